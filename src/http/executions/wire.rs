//! The JSON shapes of `/api/executions`: what clients send and receive, and the OpenAPI schema
//! that says so. Built from the domain types (`domain`), never the other way round, so a
//! change of the row format or of the domain cannot change the contract unnoticed (the
//! committed `openapi/openapi.json` and the tests would show it).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{
    AdditionalProperties, KnownFormat, Object, ObjectBuilder, OneOfBuilder, Schema, SchemaFormat,
    SchemaType, Type,
};

use crate::domain::{self, AdmitInput};
use crate::http::extract::WholeU32;

/// A JSON object with any members (`params`). Said outright (`additionalProperties: true`):
/// generators read an object without it as one that has no members, e.g. openapi-typescript's
/// `Record<string, never>`, which no call with parameters would compile against.
pub(crate) fn free_form_object() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::Object)
        .additional_properties(Some(AdditionalProperties::FreeForm(true)))
        .build()
}

/// [`free_form_object`], or null (an admission's `params` may be null: `{}`).
fn free_form_object_or_null() -> Object {
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::Object, Type::Null]))
        .additional_properties(Some(AdditionalProperties::FreeForm(true)))
        .description(Some(
            "JSON object handed to the flow; `{}` when absent or null. At most \
             `--max-params-bytes` (64 KiB by default) as canonical JSON, else 413 \
             `params_too_large`.",
        ))
        .build()
}

/// Lifecycle of an execution: `queued` → `running` → one terminal status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Queued,
    Running,
    Completed,
    Failed,
    Cancelled,
}

impl From<domain::Status> for Status {
    fn from(s: domain::Status) -> Self {
        match s {
            domain::Status::Queued => Status::Queued,
            domain::Status::Running => Status::Running,
            domain::Status::Completed => Status::Completed,
            domain::Status::Failed => Status::Failed,
            domain::Status::Cancelled => Status::Cancelled,
        }
    }
}

/// Where a queued execution stands, at the moment of the answer: `scheduled` (not due yet: a
/// `run_at`/`delay`, or a retry's backoff; it holds no slot), `ready` (runnable within its
/// tenant's free slots: it starts as soon as a worker has room and the fair share reaches its
/// tenant) or `waiting` (runnable, behind its tenant's `max_concurrent`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum QueueState {
    Scheduled,
    Waiting,
    Ready,
}

impl From<domain::QueueState> for QueueState {
    fn from(q: domain::QueueState) -> Self {
        match q {
            domain::QueueState::Scheduled => QueueState::Scheduled,
            domain::QueueState::Waiting => QueueState::Waiting,
            domain::QueueState::Ready => QueueState::Ready,
        }
    }
}

/// Why an execution failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct ErrorInfo {
    /// Machine-readable kind, e.g. `handler_error`, `lease_lost`, `poison`.
    pub kind: String,
    pub message: String,
}

/// What admission would do now with this request (`POST /api/executions/dry-run`),
/// decided by a script that cannot write: a snapshot, the real admission decides again.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({
    "decision": "wait",
    "reason": "key_at_limit",
    "queue_position": {"tenant": 3, "key": 12},
    "estimated_start": {"p50": "2026-11-29T09:01:10.000Z", "p90": "2026-11-29T09:01:31.000Z"},
    "retry_after": null,
    "run_at": null
}))]
pub struct DryRunAnswer {
    /// `admit` (it would be `ready`), `wait` (behind its tenant's `max_concurrent` or its
    /// key's limit), `schedule` (not due yet), `duplicate` (the dedup key names a live
    /// execution with the same request: a replay), `conflict` (the same key with another
    /// request: 422), `refuse` (403 `tenant_disabled`, 409 `tenant_deleting` or 429
    /// `tenant_queue_full`).
    pub decision: DryRunDecision,
    /// Why, in a word: `ready`, `tenant_at_max_concurrent`, `key_at_limit`, `scheduled`,
    /// `same_request`, `idempotency_key_conflict`, `tenant_disabled`, `tenant_deleting`,
    /// `tenant_queue_full`.
    pub reason: String,
    /// Where it would stand (admit, wait), or where the duplicate stands.
    pub queue_position: Option<QueuePosition>,
    /// When it would start (admit, wait), or the duplicate (see `Execution.estimated_start`).
    pub estimated_start: Option<EstimatedStart>,
    /// Seconds until the full queue frees a place (refuse, `tenant_queue_full`).
    #[schema(format = Int64, maximum = 3600)]
    pub retry_after: Option<u64>,
    /// The execution the dedup key names (duplicate, conflict); absent otherwise, so a client
    /// that follows it to `/api/executions/{id}` never follows a null.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[0-9a-f]{32}$", nullable = false)]
    pub execution_id: Option<String>,
    /// When it would be due (schedule), RFC 3339.
    #[schema(format = DateTime)]
    pub run_at: Option<String>,
}

