//! The worker runtime against real `sluice worker` processes and a real Redis: queued and
//! running work is never mistaken for dead work; dead workers' executions are recovered; late
//! results are fenced; attempts run out into the dead-letter stream.
//!
//! Long on purpose: a list of independent tests against real `sluice worker` processes, each
//! one story of a run (queued, started, dead, fenced, dead-lettered) read top to bottom.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{FAST_WORKER, TestApp, TestWorker};

fn with(extra: &[&'static str]) -> Vec<&'static str> {
    FAST_WORKER.iter().chain(extra).copied().collect()
}

/// Lease facts of every shard (the app's own shard map, dedicated shards included):
/// (executions holding a lease, the highest fence among them: how many times the most started
/// of them was started).
async fn pending(app: &TestApp) -> (u64, u64) {
    let mut c = app.redis.conn().await;
    let (mut entries, mut max_starts) = (0, 0);
    for shard in app.store().await.shards().all() {
        let ids: Vec<Vec<u8>> = redis::cmd("ZRANGE")
            .arg(shard.leases())
            .arg(0)
            .arg(-1)
            .query_async(&mut c)
            .await
            .unwrap();
        entries += ids.len() as u64;
        for id in ids {
            let row = shard.row(&sluice::domain::ExecutionId::from_reply(&id).unwrap());
            let fence: Option<u64> = redis::cmd("HGET")
                .arg(row)
                .arg(sluice::domain::row::FENCE)
                .query_async(&mut c)
                .await
                .unwrap();
            max_starts = max_starts.max(fence.unwrap_or(0));
        }
    }
    (entries, max_starts)
}

async fn claim_calls(app: &TestApp) -> String {
    let info = app.redis.info("commandstats").await;
    info.lines()
        .filter(|l| l.contains("xclaim") || l.contains("xautoclaim"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test]
async fn saturation_without_churn() {
    let app = TestApp::spawn().await;
    let _worker = TestWorker::spawn(&app.redis, &with(&["--concurrency", "2"]));
    // Each lasts 3 lease TTLs and 12 scan periods.
    let mut ids = Vec::new();
    for _ in 0..30 {
        ids.push(
            app.admit_with(
                "acme",
                json!({"flow_id": "demo.sleep", "params": {"ms": 1200}}),
            )
            .await,
        );
    }
    // Watch the pending list while the work runs (sampling, not synchronisation).
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut max_pending = 0;
    loop {
        let (entries, deliveries) = pending(&app).await;
        max_pending = max_pending.max(entries);
        assert!(
            deliveries <= 1,
            "an execution was started {deliveries} times"
        );
        let page = app.page("acme", "status=completed&limit=1").await;
        if page["total"] == 30 {
            break;
        }
        assert!(Instant::now() < deadline, "30 executions did not complete");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        max_pending <= 2,
        "pending list reached {max_pending} with concurrency 2"
    );
    assert!(max_pending >= 1, "the sampling never saw work running");
    for id in &ids {
        let e = app.execution("acme", id).await;
        assert_eq!(e["status"], "completed");
        assert_eq!(e["attempt"], 1, "{id} ran more than once");
        assert_eq!(e["output"]["attempt"], 1);
    }
    assert!(app.dead_letters().await.is_empty());
    assert_eq!(app.counter("reclaimed").await, 0);
    assert_eq!(app.counter("fenced").await, 0);
    assert_eq!(app.counter("completed").await, 30);
    assert_eq!(claim_calls(&app).await, "", "XCLAIM/XAUTOCLAIM was called");
    assert_eq!(pending(&app).await.0, 0, "finished runs hold no lease");
    assert_eq!(
        app.usage("acme").await,
        json!({"running": 0, "waiting": 0, "scheduled": 0})
    );
}

#[tokio::test]
async fn a_killed_workers_executions_are_rerun_once_by_another() {
    let app = TestApp::spawn().await;
    let mut a = TestWorker::spawn(&app.redis, &with(&["--concurrency", "2"]));
    let ids = [
        app.admit_with(
            "acme",
            json!({"flow_id": "demo.sleep", "params": {"ms": 1500}}),
        )
        .await,
        app.admit_with(
            "acme",
            json!({"flow_id": "demo.sleep", "params": {"ms": 1500}}),
        )
        .await,
    ];
    for id in &ids {
        app.wait_running("acme", id, 1).await;
    }
    a.kill9();
    let _b = TestWorker::spawn(&app.redis, &with(&["--concurrency", "2"]));
    for id in &ids {
        let e = app.wait_terminal("acme", id, Duration::from_secs(20)).await;
        assert_eq!(e["status"], "completed");
        assert_eq!(e["attempt"], 2);
        assert_eq!(e["output"]["attempt"], 2);
    }
    assert_eq!(
        app.counter("completed").await,
        2,
        "each execution completed exactly once"
    );
    assert_eq!(app.counter("reclaimed").await, 2);
    assert!(app.dead_letters().await.is_empty());
    assert_eq!(claim_calls(&app).await, "");
}

#[tokio::test]
async fn a_paused_workers_late_completion_is_fenced() {
    let app = TestApp::spawn().await;
    let a = TestWorker::spawn(&app.redis, &with(&["--concurrency", "1"]));
    let id = app
        .admit_with(
            "acme",
            json!({"flow_id": "demo.sleep", "params": {"ms": 1500}}),
        )
        .await;
    app.wait_running("acme", &id, 1).await;
    a.signal("STOP");
    let _b = TestWorker::spawn(&app.redis, &with(&["--concurrency", "1"]));
    let done = app
        .wait_terminal("acme", &id, Duration::from_secs(20))
        .await;
    assert_eq!(done["status"], "completed");
    assert_eq!(done["attempt"], 2);

    a.signal("CONT");
    // The zombie wakes, finishes attempt 1 and reports it: refused and counted.
    let deadline = Instant::now() + Duration::from_secs(15);
    while app.counter("fenced").await == 0 {
        assert!(
            Instant::now() < deadline,
            "the late completion was never attempted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let after = app.execution("acme", &id).await;
    assert_eq!(after, done, "the late completion changed the execution");
    assert_eq!(app.counter("completed").await, 1);
}

#[tokio::test]
async fn attempts_exhausted_by_dying_workers_dead_letter_as_lease_lost_and_retry_reruns() {
    let app = TestApp::spawn().await;
    app.put_tenant("acme", &json!({"max_concurrent": 1})).await;
    let doomed = app
        .admit_with(
            "acme",
            json!({"flow_id": "demo.sleep", "params": {"ms": 30000}, "max_attempts": 2}),
        )
        .await;
    let next = app
        .admit_with("acme", json!({"flow_id": "demo.echo"}))
        .await;
    let e = app.execution("acme", &next).await;
    assert_eq!(e["queue_state"], "waiting");

    for attempt in 1..=2 {
        let mut w = TestWorker::spawn(&app.redis, &with(&["--concurrency", "1"]));
        app.wait_running("acme", &doomed, attempt).await;
        w.kill9();
    }
    let _survivor = TestWorker::spawn(&app.redis, &with(&["--concurrency", "1"]));
    let dead = app
        .wait_terminal("acme", &doomed, Duration::from_secs(20))
        .await;
    assert_eq!(dead["status"], "failed");
    assert_eq!(dead["error"]["kind"], "lease_lost");
    let dlq = app.dead_letters().await;
    assert_eq!(dlq.len(), 1);
    assert_eq!(dlq[0]["execution_id"], doomed.as_str());
    assert_eq!(dlq[0]["reason"], "lease_lost");
    assert_eq!(dlq[0]["attempts"], 2);
    assert_eq!(dlq[0]["tenant_id"], "acme");
    // Its slot went to the waiting execution, which ran.
    let e = app
        .wait_terminal("acme", &next, Duration::from_secs(10))
        .await;
    assert_eq!(e["status"], "completed");

    // Retry: same id, fresh attempts, runs again.
    let res = app.retry("acme", &doomed).await;
    assert_eq!(res.status(), StatusCode::OK);
    let again: Value = res.json().await.unwrap();
    assert_eq!(again["status"], "queued");
    assert_eq!(again["attempt"], 0);
    assert_eq!(again["error"], Value::Null);
    app.wait_running("acme", &doomed, 1).await;
    app.cancel("acme", &doomed).await;
    let end = app
        .wait_terminal("acme", &doomed, Duration::from_secs(10))
        .await;
    assert_eq!(end["status"], "cancelled");
    // Retrying something not failed/cancelled is a conflict.
    let res = app.retry("acme", &next).await;
    assert_eq!(res.status(), StatusCode::CONFLICT);
}

#[tokio::test]
async fn short_tasks_are_not_held_up_by_long_ones() {
    let app = TestApp::spawn().await;
    let _w = TestWorker::spawn(&app.redis, &with(&["--concurrency", "4"]));
    let long: Vec<String> = {
        let mut v = Vec::new();
        for _ in 0..2 {
            v.push(
                app.admit_with(
                    "acme",
                    json!({"flow_id": "demo.sleep", "params": {"ms": 60000}}),
                )
                .await,
            );
        }
        v
    };
    for id in &long {
        app.wait_running("acme", id, 1).await;
    }
    let mut short = Vec::new();
    for i in 0..40 {
        short.push(
            app.admit_with("acme", json!({"flow_id": "demo.echo", "params": {"i": i}}))
                .await,
        );
    }
    for (i, id) in short.iter().enumerate() {
        let e = app.wait_terminal("acme", id, Duration::from_secs(20)).await;
        assert_eq!(e["status"], "completed");
        assert_eq!(e["output"], json!({"i": i}));
    }
    for id in &long {
        let e = app.execution("acme", id).await;
        assert_eq!(
            e["status"], "running",
            "the long task is still running beside them"
        );
        app.cancel("acme", id).await;
    }
}

#[tokio::test]
async fn cancelling_a_running_execution_stops_it_and_releases_the_slot_once() {
    let app = TestApp::spawn().await;
    app.put_tenant("acme", &json!({"max_concurrent": 1})).await;
    let _w = TestWorker::spawn(&app.redis, &with(&["--concurrency", "2"]));
    let id = app
        .admit_with(
            "acme",
            json!({"flow_id": "demo.sleep", "params": {"ms": 60000}}),
        )
        .await;
    let waiting = app
        .admit_with(
            "acme",
            json!({"flow_id": "demo.sleep", "params": {"ms": 60000}}),
        )
        .await;
    app.wait_running("acme", &id, 1).await;
    let res: Value = app.cancel("acme", &id).await.json().await.unwrap();
    assert_eq!(res["status"], "running");
    assert_eq!(res["cancel_requested"], true);
    let e = app
        .wait_terminal("acme", &id, Duration::from_secs(10))
        .await;
    assert_eq!(e["status"], "cancelled");
    assert_eq!(e["attempt"], 1);
    // The slot went to the waiting one, exactly once.
    app.wait_running("acme", &waiting, 1).await;
    assert_eq!(
        app.usage("acme").await,
        json!({"running": 1, "waiting": 0, "scheduled": 0})
    );
    app.cancel("acme", &id).await;
    assert_eq!(
        app.usage("acme").await,
        json!({"running": 1, "waiting": 0, "scheduled": 0})
    );
    assert_eq!(app.counter("cancelled").await, 1);
    app.cancel("acme", &waiting).await;
    app.wait_terminal("acme", &waiting, Duration::from_secs(10))
        .await;
    assert_eq!(
        app.usage("acme").await,
        json!({"running": 0, "waiting": 0, "scheduled": 0})
    );
}

#[tokio::test]
async fn graceful_shutdown_hands_unfinished_work_over_at_once() {
    let app = TestApp::spawn().await;
    // A lease far longer than the test: only a release can explain a quick hand-over.
    let slow_lease = [
        "--concurrency",
        "1",
        "--lease-ttl-ms",
        "60000",
        "--heartbeat-ms",
        "1000",
        "--drain-timeout-ms",
        "300",
    ];
    let mut a = TestWorker::spawn(&app.redis, &slow_lease);
    let quick = app
        .admit_with(
            "acme",
            json!({"flow_id": "demo.sleep", "params": {"ms": 100}}),
        )
        .await;
    app.wait_terminal("acme", &quick, Duration::from_secs(10))
        .await;
    let id = app
        .admit_with(
            "acme",
            json!({"flow_id": "demo.sleep", "params": {"ms": 60000}}),
        )
        .await;
    app.wait_running("acme", &id, 1).await;
    a.signal("TERM");
    let status = a.wait_exit(Duration::from_secs(10));
    assert!(status.success(), "{status}");
    let e = app.execution("acme", &id).await;
    assert_eq!(e["status"], "queued");
    // Back in its tenant's order, first, and within its free slots.
    assert_eq!(e["queue_state"], "ready");
    assert_eq!(app.queue_ids("acme").await, std::slice::from_ref(&id));
    // A release is not an attempt: the next worker runs it as attempt 1 again.
    assert_eq!(e["attempt"], 0);
    let _b = TestWorker::spawn(&app.redis, &slow_lease);
    app.wait_running("acme", &id, 1).await;
    app.cancel("acme", &id).await;
    assert_eq!(app.counter("reclaimed").await, 0);
}

#[tokio::test]
async fn handler_failures_retry_then_dead_letter_and_permanent_ones_fail_at_once() {
    let app = TestApp::spawn().await;
    let _w = TestWorker::spawn(&app.redis, &with(&["--concurrency", "4"]));
    let flaky = app
        .admit_with(
            "acme",
            json!({"flow_id": "demo.fail", "params": {"message": "boom"}, "max_attempts": 3}),
        )
        .await;
    let permanent = app
        .admit_with(
            "acme",
            json!({"flow_id": "demo.fail", "params": {"retryable": false}}),
        )
        .await;
    let unknown = app
        .admit_with("acme", json!({"flow_id": "no.such.flow"}))
        .await;

    let e = app
        .wait_terminal("acme", &flaky, Duration::from_secs(15))
        .await;
    assert_eq!(e["status"], "failed");
    assert_eq!(e["attempt"], 3);
    assert_eq!(
        e["error"],
        json!({"kind": "handler_error", "message": "boom"})
    );
    let e = app
        .wait_terminal("acme", &permanent, Duration::from_secs(15))
        .await;
    assert_eq!(e["status"], "failed");
    assert_eq!(e["attempt"], 1);
    let e = app
        .wait_terminal("acme", &unknown, Duration::from_secs(15))
        .await;
    assert_eq!(e["status"], "failed");
    assert_eq!(e["attempt"], 1);
    assert_eq!(e["error"]["kind"], "unknown_flow");

    let dlq = app.dead_letters().await;
    assert_eq!(dlq.len(), 1, "{dlq:?}");
    assert_eq!(dlq[0]["execution_id"], flaky.as_str());
    assert_eq!(dlq[0]["reason"], "handler_error");
    assert_eq!(dlq[0]["attempts"], 3);
    // Tenant-scoped listing shows it; another tenant's does not.
    let mine = app.get_json(Some("acme"), "/api/dlq").await;
    assert_eq!(mine["dead_letters"].as_array().unwrap().len(), 1);
    let theirs = app.get_json(Some("other"), "/api/dlq").await;
    assert_eq!(theirs["dead_letters"].as_array().unwrap().len(), 0);
    assert_eq!(
        app.usage("acme").await,
        json!({"running": 0, "waiting": 0, "scheduled": 0})
    );
}

/// A queue member whose execution does not exist (or is no longer queued) is dropped by the
/// first start that meets it, once, and counted (`repaired_stale_queue`): it never loops. Dead
/// letters beyond the cap evict the oldest, and each eviction is counted.
#[tokio::test]
async fn stale_queue_members_are_dropped_once_and_evictions_are_counted() {
    let app = TestApp::spawn_with(|c| c.api.dlq_cap = 2).await;
    let tenant = sluice::domain::TenantId::parse("acme").unwrap();
    let shard = app.shard("acme");
    // Three stale members at the head of the tenant's queue, and one real execution after them.
    let real = app
        .admit_with("acme", json!({"flow_id": "demo.echo"}))
        .await;
    let mut c = app.redis.conn().await;
    // (The real one in its stored form, as the store writes it.)
    let stored = shard.stored_id(&sluice::domain::ExecutionId::parse(&real).unwrap());
    for (score, ghost) in [
        (1, &b"0123456789abcdef0123456789abcdef"[..]),
        (2, b"nope"),
        (3, stored.as_ref()),
    ] {
        // The real one again, with a lower score: its row is queued, so it is kept.
        let _: i64 = redis::cmd("ZADD")
            .arg(shard.waiting(&tenant))
            .arg(score)
            .arg(ghost)
            .query_async(&mut c)
            .await
            .unwrap();
    }
    let _: i64 = redis::cmd("ZADD")
        .arg(shard.waiting(&tenant))
        .arg(4)
        .arg("fedcba9876543210fedcba9876543210")
        .query_async(&mut c)
        .await
        .unwrap();
    let _w = TestWorker::spawn(&app.redis, FAST_WORKER);
    let e = app
        .wait_terminal("acme", &real, Duration::from_secs(10))
        .await;
    assert_eq!(e["status"], "completed");
    assert_eq!(e["attempt"], 1);
    let deadline = Instant::now() + Duration::from_secs(10);
    while app.counter("repaired_stale_queue").await < 3 {
        assert!(Instant::now() < deadline, "stale members were not dropped");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Three dead letters with a cap of two: one evicted, and counted.
    let mut failed = Vec::new();
    for _ in 0..3 {
        failed.push(
            app.admit_with("acme", json!({"flow_id": "demo.fail", "max_attempts": 1}))
                .await,
        );
    }
    for id in &failed {
        let e = app.wait_terminal("acme", id, Duration::from_secs(10)).await;
        assert_eq!(e["status"], "failed");
    }
    assert_eq!(app.counter("repaired_stale_queue").await, 3);
    assert_eq!(app.counter("dead_lettered").await, 3);
    let dlq = app.dead_letters().await;
    assert_eq!(dlq.len(), 2, "capped at 2");
    assert_eq!(
        app.counter("dlq_evicted").await,
        1,
        "the evicted record is counted"
    );
    let metrics = app.metrics().await;
    let label = shard.label();
    let evicted = format!("sluice_shard_events{{shard=\"{label}\",event=\"dlq_evicted\"}} 1");
    assert!(metrics.contains(&evicted), "{evicted} not in:\n{metrics}");
    let dead = format!("sluice_dead_letters{{shard=\"{label}\"}} 2");
    assert!(metrics.contains(&dead), "{dead} not in:\n{metrics}");
    assert_eq!(pending(&app).await.0, 0);
    assert!(app.queue_ids("acme").await.is_empty());
}

/// A queued execution that no structure of its shard reaches (its queue entry lost, e.g. left
/// on the ready stream of a stream-model build, or removed by hand) would never run. The
/// sweeper puts each such execution back in its tenant's order, once (a second sweep finds
/// nothing to do), counts it (`repaired_reach` in `GET /api/queues`), puts back a scheduled one
/// on the timer set, and leaves a running execution alone.
#[tokio::test]
async fn the_sweeper_puts_back_a_queued_execution_nothing_reaches() {
    let app = TestApp::spawn().await;
    let worker = TestWorker::spawn(&app.redis, &with(&["--concurrency", "1"]));
    let running = app
        .admit_with(
            "acme",
            json!({"flow_id": "demo.sleep", "params": {"ms": 120_000}}),
        )
        .await;
    app.wait_running("acme", &running, 1).await;
    // The worker's one slot is taken: these stay queued.
    let mut lost = Vec::new();
    for _ in 0..5 {
        lost.push(
            app.admit_with("acme", json!({"flow_id": "demo.echo"}))
                .await,
        );
    }
    let later = app
        .admit_with("acme", json!({"flow_id": "demo.echo", "delay": "2s"}))
        .await;
    let tenant = sluice::domain::TenantId::parse("acme").unwrap();
    let shard = app.shard("acme");
    for key in [shard.waiting(&tenant), shard.delayed(), shard.runnable()] {
        let _: u64 = app.redis.query(redis::cmd("DEL").arg(key)).await;
    }

    let store = std::sync::Arc::new(app.store().await);
    let repaired = sluice::sweeper::sweep_once(store.clone(), "test", Duration::from_millis(200))
        .await
        .expect("took the sweeper turn");
    assert_eq!(
        repaired.get("reach").copied().unwrap_or(0),
        6,
        "{repaired:?}"
    );
    let mut queued = app.queue_ids("acme").await;
    queued.sort();
    let mut expected = lost.clone();
    expected.sort();
    assert_eq!(queued, expected);
    assert_eq!(
        app.execution("acme", &later).await["queue_state"],
        "scheduled"
    );
    let again = sluice::sweeper::sweep_once(store.clone(), "test", Duration::from_millis(200))
        .await
        .expect("took the sweeper turn");
    assert_eq!(again.get("reach").copied().unwrap_or(0), 0, "{again:?}");
    assert_eq!(app.counter("repaired_reach").await, 6);
    assert_eq!(app.counter("repaired_slots").await, 0);
    let e = app.execution("acme", &running).await;
    assert_eq!(e["status"], "running", "{e}");

    // The worker's slot frees; the six run, each once.
    assert_eq!(app.cancel("acme", &running).await.status(), StatusCode::OK);
    for id in lost.iter().chain([&later]) {
        let e = app.wait_terminal("acme", id, Duration::from_secs(15)).await;
        assert_eq!(e["status"], "completed", "{e}");
        assert_eq!(e["attempt"], 1, "{e}");
    }
    let e = app
        .wait_terminal("acme", &running, Duration::from_secs(15))
        .await;
    assert_eq!(e["status"], "cancelled", "{e}");
    drop(worker);
}

#[tokio::test]
async fn the_sweeper_repairs_slots_and_indexes_that_drifted() {
    let app = TestApp::spawn().await;
    app.put_tenant("acme", &json!({"max_concurrent": 1})).await;
    let holder = app
        .admit_with("acme", json!({"flow_id": "demo.echo"}))
        .await;
    let waiting = app
        .admit_with("acme", json!({"flow_id": "demo.echo"}))
        .await;
    let tenant = sluice::domain::TenantId::parse("acme").unwrap();
    let shard = app.shard("acme");
    let holder_id = sluice::domain::ExecutionId::parse(&holder).unwrap();
    // Drift by hand: the holder's row vanishes (as if expired) while its queue entry and
    // indexes stay, a slot is held by an execution that does not exist (the tenant's one slot:
    // nothing could start), and an index points at a row that does not exist.
    let _: i64 = app
        .redis
        .query(redis::cmd("DEL").arg(shard.row(&holder_id)))
        .await;
    let ghost = "0123456789abcdef0123456789abcdef";
    let _: i64 = app
        .redis
        .query(redis::cmd("SADD").arg(shard.slots(&tenant)).arg(ghost))
        .await;
    assert_eq!(
        app.execution("acme", &waiting).await["queue_state"],
        "waiting"
    );
    let _: i64 = app
        .redis
        .query(
            redis::cmd("ZADD")
                .arg(shard.listing(&tenant))
                .arg(0)
                .arg(shard.listing_member(
                    Some(sluice::domain::Status::Completed),
                    &sluice::domain::FlowId::parse("demo.echo").unwrap(),
                    &sluice::domain::ExecutionId::parse(ghost).unwrap(),
                )),
        )
        .await;
    let store = std::sync::Arc::new(app.store().await);
    let repaired = sluice::sweeper::sweep_once(store.clone(), "test", Duration::from_millis(200))
        .await
        .expect("took the sweeper turn");
    assert_eq!(repaired["slots"], 1);
    assert_eq!(repaired["waiting"], 1, "{repaired:?}");
    assert!(repaired["index"] >= 2, "{repaired:?}");
    // The freed slot lets the waiting execution start: it is ready now.
    let e = app.execution("acme", &waiting).await;
    assert_eq!(e["queue_state"], "ready");
    let page = app.page("acme", "").await;
    let ids: BTreeSet<&str> = page["executions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["execution_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, BTreeSet::from([waiting.as_str()]));
    assert_eq!(page["total"], 1);
    assert_eq!(app.counter("repaired_slots").await, 1);
    // Single flight: a second process does not get the turn while one holds it, and gets it
    // as soon as the holder gives it back (not one hold later).
    assert!(
        store
            .take_sweeper_turn("holder", Duration::from_secs(60))
            .await
            .unwrap()
    );
    assert!(
        sluice::sweeper::sweep_once(store.clone(), "other", Duration::from_secs(5))
            .await
            .is_none()
    );
    store.end_sweeper_turn("holder").await.unwrap();
    assert!(
        sluice::sweeper::sweep_once(store.clone(), "other", Duration::from_secs(60))
            .await
            .is_some()
    );
    // A finished sweep gave its turn back too.
    assert!(
        store
            .take_sweeper_turn("third", Duration::from_secs(5))
            .await
            .unwrap()
    );
}

#[tokio::test]
async fn the_sweeper_resumes_where_its_budget_ran_out() {
    let app = TestApp::spawn().await;
    let tenant = sluice::domain::TenantId::parse("acme").unwrap();
    let shard = app.shard("acme");
    app.admit_with("acme", json!({"flow_id": "demo.echo"}))
        .await;
    // 450 ghosts in one index: three batches of 200 at least.
    let mut c = app.redis.conn().await;
    let key = shard.listing(&tenant);
    let flow = sluice::domain::FlowId::parse("demo.echo").unwrap();
    for i in 0..450 {
        let ghost = sluice::domain::ExecutionId::parse(&format!("{i:032x}")).unwrap();
        let _: i64 = redis::cmd("ZADD")
            .arg(&key)
            .arg(0)
            .arg(shard.listing_member(Some(sluice::domain::Status::Completed), &flow, &ghost))
            .query_async(&mut c)
            .await
            .unwrap();
    }
    let mut sweeper = sluice::sweeper::Sweeper::new(std::sync::Arc::new(app.store().await));
    let (mut total, mut rounds) = (0, 0);
    loop {
        let turn = sweeper.advance(1).await;
        assert!(turn.failed.is_empty(), "{:?}", turn.failed);
        total += turn.repairs.values().sum::<u64>();
        rounds += 1;
        if turn.done {
            break;
        }
        assert!(rounds < 100, "the walk never finished");
    }
    assert_eq!(total, 450);
    assert!(
        rounds >= 3,
        "one call per turn cannot check 450 members in {rounds} turns"
    );
    // The ghosts are gone; the tenant's own queued execution is still listed.
    let (min, max) = sluice::store::keys::listing_range(Some(sluice::domain::Status::Completed));
    let left: u64 = app
        .redis
        .query(redis::cmd("ZLEXCOUNT").arg(&key).arg(min).arg(max))
        .await;
    assert_eq!(left, 0);
    let listed: u64 = app.redis.query(redis::cmd("ZCARD").arg(&key)).await;
    assert_eq!(listed, 1);
}

#[tokio::test]
async fn an_orphan_whose_cancel_was_requested_ends_cancelled_not_rerun() {
    let app = TestApp::spawn().await;
    // A heartbeat far slower than the lease: the worker never hears of the cancel.
    let mut a = TestWorker::spawn(
        &app.redis,
        &[
            "--lease-ttl-ms",
            "500",
            "--heartbeat-ms",
            "200",
            "--scan-ms",
            "100",
        ],
    );
    let id = app
        .admit_with(
            "acme",
            json!({"flow_id": "demo.sleep", "params": {"ms": 60000}}),
        )
        .await;
    app.wait_running("acme", &id, 1).await;
    a.kill9();
    let res: Value = app.cancel("acme", &id).await.json().await.unwrap();
    assert_eq!(res["cancel_requested"], true);
    let _b = TestWorker::spawn(&app.redis, FAST_WORKER);
    let e = app
        .wait_terminal("acme", &id, Duration::from_secs(15))
        .await;
    assert_eq!(e["status"], "cancelled");
    assert_eq!(e["attempt"], 1, "it was not started again");
    assert_eq!(
        app.usage("acme").await,
        json!({"running": 0, "waiting": 0, "scheduled": 0})
    );
}
