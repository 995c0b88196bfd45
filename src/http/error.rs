//! The API's one error type and its RFC 9457 problem+json rendering. Every error a client can
//! see — handler errors, extractor rejections, unknown routes, timeouts — leaves through here
//! with a stable machine `code`.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use crate::domain::{ExecutionId, InvalidInput};
use crate::store::StoreError;

/// Seconds a client should wait before retrying after Redis trouble.
const UNAVAILABLE_RETRY_AFTER: u64 = 1;

/// Seconds a client should wait before asking again of a tenant being deleted: its reaper
/// runs continuously (a tenant of a few thousand executions is gone within the `DELETE` that
/// began it), so a second is the time it takes, or the pace of a client polling a big one.
pub const TENANT_DELETING_RETRY_AFTER: u64 = 1;

/// Everything that can go wrong for an API caller.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{detail}")]
    BadRequest { code: &'static str, detail: String },
    #[error("missing or invalid credentials")]
    Unauthorized,
    #[error("{detail}")]
    Forbidden { code: &'static str, detail: String },
    #[error("{detail}")]
    NotFound { code: &'static str, detail: String },
    #[error(
        "the dedup key is already used by execution {existing} with a different flow, version or params"
    )]
    IdempotencyConflict { existing: ExecutionId },
    #[error("{0}")]
    UnsupportedMediaType(String),
    #[error("the tenant's queue is full ({waiting} waiting); retry later")]
    QueueFull { waiting: u64, retry_after: u64 },
    /// The tenant keeps what a storage bound (`max_bytes`, `max_retained`) allows: retry
    /// once its oldest retained executions have expired (`retry_after`), or after its bound
    /// was raised.
    #[error("{detail}")]
    StorageFull { detail: String, retry_after: u64 },
    #[error("storage is unavailable; retry later")]
    Unavailable(String),
    /// An admission whose outcome is unknown: `execution_id` may exist now or appear later.
    #[error(
        "storage stopped answering after the admission was sent: execution {execution_id} may or may not have been admitted; look it up, or repeat the request with the same Idempotency-Key"
    )]
    OutcomeUnknown {
        execution_id: ExecutionId,
        log: String,
    },
    #[error("the request took longer than the server's limit")]
    Timeout,
    /// An admission whose request ran out of time before anything of it was sent to Redis
    /// (it was withdrawn while it waited): nothing was admitted. Code `request_timeout`, like
    /// `Timeout`, which says no more.
    #[error("the request took longer than the server's limit; nothing was admitted")]
    TimeoutNothingAdmitted,
    /// Items of a batch the server never sent (its time ran out, or Redis did not answer an
    /// earlier call of the batch): nothing of them was admitted; send them again.
    #[error("{0}")]
    NotAdmitted(String),
    /// A batch whose answers did not come back within the request's bound and the time given
    /// to settle them: some of its items may have been admitted.
    #[error(
        "the batch's calls to storage did not answer in time: some of its items may have been admitted; repeat the batch with the same dedup keys to learn which"
    )]
    BatchOutcomeUnknown,
    /// The tenant is being deleted: what it held is being removed, and until that is done it
    /// admits nothing and cannot be registered again (409 `tenant_deleting`, `Retry-After`).
    #[error(
        "tenant {tenant} is being deleted: its executions, keys and dead letters are being removed; it admits nothing and can be registered again once that is done"
    )]
    TenantDeleting { tenant: crate::domain::TenantId },
    /// A bounded resource of the server is used up (e.g. its waiters): retry later.
    #[error("{detail}")]
    Busy {
        status: StatusCode,
        code: &'static str,
        detail: String,
        retry_after: u64,
    },
    /// A budget of the server that refills on its own is spent now (e.g. its lookups of
    /// unknown API keys): retry after `retry_after` seconds. Unlike `Busy`, the connection
    /// stays open: nothing is held.
    #[error("{detail}")]
    Later {
        status: StatusCode,
        code: &'static str,
        detail: String,
        retry_after: u64,
    },
    /// Any other status without a more specific error (e.g. 405 from the router).
    #[error("{detail}")]
    Status {
        status: StatusCode,
        code: &'static str,
        detail: String,
    },
    #[error("internal error")]
    Internal(String),
}

impl From<InvalidInput> for ApiError {
    fn from(e: InvalidInput) -> Self {
        ApiError::BadRequest {
            code: e.code,
            detail: e.detail,
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Unavailable(m) => ApiError::Unavailable(m),
            StoreError::Corrupt(m) => ApiError::Internal(m),
            StoreError::OutcomeUnknown {
                execution_id,
                detail,
            } => ApiError::OutcomeUnknown {
                execution_id,
                log: detail,
            },
            StoreError::NotSent(m) => ApiError::NotAdmitted(m),
        }
    }
}

impl ApiError {
    /// The not-found error for executions (also for another tenant's: never a 403).
    pub fn execution_not_found() -> Self {
        ApiError::NotFound {
            code: "execution_not_found",
            detail: "no such execution for this tenant".into(),
        }
    }

