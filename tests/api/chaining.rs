//! A run that ends starts its shard's next execution on its slot, in the completion's own call:
//! a busy worker needs one script call per execution, not a completion and a start. While
//! another shard waits for a slot, a freed slot goes to the shards in proportion to their
//! runnable weight; and a completion whose answer was lost has its next run adopted, never run twice or left to
//! its lease.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{Value, json};

use crate::helpers::{TestApp, TestWorker};

/// Long enough that nothing a test sees can come from it.
const AN_HOUR_MS: &str = "3600000";

/// Script calls over every master since the last `reset_stats`.
async fn script_calls(app: &TestApp) -> u64 {
    app.redis
        .command_calls()
        .await
        .into_iter()
        .find(|(c, _)| c == "fcall")
        .map_or(0, |(_, n)| n)
}

/// Admits `n` `demo.echo` executions of `tenant`; their ids, in order.
async fn admit_many(app: &TestApp, tenant: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        ids.push(
            app.admit_with(tenant, json!({"flow_id": "demo.echo", "params": {"i": i}}))
                .await,
        );
    }
    ids
}

/// Waits until every one of `ids` is terminal (at most 30 s); their rows.
async fn all_terminal(app: &TestApp, tenant: &str, ids: &[String]) -> Vec<Value> {
    let mut rows = Vec::with_capacity(ids.len());
    for id in ids {
        rows.push(app.wait_terminal(tenant, id, Duration::from_secs(30)).await);
    }
    rows
}

/// An RFC 3339 time of the API (`...:05.2Z`, `...:05.25Z`, `...:05.251Z`) with its fraction
/// written out to milliseconds, so that times sort as text.
fn sortable(t: &str) -> String {
    let t = t.strip_suffix('Z').unwrap();
    let (whole, fraction) = t.split_once('.').unwrap_or((t, ""));
    format!("{whole}.{fraction:0<3}Z")
}

#[tokio::test]
async fn a_busy_worker_makes_one_call_per_execution() {
    let app = TestApp::spawn().await;
    let ids = admit_many(&app, "acme", 60).await;
    app.redis.reset_stats().await;
    // No orphan scans or heartbeats in the count: only starts and completions. One slot, so
    // without passing it on every execution would need a start call of its own.
    let _w = TestWorker::spawn(
        &app.redis,
        &[
            "--concurrency",
            "1",
            "--scan-ms",
            AN_HOUR_MS,
            "--heartbeat-ms",
            AN_HOUR_MS,
            "--lease-ttl-ms",
            "7200000",
        ],
    );
    let rows = all_terminal(&app, "acme", &ids).await;
    assert!(rows.iter().all(|r| r["status"] == "completed"));
    let calls = script_calls(&app).await;
    // 60 completions, each starting the next. Besides them a worker that starts makes one
    // start call and one orphan scan per shard it serves, and a few start calls find the
    // shard drained at the end. A completion and a
    // start apiece would be 120 and more.
    let shards = app.store().await.shards().all().count() as u64;
    let most = 60 + 3 * shards + 12;
    assert!(
        (60..=most).contains(&calls),
        "{calls} script calls for 60 executions (at most {most})"
    );
}

