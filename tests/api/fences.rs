//! The fences of the Lua scripts (`migrations-lua/guard.lua`): keys and prefix must agree
//! (a wrong shard tag fails loudly, also on a standalone Redis), the Lua key builders name the
//! same keys as `src/store/keys.rs`, and a shard's freeze marker stops every script of the
//! shard — admission, cancel, a worker's start — until it is removed.
//!
//! Long on purpose: a list of independent tests, one per fence of the scripts (keys, prefix,
//! freeze marker, key builders); they share the direct-EVAL helpers at the top.

use std::time::Duration;

use redis::Value as RedisValue;
use reqwest::StatusCode;
use serde_json::json;
use sluice::domain::{ExecutionId, FlowId, Status, TenantId};
use sluice::store::{Shard, composed_source, keys, operation};

use crate::helpers::{FAST_WORKER, TestApp, TestRedis, TestWorker, problem_code};

/// EVAL of `source` with `keys` and `args`; Redis's own answer (an error reply is `Err`).
pub(crate) async fn eval<K: redis::ToRedisArgs, A: redis::ToRedisArgs>(
    redis: &TestRedis,
    source: &str,
    keys: &[K],
    args: &[A],
) -> redis::RedisResult<RedisValue> {
    let mut c = redis.conn().await;
    redis::cmd("EVAL")
        .arg(source)
        .arg(keys.len())
        .arg(keys)
        .arg(args)
        .query_async(&mut c)
        .await
}

/// The common arguments of a shard script (ARGV[1..5]) for `prefix`.
pub(crate) fn common(prefix: &str) -> Vec<String> {
    vec![
        prefix.into(),
        "10".into(),
        "100".into(),
        "60".into(),
        "60".into(),
    ]
}

