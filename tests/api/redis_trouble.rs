//! Redis trouble: a stopped Redis answers 503 + Retry-After quickly (no hang), a Redis that
//! comes back is used again without restarting sluice, and flushed scripts reload themselves.

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
    let code = problem_code(res).await;
    assert!(
        code == "redis_unavailable" || code == "request_timeout",
        "{code}"
    );
    // After the pause, service resumes on its own.
    admit_when_back(&app, Duration::from_secs(15)).await;
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
