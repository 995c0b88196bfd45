//! Redis storage: the only module that knows key names and calls scripts. Every operation is
//! one round trip (one script or one pipeline) and is bounded by the configured timeout, so a
//! Redis that is down or stuck turns into `StoreError::Unavailable` quickly, never a hang.

mod access;
mod conn;
mod freeze_tmp;
pub use freeze_tmp::frozen_key;
mod keys;
mod layout;
mod scripts;
mod stats;
mod worker;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use redis::{ErrorKind, RedisError, ServerErrorKind, Value};

use crate::admission::{
    AdmitRequest, DedupKey, Execution, ExecutionId, FlowId, QueueState, Status, TenantId,
};
pub use access::{ApiKeyRecord, KeyCreation};
pub use conn::{Conn, RedisTarget};
pub use keys::{LAYOUT_VERSION, Shard, ShardMap, WORKER_GROUP};
pub use layout::{Layout, slot_of_tag};
use scripts::Scripts;
pub use worker::{
    Completion, DeadLetter, LeaseState, NotRetryable, Outcome, RetryResult, ShardStats, Started,
    SweepMode, SweepStep, SweepTarget,
};

/// Why a storage call did not produce an answer.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Redis is unreachable, too slow, loading, or failing over: try again later.
    #[error("redis unavailable: {0}")]
    Unavailable(String),
    /// Redis answered something sluice did not write or expect: a bug or foreign data.
    #[error("unexpected data on redis: {0}")]
    Corrupt(String),
    /// An admission was sent but neither its answer nor a settling answer came back: the
    /// execution `execution_id` may exist (now or later). The only error after which
    /// something may have been admitted.
    #[error("admission outcome unknown: {detail}")]
    OutcomeUnknown {
        execution_id: ExecutionId,
        detail: String,
    },
}

impl From<RedisError> for StoreError {
    fn from(e: RedisError) -> Self {
        // Script errors and type errors are sluice's own bugs; everything else (I/O, timeouts,
        // LOADING, cluster redirects that could not be followed, READONLY after a failover)
        // is a Redis that will be back.
        match e.kind() {
            ErrorKind::Server(ServerErrorKind::ResponseError)
            | ErrorKind::Server(ServerErrorKind::CrossSlot)
            | ErrorKind::Server(ServerErrorKind::NoPerm)
            | ErrorKind::UnexpectedReturnType
            | ErrorKind::Parse => StoreError::Corrupt(e.to_string()),
            _ => StoreError::Unavailable(e.to_string()),
        }
    }
}

impl From<redis::ParsingError> for StoreError {
    fn from(e: redis::ParsingError) -> Self {
        StoreError::Corrupt(e.to_string())
    }
}

/// How the store connects and the server-wide defaults its scripts apply.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    pub redis: RedisTarget,
    /// Multiplexed connections to spread requests over (each carries many in flight).
    pub connections: usize,
    /// Upper bound on one storage operation, connection setup included.
    pub op_timeout: Duration,
    /// Shard count to record at first start; an existing record wins.
    pub shards: u16,
    pub default_max_concurrent: u32,
    pub default_max_queued: u32,
    /// How long terminal rows are kept.
    pub retention: Duration,
    /// How long a dedup key keeps mapping to its execution once that is terminal (while it is
    /// queued or running the mapping does not expire).
    pub dedup_ttl: Duration,
    /// Most records a shard's dead-letter stream keeps (older ones are evicted and counted).
    pub dlq_cap: u64,
}

/// How long the marker of an abandoned admission lives: far longer than a call can stay in
/// flight (a Redis stalled for a day has bigger problems).
const VOID_TTL: Duration = Duration::from_secs(86_400);

/// Waiting executions one promotion step handles.
const PROMOTE_STEP: u32 = 1_000;

/// Outcome of an admission.
#[derive(Debug)]
pub enum Admission {
    /// A new execution was written and enqueued.
    Created(Execution),
    /// The dedup key already maps to this execution, admitted with the same request.
    Replayed(Execution),
    /// The dedup key maps to `existing`, admitted with a different flow/version/params.
    Conflict { existing: String },
    /// The tenant is disabled; nothing was written.
    Disabled,
    /// The tenant has no free slot and its waiting set is full; nothing was written.
    QueueFull { waiting: u64 },
}

