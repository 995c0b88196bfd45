//! The pull API (`/api/worker/*`): leases, fenced heartbeats and completions, lost answers,
//! long polls that share the server's doorbell readers, cancels heard at once, the waiter
//! budget, expired leases recovered by `serve` alone, and the Python example worker killed
//! with SIGKILL in the middle of a run.
//!
//! Long on purpose: a list of independent tests of the pull API, route by route and failure by
//! failure; they are the pull contract, which reads best in one place.

use std::collections::HashSet;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::helpers::{
    ADMIN_TOKEN, FAST_WORKER, TestApp, TestWorker, cluster_mode, problem_code, sluice_bin,
};

/// A pull worker as a test drives it: its key and its id.
#[derive(Clone)]
struct Puller {
    url: String,
    token: String,
    worker: String,
    client: reqwest::Client,
}

impl Puller {
    async fn new(app: &TestApp, tenant: &str, worker: &str) -> Self {
        app.create_tenant(tenant).await;
        Self {
            url: app.url(""),
            token: app.key_token(tenant, "worker").await,
            worker: worker.into(),
            client: app.client.clone(),
        }
    }

    async fn post(&self, path: &str, body: Value) -> reqwest::Response {
        self.client
            .post(format!("{}{path}", self.url))
            .bearer_auth(&self.token)
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    /// A lease call; the runs it answered with (asserting 200).
    async fn lease(&self, query: &str, mut body: Value) -> Vec<Value> {
        body["worker_id"] = json!(self.worker);
        let res = self.post(&format!("/api/worker/lease{query}"), body).await;
        assert_eq!(res.status(), StatusCode::OK);
        let answer: Value = res.json().await.unwrap();
        answer["runs"].as_array().unwrap().clone()
    }

    async fn heartbeat(&self, id: &str, fence: u64) -> reqwest::Response {
        self.post(
            &format!("/api/worker/runs/{id}/heartbeat"),
            json!({"worker_id": self.worker, "fence": fence, "lease": "30s"}),
        )
        .await
    }

    async fn complete(&self, id: &str, fence: u64, mut body: Value) -> reqwest::Response {
        body["worker_id"] = json!(self.worker);
        body["fence"] = json!(fence);
        self.post(&format!("/api/worker/runs/{id}/complete"), body)
            .await
    }
}

fn id_of(run: &Value) -> String {
    run["execution_id"].as_str().unwrap().to_owned()
}

fn fence_of(run: &Value) -> u64 {
    run["fence"].as_u64().unwrap()
}

/// Waits until `n` long polls listen on the server's doorbells.
async fn polls_waiting(app: &TestApp, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while app.pull.doorbells.waiting() < n {
        assert!(Instant::now() < deadline, "{n} long polls never waited");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn a_worker_key_leases_heartbeats_and_completes_and_reaches_nothing_else() {
    let app = TestApp::spawn_with(|c| c.api.retry_backoff_ms = 50).await;
    let w = Puller::new(&app, "acme", "py-1").await;
    let traced = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let res = app
        .as_tenant(reqwest::Method::POST, "/api/executions", "acme")
        .header("traceparent", traced)
        .json(&json!({"flow_id": "py.echo", "params": {"n": 1}, "max_attempts": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    let first: Value = res.json().await.unwrap();
    let second = app
        .admit_with("acme", json!({"flow_id": "py.fail", "max_attempts": 2}))
        .await;

    let runs = w.lease("", json!({"max": 2, "lease": "20s"})).await;
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert_eq!(id_of(&runs[0]), first["execution_id"].as_str().unwrap());
    assert_eq!(runs[0]["params"], json!({"n": 1}));
    assert_eq!(runs[0]["tenant_id"], "acme");
    assert_eq!(runs[0]["flow_id"], "py.echo");
    assert_eq!(runs[0]["attempt"], 1);
    assert_eq!(runs[0]["lease_ms"], 20_000);
    assert_eq!(runs[0]["traceparent"], traced);
    assert_eq!(runs[0]["recovered"], false);
    assert_eq!(id_of(&runs[1]), second);

    let res = w.heartbeat(&id_of(&runs[0]), fence_of(&runs[0])).await;
    assert_eq!(res.status(), StatusCode::OK);
    let beat: Value = res.json().await.unwrap();
    assert_eq!(beat, json!({"state": "held", "lease_ms": 30_000}));

    // Completed, with its output.
    let res = w
        .complete(
            &id_of(&runs[0]),
            fence_of(&runs[0]),
            json!({"outcome": "completed", "output": {"sum": 3}}),
        )
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(
        res.json::<Value>().await.unwrap(),
        json!({"result": "completed"})
    );
    let e = app.execution("acme", &id_of(&runs[0])).await;
    assert_eq!(e["status"], "completed");
    assert_eq!(e["output"], json!({"sum": 3}));
    // The same report again is applied once.
    let res = w
        .complete(
            &id_of(&runs[0]),
            fence_of(&runs[0]),
            json!({"outcome": "completed", "output": {"sum": 3}}),
        )
        .await;
    assert_eq!(
        res.json::<Value>().await.unwrap()["result"],
        "already_reported"
    );

    // A retryable failure comes back after the server's backoff, as attempt 2 with a new
    // fence; the first run's fence is refused from then on.
    let failing = runs[1].clone();
    let res = w
        .complete(
            &second,
            fence_of(&failing),
            json!({"outcome": "failed", "retryable": true,
                   "error": {"kind": "flaky", "message": "try again"}}),
        )
        .await;
    let answer: Value = res.json().await.unwrap();
    assert_eq!(answer, json!({"result": "retrying", "retry_in_ms": 50}));
    let again = w.lease("?wait=10s", json!({"max": 1})).await;
    assert_eq!(again.len(), 1);
    assert_eq!(id_of(&again[0]), second);
    assert_eq!(again[0]["attempt"], 2);
    assert!(fence_of(&again[0]) > fence_of(&failing));
    let res = w.heartbeat(&second, fence_of(&failing)).await;
    assert_eq!(res.status(), StatusCode::CONFLICT);
    assert_eq!(problem_code(res).await, "lease_lost");
    // Its last attempt fails: dead-lettered with the worker's reason.
    let res = w
        .complete(
            &second,
            fence_of(&again[0]),
            json!({"outcome": "failed", "retryable": true, "error": {"message": "still"}}),
        )
        .await;
    assert_eq!(
        res.json::<Value>().await.unwrap()["result"],
        "dead_lettered"
    );
    let e = app.execution("acme", &second).await;
    assert_eq!(e["status"], "failed");

    // This key reaches nothing but the pull API.
    let third = app.admit_with("acme", json!({"flow_id": "py.fail"})).await;
    for (method, path) in [
        (reqwest::Method::GET, "/api/executions".to_owned()),
        (reqwest::Method::GET, format!("/api/executions/{third}")),
        (reqwest::Method::GET, "/api/me".to_owned()),
        (
            reqwest::Method::POST,
            format!("/api/executions/{third}/cancel"),
        ),
    ] {
        let res = app
            .client
            .request(method, app.url(&path))
            .bearer_auth(&w.token)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::FORBIDDEN, "{path}");
        assert_eq!(problem_code(res).await, "insufficient_role", "{path}");
    }
    // And a key of another role cannot pull.
    let editor = app.key_token("acme", "editor").await;
    let res = app
        .client
        .post(app.url("/api/worker/lease"))
        .bearer_auth(&editor)
        .json(&json!({"worker_id": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    assert_eq!(problem_code(res).await, "insufficient_role");
    // Nor serve another tenant.
    let res = w
        .post(
            "/api/worker/lease",
            json!({"worker_id": "py-1", "tenants": ["globex"]}),
        )
        .await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    assert_eq!(problem_code(res).await, "tenant_mismatch");
}

#[tokio::test]
async fn only_the_holder_of_the_current_run_is_heard() {
    let app = TestApp::spawn().await;
    let w = Puller::new(&app, "acme", "a").await;
    let other = Puller {
        worker: "b".into(),
        ..w.clone()
    };
    let id = app.admit_with("acme", json!({"flow_id": "py.echo"})).await;
    let runs = w.lease("", json!({})).await;
    let fence = fence_of(&runs[0]);
    for (who, f) in [(&other, fence), (&w, fence + 1), (&w, fence - 1)] {
        let res = who.heartbeat(&id, f).await;
        assert_eq!(res.status(), StatusCode::CONFLICT);
        assert_eq!(problem_code(res).await, "lease_lost");
        let res = who
            .complete(&id, f, json!({"outcome": "completed", "output": 1}))
            .await;
        assert_eq!(res.status(), StatusCode::CONFLICT);
        assert_eq!(problem_code(res).await, "lease_lost");
    }
    assert_eq!(app.execution("acme", &id).await["status"], "running");
    // Bad input is a 400 that names the field.
    for (body, code) in [
        (json!({"worker_id": "a b"}), "invalid_worker_id"),
        (json!({"worker_id": "a", "max": 0}), "invalid_max"),
        (json!({"worker_id": "a", "max": 101}), "invalid_max"),
        (json!({"worker_id": "a", "lease": "1h"}), "invalid_lease"),
        (json!({"worker_id": "a", "lease": "10ms"}), "invalid_lease"),
        (
            json!({"worker_id": "a", "holding": ["nope"]}),
            "invalid_execution_id",
        ),
    ] {
        let res = w.post("/api/worker/lease", body.clone()).await;
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(problem_code(res).await, code, "{body}");
    }
    let res = w
        .post("/api/worker/lease?wait=2h", json!({"worker_id": "a"}))
        .await;
    assert_eq!(problem_code(res).await, "invalid_wait");
}

/// Issue 38, contract point 9: the pull API answered `dead_lettered` to a failure its worker
/// marked not retryable, though nothing was dead-lettered (the answer had no `failed`), while
/// `sluice worker` ended the same failure `failed` without a record. One rule now, for both
/// kinds of worker, and the answer says what the store did: a failure that may not be retried
/// ends `failed` at once (attempts left or not) with no dead-letter record, answered
/// `failed`; a retryable failure on the last attempt ends `failed` with a record, answered
/// `dead_lettered`.
#[tokio::test]
async fn a_final_failure_ends_alike_through_the_pull_api_and_sluice_worker() {
    let app = TestApp::spawn().await;
    let w = Puller::new(&app, "acme", "py-1").await;
    let refused = app
        .admit_with("acme", json!({"flow_id": "py.fail", "max_attempts": 3}))
        .await;
    let unsaid = app
        .admit_with("acme", json!({"flow_id": "py.fail", "max_attempts": 3}))
        .await;
    let exhausted = app
        .admit_with("acme", json!({"flow_id": "py.fail", "max_attempts": 1}))
        .await;
    let runs = w.lease("", json!({"max": 3})).await;
    let fence = |id: &str| {
        fence_of(
            runs.iter()
                .find(|r| id_of(r) == id)
                .unwrap_or_else(|| panic!("{id} not leased: {runs:?}")),
        )
    };
    for (id, report, answer) in [
        (
            &refused,
            json!({"outcome": "failed", "retryable": false,
                   "error": {"kind": "bad_input", "message": "no such customer"}}),
            "failed",
        ),
        (
            &unsaid,
            json!({"outcome": "failed", "error": {"message": "no retry asked"}}),
            "failed",
        ),
        (
            &exhausted,
            json!({"outcome": "failed", "retryable": true,
                   "error": {"kind": "timeout", "message": "gave up"}}),
            "dead_lettered",
        ),
    ] {
        let res = w.complete(id, fence(id), report).await;
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(
            res.json::<Value>().await.unwrap(),
            json!({"result": answer})
        );
        let e = app.execution("acme", id).await;
        assert_eq!(
            (&e["status"], &e["attempt"]),
            (&json!("failed"), &json!(1)),
            "{e}"
        );
    }
    assert_eq!(
        app.execution("acme", &refused).await["error"],
        json!({"kind": "bad_input", "message": "no such customer"})
    );
    let dlq = app.get_json(Some("acme"), "/api/dlq").await;
    let records = dlq["dead_letters"].as_array().unwrap();
    assert_eq!(records.len(), 1, "{dlq}");
    assert_eq!(records[0]["execution_id"], exhausted.as_str());
    assert_eq!(records[0]["reason"], "timeout");

    // The same two failures through `sluice worker`'s demo.fail.
    let _worker = TestWorker::spawn(&app.redis, FAST_WORKER);
    let permanent = app
        .admit_with(
            "globex",
            json!({"flow_id": "demo.fail", "max_attempts": 3,
                   "params": {"retryable": false, "message": "no"}}),
        )
        .await;
    let last = app
        .admit_with(
            "globex",
            json!({"flow_id": "demo.fail", "max_attempts": 1, "params": {"message": "gone"}}),
        )
        .await;
    for id in [&permanent, &last] {
        let e = app
            .wait_terminal("globex", id, Duration::from_secs(15))
            .await;
        assert_eq!(
            (&e["status"], &e["attempt"]),
            (&json!("failed"), &json!(1)),
            "{e}"
        );
    }
    let dlq = app.get_json(Some("globex"), "/api/dlq").await;
    let records = dlq["dead_letters"].as_array().unwrap();
    assert_eq!(records.len(), 1, "{dlq}");
    assert_eq!(records[0]["execution_id"], last.as_str());
    assert_eq!(records[0]["reason"], "handler_error");
    assert_eq!(app.counter("dead_lettered").await, 2);
}

/// A started run reaches the worker as one line of Redis's answer (`start.lua`, fields joined
/// by newlines, the params last), a recovered one as a list (`adopt.lua`): both answer each
/// field as it was admitted, whatever characters the version, the trace state and the params
/// hold.
#[tokio::test]
async fn a_leased_run_answers_each_field_as_admitted_started_or_recovered() {
    let app = TestApp::spawn().await;
    let w = Puller::new(&app, "acme", "w").await;
    let traced = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let state = "vendor=a:b c,other=x";
    let params = json!({"text": "two\nlines: here\n", "n": [1, 2.5, "x:y"], "e": ""});
    let res = app
        .as_tenant(reqwest::Method::POST, "/api/executions", "acme")
        .header("traceparent", traced)
        .header("tracestate", state)
        .json(
            &json!({"flow_id": "py.echo", "version": "v2: beta 1", "params": params,
            "max_attempts": 3}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    let id = res.json::<Value>().await.unwrap()["execution_id"]
        .as_str()
        .unwrap()
        .to_owned();

    // Started: its answer is lost on the way, so the next call hands it out again (adopted).
    let started = w.lease("", json!({"max": 1, "lease": "30s"})).await;
    let recovered = w.lease("", json!({"max": 1, "lease": "30s"})).await;
    assert_eq!(started.len(), 1, "{started:?}");
    assert_eq!(
        started[0],
        json!({"execution_id": id, "tenant_id": "acme", "flow_id": "py.echo",
            "version": "v2: beta 1", "params": params, "fence": 1, "attempt": 1,
            "max_attempts": 3, "lease_ms": 30_000, "traceparent": traced,
            "tracestate": state, "recovered": false})
    );
    let mut again = started[0].clone();
    again["recovered"] = json!(true);
    assert_eq!(recovered, vec![again]);
}

#[tokio::test]
async fn a_lease_answer_lost_on_the_way_is_handed_out_again_not_dead_lettered() {
    let app = TestApp::spawn().await;
    let w = Puller::new(&app, "acme", "w").await;
    let a = app.admit_with("acme", json!({"flow_id": "py.echo"})).await;
    let b = app.admit_with("acme", json!({"flow_id": "py.echo"})).await;
    // The first answer never reaches the worker.
    let lost = w.lease("", json!({"max": 1})).await;
    assert_eq!(id_of(&lost[0]), a);
    // Its next call gets that run back, same fence and attempt, marked recovered, before any
    // new one.
    let next = w.lease("", json!({"max": 1})).await;
    assert_eq!(next.len(), 1);
    assert_eq!(id_of(&next[0]), a);
    assert_eq!(fence_of(&next[0]), fence_of(&lost[0]));
    assert_eq!(next[0]["attempt"], 1);
    assert_eq!(next[0]["recovered"], true);
    // A worker that says it runs it gets the next execution instead.
    let next = w.lease("", json!({"max": 5, "holding": [a.clone()]})).await;
    let ids: Vec<String> = next.iter().map(id_of).collect();
    assert_eq!(ids, vec![b.clone()]);
    assert_eq!(next[0]["recovered"], false);
    // Both complete on their first attempt.
    for run in [&lost[0], &next[0]] {
        let res = w
            .complete(&id_of(run), fence_of(run), json!({"outcome": "completed"}))
            .await;
        assert_eq!(res.status(), StatusCode::OK);
    }
    for id in [&a, &b] {
        let e = app.execution("acme", id).await;
        assert_eq!(
            (e["status"].as_str(), e["attempt"].as_u64()),
            (Some("completed"), Some(1))
        );
    }
    assert_eq!(app.counter("reclaimed").await, 0);
}

#[tokio::test]
async fn many_long_polls_share_the_doorbell_readers_and_each_execution_goes_to_one() {
    let app = TestApp::spawn().await;
    const POLLS: usize = 40;
    let w = Puller::new(&app, "acme", "w0").await;
    let mut polls = tokio::task::JoinSet::new();
    for i in 0..POLLS {
        let p = Puller {
            worker: format!("w{i}"),
            ..w.clone()
        };
        polls.spawn(async move { p.lease("?wait=30s", json!({"max": 1})).await });
    }
    polls_waiting(&app, POLLS).await;
    let shards = app.store().await.shards().all().count();
    let mut admitted = HashSet::new();
    let began = Instant::now();
    for _ in 0..POLLS {
        admitted.insert(app.admit_with("acme", json!({"flow_id": "py.echo"})).await);
    }
    let mut leased = Vec::new();
    while let Some(runs) = polls.join_next().await {
        let runs = runs.unwrap();
        assert_eq!(runs.len(), 1, "a long poll answered {runs:?}");
        leased.push(id_of(&runs[0]));
    }
    println!(
        "{POLLS} long polls served {POLLS} admissions in {:?}; doorbell connections {}",
        began.elapsed(),
        app.pull.doorbells.connections()
    );
    let unique: HashSet<String> = leased.iter().cloned().collect();
    assert_eq!(unique.len(), POLLS, "an execution went to two workers");
    assert_eq!(unique, admitted);
    // One reader per shard at most, however many polls waited.
    assert!(app.pull.doorbells.connections() <= shards);
    // What an operator sees.
    let metrics = app.metrics().await;
    assert!(
        metrics.contains(&format!("sluice_pull_runs_handed_out_total {POLLS}\n")),
        "{metrics}"
    );
    assert!(metrics.contains("sluice_pull_long_polls 0\n"));
    let connections = app.pull.doorbells.connections();
    assert!(metrics.contains(&format!("sluice_pull_bell_connections {connections}\n")));
}

#[tokio::test]
async fn a_cancel_reaches_a_waiting_stop_poll_at_once_and_the_heartbeat_says_so() {
    let app = TestApp::spawn().await;
    let w = Puller::new(&app, "acme", "w").await;
    let id = app.admit_with("acme", json!({"flow_id": "py.sleep"})).await;
    let run = w.lease("", json!({})).await.remove(0);
    let stops = {
        let w = w.clone();
        tokio::spawn(async move {
            let res = w
                .post("/api/worker/stops?wait=30s", json!({"worker_id": w.worker}))
                .await;
            assert_eq!(res.status(), StatusCode::OK);
            (res.json::<Value>().await.unwrap(), Instant::now())
        })
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    while !(app.pull.stops.kept().contains("pull/acme/w") && app.pull.stops.listening()) {
        assert!(Instant::now() < deadline, "the stop poll never waited");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let asked = Instant::now();
    let res = app.cancel("acme", &id).await;
    assert!(res.status().is_success(), "{}", res.status());
    let (answer, heard) = stops.await.unwrap();
    assert_eq!(answer, json!({"stop": [id.clone()]}));
    println!(
        "cancel reached the pull worker's stop poll in {:?}",
        heard.saturating_duration_since(asked)
    );
    let res = w.heartbeat(&id, fence_of(&run)).await;
    assert_eq!(
        res.json::<Value>().await.unwrap()["state"],
        "cancel_requested"
    );
    let res = w
        .complete(&id, fence_of(&run), json!({"outcome": "cancelled"}))
        .await;
    assert_eq!(res.json::<Value>().await.unwrap()["result"], "cancelled");
    assert_eq!(app.execution("acme", &id).await["status"], "cancelled");
}

/// The pull workers' stop mailboxes `serve` keeps for `tenant`'s workers.
fn mailboxes_of(app: &TestApp, tenant: &str) -> Vec<String> {
    let prefix = format!("pull/{tenant}/");
    let mut kept: Vec<String> = app
        .pull
        .stops
        .kept()
        .into_iter()
        .filter_map(|c| c.strip_prefix(&prefix).map(str::to_owned))
        .collect();
    kept.sort();
    kept
}

/// A `worker_id` is a name the caller makes up, and each stop poll of a new one leaves a
/// mailbox for a minute: a key inventing ids holds at most its bound of them (its own
/// idle-longest forgotten first), a second key of the flood takes room from the credential
/// holding the most, and other credentials' mailboxes stay and still get their cancels.
#[tokio::test]
async fn a_key_inventing_worker_ids_keeps_a_bounded_number_of_stop_mailboxes() {
    const PER_KEY: usize = 8;
    const TOTAL: usize = 16;
    let app = TestApp::spawn_with(|c| {
        c.api.pull_mailboxes_per_credential = PER_KEY;
        c.api.pull_mailboxes = TOTAL;
    })
    .await;
    let victim = Puller::new(&app, "acme", "victim").await;
    let stop_poll = |p: &Puller, worker: String, wait: &'static str| {
        let p = p.clone();
        async move {
            let res = p
                .post(
                    &format!("/api/worker/stops{wait}"),
                    json!({"worker_id": worker}),
                )
                .await;
            assert_eq!(res.status(), StatusCode::OK);
            res.json::<Value>().await.unwrap()["stop"].clone()
        }
    };
    stop_poll(&victim, "victim".into(), "").await;
    let neighbour = Puller::new(&app, "beta", "b").await;
    for i in 0..3 {
        stop_poll(&neighbour, format!("b{i}"), "").await;
    }
    // One key, 100 invented ids: it keeps its last 8, nobody else loses one.
    let flood = Puller::new(&app, "evil", "x").await;
    for i in 0..100 {
        stop_poll(&flood, format!("x{i:03}"), "").await;
    }
    let last: Vec<String> = (92..100).map(|i| format!("x{i:03}")).collect();
    assert_eq!(mailboxes_of(&app, "evil"), last);
    assert_eq!(mailboxes_of(&app, "acme"), ["victim"]);
    assert_eq!(mailboxes_of(&app, "beta"), ["b0", "b1", "b2"]);
    // A second key of the flood fills the server (16): room comes from the first key, which
    // holds the most, never from the victim or the neighbour.
    let second = Puller {
        token: app.key_token("evil", "worker").await,
        ..flood.clone()
    };
    for i in 0..100 {
        stop_poll(&second, format!("y{i:03}"), "").await;
    }
    assert_eq!(app.pull.stops.kept().len(), TOTAL);
    let evil = mailboxes_of(&app, "evil");
    let (xs, ys): (Vec<&String>, Vec<&String>) = evil.iter().partition(|w| w.starts_with('x'));
    assert_eq!(xs.len() + ys.len(), TOTAL - 4, "{evil:?}");
    assert!(xs.len() <= PER_KEY && ys.len() <= PER_KEY, "{evil:?}");
    assert!(ys.contains(&&"y099".to_owned()), "{evil:?}");
    assert_eq!(mailboxes_of(&app, "acme"), ["victim"]);
    assert_eq!(mailboxes_of(&app, "beta"), ["b0", "b1", "b2"]);
    // A mailbox a poll waits on is never forgotten: with all 8 of a key's mailboxes waited
    // on, a ninth id gets a mailbox only for its own poll.
    let third = Puller {
        token: app.key_token("evil", "worker").await,
        ..flood.clone()
    };
    let waits: Vec<_> = (0..PER_KEY)
        .map(|i| tokio::spawn(stop_poll(&third, format!("z{i}"), "?wait=3s")))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(15);
    while mailboxes_of(&app, "evil")
        .iter()
        .filter(|w| w.starts_with('z'))
        .count()
        < PER_KEY
    {
        assert!(Instant::now() < deadline, "the waits never began");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    stop_poll(&third, "z-extra".into(), "").await;
    let evil = mailboxes_of(&app, "evil");
    assert!(!evil.contains(&"z-extra".to_owned()), "{evil:?}");
    assert_eq!(evil.iter().filter(|w| w.starts_with('z')).count(), PER_KEY);
    for w in waits {
        assert_eq!(w.await.unwrap(), json!([]));
    }
    // The victim's mailbox still works: a cancel published while it does not poll is kept
    // for its next poll.
    let id = app.admit_with("acme", json!({"flow_id": "py.sleep"})).await;
    let run = victim.lease("", json!({})).await.remove(0);
    assert_eq!(id_of(&run), id);
    let deadline = Instant::now() + Duration::from_secs(15);
    while !app.pull.stops.listening() {
        assert!(Instant::now() < deadline, "the stop listener never came up");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(app.cancel("acme", &id).await.status().is_success());
    let got = stop_poll(&victim, "victim".into(), "?wait=10s").await;
    assert_eq!(got, json!([id]));
}

#[tokio::test]
async fn lease_polls_count_in_the_tenants_waiter_budget() {
    let app = TestApp::spawn_with(|c| c.api.max_waiters_per_tenant = Some(2)).await;
    let w = Puller::new(&app, "acme", "w").await;
    let mut held = Vec::new();
    for i in 0..2 {
        let p = Puller {
            worker: format!("w{i}"),
            ..w.clone()
        };
        held.push(tokio::spawn(async move {
            p.lease("?wait=30s", json!({})).await
        }));
    }
    polls_waiting(&app, 2).await;
    let res = w
        .post("/api/worker/lease?wait=30s", json!({"worker_id": "w9"}))
        .await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(problem_code(res).await, "tenant_too_many_waiters");
    // A lease that does not wait is not a waiter.
    assert!(w.lease("", json!({})).await.is_empty());
    // Two admissions end both waits.
    for _ in 0..2 {
        app.admit_with("acme", json!({"flow_id": "py.echo"})).await;
    }
    for h in held {
        assert_eq!(h.await.unwrap().len(), 1);
    }
}

#[tokio::test]
async fn the_platform_admin_serves_the_tenants_it_names_fairly() {
    let app = TestApp::spawn().await;
    for t in ["a", "b", "c"] {
        app.create_tenant(t).await;
    }
    for _ in 0..4 {
        for t in ["a", "b", "c"] {
            app.admit_with(t, json!({"flow_id": "py.echo"})).await;
        }
    }
    let res = app
        .client
        .post(app.url("/api/worker/lease"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"worker_id": "ops", "max": 6, "tenants": ["a", "b"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let runs: Value = res.json().await.unwrap();
    let mut per: std::collections::BTreeMap<String, usize> = Default::default();
    for r in runs["runs"].as_array().unwrap() {
        *per.entry(r["tenant_id"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    // Only the named tenants, and (with equal weights) as many of each.
    assert_eq!(
        per,
        [("a".into(), 3), ("b".into(), 3)].into_iter().collect()
    );
    // The platform admin names the run's tenant on a heartbeat.
    let run = &runs["runs"][0];
    let path = format!("/api/worker/runs/{}/heartbeat", id_of(run));
    let body = json!({"worker_id": "ops", "fence": fence_of(run)});
    let res = app
        .client
        .post(app.url(&path))
        .bearer_auth(ADMIN_TOKEN)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(problem_code(res).await, "tenant_required");
    let res = app
        .as_tenant(
            reqwest::Method::POST,
            &path,
            run["tenant_id"].as_str().unwrap(),
        )
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
}

/// The platform admin acts for the tenant `X-Tenant-Id` names, on the pull API as everywhere:
/// its lease serves that tenant only (new work and recovered runs alike), its `tenants` may
/// name no other, and its heartbeats and completions reach that tenant's runs only. Without
/// `X-Tenant-Id` it is a worker of the whole platform. Two tenants of one shard, so nothing
/// but the tenant tells their runs apart.
#[tokio::test]
async fn the_platform_admin_acting_for_a_tenant_serves_only_that_tenant() {
    let app = TestApp::spawn().await;
    let a = "acme".to_owned();
    let b = (0..10_000)
        .map(|i| format!("beta{i}"))
        .find(|t| app.shard(t) == app.shard(&a))
        .expect("a tenant in acme's shard");
    for t in [&a, &b] {
        app.create_tenant(t).await;
    }
    let mut ids: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for _ in 0..2 {
        for t in [&a, &b] {
            let id = app.admit_with(t, json!({"flow_id": "py.echo"})).await;
            ids.entry(t.clone()).or_default().push(id);
        }
    }
    let post = |path: &str, tenant: Option<&str>, body: Value| {
        let req = app.client.post(app.url(path)).bearer_auth(ADMIN_TOKEN);
        match tenant {
            Some(t) => req.header("X-Tenant-Id", t),
            None => req,
        }
        .json(&body)
        .send()
    };
    let runs_of = |answer: Value| -> Vec<Value> { answer["runs"].as_array().unwrap().clone() };

    // Acting for acme: acme's two runs, nothing of beta's, although both wait in one shard.
    let res = post(
        "/api/worker/lease",
        Some(&a),
        json!({"worker_id": "ops", "max": 10}),
    )
    .await
    .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let acme_runs = runs_of(res.json().await.unwrap());
    let got: Vec<String> = acme_runs.iter().map(id_of).collect();
    assert_eq!(got, ids[&a], "{acme_runs:?}");
    // Naming another tenant while acting for acme is refused, and starts nothing.
    let res = post(
        "/api/worker/lease",
        Some(&a),
        json!({"worker_id": "ops", "tenants": [b]}),
    )
    .await
    .unwrap();
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    assert_eq!(problem_code(res).await, "tenant_mismatch");
    assert_eq!(app.execution(&b, &ids[&b][0]).await["status"], "queued");

    // Without X-Tenant-Id: a worker of the whole platform, here the one with work left.
    let acme_ids: Vec<String> = acme_runs.iter().map(id_of).collect();
    let res = post(
        "/api/worker/lease",
        None,
        json!({"worker_id": "ops", "max": 1, "holding": acme_ids}),
    )
    .await
    .unwrap();
    let beta_run = runs_of(res.json().await.unwrap()).remove(0);
    assert_eq!(beta_run["tenant_id"], b.as_str());
    // Its answer was lost (the worker does not name it in `holding`): acting for acme, the
    // same worker id is not handed beta's run, nor new work of beta's...
    let res = post(
        "/api/worker/lease",
        Some(&a),
        json!({"worker_id": "ops", "max": 10, "holding": acme_ids}),
    )
    .await
    .unwrap();
    assert_eq!(runs_of(res.json().await.unwrap()), Vec::<Value>::new());
    // ... while its platform-wide lease recovers it.
    let res = post(
        "/api/worker/lease",
        None,
        json!({"worker_id": "ops", "max": 1, "holding": acme_ids}),
    )
    .await
    .unwrap();
    let recovered = runs_of(res.json().await.unwrap()).remove(0);
    assert_eq!(id_of(&recovered), id_of(&beta_run));
    assert_eq!(recovered["recovered"], true);

    // Heartbeats and completions reach the named tenant's runs only: beta's run, named as
    // acme's, is not this caller's to renew or report (and stays running).
    let beat = json!({"worker_id": "ops", "fence": fence_of(&beta_run)});
    let heartbeat = format!("/api/worker/runs/{}/heartbeat", id_of(&beta_run));
    let complete = format!("/api/worker/runs/{}/complete", id_of(&beta_run));
    let done = json!({"worker_id": "ops", "fence": fence_of(&beta_run), "outcome": "completed"});
    let res = post(&heartbeat, Some(&a), beat.clone()).await.unwrap();
    assert_eq!(res.status(), StatusCode::CONFLICT);
    assert_eq!(problem_code(res).await, "lease_lost");
    let res = post(&complete, Some(&a), done.clone()).await.unwrap();
    assert_eq!(res.status(), StatusCode::CONFLICT);
    assert_eq!(problem_code(res).await, "lease_lost");
    assert_eq!(
        app.execution(&b, &id_of(&beta_run)).await["status"],
        "running"
    );
    // Named as beta's, they are heard.
    let res = post(&heartbeat, Some(&b), beat).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let res = post(&complete, Some(&b), done).await.unwrap();
    assert_eq!(res.json::<Value>().await.unwrap()["result"], "completed");
    // And acme's runs, leased while acting for acme, are acme's to report.
    for run in &acme_runs {
        let res = post(
            &format!("/api/worker/runs/{}/complete", id_of(run)),
            Some(&a),
            json!({"worker_id": "ops", "fence": fence_of(run), "outcome": "completed"}),
        )
        .await
        .unwrap();
        assert_eq!(res.json::<Value>().await.unwrap()["result"], "completed");
    }
}

/// Starts in all of the fairness tests below: 80 leases of one, then 10 of eight.
const FAIR_STARTS: usize = 160;

/// Two tenants of weights 3 and 1 in two shards, each with a backlog of [`FAIR_STARTS`]
/// executions; returns (heavy, light).
async fn heavy_and_light(app: &TestApp) -> (String, String) {
    let heavy = "heavy".to_owned();
    let light = (0..10_000)
        .map(|i| format!("light{i}"))
        .find(|t| app.shard(t) != app.shard(&heavy))
        .expect("a tenant in another shard");
    app.put_tenant(&heavy, &json!({"weight": 3})).await;
    app.put_tenant(&light, &json!({"weight": 1})).await;
    for _ in 0..FAIR_STARTS {
        for t in [&heavy, &light] {
            app.admit_with(t, json!({"flow_id": "py.echo"})).await;
        }
    }
    (heavy, light)
}

/// A platform-wide pull worker (`lease` is the lease body besides `worker_id` and `max`)
/// leases [`FAIR_STARTS`] runs, one at a time and then eight at a time, each completed before
/// the next lease, and checks after each phase that `heavy` had 3/4 of the starts, within
/// what the algorithm guarantees.
///
/// The tolerance is that guarantee, not a margin for luck: each shard's first start comes
/// from asking it while its weight is unknown (one each), and from then on the smooth
/// weighted round robin keeps each shard within one start of its share (its credit stays
/// between minus and plus the total weight; `worker::share` tests it). So after `n` starts
/// the heavy tenant is less than 2 away from 3n/4, whatever the timing.
async fn lease_by_weight(app: &TestApp, lease: Value, heavy: &str, light: &str) {
    let post = |path: &str, tenant: Option<&str>, body: Value| {
        let req = app.client.post(app.url(path)).bearer_auth(ADMIN_TOKEN);
        match tenant {
            Some(t) => req.header("X-Tenant-Id", t),
            None => req,
        }
        .json(&body)
        .send()
    };
    let mut starts: std::collections::BTreeMap<String, usize> = Default::default();
    let mut leased = 0;
    let mut seen = Vec::new();
    for (max, calls) in [(1, FAIR_STARTS / 2), (8, FAIR_STARTS / 16)] {
        for _ in 0..calls {
            let mut body = lease.clone();
            body["worker_id"] = json!("fair");
            body["max"] = json!(max);
            let res = post("/api/worker/lease", None, body).await.unwrap();
            assert_eq!(res.status(), StatusCode::OK);
            let answer: Value = res.json().await.unwrap();
            let runs = answer["runs"].as_array().unwrap().clone();
            assert_eq!(runs.len(), max, "{answer}");
            for run in runs {
                let tenant = run["tenant_id"].as_str().unwrap().to_owned();
                let res = post(
                    &format!("/api/worker/runs/{}/complete", id_of(&run)),
                    Some(&tenant),
                    json!({"worker_id": "fair", "fence": fence_of(&run), "outcome": "completed"}),
                )
                .await
                .unwrap();
                assert_eq!(res.status(), StatusCode::OK);
                *starts.entry(tenant).or_default() += 1;
                leased += 1;
            }
        }
        let got = |t: &str| starts.get(t).copied().unwrap_or(0);
        seen.push((max, leased, got(heavy), got(light)));
        assert_eq!(got(heavy) + got(light), leased, "{starts:?}");
        let due = leased as f64 * 3.0 / 4.0;
        assert!(
            (got(heavy) as f64 - due).abs() < 2.0,
            "after {leased} starts (leases of {max}): {starts:?}, heavy due {due}"
        );
    }
    println!("starts (max, leased, heavy, light): {seen:?}");
}

/// Through the pull API, tenants of different shards share a worker by weight, as through
/// `sluice worker`: a platform-wide pull worker (every tenant, every shard) gives two
/// backlogged tenants of weights 3 and 1 in two shards their starts 3:1.
#[tokio::test]
async fn tenants_of_different_shards_share_a_pull_worker_by_weight() {
    let app = TestApp::spawn().await;
    let (heavy, light) = heavy_and_light(&app).await;
    lease_by_weight(&app, json!({}), &heavy, &light).await;
}

/// A lease that names its tenants shares by their weights only: a tenant of weight 100 with
/// a backlog in the heavy tenant's shard, which this lease does not serve, does not make
/// that shard weigh more for it (each start call answers the weight of the tenants it serves
/// there).
#[tokio::test]
async fn a_lease_naming_its_tenants_shares_by_their_weights_alone() {
    let app = TestApp::spawn().await;
    let (heavy, light) = heavy_and_light(&app).await;
    let crowd = (0..10_000)
        .map(|i| format!("crowd{i}"))
        .find(|t| app.shard(t) == app.shard(&heavy))
        .expect("a tenant in heavy's shard");
    app.put_tenant(&crowd, &json!({"weight": 100})).await;
    for _ in 0..20 {
        app.admit_with(&crowd, json!({"flow_id": "py.echo"})).await;
    }
    lease_by_weight(&app, json!({"tenants": [heavy, light]}), &heavy, &light).await;
    // The crowd waited: nobody served it.
    assert_eq!(app.usage(&crowd).await["running"], 0);
}

#[tokio::test]
async fn serve_alone_recovers_an_expired_pull_lease_and_refuses_its_late_report() {
    let app = TestApp::spawn_with(|c| c.api.orphan_scan_ms = 100).await;
    let w = Puller::new(&app, "acme", "gone").await;
    let id = app
        .admit_with("acme", json!({"flow_id": "py.echo", "max_attempts": 3}))
        .await;
    let first = w.lease("", json!({"lease": "500ms"})).await.remove(0);
    // No heartbeat: the lease expires, and the server's own orphan scan puts it back.
    let e = app
        .wait_for("acme", &id, Duration::from_secs(20), "requeued", |e| {
            e["status"] == "queued"
        })
        .await;
    assert_eq!(e["attempt"], 1);
    let next = Puller {
        worker: "next".into(),
        ..w.clone()
    };
    let second = next.lease("?wait=10s", json!({})).await.remove(0);
    assert_eq!(id_of(&second), id);
    assert_eq!(second["attempt"], 2);
    let res = w
        .complete(
            &id,
            fence_of(&first),
            json!({"outcome": "completed", "output": "late"}),
        )
        .await;
    assert_eq!(res.status(), StatusCode::CONFLICT);
    assert_eq!(problem_code(res).await, "lease_lost");
    let res = next
        .complete(
            &id,
            fence_of(&second),
            json!({"outcome": "completed", "output": "ok"}),
        )
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    let e = app.execution("acme", &id).await;
    assert_eq!(
        (e["status"].as_str(), &e["output"]),
        (Some("completed"), &json!("ok"))
    );
}

/// The example worker under `examples/`, as a child process that prints one JSON line per
/// event.
struct PyWorker {
    child: std::process::Child,
    lines: tokio::sync::mpsc::UnboundedReceiver<Value>,
    /// Every event read so far, for the message of a test that fails.
    seen: Vec<Value>,
}

impl PyWorker {
    fn start(app: &TestApp, token: &str, worker: &str) -> Self {
        use std::io::BufRead;
        let script =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/pull_worker.py");
        let mut child = std::process::Command::new("python3")
            // A SIGABRT dumps every thread's stack (see `diagnose`).
            .args(["-X", "faulthandler"])
            .arg(script)
            .args([
                "--url",
                &app.url(""),
                "--worker-id",
                worker,
                "--lease",
                "1s",
            ])
            .env("SLUICE_TOKEN", token)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .expect("python3 runs (scripts/test.sh installs it)");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = tokio::sync::mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // A line that is not JSON is kept as a string: no event matches it, and a
                // failing test shows it (the worker once interleaved two threads' lines).
                let v = serde_json::from_str::<Value>(&line).unwrap_or(Value::String(line));
                let _ = tx.send(v);
            }
        });
        Self {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// The next event named `event` it prints (within 30 s).
    async fn event(&mut self, event: &str) -> Value {
        self.event_within(event, Duration::from_secs(30)).await
    }

    /// The next event named `event` it prints within `limit`; a failure lists what it printed.
    async fn event_within(&mut self, event: &str, limit: Duration) -> Value {
        let deadline = Instant::now() + limit;
        loop {
            let line = match tokio::time::timeout_at(deadline, self.lines.recv()).await {
                Ok(Some(line)) => line,
                Ok(None) => panic!(
                    "the worker exited before a {event} event; it printed {:?}",
                    self.seen
                ),
                Err(_) => {
                    let why = self.diagnose();
                    panic!(
                        "no {event} event within {limit:?}; it printed {:?}; {why}",
                        self.seen
                    )
                }
            };
            self.seen.push(line.clone());
            if line["event"] == event {
                return line;
            }
        }
    }
}

impl PyWorker {
    /// What a silent worker is doing: each thread's scheduler state and kernel wait, then a
    /// SIGCONT and a SIGABRT, on which `-X faulthandler` prints every Python thread's stack to
    /// the test's stderr.
    fn diagnose(&mut self) -> String {
        let pid = self.child.id();
        let mut threads = Vec::new();
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
            for task in tasks.flatten() {
                let read =
                    |f: &str| std::fs::read_to_string(task.path().join(f)).unwrap_or_default();
                let stat = read("stat");
                let state = stat
                    .rsplit_once(')')
                    .map_or("?", |(_, rest)| &rest.trim_start()[..1]);
                threads.push(format!(
                    "{}: {} in {}",
                    task.file_name().to_string_lossy(),
                    state,
                    read("wchan")
                ));
            }
        }
        for sig in ["-CONT", "-ABRT"] {
            let _ = std::process::Command::new("kill")
                .args([sig, &pid.to_string()])
                .status();
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while matches!(self.child.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        format!("its threads (state, kernel wait): {threads:?}; stacks on stderr")
    }
}

impl Drop for PyWorker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn the_python_example_runs_work_and_a_sigkilled_one_loses_nothing() {
    let app = TestApp::spawn_with(|c| c.api.orphan_scan_ms = 200).await;
    app.create_tenant("acme").await;
    let token = app.key_token("acme", "worker").await;
    let mut first = PyWorker::start(&app, &token, "py-a");
    // Echo and a failure that may be retried, end to end.
    let echo = app
        .admit_with("acme", json!({"flow_id": "py.echo", "params": {"x": 1}}))
        .await;
    let done = app
        .wait_terminal("acme", &echo, Duration::from_secs(30))
        .await;
    assert_eq!(
        (done["status"].as_str(), &done["output"]),
        (Some("completed"), &json!({"x": 1}))
    );
    let failing = app
        .admit_with("acme", json!({"flow_id": "py.fail", "max_attempts": 2}))
        .await;
    let done = app
        .wait_terminal("acme", &failing, Duration::from_secs(30))
        .await;
    assert_eq!(
        (done["status"].as_str(), done["attempt"].as_u64()),
        (Some("failed"), Some(2))
    );
    // A long run, killed in the middle with SIGKILL.
    let slow = app
        .admit_with(
            "acme",
            json!({"flow_id": "py.sleep", "params": {"ms": 2000}, "max_attempts": 3}),
        )
        .await;
    let leased = loop {
        let e = first.event("leased").await;
        if e["id"] == slow.as_str() {
            break e;
        }
    };
    app.wait_running("acme", &slow, 1).await;
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    // Its lease expires; the server puts it back, and another worker runs it.
    let mut second = PyWorker::start(&app, &token, "py-b");
    let done = app
        .wait_terminal("acme", &slow, Duration::from_secs(60))
        .await;
    assert_eq!(done["status"], "completed");
    assert_eq!(done["attempt"], 2);
    let ran = second.event("completed").await;
    assert_eq!(ran["id"], slow.as_str());
    // What the killed worker would have said now is refused.
    let late = Puller {
        url: app.url(""),
        token: token.clone(),
        worker: "py-a".into(),
        client: app.client.clone(),
    };
    let res = late
        .complete(
            &slow,
            leased["fence"].as_u64().unwrap(),
            json!({"outcome": "completed"}),
        )
        .await;
    assert_eq!(res.status(), StatusCode::CONFLICT);
    assert_eq!(problem_code(res).await, "lease_lost");
    assert_eq!(app.execution("acme", &slow).await["status"], "completed");
}

/// On a cluster, a shard moved to another master while a lease long poll waits on it: the
/// server's doorbell reader finds the new master (its read there answers `MOVED`, or ends its
/// block and the next one does), and the poll is answered when work comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_long_poll_follows_its_shard_to_another_master() {
    if !cluster_mode() {
        println!("cluster only (SLUICE_TEST_CLUSTER=1); skipped");
        return;
    }
    let app = TestApp::spawn().await;
    let w = Puller::new(&app, "mover", "w").await;
    // One wait served first, so the reader has read the shard on its first master.
    let waiting = {
        let w = w.clone();
        tokio::spawn(async move { w.lease("?wait=30s", json!({})).await })
    };
    polls_waiting(&app, 1).await;
    let first = app.admit_with("mover", json!({"flow_id": "py.echo"})).await;
    assert_eq!(id_of(&waiting.await.unwrap()[0]), first);
    let shard = app.shard("mover");
    let to = (app.master_of("mover").await + 1) % app.redis.masters();
    let waiting = {
        let w = w.clone();
        tokio::spawn(async move { w.lease("?wait=30s", json!({"holding": [first]})).await })
    };
    polls_waiting(&app, 1).await;
    let args: Vec<String> = app.redis.args();
    let target = app.redis.node_address(to);
    tokio::task::spawn_blocking(move || {
        let out = std::process::Command::new(sluice_bin())
            .args([
                "cluster",
                "move-shard",
                "--shard",
                &shard.number().to_string(),
            ])
            .args(["--to", &target])
            .args(args)
            .env("RUST_LOG", "warn")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    })
    .await
    .unwrap();
    assert_eq!(app.master_of("mover").await, to);
    let second = app.admit_with("mover", json!({"flow_id": "py.echo"})).await;
    let runs = waiting.await.unwrap();
    assert_eq!(
        runs.len(),
        1,
        "the long poll was not woken on the new master"
    );
    assert_eq!(id_of(&runs[0]), second);
}

/// The example worker paused with SIGSTOP past its lease: the server recovers the run,
/// another worker runs it, and when the paused one wakes its heartbeat hears `lease_lost`
/// and its report is refused. The execution completes once, with the second worker's output.
#[tokio::test]
async fn a_paused_python_worker_wakes_to_a_refused_report() {
    let app = TestApp::spawn_with(|c| c.api.orphan_scan_ms = 200).await;
    app.create_tenant("acme").await;
    let token = app.key_token("acme", "worker").await;
    let mut paused = PyWorker::start(&app, &token, "py-paused");
    let id = app
        .admit_with(
            "acme",
            json!({"flow_id": "py.sleep", "params": {"ms": 1500}, "max_attempts": 3}),
        )
        .await;
    let leased = paused.event("leased").await;
    assert_eq!(leased["id"], id.as_str());
    let pid = paused.child.id().to_string();
    let signal = |sig: &str| {
        let ok = std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig} {pid}");
    };
    signal("-STOP");
    // Its lease lapses; the server queues it again.
    app.wait_for("acme", &id, Duration::from_secs(20), "requeued", |e| {
        e["status"] == "queued"
    })
    .await;
    let mut second = PyWorker::start(&app, &token, "py-second");
    let taken = second.event("leased").await;
    assert_eq!(taken["id"], id.as_str());
    // Attempt 2, or 3: the paused worker's long poll was still open on the server, and may
    // have been handed attempt 2, which it could not take (its lease lapsed in turn).
    let attempt = taken["attempt"].as_u64().unwrap();
    assert!((2..=3).contains(&attempt), "{taken}");
    signal("-CONT");
    // Its report is refused; on a loaded machine a report may first fail on its way (the
    // worker prints `report_failed` and tries again, for up to about 35 s).
    let refused = paused
        .event_within("refused", Duration::from_secs(60))
        .await;
    assert_eq!(refused["id"], id.as_str());
    let done = second.event("completed").await;
    assert_eq!(
        (done["id"].as_str(), done["result"].as_str()),
        (Some(id.as_str()), Some("completed"))
    );
    let e = app.execution("acme", &id).await;
    assert_eq!(e["status"], "completed");
    assert_eq!(e["attempt"], attempt);
    assert_eq!(e["output"], json!({"slept_ms": 1500}));
}

/// On a cluster, one master down: a lease that serves tenants on it and on a live master
/// hands out the live one's work (the dead shard is left out for the call), and only a lease
/// whose every shard is down answers 503.
#[tokio::test]
async fn a_lease_goes_on_when_one_master_is_down() {
    if !cluster_mode() {
        println!("cluster only (SLUICE_TEST_CLUSTER=1); skipped");
        return;
    }
    let mut app = TestApp::spawn_with(|c| {
        c.redis.redis_timeout_ms = 1_000;
        c.api.request_timeout_ms = 5_000;
    })
    .await;
    // A tenant on master 0 (the victim) and one on master 1.
    let mut on: Vec<Option<String>> = vec![None; 2];
    for i in 0..1_000 {
        let t = format!("t{i}");
        let m = app.master_of(&t).await;
        if m < 2 && on[m].is_none() {
            on[m] = Some(t);
        }
        if on.iter().all(Option::is_some) {
            break;
        }
    }
    let (victim, live) = (on[0].clone().unwrap(), on[1].clone().unwrap());
    let id = app.admit_with(&live, json!({"flow_id": "py.echo"})).await;
    app.redis.kill_node(0);
    let lease = |body: Value| {
        app.client
            .post(app.url("/api/worker/lease"))
            .bearer_auth(ADMIN_TOKEN)
            .json(&body)
            .send()
    };
    let res = lease(json!({"worker_id": "ops", "max": 5, "tenants": [victim, live]}))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let runs: Value = res.json().await.unwrap();
    let ids: Vec<String> = runs["runs"].as_array().unwrap().iter().map(id_of).collect();
    assert_eq!(ids, vec![id]);
    // A lease that serves only the victim: its only shard is down.
    let res = lease(json!({"worker_id": "ops", "tenants": [victim]}))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
}
