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

/// The runs of `demo.journal` (from the lines its workers append): `(tenant, id, start ms, end
/// ms)` for every run that ended.
fn runs(journal: &std::path::Path) -> Vec<(String, String, u64, u64)> {
    let text = std::fs::read_to_string(journal).unwrap_or_default();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mut out = Vec::new();
    for start in lines.iter().filter(|l| l["ev"] == "start") {
        let end = lines
            .iter()
            .find(|l| l["ev"] == "end" && l["id"] == start["id"] && l["fence"] == start["fence"]);
        if let Some(end) = end {
            out.push((
                start["tenant"].as_str().unwrap().to_owned(),
                start["id"].as_str().unwrap().to_owned(),
                start["t"].as_u64().unwrap(),
                end["t"].as_u64().unwrap(),
            ));
        }
    }
    out
}

/// The most runs of `tenant` that were ever running at the same time.
fn most_at_once(runs: &[(String, String, u64, u64)], tenant: &str) -> usize {
    // An end sorts before a start at the same millisecond: the slot is freed before the
    // next run can get it.
    let mut events: Vec<(u64, i32)> = runs
        .iter()
        .filter(|r| r.0 == tenant)
        .flat_map(|r| [(r.2, 1), (r.3, -1)])
        .collect();
    events.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, d) in events {
        now += d;
        most = most.max(now);
    }
    most as usize
}

/// Admits with `key` until Redis answers (a frozen shard answers 503, retryable); the id.
async fn admit_until_answered(app: &TestApp, tenant: &str, key: &str) -> (StatusCode, String) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let res = app
            .as_tenant(reqwest::Method::POST, "/api/executions", tenant)
            .header("Idempotency-Key", key)
            .json(&json!({"flow_id": "demo.journal", "params": {"ms": 100}}))
            .send()
            .await
            .unwrap();
        let status = res.status();
        let body: Value = res.json().await.unwrap();
        match status {
            StatusCode::CREATED | StatusCode::OK => {
                return (status, body["execution_id"].as_str().unwrap().to_owned());
            }
            StatusCode::SERVICE_UNAVAILABLE => {
                assert_ne!(
                    body["code"], "admission_outcome_unknown",
                    "a move must not leave an admission's outcome unknown: {body}"
                );
                assert!(Instant::now() < deadline, "still 503 after 30 s: {body}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            other => panic!("admission answered {other}: {body}"),
        }
    }
}