#[tokio::test]
async fn lua_key_builders_name_the_keys_the_rust_keys_module_does() {
    let redis = TestRedis::start().await;
    // Every builder of common.lua, against the function of keys.rs that names the same key.
    let op = "#!lua flags=no-writes
local t, id, f, h = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local out = { K.frozen(), K.ready(), K.bell(), K.adopted(h), K.leases(), K.delayed(), K.dlq(), K.stats(),
  K.tenants(), K.row(id), K.void(id), K.cfg(t), K.slots(t), K.waiting(t), K.deleting(t), K.flows(t),
  K.dedup(t, h), K.tenant_dlq(t), K.dlq_indexed(), K.dlq_poison(), K.dlq_holders(),
  K.dlq_rebuilt(), K.dlq_evicted(), EVENTS_CHANNEL .. public_id(id), K.runnable(), K.sched(),
  K.starts(), K.held(h), K.listing(t), listing_member('scheduled', f, id),
  K.trends(t, 20423), K.shard_trends(20423), K.busy(), K.key_queue(t, h), K.key_running(t, h),
  K.key_limits(t), K.key_blocked(t), K.tat(t), K.key_tat(t, h), K.outbox(t), K.webhooks(),
  WEBHOOK_CHANNEL, K.delivery_log(t), K.delivery_lock(t), K.batch_lock(t), K.reaping(),
  K.burst(t), K.retained(t), K.dedup_bucket(t, h), dedup_field(h) }
for _, s in ipairs(STATUSES) do
  table.insert(out, listing_member(s, f, id))
  local min, max = listing_range(s)
  table.insert(out, min)
  table.insert(out, max)
end
table.insert(out, QUEUED_MIN)
table.insert(out, QUEUED_MAX)
return out";
    let source = composed_source("shard", op);
    for (n, tenant, flow) in [
        (0, "a", "f"),
        (7, "acme.eu-1", "billing/invoice-v2"),
        (15, "X_9-z", "demo.echo"),
        (123, "tenant", "x"),
    ] {
        let s = crate::helpers::shard_no(n);
        let t = TenantId::parse(tenant).unwrap();
        let f = FlowId::parse(flow).unwrap();
        let id = ExecutionId::new();
        let digest = "00112233445566778899aabbccddeeff";
        let mut expected: Vec<Vec<u8>> = vec![
            s.frozen().into(),
            s.ready().into(),
            s.bell().into(),
            s.adopted(digest).into(),
            s.leases().into(),
            s.delayed().into(),
            s.dead_letters().into(),
            s.stats().into(),
            s.tenants().into(),
            s.row(&id),
            s.void(&id),
            s.tenant_config(&t).into(),
            s.slots(&t).into(),
            s.waiting(&t).into(),
            s.deleting(&t).into(),
            s.flows(&t).into(),
            s.dedup(&t, digest).into(),
            s.tenant_dead_letters(&t).into(),
            s.dead_letters_indexed().into(),
            s.poison_dead_letters().into(),
            s.dead_letter_holders().into(),
            s.dead_letters_rebuilt().into(),
            s.dead_letters_evicted().into(),
            keys::events_channel(&id).into(),
            s.runnable().into(),
            s.sched().into(),
            s.starts().into(),
            s.held(digest).into(),
            s.listing(&t).into(),
            s.listing_member(None, &f, &id),
            s.trends(&t, 20_423).into(),
            s.shard_trends(20_423).into(),
            s.busy().into(),
            s.key_queue(&t, digest).into(),
            s.key_running(&t, digest).into(),
            s.key_limits(&t).into(),
            s.key_blocked(&t).into(),
            s.tat(&t).into(),
            s.key_tat(&t, digest).into(),
            s.outbox(&t).into(),
            s.webhooks().into(),
            sluice::store::keys::WEBHOOK_CHANNEL.to_owned().into(),
            s.delivery_log(&t).into(),
            s.delivery_lock(&t).into(),
            s.batch_lock(&t).into(),
            s.reaping().into(),
            s.burst(&t).into(),
            s.retained(&t).into(),
            s.dedup_bucket(&t, digest).into(),
            keys::dedup_field(digest).to_owned().into(),
        ];
        for st in Status::ALL {
            expected.push(s.listing_member(Some(st), &f, &id));
            let (min, max) = keys::listing_range(Some(st));
            expected.extend([min.into(), max.into()]);
        }
        // place()'s bounds of the queued, written out.
        let (min, max) = keys::listing_range(Some(Status::Queued));
        expected.extend([min.into(), max.into()]);
        // Bytes, not text: the id goes in and comes back in its stored form (binary from
        // layout 5 on), as the store sends it.
        let mut args: Vec<Vec<u8>> = common(&s.prefix()).into_iter().map(Into::into).collect();
        args.extend([
            tenant.into(),
            s.stored_id(&id).as_ref().to_vec(),
            flow.into(),
            digest.into(),
        ]);
        let got = eval(&redis, &source, &[s.frozen()], &args).await.unwrap();
        let got: Vec<Vec<u8>> = redis::from_redis_value(got).unwrap();
        assert_eq!(got, expected, "shard {n}, tenant {tenant}");
    }

    // The access builders (acl_keys.lua) against keys.rs.
    let op = "#!lua flags=no-writes
return { A.frozen(), A.key(ARGV[2]), A.tenant_keys(ARGV[3]), A.tenants() }";
    let t = TenantId::parse("acme").unwrap();
    let args = vec![
        keys::acl_prefix().to_owned(),
        "0123456789abcdef".into(),
        "acme".into(),
    ];
    let got = eval(
        &redis,
        &composed_source("acl", op),
        &[keys::acl_frozen()],
        &args,
    )
    .await
    .unwrap();
    let got: Vec<String> = redis::from_redis_value(got).unwrap();
    assert_eq!(
        got,
        [
            keys::acl_frozen(),
            keys::api_key("0123456789abcdef"),
            keys::tenant_keys(&t),
            keys::tenants()
        ]
    );
}

