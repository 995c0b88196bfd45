//! Operator views of the queues: dead letters (`/api/dlq`) and per-shard statistics
//! (`/api/queues`).

use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::auth::{Caller, Role};
use super::error::{ApiError, Problem};
use super::extract::Query;
use crate::store::{DeadLetter, ShardStats};

/// The dead-letter and queue-statistics routes with their OpenAPI documentation.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_dead_letters))
        .routes(routes!(queue_stats))
}

/// Paging of `GET /api/dlq`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeadLetterParams {
    /// Page size, 1–200 (default 50).
    pub limit: Option<u32>,
    /// `next_before` of the previous page: only older records.
    pub before: Option<String>,
}

/// A page of dead letters, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeadLetterPage {
    pub dead_letters: Vec<DeadLetter>,
    /// Pass as `before` for older records; null when this page was not full.
    pub next_before: Option<String>,
}

/// List dead letters, newest first.
///
/// With a tenant (`X-Tenant-Id` or a tenant credential) only that tenant's records; the
/// platform admin without `X-Tenant-Id` sees every tenant's (and poison records, which belong
/// to no tenant).
#[utoipa::path(
    get,
    path = "/api/dlq",
    tag = "operations",
    params(DeadLetterParams),
    responses(
        (status = 200, description = "One page", body = DeadLetterPage),
        (status = 400, description = "Invalid paging", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn list_dead_letters(
    State(state): State<AppState>,
    caller: Caller,
    Query(p): Query<DeadLetterParams>,
) -> Result<axum::Json<DeadLetterPage>, ApiError> {
    let tenant = match caller.acting_tenant() {
        Some(_) => Some(caller.tenant_with(Role::Viewer)?),
        None => {
            caller.require(Role::PlatformAdmin)?;
            None
        }
    };
    let limit = p.limit.unwrap_or(50);
    if !(1..=200).contains(&limit) {
        return Err(ApiError::BadRequest {
            code: "invalid_limit",
            detail: "limit must be between 1 and 200".into(),
        });
    }
    if let Some(b) = &p.before
        && !is_stream_id(b)
    {
        return Err(ApiError::BadRequest {
            code: "invalid_cursor",
            detail: "before must be a next_before returned by this call".into(),
        });
    }
    let records = state
        .store
        .dead_letters(tenant, p.before.as_deref(), limit as usize)
        .await?;
    let next_before = (records.len() == limit as usize)
        .then(|| records.last().map(|r| r.entry_id.clone()))
        .flatten();
    Ok(axum::Json(DeadLetterPage {
        dead_letters: records,
        next_before,
    }))
}

fn is_stream_id(s: &str) -> bool {
    let (ms, seq) = s.split_once('-').unwrap_or((s, "0"));
    !ms.is_empty()
        && ms.bytes().all(|b| b.is_ascii_digit())
        && seq.bytes().all(|b| b.is_ascii_digit())
}

/// Per-shard queue statistics.
#[derive(Debug, Serialize, ToSchema)]
pub struct QueueStats {
    pub shards: Vec<ShardStats>,
}

/// Queue statistics of every shard (platform admin): ready and pending entries, leases,
/// delayed retries, dead letters, and counters (completed, failed, cancelled, reclaimed,
/// fenced late completions, dead-lettered, evicted dead letters, sweeper repairs).
#[utoipa::path(
    get,
    path = "/api/queues",
    tag = "operations",
    responses(
        (status = 200, description = "Statistics", body = QueueStats),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not the platform admin", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn queue_stats(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<axum::Json<QueueStats>, ApiError> {
    caller.require(Role::PlatformAdmin)?;
    Ok(axum::Json(QueueStats {
        shards: state.store.queue_stats().await?,
    }))
}
