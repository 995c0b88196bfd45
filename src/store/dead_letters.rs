//! Executions that failed for good: retrying one (`migrations-lua/retry.lua`, same id, fresh
//! attempts), reading the shards' dead-letter records newest first (`dlq_list.lua`: bounded by
//! the page), dismissing one (`dlq_dismiss.lua`), and rebuilding the indexes and counts an
//! older build left behind (`dlq_reindex.lua`, when `serve` starts). The caps that bound the records
//! are applied by the scripts that write them (`dead_letter` in `migrations-lua/common.lua`).

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use redis::Value;

use super::call::script_call;
use super::row::{execution_from, split_tag};
use super::storage::{self, Refused};
use super::{Shard, StorageFull, Store, StoreError};
use crate::domain::{Execution, ExecutionId, Status, TenantId};

/// What `Store::retry` did.
#[derive(Debug, Clone)]
pub enum Retry {
    /// Queued again (dispatched or waiting, as an admission would be): same id, attempt 0.
    Queued(Box<Execution>),
    /// No such execution for this tenant.
    NotFound,
    /// Its status (`queued`, `running` or `completed`) cannot be retried; nothing changed.
    NotRetryable(Status),
    /// The tenant is disabled; nothing changed.
    Disabled,
    /// The tenant is being deleted; nothing changed.
    Deleting,
    /// The tenant has no free slot and its waiting set is full; nothing changed.
    QueueFull { waiting: u64 },
    /// The tenant is over a storage bound even with what the retry frees (a bound lowered
    /// under its usage); nothing changed.
    StorageFull(StorageFull),
}

/// A page of dead letters, with what the listing covers.
#[derive(Debug, Clone, Default)]
pub struct DeadLetterPage {
    /// Newest first.
    pub records: Vec<DeadLetter>,
    /// The records held now: the tenant's in its shard, or every shard's.
    pub held: u64,
    /// Records of theirs the caps evicted so far (the tenant's, or every shard's).
    pub evicted: u64,
    /// The `before` of the next page when more may follow: the last id this page read.
    pub next: Option<String>,
}

/// What `Store::reindex_dead_letters` did.
#[derive(Debug, Clone, Default)]
pub struct Reindexed {
    /// Record ids appended to an index (records an older build left unindexed or uncounted).
    pub indexed: u64,
    /// Shards not done: unreachable, frozen, or beyond the calls allowed.
    pub unfinished: Vec<u16>,
}

/// One dead-letter record.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    /// The shard whose dead-letter stream holds the record.
    pub shard: u16,
    /// The record's id in its shard's dead-letter stream.
    pub entry_id: String,
    pub execution_id: String,
    pub tenant_id: Option<String>,
    pub flow_id: Option<String>,
    /// `lease_lost`, `handler_error` or `poison`.
    pub reason: String,
    pub attempts: u32,
    /// The ready-stream entry that carried the execution.
    pub source_entry: String,
    /// RFC 3339.
    pub dead_lettered_at: String,
    pub message: String,
}

impl Store {
    /// Re-queues a failed or cancelled execution with fresh attempts.
    pub async fn retry(&self, tenant: &TenantId, id: &ExecutionId) -> Result<Retry, StoreError> {
        let found = self.retry_in(self.shard_of(tenant), tenant, id).await?;
        match self
            .repinned(tenant, matches!(found, Retry::NotFound))
            .await?
        {
            Some(shard) => self.retry_in(shard, tenant, id).await,
            None => Ok(found),
        }
    }

    async fn retry_in(
        &self,
        shard: Shard,
        tenant: &TenantId,
        id: &ExecutionId,
    ) -> Result<Retry, StoreError> {
        let inv = self.shard_call(
            shard,
            &RetryCall {
                row: shard.row(id),
                cfg: shard.tenant_config(tenant),
                slots: shard.slots(tenant),
                waiting: shard.waiting(tenant),
                listing: shard.listing(tenant),
                runnable: shard.runnable(),
                tenant: tenant.as_str(),
                id: shard.stored_id(id),
                max_bytes: self.policy.max_bytes.load(Ordering::Relaxed),
                max_retained: self.policy.max_retained.load(Ordering::Relaxed),
            },
        );
        let mut c = self.conn();
        let reply: Vec<Value> = self.bounded(inv.invoke_async(&mut c)).await?;
        let (tag, rest) = split_tag(reply)?;
        if let Some(Refused::Full(full)) = storage::refused(&tag, &rest)? {
            return Ok(Retry::StorageFull(full));
        }
        Ok(match tag.as_str() {
            "not_found" => Retry::NotFound,
            "not_retryable" => {
                let status: String = rest
                    .into_iter()
                    .next()
                    .map(redis::from_redis_value)
                    .transpose()?
                    .unwrap_or_default();
                Retry::NotRetryable(Status::parse(&status).ok_or_else(|| {
                    StoreError::Corrupt(format!("retry: not retryable in status {status:?}"))
                })?)
            }
            "disabled" => Retry::Disabled,
            "deleting" => Retry::Deleting,
            "full" => Retry::QueueFull {
                waiting: rest
                    .into_iter()
                    .next()
                    .map(redis::from_redis_value)
                    .transpose()?
                    .unwrap_or_default(),
            },
            "ok" => {
                let mut e = execution_from(rest, false)?;
                self.forecast(&mut e).await;
                Retry::Queued(Box::new(e))
            }
            other => return Err(StoreError::Corrupt(format!("retry replied {other}"))),
        })
    }

