//! Redis storage: the only module that knows key names and calls scripts. Every state change
//! of an execution (admit, cancel, force delete, start, heartbeat, complete, reclaim, retry,
//! a sweep step) is one script on one hash slot, so it is atomic. A few operations are a short
//! sequence of such calls instead: `put_tenant` (the limits, then promotion steps, then a
//! read), `delete_tenant` (the mark in its shard, then the registry script; `reap_tenant`
//! then removes what it held in bounded steps), `list_api_keys` (the key set, then one
//! pipeline of the records), `dead_letters` (bounded pages of each shard's stream),
//! `pin_tenant`, and the reads that span shards (statistics,
//! tenant usage, sweep targets: one pipeline per shard, all at once). Each is written so that
//! an interruption between its calls leaves a consistent state. Every single Redis call is
//! bounded by the configured timeout, so a Redis that is down or stuck turns into
//! `StoreError::Unavailable` quickly, never a hang.
//!
//! One file per operation family, each beside the script it calls: `admit` (admission and
//! the settling of a lost answer; `commit` groups a shard's admissions into one call;
//! `dry_admit` asks what one would do), `cancel` (cancel, force delete), `lease` (the worker's
//! side: start, adopt, heartbeat, complete, reclaim), `dead_letters` (retry, dead-letter
//! listing), `sweep` (the sweeper's turn and repairs), `tenants` (limits and usage), `storage`
//! (the logical bytes and retained rows a tenant keeps, and their bounds' refusals), `access`
//! (API keys, tenant registry), `reap` (deleting a tenant and reaping what it held), `list`
//! (reading executions), `stats` (queue statistics),
//! `freeze` (the markers that stop a shard's scripts during a slot move), `wake` (the blocking
//! doorbell connections and stop messages that wake workers), `watch` (the start of a wait on
//! an execution, and the Pub/Sub connection its changes are announced on), `trends` (the
//! per-minute counters the scripts keep, and the tenants with work now). `row` decodes rows and
//! script replies, `keys` names every key, `scripts` composes the Lua, `call` types each
//! script's keys and arguments, `schema` checks (and migrates) what an older build left at
//! connect, `conn` (with `replica_acks`) is the connection. This file holds what they share:
//! the connection pool, the error type, the time bound, the data policy.

mod access;
mod admit;
mod bells;
mod call;
mod cancel;
mod commit;
mod compose;
mod conn;
mod dead_letters;
mod dry_admit;
mod forecast;
mod freeze;
mod function;
mod key_limits;
pub mod keys;
mod layout;
mod lease;
mod libraries;
mod list;
mod pin;
mod reap;
mod relayout;
mod replica_acks;
mod row;
mod schema;
mod scripts;
mod stats;
mod storage;
mod sweep;
mod tenants;
mod ticket;
pub mod trends;
mod wake;
mod watch;
mod webhooks;

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use redis::{ErrorKind, RedisError, ServerErrorKind};

use crate::domain::ExecutionId;

