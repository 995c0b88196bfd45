//! Serving `/metrics`: the numbers Redis holds (queue depths, dead letters, the scripts'
//! counters, the last complete minute per shard and per busy tenant) are read at scrape time
//! and set on the gauges, then the whole registry is encoded.

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::text::encode;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::labels::{
    ShardEventLabels, ShardLabels, ShardQuantileLabels, TenantEventLabels, TenantLabels,
    TenantQuantileLabels, TenantStateLabels,
};
use super::{Metrics, OTHER_TENANTS};
use crate::http::AppState;
use crate::http::auth::bearer_is;
use crate::http::error::{ApiError, Problem};
use crate::store::Shard;
use crate::store::trends::ShardTenantMinutes;

/// Content type of the exposition.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The `/metrics` route with its OpenAPI documentation.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(metrics))
}

impl Metrics {
    /// Sets the per-tenant series from what each shard's busy set and counters hold (a shard
    /// that did not answer is counted as unreadable by the shard read before). Tenants beyond
    /// the label limit are summed under `_other`, which has no waiting-time quantiles.
    fn tenant_last_minutes(&self, reads: Vec<(Shard, ShardTenantMinutes)>) {
        self.tenant_executions.clear();
        self.tenant_blocked_keys.clear();
        self.tenant_throttled.clear();
        self.tenant_last_minute.clear();
        self.tenant_last_minute_wait.clear();
        let gauge = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        for (_, read) in reads {
            let Ok(tenants) = read else { continue };
            for (work, minute) in tenants {
                let tenant = self.tenant_label(&work.tenant);
                for (state, n) in [("queued", work.queued), ("running", work.running)] {
                    self.tenant_executions
                        .get_or_create(&TenantStateLabels {
                            tenant: tenant.clone(),
                            state,
                        })
                        .inc_by(gauge(n));
                }
                self.tenant_blocked_keys
                    .get_or_create(&TenantLabels {
                        tenant: tenant.clone(),
                    })
                    .inc_by(gauge(work.blocked_keys));
                if tenant != OTHER_TENANTS {
                    self.tenant_throttled
                        .get_or_create(&TenantLabels {
                            tenant: tenant.clone(),
                        })
                        .set(work.throttled_ms as f64 / 1_000.0);
                }
                for (event, n) in minute.events() {
                    self.tenant_last_minute
                        .get_or_create(&TenantEventLabels {
                            tenant: tenant.clone(),
                            event,
                        })
                        .inc_by(gauge(n));
                }
                if tenant == OTHER_TENANTS {
                    continue;
                }
                for (quantile, q) in [("0.5", 0.5), ("0.99", 0.99)] {
                    if let Some(ms) = minute.wait_quantile_ms(q) {
                        self.tenant_last_minute_wait
                            .get_or_create(&TenantQuantileLabels {
                                tenant: tenant.clone(),
                                quantile,
                            })
                            .set(i64::from(ms));
                    }
                }
            }
        }
    }
}

/// Prometheus metrics (OpenMetrics text).
///
/// Per-tenant admission counters, a request latency histogram, connection counts, and per
/// shard the queue depth, the dead-letter count, the event counters kept on Redis
/// (completed, fenced, dlq_evicted, ...) and the last complete minute of the per-minute
/// counters (events and waiting time), read at scrape time; the same per tenant with work
/// (its queued and running executions, and its last complete minute). It names every tenant,
/// so by default it needs `Authorization: Bearer <metrics token>` (`--metrics-token`; without
/// one configured it answers 401 to everybody); with `--metrics-listen` it is served only on
/// that address (and answers 404 here), without a token unless `--metrics-token` is set;
/// `--metrics-open` serves it to anyone. The platform admin token does not open it.
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses(
        (status = 200, description = "The metrics", body = String,
            content_type = "application/openmetrics-text"),
        (status = 401, description = "`unauthorized`: the request does not carry the metrics \
            token (`--metrics-token`), or none is configured and `/metrics` was not opened \
            (`--metrics-open`, `--metrics-listen`)",
            body = Problem, content_type = "application/problem+json",
            headers(("WWW-Authenticate" = String, description = "`Bearer`"))),
        (status = 404, description = "Served on another address (`--metrics-listen`)",
            body = Problem, content_type = "application/problem+json"),
    ),
    security((), ("metrics_bearer" = [])))]
