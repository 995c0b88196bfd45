//! Read-only numbers for operators (`/api/queues`) and monitoring (`/metrics`): sizes of each
//! shard's queues and the event counters the scripts keep. Each shard is read on its own (a
//! pipeline never spans hash slots), all shards at the same time, and a shard that cannot be
//! read is reported as such without failing the others.

use std::collections::HashMap;

use super::{Shard, Store, StoreError};

/// Counters and sizes of one shard.
#[derive(Debug, Clone)]
pub struct ShardStats {
    pub shard: u16,
    /// Queued executions that are due (runnable, in their tenants' queues), summed over the
    /// shard's tenants.
    pub ready: u64,
    /// Tenants that can start an execution now (runnable work and a free slot).
    pub runnable_tenants: u64,
    /// Executions running (each holds a lease).
    pub pending: u64,
    /// Leases held.
    pub leases: u64,
    /// Entries of the timer set: executions scheduled for later or waiting out a retry
    /// backoff, and wake-ups of throttled tenants and keys.
    pub delayed: u64,
    pub dead_letters: u64,
    /// Counters since the shard's creation: completed, failed, cancelled, reclaimed, fenced,
    /// dead_lettered, dlq_evicted.
    pub counters: HashMap<String, u64>,
}

/// The statistics of one shard, or why they could not be read.
#[derive(Debug)]
pub struct ShardReport {
    pub shard: Shard,
    pub stats: Result<ShardStats, StoreError>,
}

impl Store {
    /// Sizes and counters of every shard, in shard order.
    pub async fn queue_stats(&self) -> Vec<ShardReport> {
        let reads = self.shards.all().map(|shard| async move {
            ShardReport {
                shard,
                stats: self.shard_stats(shard).await,
            }
        });
        futures_util::future::join_all(reads).await
    }

    /// Sizes and counters of one shard: three round trips on its slot (the last one reads the
    /// size of each of its tenants' queues).
    async fn shard_stats(&self, shard: Shard) -> Result<ShardStats, StoreError> {
        let mut c = self.conn();
        let (runnable_tenants, leases, delayed, dead_letters, counters): (
            u64,
            u64,
            u64,
            u64,
            HashMap<String, u64>,
        ) = self
            .bounded(
                redis::pipe()
                    .zcard(shard.runnable())
                    .zcard(shard.leases())
                    .zcard(shard.delayed())
                    .xlen(shard.dead_letters())
                    .hgetall(shard.stats())
                    .query_async(&mut c),
            )
            .await?;
        // Every running execution holds a lease.
        let pending = leases;
        // The queues' sizes, one pipeline over the shard's tenants.
        let tenants: Vec<String> = self
            .bounded(
                redis::cmd("SMEMBERS")
                    .arg(shard.tenants())
                    .query_async(&mut c),
            )
            .await?;
        let tenants: Vec<_> = tenants
            .iter()
            .filter_map(|t| crate::domain::TenantId::parse(t).ok())
            .collect();
        let mut ready = 0;
        if !tenants.is_empty() {
            let mut p = redis::pipe();
            for t in &tenants {
                p.zcard(shard.waiting(t));
            }
            let sizes: Vec<u64> = self.bounded(p.query_async(&mut c)).await?;
            ready = sizes.iter().sum();
        }
        Ok(ShardStats {
            shard: shard.number(),
            ready,
            runnable_tenants,
            pending,
            leases,
            delayed,
            dead_letters,
            counters,
        })
    }
}