pub use access::{ApiKeyRecord, KeyCreation};
pub use admit::Admission;
pub use bells::{BellNode, BellPools};
use call::Call;
pub use cancel::Reschedule;
pub use commit::{BATCH_CALL_ITEMS, GroupCommitCounts};
pub use conn::{Conn, RedisTarget};
pub use dead_letters::{DeadLetter, DeadLetterPage, Reindexed, Retry};
pub use dry_admit::{Decision, DryRun};
pub use forecast::{Pace, estimate};
use function::{Function, Invocation};
pub use key_limits::{KeyLimitChange, KeyState};
pub use keys::{Shard, ShardMap, WORKER_GROUP};
pub use layout::{Layout, slot_of_tag};
pub use lease::{Completion, LeaseState, Outcome, Reclaimed, StartBatch, Started};
use libraries::lists_library;
pub use libraries::{ANNOUNCE_EVERY, LIBRARY_GRACE};
pub use list::{ListQuery, Page};
pub use pin::{Pin, Unpin};
pub use reap::{Deletion, REAP_BATCH, REAP_INLINE_CALLS, Reaped};
#[doc(hidden)]
pub use schema::{Migration, SCHEMA};
use scripts::{Scripts, ShardScript, TagScript};
pub use scripts::{composed_source, operation};
pub use stats::{ShardReport, ShardStats};
pub use storage::{ROW_BYTES, StorageBound, StorageFull, TenantStorage};
pub use sweep::{SweepMode, SweepStep, SweepTarget};
pub use tenants::{Change, MAX_KEY_OVERRIDES, MAX_WEIGHT, RateLimit, TenantLimits, TenantState};
pub use ticket::{CloseOnDrop, Ticket, Withdrawal};
pub use trends::{Minute, PlatformTrends, TenantWork, Trends};
pub use wake::{BellConn, StopListener};
pub use watch::{Announcement, Events};
pub use webhooks::{
    DELIVERY_LOG_CAP, DeliveryRecord, OutboxEntry, Webhook, WebhookSet, WebhookState,
};

/// Why a storage call did not produce an answer.
#[derive(Debug, Clone, thiserror::Error)]
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
    /// An admission that was never sent to Redis (its request's time ran out while it waited
    /// for its call, or an earlier call of its batch went unanswered): nothing of it was
    /// admitted, and sending it again is safe.
    #[error("{0}")]
    NotSent(String),
}

impl From<RedisError> for StoreError {
    fn from(e: RedisError) -> Self {
        // Script errors and type errors are sluice's own bugs; everything else (I/O, timeouts,
        // LOADING, cluster redirects that could not be followed, READONLY after a failover, a
        // frozen shard's TRYAGAIN, OOM) is a Redis that will be back.
        match e.kind() {
            ErrorKind::Server(ServerErrorKind::ResponseError)
            | ErrorKind::Server(ServerErrorKind::CrossSlot)
            | ErrorKind::Server(ServerErrorKind::NoPerm)
            | ErrorKind::UnexpectedReturnType
            | ErrorKind::Parse => StoreError::Corrupt(compose::locate(&e.to_string())),
            // A key of another type than sluice writes: the same whether a script's `pcall`
            // caught it (admit.lua's per-admission errors) or not.
            _ if is_wrong_type(&e) => StoreError::Corrupt(compose::locate(&e.to_string())),
            _ => StoreError::Unavailable(e.to_string()),
        }
    }
}

/// Whether `e`, the error of a call that was sent, leaves open whether the call ran: only an
/// I/O error or a time-out (no answer came back). An error *reply* (TRYAGAIN from a frozen
/// shard, MOVED/ASK that could not be followed, CLUSTERDOWN, READONLY, LOADING, MASTERDOWN,
/// OOM, a script error) is Redis saying the call did not run, or failed before it wrote.
/// Whether Redis answered WRONGTYPE, to one command or to one of a pipeline's.
fn is_wrong_type(e: &RedisError) -> bool {
    const CODE: &str = "WRONGTYPE";
    e.code() == Some(CODE)
        || e.clone()
            .into_server_errors()
            .is_some_and(|errors| errors.iter().any(|(_, s)| s.code() == CODE))
}

