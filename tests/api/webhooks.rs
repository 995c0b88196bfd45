//! Webhooks: every terminal change of a tenant's executions reaches its receiver, signed, at
//! least once and in sequence per execution — through a failing receiver, a refused address
//! and `serve` killed mid-delivery.
//!
//! Long on purpose: a list of independent tests of one delivery contract (signed, at least
//! once, in order), each attacking it differently; they share the receiver fixture at the top.

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use reqwest::Response;
use serde_json::{Value, json};

use crate::helpers::{
    ADMIN_TOKEN, TestApp, TestRedis, TestServe, TestWorker, free_port, problem_code, sluice_bin,
};
use crate::operability::sample;

/// One POST the receiver got.
#[derive(Debug, Clone)]
struct Received {
    /// When it arrived.
    at: Instant,
    id: String,
    timestamp: String,
    signature: String,
    body: Vec<u8>,
}

impl Received {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

#[derive(Default)]
struct Inbox {
    got: Vec<Received>,
    /// Answer 500 to this many requests first.
    fail_first: usize,
    /// Hold each request this long before answering.
    delay: Duration,
}

/// Whether the receiver answers (a closed gate holds every request, recorded, unanswered).
type Gate = tokio::sync::watch::Sender<bool>;

/// A webhook receiver on a free loopback port: it records every POST.
/// Records each POST as it arrives, then answers (once its gate is open).
#[derive(Clone)]
struct Receiver {
    url: String,
    inbox: Arc<Mutex<Inbox>>,
    gate: Arc<Gate>,
}

impl Receiver {
    async fn start(fail_first: usize, delay: Duration) -> Self {
        Self::start_with(fail_first, delay, None).await
    }

    /// The same over HTTPS, with the certificate `tls` presents.
    async fn start_tls(tls: tokio_rustls::TlsAcceptor) -> Self {
        Self::start_with(0, Duration::ZERO, Some(tls)).await
    }