/// An admission passes its dedup mapping's field in the tenant's bucket as an argument
/// (`keys::dedup_field`, cut once in Rust), while the scripts that end, revive, release or list
/// a mapping cut it from the row's digest in Lua (`dedup_field()` in common.lua). Both must
/// name the same field for every digest, or an ended execution's mapping would stay live (and
/// its key held) forever: pinned here over many digests and the edges.
#[tokio::test]
async fn lua_and_rust_cut_the_same_dedup_field() {
    let redis = TestRedis::start().await;
    let op = "#!lua flags=no-writes
local out = {}
for i = 6, #ARGV do out[#out + 1] = dedup_field(ARGV[i]) end
return out";
    let source = composed_source("shard", op);
    let s = crate::helpers::shard_no(3);
    let mut digests: Vec<String> = (0..2000)
        .map(|i| {
            sluice::domain::DedupKey::parse(&format!("order-{i}-\u{e9}"))
                .unwrap()
                .digest()
        })
        .collect();
    // Every bucket's first digits, and what no digest is but a cut must survive.
    digests.extend((0..256).map(|b| format!("{b:02x}{:030x}", b * 7919)));
    digests.extend(["", "a", "ab", "abc", "00112233445566778899aabbccddeeff"].map(String::from));
    for chunk in digests.chunks(500) {
        let mut args = common(&s.prefix());
        args.extend(chunk.iter().cloned());
        let got = eval(&redis, &source, &[s.frozen()], &args).await.unwrap();
        let got: Vec<String> = redis::from_redis_value(got).unwrap();
        assert_eq!(got.len(), chunk.len());
        for (digest, lua) in chunk.iter().zip(&got) {
            assert_eq!(
                lua,
                keys::dedup_field(digest),
                "the field of digest {digest:?}: common.lua against keys.rs"
            );
        }
    }
}

