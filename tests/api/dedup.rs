//! Dedup mappings in their two forms (`dedup_holder()` in `migrations-lua/common.lua`): a live
//! execution's is a field of its tenant's bucket, an ended one's the string key with the dedup
//! TTL. Every end of an execution moves it in the same call, a retry moves it back, a force
//! delete frees it; the answers a client gets (replay, conflict, the listing's filter) are
//! the same in every state; mappings of the older form are converted by
//! `Store::relayout_dedup_step`, and the sweeper settles what a process of an older build left.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Value as RedisValue;
use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice::domain::{DedupKey, ExecutionId, TenantId};
use sluice::store::keys::{self, KeyKind};
use sluice::store::{Completion, Layout, Outcome, ShardMap};
use tokio::sync::Barrier;

use crate::helpers::{DedupMapping, TestApp, TestRedis, problem_code};

const WEEK: i64 = 7 * 86_400;

fn id_of(e: &Value) -> String {
    e["execution_id"].as_str().unwrap().to_owned()
}

/// A replay of `key` answers 200 with execution `id`, marked replayed; the same key with other
/// params answers 422 `idempotency_key_conflict`; the listing's filter finds `id` alone.
async fn replays_to(app: &TestApp, tenant: &str, key: &str, id: &str) {
    let res = app
        .post_with_key(
            tenant,
            key,
            &json!({"flow_id": "demo.echo", "params": {"k": key}}),
        )
        .await;
    assert_eq!(res.status(), StatusCode::OK, "replay of {key}");
    assert_eq!(
        res.headers()
            .get("Idempotent-Replayed")
            .map(|v| v.to_str().unwrap()),
        Some("true")
    );
    let body: Value = res.json().await.unwrap();
    assert_eq!(id_of(&body), id, "replay of {key}");
    assert_eq!(body["deduplicated"], true);
    let res = app
        .post_with_key(
            tenant,
            key,
            &json!({"flow_id": "demo.echo", "params": {"k": 0}}),
        )
        .await;
    assert_eq!(
        res.status(),
        StatusCode::UNPROCESSABLE_ENTITY,
        "conflict on {key}"
    );
    assert_eq!(problem_code(res).await, "idempotency_key_conflict");
    let page = app.page(tenant, &format!("dedup_key={key}")).await;
    assert_eq!(page["total"], 1, "listing of {key}: {page}");
    assert_eq!(id_of(&page["executions"][0]), id);
}

async fn admit_keyed(app: &TestApp, tenant: &str, key: &str, extra: Value) -> String {
    let mut body = json!({"flow_id": "demo.echo", "params": {"k": key}});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    let res = app.post_with_key(tenant, key, &body).await;
    assert_eq!(res.status(), StatusCode::CREATED, "{key}");
    id_of(&res.json().await.unwrap())
}

fn live_for(m: &DedupMapping, id: &str) -> bool {
    matches!(m, DedupMapping::Live(v) if v.starts_with(&format!("{id}:")))
}

/// Ended: the string key maps to `id` with the dedup TTL counted from the end.
fn ended_for(m: &DedupMapping, id: &str) -> bool {
    matches!(m, DedupMapping::Ended(v, ttl)
        if v.starts_with(&format!("{id}:")) && *ttl > WEEK - 60 && *ttl <= WEEK)
}

