//! `/api/tenants/{tenant}/trends` and `/api/trends`: what happened each minute of the last
//! hours (admissions, starts, completions, failures, cancellations, waiting time p50/p99),
//! from the per-minute counters the scripts keep on Redis (`crate::store::trends`), and the
//! tenants with work now. The console's charts draw these; `/metrics` reads the same counters.

use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::auth::Caller;
use super::error::{ApiError, Problem};
use super::extract::{Path, QueryLater};
use crate::domain::{TenantId, rfc3339_from_ms};
use crate::http::actions::Action;
use crate::store::trends::{MINUTE_MS, WAIT_BOUNDS_MS};
use crate::store::{Minute, Trends};

/// The trend routes with their OpenAPI documentation.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(get_tenant_trends))
        .routes(routes!(get_trends))
}

/// The window of a trends call.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TrendParams {
    /// Hours back from now (default 24): the series has `hours * 60` minutes, the current one
    /// last.
    #[param(minimum = 1, maximum = 24)]
    pub hours: Option<u32>,
}

/// Most hours a series covers (the counters are kept 25 hours after their day).
const MAX_HOURS: u32 = 24;

impl TrendParams {
    fn hours(&self) -> Result<u32, ApiError> {
        let h = self.hours.unwrap_or(MAX_HOURS);
        if !(1..=MAX_HOURS).contains(&h) {
            return Err(ApiError::BadRequest {
                code: "invalid_hours",
                detail: format!("hours must be between 1 and {MAX_HOURS}"),
            });
        }
        Ok(h)
    }
}

/// Sums over the whole window.
#[derive(Debug, Serialize, ToSchema)]
pub struct TrendTotals {
    pub admissions: u64,
    pub starts: u64,
    pub completions: u64,
    pub failures: u64,
    pub cancellations: u64,
    /// Median waiting time of every start in the window (bucket upper bound, ms; null
    /// without starts).
    pub wait_p50_ms: Option<u64>,
    /// 99th percentile of the same.
    pub wait_p99_ms: Option<u64>,
}

/// Per-minute series, oldest minute first; entry `i` of every array is minute `minutes[i]`.
#[derive(Debug, Serialize, ToSchema)]
pub struct TrendSeries {
    /// Start of each minute (RFC 3339, UTC). The last one is the current minute, still
    /// counting.
    pub minutes: Vec<String>,
    /// New executions admitted (a deduplicated request or a retry is not one).
    pub admissions: Vec<u64>,
    /// Runs started (every attempt).
    pub starts: Vec<u64>,
    /// Executions that ended `completed`.
    pub completions: Vec<u64>,
    /// Executions that ended `failed`, dead-lettered included (an attempt that is retried is
    /// not one).
    pub failures: Vec<u64>,
    /// Executions that ended `cancelled`.
    pub cancellations: Vec<u64>,
    /// Median waiting time (admission to start) of the minute's starts, in ms: the upper
    /// bound of the histogram bucket it falls in (see `wait_bounds_ms`; 30001 means more
    /// than 30 s). Null in a minute without starts.
    pub wait_p50_ms: Vec<Option<u64>>,
    /// 99th percentile of the same, read the same way.
    pub wait_p99_ms: Vec<Option<u64>>,
    /// The histogram's bucket bounds (ms): a percentile reads as one of these, or 30001.
    pub wait_bounds_ms: Vec<u64>,
    pub totals: TrendTotals,
}

impl From<&Trends> for TrendSeries {
    fn from(t: &Trends) -> Self {
        let m = &t.minutes;
        let pick = |f: fn(&Minute) -> u64| -> Vec<u64> { m.iter().map(f).collect() };
        let mut all = Minute::default();
        for minute in m {
            all.wait
                .iter_mut()
                .zip(minute.wait)
                .for_each(|(a, b)| *a += b);
        }
        let sum = |f: fn(&Minute) -> u64| -> u64 { m.iter().map(f).sum() };
        Self {
            minutes: (0..m.len() as u64)
                .map(|i| {
                    let ms = (t.first_minute + i) * MINUTE_MS;
                    rfc3339_from_ms(&ms.to_string()).unwrap_or_default()
                })
                .collect(),
            admissions: pick(|x| x.admitted),
            starts: pick(|x| x.started),
            completions: pick(|x| x.completed),
            failures: pick(|x| x.failed),
            cancellations: pick(|x| x.cancelled),
            wait_p50_ms: m.iter().map(|x| quantile(x, 0.5)).collect(),
            wait_p99_ms: m.iter().map(|x| quantile(x, 0.99)).collect(),
            wait_bounds_ms: WAIT_BOUNDS_MS.iter().map(|&b| u64::from(b)).collect(),
            totals: TrendTotals {
                admissions: sum(|x| x.admitted),
                starts: sum(|x| x.started),
                completions: sum(|x| x.completed),
                failures: sum(|x| x.failed),
                cancellations: sum(|x| x.cancelled),
                wait_p50_ms: quantile(&all, 0.5),
                wait_p99_ms: quantile(&all, 0.99),
            },
        }
    }
}

/// A minute's waiting-time quantile as the wire spells it.
fn quantile(m: &Minute, q: f64) -> Option<u64> {
    m.wait_quantile_ms(q).map(u64::from)
}

