//! Redis trouble: a stopped Redis answers 503 + Retry-After quickly (no hang), a Redis that
//! comes back is used again without restarting sluice, flushed scripts reload themselves, and
//! an admission whose answer was lost is settled: a 503 `redis_unavailable` means nothing was
//! admitted, also when the stalled script would have run later.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{ProxiedConnection, TestApp, TestProxy, problem_code};

/// Retries `POST` until it answers 201, for at most `limit` (Redis coming back up).
async fn admit_when_back(app: &TestApp, limit: Duration) -> Value {
    let deadline = Instant::now() + limit;
    loop {
        let res = app
            .post_execution("acme", &json!({"flow_id": "demo.echo"}))
            .await;
        if res.status() == StatusCode::CREATED {
            return res.json().await.unwrap();
        }
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            Instant::now() < deadline,
            "sluice did not recover within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_stopped_redis_is_503_and_a_restarted_one_is_used_again() {
    let mut app = TestApp::spawn_with(|c| {
        c.redis.redis_timeout_ms = 500;
        c.api.request_timeout_ms = 3_000;
    })
    .await;
    let before = app.admit("acme", "demo.echo").await;
    let id = before["execution_id"].as_str().unwrap().to_owned();

    app.redis.kill();
    // An admission may find an old connection half dead: whether its script was sent cannot
    // be told, and the answer says so, naming the id it would have had. (On a cluster the
    // client learns a node is gone more slowly, so this can happen more than once.)
    let mut unknown = Vec::new();
    for _ in 0..2 {
        let res = app
            .post_execution("acme", &json!({"flow_id": "demo.echo"}))
            .await;
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(res.headers().contains_key("retry-after"));
        let problem: Value = res.json().await.unwrap();
        match problem["code"].as_str().unwrap() {
            "redis_unavailable" => {}
            "admission_outcome_unknown" => {
                unknown.push(problem["execution_id"].as_str().unwrap().to_owned())
            }
            other => panic!("unexpected code {other}"),
        }
    }
    if !app.redis.is_cluster() {
        // One server: once the connection is known dead, Redis refuses at connect, and a
        // refused call is known not to have run.
        assert!(unknown.len() <= 1, "{unknown:?}");
    }
    for res in [
        app.get_execution("acme", &id).await,
        app.list("acme", "").await,
        app.cancel("acme", &id).await,
        app.client.get(app.url("/readyz")).send().await.unwrap(),
    ] {
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(res.headers().contains_key("retry-after"));
        assert_eq!(problem_code(res).await, "redis_unavailable");
    }
    // Liveness does not depend on Redis.
    let res = app.client.get(app.url("/healthz")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);

    app.redis.restart().await;
    admit_when_back(&app, Duration::from_secs(15)).await;
    // The AOF brought the earlier execution back, and it is served again (each of the
    // server's connections may first have to notice that its old socket died: a 503).
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut res = app.get_execution("acme", &id).await;
    while res.status() == StatusCode::SERVICE_UNAVAILABLE && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        res = app.get_execution("acme", &id).await;
    }
    let got: Value = res.json().await.unwrap();
    assert_eq!(got["execution_id"], before["execution_id"], "{got}");
    // Redis was dead before those admissions were sent: they cannot have happened.
    for unknown in unknown {
        let res = app.get_execution("acme", &unknown).await;
        assert_eq!(res.status(), StatusCode::NOT_FOUND);
    }
    let res = app.client.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_redis_that_does_not_answer_is_503_within_the_timeout() {
    let app = TestApp::spawn_with(|c| {
        c.redis.redis_timeout_ms = 300;
        c.api.request_timeout_ms = 2_000;
    })
    .await;
    app.admit("acme", "demo.echo").await;
    // Freeze the server (it keeps the socket open but answers nothing) for longer than the
    // request timeout; sluice must answer before that.
    app.redis.pause(4_000, "ALL").await;
    let res = app
        .post_execution("acme", &json!({"flow_id": "demo.echo"}))
        .await;
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(res.headers().contains_key("retry-after"));
    let problem: Value = res.json().await.unwrap();
    // The script was sent and waits in the paused server, and so does the call that would
    // settle it: the outcome is unknown, and the answer names the id to look up.
    assert_eq!(problem["code"], "admission_outcome_unknown", "{problem}");
    let named = problem["execution_id"].as_str().unwrap().to_owned();
    // After the pause, service resumes on its own, and the named execution is settled one
    // way or the other: admitted in full (row and queue entry), or not at all.
    admit_when_back(&app, Duration::from_secs(15)).await;
    let res = app.get_execution("acme", &named).await;
    match res.status() {
        StatusCode::OK => {
            let e: Value = res.json().await.unwrap();
            assert_eq!(e["queue_state"], "ready");
            assert!(
                app.queue_ids("acme").await.contains(&named),
                "admitted without its queue entry"
            );
        }
        StatusCode::NOT_FOUND => {}
        other => panic!("looking up the named execution answered {other}"),
    }
}

/// A stalled admission: the admission script was stalled in Redis past the time-out, the client
/// was told 503 `redis_unavailable`, and the script ran when Redis resumed. Now the lost answer
/// is settled before answering: 201 if the admission happened, else a void marker makes the
/// late script refuse, so the 503 stays true.
#[tokio::test]
async fn a_503_never_admits_when_the_stalled_script_runs_later() {
    let app = TestApp::spawn_with(|c| {
        c.redis.redis_timeout_ms = 300;
        c.api.request_timeout_ms = 3_000;
    })
    .await;
    let mut stalled = 0;
    for round in 0..6u64 {
        // Writes (scripts included) wait while reads go on; the pause outlasts one call's
        // time-out but, in some rounds, not the settling call's.
        let pause_ms = 350 + 100 * (round % 3);
        app.redis.pause(pause_ms, "WRITE").await;
        let nonce = format!("round-{round}");
        let sent = Instant::now();
        let res = app
            .post_execution(
                "acme",
                &json!({"flow_id": "demo.echo", "params": {"nonce": nonce}}),
            )
            .await;
        let status = res.status();
        let body: Value = res.json().await.unwrap();
        stalled += usize::from(sent.elapsed() >= Duration::from_millis(300));
        // Wait until writes go through again, so any late script has run.
        admit_when_back(&app, Duration::from_secs(15)).await;
        let page = app.page("acme", "limit=200").await;
        let with_nonce: Vec<&Value> = page["executions"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["params"]["nonce"] == nonce.as_str())
            .collect();
        match (status, body["code"].as_str()) {
            (StatusCode::CREATED, _) => {
                assert_eq!(with_nonce.len(), 1, "201 but not admitted: {body}");
                assert_eq!(with_nonce[0]["execution_id"], body["execution_id"]);
            }
            (StatusCode::SERVICE_UNAVAILABLE, Some("redis_unavailable")) => {
                assert!(
                    with_nonce.is_empty(),
                    "answered 503 redis_unavailable, yet admitted: {with_nonce:?}"
                );
            }
            (StatusCode::SERVICE_UNAVAILABLE, Some("admission_outcome_unknown")) => {
                assert!(with_nonce.len() <= 1);
                if let Some(e) = with_nonce.first() {
                    assert_eq!(e["execution_id"], body["execution_id"]);
                }
            }
            other => panic!("unexpected answer {other:?}: {body}"),
        }
    }
    // The scenario happened: calls that outlived their time-out in a stalled Redis.
    assert!(stalled > 0, "no admission was stalled past its time-out");
}

#[tokio::test]
async fn admission_survives_function_flush() {
    let app = TestApp::spawn().await;
    app.admit("acme", "demo.echo").await;
    let _: () = app.redis.query(redis::cmd("FUNCTION").arg("FLUSH")).await;
    let e = app.admit("acme", "demo.echo").await;
    let id = e["execution_id"].as_str().unwrap();
    assert_eq!(app.cancel("acme", id).await.status(), StatusCode::OK);
    let _: () = app.redis.query(redis::cmd("FUNCTION").arg("FLUSH")).await;
    let res = app.client.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let page = app.page("acme", "").await;
    assert_eq!(page["total"], 2);
}

/// A TCP proxy in front of Redis that can hold what clients send and then deliver it with the
/// connections in reverse order (each connection's own bytes stay in order): a network that
/// delays one connection more than another. It lets a test make a later call on one
/// connection reach Redis before an earlier call on another.
struct ReorderingProxy {
    proxy: TestProxy,
    state: std::sync::Arc<std::sync::Mutex<ProxyState>>,
}

#[derive(Default)]
struct ProxyState {
    holding: bool,
    /// Held chunks, in arrival order: (connection number, bytes).
    held: Vec<(usize, Vec<u8>)>,
    /// Where each connection's bytes go.
    upstream: Vec<Option<tokio::sync::mpsc::UnboundedSender<Vec<u8>>>>,
}

impl ReorderingProxy {
    async fn start(redis_port: u16) -> Self {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let state = std::sync::Arc::new(std::sync::Mutex::new(ProxyState::default()));
        let shared = state.clone();
        let proxy = TestProxy::start(redis_port, move |conn| {
            let ProxiedConnection {
                mut client_r,
                mut client_w,
                mut server_r,
                mut server_w,
            } = conn;
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
            let n = {
                let mut s = shared.lock().unwrap();
                s.upstream.push(Some(tx));
                s.upstream.len() - 1
            };
            tokio::spawn(async move {
                while let Some(bytes) = rx.recv().await {
                    if server_w.write_all(&bytes).await.is_err() {
                        return;
                    }
                }
            });
            let state = shared.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(k) = client_r.read(&mut buf).await {
                    if k == 0 {
                        return;
                    }
                    let mut s = state.lock().unwrap();
                    if s.holding {
                        s.held.push((n, buf[..k].to_vec()));
                    } else if let Some(tx) = &s.upstream[n] {
                        let _ = tx.send(buf[..k].to_vec());
                    }
                }
            });
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut server_r, &mut client_w).await;
            });
        })
        .await;
        Self { proxy, state }
    }

    fn url(&self) -> String {
        self.proxy.url()
    }

    fn hold(&self) {
        self.state.lock().unwrap().holding = true;
    }

    /// How many connections have bytes held.
    fn held_connections(&self) -> usize {
        let s = self.state.lock().unwrap();
        s.held
            .iter()
            .map(|(n, _)| *n)
            .collect::<BTreeSet<_>>()
            .len()
    }

    /// Delivers what was held, the connection that sent last first, and stops holding.
    fn release_reversed(&self) {
        let mut s = self.state.lock().unwrap();
        let held = std::mem::take(&mut s.held);
        let mut order: Vec<usize> = Vec::new();
        for (n, _) in held.iter().rev() {
            if !order.contains(n) {
                order.push(*n);
            }
        }
        for n in order {
            if let Some(tx) = &s.upstream[n] {
                for (m, bytes) in &held {
                    if *m == n {
                        let _ = tx.send(bytes.clone());
                    }
                }
            }
        }
        s.holding = false;
    }
}

