//! A tenant's limits and usage: changing limits and weight (`migrations-lua/set_limits.lua`,
//! which also makes the tenant runnable when room was made), and reading limits and usage
//! (plain pipelines, one per shard). The registry of tenants and their API keys live under the
//! `{acl}` tag instead (`access.rs`).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::time::{SystemTime, UNIX_EPOCH};

use redis::Value;

use super::call::script_call;
use super::storage::Counters;
use super::{Shard, Store, StoreError, TenantStorage};
use crate::domain::{Status, TenantId};

/// The most per-key limit overrides a tenant may have (`PUT .../concurrency-keys/{key}`).
pub const MAX_KEY_OVERRIDES: u32 = 10_000;

/// The most a tenant's weight can be (the least is 1, the default).
pub const MAX_WEIGHT: u32 = 1_000;

/// A rate limit: at most `starts` starts per `per_ms`, `burst` of them at once (counted when
/// executions start; see "Rate limits" in `migrations-lua/common.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    pub starts: u32,
    pub per_ms: u64,
    pub burst: u32,
}

impl RateLimit {
    /// The most starts a rate may allow per period, and the longest period (a day).
    pub const MAX_STARTS: u32 = 1_000_000;
    pub const MAX_PER_MS: u64 = 86_400_000;
    pub const MAX_BURST: u32 = 100_000;

    /// Reads the stored form `<starts>:<per ms>:<burst>`.
    pub fn parse(text: &str) -> Option<Self> {
        let mut it = text.split(':');
        let r = Self {
            starts: it.next()?.parse().ok()?,
            per_ms: it.next()?.parse().ok()?,
            burst: it.next()?.parse().ok()?,
        };
        it.next().is_none().then_some(r)
    }
}

impl std::fmt::Display for RateLimit {
    /// The stored form (see `parse`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}:{}", self.starts, self.per_ms, self.burst)
    }
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
    /// Its share of starts against the other tenants with runnable work (1..=1000).
    pub weight: Change<u32>,
    /// The limit of each of its concurrency keys without an override (`Reset`: none).
    pub max_concurrent_per_key: Change<u32>,
    /// Its starts' rate limit (`Reset`: none).
    pub rate_limit: Change<RateLimit>,
    /// Each of its concurrency keys' starts' rate limit (`Reset`: none).
    pub rate_limit_per_key: Change<RateLimit>,
    /// The logical bytes it may keep (see `storage`; `Reset`: the server's).
    pub max_bytes: Change<u64>,
    /// The terminal executions it may keep until they expire (`Reset`: the server's).
    pub max_retained: Change<u64>,
}

/// A tenant's effective limits and live usage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantState {
    pub max_concurrent: u32,
    pub max_queued: u32,
    pub enabled: bool,
    pub weight: u32,
    /// The limit of a concurrency key without an override; `None`: no such limit.
    pub max_concurrent_per_key: Option<u32>,
    pub rate_limit: Option<RateLimit>,
    pub rate_limit_per_key: Option<RateLimit>,
    /// Concurrency keys with an override of their own.
    pub key_overrides: u64,
    /// Concurrency keys at their limit with executions waiting behind it.
    pub blocked_keys: u64,
    /// Executions running now.
    pub running: u64,
    /// Queued executions that are runnable (due), in the tenant's order.
    pub waiting: u64,
    /// Queued executions not due yet (scheduled, or waiting out a retry backoff).
    pub scheduled: u64,
    /// It is being deleted (`Store::delete_tenant`): what it still holds is being reaped, it
    /// admits nothing and cannot be registered again until that is done.
    pub deleting: bool,
    /// Its storage bounds and what it keeps.
    pub storage: TenantStorage,
}

/// Commands `tenant_reads` adds per tenant.
const TENANT_READS: usize = 21;

