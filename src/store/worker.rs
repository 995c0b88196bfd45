//! The worker side of the store: starting, heartbeating, completing and reclaiming executions,
//! retries, dead letters, queue statistics and the sweeper's repairs. Each call is one script or
//! one pipeline on one shard.

use std::collections::HashMap;
use std::time::Duration;

use redis::Value;
use serde_json::Value as Json;

use super::keys::{self, WORKER_GROUP};
use super::{Admission, Shard, Store, StoreError, execution_from, split_tag};
use crate::admission::{ExecutionId, Status, TenantId};

/// An execution a worker has just started (it holds the lease for `attempt`).
#[derive(Debug, Clone)]
pub struct Started {
    pub shard: Shard,
    pub id: ExecutionId,
    /// The fencing token of this run: heartbeats and the completion name it. It grows with
    /// every start of the execution and never repeats, also across retries.
    pub fence: u64,
    /// Starts of the current run of the execution, 1 on the first (a retry starts over).
    pub attempt: u32,
    pub max_attempts: u32,
    pub tenant: String,
    pub flow: String,
    pub version: Option<String>,
    pub params: Json,
}

/// What a heartbeat learned about one held execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseState {
    /// Extended; keep going.
    Held,
    /// Extended, but a cancel was requested: stop and finish as cancelled.
    CancelRequested,
    /// This attempt is no longer current: stop; its result will be refused.
    Lost,
}

/// How an attempt ended, as the worker reports it.
#[derive(Debug, Clone)]
pub enum Outcome {
    Completed(Json),
    Failed {
        kind: String,
        message: String,
        /// `Some(backoff)` when another attempt may follow (if any are left).
        retry_after: Option<Duration>,
    },
    Cancelled,
    /// The worker is shutting down: put it back for another worker now (the run does not
    /// count as an attempt).
    Released,
    /// The worker could not renew the lease in time and stopped the run: handled as an
    /// expired lease would be (re-queued as a counted attempt, or dead-lettered).
    Abandoned,
}

/// What the store did with a reported outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Completion {
    /// The run was not current (fenced); nothing changed.
    Stale,
    /// This run's report had been applied already (an earlier reply was lost).
    Repeat,
    /// The execution was force-deleted while it ran; its slot is free now.
    Deleted,
    /// Abandoned: re-queued, dead-lettered or cancelled as an expired lease would be.
    Recovered,
    /// Terminal now, in this status.
    Done(Status),
    /// Failed with attempts exhausted: dead-lettered.
    DeadLettered,
    /// Failed; queued again after the backoff.
    Retrying,
    /// Back on the ready stream.
    Released,
}

/// Result of `Store::retry`.
pub type RetryResult = Result<Option<Admission>, NotRetryable>;

/// The execution is in a status that cannot be retried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotRetryable(pub String);

/// One dead-letter record.
#[derive(Debug, Clone)]
pub struct DeadLetter {
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

/// Counters and sizes of one shard.
#[derive(Debug, Clone)]
pub struct ShardStats {
    pub shard: u16,
    /// Entries on the ready stream (dispatched, not yet started, plus running ones).
    pub ready: u64,
    /// Entries read by a worker and not yet acknowledged (= executions running).
    pub pending: u64,
    /// Leases held.
    pub leases: u64,
    /// Failed executions waiting out a retry backoff.
    pub delayed: u64,
    pub dead_letters: u64,
    /// Counters since the shard's creation: completed, failed, cancelled, reclaimed, fenced,
    /// dead_lettered, dlq_evicted.
    pub counters: HashMap<String, u64>,
}

impl Store {
    /// Creates the `workers` consumer group on every ready stream (idempotent).
    pub async fn ensure_groups(&self) -> Result<(), StoreError> {
        for shard in self.shards.all() {
            self.ensure_group(shard).await?;
        }
        Ok(())
    }

