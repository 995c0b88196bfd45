//! The sweeper's storage side: one sweeper turn at a time across processes (a lock on the
//! `{meta}` tag), what to walk (every tenant of every shard, read per shard and concurrently),
//! and one batch of repairs (`migrations-lua/sweep.lua`) — or, for a tenant being deleted,
//! one step of reaping it (`reap.rs`): what a stopped server left unfinished.

use std::time::Duration;

use super::call::script_call;
use super::{Shard, Store, StoreError, keys};
use crate::domain::TenantId;

impl Store {
    /// Tries to become the sweeper for `hold`; true when this process should sweep now.
    pub async fn take_sweeper_turn(&self, owner: &str, hold: Duration) -> Result<bool, StoreError> {
        let mut c = self.conn();
        let r: Option<String> = self
            .bounded(
                redis::cmd("SET")
                    .arg(keys::sweeper_lock())
                    .arg(owner)
                    .arg("NX")
                    .arg("PX")
                    .arg(hold.as_millis() as u64)
                    .query_async(&mut c),
            )
            .await?;
        Ok(r.is_some())
    }

    /// Ends this process's sweeper turn, so the next interval's turn is free to take.
    pub async fn end_sweeper_turn(&self, owner: &str) -> Result<(), StoreError> {
        let inv = self.tag_call(&SweeperUnlockCall {
            lock: keys::sweeper_lock().to_owned(),
            owner,
        });
        let mut c = self.conn();
        let _: i64 = self.bounded(inv.invoke_async(&mut c)).await?;
        Ok(())
    }

    /// The sweep targets of one shard: two round trips on its slot. A tenant being deleted
    /// is reaped instead of swept (and listed whether or not it ever admitted).
    pub async fn shard_sweep_targets(&self, shard: Shard) -> Result<Vec<SweepTarget>, StoreError> {
        let mut c = self.conn();
        let (tenants, reaping): (Vec<String>, Vec<String>) = self
            .bounded(
                redis::pipe()
                    .smembers(shard.tenants())
                    .smembers(shard.reaping())
                    .query_async(&mut c),
            )
            .await?;
        let reaping: Vec<TenantId> = reaping
            .iter()
            .filter_map(|t| TenantId::parse(t).ok())
            .collect();
        let tenants: Vec<TenantId> = tenants
            .iter()
            .filter_map(|t| TenantId::parse(t).ok())
            .filter(|t| !reaping.contains(t))
            .collect();
        let reaped = reaping.into_iter().map(|tenant| SweepTarget {
            shard,
            tenant,
            reaping: true,
        });
        Ok(tenants
            .into_iter()
            .map(|tenant| SweepTarget {
                shard,
                tenant,
                reaping: false,
            })
            .chain(reaped)
            .collect())
    }

    /// One batch of repairs (see `migrations-lua/sweep.lua`): returns the next cursor ("0"
    /// when the walk is done; bytes, since an index walk's is a listing member, which holds
    /// an execution id) and the number of repairs. In mode `Reap`, one step of reaping
    /// the tenant (see `reap_step`; "0" once it is gone, or when only a delivery round in
    /// flight is left: the next turn looks again), which repairs nothing.
    pub async fn sweep_step(
        &self,
        step: &SweepStep,
        cursor: &[u8],
        batch: usize,
    ) -> Result<(Vec<u8>, u64), StoreError> {
        let shard = step.shard;
        let t = &step.tenant;
        if step.mode == SweepMode::Reap {
            let next = match self.reap_step(shard, t).await? {
                super::Reaped::More => b"1",
                super::Reaped::Held(_) | super::Reaped::Done => b"0",
            };
            return Ok((next.to_vec(), 0));
        }
        let index = (step.mode == SweepMode::Index).then(|| shard.listing(t));
        let inv = self.shard_call(
            shard,
            &SweepCall {
                stats: shard.stats(),
                cfg: shard.tenant_config(t),
                slots: shard.slots(t),
                waiting: shard.waiting(t),
                runnable: shard.runnable(),
                leases: shard.leases(),
                index,
                tenant: t.as_str(),
                mode: step.mode.as_str(),
                cursor,
                batch,
            },
        );
        let mut c = self.conn();
        self.bounded(inv.invoke_async(&mut c)).await
    }
}

script_call! {
    /// `migrations-lua/sweep.lua`: one batch of one walk of repairs.
    pub(super) struct SweepCall<'a> {
        keys { stats, cfg, slots, waiting, runnable, leases }
        key_tail { index: Option<String> }
        args {
            tenant: &'a str,
            mode: &'a str,
            cursor: &'a [u8],
            batch: usize,
        }
    }
}

script_call! {
    /// `migrations-lua/sweeper_unlock.lua`: ends the sweeper turn `owner` holds.
    pub(super) struct SweeperUnlockCall<'a> {
        keys { lock }
        args { owner: &'a str }
    }
}

/// A tenant the sweeper walks.
#[derive(Debug, Clone)]
pub struct SweepTarget {
    pub shard: Shard,
    pub tenant: TenantId,
    /// It is being deleted (its shard's `reaping` set lists it): reaped, not swept.
    pub reaping: bool,
}

/// What one sweep walk covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SweepMode {
    /// The tenant's slot set.
    Slots,
    /// The tenant's queue.
    Waiting,
    /// The tenant's queued executions: each must be reachable (on the timer set or in the
    /// queue).
    Reach,
    /// The tenant's listing (`Shard::listing`): members whose row is gone or says otherwise.
    Index,
    /// A tenant being deleted: one step of reaping it (`Store::reap_step`).
    Reap,
    /// The tenant's storage counters, recounted in one call when it has few enough queued
    /// and running executions (see `sweep.lua`).
    Usage,
    /// The tenant's buckets of live dedup mappings: a field whose execution ended or is gone
    /// (left by a process of an older build, which knows only the string-key form) is moved
    /// to the string key with its TTL or dropped.
    Dedup,
}

impl SweepMode {
    /// The mode's name in `sweep.lua` and in the repair counters.
    pub fn as_str(self) -> &'static str {
        match self {
            SweepMode::Slots => "slots",
            SweepMode::Waiting => "waiting",
            SweepMode::Reach => "reach",
            SweepMode::Index => "index",
            SweepMode::Reap => "reap",
            SweepMode::Usage => "usage",
            SweepMode::Dedup => "dedup",
        }
    }
}

/// One structure to walk with a SCAN cursor.
#[derive(Debug, Clone)]
pub struct SweepStep {
    pub shard: Shard,
    pub tenant: TenantId,
    pub mode: SweepMode,
}

impl SweepTarget {
    /// Every walk this tenant needs: slots, queue, reachability of its queued executions,
    /// its listing, its dedup buckets, and (after those, so it counts what they
    /// repaired) its storage counters; for a tenant being deleted, its reap alone.
    pub fn steps(&self) -> Vec<SweepStep> {
        let step = |mode| SweepStep {
            shard: self.shard,
            tenant: self.tenant.clone(),
            mode,
        };
        if self.reaping {
            return vec![step(SweepMode::Reap)];
        }
        let mut v = vec![
            step(SweepMode::Slots),
            step(SweepMode::Waiting),
            step(SweepMode::Reach),
        ];
        v.push(step(SweepMode::Index));
        v.push(step(SweepMode::Dedup));
        v.push(step(SweepMode::Usage));
        v
    }
}
