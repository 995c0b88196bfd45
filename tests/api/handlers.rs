//! Handlers through the library runtime (an in-process `Worker`): a Rust handler, and the
//! `http` and `command` kinds of a flows file, against loopback servers and real programs.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::http::StatusCode;
use serde_json::{Value, json};
use sluice::worker::{Context, HandlerError, Registry, Worker, WorkerConfig, load_flows};

use crate::helpers::TestApp;

fn fast() -> WorkerConfig {
    WorkerConfig {
        concurrency: 4,
        lease_ttl: Duration::from_millis(1000),
        heartbeat_interval: Duration::from_millis(100),
        scan_interval: Duration::from_millis(100),
        drain_timeout: Duration::from_millis(500),
        retry_backoff: Duration::from_millis(20),
        ..WorkerConfig::default()
    }
}

/// Runs `registry` in-process until the returned sender is dropped.
async fn run_worker(app: &TestApp, registry: Registry) -> tokio::sync::oneshot::Sender<()> {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let worker = Worker::new(Arc::new(app.store().await), registry, fast());
    tokio::spawn(async move {
        worker
            .run(async {
                let _ = rx.await;
            })
            .await
    });
    tx
}

/// A loopback HTTP service: `/ok` echoes `{"got": params, "attempt": header}`, `/bad` is 400,
/// `/down` is 503, `/text` answers non-JSON.
async fn http_service() -> String {
    use axum::routing::post;
    let app = axum::Router::new()
        .route(
            "/ok",
            post(
                |headers: axum::http::HeaderMap, Json(v): Json<Value>| async move {
                    let attempt = headers["x-sluice-attempt"].to_str().unwrap().to_owned();
                    Json(json!({"got": v, "attempt": attempt}))
                },
            ),
        )
        .route(
            "/bad",
            post(|| async { (StatusCode::BAD_REQUEST, "missing field x") }),
        )
        .route(
            "/down",
            post(|| async { (StatusCode::SERVICE_UNAVAILABLE, "later") }),
        )
        .route("/text", post(|| async { "plain words" }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

#[tokio::test]
async fn a_rust_handler_gets_params_and_attempt_and_its_output_is_stored() {
    let app = TestApp::spawn().await;
    let registry = Registry::new().register("math.add", |ctx: Context| async move {
        let a = ctx.params["a"]
            .as_i64()
            .ok_or_else(|| HandlerError::permanent("a missing"))?;
        let b = ctx.params["b"]
            .as_i64()
            .ok_or_else(|| HandlerError::permanent("b missing"))?;
        Ok(json!({"sum": a + b, "attempt": ctx.attempt, "tenant": ctx.tenant_id}))
    });
    let _stop = run_worker(&app, registry).await;
    let ok = app
        .admit_with(
            "acme",
            json!({"flow_id": "math.add", "params": {"a": 2, "b": 40}}),
        )
        .await;
    let bad = app
        .admit_with("acme", json!({"flow_id": "math.add", "params": {"a": 2}}))
        .await;
    let e = app
        .wait_terminal("acme", &ok, Duration::from_secs(10))
        .await;
    assert_eq!(
        e["output"],
        json!({"sum": 42, "attempt": 1, "tenant": "acme"})
    );
    let e = app
        .wait_terminal("acme", &bad, Duration::from_secs(10))
        .await;
    assert_eq!(e["status"], "failed");
    assert_eq!(
        e["error"],
        json!({"kind": "handler_error", "message": "b missing"})
    );
}

#[tokio::test]
async fn http_and_command_flows_from_a_flows_file() {
    let app = TestApp::spawn().await;
    let base = http_service().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flows.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[flows."svc.ok"]
kind = "http"
url = "{base}/ok"
[flows."svc.bad"]
kind = "http"
url = "{base}/bad"
[flows."svc.down"]
kind = "http"
url = "{base}/down"
[flows."svc.text"]
kind = "http"
url = "{base}/text"
[flows."cmd.cat"]
kind = "command"
program = "cat"
[flows."cmd.exit3"]
kind = "command"
program = "sh"
args = ["-c", "echo oops >&2; exit 3"]
[flows."cmd.slow"]
kind = "command"
program = "sh"
args = ["-c", "sleep 30"]
timeout_secs = 60
[flows."cmd.timeout"]
kind = "command"
program = "sleep"
args = ["30"]
timeout_secs = 1
"#
        ),
    )
    .unwrap();
    let registry = load_flows(Registry::new(), &path).unwrap();
    let _stop = run_worker(&app, registry).await;
    let admit = |flow: &'static str, extra: Value| {
        let mut body = json!({"flow_id": flow, "params": {"n": 7}, "max_attempts": 2});
        if let Some(o) = extra.as_object() {
            for (k, v) in o {
                body[k] = v.clone();
            }
        }
        let app = &app;
        async move { app.admit_with("acme", body).await }
    };
    let ok = admit("svc.ok", json!({})).await;
    let bad = admit("svc.bad", json!({})).await;
    let down = admit("svc.down", json!({})).await;
    let text = admit("svc.text", json!({})).await;
    let cat = admit("cmd.cat", json!({})).await;
    let exit3 = admit("cmd.exit3", json!({})).await;
    let timeout = admit("cmd.timeout", json!({"max_attempts": 1})).await;
    let slow = admit("cmd.slow", json!({})).await;

    let wait = |id: String| {
        let app = &app;
        async move {
            app.wait_terminal("acme", &id, Duration::from_secs(15))
                .await
        }
    };
    let e = wait(ok).await;
    assert_eq!(e["output"], json!({"got": {"n": 7}, "attempt": "1"}));
    let e = wait(bad).await;
    assert_eq!(
        (e["status"].as_str(), e["attempt"].as_u64()),
        (Some("failed"), Some(1)),
        "4xx is not retried"
    );
    assert!(
        e["error"]["message"].as_str().unwrap().contains("400"),
        "{e}"
    );
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("missing field x"),
        "{e}"
    );
    let e = wait(down).await;
    assert_eq!(
        (e["status"].as_str(), e["attempt"].as_u64()),
        (Some("failed"), Some(2)),
        "5xx is retried"
    );
    let e = wait(text).await;
    assert_eq!(e["status"], "failed");
    assert!(
        e["error"]["message"].as_str().unwrap().contains("not JSON"),
        "{e}"
    );
    let e = wait(cat).await;
    assert_eq!(
        e["output"],
        json!({"n": 7}),
        "params went in on stdin and came back on stdout"
    );
    let e = wait(exit3).await;
    assert_eq!(e["status"], "failed");
    let msg = e["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("exit status: 3") && msg.contains("oops"),
        "{msg}"
    );
    let e = wait(timeout).await;
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("timed out"),
        "{e}"
    );

    // Cancelling a running command kills it.
    app.wait_running("acme", &slow, 1).await;
    app.cancel("acme", &slow).await;
    let e = wait(slow).await;
    assert_eq!(e["status"], "cancelled");
}