/// A page of a tenant's executions, newest first.
#[derive(Debug)]
pub struct Page {
    pub executions: Vec<Execution>,
    /// Pass back as `cursor` for the next page; `None` on the last page.
    pub next_cursor: Option<String>,
    /// How many executions match the filter in all.
    pub total: u64,
}

/// Filter and position of a listing.
#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    pub status: Option<Status>,
    pub flow: Option<FlowId>,
    pub cursor: Option<ExecutionId>,
    pub limit: u32,
    /// Bytes of rows (field names and values, as stored) after which the page ends early.
    pub byte_budget: usize,
}

/// What a tenant update does to one of its limits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Change<T> {
    /// Leave the current value as it is.
    #[default]
    Keep,
    /// Drop the tenant's own value: the server default applies.
    Reset,
    /// The tenant's own value from now on.
    Set(T),
}

impl<T> Change<T> {
    /// The same change applied to a converted value.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Change<U> {
        match self {
            Change::Keep => Change::Keep,
            Change::Reset => Change::Reset,
            Change::Set(v) => Change::Set(f(v)),
        }
    }
}

impl<T: ToString> Change<T> {
    /// The script's spelling (see `migrations-lua/set_limits.lua`).
    fn arg(&self) -> String {
        match self {
            Change::Keep => String::new(),
            Change::Reset => "default".into(),
            Change::Set(v) => v.to_string(),
        }
    }
}

/// A change of a tenant's own limits: only the fields it names change.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TenantLimits {
    pub max_concurrent: Change<u32>,
    pub max_queued: Change<u32>,
    pub enabled: Change<bool>,
}

/// A tenant's effective limits and live usage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantState {
    pub max_concurrent: u32,
    pub max_queued: u32,
    pub enabled: bool,
    /// Executions running now.
    pub running: u64,
    /// Executions on the ready stream, holding a slot, not yet started.
    pub dispatched: u64,
    /// Executions over the concurrency limit, in FIFO order.
    pub waiting: u64,
}

/// Commands `tenant_reads` adds per tenant.
const TENANT_READS: usize = 9;

/// Reply of the tenant read pipeline: limits, whether configured, slots, waiting, running,
/// force-deleted still running, and how many status indexes exist.
type TenantReply = (
    Option<u32>,
    Option<u32>,
    Option<u8>,
    bool,
    u64,
    u64,
    u64,
    u64,
    u64,
);

/// Handle to sluice's data on Redis. Cheap to share (`Arc`) between request handlers.
pub struct Store {
    conns: Vec<Conn>,
    next: AtomicUsize,
    scripts: Scripts,
    shards: ShardMap,
    config: StoreConfig,
    policy: Policy,
}

/// The data policy scripts apply (tenant limit defaults, retention, dead-letter cap). `serve`
/// publishes its settings to Redis and workers follow them, so that a slot released by a worker
/// is refilled under the same defaults an admission would use.
struct Policy {
    max_concurrent: AtomicU32,
    max_queued: AtomicU32,
    retention_secs: AtomicU64,
    dedup_ttl_secs: AtomicU64,
    dlq_cap: AtomicU64,
}

impl Store {
    /// Connects, and reads (or records, on first start) the shard count and layout version.
    /// Fails when Redis cannot be reached: a server should not start blind.
    pub async fn connect(config: StoreConfig) -> Result<Self, StoreError> {
        let conns = Conn::open(&config.redis, config.connections, config.op_timeout)
            .await
            .map_err(|e| StoreError::Unavailable(format!("bad redis address: {e}")))?;
        let policy = Policy {
            max_concurrent: AtomicU32::new(config.default_max_concurrent),
            max_queued: AtomicU32::new(config.default_max_queued),
            retention_secs: AtomicU64::new(config.retention.as_secs().max(1)),
            dedup_ttl_secs: AtomicU64::new(config.dedup_ttl.as_secs().max(1)),
            dlq_cap: AtomicU64::new(config.dlq_cap.max(1)),
        };
        let mut store = Self {
            conns,
            next: AtomicUsize::new(0),
            scripts: Scripts::new(),
            shards: ShardMap::new(config.shards),
            config,
            policy,
        };
        store.shards = store.init_meta().await?;
        Ok(store)
    }

