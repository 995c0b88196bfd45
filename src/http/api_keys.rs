//! `/api/tenants/{tenant}/api-keys`: create, list and revoke a tenant's API keys. The platform
//! admin manages every tenant's keys; a tenant's admin key manages its own tenant's. A key's
//! token is returned once, at creation; afterwards keys are listed by id only.

use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::auth::Caller;
use super::error::{ApiError, Problem};
use super::extract::{JsonBody, Path};
use super::tenants::tenant_not_found;
use crate::access::{KeyId, KeyOrigin, KeyRole};
use crate::domain::{TenantId, is_hidden_char};
use crate::http::actions::Action;
use crate::store::{ApiKeyRecord, KeyCreation};

/// Longest key name accepted.
const MAX_NAME_LEN: usize = 64;

/// The API-key routes with their OpenAPI documentation.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_api_key, list_api_keys))
        .routes(routes!(revoke_api_key))
}

/// Body of `POST /api/tenants/{tenant}/api-keys`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"role": "editor", "name": "ci"}))]
pub struct NewApiKey {
    /// What the key may do.
    pub role: KeyRole,
    /// A label to recognise the key by, e.g. where it is used: 1–64 characters, no control
    /// characters and no invisible formatting ones (zero-width, bidirectional overrides and
    /// isolates), so a listing shows what the name is.
    #[schema(
        min_length = 1,
        max_length = 64,
        pattern = "^[^\\x00-\\x1F\\x7F-\\x9F\\xAD\\u061C\\u180E\\u200B-\\u200F\\u2028-\\u202E\\u2060-\\u2064\\u2066-\\u2069\\uFEFF\\uFFF9-\\uFFFB]*$"
    )]
    pub name: Option<String>,
}

/// An API key as listed: never its secret.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({
    "key_id": "3f9a1c0b7d2e4f68",
    "tenant_id": "acme",
    "role": "editor",
    "name": "ci",
    "created_at": "2026-11-29T09:00:00Z"
}))]
pub struct ApiKey {
    /// The key's public id (also inside its token); use it to revoke the key.
    #[schema(pattern = "^[0-9a-f]{16}$")]
    pub key_id: String,
    #[schema(pattern = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
    pub tenant_id: String,
    pub role: KeyRole,
    pub name: Option<String>,
    /// RFC 3339.
    #[schema(format = DateTime)]
    pub created_at: String,
}

impl ApiKey {
    fn new(r: &ApiKeyRecord) -> Self {
        let created_at =
            OffsetDateTime::from_unix_timestamp_nanos(i128::from(r.created_ms) * 1_000_000)
                .ok()
                .and_then(|t| t.format(&Rfc3339).ok())
                .unwrap_or_default();
        Self {
            key_id: r.id.to_string(),
            tenant_id: r.tenant.to_string(),
            role: r.role,
            name: r.name.clone(),
            created_at,
        }
    }
}

/// A new API key with its token, shown this once.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({
    "key_id": "3f9a1c0b7d2e4f68",
    "tenant_id": "acme",
    "role": "editor",
    "name": "ci",
    "created_at": "2026-11-29T09:00:00Z",
    "token": "sk_3f9a1c0b7d2e4f68_9c4e0d5b7a2f81c36e0b9d4a5f7c2e81b3d6a09f4c7e25b8a1d3f60e9b2c7a45"
}))]
pub struct CreatedApiKey {
    #[serde(flatten)]
    pub key: ApiKey,
    /// `Authorization: Bearer <token>`. Shown only in this answer; sluice stores a hash.
    #[schema(pattern = "^sk_[0-9a-f]{16}_[0-9a-f]{64}$")]
    pub token: String,
}

/// A tenant's API keys.
#[derive(Debug, Serialize, ToSchema)]
pub struct ApiKeyList {
    /// In key id order.
    pub api_keys: Vec<ApiKey>,
}