/// One tenant's trends.
#[derive(Debug, Serialize, ToSchema)]
pub struct TenantTrends {
    #[schema(pattern = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
    pub tenant_id: String,
    #[schema(minimum = 1, maximum = 24)]
    pub hours: u32,
    pub series: TrendSeries,
}

/// A tenant with queued or running executions now.
#[derive(Debug, Serialize, ToSchema)]
pub struct TenantWork {
    #[schema(pattern = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
    pub tenant_id: String,
    /// Whether it is in the registry (`PUT /api/tenants/{tenant}`); `sluice dev`'s tenants
    /// and any tenant admitting under the server defaults are not.
    pub registered: bool,
    /// Executions queued (scheduled, waiting or dispatched).
    pub queued: u64,
    /// Executions running.
    pub running: u64,
}

/// A shard whose counters could not be read (the others are summed anyway).
#[derive(Debug, Serialize, ToSchema)]
pub struct UnreadShard {
    #[schema(maximum = 65535)]
    pub shard: u16,
    pub error: String,
}

/// Every tenant's trends summed, and who has work now.
#[derive(Debug, Serialize, ToSchema)]
pub struct PlatformTrends {
    #[schema(minimum = 1, maximum = 24)]
    pub hours: u32,
    pub series: TrendSeries,
    /// Every tenant with queued or running executions, registered or not, by id.
    pub tenants_with_work: Vec<TenantWork>,
    /// Shards that did not answer: their tenants are missing from both; empty when all did.
    pub unavailable: Vec<UnreadShard>,
}

/// Now, in Unix milliseconds (the window ends with this minute).
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A tenant's activity per minute over the last hours (platform admin, or the tenant's admin
/// key).
///
/// Admissions, starts, completions, failures and cancellations per minute, and the waiting
/// time (admission to start) p50/p99, read from counters the scripts keep on Redis (at most
/// 52 KB per tenant per active day, kept 25 hours after the day ends). Costs one round trip
/// to the tenant's shard (at most two ranges of one key each). A tenant that never did
/// anything reads as zeros.
#[utoipa::path(
    get,
    path = "/api/tenants/{tenant}/trends",
    tag = "tenants",
    params(
        ("tenant" = String, Path, pattern = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", description = "Tenant id"),
        TrendParams,
    ),
    responses(
        (status = 200, description = "The tenant's series", body = TenantTrends),
        (status = 400, description = "Invalid tenant id or hours", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Neither the platform admin nor this tenant's admin key", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn get_tenant_trends(
    State(state): State<AppState>,
    caller: Caller,
    Path(tenant): Path<String>,
    query: QueryLater<TrendParams>,
) -> Result<axum::Json<TenantTrends>, ApiError> {
    let tenant = TenantId::parse(&tenant)?;
    caller.require_for(&tenant, Action::ReadTrends)?;
    let hours = query.parse()?.hours()?;
    let trends = state
        .store
        .tenant_trends(&tenant, u64::from(hours) * 60, now_ms())
        .await?;
    Ok(axum::Json(TenantTrends {
        tenant_id: tenant.to_string(),
        hours,
        series: (&trends).into(),
    }))
}

/// Every tenant's activity per minute summed, and the tenants with work now (platform admin).
///
/// The same series as `GET /api/tenants/{tenant}/trends`, summed over all tenants (each shard
/// keeps the sum of its tenants, so this reads one key range per shard, not per tenant), and
/// every tenant with queued or running executions, registered or not, with its counts. Costs
/// two round trips per shard (all shards at once) plus one to the registry; the second reads
/// two counts per tenant with work. A shard that does not answer is listed in `unavailable`
/// (503 only when none did).
#[utoipa::path(
    get,
    path = "/api/trends",
    tag = "operations",
    params(TrendParams),
    responses(
        (status = 200, description = "The summed series and the tenants with work", body = PlatformTrends),
        (status = 400, description = "Invalid hours, or the platform admin named an invalid X-Tenant-Id", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not the platform admin", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unavailable: no shard answered", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn get_trends(
    State(state): State<AppState>,
    caller: Caller,
    query: QueryLater<TrendParams>,
) -> Result<axum::Json<PlatformTrends>, ApiError> {
    caller.require(Action::ManagePlatform)?;
    let hours = query.parse()?.hours()?;
    let read = state
        .store
        .platform_trends(u64::from(hours) * 60, now_ms())
        .await;
    let all_failed = read.unavailable.len() == state.store.shards().all().count();
    let mut unavailable = Vec::new();
    let mut last_error = None;
    for (shard, e) in read.unavailable {
        unavailable.push(UnreadShard {
            shard: shard.number(),
            error: e.to_string(),
        });
        last_error = Some(e);
    }
    if all_failed && let Some(e) = last_error {
        return Err(e.into());
    }
    let ids: Vec<TenantId> = read.busy.iter().map(|w| w.tenant.clone()).collect();
    let registered = state.store.registered(&ids).await?;
    let tenants_with_work = read
        .busy
        .into_iter()
        .zip(registered)
        .map(|(w, registered)| TenantWork {
            tenant_id: w.tenant.to_string(),
            registered,
            queued: w.queued,
            running: w.running,
        })
        .collect();
    Ok(axum::Json(PlatformTrends {
        hours,
        series: (&read.trends).into(),
        tenants_with_work,
        unavailable,
    }))
}