fn is_lost(e: &RedisError) -> bool {
    e.is_io_error() || e.is_timeout() || e.is_connection_dropped()
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
    /// Most admissions one call to a shard carries (group commit, see `commit`; 1..=100).
    pub admission_group: usize,
    /// Upper bound on one storage operation, connection setup included.
    pub op_timeout: Duration,
    /// Replicas that must acknowledge a script's writes before its answer is returned
    /// (`--redis-replica-acks`; 0 = asynchronous replication).
    pub replica_acks: u32,
    /// Shard count to record at first start; an existing record wins.
    pub shards: u16,
    /// Dedicated shards (for pinned tenants) to record at first start; a record wins.
    pub dedicated_shards: u16,
    /// The key layout to record at first start, `None` for `Layout::CURRENT`; a record wins.
    /// Only tests and the benchmark set it (to `Layout::Binary`) until layout 5 is `CURRENT`.
    pub initial_layout: Option<Layout>,
    pub default_max_concurrent: u32,
    pub default_max_queued: u32,
    /// Logical bytes a tenant without its own `max_bytes` may keep (see `storage`).
    pub default_max_bytes: u64,
    /// Terminal rows a tenant without its own `max_retained` may keep (see `storage`).
    pub default_max_retained: u64,
    /// How long terminal rows are kept.
    pub retention: Duration,
    /// How long a dedup key keeps mapping to its execution once that is terminal (while it is
    /// queued or running the mapping does not expire).
    pub dedup_ttl: Duration,
    /// Most records a shard's dead-letter stream keeps in all: when it is hit, the tenant
    /// holding the most loses its oldest (evictions are counted).
    pub dlq_cap: u64,
    /// Most dead-letter records one tenant keeps in its shard (its own oldest go first; never
    /// more than `dlq_cap`).
    pub dlq_tenant_cap: u64,
    /// Whether starts are appended to their shard's start log (`--start-log`; `K.starts()` in
    /// `migrations-lua/common.lua`): only tests, the fault suite and the fairness benchmark
    /// read it, so production does not pay its stream write per start.
    pub start_log: bool,
}

/// Handle to sluice's data on Redis. Cheap to share (`Arc`) between request handlers.
pub struct Store {
    conns: Vec<Conn>,
    /// The next connection to use, round robin (shared with `commits`: a call that settles a
    /// lost admission goes on another connection than the lost call).
    next: std::sync::Arc<AtomicUsize>,
    scripts: Scripts,
    shards: ShardMap,
    /// Tenants pinned to a dedicated shard (see `pin`): tenant id → shard number.
    pins: std::sync::RwLock<std::collections::HashMap<String, u16>>,
    config: StoreConfig,
    policy: std::sync::Arc<Policy>,
    /// Admissions waiting for their shard's next call (see `commit`).
    commits: std::sync::Arc<commit::GroupCommit>,
    /// Reports of ended runs waiting for their shard's next call (see `commit`).
    completions: std::sync::Arc<commit::GroupCommit>,
    /// Tenants' start rates, read lately (the forecast's input, see `forecast`).
    paces: forecast::PaceCache,
    /// When this store was made: the clock of `announced`.
    clock: std::time::Instant,
    /// When this process last said its build's library is in use (ms after `clock`, 0:
    /// never; see `libraries.rs`).
    announced: AtomicU64,
}

/// The data policy scripts apply (tenant limit defaults, retention, dead-letter cap). `serve`
/// publishes its settings to Redis and workers follow them, so that a slot released by a worker
/// is refilled under the same defaults an admission would use.
struct Policy {
    max_concurrent: AtomicU32,
    max_queued: AtomicU32,
    /// The storage bounds of tenants without their own: arguments of the scripts that decide
    /// an admission (`admit.lua`, `retry.lua`, `dry_admit.lua`), not of every script.
    max_bytes: AtomicU64,
    max_retained: AtomicU64,
    retention_secs: AtomicU64,
    dedup_ttl_secs: AtomicU64,
    dlq_cap: AtomicU64,
    dlq_tenant_cap: AtomicU64,
    /// `StoreConfig::start_log`, as `serve` published it (see `refresh_defaults`).
    start_log: std::sync::atomic::AtomicBool,
}

/// A shard script's invocation: the shard's freeze marker, the call's keys, the shard prefix
/// and `policy`, the call's values. `Store::shard_call` and group commit (which holds its
/// script apart from the store) both build calls with it.
fn shard_invocation<'s, C: Call>(
    script: &'s Function,
    shard: Shard,
    policy: &Policy,
    call: &C,
) -> Invocation<'s> {
    let mut inv = script.key(shard.frozen());
    call.keys(&mut inv);
    policy.common_args(&mut inv, shard);
    call.args(&mut inv);
    inv
}

