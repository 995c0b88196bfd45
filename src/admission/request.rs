//! A request to start an execution: its fields as a client gave them, and the parsed form the
//! store admits. (The JSON body itself is `http::executions::wire::NewExecution`.)

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::ids::{DedupKey, FlowId, InvalidInput, Version};

/// Upper bound on `max_attempts`; more is almost always a mistake in the client.
pub const MAX_ATTEMPTS_LIMIT: u32 = 100;

/// The fields of an admission request as the client gave them, not yet checked.
#[derive(Debug, Clone, Default)]
pub struct AdmitInput {
    pub flow_id: String,
    pub version: Option<String>,
    /// Must be a JSON object; `None` and `null` mean `{}`.
    pub params: Option<Value>,
    pub dedup_key: Option<String>,
    pub max_attempts: Option<u32>,
}

/// What identifies "the same request" under one dedup key: flow, version and params.
/// A replay with a different fingerprint is a conflict, not a duplicate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprint(String);

impl Fingerprint {
    /// The fingerprint as stored next to the dedup mapping (64 bits of SHA-256, hex: it only
    /// has to tell apart the requests made under one dedup key).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A parsed, valid admission request.
#[derive(Debug, Clone)]
pub struct AdmitRequest {
    pub flow: FlowId,
    pub version: Option<Version>,
    /// The params as canonical JSON text (object keys sorted), stored as given to workers.
    pub params: String,
    /// The same params as a value, for the answer to a new admission.
    pub params_value: Value,
    pub dedup: Option<DedupKey>,
    pub max_attempts: u32,
    pub fingerprint: Fingerprint,
}

impl AdmitRequest {
    /// Parses a body and the optional `Idempotency-Key` header. Both keys given and different
    /// is refused, since the client's intent is then unknowable.
    pub fn parse(
        body: AdmitInput,
        header_key: Option<&str>,
        default_max_attempts: u32,
    ) -> Result<Self, InvalidInput> {
        let flow = FlowId::parse(&body.flow_id)?;
        let version = body.version.as_deref().map(Version::parse).transpose()?;
        let params = match body.params {
            None | Some(Value::Null) => Value::Object(Map::new()),
            Some(v @ Value::Object(_)) => v,
            Some(_) => {
                return Err(InvalidInput {
                    code: "invalid_params",
                    detail: "params must be a JSON object".into(),
                });
            }
        };
        let dedup = match (header_key, body.dedup_key.as_deref()) {
            (Some(h), Some(b)) if h != b => {
                return Err(InvalidInput {
                    code: "dedup_key_mismatch",
                    detail: "Idempotency-Key header and body dedup_key differ".into(),
                });
            }
            (Some(k), _) | (None, Some(k)) => Some(DedupKey::parse(k)?),
            (None, None) => None,
        };
        let max_attempts = body.max_attempts.unwrap_or(default_max_attempts);
        if !(1..=MAX_ATTEMPTS_LIMIT).contains(&max_attempts) {
            return Err(InvalidInput {
                code: "invalid_max_attempts",
                detail: format!("max_attempts must be between 1 and {MAX_ATTEMPTS_LIMIT}"),
            });
        }
        // serde_json's map is ordered by key, so this text is canonical for equal params.
        let params_value = params;
        let params = params_value.to_string();
        let fingerprint = fingerprint(&flow, version.as_ref(), &params);
        Ok(Self {
            flow,
            version,
            params,
            params_value,
            dedup,
            max_attempts,
            fingerprint,
        })
    }
}

fn fingerprint(flow: &FlowId, version: Option<&Version>, params: &str) -> Fingerprint {
    let mut h = Sha256::new();
    h.update(flow.as_str());
    h.update([0]);
    if let Some(v) = version {
        h.update([1]);
        h.update(v.as_str());
    }
    h.update([0]);
    h.update(params);
    Fingerprint(hex::encode(&h.finalize()[..8]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(v: Value) -> AdmitInput {
        let text = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
        AdmitInput {
            flow_id: text("flow_id").unwrap_or_default(),
            version: text("version"),
            params: v.get("params").cloned(),
            dedup_key: text("dedup_key"),
            max_attempts: v
                .get("max_attempts")
                .and_then(Value::as_u64)
                .map(|n| n as u32),
        }
    }

    #[test]
    fn equal_params_in_any_key_order_have_one_fingerprint() {
        let a = AdmitRequest::parse(body(json!({"flow_id":"f","params":{"a":1,"b":2}})), None, 5);
        let b = AdmitRequest::parse(body(json!({"flow_id":"f","params":{"b":2,"a":1}})), None, 5);
        assert_eq!(a.unwrap().fingerprint, b.unwrap().fingerprint);
    }

    #[test]
    fn version_and_params_change_the_fingerprint() {
        let fp = |v: Value| AdmitRequest::parse(body(v), None, 5).unwrap().fingerprint;
        let base = fp(json!({"flow_id":"f"}));
        assert_ne!(base, fp(json!({"flow_id":"f","version":"2"})));
        assert_ne!(base, fp(json!({"flow_id":"f","params":{"x":1}})));
        assert_ne!(base, fp(json!({"flow_id":"g"})));
    }

    #[test]
    fn header_and_body_keys_must_agree() {
        let r = AdmitRequest::parse(body(json!({"flow_id":"f","dedup_key":"a"})), Some("b"), 5);
        assert_eq!(r.unwrap_err().code, "dedup_key_mismatch");
        let r = AdmitRequest::parse(body(json!({"flow_id":"f","dedup_key":"a"})), Some("a"), 5);
        assert_eq!(r.unwrap().dedup.unwrap().as_str(), "a");
    }

    #[test]
    fn params_must_be_an_object() {
        let r = AdmitRequest::parse(body(json!({"flow_id":"f","params":[1]})), None, 5);
        assert_eq!(r.unwrap_err().code, "invalid_params");
    }
}