/// `DryRunAnswer.decision`.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DryRunDecision {
    Admit,
    Wait,
    Schedule,
    Duplicate,
    Conflict,
    Refuse,
}

impl DryRunAnswer {
    /// The answer for the store's dry run, with the `Retry-After` a refusal would carry.
    pub fn new(run: crate::store::DryRun, retry_after: Option<u64>) -> Self {
        use crate::store::Decision as D;
        Self {
            decision: match run.decision {
                D::Admit => DryRunDecision::Admit,
                D::Wait => DryRunDecision::Wait,
                D::Schedule => DryRunDecision::Schedule,
                D::Duplicate => DryRunDecision::Duplicate,
                D::Conflict => DryRunDecision::Conflict,
                D::Refuse => DryRunDecision::Refuse,
            },
            reason: run.reason,
            queue_position: run.queue_position.map(|p| QueuePosition {
                tenant: p.tenant,
                key: p.key,
            }),
            estimated_start: run.estimated_start.map(|s| EstimatedStart {
                p50: s.p50,
                p90: s.p90,
            }),
            retry_after,
            execution_id: run.execution_id,
            run_at: run
                .run_at_ms
                .and_then(|ms| domain::rfc3339_from_ms(&ms.to_string())),
        }
    }
}

/// Where a runnable execution stands at the moment of an answer.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct QueuePosition {
    /// How many of its tenant's runnable executions start before it in the tenant's order (0:
    /// it is next). For one whose concurrency key is at its limit: the executions of the
    /// tenant's order ahead of its place.
    #[schema(format = Int64, maximum = 1_000_000_000_u64)]
    pub tenant: u64,
    /// With a concurrency key: how many executions of its key come before it (0: it is its
    /// key's next); null without a key.
    #[schema(format = Int64, maximum = 1_000_000_000_u64)]
    pub key: Option<u64>,
}

/// When a waiting execution is expected to start: before `p50` about half the time, before
/// `p90` about nine times in ten, if its tenant's recent start rate holds.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct EstimatedStart {
    #[schema(format = DateTime)]
    pub p50: String,
    #[schema(format = DateTime)]
    pub p90: String,
}

