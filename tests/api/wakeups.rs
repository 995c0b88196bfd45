//! Workers are woken by Redis, not by polling: an admission wakes an idle worker through its
//! shard's doorbell, a cancel or force delete reaches a running handler through a stop message,
//! an idle worker's only calls are its orphan scans, and a wake-up lost with a worker that
//! froze right after taking it is repaired by another worker's orphan scan. Each test turns
//! the slow paths (scan, heartbeat) up to an hour, so only the wake-up can explain what it sees.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::{TestApp, TestWorker};

/// Long enough that nothing a test sees can come from it.
const AN_HOUR_MS: &str = "3600000";

/// Sum of one `INFO` field over the masters.
async fn info_sum(app: &TestApp, section: &str, field: &str) -> u64 {
    app.redis
        .info(section)
        .await
        .lines()
        .filter_map(|l| l.strip_prefix(&format!("{field}:")))
        .map(|v| v.trim().parse::<u64>().unwrap())
        .sum()
}

/// Waits until the masters have at least `n` clients blocked (in `BZPOPMIN`), at most 15 s.
async fn wait_blocked(app: &TestApp, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let blocked = info_sum(app, "clients", "blocked_clients").await;
        if blocked >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{blocked} clients blocked, not {n}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The shards a worker serves (hashed and dedicated), as the server recorded them.
async fn shard_count(app: &TestApp) -> u64 {
    u64::from(app.store().await.shards().all().count() as u16)
}

#[tokio::test]
async fn an_admission_wakes_an_idle_worker_that_never_polls() {
    let app = TestApp::spawn().await;
    let _w = TestWorker::spawn(&app.redis, &["--scan-ms", AN_HOUR_MS]);
    // Every pickup of the worker is waiting on its doorbell.
    wait_blocked(&app, shard_count(&app).await).await;
    for n in 0..5 {
        let id = app
            .admit_with("acme", json!({"flow_id": "demo.echo", "params": {"n": n}}))
            .await;
        let done = app
            .wait_terminal("acme", &id, Duration::from_secs(10))
            .await;
        assert_eq!(done["status"], "completed", "{done}");
        assert_eq!(done["output"], json!({"n": n}));
    }
}

#[tokio::test]
async fn an_idle_worker_sends_nothing_but_one_orphan_scan_per_shard_per_interval() {
    let app = TestApp::spawn().await;
    let _w = TestWorker::spawn(&app.redis, &["--scan-ms", "500"]);
    let shards = shard_count(&app).await;
    let id = app.admit("acme", "demo.echo").await;
    let id = id["execution_id"].as_str().unwrap().to_owned();
    app.wait_terminal("acme", &id, Duration::from_secs(10))
        .await;
    wait_blocked(&app, shards).await;
    app.redis.reset_stats().await;
    // A measurement window, not a synchronisation: what does an idle worker send in 3 s?
    let window = Duration::from_secs(3);
    tokio::time::sleep(window).await;
    let calls = app.redis.command_calls().await;
    let of = |name: &str| calls.iter().find(|(c, _)| c == name).map_or(0, |(_, n)| *n);
    // Scans: one per shard every 500 ms (the first tick of a window may add one per shard).
    let scans = shards * (window.as_millis() as u64 / 500 + 1);
    assert!(
        of("fcall") + of("fcall_ro") <= scans,
        "{} script calls in {window:?} from an idle worker over {shards} shards: {calls:?}",
        of("fcall") + of("fcall_ro")
    );
    // (Redis counts the commands a script runs too: those are the scans' own.) No start call
    // (start.lua always reads the shard's eligible weight with HGET, which the orphan scan
    // never does), and no doorbell wait sent again while nothing rang.
    assert_eq!(of("hget"), 0, "{calls:?}");
    assert_eq!(of("bzpopmin"), 0, "{calls:?}");
    // The probe sees a start call when there is one.
    let id = app.admit("acme", "demo.echo").await;
    let id = id["execution_id"].as_str().unwrap().to_owned();
    app.wait_terminal("acme", &id, Duration::from_secs(10))
        .await;
    let calls = app.redis.command_calls().await;
    let of = |name: &str| calls.iter().find(|(c, _)| c == name).map_or(0, |(_, n)| *n);
    assert!(of("hget") > 0, "{calls:?}");
}

#[tokio::test]
async fn a_cancel_and_a_force_delete_reach_a_running_handler_without_a_heartbeat() {
    let app = TestApp::spawn().await;
    let _w = TestWorker::spawn(
        &app.redis,
        &[
            "--heartbeat-ms",
            AN_HOUR_MS,
            "--lease-ttl-ms",
            "7200000",
            "--scan-ms",
            AN_HOUR_MS,
        ],
    );
    let long = json!({"flow_id": "demo.sleep", "params": {"ms": 600000}});
    let a = app.admit_with("acme", long.clone()).await;
    let b = app.admit_with("acme", long).await;
    app.wait_running("acme", &a, 1).await;
    app.wait_running("acme", &b, 1).await;

    app.cancel("acme", &a).await;
    let done = app.wait_terminal("acme", &a, Duration::from_secs(10)).await;
    assert_eq!(done["status"], "cancelled", "{done}");
    assert_eq!(done["cancel_requested"], true);

    assert_eq!(
        app.delete("acme", &b, true).await.status(),
        StatusCode::NO_CONTENT
    );
    // The handler stopped: its slot is free (it was counted as running until then).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let usage = app.usage("acme").await;
        if usage == json!({"running": 0, "waiting": 0, "scheduled": 0}) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the deleted run still holds its slot: {usage}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A worker that took a doorbell's wake-up and froze before it started anything (SIGSTOP): the
/// execution would wait until that worker woke, had no one repaired the bell. Another worker's
/// orphan scan sees unread work and starts it.
#[tokio::test]
async fn a_wake_up_taken_by_a_frozen_worker_is_repaired_by_another_workers_orphan_scan() {
    let app = TestApp::spawn().await;
    let shards = shard_count(&app).await;
    // `frozen` waits on every doorbell first (Redis hands the marker to the longest-waiting
    // client), and scans only once an hour.
    let frozen = TestWorker::spawn(&app.redis, &["--scan-ms", AN_HOUR_MS]);
    wait_blocked(&app, shards).await;
    let _rescuer = TestWorker::spawn(&app.redis, &["--scan-ms", "300"]);
    wait_blocked(&app, 2 * shards).await;
    frozen.signal("STOP");

    let id = app
        .admit_with(
            "acme",
            json!({"flow_id": "demo.echo", "params": {"rescued": true}}),
        )
        .await;
    let done = app
        .wait_terminal("acme", &id, Duration::from_secs(10))
        .await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["attempt"], 1, "it was started once: {done}");
    assert_eq!(done["output"], json!({"rescued": true}));
    frozen.signal("CONT");
}
