//! Span export (`--otlp-endpoint`): `sluice serve` and `sluice worker` processes send their
//! spans over OTLP/HTTP to a small receiver in the test, which decodes them as a collector
//! would. The trace the caller started goes on through sluice into the handler, as one tree.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::body::Bytes;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use prost::Message;
use serde_json::{Value, json};

use crate::helpers::{ADMIN_TOKEN, TestRedis, TestServe, TestWorker, free_port};

/// A span as the receiver got it.
#[derive(Debug, Clone)]
struct Got {
    service: String,
    name: String,
    trace_id: String,
    span_id: String,
    parent: String,
    attributes: HashMap<String, String>,
    start_ns: u64,
    end_ns: u64,
}

type Spans = Arc<Mutex<Vec<Got>>>;

/// An OTLP/HTTP receiver on loopback (`POST /v1/traces`, protobuf), and a handler service
/// (`POST /handler`) that answers with the trace headers it got.
async fn receiver() -> (String, Spans) {
    let spans: Spans = Arc::default();
    let kept = spans.clone();
    let app = axum::Router::new()
        .route(
            "/v1/traces",
            post(move |body: Bytes| {
                let kept = kept.clone();
                async move {
                    let req = ExportTraceServiceRequest::decode(body).expect("an OTLP request");
                    let mut kept = kept.lock().unwrap();
                    for rs in req.resource_spans {
                        let service = rs
                            .resource
                            .iter()
                            .flat_map(|r| &r.attributes)
                            .find(|a| a.key == "service.name")
                            .map(|a| text(a.value.as_ref().and_then(|v| v.value.as_ref())))
                            .unwrap_or_default();
                        for span in rs.scope_spans.into_iter().flat_map(|s| s.spans) {
                            kept.push(Got {
                                service: service.clone(),
                                name: span.name,
                                trace_id: hex::encode(span.trace_id),
                                span_id: hex::encode(span.span_id),
                                parent: hex::encode(span.parent_span_id),
                                attributes: span
                                    .attributes
                                    .iter()
                                    .map(|a| {
                                        (
                                            a.key.clone(),
                                            text(a.value.as_ref().and_then(|v| v.value.as_ref())),
                                        )
                                    })
                                    .collect(),
                                start_ns: span.start_time_unix_nano,
                                end_ns: span.end_time_unix_nano,
                            });
                        }
                    }
                    // An empty ExportTraceServiceResponse.
                    (
                        [("content-type", "application/x-protobuf")],
                        Vec::<u8>::new(),
                    )
                }
            }),
        )
        .route(
            "/handler",
            post(|headers: axum::http::HeaderMap| async move {
                Json(crate::helpers::trace_headers(&headers))
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), spans)
}

fn text(v: Option<&AnyValue>) -> String {
    match v {
        Some(AnyValue::StringValue(s)) => s.clone(),
        Some(AnyValue::IntValue(i)) => i.to_string(),
        Some(AnyValue::BoolValue(b)) => b.to_string(),
        other => format!("{other:?}"),
    }
}

/// `sluice serve` on `redis`, exporting its spans to the receiver at `base`; its API's base
/// URL once it is ready, and a client.
async fn serve_exporting(redis: &TestRedis, base: &str) -> (TestServe, String, reqwest::Client) {
    let port = free_port();
    let serve = TestServe::spawn(redis, port, &["--otlp-endpoint", base]);
    let client = sluice::tls::client_builder(&[]).unwrap().build().unwrap();
    let api = format!("http://127.0.0.1:{port}");
    assert!(
        crate::helpers::wait_ready(&client, &api, Duration::from_secs(30)).await,
        "sluice serve did not become ready"
    );
    (serve, api, client)
}

/// The spans of trace `trace_id` the receiver holds, once `names` are all among them (30 s
/// at most: export batches for up to half a second).
async fn spans_of(spans: &Spans, trace_id: &str, names: &[&str]) -> Vec<Got> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let of_trace: Vec<Got> = spans
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.trace_id == trace_id)
            .cloned()
            .collect();
        if names.iter().all(|n| of_trace.iter().any(|s| s.name == *n)) {
            return of_trace;
        }
        assert!(
            Instant::now() < deadline,
            "spans missing; got {:?}",
            of_trace.iter().map(|s| &s.name).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The trace id and the parent id of a `traceparent`.
fn ids(traceparent: &str) -> (String, String) {
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{traceparent}");
    (parts[1].to_owned(), parts[2].to_owned())
}

#[tokio::test]
async fn spans_of_serve_and_worker_form_one_trace_with_the_caller_and_the_handler() {
    const CALLER: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let (trace_id, caller_span) = ids(CALLER);
    let redis = TestRedis::start().await;
    let (base, spans) = receiver().await;
    let (_serve, api, client) = serve_exporting(&redis, &base).await;
    let (_dir, flows) = crate::helpers::flows_file(&format!(
        "[flows.\"svc.traced\"]\nkind = \"http\"\nurl = \"{base}/handler\"\n"
    ));
    let _worker = TestWorker::spawn(
        &redis,
        &["--flows", flows.to_str().unwrap(), "--otlp-endpoint", &base],
    );
    let admit = |traceparent: Option<&'static str>| {
        let mut req = client
            .post(format!("{api}/api/executions"))
            .bearer_auth(ADMIN_TOKEN)
            .header("x-tenant-id", "acme")
            .json(&json!({"flow_id": "svc.traced"}));
        if let Some(tp) = traceparent {
            req = req
                .header("traceparent", tp)
                .header("tracestate", "congo=t61rcWkgMzE");
        }
        async move {
            let res = req.send().await.unwrap();
            assert_eq!(res.status(), 201);
            res.json::<Value>().await.unwrap()
        }
    };
    let traced = admit(Some(CALLER)).await;
    let untraced = admit(None).await;
    // The execution keeps sluice's admit span as the parent, in the caller's trace.
    let (kept_trace, admit_span) = ids(traced["traceparent"].as_str().unwrap());
    assert_eq!(kept_trace, trace_id);
    assert_ne!(admit_span, caller_span);
    assert_eq!(traced["tracestate"], "congo=t61rcWkgMzE");
    // Without a traceparent, the admit span starts a trace of its own.
    let (own_trace, _) = ids(untraced["traceparent"].as_str().unwrap());
    assert_ne!(own_trace, trace_id);

    let done = |e: &Value| {
        let url = format!(
            "{api}/api/executions/{}?wait=20s",
            e["execution_id"].as_str().unwrap()
        );
        let client = &client;
        async move {
            let e: Value = client
                .get(url)
                .bearer_auth(ADMIN_TOKEN)
                .header("x-tenant-id", "acme")
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            assert_eq!(e["status"], "completed", "{e}");
            e
        }
    };
    let handler_got = done(&traced).await["output"].clone();
    done(&untraced).await;
    let (handler_trace, handler_parent) = ids(handler_got["traceparent"].as_str().unwrap());
    assert_eq!(
        handler_trace, trace_id,
        "the handler is in the caller's trace"
    );
    assert_eq!(handler_got["tracestate"], "congo=t61rcWkgMzE");

    // Every span of the traced execution arrives.
    let of_trace = spans_of(
        &spans,
        &trace_id,
        &["admit", "wait", "start", "run", "complete"],
    )
    .await;
    let one = |name: &str| {
        let found: Vec<&Got> = of_trace.iter().filter(|s| s.name == name).collect();
        assert_eq!(found.len(), 1, "one {name} span: {of_trace:#?}");
        found[0].clone()
    };
    let (admit, wait, start, run, complete) = (
        one("admit"),
        one("wait"),
        one("start"),
        one("run"),
        one("complete"),
    );
    // The tree: caller → admit → (wait, start, run) → complete; the handler under run.
    assert_eq!(
        (admit.service.as_str(), admit.parent.as_str()),
        ("sluice-serve", caller_span.as_str())
    );
    assert_eq!(admit.span_id, admit_span);
    for s in [&wait, &start, &run] {
        assert_eq!(
            (s.service.as_str(), s.parent.as_str()),
            ("sluice-worker", admit_span.as_str()),
            "{s:?}"
        );
        assert_eq!(
            s.attributes["sluice.execution_id"],
            traced["execution_id"].as_str().unwrap()
        );
    }
    assert_eq!(complete.parent, run.span_id);
    assert_eq!(
        handler_parent, run.span_id,
        "the handler's parent is the run span"
    );
    assert_eq!(admit.attributes["sluice.outcome"], "admitted");
    assert_eq!(admit.attributes["sluice.tenant"], "acme");
    assert_eq!(run.attributes["sluice.outcome"], "completed");
    assert_eq!(run.attributes["sluice.attempt"], "1");
    // In time order: waiting ends where the start call begins, the run follows it.
    assert!(
        wait.end_ns <= start.end_ns && start.start_ns <= run.start_ns,
        "{of_trace:#?}"
    );
    assert!(
        wait.start_ns <= wait.end_ns
            && run.start_ns <= complete.start_ns
            && complete.end_ns <= run.end_ns
    );
}

