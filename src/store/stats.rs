//! Read-only numbers for operators (`/api/queues`) and monitoring (`/metrics`): sizes of each
//! shard's queues and the event counters the scripts keep. Two pipelines for all shards.

use std::collections::HashMap;

use redis::Value;

use super::keys::WORKER_GROUP;
use super::{Shard, ShardStats, Store, StoreError};

impl Store {
    /// Sizes and counters of every shard, in shard order.
    pub async fn queue_stats(&self) -> Result<Vec<ShardStats>, StoreError> {
        let shards: Vec<Shard> = self.shards.all().collect();
        let mut counts = redis::pipe();
        let mut pending = redis::pipe();
        for s in &shards {
            counts
                .xlen(s.ready())
                .zcard(s.leases())
                .zcard(s.delayed())
                .xlen(s.dead_letters())
                .hgetall(s.stats());
            pending.cmd("XPENDING").arg(s.ready()).arg(WORKER_GROUP);
        }
        let mut c = self.conn();
        let counts: Vec<Value> = self.bounded(counts.query_async(&mut c)).await?;
        // The groups exist from start-up on; if one was deleted by hand, recreate them and
        // report nothing pending this time rather than fail the whole answer.
        let pending: Vec<u64> = match self
            .bounded_raw(pending.query_async::<Vec<Value>>(&mut c))
            .await?
        {
            Ok(replies) => replies
                .into_iter()
                .map(|r| match r {
                    Value::Array(v) => v
                        .into_iter()
                        .next()
                        .map(redis::from_redis_value::<u64>)
                        .transpose()
                        .map(Option::unwrap_or_default),
                    _ => Ok(0),
                })
                .collect::<Result<_, _>>()?,
            Err(_) => {
                self.ensure_groups().await?;
                vec![0; shards.len()]
            }
        };
        let mut counts = counts.into_iter();
        let mut out = Vec::with_capacity(shards.len());
        for (shard, pending) in shards.into_iter().zip(pending) {
            let mut next = || {
                counts
                    .next()
                    .ok_or_else(|| StoreError::Corrupt("short statistics reply".into()))
            };
            let (ready, leases, delayed, dead_letters, counters) =
                (next()?, next()?, next()?, next()?, next()?);
            out.push(ShardStats {
                shard: shard.number(),
                ready: redis::from_redis_value(ready)?,
                pending,
                leases: redis::from_redis_value(leases)?,
                delayed: redis::from_redis_value(delayed)?,
                dead_letters: redis::from_redis_value(dead_letters)?,
                counters: redis::from_redis_value::<HashMap<String, u64>>(counters)?,
            });
        }
        Ok(out)
    }
}
