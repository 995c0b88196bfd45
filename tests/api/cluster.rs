//! Redis Cluster: what only a cluster can do to sluice — one master of three dying, a
//! failover, a shard's slot moving while clients admit. These run when the suite runs on a
//! cluster (`SLUICE_TEST_CLUSTER=1`, the second pass of `scripts/test.sh`); everything else in
//! the suite runs on both.
//!
//! Long on purpose: each test drives a whole three-master cluster through one failure (a death,
//! a failover, a slot move), and their common choreography is easier to follow side by side.

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

/// Sends the request `send` makes until it is answered with anything but a 503 (Redis
/// unavailable or timed out: retryable), for at most 30 s; its status and body. Counts the
/// 503s in `retried`.
async fn until_not_503<F, Fut>(retried: &mut usize, mut send: F) -> (StatusCode, Value)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = reqwest::Response>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let res = send().await;
        let status = res.status();
        let body: Value = res.json().await.unwrap();
        if status != StatusCode::SERVICE_UNAVAILABLE {
            return (status, body);
        }
        assert!(Instant::now() < deadline, "still 503 after 30 s: {body}");
        println!("a check answered 503, sent again: {body}");
        *retried += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
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
    assert_eq!(
        usage,
        json!({"running": 0, "waiting": 0, "scheduled": 0}),
        "{usage}"
    );
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
    use sluice::domain::{ExecutionId, Status, TenantId};
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
    k[1] =
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

/// One answer a client got to an admission: its tenant, when, and the status.
struct Answer {
    tenant: String,
    at: Instant,
    status: StatusCode,
}