    /// The newest dead letters, newest first, older than the record id `before` (`(ms, seq)`)
    /// when given. With `tenant`, only that tenant's records (of its shard): the ids of its
    /// index (`migrations-lua/dlq_list.lua`), then their records in one pipeline; otherwise
    /// every shard's, one script call per shard. The Redis work is bounded by the page,
    /// whatever the shard holds.
    pub async fn dead_letters(
        &self,
        tenant: Option<&TenantId>,
        before: Option<(u64, u64)>,
        limit: usize,
    ) -> Result<DeadLetterPage, StoreError> {
        let shards: Vec<Shard> = match tenant {
            Some(t) => vec![self.shard_of(t)],
            None => self.shards.all().collect(),
        };
        // Nothing is older than the smallest id: the counts alone are read.
        let limit = if before == Some((0, 0)) { 0 } else { limit };
        let before = before
            .map(|(ms, seq)| format!("{ms}-{seq}"))
            .unwrap_or_default();
        // Every shard at the same time: a slow master delays the answer by its own time only.
        // A shard that fails fails the page (records left out would be skipped for good by the
        // `before` cursor).
        let reads = shards
            .into_iter()
            .map(|shard| self.dead_letters_in(shard, tenant, &before, limit));
        let mut page = DeadLetterPage::default();
        for part in futures_util::future::join_all(reads).await {
            let part = part?;
            page.held += part.held;
            page.evicted += part.evicted;
            page.records.extend(part.records);
            page.next = part.next;
        }
        if tenant.is_none() {
            // Record ids are "<ms>-<seq>": newest first across shards.
            page.records
                .sort_by_key(|d| std::cmp::Reverse(stream_id_key(&d.entry_id)));
            page.records.truncate(limit);
            page.next = (limit > 0 && page.records.len() == limit)
                .then(|| page.records.last().map(|r| r.entry_id.clone()))
                .flatten();
        }
        Ok(page)
    }

    /// Removes one dead-letter record of shard `shard` (`migrations-lua/dlq_dismiss.lua`),
    /// of `tenant` only when given. `Ok(false)`: no such record there (or another tenant's, or
    /// no such shard).
    pub async fn dismiss_dead_letter(
        &self,
        shard: u16,
        record: (u64, u64),
        tenant: Option<&TenantId>,
    ) -> Result<bool, StoreError> {
        let Some(shard) = self.shards.all().find(|s| s.number() == shard) else {
            return Ok(false);
        };
        let inv = self.shard_call(
            shard,
            &DlqDismissCall {
                dead_letters: shard.dead_letters(),
                stats: shard.stats(),
                dead_letter_holders: shard.dead_letter_holders(),
                record: format!("{}-{}", record.0, record.1),
                tenant: tenant.map(TenantId::as_str).unwrap_or(""),
            },
        );
        let mut c = self.conn();
        let removed: i64 = self.bounded(inv.invoke_async(&mut c)).await?;
        Ok(removed == 1)
    }

    /// One shard's part of `dead_letters` (`migrations-lua/dlq_list.lua`): up to `limit`
    /// records older than `before` (`""`: no bound), of `tenant` when given, and the counts.
    async fn dead_letters_in(
        &self,
        shard: Shard,
        tenant: Option<&TenantId>,
        before: &str,
        limit: usize,
    ) -> Result<DeadLetterPage, StoreError> {
        let inv = self.shard_call(
            shard,
            &DlqListCall {
                dead_letters: shard.dead_letters(),
                dead_letter_holders: shard.dead_letter_holders(),
                stats: shard.stats(),
                dead_letters_evicted: shard.dead_letters_evicted(),
                tenant: tenant.map(TenantId::as_str).unwrap_or(""),
                before,
                limit,
            },
        );
        let mut c = self.conn();
        let reply: Vec<Value> = self.bounded(inv.invoke_async(&mut c)).await?;
        let mut items = reply.into_iter();
        let mut count = |what: &str| -> Result<u64, StoreError> {
            let v = items
                .next()
                .ok_or_else(|| StoreError::Corrupt(format!("dlq_list replied no {what}")))?;
            Ok(redis::from_redis_value(v)?)
        };
        let (held, evicted) = (count("held")?, count("evicted")?);
        let mut records = Vec::new();
        let Some(tenant) = tenant else {
            while let (Some(id), Some(fields)) = (items.next(), items.next()) {
                let id: String = redis::from_redis_value(id)?;
                let fields: HashMap<String, String> = redis::from_redis_value(fields)?;
                records.push(dead_letter_of(shard.number(), id, fields));
            }
            return Ok(DeadLetterPage {
                records,
                held,
                evicted,
                next: None,
            });
        };
        // A tenant's page: the ids its index gave, then their records in one pipeline (read
        // natively, not through Lua). A record gone meanwhile (dismissed, evicted) is left
        // out; the cursor still follows the ids read, so the next page goes on from there.
        let ids: Vec<String> = items
            .map(redis::from_redis_value)
            .collect::<Result<_, _>>()?;
        if !ids.is_empty() {
            let mut p = redis::pipe();
            for id in &ids {
                p.cmd("XRANGE").arg(shard.dead_letters()).arg(id).arg(id);
            }
            let found: Vec<Vec<(String, HashMap<String, String>)>> =
                self.bounded(p.query_async(&mut c)).await?;
            for (entry_id, f) in found.into_iter().flatten() {
                if f.get("tenant_id").map(String::as_str) == Some(tenant.as_str()) {
                    records.push(dead_letter_of(shard.number(), entry_id, f));
                }
            }
        }
        let next = (limit > 0 && ids.len() == limit)
            .then(|| ids.last().cloned())
            .flatten();
        Ok(DeadLetterPage {
            records,
            held,
            evicted,
            next,
        })
    }

