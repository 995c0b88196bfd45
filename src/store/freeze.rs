//! Freeze markers: while `<prefix>frozen` exists, every script under that prefix refuses to run
//! (`migrations-lua/guard.lua` answers `TRYAGAIN shard frozen for a slot move` before touching
//! anything), so a shard's slot can be migrated between Redis Cluster nodes without a script
//! running against half-moved data. Callers see `StoreError::Unavailable` (HTTP 503, retry
//! later); a worker starts nothing in a frozen shard. Plain reads (`GET /api/executions/{id}`,
//! tenant usage, statistics) are not scripts and are not stopped.
//!
//! Keep a freeze short: heartbeats are refused too, so runs in a shard frozen for longer than
//! the lease are abandoned by their workers and re-run after the thaw.
//!
//! A shard frozen for a move carries two markers: this build's (`Shard::frozen`, `<p>hold`,
//! what `guard.lua` checks) and the one a layout-5 build will check (`Shard::binary_hold`,
//! `<p>hold:5`), so that a process of either build is fenced out of a moving shard
//! (docs/layout-5-plan.md §2.2). They are set and cleared together; only this build's says
//! whether the shard is frozen.

use redis::Value;

use super::{Shard, Store, StoreError, keys};

impl Store {
    /// Sets the freeze markers of `shard` (this build's first): from now on its scripts refuse
    /// to run, and so will a layout-5 build's. Idempotent. One command each, not one `MSET`:
    /// during a slot move each is routed (and redirected) on its own, as one marker may
    /// already be on the target.
    pub async fn freeze_shard(&self, shard: Shard) -> Result<(), StoreError> {
        self.set_marker(shard.frozen(), true).await?;
        self.set_marker(shard.binary_hold(), true).await
    }

    /// Removes the freeze markers of `shard` (this build's last, so a stop in between leaves
    /// the shard frozen, not half open): its scripts run again. Idempotent.
    pub async fn unfreeze_shard(&self, shard: Shard) -> Result<(), StoreError> {
        self.set_marker(shard.binary_hold(), false).await?;
        self.set_marker(shard.frozen(), false).await
    }

    /// Whether `shard` is frozen.
    pub async fn is_frozen(&self, shard: Shard) -> Result<bool, StoreError> {
        self.marker_set(shard.frozen()).await
    }

    /// Sets the freeze marker of the access data (`{acl}`: API keys and the tenant registry).
    pub async fn freeze_access(&self) -> Result<(), StoreError> {
        self.set_marker(keys::acl_frozen(), true).await
    }

    /// Removes the freeze marker of the access data.
    pub async fn unfreeze_access(&self) -> Result<(), StoreError> {
        self.set_marker(keys::acl_frozen(), false).await
    }

    /// Whether the access data is frozen.
    pub async fn is_access_frozen(&self) -> Result<bool, StoreError> {
        self.marker_set(keys::acl_frozen()).await
    }

    async fn set_marker(&self, key: String, frozen: bool) -> Result<(), StoreError> {
        let mut c = self.conn();
        let mut cmd = if frozen {
            redis::cmd("SET")
        } else {
            redis::cmd("DEL")
        };
        cmd.arg(key);
        if frozen {
            cmd.arg(1);
        }
        let _: Value = self.bounded(cmd.query_async(&mut c)).await?;
        Ok(())
    }

    async fn marker_set(&self, key: String) -> Result<bool, StoreError> {
        let mut c = self.conn();
        self.bounded(redis::cmd("EXISTS").arg(key).query_async(&mut c))
            .await
    }
}