/// One execution, as returned by every execution call.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(example = json!({
    "execution_id": "019abc12d3e47f80a1b2c3d4e5f60718",
    "tenant_id": "acme",
    "flow_id": "demo.echo",
    "version": null,
    "params": {"order": 42},
    "status": "queued",
    "queue_state": "ready",
    "queue_position": {"tenant": 4, "key": 0},
    "estimated_start": {"p50": "2026-11-29T09:00:01.400Z", "p90": "2026-11-29T09:00:02.100Z"},
    "priority": 3,
    "run_at": null,
    "dedup_key": "order-42",
    "concurrency_key": "customer-7",
    "deduplicated": false,
    "attempt": 0,
    "max_attempts": 5,
    "cancel_requested": false,
    "created_at": "2026-11-29T09:00:00.123Z",
    "started_at": null,
    "finished_at": null,
    "updated_at": "2026-11-29T09:00:00.123Z",
    "output": null,
    "error": null
}))]
pub struct Execution {
    /// 32 lowercase hex characters (a UUIDv7, so ids sort by creation time).
    #[schema(pattern = "^[0-9a-f]{32}$")]
    pub execution_id: String,
    #[schema(pattern = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
    pub tenant_id: String,
    #[schema(pattern = "^[A-Za-z0-9][A-Za-z0-9_./-]{0,127}$")]
    pub flow_id: String,
    #[schema(min_length = 1, max_length = 64)]
    pub version: Option<String>,
    #[schema(schema_with = free_form_object)]
    pub params: domain::JsonText,
    pub status: Status,
    /// Set only while `queued`.
    pub queue_state: Option<QueueState>,
    /// Where it stands while runnable (queued and due; null otherwise): a snapshot at the
    /// moment of the answer, not a promise — fair share between tenants, other keys and
    /// higher priorities move it.
    pub queue_position: Option<QueuePosition>,
    /// When it is expected to start while runnable, from the start rate its tenant's
    /// per-minute counters measured over the last minutes; null while nothing was measured (or
    /// its key is held at 0). An estimate, not a promise.
    pub estimated_start: Option<EstimatedStart>,
    /// 1 (first) to 5 (last): the order within its tenant (between tenants only weights
    /// decide).
    #[schema(minimum = 1, maximum = 5)]
    pub priority: u8,
    /// When it was scheduled to start at the earliest (RFC 3339): its `run_at`, its `delay`
    /// counted from admission, or the end of a retry's backoff; null when never scheduled.
    #[schema(format = DateTime)]
    pub run_at: Option<String>,
    #[schema(min_length = 1, max_length = 256)]
    pub dedup_key: Option<String>,
    /// What it competes for inside its tenant (see `NewExecution.concurrency_key`).
    #[schema(min_length = 1, max_length = 128)]
    pub concurrency_key: Option<String>,
    /// The W3C `traceparent` its admission carried (the first admission's, on a replay): what
    /// its handlers receive (the `traceparent` header of an `http` handler, `TRACEPARENT` in
    /// a `command` handler's environment). Null when the admission sent none, or one that
    /// does not parse (ignored, as the W3C recommendation says).
    #[schema(pattern = "^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")]
    pub traceparent: Option<String>,
    /// The W3C `tracestate` sent beside that `traceparent` (at most 512 bytes), handed on
    /// with it.
    #[schema(max_length = 512)]
    pub tracestate: Option<String>,
    /// True when this response replays an earlier admission with the same dedup key.
    pub deduplicated: bool,
    /// Starts of its current run: 1 on the first, counted up by each re-run after a lost
    /// lease or a retryable failure, never above `max_attempts`; `POST .../retry` starts over
    /// at 0. (Workers are fenced by a separate token that never repeats.)
    #[schema(maximum = 100)]
    pub attempt: u32,
    #[schema(minimum = 1, maximum = 100)]
    pub max_attempts: u32,
    pub cancel_requested: bool,
    /// RFC 3339.
    #[schema(format = DateTime)]
    pub created_at: String,
    #[schema(format = DateTime)]
    pub started_at: Option<String>,
    #[schema(format = DateTime)]
    pub finished_at: Option<String>,
    #[schema(format = DateTime)]
    pub updated_at: String,
    /// What the flow returned (any JSON value), once completed.
    #[schema(value_type = Option<Value>)]
    pub output: Option<Value>,
    pub error: Option<ErrorInfo>,
}

impl From<domain::Execution> for Execution {
    fn from(e: domain::Execution) -> Self {
        Self {
            execution_id: e.execution_id,
            tenant_id: e.tenant_id,
            flow_id: e.flow_id,
            version: e.version,
            params: e.params,
            status: e.status.into(),
            queue_state: e.queue_state.map(Into::into),
            queue_position: e.queue_position.map(|p| QueuePosition {
                tenant: p.tenant,
                key: p.key,
            }),
            estimated_start: e.estimated_start.map(|s| EstimatedStart {
                p50: s.p50,
                p90: s.p90,
            }),
            priority: e.priority,
            run_at: e.run_at,
            dedup_key: e.dedup_key,
            concurrency_key: e.concurrency_key,
            traceparent: e.traceparent,
            tracestate: e.tracestate,
            deduplicated: e.deduplicated,
            attempt: e.attempt,
            max_attempts: e.max_attempts,
            cancel_requested: e.cancel_requested,
            created_at: e.created_at,
            started_at: e.started_at,
            finished_at: e.finished_at,
            updated_at: e.updated_at,
            output: e.output,
            error: e.error.map(|e| ErrorInfo {
                kind: e.kind,
                message: e.message,
            }),
        }
    }
}

