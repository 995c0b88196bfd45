//! `/api/tenants`: the tenant registry, each tenant's limits and live usage. Creating,
//! changing, listing and deleting tenants is the platform admin's; a tenant admin key may read
//! its own tenant. API keys are in `api_keys.rs`.

use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::auth::{Caller, Role};
use super::error::{ApiError, Problem};
use super::extract::{Json, Path};
use crate::admission::TenantId;
use crate::store::{Change, TenantLimits, TenantState};

/// The tenant routes with their OpenAPI documentation.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(put_tenant, get_tenant, delete_tenant))
        .routes(routes!(list_tenants))
}

/// Body of `PUT /api/tenants/{tenant}`: only the fields it names change. A field absent keeps
/// its current value (the server default for a tenant never set); `null` drops the tenant's
/// own value so the server default applies again.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"max_concurrent": 10, "max_queued": 1000, "enabled": true}))]
pub struct TenantSettings {
    /// Executions dispatched or running at once. Raising it dispatches every waiting
    /// execution that now fits, oldest first.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<u32>, nullable)]
    pub max_concurrent: Option<Option<u32>>,
    /// Executions waiting beyond `max_concurrent` before admission answers 429.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<u32>, nullable)]
    pub max_queued: Option<Option<u32>>,
    /// A disabled tenant's admissions answer 403; nothing else changes.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<bool>, nullable)]
    pub enabled: Option<Option<bool>>,
}

/// Tells a field given as `null` (`Some(None)`) from one left out (`None`, by `default`).
fn present<'de, T, D>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    T: Deserialize<'de>,
    D: serde::Deserializer<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

/// The store's change for one field of `TenantSettings`.
fn change<T>(field: Option<Option<T>>) -> Change<T> {
    match field {
        None => Change::Keep,
        Some(None) => Change::Reset,
        Some(Some(v)) => Change::Set(v),
    }
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
#[schema(example = json!({
    "tenant_id": "acme",
    "max_concurrent": 10,
    "max_queued": 1000,
    "enabled": true,
    "usage": {"running": 3, "dispatched": 7, "waiting": 42}
}))]
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

/// Create a tenant or set its limits (platform admin).
///
/// Registers the tenant (so it is listed and can have API keys) and changes only the fields
/// the body names: an absent field keeps its value, `null` restores the server default.
/// Raising `max_concurrent` dispatches every waiting execution that now fits, oldest first,
/// before answering; `enabled: false` makes admissions answer 403 `tenant_disabled` without
/// touching work already admitted.
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
    state.store.register_tenant(&tenant).await?;
    let limits = TenantLimits {
        max_concurrent: change(body.max_concurrent),
        max_queued: change(body.max_queued),
        enabled: change(body.enabled),
    };
    let s = state.store.put_tenant(&tenant, &limits).await?;
    Ok(axum::Json(Tenant::new(&tenant, s)))
}

/// Read a tenant's limits and live usage (platform admin, or the tenant's admin key).
#[utoipa::path(
    get,
    path = "/api/tenants/{tenant}",
    tag = "tenants",
    params(("tenant" = String, Path, description = "Tenant id")),
    responses(
        (status = 200, description = "The tenant", body = Tenant),
        (status = 400, description = "Invalid tenant id", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Neither the platform admin nor this tenant's admin key", body = Problem, content_type = "application/problem+json"),
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
    let tenant = TenantId::parse(&tenant)?;
    caller.admin_of(&tenant, Role::TenantAdmin)?;
    match state.store.get_tenant(&tenant).await? {
        Some(s) => Ok(axum::Json(Tenant::new(&tenant, s))),
        None => Err(tenant_not_found()),
    }
}

/// The not-found error for tenants.
pub fn tenant_not_found() -> ApiError {
    ApiError::NotFound {
        code: "tenant_not_found",
        detail: "no such tenant".into(),
    }
}

/// The registered tenants.
#[derive(Debug, Serialize, ToSchema)]
pub struct TenantList {
    /// In tenant id order.
    pub tenants: Vec<Tenant>,
}

/// List the registered tenants with their limits and usage (platform admin).
///
/// Tenants are registered by `PUT /api/tenants/{tenant}`. One Redis round trip per tenant.
#[utoipa::path(
    get,
    path = "/api/tenants",
    tag = "tenants",
    responses(
        (status = 200, description = "Every registered tenant", body = TenantList),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not the platform admin", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn list_tenants(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<axum::Json<TenantList>, ApiError> {
    caller.require(Role::PlatformAdmin)?;
    let mut tenants = Vec::new();
    for id in state.store.list_tenants().await? {
        if let Some(s) = state.store.get_tenant(&id).await? {
            tenants.push(Tenant::new(&id, s));
        }
    }
    Ok(axum::Json(TenantList { tenants }))
}

/// Delete a tenant (platform admin).
///
/// Unregisters it, revokes all its API keys (their next request is a 401) and drops its own
/// limits, so the server defaults apply. Its executions run their course, none stranded:
/// waiting ones that fit the default limits are dispatched now, the rest as slots free up;
/// running ones finish; terminal ones expire with retention. Cancel or force-delete them
/// first to stop them.
#[utoipa::path(
    delete,
    path = "/api/tenants/{tenant}",
    tag = "tenants",
    params(("tenant" = String, Path, description = "Tenant id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 400, description = "Invalid tenant id", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not the platform admin", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "Not a registered tenant", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn delete_tenant(
    State(state): State<AppState>,
    caller: Caller,
    Path(tenant): Path<String>,
) -> Result<StatusCode, ApiError> {
    caller.require(Role::PlatformAdmin)?;
    let tenant = TenantId::parse(&tenant)?;
    if state.store.delete_tenant(&tenant).await? {
        state.metrics.forget_tenant(&tenant);
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(tenant_not_found())
    }
}