    /// Creates the `workers` consumer group on one shard's ready stream (idempotent).
    pub async fn ensure_group(&self, shard: Shard) -> Result<(), StoreError> {
        let mut c = self.conn();
        let r: redis::RedisResult<()> = self
            .bounded_raw(
                redis::cmd("XGROUP")
                    .arg("CREATE")
                    .arg(shard.ready())
                    .arg(WORKER_GROUP)
                    .arg("0")
                    .arg("MKSTREAM")
                    .query_async(&mut c),
            )
            .await?;
        match r {
            Ok(()) => Ok(()),
            Err(e) if e.code() == Some("BUSYGROUP") => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Reads and starts up to `count` executions of one shard for `consumer`.
    ///
    /// An error does not mean nothing started: the call may have run with its answer lost.
    /// Call `adopt` before starting anything else in that shard.
    pub async fn start(
        &self,
        shard: Shard,
        consumer: &str,
        count: usize,
        lease_ttl: Duration,
    ) -> Result<Vec<Started>, StoreError> {
        let mut inv = self.scripts.start.key(shard.ready());
        self.common_args(&mut inv, shard);
        inv.arg(consumer)
            .arg(count.max(1))
            .arg(lease_ttl.as_millis() as u64)
            .arg(self.dlq_cap());
        let mut c = self.conn();
        let reply: Vec<RunReply> = match self.bounded(inv.invoke_async(&mut c)).await {
            Err(StoreError::Corrupt(m)) if m.contains("NOGROUP") => {
                self.ensure_group(shard).await?;
                return Ok(Vec::new());
            }
            other => other?,
        };
        runs_of(shard, reply)
    }

    /// Every run `consumer` holds in one shard according to Redis, their leases extended (see
    /// `migrations-lua/adopt.lua`): what a lost `start` answer started is among them.
    pub async fn adopt(
        &self,
        shard: Shard,
        consumer: &str,
        most: usize,
        lease_ttl: Duration,
    ) -> Result<Vec<Started>, StoreError> {
        let mut inv = self.scripts.adopt.key(shard.ready());
        self.common_args(&mut inv, shard);
        inv.arg(consumer)
            .arg(most.max(1))
            .arg(lease_ttl.as_millis() as u64);
        let mut c = self.conn();
        let reply: Vec<RunReply> = self.bounded(inv.invoke_async(&mut c)).await?;
        runs_of(shard, reply)
    }

    /// Extends the leases `consumer` holds as `held` (id, fence) in one shard; one answer
    /// per pair.
    pub async fn heartbeat(
        &self,
        shard: Shard,
        consumer: &str,
        held: &[(ExecutionId, u64)],
        lease_ttl: Duration,
    ) -> Result<Vec<LeaseState>, StoreError> {
        if held.is_empty() {
            return Ok(Vec::new());
        }
        let mut inv = self.scripts.heartbeat.key(shard.leases());
        self.common_args(&mut inv, shard);
        inv.arg(lease_ttl.as_millis() as u64).arg(consumer);
        for (id, fence) in held {
            inv.arg(id.as_str()).arg(*fence);
        }
        let mut c = self.conn();
        let reply: Vec<String> = self.bounded(inv.invoke_async(&mut c)).await?;
        Ok(reply
            .iter()
            .map(|s| match s.as_str() {
                "ok" => LeaseState::Held,
                "cancel" => LeaseState::CancelRequested,
                _ => LeaseState::Lost,
            })
            .collect())
    }

    /// Reports how the run `fence` of `consumer` ended; refused (`Stale`) unless that run is
    /// current. Safe to repeat after a lost answer (`Repeat`).
    pub async fn complete(
        &self,
        shard: Shard,
        id: &ExecutionId,
        fence: u64,
        consumer: &str,
        outcome: &Outcome,
    ) -> Result<Completion, StoreError> {
        let (name, output, kind, message, backoff) = match outcome {
            Outcome::Completed(v) => ("completed", v.to_string(), "", "", String::new()),
            Outcome::Failed {
                kind,
                message,
                retry_after,
            } => (
                "failed",
                String::new(),
                kind.as_str(),
                message.as_str(),
                retry_after
                    .map(|d| d.as_millis().to_string())
                    .unwrap_or_default(),
            ),
            Outcome::Cancelled => ("cancelled", String::new(), "", "", String::new()),
            Outcome::Released => ("released", String::new(), "", "", String::new()),
            Outcome::Abandoned => ("abandoned", String::new(), "", "", String::new()),
        };
        let mut inv = self.scripts.complete.key(shard.row(id));
        self.common_args(&mut inv, shard);
        inv.arg(id.as_str())
            .arg(fence)
            .arg(consumer)
            .arg(name)
            .arg(output)
            .arg(kind)
            .arg(message)
            .arg(backoff)
            .arg(self.dlq_cap());
        let mut c = self.conn();
        let reply: Vec<Value> = self.bounded(inv.invoke_async(&mut c)).await?;
        let (tag, rest) = split_tag(reply)?;
        Ok(match tag.as_str() {
            "stale" => Completion::Stale,
            "repeat" => Completion::Repeat,
            "deleted" => Completion::Deleted,
            "recovered" => Completion::Recovered,
            "dead_lettered" => Completion::DeadLettered,
            "retrying" => Completion::Retrying,
            "released" => Completion::Released,
            "done" => {
                let s: String = redis::from_redis_value(
                    rest.into_iter()
                        .next()
                        .ok_or_else(|| StoreError::Corrupt("done without status".into()))?,
                )?;
                Completion::Done(
                    Status::parse(&s).ok_or_else(|| StoreError::Corrupt(format!("status {s}")))?,
                )
            }
            other => return Err(StoreError::Corrupt(format!("complete replied {other}"))),
        })
    }

    /// Recovers up to `batch` executions of one shard whose lease expired; returns
    /// (re-queued, dead-lettered).
    pub async fn reclaim(&self, shard: Shard, batch: usize) -> Result<(u64, u64), StoreError> {
        let mut inv = self.scripts.reclaim.key(shard.leases());
        self.common_args(&mut inv, shard);
        inv.arg(batch.max(1)).arg(self.dlq_cap());
        let mut c = self.conn();
        self.bounded(inv.invoke_async(&mut c)).await
    }

    /// Re-queues a failed or cancelled execution with fresh attempts. `Ok(None)`: not found.
    pub async fn retry(
        &self,
        tenant: &TenantId,
        id: &ExecutionId,
    ) -> Result<RetryResult, StoreError> {
        let shard = self.shards.shard_of(tenant);
        let mut inv = self.scripts.retry.key(shard.row(id));
        self.common_args(&mut inv, shard);
        inv.arg(tenant.as_str()).arg(id.as_str());
        let mut c = self.conn();
        let reply: Vec<Value> = self.bounded(inv.invoke_async(&mut c)).await?;
        let (tag, rest) = split_tag(reply)?;
        Ok(match tag.as_str() {
            "not_found" => Ok(None),
            "not_retryable" => Err(NotRetryable(
                rest.into_iter()
                    .next()
                    .map(redis::from_redis_value)
                    .transpose()?
                    .unwrap_or_default(),
            )),
            "disabled" => Ok(Some(Admission::Disabled)),
            "full" => Ok(Some(Admission::QueueFull {
                waiting: rest
                    .into_iter()
                    .next()
                    .map(redis::from_redis_value)
                    .transpose()?
                    .unwrap_or_default(),
            })),
            "ok" => Ok(Some(Admission::Created(execution_from(rest, false)?))),
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
            Some(t) => vec![self.shards.shard_of(t)],
            None => self.shards.all().collect(),
        };
        let max = before
            .map(|(ms, seq)| format!("({ms}-{seq}"))
            .unwrap_or_else(|| "+".into());
        let mut out = Vec::new();
        let mut c = self.conn();
        for shard in shards {
            // A tenant's records are mixed with its shard neighbours': read in bounded pages
            // until `limit` of its own are found or the stream is exhausted.
            let mut upper = max.clone();
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
                    out.push(dead_letter_of(entry_id, f));
                    found += 1;
                }
                if found >= limit || n < limit.max(1) * 4 {
                    break;
                }
            }
        }
        // Record ids are "<ms>-<seq>": newest first across shards.
        out.sort_by_key(|d| std::cmp::Reverse(stream_id_key(&d.entry_id)));
        out.truncate(limit);
        Ok(out)
    }

    /// Tries to become the sweeper for `hold`; true when this process should sweep now.
    pub async fn take_sweeper_turn(&self, owner: &str, hold: Duration) -> Result<bool, StoreError> {
        let mut c = self.conn();
        let r: Option<String> = self
            .bounded(
                redis::cmd("SET")
                    .arg(keys::sweeper_lock())
                    .arg(owner)
                    .arg("NX")
                    .arg("PX")
                    .arg(hold.as_millis() as u64)
                    .query_async(&mut c),
            )
            .await?;
        Ok(r.is_some())
    }

    /// Ends this process's sweeper turn, so the next interval's turn is free to take.
    pub async fn end_sweeper_turn(&self, owner: &str) -> Result<(), StoreError> {
        static UNLOCK: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
            redis::Script::new(include_str!("../../migrations-lua/sweeper_unlock.lua"))
        });
        let mut inv = UNLOCK.key(keys::sweeper_lock());
        inv.arg(owner);
        let mut c = self.conn();
        let _: i64 = self.bounded(inv.invoke_async(&mut c)).await?;
        Ok(())
    }

