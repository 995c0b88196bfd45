//! `/metrics`: Prometheus metrics in the OpenMetrics text format (which Prometheus scrapes
//! natively). The registry lives in the application state, not in a global, so every test
//! app has its own numbers.
//!
//! - `sluice_admissions_total{tenant,outcome}`: `admitted`, `deduplicated`, `conflict`;
//! - `sluice_admissions_rejected_total{tenant,reason}`: `queue_full`, `tenant_disabled`,
//!   `invalid`;
//! - `sluice_http_request_duration_seconds{method,route,status}`: a histogram; `route` is the
//!   route template (`/api/executions/{id}`), so ids do not multiply series;
//! - `sluice_queue_depth{shard}`: length of each shard's ready stream, read from Redis at
//!   scrape time (absent when Redis does not answer);
//! - `sluice_dead_letters{shard}`: records on each shard's dead-letter stream;
//! - `sluice_shard_events{shard,event}`: cumulative counts the scripts keep on Redis —
//!   `completed`, `failed`, `cancelled`, `reclaimed`, `fenced` (late completions refused),
//!   `dead_lettered`, `dlq_evicted` (dead letters pushed out by the cap), `repaired_*` (sweeper).
//!   They are gauges because Redis, not this process, holds them; they only grow.

use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use crate::admission::TenantId;

/// Content type of the exposition.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The `/metrics` route with its OpenAPI documentation.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(metrics))
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AdmissionLabels {
    tenant: String,
    outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RejectionLabels {
    tenant: String,
    reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    method: String,
    route: String,
    status: u16,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShardLabels {
    shard: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShardEventLabels {
    shard: String,
    event: String,
}

fn latency_histogram() -> Histogram {
    // 1 ms to ~16 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

/// The server's metrics and the registry that renders them.
pub struct Metrics {
    registry: Registry,
    admissions: Family<AdmissionLabels, Counter>,
    rejections: Family<RejectionLabels, Counter>,
    latency: Family<RequestLabels, Histogram, fn() -> Histogram>,
    queue_depth: Family<ShardLabels, Gauge>,
    dead_letters: Family<ShardLabels, Gauge>,
    shard_events: Family<ShardEventLabels, Gauge>,
}

/// How an admission ended, for the per-tenant counters.
#[derive(Debug, Clone, Copy)]
pub enum AdmissionOutcome {
    Admitted,
    Deduplicated,
    Conflict,
    QueueFull,
    Disabled,
    Invalid,
}

impl Metrics {
    /// A fresh registry with every sluice metric.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let admissions = Family::<AdmissionLabels, Counter>::default();
        let rejections = Family::<RejectionLabels, Counter>::default();
        let latency = Family::<RequestLabels, Histogram, fn() -> Histogram>::new_with_constructor(
            latency_histogram,
        );
        let queue_depth = Family::<ShardLabels, Gauge>::default();
        let dead_letters = Family::<ShardLabels, Gauge>::default();
        let shard_events = Family::<ShardEventLabels, Gauge>::default();
        registry.register(
            "sluice_dead_letters",
            "Records on each shard's dead-letter stream, read at scrape time",
            dead_letters.clone(),
        );
        registry.register(
            "sluice_shard_events",
            "Cumulative events per shard kept on Redis (completed, fenced, dlq_evicted, ...)",
            shard_events.clone(),
        );
        registry.register(
            "sluice_admissions",
            "Admission requests that reached Redis, by tenant and outcome",
            admissions.clone(),
        );
        registry.register(
            "sluice_admissions_rejected",
            "Admission requests refused, by tenant and reason",
            rejections.clone(),
        );
        registry.register(
            "sluice_http_request_duration_seconds",
            "Time to answer an HTTP request, by method, route template and status",
            latency.clone(),
        );
        registry.register(
            "sluice_queue_depth",
            "Entries on each shard's ready stream, read at scrape time",
            queue_depth.clone(),
        );
        Self {
            registry,
            admissions,
            rejections,
            latency,
            queue_depth,
            dead_letters,
            shard_events,
        }
    }

    /// Counts one admission of `tenant`.
    pub fn admission(&self, tenant: &TenantId, outcome: AdmissionOutcome) {
        let tenant = tenant.to_string();
        let (counted, reason) = match outcome {
            AdmissionOutcome::Admitted => (Some("admitted"), None),
            AdmissionOutcome::Deduplicated => (Some("deduplicated"), None),
            AdmissionOutcome::Conflict => (Some("conflict"), None),
            AdmissionOutcome::QueueFull => (None, Some("queue_full")),
            AdmissionOutcome::Disabled => (None, Some("tenant_disabled")),
            AdmissionOutcome::Invalid => (None, Some("invalid")),
        };
        if let Some(outcome) = counted {
            self.admissions
                .get_or_create(&AdmissionLabels { tenant, outcome })
                .inc();
        } else if let Some(reason) = reason {
            self.rejections
                .get_or_create(&RejectionLabels { tenant, reason })
                .inc();
        }
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Records one request's duration under its route template (`None`: no route matched).
    pub fn observe_latency(
        &self,
        method: &str,
        route: Option<String>,
        status: StatusCode,
        took: std::time::Duration,
    ) {
        self.latency
            .get_or_create(&RequestLabels {
                method: method.to_owned(),
                route: route.unwrap_or_else(|| "unmatched".to_owned()),
                status: status.as_u16(),
            })
            .observe(took.as_secs_f64());
    }
}

/// Prometheus metrics (OpenMetrics text).
///
/// Per-tenant admission counters, a request latency histogram, and per shard the ready-stream
/// depth, the dead-letter count and the event counters kept on Redis (completed, fenced,
/// dlq_evicted, ...), read at scrape time. No authentication, like the probes: keep it off public
/// networks.
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses((status = 200, description = "The metrics", body = String,
        content_type = "application/openmetrics-text")))]
pub async fn metrics(State(state): State<AppState>) -> Response {
    let m = &state.metrics;
    m.queue_depth.clear();
    m.dead_letters.clear();
    m.shard_events.clear();
    let gauge = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    match state.store.queue_stats().await {
        Ok(shards) => {
            for g in shards {
                let shard = format!("s{:02}", g.shard);
                m.queue_depth
                    .get_or_create(&ShardLabels {
                        shard: shard.clone(),
                    })
                    .set(gauge(g.ready));
                m.dead_letters
                    .get_or_create(&ShardLabels {
                        shard: shard.clone(),
                    })
                    .set(gauge(g.dead_letters));
                for (event, n) in g.counters {
                    m.shard_events
                        .get_or_create(&ShardEventLabels {
                            shard: shard.clone(),
                            event,
                        })
                        .set(gauge(n));
                }
            }
        }
        Err(e) => tracing::warn!(error = %e, "shard numbers not read for /metrics"),
    }
    let mut body = String::new();
    if encode(&mut body, &m.registry).is_err() {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    }
    let mut res = body.into_response();
    res.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(OPENMETRICS));
    res
}
