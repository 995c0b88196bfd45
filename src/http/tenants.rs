//! `/api/tenants/{tenant}`: a tenant's limits and live usage. The full tenant and API-key
//! surface builds on this.

use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::auth::{Caller, Role};
use super::error::{ApiError, Problem};
use super::extract::{Json, Path};
use crate::admission::TenantId;
use crate::store::{TenantLimits, TenantState};

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(put_tenant, get_tenant))
}

/// Body of `PUT /api/tenants/{tenant}`; each field absent means the server default.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"max_concurrent": 10, "max_queued": 1000, "enabled": true}))]
pub struct TenantSettings {
    /// Executions dispatched or running at once.
    pub max_concurrent: Option<u32>,
    /// Executions waiting beyond `max_concurrent` before admission answers 429.
    pub max_queued: Option<u32>,
    /// A disabled tenant's admissions answer 403; its running work is untouched.
    pub enabled: Option<bool>,
}

/// Live usage of a tenant's quota.
#[derive(Debug, Serialize, ToSchema)]
pub struct TenantUsage {
    pub running: u64,
    /// On the ready stream holding a slot, not yet started.
    pub dispatched: u64,
    /// Over `max_concurrent`, in FIFO order.
    pub waiting: u64,
}

/// A tenant's effective limits and usage.
#[derive(Debug, Serialize, ToSchema)]
pub struct Tenant {
    pub tenant_id: String,
    pub max_concurrent: u32,
    pub max_queued: u32,
    pub enabled: bool,
    pub usage: TenantUsage,
}

impl Tenant {
    fn new(id: &TenantId, s: TenantState) -> Self {
        Self {
            tenant_id: id.to_string(),
            max_concurrent: s.max_concurrent,
            max_queued: s.max_queued,
            enabled: s.enabled,
            usage: TenantUsage {
                running: s.running,
                dispatched: s.dispatched,
                waiting: s.waiting,
            },
        }
    }
}

/// Set a tenant's limits (platform admin).
///
/// Replaces the tenant's own values; absent fields fall back to the server defaults. Raising
/// `max_concurrent` dispatches waiting executions at once.
#[utoipa::path(
    put,
    path = "/api/tenants/{tenant}",
    tag = "tenants",
    params(("tenant" = String, Path, description = "Tenant id")),
    request_body = TenantSettings,
    responses(
        (status = 200, description = "The tenant after the change", body = Tenant),
        (status = 400, description = "Invalid tenant id or body", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not the platform admin", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn put_tenant(
    State(state): State<AppState>,
    caller: Caller,
    Path(tenant): Path<String>,
    Json(body): Json<TenantSettings>,
) -> Result<axum::Json<Tenant>, ApiError> {
    caller.require(Role::PlatformAdmin)?;
    let tenant = TenantId::parse(&tenant)?;
    let limits = TenantLimits {
        max_concurrent: body.max_concurrent,
        max_queued: body.max_queued,
        enabled: body.enabled,
    };
    let s = state.store.put_tenant(&tenant, &limits).await?;
    Ok(axum::Json(Tenant::new(&tenant, s)))
}

/// Read a tenant's limits and live usage (platform admin).
#[utoipa::path(
    get,
    path = "/api/tenants/{tenant}",
    tag = "tenants",
    params(("tenant" = String, Path, description = "Tenant id")),
    responses(
        (status = 200, description = "The tenant", body = Tenant),
        (status = 400, description = "Invalid tenant id", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not the platform admin", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "Never configured and no executions", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn get_tenant(
    State(state): State<AppState>,
    caller: Caller,
    Path(tenant): Path<String>,
) -> Result<axum::Json<Tenant>, ApiError> {
    caller.require(Role::PlatformAdmin)?;
    let tenant = TenantId::parse(&tenant)?;
    match state.store.get_tenant(&tenant).await? {
        Some(s) => Ok(axum::Json(Tenant::new(&tenant, s))),
        None => Err(ApiError::NotFound {
            code: "tenant_not_found",
            detail: "no such tenant".into(),
        }),
    }
}
