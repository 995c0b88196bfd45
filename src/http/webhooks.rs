//! `/api/tenants/{tenant}/webhook`: a tenant's webhook — the address its terminal changes are
//! POSTed to, signed with a secret shown once — and the log of its deliveries. The platform
//! admin or the tenant's admin key. Delivery itself is `crate::delivery`'s.

use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::auth::Caller;
use super::error::{ApiError, Problem};
use super::extract::{JsonBody, Path, QueryLater};
use super::tenants::tenant_not_found;
use crate::delivery::{check_url, new_secret};
use crate::domain::TenantId;
use crate::http::actions::Action;
use crate::store::{DELIVERY_LOG_CAP, DeliveryRecord, WebhookSet, WebhookState};

/// The webhook routes with their OpenAPI documentation.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(put_webhook, get_webhook, delete_webhook))
        .routes(routes!(list_deliveries))
}

/// Body of `PUT /api/tenants/{tenant}/webhook`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"url": "https://hooks.example.com/sluice"}))]
pub struct WebhookSettings {
    /// Where events are POSTed: `https://` (the receiver's certificate verified against the
    /// system's roots and `--webhook-ca-file`) or `http://`, a host name or a dotted IPv4
    /// address, an optional port, an optional path and query (no fragment). It is resolved at every delivery, and refused when it resolves to a
    /// loopback, private or link-local address unless the server runs with
    /// `--webhook-allow-private`.
    #[schema(
        min_length = 8,
        max_length = 2048,
        pattern = "^https?://(([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\\.)*[A-Za-z]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?|((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9]))(:([0-9]{1,4}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5]))?([/?][^\\s#]*)?$"
    )]
    pub url: String,
    /// Make a new signing secret (shown in this answer only); the old one stops signing at
    /// once. A webhook's first `PUT` always makes one.
    #[serde(default)]
    pub rotate_secret: bool,
}

/// A tenant's webhook and how its deliveries go.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({
    "tenant_id": "acme",
    "url": "https://hooks.example.com/sluice",
    "created_at": "2026-12-02T09:00:00Z",
    "pending": 0,
    "dropped": 0,
    "delivered": 42,
    "failed_attempts": 1,
    "last_delivered_at": "2026-12-02T09:30:00Z"
}))]
pub struct Webhook {
    #[schema(pattern = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
    pub tenant_id: String,
    pub url: String,
    /// When the webhook was first set (RFC 3339).
    #[schema(format = DateTime)]
    pub created_at: String,
    /// Events waiting to be delivered (or delivered again after a failure).
    pub pending: u64,
    /// Events dropped undelivered: evicted from a full outbox (10,000 per tenant) or older
    /// than the server's `--webhook-max-age-secs`.
    pub dropped: u64,
    /// Events delivered (the receiver answered 2xx).
    pub delivered: u64,
    /// Delivery attempts that failed (no answer in time, a refused address, or an answer
    /// other than 2xx); each is in the delivery log.
    pub failed_attempts: u64,
    /// The last delivery (RFC 3339), if any.
    #[schema(format = DateTime)]
    pub last_delivered_at: Option<String>,
}

impl Webhook {
    fn new(tenant: &TenantId, s: &WebhookState) -> Self {
        Self {
            tenant_id: tenant.to_string(),
            url: s.url.clone(),
            created_at: rfc3339(s.created_ms),
            pending: s.pending,
            dropped: s.dropped,
            delivered: s.delivered,
            failed_attempts: s.failed_attempts,
            last_delivered_at: s.last_delivered_ms.map(rfc3339),
        }
    }
}

/// A webhook after `PUT`, with its new signing secret when it got one.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({
    "tenant_id": "acme",
    "url": "https://hooks.example.com/sluice",
    "created_at": "2026-12-02T09:00:00Z",
    "pending": 0,
    "dropped": 0,
    "delivered": 0,
    "failed_attempts": 0,
    "last_delivered_at": null,
    "secret": "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD"
}))]
pub struct WebhookWithSecret {
    #[serde(flatten)]
    pub webhook: Webhook,
    /// The signing secret (`whsec_` + base64 of the key), in this answer only, and only when
    /// it is new (the first `PUT`, or `rotate_secret`). Verify `webhook-signature` with it
    /// as the Standard Webhooks specification says.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^whsec_[A-Za-z0-9+/]+=*$")]
    pub secret: Option<String>,
}