/// Cancels `id` until Redis answers (a frozen shard answers 503); whether it was cancelled
/// (409: it had ended already).
async fn cancel_until_answered(app: &TestApp, tenant: &str, id: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let res = app.cancel(tenant, id).await;
        let status = res.status();
        let body: Value = res.json().await.unwrap();
        match status {
            StatusCode::OK => return true,
            StatusCode::CONFLICT => return false,
            StatusCode::SERVICE_UNAVAILABLE => {
                assert!(Instant::now() < deadline, "still 503 after 30 s: {body}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            other => panic!("cancel answered {other}: {body}"),
        }
    }
}

/// `sluice cluster move-shard` while clients admit with Idempotency-Keys (each key sent until
/// answered, then once more) and workers run a tenant limited to 2 at once. Legacy resharding
/// gave one key two ids, exceeded the quota and stranded executions; the frozen move must not:
/// exactly one execution per key, never more than 2 running, every execution completed, the
/// shard served by the new master and unfrozen.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn moving_a_shard_under_load_loses_nothing() {
    if !cluster_mode() {
        println!("cluster only (SLUICE_TEST_CLUSTER=1); skipped");
        return;
    }
    let app = std::sync::Arc::new(
        TestApp::spawn_with(|c| {
            c.redis.redis_timeout_ms = 2_000;
            c.api.request_timeout_ms = 7_000;
        })
        .await,
    );
    let tenant = "mover";
    app.put_tenant(tenant, &json!({"max_concurrent": 2})).await;
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal.jsonl");
    let worker_args = [
        "--concurrency",
        "4",
        "--heartbeat-ms",
        "300",
        "--lease-ttl-ms",
        "3000",
        "--scan-ms",
        "500",
        "--idle-poll-ms",
        "20",
    ];
    let env = [("SLUICE_JOURNAL", journal.to_str().unwrap())];
    let _workers = [
        TestWorker::spawn_env(&app.redis, &worker_args, &env),
        TestWorker::spawn_env(&app.redis, &worker_args, &env),
    ];

    // 8 clients, 30 keys each.
    let mut clients = tokio::task::JoinSet::new();
    for c in 0..8 {
        let app = app.clone();
        clients.spawn(async move {
            let mut ids = Vec::new();
            for k in 0..30 {
                let key = format!("key-{c}-{k}");
                let (status, id) = admit_until_answered(&app, tenant, &key).await;
                let (again, same) = admit_until_answered(&app, tenant, &key).await;
                assert_eq!(again, StatusCode::OK, "{key}: a second send replays");
                assert_eq!(same, id, "{key}: one key, one execution");
                // Every other one is cancelled at once (it may be queued, running or done).
                let cancelled = k % 2 == 0 && cancel_until_answered(&app, tenant, &id).await;
                ids.push((key, status, id, cancelled));
            }
            ids
        });
    }

    // Once the shard holds a few hundred keys, it moves to another master and back, twice, a
    // few keys per MIGRATE call so each move takes a while.
    let shard = app.shard(tenant).number();
    let deadline = Instant::now() + Duration::from_secs(30);
    while app.get_json(Some(tenant), "/api/executions?limit=1").await["total"]
        .as_u64()
        .unwrap_or(0)
        < 60
    {
        assert!(Instant::now() < deadline, "admissions did not get going");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let home = app.master_of(tenant).await;
    let away = (home + 1) % app.redis.masters();
    for to in [away, home, away, home] {
        let out = std::process::Command::new(crate::helpers::sluice_bin())
            .args(["cluster", "move-shard", "--shard", &shard.to_string()])
            .args(["--to", &app.redis.node_address(to), "--keys-per-call", "5"])
            .args(app.redis.args())
            .env("RUST_LOG", "warn")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "move-shard failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        println!("{}", String::from_utf8_lossy(&out.stdout).trim());
        assert_eq!(app.master_of(tenant).await, to);
    }

    let mut all = Vec::new();
    while let Some(ids) = clients.join_next().await {
        all.extend(ids.unwrap());
    }
    assert_eq!(all.len(), 240);
    let distinct: std::collections::BTreeSet<&String> =
        all.iter().map(|(_, _, id, _)| id).collect();
    assert_eq!(distinct.len(), 240, "every key its own execution");
    for (_, _, id, cancelled) in &all {
        let done = app.wait_terminal(tenant, id, Duration::from_secs(60)).await;
        let expected = if *cancelled { "cancelled" } else { "completed" };
        assert_eq!(done["status"], expected, "{done}");
    }
    // Nothing else was admitted, nothing holds a slot or waits.
    let page = app.get_json(Some(tenant), "/api/executions?limit=1").await;
    assert_eq!(page["total"], 240, "{page}");
    let usage = app.usage(tenant).await;
    assert_eq!(usage["running"], 0, "{usage}");
    assert_eq!(usage["dispatched"], 0, "{usage}");
    assert_eq!(usage["waiting"], 0, "{usage}");
    assert!(
        most_at_once(&runs(&journal), tenant) <= 2,
        "the quota of 2 was exceeded"
    );
    let frozen: bool = app
        .redis
        .query(redis::cmd("EXISTS").arg(app.shard(tenant).frozen()))
        .await;
    assert!(!frozen, "the shard is still frozen");
}

/// On a cluster, Redis itself stands between a wrong shard tag and the data too: an admission
/// whose keys span two shards' slots is refused (CROSSSLOT) before it runs, and one whose
/// prefix names another shard is refused by the scripts' own check. Nothing is written.
#[tokio::test]
async fn a_wrong_shard_tag_fails_loudly_on_a_cluster() {
    if !cluster_mode() {
        println!("cluster only (SLUICE_TEST_CLUSTER=1); skipped");
        return;
    }
    use crate::fences::{admit_call, eval};
    use sluice::admission::{ExecutionId, Status, TenantId};
    use sluice::store::{composed_source, operation};

    let redis = crate::helpers::TestRedis::start().await;
    let admit = composed_source("shard", operation("admit.lua").unwrap());
    let id = ExecutionId::new();
    let (k, a) = admit_call(
        crate::helpers::shard_no(3),
        crate::helpers::shard_no(3),
        &id,
    );
    eval(&redis, &admit, &k, &a)
        .await
        .expect("the right call admits");
    let before = redis.keys().await;

    let (mut k, a) = admit_call(
        crate::helpers::shard_no(3),
        crate::helpers::shard_no(3),
        &ExecutionId::new(),
    );
    k[6] =
        crate::helpers::shard_no(4).status_index(&TenantId::parse("acme").unwrap(), Status::Queued);
    let e = eval(&redis, &admit, &k, &a).await.unwrap_err();
    assert!(
        e.to_string().to_lowercase().contains("crossslot")
            || e.to_string().to_lowercase().contains("crossed slots"),
        "{e}"
    );
    let (k, a) = admit_call(
        crate::helpers::shard_no(3),
        crate::helpers::shard_no(5),
        &ExecutionId::new(),
    );
    let e = eval(&redis, &admit, &k, &a).await.unwrap_err();
    assert!(e.to_string().contains("outside the prefix"), "{e}");
    assert_eq!(redis.keys().await, before);
}
