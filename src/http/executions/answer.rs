//! An execution's JSON answer written by hand, for the admission's 201 and 200: the bytes
//! serde_json's derived `Serialize` of [`Execution`] gives (`axum::Json`), field by field in
//! the struct's order, without going through serde's serializer. Admission is the hot path
//! (issue 39: serde's derive and its string escaping were 8.2 k of serve's 104 k instructions
//! per admission); every other answer keeps `axum::Json`, and the tests below and
//! `admission::admission_answers_carry_the_headers_and_bytes_of_their_json` hold the two to
//! the same bytes.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;

use super::wire::{Execution, QueueState, Status};

/// Room reserved for an admission's JSON answer: a new execution with small params is about
/// 700 bytes, and `axum::Json` starts at 128 and grows three times (a copy each) to hold it.
const EXECUTION_JSON_CAPACITY: usize = 1024;

/// `status` with `e` as its JSON body: the bytes and headers `(status, axum::Json(e))` gives
/// (`Content-Type: application/json`), written into a buffer sized for it at once.
pub(super) fn execution_json(status: StatusCode, e: &Execution) -> Response {
    let mut buf = Vec::with_capacity(EXECUTION_JSON_CAPACITY);
    write_execution(&mut buf, e);
    let mut res = Response::new(axum::body::Body::from(buf));
    *res.status_mut() = status;
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    res
}

/// The `Location` of a new execution, `/api/executions/{id}`, without `format!`'s machinery.
pub(super) fn location(id: &str) -> String {
    const ROUTE: &str = "/api/executions/";
    let mut location = String::with_capacity(ROUTE.len() + id.len());
    location.push_str(ROUTE);
    location.push_str(id);
    location
}

/// Writes `e` as serde_json writes the derived `Serialize` of [`Execution`]: compact, the
/// members in the struct's order, every `Option` present (`null`).
fn write_execution(out: &mut Vec<u8>, e: &Execution) {
    out.extend_from_slice(b"{\"execution_id\":");
    string(out, &e.execution_id);
    out.extend_from_slice(b",\"tenant_id\":");
    string(out, &e.tenant_id);
    out.extend_from_slice(b",\"flow_id\":");
    string(out, &e.flow_id);
    out.extend_from_slice(b",\"version\":");
    opt_string(out, e.version.as_deref());
    out.extend_from_slice(b",\"params\":");
    // Held as its canonical text, which serde_json writes as it is.
    out.extend_from_slice(e.params.as_str().as_bytes());
    out.extend_from_slice(b",\"status\":");
    out.extend_from_slice(match e.status {
        Status::Queued => b"\"queued\"",
        Status::Running => b"\"running\"",
        Status::Completed => b"\"completed\"",
        Status::Failed => b"\"failed\"",
        Status::Cancelled => b"\"cancelled\"",
    });
    out.extend_from_slice(b",\"queue_state\":");
    out.extend_from_slice(match e.queue_state {
        None => b"null",
        Some(QueueState::Scheduled) => b"\"scheduled\"",
        Some(QueueState::Waiting) => b"\"waiting\"",
        Some(QueueState::Ready) => b"\"ready\"",
    });
    out.extend_from_slice(b",\"queue_position\":");
    match &e.queue_position {
        None => out.extend_from_slice(b"null"),
        Some(p) => {
            out.extend_from_slice(b"{\"tenant\":");
            number(out, p.tenant);
            out.extend_from_slice(b",\"key\":");
            match p.key {
                None => out.extend_from_slice(b"null"),
                Some(k) => number(out, k),
            }
            out.push(b'}');
        }
    }
    out.extend_from_slice(b",\"estimated_start\":");
    match &e.estimated_start {
        None => out.extend_from_slice(b"null"),
        Some(s) => {
            out.extend_from_slice(b"{\"p50\":");
            string(out, &s.p50);
            out.extend_from_slice(b",\"p90\":");
            string(out, &s.p90);
            out.push(b'}');
        }
    }
    out.extend_from_slice(b",\"priority\":");
    number(out, e.priority.into());
    out.extend_from_slice(b",\"run_at\":");
    opt_string(out, e.run_at.as_deref());
    out.extend_from_slice(b",\"dedup_key\":");
    opt_string(out, e.dedup_key.as_deref());
    out.extend_from_slice(b",\"concurrency_key\":");
    opt_string(out, e.concurrency_key.as_deref());
    out.extend_from_slice(b",\"traceparent\":");
    opt_string(out, e.traceparent.as_deref());
    out.extend_from_slice(b",\"tracestate\":");
    opt_string(out, e.tracestate.as_deref());
    out.extend_from_slice(b",\"deduplicated\":");
    boolean(out, e.deduplicated);
    out.extend_from_slice(b",\"attempt\":");
    number(out, e.attempt.into());
    out.extend_from_slice(b",\"max_attempts\":");
    number(out, e.max_attempts.into());
    out.extend_from_slice(b",\"cancel_requested\":");
    boolean(out, e.cancel_requested);
    out.extend_from_slice(b",\"created_at\":");
    string(out, &e.created_at);
    out.extend_from_slice(b",\"started_at\":");
    opt_string(out, e.started_at.as_deref());
    out.extend_from_slice(b",\"finished_at\":");
    opt_string(out, e.finished_at.as_deref());
    out.extend_from_slice(b",\"updated_at\":");
    string(out, &e.updated_at);
    out.extend_from_slice(b",\"output\":");
    match &e.output {
        None => out.extend_from_slice(b"null"),
        // Any JSON value: serde_json's own writer (writing into a Vec cannot fail).
        Some(v) => {
            let _ = serde_json::to_writer(&mut *out, v);
        }
    }
    out.extend_from_slice(b",\"error\":");
    match &e.error {
        None => out.extend_from_slice(b"null"),
        Some(err) => {
            out.extend_from_slice(b"{\"kind\":");
            string(out, &err.kind);
            out.extend_from_slice(b",\"message\":");
            string(out, &err.message);
            out.push(b'}');
        }
    }
    out.push(b'}');
}