    /// What the sweeper walks: every tenant of every shard, with the flows it admitted.
    pub async fn sweep_targets(&self) -> Result<Vec<SweepTarget>, StoreError> {
        let mut out = Vec::new();
        for shard in self.shards.all() {
            out.extend(self.shard_sweep_targets(shard).await?);
        }
        Ok(out)
    }

    /// What the sweeper walks in one shard: its tenants, with the flows each admitted.
    pub async fn shard_sweep_targets(&self, shard: Shard) -> Result<Vec<SweepTarget>, StoreError> {
        let mut out = Vec::new();
        let mut c = self.conn();
        let tenants: Vec<String> = self
            .bounded(
                redis::cmd("SMEMBERS")
                    .arg(shard.tenants())
                    .query_async(&mut c),
            )
            .await?;
        for tenant in tenants {
            let Ok(tenant) = TenantId::parse(&tenant) else {
                continue;
            };
            let flows: Vec<String> = self
                .bounded(
                    redis::cmd("SMEMBERS")
                        .arg(shard.flows(&tenant))
                        .query_async(&mut c),
                )
                .await?;
            out.push(SweepTarget {
                shard,
                tenant,
                flows,
            });
        }
        Ok(out)
    }

    /// One batch of repairs (see `migrations-lua/sweep.lua`): returns the next cursor ("0"
    /// when the walk is done) and the number of repairs.
    pub async fn sweep_step(
        &self,
        step: &SweepStep,
        cursor: &str,
        batch: usize,
    ) -> Result<(String, u64), StoreError> {
        let shard = step.shard;
        let mut inv = self.scripts.sweep.key(shard.tenant_config(&step.tenant));
        self.common_args(&mut inv, shard);
        inv.arg(step.tenant.as_str())
            .arg(step.mode.as_str())
            .arg(step.status.map(Status::as_str).unwrap_or(""))
            .arg(step.flow.as_deref().unwrap_or(""))
            .arg(cursor)
            .arg(batch);
        let mut c = self.conn();
        self.bounded(inv.invoke_async(&mut c)).await
    }
}

