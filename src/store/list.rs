//! Reading executions: one by id (a plain `HGETALL` of its row) and a tenant's pages
//! (`migrations-lua/list.lua`, newest first, bounded in rows and in bytes).

use std::collections::HashMap;

use redis::Value;

use super::row::{from_fields, row_to_execution};
use super::{Store, StoreError};
use crate::admission::{Execution, ExecutionId, FlowId, Status, TenantId};

/// A page of a tenant's executions, newest first.
#[derive(Debug)]
pub struct Page {
    pub executions: Vec<Execution>,
    /// Pass back as `cursor` for the next page; `None` on the last page.
    pub next_cursor: Option<String>,
    /// How many executions match the filter in all.
    pub total: u64,
}

/// Filter and position of a listing.
#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    pub status: Option<Status>,
    pub flow: Option<FlowId>,
    pub cursor: Option<ExecutionId>,
    pub limit: u32,
    /// Bytes of rows (field names and values, as stored) after which the page ends early.
    pub byte_budget: usize,
}

impl Store {
    /// One execution of a tenant; `None` when missing or another tenant's.
    pub async fn get(
        &self,
        tenant: &TenantId,
        id: &ExecutionId,
    ) -> Result<Option<Execution>, StoreError> {
        let shard = self.shard_of(tenant);
        let mut c = self.conn();
        let fields: HashMap<String, String> = self
            .bounded(redis::cmd("HGETALL").arg(shard.row(id)).query_async(&mut c))
            .await?;
        // A force-deleted row still running is kept only to hold its slot: gone for readers.
        if fields.get("tenant").map(String::as_str) != Some(tenant.as_str())
            || fields.contains_key("deleted")
        {
            return Ok(None);
        }
        from_fields(id.as_str(), fields, false).map(Some)
    }

    /// One page of a tenant's executions (see `migrations-lua/list.lua`).
    pub async fn list(&self, tenant: &TenantId, q: &ListQuery) -> Result<Page, StoreError> {
        let shard = self.shard_of(tenant);
        let statuses: Vec<Status> = match q.status {
            Some(s) => vec![s],
            None => Status::ALL.to_vec(),
        };
        let mut keys: Vec<String> = statuses
            .iter()
            .map(|s| shard.status_index(tenant, *s))
            .collect();
        if let Some(f) = &q.flow {
            keys.extend(statuses.iter().map(|s| shard.flow_index(tenant, f, *s)));
        }
        let mut inv = self.shard_script(&self.scripts.list, shard, &keys);
        inv.arg(tenant.as_str())
            .arg(q.status.map(Status::as_str).unwrap_or(""))
            .arg(q.flow.as_ref().map(FlowId::as_str).unwrap_or(""))
            .arg(q.cursor.as_ref().map(ExecutionId::as_str).unwrap_or(""))
            .arg(q.limit)
            .arg(q.byte_budget.max(1));
        let mut c = self.conn();
        let reply: Vec<Value> = self.bounded(inv.invoke_async(&mut c)).await?;
        let mut it = reply.into_iter();
        let (Some(cursor), Some(total)) = (it.next(), it.next()) else {
            return Err(StoreError::Corrupt("list reply too short".into()));
        };
        let cursor: String = redis::from_redis_value(cursor)?;
        let total: u64 = redis::from_redis_value(total)?;
        let mut executions = Vec::with_capacity(it.len() / 2);
        while let (Some(id), Some(row)) = (it.next(), it.next()) {
            executions.push(row_to_execution(id, row, false)?);
        }
        Ok(Page {
            executions,
            next_cursor: (!cursor.is_empty()).then_some(cursor),
            total,
        })
    }
}
