//! Read-only numbers for operators (`/api/queues`) and monitoring (`/metrics`): sizes of each
//! shard's queues and the event counters the scripts keep. Each shard is read on its own (a
//! pipeline never spans hash slots), all shards at the same time, and a shard that cannot be
//! read is reported as such without failing the others.

use std::collections::HashMap;

use redis::Value;

use super::keys::WORKER_GROUP;
use super::{Shard, Store, StoreError};

/// Counters and sizes of one shard.
#[derive(Debug, Clone)]
pub struct ShardStats {
    pub shard: u16,
    /// Entries on the ready stream (dispatched, not yet started, plus running ones).
    pub ready: u64,
    /// Entries read by a worker and not yet acknowledged (= executions running).
    pub pending: u64,
    /// Leases held.
    pub leases: u64,
    /// Failed executions waiting out a retry backoff.
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

    /// Sizes and counters of one shard: two round trips on its slot.
    async fn shard_stats(&self, shard: Shard) -> Result<ShardStats, StoreError> {
        let mut c = self.conn();
        let (ready, leases, delayed, dead_letters, counters): (
            u64,
            u64,
            u64,
            u64,
            HashMap<String, u64>,
        ) = self
            .bounded(
                redis::pipe()
                    .xlen(shard.ready())
                    .zcard(shard.leases())
                    .zcard(shard.delayed())
                    .xlen(shard.dead_letters())
                    .hgetall(shard.stats())
                    .query_async(&mut c),
            )
            .await?;
        // The group exists from start-up on; if it was deleted by hand, recreate it and
        // report nothing pending this time rather than fail the answer.
        let pending = match self
            .bounded_raw(
                redis::cmd("XPENDING")
                    .arg(shard.ready())
                    .arg(WORKER_GROUP)
                    .query_async::<Value>(&mut c),
            )
            .await?
        {
            Ok(Value::Array(v)) => v
                .into_iter()
                .next()
                .map(redis::from_redis_value::<u64>)
                .transpose()?
                .unwrap_or_default(),
            Ok(_) => 0,
            Err(e) if e.code() == Some("NOGROUP") => {
                self.ensure_group(shard).await?;
                0
            }
            Err(e) => return Err(e.into()),
        };
        Ok(ShardStats {
            shard: shard.number(),
            ready,
            pending,
            leases,
            delayed,
            dead_letters,
            counters,
        })
    }
}