    async fn start_with(
        fail_first: usize,
        delay: Duration,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) -> Self {
        let inbox = Arc::new(Mutex::new(Inbox {
            fail_first,
            delay,
            ..Inbox::default()
        }));
        let gate = Arc::new(tokio::sync::watch::channel(true).0);
        type Shared = (Arc<Mutex<Inbox>>, Arc<Gate>);
        async fn take(
            State((inbox, gate)): State<Shared>,
            headers: HeaderMap,
            body: axum::body::Bytes,
        ) -> StatusCode {
            let header = |n: &str| {
                headers
                    .get(n)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_owned()
            };
            let (delay, fail) = {
                let mut inbox = inbox.lock().unwrap();
                inbox.got.push(Received {
                    at: Instant::now(),
                    id: header("webhook-id"),
                    timestamp: header("webhook-timestamp"),
                    signature: header("webhook-signature"),
                    body: body.to_vec(),
                });
                let fail = inbox.fail_first > 0;
                inbox.fail_first = inbox.fail_first.saturating_sub(1);
                (inbox.delay, fail)
            };
            let _ = gate.subscribe().wait_for(|open| *open).await;
            tokio::time::sleep(delay).await;
            if fail {
                StatusCode::INTERNAL_SERVER_ERROR
            } else {
                StatusCode::NO_CONTENT
            }
        }
        let app = axum::Router::new()
            .route("/hook", axum::routing::post(take))
            .with_state((inbox.clone(), gate.clone()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let Some(tls) = tls else {
            tokio::spawn(async move { axum::serve(listener, app).await });
            return Self {
                url: format!("http://{addr}/hook"),
                inbox,
                gate,
            };
        };
        // Lives as long as the test's runtime, like `axum::serve`.
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (tls, app) = (tls.clone(), app.clone());
                tokio::spawn(async move {
                    // A client that does not trust the certificate ends here.
                    let Ok(stream) = tls.accept(tcp).await else {
                        return;
                    };
                    let _ = hyper_util::server::conn::auto::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    )
                    .serve_connection(
                        hyper_util::rt::TokioIo::new(stream),
                        hyper_util::service::TowerToHyperService::new(app),
                    )
                    .await;
                });
            }
        });
        Self {
            url: format!("https://{addr}/hook"),
            inbox,
            gate,
        }
    }

    /// Holds (false) or lets through (true) every answer.
    fn answer(&self, open: bool) {
        self.gate.send_replace(open);
    }

    fn got(&self) -> Vec<Received> {
        self.inbox.lock().unwrap().got.clone()
    }

    /// Waits (at most `limit`) until `done` holds of what arrived; what arrived then.
    async fn until(
        &self,
        limit: Duration,
        what: &str,
        done: impl Fn(&[Received]) -> bool,
    ) -> Vec<Received> {
        let deadline = Instant::now() + limit;
        loop {
            let got = self.got();
            if done(&got) {
                return got;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not within {limit:?}; got {:?}",
                got.iter().map(Received::json).collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// `acme`'s webhook as `GET` shows it, once `done` holds of it (within `limit`).
async fn webhook_once(
    app: &TestApp,
    limit: Duration,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + limit;
    loop {
        let w = app.get_json(None, "/api/tenants/acme/webhook").await;
        if done(&w) {
            return w;
        }
        assert!(Instant::now() < deadline, "{what}: {w}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Distinct `webhook-id`s received.
fn ids(got: &[Received]) -> BTreeSet<String> {
    got.iter().map(|r| r.id.clone()).collect()
}

async fn put_webhook(app: &TestApp, tenant: &str, body: Value) -> Response {
    app.client
        .put(app.url(&format!("/api/tenants/{tenant}/webhook")))
        .bearer_auth(ADMIN_TOKEN)
        .json(&body)
        .send()
        .await
        .unwrap()
}

/// Sets `tenant`'s webhook to `url`; its secret.
async fn hook(app: &TestApp, tenant: &str, url: &str) -> String {
    let res = put_webhook(app, tenant, json!({"url": url})).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["cache-control"], "no-store");
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["url"], url);
    body["secret"]
        .as_str()
        .expect("a first PUT answers the secret")
        .to_owned()
}

/// Checks a received POST's signature with `secret` (and that its timestamp is recent).
fn assert_signed(r: &Received, secret: &str) {
    let ts: u64 = r.timestamp.parse().expect("webhook-timestamp is a number");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(ts.abs_diff(now) < 300, "timestamp {ts}, now {now}");
    assert_eq!(
        sluice::delivery::signature(secret, &r.id, ts, &r.body).as_deref(),
        Some(r.signature.as_str()),
        "{r:?}"
    );
}

#[tokio::test]
async fn every_terminal_change_reaches_the_webhook_signed() {
    let app = TestApp::spawn_with(|c| c.api.webhook_allow_private = true).await;
    app.create_tenant("acme").await;
    let receiver = Receiver::start(0, Duration::ZERO).await;
    let secret = hook(&app, "acme", &receiver.url).await;
    assert!(secret.starts_with("whsec_"), "{secret}");
    // The secret is never shown again.
    let got = app.get_json(None, "/api/tenants/acme/webhook").await;
    assert_eq!(got["url"], receiver.url.as_str());
    assert!(got.get("secret").is_none(), "{got}");
    let res = put_webhook(&app, "acme", json!({"url": receiver.url})).await;
    assert!(res.json::<Value>().await.unwrap().get("secret").is_none());

    // Queued, then cancelled and force-deleted before any worker runs.
    let cancelled = app
        .admit_with("acme", json!({"flow_id": "demo.echo"}))
        .await;
    assert_eq!(
        app.cancel("acme", &cancelled).await.status(),
        StatusCode::OK
    );
    let deleted = app
        .admit_with("acme", json!({"flow_id": "demo.echo"}))
        .await;
    assert_eq!(
        app.delete("acme", &deleted, true).await.status(),
        StatusCode::NO_CONTENT
    );
    // Run by a worker: one completes, one fails for good (dead-lettered after 2 attempts).
    let completed = app
        .admit_with("acme", json!({"flow_id": "demo.echo", "params": {"x": 1}}))
        .await;
    let failed = app
        .admit_with(
            "acme",
            json!({"flow_id": "demo.fail", "params": {"message": "boom"}, "max_attempts": 2}),
        )
        .await;
    let _worker = TestWorker::spawn(&app.redis, &["--retry-backoff-ms", "10"]);
    let got = receiver
        .until(Duration::from_secs(30), "four events", |g| {
            ids(g).len() >= 4
        })
        .await;
    assert_eq!(got.len(), 4, "each event once when the receiver takes it");
    let by_execution: BTreeMap<String, Value> = got
        .iter()
        .map(|r| {
            assert_signed(r, &secret);
            let v = r.json();
            let id = v["data"]["execution_id"].as_str().unwrap().to_owned();
            assert_eq!(r.id, format!("msg_{id}_1"), "{v}");
            (id, v)
        })
        .collect();
    let event = |id: &str| by_execution[id].clone();
    assert_eq!(event(&cancelled)["type"], "execution.cancelled");
    assert_eq!(event(&cancelled)["data"]["status"], "cancelled");
    assert_eq!(event(&deleted)["type"], "execution.deleted");
    assert_eq!(event(&deleted)["data"]["previous_status"], "queued");
    let done = event(&completed);
    assert_eq!(done["type"], "execution.completed");
    assert_eq!(
        (
            &done["data"]["tenant_id"],
            &done["data"]["flow_id"],
            &done["data"]["attempt"],
            &done["data"]["sequence"]
        ),
        (&json!("acme"), &json!("demo.echo"), &json!(1), &json!(1))
    );
    assert!(done["timestamp"].as_str().unwrap().ends_with('Z'), "{done}");
    let fail = event(&failed);
    assert_eq!(fail["type"], "execution.failed");
    assert_eq!(fail["data"]["attempt"], 2);
    assert_eq!(fail["data"]["dead_lettered"], true);
    assert_eq!(fail["data"]["error"]["message"], "boom");

    // The API says so too.
    let w = settled_webhook(&app, "acme").await;
    assert_eq!(
        (
            &w["pending"],
            &w["delivered"],
            &w["failed_attempts"],
            &w["dropped"]
        ),
        (&json!(0), &json!(4), &json!(0), &json!(0)),
        "{w}"
    );
    let log = app
        .get_json(None, "/api/tenants/acme/webhook/deliveries")
        .await;
    let log = log["deliveries"].as_array().unwrap();
    assert_eq!(log.len(), 4);
    assert!(
        log.iter()
            .all(|d| d["delivered"] == true && d["status"] == 204),
        "{log:?}"
    );
}

/// `GET /api/tenants/{tenant}/webhook` once nothing is pending (or after 30 s, as it is then).
/// The deliverer records a delivery when the receiver's answer is back, a moment after the
/// receiver saw the request, so a test that saw the request waits for the record.
async fn settled_webhook(app: &TestApp, tenant: &str) -> Value {
    let path = format!("/api/tenants/{tenant}/webhook");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let w = app.get_json(None, &path).await;
        if w["pending"] == 0 || Instant::now() >= deadline {
            return w;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_failing_receiver_gets_each_event_again_with_its_id_and_in_order() {
    let app = TestApp::spawn_with(|c| c.api.webhook_allow_private = true).await;
    app.create_tenant("acme").await;
    let receiver = Receiver::start(2, Duration::ZERO).await;
    let secret = hook(&app, "acme", &receiver.url).await;
    let id = app
        .admit_with("acme", json!({"flow_id": "demo.echo"}))
        .await;
    let _worker = TestWorker::spawn(&app.redis, &[]);
    app.wait_terminal("acme", &id, Duration::from_secs(30))
        .await;
    // A second change of the same execution while the first is still being retried.
    assert_eq!(
        app.delete("acme", &id, true).await.status(),
        StatusCode::NO_CONTENT
    );
    let got = receiver
        .until(Duration::from_secs(30), "both events taken", |g| {
            g.len() >= 4 && ids(&g[2..]).len() == 2
        })
        .await;
    // Two refused, then taken: the same id and the same bytes each time; then the next one.
    let first = format!("msg_{id}_1");
    let seq: Vec<&str> = got.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(seq[..3], [first.as_str(); 3], "{seq:?}");
    assert_eq!(seq[3], format!("msg_{id}_2"));
    assert!(got[..3].iter().all(|r| r.body == got[0].body));
    for r in &got {
        assert_signed(r, &secret);
    }
    assert_eq!(got[3].json()["type"], "execution.deleted");
    assert_eq!(got[3].json()["data"]["previous_status"], "completed");
    let w = settled_webhook(&app, "acme").await;
    assert_eq!(
        (&w["pending"], &w["delivered"], &w["failed_attempts"]),
        (&json!(0), &json!(2), &json!(2)),
        "{w}"
    );
    // The server's own counts say the same (counted before the record above is written).
    let text = app.metrics().await;
    for (series, want) in [
        ("sluice_webhook_deliveries_total", 2.0),
        ("sluice_webhook_failed_attempts_total", 2.0),
        ("sluice_webhook_dropped_total", 0.0),
    ] {
        assert_eq!(sample(&text, series), Some(want), "{series}");
    }
    let log = app
        .get_json(None, "/api/tenants/acme/webhook/deliveries?limit=4")
        .await;
    let log = log["deliveries"].as_array().unwrap();
    // Newest first.
    let attempts: Vec<(Value, Value, Value)> = log
        .iter()
        .rev()
        .map(|d| {
            (
                d["webhook_id"].clone(),
                d["status"].clone(),
                d["attempt"].clone(),
            )
        })
        .collect();
    assert_eq!(
        attempts,
        [
            (json!(first), json!(500), json!(1)),
            (json!(first), json!(500), json!(2)),
            (json!(first), json!(204), json!(3)),
            (json!(format!("msg_{id}_2")), json!(204), json!(1)),
        ]
    );
}

/// A receiver that keeps failing gets the same event again only after the documented pause:
/// 1 s after the first failure, then doubling per failure of that event — however often its
/// tenant is woken meanwhile (each server scans every 200 ms here) and whichever of the two
/// servers delivering it tries.
#[tokio::test]
async fn a_failing_receiver_is_sent_an_event_again_only_after_a_doubling_pause() {
    use sluice::delivery::retry_pause;
    let app = TestApp::spawn_with(|c| {
        c.api.webhook_allow_private = true;
        c.api.webhook_scan_ms = 200;
    })
    .await;
    app.spawn_beside(|_| {}).await;
    app.create_tenant("acme").await;
    const FAILURES: usize = 3;
    let receiver = Receiver::start(FAILURES, Duration::ZERO).await;
    hook(&app, "acme", &receiver.url).await;
    let id = app
        .admit_with("acme", json!({"flow_id": "demo.echo"}))
        .await;
    assert_eq!(app.cancel("acme", &id).await.status(), StatusCode::OK);
    let got = receiver
        .until(Duration::from_secs(60), "taken after its failures", |g| {
            g.len() > FAILURES
        })
        .await;
    let first = format!("msg_{id}_1");
    assert!(got.iter().all(|r| r.id == first), "{:?}", ids(&got));
    let gaps: Vec<Duration> = got.windows(2).map(|w| w[1].at - w[0].at).collect();
    println!("attempts of one event came after gaps of {gaps:?}");
    for (n, gap) in gaps.iter().enumerate().take(FAILURES) {
        let pause = retry_pause(n as u32 + 1);
        assert!(
            *gap >= pause,
            "attempt {} came {gap:?} after attempt {}, before its pause of {pause:?}",
            n + 2,
            n + 1
        );
    }
    assert_eq!(
        (1..=3).map(retry_pause).collect::<Vec<_>>(),
        [1, 2, 4].map(Duration::from_secs)
    );
}

#[tokio::test]
async fn private_addresses_are_refused_unless_allowed() {
    let app = TestApp::spawn().await;
    app.create_tenant("acme").await;
    let receiver = Receiver::start(0, Duration::ZERO).await;
    // By name (the resolver refuses it) and by address (refused before any connection).
    let port = receiver.url.rsplit(':').next().unwrap().to_owned();
    for url in [format!("http://localhost:{port}"), receiver.url.clone()] {
        hook(&app, "acme", &url).await;
        let id = app
            .admit_with("acme", json!({"flow_id": "demo.echo"}))
            .await;
        assert_eq!(app.cancel("acme", &id).await.status(), StatusCode::OK);
        let deadline = Instant::now() + Duration::from_secs(20);
        let refused = loop {
            let log = app
                .get_json(None, "/api/tenants/acme/webhook/deliveries")
                .await;
            if let Some(d) = log["deliveries"]
                .as_array()
                .unwrap()
                .iter()
                .find(|d| d["execution_id"] == id.as_str())
            {
                break d.clone();
            }
            assert!(Instant::now() < deadline, "no attempt logged for {url}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(refused["delivered"], false, "{refused}");
        assert_eq!(refused["status"], Value::Null, "{refused}");
        let error = refused["error"].as_str().unwrap();
        assert!(error.contains("private"), "{refused}");
        // The tenant learns that its address was refused, never what a name resolves to
        // (the server's own log has it): no loopback address in the text of the by-name
        // refusal, whose URL names none.
        if url.contains("localhost") {
            for resolved in ["127.0.0.1", "::1"] {
                assert!(!error.contains(resolved), "{resolved} shown: {refused}");
            }
            assert!(error.contains("localhost"), "{refused}");
        }
        // The event stays, to be delivered if the address changes.
        assert!(
            app.get_json(None, "/api/tenants/acme/webhook").await["pending"].as_u64() >= Some(1)
        );
        // Removing the webhook drops what it still held.
        let res = app
            .client
            .delete(app.url("/api/tenants/acme/webhook"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::NO_CONTENT);
    }
    assert!(
        receiver.got().is_empty(),
        "nothing reached the private address"
    );
}

/// A test CA (its certificate as PEM) and a TLS acceptor presenting a certificate it signed
/// for 127.0.0.1.
fn test_ca_and_receiver_tls() -> (String, tokio_rustls::TlsAcceptor) {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "sluice test CA");
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![cert.der().clone()],
        rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
    )
    .unwrap();
    (ca.pem(), tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// An `https` receiver gets its events, signed, when its certificate verifies (here against
/// the CA `--webhook-ca-file` adds); a server that does not trust the certificate sends
/// nothing to it, logs why, and keeps the event.
#[tokio::test]
async fn an_https_receiver_is_reached_only_through_a_verified_certificate() {
    let (ca, tls) = test_ca_and_receiver_tls();
    let receiver = Receiver::start_tls(tls).await;
    assert!(receiver.url.starts_with("https://127.0.0.1:"));

    // Without the CA: the system's roots do not know it.
    let untrusting = TestApp::spawn_with(|c| c.api.webhook_allow_private = true).await;
    untrusting.create_tenant("acme").await;
    hook(&untrusting, "acme", &receiver.url).await;
    let id = untrusting
        .admit_with("acme", json!({"flow_id": "demo.echo"}))
        .await;
    assert_eq!(
        untrusting.cancel("acme", &id).await.status(),
        StatusCode::OK
    );
    let w = webhook_once(
        &untrusting,
        Duration::from_secs(20),
        "a refused attempt",
        |w| w["failed_attempts"].as_u64() >= Some(1),
    )
    .await;
    assert_eq!(w["pending"], 1, "the event is kept: {w}");
    let log = untrusting
        .get_json(None, "/api/tenants/acme/webhook/deliveries")
        .await;
    let attempt = &log["deliveries"][0];
    assert_eq!(
        (&attempt["delivered"], &attempt["status"]),
        (&json!(false), &Value::Null),
        "{log}"
    );
    assert!(
        attempt["error"]
            .as_str()
            .unwrap()
            .to_lowercase()
            .contains("certificate"),
        "{log}"
    );
    assert!(
        receiver.got().is_empty(),
        "nothing sent to an unverified receiver"
    );
    drop(untrusting);

    // With the CA.
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), &ca).unwrap();
    let path = file.path().to_owned();
    let app = TestApp::spawn_with(|c| {
        c.api.webhook_allow_private = true;
        c.api.webhook_ca_file = Some(path);
    })
    .await;
    app.create_tenant("acme").await;
    let secret = hook(&app, "acme", &receiver.url).await;
    let id = app
        .admit_with("acme", json!({"flow_id": "demo.echo"}))
        .await;
    assert_eq!(app.cancel("acme", &id).await.status(), StatusCode::OK);
    let got = receiver
        .until(Duration::from_secs(20), "the event over https", |got| {
            !got.is_empty()
        })
        .await;
    assert_signed(&got[0], &secret);
    let event = got[0].json();
    assert_eq!(
        (&event["data"]["execution_id"], &event["data"]["status"]),
        (&json!(id), &json!("cancelled")),
        "{event}"
    );
    let w = settled_webhook(&app, "acme").await;
    assert_eq!(
        (&w["pending"], &w["delivered"]),
        (&json!(0), &json!(1)),
        "{w}"
    );
}

/// A CA file that cannot be used stops the server at start, saying which file and why.
#[tokio::test]
async fn an_unusable_webhook_ca_file_stops_the_server() {
    let redis = TestRedis::start().await;
    let empty = tempfile::NamedTempFile::new().unwrap();
    for (path, why) in [
        (empty.path().to_owned(), "holds no certificate"),
        ("/nonexistent/ca.pem".into(), "cannot read CA file"),
    ] {
        let mut serve = Command::new(sluice_bin())
            .args([
                "serve",
                "--admin-token",
                ADMIN_TOKEN,
                "--listen",
                "127.0.0.1:0",
            ])
            .args(redis.args())
            .arg("--webhook-ca-file")
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // A server that started anyway would run for ever: give it 30 s to stop.
        let deadline = Instant::now() + Duration::from_secs(30);
        while serve.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = serve.kill();
                panic!("serve started with --webhook-ca-file {path:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let out = serve.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert!(
            stderr.contains(why) && stderr.contains(&*path.to_string_lossy()),
            "{stderr}"
        );
    }
}

#[tokio::test]
async fn webhook_settings_refuse_bad_input_and_other_callers() {
    let app = TestApp::spawn().await;
    app.create_tenant("acme").await;
    app.create_tenant("other").await;
    for (body, code) in [
        (json!({"url": "not a url"}), "invalid_webhook_url"),
        (
            json!({"url": "HTTPS://hooks.example.com/"}),
            "invalid_webhook_url",
        ),
        (
            json!({"url": "ftp://hooks.example.com/"}),
            "invalid_webhook_url",
        ),
        (
            json!({"url": "http://u:p@hooks.example.com/"}),
            "invalid_webhook_url",
        ),
        (
            json!({"url": "http://hooks.example.com/", "extra": 1}),
            "invalid_body",
        ),
        (json!({}), "invalid_body"),
    ] {
        let res = put_webhook(&app, "acme", body.clone()).await;
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(problem_code(res).await, code, "{body}");
    }
    // Nothing was set.
    let res = app
        .client
        .get(app.url("/api/tenants/acme/webhook"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    assert_eq!(problem_code(res).await, "webhook_not_found");
    let res = put_webhook(&app, "nobody", json!({"url": "http://hooks.example.com/"})).await;
    assert_eq!(problem_code(res).await, "tenant_not_found");
    // The tenant's admin key may; an editor, a worker or another tenant's admin may not.
    let own = app.key_token("acme", "admin").await;
    let call = |token: String, tenant: &str| {
        app.client
            .put(app.url(&format!("/api/tenants/{tenant}/webhook")))
            .bearer_auth(token)
            .json(&json!({"url": "http://hooks.example.com/x"}))
            .send()
    };
    let res = call(own.clone(), "acme").await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let first: Value = res.json().await.unwrap();
    for (token, tenant, code) in [
        (
            app.key_token("acme", "editor").await,
            "acme",
            "insufficient_role",
        ),
        (
            app.key_token("acme", "worker").await,
            "acme",
            "insufficient_role",
        ),
        (
            app.key_token("other", "admin").await,
            "acme",
            "tenant_mismatch",
        ),
    ] {
        let res = call(token, tenant).await.unwrap();
        assert_eq!(res.status(), StatusCode::FORBIDDEN);
        assert_eq!(problem_code(res).await, code);
    }
    // Rotating makes a new secret; the address stays the one set.
    let res = app
        .client
        .put(app.url("/api/tenants/acme/webhook"))
        .bearer_auth(&own)
        .json(&json!({"url": "http://hooks.example.com/y", "rotate_secret": true}))
        .send()
        .await
        .unwrap();
    let rotated: Value = res.json().await.unwrap();
    assert_ne!(rotated["secret"], first["secret"]);
    assert!(rotated["secret"].as_str().unwrap().starts_with("whsec_"));
    assert_eq!(rotated["created_at"], first["created_at"]);
    // Deleting the tenant removes its webhook.
    let res = app
        .client
        .delete(app.url("/api/tenants/acme"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    app.create_tenant("acme").await;
    let res = app
        .client
        .get(app.url("/api/tenants/acme/webhook"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(problem_code(res).await, "webhook_not_found");
}

/// `sluice serve` as a process of its own, delivering webhooks.
fn delivering_serve(redis: &TestRedis) -> TestServe {
    TestServe::spawn(
        redis,
        free_port(),
        &["--webhook-allow-private", "--webhook-timeout-ms", "1000"],
    )
}

/// `serve` killed (SIGKILL) while it delivers: after a restart every change is delivered, and
/// an event received twice carries the same `webhook-id` and the same body both times.
#[tokio::test]
async fn serve_killed_mid_delivery_loses_no_event() {
    // The API of this app admits and cancels; it delivers nothing (the process below does).
    let app = TestApp::spawn_with(|c| c.api.webhook_delivery = false).await;
    app.create_tenant("acme").await;
    let receiver = Receiver::start(0, Duration::ZERO).await;
    hook(&app, "acme", &receiver.url).await;
    const N: usize = 40;
    let mut expected = BTreeSet::new();
    for _ in 0..N {
        let id = app
            .admit_with("acme", json!({"flow_id": "demo.echo"}))
            .await;
        assert_eq!(app.cancel("acme", &id).await.status(), StatusCode::OK);
        expected.insert(format!("msg_{id}_1"));
    }
    // Deliveries arrive and wait for an answer that comes only after the kill.
    receiver.answer(false);
    let mut serve = delivering_serve(&app.redis);
    let arrived = receiver
        .until(Duration::from_secs(30), "the first deliveries", |g| {
            g.len() >= 3
        })
        .await
        .len();
    serve.kill();
    receiver.answer(true);
    // Nothing was acknowledged: every event is still in the outbox.
    let w = app.get_json(None, "/api/tenants/acme/webhook").await;
    assert_eq!(w["pending"], N, "{w}");
    let _serve = delivering_serve(&app.redis);
    let w = webhook_once(
        &app,
        Duration::from_secs(60),
        "still pending after the restart",
        |w| w["pending"] == 0,
    )
    .await;
    assert_eq!(w["delivered"], N, "{w}");
    let got = receiver.got();
    assert_eq!(ids(&got), expected);
    // What arrived before the kill came again: the same message both times.
    assert!(
        got.len() >= N + arrived,
        "{} received, {arrived} before the kill",
        got.len()
    );
    let mut bodies: BTreeMap<&str, &[u8]> = BTreeMap::new();
    for r in &got {
        let first = *bodies.entry(&r.id).or_insert(&r.body);
        assert_eq!(first, &r.body[..], "{}", r.id);
    }
}

/// Pinning a tenant moves its webhook with it, and waits while events are still to go out.
#[tokio::test]
async fn a_pinned_tenant_keeps_its_webhook_and_no_event_is_stranded() {
    let app = TestApp::spawn_with(|c| c.api.webhook_allow_private = true).await;
    app.create_tenant("acme").await;
    let receiver = Receiver::start(0, Duration::ZERO).await;
    let secret = hook(&app, "acme", &receiver.url).await;
    let pin = || {
        app.client
            .post(app.url("/api/tenants/acme/dedicated-shard"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
    };
    // An event in flight (its receiver holds the answer) is data that cannot follow.
    receiver.answer(false);
    let id = app
        .admit_with("acme", json!({"flow_id": "demo.echo"}))
        .await;
    assert_eq!(
        app.delete("acme", &id, true).await.status(),
        StatusCode::NO_CONTENT
    );
    receiver
        .until(Duration::from_secs(20), "the event in flight", |g| {
            !g.is_empty()
        })
        .await;
    let res = pin().await.unwrap();
    assert_eq!(res.status(), StatusCode::CONFLICT);
    assert_eq!(problem_code(res).await, "tenant_has_executions");
    receiver.answer(true);
    webhook_once(
        &app,
        Duration::from_secs(20),
        "the event was never acknowledged",
        |w| w["pending"] == 0,
    )
    .await;
    assert_eq!(pin().await.unwrap().status(), StatusCode::OK);
    // Same address, same secret, on the dedicated shard.
    let w = app.get_json(None, "/api/tenants/acme/webhook").await;
    assert_eq!(w["url"], receiver.url.as_str(), "{w}");
    let moved = app
        .admit_with("acme", json!({"flow_id": "demo.echo"}))
        .await;
    assert_eq!(app.cancel("acme", &moved).await.status(), StatusCode::OK);
    let got = receiver
        .until(Duration::from_secs(20), "the pinned tenant's event", |g| {
            g.iter().any(|r| r.id == format!("msg_{moved}_1"))
        })
        .await;
    let r = got
        .iter()
        .find(|r| r.id == format!("msg_{moved}_1"))
        .unwrap();
    assert_signed(r, &secret);
    assert_eq!(r.json()["type"], "execution.cancelled");
}

/// An event that cannot be delivered within `--webhook-max-age-secs` is dropped, and counted.
#[tokio::test]
async fn an_event_older_than_the_age_bound_is_dropped_and_counted() {
    // Private addresses stay refused: every attempt fails.
    let app = TestApp::spawn_with(|c| c.api.webhook_max_age_secs = 1).await;
    app.create_tenant("acme").await;
    hook(&app, "acme", "http://127.0.0.1:9/hook").await;
    let id = app
        .admit_with("acme", json!({"flow_id": "demo.echo"}))
        .await;
    assert_eq!(app.cancel("acme", &id).await.status(), StatusCode::OK);
    let w = webhook_once(&app, Duration::from_secs(30), "never dropped", |w| {
        w["dropped"] == 1
    })
    .await;
    assert_eq!(
        (&w["pending"], &w["delivered"]),
        (&json!(0), &json!(0)),
        "{w}"
    );
    assert!(w["failed_attempts"].as_u64() >= Some(1), "{w}");
    // On /metrics too: the drop (counted just after it is written), the failed attempts.
    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        let text = app.metrics().await;
        if sample(&text, "sluice_webhook_dropped_total") == Some(1.0) {
            break text;
        }
        assert!(Instant::now() < deadline, "no drop on /metrics: {text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(sample(&text, "sluice_webhook_failed_attempts_total") >= Some(1.0));
    assert_eq!(sample(&text, "sluice_webhook_deliveries_total"), Some(0.0));
}

/// A tenant's outbox holds at most 10,000 events: the next evicts the oldest, and the
/// eviction is counted in `dropped` (the receiver here refuses everything, so nothing drains).
#[tokio::test]
async fn a_full_outbox_evicts_its_oldest_event_and_counts_it() {
    const CAP: usize = 10_000;
    // Private addresses stay refused: every attempt fails and every event stays.
    let app = TestApp::spawn().await;
    app.create_tenant("acme").await;
    hook(&app, "acme", "http://127.0.0.1:9/hook").await;
    // The outbox filled to its cap directly (10,000 cancellations through the API would take
    // a minute); each entry as the scripts write one.
    let outbox = app
        .shard("acme")
        .outbox(&sluice::domain::TenantId::parse("acme").unwrap());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        .to_string();
    let mut first = None;
    for chunk in 0..CAP / 1_000 {
        let mut p = redis::pipe();
        for n in 0..1_000 {
            p.cmd("XADD")
                .arg(&outbox)
                .arg("*")
                .arg(&["type", "cancelled", "id"])
                .arg(format!("{:032x}", chunk * 1_000 + n))
                .arg(&["seq", "1", "at", &now, "flow", "demo.echo", "attempt", "0"]);
        }
        let ids: Vec<String> = p.query_async(&mut app.redis.conn().await).await.unwrap();
        first = first.or(ids.first().cloned());
    }
    let first = first.unwrap();
    let id = app
        .admit_with("acme", json!({"flow_id": "demo.echo"}))
        .await;
    assert_eq!(app.cancel("acme", &id).await.status(), StatusCode::OK);
    let w = app.get_json(None, "/api/tenants/acme/webhook").await;
    assert_eq!(
        (&w["pending"], &w["dropped"]),
        (&json!(CAP), &json!(1)),
        "{w}"
    );
    // The oldest is the one gone; the newest is the cancellation.
    let oldest: redis::streams::StreamRangeReply = app
        .redis
        .query(
            redis::cmd("XRANGE")
                .arg(&outbox)
                .arg("-")
                .arg("+")
                .arg("COUNT")
                .arg(1),
        )
        .await;
    assert_ne!(oldest.ids[0].id, first);
    let newest: redis::streams::StreamRangeReply = app
        .redis
        .query(
            redis::cmd("XREVRANGE")
                .arg(&outbox)
                .arg("+")
                .arg("-")
                .arg("COUNT")
                .arg(1),
        )
        .await;
    assert_eq!(
        newest.ids[0].get::<String>("id").as_deref(),
        Some(id.as_str())
    );
}

/// An event written while a delivery is under way (its outbox was not empty, so no wake-up
/// was published) goes out in the same drain, not at the next scan (there is none here).
#[tokio::test]
async fn an_event_written_during_a_delivery_goes_out_in_the_same_drain() {
    let app = TestApp::spawn_with(|c| {
        c.api.webhook_allow_private = true;
        c.api.webhook_scan_ms = 0;
    })
    .await;
    // The deliverer's start-up scan is over: only the first event's wake-up will come.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !app.deliverer.listening() {
        assert!(Instant::now() < deadline, "the deliverer never listened");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    app.create_tenant("acme").await;
    let receiver = Receiver::start(0, Duration::ZERO).await;
    hook(&app, "acme", &receiver.url).await;
    receiver.answer(false);
    let first = app
        .admit_with("acme", json!({"flow_id": "demo.echo"}))
        .await;
    assert_eq!(app.cancel("acme", &first).await.status(), StatusCode::OK);
    receiver
        .until(Duration::from_secs(20), "the first event in flight", |g| {
            !g.is_empty()
        })
        .await;
    let second = app
        .admit_with("acme", json!({"flow_id": "demo.echo"}))
        .await;
    assert_eq!(app.cancel("acme", &second).await.status(), StatusCode::OK);
    receiver.answer(true);
    let got = receiver
        .until(Duration::from_secs(20), "the second event", |g| {
            g.iter().any(|r| r.id == format!("msg_{second}_1"))
        })
        .await;
    assert_eq!(got[0].id, format!("msg_{first}_1"));
}

/// The address grammar the OpenAPI document states is the one the server enforces.
#[test]
fn the_documented_address_pattern_is_the_enforced_one() {
    let spec = serde_json::to_value(sluice::http::openapi()).unwrap();
    assert_eq!(
        spec["components"]["schemas"]["WebhookSettings"]["properties"]["url"]["pattern"],
        sluice::delivery::WEBHOOK_URL_PATTERN
    );
}
