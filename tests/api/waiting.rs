//! Waiting for an execution without polling: `GET /api/executions/{id}?wait=...` answers when
//! the execution is terminal (or at the end of the wait), `GET .../events` streams its changes
//! as Server-Sent Events; both are served by one Pub/Sub listener per server, so many clients
//! waiting cost Redis nothing per client, and both still end with the right answer when that
//! listener's connection or Redis itself goes away.
//!
//! Long on purpose: a list of independent tests of the two ways to wait (long poll and event
//! stream) and of the one listener that serves both; they share its set-up and its failure
//! cases.

use std::time::{Duration, Instant};

use reqwest::{Response, StatusCode};
use serde_json::{Value, json};
use sluice::Application;
use sluice::domain::ExecutionId;

use crate::helpers::{ADMIN_TOKEN, FAST_WORKER, METRICS_TOKEN, TestApp, TestWorker, problem_code};

/// One thing read off an event stream.
#[derive(Debug)]
enum Sse {
    Event {
        name: String,
        data: Value,
    },
    /// A comment line (a heartbeat).
    Comment,
}

/// A client's view of `GET /api/executions/{id}/events`.
struct EventStream {
    res: Response,
    buf: String,
}

impl EventStream {
    /// Opens the stream (asserting 200 and the content type).
    async fn open(app: &TestApp, tenant: &str, id: &str) -> Self {
        let res = events(app, tenant, id).await;
        assert_eq!(res.status(), StatusCode::OK);
        let ct = res.headers()["content-type"].to_str().unwrap().to_owned();
        assert!(ct.starts_with("text/event-stream"), "{ct}");
        Self {
            res,
            buf: String::new(),
        }
    }

    /// The next event or comment; `None` when the server ended the stream. Fails after
    /// `limit`.
    async fn next(&mut self, limit: Duration) -> Option<Sse> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let (mut name, mut data) = (String::new(), String::new());
                let mut comment = false;
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("event:") {
                        name = v.trim().to_owned();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.trim_start());
                    } else if line.starts_with(':') {
                        comment = true;
                    }
                }
                if name.is_empty() && data.is_empty() && comment {
                    return Some(Sse::Comment);
                }
                return Some(Sse::Event {
                    name,
                    data: serde_json::from_str(&data).expect("event data is JSON"),
                });
            }
            let chunk = tokio::time::timeout_at(deadline, self.res.chunk())
                .await
                .unwrap_or_else(|_| panic!("nothing on the stream within {limit:?}"))
                .expect("the stream reads cleanly");
            match chunk {
                Some(bytes) => self.buf.push_str(std::str::from_utf8(&bytes).unwrap()),
                None => {
                    assert!(self.buf.trim().is_empty(), "stream ended mid-event");
                    return None;
                }
            }
        }
    }

    /// The next event (skipping heartbeats): its name and data; `None` at the end.
    async fn next_event(&mut self, limit: Duration) -> Option<(String, Value)> {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.next(left.max(Duration::from_millis(1))).await? {
                Sse::Comment => continue,
                Sse::Event { name, data } => return Some((name, data)),
            }
        }
    }

    /// Reads events until the stream ends; the statuses of the `execution` events (and
    /// `deleted` for a deleted event).
    async fn rest(&mut self, limit: Duration) -> Vec<String> {
        let deadline = Instant::now() + limit;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.next_event(left.max(Duration::from_millis(1))).await {
                None => return seen,
                Some((name, data)) if name == "execution" => {
                    seen.push(data["status"].as_str().unwrap().to_owned())
                }
                Some((name, _)) => seen.push(name),
            }
        }
    }
}

async fn events(app: &TestApp, tenant: &str, id: &str) -> Response {
    app.as_tenant(
        reqwest::Method::GET,
        &format!("/api/executions/{id}/events"),
        tenant,
    )
    .send()
    .await
    .unwrap()
}

/// `GET /api/executions/{id}?wait=<wait>`.
async fn wait_get(app: &TestApp, tenant: &str, id: &str, wait: &str) -> Response {
    app.as_tenant(
        reqwest::Method::GET,
        &format!("/api/executions/{id}?wait={wait}"),
        tenant,
    )
    .send()
    .await
    .unwrap()
}

/// The `Sluice-Wait` header of a long poll's answer.
fn wait_outcome(res: &Response) -> String {
    res.headers()["sluice-wait"].to_str().unwrap().to_owned()
}

/// Admits an execution that stays queued (no worker runs in these tests unless started).
async fn admit_sleep(app: &TestApp, tenant: &str, ms: u64) -> String {
    app.admit_with(
        tenant,
        json!({"flow_id": "demo.sleep", "params": {"ms": ms}}),
    )
    .await
}