/// Admits to `tenant` at `url` (`/api/executions` of a server) with fresh Idempotency-Keys one
/// after the other until `stop`, each key sent until answered (a 503 — Redis down, or the
/// outcome unknown — is sent again with the same key, as a client should); every answer goes
/// to `log`. The keys with their ids and the bodies sent.
async fn admit_continuously(
    http: reqwest::Client,
    url: String,
    tenant: String,
    client: usize,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    log: std::sync::Arc<std::sync::Mutex<Vec<Answer>>>,
) -> Vec<(String, String, Value)> {
    let mut keys = Vec::new();
    for k in 0.. {
        if stop.load(std::sync::atomic::Ordering::Relaxed) {
            break;
        }
        let key = format!("{tenant}-{client}-{k}");
        let body = if k % 2 == 0 {
            json!({"flow_id": "demo.echo", "params": {"key": key}})
        } else {
            json!({"flow_id": "demo.sleep", "params": {"ms": 50}})
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let res = http
                .post(&url)
                .bearer_auth(crate::helpers::ADMIN_TOKEN)
                .header("X-Tenant-Id", &tenant)
                .header("Idempotency-Key", &key)
                .json(&body)
                .send()
                .await
                .unwrap();
            let status = res.status();
            let answer: Value = res.json().await.unwrap();
            log.lock().unwrap().push(Answer {
                tenant: tenant.clone(),
                at: Instant::now(),
                status,
            });
            match status {
                StatusCode::CREATED | StatusCode::OK => {
                    let id = answer["execution_id"].as_str().unwrap().to_owned();
                    keys.push((key, id, body));
                    break;
                }
                StatusCode::SERVICE_UNAVAILABLE => {
                    assert!(Instant::now() < deadline, "{key}: still 503 after 60 s");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                other => panic!("{key}: admission answered {other}: {answer}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    keys
}

/// Issue 11: a master of three is SIGKILLed while clients admit to a tenant on it and to a
/// tenant on another master, and its replica is promoted by the cluster. The other master's
/// tenant never sees a 503; the dead master's tenant sees 503s for a few seconds (failure
/// detection after the 2 s node timeout, the replica's election, the client learning the new
/// master from MOVED and its slot refresh) and then admits again with no change of
/// configuration. Every key maps to exactly one execution, every execution acknowledged
/// (before, during or after the crash) still exists and completes, and nothing is left holding
/// a slot or waiting.
///
/// Server and worker run with `--redis-replica-acks 1`: Redis replicates asynchronously, so
/// without it a 201 answered in the last moments before the SIGKILL may be for a write the
/// replica never received — the promoted replica would not know that execution, and "every
/// acknowledged execution still exists" would hold only by luck of timing. With it, a script's
/// answer is returned only once the replica holds its writes (or, if the WAIT gets no answer
/// because the master died, the answer counts as lost and the client sends the key again).
/// On a loaded machine a WAIT can come back short before the kill, and the server then answers
/// without the replica for a while (`sluice_redis_unconfirmed_answers_total` counts them): only
/// then may a key's execution be gone after the failover, and its repeat admits it afresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_master_failover_costs_only_its_tenants_a_few_seconds_and_loses_nothing() {
    use futures_util::FutureExt;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    if !cluster_mode() {
        println!("cluster only (SLUICE_TEST_CLUSTER=1); skipped");
        return;
    }
    let redis = crate::helpers::TestRedis::start_cluster(3, 1).await;
    // Every master's replica has finished its first sync (before that, WAIT cannot succeed).
    let deadline = Instant::now() + Duration::from_secs(30);
    while redis
        .info("replication")
        .await
        .matches("state=online")
        .count()
        < 3
    {
        assert!(Instant::now() < deadline, "the replicas did not sync");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut app = TestApp::spawn_on(redis, |c| {
        c.redis.redis_timeout_ms = 1_000;
        c.redis.redis_replica_acks = 1;
        c.api.request_timeout_ms = 5_000;
    })
    .await;
    let tenants = a_tenant_per_master(&app).await;
    let (victim, bystander) = (tenants[0].clone(), tenants[1].clone());
    let _worker = TestWorker::spawn(
        &app.redis,
        &[
            "--concurrency",
            "8",
            "--lease-ttl-ms",
            "5000",
            "--heartbeat-ms",
            "500",
            "--scan-ms",
            "500",
            "--redis-timeout-ms",
            "1000",
            "--redis-replica-acks",
            "1",
        ],
    );

    // Two clients per tenant.
    let stop = Arc::new(AtomicBool::new(false));
    let log: Arc<Mutex<Vec<Answer>>> = Arc::default();
    let mut clients = tokio::task::JoinSet::new();
    for tenant in [&victim, &bystander] {
        for c in 0..2 {
            clients.spawn(admit_continuously(
                app.client.clone(),
                app.url("/api/executions"),
                tenant.clone(),
                c,
                stop.clone(),
                log.clone(),
            ));
        }
    }
    let answered = |tenant: &str, after: Instant, ok: bool| {
        log.lock()
            .unwrap()
            .iter()
            .filter(|a| a.tenant == tenant && a.at > after && a.status.is_success() == ok)
            .count()
    };
    let started = Instant::now();
    let deadline = started + Duration::from_secs(20);
    while answered(&victim, started, true) < 50 || answered(&bystander, started, true) < 50 {
        assert!(Instant::now() < deadline, "admissions did not get going");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Master 0 dies mid-stream; its replica takes over.
    app.redis.kill_node(0);
    let killed = Instant::now();
    // Answers given before a replica acknowledged them (a WAIT that came back short on a
    // loaded machine, and the calls after it while its master counted as short): a failover
    // may lose those writes, so the test can hold the server to "nothing acknowledged is lost"
    // only when there were none. Read now: the promoted replica, which has no replica of its
    // own, answers nothing before the failure is detected (2 s).
    let unconfirmed = app.app_store.unconfirmed_answers();
    // Admissions go on until the victim has been admitting again for a while.
    let deadline = killed + Duration::from_secs(40);
    loop {
        let last_503 = log
            .lock()
            .unwrap()
            .iter()
            .filter(|a| a.tenant == victim && a.status == StatusCode::SERVICE_UNAVAILABLE)
            .map(|a| a.at)
            .max();
        if let Some(last) = last_503
            && answered(&victim, last, true) >= 50
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the victim's tenant does not admit again 40 s after its master died"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::Relaxed);
    // (tenant, key, id, body)
    let mut keys: Vec<(String, String, String, Value)> = Vec::new();
    while let Some(done) = clients.join_next().await {
        // The client's tenant is in its keys' names.
        for (key, id, body) in done.unwrap() {
            let tenant = if key.starts_with(&format!("{victim}-")) {
                victim.clone()
            } else {
                bystander.clone()
            };
            keys.push((tenant, key, id, body));
        }
    }

    // The 503 windows.
    let log = std::mem::take(&mut *log.lock().unwrap());
    let unavailable = |tenant: &str| -> Vec<Duration> {
        log.iter()
            .filter(|a| a.tenant == tenant && a.status == StatusCode::SERVICE_UNAVAILABLE)
            .map(|a| a.at.saturating_duration_since(killed))
            .collect()
    };
    let victim_503 = unavailable(&victim);
    let bystander_503 = unavailable(&bystander);
    let window = victim_503.iter().max().copied().unwrap_or_default();
    println!(
        "failover: {} answers; the victim's tenant got {} 503s, the first {:?} and the last {:?} \
         after the SIGKILL; the other master's tenant got {} 503s; {unconfirmed} answers \
         unconfirmed by a replica at the SIGKILL",
        log.len(),
        victim_503.len(),
        victim_503.iter().min().copied().unwrap_or_default(),
        window,
        bystander_503.len(),
    );
    assert!(
        !victim_503.is_empty(),
        "the kill did not reach the victim's tenant"
    );
    assert!(
        bystander_503.is_empty(),
        "the other master's tenant got 503s: {bystander_503:?}"
    );
    // Detection (node timeout 2 s, then the FAIL flag spreads), election (500 ms + up to
    // 500 ms random delay), then the app's first call that learns the new master: about 4-5 s
    // here; 12 s leaves room for a loaded two-core machine.
    assert!(
        window < Duration::from_secs(12),
        "503s for {window:?} after the SIGKILL"
    );
    // The replica (node 3) serves the victim's shard now, found with no change of config.
    assert_eq!(app.master_of(&victim).await, 3);

    // Every key: one execution, which exists and completes. A key whose execution is gone
    // (its admission answered while a replica had not acknowledged it, then lost with its
    // master) is admitted afresh by its repeat, and only then.
    let ids: std::collections::BTreeSet<&String> = keys.iter().map(|(_, _, id, _)| id).collect();
    assert_eq!(ids.len(), keys.len(), "two keys share an execution");
    // A 503 here is "retry", never "gone": the checks run on a loaded machine with the 1 s
    // Redis timeout set above, so a read may time out long after the failover.
    let mut lost = Vec::new();
    let mut retried = 0;
    for (tenant, key, id, body) in &mut keys {
        let (status, again) =
            until_not_503(&mut retried, || app.post_with_key(tenant, key, body)).await;
        if status == StatusCode::CREATED && unconfirmed > 0 {
            lost.push(key.clone());
            *id = again["execution_id"].as_str().unwrap().to_owned();
            continue;
        }
        assert_eq!(
            status,
            StatusCode::OK,
            "{key}: a repeat replays ({unconfirmed} answers unconfirmed): {again}"
        );
        assert_eq!(
            again["execution_id"],
            id.as_str(),
            "{key}: one key, one execution"
        );
        let (status, found) = until_not_503(&mut retried, || app.get_execution(tenant, id)).await;
        assert_eq!(
            status,
            StatusCode::OK,
            "{key}: execution {id} is gone: {found}"
        );
    }
    if !lost.is_empty() {
        println!(
            "failover: {} acknowledged admissions lost with their master, {unconfirmed} answers \
             having been given unconfirmed: {lost:?}",
            lost.len()
        );
    }
    for (tenant, _, id, _) in &keys {
        let done = app.wait_terminal(tenant, id, Duration::from_secs(60)).await;
        assert_eq!(done["status"], "completed", "{done}");
    }
    for tenant in [&victim, &bystander] {
        let mine = keys.iter().filter(|(t, _, _, _)| t == tenant).count();
        let (_, page) = until_not_503(&mut retried, || {
            app.as_tenant(reqwest::Method::GET, "/api/executions?limit=1", tenant)
                .send()
                .map(Result::unwrap)
        })
        .await;
        assert_eq!(
            page["total"], mine,
            "{tenant}: executions without a key: {page}"
        );
        let (_, found) = until_not_503(&mut retried, || {
            app.as_tenant(
                reqwest::Method::GET,
                &format!("/api/tenants/{tenant}"),
                tenant,
            )
            .send()
            .map(Result::unwrap)
        })
        .await;
        let usage = &found["usage"];
        assert_eq!(
            *usage,
            json!({"running": 0, "waiting": 0, "scheduled": 0}),
            "{usage}"
        );
    }
    println!(
        "failover: {} keys, {} on the victim's tenant; {retried} checks answered 503 and were \
         sent again",
        keys.len(),
        keys.iter().filter(|(t, _, _, _)| *t == victim).count()
    );
}

/// Starts moving `shard` to master `to` by hand, as `move-shard` does before it copies: the
/// shard frozen, its slot IMPORTING on the target and MIGRATING on the source. The source's
/// connection and the slot.
async fn begin_move_by_hand(
    app: &TestApp,
    shard: sluice::store::Shard,
    to: usize,
) -> (redis::aio::MultiplexedConnection, u16) {
    let slot = app.redis.slot_of(&shard.prefix()).await;
    let from = app.redis.master_of_slot(slot).await;
    let (mut src, mut tgt) = (
        app.redis.node_conn(from).await,
        app.redis.node_conn(to).await,
    );
    let id_of = |c: &mut redis::aio::MultiplexedConnection| {
        let mut c = c.clone();
        async move {
            redis::cmd("CLUSTER")
                .arg("MYID")
                .query_async::<String>(&mut c)
                .await
                .unwrap()
        }
    };
    let (src_id, tgt_id) = (id_of(&mut src).await, id_of(&mut tgt).await);
    app.store().await.freeze_shard(shard).await.unwrap();
    let setslot = |state: &str, node: &str| {
        let mut c = redis::cmd("CLUSTER");
        c.arg("SETSLOT").arg(slot).arg(state).arg(node);
        c
    };
    let () = setslot("IMPORTING", &src_id)
        .query_async(&mut tgt)
        .await
        .unwrap();
    let () = setslot("MIGRATING", &tgt_id)
        .query_async(&mut src)
        .await
        .unwrap();
    (src, slot)
}

/// Copies `keys` from the source `src` to master `to` by hand (one `MIGRATE`).
async fn migrate_by_hand(
    app: &TestApp,
    src: &mut redis::aio::MultiplexedConnection,
    to: usize,
    keys: &[Vec<u8>],
) {
    let (host, port) = app
        .redis
        .node_address(to)
        .rsplit_once(':')
        .map(|(h, p)| (h.to_owned(), p.to_owned()))
        .unwrap();
    let _: redis::Value = redis::cmd("MIGRATE")
        .arg(&host)
        .arg(&port)
        .arg("")
        .arg(0)
        .arg(5_000)
        .arg("KEYS")
        .arg(keys)
        .query_async(src)
        .await
        .unwrap();
}

/// Runs `sluice cluster move-shard` for `shard` to master `to`; what it printed and its status.
fn run_move_shard(
    app: &TestApp,
    shard: sluice::store::Shard,
    to: usize,
    keys_per_call: usize,
) -> std::process::Output {
    std::process::Command::new(crate::helpers::sluice_bin())
        .args([
            "cluster",
            "move-shard",
            "--shard",
            &shard.number().to_string(),
        ])
        .args(["--to", &app.redis.node_address(to)])
        .args(["--keys-per-call", &keys_per_call.to_string()])
        .args(app.redis.args())
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

/// Runs `sluice cluster move-shard` for `shard` to master `to`; asserts it finished.
fn move_shard(app: &TestApp, shard: sluice::store::Shard, to: usize, keys_per_call: usize) {
    let out = run_move_shard(app, shard, to, keys_per_call);
    assert!(
        out.status.success(),
        "move-shard did not finish the move: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// While `sluice migrate-layout` has a move under way (`layout_to` in the meta record, as it
/// writes it), `move-shard` refuses and touches nothing: its last step lifts the shard's hold,
/// which would let this build serve rows not converted yet.
#[tokio::test]
async fn move_shard_refuses_while_a_layout_move_is_under_way() {
    if !cluster_mode() {
        println!("cluster only (SLUICE_TEST_CLUSTER=1); skipped");
        return;
    }
    let app = TestApp::spawn().await;
    let tenant = "layout-moving";
    let ids = five_queued(&app, tenant).await;
    let shard = app.shard(tenant);
    let from = app.master_of(tenant).await;
    let to = (from + 1) % app.redis.masters();
    let () = app
        .redis
        .query(
            redis::cmd("HSET")
                .arg(sluice::store::keys::meta())
                .arg("layout_to")
                .arg(sluice::store::Layout::CURRENT.number()),
        )
        .await;
    let before = app.redis.keys().await;
    let out = run_move_shard(&app, shard, to, 100);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "move-shard ran during a layout move");
    assert!(stderr.contains("sluice migrate-layout"), "{stderr}");
    assert_eq!(app.master_of(tenant).await, from, "the shard moved");
    assert_eq!(app.redis.keys().await, before, "move-shard wrote something");
    // Once the layout move is over, the same command moves it.
    let _: i64 = app
        .redis
        .query(
            redis::cmd("HDEL")
                .arg(sluice::store::keys::meta())
                .arg("layout_to"),
        )
        .await;
    move_shard(&app, shard, to, 100);
    served_after_move(&app, tenant, to, &ids).await;
}

/// Five `demo.echo` executions of `tenant`, queued (no worker yet).
async fn five_queued(app: &TestApp, tenant: &str) -> Vec<String> {
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(
            app.admit_with(tenant, json!({"flow_id": "demo.echo"}))
                .await,
        );
    }
    ids
}

/// After a move to master `to`: the shard is served there, unfrozen, and a worker completes
/// every one of `ids`.
async fn served_after_move(app: &TestApp, tenant: &str, to: usize, ids: &[String]) {
    let shard = app.shard(tenant);
    assert_eq!(app.master_of(tenant).await, to);
    assert!(!app.store().await.is_frozen(shard).await.unwrap());
    let _worker = TestWorker::spawn(&app.redis, &["--concurrency", "4"]);
    for id in ids {
        let done = app.wait_terminal(tenant, id, Duration::from_secs(20)).await;
        assert_eq!(done["status"], "completed", "{done}");
    }
}

/// A move interrupted after every key was copied (the marker last) but before the slot was
/// handed over: the source is empty and answers ASK for the shard, so the marker cannot be
/// written through it. Running the same command again must finish the move, not fail.
#[tokio::test]
async fn an_interrupted_move_is_finished_by_running_it_again() {
    if !cluster_mode() {
        println!("cluster only (SLUICE_TEST_CLUSTER=1); skipped");
        return;
    }
    let app = TestApp::spawn().await;
    let tenant = "halfway";
    let ids = five_queued(&app, tenant).await;
    let shard = app.shard(tenant);
    let to = (app.master_of(tenant).await + 1) % app.redis.masters();
    let (mut src, slot) = begin_move_by_hand(&app, shard, to).await;
    // Bytes: a layout-5 name holds a binary id.
    let keys: Vec<Vec<u8>> = redis::cmd("CLUSTER")
        .arg("GETKEYSINSLOT")
        .arg(slot)
        .arg(10_000)
        .query_async(&mut src)
        .await
        .unwrap();
    assert!(keys.contains(&shard.frozen().into_bytes()), "{keys:?}");
    migrate_by_hand(&app, &mut src, to, &keys).await;

    move_shard(&app, shard, to, 100);
    served_after_move(&app, tenant, to, &ids).await;
}

/// A move interrupted after its marker was copied alone, before the other keys (what
/// `--keys-per-call 1` did when Redis 7.0 listed the marker first): the marker is on the
/// target, the rest on the source, which answers ASK for the marker. Every re-run used to
/// fail with `Ask`, the shard refusing until `redis-cli --cluster fix`; running the command
/// again must finish the move.
#[tokio::test]
async fn a_move_interrupted_after_its_marker_went_first_is_finished_by_running_it_again() {
    if !cluster_mode() {
        println!("cluster only (SLUICE_TEST_CLUSTER=1); skipped");
        return;
    }
    let app = TestApp::spawn().await;
    let tenant = "markerfirst";
    let ids = five_queued(&app, tenant).await;
    let shard = app.shard(tenant);
    let to = (app.master_of(tenant).await + 1) % app.redis.masters();
    let (mut src, _) = begin_move_by_hand(&app, shard, to).await;
    migrate_by_hand(&app, &mut src, to, &[shard.frozen().into_bytes()]).await;

    move_shard(&app, shard, to, 1);
    served_after_move(&app, tenant, to, &ids).await;
}

/// `move-shard --keys-per-call 1` copies the freeze markers (this build's and layout 5's)
/// last, whatever order Redis lists the slot's keys in (7.0 lists the newest, the markers,
/// first): the target's own command log (`MONITOR`) shows every other key restored before
/// them. Then both are cleared and the shard serves.
#[tokio::test]
async fn one_key_per_call_moves_the_marker_last() {
    if !cluster_mode() {
        println!("cluster only (SLUICE_TEST_CLUSTER=1); skipped");
        return;
    }
    let app = TestApp::spawn().await;
    let tenant = "onebyone";
    let ids = five_queued(&app, tenant).await;
    let shard = app.shard(tenant);
    let to = (app.master_of(tenant).await + 1) % app.redis.masters();

    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("monitor.log");
    let port = app
        .redis
        .node_address(to)
        .rsplit_once(':')
        .unwrap()
        .1
        .to_owned();
    let mut monitor = std::process::Command::new("redis-cli")
        .args(["-p", &port, "monitor"])
        .stdout(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    // MONITOR answers OK once it is on.
    let on = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&log).unwrap().starts_with("OK") {
        assert!(Instant::now() < on, "MONITOR did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    move_shard(&app, shard, to, 1);
    // Every key arrived before the move's command returned; a PING through MONITOR marks the
    // end of what the log must hold.
    let mut c = app.redis.node_conn(to).await;
    let _: String = redis::cmd("PING")
        .arg("end-of-move")
        .query_async(&mut c)
        .await
        .unwrap();
    let logged = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&log)
        .unwrap()
        .contains("end-of-move")
    {
        assert!(Instant::now() < logged, "MONITOR did not log the end");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = monitor.kill();
    let _ = monitor.wait();
    let restored: Vec<String> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .filter(|l| l.contains("\"RESTORE-ASKING\""))
        .filter_map(|l| l.split('"').nth(3).map(str::to_owned))
        .collect();
    assert!(restored.len() > 5, "{restored:?}");
    // Both builds' markers were set for the move (this one's `hold`, layout 5's `hold:5`),
    // each copied once, together, after every other key.
    let markers = [shard.frozen(), shard.binary_hold()];
    for m in &markers {
        assert_eq!(
            restored.iter().filter(|k| *k == m).count(),
            1,
            "{m}: {restored:?}"
        );
    }
    let (others, last_two) = restored.split_at(restored.len() - 2);
    assert!(last_two.iter().all(|k| markers.contains(k)), "{restored:?}");
    assert!(!others.iter().any(|k| markers.contains(k)), "{restored:?}");
    // And both are gone once the shard is served again.
    for m in &markers {
        let left: i64 = app.redis.query(redis::cmd("EXISTS").arg(m)).await;
        assert_eq!(left, 0, "{m} left after the move");
    }
    served_after_move(&app, tenant, to, &ids).await;
}

/// A move interrupted in its hand-over: every key is on the target and the target already
/// owns the slot, but the seed node (here the source) may not have heard yet. The target
/// refuses to import a slot it owns; running the command again must finish the hand-over and
/// unfreeze, not fail on that refusal.
#[tokio::test]
async fn a_move_interrupted_in_its_hand_over_is_finished_by_running_it_again() {
    if !cluster_mode() {
        println!("cluster only (SLUICE_TEST_CLUSTER=1); skipped");
        return;
    }
    let app = TestApp::spawn().await;
    // A tenant whose shard is on node 0, the seed `move-shard` asks first.
    let mut tenant = None;
    for i in 0..1_000 {
        let t = format!("h{i}");
        if app.master_of(&t).await == 0 {
            tenant = Some(t);
            break;
        }
    }
    let tenant = tenant.expect("a tenant on node 0");
    let ids = five_queued(&app, &tenant).await;
    let shard = app.shard(&tenant);
    let to = 1;
    let (mut src, slot) = begin_move_by_hand(&app, shard, to).await;
    let keys: Vec<Vec<u8>> = redis::cmd("CLUSTER")
        .arg("GETKEYSINSLOT")
        .arg(slot)
        .arg(10_000)
        .query_async(&mut src)
        .await
        .unwrap();
    let (marker, rest): (Vec<Vec<u8>>, Vec<Vec<u8>>) = keys
        .into_iter()
        .partition(|k| *k == shard.frozen().into_bytes());
    migrate_by_hand(&app, &mut src, to, &rest).await;
    migrate_by_hand(&app, &mut src, to, &marker).await;
    // The target takes the slot; the source is not told.
    let mut tgt = app.redis.node_conn(to).await;
    let tgt_id: String = redis::cmd("CLUSTER")
        .arg("MYID")
        .query_async(&mut tgt)
        .await
        .unwrap();
    let () = redis::cmd("CLUSTER")
        .arg("SETSLOT")
        .arg(slot)
        .arg("NODE")
        .arg(&tgt_id)
        .query_async(&mut tgt)
        .await
        .unwrap();

    move_shard(&app, shard, to, 100);
    served_after_move(&app, &tenant, to, &ids).await;
}

/// A master added for a move holds no slot, so the cluster client's `FUNCTION LOAD` at
/// connect (sent to the masters it knows from the slot table) never reached it, and a cluster
/// does not copy libraries between masters: `move-shard` loads this build's library on its
/// target before the slot moves, so the target has it when the move ends — before any call
/// reaches it — and the moved tenant's executions are served there.
#[tokio::test]
async fn a_shard_moved_to_a_new_master_finds_the_library_there() {
    if !cluster_mode() {
        println!("cluster only (SLUICE_TEST_CLUSTER=1); skipped");
        return;
    }
    let mut app = TestApp::spawn().await;
    let tenant = "newcomer";
    let ids = five_queued(&app, tenant).await;
    let to = app.redis.add_master().await;
    assert_eq!(
        libraries_on(&app, to).await,
        0,
        "a new master starts without it"
    );
    move_shard(&app, app.shard(tenant), to, 100);
    assert_eq!(
        libraries_on(&app, to).await,
        1,
        "the move left the target without the library"
    );
    served_after_move(&app, tenant, to, &ids).await;
}

/// How many libraries of this build's name node `i` holds (0 or 1).
async fn libraries_on(app: &TestApp, i: usize) -> usize {
    let mut c = app.redis.node_conn(i).await;
    let list: redis::Value = redis::cmd("FUNCTION")
        .arg("LIST")
        .arg("LIBRARYNAME")
        .arg(sluice::store::library_name())
        .query_async(&mut c)
        .await
        .unwrap();
    match list {
        redis::Value::Array(libs) => libs.len(),
        other => panic!("FUNCTION LIST answered {other:?}"),
    }
}
