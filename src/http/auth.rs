//! Who is calling: the `Caller` extractor. The tenant always comes from the credential (or,
//! for the platform admin and in dev mode, from `X-Tenant-Id`), never from a request body.
//!
//! Credentials, in order: a bearer token starting `sk_` is a tenant API key, checked by
//! `crate::revocation` (looked up on Redis, a verified key then trusted for at most
//! `HIT_TTL` unless the news of its revocation comes first, a key id Redis did not know
//! remembered a few seconds, one not known to exist looked up within a budget — 503
//! `key_lookups_busy` past it); any other bearer token must equal the platform admin token
//! (constant-time compare); no `Authorization` header is accepted only in dev mode. What a
//! caller may do once known is `super::actions`. A tenant key sent with an `X-Tenant-Id` naming another tenant is a 403
//! `tenant_mismatch`; a missing, malformed, unknown or revoked credential is a 401.
//!
//! A caller that authenticated is named to its connection (`ConnectionHandle`), which counts
//! itself against that credential's share of connections; past the share the extractor fails
//! with a 429 that closes the connection, so the handler never runs (`crate::server`).

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::HeaderMap;
use axum::http::request::Parts;
use subtle::ConstantTimeEq;

use super::error::ApiError;
use super::{AppState, ConnectionHolder};
use crate::access::{KeyId, KeyRole, PresentedKey, TOKEN_PREFIX};
use crate::config::Secret;
use crate::domain::TenantId;
use crate::revocation::{KeyVerdict, KeyWatch, Revocations};

/// What every route a `worker` key may call starts with (the pull API, `http::worker`).
pub const WORKER_ROUTES: &str = "/api/worker/";

/// Header naming the tenant the platform admin (or a dev-mode caller) acts for.
pub const TENANT_HEADER: &str = "x-tenant-id";
/// [`TENANT_HEADER`] as a name, for the lookup every request makes (a `&str` is parsed into
/// a name per lookup).
const TENANT_HEADER_NAME: axum::http::HeaderName =
    axum::http::HeaderName::from_static(TENANT_HEADER);

/// What a caller's credential grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    /// A tenant API key with its role, for its own tenant only.
    Key(KeyRole),
    /// The platform admin token (or dev mode): every call, for any tenant.
    PlatformAdmin,
}

/// How a caller proved who it is (what `GET /api/me` reports).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    /// A tenant API key, by its id.
    ApiKey(KeyId),
    /// The platform admin token.
    AdminToken,
    /// Nothing: a dev-auth server without an `Authorization` header.
    DevAuth,
}

/// The authenticated caller of one request.
#[derive(Debug, Clone)]
pub struct Caller {
    tenant: Option<TenantId>,
    grant: Grant,
    credential: Credential,
}

impl Caller {
    /// How the caller authenticated.
    pub fn credential(&self) -> &Credential {
        &self.credential
    }

    /// For a caller with an API key: a watch that resolves when the key is revoked or its
    /// tenant deleted (open waits and streams end then). `None` for the admin token and dev
    /// auth, which nothing on Redis withdraws.
    pub fn key_watch(&self, revocations: &Arc<Revocations>) -> Option<KeyWatch> {
        match (&self.credential, &self.tenant) {
            (Credential::ApiKey(id), Some(tenant)) => {
                Some(revocations.watch(id.clone(), tenant.clone()))
            }
            _ => None,
        }
    }

    /// The tenant this call acts for, if any (the platform admin may name none).
    pub fn acting_tenant(&self) -> Option<&TenantId> {
        self.tenant.as_ref()
    }

    /// What the caller's credential grants.
    pub fn grant(&self) -> Grant {
        self.grant
    }
}

fn insufficient(detail: String) -> ApiError {
    ApiError::Forbidden {
        code: "insufficient_role",
        detail,
    }
}

/// Longest bearer token looked at; anything longer is refused without a lookup (the admin
/// token and API keys are far shorter).
const MAX_TOKEN_LEN: usize = 512;

fn tenant_header(headers: &HeaderMap) -> Result<Option<TenantId>, ApiError> {
    match headers.get(TENANT_HEADER_NAME) {
        None => Ok(None),
        Some(v) => {
            let s = v.to_str().map_err(|_| ApiError::BadRequest {
                code: "invalid_tenant_id",
                detail: "X-Tenant-Id must be ASCII".into(),
            })?;
            Ok(Some(TenantId::parse(s)?))
        }
    }
}

/// The bearer token, if an `Authorization` header is present. A header that is not
/// `Bearer <token>` (another scheme, an empty token, non-ASCII, too long) is a 401.
fn bearer(headers: &HeaderMap) -> Result<Option<&str>, ApiError> {
    let Some(v) = headers.get(axum::http::header::AUTHORIZATION) else {
        return Ok(None);
    };
    let token = v
        .to_str()
        .ok()
        .and_then(|s| s.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, t)| t.trim())
        .filter(|t| !t.is_empty() && t.len() <= MAX_TOKEN_LEN)
        .ok_or(ApiError::Unauthorized)?;
    Ok(Some(token))
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let caller = authenticate(parts, state).await?;
        // Its connection is no longer one of its address's unauthenticated ones, and counts
        // against the credential's share of connections. Past that share nothing is done for
        // the request: the handler never runs, the answer is a 429 that closes the connection.
        if let Some(conn) = parts.extensions.get::<super::ConnectionHandle>() {
            conn.authenticated(&caller.connection_holder())?;
        }
        Ok(caller)
    }
}