    /// The shard map in force (possibly recorded by an earlier start).
    pub fn shards(&self) -> ShardMap {
        self.shards
    }

    async fn init_meta(&self) -> Result<ShardMap, StoreError> {
        let mut c = self.conn();
        let (_, _, shards, layout): (Value, Value, Option<u16>, Option<u32>) = self
            .bounded(
                redis::pipe()
                    .hset_nx(keys::meta(), "shards", self.config.shards)
                    .hset_nx(keys::meta(), "layout", LAYOUT_VERSION)
                    .hget(keys::meta(), "shards")
                    .hget(keys::meta(), "layout")
                    .query_async(&mut c),
            )
            .await?;
        let (Some(shards), Some(layout)) = (shards, layout) else {
            return Err(StoreError::Corrupt(
                "meta record lacks shards/layout".into(),
            ));
        };
        if layout > LAYOUT_VERSION {
            return Err(StoreError::Corrupt(format!(
                "redis holds key layout {layout}, this build knows up to {LAYOUT_VERSION}: upgrade sluice"
            )));
        }
        if shards != self.config.shards {
            tracing::warn!(
                recorded = shards,
                configured = self.config.shards,
                "shard count is fixed at first start; using the recorded value"
            );
        }
        self.load_scripts().await?;
        Ok(ShardMap::new(shards))
    }

    /// Loads every script (also after `SCRIPT FLUSH`); calls fall back on their own anyway.
    pub async fn load_scripts(&self) -> Result<(), StoreError> {
        let mut c = self.conn();
        for s in self.scripts.all() {
            self.bounded(s.load_async(&mut c)).await?;
        }
        Ok(())
    }

    /// Readiness: Redis answers and every script is in its cache (reloaded if it was flushed).
    pub async fn ready(&self) -> Result<(), StoreError> {
        let mut c = self.conn();
        let hashes: Vec<&str> = self.scripts.all().iter().map(|s| s.get_hash()).collect();
        let loaded: Vec<bool> = self
            .bounded(
                redis::cmd("SCRIPT")
                    .arg("EXISTS")
                    .arg(&hashes)
                    .query_async(&mut c),
            )
            .await?;
        if loaded.iter().all(|l| *l) {
            Ok(())
        } else {
            self.load_scripts().await
        }
    }

    /// Admits one execution in one atomic script (see `migrations-lua/admit.lua`).
    ///
    /// The id is minted here, before the call. If the call's answer is lost (time-out, broken
    /// connection: the script may have run, or may still run when a stalled Redis resumes),
    /// `abandon.lua` settles it: the admission either happened (answered as created) or can no
    /// longer happen (`Unavailable`, nothing admitted). Only when that answer is lost too is
    /// the result `OutcomeUnknown`, naming the id.
    pub async fn admit(
        &self,
        tenant: &TenantId,
        req: &AdmitRequest,
    ) -> Result<Admission, StoreError> {
        let shard = self.shards.shard_of(tenant);
        let id = ExecutionId::new();
        let digest = req.dedup.as_ref().map(DedupKey::digest).unwrap_or_default();
        let mut inv = self.scripts.admit.key(shard.row(&id));
        self.common_args(&mut inv, shard);
        inv.arg(tenant.as_str())
            .arg(id.as_str())
            .arg(req.flow.as_str())
            .arg(req.version.as_ref().map(|v| v.as_str()).unwrap_or(""))
            .arg(&req.params)
            .arg(req.max_attempts)
            .arg(req.dedup.as_ref().map(|d| d.as_str()).unwrap_or(""))
            .arg(&digest)
            .arg(req.fingerprint.as_str());
        let mut c = self.conn();
        let sent = match self.bounded_raw(inv.invoke_async(&mut c)).await {
            // Refused at connect, or refused by Redis before running (a redirect, a frozen
            // shard, a cluster settling): nothing was admitted.
            Ok(Err(e)) if conn::did_not_run(&e) => return Err(e.into()),
            Ok(r) => r.map_err(StoreError::from),
            Err(timeout) => Err(timeout),
        };
        let reply: Vec<Value> = match sent {
            Ok(reply) => reply,
            // Sent, answer lost: it may have run, or may still run.
            Err(StoreError::Unavailable(lost)) => return self.abandon(tenant, &id, &lost).await,
            Err(e) => return Err(e),
        };
        let (tag, rest) = split_tag(reply)?;
        match tag.as_str() {
            "new" => {
                let (qstate, now) = (string_at(&rest, 0)?, string_at(&rest, 1)?);
                let qstate = match qstate.as_str() {
                    "waiting" => QueueState::Waiting,
                    _ => QueueState::Dispatched,
                };
                Execution::admitted(id.as_str(), tenant.as_str(), req, qstate, &now)
                    .map(Admission::Created)
                    .map_err(StoreError::Corrupt)
            }
            "dup" => Ok(Admission::Replayed(execution_from(rest, true)?)),
            "conflict" => Ok(Admission::Conflict {
                existing: string_at(&rest, 0)?,
            }),
            "disabled" => Ok(Admission::Disabled),
            "full" => Ok(Admission::QueueFull {
                waiting: redis::from_redis_value(first(&rest)?.clone())?,
            }),
            other => Err(StoreError::Corrupt(format!("admit replied {other}"))),
        }
    }

