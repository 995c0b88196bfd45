//! The guarantees under faults (docs/operations.md), each attacked the way it
//! once broke: real `sluice worker` processes and a real `redis-server`, paused (SIGSTOP),
//! stalled (CLIENT PAUSE) or raced by a cancel, retry, force delete or limit change, and the
//! outcome checked as a user would check it — which run's output was accepted, the final
//! status and attempt, the tenant's usage.
//! Where timing matters, `demo.journal` leaves the evidence of when each run really ran.
//!
//! Long on purpose: one test per guarantee and the fault that once broke it; the list is the
//! table of docs/operations.md in code.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice::domain::{ExecutionId, TenantId};
use sluice::store::{Completion, LeaseState, Outcome};

use crate::helpers::{ADMIN_TOKEN, DedupMapping, FAST_WORKER, TestApp, TestWorker};

fn with<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    FAST_WORKER.iter().chain(extra).copied().collect()
}

/// A `demo.journal` file shared by the workers of one test.
struct Journal {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl Journal {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.jsonl");
        Self { _dir: dir, path }
    }

    fn env(&self) -> [(&str, &str); 1] {
        [("SLUICE_JOURNAL", self.path.to_str().unwrap())]
    }

    /// Every line so far.
    fn lines(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.path)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// The line of event `ev` of execution `id`'s run `fence`.
    fn event(&self, id: &str, fence: u64, ev: &str) -> Option<Value> {
        self.lines()
            .into_iter()
            .find(|l| l["id"] == id && l["fence"] == fence && l["ev"] == ev)
    }