/// The name of this build's Lua library (`sluice_<12 hex>`): its functions' names start with
/// it, and the libraries of other builds have other names.
pub fn library_name() -> &'static str {
    &scripts::library().name
}

/// Loads this build's Lua library on the node `conn` reaches (`FUNCTION LOAD REPLACE`):
/// for a master that is about to be given a slot (`reshard.rs`). On a cluster connection it
/// reaches every master.
pub async fn load_library<C: redis::aio::ConnectionLike>(conn: &mut C) -> redis::RedisResult<()> {
    function::load(conn, &scripts::library().source).await
}

/// The policy in one master's answer to `CONFIG GET maxmemory-policy` (a name/value pair as an
/// array, or a map under RESP3); `None` for an error answer or another shape.
fn eviction_policy(answer: &redis::Value) -> Option<String> {
    let pairs: std::collections::HashMap<String, String> =
        redis::from_redis_value(answer.clone()).ok()?;
    pairs.get("maxmemory-policy").cloned()
}

impl Policy {
    /// ARGV[1..5] of a shard script (see `migrations-lua/common.lua`): the shard's prefix and
    /// this policy.
    fn common_args(&self, inv: &mut Invocation<'_>, shard: Shard) {
        self.common_args_of_prefix(inv, &shard.prefix());
    }

    /// [`Policy::common_args`] with the shard's prefix given (the group commit remembers it
    /// per shard rather than formatting it per call).
    fn common_args_of_prefix(&self, inv: &mut Invocation<'_>, prefix: &str) {
        inv.arg(prefix)
            .arg(self.max_concurrent.load(Ordering::Relaxed))
            .arg(self.max_queued.load(Ordering::Relaxed))
            .arg(self.retention_secs.load(Ordering::Relaxed))
            .arg(self.dedup_ttl_secs.load(Ordering::Relaxed));
    }
}

impl Store {
    /// Connects, and reads (or records, on first start) the shard count and layout version.
    /// Fails when Redis cannot be reached: a server should not start blind.
    ///
    /// A Redis on an older key layout is refused (the error names `sluice migrate-layout`),
    /// unless a move to this build's layout is under way: then the store uses the new
    /// layout's names, and shards not converted yet refuse with 503 (their hold marker).
    pub async fn connect(config: StoreConfig) -> Result<Self, StoreError> {
        Self::open(config, false).await
    }

    /// A store on whatever layout the meta record names, for `sluice migrate-layout`: the
    /// shard map is the recorded (old) one and no data schema migration runs (it reads rows
    /// by this build's names, which an old layout's rows do not have yet).
    pub async fn connect_for_migration(config: StoreConfig) -> Result<Self, StoreError> {
        Self::open(config, true).await
    }

