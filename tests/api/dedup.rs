//! Dedup mappings in their two forms (`dedup_holder()` in `migrations-lua/common.lua`): a live
//! execution's is a field of its tenant's bucket, an ended one's the string key with the dedup
//! TTL. Every end of an execution moves it in the same call, a retry moves it back, a force
//! delete frees it; the answers a client gets (replay, conflict, the listing's filter) are
//! the same in every state; mappings of the older form are converted by
//! `Store::relayout_dedup_step`, and the sweeper settles what a process of an older build left.

use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice::domain::{DedupKey, ExecutionId, TenantId};
use sluice::store::Outcome;
use sluice::store::keys::{self, KeyKind};

use crate::helpers::{DedupMapping, TestApp, problem_code};

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
        let fields: Vec<(String, String)> = app.redis.query(redis::cmd("HGETALL").arg(&key)).await;
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
    for (d, v) in [
        (&digest, mapped.clone()),
        (&stray, format!("{}:0011223344556677", ExecutionId::new())),
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
