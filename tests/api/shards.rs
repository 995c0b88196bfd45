//! Shards are served on their own: a shard whose calls fail — here for real, its
//! keys replaced by a value of the wrong type so Redis refuses every call on them, as a broken
//! master would — holds back no other shard's starts, orphan scans or sweeps, and is picked up
//! again once it is repaired; a worker started before its Redis waits for it; and however many
//! shards race for a worker's slots, it never runs more handlers than its concurrency.

use std::collections::{BTreeSet, HashSet};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice::domain::{Status, TenantId};
use sluice::store::Shard;

use crate::helpers::{FAST_WORKER, TestApp, TestWorker};

fn with(extra: &[&'static str]) -> Vec<&'static str> {
    FAST_WORKER.iter().chain(extra).copied().collect()
}

/// Two tenants: one of the first shard (the first that a walk over the shards in order
/// visits, so breaking it would hold back every other one) and one of another shard.
fn first_and_other(app: &TestApp) -> (String, String) {
    let find = |on_first: bool| {
        (0..1000)
            .map(|i| format!("t{i}"))
            .find(|t| (app.shard(t).number() == 0) == on_first)
            .expect("tenants land on every shard")
    };
    (find(true), find(false))
}

/// Where a broken key's real value waits (same hash tag, so the same slot on a cluster).
fn parked(key: &str) -> String {
    format!("{key}:parked")
}

/// Breaks `key`: its value (if any) moves aside and a string takes its place, so every command
/// and script on it fails with WRONGTYPE.
async fn break_key(app: &TestApp, key: &str) {
    // (A name as `TestRedis::keys` lists it, `key_text`: its bytes.)
    let (key, parked_key) = (
        crate::helpers::key_bytes(key),
        crate::helpers::key_bytes(&parked(key)),
    );
    let exists: i64 = app.redis.query(redis::cmd("EXISTS").arg(&key)).await;
    if exists == 1 {
        let _: () = app
            .redis
            .query(redis::cmd("RENAME").arg(&key).arg(&parked_key))
            .await;
    }
    let _: () = app
        .redis
        .query(redis::cmd("SET").arg(&key).arg("broken"))
        .await;
}

/// Puts the real value of a key `break_key` broke back.
async fn repair_key(app: &TestApp, key: &str) {
    let (key, parked_key) = (
        crate::helpers::key_bytes(key),
        crate::helpers::key_bytes(&parked(key)),
    );
    let _: i64 = app.redis.query(redis::cmd("DEL").arg(&key)).await;
    let parked_exists: i64 = app.redis.query(redis::cmd("EXISTS").arg(&parked_key)).await;
    if parked_exists == 1 {
        let _: () = app
            .redis
            .query(redis::cmd("RENAME").arg(&parked_key).arg(&key))
            .await;
    }
}

async fn admit_echoes(app: &TestApp, tenant: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        ids.push(
            app.admit_with(tenant, json!({"flow_id": "demo.echo", "params": {"i": i}}))
                .await,
        );
    }
    ids
}

async fn assert_completed(app: &TestApp, tenant: &str, ids: &[String]) {
    for id in ids {
        let e = app.wait_terminal(tenant, id, Duration::from_secs(20)).await;
        assert_eq!(e["status"], "completed", "{e}");
        assert_eq!(e["attempt"], 1, "{e}");
    }
}

#[tokio::test]
async fn a_broken_shard_holds_back_no_other_shard_and_is_picked_up_once_repaired() {
    let app = TestApp::spawn().await;
    let (broken, healthy) = first_and_other(&app);
    let broken = broken.as_str();
    let ready = app.shard(broken).runnable();

    // Broken before the worker starts, with work queued on it: its runnable set is a value of
    // the wrong type, so every start there fails.
    let queued = admit_echoes(&app, broken, 3).await;
    break_key(&app, &ready).await;
    let mut worker = TestWorker::spawn(&app.redis, &with(&["--concurrency", "2"]));
    let ids = admit_echoes(&app, &healthy, 6).await;
    assert_completed(&app, &healthy, &ids).await;
    assert!(
        worker.is_running(),
        "a shard failing at start stopped the worker"
    );
    for id in &queued {
        let e = app.execution(broken, id).await;
        assert_eq!(e["status"], "queued", "{e}");
    }
    // Repaired: its pickup's next call starts what waited.
    repair_key(&app, &ready).await;
    assert_completed(&app, broken, &queued).await;

    // Broken while the worker runs: its starts fail, then the `adopt` calls that follow a
    // failed start fail too (and keep that start's slot reserved); the other shard goes on
    // with the slot left.
    break_key(&app, &ready).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let ids = admit_echoes(&app, &healthy, 6).await;
    assert_completed(&app, &healthy, &ids).await;
    assert!(worker.is_running());
    repair_key(&app, &ready).await;
    let later = admit_echoes(&app, broken, 3).await;
    assert_completed(&app, broken, &later).await;

    assert_eq!(app.counter("completed").await, 18);
    assert_eq!(app.counter("reclaimed").await, 0);
    assert!(app.dead_letters().await.is_empty());
}

#[tokio::test]
async fn many_shards_racing_for_slots_never_run_more_handlers_than_the_concurrency() {
    let app = TestApp::spawn().await;
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal.jsonl");
    let tenants: Vec<String> = (0..24).map(|i| format!("c{i}")).collect();
    let shards: BTreeSet<u16> = tenants.iter().map(|t| app.shard(t).number()).collect();
    assert!(shards.len() >= 8, "tenants on {} shards only", shards.len());
    // A backlog on every one of those shards before the worker starts, so their pickups all
    // race for slots from the first moment.
    let mut ids = Vec::new();
    for (i, t) in tenants.iter().enumerate() {
        for j in 0..10 {
            let ms = 100 + (i * 7 + j * 13) % 100;
            ids.push(
                app.admit_with(t, json!({"flow_id": "demo.journal", "params": {"ms": ms}}))
                    .await,
            );
        }
    }
    const CONCURRENCY: i64 = 20;
    let _worker = TestWorker::spawn_env(
        &app.redis,
        &[
            "--concurrency",
            "20",
            "--lease-ttl-ms",
            "3000",
            "--heartbeat-ms",
            "500",
            "--scan-ms",
            "100",
        ],
        &[("SLUICE_JOURNAL", journal.to_str().unwrap())],
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while app.counter("completed").await < ids.len() as u64 {
        assert!(Instant::now() < deadline, "the backlog was not worked off");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let text = std::fs::read_to_string(&journal).unwrap();
    let mut events: Vec<(u64, i64)> = Vec::new();
    let mut runs = HashSet::new();
    for line in text.lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        let t = v["t_us"].as_u64().expect("t_us");
        if v["ev"] == "start" {
            assert!(
                runs.insert((v["id"].to_string(), v["fence"].as_u64())),
                "a run started twice: {line}"
            );
            events.push((t, 1));
        } else {
            assert_eq!(v["how"], "ok", "{line}");
            events.push((t, -1));
        }
    }
    assert_eq!(runs.len(), ids.len(), "each execution ran exactly once");
    // At the same microsecond an end counts before a start (a slot is given back after its
    // run's end was written, so that order is the real one).
    events.sort();
    let (mut running, mut most) = (0, 0);
    for (_, d) in events {
        running += d;
        most = most.max(running);
    }
    assert!(
        most <= CONCURRENCY,
        "{most} handlers ran at once with concurrency {CONCURRENCY}"
    );
    assert_eq!(most, CONCURRENCY, "the backlog never filled every slot");
    assert_eq!(app.counter("reclaimed").await, 0);
}

#[tokio::test]
async fn the_sweeper_goes_on_past_a_shard_it_cannot_read_and_sweeps_it_once_repaired() {
    let app = TestApp::spawn().await;
    let (a, b) = first_and_other(&app);
    let a = a.as_str();
    let (sa, sb) = (app.shard(a), app.shard(&b));
    let (ta, tb) = (TenantId::parse(a).unwrap(), TenantId::parse(&b).unwrap());
    app.admit_with(a, json!({"flow_id": "demo.echo"})).await;
    app.admit_with(&b, json!({"flow_id": "demo.echo"})).await;
    let ghost = |n: u32| {
        sa.listing_member(
            Some(Status::Completed),
            &sluice::domain::FlowId::parse("demo.echo").unwrap(),
            &sluice::domain::ExecutionId::parse(&format!("{n:032x}")).unwrap(),
        )
    };
    let haunt = |shard: Shard, t: &TenantId, n: u32| {
        redis::cmd("ZADD")
            .arg(shard.listing(t))
            .arg(0)
            .arg(ghost(n))
            .clone()
    };
    let haunted = |shard: Shard, t: &TenantId, n: u32| {
        redis::cmd("ZSCORE")
            .arg(shard.listing(t))
            .arg(ghost(n))
            .clone()
    };
    let _: i64 = app.redis.query(&mut haunt(sa, &ta, 1)).await;
    let _: i64 = app.redis.query(&mut haunt(sb, &tb, 2)).await;
    let store = std::sync::Arc::new(app.store().await);
    let hold = Duration::from_secs(5);

    // Shard A's tenant list cannot be read: B is swept all the same.
    break_key(&app, &sa.tenants()).await;
    let repairs = sluice::sweeper::sweep_once(store.clone(), "test", hold)
        .await
        .expect("took the turn");
    assert_eq!(repairs.get("index"), Some(&1), "{repairs:?}");
    let left: Option<f64> = app.redis.query(&mut haunted(sb, &tb, 2)).await;
    assert_eq!(left, None, "the healthy shard was not swept");
    let left: Option<f64> = app.redis.query(&mut haunted(sa, &ta, 1)).await;
    assert_eq!(left, Some(0.0));

    // Shard A fails in the middle of its walk now (its tenant's waiting set is not a set):
    // B's walk goes on.
    repair_key(&app, &sa.tenants()).await;
    let _: () = app
        .redis
        .query(redis::cmd("SET").arg(sa.waiting(&ta)).arg("broken"))
        .await;
    let _: i64 = app.redis.query(&mut haunt(sb, &tb, 3)).await;
    let mut sweeper = sluice::sweeper::Sweeper::new(store.clone());
    let turn = sweeper.advance(1_000).await;
    assert_eq!(
        turn.failed.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        vec![sa],
        "{:?}",
        turn.failed
    );
    assert!(turn.done, "a failed shard does not hold the round up");
    assert_eq!(turn.repairs.get("index"), Some(&1), "{:?}", turn.repairs);
    let left: Option<f64> = app.redis.query(&mut haunted(sb, &tb, 3)).await;
    assert_eq!(left, None);

    // Repaired: the next turn sweeps it.
    let _: i64 = app
        .redis
        .query(redis::cmd("DEL").arg(sa.waiting(&ta)))
        .await;
    let turn = sweeper.advance(1_000).await;
    assert!(turn.failed.is_empty(), "{:?}", turn.failed);
    assert_eq!(turn.repairs.get("index"), Some(&1), "{:?}", turn.repairs);
    let left: Option<f64> = app.redis.query(&mut haunted(sa, &ta, 1)).await;
    assert_eq!(left, None, "the repaired shard was not swept");
}

#[tokio::test]
async fn a_worker_started_while_redis_is_down_waits_for_it() {
    let mut app = TestApp::spawn().await;
    app.redis.kill();
    let mut worker = TestWorker::spawn(&app.redis, FAST_WORKER);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(worker.is_running(), "the worker gave up on Redis");
    app.redis.restart().await;
    // The API reconnects too; its first answers may still be 503.
    let deadline = Instant::now() + Duration::from_secs(15);
    let id = loop {
        let res = app
            .post_execution("acme", &json!({"flow_id": "demo.echo"}))
            .await;
        if res.status() == StatusCode::CREATED {
            break res.json::<Value>().await.unwrap()["execution_id"]
                .as_str()
                .unwrap()
                .to_owned();
        }
        assert!(Instant::now() < deadline, "no admission after the restart");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let e = app
        .wait_terminal("acme", &id, Duration::from_secs(20))
        .await;
    assert_eq!(e["status"], "completed");
}

/// A worker started before its Redis waits for it (logging each retry, with a growing pause)
/// and still stops at once, cleanly, on SIGTERM while it waits — a container stopped before
/// its Redis ever came up must not hang until it is killed.
#[tokio::test]
async fn a_worker_waiting_for_redis_stops_cleanly_on_sigterm() {
    let mut app = TestApp::spawn().await;
    app.redis.kill();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("worker.log");
    // Killed when the test ends, also when an assertion fails first.
    struct Reaped(std::process::Child);
    impl Drop for Reaped {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut worker = Reaped(
        std::process::Command::new(crate::helpers::sluice_bin())
            .args(["worker", "--demo-flows"])
            .args(app.redis.args())
            .env("RUST_LOG", "warn")
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    // Two retries logged: it is waiting, not failing.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(&log).unwrap();
        if text.matches("the worker waits for it").count() >= 2 {
            break;
        }
        assert!(
            worker.0.try_wait().unwrap().is_none(),
            "the worker gave up: {text}"
        );
        assert!(Instant::now() < deadline, "no retry logged: {text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ok = std::process::Command::new("kill")
        .args(["-TERM", &worker.0.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok);
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = worker.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "SIGTERM did not stop the waiting worker"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "{status}");
}

/// A tenant that fell out of its shard's runnable set while it had queued work (the set lost
/// or replaced by hand) would wait for ever: no start picks it and no doorbell rings for it.
/// The sweeper's walk of the tenant puts it back (and rings), and a listening worker runs the
/// work at once.
#[tokio::test]
async fn a_tenant_lost_from_the_runnable_set_is_put_back_by_the_sweeper() {
    let app = TestApp::spawn().await;
    let (tenant, _) = first_and_other(&app);
    let runnable = app.shard(&tenant).runnable();
    let queued = admit_echoes(&app, &tenant, 3).await;
    let _: () = app.redis.query(redis::cmd("DEL").arg(&runnable)).await;
    let _worker = TestWorker::spawn(&app.redis, &with(&["--concurrency", "2"]));
    // The worker looks once at start, finds nothing to start, and clears the doorbell.
    let bell = app.shard(&tenant).bell();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let rung: i64 = app.redis.query(redis::cmd("EXISTS").arg(&bell)).await;
        if rung == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the worker never looked at its shard"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for id in &queued {
        assert_eq!(app.execution(&tenant, id).await["status"], "queued");
    }
    let store = std::sync::Arc::new(app.store().await);
    sluice::sweeper::sweep_once(store, "test", Duration::from_millis(200))
        .await
        .expect("took the sweeper turn");
    assert_completed(&app, &tenant, &queued).await;
    assert_eq!(app.counter("reclaimed").await, 0);
}

/// Data sluice did not write (a row that is not a hash) is a fault of the data, not of Redis:
/// the answer is 500 `internal_error`, never a 503 that tells the client to retry, whether the
/// script that met it catches the error (admission, per item) or not (a read, a cancel).
#[tokio::test]
async fn a_key_of_the_wrong_type_answers_500_not_503() {
    let app = TestApp::spawn().await;
    let e = app.admit("acme", "demo.echo").await;
    let id = e["execution_id"].as_str().unwrap().to_owned();
    let row = crate::helpers::key_text(
        app.shard("acme")
            .row(&sluice::domain::ExecutionId::parse(&id).unwrap()),
    );
    break_key(&app, &row).await;
    let get = app.get_execution("acme", &id).await;
    let status = get.status();
    let body = get.json::<Value>().await.unwrap();
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    assert_eq!(body["code"], "internal_error");
    let cancel = app
        .as_tenant(
            reqwest::Method::POST,
            &format!("/api/executions/{id}/cancel"),
            "acme",
        )
        .send()
        .await
        .unwrap();
    assert_eq!(cancel.status(), StatusCode::INTERNAL_SERVER_ERROR);
    repair_key(&app, &row).await;
    assert_eq!(
        app.get_execution("acme", &id).await.status(),
        StatusCode::OK
    );
}
