//! Reading executions: one by id (a plain `HGETALL` of its row) and a tenant's pages
//! (`migrations-lua/list.lua`, newest first, bounded in rows and in bytes).

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use redis::Value;

use super::call::script_call;
use super::row::{RowFields, from_fields, row_to_execution};
use super::{Shard, Store, StoreError};
use crate::domain::{DedupKey, Execution, ExecutionId, FlowId, Status, TenantId, row};

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
    /// Only the execution that holds this dedup key now (at most one).
    pub dedup: Option<DedupKey>,
    /// Only executions admitted at or after this Unix time in milliseconds (by the time in
    /// their id, which is when the server minted it).
    pub created_from_ms: Option<u64>,
    /// Only executions admitted before this Unix time in milliseconds.
    pub created_before_ms: Option<u64>,
    pub cursor: Option<ExecutionId>,
    /// Only scheduled executions (queued, not due yet); `status` is then `queued` or none.
    pub scheduled: bool,
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
        let found = self.get_in(self.shard_of(tenant), tenant, id).await?;
        match self.repinned(tenant, found.is_none()).await? {
            Some(shard) => self.get_in(shard, tenant, id).await,
            None => Ok(found),
        }
    }

    async fn get_in(
        &self,
        shard: Shard,
        tenant: &TenantId,
        id: &ExecutionId,
    ) -> Result<Option<Execution>, StoreError> {
        let Some(mut e) = self.view_in(shard, tenant, id, false).await? else {
            return Ok(None);
        };
        self.forecast(&mut e).await;
        Ok(Some(e))
    }

    /// Execution `id` of `tenant` as it is in `shard` now, without its forecast (`None` when
    /// missing, another tenant's or force-deleted): what `view()` in
    /// `migrations-lua/common.lua` answers, read with plain commands in one round trip (two
    /// for a row with a concurrency key). GET reads it, and a replayed admission
    /// (`Store::admit`, `deduplicated` set): plain commands' replies cost Redis far less than
    /// a script's table of the same values.
    pub(super) async fn view_in(
        &self,
        shard: Shard,
        tenant: &TenantId,
        id: &ExecutionId,
        deduplicated: bool,
    ) -> Result<Option<Execution>, StoreError> {
        let mut c = self.conn();
        // The row, and what its queue state is read from (a queued row's rank in its tenant's
        // queue against the tenant's free slots), in one round trip.
        let (RowFields(mut fields), rank, running, max_concurrent): (
            RowFields,
            Option<u64>,
            u64,
            Option<u64>,
        ) = self
            .bounded(
                redis::pipe()
                    .hgetall(shard.row(id))
                    .zrank(shard.waiting(tenant), shard.stored_id(id))
                    .scard(shard.slots(tenant))
                    .hget(shard.tenant_config(tenant), "max_concurrent")
                    .query_async(&mut c),
            )
            .await?;
        // A row of an older layout (its shard's conversion is under way) reads the same.
        fields = row::normalize(fields);
        // A force-deleted row still running is kept only to hold its slot: gone for readers.
        if fields.get(row::TENANT).map(String::as_str) != Some(tenant.as_str())
            || fields.contains_key(row::DELETED)
        {
            return Ok(None);
        }
        if fields.get(row::STATUS).map(String::as_str) == Some("queued")
            && fields.get(row::QSTATE).map(String::as_str) != Some("scheduled")
        {
            let max = max_concurrent
                .unwrap_or_else(|| u64::from(self.policy.max_concurrent.load(Ordering::Relaxed)));
            let ready = rank.is_some_and(|r| r < max.saturating_sub(running));
            let qs = if ready { "ready" } else { "waiting" };
            fields.insert("qs".into(), qs.into());
            self.position_fields(shard, tenant, id, rank, &mut fields)
                .await?;
        }
        from_fields(id.as_str(), fields, deduplicated).map(Some)
    }

    /// Adds a runnable row's position to its fields as `view()` in
    /// `migrations-lua/common.lua` does (`qpt`, `qpk`, `qkl`), from its `rank` in its tenant's
    /// queue; a keyed row costs one more round trip (its key's limit and queue).
    async fn position_fields(
        &self,
        shard: Shard,
        tenant: &TenantId,
        id: &ExecutionId,
        rank: Option<u64>,
        fields: &mut HashMap<String, String>,
    ) -> Result<(), StoreError> {
        let Some(h) = fields.get(row::CONCURRENCY_DIGEST).cloned() else {
            if let Some(r) = rank {
                fields.insert("qpt".into(), r.to_string());
            }
            return Ok(());
        };
        // Its order key, as order_key() in common.lua computes it.
        let number = |k: &str| fields.get(k).and_then(|v| v.parse::<i64>().ok());
        let ready_at = number(row::READY_AT)
            .or_else(|| number(row::CREATED))
            .unwrap_or(0);
        let at = ready_at + (number(row::PRIORITY).unwrap_or(3) - 3) * 60_000;
        let mut c = self.conn();
        let (own, per_key, key_rank, ahead): (Option<String>, Option<i64>, Option<u64>, u64) = self
            .bounded(
                redis::pipe()
                    .hget(shard.key_limits(tenant), &h)
                    .hget(shard.tenant_config(tenant), "max_concurrent_per_key")
                    .zrank(shard.key_queue(tenant, &h), shard.stored_id(id))
                    .zcount(shard.waiting(tenant), "-inf", format!("({at}"))
                    .query_async(&mut c),
            )
            .await?;
        let own = own
            .as_deref()
            .and_then(|v| v.split_once(':'))
            .and_then(|(l, _)| l.parse::<i64>().ok());
        let Some(key_rank) = key_rank else {
            return Ok(());
        };
        let (tenant_pos, key_pos) = match rank {
            Some(r) => (r, 0),
            None => (ahead, key_rank),
        };
        fields.insert("qpt".into(), tenant_pos.to_string());
        fields.insert("qpk".into(), key_pos.to_string());
        fields.insert("qkl".into(), own.or(per_key).unwrap_or(-1).to_string());
        Ok(())
    }

    /// One page of a tenant's executions (see `migrations-lua/list.lua`).
    pub async fn list(&self, tenant: &TenantId, q: &ListQuery) -> Result<Page, StoreError> {
        let shard = self.shard_of(tenant);
        let status_filter = match (q.scheduled, q.status) {
            (true, _) => "scheduled",
            (false, Some(s)) => s.as_str(),
            (false, None) => "",
        };
        let digest = q.dedup.as_ref().map(DedupKey::digest).unwrap_or_default();
        let cursor = q.cursor.as_ref().map(|id| shard.stored_id(id));
        let dedup_keys = match q.dedup {
            Some(_) => vec![
                shard.dedup_bucket(tenant, &digest),
                shard.dedup(tenant, &digest),
            ],
            None => Vec::new(),
        };
        let inv = self.shard_call(
            shard,
            &ListCall {
                listing: shard.listing(tenant),
                flows: shard.flows(tenant),
                mapping: dedup_keys,
                tenant: tenant.as_str(),
                status: status_filter,
                flow: q.flow.as_ref().map(FlowId::as_str).unwrap_or(""),
                cursor: cursor.as_ref().map_or(&[][..], AsRef::as_ref),
                limit: q.limit,
                budget: q.byte_budget.max(1),
                dedup: q.dedup.as_ref().map(DedupKey::as_str).unwrap_or(""),
                dedup_digest: &digest,
                from: q
                    .created_from_ms
                    .map(|ms| shard.id_time_bound(ms))
                    .unwrap_or_default(),
                before: q
                    .created_before_ms
                    .map(|ms| shard.id_time_bound(ms))
                    .unwrap_or_default(),
            },
        );
        let mut c = self.conn();
        let reply: Vec<Value> = self.bounded(inv.invoke_async(&mut c)).await?;
        let mut it = reply.into_iter();
        let (Some(cursor), Some(total)) = (it.next(), it.next()) else {
            return Err(StoreError::Corrupt("list reply too short".into()));
        };
        // The last id of the page, in its stored form; the API's cursor is its hex.
        let cursor: Vec<u8> = redis::from_redis_value(cursor)?;
        let cursor = match cursor.is_empty() {
            true => String::new(),
            false => ExecutionId::from_reply(&cursor)
                .map_err(StoreError::Corrupt)?
                .as_str()
                .to_owned(),
        };
        let total: u64 = redis::from_redis_value(total)?;
        let mut executions = Vec::with_capacity(it.len() / 2);
        while let (Some(id), Some(row)) = (it.next(), it.next()) {
            let mut e = row_to_execution(id, row, false)?;
            // One tenant: its pace is read (or found cached) once for the whole page.
            self.forecast(&mut e).await;
            executions.push(e);
        }
        Ok(Page {
            executions,
            next_cursor: (!cursor.is_empty()).then_some(cursor),
            total,
        })
    }
}

