//! An execution as sluice knows it, rebuilt from its Redis row. Not the wire format: the API's
//! JSON shape is `http::executions::wire`, built from this, so a storage change cannot change
//! the contract by accident.

use std::collections::HashMap;

use serde_json::Value;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// Lifecycle of an execution: `queued` → `running` → one terminal status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Queued,
    Running,
    Completed,
    Failed,
    Cancelled,
}

impl Status {
    /// Every status, in lifecycle order.
    pub const ALL: [Status; 5] = [
        Status::Queued,
        Status::Running,
        Status::Completed,
        Status::Failed,
        Status::Cancelled,
    ];

    /// The status as written on Redis and in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Queued => "queued",
            Status::Running => "running",
            Status::Completed => "completed",
            Status::Failed => "failed",
            Status::Cancelled => "cancelled",
        }
    }

    /// Parses the API/Redis spelling.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// Whether no further transition happens (the row then carries the retention TTL).
    pub fn is_terminal(self) -> bool {
        matches!(self, Status::Completed | Status::Failed | Status::Cancelled)
    }
}

/// Where a queued execution stands: not due yet (`scheduled`: a `run_at`/`delay`, or a retry's
/// backoff), runnable within its tenant's free slots (`ready`: it starts as soon as a worker
/// has room and the fair share reaches its tenant), or runnable behind its tenant's
/// `max_concurrent` (`waiting`). A snapshot taken when the answer was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueState {
    Scheduled,
    Waiting,
    Ready,
}

impl QueueState {
    /// The state as scripts name it (`queue_state()` in `migrations-lua/common.lua`).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "scheduled" => Some(Self::Scheduled),
            "waiting" => Some(Self::Waiting),
            "ready" => Some(Self::Ready),
            _ => None,
        }
    }
}

/// Why an execution failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorInfo {
    /// Machine-readable kind, e.g. `handler_error`, `lease_lost`, `poison`.
    pub kind: String,
    pub message: String,
}

/// Where a runnable execution stands at the moment of an answer: a snapshot, not a promise
/// (fair share, other keys and retries move it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueuePosition {
    /// How many of its tenant's runnable executions start before it in the tenant's order (0:
    /// it is next).
    pub tenant: u64,
    /// With a concurrency key: how many executions of its key come before it.
    pub key: Option<u64>,
    /// Its key's limit, when it has one (what the forecast needs).
    pub key_limit: Option<u32>,
}

impl QueuePosition {
    /// Reads the position fields a script adds to a view (`qpt`, `qpk`, `qkl`: see `view()`
    /// and `position()` in `migrations-lua/common.lua`); `None` when there are none.
    pub fn from_fields(
        tenant: Option<&str>,
        key: Option<&str>,
        limit: Option<&str>,
    ) -> Option<Self> {
        let tenant = tenant?.parse().ok()?;
        let key = key.and_then(|k| k.parse().ok());
        let key_limit = limit
            .and_then(|l| l.parse::<i64>().ok())
            .and_then(|l| u32::try_from(l).ok());
        Some(Self {
            tenant,
            key,
            key_limit,
        })
    }
}

/// When a waiting execution is expected to start (RFC 3339 times), from the start rate its
/// tenant's per-minute counters measured: it starts before `p50` about half the time, before
/// `p90` about nine times in ten, if the rate holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EstimatedStart {
    pub p50: String,
    pub p90: String,
}

/// One execution: its request, where it is in its lifecycle, and how its last run ended.
#[derive(Debug, Clone)]
pub struct Execution {
    /// 32 lowercase hex characters (a UUIDv7, so ids sort by creation time).
    pub execution_id: String,
    pub tenant_id: String,
    pub flow_id: String,
    pub version: Option<String>,
    /// Its params as stored (canonical JSON text), shared, not parsed.
    pub params: super::JsonText,
    pub status: Status,
    /// Set only while `queued`.
    pub queue_state: Option<QueueState>,
    /// Set only while runnable (queued and due).
    pub queue_position: Option<QueuePosition>,
    /// Set only while runnable and a start rate was measured (`Store::forecast`).
    pub estimated_start: Option<EstimatedStart>,
    /// 1..=5, 1 first: the order within its tenant.
    pub priority: u8,
    /// RFC 3339: when it was scheduled to start at the earliest (its `run_at`, its `delay`
    /// from admission, or the end of a retry's backoff); `None` when it never was.
    pub run_at: Option<String>,
    pub dedup_key: Option<String>,
    /// What it competes for inside its tenant; `None` for none.
    pub concurrency_key: Option<String>,
    /// The W3C trace context its admission carried (`traceparent`, `tracestate`).
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
    /// True when this response replays an earlier admission with the same dedup key.
    pub deduplicated: bool,
    /// Starts of its current run: 1 on the first, counted up by each re-run after a lost
    /// lease or a retryable failure, never above `max_attempts`; `POST .../retry` starts over
    /// at 0. (Workers are fenced by a separate token that never repeats.)
    pub attempt: u32,
    pub max_attempts: u32,
    pub cancel_requested: bool,
    /// RFC 3339.
    pub created_at: String,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
    pub updated_at: String,
    pub output: Option<Value>,
    pub error: Option<ErrorInfo>,
}