/// Two saturating tenants in different shards, weights 1 and 3, one worker slot: the slot
/// goes to the shards in proportion to their runnable weight (a completion chains its own
/// shard's next run only when its shard is the one picked, else it hands the slot over), so
/// while both have work the heavier tenant gets three starts of every four.
#[tokio::test]
async fn a_freed_slot_goes_to_the_shards_in_proportion_to_their_weight() {
    let app = TestApp::spawn().await;
    let a = "acme";
    let b = (0..100)
        .map(|i| format!("tenant-{i}"))
        .find(|t| app.shard(t) != app.shard(a))
        .unwrap();
    app.put_tenant(&b, &json!({"weight": 3})).await;
    const EACH: usize = 80;
    let sleep = |i: usize| json!({"flow_id": "demo.sleep", "params": {"ms": 5, "i": i}});
    let mut ids = Vec::new();
    for i in 0..EACH {
        ids.push(app.admit_with(a, sleep(i)).await);
    }
    for i in 0..EACH {
        ids.push(app.admit_with(&b, sleep(i)).await);
    }
    let tenant_of: HashMap<String, &str> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| (id.clone(), if i < EACH { a } else { b.as_str() }))
        .collect();
    // One slot: every execution's start is in one sequence, each at least 5 ms after the last.
    let _w = TestWorker::spawn(&app.redis, &["--concurrency", "1"]);
    let mut rows = Vec::new();
    for id in &ids {
        rows.push(
            app.wait_terminal(tenant_of[id], id, Duration::from_secs(60))
                .await,
        );
    }
    assert!(rows.iter().all(|r| r["status"] == "completed"));
    let mut started: Vec<(String, &str)> = rows
        .iter()
        .map(|r| {
            let id = r["execution_id"].as_str().unwrap();
            (sortable(r["started_at"].as_str().unwrap()), tenant_of[id])
        })
        .collect();
    started.sort();
    // Counted while both had work and both pickups had surely looked at their shards: from
    // the first start of the tenant that did not start first, to the last start of the tenant
    // that finished first.
    let from = started
        .iter()
        .position(|(_, t)| *t != started[0].1)
        .expect("both tenants started");
    let last_of = |tenant: &str| started.iter().rposition(|(_, t)| *t == tenant).unwrap();
    let to = last_of(a).min(last_of(&b));
    let window = &started[from..=to];
    let heavy = window.iter().filter(|(_, t)| *t == b.as_str()).count();
    let share = heavy as f64 / window.len() as f64;
    assert!(
        window.len() >= 40,
        "only {} starts while both had work: {started:?}",
        window.len()
    );
    assert!(
        (0.65..=0.85).contains(&share),
        "the weight-3 tenant got {heavy} of {} starts ({share:.2}) while both had work: \
         {started:?}",
        window.len()
    );
}

#[tokio::test]
async fn a_next_run_started_by_a_completion_whose_answer_was_lost_is_adopted() {
    let app = TestApp::spawn_with(|c| {
        // One shard: the second execution is on the first one's stream. An API patient enough
        // to wait out the stall.
        c.redis.shards = 1;
        c.redis.redis_timeout_ms = 5_000;
        c.api.request_timeout_ms = 20_000;
    })
    .await;
    let _w = TestWorker::spawn(
        &app.redis,
        &[
            "--concurrency",
            "1",
            // One connection: Redis runs the worker's calls in the order they were sent, so
            // the first report (the one that starts the next run) runs before its repeats.
            "--redis-connections",
            "1",
            "--redis-timeout-ms",
            "300",
            "--lease-ttl-ms",
            "4000",
            "--heartbeat-ms",
            "500",
            "--scan-ms",
            "100",
        ],
    );
    let first = app
        .admit_with(
            "acme",
            json!({"flow_id": "demo.journal", "params": {"ms": 1000}}),
        )
        .await;
    // Queued behind it (the only slot is taken).
    let second = app
        .admit_with("acme", json!({"flow_id": "demo.echo", "params": {"n": 2}}))
        .await;
    app.wait_running("acme", &first, 1).await;
    // The first run ends inside the stall: its completion, which also starts the second, times
    // out on the worker's side and runs on Redis's once the pause is over.
    app.redis.pause(2_500, "WRITE").await;
    let first = app
        .wait_terminal("acme", &first, Duration::from_secs(20))
        .await;
    let second = app
        .wait_terminal("acme", &second, Duration::from_secs(20))
        .await;
    assert_eq!(first["status"], "completed", "{first}");
    assert_eq!(second["status"], "completed", "{second}");
    let ms = |t: &Value| {
        let t = sortable(t.as_str().unwrap());
        let secs: f64 = t[17..t.len() - 1].parse().unwrap();
        let minutes: f64 = t[14..16].parse().unwrap();
        let hours: f64 = t[11..13].parse().unwrap();
        ((hours * 60.0 + minutes) * 60.0 + secs) * 1000.0
    };
    assert!(
        ms(&first["finished_at"]) - ms(&first["started_at"]) >= 1_500.0,
        "the first run's completion was not held by the stall: {first}"
    );
    assert_eq!(
        second["started_at"], first["finished_at"],
        "the second run was started by the first one's completion call: {first} {second}"
    );
    assert_eq!(
        second["attempt"], 1,
        "no attempt was lost to a phantom start"
    );
    assert_eq!(
        app.counter("reclaimed").await,
        0,
        "adopted, not left to expire"
    );
}
