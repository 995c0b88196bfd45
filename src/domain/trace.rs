//! W3C Trace Context (`traceparent`, `tracestate`) carried from an admission to the handlers
//! that run it, so a trace the caller started goes on through sluice instead of stopping
//! there.
//!
//! Read as the W3C recommendation says a receiver reads it: a `traceparent` that does not
//! parse is ignored (the execution then carries no trace context; it is not an error, since a
//! caller's tracing library, not the caller, wrote it), and `tracestate` is kept only beside a
//! valid `traceparent`.

/// The most `tracestate` kept, in bytes: the recommendation's 512 characters (a longer one is
/// dropped whole rather than cut, since a cut list member would be wrong).
pub const MAX_TRACESTATE_BYTES: usize = 512;

/// A caller's trace context, as kept with an execution (row fields `tp` and `tst`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    /// `00-<trace id>-<parent id>-<flags>`, lowercase hex (version `00` as sent; a later
    /// version is kept as its first four fields, as the recommendation says to read it).
    pub traceparent: String,
    /// The vendors' list as sent, when present, valid and at most [`MAX_TRACESTATE_BYTES`].
    pub tracestate: Option<String>,
}

impl TraceContext {
    /// The trace context of a request's `traceparent` and `tracestate` header values; `None`
    /// when there is no valid `traceparent`.
    pub fn from_headers(traceparent: Option<&str>, tracestate: Option<&str>) -> Option<Self> {
        let traceparent = parse_traceparent(traceparent?.trim())?;
        let tracestate = tracestate
            .map(str::trim)
            .filter(|s| !s.is_empty() && s.len() <= MAX_TRACESTATE_BYTES)
            .filter(|s| s.bytes().all(|b| (0x20..=0x7e).contains(&b)))
            .map(str::to_owned);
        Some(Self {
            traceparent,
            tracestate,
        })
    }
}

/// The `traceparent` to keep, or `None` when `v` is not one: four dash-separated lowercase
/// hex fields of 2, 32, 16 and 2 digits; version `ff` is invalid; the trace id and the parent
/// id are not all zeros. Version `00` has exactly those four fields; a later version may add
/// more after a dash, which are dropped.
fn parse_traceparent(v: &str) -> Option<String> {
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let head = v.get(..55)?;
    let rest = &v[55..];
    let mut fields = head.split('-');
    let (version, trace_id, parent_id, flags) = (
        fields.next()?,
        fields.next()?,
        fields.next()?,
        fields.next()?,
    );
    let valid = hex(version, 2)
        && version != "ff"
        && hex(trace_id, 32)
        && trace_id.bytes().any(|b| b != b'0')
        && hex(parent_id, 16)
        && parent_id.bytes().any(|b| b != b'0')
        && hex(flags, 2)
        && (if version == "00" {
            rest.is_empty()
        } else {
            rest.is_empty() || rest.starts_with('-')
        });
    valid.then(|| head.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_is_kept_with_its_tracestate() {
        let t = TraceContext::from_headers(Some(VALID), Some("congo=t61rcWkgMzE")).unwrap();
        assert_eq!(t.traceparent, VALID);
        assert_eq!(t.tracestate.as_deref(), Some("congo=t61rcWkgMzE"));
        let t = TraceContext::from_headers(Some(&format!(" {VALID} ")), None).unwrap();
        assert_eq!((t.traceparent.as_str(), t.tracestate), (VALID, None));
    }

    #[test]
    fn an_invalid_traceparent_is_ignored_and_its_tracestate_with_it() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "0é-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
        ] {
            assert_eq!(
                TraceContext::from_headers(Some(bad), Some("a=b")),
                None,
                "{bad}"
            );
        }
        assert_eq!(TraceContext::from_headers(None, Some("a=b")), None);
    }

    #[test]
    fn a_later_version_is_read_as_its_first_four_fields() {
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes-next";
        let t = TraceContext::from_headers(Some(later), None).unwrap();
        assert_eq!(
            t.traceparent,
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        );
    }

    #[test]
    fn a_tracestate_too_long_or_not_printable_is_dropped_whole() {
        let long = "a=".to_owned() + &"b".repeat(MAX_TRACESTATE_BYTES);
        let t = TraceContext::from_headers(Some(VALID), Some(&long)).unwrap();
        assert_eq!(t.tracestate, None);
        let t = TraceContext::from_headers(Some(VALID), Some("a=b\u{7}")).unwrap();
        assert_eq!(t.tracestate, None);
        let t = TraceContext::from_headers(Some(VALID), Some("   ")).unwrap();
        assert_eq!(t.tracestate, None);
    }
}
