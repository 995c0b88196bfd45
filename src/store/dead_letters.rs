//! Executions that failed for good: retrying one (`migrations-lua/retry.lua`, same id, fresh
//! attempts) and reading the shards' dead-letter streams, newest first.

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
                queued: shard.status_index(tenant, Status::Queued),
                runnable: shard.runnable(),
                tenant: tenant.as_str(),
                id: id.as_str(),
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
    /// when given. With `tenant`, only that tenant's records (of its shard); otherwise every
    /// shard's.
    pub async fn dead_letters(
        &self,
        tenant: Option<&TenantId>,
        before: Option<(u64, u64)>,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, StoreError> {
        // Nothing is older than the smallest id (and Redis refuses an exclusive range below it).
        if before == Some((0, 0)) {
            return Ok(Vec::new());
        }
        let shards: Vec<Shard> = match tenant {
            Some(t) => vec![self.shard_of(t)],
            None => self.shards.all().collect(),
        };
        let max = before
            .map(|(ms, seq)| format!("({ms}-{seq}"))
            .unwrap_or_else(|| "+".into());
        // Every shard at the same time: a slow master delays the answer by its own time only.
        // A shard that fails fails the page (records left out would be skipped for good by the
        // `before` cursor).
        let reads = shards.into_iter().map(|shard| {
            let max = max.clone();
            async move {
                match tenant {
                    Some(t) => {
                        self.tenant_dead_letters(shard, t, before, &max, limit)
                            .await
                    }
                    None => self.shard_dead_letters(shard, None, &max, limit).await,
                }
            }
        });
        let mut out = Vec::new();
        for page in futures_util::future::join_all(reads).await {
            out.extend(page?);
        }
        // Record ids are "<ms>-<seq>": newest first across shards.
        out.sort_by_key(|d| std::cmp::Reverse(stream_id_key(&d.entry_id)));
        out.truncate(limit);
        Ok(out)
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
                record: format!("{}-{}", record.0, record.1),
                tenant: tenant.map(TenantId::as_str).unwrap_or(""),
            },
        );
        let mut c = self.conn();
        let removed: i64 = self.bounded(inv.invoke_async(&mut c)).await?;
        Ok(removed == 1)
    }

    /// Up to `limit` dead letters of `tenant` in its shard, newest first, below `max` (an
    /// XREVRANGE bound; `before` is the same bound as numbers). Read through the tenant's index
    /// (`Shard::tenant_dead_letters`): a page of ids, then their records in one pipeline — what
    /// is read is the tenant's own, however many records its shard neighbours have. Ids whose
    /// record is gone are skipped (at most a few index pages per call). Records older than
    /// the index (`Shard::dead_letters_indexed`) are found by the scan of a build without it.
    async fn tenant_dead_letters(
        &self,
        shard: Shard,
        tenant: &TenantId,
        before: Option<(u64, u64)>,
        max: &str,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, StoreError> {
        let mut c = self.conn();
        let index = shard.tenant_dead_letters(tenant);
        let first: Option<String> = self
            .bounded(
                redis::cmd("GET")
                    .arg(shard.dead_letters_indexed())
                    .query_async(&mut c),
            )
            .await?;
        let mut out = Vec::new();
        let mut upper = max.to_owned();
        if first.is_some() {
            for _ in 0..8 {
                let ids: Vec<(String, Value)> = self
                    .bounded(
                        redis::cmd("XREVRANGE")
                            .arg(&index)
                            .arg(&upper)
                            .arg("-")
                            .arg("COUNT")
                            .arg(limit - out.len())
                            .query_async(&mut c),
                    )
                    .await?;
                let Some((last, _)) = ids.last() else { break };
                upper = format!("({last}");
                let asked = limit - out.len();
                let mut p = redis::pipe();
                for (id, _) in &ids {
                    p.cmd("XRANGE").arg(shard.dead_letters()).arg(id).arg(id);
                }
                let records: Vec<Vec<(String, HashMap<String, String>)>> =
                    self.bounded(p.query_async(&mut c)).await?;
                for (entry_id, f) in records.into_iter().flatten() {
                    if f.get("tenant_id").map(String::as_str) == Some(tenant.as_str()) {
                        out.push(dead_letter_of(shard.number(), entry_id, f));
                    }
                }
                if out.len() >= limit || ids.len() < asked {
                    break;
                }
            }
        }
        if out.len() >= limit {
            return Ok(out);
        }
        // Records from before the index: below its first id (and below `before`).
        let legacy_max = match &first {
            None => max.to_owned(),
            Some(first) if before.is_some_and(|b| b <= stream_id_key(first)) => max.to_owned(),
            Some(first) => format!("({first}"),
        };
        out.extend(
            self.shard_dead_letters(shard, Some(tenant), &legacy_max, limit - out.len())
                .await?,
        );
        Ok(out)
    }

    /// Up to `limit` dead letters of one shard (of `tenant` only, when given), newest first,
    /// below `max` (an XREVRANGE bound), by scanning the shard's stream: every shard's for the
    /// platform admin, and a tenant's records written before its index existed.
    async fn shard_dead_letters(
        &self,
        shard: Shard,
        tenant: Option<&TenantId>,
        max: &str,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, StoreError> {
        let mut out = Vec::new();
        let mut c = self.conn();
        // A tenant's records are mixed with its shard neighbours': read in bounded pages
        // until `limit` of its own are found or the stream is exhausted.
        let mut upper = max.to_owned();
        let mut found = 0;
        for _ in 0..64 {
            let page: Vec<(String, HashMap<String, String>)> = self
                .bounded(
                    redis::cmd("XREVRANGE")
                        .arg(shard.dead_letters())
                        .arg(&upper)
                        .arg("-")
                        .arg("COUNT")
                        .arg(limit.max(1) * 4)
                        .query_async(&mut c),
                )
                .await?;
            let Some((last, _)) = page.last() else { break };
            upper = format!("({last}");
            let n = page.len();
            for (entry_id, f) in page {
                if let Some(t) = tenant
                    && f.get("tenant_id").map(String::as_str) != Some(t.as_str())
                {
                    continue;
                }
                out.push(dead_letter_of(shard.number(), entry_id, f));
                found += 1;
            }
            if found >= limit || n < limit.max(1) * 4 {
                break;
            }
        }
        Ok(out)
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
        keys { row, cfg, slots, waiting, queued, runnable }
        args { tenant: &'a str, id: &'a str, max_bytes: u64, max_retained: u64 }
    }
}

script_call! {
    /// `migrations-lua/dlq_dismiss.lua`: removes one dead-letter record.
    pub(super) struct DlqDismissCall<'a> {
        keys { dead_letters, stats }
        args { record: String, tenant: &'a str }
    }
}
