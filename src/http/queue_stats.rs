//! Per-shard queue statistics for operators (`GET /api/queues`): what is due, running and
//! dead-lettered in each shard, and which shards could not be read.

use std::collections::BTreeMap;

use axum::extract::State;
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::auth::Caller;
use super::error::{ApiError, Problem};
use crate::http::actions::Action;
use crate::store;

/// The queue-statistics route with its OpenAPI documentation.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(queue_stats))
}

/// Counters and sizes of one shard.
#[derive(Debug, Serialize, ToSchema)]
pub struct ShardStats {
    #[schema(maximum = 65535)]
    pub shard: u16,
    /// Queued executions that are due (runnable in their tenants' queues, ready or waiting).
    pub ready: u64,
    /// Tenants that can start an execution now (due work and a free slot).
    pub runnable_tenants: u64,
    /// Executions running (each holds a lease; the same as `leases`, kept for clients of
    /// earlier versions).
    pub pending: u64,
    /// Leases held.
    pub leases: u64,
    /// Executions on the timer set: scheduled for later, or waiting out a retry backoff.
    pub delayed: u64,
    pub dead_letters: u64,
    /// Counters since the shard's creation: completed, failed, cancelled, reclaimed, fenced,
    /// dead_lettered, dlq_evicted, repaired_*.
    pub counters: BTreeMap<String, u64>,
}

impl From<store::ShardStats> for ShardStats {
    fn from(s: store::ShardStats) -> Self {
        Self {
            shard: s.shard,
            ready: s.ready,
            runnable_tenants: s.runnable_tenants,
            pending: s.pending,
            leases: s.leases,
            delayed: s.delayed,
            dead_letters: s.dead_letters,
            counters: s.counters.into_iter().collect(),
        }
    }
}

/// A shard whose statistics could not be read (the others are reported anyway).
#[derive(Debug, Serialize, ToSchema)]
pub struct UnavailableShard {
    #[schema(maximum = 65535)]
    pub shard: u16,
    /// Why, e.g. a time-out or a refusal by Redis.
    pub error: String,
}

/// Per-shard queue statistics.
#[derive(Debug, Serialize, ToSchema)]
pub struct QueueStats {
    /// Every shard that answered, in shard order.
    pub shards: Vec<ShardStats>,
    /// Shards that did not answer (each shard is read on its own); empty when all did.
    pub unavailable: Vec<UnavailableShard>,
}

/// Queue statistics of every shard (platform admin): ready and pending entries, leases,
/// delayed retries, dead letters, and counters (completed, failed, cancelled, reclaimed,
/// fenced late completions, dead-lettered, evicted dead letters, sweeper repairs).
///
/// Each shard is read on its own: one that does not answer is listed in `unavailable` and
/// the others are reported (503 only when no shard answered).
#[utoipa::path(
    get,
    path = "/api/queues",
    tag = "operations",
    responses(
        (status = 200, description = "Statistics", body = QueueStats),
        (status = 400, description = "The platform admin named an invalid X-Tenant-Id", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not the platform admin", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unavailable: no shard answered", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn queue_stats(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<axum::Json<QueueStats>, ApiError> {
    caller.require(Action::ManagePlatform)?;
    let mut shards = Vec::new();
    let mut unavailable = Vec::new();
    let mut last_error = None;
    for report in state.store.queue_stats().await {
        match report.stats {
            Ok(s) => shards.push(s.into()),
            Err(e) => {
                unavailable.push(UnavailableShard {
                    shard: report.shard.number(),
                    error: e.to_string(),
                });
                last_error = Some(e);
            }
        }
    }
    if shards.is_empty()
        && let Some(e) = last_error
    {
        return Err(e.into());
    }
    Ok(axum::Json(QueueStats {
        shards,
        unavailable,
    }))
}