/// What the reads of `tenant_reads` found for one tenant, in their order.
struct TenantReads {
    /// Its own limits, where it has them (else the server defaults apply).
    max_concurrent: Option<u32>,
    max_queued: Option<u32>,
    /// Its own `enabled` flag (0 = disabled), where set.
    enabled: Option<u8>,
    weight: Option<u32>,
    max_concurrent_per_key: Option<u32>,
    rate_limit: Option<String>,
    rate_limit_per_key: Option<String>,
    /// Whether it has a configuration hash at all.
    configured: bool,
    /// Queued, scheduled or not (`queued - scheduled` are runnable).
    queued: u64,
    scheduled: u64,
    running: u64,
    /// Force-deleted executions whose handler still runs (they keep their slot).
    deleting: u64,
    key_overrides: u64,
    blocked_keys: u64,
    /// How many of its status indexes exist (0: it never had an execution).
    indexes: u64,
    /// When its deletion began (ms), while it is being deleted.
    deletion_since: Option<u64>,
    /// Its own storage bounds, where it has them.
    max_bytes: Option<u64>,
    max_retained: Option<u64>,
    /// Its storage counters as stored.
    counters: Counters,
}

impl redis::FromRedisValue for TenantReads {
    fn from_redis_value(v: Value) -> Result<Self, redis::ParsingError> {
        let items: Vec<Value> = redis::from_redis_value(v)?;
        let [
            max_concurrent,
            max_queued,
            enabled,
            weight,
            max_concurrent_per_key,
            rate_limit,
            rate_limit_per_key,
            configured,
            queued,
            scheduled,
            running,
            deleting,
            key_overrides,
            blocked_keys,
            indexes,
            deletion_since,
            max_bytes,
            max_retained,
            u_bytes,
            u_rows,
            u_next,
        ]: [Value; TENANT_READS] = items.try_into().map_err(|_| {
            redis::ParsingError::from("tenant reads: wrong number of replies".to_owned())
        })?;
        fn read<T: redis::FromRedisValue>(v: Value) -> Result<T, redis::ParsingError> {
            redis::from_redis_value(v)
        }
        Ok(Self {
            max_concurrent: read(max_concurrent)?,
            max_queued: read(max_queued)?,
            enabled: read(enabled)?,
            weight: read(weight)?,
            max_concurrent_per_key: read(max_concurrent_per_key)?,
            rate_limit: read(rate_limit)?,
            rate_limit_per_key: read(rate_limit_per_key)?,
            configured: read(configured)?,
            queued: read(queued)?,
            scheduled: read(scheduled)?,
            running: read(running)?,
            deleting: read(deleting)?,
            key_overrides: read(key_overrides)?,
            blocked_keys: read(blocked_keys)?,
            indexes: read(indexes)?,
            deletion_since: read(deletion_since)?,
            max_bytes: read(max_bytes)?,
            max_retained: read(max_retained)?,
            counters: Counters {
                bytes: read::<Option<i64>>(u_bytes)?.unwrap_or(0),
                rows: read::<Option<i64>>(u_rows)?.unwrap_or(0),
                next: read(u_next)?,
            },
        })
    }
}

/// What `set_limits.lua` did.
pub(super) enum Limits {
    /// Written.
    Set,
    /// The tenant is being deleted: nothing written.
    Deleting,
    /// The tenant is pinned elsewhere: nothing written.
    Moved,
}