/// Create an API key for a tenant (platform admin, or the tenant's admin key).
///
/// The answer holds the token once; store it, sluice cannot show it again. The tenant must
/// exist (`PUT /api/tenants/{tenant}`) and have fewer than `--max-api-keys-per-tenant` (100)
/// live keys.
#[utoipa::path(
    post,
    path = "/api/tenants/{tenant}/api-keys",
    tag = "api-keys",
    params(("tenant" = String, Path, pattern = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", description = "Tenant id")),
    request_body = NewApiKey,
    responses(
        (status = 201, description = "Created; the token is in this answer only", body = CreatedApiKey,
            headers(
                ("Location" = String, description = "URL of the key (for DELETE)"),
                ("Cache-Control" = String, description = "`no-store`: the token must not be kept by any cache"),
            )),
        (status = 400, description = "Invalid tenant id or body", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Neither the platform admin nor this tenant's admin key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "Not a registered tenant", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`too_many_api_keys`: the tenant has `--max-api-keys-per-tenant` live keys", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn create_api_key(
    State(state): State<AppState>,
    caller: Caller,
    Path(tenant): Path<String>,
    body: JsonBody<NewApiKey>,
) -> Result<Response, ApiError> {
    let tenant = TenantId::parse(&tenant)?;
    caller.require_for(&tenant, Action::ManageApiKeys)?;
    let body = body.parse().await?;
    if let Some(name) = &body.name
        && (name.is_empty()
            || name.chars().count() > MAX_NAME_LEN
            || name.chars().any(is_hidden_char))
    {
        return Err(ApiError::BadRequest {
            code: "invalid_key_name",
            detail: format!(
                "name must be 1–{MAX_NAME_LEN} characters without control, zero-width or \
                 bidirectional formatting characters"
            ),
        });
    }
    // Checked before the (atomic) creation: concurrent creations may each see room, so a
    // tenant can overshoot by the requests in flight at once, never without bound.
    if state.store.count_api_keys(&tenant).await? >= state.max_api_keys {
        return Err(ApiError::Status {
            status: StatusCode::CONFLICT,
            code: "too_many_api_keys",
            detail: format!(
                "this tenant has {} live API keys, the most it may have; revoke one first",
                state.max_api_keys
            ),
        });
    }
    let origin = if state.auth.dev_auth {
        KeyOrigin::DevAuth
    } else {
        KeyOrigin::Authenticated
    };
    let now_ms = i64::try_from(OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000)
        .map_err(|_| ApiError::Internal("clock out of range".into()))?;
    match state
        .store
        .create_api_key(&tenant, body.role, body.name.as_deref(), now_ms, origin)
        .await?
    {
        KeyCreation::Created(record, key) => {
            // This server serves the key from its first request on, whatever its budget for
            // unknown ids; the others learn it from the news.
            state
                .revocations
                .notice(crate::access::AccessChange::KeyCreated(record.id.clone()));
            let location = format!("/api/tenants/{tenant}/api-keys/{}", record.id);
            let created = CreatedApiKey {
                key: ApiKey::new(&record),
                token: key.token,
            };
            let mut res = (StatusCode::CREATED, axum::Json(created)).into_response();
            let headers = res.headers_mut();
            if let Ok(v) = HeaderValue::from_str(&location) {
                headers.insert(header::LOCATION, v);
            }
            // The token is in this answer only: no cache (browser, proxy) may keep a copy.
            headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            Ok(res)
        }
        KeyCreation::NoTenant => Err(tenant_not_found()),
    }
}

/// List a tenant's API keys by id, never by value (platform admin, or the tenant's admin key).
#[utoipa::path(
    get,
    path = "/api/tenants/{tenant}/api-keys",
    tag = "api-keys",
    params(("tenant" = String, Path, pattern = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", description = "Tenant id")),
    responses(
        (status = 200, description = "The tenant's live keys", body = ApiKeyList),
        (status = 400, description = "Invalid tenant id", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Neither the platform admin nor this tenant's admin key", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn list_api_keys(
    State(state): State<AppState>,
    caller: Caller,
    Path(tenant): Path<String>,
) -> Result<axum::Json<ApiKeyList>, ApiError> {
    let tenant = TenantId::parse(&tenant)?;
    caller.require_for(&tenant, Action::ManageApiKeys)?;
    let keys = state.store.list_api_keys(&tenant).await?;
    Ok(axum::Json(ApiKeyList {
        api_keys: keys.iter().map(ApiKey::new).collect(),
    }))
}

/// Revoke one of a tenant's API keys (platform admin, or the tenant's admin key).
///
/// The next request with the key is a 401. A key may revoke itself.
#[utoipa::path(
    delete,
    path = "/api/tenants/{tenant}/api-keys/{key_id}",
    tag = "api-keys",
    params(
        ("tenant" = String, Path, pattern = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", description = "Tenant id"),
        ("key_id" = String, Path, pattern = "^[0-9a-f]{16}$", description = "Key id (16 lowercase hex)"),
    ),
    responses(
        (status = 204, description = "Revoked"),
        (status = 400, description = "Invalid tenant id", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Neither the platform admin nor this tenant's admin key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such key for this tenant", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn revoke_api_key(
    State(state): State<AppState>,
    caller: Caller,
    Path((tenant, key_id)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let tenant = TenantId::parse(&tenant)?;
    caller.require_for(&tenant, Action::ManageApiKeys)?;
    let not_found = || ApiError::NotFound {
        code: "api_key_not_found",
        detail: "no such API key for this tenant".into(),
    };
    let id = KeyId::parse(&key_id).ok_or_else(not_found)?;
    if state.store.revoke_api_key(&tenant, &id).await? {
        // This server refuses the key from its next request on; the others when the news
        // reaches them (at most `revocation::HIT_TTL` later without it).
        state
            .revocations
            .notice(crate::access::AccessChange::KeyRevoked(id));
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(not_found())
    }
}