/// The body of `POST /api/executions`.
///
/// `dedup_key` is at most 256 *bytes* of UTF-8 (JSON Schema counts characters, so
/// `maxLength` alone allows more); when the `Idempotency-Key` header is sent too, both must
/// be equal.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"flow_id": "demo.echo", "params": {"order": 42}, "dedup_key": "order-42"}))]
pub struct NewExecution {
    /// Flow to run.
    #[schema(pattern = "^[A-Za-z0-9][A-Za-z0-9_./-]{0,127}$")]
    pub flow_id: String,
    /// Optional flow version label: 1–64 characters, no control characters.
    #[serde(default)]
    #[schema(
        min_length = 1,
        max_length = 64,
        pattern = "^[^\\x00-\\x1F\\x7F-\\x9F]*$"
    )]
    pub version: Option<String>,
    /// JSON object handed to the flow; `{}` when absent or null. At most `--max-params-bytes`
    /// (64 KiB by default) as canonical JSON, else 413 `params_too_large`.
    #[serde(default)]
    #[schema(schema_with = free_form_object_or_null)]
    pub params: Option<Box<serde_json::value::RawValue>>,
    /// Idempotency key: 1–256 bytes of UTF-8 without control characters or invisible
    /// formatting ones (zero-width, bidirectional overrides and isolates: they would make two
    /// keys that look alike differ); may instead come from the `Idempotency-Key` header.
    #[serde(default)]
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = "^[^\\x00-\\x1F\\x7F-\\x9F\\xAD\\u061C\\u180E\\u200B-\\u200F\\u2028-\\u202E\\u2060-\\u2064\\u2066-\\u2069\\uFEFF\\uFFF9-\\uFFFB]*$"
    )]
    pub dedup_key: Option<String>,
    /// How many times a worker may start it (default 5).
    #[serde(default)]
    #[schema(value_type = Option<u32>, minimum = 1, maximum = 100)]
    pub max_attempts: Option<WholeU32>,
    /// 1 (first) to 5 (last), default 3: orders the tenant's own executions (FIFO within a
    /// priority; a priority step counts as a minute of waiting, so nothing starves).
    #[serde(default)]
    #[schema(value_type = Option<u32>, minimum = 1, maximum = 5)]
    pub priority: Option<WholeU32>,
    /// Start no earlier than this (RFC 3339, at most a year ahead; a past time means now).
    /// Until then the execution is `queued` / `scheduled`.
    #[serde(default)]
    #[schema(format = DateTime)]
    pub run_at: Option<String>,
    /// Start no earlier than this long after admission: `250ms`, `30s`, `5m`, `2h`, `1d` (a
    /// plain number is seconds), at most a year. Not with `run_at`.
    #[serde(default)]
    #[schema(pattern = "^[0-9]{1,12}(ms|s|m|h|d)?$")]
    pub delay: Option<String>,
    /// What it competes for inside its tenant, e.g. its end customer: executions with one key
    /// run at most the key's limit at once (its override, `PUT
    /// /api/tenants/{tenant}/concurrency-keys/{key}`, else the tenant's
    /// `max_concurrent_per_key`; none when neither is set), inside the tenant's
    /// `max_concurrent`. A key at its limit never delays another key. 1–128 bytes of UTF-8,
    /// the dedup key's characters; part of what a dedup key's replay must match.
    #[serde(default)]
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = "^[^\\x00-\\x1F\\x7F-\\x9F\\xAD\\u061C\\u180E\\u200B-\\u200F\\u2028-\\u202E\\u2060-\\u2064\\u2066-\\u2069\\uFEFF\\uFFF9-\\uFFFB]*$"
    )]
    pub concurrency_key: Option<String>,
}

impl From<NewExecution> for AdmitInput {
    fn from(b: NewExecution) -> Self {
        Self {
            flow_id: b.flow_id,
            version: b.version,
            params: b.params,
            dedup_key: b.dedup_key,
            max_attempts: b.max_attempts.map(|m| m.0),
            priority: b.priority.map(|p| p.0),
            run_at: b.run_at,
            delay: b.delay,
            concurrency_key: b.concurrency_key,
        }
    }
}

/// A page of executions, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub struct ExecutionPage {
    /// At most `limit`, and fewer when the page reached its byte budget.
    pub executions: Vec<Execution>,
    /// Pass as `cursor` for the next page; null on the last page.
    #[schema(pattern = "^[0-9a-f]{32}$")]
    pub next_cursor: Option<String>,
    /// How many executions match the filters in all.
    pub total: u64,
}

/// The pattern of a `delay` (the range, at most a year, is checked by the server).
const DELAY_PATTERN: &str = "^[0-9]{1,12}(ms|s|m|h|d)?$";

/// The body of `POST /api/executions/{id}/reschedule`: exactly one of `run_at` and `delay`,
/// each a string. Its schema says so (`oneOf`, each branch requiring its member and nothing
/// else), and the server takes exactly what the schema takes: neither, both, a `null` or any
/// other member is a 400, so a client that checks its body against the schema is never
/// surprised by the answer.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RescheduleBody {
    /// The new earliest start (RFC 3339, at most a year ahead; a past time means now).
    #[serde(default, deserialize_with = "string_not_null")]
    pub run_at: Option<String>,
    /// The new earliest start as a duration from now: `250ms`, `30s`, `5m`, `2h`, `1d`.
    #[serde(default, deserialize_with = "string_not_null")]
    pub delay: Option<String>,
}