    /// Waits (at most `limit`) for that line.
    async fn wait_event(&self, id: &str, fence: u64, ev: &str, limit: Duration) -> Value {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(l) = self.event(id, fence, ev) {
                return l;
            }
            assert!(
                Instant::now() < deadline,
                "no {ev} of run {fence} of {id} within {limit:?}: {:?}",
                self.lines()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Waits until the shard counter `name` reaches `at_least` (at most 15 s); returns it.
async fn wait_counter(app: &TestApp, name: &str, at_least: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let n = app.counter(name).await;
        if n >= at_least {
            return n;
        }
        assert!(Instant::now() < deadline, "{name} stayed at {n}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn id_of(e: &Value) -> String {
    e["execution_id"].as_str().unwrap().to_owned()
}

/// 1. A retry used to reset the fencing token: a worker paused in the run before the retry
/// woke up, renewed the new run's lease and had its output accepted.
///
/// Leases sized for a loaded machine: A's must expire while A is paused (so B takes over), yet
/// outlast any stall of A before the pause (a worker that cannot renew in time stops its run
/// and reports it at once, and then no stale report is left to fence); B's must outlast any
/// stall of B during the run after the retry (with 500 ms, a stall of B past it lost that run,
/// and the execution, out of attempts, failed).
#[tokio::test]
async fn a_retry_fences_off_the_paused_run_from_before_it() {
    let app = TestApp::spawn().await;
    let worker = |lease_ms: &'static str, heartbeat_ms: &'static str| {
        TestWorker::spawn(
            &app.redis,
            &[
                "--concurrency",
                "1",
                "--lease-ttl-ms",
                lease_ms,
                "--heartbeat-ms",
                heartbeat_ms,
                "--scan-ms",
                "100",
            ],
        )
    };
    let a = worker("2000", "200");
    // Runs past the moment the test pauses A, however late that is on a busy machine.
    let id = app
        .admit_with(
            "acme",
            json!({"flow_id": "demo.sleep", "params": {"ms": 3000}, "max_attempts": 1}),
        )
        .await;
    app.wait_running("acme", &id, 1).await;
    a.signal("STOP");
    let _b = worker("30000", "1000");
    // B finds A's lease expired; with no attempt left the execution is dead-lettered.
    let failed = app
        .wait_terminal("acme", &id, Duration::from_secs(15))
        .await;
    assert_eq!(failed["error"]["kind"], "lease_lost", "{failed}");
    assert_eq!(app.retry("acme", &id).await.status(), StatusCode::OK);
    let rerun = app.wait_running("acme", &id, 1).await;
    // A wakes up with its sleep long over and reports the run it held before the retry.
    a.signal("CONT");
    wait_counter(&app, "fenced", 1).await;
    let done = app
        .wait_terminal("acme", &id, Duration::from_secs(15))
        .await;
    assert_eq!(done["status"], "completed");
    assert_eq!(
        done["output"]["fence"], 2,
        "the accepted output is the run after the retry: {done}"
    );
    assert_eq!(done["started_at"], rerun["started_at"]);
    assert_eq!(done["attempt"], 1);
}

/// 2. A cancel requested while an attempt ran was lost when that attempt then failed
/// retryably: it was re-queued and ran again.
#[tokio::test]
async fn a_cancel_requested_during_a_failing_attempt_is_final() {
    let app = TestApp::spawn().await;
    // Heartbeats far apart: the cancel reaches the worker only through its report.
    let _w = TestWorker::spawn(
        &app.redis,
        &[
            "--concurrency",
            "1",
            "--lease-ttl-ms",
            "20000",
            "--heartbeat-ms",
            "8000",
            "--retry-backoff-ms",
            "20",
        ],
    );
    let id = app
        .admit_with(
            "acme",
            json!({"flow_id": "demo.journal", "params": {"ms": 800, "fail_attempts": 9},
                   "max_attempts": 4}),
        )
        .await;
    app.wait_running("acme", &id, 1).await;
    let res = app.cancel("acme", &id).await;
    assert_eq!(res.status(), StatusCode::OK);
    let e: Value = res.json().await.unwrap();
    assert_eq!(e["cancel_requested"], true);
    let done = app
        .wait_terminal("acme", &id, Duration::from_secs(15))
        .await;
    assert_eq!(done["status"], "cancelled", "{done}");
    assert_eq!(done["attempt"], 1, "it never ran again: {done}");
    assert_eq!(
        app.usage("acme").await,
        json!({"running": 0, "waiting": 0, "scheduled": 0})
    );
}

/// 4. A start call whose answer was lost (time-out while Redis stalled) still started the
/// execution; the worker took the error for "nothing read", and a lease later the execution
/// was reclaimed as if its worker had died: an attempt burned without any run.
#[tokio::test]
async fn a_start_whose_answer_was_lost_is_adopted_not_reclaimed() {
    let app = TestApp::spawn_with(|c| {
        // One shard, so every start call of the worker reads the execution's shard; an API
        // patient enough to wait out the stall.
        c.redis.shards = 1;
        c.redis.redis_timeout_ms = 5_000;
        c.api.request_timeout_ms = 20_000;
    })
    .await;
    let _w = TestWorker::spawn(
        &app.redis,
        &[
            "--redis-timeout-ms",
            "300",
            "--lease-ttl-ms",
            "3000",
            "--heartbeat-ms",
            "500",
            "--scan-ms",
            "100",
            "--retry-backoff-ms",
            "1000",
        ],
    );
    // Workers are woken by Redis, so a start call is sent into a stall only when the worker
    // itself decides to look: here, when a retry's backoff ends. The first attempt fails
    // (retryably); while the backoff runs, Redis is paused for longer than what is left of
    // it, so the start call of the second attempt times out on the worker's side and runs on
    // Redis's side once the pause ends.
    let id = app
        .admit_with(
            "acme",
            json!({"flow_id": "demo.journal", "params": {"ms": 100, "fail_attempts": 1}}),
        )
        .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let row: Value = app.get_execution("acme", &id).await.json().await.unwrap();
        if row["status"] == "queued" && row["attempt"] == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the first attempt never failed: {row}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    app.redis.pause(1_500, "WRITE").await;
    let done = app
        .wait_terminal("acme", &id, Duration::from_secs(20))
        .await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["attempt"], 2, "no attempt was lost to a phantom start");
    assert_eq!(app.counter("reclaimed").await, 0);
}

/// 5. A handler that panicked left its execution running for ever, its lease renewed and its
/// tenant's slot held.
#[tokio::test]
async fn a_panicking_handler_fails_its_execution_and_the_worker_goes_on() {
    let app = TestApp::spawn().await;
    let mut w = TestWorker::spawn(&app.redis, &with(&["--concurrency", "1"]));
    let id = app
        .admit_with("acme", json!({"flow_id": "demo.panic", "max_attempts": 2}))
        .await;
    let done = app
        .wait_terminal("acme", &id, Duration::from_secs(15))
        .await;
    assert_eq!(done["status"], "failed");
    assert_eq!(done["error"]["kind"], "handler_panic");
    assert!(
        done["error"]["message"]
            .as_str()
            .unwrap()
            .contains("panicked on purpose"),
        "{done}"
    );
    assert_eq!(done["attempt"], 2);
    assert_eq!(
        app.usage("acme").await,
        json!({"running": 0, "waiting": 0, "scheduled": 0})
    );
    let letters = app.dead_letters().await;
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0]["reason"], "handler_panic");
    // The same worker runs the next execution.
    let next = app
        .admit_with("acme", json!({"flow_id": "demo.echo", "params": {"n": 1}}))
        .await;
    let next = app
        .wait_terminal("acme", &next, Duration::from_secs(10))
        .await;
    assert_eq!(next["output"], json!({"n": 1}));
    assert!(w.is_running());
}

/// 6. Dedup keys expired a fixed time after admission, whatever the status: an execution still
/// queued or running a week later could be admitted twice under the same key.
#[tokio::test]
async fn a_dedup_key_expires_only_once_its_execution_is_terminal() {
    let app = TestApp::spawn().await;
    let dedup_ttl = 7 * 24 * 3600;
    // While live, the mapping is a field of its bucket, which never expires; once terminal,
    // the string key with the TTL: -1 stands for "live" below.
    let ttl = async |app: &TestApp| -> i64 {
        match app.dedup_mapping("acme", "order-1").await {
            DedupMapping::Live(_) => -1,
            DedupMapping::Ended(_, ttl) => ttl,
            DedupMapping::Free => -2,
        }
    };
    let body = json!({"flow_id": "demo.sleep", "params": {"ms": 60000}});
    let res = app.post_with_key("acme", "order-1", &body).await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let id = id_of(&res.json().await.unwrap());
    assert_eq!(ttl(&app).await, -1, "no expiry while queued");
    let _w = TestWorker::spawn(&app.redis, &with(&[]));
    app.wait_running("acme", &id, 1).await;
    assert_eq!(ttl(&app).await, -1, "no expiry while running");
    app.cancel("acme", &id).await;
    app.wait_terminal("acme", &id, Duration::from_secs(10))
        .await;
    let left = ttl(&app).await;
    assert!(
        left > dedup_ttl - 60 && left <= dedup_ttl,
        "the TTL counts from the end: {left}"
    );
    // A retry makes it live again, and the key keeps mapping to it.
    assert_eq!(app.retry("acme", &id).await.status(), StatusCode::OK);
    assert_eq!(ttl(&app).await, -1);
    let res = app.post_with_key("acme", "order-1", &body).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(id_of(&res.json().await.unwrap()), id);
    app.wait_running("acme", &id, 1).await;
    assert_eq!(ttl(&app).await, -1);
    app.cancel("acme", &id).await;
    app.wait_terminal("acme", &id, Duration::from_secs(10))
        .await;
    assert!(ttl(&app).await > dedup_ttl - 60);
}

/// 7. Force-deleting a running execution freed its slot at once while its handler went on
/// until the next heartbeat: the tenant ran more than `max_concurrent`.
#[tokio::test]
async fn a_force_deleted_running_execution_holds_its_slot_until_its_handler_stops() {
    let app = TestApp::spawn().await;
    let journal = Journal::new();
    let w = TestWorker::spawn_env(
        &app.redis,
        &[
            "--concurrency",
            "4",
            "--lease-ttl-ms",
            "6000",
            "--heartbeat-ms",
            "1000",
        ],
        &journal.env(),
    );
    app.put_tenant("acme", &json!({"max_concurrent": 1})).await;
    let long = json!({"flow_id": "demo.journal", "params": {"ms": 30000}});
    let res = app.post_with_key("acme", "job-x", &long).await;
    let x = id_of(&res.json().await.unwrap());
    app.wait_running("acme", &x, 1).await;
    let y = app
        .admit_with(
            "acme",
            json!({"flow_id": "demo.journal", "params": {"ms": 50}}),
        )
        .await;
    // The worker is told of a force delete at once: frozen, it cannot stop x's handler before
    // the checks below (well within x's lease).
    w.signal("STOP");
    assert_eq!(
        app.delete("acme", &x, true).await.status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        app.get_execution("acme", &x).await.status(),
        StatusCode::NOT_FOUND
    );
    // The key is free at once; the slot is not while x's handler runs.
    let res = app.post_with_key("acme", "job-x", &long).await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let z = id_of(&res.json().await.unwrap());
    assert_ne!(z, x);
    assert_eq!(
        app.usage("acme").await,
        json!({"running": 1, "waiting": 2, "scheduled": 0}),
        "x counts as running until its handler stops"
    );
    let e = app.execution("acme", &y).await;
    assert_eq!(e["queue_state"], "waiting", "{e}");
    // Another worker with room finds nothing it may start.
    let store = app.store().await;
    let batch = store
        .start(
            app.shard("acme"),
            "another-worker",
            4,
            Duration::from_secs(30),
            0,
        )
        .await
        .unwrap();
    assert!(batch.started.is_empty(), "started while x's handler ran");
    assert!(journal.event(&x, 1, "end").is_none());
    w.signal("CONT");
    // Until y is over, at most one of them counts as running at any time.
    let deadline = Instant::now() + Duration::from_secs(15);
    let done = loop {
        let usage = app.usage("acme").await;
        assert!(usage["running"].as_u64().unwrap() <= 1, "{usage}");
        let e = app.execution("acme", &y).await;
        if e["status"] != "queued" && e["status"] != "running" {
            break e;
        }
        assert!(Instant::now() < deadline, "y did not end: {e}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(done["status"], "completed");
    let x_end = journal
        .wait_event(&x, 1, "end", Duration::from_secs(5))
        .await;
    let y_start = journal
        .wait_event(&y, 1, "start", Duration::from_secs(5))
        .await;
    assert!(
        x_end["t"].as_u64() <= y_start["t"].as_u64(),
        "y started at {} while the deleted x ran until {}",
        y_start["t"],
        x_end["t"]
    );
    // Its row is gone for good once the handler stopped; z runs next.
    let row = app.shard("acme").row(&ExecutionId::parse(&x).unwrap());
    let exists: i64 = app.redis.query(redis::cmd("EXISTS").arg(row)).await;
    assert_eq!(exists, 0);
    app.wait_running("acme", &z, 1).await;
    app.cancel("acme", &z).await;
}

/// 8a. `PUT /api/tenants/{t}` reset absent fields: `{"enabled": false}` turned a limit of 1
/// into the default and dispatched everything waiting (now: would let all three start).
#[tokio::test]
async fn disabling_a_tenant_changes_nothing_else() {
    let app = TestApp::spawn().await;
    app.put_tenant("acme", &json!({"max_concurrent": 1, "max_queued": 10}))
        .await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(id_of(&app.admit("acme", "demo.echo").await));
    }
    let states = async |app: &TestApp| {
        let mut v = Vec::new();
        for id in &ids {
            v.push(app.execution("acme", id).await["queue_state"].clone());
        }
        v
    };
    let t = app.put_tenant("acme", &json!({"enabled": false})).await;
    assert_eq!(t["max_concurrent"], 1);
    assert_eq!(t["max_queued"], 10);
    assert_eq!(t["enabled"], false);
    assert_eq!(
        t["usage"],
        json!({"running": 0, "waiting": 3, "scheduled": 0})
    );
    // Still one at a time: only the oldest would start.
    assert_eq!(states(&app).await, ["ready", "waiting", "waiting"]);
    let res = app
        .post_execution("acme", &json!({"flow_id": "demo.echo"}))
        .await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    let t = app.put_tenant("acme", &json!({"enabled": true})).await;
    assert_eq!(t["max_concurrent"], 1);
    assert_eq!(t["max_queued"], 10);
    assert_eq!(
        t["usage"],
        json!({"running": 0, "waiting": 3, "scheduled": 0})
    );
    assert_eq!(states(&app).await, ["ready", "waiting", "waiting"]);
}

/// 8b. Raising `max_concurrent` dispatched at most 1000 waiting executions; the rest waited
/// for releases that might never come. Now nothing is moved when the limit rises: every
/// waiting execution that fits is ready at once, and a worker starts them all.
#[tokio::test]
async fn raising_the_limit_lets_every_waiting_execution_that_fits_start() {
    let app = TestApp::spawn().await;
    app.put_tenant("acme", &json!({"max_concurrent": 1})).await;
    let n = 1_201;
    let admitted = futures_util::future::join_all((0..16).map(|_| async {
        let mut ids = Vec::new();
        loop {
            // Claim one of the n admissions.
            let i = COUNTER.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if i >= n {
                return ids;
            }
            ids.push(id_of(&app.admit("acme", "demo.echo").await));
        }
    }))
    .await;
    static COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let admitted: BTreeSet<String> = admitted.into_iter().flatten().collect();
    assert_eq!(admitted.len(), n);
    assert_eq!(app.waiting_len("acme").await, 1_201);
    let queue = app.queue_ids("acme").await;
    let (first, last) = (queue[0].clone(), queue[n - 1].clone());
    assert_eq!(app.execution("acme", &first).await["queue_state"], "ready");
    assert_eq!(app.execution("acme", &last).await["queue_state"], "waiting");
    let t = app
        .put_tenant("acme", &json!({"max_concurrent": 5000}))
        .await;
    assert_eq!(
        t["usage"],
        json!({"running": 0, "waiting": 1201, "scheduled": 0})
    );
    // The last in the queue fits now: all 1201 would start if workers had room.
    assert_eq!(app.execution("acme", &last).await["queue_state"], "ready");
    assert_eq!(app.runnable_tenants("acme").await, ["acme"]);
    // And a worker starts every one of them.
    let _w = TestWorker::spawn(&app.redis, &with(&["--concurrency", "32"]));
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let page = app.page("acme", "status=completed&limit=1").await;
        if page["total"] == n {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not all started: {}",
            app.usage("acme").await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(app.start_log("acme").await.len(), n);
    assert_eq!(
        app.usage("acme").await,
        json!({"running": 0, "waiting": 0, "scheduled": 0})
    );
}

/// 8c. A new admission overtook older waiting executions when room appeared without their
/// promotion (an interrupted limit change, a repaired slot): FIFO within a tenant broke. Now
/// nothing is promoted: a tenant's queue is ordered by a key fixed at admission, and room
/// appearing behind sluice's back changes nothing of that order.
#[tokio::test]
async fn a_new_admission_never_overtakes_an_older_waiting_one() {
    let app = TestApp::spawn().await;
    let journal = Journal::new();
    app.put_tenant("acme", &json!({"max_concurrent": 1})).await;
    let quick = json!({"flow_id": "demo.journal", "params": {"ms": 0}});
    let mut ids = Vec::new();
    for _ in 0..121 {
        ids.push(app.admit_with("acme", quick.clone()).await);
    }
    // Room appears with nobody told: the limit raised behind sluice's back.
    let tenant = TenantId::parse("acme").unwrap();
    let _: i64 = app
        .redis
        .query(
            redis::cmd("HSET")
                .arg(app.shard("acme").tenant_config(&tenant))
                .arg("max_concurrent")
                .arg(1000),
        )
        .await;
    let newest = app.admit_with("acme", quick).await;
    ids.push(newest.clone());
    // The newcomer is last in the queue, behind every older one, although there is room.
    assert_eq!(app.queue_ids("acme").await, ids);
    // A worker with one slot starts them one by one: in admission order.
    let _w = TestWorker::spawn_env(&app.redis, &with(&["--concurrency", "1"]), &journal.env());
    app.wait_terminal("acme", &newest, Duration::from_secs(60))
        .await;
    let started: Vec<String> = journal
        .lines()
        .into_iter()
        .filter(|l| l["ev"] == "start")
        .map(|l| l["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(started, ids);
}

/// 8d. Deleting a tenant dropped its limits but left its waiting executions stranded until
/// some slot freed. Now a deleted tenant's queued executions end with it (removed, never
/// started), so none is stranded either way; issue 38, 8b: and they are not left for a tenant
/// registered again under the same id (`deletion::`).
#[tokio::test]
async fn deleting_a_tenant_leaves_none_of_its_executions_stranded() {
    let app = TestApp::spawn().await;
    // A limit of 0: nothing of the tenant can start, so it is not runnable, and only the
    // deletion can end them (no slot will ever free).
    app.put_tenant("acme", &json!({"max_concurrent": 0})).await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(id_of(&app.admit("acme", "demo.echo").await));
    }
    for id in &ids {
        assert_eq!(app.execution("acme", id).await["queue_state"], "waiting");
    }
    assert!(app.runnable_tenants("acme").await.is_empty());
    let res = app
        .client
        .delete(app.url("/api/tenants/acme"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    // Gone, not waiting: nothing of the tenant is queued, runnable or left to start.
    for id in &ids {
        let res = app.get_execution("acme", id).await;
        assert_eq!(res.status(), StatusCode::NOT_FOUND, "{id}");
    }
    assert!(app.queue_ids("acme").await.is_empty());
    assert!(app.runnable_tenants("acme").await.is_empty());
    assert_eq!(app.row_count().await, 0);
}

/// 9a and 6. `fenced` counted repeated reports that had in fact been applied; and a worker
/// other than the lease holder could renew or complete a run when it named the right attempt.
#[tokio::test]
async fn reports_are_fenced_by_run_and_holder_and_repeats_are_not_counted() {
    let app = TestApp::spawn().await;
    let store = app.store().await;
    let shard = app.shard("acme");
    let id = id_of(&app.admit("acme", "demo.echo").await);
    let ttl = Duration::from_secs(30);
    let started = store
        .start(shard, "holder", 1, ttl, 0)
        .await
        .unwrap()
        .started;
    assert_eq!(started.len(), 1);
    let run = &started[0];
    assert_eq!(run.id.as_str(), id);
    assert_eq!((run.fence, run.attempt), (1, 1));
    // Another worker naming the right execution and fence is not the holder.
    let beat = store
        .heartbeat(shard, "intruder", &[(run.id.clone(), run.fence)], ttl)
        .await
        .unwrap();
    assert_eq!(beat, vec![LeaseState::Lost]);
    let done = Outcome::Completed(json!({"by": "intruder"}));
    let c = store
        .complete(shard, &run.id, run.fence, "intruder", &done)
        .await
        .unwrap();
    assert_eq!(c, Completion::Stale);
    // The holder's report, then the same report again (as after a lost reply).
    let done = Outcome::Completed(json!({"by": "holder"}));
    let c = store
        .complete(shard, &run.id, run.fence, "holder", &done)
        .await
        .unwrap();
    assert_eq!(c, Completion::Done(sluice::domain::Status::Completed));
    let c = store
        .complete(shard, &run.id, run.fence, "holder", &done)
        .await
        .unwrap();
    assert_eq!(c, Completion::Repeat);
    assert_eq!(
        app.counter("fenced").await,
        1,
        "only the intruder was fenced"
    );
    let e = app.execution("acme", &id).await;
    assert_eq!(e["output"], json!({"by": "holder"}));
}

/// A report repeated after its answer was lost is recognised for every outcome and changes
/// nothing on Redis, byte for byte (`complete.lua` answers a call of one report that changes
/// nothing from its row alone, before anything else is read); asked to chain, it starts
/// nothing although work waits; and a run that is current is never taken for a repeat: the
/// next run of a retried execution, reported once, is recorded.
#[tokio::test]
async fn a_repeated_report_changes_nothing_whatever_its_outcome() {
    let app = TestApp::spawn().await;
    let store = app.store().await;
    let shard = app.shard("acme");
    let ttl = Duration::from_secs(60);
    let outcomes = [
        Outcome::Completed(json!({"ok": 1})),
        Outcome::Failed {
            kind: "handler_error".into(),
            message: "again later".into(),
            retry_after: Some(Duration::from_millis(1)),
        },
        Outcome::Failed {
            kind: "handler_error".into(),
            message: "never".into(),
            retry_after: None,
        },
        Outcome::Cancelled,
        Outcome::Released,
        Outcome::Abandoned,
    ];
    for _ in 0..outcomes.len() + 1 {
        app.admit("acme", "demo.echo").await;
    }
    let runs = store
        .start(shard, "w", outcomes.len(), ttl, 0)
        .await
        .unwrap()
        .started;
    assert_eq!(runs.len(), outcomes.len());
    for (run, outcome) in runs.iter().zip(&outcomes) {
        let first = store
            .complete(shard, &run.id, run.fence, "w", outcome)
            .await
            .unwrap();
        assert_ne!(first, Completion::Repeat, "{outcome:?}");
        assert_ne!(first, Completion::Stale, "{outcome:?}");
        let before = app.redis.dump().await;
        let (again, batch) = store
            .complete_and_start(shard, &run.id, run.fence, "w", outcome, 1, ttl, 0)
            .await
            .unwrap();
        assert_eq!(again, Completion::Repeat, "{outcome:?}");
        assert!(
            batch.started.is_empty(),
            "{outcome:?}: a repeat started {batch:?}"
        );
        assert_eq!(
            app.redis.dump().await,
            before,
            "{outcome:?}: a repeat wrote"
        );
    }
    // The retried one's next run (a new fence) is current: its report is recorded.
    let retried = &runs[1];
    let deadline = Instant::now() + Duration::from_secs(10);
    let next = loop {
        let started = store.start(shard, "w", 8, ttl, 0).await.unwrap().started;
        if let Some(r) = started.into_iter().find(|r| r.id == retried.id) {
            break r;
        }
        assert!(Instant::now() < deadline, "the retry was not started again");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(next.fence > retried.fence);
    let done = Outcome::Completed(json!({"second": true}));
    let c = store
        .complete(shard, &next.id, next.fence, "w", &done)
        .await
        .unwrap();
    assert_eq!(c, Completion::Done(sluice::domain::Status::Completed));
    // The first run's report again, now that a later run's was taken: refused as stale.
    let c = store
        .complete(shard, &retried.id, retried.fence, "w", &outcomes[1])
        .await
        .unwrap();
    assert_eq!(c, Completion::Stale);
    let e = app.execution("acme", retried.id.as_str()).await;
    assert_eq!(e["output"], json!({"second": true}), "{e}");
    assert_eq!(app.counter("fenced").await, 1);
}

/// The lease holder stops a run it can no longer prove it holds: Redis stalled past the lease,
/// so another worker may start the execution as soon as Redis is back.
#[tokio::test]
async fn a_run_whose_lease_cannot_be_renewed_is_stopped_before_another_starts() {
    let app = TestApp::spawn().await;
    let journal = Journal::new();
    let _w = TestWorker::spawn_env(
        &app.redis,
        &[
            "--redis-timeout-ms",
            "200",
            "--lease-ttl-ms",
            "1500",
            "--heartbeat-ms",
            "300",
            "--scan-ms",
            "300",
        ],
        &journal.env(),
    );
    let id = app
        .admit_with(
            "acme",
            json!({"flow_id": "demo.journal", "params": {"ms": 4000}, "max_attempts": 3}),
        )
        .await;
    app.wait_running("acme", &id, 1).await;
    app.redis.signal("STOP");
    let stopped = journal
        .wait_event(&id, 1, "end", Duration::from_secs(10))
        .await;
    app.redis.signal("CONT");
    assert_eq!(stopped["how"], "stopped");
    let start = journal.event(&id, 1, "start").unwrap();
    let ran = stopped["t"].as_u64().unwrap() - start["t"].as_u64().unwrap();
    assert!(ran < 4000, "the run went on for {ran} ms");
    assert!(
        stopped["t"].as_u64().unwrap() <= stopped["lease_deadline"].as_u64().unwrap() + 500,
        "stopped long after its lease: {stopped}"
    );
    let done = app
        .wait_terminal("acme", &id, Duration::from_secs(20))
        .await;
    assert_eq!(done["status"], "completed");
    // Usually the second run completes it. On a loaded machine (a cluster coming back from a
    // whole stop) the second can lose its lease in turn and be stopped the same way: then a
    // third completes it. Either way every run started only after the one before it ended,
    // and every stopped run counted as an attempt.
    let last = done["output"]["fence"].as_u64().unwrap();
    assert!((2..=3).contains(&last), "{done}");
    assert_eq!(
        done["attempt"], last,
        "every stopped run counted as an attempt"
    );
    for fence in 2..=last {
        let before = journal
            .wait_event(&id, fence - 1, "end", Duration::from_secs(10))
            .await;
        let start = journal.event(&id, fence, "start").unwrap();
        assert!(
            start["t"].as_u64() >= before["t"].as_u64(),
            "run {fence} started before run {} ended: {start} {before}",
            fence - 1
        );
    }
    let runs: BTreeSet<u64> = journal
        .lines()
        .iter()
        .filter(|l| l["ev"] == "start")
        .map(|l| l["fence"].as_u64().unwrap())
        .collect();
    assert_eq!(runs, (1..=last).collect::<BTreeSet<u64>>());
}