/// One delivery attempt.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({
    "at": "2026-12-02T09:30:00.120Z",
    "webhook_id": "msg_0193a1b2c3d47e8f9a0b1c2d3e4f5a6b_1",
    "type": "execution.completed",
    "execution_id": "0193a1b2c3d47e8f9a0b1c2d3e4f5a6b",
    "delivered": true,
    "status": 200,
    "error": null,
    "duration_ms": 12,
    "attempt": 1
}))]
pub struct Delivery {
    /// When the attempt ended (RFC 3339).
    #[schema(format = DateTime)]
    pub at: String,
    /// The `webhook-id` header it carried: the same for every attempt of one event.
    pub webhook_id: String,
    /// `execution.completed`, `execution.failed`, `execution.cancelled` or
    /// `execution.deleted`.
    #[serde(rename = "type")]
    pub event_type: String,
    pub execution_id: String,
    /// Whether the receiver took it (answered 2xx).
    pub delivered: bool,
    /// The receiver's status code; null when it did not answer.
    #[schema(minimum = 100, maximum = 599)]
    pub status: Option<u16>,
    /// Why the attempt failed, if it did.
    pub error: Option<String>,
    pub duration_ms: u64,
    /// The how-manieth attempt of this event by the server that made it.
    #[schema(format = Int64, minimum = 1, maximum = 4294967295_u64)]
    pub attempt: u32,
}

impl From<DeliveryRecord> for Delivery {
    fn from(r: DeliveryRecord) -> Self {
        Self {
            at: rfc3339(r.at_ms),
            delivered: r.delivered(),
            webhook_id: r.webhook_id,
            event_type: r.event_type,
            execution_id: r.execution_id,
            status: r.status,
            error: r.error,
            duration_ms: r.duration_ms,
            attempt: r.attempt,
        }
    }
}

/// A tenant's last delivery attempts.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeliveryList {
    /// Newest first.
    pub deliveries: Vec<Delivery>,
}

/// Query of `GET /api/tenants/{tenant}/webhook/deliveries`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct DeliveryQuery {
    /// Most attempts to list (1–200, default 50).
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<u32>,
}

fn rfc3339(ms: u64) -> String {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_default()
}

fn webhook_not_found() -> ApiError {
    ApiError::NotFound {
        code: "webhook_not_found",
        detail: "this tenant has no webhook".into(),
    }
}

/// The tenant a webhook call is about, after checking the caller may manage it and that it
/// is registered.
async fn managed_tenant(
    state: &AppState,
    caller: &Caller,
    tenant: &str,
) -> Result<TenantId, ApiError> {
    let tenant = TenantId::parse(tenant)?;
    caller.require_for(&tenant, Action::ManageWebhook)?;
    if !state.store.tenant_registered(&tenant).await? {
        return Err(tenant_not_found());
    }
    Ok(tenant)
}

