//! What `start.lua` and `complete.lua` answer, field by field, as Redis sends it: the worker
//! and the pull API read these replies by position (`src/store/lease.rs`), and every field a
//! reply carries costs Redis to build and the reader to parse, so each is pinned here — one
//! moved, added or dropped fails a test before it confuses a reader.

use redis::Value;
use sluice::domain::{ExecutionId, TenantId};
use sluice::store::Shard;

use crate::fences::{admit_call, admit_tag, common, fcall};
use crate::helpers::{TestRedis, shard_no};

const CONSUMER: &str = "w";
const TTL_MS: &str = "30000";

/// KEYS and ARGV of `start.lua` for up to `count` runs of shard `s` (every tenant).
fn start_call(s: Shard, count: u32) -> (Vec<String>, Vec<String>) {
    let keys = vec![
        s.frozen(),
        s.runnable(),
        s.delayed(),
        s.leases(),
        s.dead_letters(),
        s.stats(),
        s.dead_letters_indexed(),
        s.adopted(CONSUMER),
    ];
    let mut args = common(&s.prefix());
    args.extend([
        CONSUMER.into(),
        count.to_string(),
        TTL_MS.into(),
        "1000".into(),
        "0".into(),
        // No start log (the default).
        "0".into(),
    ]);
    (keys, args)
}

/// KEYS and ARGV of `complete.lua` for one report: run `fence` of `id` completed with output
/// `{}`, chaining `chain` starts, for `tenant` ('' for any: the worker's report).
fn complete_call(
    s: Shard,
    id: &ExecutionId,
    fence: &str,
    chain: u32,
    tenant: &str,
) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    // Bytes: the row's name holds the id in its stored form.
    let keys: Vec<Vec<u8>> = vec![
        s.frozen().into(),
        s.runnable().into(),
        s.leases().into(),
        s.delayed().into(),
        s.dead_letters().into(),
        s.stats().into(),
        s.dead_letter_holders().into(),
        s.row(id),
        s.adopted(CONSUMER).into(),
    ];
    // Bytes: the id goes in its stored form, as the store sends it.
    let mut args: Vec<Vec<u8>> = common(&s.prefix()).into_iter().map(Into::into).collect();
    args.extend(
        [
            &b"1000"[..],
            b"100",
            // No start log (the default).
            b"0",
            b"1",
            s.stored_id(id).as_ref(),
            fence.as_bytes(),
            CONSUMER.as_bytes(),
            b"completed",
            b"{}",
            b"",
            b"",
            b"",
            chain.to_string().as_bytes(),
            TTL_MS.as_bytes(),
            b"0",
            tenant.as_bytes(),
        ]
        .map(<[u8]>::to_vec),
    );
    (keys, args)
}

fn bulk(s: &str) -> Value {
    Value::BulkString(s.as_bytes().to_vec())
}

#[tokio::test]
async fn start_and_complete_answer_each_field_where_the_store_reads_it() {
    let redis = TestRedis::start_standalone().await;
    let mut c = redis.conn().await;
    sluice::store::load_library(&mut c).await.unwrap();
    let s = shard_no(2);
    let tenant = TenantId::parse("acme").unwrap();
    let (first, second) = (ExecutionId::new(), ExecutionId::new());
    for id in [&first, &second] {
        let (k, a) = admit_call(s, s, id);
        assert_eq!(
            admit_tag(fcall(&redis, "admit", &k, &a).await.unwrap()),
            "new"
        );
    }

    // start: {more, started, next_due, weight}; each started run one string, its fields
    // joined by newlines: id, fence, attempt, tenant, flow, version or '', max_attempts,
    // traceparent or '', tracestate or '', params (last: only they may hold a newline).
    let (k, a) = start_call(s, 1);
    let started = fcall(&redis, "start", &k, &a).await.unwrap();
    // (The id in its stored form: 16 bytes at layout 5, which may hold a newline.)
    let run = |id: &ExecutionId| {
        let mut line = s.stored_id(id).as_ref().to_vec();
        line.extend_from_slice(
            format!("\n1\n1\n{}\ndemo.echo\n\n5\n\n\n{{}}", tenant.as_str()).as_bytes(),
        );
        Value::BulkString(line)
    };
    // The second admission is still runnable (more 1, weight 1); nothing is scheduled (-1).
    assert_eq!(
        started,
        Value::Array(vec![
            Value::Int(1),
            Value::Array(vec![run(&first)]),
            Value::Int(-1),
            Value::Int(1),
        ])
    );

    // A pull worker's report (it names its tenant, chains nothing): its outcome alone, as one
    // string; the pull API answers nothing of the shard.
    let (k, a) = complete_call(s, &first, "1", 0, tenant.as_str());
    let done = fcall(&redis, "complete", &k, &a).await.unwrap();
    assert_eq!(done, bulk("done:completed"));

    // The worker's report, chaining one start on the slot it frees: per report {what,
    // detail, started} (started as start.lua's; here none is left), then the call's shard
    // part once, after the reports: {next_due, weight}; a call of one report has it in the
    // report's own table (one table less for Redis to convert).
    let (k, a) = start_call(s, 1);
    let started = fcall(&redis, "start", &k, &a).await.unwrap();
    assert_eq!(
        started,
        Value::Array(vec![
            Value::Int(0),
            Value::Array(vec![run(&second)]),
            Value::Int(-1),
            Value::Int(0),
        ]),
        "the last one starts, and leaves the shard empty"
    );
    let (k, a) = complete_call(s, &second, "1", 1, "");
    let done = fcall(&redis, "complete", &k, &a).await.unwrap();
    assert_eq!(
        done,
        Value::Array(vec![Value::Array(vec![
            bulk("done"),
            bulk("completed"),
            Value::Array(vec![]),
            Value::Int(-1),
            Value::Int(0),
        ])]),
        "nothing left to chain"
    );

    // Two worker reports and a pull worker's in one call (group commit; runs that are not
    // current, so 'stale'): a report that started nothing is one string, `what:detail:` (its
    // `started` empty after the last ':') or, asking for its outcome alone, `what:detail`;
    // then the shard's part once, after them (src/store/commit.rs, `joined_report`).
    let (mut k, mut a) = complete_call(s, &ExecutionId::new(), "1", 0, "");
    for tenant in ["", tenant.as_str()] {
        let (k2, a2) = complete_call(s, &ExecutionId::new(), "1", 0, tenant);
        k.extend_from_slice(&k2[7..]);
        a.extend_from_slice(&a2[9..]);
    }
    a[8] = "3".into();
    assert_eq!(
        fcall(&redis, "complete", &k, &a).await.unwrap(),
        Value::Array(vec![
            bulk("stale::"),
            bulk("stale::"),
            bulk("stale:"),
            Value::Array(vec![Value::Int(-1), Value::Int(0)]),
        ]),
    );
}
