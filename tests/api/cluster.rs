//! Redis Cluster: what only a cluster can do to sluice — one master of three dying, a
//! failover, a shard's slot moving while clients admit. These run when the suite runs on a
//! cluster (`SLUICE_TEST_CLUSTER=1`, the second pass of `scripts/test.sh`); everything else in
//! the suite runs on both.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{TestApp, TestWorker, cluster_mode};

/// Tenants `t0`, `t1`, ... until one is found on each master; `found[m]` is on master `m`.
async fn a_tenant_per_master(app: &TestApp) -> Vec<String> {
    let masters = app.redis.masters();
    let mut found: Vec<Option<String>> = vec![None; masters];
    for i in 0..1_000 {
        let t = format!("t{i}");
        let m = app.master_of(&t).await;
        if found[m].is_none() {
            found[m] = Some(t);
        }
        if found.iter().all(Option::is_some) {
            break;
        }
    }
    found
        .into_iter()
        .map(|t| t.expect("a tenant on every master"))
        .collect()
}

/// A master dies (no replica): its shards' tenants get 503s, and nothing else changes — the
/// other masters' tenants keep admitting and completing, and a run that outlives several lease
/// lengths keeps its lease (heartbeats to the live masters are not held up by the dead one).
#[tokio::test]
async fn one_master_down_stops_only_its_own_shards() {
    if !cluster_mode() {
        println!("cluster only (SLUICE_TEST_CLUSTER=1); skipped");
        return;
    }
    let mut app = TestApp::spawn_with(|c| {
        c.redis.redis_timeout_ms = 1_000;
        c.api.request_timeout_ms = 5_000;
    })
    .await;
    let tenants = a_tenant_per_master(&app).await;
    let (victim, survivors) = (&tenants[0], &tenants[1..]);
    let _worker = TestWorker::spawn(
        &app.redis,
        &[
            "--concurrency",
            "8",
            "--lease-ttl-ms",
            "2000",
            "--heartbeat-ms",
            "400",
            "--scan-ms",
            "500",
            "--redis-timeout-ms",
            "1000",
        ],
    );
    // A run on a live master that lasts three lease lengths.
    let long = app
        .admit_with(
            &survivors[0],
            json!({"flow_id": "demo.sleep", "params": {"ms": 6_000}}),
        )
        .await;
    app.wait_running(&survivors[0], &long, 1).await;

    app.redis.kill_node(0);
    let res = app
        .post_execution(victim, &json!({"flow_id": "demo.echo"}))
        .await;
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);

    // Meanwhile the live masters' tenants are served as before.
    let until = Instant::now() + Duration::from_secs(5);
    let mut completed = 0;
    while Instant::now() < until {
        for t in survivors {
            let id = app
                .admit_with(
                    t,
                    json!({"flow_id": "demo.echo", "params": {"n": completed}}),
                )
                .await;
            let done = app.wait_terminal(t, &id, Duration::from_secs(3)).await;
            assert_eq!(done["status"], "completed", "{done}");
            completed += 1;
        }
    }
    assert!(completed >= 4, "{completed}");
    // The long run kept its lease all along: one attempt, completed by its first holder.
    let long_done = app
        .wait_terminal(&survivors[0], &long, Duration::from_secs(10))
        .await;
    assert_eq!(long_done["status"], "completed", "{long_done}");
    assert_eq!(long_done["attempt"], 1, "{long_done}");
    let reclaimed = app.get_json(None, "/api/queues").await;
    let shards: &Vec<Value> = reclaimed["shards"].as_array().unwrap();
    let live_reclaims: u64 = shards
        .iter()
        .filter_map(|s| s["counters"]["reclaimed"].as_u64())
        .sum();
    assert_eq!(live_reclaims, 0, "{reclaimed}");
}