impl Execution {
    /// The view of an execution admitted just now, built from its request and what the
    /// admission script decided (saves reading back the row it wrote).
    pub fn admitted(
        id: &str,
        tenant: &str,
        req: &super::AdmitRequest,
        queue_state: QueueState,
        queue_position: Option<QueuePosition>,
        now_ms: &str,
        due_ms: Option<String>,
    ) -> Result<Self, String> {
        let now = rfc3339_from_ms_of(now_ms, id)?;
        let run_at = due_ms.map(|d| rfc3339_from_ms_of(&d, id)).transpose()?;
        Ok(Self {
            execution_id: id.to_owned(),
            tenant_id: tenant.to_owned(),
            // `as_str().to_owned()`, not `to_string()`: `Display` goes through the formatter.
            flow_id: req.flow.as_str().to_owned(),
            version: req.version.as_ref().map(|v| v.as_str().to_owned()),
            params: req.params.clone(),
            status: Status::Queued,
            queue_state: Some(queue_state),
            queue_position,
            estimated_start: None,
            priority: req.priority,
            run_at,
            dedup_key: req.dedup.as_ref().map(|d| d.as_str().to_owned()),
            concurrency_key: req.concurrency_key.as_ref().map(|k| k.as_str().to_owned()),
            traceparent: req.trace.as_ref().map(|t| t.traceparent.clone()),
            tracestate: req.trace.as_ref().and_then(|t| t.tracestate.clone()),
            deduplicated: false,
            attempt: 0,
            max_attempts: req.max_attempts,
            cancel_requested: false,
            created_at: now.clone(),
            started_at: None,
            finished_at: None,
            updated_at: now,
            output: None,
            error: None,
        })
    }

    /// Builds the client view of a row (`HGETALL` field/value pairs). An error means the row
    /// is not one sluice wrote: a bug or foreign data, reported as such.
    pub fn from_row(
        id: &str,
        fields: HashMap<String, String>,
        deduplicated: bool,
    ) -> Result<Self, String> {
        use super::row as f;
        // A row of layout 1 or 2 (its shard's conversion is under way): read by its old names.
        let fields = f::normalize(fields);
        let get = |k: &str| fields.get(k).map(String::as_str);
        let need = |k: &str| get(k).ok_or_else(|| format!("row {id} lacks field {k}"));
        let time_of = |k: &str| -> Result<Option<String>, String> {
            get(k).map(|v| rfc3339_from_ms_of(v, id)).transpose()
        };
        let number = |k: &str, default: Option<u32>| -> Result<u32, String> {
            match (get(k), default) {
                (None, Some(d)) => Ok(d),
                (v, _) => v
                    .ok_or_else(|| format!("row {id} lacks field {k}"))?
                    .parse()
                    .map_err(|_| format!("row {id} has a non-numeric {k}")),
            }
        };
        let status = Status::parse(need(f::STATUS)?)
            .ok_or_else(|| format!("row {id} has an unknown status"))?;
        // `qs` is the state a script computed for the answer (it needs the tenant's queue);
        // a plain read of the row knows only whether it is scheduled.
        let queue_state = match (status, get("qs"), get(f::QSTATE)) {
            (Status::Queued, Some(qs), _) => QueueState::parse(qs),
            (Status::Queued, None, Some("scheduled")) => Some(QueueState::Scheduled),
            (Status::Queued, None, _) => Some(QueueState::Waiting),
            _ => None,
        };
        let priority = match get(f::PRIORITY) {
            None => super::request::DEFAULT_PRIORITY,
            Some(p) => p
                .parse()
                .map_err(|_| format!("row {id} has a non-numeric priority"))?,
        };
        let params = super::JsonText::parse(need(f::PARAMS)?.to_owned())
            .map_err(|e| format!("row {id} has unreadable params: {e}"))?;
        let output = get(f::OUTPUT)
            .map(serde_json::from_str)
            .transpose()
            .map_err(|e| format!("row {id} has unreadable output: {e}"))?;
        let error = get(f::ERR_KIND).map(|kind| ErrorInfo {
            kind: kind.to_owned(),
            message: get(f::ERR_MSG).unwrap_or_default().to_owned(),
        });
        let created_at =
            time_of(f::CREATED)?.ok_or_else(|| format!("row {id} lacks field {}", f::CREATED))?;
        Ok(Self {
            execution_id: id.to_owned(),
            tenant_id: need(f::TENANT)?.to_owned(),
            flow_id: need(f::FLOW)?.to_owned(),
            version: get(f::VERSION).map(str::to_owned),
            params,
            status,
            queue_position: match queue_state {
                Some(QueueState::Scheduled) | None => None,
                Some(_) => QueuePosition::from_fields(get("qpt"), get("qpk"), get("qkl")),
            },
            estimated_start: None,
            queue_state,
            priority,
            run_at: time_of(f::RUN_AT)?,
            dedup_key: get(f::DEDUP).map(str::to_owned),
            concurrency_key: get(f::CONCURRENCY_KEY).map(str::to_owned),
            traceparent: get(f::TRACEPARENT).map(str::to_owned),
            tracestate: get(f::TRACESTATE).map(str::to_owned),
            deduplicated,
            attempt: number(f::ATTEMPT, Some(0))?,
            max_attempts: number(f::MAX_ATTEMPTS, None)?,
            cancel_requested: get(f::CANCEL) == Some("1"),
            updated_at: time_of(f::UPDATED)?.unwrap_or_else(|| created_at.clone()),
            created_at,
            started_at: time_of(f::STARTED)?,
            finished_at: time_of(f::FINISHED)?,
            output,
            error,
        })
    }
}

fn rfc3339_from_ms_of(ms: &str, id: &str) -> Result<String, String> {
    rfc3339_from_ms(ms).ok_or_else(|| format!("row {id} has a bad timestamp"))
}

/// Renders Unix milliseconds (as Redis scripts record them) as RFC 3339.
pub fn rfc3339_from_ms(ms: &str) -> Option<String> {
    let ms: i128 = ms.parse().ok()?;
    OffsetDateTime::from_unix_timestamp_nanos(ms * 1_000_000)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
}