    /// Settles an admission whose answer was lost (see `migrations-lua/abandon.lua`).
    async fn abandon(
        &self,
        tenant: &TenantId,
        id: &ExecutionId,
        lost: &str,
    ) -> Result<Admission, StoreError> {
        tracing::warn!(%id, error = %lost, "admission answer lost; settling it");
        let shard = self.shards.shard_of(tenant);
        let mut inv = self.scripts.abandon.key(shard.row(id));
        self.common_args(&mut inv, shard);
        inv.arg(tenant.as_str())
            .arg(id.as_str())
            .arg(VOID_TTL.as_secs());
        let mut c = self.conn();
        let reply: Vec<Value> = match self.bounded(inv.invoke_async(&mut c)).await {
            Ok(reply) => reply,
            Err(e) => {
                return Err(StoreError::OutcomeUnknown {
                    execution_id: id.clone(),
                    detail: format!("{lost}; then, settling it: {e}"),
                });
            }
        };
        let (tag, rest) = split_tag(reply)?;
        match tag.as_str() {
            "admitted" => {
                let fields: HashMap<String, String> =
                    redis::from_redis_value(first(&rest)?.clone())?;
                Execution::from_row(id.as_str(), fields, false)
                    .map(Admission::Created)
                    .map_err(StoreError::Corrupt)
            }
            "void" => Err(StoreError::Unavailable(format!(
                "{lost} (nothing was admitted)"
            ))),
            other => Err(StoreError::Corrupt(format!("abandon replied {other}"))),
        }
    }

    /// One execution of a tenant; `None` when missing or another tenant's.
    pub async fn get(
        &self,
        tenant: &TenantId,
        id: &ExecutionId,
    ) -> Result<Option<Execution>, StoreError> {
        let shard = self.shards.shard_of(tenant);
        let mut c = self.conn();
        let fields: HashMap<String, String> = self
            .bounded(redis::cmd("HGETALL").arg(shard.row(id)).query_async(&mut c))
            .await?;
        // A force-deleted row still running is kept only to hold its slot: gone for readers.
        if fields.get("tenant").map(String::as_str) != Some(tenant.as_str())
            || fields.contains_key("deleted")
        {
            return Ok(None);
        }
        Execution::from_row(id.as_str(), fields, false)
            .map(Some)
            .map_err(StoreError::Corrupt)
    }

    /// Cancels an execution (see `migrations-lua/cancel.lua`); `None` when not found.
    pub async fn cancel(
        &self,
        tenant: &TenantId,
        id: &ExecutionId,
    ) -> Result<Option<Execution>, StoreError> {
        let shard = self.shards.shard_of(tenant);
        let mut inv = self.scripts.cancel.key(shard.row(id));
        self.common_args(&mut inv, shard);
        inv.arg(tenant.as_str()).arg(id.as_str());
        let mut c = self.conn();
        let reply: Vec<Value> = self.bounded(inv.invoke_async(&mut c)).await?;
        let (tag, rest) = split_tag(reply)?;
        match tag.as_str() {
            "ok" => Ok(Some(execution_from(rest, false)?)),
            "not_found" => Ok(None),
            other => Err(StoreError::Corrupt(format!("cancel replied {other}"))),
        }
    }