/// Set a tenant's webhook (platform admin, or the tenant's admin key).
///
/// From now on each of the tenant's executions that completes, fails (dead-lettered
/// included), is cancelled or force-deleted is POSTed to `url` as a JSON event (`type`,
/// `timestamp`, `data`), signed as the Standard Webhooks specification says (`webhook-id`,
/// `webhook-timestamp`, `webhook-signature`: HMAC-SHA256 with the secret). Delivery is at
/// least once: an event leaves the outbox only when the receiver answers 2xx, and is sent
/// again (same `webhook-id`, same body) until then, with backoff; drop duplicates by
/// `webhook-id`. One execution's events arrive in order (`data.sequence`). Redirects are not
/// followed. The first `PUT` makes the signing secret and answers it, once; later ones keep it
/// unless `rotate_secret` is true.
#[utoipa::path(
    put,
    path = "/api/tenants/{tenant}/webhook",
    tag = "webhooks",
    params(("tenant" = String, Path, pattern = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", description = "Tenant id")),
    request_body = WebhookSettings,
    responses(
        (status = 200, description = "Set; `secret` is present when it is new", body = WebhookWithSecret,
            headers(("Cache-Control" = String, description = "`no-store`: a secret must not be kept by any cache"))),
        (status = 400, description = "Invalid tenant id or body; `invalid_webhook_url`: the address is not an absolute http:// URL", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Neither the platform admin nor this tenant's admin key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "Not a registered tenant", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`tenant_deleting`: the tenant is being deleted", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
        (status = 503, description = "Redis unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn put_webhook(
    State(state): State<AppState>,
    caller: Caller,
    Path(tenant): Path<String>,
    body: JsonBody<WebhookSettings>,
) -> Result<Response, ApiError> {
    let tenant = managed_tenant(&state, &caller, &tenant).await?;
    let body = body.parse().await?;
    let url = check_url(&body.url).map_err(|detail| ApiError::BadRequest {
        code: "invalid_webhook_url",
        detail,
    })?;
    let now_ms = (OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as u64;
    let fresh = body.rotate_secret.then(new_secret);
    let mut secret = fresh.clone();
    let mut set = state
        .store
        .set_webhook(&tenant, url.as_str(), secret.as_deref(), now_ms)
        .await?;
    if set == WebhookSet::NoSecret {
        // The first PUT: the webhook gets its secret.
        secret = Some(new_secret());
        set = state
            .store
            .set_webhook(&tenant, url.as_str(), secret.as_deref(), now_ms)
            .await?;
    }
    if set == WebhookSet::Deleting {
        // Deleted since it was found registered above.
        return Err(ApiError::TenantDeleting { tenant });
    }
    let s = state
        .store
        .webhook_state(&tenant)
        .await?
        .ok_or_else(webhook_not_found)?;
    let answer = WebhookWithSecret {
        webhook: Webhook::new(&tenant, &s),
        secret,
    };
    let mut res = axum::Json(answer).into_response();
    res.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(res)
}

/// Read a tenant's webhook and its delivery counts (platform admin, or the tenant's admin
/// key). The secret is never shown again.
#[utoipa::path(
    get,
    path = "/api/tenants/{tenant}/webhook",
    tag = "webhooks",
    params(("tenant" = String, Path, pattern = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", description = "Tenant id")),
    responses(
        (status = 200, description = "The webhook", body = Webhook),
        (status = 400, description = "Invalid tenant id", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Neither the platform admin nor this tenant's admin key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "Not a registered tenant (`tenant_not_found`), or no webhook (`webhook_not_found`)", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn get_webhook(
    State(state): State<AppState>,
    caller: Caller,
    Path(tenant): Path<String>,
) -> Result<axum::Json<Webhook>, ApiError> {
    let tenant = managed_tenant(&state, &caller, &tenant).await?;
    let s = state
        .store
        .webhook_state(&tenant)
        .await?
        .ok_or_else(webhook_not_found)?;
    Ok(axum::Json(Webhook::new(&tenant, &s)))
}

/// Remove a tenant's webhook (platform admin, or the tenant's admin key).
///
/// No event is written for it from now on, and the events not delivered yet are dropped.
#[utoipa::path(
    delete,
    path = "/api/tenants/{tenant}/webhook",
    tag = "webhooks",
    params(("tenant" = String, Path, pattern = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", description = "Tenant id")),
    responses(
        (status = 204, description = "Removed"),
        (status = 400, description = "Invalid tenant id", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Neither the platform admin nor this tenant's admin key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "Not a registered tenant (`tenant_not_found`), or no webhook (`webhook_not_found`)", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn delete_webhook(
    State(state): State<AppState>,
    caller: Caller,
    Path(tenant): Path<String>,
) -> Result<StatusCode, ApiError> {
    let tenant = managed_tenant(&state, &caller, &tenant).await?;
    match state.store.clear_webhook(&tenant).await? {
        Some(_) => Ok(StatusCode::NO_CONTENT),
        None => Err(webhook_not_found()),
    }
}

/// List a tenant's last webhook delivery attempts, newest first (platform admin, or the
/// tenant's admin key). The log keeps the last 200 or so.
#[utoipa::path(
    get,
    path = "/api/tenants/{tenant}/webhook/deliveries",
    tag = "webhooks",
    params(
        ("tenant" = String, Path, pattern = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", description = "Tenant id"),
        DeliveryQuery,
    ),
    responses(
        (status = 200, description = "The attempts", body = DeliveryList),
        (status = 400, description = "Invalid tenant id or query", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Neither the platform admin nor this tenant's admin key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "Not a registered tenant", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn list_deliveries(
    State(state): State<AppState>,
    caller: Caller,
    Path(tenant): Path<String>,
    query: QueryLater<DeliveryQuery>,
) -> Result<axum::Json<DeliveryList>, ApiError> {
    let tenant = managed_tenant(&state, &caller, &tenant).await?;
    let query = query.parse()?;
    let limit = query.limit.map(|l| l as usize).unwrap_or(50);
    if !(1..=DELIVERY_LOG_CAP).contains(&limit) {
        return Err(ApiError::BadRequest {
            code: "invalid_limit",
            detail: format!("limit must be from 1 to {DELIVERY_LOG_CAP}"),
        });
    }
    let records = state.store.delivery_log(&tenant, limit).await?;
    Ok(axum::Json(DeliveryList {
        deliveries: records.into_iter().map(Delivery::from).collect(),
    }))
}
