//! Deleting a tenant: the mark in its shard (`migrations-lua/tenant_drop.lua`), its registry
//! entry and keys (`access.rs`), and the reaping of everything it held, in bounded steps
//! (`migrations-lua/tenant_reap.lua`).
//!
//! Why reap before the id is free, rather than name every key with a generation: a deleted
//! tenant's executions, dedup mappings, dead letters, trends and settings all live under its
//! id in its shard, so a tenant registered again under the same id would inherit them. A
//! generation in every key name would free the id at once, but it would cost every script and
//! every key of every tenant, every day, for an operation a platform admin runs now and then.
//! Instead the tenant is marked `deleting` in its shard (the one place every script that admits,
//! starts or configures it already reads: its cfg), which refuses admissions and registration
//! (409 `tenant_deleting`) until the reap has removed everything, then the mark goes. A tenant
//! of a few thousand executions is reaped within the `DELETE` that began it; a bigger one by a
//! task of the server that deleted it, paced, and by the sweeper for what a stopped server
//! left (the shard's `reaping` set says who is unfinished).

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Value;

use super::call::script_call;
use super::row::split_tag;
use super::{Shard, Store, StoreError};
use crate::domain::TenantId;

/// Members (executions, index entries, dead-letter records, override fields) one call of
/// `tenant_reap.lua` removes at most: an execution costs five to a dozen O(log n) commands
/// (about 16 µs measured for a queued one), so a call holds its Redis for about a
/// millisecond, like a sweep step, and another tenant's call waits at most that long.
pub const REAP_BATCH: usize = 64;

/// Calls of `tenant_reap.lua` a `DELETE /api/tenants/{t}` makes itself before it answers
/// (about 1,600 executions): a small tenant is gone when the call answers 204, a bigger one
/// goes on in the background (202).
pub const REAP_INLINE_CALLS: usize = 25;

/// The pause between two calls of a background reap: it keeps a big tenant's removal to a
/// small share of its shard's Redis (a call of about a millisecond per pause).
const REAP_PAUSE: Duration = Duration::from_millis(10);

/// How long a background reap goes on before it leaves the rest to the sweeper (whose turns
/// reap too), and how many calls it makes at most.
const REAP_BACKGROUND_LIMIT: Duration = Duration::from_secs(3_600);
const REAP_BACKGROUND_CALLS: usize = 1_000_000;

/// The longest a background reap waits, at a time, for a delivery round that holds the
/// tenant's webhook lock (the round's end writes its log, which the reap must then remove).
const HELD_WAIT_MAX: Duration = Duration::from_secs(1);

/// What `Store::delete_tenant` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deletion {
    /// The tenant is not registered and its shard holds nothing of it: nothing was written.
    Unknown,
    /// It is being deleted (from now, or since an earlier call): it admits nothing, its keys
    /// are revoked, and what it held is being reaped.
    Deleting {
        /// When the deletion began (ms, Redis's clock).
        since_ms: u64,
    },
}

/// Where the reaping of a deleted tenant stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reaped {
    /// Some of it is left: reap again.
    More,
    /// Nothing is left but a webhook delivery round in flight, which holds its lock this much
    /// longer: reap again after it.
    Held(Duration),
    /// Nothing of it is left (or it was not being deleted): the id is free.
    Done,
}

impl Store {
    /// Deletes `tenant`: marks it `deleting` in its shard (from then on it admits nothing,
    /// starts nothing, takes no settings, and its webhook is gone), then removes it from the
    /// registry and revokes its keys (every server hears of it). What it held is reaped by
    /// `reap_tenant`; until that is done, registering it again is refused. Repeatable: a
    /// second call finds the mark and finishes what an interrupted first one left.
    pub async fn delete_tenant(&self, tenant: &TenantId) -> Result<Deletion, StoreError> {
        let registered = self.tenant_registered(tenant).await?;
        // Twice at most: a tenant pinned since this process last read the pins is sent on.
        for _ in 0..2 {
            let shard = self.shard_of(tenant);
            let inv = self.shard_call(
                shard,
                &TenantDropCall {
                    cfg: shard.tenant_config(tenant),
                    reaping: shard.reaping(),
                    runnable: shard.runnable(),
                    outbox: shard.outbox(tenant),
                    webhooks: shard.webhooks(),
                    tenant: tenant.as_str(),
                    registered: if registered { "1" } else { "0" },
                },
            );
            let mut c = self.conn();
            let reply: Vec<Value> = self.bounded(inv.invoke_async(&mut c)).await?;
            let (tag, rest) = split_tag(reply)?;
            let since_ms = match tag.as_str() {
                "unknown" => return Ok(Deletion::Unknown),
                "marked" | "deleting" => number(&rest)?,
                "moved" => {
                    self.refresh_pins().await?;
                    continue;
                }
                other => {
                    return Err(StoreError::Corrupt(format!("tenant_drop replied {other}")));
                }
            };
            // After the mark: from here on nothing of it is admitted, so the keys revoked
            // now cannot be followed by work they admitted.
            self.unregister_tenant(tenant).await?;
            return Ok(Deletion::Deleting { since_ms });
        }
        Err(StoreError::Corrupt(format!(
            "tenant {tenant} was sent on twice"
        )))
    }

