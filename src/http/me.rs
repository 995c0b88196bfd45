//! `GET /api/me`: who the caller is — its tenant, role and key — and what it may do (the
//! server's own table, `super::actions`), so a client (the web console first) offers exactly
//! the calls the credential allows without trying each or keeping its own copy of the rules.
//! Nothing here reads Redis beyond the authentication every call does.

use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::actions::Action;
use super::auth::{Caller, Credential, Grant};
use super::error::{ApiError, Problem};
use crate::access::KeyRole;

/// The `/api/me` route with its OpenAPI documentation.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(get_me))
}

/// What a caller may do, in the API's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CallerRole {
    /// A tenant key that leases and runs executions through `/api/worker/*` only (it cannot
    /// call `/api/me` itself; the console names it when listing keys).
    Worker,
    /// A tenant key that reads executions and dead letters.
    Viewer,
    /// A tenant key that also admits, cancels and retries executions.
    Editor,
    /// A tenant key that also force-deletes, reads its tenant and manages its keys.
    Admin,
    /// The platform admin token (or any caller of a dev-auth server): everything, for any
    /// tenant.
    PlatformAdmin,
}

impl From<Grant> for CallerRole {
    fn from(g: Grant) -> Self {
        match g {
            Grant::Key(KeyRole::Worker) => CallerRole::Worker,
            Grant::Key(KeyRole::Viewer) => CallerRole::Viewer,
            Grant::Key(KeyRole::Editor) => CallerRole::Editor,
            Grant::Key(KeyRole::Admin) => CallerRole::Admin,
            Grant::PlatformAdmin => CallerRole::PlatformAdmin,
        }
    }
}

/// How the caller authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AuthKind {
    /// A tenant API key (`sk_...`).
    ApiKey,
    /// The platform admin token.
    AdminToken,
    /// No credential: the server runs with `--dev-auth`.
    DevAuth,
}

/// The caller of this request.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(example = json!({
    "tenant_id": "acme",
    "role": "editor",
    "key_id": "3f2a9c0d1e4b5a69",
    "auth": "api_key",
    "may": ["read", "admit", "cancel", "retry", "reschedule", "dismiss_dead_letters"]
}))]
pub struct Me {
    /// The tenant the call acts for: the key's own, or the `X-Tenant-Id` the platform admin
    /// sent; null for the platform admin without one.
    #[schema(pattern = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
    pub tenant_id: Option<String>,
    pub role: CallerRole,
    /// The API key's id (as `GET /api/tenants/{tenant}/api-keys` lists it); null for the
    /// admin token and dev auth.
    #[schema(pattern = "^[0-9a-f]{16}$")]
    pub key_id: Option<String>,
    pub auth: AuthKind,
    /// Every action this credential may take, as the server checks it: for the tenant it
    /// acts for, or every tenant for the platform admin. Offer these and no others; a new
    /// server may name actions a client does not know yet (ignore them).
    pub may: Vec<Action>,
}

/// Who the caller is: tenant, role and API key id.
///
/// Any valid credential may ask; it reveals only what the caller already holds. A client
/// uses it to check a token (401 when it is unknown or revoked) and to offer only the
/// actions its role allows.
#[utoipa::path(
    get,
    path = "/api/me",
    tag = "auth",
    responses(
        (status = 200, description = "The caller", body = Me),
        (status = 400, description = "The platform admin named an invalid X-Tenant-Id", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "X-Tenant-Id names another tenant than the API key's", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unavailable (an API key could not be checked)", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn get_me(caller: Caller) -> Result<axum::Json<Me>, ApiError> {
    let (key_id, auth) = match caller.credential() {
        Credential::ApiKey(id) => (Some(id.as_str().to_owned()), AuthKind::ApiKey),
        Credential::AdminToken => (None, AuthKind::AdminToken),
        Credential::DevAuth => (None, AuthKind::DevAuth),
    };
    Ok(axum::Json(Me {
        tenant_id: caller.acting_tenant().map(|t| t.as_str().to_owned()),
        role: caller.grant().into(),
        key_id,
        auth,
        may: caller.actions(),
    }))
}
