//! Span export over OTLP/HTTP (`--otlp-endpoint`), so a trace the caller started shows what
//! sluice did with the execution: `admit` in `serve`; `wait` (admission to start), `start`
//! (the start call), `run` (the handler) and `complete` (the report) in `worker`.
//!
//! Spans are made with the OpenTelemetry API directly, not from the `tracing` log events: they
//! are few and have explicit parents and times (a `wait` span starts at the admission, in
//! another process), which a span per log scope could not express. Without an endpoint
//! nothing is set up and every function here is a cheap no-op.
//!
//! With an endpoint, sluice's own spans take the caller's place as the parent handed on:
//! the execution keeps the `admit` span's context (an admission without a `traceparent` starts
//! a trace), and a handler gets the `run` span's, so the caller's trace, sluice's spans and the
//! handler's spans form one tree.

use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId,
    TraceState, Tracer as _,
};
use opentelemetry::{Context, KeyValue, global};
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider};

use crate::domain::{ExecutionId, TraceContext};
use crate::store::Started;

/// The provider while export is on (kept to flush it at exit).
static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

/// How long spans wait in memory before they are sent (a batch also goes when full).
const EXPORT_DELAY: Duration = Duration::from_millis(500);

/// Starts exporting spans to the OTLP/HTTP collector at `endpoint` (its base URL, e.g.
/// `http://127.0.0.1:4318`; spans go to `<endpoint>/v1/traces` as protobuf), as `service`.
/// Export runs on its own thread and never blocks a request; a collector that is down loses
/// spans (logged by the exporter), never executions.
pub fn init(endpoint: &str, service: &'static str) -> anyhow::Result<()> {
    use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
    let url = format!("{}/v1/traces", endpoint.trim_end_matches('/'));
    // Built on a thread of its own, as the exporter builds its default one: a blocking client
    // may not be made (or dropped) on an async runtime's thread.
    let client = std::thread::spawn(|| {
        crate::tls::blocking_client_builder()?
            .timeout(Duration::from_secs(5))
            .build()
            .map_err(anyhow::Error::from)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("building the OTLP exporter's HTTP client panicked"))??;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(client)
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(url.clone())
        .with_timeout(Duration::from_secs(5))
        .build()
        .map_err(|e| anyhow::anyhow!("--otlp-endpoint {endpoint}: {e}"))?;
    let processor = BatchSpanProcessor::builder(exporter)
        .with_batch_config(
            BatchConfigBuilder::default()
                .with_scheduled_delay(EXPORT_DELAY)
                .build(),
        )
        .build();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(service)
                .build(),
        )
        .build();
    global::set_tracer_provider(provider.clone());
    let _ = PROVIDER.set(provider);
    tracing::info!(%url, service, "exporting spans over OTLP/HTTP");
    Ok(())
}

/// Sends the spans still in memory (at most a few seconds), at exit.
pub async fn shutdown() {
    if let Some(provider) = PROVIDER.get() {
        let provider = provider.clone();
        let _ = tokio::task::spawn_blocking(move || {
            if let Err(e) = provider.shutdown_with_timeout(Duration::from_secs(5)) {
                tracing::warn!(error = %e, "spans not all exported at exit");
            }
        })
        .await;
    }
}

/// Whether spans are exported.
pub fn enabled() -> bool {
    PROVIDER.get().is_some()
}

fn tracer() -> global::BoxedTracer {
    global::tracer("sluice")
}

/// The context of a stored trace context, as a remote parent (an empty context for none).
fn parent_of(trace: Option<&TraceContext>) -> Context {
    let Some(t) = trace else {
        return Context::new();
    };
    let mut parts = t.traceparent.split('-');
    let (_, trace_id, span_id, flags) = (parts.next(), parts.next(), parts.next(), parts.next());
    let (Some(trace_id), Some(span_id), Some(flags)) = (trace_id, span_id, flags) else {
        return Context::new();
    };
    let (Ok(trace_id), Ok(span_id), Ok(flags)) = (
        TraceId::from_hex(trace_id),
        SpanId::from_hex(span_id),
        u8::from_str_radix(flags, 16),
    ) else {
        return Context::new();
    };
    let state = t
        .tracestate
        .as_deref()
        .and_then(|s| s.parse::<TraceState>().ok())
        .unwrap_or_default();
    Context::new().with_remote_span_context(SpanContext::new(
        trace_id,
        span_id,
        TraceFlags::new(flags),
        true,
        state,
    ))
}

/// The trace context that names `span` as the parent, keeping the caller's `tracestate`.
fn handed_on(span: &SpanContext, caller: Option<&TraceContext>) -> TraceContext {
    TraceContext {
        traceparent: format!(
            "00-{}-{}-{:02x}",
            span.trace_id(),
            span.span_id(),
            span.trace_flags().to_u8()
        ),
        tracestate: caller.and_then(|c| c.tracestate.clone()),
    }
}

/// The `admit` span of one admission (`serve`), when export is on.
pub struct AdmitSpan {
    cx: Context,
    trace: TraceContext,
}

impl AdmitSpan {
    /// Opens the span under the caller's context (a new trace without one).
    pub fn start(tenant: &str, flow: &str, caller: Option<&TraceContext>) -> Option<Self> {
        Self::open(
            "admit",
            || {
                [
                    KeyValue::new("sluice.tenant", tenant.to_owned()),
                    KeyValue::new("sluice.flow", flow.to_owned()),
                ]
            },
            caller,
        )
    }

