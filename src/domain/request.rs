//! A request to start an execution: its fields as a client gave them, and the parsed form the
//! store admits. (The JSON body itself is `http::executions::wire::NewExecution`.)

use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

use super::ids::{ConcurrencyKey, DedupKey, FlowId, InvalidInput, Version, lower_hex};
use super::json_text::JsonText;
use super::trace::TraceContext;

/// Upper bound on `max_attempts`; more is almost always a mistake in the client.
pub const MAX_ATTEMPTS_LIMIT: u32 = 100;

/// The priority of an admission that names none (1 is first, 5 last).
pub const DEFAULT_PRIORITY: u8 = 3;

/// How far ahead an execution can be scheduled: a year (365 days).
pub const MAX_SCHEDULE_AHEAD_MS: u64 = 365 * 24 * 3600 * 1000;

/// When an execution may start at the earliest, as the client asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schedule {
    /// At this Unix time (ms); a time that has passed means now.
    At(u64),
    /// This long after the admission (ms), on Redis's clock.
    After(u64),
}

/// The fields of an admission request as the client gave them, not yet checked.
#[derive(Debug, Clone, Default)]
pub struct AdmitInput {
    pub flow_id: String,
    pub version: Option<String>,
    /// Must be a JSON object; `None` and `null` mean `{}`. Kept as the client's text: it is
    /// made canonical without being parsed into a tree (`JsonText::canonical`).
    pub params: Option<Box<RawValue>>,
    pub dedup_key: Option<String>,
    pub max_attempts: Option<u32>,
    pub priority: Option<u32>,
    /// RFC 3339 date-time.
    pub run_at: Option<String>,
    /// A duration such as `250ms`, `30s`, `5m`, `2h` or `1d` (a plain number is seconds).
    pub delay: Option<String>,
    pub concurrency_key: Option<String>,
}

/// What identifies "the same request" under one dedup key: flow, version, params and
/// concurrency key.
/// A replay with a different fingerprint is a conflict, not a duplicate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprint(String);

impl Fingerprint {
    /// The fingerprint as stored next to the dedup mapping (64 bits of SHA-256, hex: it only
    /// has to tell apart the requests made under one dedup key).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Its 8 bytes, half the hex's: a layout-5 shard stores a dedup mapping as
    /// `<id 16><fingerprint 8>` (`Shard::stored_fingerprint`), 24 bytes instead of 49.
    pub fn to_bytes(&self) -> [u8; 8] {
        let mut out = [0u8; 8];
        // `fingerprint()` makes exactly 16 lowercase hex digits: decoding cannot fail.
        hex::decode_to_slice(&self.0, &mut out).expect("a Fingerprint is 16 hex digits");
        out
    }
}

/// A parsed, valid admission request.
#[derive(Debug, Clone)]
pub struct AdmitRequest {
    pub flow: FlowId,
    pub version: Option<Version>,
    /// The params as canonical JSON text (object keys sorted), stored as given to workers and
    /// shared with the answer to a new admission (no parsed copy is kept).
    pub params: JsonText,
    pub dedup: Option<DedupKey>,
    pub max_attempts: u32,
    pub fingerprint: Fingerprint,
    /// 1..=5, 1 first; orders executions within their tenant only.
    pub priority: u8,
    /// When it may start at the earliest; `None` for now.
    pub schedule: Option<Schedule>,
    /// What it competes for inside its tenant (its key's limit caps how many run at once).
    pub concurrency_key: Option<ConcurrencyKey>,
    /// The caller's trace context, handed to the handlers that run it. Not part of the
    /// fingerprint: a retry of the request from another trace is still a replay (and the
    /// execution keeps the first admission's context).
    pub trace: Option<TraceContext>,
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
        let params = match body.params.as_deref().map(RawValue::get) {
            None | Some("null") => "{}",
            Some(raw) if raw.starts_with('{') => raw,
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
        let priority = match body.priority {
            None => DEFAULT_PRIORITY,
            Some(p @ 1..=5) => p as u8,
            Some(_) => {
                return Err(InvalidInput {
                    code: "invalid_priority",
                    detail: "priority must be an integer from 1 (first) to 5 (last)".into(),
                });
            }
        };
        let schedule = schedule_of(body.run_at.as_deref(), body.delay.as_deref())?;
        let concurrency_key = body
            .concurrency_key
            .as_deref()
            .map(ConcurrencyKey::parse)
            .transpose()?;
        // Keys sorted, the form serde_json's map writes: equal params have equal text.
        let params = JsonText::canonical(params).map_err(|e| InvalidInput {
            code: "invalid_params",
            detail: format!("params are not valid JSON: {e}"),
        })?;
        let fingerprint = fingerprint(&flow, version.as_ref(), &params, concurrency_key.as_ref());
        Ok(Self {
            flow,
            version,
            params,
            dedup,
            max_attempts,
            fingerprint,
            priority,
            schedule,
            concurrency_key,
            trace: None,
        })
    }
}