/// `s` as a JSON string, as serde_json writes it. Almost every string of an answer (ids,
/// times, keys) holds nothing to escape and is copied between its quotes; one that does is
/// left to serde_json's escaping, so both agree on every character. (The check folds every
/// byte without stopping early, which the compiler turns into vector instructions: the
/// strings are short, so that beats a loop that may stop.)
fn string(out: &mut Vec<u8>, s: &str) {
    let escapes = s.bytes().fold(false, |any, b| {
        any | (b < 0x20) | (b == b'"') | (b == b'\\')
    });
    if escapes {
        let _ = serde_json::to_writer(&mut *out, s);
    } else {
        out.reserve(s.len() + 2);
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    }
}

fn opt_string(out: &mut Vec<u8>, s: Option<&str>) {
    match s {
        None => out.extend_from_slice(b"null"),
        Some(s) => string(out, s),
    }
}

fn boolean(out: &mut Vec<u8>, b: bool) {
    out.extend_from_slice(if b { b"true" } else { b"false" });
}

/// `n` in decimal, as serde_json writes an unsigned integer.
fn number(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::wire::{ErrorInfo, EstimatedStart, Execution, QueuePosition};
    use super::{Status, number, string, write_execution};
    use crate::domain::JsonText;

    /// What `axum::Json` writes for `e` (its `into_response` is `serde_json::to_writer`).
    fn serde_answer(e: &Execution) -> Vec<u8> {
        serde_json::to_vec(e).expect("an execution serializes")
    }

    fn bare() -> Execution {
        Execution {
            execution_id: "019abc12d3e47f80a1b2c3d4e5f60718".into(),
            tenant_id: "acme".into(),
            flow_id: "demo.echo".into(),
            version: None,
            params: JsonText::canonical("{}").unwrap(),
            status: Status::Queued,
            queue_state: None,
            queue_position: None,
            estimated_start: None,
            priority: 3,
            run_at: None,
            dedup_key: None,
            concurrency_key: None,
            traceparent: None,
            tracestate: None,
            deduplicated: false,
            attempt: 0,
            max_attempts: 5,
            cancel_requested: false,
            created_at: "2026-11-29T09:00:00.123Z".into(),
            started_at: None,
            finished_at: None,
            updated_at: "2026-11-29T09:00:00.123Z".into(),
            output: None,
            error: None,
        }
    }

    fn same_bytes(e: &Execution) {
        let mut mine = Vec::new();
        write_execution(&mut mine, e);
        assert_eq!(
            String::from_utf8(mine).unwrap(),
            String::from_utf8(serde_answer(e)).unwrap()
        );
    }

    #[test]
    fn an_execution_is_written_as_serde_json_writes_it() {
        same_bytes(&bare());
        let odd = "é \"quoted\" \\ \u{1}\u{1f}\u{7f}\u{2028}/\t\n😀";
        let mut every = bare();
        every.version = Some(odd.into());
        every.params = JsonText::canonical(r#"{"b":[1,2.5,"x\u0001"],"a":{"c":null}}"#).unwrap();
        every.queue_position = Some(QueuePosition {
            tenant: u64::MAX,
            key: Some(0),
        });
        every.estimated_start = Some(EstimatedStart {
            p50: "2026-11-29T09:00:01.400Z".into(),
            p90: "2026-11-29T09:00:02.100Z".into(),
        });
        every.priority = 1;
        every.run_at = Some("2026-11-29T10:00:00.000Z".into());
        every.dedup_key = Some(odd.into());
        every.concurrency_key = Some("customer-7".into());
        every.traceparent = Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into());
        every.tracestate = Some("congo=t61rcWkgMzE".into());
        every.deduplicated = true;
        every.attempt = 100;
        every.max_attempts = 100;
        every.cancel_requested = true;
        every.started_at = Some("2026-11-29T09:00:03.000Z".into());
        every.finished_at = Some("2026-11-29T09:00:04.000Z".into());
        every.output = Some(json!({"z": [1, -2, 3.25, "é\u{0}"], "a": true}));
        every.error = Some(ErrorInfo {
            kind: "handler_error".into(),
            message: odd.into(),
        });
        same_bytes(&every);
        for (status, state) in [
            (Status::Queued, Some(super::QueueState::Scheduled)),
            (Status::Queued, Some(super::QueueState::Waiting)),
            (Status::Queued, Some(super::QueueState::Ready)),
            (Status::Running, None),
            (Status::Completed, None),
            (Status::Failed, None),
            (Status::Cancelled, None),
        ] {
            let mut e = every.clone();
            e.status = status;
            e.queue_state = state;
            e.queue_position = Some(QueuePosition {
                tenant: 0,
                key: None,
            });
            same_bytes(&e);
        }
    }

    #[test]
    fn every_character_is_escaped_as_serde_json_escapes_it() {
        // Every character below U+0800 (all of ASCII and the two-byte forms) and a sample of
        // the rest, alone and between others.
        let chars = (0..0x800)
            .chain((0x800..=0x10_ffff).step_by(97))
            .filter_map(char::from_u32);
        for c in chars {
            for s in [c.to_string(), format!("a{c}b{c}")] {
                let mut mine = Vec::new();
                string(&mut mine, &s);
                assert_eq!(mine, serde_json::to_vec(&s).unwrap(), "{:?}", c);
            }
        }
    }

    #[test]
    fn numbers_are_written_as_serde_json_writes_them() {
        for n in [0, 1, 9, 10, 99, 100, 12_345, u64::from(u32::MAX), u64::MAX] {
            let mut mine = Vec::new();
            number(&mut mine, n);
            assert_eq!(mine, serde_json::to_vec(&n).unwrap());
        }
    }
}