impl Store {
    /// Changes the limits `limits` names (the others stay); raised limits let waiting
    /// executions start as workers pick them, in order (see `migrations-lua/set_limits.lua`).
    /// A tenant being deleted takes no change: its state is returned as it is, `deleting`.
    pub async fn put_tenant(
        &self,
        tenant: &TenantId,
        limits: &TenantLimits,
    ) -> Result<TenantState, StoreError> {
        // Twice at most: a tenant pinned since this process last read the pins is sent on.
        for _ in 0..2 {
            let shard = self.shard_of(tenant);
            match self.set_limits_in(shard, tenant, limits).await? {
                // A changed per-key limit may unblock keys: walk them.
                Limits::Set
                    if limits.max_concurrent_per_key != Change::Keep
                        || limits.rate_limit_per_key != Change::Keep =>
                {
                    self.promote_all(tenant).await?;
                }
                Limits::Set | Limits::Deleting => {}
                Limits::Moved => {
                    self.refresh_pins().await?;
                    continue;
                }
            }
            return self
                .get_tenant(tenant)
                .await?
                .ok_or_else(|| StoreError::Corrupt("tenant vanished after write".into()));
        }
        Err(StoreError::Corrupt(format!(
            "tenant {tenant} was sent on twice"
        )))
    }

    /// Runs `set_limits.lua` for `tenant` on `shard`.
    pub(super) async fn set_limits_in(
        &self,
        shard: Shard,
        tenant: &TenantId,
        limits: &TenantLimits,
    ) -> Result<Limits, StoreError> {
        let inv = self.shard_call(
            shard,
            &SetLimitsCall {
                cfg: shard.tenant_config(tenant),
                slots: shard.slots(tenant),
                waiting: shard.waiting(tenant),
                runnable: shard.runnable(),
                tenant: tenant.as_str(),
                max_concurrent: limits.max_concurrent.arg(),
                max_queued: limits.max_queued.arg(),
                enabled: limits.enabled.map(u8::from).arg(),
                weight: limits.weight.arg(),
                max_concurrent_per_key: limits.max_concurrent_per_key.arg(),
                rate: limits.rate_limit.arg(),
                key_rate: limits.rate_limit_per_key.arg(),
                max_bytes: limits.max_bytes.arg(),
                max_retained: limits.max_retained.arg(),
            },
        );
        let mut c = self.conn();
        let reply: i64 = self.bounded(inv.invoke_async(&mut c)).await?;
        Ok(match reply {
            r if r < 0 => Limits::Moved,
            1 => Limits::Deleting,
            _ => Limits::Set,
        })
    }

    /// Lets `tenant` and its blocked concurrency keys take what room changed limits made, in
    /// short steps (see `migrations-lua/promote.lua`). An interrupted run leaves a consistent
    /// state: a key it did not reach offers its next execution when a run of it ends.
    pub async fn promote_all(&self, tenant: &TenantId) -> Result<(), StoreError> {
        let shard = self.shard_of(tenant);
        let mut c = self.conn();
        let mut cursor = "0".to_owned();
        // Bounded: each step walks about 200 blocked keys, and a tenant has at most max_queued
        // of them (100k by default) — far fewer steps than this.
        for _ in 0..100_000 {
            let inv = self.shard_call(
                shard,
                &PromoteCall {
                    cfg: shard.tenant_config(tenant),
                    slots: shard.slots(tenant),
                    waiting: shard.waiting(tenant),
                    runnable: shard.runnable(),
                    tenant: tenant.as_str().to_owned(),
                    cursor: cursor.clone(),
                },
            );
            cursor = self.bounded(inv.invoke_async(&mut c)).await?;
            if cursor == "0" {
                return Ok(());
            }
        }
        Ok(())
    }

    /// A tenant's effective limits and usage; `None` for a tenant never configured and without
    /// executions.
    pub async fn get_tenant(&self, tenant: &TenantId) -> Result<Option<TenantState>, StoreError> {
        let shard = self.shard_of(tenant);
        let mut p = redis::pipe();
        tenant_reads(&mut p, shard, tenant);
        let mut c = self.conn();
        let reply: TenantReads = self.bounded(p.query_async(&mut c)).await?;
        let mut states = self.states_of(shard, &[tenant], vec![reply]).await?;
        Ok(states.pop().flatten())
    }

