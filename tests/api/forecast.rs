//! The admission forecast: every answer that shows a runnable execution says where it stands
//! (`queue_position`, a snapshot read in O(log n)) and, once its tenant's start rate was
//! measured, when it is expected to start (`estimated_start`); `POST /api/executions/dry-run`
//! answers what admission would do and writes nothing; a full queue's `Retry-After` comes from
//! the measured drain.

use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sluice::domain::ExecutionId;
use sluice::store::Outcome;

use crate::helpers::{FAST_WORKER, TestApp, TestWorker, problem_code};

/// Starts up to `count` executions of `tenant`'s shard by hand: (id, fence).
async fn start(app: &TestApp, tenant: &str, count: usize) -> Vec<(String, u64)> {
    app.started_by_hand(tenant, count).await
}

async fn admit(app: &TestApp, tenant: &str, body: Value) -> Value {
    let res = app.post_execution(tenant, &body).await;
    assert_eq!(res.status(), StatusCode::CREATED);
    res.json().await.unwrap()
}

async fn dry_run(app: &TestApp, tenant: &str, body: &Value, key: Option<&str>) -> Value {
    let mut req = app
        .as_tenant(Method::POST, "/api/executions/dry-run", tenant)
        .json(body);
    if let Some(k) = key {
        req = req.header("Idempotency-Key", k);
    }
    let res = req.send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    res.json().await.unwrap()
}

fn id_of(e: &Value) -> String {
    e["execution_id"].as_str().unwrap().to_owned()
}

/// Positions in the 201, in a GET and in the list count what starts before each execution, in
/// the tenant's order and in its key's; they move up as executions start; scheduled, running
/// and terminal executions have none.
#[tokio::test]
async fn queue_positions_count_what_starts_first() {
    let app = TestApp::spawn().await;
    app.put_tenant("acme", &json!({"max_concurrent": 10})).await;
    let mut plain = Vec::new();
    for i in 0..4 {
        let e = admit(
            &app,
            "acme",
            json!({"flow_id": "demo.echo", "params": {"i": i}}),
        )
        .await;
        assert_eq!(
            e["queue_position"],
            json!({"tenant": i, "key": null}),
            "{e}"
        );
        plain.push(id_of(&e));
    }
    // A priority-1 admission goes ahead of all four.
    let urgent = admit(&app, "acme", json!({"flow_id": "demo.echo", "priority": 1})).await;
    assert_eq!(urgent["queue_position"]["tenant"], 0);
    assert_eq!(
        app.execution("acme", &plain[3]).await["queue_position"],
        json!({"tenant": 4, "key": null})
    );
    // Keyed, limit 1: the key's first stands in the tenant's order, the others behind it.
    app.put_tenant("acme", &json!({"max_concurrent_per_key": 1}))
        .await;
    let mut keyed = Vec::new();
    for i in 0..3 {
        let e = admit(
            &app,
            "acme",
            json!({"flow_id": "demo.echo", "concurrency_key": "K", "params": {"i": i}}),
        )
        .await;
        assert_eq!(e["queue_position"]["key"], i, "{e}");
        keyed.push(id_of(&e));
    }
    assert_eq!(
        app.execution("acme", &keyed[0]).await["queue_position"],
        json!({"tenant": 5, "key": 0})
    );
    // The list shows the same.
    let page = app.page("acme", "status=queued&limit=200").await;
    assert!(page["executions"].is_array(), "{page}");
    for e in page["executions"].as_array().unwrap() {
        let id = id_of(e);
        let want = app.execution("acme", &id).await["queue_position"].clone();
        assert_eq!(e["queue_position"], want, "{id}");
    }
    // Three start (urgent, plain 0 and 1): everyone moves up by three.
    let started = start(&app, "acme", 3).await;
    assert_eq!(started.len(), 3);
    assert_eq!(
        app.execution("acme", &plain[3]).await["queue_position"],
        json!({"tenant": 1, "key": null})
    );
    assert_eq!(
        app.execution("acme", &keyed[2]).await["queue_position"]["key"],
        2
    );
    // Running: none.
    let running = app.execution("acme", &started[0].0).await;
    assert_eq!(running["status"], "running");
    assert_eq!(running["queue_position"], Value::Null);
    assert_eq!(running["estimated_start"], Value::Null);
    // Scheduled: none.
    let later = admit(&app, "acme", json!({"flow_id": "demo.echo", "delay": "1h"})).await;
    assert_eq!(later["queue_state"], "scheduled");
    assert_eq!(later["queue_position"], Value::Null);
    // Terminal: none.
    app.cancel("acme", &plain[3]).await;
    let gone = app.execution("acme", &plain[3]).await;
    assert_eq!(gone["status"], "cancelled");
    assert_eq!(gone["queue_position"], Value::Null);
    let store = app.store().await;
    let id = ExecutionId::parse(&started[0].0).unwrap();
    store
        .complete(
            app.shard("acme"),
            &id,
            started[0].1,
            "w",
            &Outcome::Completed(json!({})),
        )
        .await
        .unwrap();
    let done = app.execution("acme", &started[0].0).await;
    assert_eq!(done["status"], "completed");
    assert_eq!(done["queue_position"], Value::Null);
}