impl Caller {
    /// Who a connection this caller authenticates first on is counted against.
    fn connection_holder(&self) -> ConnectionHolder {
        match (&self.credential, &self.tenant) {
            (Credential::ApiKey(key), Some(tenant)) => ConnectionHolder::Key {
                tenant: tenant.clone(),
                key: key.clone(),
            },
            (Credential::DevAuth, Some(tenant)) => ConnectionHolder::DevTenant(tenant.clone()),
            // A key always names its tenant; the admin token acts for any tenant over one
            // pool of connections, so it is counted against none of theirs.
            (Credential::ApiKey(_) | Credential::AdminToken | Credential::DevAuth, _) => {
                ConnectionHolder::Operator
            }
        }
    }
}

/// The caller a request's credentials name (see [`Caller`]).
async fn authenticate(parts: &Parts, state: &AppState) -> Result<Caller, ApiError> {
    let token = bearer(&parts.headers)?;
    // Parsed only once the credential passed, so a stranger learns nothing from a 400.
    let tenant = || tenant_header(&parts.headers);
    match token {
        Some(given) if given.starts_with(TOKEN_PREFIX) => {
            let key = PresentedKey::parse(given).ok_or(ApiError::Unauthorized)?;
            let (own, role) = match state
                .revocations
                .authenticate(&key, state.auth.dev_auth)
                .await?
            {
                KeyVerdict::Valid(tenant, role) => (tenant, role),
                KeyVerdict::Unknown => return Err(ApiError::Unauthorized),
                KeyVerdict::Throttled => return Err(key_lookups_busy()),
            };
            if tenant()?.is_some_and(|t| t != own) {
                return Err(tenant_mismatch());
            }
            if role == KeyRole::Worker && !parts.uri.path().starts_with(WORKER_ROUTES) {
                return Err(insufficient(format!(
                    "a {role} key reaches only {WORKER_ROUTES}*"
                )));
            }
            Ok(Caller {
                tenant: Some(own),
                grant: Grant::Key(role),
                credential: Credential::ApiKey(key.id),
            })
        }
        Some(given) => match state.auth.admin_token.as_ref().map(Secret::expose) {
            Some(admin) if bool::from(given.as_bytes().ct_eq(admin.as_bytes())) => Ok(Caller {
                tenant: tenant()?,
                grant: Grant::PlatformAdmin,
                credential: Credential::AdminToken,
            }),
            _ => Err(ApiError::Unauthorized),
        },
        None if state.auth.dev_auth => Ok(Caller {
            tenant: tenant()?,
            grant: Grant::PlatformAdmin,
            credential: Credential::DevAuth,
        }),
        None => Err(ApiError::Unauthorized),
    }
}

/// A key id this server does not know to exist, while its budget for looking such ids up is
/// spent (`crate::revocation`): a flood of made-up tokens, or a real key created elsewhere
/// whose news did not arrive. Not a 401: a real key is looked up on a retry.
fn key_lookups_busy() -> ApiError {
    ApiError::Later {
        status: axum::http::StatusCode::SERVICE_UNAVAILABLE,
        code: "key_lookups_busy",
        detail: "this server is looking up too many unknown API keys; retry in a second".into(),
        retry_after: 1,
    }
}

/// Whether the request carries `Authorization: Bearer <expected>` (constant-time compare).
pub fn bearer_is(headers: &HeaderMap, expected: &Secret) -> bool {
    matches!(
        bearer(headers),
        Ok(Some(given)) if bool::from(given.as_bytes().ct_eq(expected.expose().as_bytes()))
    )
}

/// A tenant key used for another tenant (by `X-Tenant-Id` or a tenant path): the credential
/// is valid, the tenant is not its own.
pub(super) fn tenant_mismatch() -> ApiError {
    ApiError::Forbidden {
        code: "tenant_mismatch",
        detail: "this API key belongs to another tenant".into(),
    }
}

/// How callers are authenticated.
#[derive(Debug, Clone, Default)]
pub struct AuthConfig {
    /// The platform admin token, if configured.
    pub admin_token: Option<Secret>,
    /// Dev mode: no credentials needed.
    pub dev_auth: bool,
    /// The token `/metrics` requires, if configured (never the admin token: a scraper's
    /// credential should open nothing else).
    pub metrics_token: Option<Secret>,
    /// Whether `/metrics` answers without a token when none is configured: `--metrics-open`,
    /// `/metrics` on its own listener (`--metrics-listen`, whose reach the operator chose), or
    /// dev auth (every caller is the platform admin anyway). Otherwise a request without the
    /// metrics token is a 401: the metrics name every tenant with its counts.
    pub metrics_open: bool,
}