/// The settling call overtakes the admission it settles (it went over another connection, and
/// the network delivered that one first): the void marker it leaves makes the late admission
/// refuse, so the 503 `redis_unavailable` the client got stays true.
#[tokio::test]
async fn a_late_admission_after_its_settling_call_admits_nothing() {
    let redis = crate::helpers::TestRedis::start_standalone().await;
    let proxy = ReorderingProxy::start(redis.port).await;
    let app = TestApp::spawn_on(redis, |c| {
        c.redis.redis_url = proxy.url();
        c.redis.redis_timeout_ms = 400;
        c.api.request_timeout_ms = 3_000;
        // Only the admission and its settling call may pass the proxy while it holds: the
        // webhook deliverer's start-up scan would be held with them.
        c.api.webhook_delivery = false;
    })
    .await;
    app.admit("acme", "demo.echo").await;
    let mut voided = 0;
    for round in 0..4 {
        proxy.hold();
        let nonce = format!("round-{round}");
        let post = {
            let (client, url) = (app.client.clone(), app.url("/api/executions"));
            let nonce = nonce.clone();
            tokio::spawn(async move {
                client
                    .post(url)
                    .bearer_auth(crate::helpers::ADMIN_TOKEN)
                    .header("X-Tenant-Id", "acme")
                    .json(&json!({"flow_id": "demo.echo", "params": {"nonce": nonce}}))
                    .send()
                    .await
                    .unwrap()
            })
        };
        // Wait for the admission and its settling call to be held on two connections.
        let deadline = Instant::now() + Duration::from_secs(5);
        while proxy.held_connections() < 2 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        proxy.release_reversed();
        let res = post.await.unwrap();
        let status = res.status();
        let body: Value = res.json().await.unwrap();
        let page = app.page("acme", "limit=200").await;
        let with_nonce = page["executions"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["params"]["nonce"] == nonce.as_str())
            .count();
        match (status, body["code"].as_str()) {
            (StatusCode::CREATED, _) => assert_eq!(with_nonce, 1),
            (StatusCode::SERVICE_UNAVAILABLE, Some("redis_unavailable")) => {
                assert_eq!(with_nonce, 0, "503 redis_unavailable, yet admitted");
                voided += 1;
            }
            other => panic!("unexpected answer {other:?}: {body}"),
        }
    }
    assert!(voided > 0, "the settling call never overtook the admission");
}