    /// HTTP status of this error.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest { .. } => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden { .. } => StatusCode::FORBIDDEN,
            ApiError::NotFound { .. } => StatusCode::NOT_FOUND,
            ApiError::IdempotencyConflict { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::QueueFull { .. } | ApiError::StorageFull { .. } => {
                StatusCode::TOO_MANY_REQUESTS
            }
            ApiError::Unavailable(_)
            | ApiError::OutcomeUnknown { .. }
            | ApiError::Timeout
            | ApiError::TimeoutNothingAdmitted
            | ApiError::NotAdmitted(_)
            | ApiError::BatchOutcomeUnknown => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::TenantDeleting { .. } => StatusCode::CONFLICT,
            ApiError::Status { status, .. }
            | ApiError::Busy { status, .. }
            | ApiError::Later { status, .. } => *status,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// Stable machine code of this error.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::BadRequest { code, .. }
            | ApiError::Forbidden { code, .. }
            | ApiError::NotFound { code, .. }
            | ApiError::Status { code, .. }
            | ApiError::Busy { code, .. }
            | ApiError::Later { code, .. } => code,
            ApiError::Unauthorized => "unauthorized",
            ApiError::IdempotencyConflict { .. } => "idempotency_key_conflict",
            ApiError::UnsupportedMediaType(_) => "unsupported_media_type",
            ApiError::QueueFull { .. } => "tenant_queue_full",
            ApiError::StorageFull { .. } => "tenant_storage_full",
            ApiError::Unavailable(_) => "redis_unavailable",
            ApiError::OutcomeUnknown { .. } | ApiError::BatchOutcomeUnknown => {
                "admission_outcome_unknown"
            }
            ApiError::Timeout | ApiError::TimeoutNothingAdmitted => "request_timeout",
            ApiError::NotAdmitted(_) => "not_admitted",
            ApiError::TenantDeleting { .. } => "tenant_deleting",
            ApiError::Internal(_) => "internal_error",
        }
    }

    /// The `Retry-After` this error answers with, in seconds.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            ApiError::QueueFull { retry_after, .. }
            | ApiError::StorageFull { retry_after, .. }
            | ApiError::Busy { retry_after, .. }
            | ApiError::Later { retry_after, .. } => Some(*retry_after),
            ApiError::Unavailable(_)
            | ApiError::OutcomeUnknown { .. }
            | ApiError::Timeout
            | ApiError::TimeoutNothingAdmitted
            | ApiError::NotAdmitted(_)
            | ApiError::BatchOutcomeUnknown => Some(UNAVAILABLE_RETRY_AFTER),
            ApiError::TenantDeleting { .. } => Some(TENANT_DELETING_RETRY_AFTER),
            _ => None,
        }
    }
}

/// An RFC 9457 problem document, as every error response carries it.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({
    "type": "urn:sluice:problem:tenant_queue_full",
    "title": "Too Many Requests",
    "status": 429,
    "detail": "the tenant's queue is full (1000 waiting); retry later",
    "code": "tenant_queue_full"
}))]
pub struct Problem {
    /// `urn:sluice:problem:<code>`.
    #[serde(rename = "type")]
    pub type_: String,
    /// The HTTP status phrase.
    pub title: String,
    #[schema(minimum = 400, maximum = 599)]
    pub status: u16,
    /// What went wrong, for a human.
    pub detail: String,
    /// Stable machine code; switch on this, not on `detail`.
    pub code: String,
    /// The related execution, when there is one: the holder of a conflicting dedup key, or
    /// the execution an admission of unknown outcome may have created.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub execution_id: Option<String>,
}

/// Content type of problem documents.
pub const PROBLEM_JSON: &str = "application/problem+json";

impl ApiError {
    /// The problem document this error answers with.
    pub fn problem(&self) -> Problem {
        let status = self.status();
        Problem {
            type_: format!("urn:sluice:problem:{}", self.code()),
            title: status.canonical_reason().unwrap_or("Error").to_owned(),
            status: status.as_u16(),
            detail: self.to_string(),
            code: self.code().to_owned(),
            execution_id: match self {
                ApiError::IdempotencyConflict { existing } => Some(existing.to_string()),
                ApiError::OutcomeUnknown { execution_id, .. } => Some(execution_id.to_string()),
                _ => None,
            },
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        // The one place failures are logged: internal ones loudly, Redis trouble as a warning.
        match &self {
            ApiError::Internal(m) => tracing::error!(error = %m, "internal error"),
            ApiError::Unavailable(m) => tracing::warn!(error = %m, "redis unavailable"),
            ApiError::OutcomeUnknown { execution_id, log } => {
                tracing::warn!(%execution_id, error = %log, "admission outcome unknown")
            }
            _ => {}
        }
        let problem = self.problem();
        let mut res = (status, axum::Json(problem)).into_response();
        let headers = res.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(secs) = self.retry_after() {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if matches!(self, ApiError::Unauthorized) {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if matches!(self, ApiError::Busy { .. }) {
            // A client refused for holding too much gives its connection back.
            res.extensions_mut().insert(super::CloseConnection);
        }
        res
    }
}