/// Waits until `n` clients wait on the app (at most 15 s).
async fn until_waiters(app: &TestApp, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while app.waiters.waiters() != n {
        assert!(
            Instant::now() < deadline,
            "{} waiters, not {n}",
            app.waiters.waiters()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until a waiter's first read (watch.lua) marked the execution's row as watched.
async fn until_watched(app: &TestApp, tenant: &str, id: &str) {
    let key = app.shard(tenant).row(&ExecutionId::parse(id).unwrap());
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let watch: Option<u64> = app
            .redis
            .query(redis::cmd("HGET").arg(&key).arg(sluice::domain::row::WATCH))
            .await;
        if watch.is_some() {
            return;
        }
        assert!(Instant::now() < deadline, "{id} was never watched");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Calls of every command Redis served so far (every master), by `INFO commandstats`.
async fn redis_calls(app: &TestApp, command: Option<&str>) -> u64 {
    let info = app.redis.info("commandstats").await;
    info.lines()
        .filter(|l| l.starts_with("cmdstat_"))
        .filter(|l| command.is_none_or(|c| l.starts_with(&format!("cmdstat_{c}:"))))
        .map(|l| {
            let calls = l.split("calls=").nth(1).unwrap();
            calls.split(',').next().unwrap().parse::<u64>().unwrap()
        })
        .sum()
}

/// A long poll of `id` (tenant `acme`, as the platform admin) waiting `wait`, on its own task.
fn spawn_wait(app: &TestApp, id: &str, wait: &str) -> tokio::task::JoinHandle<reqwest::Response> {
    let url = app.url(&format!("/api/executions/{id}?wait={wait}"));
    let client = app.client.clone();
    tokio::spawn(async move {
        client
            .get(url)
            .bearer_auth(ADMIN_TOKEN)
            .header("X-Tenant-Id", "acme")
            .send()
            .await
            .unwrap()
    })
}

/// An event stream of `id` (tenant `acme`) whose first event, the state now, is `queued`.
async fn queued_stream(app: &TestApp, id: &str) -> EventStream {
    let mut stream = EventStream::open(app, "acme", id).await;
    assert_eq!(
        stream.next_event(Duration::from_secs(10)).await.unwrap().1["status"],
        "queued"
    );
    stream
}

#[tokio::test]
async fn a_wait_answers_with_the_terminal_state_when_the_run_ends() {
    let app = TestApp::spawn().await;
    let id = admit_sleep(&app, "acme", 800).await;
    let waiting = {
        let app_url = app.url(&format!("/api/executions/{id}?wait=50s"));
        let client = app.client.clone();
        tokio::spawn(async move {
            client
                .get(app_url)
                .bearer_auth(ADMIN_TOKEN)
                .header("X-Tenant-Id", "acme")
                .send()
                .await
                .unwrap()
        })
    };
    // The wait is under way before anything runs the execution.
    until_watched(&app, "acme", &id).await;
    let _worker = TestWorker::spawn(&app.redis, FAST_WORKER);
    let res = waiting.await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(wait_outcome(&res), "terminal");
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["status"], "completed", "{body}");
    assert_eq!(body["execution_id"], id.as_str());
    // A wait on an execution that is terminal already answers at once, the same way.
    let res = wait_get(&app, "acme", &id, "50s").await;
    assert_eq!(wait_outcome(&res), "terminal");
    assert_eq!(res.json::<Value>().await.unwrap()["status"], "completed");
}

#[tokio::test]
async fn a_wait_on_an_execution_that_stays_queued_answers_its_state_when_the_wait_ends() {
    let app = TestApp::spawn().await;
    let id = admit_sleep(&app, "acme", 100).await;
    let started = Instant::now();
    let res = wait_get(&app, "acme", &id, "1200ms").await;
    assert!(started.elapsed() >= Duration::from_millis(1200));
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(wait_outcome(&res), "timeout");
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["status"], "queued");
    assert_eq!(body["queue_state"], "ready");
    // The waiter left: nothing stays registered after an answer.
    until_waiters(&app, 0).await;
    // Without `wait` the read is as it always was: no header, no waiting.
    let res = app.get_execution("acme", &id).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert!(res.headers().get("sluice-wait").is_none());
}

#[tokio::test]
async fn bad_waits_are_refused_and_other_tenants_executions_are_not_found() {
    let app = TestApp::spawn().await;
    let id = admit_sleep(&app, "acme", 100).await;
    for wait in [
        "0", "0ms", "61", "61s", "2m", "60001ms", "1.5s", "abc", "", "-1", "1h",
    ] {
        let res = wait_get(&app, "acme", &id, wait).await;
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "wait={wait}");
        assert_eq!(problem_code(res).await, "invalid_wait", "wait={wait}");
    }
    // Another tenant's execution is a 404 for a wait and a stream, exactly like an unknown id.
    let res = wait_get(&app, "other", &id, "5s").await;
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    assert_eq!(problem_code(res).await, "execution_not_found");
    let res = events(&app, "other", &id).await;
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    assert_eq!(problem_code(res).await, "execution_not_found");
    let unknown = ExecutionId::new().to_string();
    assert_eq!(
        wait_get(&app, "acme", &unknown, "5s").await.status(),
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        events(&app, "acme", "not-an-id").await.status(),
        StatusCode::BAD_REQUEST
    );
    // The other tenant's attempt left no mark on the row, and nobody waits any more.
    let watch: Option<u64> = app
        .redis
        .query(
            redis::cmd("HGET")
                .arg(app.shard("acme").row(&ExecutionId::parse(&id).unwrap()))
                .arg(sluice::domain::row::WATCH),
        )
        .await;
    assert_eq!(watch, None);
    until_waiters(&app, 0).await;
}

#[tokio::test]
async fn the_event_stream_shows_queued_running_completed_in_order_and_ends() {
    let app = TestApp::spawn().await;
    let id = admit_sleep(&app, "acme", 800).await;
    let mut stream = EventStream::open(&app, "acme", &id).await;
    let (name, first) = stream.next_event(Duration::from_secs(10)).await.unwrap();
    assert_eq!(name, "execution");
    assert_eq!(first["status"], "queued");
    assert_eq!(first["execution_id"], id.as_str());
    let _worker = TestWorker::spawn(&app.redis, FAST_WORKER);
    let rest = stream.rest(Duration::from_secs(30)).await;
    assert_eq!(rest, ["running", "completed"], "events after queued");
    until_waiters(&app, 0).await;
    // A stream of a terminal execution is its state, then the end.
    let mut again = EventStream::open(&app, "acme", &id).await;
    assert_eq!(again.rest(Duration::from_secs(10)).await, ["completed"]);
}

#[tokio::test]
async fn a_cancel_and_a_force_delete_end_waits_and_streams() {
    let app = TestApp::spawn().await;
    for force in [false, true] {
        let id = admit_sleep(&app, "acme", 100).await;
        let mut stream = queued_stream(&app, &id).await;
        let waiting = spawn_wait(&app, &id, "50s");
        until_waiters(&app, 2).await;
        if force {
            assert_eq!(
                app.delete("acme", &id, true).await.status(),
                StatusCode::NO_CONTENT
            );
            assert_eq!(stream.rest(Duration::from_secs(20)).await, ["deleted"]);
            let res = waiting.await.unwrap();
            assert_eq!(res.status(), StatusCode::NOT_FOUND);
        } else {
            assert_eq!(app.cancel("acme", &id).await.status(), StatusCode::OK);
            assert_eq!(stream.rest(Duration::from_secs(20)).await, ["cancelled"]);
            let res = waiting.await.unwrap();
            assert_eq!(wait_outcome(&res), "terminal");
            assert_eq!(res.json::<Value>().await.unwrap()["status"], "cancelled");
        }
        until_waiters(&app, 0).await;
    }
}

#[tokio::test]
async fn the_waiter_caps_refuse_the_next_one() {
    let app = TestApp::spawn_with(|c| {
        c.api.max_waiters = 3;
        c.api.max_waiters_per_tenant = Some(2);
    })
    .await;
    let a = admit_sleep(&app, "acme", 100).await;
    let b = admit_sleep(&app, "beta", 100).await;
    let c = admit_sleep(&app, "gamma", 100).await;
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(EventStream::open(&app, "acme", &a).await);
    }
    // The tenant's share is used up; other tenants still get in, up to the server's cap.
    let res = wait_get(&app, "acme", &a, "5s").await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(res.headers().contains_key("retry-after"));
    assert_eq!(problem_code(res).await, "tenant_too_many_waiters");
    let url = app.url(&format!("/api/executions/{b}?wait=2s"));
    let client = app.client.clone();
    let third = tokio::spawn(async move {
        client
            .get(url)
            .bearer_auth(ADMIN_TOKEN)
            .header("X-Tenant-Id", "beta")
            .send()
            .await
            .unwrap()
    });
    until_waiters(&app, 3).await;
    let res = events(&app, "gamma", &c).await;
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(res.headers().contains_key("retry-after"));
    assert_eq!(problem_code(res).await, "too_many_waiters");
    // Room again once a client leaves.
    assert_eq!(third.await.unwrap().status(), StatusCode::OK);
    until_waiters(&app, 2).await;
    let res = wait_get(&app, "gamma", &c, "100ms").await;
    assert_eq!(res.status(), StatusCode::OK);
    drop(held);
}

