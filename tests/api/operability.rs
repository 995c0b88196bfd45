//! What an operator and a browser console see: metrics, CORS, Swagger UI, request ids in the
//! answer and in the logs, and the header-read timeout against slow clients.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::helpers::{ADMIN_TOKEN, METRICS_TOKEN, TestApp, TestRedis, free_port, sluice_bin};

/// The value of the one sample named `series` (name and labels exactly as exposed).
pub(crate) fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

#[tokio::test]
async fn metrics_count_admissions_per_tenant_and_show_queue_depth() {
    let app = TestApp::spawn().await;
    let body = json!({"flow_id": "demo.echo"});
    for _ in 0..2 {
        assert_eq!(
            app.post_execution("acme", &body).await.status(),
            StatusCode::CREATED
        );
    }
    assert_eq!(
        app.post_with_key("acme", "k1", &body).await.status(),
        StatusCode::CREATED
    );
    assert_eq!(
        app.post_with_key("acme", "k1", &body).await.status(),
        StatusCode::OK
    );
    let other = json!({"flow_id": "demo.other"});
    assert_eq!(
        app.post_with_key("acme", "k1", &other).await.status(),
        StatusCode::UNPROCESSABLE_ENTITY
    );
    app.put_tenant("beta", &json!({"enabled": false})).await;
    assert_eq!(
        app.post_execution("beta", &body).await.status(),
        StatusCode::FORBIDDEN
    );
    app.put_tenant("gamma", &json!({"max_concurrent": 0, "max_queued": 0}))
        .await;
    assert_eq!(
        app.post_execution("gamma", &body).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );

    let res = app
        .client
        .get(app.url("/metrics"))
        .bearer_auth(METRICS_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let ct = res.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(ct.starts_with("application/openmetrics-text"), "{ct}");
    let text = res.text().await.unwrap();
    let want = [
        (
            r#"sluice_admissions_total{tenant="acme",outcome="admitted"}"#,
            3.0,
        ),
        (
            r#"sluice_admissions_total{tenant="acme",outcome="deduplicated"}"#,
            1.0,
        ),
        (
            r#"sluice_admissions_total{tenant="acme",outcome="conflict"}"#,
            1.0,
        ),
        (
            r#"sluice_admissions_rejected_total{tenant="beta",reason="tenant_disabled"}"#,
            1.0,
        ),
        (
            r#"sluice_admissions_rejected_total{tenant="gamma",reason="queue_full"}"#,
            1.0,
        ),
        (
            r#"sluice_http_request_duration_seconds_count{method="POST",route="/api/executions",status="201"}"#,
            3.0,
        ),
    ];
    for (series, value) in want {
        assert_eq!(sample(&text, series), Some(value), "{series} in\n{text}");
    }
    // Queue depth: acme's three executions are queued in its shard (runnable, none started,
    // no worker); every shard has a gauge (the 16 hashed ones and the 2 dedicated ones).
    let shard = app.shard("acme").label();
    assert_eq!(
        sample(&text, &format!(r#"sluice_queue_depth{{shard="{shard}"}}"#)),
        Some(3.0),
        "{text}"
    );
    assert_eq!(text.matches("sluice_queue_depth{").count(), 18);
}

#[tokio::test]
async fn cors_is_off_by_default() {
    let app = TestApp::spawn().await;
    let res = app
        .client
        .request(reqwest::Method::OPTIONS, app.url("/api/executions"))
        .header("Origin", "http://console.example")
        .header("Access-Control-Request-Method", "POST")
        .send()
        .await
        .unwrap();
    assert!(!res.headers().contains_key("access-control-allow-origin"));
}

#[tokio::test]
async fn cors_preflight_allows_configured_origins_only() {
    let origin = "http://console.example:3000";
    let app = TestApp::spawn_with(|c| c.api.cors_origins = vec![origin.into()]).await;
    let preflight = |from: &'static str| {
        app.client
            .request(reqwest::Method::OPTIONS, app.url("/api/executions"))
            .header("Origin", from)
            .header("Access-Control-Request-Method", "POST")
            .header(
                "Access-Control-Request-Headers",
                "authorization,content-type,idempotency-key",
            )
            .send()
    };
    let res = preflight(origin).await.unwrap();
    assert!(res.status().is_success(), "{}", res.status());
    let h = res.headers();
    assert_eq!(h["access-control-allow-origin"], origin);
    let methods = h["access-control-allow-methods"].to_str().unwrap();
    assert!(
        methods.contains("POST") && methods.contains("DELETE"),
        "{methods}"
    );
    let headers = h["access-control-allow-headers"].to_str().unwrap();
    for name in [
        "authorization",
        "content-type",
        "idempotency-key",
        "x-tenant-id",
    ] {
        assert!(headers.contains(name), "{headers}");
    }

    let res = preflight("http://evil.example").await.unwrap();
    assert!(!res.headers().contains_key("access-control-allow-origin"));

    // The actual call carries the header too, and exposes what a console needs to read.
    let res = app
        .as_tenant(reqwest::Method::POST, "/api/executions", "acme")
        .header("Origin", origin)
        .json(&json!({"flow_id": "demo.echo"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    assert_eq!(res.headers()["access-control-allow-origin"], origin);
    let exposed = res.headers()["access-control-expose-headers"]
        .to_str()
        .unwrap()
        .to_lowercase();
    assert!(
        exposed.contains("location") && exposed.contains("x-request-id"),
        "{exposed}"
    );
}

#[tokio::test]
async fn swagger_ui_is_served_from_the_binary() {
    let app = TestApp::spawn().await;
    let res = app.client.get(app.url("/docs/")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let html = res.text().await.unwrap();
    assert!(html.contains("swagger-ui"), "{html}");
    let init = app
        .client
        .get(app.url("/docs/swagger-initializer.js"))
        .send()
        .await
        .unwrap();
    assert_eq!(init.status(), StatusCode::OK);
    assert!(init.text().await.unwrap().contains("/openapi.json"));
    let bundle = app
        .client
        .get(app.url("/docs/swagger-ui-bundle.js"))
        .send()
        .await
        .unwrap();
    assert_eq!(bundle.status(), StatusCode::OK);
    assert!(bundle.bytes().await.unwrap().len() > 100_000);
}

#[tokio::test]
async fn a_client_that_trickles_its_headers_is_disconnected() {
    let app = TestApp::spawn_with(|c| c.api.header_read_timeout_ms = 300).await;
    let mut slow = tokio::net::TcpStream::connect(app.addr).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: sluice\r\n")
        .await
        .unwrap();
    // The server must close the connection well before this bound; it never answers 200.
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), slow.read_to_end(&mut buf)).await;
    let closed = matches!(read, Ok(Ok(_)) | Ok(Err(_)));
    assert!(closed, "the slow connection was not closed");
    assert!(!String::from_utf8_lossy(&buf).contains("200 OK"));
    // A normal client is unaffected.
    let res = app.client.get(app.url("/healthz")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
}

/// The request id and problem+json wrap every answer, also those the router makes itself
/// (no route, a method the route lacks, a body over the limit) and those of `/docs`, and an
/// admission's: the layers that give them wrap the whole router, not only its routes.
#[tokio::test]
async fn every_answer_carries_its_request_id_also_the_routers_own() {
    let app = TestApp::spawn_with(|c| c.api.body_limit = 4096).await;
    let big = json!({"flow_id": "demo.echo", "params": {"blob": "x".repeat(8192)}});
    let cases = [
        (
            reqwest::Method::GET,
            "/api/nothing-here",
            None,
            StatusCode::NOT_FOUND,
        ),
        (
            reqwest::Method::PATCH,
            "/api/executions",
            None,
            StatusCode::METHOD_NOT_ALLOWED,
        ),
        (
            reqwest::Method::POST,
            "/api/executions",
            Some(big),
            StatusCode::PAYLOAD_TOO_LARGE,
        ),
        (
            reqwest::Method::POST,
            "/api/executions",
            Some(json!({"flow_id": "demo.echo"})),
            StatusCode::CREATED,
        ),
        (reqwest::Method::GET, "/docs/", None, StatusCode::OK),
        (reqwest::Method::GET, "/healthz", None, StatusCode::OK),
    ];
    for (i, (method, path, body, status)) in cases.into_iter().enumerate() {
        let id = format!("req-{i}");
        let mut req = app
            .as_tenant(method.clone(), path, "acme")
            .header("X-Request-Id", &id);
        if let Some(body) = &body {
            req = req.json(body);
        }
        let res = req.send().await.unwrap();
        assert_eq!(res.status(), status, "{method} {path}");
        assert_eq!(
            res.headers()["x-request-id"],
            id.as_str(),
            "{method} {path}"
        );
        if status.is_client_error() {
            assert_eq!(
                res.headers()["content-type"],
                "application/problem+json",
                "{method} {path}"
            );
        }
        // Without one the server makes one up, for every answer alike.
        let mut req = app.as_tenant(method.clone(), path, "acme");
        if let Some(body) = &body {
            req = req.json(body);
        }
        let res = req.send().await.unwrap();
        assert_eq!(res.status(), status, "{method} {path}");
        let made_up = res.headers()["x-request-id"].to_str().unwrap();
        assert_eq!(made_up.len(), 36, "{method} {path}: {made_up}");
    }
}

#[tokio::test]
async fn the_request_id_is_returned_and_in_the_logs() {
    let redis = TestRedis::start().await;
    let port = free_port();
    let (mut child, rx) = serve_with_json_log(&redis, port, "info,tower_http=debug");
    let client = sluice::tls::client_builder(&[]).unwrap().build().unwrap();
    let url = format!("http://127.0.0.1:{port}/api/executions");
    // Wait until the server answers (it logs and binds quickly).
    let mut res = None;
    for _ in 0..100 {
        match client
            .get(&url)
            .bearer_auth(ADMIN_TOKEN)
            .header("X-Tenant-Id", "acme")
            .header("X-Request-Id", "req-from-the-test-42")
            .send()
            .await
        {
            Ok(r) => {
                res = Some(r);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let res = res.expect("sluice serve answered");
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["x-request-id"], "req-from-the-test-42");
    // Without one, the server makes one up and returns it.
    let res = client
        .get(format!("http://127.0.0.1:{port}/healthz"))
        .send()
        .await
        .unwrap();
    let made_up = res.headers()["x-request-id"].to_str().unwrap().to_owned();
    assert_eq!(made_up.len(), 36, "{made_up}");

    // Each id, the client's and the made-up one, names its request's span in the log.
    let mut lines = Vec::new();
    for id in ["req-from-the-test-42", made_up.as_str()] {
        lines.push(loop {
            let line = rx
                .recv_timeout(Duration::from_secs(10))
                .expect("a log line with the request id");
            if line.contains(id) {
                break line;
            }
        });
        let log: serde_json::Value = serde_json::from_str(lines.last().unwrap()).unwrap();
        assert_eq!(log["span"]["request_id"], id, "{lines:?}");
    }
    let _ = child.kill();
    let _ = child.wait();
    let line = lines.join("\n");
    assert!(
        !line.contains(ADMIN_TOKEN),
        "the token leaked into the log: {line}"
    );
}

/// Series of `metric` in an exposition.
fn series<'a>(text: &'a str, metric: &str) -> Vec<&'a str> {
    text.lines()
        .filter(|l| l.starts_with(metric) && !l.starts_with('#'))
        .collect()
}

#[tokio::test]
async fn metric_labels_come_from_closed_sets() {
    let app = TestApp::spawn_with(|c| c.api.metrics_tenant_limit = 2).await;
    // Any token is a legal HTTP method: none of them may become a label value.
    for i in 0..40 {
        let method = reqwest::Method::from_bytes(format!("M{i}X").as_bytes()).unwrap();
        let res = app
            .client
            .request(method, app.url("/api/executions"))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::METHOD_NOT_ALLOWED);
    }
    let long = reqwest::Method::from_bytes("L".repeat(10_000).as_bytes()).unwrap();
    let res = app
        .client
        .request(long, app.url("/x"))
        .send()
        .await
        .unwrap();
    assert!(res.status().is_client_error());
    // Tenants beyond the limit share one label value.
    for tenant in ["t1", "t2", "t3", "t4"] {
        app.admit(tenant, "demo.echo").await;
    }
    let text = app.metrics().await;
    let latency = series(&text, "sluice_http_request_duration_seconds_count");
    assert!(
        latency
            .iter()
            .all(|l| !l.contains("M1X") && !l.contains("LLLL")),
        "{latency:#?}"
    );
    assert!(
        latency
            .iter()
            .any(|l| l.contains(r#"method="other",route="/api/executions",status="405""#)),
        "{latency:#?}"
    );
    let admitted = series(&text, "sluice_admissions_total");
    let want = [
        r#"sluice_admissions_total{tenant="t1",outcome="admitted"} 1"#,
        r#"sluice_admissions_total{tenant="t2",outcome="admitted"} 1"#,
        r#"sluice_admissions_total{tenant="_other",outcome="admitted"} 2"#,
    ];
    let mut got = admitted.clone();
    got.sort();
    let mut want = want.to_vec();
    want.sort();
    assert_eq!(got, want);
    assert!(text.len() < 64 * 1024, "{} bytes", text.len());

    // A deleted tenant's series go, and its label is free for another tenant.
    app.put_tenant("t1", &json!({})).await;
    let res = app
        .client
        .delete(app.url("/api/tenants/t1"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    app.admit("t5", "demo.echo").await;
    let text = app.metrics().await;
    let admitted = series(&text, "sluice_admissions_total");
    assert!(
        !admitted.iter().any(|l| l.contains(r#""t1""#)),
        "{admitted:#?}"
    );
    assert!(
        admitted.iter().any(|l| l.contains(r#""t5""#)),
        "{admitted:#?}"
    );
}

#[tokio::test]
async fn metrics_can_require_their_own_token() {
    let app = TestApp::spawn_with(|c| c.api.metrics_token = Some("scrape-secret".into())).await;
    let get = |token: Option<&'static str>| {
        let mut req = app.client.get(app.url("/metrics"));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        req.send()
    };
    for token in [None, Some(ADMIN_TOKEN), Some("scrape-secreT")] {
        let res = get(token).await.unwrap();
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED, "{token:?}");
        assert_eq!(res.headers()["www-authenticate"], "Bearer");
        assert_eq!(crate::helpers::problem_code(res).await, "unauthorized");
    }
    let res = get(Some("scrape-secret")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert!(res.text().await.unwrap().contains("sluice_queue_depth"));
    // The probes stay open.
    let res = app.client.get(app.url("/healthz")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
}

/// By default `/metrics` names no tenant to anybody: on the API's address it needs the
/// metrics token, and without one configured it answers 401 to every caller — the platform
/// admin token and a tenant admin's key included (neither is a scraper's credential). Only
/// `--metrics-open` (or dev auth, or its own address) serves it without a token, and
/// `--metrics-open` beside `--metrics-token` stops the server at start.
#[tokio::test]
async fn metrics_need_their_token_by_default_and_are_opened_only_on_purpose() {
    let app = TestApp::spawn_with(|c| c.api.metrics_token = None).await;
    app.create_tenant("acme").await;
    app.admit("acme", "demo.echo").await;
    let tenant_admin = app.key_token("acme", "admin").await;
    for token in [None, Some(ADMIN_TOKEN), Some(tenant_admin.as_str())] {
        let mut req = app.client.get(app.url("/metrics"));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let res = req.send().await.unwrap();
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED, "{token:?}");
        assert_eq!(res.headers()["www-authenticate"], "Bearer");
        let ct = res.headers()["content-type"].to_str().unwrap().to_owned();
        assert_eq!(ct, "application/problem+json");
        let body = res.text().await.unwrap();
        assert!(body.contains(r#""code":"unauthorized""#), "{body}");
        assert!(!body.contains("acme"), "a tenant named: {body}");
    }
    // Opened on purpose: anyone reads it.
    let open = TestApp::spawn_with(|c| {
        c.api.metrics_token = None;
        c.api.metrics_open = true;
    })
    .await;
    open.admit("acme", "demo.echo").await;
    let res = open.client.get(open.url("/metrics")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert!(res.text().await.unwrap().contains(r#"tenant="acme""#));
    // Dev auth: every caller is the platform admin already.
    let dev = TestApp::spawn_with(|c| {
        c.api.metrics_token = None;
        c.api.dev_auth = true;
    })
    .await;
    let res = dev.client.get(dev.url("/metrics")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    // Open and a token at once make no sense: refused at start.
    let mut config = sluice::config::AppConfig {
        api: sluice::config::ApiSettings::defaults(),
        redis: app.redis.settings(),
    };
    config.api.listen = "127.0.0.1:0".parse().unwrap();
    config.api.metrics_open = true;
    config.api.metrics_token = Some("scrape-secret".into());
    let refused = sluice::Application::build(config)
        .await
        .err()
        .expect("refused");
    assert!(
        refused.to_string().contains("--metrics-open"),
        "{refused:#}"
    );
}

#[tokio::test]
async fn metrics_can_have_their_own_address() {
    // No token: on its own address the operator chose who reaches it.
    let app = TestApp::spawn_with(|c| {
        c.api.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
        c.api.metrics_token = None;
    })
    .await;
    let res = app.client.get(app.url("/metrics")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    assert_eq!(crate::helpers::problem_code(res).await, "route_not_found");
    let own = app.metrics_addr.expect("a metrics address");
    assert_ne!(own, app.addr);
    let res = app
        .client
        .get(format!("http://{own}/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert!(res.text().await.unwrap().contains("sluice_queue_depth"));
    // Only /metrics there: the API is not reachable through it.
    let res = app
        .client
        .get(format!("http://{own}/api/executions"))
        .bearer_auth(ADMIN_TOKEN)
        .header("X-Tenant-Id", "acme")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
}

/// `/docs` carries a Content-Security-Policy, refuses framing and MIME sniffing, and the page
/// still works under it: every file it references is served from the binary on this origin
/// (with the same headers), and it has no inline script the policy would block.
#[tokio::test]
async fn swagger_ui_is_locked_down_and_still_loads_its_files() {
    let app = TestApp::spawn().await;
    let check = |res: &reqwest::Response| {
        let h = res.headers();
        let csp = h["content-security-policy"].to_str().unwrap().to_owned();
        assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
        assert!(csp.contains("script-src 'self'"), "{csp}");
        assert!(!csp.contains("unsafe-eval"), "{csp}");
        assert!(csp.contains("connect-src 'self'"), "{csp}");
        assert_eq!(h["x-frame-options"], "DENY");
        assert_eq!(h["x-content-type-options"], "nosniff");
    };
    let res = app.client.get(app.url("/docs/")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    check(&res);
    let html = res.text().await.unwrap();
    // Only scripts from files: an inline one would be blocked by `script-src 'self'`.
    for tag in html.split("<script").skip(1) {
        let open = tag.split('>').next().unwrap();
        assert!(open.contains("src="), "an inline script: <script{open}>");
    }
    // Every file the page references: relative (this origin), served from the binary.
    let mut files = Vec::new();
    for attr in ["src=\"", "href=\""] {
        for part in html.split(attr).skip(1) {
            let target = part.split('"').next().unwrap();
            assert!(!target.contains("//"), "loaded from elsewhere: {target}");
            files.push(target.trim_start_matches("./").to_owned());
        }
    }
    assert!(files.len() >= 5, "{files:?}");
    for file in files {
        let res = app
            .client
            .get(app.url(&format!("/docs/{file}")))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{file}");
        check(&res);
        assert!(!res.bytes().await.unwrap().is_empty(), "{file}");
    }
}

/// What `sluice serve` logs on `redis` up to the line that follows its store's connection
/// (the note on how `/metrics` answers, logged by `App::build` after `Store::connect`).
fn start_log(redis: &TestRedis) -> Vec<String> {
    let (mut child, rx) = serve_with_json_log(redis, free_port(), "info");
    let mut lines = Vec::new();
    // Bounded: a start logs a few lines; each wait is bounded too.
    for _ in 0..1_000 {
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("no '/metrics answers' line after: {lines:#?}"));
        let done = line.contains("/metrics answers");
        lines.push(line);
        if done {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    lines
}

/// sluice needs `maxmemory-policy noeviction` (docs/operations.md): a server started on a
/// Redis whose masters may evict says so at start, naming the policy; on `noeviction` (Redis's
/// default) it says nothing of it.
#[tokio::test]
async fn a_redis_that_may_evict_keys_is_named_in_the_start_log() {
    let redis = TestRedis::start().await;
    let quiet = start_log(&redis);
    assert!(
        !quiet.iter().any(|l| l.contains("maxmemory-policy")),
        "{quiet:#?}"
    );
    // One master that may evict is enough (on a cluster, the last).
    let mut node = redis.node_conn(redis.masters() - 1).await;
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("allkeys-lru")
        .query_async(&mut node)
        .await
        .unwrap();
    let loud = start_log(&redis);
    let warning = loud
        .iter()
        .find(|l| l.contains("maxmemory-policy"))
        .unwrap_or_else(|| panic!("no warning of the policy: {loud:#?}"));
    let event: serde_json::Value = serde_json::from_str(warning).unwrap();
    assert_eq!(event["level"], "WARN", "{warning}");
    assert_eq!(event["fields"]["policy"], "allkeys-lru", "{warning}");
    assert_eq!(
        event["fields"]["masters"],
        redis.masters() as u64,
        "{warning}"
    );
    assert!(warning.contains("needs noeviction"), "{warning}");
}

/// `sluice serve` on `redis` at 127.0.0.1:`port`, logging JSON at `rust_log`; its log lines
/// arrive on the receiver as it writes them.
fn serve_with_json_log(
    redis: &TestRedis,
    port: u16,
    rust_log: &str,
) -> (std::process::Child, std::sync::mpsc::Receiver<String>) {
    let mut child = Command::new(sluice_bin())
        .args(["--log-format", "json", "serve", "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .args(redis.args())
        .env("SLUICE_ADMIN_TOKEN", ADMIN_TOKEN)
        .env("RUST_LOG", rust_log)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    (child, rx)
}