    /// Several tenants' limits and usage (as `get_tenant`), in the order asked: one pipeline
    /// per shard (a pipeline never spans hash slots), all shards at the same time. A shard that
    /// cannot be read fails only its own tenants' entries.
    pub async fn get_tenants(
        &self,
        tenants: &[TenantId],
    ) -> Vec<Result<Option<TenantState>, StoreError>> {
        let mut by_shard: BTreeMap<Shard, Vec<usize>> = BTreeMap::new();
        for (i, t) in tenants.iter().enumerate() {
            by_shard.entry(self.shard_of(t)).or_default().push(i);
        }
        let reads = by_shard.into_iter().map(|(shard, members)| async move {
            let result = self.tenant_states(shard, &members, tenants).await;
            (members, result)
        });
        let mut out: Vec<Result<Option<TenantState>, StoreError>> =
            tenants.iter().map(|_| Ok(None)).collect();
        for (members, result) in futures_util::future::join_all(reads).await {
            match result {
                Ok(states) => {
                    for (i, s) in members.into_iter().zip(states) {
                        out[i] = Ok(s);
                    }
                }
                Err(e) => {
                    for i in members {
                        out[i] = Err(StoreError::Unavailable(e.to_string()));
                    }
                }
            }
        }
        out
    }

    /// The states of `tenants[i]` for each `i` of `members`, all of `shard`, in one pipeline.
    async fn tenant_states(
        &self,
        shard: Shard,
        members: &[usize],
        tenants: &[TenantId],
    ) -> Result<Vec<Option<TenantState>>, StoreError> {
        let mut p = redis::pipe();
        for &i in members {
            tenant_reads(&mut p, shard, &tenants[i]);
        }
        let mut c = self.conn();
        let replies: Vec<Value> = self.bounded(p.query_async(&mut c)).await?;
        if replies.len() != members.len() * TENANT_READS {
            return Err(StoreError::Corrupt("short tenant reply".into()));
        }
        let mut replies = replies.into_iter();
        let mut reads = Vec::with_capacity(members.len());
        for _ in members {
            let one: Vec<Value> = replies.by_ref().take(TENANT_READS).collect();
            reads.push(redis::from_redis_value(Value::Array(one))?);
        }
        let of: Vec<&TenantId> = members.iter().map(|&i| &tenants[i]).collect();
        self.states_of(shard, &of, reads).await
    }

    /// The states `reads` (of `tenants`, in order, all of `shard`) describe. A tenant whose
    /// earliest expiry bucket has ended has its buckets read (one more round trip for all such
    /// tenants of the shard), so its usage shows what its next decision will count, not what
    /// the counters held at its last one.
    async fn states_of(
        &self,
        shard: Shard,
        tenants: &[&TenantId],
        reads: Vec<TenantReads>,
    ) -> Result<Vec<Option<TenantState>>, StoreError> {
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let due: Vec<usize> = (0..reads.len())
            .filter(|&i| reads[i].counters.due(now_ms))
            .collect();
        let mut buckets: HashMap<usize, HashMap<String, String>> = HashMap::new();
        if !due.is_empty() {
            let mut p = redis::pipe();
            for &i in &due {
                p.hgetall(shard.retained(tenants[i]));
            }
            let mut c = self.conn();
            let replies: Vec<HashMap<String, String>> = self.bounded(p.query_async(&mut c)).await?;
            buckets.extend(due.into_iter().zip(replies));
        }
        Ok(reads
            .into_iter()
            .enumerate()
            .map(|(i, r)| self.tenant_state(r, buckets.get(&i), now_ms))
            .collect())
    }