#[tokio::test]
async fn many_waiters_on_one_execution_cost_redis_nothing_while_they_wait() {
    // No sweeper: only the waiters (and the pin refresh every 2 s) talk to Redis.
    let app = TestApp::spawn_with(|c| c.api.sweep_interval_secs = 0).await;
    let id = admit_sleep(&app, "acme", 100).await;
    let mut streams = Vec::new();
    for _ in 0..25 {
        streams.push(EventStream::open(&app, "acme", &id).await);
    }
    let mut polls = Vec::new();
    for _ in 0..25 {
        polls.push(spawn_wait(&app, &id, "50s"));
    }
    for s in &mut streams {
        assert_eq!(
            s.next_event(Duration::from_secs(10)).await.unwrap().1["status"],
            "queued"
        );
    }
    until_waiters(&app, 50).await;
    let metrics = app.metrics().await;
    assert!(metrics.contains("sluice_waiters 50\n"), "{metrics}");
    assert!(
        metrics.contains("sluice_waiters_listening 1\n"),
        "{metrics}"
    );
    // Let the long polls' first reads land before counting.
    let deadline = Instant::now() + Duration::from_secs(15);
    while redis_calls(&app, Some("fcall")).await < 50 + 1 {
        assert!(
            Instant::now() < deadline,
            "the waiters' first reads never came"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = redis_calls(&app, None).await;
    // A few seconds of waiting, longer than a waiter's fallback read period: measured, not
    // waited for.
    tokio::time::sleep(sluice::waiters::FALLBACK_READ + Duration::from_secs(1)).await;
    let during = redis_calls(&app, None).await - before;
    // The INFO calls themselves, the pin refresh and the listener's ping: a handful, whatever
    // the number of waiters (50 clients polling even every few seconds would be 50 or more).
    assert!(during < 20, "{during} Redis calls while 50 clients waited");
    // One change: read once for all of them.
    let reads_before = redis_calls(&app, Some("hgetall")).await;
    assert_eq!(app.cancel("acme", &id).await.status(), StatusCode::OK);
    for s in &mut streams {
        assert_eq!(s.rest(Duration::from_secs(20)).await, ["cancelled"]);
    }
    for p in polls {
        let res = p.await.unwrap();
        assert_eq!(res.json::<Value>().await.unwrap()["status"], "cancelled");
    }
    let reads = redis_calls(&app, Some("hgetall")).await - reads_before;
    assert!(
        reads <= 3,
        "{reads} reads of the row for one change and 50 waiters"
    );
}

#[tokio::test]
async fn waits_and_streams_end_right_when_the_listener_connection_is_killed() {
    let app = TestApp::spawn().await;
    let id = admit_sleep(&app, "acme", 100).await;
    let mut stream = queued_stream(&app, &id).await;
    let waiting = spawn_wait(&app, &id, "50s");
    until_waiters(&app, 2).await;
    until_watched(&app, "acme", &id).await;
    // The server's subscriber goes away and cannot come back for a while (every node refuses
    // new connections; the connections already open serve on), and the change comes
    // meanwhile: its announcement reaches no one.
    let mut nodes = Vec::new();
    for i in 0..app.redis.masters() {
        let mut c = app.redis.node_conn(i).await;
        let info: String = redis::cmd("INFO")
            .arg("clients")
            .query_async(&mut c)
            .await
            .unwrap();
        let connected: u64 = info
            .lines()
            .find_map(|l| l.strip_prefix("connected_clients:"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxclients")
            .arg(connected.saturating_sub(1).max(1))
            .query_async(&mut c)
            .await
            .unwrap();
        let _: u64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("pubsub")
            .query_async(&mut c)
            .await
            .unwrap();
        nodes.push(c);
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    while app.waiters.listening() {
        assert!(Instant::now() < deadline, "the listener did not notice");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(app.cancel("acme", &id).await.status(), StatusCode::OK);
    for c in &mut nodes {
        let () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxclients")
            .arg(10_000)
            .query_async(c)
            .await
            .unwrap();
    }
    assert_eq!(stream.rest(Duration::from_secs(20)).await, ["cancelled"]);
    let res = waiting.await.unwrap();
    assert_eq!(wait_outcome(&res), "terminal");
    assert_eq!(res.json::<Value>().await.unwrap()["status"], "cancelled");
}

#[tokio::test]
async fn waits_and_streams_end_right_across_a_redis_restart() {
    let mut app = TestApp::spawn().await;
    // Every write on disk at once: a SIGKILL loses nothing the test relies on.
    app.redis.fsync_always().await;
    let id = admit_sleep(&app, "acme", 100).await;
    let mut stream = queued_stream(&app, &id).await;
    let waiting = spawn_wait(&app, &id, "55s");
    until_waiters(&app, 2).await;
    until_watched(&app, "acme", &id).await;
    app.redis.restart().await;
    // Cancel as soon as the server can reach Redis again (its connections reconnect).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let res = app.cancel("acme", &id).await;
        if res.status() == StatusCode::OK {
            break;
        }
        assert!(Instant::now() < deadline, "no cancel after the restart");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(stream.rest(Duration::from_secs(30)).await, ["cancelled"]);
    let res = waiting.await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.json::<Value>().await.unwrap()["status"], "cancelled");
}

#[tokio::test]
async fn streams_beat_and_end_at_their_lifetime_and_long_waits_outlast_the_request_bound() {
    // A request bound of 1.5 s and a stalled-peer rule of 2.5 s: a 4 s wait and a stream open
    // for longer must outlast both (the heartbeat is lowered to fit under the rule).
    let app = TestApp::spawn_with(|c| {
        c.redis.redis_timeout_ms = 450;
        c.api.request_timeout_ms = 1_500;
        c.api.header_read_timeout_ms = 1_000;
        c.api.events_lifetime_secs = 4;
    })
    .await;
    let id = admit_sleep(&app, "acme", 100).await;
    let mut stream = EventStream::open(&app, "acme", &id).await;
    let res = wait_get(&app, "acme", &id, "4s").await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(wait_outcome(&res), "timeout");
    assert_eq!(res.json::<Value>().await.unwrap()["status"], "queued");
    let mut heartbeats = 0;
    let mut statuses = Vec::new();
    while let Some(item) = stream.next(Duration::from_secs(10)).await {
        match item {
            Sse::Comment => heartbeats += 1,
            Sse::Event { data, .. } => statuses.push(data["status"].clone()),
        }
    }
    assert_eq!(statuses, [json!("queued")]);
    assert!(heartbeats >= 2, "{heartbeats} heartbeats in 4 s");
}

#[tokio::test]
async fn waits_and_streams_end_at_once_when_the_server_shuts_down() {
    let redis = crate::helpers::TestRedis::start().await;
    let mut config = sluice::config::AppConfig {
        api: sluice::config::ApiSettings::defaults(),
        redis: redis.settings(),
    };
    config.api.listen = "127.0.0.1:0".parse().unwrap();
    config.api.dev_auth = true;
    let app = Application::build(config).await.unwrap();
    let base = format!("http://{}", app.address());
    let waiters = app.waiters();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(app.run_until_stopped(async {
        let _ = stopped.await;
    }));
    let client = sluice::tls::client_builder(&[]).unwrap().build().unwrap();
    let res = client
        .post(format!("{base}/api/executions"))
        .header("X-Tenant-Id", "acme")
        .json(&json!({"flow_id": "demo.sleep"}))
        .send()
        .await
        .unwrap();
    let id = res.json::<Value>().await.unwrap()["execution_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let poll = tokio::spawn(
        client
            .get(format!("{base}/api/executions/{id}?wait=60s"))
            .header("X-Tenant-Id", "acme")
            .send(),
    );
    let stream = client
        .get(format!("{base}/api/executions/{id}/events"))
        .header("X-Tenant-Id", "acme")
        .send()
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while waiters.waiters() != 2 {
        assert!(Instant::now() < deadline, "the waiters never registered");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.send(()).unwrap();
    // Well before the 60 s wait: the wait answers, the stream ends, the server stops.
    let res = tokio::time::timeout(Duration::from_secs(15), poll)
        .await
        .expect("the wait answered at shutdown")
        .unwrap()
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(wait_outcome(&res), "timeout");
    let body = tokio::time::timeout(Duration::from_secs(15), stream.text())
        .await
        .expect("the stream ended at shutdown")
        .unwrap();
    assert!(body.contains("event: execution"), "{body}");
    tokio::time::timeout(Duration::from_secs(15), server)
        .await
        .expect("the server stopped")
        .unwrap();
}

/// A refused waiter gives its connection back: the 429 says `Connection: close` and the
/// connection ends over HTTP/1; over HTTP/2 the server sends a GOAWAY once the connection's
/// other stream (the client's waiter that got in) is done — that one is not cut — and the
/// connection ends. (The idle bound here is a minute, so nothing else would close them.)
#[tokio::test]
async fn a_refused_waiter_has_its_connection_closed() {
    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let app = TestApp::spawn_with(|c| {
        c.api.max_waiters_per_tenant = Some(1);
        c.api.header_read_timeout_ms = 60_000;
    })
    .await;
    // No worker: it stays queued until cancelled.
    let id = admit_sleep(&app, "acme", 100).await;
    let events_of = |id: &str| {
        hyper::Request::get(app.url(&format!("/api/executions/{id}/events")))
            .header("authorization", format!("Bearer {ADMIN_TOKEN}"))
            .header("x-tenant-id", "acme")
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap()
    };
    // An HTTP/2 (h2c) connection whose first stream is the tenant's one waiter.
    let io = hyper_util::rt::TokioIo::new(tokio::net::TcpStream::connect(app.addr).await.unwrap());
    let (mut h2, conn) = hyper::client::conn::http2::handshake::<
        _,
        _,
        http_body_util::Empty<bytes::Bytes>,
    >(hyper_util::rt::TokioExecutor::new(), io)
    .await
    .unwrap();
    let conn = tokio::spawn(conn);
    let held = h2.send_request(events_of(&id)).await.unwrap();
    assert_eq!(held.status(), 200);
    until_waiters(&app, 1).await;

    // HTTP/1.1, by hand: refused, told so, and closed.
    let mut h1 = tokio::net::TcpStream::connect(app.addr).await.unwrap();
    let req = format!(
        "GET /api/executions/{id}?wait=5s HTTP/1.1\r\nHost: sluice\r\n\
         Authorization: Bearer {ADMIN_TOKEN}\r\nX-Tenant-Id: acme\r\n\r\n"
    );
    h1.write_all(req.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), h1.read_to_end(&mut answer))
        .await
        .expect("the refused waiter's HTTP/1 connection stayed open")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer).to_lowercase();
    assert!(answer.starts_with("http/1.1 429"), "{answer}");
    assert!(answer.contains("connection: close"), "{answer}");
    assert!(answer.contains("tenant_too_many_waiters"), "{answer}");

    // A second stream on the HTTP/2 connection: refused.
    let res = h2.send_request(events_of(&id)).await.unwrap();
    assert_eq!(res.status(), 429);
    drop(res);
    // The stream that got in is not cut: it still delivers the execution's end.
    assert_eq!(app.cancel("acme", &id).await.status(), StatusCode::OK);
    let body = tokio::time::timeout(Duration::from_secs(20), held.into_body().collect())
        .await
        .expect("the held stream never ended")
        .expect("the held stream was cut")
        .to_bytes();
    let body = String::from_utf8_lossy(&body);
    assert!(body.contains("\"cancelled\""), "{body}");
    // Then the connection is closed.
    tokio::time::timeout(Duration::from_secs(10), conn)
        .await
        .expect("the refused waiter's HTTP/2 connection stayed open")
        .unwrap()
        .ok();
}

/// `wait` is read from the decoded query, by the time bound as by the handler: `2%73` is `2s`,
/// so the request is bounded by its wait plus the request bound, and answers at the end of the
/// wait instead of timing out after the request bound (here 1 s).
#[tokio::test]
async fn a_percent_encoded_wait_is_the_same_wait() {
    let app = TestApp::spawn_with(|c| {
        c.redis.redis_timeout_ms = 300;
        c.api.request_timeout_ms = 1_000;
    })
    .await;
    // No worker: it stays queued, and the wait runs to its end.
    let id = admit_sleep(&app, "acme", 100).await;
    let res = wait_get(&app, "acme", &id, "2%73").await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(wait_outcome(&res), "timeout");
}

/// Registers `tenant` and creates a `viewer` key for it as the platform admin: (key id, token).
async fn viewer_key(app: &TestApp, tenant: &str) -> (String, String) {
    let res = app
        .client
        .post(app.url(&format!("/api/tenants/{tenant}/api-keys")))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"role": "viewer"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    let key: Value = res.json().await.unwrap();
    (
        key["key_id"].as_str().unwrap().to_owned(),
        key["token"].as_str().unwrap().to_owned(),
    )
}

/// An event stream of `id` opened with an API key on the server at `base`, its first event
/// (the state now, `queued`) read.
async fn key_stream(
    app: &TestApp,
    base: std::net::SocketAddr,
    token: &str,
    id: &str,
) -> EventStream {
    let res = app
        .client
        .get(format!("http://{base}/api/executions/{id}/events"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let mut stream = EventStream {
        res,
        buf: String::new(),
    };
    let (name, data) = stream.next_event(Duration::from_secs(10)).await.unwrap();
    assert_eq!(
        (name.as_str(), &data["status"]),
        ("execution", &json!("queued"))
    );
    stream
}

/// A long poll of `id` with an API key on the server at `base`, on its own task: its status
/// and when it came.
fn key_wait(
    app: &TestApp,
    base: std::net::SocketAddr,
    token: &str,
    id: &str,
) -> tokio::task::JoinHandle<(StatusCode, Instant)> {
    let req = app
        .client
        .get(format!("http://{base}/api/executions/{id}?wait=30s"))
        .bearer_auth(token);
    tokio::spawn(async move {
        let res = req.send().await.unwrap();
        (res.status(), Instant::now())
    })
}

/// `sluice_waiters` of the server at `base`, waited for until it is `n` (at most 15 s).
async fn until_waiters_at(app: &TestApp, base: std::net::SocketAddr, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let text = app
            .client
            .get(format!("http://{base}/metrics"))
            .bearer_auth(METRICS_TOKEN)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let now = text
            .lines()
            .find_map(|l| l.strip_prefix("sluice_waiters "))
            .and_then(|v| v.trim().parse::<f64>().ok());
        if now == Some(n as f64) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{now:?} waiters at {base}, not {n}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Reads the stream to its end: it must end with a `revoked` event naming `id`; returns when.
async fn revoked_end(stream: &mut EventStream, id: &str) -> Instant {
    // Generous for a loaded machine; before the fix nothing came for the stream's 300 s.
    let (name, data) = stream
        .next_event(Duration::from_secs(20))
        .await
        .expect("an event before the end");
    let at = Instant::now();
    assert_eq!(
        (name.as_str(), &data),
        ("revoked", &json!({"execution_id": id}))
    );
    assert!(
        stream.next_event(Duration::from_secs(5)).await.is_none(),
        "the stream ends"
    );
    at
}

/// Issue 19: a revoked key's open streams and waits end, on every server, within about a
/// second (they used to go on for up to 300 s and 60 s); another key's stream goes on.
#[tokio::test]
async fn revoking_a_key_ends_its_streams_and_waits_on_every_server() {
    let app = TestApp::spawn().await;
    let other = app.spawn_beside(|_| {}).await;
    app.put_tenant("acme", &json!({})).await;
    let (key_id, token) = viewer_key(&app, "acme").await;
    let (_, kept) = viewer_key(&app, "acme").await;
    let id = admit_sleep(&app, "acme", 100).await;

    let mut stream = key_stream(&app, app.addr, &token, &id).await;
    let mut stream_elsewhere = key_stream(&app, other, &token, &id).await;
    let stays = key_stream(&app, app.addr, &kept, &id).await;
    let wait = key_wait(&app, other, &token, &id);
    until_waiters(&app, 2).await;
    until_waiters_at(&app, other, 2).await;

    let revoked_at = Instant::now();
    let res = app
        .client
        .delete(app.url(&format!("/api/tenants/acme/api-keys/{key_id}")))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NO_CONTENT);

    let here = revoked_end(&mut stream, &id).await;
    let there = revoked_end(&mut stream_elsewhere, &id).await;
    let (status, waited) = wait.await.unwrap();
    assert_eq!(status, StatusCode::UNAUTHORIZED, "the wait ends refused");
    eprintln!(
        "after the revocation: stream {:?}, stream on another server {:?}, wait {:?}",
        here - revoked_at,
        there - revoked_at,
        waited - revoked_at
    );
    // Well before the wait's own 30 s (a loaded machine may take a few seconds).
    assert!(waited - revoked_at < Duration::from_secs(20));
    // The other key's stream is still open, and the revoked key is refused from now on.
    until_waiters(&app, 1).await;
    until_waiters_at(&app, other, 0).await;
    let res = events_with(&app, &token, &id).await;
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    drop(stays);
}

async fn events_with(app: &TestApp, token: &str, id: &str) -> Response {
    app.client
        .get(app.url(&format!("/api/executions/{id}/events")))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
}

/// The same when the tenant is deleted: every key of it is withdrawn at once.
#[tokio::test]
async fn deleting_a_tenant_ends_its_keys_streams_and_waits() {
    let app = TestApp::spawn().await;
    app.put_tenant("acme", &json!({})).await;
    let (_, token) = viewer_key(&app, "acme").await;
    let id = admit_sleep(&app, "acme", 100).await;
    let mut stream = key_stream(&app, app.addr, &token, &id).await;
    let wait = key_wait(&app, app.addr, &token, &id);
    until_waiters(&app, 2).await;

    let deleted_at = Instant::now();
    let res = app
        .client
        .delete(app.url("/api/tenants/acme"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    let ended = revoked_end(&mut stream, &id).await;
    let (status, waited) = wait.await.unwrap();
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    eprintln!(
        "after the tenant's deletion: stream {:?}, wait {:?}",
        ended - deleted_at,
        waited - deleted_at
    );
    assert!(waited - deleted_at < Duration::from_secs(20));
    until_waiters(&app, 0).await;
}

/// A revocation whose announcement never arrives (here: the key's record removed behind the
/// server's back, as a crashed server would leave it) is still caught by the re-check.
#[tokio::test]
async fn a_revocation_without_its_announcement_is_caught_by_the_recheck() {
    let app = TestApp::spawn().await;
    app.put_tenant("acme", &json!({})).await;
    let (key_id, token) = viewer_key(&app, "acme").await;
    let id = admit_sleep(&app, "acme", 100).await;
    let mut stream = key_stream(&app, app.addr, &token, &id).await;
    let wait = key_wait(&app, app.addr, &token, &id);
    until_waiters(&app, 2).await;

    let removed_at = Instant::now();
    let removed: i64 = app
        .redis
        .query(redis::cmd("DEL").arg(sluice::store::keys::api_key(&key_id)))
        .await;
    assert_eq!(removed, 1);
    let ended = revoked_end(&mut stream, &id).await;
    let (status, waited) = wait.await.unwrap();
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    eprintln!(
        "after the silent removal: stream {:?}, wait {:?}",
        ended - removed_at,
        waited - removed_at
    );
    assert!(waited - removed_at < Duration::from_secs(20));
}

/// A well-formed token Redis does not know is remembered: repeating it costs no Redis call
/// (it used to cost one each); a key created afterwards works at once.
#[tokio::test]
async fn a_fake_token_repeated_costs_redis_almost_nothing() {
    // No sweeper: its scripts would count among the calls measured.
    let app = TestApp::spawn_with(|c| c.api.sweep_interval_secs = 0).await;
    app.put_tenant("acme", &json!({})).await;
    let fake = format!("sk_{}_{}", "0".repeat(16), "ab".repeat(32));
    app.redis.reset_stats().await;
    for _ in 0..50 {
        let res = app
            .client
            .get(app.url("/api/executions"))
            .bearer_auth(&fake)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    }
    let calls: u64 = app
        .redis
        .command_calls()
        .await
        .iter()
        .filter(|(c, _)| c.starts_with("eval"))
        .map(|(_, n)| n)
        .sum();
    assert!(
        calls <= 2,
        "50 requests with one fake token made {calls} script calls"
    );
    // A real key still works on its first request.
    let (_, token) = viewer_key(&app, "acme").await;
    let res = app
        .client
        .get(app.url("/api/executions"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
}

/// Events carry the position as of each event; a change of position alone sends nothing:
/// starts ahead of a watched execution move it up without an event, so the next event its
/// stream shows is its own cancel (with no position).
#[tokio::test]
async fn events_carry_the_position_and_a_move_alone_sends_nothing() {
    let app = TestApp::spawn().await;
    app.put_tenant("acme", &json!({"max_concurrent": 10})).await;
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(
            app.admit_with("acme", json!({"flow_id": "demo.echo", "params": {"i": i}}))
                .await,
        );
    }
    let mut stream = EventStream::open(&app, "acme", &ids[2]).await;
    let (name, first) = stream.next_event(Duration::from_secs(10)).await.unwrap();
    assert_eq!(name, "execution");
    assert_eq!(first["queue_position"], json!({"tenant": 2, "key": null}));
    until_watched(&app, "acme", &ids[2]).await;
    // Two start ahead of it: it is next now, and nothing is sent for that.
    let store = app.store().await;
    let started = store
        .start(app.shard("acme"), "w", 2, Duration::from_secs(60), 0)
        .await
        .unwrap()
        .started;
    assert_eq!(started.len(), 2);
    assert_eq!(
        app.execution("acme", &ids[2]).await["queue_position"]["tenant"],
        0
    );
    assert_eq!(app.cancel("acme", &ids[2]).await.status(), StatusCode::OK);
    let (_, next) = stream.next_event(Duration::from_secs(10)).await.unwrap();
    assert_eq!(next["status"], "cancelled", "{next}");
    assert_eq!(next["queue_position"], Value::Null);
}
