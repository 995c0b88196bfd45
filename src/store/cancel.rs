//! Changing a queued or running execution on a caller's request: cancel
//! (`migrations-lua/cancel.lua`), force delete (`migrations-lua/force_delete.lua`) and moving
//! a scheduled one (`migrations-lua/reschedule.lua`).

use redis::Value;

use super::call::script_call;
use super::row::{execution_from, split_tag, string_at};
use super::{Shard, Store, StoreError};
use crate::domain::{Execution, ExecutionId, QueueState, Schedule, Status, TenantId};

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
        let inv = self.shard_call(
            shard,
            &CancelCall {
                row: shard.row(id),
                cfg: shard.tenant_config(tenant),
                slots: shard.slots(tenant),
                waiting: shard.waiting(tenant),
                listing: shard.listing(tenant),
                runnable: shard.runnable(),
                delayed: shard.delayed(),
                stats: shard.stats(),
                tenant: tenant.as_str(),
                id: shard.stored_id(id),
            },
        );
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
        let inv = self.shard_call(
            shard,
            &ForceDeleteCall {
                row: shard.row(id),
                cfg: shard.tenant_config(tenant),
                slots: shard.slots(tenant),
                waiting: shard.waiting(tenant),
                deleting: shard.deleting(tenant),
                runnable: shard.runnable(),
                delayed: shard.delayed(),
                leases: shard.leases(),
                tenant: tenant.as_str(),
                id: shard.stored_id(id),
            },
        );
        let mut c = self.conn();
        let reply: Vec<Value> = self.bounded(inv.invoke_async(&mut c)).await?;
        let (tag, _) = split_tag(reply)?;
        Ok(tag == "deleted")
    }
}

/// What `reschedule` found.
#[derive(Debug)]
pub enum Reschedule {
    /// Moved (or made runnable now, for a time that has come): the execution after it.
    Done(Box<Execution>),
    /// Missing, or another tenant's.
    NotFound,
    /// Not scheduled any more (runnable, running or over): its status, and its queue state
    /// while queued.
    NotScheduled(Status, Option<QueueState>),
}

impl Store {
    /// Moves a scheduled execution to a new due time (see `migrations-lua/reschedule.lua`).
    pub async fn reschedule(
        &self,
        tenant: &TenantId,
        id: &ExecutionId,
        when: Schedule,
    ) -> Result<Reschedule, StoreError> {
        let found = self
            .reschedule_in(self.shard_of(tenant), tenant, id, when)
            .await?;
        let missing = matches!(found, Reschedule::NotFound);
        match self.repinned(tenant, missing).await? {
            Some(shard) => self.reschedule_in(shard, tenant, id, when).await,
            None => Ok(found),
        }
    }

    async fn reschedule_in(
        &self,
        shard: Shard,
        tenant: &TenantId,
        id: &ExecutionId,
        when: Schedule,
    ) -> Result<Reschedule, StoreError> {
        let (run_at, delay) = match when {
            Schedule::At(ms) => (ms.to_string(), String::new()),
            Schedule::After(ms) => (String::new(), ms.to_string()),
        };
        let inv = self.shard_call(
            shard,
            &RescheduleCall {
                row: shard.row(id),
                delayed: shard.delayed(),
                tenant: tenant.as_str(),
                id: shard.stored_id(id),
                run_at,
                delay,
            },
        );
        let mut c = self.conn();
        let reply: Vec<Value> = self.bounded(inv.invoke_async(&mut c)).await?;
        let (tag, rest) = split_tag(reply)?;
        match tag.as_str() {
            "ok" => {
                let mut e = execution_from(rest, false)?;
                self.forecast(&mut e).await;
                Ok(Reschedule::Done(Box::new(e)))
            }
            "not_found" => Ok(Reschedule::NotFound),
            "not_scheduled" => {
                let status = string_at(&rest, 0)?;
                let status = Status::parse(&status)
                    .ok_or_else(|| StoreError::Corrupt(format!("reschedule: status {status}")))?;
                Ok(Reschedule::NotScheduled(
                    status,
                    QueueState::parse(&string_at(&rest, 1)?),
                ))
            }
            other => Err(StoreError::Corrupt(format!("reschedule replied {other}"))),
        }
    }
}

script_call! {
    /// `migrations-lua/cancel.lua`: cancels one execution of a tenant.
    pub(super) struct CancelCall<'a> {
        keys { row: Vec<u8>, cfg, slots, waiting, listing, runnable, delayed, stats }
        args { tenant: &'a str, id: super::keys::StoredId }
    }
}

script_call! {
    /// `migrations-lua/force_delete.lua`: deletes one execution of a tenant now.
    pub(super) struct ForceDeleteCall<'a> {
        keys { row: Vec<u8>, cfg, slots, waiting, deleting, runnable, delayed, leases }
        args { tenant: &'a str, id: super::keys::StoredId }
    }
}

script_call! {
    /// `migrations-lua/reschedule.lua`: moves a scheduled execution; exactly one of `run_at`
    /// and `delay` is a number of ms, the other ''.
    pub(super) struct RescheduleCall<'a> {
        keys { row: Vec<u8>, delayed }
        args { tenant: &'a str, id: super::keys::StoredId, run_at: String, delay: String }
    }
}