/// The schedule an admission (or a reschedule) asks for: `run_at` or `delay`, not both; at
/// most [`MAX_SCHEDULE_AHEAD_MS`] ahead. A `run_at` that has passed means now.
pub fn schedule_of(
    run_at: Option<&str>,
    delay: Option<&str>,
) -> Result<Option<Schedule>, InvalidInput> {
    match (run_at, delay) {
        (Some(_), Some(_)) => Err(InvalidInput {
            code: "invalid_schedule",
            detail: "give run_at or delay, not both".into(),
        }),
        (Some(at), None) => {
            let bad = |why: &str| InvalidInput {
                code: "invalid_run_at",
                detail: format!("run_at {why}"),
            };
            let t = time::OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339)
                .map_err(|_| bad("must be an RFC 3339 date-time, e.g. 2026-12-01T09:30:00Z"))?;
            let ms = t.unix_timestamp_nanos() / 1_000_000;
            let now = time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000;
            if ms > now + i128::from(MAX_SCHEDULE_AHEAD_MS) {
                return Err(bad("is more than a year ahead"));
            }
            Ok(Some(Schedule::At(u64::try_from(ms.max(0)).unwrap_or(0))))
        }
        (None, Some(d)) => Ok(Some(Schedule::After(parse_delay(d)?))),
        (None, None) => Ok(None),
    }
}

/// Parses a `delay`: whole milliseconds (`250ms`), seconds (`30s`, or a plain `30`), minutes
/// (`5m`), hours (`2h`) or days (`1d`), from 0 to a year.
pub fn parse_delay(text: &str) -> Result<u64, InvalidInput> {
    let invalid = || InvalidInput {
        code: "invalid_delay",
        detail: "delay must be a duration such as 250ms, 30s, 5m, 2h or 1d (a plain number is \
                 seconds), at most a year"
            .into(),
    };
    let units: [(&str, u64); 5] = [
        ("ms", 1),
        ("s", 1_000),
        ("m", 60_000),
        ("h", 3_600_000),
        ("d", 86_400_000),
    ];
    let (digits, unit) = units
        .iter()
        .find_map(|(suffix, ms)| text.strip_suffix(suffix).map(|d| (d, *ms)))
        .unwrap_or((text, 1_000));
    if digits.is_empty() || digits.len() > 12 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid());
    }
    let n: u64 = digits.parse().map_err(|_| invalid())?;
    match n.checked_mul(unit) {
        Some(ms) if ms <= MAX_SCHEDULE_AHEAD_MS => Ok(ms),
        _ => Err(invalid()),
    }
}