    async fn open(config: StoreConfig, migrating: bool) -> Result<Self, StoreError> {
        let conns = Conn::open(
            &config.redis,
            config.connections,
            config.op_timeout,
            config.replica_acks,
        )
        .await
        .map_err(|e| StoreError::Unavailable(format!("bad redis address: {e}")))?;
        let policy = Policy {
            max_concurrent: AtomicU32::new(config.default_max_concurrent),
            max_queued: AtomicU32::new(config.default_max_queued),
            max_bytes: AtomicU64::new(config.default_max_bytes),
            max_retained: AtomicU64::new(config.default_max_retained),
            retention_secs: AtomicU64::new(config.retention.as_secs().max(1)),
            dedup_ttl_secs: AtomicU64::new(config.dedup_ttl.as_secs().max(1)),
            dlq_cap: AtomicU64::new(config.dlq_cap.max(1)),
            dlq_tenant_cap: AtomicU64::new(config.dlq_tenant_cap.max(1)),
            start_log: std::sync::atomic::AtomicBool::new(config.start_log),
        };
        let policy = std::sync::Arc::new(policy);
        let scripts = Scripts::new();
        let next = std::sync::Arc::new(AtomicUsize::new(0));
        let commits = std::sync::Arc::new(commit::GroupCommit::new(
            commit::Batched::Admit,
            conns.clone(),
            next.clone(),
            <commit::AdmitCall as ShardScript>::script(&scripts).clone(),
            policy.clone(),
            config.op_timeout,
            config.admission_group.clamp(1, 100),
        ));
        let completions = std::sync::Arc::new(commit::GroupCommit::new(
            commit::Batched::Complete,
            conns.clone(),
            next.clone(),
            <commit::CompleteCall as ShardScript>::script(&scripts).clone(),
            policy.clone(),
            config.op_timeout,
            commit::COMPLETION_GROUP,
        ));
        let mut store = Self {
            conns,
            next,
            scripts,
            shards: ShardMap::new(config.shards, Layout::CURRENT),
            pins: Default::default(),
            config,
            policy,
            commits,
            completions,
            paces: Default::default(),
            clock: std::time::Instant::now(),
            announced: AtomicU64::new(0),
        };
        let (shards, fresh) = store.init_meta(migrating).await?;
        store.shards = shards;
        store.refresh_pins().await?;
        if !migrating {
            store.ensure_schema(fresh).await?;
            store.check_eviction_policy().await;
        }
        Ok(store)
    }

    /// Warns, at start, of every master whose `maxmemory-policy` lets Redis drop keys to make
    /// room. sluice needs `noeviction`: over `maxmemory` such a Redis then refuses what adds
    /// data (admissions answer 503, see docs/operations.md) and keeps what it holds, where an
    /// evicting one silently drops a row, a queue member or a dedup mapping (an execution
    /// lost, or admitted twice) and leaves the facts derived from them wrong (a tenant's byte
    /// counters, the registries its `reg_flow` vouches for). A warning, not a refusal, as
    /// peers do: Redis evicts only when full, and a Redis that does not answer `CONFIG`
    /// (some managed services) cannot be checked, which is said at `info`.
    async fn check_eviction_policy(&self) {
        let mut c = self.conn();
        let mut get = redis::cmd("CONFIG");
        get.arg("GET").arg("maxmemory-policy");
        let answers = match self.bounded(c.on_every_master(&get)).await {
            Ok(answers) => answers,
            Err(e) => {
                tracing::info!(error = %e, "could not read Redis's maxmemory-policy");
                return;
            }
        };
        let masters = answers.len();
        let mut evicting: Vec<String> = answers
            .iter()
            .filter_map(eviction_policy)
            .filter(|p| p != "noeviction")
            .collect();
        evicting.sort();
        evicting.dedup();
        if !evicting.is_empty() {
            tracing::warn!(
                policy = %evicting.join(","),
                masters,
                "Redis's maxmemory-policy is {} where sluice needs noeviction: a full Redis \
                 would drop executions instead of refusing new ones (CONFIG SET \
                 maxmemory-policy noeviction, and in redis.conf)",
                evicting.join(",")
            );
        }
    }

    /// How this store was configured (where Redis is, its time bounds).
    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    /// The shard map in force (possibly recorded by an earlier start).
    pub fn shards(&self) -> ShardMap {
        self.shards
    }

    /// Loads this build's library on every master (also after `FUNCTION FLUSH`); a call that
    /// finds it missing loads it on its own anyway (`function.rs`).
    pub async fn load_scripts(&self) -> Result<(), StoreError> {
        let mut c = self.conn();
        self.bounded(function::load(&mut c, &scripts::library().source))
            .await
    }