    /// Terminalizes and deletes an execution now, releasing its dedup key, and its slot
    /// once no handler runs it (see `migrations-lua/force_delete.lua`). Returns whether it
    /// existed.
    pub async fn force_delete(
        &self,
        tenant: &TenantId,
        id: &ExecutionId,
    ) -> Result<bool, StoreError> {
        let shard = self.shards.shard_of(tenant);
        let mut inv = self.scripts.force_delete.key(shard.row(id));
        self.common_args(&mut inv, shard);
        inv.arg(tenant.as_str()).arg(id.as_str());
        let mut c = self.conn();
        let reply: Vec<Value> = self.bounded(inv.invoke_async(&mut c)).await?;
        let (tag, _) = split_tag(reply)?;
        Ok(tag == "deleted")
    }

    /// One page of a tenant's executions (see `migrations-lua/list.lua`).
    pub async fn list(&self, tenant: &TenantId, q: &ListQuery) -> Result<Page, StoreError> {
        let shard = self.shards.shard_of(tenant);
        let mut inv = self
            .scripts
            .list
            .key(shard.status_index(tenant, Status::Queued));
        self.common_args(&mut inv, shard);
        inv.arg(tenant.as_str())
            .arg(q.status.map(Status::as_str).unwrap_or(""))
            .arg(q.flow.as_ref().map(FlowId::as_str).unwrap_or(""))
            .arg(q.cursor.as_ref().map(ExecutionId::as_str).unwrap_or(""))
            .arg(q.limit)
            .arg(q.byte_budget.max(1));
        let mut c = self.conn();
        let reply: Vec<Value> = self.bounded(inv.invoke_async(&mut c)).await?;
        let mut it = reply.into_iter();
        let (Some(cursor), Some(total)) = (it.next(), it.next()) else {
            return Err(StoreError::Corrupt("list reply too short".into()));
        };
        let cursor: String = redis::from_redis_value(cursor)?;
        let total: u64 = redis::from_redis_value(total)?;
        let mut executions = Vec::with_capacity(it.len() / 2);
        while let (Some(id), Some(row)) = (it.next(), it.next()) {
            executions.push(row_to_execution(id, row, false)?);
        }
        Ok(Page {
            executions,
            next_cursor: (!cursor.is_empty()).then_some(cursor),
            total,
        })
    }

    /// Changes the limits `limits` names (the others stay) and dispatches every waiting
    /// execution that now fits, oldest first (see `migrations-lua/set_limits.lua`).
    pub async fn put_tenant(
        &self,
        tenant: &TenantId,
        limits: &TenantLimits,
    ) -> Result<TenantState, StoreError> {
        let shard = self.shards.shard_of(tenant);
        let mut inv = self.scripts.set_limits.key(shard.tenant_config(tenant));
        self.common_args(&mut inv, shard);
        inv.arg(tenant.as_str())
            .arg(limits.max_concurrent.arg())
            .arg(limits.max_queued.arg())
            .arg(limits.enabled.map(u8::from).arg())
            .arg(PROMOTE_STEP);
        let mut c = self.conn();
        let more: u8 = self.bounded(inv.invoke_async(&mut c)).await?;
        if more == 1 {
            self.promote_all(tenant).await?;
        }
        self.get_tenant(tenant)
            .await?
            .ok_or_else(|| StoreError::Corrupt("tenant vanished after write".into()))
    }

    /// Dispatches every waiting execution of `tenant` that fits its limits now, in short
    /// steps (see `migrations-lua/promote.lua`). An interrupted run leaves a consistent state:
    /// the rest are dispatched by the next admission, release or sweep of the tenant.
    pub async fn promote_all(&self, tenant: &TenantId) -> Result<(), StoreError> {
        let shard = self.shards.shard_of(tenant);
        let mut c = self.conn();
        // Bounded: each step handles PROMOTE_STEP members, and a tenant has at most
        // max_queued waiting (100k by default) — far fewer steps than this.
        for _ in 0..100_000 {
            let mut inv = self.scripts.promote.key(shard.tenant_config(tenant));
            self.common_args(&mut inv, shard);
            inv.arg(tenant.as_str()).arg(PROMOTE_STEP);
            let more: u8 = self.bounded(inv.invoke_async(&mut c)).await?;
            if more == 0 {
                return Ok(());
            }
        }
        Ok(())
    }