script_call! {
    /// `migrations-lua/list.lua`: one page of a tenant's executions.
    pub(super) struct ListCall<'a> {
        keys { listing, flows }
        key_tail { mapping: Vec<String> }
        args {
            tenant: &'a str,
            status: &'a str,
            flow: &'a str,
            cursor: &'a [u8],
            limit: u32,
            budget: usize,
            dedup: &'a str,
            dedup_digest: &'a str,
            from: Vec<u8>,
            before: Vec<u8>,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::domain::ExecutionId;
    use crate::store::{Layout, ShardMap};

    #[test]
    fn a_time_bound_sorts_between_the_ids_of_adjacent_milliseconds() {
        let id = ExecutionId::new();
        let ms = u64::from_str_radix(&id.as_str()[..12], 16).unwrap();
        for layout in [Layout::Listing, Layout::Binary] {
            let s = ShardMap::new(16, layout).shard(0);
            let stored = s.stored_id(&id);
            assert!(
                s.id_time_bound(ms).as_slice() <= stored.as_ref(),
                "{layout:?}"
            );
            assert!(
                s.id_time_bound(ms + 1).as_slice() > stored.as_ref(),
                "{layout:?}"
            );
        }
        let hex = ShardMap::new(16, Layout::Listing).shard(0);
        assert_eq!(hex.id_time_bound(0), b"000000000000");
        assert_eq!(hex.id_time_bound(u64::MAX), b"ffffffffffff");
    }
}
