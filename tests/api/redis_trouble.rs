//! Redis trouble: a stopped Redis answers 503 + Retry-After quickly (no hang), a Redis that
//! comes back is used again without restarting sluice, flushed scripts reload themselves, and
//! an admission whose answer was lost is settled: a 503 `redis_unavailable` means nothing was
//! admitted, also when the stalled script would have run later.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{TestApp, problem_code};

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
    // The first admission may find the old connection half dead: whether its script was sent
    // cannot be told, and the answer says so, naming the id it would have had.
    let res = app
        .post_execution("acme", &json!({"flow_id": "demo.echo"}))
        .await;
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(res.headers().contains_key("retry-after"));
    let problem: Value = res.json().await.unwrap();
    let unknown = match problem["code"].as_str().unwrap() {
        "redis_unavailable" => None,
        "admission_outcome_unknown" => Some(problem["execution_id"].as_str().unwrap().to_owned()),
        other => panic!("unexpected code {other}"),
    };
    for res in [
        app.post_execution("acme", &json!({"flow_id": "demo.echo"}))
            .await,
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
    // The AOF brought the earlier execution back, and it is served again.
    let got = app.execution("acme", &id).await;
    assert_eq!(got["execution_id"], before["execution_id"]);
    // Redis was dead before that admission was sent: it cannot have happened.
    if let Some(unknown) = unknown {
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
    let _: () = app
        .redis
        .query(redis::cmd("CLIENT").arg("PAUSE").arg(4_000).arg("ALL"))
        .await;
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
            assert_eq!(e["queue_state"], "dispatched");
            let entries: Vec<(String, Vec<String>)> = app
                .redis
                .query(
                    redis::cmd("XRANGE")
                        .arg(app.shard("acme").ready())
                        .arg("-")
                        .arg("+"),
                )
                .await;
            assert!(
                entries.iter().any(|(_, f)| f.contains(&named)),
                "admitted without its queue entry"
            );
        }
        StatusCode::NOT_FOUND => {}
        other => panic!("looking up the named execution answered {other}"),
    }
}

/// Bug 3 of issue 8: the admission script was stalled in Redis past the time-out, the client
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
        let _: () = app
            .redis
            .query(redis::cmd("CLIENT").arg("PAUSE").arg(pause_ms).arg("WRITE"))
            .await;
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
async fn admission_survives_script_flush() {
    let app = TestApp::spawn().await;
    app.admit("acme", "demo.echo").await;
    let _: () = app.redis.query(redis::cmd("SCRIPT").arg("FLUSH")).await;
    let e = app.admit("acme", "demo.echo").await;
    let id = e["execution_id"].as_str().unwrap();
    assert_eq!(app.cancel("acme", id).await.status(), StatusCode::OK);
    let _: () = app.redis.query(redis::cmd("SCRIPT").arg("FLUSH")).await;
    let res = app.client.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let page = app.page("acme", "").await;
    assert_eq!(page["total"], 2);
}
