//! `X-Request-Id`: every answer carries the request's id, the client's own or one made up (a
//! UUIDv4, 36 characters), and the request's log span names it (`request_span`).
//!
//! One layer where tower-http takes two (`SetRequestId` and `PropagateRequestId`): the id is
//! kept in the request's extensions for the span and written into the answer, and a made-up
//! one is not also inserted into the request's headers, which nothing here reads (inserting
//! grew hyper's header map, 1.1 k instructions of an admission's 94 k).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::http::{HeaderName, HeaderValue, Request, Response};
use tower::{Layer, Service};

/// The header, as a name (looked up per request).
pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The request's id, in its extensions.
#[derive(Debug, Clone)]
pub struct RequestId(pub HeaderValue);

/// Gives every request its id and every answer the `X-Request-Id` header (unless the answer
/// has one already).
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestIdLayer;

impl<S> Layer<S> for RequestIdLayer {
    type Service = WithRequestId<S>;

    fn layer(&self, inner: S) -> Self::Service {
        WithRequestId { inner }
    }
}

/// The service of [`RequestIdLayer`].
#[derive(Debug, Clone)]
pub struct WithRequestId<S> {
    inner: S,
}

impl<S, B, R> Service<Request<B>> for WithRequestId<S>
where
    S: Service<Request<B>, Response = Response<R>>,
{
    type Response = Response<R>;
    type Error = S::Error;
    type Future = RequestIdFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let id = match req.headers().get(X_REQUEST_ID) {
            Some(given) => given.clone(),
            None => made_up(),
        };
        req.extensions_mut().insert(RequestId(id.clone()));
        RequestIdFuture {
            inner: self.inner.call(req),
            id: Some(id),
        }
    }
}

/// A new request id: a UUIDv4, hyphenated.
fn made_up() -> HeaderValue {
    let mut text = [0u8; uuid::fmt::Hyphenated::LENGTH];
    let text = uuid::Uuid::new_v4().hyphenated().encode_lower(&mut text);
    // Hex digits and hyphens are always a valid value; the fallback is never taken.
    HeaderValue::from_str(text).unwrap_or_else(|_| HeaderValue::from_static("unknown"))
}

pin_project_lite::pin_project! {
    /// The answer of [`WithRequestId`]: the inner answer with the request's id.
    pub struct RequestIdFuture<F> {
        #[pin]
        inner: F,
        id: Option<HeaderValue>,
    }
}

impl<F, R, E> Future for RequestIdFuture<F>
where
    F: Future<Output = Result<Response<R>, E>>,
{
    type Output = Result<Response<R>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut res = std::task::ready!(this.inner.poll(cx))?;
        if let Some(id) = this.id.take()
            && !res.headers().contains_key(X_REQUEST_ID)
        {
            res.headers_mut().insert(X_REQUEST_ID, id);
        }
        Poll::Ready(Ok(res))
    }
}