    /// The state the reads of `tenant_reads` describe, its storage drained of the buckets of
    /// `buckets` (the tenant's expiry hash, when it was read) that ended by `now_ms`.
    fn tenant_state(
        &self,
        r: TenantReads,
        buckets: Option<&HashMap<String, String>>,
        now_ms: u64,
    ) -> Option<TenantState> {
        if !r.configured && r.indexes == 0 {
            return None;
        }
        let running = r.running + r.deleting;
        let (bytes, retained, next_drain_ms) = match buckets {
            Some(b) => r.counters.drained(b, now_ms),
            None => r.counters.as_stored(),
        };
        Some(TenantState {
            max_concurrent: r
                .max_concurrent
                .unwrap_or(self.policy.max_concurrent.load(Ordering::Relaxed)),
            max_queued: r
                .max_queued
                .unwrap_or(self.policy.max_queued.load(Ordering::Relaxed)),
            enabled: r.enabled != Some(0),
            weight: r.weight.unwrap_or(1),
            max_concurrent_per_key: r.max_concurrent_per_key,
            rate_limit: r.rate_limit.as_deref().and_then(RateLimit::parse),
            rate_limit_per_key: r.rate_limit_per_key.as_deref().and_then(RateLimit::parse),
            key_overrides: r.key_overrides,
            blocked_keys: r.blocked_keys,
            running,
            waiting: r.queued.saturating_sub(r.scheduled),
            scheduled: r.scheduled,
            deleting: r.deletion_since.is_some(),
            storage: TenantStorage {
                max_bytes: r
                    .max_bytes
                    .unwrap_or(self.policy.max_bytes.load(Ordering::Relaxed)),
                max_retained: r
                    .max_retained
                    .unwrap_or(self.policy.max_retained.load(Ordering::Relaxed)),
                bytes,
                retained,
                next_drain_ms,
            },
        })
    }
}

script_call! {
    /// `migrations-lua/set_limits.lua`: changes the limits a request names. Each value is the
    /// script's spelling of a `Change` (`Change::arg`).
    pub(super) struct SetLimitsCall<'a> {
        keys { cfg, slots, waiting, runnable }
        args {
            tenant: &'a str,
            max_concurrent: String,
            max_queued: String,
            enabled: String,
            weight: String,
            max_concurrent_per_key: String,
            rate: String,
            key_rate: String,
            max_bytes: String,
            max_retained: String,
        }
    }
}

script_call! {
    /// `migrations-lua/promote.lua`: one step of letting a tenant take the room its limits
    /// now give.
    pub(super) struct PromoteCall {
        keys { cfg, slots, waiting, runnable }
        args { tenant: String, cursor: String }
    }
}

/// Adds the reads of one tenant's limits and usage to `p` (`TENANT_READS` commands, all in
/// the tenant's shard).
fn tenant_reads(p: &mut redis::Pipeline, shard: Shard, tenant: &TenantId) {
    let listing = shard.listing(tenant);
    let queued = super::keys::listing_range(Some(Status::Queued));
    let scheduled = super::keys::listing_range(None);
    let running = super::keys::listing_range(Some(Status::Running));
    p.hget(shard.tenant_config(tenant), "max_concurrent")
        .hget(shard.tenant_config(tenant), "max_queued")
        .hget(shard.tenant_config(tenant), "enabled")
        .hget(shard.tenant_config(tenant), "weight")
        .hget(shard.tenant_config(tenant), "max_concurrent_per_key")
        .hget(shard.tenant_config(tenant), "rate")
        .hget(shard.tenant_config(tenant), "key_rate")
        .exists(shard.tenant_config(tenant))
        .zlexcount(listing.clone(), &queued.0, &queued.1)
        .zlexcount(listing.clone(), &scheduled.0, &scheduled.1)
        .zlexcount(listing.clone(), &running.0, &running.1)
        .scard(shard.deleting(tenant))
        .hlen(shard.key_limits(tenant))
        .scard(shard.key_blocked(tenant));
    p.exists(listing)
        .hget(shard.tenant_config(tenant), "deleting")
        .hget(shard.tenant_config(tenant), "max_bytes")
        .hget(shard.tenant_config(tenant), "max_retained")
        .hget(shard.tenant_config(tenant), "u_bytes")
        .hget(shard.tenant_config(tenant), "u_rows")
        .hget(shard.tenant_config(tenant), "u_next");
}
