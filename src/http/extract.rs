//! Request extractors whose rejections are problem+json like every other error, instead of
//! axum's plain-text defaults.

use axum::extract::FromRequest;
use axum::extract::FromRequestParts;
use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::http::StatusCode;

use super::error::ApiError;

/// `axum::Json` for request bodies, rejecting with problem+json.
#[derive(Debug, FromRequest)]
#[from_request(via(axum::Json), rejection(ApiError))]
pub struct Json<T>(pub T);

/// `axum::extract::Path`, rejecting with problem+json.
#[derive(Debug, FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(ApiError))]
pub struct Path<T>(pub T);

/// `axum::extract::Query`, rejecting with problem+json.
#[derive(Debug, FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(ApiError))]
pub struct Query<T>(pub T);

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> Self {
        match r {
            JsonRejection::MissingJsonContentType(_) => ApiError::UnsupportedMediaType(
                "request body must be JSON with Content-Type: application/json".into(),
            ),
            JsonRejection::JsonSyntaxError(e) => ApiError::BadRequest {
                code: "malformed_json",
                detail: e.body_text(),
            },
            JsonRejection::JsonDataError(e) => ApiError::BadRequest {
                code: "invalid_body",
                detail: e.body_text(),
            },
            JsonRejection::BytesRejection(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                ApiError::Status {
                    status: StatusCode::PAYLOAD_TOO_LARGE,
                    code: "payload_too_large",
                    detail: "the request body exceeds the server's limit".into(),
                }
            }
            other => ApiError::BadRequest {
                code: "invalid_body",
                detail: other.body_text(),
            },
        }
    }
}

impl From<PathRejection> for ApiError {
    fn from(r: PathRejection) -> Self {
        ApiError::BadRequest {
            code: "invalid_path",
            detail: r.body_text(),
        }
    }
}

impl From<QueryRejection> for ApiError {
    fn from(r: QueryRejection) -> Self {
        ApiError::BadRequest {
            code: "invalid_query",
            detail: r.body_text(),
        }
    }
}
