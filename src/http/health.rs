//! Probes for orchestrators, outside `/api` and without authentication.

use axum::extract::State;
use axum::http::StatusCode;
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::error::{ApiError, Problem};

/// The probe routes with their OpenAPI documentation.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(healthz))
        .routes(routes!(readyz))
}

/// Probe answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    /// `ok`
    pub status: &'static str,
}

/// Liveness: the process is up and serving HTTP.
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses((status = 200, description = "Up", body = Health)))]
pub async fn healthz() -> axum::Json<Health> {
    axum::Json(Health { status: "ok" })
}

/// Readiness: Redis answers and sluice's scripts are loaded (reloaded if they were flushed).
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses(
        (status = 200, description = "Ready", body = Health),
        (status = 503, description = "Redis unavailable", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn readyz(
    State(state): State<AppState>,
) -> Result<(StatusCode, axum::Json<Health>), ApiError> {
    state.store.ready().await?;
    Ok((StatusCode::OK, axum::Json(Health { status: "ok" })))
}