#[tokio::test]
async fn every_end_moves_the_mapping_to_its_string_key_and_a_retry_moves_it_back() {
    let app = TestApp::spawn().await;
    let store = app.store().await;
    let shard = app.shard("acme");
    // Started in this order (one tenant: its queue is FIFO), six runs by hand.
    let run_keys = [
        "done",
        "dead",
        "lost",
        "cancel-r",
        "forced-r",
        "forced-done",
    ];
    let mut ids = std::collections::HashMap::new();
    for k in run_keys {
        let extra = if k == "lost" {
            json!({"max_attempts": 1})
        } else {
            json!({})
        };
        ids.insert(k, admit_keyed(&app, "acme", k, extra).await);
    }
    let runs = store
        .start(shard, "w", 6, Duration::from_secs(120), 0)
        .await
        .unwrap()
        .started;
    let started: Vec<String> = runs.iter().map(|r| r.id.to_string()).collect();
    let wanted: Vec<String> = run_keys.iter().map(|k| ids[k].clone()).collect();
    assert_eq!(started, wanted);
    for k in ["cancel-q", "forced-q", "queued"] {
        ids.insert(k, admit_keyed(&app, "acme", k, json!({})).await);
    }
    let run = |k: &str| {
        runs.iter()
            .find(|r| r.id.as_str() == ids[k])
            .unwrap()
            .clone()
    };

    // Live, queued or running: a field of its bucket, and the answers of a live execution.
    for (k, id) in &ids {
        assert!(
            live_for(&app.dedup_mapping("acme", k).await, id),
            "{k}: {:?}",
            app.dedup_mapping("acme", k).await
        );
        replays_to(&app, "acme", k, id).await;
    }
    assert_eq!(app.dedup_orphans().await, Vec::<String>::new());

    // Every way to end.
    let report = async |k: &str, outcome: Outcome| {
        let r = run(k);
        store
            .complete(shard, &r.id, r.fence, "w", &outcome)
            .await
            .unwrap()
    };
    report("done", Outcome::Completed(json!({"ok": true}))).await;
    report(
        "dead",
        Outcome::Failed {
            kind: "error".into(),
            message: "no".into(),
            retry_after: None,
        },
    )
    .await;
    // Its last attempt lost: dead-lettered as an expired lease would be.
    report("lost", Outcome::Abandoned).await;
    assert_eq!(
        app.cancel("acme", &ids["cancel-r"]).await.status(),
        StatusCode::OK
    );
    report("cancel-r", Outcome::Cancelled).await;
    assert_eq!(
        app.cancel("acme", &ids["cancel-q"]).await.status(),
        StatusCode::OK
    );
    report("forced-done", Outcome::Completed(json!({}))).await;
    for k in ["forced-r", "forced-done", "forced-q"] {
        let res = app.delete("acme", &ids[k], true).await;
        assert_eq!(res.status(), StatusCode::NO_CONTENT, "{k}");
    }
    for (k, status) in [
        ("done", "completed"),
        ("dead", "failed"),
        ("lost", "failed"),
        ("cancel-r", "cancelled"),
        ("cancel-q", "cancelled"),
    ] {
        let e = app.execution("acme", &ids[k]).await;
        assert_eq!(e["status"], status, "{k}");
        let m = app.dedup_mapping("acme", k).await;
        assert!(ended_for(&m, &ids[k]), "{k}: {m:?}");
        replays_to(&app, "acme", k, &ids[k]).await;
    }
    assert!(live_for(
        &app.dedup_mapping("acme", "queued").await,
        &ids["queued"]
    ));
    // A force delete frees the key in whichever form: the same key admits a new execution.
    for k in ["forced-r", "forced-done", "forced-q"] {
        assert_eq!(
            app.dedup_mapping("acme", k).await,
            DedupMapping::Free,
            "{k}"
        );
        let again = admit_keyed(&app, "acme", k, json!({})).await;
        assert_ne!(again, ids[k]);
        assert!(live_for(&app.dedup_mapping("acme", k).await, &again), "{k}");
    }
    assert_eq!(app.dedup_orphans().await, Vec::<String>::new());

    // A retry makes it live again: back in its bucket, still its key's execution.
    for k in ["dead", "cancel-q"] {
        assert_eq!(
            app.retry("acme", &ids[k]).await.status(),
            StatusCode::OK,
            "{k}"
        );
        assert!(
            live_for(&app.dedup_mapping("acme", k).await, &ids[k]),
            "{k}"
        );
        replays_to(&app, "acme", k, &ids[k]).await;
    }
    assert_eq!(app.dedup_orphans().await, Vec::<String>::new());
}

/// Digests of a tenant's live mappings that share a bucket: `n` dedup keys whose digests
/// start with the same two hex digits.
fn keys_of_one_bucket(n: usize) -> Vec<String> {
    (0..)
        .map(|i| format!("same-bucket-{i}"))
        .filter(|k| DedupKey::parse(k).unwrap().digest().starts_with("00"))
        .take(n)
        .collect()
}

#[tokio::test]
async fn a_bucket_past_the_listpack_limit_converts_and_keeps_every_mapping() {
    let app = TestApp::spawn().await;
    // Redis's own threshold (512 by default for hashes): one field more converts a bucket.
    let (_, limit): (String, usize) = app
        .redis
        .query(
            redis::cmd("CONFIG")
                .arg("GET")
                .arg("hash-max-listpack-entries"),
        )
        .await;
    let keys = keys_of_one_bucket(limit + 1);
    let mut ids = Vec::new();
    for k in &keys {
        ids.push(admit_keyed(&app, "acme", k, json!({})).await);
    }
    let t = TenantId::parse("acme").unwrap();
    let bucket = app.shard("acme").dedup_bucket(&t, "00");
    let encoding: String = app
        .redis
        .query(redis::cmd("OBJECT").arg("ENCODING").arg(&bucket))
        .await;
    assert_eq!(encoding, "hashtable");
    let len: usize = app.redis.query(redis::cmd("HLEN").arg(&bucket)).await;
    assert_eq!(len, limit + 1);
    // Every mapping still answers (a sample of them, and the last, which converted it).
    for (k, id) in keys
        .iter()
        .zip(&ids)
        .step_by(37)
        .chain([(&keys[limit], &ids[limit])])
    {
        replays_to(&app, "acme", k, id).await;
    }
    assert_eq!(app.cancel("acme", &ids[7]).await.status(), StatusCode::OK);
    assert!(ended_for(
        &app.dedup_mapping("acme", &keys[7]).await,
        &ids[7]
    ));
    assert_eq!(app.dedup_orphans().await, Vec::<String>::new());
}

