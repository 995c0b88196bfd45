//! Read-only numbers for monitoring: queue depth per shard, read at scrape time.

use super::{Shard, Store, StoreError};

impl Store {
    /// The length of every shard's ready stream (executions dispatched and not yet acknowledged
    /// by a worker), in shard order. One pipeline of `XLEN`s.
    pub async fn ready_depths(&self) -> Result<Vec<(Shard, u64)>, StoreError> {
        let shards: Vec<Shard> = self.shards.all().collect();
        let mut p = redis::pipe();
        for s in &shards {
            p.xlen(s.ready());
        }
        let mut c = self.conn();
        let lens: Vec<u64> = self.bounded(p.query_async(&mut c)).await?;
        Ok(shards.into_iter().zip(lens).collect())
    }
}