/// No start measured: no estimate. Once a worker has been starting the tenant's work, a
/// waiting execution gets p50 <= p90, in the future, later for a later position.
#[tokio::test]
async fn the_estimate_comes_from_the_measured_start_rate() {
    let app = TestApp::spawn().await;
    app.put_tenant("acme", &json!({"max_concurrent": 2, "max_queued": 1000}))
        .await;
    let first = admit(&app, "acme", json!({"flow_id": "demo.echo"})).await;
    assert_eq!(first["queue_position"]["tenant"], 0);
    assert_eq!(
        first["estimated_start"],
        Value::Null,
        "nothing measured yet"
    );
    let mut args = vec!["--concurrency", "2"];
    args.extend_from_slice(FAST_WORKER);
    let worker = TestWorker::spawn(&app.redis, &args);
    let mut ids = vec![id_of(&first)];
    for i in 0..20 {
        ids.push(id_of(
            &admit(
                &app,
                "acme",
                json!({"flow_id": "demo.sleep", "params": {"ms": 20, "i": i}}),
            )
            .await,
        ));
    }
    for id in &ids {
        app.wait_terminal("acme", id, Duration::from_secs(30)).await;
    }
    drop(worker);
    // The pace is cached for 2 s: wait until the server has read one with these starts.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let (near, far) = loop {
        let near = admit(&app, "acme", json!({"flow_id": "demo.echo"})).await;
        if !near["estimated_start"].is_null() {
            let mut far = near.clone();
            for _ in 0..10 {
                far = admit(&app, "acme", json!({"flow_id": "demo.echo"})).await;
            }
            break (near, far);
        }
        assert!(std::time::Instant::now() < deadline, "no estimate: {near}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let ms = |e: &Value, q: &str| {
        let t = time::OffsetDateTime::parse(
            e["estimated_start"][q].as_str().unwrap(),
            &time::format_description::well_known::Rfc3339,
        )
        .unwrap();
        (t.unix_timestamp_nanos() / 1_000_000) as i64
    };
    let created = |e: &Value| {
        let t = time::OffsetDateTime::parse(
            e["created_at"].as_str().unwrap(),
            &time::format_description::well_known::Rfc3339,
        )
        .unwrap();
        (t.unix_timestamp_nanos() / 1_000_000) as i64
    };
    for e in [&near, &far] {
        assert!(ms(e, "p50") <= ms(e, "p90"), "{e}");
        assert!(ms(e, "p50") >= created(e) - 1_000, "{e}");
    }
    assert!(far["queue_position"]["tenant"].as_u64() > near["queue_position"]["tenant"].as_u64());
    assert!(ms(&far, "p50") > ms(&near, "p50"), "{near} {far}");
    // The GET of a waiting execution carries one too.
    let got = app.execution("acme", &id_of(&far)).await;
    assert!(!got["estimated_start"].is_null(), "{got}");
}