fn fingerprint(
    flow: &FlowId,
    version: Option<&Version>,
    params: &str,
    key: Option<&ConcurrencyKey>,
) -> Fingerprint {
    let mut h = Sha256::new();
    h.update(flow.as_str());
    h.update([0]);
    if let Some(v) = version {
        h.update([1]);
        h.update(v.as_str());
    }
    h.update([0]);
    h.update(params);
    // Without a key the fingerprint is what it was before keys existed, so mappings written
    // by an older build still recognise their replays.
    if let Some(k) = key {
        h.update([0, 2]);
        h.update(k.as_str());
    }
    Fingerprint(lower_hex(&h.finalize()[..8]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn body(v: Value) -> AdmitInput {
        let text = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
        AdmitInput {
            flow_id: text("flow_id").unwrap_or_default(),
            version: text("version"),
            params: v
                .get("params")
                .map(|p| serde_json::value::to_raw_value(p).unwrap()),
            dedup_key: text("dedup_key"),
            max_attempts: v
                .get("max_attempts")
                .and_then(Value::as_u64)
                .map(|n| n as u32),
            priority: v.get("priority").and_then(Value::as_u64).map(|n| n as u32),
            run_at: text("run_at"),
            delay: text("delay"),
            concurrency_key: text("concurrency_key"),
        }
    }

    #[test]
    fn the_concurrency_key_is_part_of_the_fingerprint_and_checked() {
        let fp = |v: Value| AdmitRequest::parse(body(v), None, 5).unwrap().fingerprint;
        let plain = fp(json!({"flow_id": "f"}));
        let a = fp(json!({"flow_id": "f", "concurrency_key": "a"}));
        let b = fp(json!({"flow_id": "f", "concurrency_key": "b"}));
        assert_ne!(plain, a);
        assert_ne!(a, b);
        for bad in ["", "a\u{202E}b"] {
            let e = AdmitRequest::parse(
                body(json!({"flow_id": "f", "concurrency_key": bad})),
                None,
                5,
            )
            .unwrap_err();
            assert_eq!(e.code, "invalid_concurrency_key");
        }
        let long = "k".repeat(129);
        assert!(
            AdmitRequest::parse(
                body(json!({"flow_id": "f", "concurrency_key": long})),
                None,
                5
            )
            .is_err()
        );
    }

    #[test]
    fn equal_params_in_any_key_order_have_one_fingerprint() {
        let a = AdmitRequest::parse(body(json!({"flow_id":"f","params":{"a":1,"b":2}})), None, 5);
        let b = AdmitRequest::parse(body(json!({"flow_id":"f","params":{"b":2,"a":1}})), None, 5);
        assert_eq!(a.unwrap().fingerprint, b.unwrap().fingerprint);
    }

    /// A shard stores a fingerprint as its 16 hex digits up to layout 4 and as their 8 bytes
    /// at layout 5 (the dedup mapping `<id 16><fingerprint 8>`, 24 bytes, told by length).
    #[test]
    fn a_fingerprint_is_stored_as_hex_or_as_its_8_bytes_at_layout_5() {
        use crate::store::{Layout, ShardMap};
        let fp = AdmitRequest::parse(body(json!({"flow_id":"f"})), None, 5)
            .unwrap()
            .fingerprint;
        assert_eq!(fp.as_str().len(), 16);
        let raw = fp.to_bytes();
        assert_eq!(lower_hex(&raw), fp.as_str());
        let hex = ShardMap::new(16, Layout::CURRENT).shard(3);
        assert_eq!(hex.stored_fingerprint(&fp).as_ref(), fp.as_str().as_bytes());
        let binary = ShardMap::new(16, Layout::Binary).shard(3);
        assert_eq!(binary.stored_fingerprint(&fp).as_ref(), &raw[..]);
        assert_eq!(
            binary
                .stored_id(&crate::domain::ExecutionId::new())
                .as_ref()
                .len()
                + binary.stored_fingerprint(&fp).as_ref().len(),
            24
        );
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
    fn priority_and_schedule_stay_out_of_the_fingerprint() {
        let fp = |v: Value| AdmitRequest::parse(body(v), None, 5).unwrap().fingerprint;
        assert_eq!(
            fp(json!({"flow_id":"f"})),
            fp(json!({"flow_id":"f","priority":1}))
        );
        let r = AdmitRequest::parse(body(json!({"flow_id":"f","priority":6})), None, 5);
        assert_eq!(r.unwrap_err().code, "invalid_priority");
        let r = AdmitRequest::parse(body(json!({"flow_id":"f","priority":0})), None, 5);
        assert_eq!(r.unwrap_err().code, "invalid_priority");
    }

    #[test]
    fn schedules_parse_within_a_year() {
        assert_eq!(parse_delay("250ms").unwrap(), 250);
        assert_eq!(parse_delay("30").unwrap(), 30_000);
        assert_eq!(parse_delay("2h").unwrap(), 7_200_000);
        assert_eq!(parse_delay("365d").unwrap(), MAX_SCHEDULE_AHEAD_MS);
        assert_eq!(parse_delay("366d").unwrap_err().code, "invalid_delay");
        assert_eq!(parse_delay("-1s").unwrap_err().code, "invalid_delay");
        assert_eq!(parse_delay("1.5s").unwrap_err().code, "invalid_delay");
        assert_eq!(
            schedule_of(Some("2020-01-01T00:00:00Z"), None).unwrap(),
            Some(Schedule::At(1_577_836_800_000))
        );
        assert_eq!(
            schedule_of(Some("2999-01-01T00:00:00Z"), None)
                .unwrap_err()
                .code,
            "invalid_run_at"
        );
        assert_eq!(
            schedule_of(Some("tomorrow"), None).unwrap_err().code,
            "invalid_run_at"
        );
        assert_eq!(
            schedule_of(Some("2020-01-01T00:00:00Z"), Some("1s"))
                .unwrap_err()
                .code,
            "invalid_schedule"
        );
    }

    #[test]
    fn params_must_be_an_object() {
        let r = AdmitRequest::parse(body(json!({"flow_id":"f","params":[1]})), None, 5);
        assert_eq!(r.unwrap_err().code, "invalid_params");
    }
}