    /// Brings every shard's dead-letter indexes and counts in line with its stream where an
    /// older build left them behind (`migrations-lua/dlq_reindex.lua`): run when `serve` starts, one
    /// call per shard when there is nothing to do, else bounded batches of `batch` records,
    /// at most `max_calls` calls in all (tests interrupt it with a small number). Safe to run
    /// again, also from several processes at once. A shard that cannot be reached (its master
    /// down, frozen for a slot move) is left for the next connect and never fails this one.
    /// Returns the shards done or left alone, and the record ids indexed on the way.
    pub async fn reindex_dead_letters(&self, batch: usize, max_calls: usize) -> Reindexed {
        let mut out = Reindexed::default();
        let mut calls = 0usize;
        'shards: for shard in self.shards.all() {
            let mut cursor = String::new();
            loop {
                if calls >= max_calls {
                    out.unfinished.push(shard.number());
                    continue 'shards;
                }
                calls += 1;
                let inv = self.shard_call(
                    shard,
                    &DlqReindexCall {
                        dead_letters: shard.dead_letters(),
                        dead_letters_indexed: shard.dead_letters_indexed(),
                        dead_letter_holders: shard.dead_letter_holders(),
                        dead_letters_rebuilt: shard.dead_letters_rebuilt(),
                        cursor: &cursor,
                        batch: batch.max(1),
                    },
                );
                let mut c = self.conn();
                let reply: Result<(String, u64), _> = self.bounded(inv.invoke_async(&mut c)).await;
                let (next, n) = match reply {
                    Ok(r) => r,
                    Err(e) => {
                        tracing::warn!(
                            shard = shard.number(),
                            error = %e,
                            "dead-letter records not reindexed now (left for the next start)"
                        );
                        out.unfinished.push(shard.number());
                        continue 'shards;
                    }
                };
                out.indexed += n;
                if next == "done" {
                    break;
                }
                cursor = next;
            }
        }
        out
    }
}

fn stream_id_key(id: &str) -> (u64, u64) {
    let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
    (ms.parse().unwrap_or(0), seq.parse().unwrap_or(0))
}

fn dead_letter_of(shard: u16, entry_id: String, mut f: HashMap<String, String>) -> DeadLetter {
    let mut take = |k: &str| f.remove(k).unwrap_or_default();
    let at = take("at");
    let tenant = take("tenant_id");
    let flow = take("flow_id");
    DeadLetter {
        shard,
        execution_id: take("execution_id"),
        reason: take("reason"),
        attempts: take("attempts").parse().unwrap_or(0),
        source_entry: take("source_entry"),
        message: take("message"),
        tenant_id: (!tenant.is_empty()).then_some(tenant),
        flow_id: (!flow.is_empty()).then_some(flow),
        dead_lettered_at: crate::domain::rfc3339_from_ms(&at).unwrap_or(at),
        entry_id,
    }
}

script_call! {
    /// `migrations-lua/retry.lua`: re-queues a failed or cancelled execution.
    pub(super) struct RetryCall<'a> {
        keys { row: Vec<u8>, cfg, slots, waiting, listing, runnable }
        args { tenant: &'a str, id: super::keys::StoredId, max_bytes: u64, max_retained: u64 }
    }
}

script_call! {
    /// `migrations-lua/dlq_dismiss.lua`: removes one dead-letter record.
    pub(super) struct DlqDismissCall<'a> {
        keys { dead_letters, stats, dead_letter_holders }
        args { record: String, tenant: &'a str }
    }
}

script_call! {
    /// `migrations-lua/dlq_list.lua`: one page of a shard's dead letters (of one tenant).
    pub(super) struct DlqListCall<'a> {
        keys { dead_letters, dead_letter_holders, stats, dead_letters_evicted }
        args { tenant: &'a str, before: &'a str, limit: usize }
    }
}

script_call! {
    /// `migrations-lua/dlq_reindex.lua`: one batch of a shard's dead-letter rebuild.
    pub(super) struct DlqReindexCall<'a> {
        keys { dead_letters, dead_letters_indexed, dead_letter_holders, dead_letters_rebuilt }
        args { cursor: &'a str, batch: usize }
    }
}