pub async fn metrics(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let allowed = match &state.auth.metrics_token {
        Some(token) => bearer_is(&headers, token),
        None => state.auth.metrics_open,
    };
    if !allowed {
        return ApiError::Unauthorized.into_response();
    }
    let m = &state.metrics;
    m.queue_depth.clear();
    m.dead_letters.clear();
    m.shard_events.clear();
    let gauge = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    let mut unreadable = 0;
    for report in state.store.queue_stats().await {
        let g = match report.stats {
            Ok(g) => g,
            Err(e) => {
                tracing::warn!(shard = %report.shard.label(), error = %e, "shard numbers not read for /metrics");
                unreadable += 1;
                continue;
            }
        };
        let shard = report.shard.label();
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
    m.last_minute.clear();
    m.last_minute_wait.clear();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    for (shard, read) in state.store.last_minute(now).await {
        // A shard that did not answer was counted above (or answers the next scrape).
        let Ok(minute) = read else { continue };
        let shard = shard.label();
        for (event, n) in minute.events() {
            m.last_minute
                .get_or_create(&ShardEventLabels {
                    shard: shard.clone(),
                    event: event.to_owned(),
                })
                .set(gauge(n));
        }
        for (quantile, q) in [("0.5", 0.5), ("0.99", 0.99)] {
            if let Some(ms) = minute.wait_quantile_ms(q) {
                m.last_minute_wait
                    .get_or_create(&ShardQuantileLabels {
                        shard: shard.clone(),
                        quantile,
                    })
                    .set(i64::from(ms));
            }
        }
    }
    m.tenant_last_minutes(state.store.tenants_last_minute(now).await);
    m.shards_unreadable.set(unreadable);
    let grouped = state.store.group_commit_counts();
    // Counters kept by the store and the deliverer: each scrape adds what happened since the
    // last.
    let caught_up = m.catch_up.lock().expect("metrics catch-up");
    let reported = state.store.completion_counts();
    let webhooks = state.deliverer.counts();
    for (counter, total) in [
        (&m.admission_calls, grouped.calls),
        (&m.admission_calls_carried, grouped.carried),
        (&m.admission_answers_lost, grouped.lost),
        (&m.admission_outcomes_unknown, grouped.unknown),
        (&m.admissions_withdrawn, grouped.withdrawn),
        (&m.completion_calls, reported.calls),
        (&m.completion_calls_carried, reported.carried),
        (&m.webhook_deliveries, webhooks.delivered),
        (&m.webhook_failed_attempts, webhooks.failed),
        (&m.webhook_dropped, webhooks.dropped),
        (
            &m.redis_unconfirmed_answers,
            state.store.unconfirmed_answers(),
        ),
    ] {
        counter.inc_by(total.saturating_sub(counter.get()));
    }
    drop(caught_up);
    m.admissions_grouping.set(gauge(grouped.waiting));
    m.waiters
        .set(i64::try_from(state.waiters.waiters()).unwrap_or(i64::MAX));
    m.waiters_listening
        .set(i64::from(state.waiters.listening()));
    let pull = &state.pull;
    m.pull_long_polls
        .set(i64::try_from(pull.doorbells.waiting()).unwrap_or(i64::MAX));
    m.pull_bell_connections
        .set(i64::try_from(pull.doorbells.connections()).unwrap_or(i64::MAX));
    m.pull_stops_listening
        .set(i64::from(pull.stops.listening()));
    let mut body = String::new();
    if let Err(e) = encode(&mut body, &m.registry) {
        return ApiError::Internal(format!("metrics encoding failed: {e}")).into_response();
    }
    let mut res = body.into_response();
    res.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(OPENMETRICS));
    res
}