/// `POST /api/executions/dry-run` answers each decision admission would make — and Redis is
/// byte for byte the same afterwards, every time.
#[tokio::test]
async fn a_dry_run_answers_what_admission_would_do_and_writes_nothing() {
    let app = TestApp::spawn().await;
    app.put_tenant(
        "acme",
        &json!({"max_concurrent": 1, "max_queued": 4, "max_concurrent_per_key": 1}),
    )
    .await;
    let echo = json!({"flow_id": "demo.echo"});
    let checked = |body: Value, key: Option<&'static str>| {
        let app = &app;
        async move {
            let before = app.redis.dump().await;
            let answer = dry_run(app, "acme", &body, key).await;
            assert_eq!(app.redis.dump().await, before, "a dry run wrote: {answer}");
            answer
        }
    };
    // Empty tenant: it would be ready, first.
    let a = checked(echo.clone(), None).await;
    assert_eq!(a["decision"], "admit", "{a}");
    assert_eq!(a["reason"], "ready");
    assert_eq!(a["queue_position"], json!({"tenant": 0, "key": null}));
    // No execution to name: the field is absent, never a null a client could follow.
    assert!(a.get("execution_id").is_none(), "{a}");
    // One admitted: the next would wait behind max_concurrent 1, second.
    let held = admit(
        &app,
        "acme",
        json!({"flow_id": "demo.echo", "dedup_key": "d-1"}),
    )
    .await;
    let w = checked(echo.clone(), None).await;
    assert_eq!(
        (w["decision"].as_str(), w["reason"].as_str()),
        (Some("wait"), Some("tenant_at_max_concurrent"))
    );
    assert_eq!(w["queue_position"]["tenant"], 1);
    // Keyed behind a running execution of its key: waits for its key.
    start(&app, "acme", 1).await;
    admit(
        &app,
        "acme",
        json!({"flow_id": "demo.echo", "concurrency_key": "K"}),
    )
    .await;
    let _ = held;
    let k = checked(
        json!({"flow_id": "demo.echo", "concurrency_key": "K"}),
        None,
    )
    .await;
    assert_eq!(k["decision"], "wait", "{k}");
    assert_eq!(k["queue_position"]["key"], 1);
    app.put_tenant("acme", &json!({"max_concurrent": 10})).await;
    let running_k = start(&app, "acme", 1).await;
    assert_eq!(running_k.len(), 1);
    let k = checked(
        json!({"flow_id": "demo.echo", "concurrency_key": "K"}),
        None,
    )
    .await;
    assert_eq!(
        (k["decision"].as_str(), k["reason"].as_str()),
        (Some("wait"), Some("key_at_limit")),
        "{k}"
    );
    let other_key = checked(
        json!({"flow_id": "demo.echo", "concurrency_key": "L"}),
        None,
    )
    .await;
    assert_eq!(other_key["decision"], "admit", "{other_key}");
    // Scheduled.
    let s = checked(json!({"flow_id": "demo.echo", "delay": "1h"}), None).await;
    assert_eq!(s["decision"], "schedule");
    assert!(s["run_at"].is_string(), "{s}");
    // Dedup: the same request is a duplicate naming the execution; another is a conflict.
    let d = checked(json!({"flow_id": "demo.echo", "dedup_key": "d-1"}), None).await;
    assert_eq!(d["decision"], "duplicate", "{d}");
    assert_eq!(d["execution_id"], held["execution_id"]);
    let c = checked(json!({"flow_id": "demo.other"}), Some("d-1")).await;
    assert_eq!(c["decision"], "conflict", "{c}");
    assert_eq!(c["execution_id"], held["execution_id"]);
    // Full (max_queued 4: fill it up), then disabled.
    let usage = app.usage("acme").await;
    let queued = usage["waiting"].as_u64().unwrap() + usage["scheduled"].as_u64().unwrap();
    for _ in queued..4 {
        admit(&app, "acme", echo.clone()).await;
    }
    let f = checked(echo.clone(), None).await;
    assert_eq!(
        (f["decision"].as_str(), f["reason"].as_str()),
        (Some("refuse"), Some("tenant_queue_full")),
        "{f}"
    );
    assert!(
        f["retry_after"]
            .as_u64()
            .is_some_and(|s| (1..=3600).contains(&s))
    );
    let res = app.post_execution("acme", &echo).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry_after: u64 = res.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=3600).contains(&retry_after));
    app.put_tenant("acme", &json!({"enabled": false})).await;
    let off = checked(echo.clone(), None).await;
    assert_eq!(
        (off["decision"].as_str(), off["reason"].as_str()),
        (Some("refuse"), Some("tenant_disabled"))
    );
    // Validation as for an admission.
    let res = app
        .as_tenant(Method::POST, "/api/executions/dry-run", "acme")
        .json(&json!({"flow_id": "bad id"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
}

/// The dry run moved to its own operation, so an admission's 200 is only ever an `Execution`:
/// the old form `POST /api/executions?dry_run=true` is refused, naming the new path, and
/// admits nothing; `dry_run=false` is an ordinary admission; a `dry_run` that is not a
/// boolean is refused as any bad query is.
#[tokio::test]
async fn the_old_dry_run_query_is_refused_naming_the_new_operation() {
    let app = TestApp::spawn().await;
    let echo = json!({"flow_id": "demo.echo"});
    let res = app
        .as_tenant(Method::POST, "/api/executions?dry_run=true", "acme")
        .json(&echo)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    let problem: Value = res.json().await.unwrap();
    assert_eq!(problem["code"], "dry_run_moved");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("POST /api/executions/dry-run"),
        "{problem}"
    );
    assert_eq!(app.page("acme", "").await["total"], 0);
    let res = app
        .as_tenant(Method::POST, "/api/executions?dry_run=false", "acme")
        .json(&echo)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    let res = app
        .as_tenant(Method::POST, "/api/executions?dry_run=maybe", "acme")
        .json(&echo)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert_eq!(problem_code(res).await, "invalid_query");
    assert_eq!(app.page("acme", "").await["total"], 1);
}

/// Unix ms of an RFC 3339 time in an answer.
fn unix_ms(text: &Value) -> i64 {
    let t = time::OffsetDateTime::parse(
        text.as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap();
    (t.unix_timestamp_nanos() / 1_000_000) as i64
}

/// A tenant that just became busy is forecast from how fast it has drained since its first
/// start, not from that rate spread over the minute in which the first start came (which made
/// `Retry-After` and the estimates several times too late). 10 s after a worker began
/// draining it at a steady pace (`demo.sleep` of 2 s, one at a time), with the burst begun at
/// least 15 s into a minute, the 429 of its full queue says `Retry-After` within ±50 % of the
/// time per start measured here, and its last queued execution's expected start (p50) is
/// within ±50 % of its place in the queue times that.
#[tokio::test]
async fn a_tenant_that_just_became_busy_is_forecast_from_its_real_drain() {
    const SLEEP_MS: u64 = 2_000;
    let app = TestApp::spawn().await;
    app.put_tenant("acme", &json!({"max_concurrent": 1, "max_queued": 12}))
        .await;
    let mut args = vec!["--concurrency", "1"];
    args.extend_from_slice(FAST_WORKER);
    let _worker = TestWorker::spawn(&app.redis, &args);
    // The worker is up (another tenant's run went through) before the burst begins.
    let warm = admit(&app, "warm", json!({"flow_id": "demo.echo"})).await;
    app.wait_terminal("warm", &id_of(&warm), Duration::from_secs(30))
        .await;
    // A burst that begins early in a minute was measured nearly right before; one that begins
    // later in it was not: start at least 15 s into a minute.
    let deadline = Instant::now() + Duration::from_secs(20);
    while time::OffsetDateTime::now_utc().second() < 15 {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let sleep = json!({"flow_id": "demo.sleep", "params": {"ms": SLEEP_MS}});
    let fill = || async {
        let mut admitted = Vec::new();
        for _ in 0..40 {
            let res = app.post_execution("acme", &sleep).await;
            if res.status() == StatusCode::TOO_MANY_REQUESTS {
                let retry_after: u64 = res.headers()["retry-after"]
                    .to_str()
                    .unwrap()
                    .parse()
                    .unwrap();
                return (admitted, retry_after);
            }
            assert_eq!(res.status(), StatusCode::CREATED);
            admitted.push(id_of(&res.json::<Value>().await.unwrap()));
        }
        panic!("the queue never filled");
    };
    let (mut ids, _) = fill().await;
    let first = app
        .wait_for("acme", &ids[0], Duration::from_secs(15), "started", |e| {
            !e["started_at"].is_null()
        })
        .await;
    let first_start = unix_ms(&first["started_at"]);
    // 10 s into the burst.
    let now_ms = || (time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as i64;
    while now_ms() < first_start + 10_000 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The drain measured here: the time per start over the starts so far.
    let mut starts = Vec::new();
    for id in &ids {
        let e = app.execution("acme", id).await;
        if !e["started_at"].is_null() {
            starts.push(unix_ms(&e["started_at"]));
        }
    }
    starts.sort_unstable();
    assert!(starts.len() >= 3, "{starts:?}");
    let per_start_ms = (starts[starts.len() - 1] - starts[0]) as f64 / (starts.len() - 1) as f64;
    // The queue is full again: its 429 and its last execution's estimate.
    let (more, retry_after) = fill().await;
    ids.extend(more);
    let last = app.execution("acme", ids.last().unwrap()).await;
    let ahead = last["queue_position"]["tenant"].as_u64().unwrap();
    let p50_in = unix_ms(&last["estimated_start"]["p50"]) - now_ms();
    // It starts after those ahead of it and after the run going on: about ahead + 1 starts.
    let real_ms = (ahead + 1) as f64 * per_start_ms;
    println!(
        "{} starts in the first 10 s, {per_start_ms:.0} ms per start; Retry-After \
         {retry_after} s; the last queued ({ahead} ahead) expected in {p50_in} ms, about \
         {real_ms:.0} ms by the measured drain",
        starts.len()
    );
    let within = |got: f64, want: f64| (0.5 * want..=1.5 * want).contains(&got);
    assert!(
        within(retry_after as f64 * 1_000.0, per_start_ms),
        "Retry-After {retry_after} s for {per_start_ms:.0} ms per start"
    );
    assert!(
        within(p50_in as f64, real_ms),
        "expected in {p50_in} ms, the drain says {real_ms:.0} ms"
    );
}
