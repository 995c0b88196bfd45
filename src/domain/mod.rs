//! The domain: what a request to start an execution is, once parsed, and what an
//! execution is. No HTTP and no Redis types live here; the HTTP layer parses into these types
//! at the edge (and renders them as its own wire types), and the store persists them.

mod execution;
mod ids;
mod json_text;
mod request;
pub mod row;
mod trace;

pub use execution::{
    ErrorInfo, EstimatedStart, Execution, QueuePosition, QueueState, Status, rfc3339_from_ms,
};
pub use ids::{
    ConcurrencyKey, DedupKey, ExecutionId, FlowId, InvalidInput, TenantId, Version, is_hidden_char,
};
pub use json_text::JsonText;
pub use request::{
    AdmitInput, AdmitRequest, DEFAULT_PRIORITY, Fingerprint, MAX_ATTEMPTS_LIMIT,
    MAX_SCHEDULE_AHEAD_MS, Schedule, parse_delay, schedule_of,
};
pub use trace::{MAX_TRACESTATE_BYTES, TraceContext};