/// A whole number the Lua hands to Redis as text (`num_text()` in common.lua: a row's size, a
/// start's attempt and fence, a retained bucket's field) must be the text Redis writes for the
/// number itself, what the readers of those fields parse: pinned over many numbers and the
/// edges (negative, a time in ms, 2^53 - 1), each asked twice, the second time after the memo
/// was emptied (it holds 1,024).
#[tokio::test]
async fn a_number_as_text_is_what_redis_writes_for_it() {
    let redis = TestRedis::start().await;
    let op = "#!lua
local out = {}
for i = 6, #ARGV do
  local n = ARGV[i] + 0
  redis_call('HSET', KEYS[2], 'n', n)
  local theirs = redis_call('HGET', KEYS[2], 'n')
  local ours = num_text(n)
  if ours ~= theirs then out[#out + 1] = ARGV[i] .. ': ' .. ours .. ' against ' .. theirs end
end
return out";
    let source = composed_source("shard", op);
    let s = crate::helpers::shard_no(3);
    let mut numbers: Vec<String> = (0..1100).map(|n| n.to_string()).collect();
    numbers.extend(
        [
            "-1",
            "-1000",
            "540",
            "1799233200",
            "1796637766803",
            "999999999999999",
            "9007199254740991",
        ]
        .map(String::from),
    );
    // Again, now that the memo has been emptied once.
    numbers.extend((0..600).map(|n| (n * 3).to_string()));
    let mut args = common(&s.prefix());
    args.extend(numbers);
    let got = eval(
        &redis,
        &source,
        &[s.frozen(), format!("{}numtext", s.prefix())],
        &args,
    )
    .await
    .unwrap();
    let got: Vec<String> = redis::from_redis_value(got).unwrap();
    assert!(got.is_empty(), "num_text() against Redis: {got:#?}");
}

/// KEYS and ARGV of an admission of `id` for tenant `acme` in shard `keys_of`, with the
/// prefix of shard `prefix_of` (the same shard for a correct call).
pub(crate) fn admit_call(
    keys_of: Shard,
    prefix_of: Shard,
    id: &ExecutionId,
) -> (Vec<String>, Vec<Vec<u8>>) {
    let t = TenantId::parse("acme").unwrap();
    let s = keys_of;
    let keys = vec![s.frozen(), s.listing(&t)];
    // A fingerprint of the shard's width: 8 bytes at layout 5, where a dedup mapping is
    // `<id 16><fingerprint 8>` told by its length (`Shard::stored_fingerprint`).
    let fingerprint: &[u8] = if prefix_of.binary_ids() {
        b"fingerpr"
    } else {
        b"fingerprint"
    };
    // Bytes: the id goes in its stored form, as the store sends it.
    let mut args: Vec<Vec<u8>> = common(&prefix_of.prefix())
        .into_iter()
        .map(Into::into)
        .collect();
    args.extend(
        [
            &b"1"[..],
            // The server's storage bounds.
            b"1073741824",
            b"1000000",
            b"acme",
            prefix_of.stored_id(id).as_ref(),
            b"demo.echo",
            b"",
            b"{}",
            b"5",
            b"",
            b"",
            fingerprint,
            b"3",
            // No schedule, concurrency key or trace context.
            b"",
            b"",
            b"",
            b"",
            b"",
            // No dedup key: no bucket field.
            b"",
        ]
        .map(<[u8]>::to_vec),
    );
    (keys, args)
}

#[tokio::test]
async fn a_wrong_shard_tag_fails_loudly_on_a_standalone_redis() {
    // One server: nothing but the scripts' own check stands between a wrong tag and the data.
    // (On a cluster, Redis itself refuses keys of several slots: `cluster.rs`.)
    let redis = TestRedis::start_standalone().await;
    let admit = composed_source("shard", operation("admit.lua").unwrap());
    let id = ExecutionId::new();

    // The right call admits (the harness is sound).
    let (k, a) = admit_call(
        crate::helpers::shard_no(3),
        crate::helpers::shard_no(3),
        &id,
    );
    assert_eq!(
        admit_tag(eval(&redis, &admit, &k, &a).await.unwrap()),
        "new"
    );
    let before = redis.keys().await;

    // Keys of shard 3, prefix of shard 5: refused before anything is read or written.
    let other = ExecutionId::new();
    let (k, a) = admit_call(
        crate::helpers::shard_no(3),
        crate::helpers::shard_no(5),
        &other,
    );
    let e = eval(&redis, &admit, &k, &a).await.unwrap_err();
    assert!(
        e.to_string().contains(&format!(
            "outside the prefix {}",
            crate::helpers::shard_no(5).prefix()
        )),
        "{e}"
    );
    // One key of another shard among the right ones: the same.
    let (mut k, a) = admit_call(
        crate::helpers::shard_no(3),
        crate::helpers::shard_no(3),
        &other,
    );
    k[1] =
        crate::helpers::shard_no(4).status_index(&TenantId::parse("acme").unwrap(), Status::Queued);
    let e = eval(&redis, &admit, &k, &a).await.unwrap_err();
    assert!(
        e.to_string()
            .contains(&format!("KEYS[2] {}", crate::helpers::shard_no(4).prefix())),
        "{e}"
    );
    // The right shard, but a key that is not the one the script uses: named in the error
    // (every script but admit.lua checks the positions; admit's are checked by
    // `admit_declares_the_keys_it_writes`).
    let s3 = crate::helpers::shard_no(3);
    let acme = TenantId::parse("acme").unwrap();
    let set_limits = composed_source("shard", operation("set_limits.lua").unwrap());
    let k = vec![
        s3.frozen(),
        s3.slots(&acme), // should be the tenant's cfg
        s3.slots(&acme),
        s3.waiting(&acme),
        s3.runnable(),
    ];
    let mut a = common(&s3.prefix());
    a.extend(["acme", "5", "", "", "", "", "", ""].map(String::from));
    let e = eval(&redis, &set_limits, &k, &a).await.unwrap_err();
    assert!(
        e.to_string()
            .contains(&format!("KEYS[2] is {}t:acme:slots", s3.prefix())),
        "{e}"
    );
    // No freeze marker first: refused.
    let (mut k, a) = admit_call(
        crate::helpers::shard_no(3),
        crate::helpers::shard_no(3),
        &other,
    );
    k.remove(0);
    let e = eval(&redis, &admit, &k, &a).await.unwrap_err();
    assert!(
        e.to_string().contains(&format!(
            "KEYS[1] must be {}hold",
            crate::helpers::shard_no(3).prefix()
        )),
        "{e}"
    );
    // A prefix that is no prefix (it would match every key).
    let (k, mut a) = admit_call(
        crate::helpers::shard_no(3),
        crate::helpers::shard_no(3),
        &other,
    );
    a[0] = "sluice:".into();
    let e = eval(&redis, &admit, &k, &a).await.unwrap_err();
    assert!(e.to_string().contains("not a key prefix"), "{e}");
    assert_eq!(redis.keys().await, before, "a refused call wrote something");

    // The access scripts are fenced the same way: a shard prefix with the {acl} keys.
    let auth = composed_source("acl", operation("api_key_auth.lua").unwrap());
    let k = vec![
        keys::acl_frozen(),
        keys::api_key("0123456789abcdef"),
        keys::tenants(),
    ];
    let a = vec![
        crate::helpers::shard_no(3).prefix(),
        "0123456789abcdef".into(),
    ];
    let e = eval(&redis, &auth, &k, &a).await.unwrap_err();
    assert!(e.to_string().contains("outside the prefix"), "{e}");
}

#[tokio::test]
async fn a_frozen_shard_refuses_every_script_until_the_marker_goes() {
    let app = TestApp::spawn().await;
    let store = app.store().await;
    let shard = app.shard("acme");
    // A tenant of another shard, to show that a freeze is per shard.
    let neighbour = (0..200)
        .map(|i| format!("t{i}"))
        .find(|t| app.shard(t) != shard)
        .unwrap();
    let queued = app.admit("acme", "demo.echo").await;
    let queued = queued["execution_id"].as_str().unwrap().to_owned();

    store.freeze_shard(shard).await.unwrap();
    assert!(store.is_frozen(shard).await.unwrap());
    assert!(
        !store
            .is_frozen(crate::helpers::shard_no(shard.number() ^ 1))
            .await
            .unwrap()
    );
    let keys_before = app.redis.keys().await;
    let row_before: Vec<String> = app
        .redis
        .query(redis::cmd("HGETALL").arg(shard.row(&ExecutionId::parse(&queued).unwrap())))
        .await;

    // Admission: 503, retryable, and "nothing was admitted" (not an unknown outcome: Redis
    // answered that the script did not run).
    for body in [
        json!({"flow_id": "demo.echo"}),
        json!({"flow_id": "demo.echo", "dedup_key": "k1"}),
    ] {
        let res = app.post_execution("acme", &body).await;
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(res.headers().contains_key("retry-after"));
        assert_eq!(problem_code(res).await, "redis_unavailable");
    }
    // Cancel: 503 and the execution untouched.
    let res = app.cancel("acme", &queued).await;
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(problem_code(res).await, "redis_unavailable");
    let e = app.execution("acme", &queued).await;
    assert_eq!(e["status"], "queued");
    assert_eq!(e["cancel_requested"], false);
    // Limits: refused too.
    let res = app
        .client
        .put(app.url("/api/tenants/acme"))
        .bearer_auth(crate::helpers::ADMIN_TOKEN)
        .json(&json!({"max_concurrent": 3}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);

    // A worker starts nothing in the frozen shard.
    let _worker = TestWorker::spawn(&app.redis, FAST_WORKER);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(app.execution("acme", &queued).await["status"], "queued");
    let leases: u64 = app
        .redis
        .query(redis::cmd("ZCARD").arg(shard.leases()))
        .await;
    assert_eq!(leases, 0, "a run started");

    // Nothing changed in the frozen shard (the other shards' keys may have).
    let in_shard = |ks: &std::collections::BTreeSet<String>| -> Vec<String> {
        ks.iter()
            .filter(|k| k.starts_with(&shard.prefix()))
            .cloned()
            .collect()
    };
    assert_eq!(in_shard(&app.redis.keys().await), in_shard(&keys_before));
    let row_after: Vec<String> = app
        .redis
        .query(redis::cmd("HGETALL").arg(shard.row(&ExecutionId::parse(&queued).unwrap())))
        .await;
    assert_eq!(row_after, row_before);

    // Another shard works meanwhile (its execution runs to the end).
    let other = app.admit(&neighbour, "demo.echo").await;
    let other = other["execution_id"].as_str().unwrap();
    let done = app
        .wait_terminal(&neighbour, other, Duration::from_secs(15))
        .await;
    assert_eq!(done["status"], "completed");

    // The marker goes: everything works again, the waiting work included.
    store.unfreeze_shard(shard).await.unwrap();
    assert!(!store.is_frozen(shard).await.unwrap());
    let done = app
        .wait_terminal("acme", &queued, Duration::from_secs(15))
        .await;
    assert_eq!(done["status"], "completed");
    let fresh = app.admit("acme", "demo.echo").await;
    let fresh = fresh["execution_id"].as_str().unwrap().to_owned();
    let res = app.cancel("acme", &fresh).await;
    assert_eq!(res.status(), StatusCode::OK);
}

#[tokio::test]
async fn frozen_access_data_refuses_key_scripts_until_thawed() {
    let app = TestApp::spawn().await;
    let store = app.store().await;
    app.put_tenant("acme", &json!({})).await;
    store.freeze_access().await.unwrap();
    assert!(store.is_access_frozen().await.unwrap());
    let res = app
        .client
        .post(app.url("/api/tenants/acme/api-keys"))
        .bearer_auth(crate::helpers::ADMIN_TOKEN)
        .json(&json!({"role": "viewer"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    store.unfreeze_access().await.unwrap();
    let res = app
        .client
        .post(app.url("/api/tenants/acme/api-keys"))
        .bearer_auth(crate::helpers::ADMIN_TOKEN)
        .json(&json!({"role": "viewer"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
}

/// admit.lua does not rebuild its declared keys to check their positions (it is the hot path):
/// the keys `Store::admit` declares must be the ones the script writes, with the right
/// contents. A swapped pair in the caller's list would put a flow in the tenant registry, an id
/// in the wrong index, or the row under another name.
#[tokio::test]
async fn admit_declares_the_keys_it_writes() {
    let app = TestApp::spawn().await;
    let before = app.redis.keys().await;
    let res = app
        .post_with_key("acme", "order-9", &json!({"flow_id": "demo.echo"}))
        .await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let id: String = res.json::<serde_json::Value>().await.unwrap()["execution_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let written: Vec<String> = app
        .redis
        .keys()
        .await
        .difference(&before)
        .cloned()
        .collect();
    let t = TenantId::parse("acme").unwrap();
    let f = FlowId::parse("demo.echo").unwrap();
    let s = app.shard("acme");
    let eid = ExecutionId::parse(&id).unwrap();
    let digest = sluice::domain::DedupKey::parse("order-9").unwrap().digest();
    let mut expected = vec![
        crate::helpers::key_text(s.row(&eid)),
        s.listing(&t),
        s.flows(&t),
        s.tenants(),
        s.waiting(&t),
        s.runnable(),
        s.sched(),
        // A live mapping is a field of its bucket (the string key comes when it ends).
        s.dedup_bucket(&t, &digest),
        s.bell(),
        // Its logical bytes, counted in its configuration (see "Storage" in common.lua).
        s.tenant_config(&t),
    ];
    // The admission is counted in the tenant's and the shard's per-minute records of the day
    // it was admitted on (Redis's clock), and the tenant is listed as having work.
    let created: u64 = app
        .redis
        .query(
            redis::cmd("HGET")
                .arg(s.row(&eid))
                .arg(sluice::domain::row::CREATED),
        )
        .await;
    let day = created / 86_400_000;
    expected.extend([s.trends(&t, day), s.shard_trends(day), s.busy()]);
    expected.sort();
    // The doorbell is set (no worker runs here to take it).
    let marker: u64 = app.redis.query(redis::cmd("ZCARD").arg(s.bell())).await;
    assert_eq!(marker, 1);
    let mut written = written;
    written.sort();
    assert_eq!(written, expected);
    // The execution is first in its tenant's queue, and the tenant runnable.
    assert_eq!(app.queue_ids("acme").await, std::slice::from_ref(&id));
    assert_eq!(app.runnable_tenants("acme").await, ["acme"]);

    let q = |c: &mut redis::Cmd| {
        let c = c.clone();
        let app = &app;
        async move { app.redis.query::<Vec<String>>(&mut c.clone()).await }
    };
    assert_eq!(q(redis::cmd("SMEMBERS").arg(s.tenants())).await, ["acme"]);
    assert_eq!(
        q(redis::cmd("SMEMBERS").arg(s.flows(&t))).await,
        ["demo.echo"]
    );
    // One listing member: queued, its flow, its id (bytes: the id in its stored form).
    let members: Vec<Vec<u8>> = app
        .redis
        .query(redis::cmd("ZRANGE").arg(s.listing(&t)).arg(0).arg(-1))
        .await;
    assert_eq!(members, [s.listing_member(Some(Status::Queued), &f, &eid)]);
    let tenant: Option<String> = app
        .redis
        .query(
            redis::cmd("HGET")
                .arg(s.row(&eid))
                .arg(sluice::domain::row::TENANT),
        )
        .await;
    assert_eq!(tenant.as_deref(), Some("acme"));
    let mapping: Vec<u8> = app
        .redis
        .query(
            redis::cmd("HGET")
                .arg(s.dedup_bucket(&t, &digest))
                .arg(keys::dedup_field(&digest)),
        )
        .await;
    // `<id>:<fingerprint>`, or layout 5's `<id 16><fingerprint 8>` (no separator).
    let mut holder = s.stored_id(&eid).as_ref().to_vec();
    if s.binary_ids() {
        assert_eq!(mapping.len(), 24, "{mapping:?}");
    } else {
        holder.push(b':');
    }
    assert!(mapping.starts_with(&holder), "{mapping:?}");

    // A scheduled admission writes the timer set instead, and a second listing member (under
    // 's', for the scheduled filter) in the listing that exists already.
    let before = app.redis.keys().await;
    let res = app
        .post_execution("acme", &json!({"flow_id": "demo.echo", "delay": "1h"}))
        .await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let later = res.json::<serde_json::Value>().await.unwrap();
    assert_eq!(later["queue_state"], "scheduled");
    let later_id = ExecutionId::parse(later["execution_id"].as_str().unwrap()).unwrap();
    let mut written: Vec<String> = app
        .redis
        .keys()
        .await
        .difference(&before)
        .cloned()
        .collect();
    written.sort();
    let mut expected = vec![crate::helpers::key_text(s.row(&later_id)), s.delayed()];
    expected.sort();
    assert_eq!(written, expected);
    let members: Vec<Vec<u8>> = app
        .redis
        .query(redis::cmd("ZRANGE").arg(s.listing(&t)).arg(0).arg(-1))
        .await;
    assert!(
        members.contains(&s.listing_member(None, &f, &later_id))
            && members.contains(&s.listing_member(Some(Status::Queued), &f, &later_id)),
        "{members:?}"
    );
}

/// FCALL of this build's library function `op` (loaded with `FUNCTION LOAD REPLACE` first by
/// the caller); Redis's own answer.
pub(crate) async fn fcall<K: redis::ToRedisArgs, A: redis::ToRedisArgs>(
    redis: &TestRedis,
    op: &str,
    keys: &[K],
    args: &[A],
) -> redis::RedisResult<RedisValue> {
    let mut c = redis.conn().await;
    redis::cmd("FCALL")
        .arg(format!("{}_{op}", sluice::store::library_name()))
        .arg(keys.len())
        .arg(keys)
        .arg(args)
        .query_async(&mut c)
        .await
}

/// The tag of the first entry of an `admit` reply.
pub(crate) fn admit_tag(reply: RedisValue) -> String {
    // A call of one answers a new runnable admission as one string, 'new:...' (admit.lua's
    // header), and a replay as the id alone.
    // (Told by its start: a binary id, layout 5, may hold ':' itself, never start "new:".)
    if let RedisValue::BulkString(short) = &reply {
        let tag = if short.starts_with(b"new:") {
            "new"
        } else {
            "dup"
        };
        return tag.to_string();
    }
    let entries: Vec<RedisValue> = redis::from_redis_value(reply).unwrap();
    let first: Vec<RedisValue> = redis::from_redis_value(entries[0].clone()).unwrap();
    redis::from_redis_value(first[0].clone()).unwrap()
}

#[tokio::test]
async fn a_key_the_library_passed_under_one_prefix_is_refused_under_another() {
    // The library's guard remembers the keys it found under a prefix (guard.lua: a key met again
    // costs a table read, not a string search). What it remembers is "this key under this
    // prefix": a key of shard 4, passed by a call of shard 4, is still refused in a call of
    // shard 3, on a standalone Redis where nothing else would stop it.
    let redis = TestRedis::start_standalone().await;
    let mut c = redis.conn().await;
    sluice::store::load_library(&mut c).await.unwrap();
    let (s3, s4) = (crate::helpers::shard_no(3), crate::helpers::shard_no(4));
    let id = ExecutionId::new();
    // Every key of shard 4's call is remembered under shard 4's prefix.
    let (k4, a4) = admit_call(s4, s4, &id);
    assert_eq!(
        admit_tag(fcall(&redis, "admit", &k4, &a4).await.unwrap()),
        "new"
    );
    // Shard 3's own call passes (and is remembered) too: the harness is sound.
    let (k3, a3) = admit_call(s3, s3, &ExecutionId::new());
    assert_eq!(
        admit_tag(fcall(&redis, "admit", &k3, &a3).await.unwrap()),
        "new"
    );
    let before = redis.keys().await;

    // Shard 3's call again, with shard 4's listing (remembered, but under shard 4).
    let (mut k, a) = admit_call(s3, s3, &ExecutionId::new());
    k[1] = k4[1].clone();
    let e = fcall(&redis, "admit", &k, &a).await.unwrap_err();
    assert!(
        e.to_string().contains(&format!("KEYS[2] {}", s4.prefix()))
            && e.to_string().contains("outside the prefix"),
        "{e}"
    );
    // All of shard 4's keys (each remembered) with shard 3's prefix: refused at the first key,
    // not let through to the freeze marker's check.
    let (k, mut a) = admit_call(s4, s4, &id);
    a[0] = s3.prefix().into();
    let e = fcall(&redis, "admit", &k, &a).await.unwrap_err();
    assert!(
        e.to_string().contains(&format!(
            "KEYS[1] {}hold is outside the prefix",
            s4.prefix()
        )),
        "{e}"
    );
    assert_eq!(redis.keys().await, before, "a refused call wrote something");
}
