//! A tenant's storage bounds (`max_bytes`, `max_retained`): what it keeps on Redis is counted
//! in logical bytes (512 per execution + its params + its output + its error message, as
//! stored) and retained terminal rows; an admission over a bound is refused (429
//! `tenant_storage_full` with `Retry-After`, 413 `execution_too_large` when it can never fit)
//! with nothing written; and the counts stay exact through completion, failure, cancel,
//! retry, force delete, concurrent admissions — and rows expiring by their TTL, which nobody
//! lists or sweeps.
//!
//! Runs start and end through the store as a worker's calls do (`start`, `complete`): the
//! same scripts as `sluice worker`, with exact counts and no timing.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice::domain::{ExecutionId, Status, TenantId};
use sluice::store::{Completion, Outcome, ROW_BYTES};

use crate::helpers::{TestApp, problem_code};

/// The tenant as `GET /api/tenants/{t}` shows it.
async fn tenant(app: &TestApp, t: &str) -> Value {
    app.get_json(None, &format!("/api/tenants/{t}")).await
}

/// Its `storage` (bytes, retained) as exact numbers.
async fn storage(app: &TestApp, t: &str) -> (u64, u64) {
    let s = tenant(app, t).await["storage"].clone();
    (
        s["bytes"].as_u64().unwrap(),
        s["retained"].as_u64().unwrap(),
    )
}

/// Params of exactly `n` bytes as canonical JSON (`{"b":"xx…"}`).
fn params_of(n: usize) -> Value {
    json!({ "b": "x".repeat(n - 8) })
}

/// The logical size of an execution admitted with `params_of(n)`, before any output.
fn size_of(n: usize) -> u64 {
    ROW_BYTES + n as u64
}

async fn admit_sized(app: &TestApp, t: &str, n: usize) -> String {
    app.admit_with(t, json!({"flow_id": "demo.echo", "params": params_of(n)}))
        .await
}