/// WAIT calls the master has answered since the last `reset_stats`.
async fn wait_calls(redis: &crate::helpers::TestRedis) -> u64 {
    redis
        .command_calls()
        .await
        .into_iter()
        .find(|(c, _)| c == "wait")
        .map_or(0, |(_, n)| n)
}

/// `sluice_redis_unconfirmed_answers_total` from the app's `/metrics`.
async fn unconfirmed_answers(app: &TestApp) -> f64 {
    crate::operability::sample(
        &app.metrics().await,
        "sluice_redis_unconfirmed_answers_total",
    )
    .expect("the unconfirmed answers' counter")
}

/// `--redis-replica-acks 1` and a frozen replica (SIGSTOP): the master's `INFO` lists it as
/// `online` for up to its `repl-timeout` (60 s) although it acknowledges nothing. Counting
/// such a replica re-enabled WAIT every 500 ms, each WAIT blocked the shared connection for its
/// whole time-out, and admissions fell to a sixth. A replica counts only while it acknowledged
/// within the last second: over 8 s of admissions with the replica frozen (and known to be
/// silent), WAIT is sent once, to find it short (before: three to eight times), and `/metrics`
/// counts every answer given without the replica; once the replica runs again, every write
/// waits for it again.
#[tokio::test]
async fn a_frozen_replica_does_not_block_the_connection_every_probe() {
    let master = crate::helpers::TestRedis::start_standalone().await;
    let replica = crate::helpers::TestRedis::start_standalone().await;
    let mut c = replica.node_conn(0).await;
    let () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(master.port)
        .query_async(&mut c)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !master.info("replication").await.contains("state=online") {
        assert!(Instant::now() < deadline, "the replica did not sync");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let app = TestApp::spawn_on(master, |c| c.redis.redis_replica_acks = 1).await;
    app.admit("acme", "demo.echo").await;
    assert!(
        wait_calls(&app.redis).await > 0,
        "admissions wait for the replica"
    );
    assert_eq!(
        unconfirmed_answers(&app).await,
        0.0,
        "answers the replica acknowledged are confirmed"
    );

    replica.signal("STOP");
    // Until the master has not heard from it for two seconds, a frozen replica cannot be told
    // from a live one; from then on it is still `online` in the master's INFO.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let info = app.redis.info("replication").await;
        let lag = info
            .lines()
            .find(|l| l.starts_with("slave0:"))
            .and_then(|l| l.rsplit_once("lag=")?.1.trim().parse::<u64>().ok());
        assert!(info.contains("state=online"), "{info}");
        if lag.is_some_and(|lag| lag >= 2) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the replica's lag did not grow: {info}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A probe of the app's that read the lag just before it reached 2 saw a live replica and
    // let WAIT resume: calls that went past it then (the app's sweeper and scans too) may still
    // be blocked in WAIT. From here on every probe sees the lag, so once those end, WAIT is off
    // for good; only then does the count start.
    let mut c = app.redis.node_conn(0).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let clients: String = redis::cmd("CLIENT")
            .arg("LIST")
            .query_async(&mut c)
            .await
            .unwrap();
        let blocked_in_wait = clients
            .lines()
            .filter(|l| l.contains(" cmd=wait ") && l.contains(" flags=b "))
            .count();
        if blocked_in_wait == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{blocked_in_wait} calls still blocked in WAIT: {clients}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    app.redis.reset_stats().await;
    let until = Instant::now() + Duration::from_secs(8);
    let mut admitted = 0;
    while Instant::now() < until && admitted < 100_000 {
        app.admit("acme", "demo.echo").await;
        admitted += 1;
    }
    // One WAIT finds it short; no probe brings WAIT back while it stays frozen.
    let waits = wait_calls(&app.redis).await;
    assert!(
        waits <= 1,
        "{waits} WAITs in 8 s for a replica that acknowledges nothing ({admitted} admissions)"
    );
    // Each of those answers was given without the replica, and `/metrics` says so.
    let unconfirmed = unconfirmed_answers(&app).await;
    assert!(
        unconfirmed >= f64::from(admitted),
        "{unconfirmed} answers counted unconfirmed of {admitted} admitted without the replica"
    );

    replica.signal("CONT");
    // Back: within the relapse back-off (at most 8 s), every admission waits for it again.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let before = wait_calls(&app.redis).await;
        for _ in 0..5 {
            app.admit("acme", "demo.echo").await;
        }
        if wait_calls(&app.redis).await - before >= 5 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "WAIT did not resume once the replica ran again"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Many clients admit while Redis stalls again and again, longer than a call's time-out and
/// than the request's bound: admissions queue behind a stalled call of their shard, calls lose
/// their answers, requests run out of time. Whatever each client was told is true of what Redis
/// holds once the stalls are over: 201 names the one execution with its nonce; 503
/// `request_timeout` and `redis_unavailable` mean none has it (an admission still waiting for its
/// call when its request ran out of time was never sent); `admission_outcome_unknown` names the
/// one it may have. Before admissions carried their request's deadline, most 503
/// `request_timeout` answers had an execution behind them.
#[tokio::test]
async fn every_answer_under_repeated_stalls_says_what_was_admitted() {
    let app = TestApp::spawn_with(|c| {
        c.redis.redis_timeout_ms = 300;
        c.api.request_timeout_ms = 1_000;
        // Small groups: 48 clients make a queue several calls deep behind a stalled call,
        // as a few hundred clients would with the default group of 64.
        c.redis.redis_admission_group = 4;
        // Only the admissions (and their settling) reach Redis during the stalls.
        c.api.webhook_delivery = false;
    })
    .await;
    app.admit("acme", "demo.echo").await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = (0..48)
        .map(|c| {
            let (client, url) = (app.client.clone(), app.url("/api/executions"));
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut answers = Vec::new();
                for n in 0..400 {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    let nonce = format!("{c}-{n}");
                    let res = client
                        .post(&url)
                        .bearer_auth(crate::helpers::ADMIN_TOKEN)
                        .header("X-Tenant-Id", "acme")
                        .json(&json!({"flow_id": "demo.echo", "params": {"nonce": nonce}}))
                        .send()
                        .await
                        .unwrap();
                    let status = res.status();
                    let body: Value = res.json().await.unwrap();
                    answers.push((nonce, status, body));
                }
                answers
            })
        })
        .collect();
    // Stalls of 0.3–1.5 s, with a little air between them.
    for (i, ms) in [300u64, 1_500, 700, 1_100, 450, 1_300, 900]
        .iter()
        .enumerate()
    {
        tokio::time::sleep(Duration::from_millis(150 + 50 * i as u64)).await;
        app.redis.pause(*ms, "WRITE").await;
        tokio::time::sleep(Duration::from_millis(*ms)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut answers = Vec::new();
    for c in clients {
        answers.extend(c.await.unwrap());
    }
    // Writes go through again: every call sent during a stall has run by now.
    admit_when_back(&app, Duration::from_secs(15)).await;
    let found = app.admitted_by_nonce("acme").await;
    let mut count = std::collections::BTreeMap::<String, usize>::new();
    let mut untrue = Vec::new();
    for (nonce, status, body) in &answers {
        let here = found.get(nonce).map(Vec::as_slice).unwrap_or_default();
        let code = body["code"].as_str().unwrap_or("");
        *count
            .entry(format!("{} {code}", status.as_u16()))
            .or_default() += 1;
        let true_ = match (*status, code) {
            (StatusCode::CREATED, _) => here == [body["execution_id"].as_str().unwrap()],
            (StatusCode::SERVICE_UNAVAILABLE, "redis_unavailable" | "request_timeout") => {
                here.is_empty()
            }
            (StatusCode::SERVICE_UNAVAILABLE, "admission_outcome_unknown") => {
                here.is_empty() || here == [body["execution_id"].as_str().unwrap()]
            }
            other => panic!("{nonce}: unexpected answer {other:?}: {body}"),
        };
        if !true_ {
            untrue.push(format!(
                "{nonce}: {} {code}, on Redis {here:?}",
                status.as_u16()
            ));
        }
    }
    eprintln!("answers: {count:?}");
    assert!(
        untrue.is_empty(),
        "{} of {} answers untrue, e.g. {:?}",
        untrue.len(),
        answers.len(),
        &untrue[..untrue.len().min(5)]
    );
    // The scenario happened: requests ran into the stalls.
    let troubled: usize = count
        .iter()
        .filter(|(k, _)| k.starts_with("503"))
        .map(|(_, n)| n)
        .sum();
    assert!(troubled >= 10, "too few answers met a stall: {count:?}");
}
