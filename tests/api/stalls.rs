//! Short Redis stalls never turn into dead letters for runs that never ran. A worker whose
//! calls time out during a stall cannot know what they started: Redis may still run them after
//! the stall, and with several connections in any order, also after the `adopt` the worker
//! sends to find out. These tests stall Redis again and again under a busy worker and check
//! that every execution ran and completed on its first and only attempt.

use std::time::Duration;

use serde_json::json;
use sluice::domain::Status;
use sluice::store::{Completion, Outcome};

use crate::helpers::{TestApp, TestWorker};

/// 160 executions of 100 ms over 16 tenants, a worker with two slots whose calls time out
/// after 300 ms, and six `CLIENT PAUSE 700 WRITE` while it works (each under a quarter of the
/// 3 s lease): every execution completes on attempt 1, none is failed as `lease_lost`.
async fn stalls_under_a_busy_worker(connections: &str) {
    let app = TestApp::spawn_with(|c| {
        // An API patient enough to wait out the stalls.
        c.redis.redis_timeout_ms = 5_000;
        c.api.request_timeout_ms = 20_000;
    })
    .await;
    let mut ids = Vec::new();
    for i in 0..160 {
        let tenant = format!("t{}", i % 16);
        let body = json!({"flow_id": "demo.sleep", "params": {"ms": 100}, "max_attempts": 1});
        ids.push((tenant.clone(), app.admit_with(&tenant, body).await));
    }
    let _w = TestWorker::spawn(
        &app.redis,
        &[
            "--concurrency",
            "2",
            "--redis-connections",
            connections,
            "--redis-timeout-ms",
            "300",
            "--lease-ttl-ms",
            "3000",
        ],
    );
    // Stalls while the worker is busy (160 × 100 ms on two slots takes about 8 s): each one
    // catches some calls in flight, completions that start the next run among them.
    for _ in 0..6 {
        app.redis.pause(700, "WRITE").await;
        tokio::time::sleep(Duration::from_millis(1_000)).await;
    }
    let mut failed = Vec::new();
    for (tenant, id) in &ids {
        let row = app.wait_terminal(tenant, id, Duration::from_secs(60)).await;
        if row["status"] != "completed" || row["attempt"] != 1 {
            failed.push(row);
        }
    }
    assert!(
        failed.is_empty(),
        "{} of 160 executions did not complete on their only attempt: {failed:#?}",
        failed.len()
    );
    assert_eq!(app.dead_letters().await.len(), 0, "no dead letter");
    assert_eq!(
        app.counter("reclaimed").await,
        0,
        "no run left to its lease"
    );
}

#[tokio::test]
async fn short_stalls_fail_no_run_with_one_connection() {
    stalls_under_a_busy_worker("1").await;
}

#[tokio::test]
async fn short_stalls_fail_no_run_with_two_connections() {
    stalls_under_a_busy_worker("2").await;
}

/// The barrier an `adopt` writes: a start or a chained completion of that worker numbered at
/// or below it, reaching Redis only after the `adopt` (as a call on another connection may,
/// once a stall is over), starts nothing; a later call, or another worker's, starts as usual.
/// Without it the late call started a run that nobody ran, and its lease ran out as
/// `lease_lost`.
#[tokio::test]
async fn a_lost_call_that_reaches_redis_after_the_adopt_starts_nothing() {
    let app = TestApp::spawn_with(|c| c.redis.shards = 1).await;
    let store = app.store().await;
    let shard = app.shard("acme");
    let ttl = Duration::from_secs(30);
    let admit = async || {
        app.admit("acme", "demo.echo").await["execution_id"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let (first, second, third) = (admit().await, admit().await, admit().await);
    // Call 1 started the first run and was answered; calls 2 and 3 "went unanswered" and the
    // worker adopted with barrier 3: nothing was started by them yet.
    let run = store.start(shard, "w", 1, ttl, 1).await.unwrap().started;
    assert_eq!(run.len(), 1);
    assert_eq!(store.adopt(shard, "w", 8, ttl, 3).await.unwrap().len(), 1);
    // Call 3 reaches Redis now: it reads nothing, starts nothing.
    let late = store.start(shard, "w", 2, ttl, 3).await.unwrap();
    assert!(late.started.is_empty() && !late.more, "{late:?}");
    // Call 2, a completion that asked for the next run: the report counts, no run starts.
    let done = Outcome::Completed(json!({}));
    let (c, late) = store
        .complete_and_start(shard, &run[0].id, run[0].fence, "w", &done, 1, ttl, 2)
        .await
        .unwrap();
    assert_eq!(c, Completion::Done(Status::Completed));
    assert!(late.started.is_empty(), "{late:?}");
    for id in [&second, &third] {
        assert_eq!(app.execution("acme", id).await["status"], "queued");
    }
    // A barrier never goes down: an older adopt answered late leaves it at 3.
    store.adopt(shard, "w", 8, ttl, 2).await.unwrap();
    assert!(
        store
            .start(shard, "w", 1, ttl, 3)
            .await
            .unwrap()
            .started
            .is_empty()
    );
    // The worker's next call (4), and another worker's, start as usual.
    let next = store.start(shard, "w", 1, ttl, 4).await.unwrap().started;
    let other = store.start(shard, "v", 1, ttl, 1).await.unwrap().started;
    let mut started: Vec<String> = next
        .iter()
        .chain(&other)
        .map(|s| s.id.to_string())
        .collect();
    started.sort();
    let mut expected = vec![second, third];
    expected.sort();
    assert_eq!(started, expected);
    assert_eq!(app.execution("acme", &first).await["status"], "completed");
}