#[test]
fn a_flows_file_with_a_bad_flow_name_or_url_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flows.toml");
    std::fs::write(
        &path,
        "[flows.\"a b\"]\nkind = \"command\"\nprogram = \"cat\"\n",
    )
    .unwrap();
    assert!(load_flows(Registry::new(), &path).is_err());
    std::fs::write(&path, "[flows.x]\nkind = \"http\"\nurl = \"not a url\"\n").unwrap();
    assert!(load_flows(Registry::new(), &path).is_err());
    assert!(load_flows(Registry::new(), &dir.path().join("missing.toml")).is_err());
}

/// A caller's W3C trace context goes on through sluice: kept with the execution (the first
/// admission's, on a replay), shown by the API, and handed to `http` handlers as headers and to
/// `command` handlers in their environment. One that does not parse is ignored, not refused.
#[tokio::test]
async fn the_callers_trace_context_reaches_http_and_command_handlers() {
    use axum::routing::post;
    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const OTHER_TP: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let app = TestApp::spawn().await;
    let service = axum::Router::new().route(
        "/trace",
        post(|headers: axum::http::HeaderMap| async move {
            Json(crate::helpers::trace_headers(&headers))
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, service).await });
    let (_dir, path) = crate::helpers::flows_file(&format!(
        r#"
[flows."svc.trace"]
kind = "http"
url = "http://{addr}/trace"
[flows."cmd.trace"]
kind = "command"
program = "sh"
args = ["-c", "printf '{{\"traceparent\":\"%s\",\"tracestate\":\"%s\"}}' \"$TRACEPARENT\" \"$TRACESTATE\""]
"#
    ));
    let admit =
        |flow: &'static str, key: &'static str, tp: &'static str, ts: Option<&'static str>| {
            let app = &app;
            async move {
                let mut req = app
                    .as_tenant(reqwest::Method::POST, "/api/executions", "acme")
                    .header("traceparent", tp)
                    .header("idempotency-key", key)
                    .json(&json!({"flow_id": flow}));
                if let Some(ts) = ts {
                    req = req.header("tracestate", ts);
                }
                let res = req.send().await.unwrap();
                let status = res.status();
                (status, res.json::<Value>().await.unwrap())
            }
        };
    // Admitted with a context: the answer shows it.
    let (status, http) = admit("svc.trace", "t-http", TP, Some("congo=t61rcWkgMzE")).await;
    assert_eq!(status, StatusCode::CREATED, "{http}");
    assert_eq!(
        (&http["traceparent"], &http["tracestate"]),
        (&json!(TP), &json!("congo=t61rcWkgMzE"))
    );
    // A replay from another trace is still a replay, and keeps the first context.
    let (status, again) = admit("svc.trace", "t-http", OTHER_TP, None).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["execution_id"], http["execution_id"]);
    assert_eq!(again["traceparent"], json!(TP));
    let (_, cmd) = admit(
        "cmd.trace",
        "t-cmd",
        OTHER_TP,
        Some("rojo=00f067aa0ba902b7"),
    )
    .await;
    // Not a traceparent: admitted all the same, without a context (tracestate dropped too).
    let (status, none) = admit(
        "cmd.trace",
        "t-none",
        "00-zz-00f067aa0ba902b7-01",
        Some("a=b"),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{none}");
    assert_eq!(
        (&none["traceparent"], &none["tracestate"]),
        (&Value::Null, &Value::Null)
    );

    let registry = load_flows(Registry::new(), &path).unwrap();
    let _stop = run_worker(&app, registry).await;
    let output = |e: &Value| {
        let id = e["execution_id"].as_str().unwrap().to_owned();
        let app = &app;
        async move {
            let done = app
                .wait_terminal("acme", &id, Duration::from_secs(15))
                .await;
            assert_eq!(done["status"], "completed", "{done}");
            done["output"].clone()
        }
    };
    assert_eq!(
        output(&http).await,
        json!({"traceparent": TP, "tracestate": "congo=t61rcWkgMzE"}),
        "the http handler got the headers"
    );
    assert_eq!(
        output(&cmd).await,
        json!({"traceparent": OTHER_TP, "tracestate": "rojo=00f067aa0ba902b7"}),
        "the command got the environment"
    );
    assert_eq!(
        output(&none).await,
        json!({"traceparent": "", "tracestate": ""}),
        "no context: none handed on"
    );
    // Read back from the row, as every later reader sees it.
    let got = app
        .get_json(
            Some("acme"),
            &format!("/api/executions/{}", http["execution_id"].as_str().unwrap()),
        )
        .await;
    assert_eq!(
        (&got["traceparent"], &got["tracestate"]),
        (&json!(TP), &json!("congo=t61rcWkgMzE"))
    );
}