/// A tenant the sweeper walks.
#[derive(Debug, Clone)]
pub struct SweepTarget {
    pub shard: Shard,
    pub tenant: TenantId,
    pub flows: Vec<String>,
}

/// What one sweep walk covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SweepMode {
    /// The tenant's slot set.
    Slots,
    /// The tenant's waiting set.
    Waiting,
    /// One status index (of the tenant, or of one of its flows).
    Index,
}

impl SweepMode {
    /// The mode's name in `sweep.lua` and in the repair counters.
    pub fn as_str(self) -> &'static str {
        match self {
            SweepMode::Slots => "slots",
            SweepMode::Waiting => "waiting",
            SweepMode::Index => "index",
        }
    }
}

/// One structure to walk with a SCAN cursor.
#[derive(Debug, Clone)]
pub struct SweepStep {
    pub shard: Shard,
    pub tenant: TenantId,
    pub mode: SweepMode,
    pub status: Option<Status>,
    pub flow: Option<String>,
}

impl SweepTarget {
    /// Every walk this tenant needs: slots, waiting, and each status index with and without
    /// flow.
    pub fn steps(&self) -> Vec<SweepStep> {
        let step = |mode, status, flow| SweepStep {
            shard: self.shard,
            tenant: self.tenant.clone(),
            mode,
            status,
            flow,
        };
        let mut v = vec![
            step(SweepMode::Slots, None, None),
            step(SweepMode::Waiting, None, None),
        ];
        for status in Status::ALL {
            v.push(step(SweepMode::Index, Some(status), None));
            for f in &self.flows {
                v.push(step(SweepMode::Index, Some(status), Some(f.clone())));
            }
        }
        v
    }
}

/// A run as `start.lua` and `adopt.lua` report it:
/// (id, fence, attempt, tenant, flow, version or '', params, max_attempts).
type RunReply = (String, u64, u32, String, String, String, String, u32);

fn runs_of(shard: Shard, reply: Vec<RunReply>) -> Result<Vec<Started>, StoreError> {
    reply
        .into_iter()
        .map(
            |(id, fence, attempt, tenant, flow, version, params, max_attempts)| {
                Ok(Started {
                    shard,
                    id: ExecutionId::parse(&id)
                        .map_err(|_| StoreError::Corrupt(format!("bad id {id}")))?,
                    fence,
                    attempt,
                    max_attempts,
                    tenant,
                    flow,
                    version: (!version.is_empty()).then_some(version),
                    params: serde_json::from_str(&params)
                        .map_err(|e| StoreError::Corrupt(format!("params of {id}: {e}")))?,
                })
            },
        )
        .collect()
}

fn stream_id_key(id: &str) -> (u64, u64) {
    let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
    (ms.parse().unwrap_or(0), seq.parse().unwrap_or(0))
}

fn dead_letter_of(entry_id: String, mut f: HashMap<String, String>) -> DeadLetter {
    let mut take = |k: &str| f.remove(k).unwrap_or_default();
    let at = take("at");
    let tenant = take("tenant_id");
    let flow = take("flow_id");
    DeadLetter {
        execution_id: take("execution_id"),
        reason: take("reason"),
        attempts: take("attempts").parse().unwrap_or(0),
        source_entry: take("source_entry"),
        message: take("message"),
        tenant_id: (!tenant.is_empty()).then_some(tenant),
        flow_id: (!flow.is_empty()).then_some(flow),
        dead_lettered_at: crate::admission::rfc3339_from_ms(&at).unwrap_or(at),
        entry_id,
    }
}
