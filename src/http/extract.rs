//! Request extractors whose rejections are problem+json like every other error, instead of
//! axum's plain-text defaults; and deferred ones, which a handler parses only after its
//! permission checks.

use std::convert::Infallible;
use std::marker::PhantomData;

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{StatusCode, Uri};
use serde::de::DeserializeOwned;

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

/// A JSON body that is read and parsed only when the handler calls [`JsonBody::parse`], after
/// it checked the caller's role: a caller without the right learns nothing about what the
/// server would make of the body (no parser detail in a 400, no 413 or 415), and the body is
/// not even read for it.
pub struct JsonBody<T> {
    req: Request,
    _into: PhantomData<fn() -> T>,
}

impl<S: Send + Sync, T> FromRequest<S> for JsonBody<T> {
    type Rejection = Infallible;

    async fn from_request(req: Request, _: &S) -> Result<Self, Infallible> {
        Ok(Self {
            req,
            _into: PhantomData,
        })
    }
}

impl<T: DeserializeOwned> JsonBody<T> {
    /// Reads and parses the body (content type, size limit and JSON checked as by `Json`).
    pub async fn parse(self) -> Result<T, ApiError> {
        let Json(body) = Json::<T>::from_request(self.req, &()).await?;
        Ok(body)
    }
}

/// Query parameters parsed only when the handler calls [`QueryLater::parse`], after its
/// permission checks (see [`JsonBody`]).
pub struct QueryLater<T> {
    uri: Uri,
    _into: PhantomData<fn() -> T>,
}

impl<S: Send + Sync, T> FromRequestParts<S> for QueryLater<T> {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Infallible> {
        Ok(Self {
            uri: parts.uri.clone(),
            _into: PhantomData,
        })
    }
}

impl<T: DeserializeOwned> QueryLater<T> {
    /// Parses the query string.
    pub fn parse(&self) -> Result<T, ApiError> {
        let axum::extract::Query(q) = axum::extract::Query::try_from_uri(&self.uri)?;
        Ok(q)
    }
}

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