/// A member that, when present, is a string (`null` is refused like any other non-string).
fn string_not_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    String::deserialize(d).map(Some)
}

impl utoipa::PartialSchema for RescheduleBody {
    fn schema() -> RefOr<Schema> {
        // One branch: an object with `name` (required) and nothing else.
        let branch = |title: &str, name: &str, member: ObjectBuilder| {
            ObjectBuilder::new()
                .schema_type(Type::Object)
                .title(Some(title))
                .property(name, member)
                .required(name)
                .additional_properties(Some(AdditionalProperties::FreeForm(false)))
                .build()
        };
        OneOfBuilder::new()
            .item(branch(
                "RescheduleAt",
                "run_at",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .format(Some(SchemaFormat::KnownFormat(KnownFormat::DateTime)))
                    .description(Some(
                        "The new earliest start (RFC 3339, at most a year ahead; a past time \
                         means now).",
                    )),
            ))
            .item(branch(
                "RescheduleAfter",
                "delay",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .pattern(Some(DELAY_PATTERN))
                    .description(Some(
                        "The new earliest start as a duration from now: `250ms`, `30s`, `5m`, \
                         `2h`, `1d` (a plain number is seconds), at most a year.",
                    )),
            ))
            .description(Some(
                "Exactly one of `run_at` and `delay`; neither, both, or a null is a 400.",
            ))
            .examples([serde_json::json!({"delay": "10m"})])
            .into()
    }
}

impl ToSchema for RescheduleBody {}

/// The body `POST /api/executions/{id}/retry` takes: none, or an empty object. A retry
/// changes nothing of the execution yet, so any member is a 400 `invalid_body` rather than
/// silently ignored: a client that meant to change something learns at once that it did not.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({}))]
pub struct RetryBody {}

/// One event of `GET /api/executions/{id}/events`, as an SSE parser hands it over (the stream
/// itself is `text/event-stream` text; comment lines are heartbeats and carry no event). Not
/// sent as JSON: the schema documents the event's fields for clients and schema checkers.
#[derive(Debug, ToSchema)]
#[allow(dead_code)]
pub struct ExecutionEvent {
    /// `execution`: `data` is the execution, exactly as `GET /api/executions/{id}` returns it.
    /// `deleted`: it was force-deleted; `data` is `{"execution_id": ...}`, and the stream ends.
    /// `revoked`: the caller's API key was revoked or its tenant deleted; `data` is
    /// `{"execution_id": ...}`, and the stream ends (opening it again answers 401).
    pub event: ExecutionEventName,
    /// The event's payload, JSON text.
    #[schema(content_media_type = "application/json")]
    pub data: String,
}

/// The name of an event of `GET /api/executions/{id}/events`.
#[derive(Debug, ToSchema)]
#[schema(rename_all = "lowercase")]
#[allow(dead_code)]
pub enum ExecutionEventName {
    Execution,
    Deleted,
    Revoked,
}

/// Body of `POST /api/executions/batch`: the executions to admit, in order.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"items": [
    {"flow_id": "demo.echo", "params": {"order": 42}, "dedup_key": "order-42"},
    {"flow_id": "demo.echo", "params": {"order": 43}, "priority": 1}
]}))]
pub struct NewBatch {
    /// 1–1,000 executions, each exactly the body `POST /api/executions` takes (its own
    /// `dedup_key`, priority, schedule and concurrency key). An item that is not valid gets its
    /// own 400 result; the others are admitted.
    #[schema(value_type = Vec<NewExecution>, min_items = 1, max_items = 1000)]
    pub items: Vec<Value>,
}

/// What became of one item of a batch: the status and body it would have had alone.
#[derive(Debug, Serialize, ToSchema)]
pub struct BatchResult {
    /// 201 admitted, 200 a replay of its dedup key (an earlier item of the batch included),
    /// or the error status single admission answers (400, 403, 413, 422, 429, 503, 500).
    #[schema(minimum = 200, maximum = 599)]
    pub status: u16,
    /// The execution (201, 200).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub execution: Option<Execution>,
    /// Why it was not admitted (any other status), with the codes of single admission.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<crate::http::error::Problem>,
}

/// The answer of `POST /api/executions/batch`: one result per item, in the items' order.
#[derive(Debug, Serialize, ToSchema)]
pub struct BatchAnswer {
    pub results: Vec<BatchResult>,
}