/// A batch admission makes one `admit_batch` span under the caller's, counting its items'
/// outcomes, and every execution it admitted keeps that span as its parent.
#[tokio::test]
async fn a_batch_is_one_span_that_its_executions_keep_as_their_parent() {
    const CALLER: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let (trace_id, caller_span) = ids(CALLER);
    let redis = TestRedis::start().await;
    let (base, spans) = receiver().await;
    let (_serve, api, client) = serve_exporting(&redis, &base).await;
    let res = client
        .post(format!("{api}/api/executions/batch"))
        .bearer_auth(ADMIN_TOKEN)
        .header("x-tenant-id", "acme")
        .header("traceparent", CALLER)
        .json(&json!({"items": [
            {"flow_id": "demo.echo", "dedup_key": "a"},
            {"flow_id": "demo.echo", "dedup_key": "a"},
            {"flow_id": "demo.echo"},
            {"flow_id": ""},
        ]}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let answer: Value = res.json().await.unwrap();
    let results = answer["results"].as_array().unwrap();
    let statuses: Vec<&Value> = results.iter().map(|r| &r["status"]).collect();
    assert_eq!(
        statuses,
        [&json!(201), &json!(200), &json!(201), &json!(400)]
    );
    let parents: Vec<(String, String)> = results[..3]
        .iter()
        .map(|r| ids(r["execution"]["traceparent"].as_str().unwrap()))
        .collect();
    let batch = spans_of(&spans, &trace_id, &["admit_batch"]).await;
    assert_eq!(batch.len(), 1, "one span for the batch: {batch:#?}");
    let batch = &batch[0];
    assert_eq!(
        (batch.service.as_str(), batch.parent.as_str()),
        ("sluice-serve", caller_span.as_str())
    );
    for (kept_trace, parent) in &parents {
        assert_eq!((kept_trace, parent), (&trace_id, &batch.span_id));
    }
    for (name, want) in [
        ("sluice.tenant", "acme"),
        ("sluice.items", "4"),
        ("sluice.admitted", "2"),
        ("sluice.replayed", "1"),
        ("sluice.not_admitted", "1"),
    ] {
        assert_eq!(batch.attributes[name], want, "{name}: {batch:?}");
    }
}