    /// Reaps what deleted `tenant` holds in its shard, in at most `calls` calls of
    /// `tenant_reap.lua` (each bounded, see `REAP_BATCH`), one after the other: `Done` once
    /// nothing is left and the id is free, `More` when the calls ran out first, `Held` when
    /// only a webhook delivery round in flight is left to wait for.
    pub async fn reap_tenant(&self, tenant: &TenantId, calls: usize) -> Result<Reaped, StoreError> {
        for _ in 0..calls {
            match self.reap_step(self.shard_of(tenant), tenant).await? {
                Reaped::More => continue,
                other => return Ok(other),
            }
        }
        Ok(Reaped::More)
    }

    /// Reaps `tenant` to the end in the background, paced (`REAP_PAUSE` between calls) and
    /// bounded (`REAP_BACKGROUND_LIMIT`, `REAP_BACKGROUND_CALLS`); what it leaves (a stopped
    /// process, Redis down for long) the sweeper's turns finish.
    pub fn reap_in_background(self: &Arc<Self>, tenant: TenantId) {
        let store = self.clone();
        tokio::spawn(async move {
            let began = Instant::now();
            let mut failures = 0u32;
            for _ in 0..REAP_BACKGROUND_CALLS {
                if began.elapsed() > REAP_BACKGROUND_LIMIT {
                    break;
                }
                let pause = match store.reap_tenant(&tenant, 1).await {
                    Ok(Reaped::Done) => return,
                    Ok(Reaped::More) => REAP_PAUSE,
                    Ok(Reaped::Held(left)) => left.min(HELD_WAIT_MAX),
                    Err(e) => {
                        failures += 1;
                        tracing::warn!(%tenant, error = %e, "reaping a deleted tenant failed; trying again");
                        // Data it cannot read will not read better later: the sweeper tries.
                        if matches!(e, StoreError::Corrupt(_)) || failures >= 10 {
                            return;
                        }
                        Duration::from_secs(1)
                    }
                };
                tokio::time::sleep(pause).await;
            }
            tracing::warn!(%tenant, "a deleted tenant is not reaped yet; the sweeper goes on with it");
        });
    }

    /// One step of reaping `tenant` on `shard` (the sweeper names the shard whose `reaping`
    /// set lists it): one call of `tenant_reap.lua`; when that finds nothing left, the tenant
    /// leaves the registry again (a registration that raced the deletion goes too) and a last
    /// call drops the mark.
    pub async fn reap_step(&self, shard: Shard, tenant: &TenantId) -> Result<Reaped, StoreError> {
        match self.reap_call(shard, tenant, false).await? {
            ReapReply::Empty => {}
            ReapReply::Reaped(r) => return Ok(r),
        }
        self.unregister_tenant(tenant).await?;
        match self.reap_call(shard, tenant, true).await? {
            ReapReply::Reaped(r) => Ok(r),
            ReapReply::Empty => Err(StoreError::Corrupt(
                "tenant_reap answered empty to a finishing call".into(),
            )),
        }
    }

    /// One call of `tenant_reap.lua`.
    async fn reap_call(
        &self,
        shard: Shard,
        tenant: &TenantId,
        finish: bool,
    ) -> Result<ReapReply, StoreError> {
        let inv = self.shard_call(
            shard,
            &TenantReapCall {
                cfg: shard.tenant_config(tenant),
                reaping: shard.reaping(),
                tenant: tenant.as_str(),
                budget: REAP_BATCH,
                finish: if finish { "1" } else { "0" },
            },
        );
        let mut c = self.conn();
        let reply: Vec<Value> = self.bounded(inv.invoke_async(&mut c)).await?;
        let (tag, rest) = split_tag(reply)?;
        Ok(match tag.as_str() {
            "more" => ReapReply::Reaped(Reaped::More),
            "held" => ReapReply::Reaped(Reaped::Held(Duration::from_millis(number(&rest)?))),
            "done" | "none" => ReapReply::Reaped(Reaped::Done),
            "empty" => ReapReply::Empty,
            other => return Err(StoreError::Corrupt(format!("tenant_reap replied {other}"))),
        })
    }

    /// The tenants being deleted in `shard` (its `reaping` set): what the sweeper reaps.
    pub async fn tenants_reaping(&self, shard: Shard) -> Result<Vec<TenantId>, StoreError> {
        let mut c = self.conn();
        let names: Vec<String> = self
            .bounded(
                redis::cmd("SMEMBERS")
                    .arg(shard.reaping())
                    .query_async(&mut c),
            )
            .await?;
        Ok(names
            .iter()
            .filter_map(|t| TenantId::parse(t).ok())
            .collect())
    }
}

/// What one call of `tenant_reap.lua` answered.
enum ReapReply {
    Reaped(Reaped),
    /// Nothing is left but the mark (a call without `finish`).
    Empty,
}

/// The number after a reply's tag.
fn number(rest: &[Value]) -> Result<u64, StoreError> {
    let v = rest
        .first()
        .ok_or_else(|| StoreError::Corrupt("script reply too short".into()))?;
    let n: i64 = redis::from_redis_value(v.clone())?;
    Ok(n.max(0) as u64)
}

script_call! {
    /// `migrations-lua/tenant_drop.lua`: marks a tenant as being deleted in its shard.
    pub(super) struct TenantDropCall<'a> {
        keys { cfg, reaping, runnable, outbox, webhooks }
        args { tenant: &'a str, registered: &'a str }
    }
}

script_call! {
    /// `migrations-lua/tenant_reap.lua`: one bounded step of removing a deleted tenant.
    pub(super) struct TenantReapCall<'a> {
        keys { cfg, reaping }
        args { tenant: &'a str, budget: usize, finish: &'a str }
    }
}