    /// Readiness: Redis answers and this build's library is loaded — on a cluster,
    /// `FUNCTION LIST` is asked of every master and every one must have it — loaded where a
    /// master lacks it. Also how a store loads it at connect: a master that has it is not sent
    /// it again (a load is written to the AOF and to replicas, and every process starts).
    pub async fn ready(&self) -> Result<(), StoreError> {
        let mut c = self.conn();
        let name = &scripts::library().name;
        let mut list = redis::cmd("FUNCTION");
        list.arg("LIST").arg("LIBRARYNAME").arg(name);
        let loaded = self.bounded(c.on_every_master(&list)).await?;
        if loaded.iter().all(|v| lists_library(v, name)) {
            Ok(())
        } else {
            self.load_scripts().await
        }
    }

    /// A call of a shard script in the calling convention of `migrations-lua/guard.lua` and
    /// `common.lua`: KEYS = the shard's freeze marker, then the call's keys; ARGV = the shard
    /// prefix and the data policy, then the call's values (see `call.rs`).
    fn shard_call<C: ShardScript>(&self, shard: Shard, call: &C) -> Invocation<'_> {
        shard_invocation(C::script(&self.scripts), shard, &self.policy, call)
    }

    /// A call of an `{acl}` or `{meta}` script: KEYS = the tag's freeze marker, then the
    /// call's keys; ARGV = the tag's prefix, then the call's values.
    fn tag_call<C: TagScript>(&self, call: &C) -> Invocation<'_> {
        let mut inv = C::script(&self.scripts).key(C::frozen());
        call.keys(&mut inv);
        inv.arg(C::prefix());
        call.args(&mut inv);
        inv
    }

    /// What group commit has done so far (see `commit`), for `/metrics`.
    pub fn group_commit_counts(&self) -> GroupCommitCounts {
        self.commits.counts()
    }

    /// Script answers returned without the acknowledgements `--redis-replica-acks` asks for
    /// (see `ReplicaAcks`): writes a failover may lose although their callers were answered.
    pub fn unconfirmed_answers(&self) -> u64 {
        self.conns.first().map_or(0, Conn::unconfirmed_answers)
    }

    /// What group commit of completions has done so far (see `commit`): calls of
    /// `complete.lua`, the reports they carried, and the reports waiting.
    pub fn completion_counts(&self) -> GroupCommitCounts {
        self.completions.counts()
    }

    /// The start log's argument of `start.lua` and `complete.lua`: 1 to keep it, 0 not.
    fn start_log(&self) -> u8 {
        u8::from(self.policy.start_log.load(Ordering::Relaxed))
    }

    fn dlq_cap(&self) -> u64 {
        self.policy.dlq_cap.load(Ordering::Relaxed)
    }

    /// The most dead-letter records one tenant keeps, as the scripts apply it: never above
    /// the shard's cap. Public for the listing, which tells a tenant its cap.
    pub fn dlq_tenant_cap(&self) -> u64 {
        self.policy
            .dlq_tenant_cap
            .load(Ordering::Relaxed)
            .min(self.dlq_cap())
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
                    .arg("dlq_tenant_cap")
                    .arg(p.dlq_tenant_cap.load(Ordering::Relaxed))
                    .arg("start_log")
                    .arg(u8::from(p.start_log.load(Ordering::Relaxed)))
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
            Option<u64>,
            Option<u8>,
        );
        let (mc, mq, ret, dedup, cap, tenant_cap, start_log): Published = self
            .bounded(
                redis::cmd("HMGET")
                    .arg(keys::meta())
                    .arg("default_max_concurrent")
                    .arg("default_max_queued")
                    .arg("retention_secs")
                    .arg("dedup_ttl_secs")
                    .arg("dlq_cap")
                    .arg("dlq_tenant_cap")
                    .arg("start_log")
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
        if let Some(v) = tenant_cap {
            p.dlq_tenant_cap.store(v.max(1), Ordering::Relaxed);
        }
        // (A server from before the setting publishes none: its workers keep their own.)
        if let Some(v) = start_log {
            p.start_log.store(v == 1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// A connection for one operation: round robin over the multiplexed connections.
    fn conn(&self) -> Conn {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.conns.len();
        self.conns[i].clone()
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
