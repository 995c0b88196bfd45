//! Who is calling: the `Caller` extractor. The tenant always comes from the credential (or,
//! for the platform admin and in dev mode, from `X-Tenant-Id`), never from a request body.

use axum::extract::FromRequestParts;
use axum::http::HeaderMap;
use axum::http::request::Parts;
use subtle::ConstantTimeEq;

use super::AppState;
use super::error::ApiError;
use crate::admission::TenantId;

/// Header naming the tenant the platform admin (or a dev-mode caller) acts for.
pub const TENANT_HEADER: &str = "x-tenant-id";

/// What a caller may do, weakest first (the order is used for `>=` checks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// Read executions.
    Viewer,
    /// Also submit, cancel and retry.
    Editor,
    /// Also force-delete and manage the tenant's own settings.
    TenantAdmin,
    /// Everything, for any tenant.
    PlatformAdmin,
}

/// The authenticated caller of one request.
#[derive(Debug, Clone)]
pub struct Caller {
    tenant: Option<TenantId>,
    role: Role,
}

impl Caller {
    /// The tenant this call acts for, with at least `role`.
    pub fn tenant_with(&self, role: Role) -> Result<&TenantId, ApiError> {
        self.require(role)?;
        self.tenant.as_ref().ok_or_else(|| ApiError::BadRequest {
            code: "tenant_required",
            detail: "this call acts for a tenant: send X-Tenant-Id".into(),
        })
    }

    /// The tenant this call acts for, if any (the platform admin may name none).
    pub fn acting_tenant(&self) -> Option<&TenantId> {
        self.tenant.as_ref()
    }

    /// Fails with 403 unless the caller has at least `role`.
    pub fn require(&self, role: Role) -> Result<(), ApiError> {
        if self.role >= role {
            Ok(())
        } else {
            Err(ApiError::Forbidden {
                code: "insufficient_role",
                detail: format!("this call needs the {role:?} role"),
            })
        }
    }
}

fn tenant_header(headers: &HeaderMap) -> Result<Option<TenantId>, ApiError> {
    match headers.get(TENANT_HEADER) {
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

fn bearer(headers: &HeaderMap) -> Result<Option<&str>, ApiError> {
    let Some(v) = headers.get(axum::http::header::AUTHORIZATION) else {
        return Ok(None);
    };
    let token = v
        .to_str()
        .ok()
        .and_then(|s| s.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or(ApiError::Unauthorized)?;
    Ok(Some(token))
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let token = bearer(&parts.headers)?;
        let tenant = tenant_header(&parts.headers)?;
        match (token, state.auth.admin_token.as_deref()) {
            (Some(given), Some(admin)) if bool::from(given.as_bytes().ct_eq(admin.as_bytes())) => {
                Ok(Caller {
                    tenant,
                    role: Role::PlatformAdmin,
                })
            }
            (Some(_), _) => Err(ApiError::Unauthorized),
            (None, _) if state.auth.dev_auth => Ok(Caller {
                tenant,
                role: Role::PlatformAdmin,
            }),
            (None, _) => Err(ApiError::Unauthorized),
        }
    }
}

/// How callers are authenticated.
#[derive(Debug, Clone, Default)]
pub struct AuthConfig {
    /// The platform admin token, if configured.
    pub admin_token: Option<String>,
    /// Dev mode: no credentials needed.
    pub dev_auth: bool,
}
