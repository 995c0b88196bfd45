//! Request extractors whose rejections are problem+json like every other error, instead of
//! axum's plain-text defaults; and deferred ones, which a handler parses only after its
//! permission checks.

use std::convert::Infallible;
use std::fmt;
use std::marker::PhantomData;

use axum::body::Bytes;
use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{StatusCode, Uri, header};
use serde::de::value::MapAccessDeserializer;
use serde::de::{self, DeserializeOwned, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

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
    /// Reads and parses the body (content type, size limit and JSON checked as by `Json`),
    /// which must be a JSON object.
    pub async fn parse(self) -> Result<T, ApiError> {
        // A body sent as exactly `application/json` (what clients send) is read and parsed
        // at once; only one that does not parse goes through `Json::from_bytes` again, for
        // the rejection `Json` gives. `Json` itself parses the content type as a MIME type
        // and the body through serde_path_to_error (to name the field at fault): some 2,000
        // instructions per admission spent on an error it rarely has.
        let exact = self
            .req
            .headers()
            .get(header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes() == b"application/json");
        if exact {
            let bytes = Bytes::from_request(self.req, &())
                .await
                .map_err(JsonRejection::from)?;
            return match serde_json::from_slice::<ObjectOnly<T>>(&bytes) {
                Ok(ObjectOnly(body)) => Ok(body),
                Err(_) => {
                    let axum::Json(ObjectOnly(body)) =
                        axum::Json::<ObjectOnly<T>>::from_bytes(&bytes)?;
                    Ok(body)
                }
            };
        }
        let Json(ObjectOnly(body)) = Json::<ObjectOnly<T>>::from_request(self.req, &()).await?;
        Ok(body)
    }

    /// [`parse`](Self::parse) for a route whose body is optional: no body at all (whatever
    /// its `Content-Type`, or none) is `None`; anything else must be what `parse` takes, with
    /// the same answers (415, 400 `malformed_json` or `invalid_body`, 413).
    pub async fn parse_optional(self) -> Result<Option<T>, ApiError> {
        let headers = self.req.headers().clone();
        // Read within `--body-limit` (the `DefaultBodyLimit` the router sets), as `parse`.
        let bytes = Bytes::from_request(self.req, &())
            .await
            .map_err(|e| match e.status() {
                StatusCode::PAYLOAD_TOO_LARGE => ApiError::Status {
                    status: StatusCode::PAYLOAD_TOO_LARGE,
                    code: "payload_too_large",
                    detail: "the request body exceeds the server's limit".into(),
                },
                _ => ApiError::BadRequest {
                    code: "invalid_body",
                    detail: e.body_text(),
                },
            })?;
        if bytes.is_empty() {
            return Ok(None);
        }
        // The bytes again, with the request's headers: `parse`'s content type and JSON checks.
        let mut req = Request::new(axum::body::Body::from(bytes));
        *req.headers_mut() = headers;
        Self {
            req,
            _into: PhantomData,
        }
        .parse()
        .await
        .map(Some)
    }
}

/// Whether `headers` name a JSON body (`application/json` or `application/*+json`), as
/// `Json` requires.
pub fn is_json(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .is_some_and(|essence| {
            essence == "application/json"
                || (essence.starts_with("application/") && essence.ends_with("+json"))
        })
}

/// A struct read from a JSON object only. Serde's derived structs also accept an array of
/// their fields in order (`[null, null]` would be a tenant update), which the schema does not
/// allow and no client means.
struct ObjectOnly<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for ObjectOnly<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Object<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for Object<T> {
            type Value = T;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(MapAccessDeserializer::new(map))
            }
        }
        d.deserialize_map(Object(PhantomData)).map(ObjectOnly)
    }
}

/// A `u32` field written as any JSON number with a whole value: `5`, `5.0` and `5e0` alike.
/// JSON Schema's `integer` admits all three, so a client following the schema may send any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WholeU32(pub u32);

impl<'de> Deserialize<'de> for WholeU32 {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Whole;
        impl Visitor<'_> for Whole {
            type Value = WholeU32;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a whole number from 0 to 4294967295")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<WholeU32, E> {
                u32::try_from(v)
                    .map(WholeU32)
                    .map_err(|_| E::invalid_value(de::Unexpected::Unsigned(v), &self))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<WholeU32, E> {
                u32::try_from(v)
                    .map(WholeU32)
                    .map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &self))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<WholeU32, E> {
                if v.fract() == 0.0 && (0.0..=f64::from(u32::MAX)).contains(&v) {
                    // Whole and in range: the conversion is exact.
                    Ok(WholeU32(v as u32))
                } else {
                    Err(E::invalid_value(de::Unexpected::Float(v), &self))
                }
            }
        }
        d.deserialize_any(Whole)
    }
}

/// The largest integer every JSON reader holds exactly (2^53 - 1): the bound of [`WholeU64`].
pub const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// A `u64` field written as any JSON number with a whole value up to [`MAX_SAFE_INTEGER`]
/// (`7`, `7.0`, `7e0`), as [`WholeU32`] is for `u32`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WholeU64(pub u64);

impl<'de> Deserialize<'de> for WholeU64 {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Whole;
        impl Visitor<'_> for Whole {
            type Value = WholeU64;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "a whole number from 0 to {MAX_SAFE_INTEGER}")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<WholeU64, E> {
                if v <= MAX_SAFE_INTEGER {
                    Ok(WholeU64(v))
                } else {
                    Err(E::invalid_value(de::Unexpected::Unsigned(v), &self))
                }
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<WholeU64, E> {
                u64::try_from(v)
                    .map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &self))
                    .and_then(|v| self.visit_u64(v))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<WholeU64, E> {
                if v.fract() == 0.0 && (0.0..=MAX_SAFE_INTEGER as f64).contains(&v) {
                    // Whole and within 2^53: the conversion is exact.
                    Ok(WholeU64(v as u64))
                } else {
                    Err(E::invalid_value(de::Unexpected::Float(v), &self))
                }
            }
        }
        d.deserialize_any(Whole)
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

impl<T> QueryLater<T> {
    /// Whether the request has a query string at all (`?` in its target): a handler whose
    /// parameters are all optional can skip parsing an absent one.
    pub fn given(&self) -> bool {
        self.uri.query().is_some()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_numbers_in_any_spelling_are_u32() {
        for (text, want) in [
            ("5", 5),
            ("5.0", 5),
            ("5e0", 5),
            ("-0.0", 0),
            ("4294967295", u32::MAX),
        ] {
            let got: WholeU32 = serde_json::from_str(text).unwrap();
            assert_eq!(got.0, want, "{text}");
        }
        for text in [
            "5.5",
            "-1",
            "4294967296",
            "4294967296.0",
            "1e10",
            "\"5\"",
            "null",
        ] {
            assert!(serde_json::from_str::<WholeU32>(text).is_err(), "{text}");
        }
    }

    #[test]
    fn bodies_are_objects_only() {
        #[derive(Debug, Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Body {
            a: Option<u32>,
        }
        let ok: ObjectOnly<Body> = serde_json::from_str(r#"{"a": 1}"#).unwrap();
        assert_eq!(ok.0.a, Some(1));
        // Serde's derived struct alone takes the array form; the wrapper does not.
        assert!(serde_json::from_str::<Body>("[1]").is_ok());
        assert!(serde_json::from_str::<ObjectOnly<Body>>("[1]").is_err());
        assert!(serde_json::from_str::<ObjectOnly<Body>>(r#"{"b": 1}"#).is_err());
    }
}