    /// A tenant's effective limits and usage; `None` for a tenant never configured and without
    /// executions.
    pub async fn get_tenant(&self, tenant: &TenantId) -> Result<Option<TenantState>, StoreError> {
        let mut p = redis::pipe();
        self.tenant_reads(&mut p, tenant);
        let mut c = self.conn();
        let reply: TenantReply = self.bounded(p.query_async(&mut c)).await?;
        Ok(self.tenant_state(reply))
    }

    /// Several tenants' limits and usage (as `get_tenant`), in one pipelined round trip.
    pub async fn get_tenants(
        &self,
        tenants: &[TenantId],
    ) -> Result<Vec<Option<TenantState>>, StoreError> {
        if tenants.is_empty() {
            return Ok(Vec::new());
        }
        let mut p = redis::pipe();
        for t in tenants {
            self.tenant_reads(&mut p, t);
        }
        let mut c = self.conn();
        let replies: Vec<Value> = self.bounded(p.query_async(&mut c)).await?;
        if replies.len() != tenants.len() * TENANT_READS {
            return Err(StoreError::Corrupt("short tenant reply".into()));
        }
        let mut out = Vec::with_capacity(tenants.len());
        let mut replies = replies.into_iter();
        for _ in tenants {
            let one: Vec<Value> = replies.by_ref().take(TENANT_READS).collect();
            let reply: TenantReply = redis::from_redis_value(Value::Array(one))?;
            out.push(self.tenant_state(reply));
        }
        Ok(out)
    }

    /// Adds the reads of one tenant's limits and usage to `p` (`TENANT_READS` commands).
    fn tenant_reads(&self, p: &mut redis::Pipeline, tenant: &TenantId) {
        let shard = self.shards.shard_of(tenant);
        p.hget(shard.tenant_config(tenant), "max_concurrent")
            .hget(shard.tenant_config(tenant), "max_queued")
            .hget(shard.tenant_config(tenant), "enabled")
            .exists(shard.tenant_config(tenant))
            .scard(shard.slots(tenant))
            .zcard(shard.waiting(tenant))
            .zcard(shard.status_index(tenant, Status::Running))
            .scard(shard.deleting(tenant));
        let indexes: Vec<String> = Status::ALL
            .into_iter()
            .map(|s| shard.status_index(tenant, s))
            .collect();
        p.exists(indexes);
    }

    /// The state the reads of `tenant_reads` describe.
    fn tenant_state(&self, reply: TenantReply) -> Option<TenantState> {
        let (max_c, max_q, enabled, configured, slots, waiting, running, deleting, indexes) = reply;
        let running = running + deleting;
        if !configured && indexes == 0 {
            return None;
        }
        Some(TenantState {
            max_concurrent: max_c.unwrap_or(self.policy.max_concurrent.load(Ordering::Relaxed)),
            max_queued: max_q.unwrap_or(self.policy.max_queued.load(Ordering::Relaxed)),
            enabled: enabled != Some(0),
            running,
            dispatched: slots.saturating_sub(running),
            waiting,
        })
    }

    fn common_args(&self, inv: &mut redis::ScriptInvocation<'_>, shard: Shard) {
        inv.arg(shard.prefix())
            .arg(self.policy.max_concurrent.load(Ordering::Relaxed))
            .arg(self.policy.max_queued.load(Ordering::Relaxed))
            .arg(self.policy.retention_secs.load(Ordering::Relaxed))
            .arg(self.policy.dedup_ttl_secs.load(Ordering::Relaxed));
    }

    fn dlq_cap(&self) -> u64 {
        self.policy.dlq_cap.load(Ordering::Relaxed)
    }