fn retry_after(res: &reqwest::Response) -> u64 {
    res.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// The raw counters in the tenant's configuration hash and the sum of its expiry buckets
/// (bytes, rows): what the scripts wrote, not what the API computes from them.
async fn raw(app: &TestApp, t: &str) -> (Option<i64>, Option<i64>, i64, i64) {
    let s = app.shard(t);
    let tid = TenantId::parse(t).unwrap();
    let (bytes, rows): (Option<i64>, Option<i64>) = app
        .redis
        .query(
            redis::cmd("HMGET")
                .arg(s.tenant_config(&tid))
                .arg("u_bytes")
                .arg("u_rows"),
        )
        .await;
    let buckets: std::collections::HashMap<String, String> = app
        .redis
        .query(redis::cmd("HGETALL").arg(s.retained(&tid)))
        .await;
    let (mut b, mut r) = (0, 0);
    for v in buckets.values() {
        let (x, y) = v.split_once(':').unwrap();
        b += x.parse::<i64>().unwrap();
        r += y.parse::<i64>().unwrap();
    }
    (bytes, rows, b, r)
}

#[tokio::test]
async fn big_params_fill_the_byte_bound_and_the_next_admission_is_refused_with_nothing_written() {
    let app = TestApp::spawn().await;
    let n = 20_000;
    // Room for three, not four.
    let bound = 4 * size_of(n) - 1;
    let t = app.put_tenant("acme", &json!({"max_bytes": bound})).await;
    assert_eq!(t["max_bytes"], bound);
    assert_eq!(
        t["storage"],
        json!({"bytes": 0, "retained": 0, "next_expiry": null})
    );
    for _ in 0..3 {
        admit_sized(&app, "acme", n).await;
    }
    assert_eq!(storage(&app, "acme").await, (3 * size_of(n), 0));

    let before = app.redis.dump().await;
    let res = app
        .post_execution(
            "acme",
            &json!({"flow_id": "demo.echo", "params": params_of(n)}),
        )
        .await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    // Nothing of its retains expires soon: the answer says to look again within the hour.
    assert_eq!(retry_after(&res), 3600);
    assert_eq!(problem_code(res).await, "tenant_storage_full");
    // The same as a batch item.
    let small = 100;
    let batch = app
        .as_tenant(reqwest::Method::POST, "/api/executions/batch", "acme")
        .json(&json!({"items": [
            {"flow_id": "demo.echo", "params": params_of(n)},
        ]}))
        .send()
        .await
        .unwrap();
    assert_eq!(batch.status(), StatusCode::OK);
    let answer: Value = batch.json().await.unwrap();
    assert_eq!(answer["results"][0]["status"], 429, "{answer}");
    assert_eq!(
        answer["results"][0]["problem"]["code"],
        "tenant_storage_full"
    );
    assert_eq!(
        app.redis.dump().await,
        before,
        "a refused admission writes nothing"
    );
    assert_eq!(storage(&app, "acme").await, (3 * size_of(n), 0));
    // What is left is room for a smaller one, and another tenant is not held back at all.
    assert!(3 * size_of(n) + size_of(small) <= bound);
    admit_sized(&app, "acme", small).await;
    assert_eq!(
        storage(&app, "acme").await,
        (3 * size_of(n) + size_of(small), 0)
    );
    admit_sized(&app, "other", n).await;
    assert_eq!(storage(&app, "other").await, (size_of(n), 0));
}

#[tokio::test]
async fn an_execution_larger_than_max_bytes_is_refused_with_413_as_it_can_never_fit() {
    let app = TestApp::spawn().await;
    app.put_tenant("acme", &json!({"max_bytes": 1_000})).await;
    let before = app.redis.dump().await;
    // 512 + 600 > 1,000, with nothing else kept.
    let res = app
        .post_execution(
            "acme",
            &json!({"flow_id": "demo.echo", "params": params_of(600)}),
        )
        .await;
    assert_eq!(res.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["code"], "execution_too_large", "{body}");
    let batch = app
        .as_tenant(reqwest::Method::POST, "/api/executions/batch", "acme")
        .json(&json!({"items": [{"flow_id": "demo.echo", "params": params_of(600)}]}))
        .send()
        .await
        .unwrap();
    let answer: Value = batch.json().await.unwrap();
    assert_eq!(answer["results"][0]["status"], 413, "{answer}");
    assert_eq!(app.redis.dump().await, before);
    // One that fits is admitted.
    admit_sized(&app, "acme", 400).await;
    assert_eq!(storage(&app, "acme").await, (size_of(400), 0));
}

#[tokio::test]
async fn a_dry_run_answers_the_storage_refusal_and_writes_nothing() {
    let app = TestApp::spawn().await;
    app.put_tenant(
        "acme",
        &json!({"max_bytes": 2 * size_of(100), "max_retained": 1}),
    )
    .await;
    let dry = |body: Value| {
        let app = &app;
        async move {
            let res = app
                .as_tenant(reqwest::Method::POST, "/api/executions/dry-run", "acme")
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(res.status(), StatusCode::OK);
            res.json::<Value>().await.unwrap()
        }
    };
    let too_big = dry(json!({"flow_id": "demo.echo", "params": params_of(1_000)})).await;
    assert_eq!(too_big["decision"], "refuse");
    assert_eq!(too_big["reason"], "execution_too_large");
    let id = admit_sized(&app, "acme", 100).await;
    app.cancel("acme", &id).await;
    let before = app.redis.dump().await;
    let full = dry(json!({"flow_id": "demo.echo", "params": params_of(100)})).await;
    assert_eq!(full["decision"], "refuse", "{full}");
    assert_eq!(full["reason"], "tenant_storage_full");
    // Its one retained row expires in 30 days: look again within the hour.
    assert_eq!(full["retry_after"], 3600);
    assert_eq!(app.redis.dump().await, before);
}

#[tokio::test]
async fn admit_then_cancel_past_max_retained_answers_429_and_retry_frees_a_row() {
    let app = TestApp::spawn().await;
    app.put_tenant("acme", &json!({"max_retained": 5})).await;
    let mut cancelled = Vec::new();
    for _ in 0..5 {
        let id = admit_sized(&app, "acme", 10).await;
        assert_eq!(app.cancel("acme", &id).await.status(), StatusCode::OK);
        cancelled.push(id);
    }
    assert_eq!(storage(&app, "acme").await, (5 * size_of(10), 5));
    let before = app.redis.dump().await;
    let res = app
        .post_execution(
            "acme",
            &json!({"flow_id": "demo.echo", "params": params_of(10)}),
        )
        .await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(retry_after(&res) >= 1);
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["code"], "tenant_storage_full");
    assert!(
        body["detail"].as_str().unwrap().contains("max_retained"),
        "{body}"
    );
    assert_eq!(app.redis.dump().await, before);

    // A retry adds nothing (its row stops being retained): allowed at the bound, and the
    // room it makes lets one admission in.
    assert_eq!(
        app.retry("acme", &cancelled[0]).await.status(),
        StatusCode::OK
    );
    assert_eq!(storage(&app, "acme").await, (5 * size_of(10), 4));
    admit_sized(&app, "acme", 10).await;
    assert_eq!(storage(&app, "acme").await, (6 * size_of(10), 4));
    // A bound lowered under the usage refuses even a retry, which would leave it over.
    app.put_tenant("acme", &json!({"max_retained": 3})).await;
    let res = app.retry("acme", &cancelled[1]).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(problem_code(res).await, "tenant_storage_full");
    assert_eq!(storage(&app, "acme").await, (6 * size_of(10), 4));
}

