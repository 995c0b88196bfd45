//! Ending an execution on a caller's request: cancel (`migrations-lua/cancel.lua`) and force
//! delete (`migrations-lua/force_delete.lua`).

use redis::Value;

use super::row::{execution_from, split_tag};
use super::{Shard, Store, StoreError};
use crate::admission::{Execution, ExecutionId, Status, TenantId};

impl Store {
    /// Cancels an execution (see `migrations-lua/cancel.lua`); `None` when not found.
    pub async fn cancel(
        &self,
        tenant: &TenantId,
        id: &ExecutionId,
    ) -> Result<Option<Execution>, StoreError> {
        let found = self.cancel_in(self.shard_of(tenant), tenant, id).await?;
        match self.repinned(tenant, found.is_none()).await? {
            Some(shard) => self.cancel_in(shard, tenant, id).await,
            None => Ok(found),
        }
    }

    async fn cancel_in(
        &self,
        shard: Shard,
        tenant: &TenantId,
        id: &ExecutionId,
    ) -> Result<Option<Execution>, StoreError> {
        let keys = [
            shard.row(id),
            shard.tenant_config(tenant),
            shard.slots(tenant),
            shard.waiting(tenant),
            shard.status_index(tenant, Status::Queued),
            shard.status_index(tenant, Status::Cancelled),
            shard.ready(),
            shard.delayed(),
            shard.stats(),
        ];
        let mut inv = self.shard_script(&self.scripts.cancel, shard, &keys);
        inv.arg(tenant.as_str()).arg(id.as_str());
        let mut c = self.conn();
        let reply: Vec<Value> = self.bounded(inv.invoke_async(&mut c)).await?;
        let (tag, rest) = split_tag(reply)?;
        match tag.as_str() {
            "ok" => Ok(Some(execution_from(rest, false)?)),
            "not_found" => Ok(None),
            other => Err(StoreError::Corrupt(format!("cancel replied {other}"))),
        }
    }

    /// Terminalizes and deletes an execution now, releasing its dedup key, and its slot
    /// once no handler runs it (see `migrations-lua/force_delete.lua`). Returns whether it
    /// existed.
    pub async fn force_delete(
        &self,
        tenant: &TenantId,
        id: &ExecutionId,
    ) -> Result<bool, StoreError> {
        let found = self
            .force_delete_in(self.shard_of(tenant), tenant, id)
            .await?;
        match self.repinned(tenant, !found).await? {
            Some(shard) => self.force_delete_in(shard, tenant, id).await,
            None => Ok(found),
        }
    }

    async fn force_delete_in(
        &self,
        shard: Shard,
        tenant: &TenantId,
        id: &ExecutionId,
    ) -> Result<bool, StoreError> {
        let keys = [
            shard.row(id),
            shard.tenant_config(tenant),
            shard.slots(tenant),
            shard.waiting(tenant),
            shard.deleting(tenant),
            shard.ready(),
            shard.delayed(),
            shard.leases(),
        ];
        let mut inv = self.shard_script(&self.scripts.force_delete, shard, &keys);
        inv.arg(tenant.as_str()).arg(id.as_str());
        let mut c = self.conn();
        let reply: Vec<Value> = self.bounded(inv.invoke_async(&mut c)).await?;
        let (tag, _) = split_tag(reply)?;
        Ok(tag == "deleted")
    }
}
