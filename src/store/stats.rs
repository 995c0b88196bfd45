//! Read-only numbers for monitoring, read at scrape time: queue depth, dead letters and the
//! per-shard event counters the scripts keep.

use std::collections::HashMap;

use super::{Shard, Store, StoreError};

/// One shard's numbers for `/metrics`.
#[derive(Debug, Clone)]
pub struct ShardGauges {
    pub shard: Shard,
    /// Entries on the ready stream (dispatched, not yet acknowledged by a worker).
    pub ready: u64,
    /// Records on the dead-letter stream.
    pub dead_letters: u64,
    /// Cumulative event counts (completed, failed, cancelled, reclaimed, fenced,
    /// dead_lettered, dlq_evicted, repaired_*).
    pub events: HashMap<String, u64>,
}

impl Store {
    /// Every shard's gauges, in shard order: one pipeline for all shards.
    pub async fn shard_gauges(&self) -> Result<Vec<ShardGauges>, StoreError> {
        let shards: Vec<Shard> = self.shards.all().collect();
        let mut p = redis::pipe();
        for s in &shards {
            p.xlen(s.ready()).xlen(s.dead_letters()).hgetall(s.stats());
        }
        let mut c = self.conn();
        let values: Vec<redis::Value> = self.bounded(p.query_async(&mut c)).await?;
        let mut it = values.into_iter();
        let mut out = Vec::with_capacity(shards.len());
        for shard in shards {
            let (Some(ready), Some(dlq), Some(events)) = (it.next(), it.next(), it.next()) else {
                return Err(StoreError::Corrupt("short gauge pipeline reply".into()));
            };
            out.push(ShardGauges {
                shard,
                ready: redis::from_redis_value(ready)?,
                dead_letters: redis::from_redis_value(dlq)?,
                events: redis::from_redis_value(events)?,
            });
        }
        Ok(out)
    }
}