/// Rewrites every live mapping on Redis in the form of older builds: a string key without TTL
/// (and no bucket field). Returns how many.
pub(crate) async fn to_old_form(app: &TestApp) -> u64 {
    let mut n = 0;
    for key in app.redis.keys().await {
        let Some(name) = keys::parse(&key) else {
            continue;
        };
        if name.kind != KeyKind::DedupBucket {
            continue;
        }
        let head = key.rsplit(':').next().unwrap().to_owned();
        let t = TenantId::parse(name.tenant.unwrap()).unwrap();
        let fields: Vec<(String, Vec<u8>)> = app.redis.query(redis::cmd("HGETALL").arg(&key)).await;
        for (field, mapped) in fields {
            let string_key = name.shard.unwrap().dedup(&t, &format!("{head}{field}"));
            let _: () = app
                .redis
                .query(redis::cmd("SET").arg(&string_key).arg(&mapped))
                .await;
            let _: () = app
                .redis
                .query(redis::cmd("HDEL").arg(&key).arg(&field))
                .await;
            n += 1;
        }
    }
    n
}

#[tokio::test]
async fn old_form_mappings_are_converted_in_batches_and_a_rerun_after_an_interruption_loses_none() {
    let app = TestApp::spawn().await;
    let store = app.store().await;
    let tenants = ["acme", "globex"];
    let mut ids: Vec<(&str, String, String)> = Vec::new();
    for t in tenants {
        for i in 0..40 {
            let k = format!("order-{i}");
            let id = admit_keyed(&app, t, &k, json!({})).await;
            ids.push((t, k, id));
        }
        // Ten running, five ended (their mapping is a string key with a TTL already).
        store
            .start(app.shard(t), "w", 10, Duration::from_secs(120), 0)
            .await
            .unwrap();
        for (_, _, id) in ids.iter().rev().take(5) {
            assert_eq!(app.cancel(t, id).await.status(), StatusCode::OK);
        }
    }
    assert_eq!(to_old_form(&app).await, 70);
    // What an older build could leave besides: an ended execution's mapping without its TTL,
    // and a mapping whose row is gone.
    let acme = TenantId::parse("acme").unwrap();
    let s = app.shard("acme");
    let ended_digest = DedupKey::parse("order-39").unwrap().digest();
    let _: () = app
        .redis
        .query(redis::cmd("PERSIST").arg(s.dedup(&acme, &ended_digest)))
        .await;
    let gone_digest = DedupKey::parse("gone").unwrap().digest();
    let gone = s.dedup(&acme, &gone_digest);
    let _: () = app
        .redis
        .query(
            redis::cmd("SET")
                .arg(&gone)
                .arg(format!("{}:0011223344556677", ExecutionId::new())),
        )
        .await;
    assert!(!app.dedup_orphans().await.is_empty());
    // The old form is still honoured before the conversion.
    let (t, k, id) = &ids[3];
    replays_to(&app, t, k, id).await;

    // Interrupted after three batches of one shard, then run again from the start everywhere.
    let mut shards: Vec<_> = tenants.iter().map(|t| app.shard(t)).collect();
    shards.dedup();
    let mut converted = 0;
    let mut cursor = 0;
    for _ in 0..3 {
        let (next, n) = store
            .relayout_dedup_step(shards[0], cursor, 5)
            .await
            .unwrap();
        converted += n;
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    for shard in &shards {
        let mut cursor = 0;
        for calls in 0.. {
            assert!(calls < 10_000, "the walk of {shard:?} does not end");
            let (next, n) = store.relayout_dedup_step(*shard, cursor, 5).await.unwrap();
            converted += n;
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
    }
    assert_eq!(converted, 70, "each live mapping converted exactly once");
    assert_eq!(app.dedup_orphans().await, Vec::<String>::new());
    let ttl: i64 = app
        .redis
        .query(redis::cmd("TTL").arg(s.dedup(&acme, &ended_digest)))
        .await;
    assert!(ttl > WEEK - 60 && ttl <= WEEK, "{ttl}");
    let exists: u64 = app.redis.query(redis::cmd("EXISTS").arg(&gone)).await;
    assert_eq!(exists, 0);
    // A run over converted data converts nothing.
    for shard in &shards {
        let mut cursor = 0;
        for calls in 0.. {
            assert!(calls < 10_000);
            let (next, n) = store.relayout_dedup_step(*shard, cursor, 50).await.unwrap();
            assert_eq!(n, 0);
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
    }
    // Every key answers as before, in every state.
    for (t, k, id) in &ids {
        replays_to(&app, t, k, id).await;
    }
    // (The first ten are running: this one is queued.)
    let (t, k, id) = &ids[15];
    assert_eq!(app.cancel(t, id).await.status(), StatusCode::OK);
    assert!(ended_for(&app.dedup_mapping(t, k).await, id));
    assert_eq!(app.dedup_orphans().await, Vec::<String>::new());
}

#[tokio::test]
async fn the_sweeper_settles_bucket_fields_an_older_build_left() {
    let app = TestApp::spawn().await;
    let store = Arc::new(app.store().await);
    let shard = app.shard("acme");
    let t = TenantId::parse("acme").unwrap();
    let id = admit_keyed(&app, "acme", "left", json!({})).await;
    let live = admit_keyed(&app, "acme", "live", json!({})).await;
    let run = store
        .start(shard, "w", 1, Duration::from_secs(120), 0)
        .await
        .unwrap()
        .started
        .remove(0);
    assert_eq!(run.id.as_str(), id);
    store
        .complete(
            shard,
            &run.id,
            run.fence,
            "w",
            &Outcome::Completed(json!({})),
        )
        .await
        .unwrap();
    // An older build ends an execution in the string-key form only: its field stays, and
    // there is no string key. And a field whose row is gone.
    let DedupMapping::Ended(mapped, _) = app.dedup_mapping("acme", "left").await else {
        panic!("not ended");
    };
    let digest = DedupKey::parse("left").unwrap().digest();
    let stray = DedupKey::parse("stray").unwrap().digest();
    // (Written as the store writes them: the id in its stored form, and at layout 5 the
    // fingerprint's 8 bytes after it, no separator.)
    let stored = |text: &str| {
        let (id, fp) = text.split_once(':').unwrap();
        let mut v = shard
            .stored_id(&ExecutionId::parse(id).unwrap())
            .as_ref()
            .to_vec();
        if shard.binary_ids() {
            v.extend_from_slice(&hex::decode(fp).unwrap());
        } else {
            v.push(b':');
            v.extend_from_slice(fp.as_bytes());
        }
        v
    };
    for (d, v) in [
        (&digest, stored(&mapped)),
        (
            &stray,
            stored(&format!("{}:0011223344556677", ExecutionId::new())),
        ),
    ] {
        let _: () = app
            .redis
            .query(
                redis::cmd("HSET")
                    .arg(shard.dedup_bucket(&t, d))
                    .arg(keys::dedup_field(d))
                    .arg(v),
            )
            .await;
    }
    let _: () = app
        .redis
        .query(redis::cmd("DEL").arg(shard.dedup(&t, &digest)))
        .await;
    assert_eq!(app.dedup_orphans().await.len(), 2);

    let repairs = sluice::sweeper::sweep_once(store.clone(), "test", Duration::from_secs(60))
        .await
        .expect("took the sweeper turn");
    assert_eq!(repairs.get("dedup"), Some(&2), "{repairs:?}");
    // Counted for operators: `repaired_dedup` in /api/queues (and /metrics).
    assert_eq!(app.counter("repaired_dedup").await, 2);
    assert!(ended_for(&app.dedup_mapping("acme", "left").await, &id));
    assert_eq!(app.dedup_mapping("acme", "stray").await, DedupMapping::Free);
    assert!(live_for(&app.dedup_mapping("acme", "live").await, &live));
    assert_eq!(app.dedup_orphans().await, Vec::<String>::new());
    // A pass over sound buckets repairs nothing.
    let repairs = sluice::sweeper::sweep_once(store, "test", Duration::from_secs(60))
        .await
        .expect("took the sweeper turn");
    assert_eq!(repairs.get("dedup"), None, "{repairs:?}");
}

/// What a replay answers beside a GET of the same execution: the body without
/// `deduplicated` (a replay's is true, a GET's false) and `estimated_start` (computed at the
/// moment of each answer from the measured start rate).
fn comparable(mut e: Value) -> Value {
    let o = e.as_object_mut().unwrap();
    o.remove("deduplicated");
    o.remove("estimated_start");
    e
}

/// Replays `body` with dedup key `key` and checks the answer: 200, marked replayed, the
/// execution `id` exactly as a GET answers it just after (no worker runs, nothing changes in
/// between), and as the first answer when given. Returns the replay's body.
async fn replay_is_get(
    app: &TestApp,
    key: &str,
    body: &Value,
    id: &str,
    state: &str,
    first: Option<&Value>,
) -> Value {
    let res = app.post_with_key("acme", key, body).await;
    assert_eq!(res.status(), StatusCode::OK, "{state}");
    assert_eq!(
        res.headers()
            .get("Idempotent-Replayed")
            .map(|v| v.to_str().unwrap()),
        Some("true"),
        "{state}"
    );
    let replay: Value = res.json().await.unwrap();
    assert_eq!(replay["deduplicated"], true, "{state}: {replay}");
    assert_eq!(id_of(&replay), id, "{state}");
    let get = app.execution("acme", id).await;
    assert_eq!(get["deduplicated"], false, "{state}: {get}");
    assert_eq!(
        comparable(replay.clone()),
        comparable(get),
        "{state}: the replay answers what GET does"
    );
    if let Some(first) = first {
        assert_eq!(
            comparable(replay.clone()),
            comparable(first.clone()),
            "{state}: the replay answers what the first admission did"
        );
    }
    replay
}

/// A replayed admission answers the whole execution (`admit.lua` names it, the server reads
/// it: `Store::view_in`), field for field what GET answers, in every state an execution with
/// a dedup key passes through: queued ready, waiting behind the tenant's limit, waiting
/// behind its concurrency key, scheduled, running, completed, failed, cancelled and queued
/// again after a retry; and right after its admission, what the 201 answered.
#[tokio::test]
async fn a_replay_answers_the_execution_as_get_does_in_every_state() {
    let app = TestApp::spawn().await;
    let store = app.store().await;
    let shard = app.shard("acme");
    app.put_tenant(
        "acme",
        &json!({"max_concurrent": 2, "max_concurrent_per_key": 1}),
    )
    .await;
    let body_of = |k: &str, extra: Value| {
        let mut b = json!({"flow_id": "demo.echo", "version": "v2", "params": {"k": k, "n": [1, 2.5, "x"]}});
        if let (Some(b), Some(e)) = (b.as_object_mut(), extra.as_object()) {
            b.extend(e.clone());
        }
        b
    };
    let specs = [
        ("run", json!({"priority": 2})),
        (
            "keyed-a",
            json!({"concurrency_key": "gpu", "max_attempts": 1}),
        ),
        ("keyed-b", json!({"concurrency_key": "gpu"})),
        ("behind", json!({"priority": 4})),
        ("later", json!({"delay": "1h"})),
    ];
    let mut ids = std::collections::HashMap::new();
    for (k, extra) in &specs {
        let body = body_of(k, extra.clone());
        let res = app.post_with_key("acme", k, &body).await;
        assert_eq!(res.status(), StatusCode::CREATED, "{k}");
        let first: Value = res.json().await.unwrap();
        let id = id_of(&first);
        ids.insert(*k, (id.clone(), body.clone()));
        // Right after its admission, before anything else happened to its tenant's order.
        if *k == "run" || *k == "later" {
            replay_is_get(&app, k, &body, &id, &format!("{k}: admitted"), Some(&first)).await;
        }
    }
    let replay = async |k: &str, state: &str| {
        let (id, body) = &ids[k];
        replay_is_get(&app, k, body, id, state, None).await
    };
    // Queued: ready, waiting behind the key's limit, waiting behind the tenant's, scheduled.
    let r = replay("run", "queued, first in line").await;
    assert_eq!(r["queue_state"], "ready", "{r}");
    let r = replay("keyed-b", "queued behind its key").await;
    assert_eq!(r["queue_state"], "waiting", "{r}");
    assert_eq!(r["queue_position"]["key"], 1, "{r}");
    let r = replay("later", "scheduled").await;
    assert_eq!(r["queue_state"], "scheduled", "{r}");
    // Running: the first two in the tenant's order ("run" by priority, then "keyed-a").
    let runs = store
        .start(shard, "w", 2, Duration::from_secs(120), 0)
        .await
        .unwrap()
        .started;
    let started: Vec<String> = runs.iter().map(|r| r.id.to_string()).collect();
    assert_eq!(
        started,
        vec![ids["run"].0.clone(), ids["keyed-a"].0.clone()]
    );
    let r = replay("run", "running").await;
    assert_eq!(r["status"], "running", "{r}");
    let r = replay("behind", "queued behind the tenant's limit").await;
    assert_eq!(r["queue_state"], "waiting", "{r}");
    // Ended: completed, failed (its one attempt), cancelled.
    let fence_of = |k: &str| runs.iter().find(|r| r.id.as_str() == ids[k].0).unwrap();
    let run = fence_of("run");
    store
        .complete(
            shard,
            &run.id,
            run.fence,
            "w",
            &Outcome::Completed(json!({"ok": [1, 2]})),
        )
        .await
        .unwrap();
    let r = replay("run", "completed").await;
    assert_eq!(r["output"], json!({"ok": [1, 2]}), "{r}");
    let keyed = fence_of("keyed-a");
    let failed = Outcome::Failed {
        kind: "handler_error".into(),
        message: "no luck".into(),
        retry_after: Some(Duration::from_secs(5)),
    };
    store
        .complete(shard, &keyed.id, keyed.fence, "w", &failed)
        .await
        .unwrap();
    let r = replay("keyed-a", "failed").await;
    assert_eq!(r["status"], "failed", "{r}");
    assert_eq!(r["error"]["message"], "no luck", "{r}");
    assert_eq!(
        app.cancel("acme", &ids["behind"].0).await.status(),
        StatusCode::OK
    );
    let r = replay("behind", "cancelled").await;
    assert_eq!(r["status"], "cancelled", "{r}");
    // Queued again by a retry: its history cleared, its key's place taken again.
    for k in ["keyed-a", "behind"] {
        assert_eq!(
            app.retry("acme", &ids[k].0).await.status(),
            StatusCode::OK,
            "{k}"
        );
        let r = replay(k, "queued again after a retry").await;
        assert_eq!(r["status"], "queued", "{r}");
    }
}

/// A replay whose execution goes while it is answered — force-deleted, or its retention
/// running out — answers either that execution as it was, or, the key being free, admits
/// anew: every concurrent replay gets one of those, never an error, and the key ends up
/// naming exactly one new execution. (`admit.lua` names the execution and the server reads
/// it after: between the two it may go, and the server then decides the admission again.)
#[tokio::test]
async fn a_replay_racing_a_force_delete_or_the_rows_expiry_answers_the_old_or_one_new() {
    const REPLAYS: usize = 24;
    const ROUNDS: usize = 4;
    let app =
        Arc::new(TestApp::spawn_with(|c| c.api.max_anonymous_connections_per_address = 0).await);
    let store = app.store().await;
    for round in 0..ROUNDS {
        // Even rounds: a queued execution force-deleted. Odd: a completed one whose row's
        // retention runs out (its TTL cut to nothing), as Redis expires it. A tenant each.
        let expire = round % 2 == 1;
        let tenant = format!("racer-{round}");
        let shard = app.shard(&tenant);
        let key = "race".to_owned();
        let body = json!({"flow_id": "demo.echo", "params": {"round": round}});
        let res = app.post_with_key(&tenant, &key, &body).await;
        assert_eq!(res.status(), StatusCode::CREATED);
        let old = id_of(&res.json().await.unwrap());
        if expire {
            let runs = store
                .start(shard, "w", 1, Duration::from_secs(120), 0)
                .await
                .unwrap()
                .started;
            assert_eq!(runs[0].id.as_str(), old);
            store
                .complete(
                    shard,
                    &runs[0].id,
                    runs[0].fence,
                    "w",
                    &Outcome::Completed(json!(1)),
                )
                .await
                .unwrap();
        }
        let barrier = Arc::new(Barrier::new(REPLAYS + 1));
        let mut tasks = Vec::new();
        for _ in 0..REPLAYS {
            let (app, barrier, key, body, tenant) = (
                app.clone(),
                barrier.clone(),
                key.clone(),
                body.clone(),
                tenant.clone(),
            );
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                let res = app.post_with_key(&tenant, &key, &body).await;
                let status = res.status();
                let replayed = res.headers().get("Idempotent-Replayed").is_some();
                (status, replayed, res.json::<Value>().await.unwrap())
            }));
        }
        barrier.wait().await;
        if expire {
            let row = shard.row(&ExecutionId::parse(&old).unwrap());
            let _: i64 = app.redis.query(redis::cmd("PEXPIRE").arg(row).arg(1)).await;
        } else {
            let res = app.delete(&tenant, &old, true).await;
            assert_eq!(res.status(), StatusCode::NO_CONTENT);
        }
        let (mut olds, mut created, mut news) = (0, 0, std::collections::HashSet::new());
        for t in tasks {
            let (status, replayed, b) = t.await.unwrap();
            match status {
                StatusCode::OK => {
                    assert!(replayed, "round {round}: {b}");
                    assert_eq!(b["deduplicated"], true, "round {round}: {b}");
                    if id_of(&b) == old {
                        olds += 1;
                        let want = if expire { "completed" } else { "queued" };
                        assert_eq!(b["status"], want, "round {round}: {b}");
                    } else {
                        news.insert(id_of(&b));
                    }
                }
                StatusCode::CREATED => {
                    created += 1;
                    news.insert(id_of(&b));
                }
                other => panic!("round {round}: a replay answered {other}: {b}"),
            }
        }
        // Whoever came after the end found the key free: one of them admitted, the others
        // replayed that one.
        assert!(news.len() <= 1, "round {round}: new ids {news:?}");
        assert_eq!(created, news.len(), "round {round}: {created} created");
        // One more, after the end for sure: that new execution, or the first one. An expiry's
        // end is Redis's to tell: the row may still be there in the millisecond after
        // PEXPIRE, and a post that fast replayed the old execution (8 of 10 runs on an idle
        // machine, cluster mode). Until Redis no longer has it (EXISTS expires it once due).
        if expire {
            let row = shard.row(&ExecutionId::parse(&old).unwrap());
            let deadline = Instant::now() + Duration::from_secs(5);
            while app.redis.query::<i64>(redis::cmd("EXISTS").arg(&row)).await == 1 {
                assert!(
                    Instant::now() < deadline,
                    "round {round}: {row:?} never expired"
                );
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        let res = app.post_with_key(&tenant, &key, &body).await;
        let want = if news.is_empty() {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        };
        let status = res.status();
        let answer: Value = res.json().await.unwrap();
        assert_eq!(status, want, "round {round}: {answer}");
        let last = id_of(&answer);
        assert_ne!(last, old, "round {round}");
        news.insert(last.clone());
        assert_eq!(news.len(), 1, "round {round}: new ids {news:?}");
        let page = app.page(&tenant, &format!("dedup_key={key}")).await;
        assert_eq!(page["total"], 1, "round {round}: {page}");
        assert_eq!(id_of(&page["executions"][0]), last, "round {round}");
        assert!(live_for(&app.dedup_mapping(&tenant, &key).await, &last));
        assert_eq!(
            app.get_execution(&tenant, &old).await.status(),
            StatusCode::NOT_FOUND,
            "round {round}"
        );
        eprintln!("round {round}: {olds} answered the old execution, {created} admitted anew");
    }
    assert_eq!(app.dedup_orphans().await, Vec::<String>::new());
}

/// A replayed admission alone in its call is answered before the call sets the helpers'
/// per-call state afresh (`admit.lua` runs `begin_call()` past the dedup lookup, where a
/// replay has been answered), and answers the execution's id alone (`dup:<id>` before; the
/// server reads it back as `{'dup', id}`). The admissions after a replay must each still get
/// their own state: Redis's clock read in their own call (the row's `c`), the quota read
/// afresh (the server's `max_queued` of 2 refuses the third; replays count nothing). The
/// library is called directly (FCALL) on a Redis of its own, so that no other call (`serve`'s
/// background work) sets the state afresh between them.
#[tokio::test]
async fn an_admission_after_a_replay_reads_its_own_clock_and_limits() {
    let redis = TestRedis::start_standalone().await;
    let mut c = redis.conn().await;
    sluice::store::load_library(&mut c).await.unwrap();
    let s = crate::helpers::shard_no(3);
    let acme = TenantId::parse("acme").unwrap();
    // `admit_call`'s admission with dedup key `key` (its bucket and string key declared, its
    // digest and bucket field given), under a server `max_queued` of 2.
    let keyed = |id: &ExecutionId, key: &str| {
        let (mut k, mut a) = crate::fences::admit_call(s, s, id);
        let d = DedupKey::parse(key).unwrap().digest();
        k.extend([s.dedup_bucket(&acme, &d), s.dedup(&acme, &d)]);
        a[2] = "2".into();
        a[14] = key.into();
        a[23] = keys::dedup_field(&d).into();
        a[15] = d.into();
        (k, a)
    };
    let call = |(k, a): (Vec<String>, Vec<Vec<u8>>)| {
        let redis = &redis;
        async move { crate::fences::fcall(redis, "admit", &k, &a).await.unwrap() }
    };
    let mut last = 0;
    for key in ["first", "second"] {
        // Redis's clock past the last admission's millisecond (awaited, at most 2 s).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        loop {
            let (secs, us): (u64, u64) = redis.query(&mut redis::cmd("TIME")).await;
            if secs * 1000 + us / 1000 > last {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "Redis's clock stood still"
            );
            tokio::task::yield_now().await;
        }
        let id = ExecutionId::new();
        let reply = call(keyed(&id, key)).await;
        assert_eq!(crate::fences::admit_tag(reply), "new", "{key}");
        let created: u64 = redis
            .query(redis::cmd("HGET").arg(s.row(&id)).arg("c"))
            .await;
        assert!(
            created > last,
            "{key} was admitted at {created}, not after {last}"
        );
        last = created;
        for _ in 0..2 {
            // Another id minted by the caller, the same request: the first one's id, alone.
            let reply = call(keyed(&ExecutionId::new(), key)).await;
            assert_eq!(
                reply,
                RedisValue::BulkString(s.stored_id(&id).as_ref().to_vec())
            );
        }
    }
    let reply = call(keyed(&ExecutionId::new(), "third")).await;
    assert_eq!(crate::fences::admit_tag(reply), "full");
}

/// At layout 5 a stored id is its 16 raw bytes and a fingerprint its 8
/// (`Shard::stored_fingerprint`), which may hold ':' (layout 4's separator), '{', '}', NUL or
/// a newline: the mapping `<id 16><fingerprint 8>` is read by position, so a replay answers
/// the holder's id whole, a conflict names it whole, and the holder's end moves the mapping
/// that names it. An id and a fingerprint chosen to hold those bytes; the library called
/// directly (FCALL), as the store calls it on a layout-5 shard.
#[tokio::test]
async fn a_dedup_mapping_of_a_binary_id_holding_a_colon_replays_and_conflicts_whole() {
    let redis = TestRedis::start_standalone().await;
    let mut c = redis.conn().await;
    sluice::store::load_library(&mut c).await.unwrap();
    let s = ShardMap::new(16, Layout::Binary).shard(3);
    let acme = TenantId::parse("acme").unwrap();
    let fingerprint: &[u8] = &[b':', 0x01, b'{', 0, b'}', b'\n', 0xff, b':'];
    let other_request: &[u8] = &[b':', 0x01, b'{', 0, b'}', b'\n', 0xff, b';'];
    let keyed = |id: &ExecutionId, fingerprint: &[u8]| {
        let (mut k, mut a) = crate::fences::admit_call(s, s, id);
        let d = DedupKey::parse("k").unwrap().digest();
        k.extend([s.dedup_bucket(&acme, &d), s.dedup(&acme, &d)]);
        a[14] = b"k".to_vec();
        a[23] = keys::dedup_field(&d).into();
        a[15] = d.into();
        a[16] = fingerprint.to_vec();
        (k, a)
    };
    let call = |(k, a): (Vec<String>, Vec<Vec<u8>>)| {
        let redis = &redis;
        async move { crate::fences::fcall(redis, "admit", &k, &a).await.unwrap() }
    };
    let holder = ExecutionId::from_bytes(&[
        0x01, 0x8f, b':', b'{', 0, b'}', b':', b'\n', 0xff, b':', 0, 0x3a, b':', 1, 2, b':',
    ])
    .unwrap();
    let raw = holder.to_bytes();
    assert_eq!(raw.iter().filter(|&&b| b == b':').count(), 6);
    assert_eq!(s.stored_id(&holder).as_ref(), &raw[..]);
    assert_eq!(
        crate::fences::admit_tag(call(keyed(&holder, fingerprint)).await),
        "new"
    );
    let d = DedupKey::parse("k").unwrap().digest();
    let mapped: Vec<u8> = redis
        .query(
            redis::cmd("HGET")
                .arg(s.dedup_bucket(&acme, &d))
                .arg(keys::dedup_field(&d)),
        )
        .await;
    let mut expected = raw.to_vec();
    expected.extend_from_slice(fingerprint);
    assert_eq!(mapped, expected, "24 bytes, no separator");

    // Another id, the same request: the holder's id, all 16 bytes.
    let replay = call(keyed(&ExecutionId::new(), fingerprint)).await;
    assert_eq!(replay, RedisValue::BulkString(raw.to_vec()));
    // Another id, another request: a conflict naming the holder, all 16 bytes.
    let conflict = call(keyed(&ExecutionId::new(), other_request)).await;
    let entries: Vec<Vec<Vec<u8>>> = redis::from_redis_value(conflict).unwrap();
    assert_eq!(entries, [vec![b"conflict".to_vec(), raw.to_vec()]]);
    assert_eq!(
        ExecutionId::from_reply(&entries[0][1]).unwrap(),
        holder,
        "the store reads the holder back"
    );
    // Nothing else was admitted: one row, one listing member.
    let members: Vec<Vec<u8>> = redis
        .query(redis::cmd("ZRANGE").arg(s.listing(&acme)).arg(0).arg(-1))
        .await;
    assert_eq!(members.len(), 1);
    assert!(members[0].ends_with(&raw));
}

/// The one run whose dedup key another execution may hold: its execution force-deleted (the
/// key released) and the key admitted again while its handler still runs. Its completion
/// must not touch the new execution's mapping (the deleted run is buried, not finished:
/// `dedup_end()` never sees it), so the key still answers the new execution: a replay
/// returns it, `?dedup_key=` lists it, its mapping is live and names it. Layout 5's plan to
/// end a mapping without reading it first (docs/layout-5-plan.md §1.2) rests on this.
#[tokio::test]
async fn a_force_deleted_runs_completion_leaves_the_readmitted_key_alone() {
    let app = TestApp::spawn().await;
    let store = Arc::new(app.store().await);
    let shard = app.shard("acme");
    let old = admit_keyed(&app, "acme", "k", json!({})).await;
    let run = store
        .start(shard, "w", 1, Duration::from_secs(120), 0)
        .await
        .unwrap()
        .started
        .remove(0);
    assert_eq!(run.id.as_str(), old);
    assert_eq!(
        app.delete("acme", &old, true).await.status(),
        StatusCode::NO_CONTENT
    );
    let new = admit_keyed(&app, "acme", "k", json!({})).await;
    assert_ne!(new, old);
    // The old handler finishes now, with its lease's fence: told its execution was deleted.
    let done = store
        .complete(
            shard,
            &run.id,
            run.fence,
            "w",
            &Outcome::Completed(json!({})),
        )
        .await
        .unwrap();
    assert!(matches!(done, Completion::Deleted), "{done:?}");
    assert_eq!(
        app.get_execution("acme", &old).await.status(),
        StatusCode::NOT_FOUND
    );
    replays_to(&app, "acme", "k", &new).await;
    assert!(live_for(&app.dedup_mapping("acme", "k").await, &new));
    assert_eq!(app.dedup_orphans().await, Vec::<String>::new());
}
