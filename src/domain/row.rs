//! The field names of an execution's row (a Redis hash), layout 3: the Rust half of the one
//! table declared in `migrations-lua/common.lua` ("Rows"). Names are one or two characters
//! because each is stored once per execution; a field equal to its default is not stored and
//! the reader supplies it. Every Rust reader of a raw row (`Execution::from_row`, the test
//! helpers, the benchmark's checks) names fields through these constants, and the test
//! `rows::` checks this table against the Lua one and against what the scripts write, so a
//! field renamed on one side fails a test, not a read.
//!
//! `LEGACY` maps the names of layouts 1 and 2 to these: `sluice migrate-layout` converts
//! rows with it, and a plain read of a row not converted yet (a shard whose conversion is
//! under way) is read through it.

use std::collections::HashMap;

/// Tenant id.
pub const TENANT: &str = "t";
/// Flow id.
pub const FLOW: &str = "f";
/// Flow version; absent: none.
pub const VERSION: &str = "v";
/// Params, JSON text.
pub const PARAMS: &str = "p";
/// Status: `queued`, `running`, `completed`, `failed` or `cancelled`.
pub const STATUS: &str = "s";
/// `max_attempts`.
pub const MAX_ATTEMPTS: &str = "m";
/// Starts of the current run; absent: 0.
pub const ATTEMPT: &str = "a";
/// Admission time, Unix ms.
pub const CREATED: &str = "c";
/// Last change, Unix ms; absent: equal to `CREATED`.
pub const UPDATED: &str = "u";
/// Priority 1..5; absent: `DEFAULT_PRIORITY`.
pub const PRIORITY: &str = "pr";
/// Logical base size (the tenant's byte accounting).
pub const SIZE: &str = "z";
/// Dedup key as given.
pub const DEDUP: &str = "d";
/// Dedup key's digest: 32 hex digits, its 16 bytes at layout 5 (`Shard::stored_digest`).
pub const DEDUP_DIGEST: &str = "dh";
/// Concurrency key as given.
pub const CONCURRENCY_KEY: &str = "k";
/// Concurrency key's digest.
pub const CONCURRENCY_DIGEST: &str = "kh";
/// W3C `traceparent`.
pub const TRACEPARENT: &str = "tp";
/// W3C `tracestate`.
pub const TRACESTATE: &str = "ts";
/// Queue state while queued: `queued` or `scheduled`; absent: `queued`.
pub const QSTATE: &str = "q";
/// When it became runnable, Unix ms; absent: equal to `CREATED`.
pub const READY_AT: &str = "r";
/// Due time while scheduled, Unix ms.
pub const RUN_AT: &str = "ra";
/// Stream entry (schema 1 only).
pub const ENTRY: &str = "e";
/// Lease owner (worker consumer name).
pub const LEASE_OWNER: &str = "lo";
/// Lease end, Unix ms.
pub const LEASE_UNTIL: &str = "lu";
/// Fencing token of the current start.
pub const FENCE: &str = "fe";
/// Cancel requested (`1`).
pub const CANCEL: &str = "x";
/// Force-deleted while running (`1`).
pub const DELETED: &str = "dl";
/// Somebody waits on it until (Unix ms).
pub const WATCH: &str = "w";
/// Webhook sequence number.
pub const WEBHOOK_SEQ: &str = "ws";
/// Start time, Unix ms.
pub const STARTED: &str = "st";
/// End time, Unix ms.
pub const FINISHED: &str = "fi";
/// Output, JSON text.
pub const OUTPUT: &str = "o";
/// Error kind.
pub const ERR_KIND: &str = "ek";
/// Error message.
pub const ERR_MSG: &str = "em";
/// Fence of the run whose report was taken.
pub const REPORTED: &str = "rp";

/// Layout 5: the request's fingerprint (8 bytes), beside the binary `DEDUP_DIGEST`, in a
/// row with a dedup key; the Lua's, so that a completion moves the dedup mapping without
/// reading it (`dedup_end()` in common.lua). No reader of the API wants it.
pub const FINGERPRINT: &str = "fp";

/// The fields only a row of layout 5 holds (no layout-2 name: not in `LEGACY`).
pub const LAYOUT_5: [&str; 1] = [FINGERPRINT];

/// Every field a row may hold, with its layout-2 name: the declaration the test checks
/// against `common.lua`, and the conversion `sluice migrate-layout` applies.
pub const LEGACY: [(&str, &str); 34] = [
    ("tenant", TENANT),
    ("flow", FLOW),
    ("version", VERSION),
    ("params", PARAMS),
    ("status", STATUS),
    ("max_attempts", MAX_ATTEMPTS),
    ("attempt", ATTEMPT),
    ("created", CREATED),
    ("updated", UPDATED),
    ("priority", PRIORITY),
    ("sz", SIZE),
    ("dedup", DEDUP),
    ("ddh", DEDUP_DIGEST),
    ("ckey", CONCURRENCY_KEY),
    ("ckh", CONCURRENCY_DIGEST),
    ("tp", TRACEPARENT),
    ("tst", TRACESTATE),
    ("qstate", QSTATE),
    ("ready_at", READY_AT),
    ("run_at", RUN_AT),
    ("entry", ENTRY),
    ("lease_owner", LEASE_OWNER),
    ("lease_until", LEASE_UNTIL),
    ("fence", FENCE),
    ("cancel", CANCEL),
    ("deleted", DELETED),
    ("watch", WATCH),
    ("whseq", WEBHOOK_SEQ),
    ("started", STARTED),
    ("finished", FINISHED),
    ("output", OUTPUT),
    ("err_kind", ERR_KIND),
    ("err_msg", ERR_MSG),
    ("reported", REPORTED),
];

/// The layout-3 name of a layout-2 field, `None` for a name no row of layout 2 holds.
pub fn compact_name(legacy: &str) -> Option<&'static str> {
    LEGACY.iter().find(|(l, _)| *l == legacy).map(|(_, c)| *c)
}

/// A row's fields under the names of this layout: a row of layout 1 or 2 (every such row
/// has a `status`; its shard's conversion is under way) is renamed, names no row holds (a
/// script's reply fields) kept; a compact row is returned as it is.
pub fn normalize(fields: HashMap<String, String>) -> HashMap<String, String> {
    if !fields.contains_key("status") {
        return fields;
    }
    fields
        .into_iter()
        .map(|(k, v)| (compact_name(&k).map_or(k, str::to_owned), v))
        .collect()
}