    /// Records this process's data policy on Redis for workers to follow (`serve` does this).
    pub async fn publish_defaults(&self) -> Result<(), StoreError> {
        let mut c = self.conn();
        let p = &self.policy;
        let () = self
            .bounded(
                redis::cmd("HSET")
                    .arg(keys::meta())
                    .arg("default_max_concurrent")
                    .arg(p.max_concurrent.load(Ordering::Relaxed))
                    .arg("default_max_queued")
                    .arg(p.max_queued.load(Ordering::Relaxed))
                    .arg("retention_secs")
                    .arg(p.retention_secs.load(Ordering::Relaxed))
                    .arg("dedup_ttl_secs")
                    .arg(p.dedup_ttl_secs.load(Ordering::Relaxed))
                    .arg("dlq_cap")
                    .arg(p.dlq_cap.load(Ordering::Relaxed))
                    .query_async(&mut c),
            )
            .await?;
        Ok(())
    }

    /// Adopts the data policy `serve` published, where it did (workers call this).
    pub async fn refresh_defaults(&self) -> Result<(), StoreError> {
        let mut c = self.conn();
        type Published = (
            Option<u32>,
            Option<u32>,
            Option<u64>,
            Option<u64>,
            Option<u64>,
        );
        let (mc, mq, ret, dedup, cap): Published = self
            .bounded(
                redis::cmd("HMGET")
                    .arg(keys::meta())
                    .arg("default_max_concurrent")
                    .arg("default_max_queued")
                    .arg("retention_secs")
                    .arg("dedup_ttl_secs")
                    .arg("dlq_cap")
                    .query_async(&mut c),
            )
            .await?;
        let p = &self.policy;
        if let Some(v) = mc {
            p.max_concurrent.store(v, Ordering::Relaxed);
        }
        if let Some(v) = mq {
            p.max_queued.store(v, Ordering::Relaxed);
        }
        if let Some(v) = ret {
            p.retention_secs.store(v.max(1), Ordering::Relaxed);
        }
        if let Some(v) = dedup {
            p.dedup_ttl_secs.store(v.max(1), Ordering::Relaxed);
        }
        if let Some(v) = cap {
            p.dlq_cap.store(v.max(1), Ordering::Relaxed);
        }
        Ok(())
    }

    /// A connection for one operation: round robin over the multiplexed connections.
    fn conn(&self) -> Conn {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.conns.len();
        self.conns[i].clone()
    }

    /// Like `bounded`, but hands Redis's own error to the caller (a time-out is still ours).
    async fn bounded_raw<T>(
        &self,
        op: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<redis::RedisResult<T>, StoreError> {
        tokio::time::timeout(self.config.op_timeout, op)
            .await
            .map_err(|_| {
                StoreError::Unavailable(format!("no answer within {:?}", self.config.op_timeout))
            })
    }

    /// Runs one Redis operation under the configured time bound.
    async fn bounded<T>(
        &self,
        op: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.config.op_timeout, op).await {
            Ok(r) => r.map_err(StoreError::from),
            Err(_) => Err(StoreError::Unavailable(format!(
                "no answer within {:?}",
                self.config.op_timeout
            ))),
        }
    }
}

fn split_tag(reply: Vec<Value>) -> Result<(String, Vec<Value>), StoreError> {
    let mut it = reply.into_iter();
    let tag = it
        .next()
        .ok_or_else(|| StoreError::Corrupt("empty script reply".into()))?;
    Ok((redis::from_redis_value(tag)?, it.collect()))
}

fn first(rest: &[Value]) -> Result<&Value, StoreError> {
    rest.first()
        .ok_or_else(|| StoreError::Corrupt("script reply too short".into()))
}

fn string_at(rest: &[Value], i: usize) -> Result<String, StoreError> {
    let v = rest
        .get(i)
        .ok_or_else(|| StoreError::Corrupt("script reply too short".into()))?;
    Ok(redis::from_redis_value(v.clone())?)
}

/// Reads `id, row` from a script reply's remainder.
fn execution_from(rest: Vec<Value>, deduplicated: bool) -> Result<Execution, StoreError> {
    let mut it = rest.into_iter();
    let (Some(id), Some(row)) = (it.next(), it.next()) else {
        return Err(StoreError::Corrupt("script reply lacks the row".into()));
    };
    row_to_execution(id, row, deduplicated)
}

fn row_to_execution(id: Value, row: Value, deduplicated: bool) -> Result<Execution, StoreError> {
    let id: String = redis::from_redis_value(id)?;
    let fields: HashMap<String, String> = redis::from_redis_value(row)?;
    Execution::from_row(&id, fields, deduplicated).map_err(StoreError::Corrupt)
}