    /// Opens a server span `name` with `attributes` under the caller's context, when export is
    /// on (the attributes are made only then: they copy their strings, per request).
    fn open(
        name: &'static str,
        attributes: impl FnOnce() -> [KeyValue; 2],
        caller: Option<&TraceContext>,
    ) -> Option<Self> {
        if !enabled() {
            return None;
        }
        let span = tracer()
            .span_builder(name)
            .with_kind(SpanKind::Server)
            .with_attributes(attributes())
            .start_with_context(&tracer(), &parent_of(caller));
        let trace = handed_on(span.span_context(), caller);
        Some(Self {
            cx: Context::new().with_span(span),
            trace,
        })
    }

    /// The context to keep with the execution: this span as the parent.
    pub fn trace(&self) -> TraceContext {
        self.trace.clone()
    }

    /// Opens the one span of a batch admission (`admit_batch`) under the caller's context: the
    /// parent every item's execution keeps, as one admission keeps its `admit` span. One span
    /// per batch, not per item: a batch of 1,000 would otherwise fill the export queue.
    pub fn start_batch(tenant: &str, items: usize, caller: Option<&TraceContext>) -> Option<Self> {
        Self::open(
            "admit_batch",
            || {
                [
                    KeyValue::new("sluice.tenant", tenant.to_owned()),
                    KeyValue::new("sluice.items", items as i64),
                ]
            },
            caller,
        )
    }

    /// Closes a batch's span with how many of its items were admitted, replayed (an earlier
    /// execution's dedup key) and not admitted (refused, invalid or failed).
    pub fn end_batch(self, admitted: usize, replayed: usize, not_admitted: usize) {
        let span = self.cx.span();
        for (name, n) in [
            ("sluice.admitted", admitted),
            ("sluice.replayed", replayed),
            ("sluice.not_admitted", not_admitted),
        ] {
            span.set_attribute(KeyValue::new(name, n as i64));
        }
        span.end();
    }

    /// Closes the span with what admission answered (`admitted`, `replayed`, `conflict`,
    /// `queue_full`, ...) and the execution it named, if any.
    pub fn end(self, outcome: &'static str, execution: Option<&str>) {
        let span = self.cx.span();
        span.set_attribute(KeyValue::new("sluice.outcome", outcome));
        if let Some(id) = execution {
            span.set_attribute(KeyValue::new("sluice.execution_id", id.to_owned()));
        }
        span.end();
    }
}

/// The spans of one run (`worker`), when export is on: `wait` and `start` closed at once,
/// `run` open until [`RunSpans::end`], which adds `complete`.
pub struct RunSpans {
    run: Context,
    handler: TraceContext,
}

/// The milliseconds since the epoch in a UUIDv7 execution id (its first 48 bits).
fn minted_at(id: &ExecutionId) -> Option<SystemTime> {
    let ms = u64::from_str_radix(id.as_str().get(..12)?, 16).ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::from_millis(ms))
}

impl RunSpans {
    /// Records the run's `wait` (from admission, on its first attempt) and `start` (the start
    /// call, from `sent` to `answered`) spans and opens `run`, under the execution's stored
    /// context.
    pub fn begin(run: &Started, sent: SystemTime, answered: SystemTime) -> Option<Self> {
        if !enabled() {
            return None;
        }
        let (id, tenant, flow) = (&run.id, run.tenant.as_str(), run.flow.as_str());
        let (attempt, fence, stored) = (run.attempt, run.fence, run.trace.as_ref());
        let parent = parent_of(stored);
        let tracer = tracer();
        let attrs = || {
            [
                KeyValue::new("sluice.execution_id", id.as_str().to_owned()),
                KeyValue::new("sluice.tenant", tenant.to_owned()),
                KeyValue::new("sluice.flow", flow.to_owned()),
                KeyValue::new("sluice.attempt", i64::from(attempt)),
                KeyValue::new("sluice.fence", i64::try_from(fence).unwrap_or(i64::MAX)),
            ]
        };
        if attempt == 1
            && let Some(admitted) = minted_at(id)
        {
            let mut wait = tracer
                .span_builder("wait")
                .with_kind(SpanKind::Internal)
                .with_start_time(admitted.min(sent))
                .with_attributes(attrs())
                .start_with_context(&tracer, &parent);
            wait.end_with_timestamp(sent);
        }
        let mut start = tracer
            .span_builder("start")
            .with_kind(SpanKind::Client)
            .with_start_time(sent)
            .with_attributes(attrs())
            .start_with_context(&tracer, &parent);
        start.end_with_timestamp(answered.max(sent));
        let run = tracer
            .span_builder("run")
            .with_kind(SpanKind::Consumer)
            .with_attributes(attrs())
            .start_with_context(&tracer, &parent);
        let handler = handed_on(run.span_context(), stored);
        Some(Self {
            run: Context::new().with_span(run),
            handler,
        })
    }

    /// The context a handler gets: the `run` span as its parent.
    pub fn handler_trace(&self) -> TraceContext {
        self.handler.clone()
    }

    /// Closes `run` with its outcome (`completed`, `failed`, `cancelled`, ...; an error status
    /// with `error` for a failure), and records `complete`, the report (from `reported_from` to
    /// now), under it.
    pub fn end(self, outcome: &'static str, error: Option<&str>, reported_from: SystemTime) {
        let tracer = tracer();
        let mut complete = tracer
            .span_builder("complete")
            .with_kind(SpanKind::Client)
            .with_start_time(reported_from)
            .start_with_context(&tracer, &self.run);
        complete.end();
        let span = self.run.span();
        span.set_attribute(KeyValue::new("sluice.outcome", outcome));
        if let Some(message) = error {
            span.set_status(Status::error(message.to_owned()));
        }
        span.end();
    }
}