#[tokio::test]
async fn counts_fall_when_retained_rows_expire_by_their_ttl_without_a_listing_or_sweep() {
    // Rows live 10 s after they end (long enough for the steps before the refusal below on a
    // busy machine); the expiry buckets are then 1 s wide. No sweeper.
    let app = TestApp::spawn_with(|c| {
        c.api.retention_secs = Some(10);
        c.api.sweep_interval_secs = 0;
    })
    .await;
    app.put_tenant("acme", &json!({"max_retained": 3})).await;
    let mut rows = Vec::new();
    for _ in 0..3 {
        let id = admit_sized(&app, "acme", 50).await;
        app.cancel("acme", &id).await;
        rows.push(id);
    }
    assert_eq!(storage(&app, "acme").await, (3 * size_of(50), 3));
    let res = app
        .post_execution("acme", &json!({"flow_id": "demo.echo"}))
        .await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    // The oldest rows expire within the retention, their bucket ends at most 1 s later.
    assert!(retry_after(&res) <= 11, "{:?}", res.headers());

    // Redis deletes the rows by their TTL; nobody lists them and no sweep runs.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let t = tenant(&app, "acme").await;
        if t["storage"]["retained"] == 0 {
            assert_eq!(
                t["storage"],
                json!({"bytes": 0, "retained": 0, "next_expiry": null})
            );
            break;
        }
        assert!(Instant::now() < deadline, "counts never fell: {t}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let s = app.shard("acme");
    let acme = TenantId::parse("acme").unwrap();
    for id in &rows {
        let gone: i64 = app
            .redis
            .query(redis::cmd("EXISTS").arg(s.row(&ExecutionId::parse(id).unwrap())))
            .await;
        assert_eq!(gone, 0, "the row expired");
    }
    // Nothing met them: their index entries are still there.
    let (min, max) = sluice::store::keys::listing_range(Some(Status::Cancelled));
    let indexed: i64 = app
        .redis
        .query(
            redis::cmd("ZLEXCOUNT")
                .arg(s.listing(&acme))
                .arg(min)
                .arg(max),
        )
        .await;
    assert_eq!(indexed, 3);
    // The next admission is decided on the drained counts, and its script wrote them.
    admit_sized(&app, "acme", 50).await;
    assert_eq!(
        raw(&app, "acme").await,
        (Some(size_of(50) as i64), None, 0, 0)
    );
    assert_eq!(storage(&app, "acme").await, (size_of(50), 0));
}

#[tokio::test]
async fn completions_failures_retries_and_force_deletes_keep_the_counts_exact() {
    let app = TestApp::spawn().await;
    let store = app.store().await;
    let shard = app.shard("acme");
    // Distinct sizes, so any mix-up shows.
    let (pa, pb, pc, pd) = (100, 210, 330, 470);
    let a = admit_sized(&app, "acme", pa).await;
    let b = admit_sized(&app, "acme", pb).await;
    assert_eq!(storage(&app, "acme").await, (size_of(pa) + size_of(pb), 0));
    let started = app.started_by_hand("acme", 2).await;
    assert_eq!(
        started.iter().map(|(id, _)| id.clone()).collect::<Vec<_>>(),
        [a.clone(), b.clone()]
    );
    let id = |s: &str| ExecutionId::parse(s).unwrap();
    // a completes with an output; b fails with a message, retryable first (the message is
    // kept while it waits), then for good.
    let output = json!({"result": "y".repeat(1_000)});
    let out_len = output.to_string().len() as u64;
    let done = store
        .complete(
            shard,
            &id(&a),
            started[0].1,
            "w",
            &Outcome::Completed(output),
        )
        .await
        .unwrap();
    assert_eq!(done, Completion::Done(Status::Completed));
    let failed = store
        .complete(
            shard,
            &id(&b),
            started[1].1,
            "w",
            &Outcome::Failed {
                kind: "handler_error".into(),
                message: "e".repeat(300),
                retry_after: Some(Duration::ZERO),
            },
        )
        .await
        .unwrap();
    assert_eq!(failed, Completion::Retrying);
    let sa = size_of(pa) + out_len;
    assert_eq!(storage(&app, "acme").await, (sa + size_of(pb) + 300, 1));
    // Its second run (the retry is due at once) fails for good with a shorter message.
    let again = app.started_by_hand("acme", 1).await;
    assert_eq!(again[0].0, b);
    let failed = store
        .complete(
            shard,
            &id(&b),
            again[0].1,
            "w",
            &Outcome::Failed {
                kind: "handler_error".into(),
                message: "f".repeat(40),
                retry_after: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(failed, Completion::Done(Status::Failed));
    let sb = size_of(pb) + 40;
    assert_eq!(storage(&app, "acme").await, (sa + sb, 2));
    // c is cancelled while queued; d waits.
    let c = admit_sized(&app, "acme", pc).await;
    let d = admit_sized(&app, "acme", pd).await;
    app.cancel("acme", &c).await;
    assert_eq!(
        storage(&app, "acme").await,
        (sa + sb + size_of(pc) + size_of(pd), 3)
    );
    let (_, _, bucket_bytes, bucket_rows) = raw(&app, "acme").await;
    assert_eq!(
        (bucket_bytes, bucket_rows),
        ((sa + sb + size_of(pc)) as i64, 3),
        "the retained rows are in the expiry buckets"
    );

    // Retry of b: its row is no longer retained and its message goes.
    assert_eq!(app.retry("acme", &b).await.status(), StatusCode::OK);
    assert_eq!(
        storage(&app, "acme").await,
        (sa + size_of(pb) + size_of(pc) + size_of(pd), 2)
    );
    // Force delete of the completed a (retained), then of the queued b.
    assert_eq!(
        app.delete("acme", &a, true).await.status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        storage(&app, "acme").await,
        (size_of(pb) + size_of(pc) + size_of(pd), 1)
    );
    assert_eq!(
        app.delete("acme", &b, true).await.status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(storage(&app, "acme").await, (size_of(pc) + size_of(pd), 1));
    // d runs and is force-deleted while it runs: its bytes go at once, and its late report
    // (with an output) counts nothing.
    let run = app.started_by_hand("acme", 1).await;
    assert_eq!(run[0].0, d);
    assert_eq!(
        app.delete("acme", &d, true).await.status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(storage(&app, "acme").await, (size_of(pc), 1));
    let late = store
        .complete(
            shard,
            &id(&d),
            run[0].1,
            "w",
            &Outcome::Completed(json!("late")),
        )
        .await
        .unwrap();
    assert_eq!(late, Completion::Deleted);
    assert_eq!(storage(&app, "acme").await, (size_of(pc), 1));
    // Retry of the cancelled c, then its force delete: nothing is left, not even a field.
    assert_eq!(app.retry("acme", &c).await.status(), StatusCode::OK);
    assert_eq!(storage(&app, "acme").await, (size_of(pc), 0));
    assert_eq!(
        app.delete("acme", &c, true).await.status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(storage(&app, "acme").await, (0, 0));
    assert_eq!(raw(&app, "acme").await, (None, None, 0, 0));
    let buckets: i64 = app
        .redis
        .query(redis::cmd("EXISTS").arg(shard.retained(&TenantId::parse("acme").unwrap())))
        .await;
    assert_eq!(buckets, 0, "every bucket emptied and gone");
}

#[tokio::test]
async fn concurrent_admissions_fill_the_byte_bound_exactly() {
    let app = std::sync::Arc::new(TestApp::spawn().await);
    let n = 1_000;
    // Room for exactly 7.
    app.put_tenant("acme", &json!({"max_bytes": 7 * size_of(n) + 100}))
        .await;
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(20));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..20 {
        let (app, barrier) = (app.clone(), barrier.clone());
        tasks.spawn(async move {
            barrier.wait().await;
            app.post_execution(
                "acme",
                &json!({"flow_id": "demo.echo", "params": params_of(n)}),
            )
            .await
            .status()
        });
    }
    let (mut created, mut refused) = (0, 0);
    while let Some(status) = tasks.join_next().await {
        match status.unwrap() {
            StatusCode::CREATED => created += 1,
            StatusCode::TOO_MANY_REQUESTS => refused += 1,
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!((created, refused), (7, 13));
    assert_eq!(storage(&app, "acme").await, (7 * size_of(n), 0));
    assert_eq!(app.row_count().await, 7);
}

#[tokio::test]
async fn the_sweeper_recounts_counters_that_drifted() {
    let app = TestApp::spawn_with(|c| c.api.sweep_interval_secs = 0).await;
    let store = std::sync::Arc::new(app.store().await);
    let queued = admit_sized(&app, "acme", 100).await;
    let done = admit_sized(&app, "acme", 200).await;
    app.cancel("acme", &done).await;
    let _ = queued;
    let exact = (size_of(100) + size_of(200), 1);
    assert_eq!(storage(&app, "acme").await, exact);
    // What an execution ended by an older build's worker, or a deleted configuration, leaves.
    let cfg = app
        .shard("acme")
        .tenant_config(&TenantId::parse("acme").unwrap());
    let _: () = app
        .redis
        .query(
            redis::cmd("HSET")
                .arg(&cfg)
                .arg("u_bytes")
                .arg(99_999)
                .arg("u_rows")
                .arg(7),
        )
        .await;
    assert_eq!(storage(&app, "acme").await, (99_999, 7));
    let repairs = sluice::sweeper::sweep_once(store, "test", Duration::from_secs(60))
        .await
        .expect("took the sweeper turn");
    assert_eq!(repairs.get("usage"), Some(&1), "{repairs:?}");
    assert_eq!(storage(&app, "acme").await, exact);
}
