//! Steps of `sluice migrate-layout` that convert data written in an older form, one shard and
//! one bounded batch at a time, each beside its Lua. Today: the dedup mappings
//! (`migrations-lua/relayout_dedup.lua`), from a string key per mapping to fields of per-tenant
//! hash buckets for the live ones. Each step is idempotent and safe to repeat after an
//! interruption; `migrate-layout` drives them shard by shard.

use super::{Shard, Store, StoreError};
use crate::store::call::script_call;

impl Store {
    /// One batch of converting `shard`'s dedup mappings of the older form (a string key
    /// without TTL for a live execution) into fields of their tenants' buckets
    /// (`migrations-lua/relayout_dedup.lua`). Walks the shard's node with `SCAN` from
    /// `cursor` (0 to begin) with `COUNT batch`; returns the next cursor (0 once the walk is
    /// done) and how many mappings this batch converted. Mappings of ended executions without
    /// a TTL get it, and those of executions that are gone are deleted, uncounted.
    ///
    /// Idempotent: a converted mapping is not met again, so an interrupted walk run again
    /// from 0 converts what is left. Each batch is atomic and every reader takes both forms,
    /// so it is also correct on a serving shard.
    pub async fn relayout_dedup_step(
        &self,
        shard: Shard,
        cursor: u64,
        batch: usize,
    ) -> Result<(u64, u64), StoreError> {
        let inv = self.shard_call(
            shard,
            &RelayoutDedupCall {
                cursor,
                batch: batch.max(1),
            },
        );
        let mut c = self.conn();
        let (next, converted): (String, u64) = self.bounded(inv.invoke_async(&mut c)).await?;
        let next = next
            .parse()
            .map_err(|_| StoreError::Corrupt(format!("relayout_dedup cursor {next}")))?;
        Ok((next, converted))
    }
}

script_call! {
    /// `migrations-lua/relayout_dedup.lua`: one batch of converting a shard's dedup mappings.
    pub(super) struct RelayoutDedupCall {
        keys {}
        args { cursor: u64, batch: usize }
    }
}
