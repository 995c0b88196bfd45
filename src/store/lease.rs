//! The worker's side of an execution's lease (`migrations-lua/start.lua`, `adopt.lua`,
//! `heartbeat.lua`, `complete.lua`, `reclaim.lua`): starting what a worker reads, finding what
//! a lost start answer started, keeping leases alive, reporting how a run ended, and
//! recovering runs whose lease expired. Each of those is one script on one shard (a completion
//! may also start the next run on the slot it frees: `complete_and_start`). Every call that
//! can start runs also says when the shard's earliest scheduled execution is due and how much
//! weight its runnable tenants have (`StartBatch`), so the worker sleeps on its own timer and
//! shares its slots between shards by weight.

use std::time::Duration;

use serde_json::Value as Json;

use redis::Value;

use super::call::{script_call, script_group};
use super::commit::{Item, Outcome as Sent};
use super::{Shard, Store, StoreError};
use crate::domain::{ExecutionId, FlowId, Status, TenantId, TraceContext};

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
    pub tenant: TenantId,
    pub flow: FlowId,
    pub version: Option<String>,
    pub params: Json,
    /// The W3C trace context its admission carried, handed to the handler.
    pub trace: Option<TraceContext>,
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
    /// Failed; scheduled again after the backoff (its slot is free meanwhile).
    Retrying,
    /// Back in its tenant's order, where it stood.
    Released,
}

impl Store {
    /// Picks (by fair share) and starts up to `count` executions of one shard for `consumer`.
    ///
    /// An error does not mean nothing started: the call may have run with its answer lost.
    /// Call `adopt` before starting anything else in that shard.
    ///
    /// `call` numbers the worker's start-capable calls in the shard (1, 2, …, rising; 0 for
    /// none): a numbered call that reaches Redis after an `adopt` whose barrier covers it
    /// starts nothing (see `Shard::adopted`).
    pub async fn start(
        &self,
        shard: Shard,
        consumer: &str,
        count: usize,
        lease_ttl: Duration,
        call: u64,
    ) -> Result<StartBatch, StoreError> {
        self.start_for(shard, consumer, count, lease_ttl, call, &[])
            .await
    }

    /// `start`, for the tenants `only` of the shard (none: every tenant): a pull worker that
    /// serves some tenants. The fair share holds among them.
    pub async fn start_for(
        &self,
        shard: Shard,
        consumer: &str,
        count: usize,
        lease_ttl: Duration,
        call: u64,
        only: &[TenantId],
    ) -> Result<StartBatch, StoreError> {
        let inv = self.shard_call(
            shard,
            &StartCall {
                runnable: shard.runnable(),
                delayed: shard.delayed(),
                leases: shard.leases(),
                dead_letters: shard.dead_letters(),
                stats: shard.stats(),
                dead_letters_indexed: shard.dead_letters_indexed(),
                adopted: shard.adopted(consumer),
                consumer,
                count: count.max(1),
                lease_ttl_ms: lease_ttl.as_millis() as u64,
                dlq_cap: self.dlq_cap(),
                call,
                start_log: self.start_log(),
                only: only.iter().map(TenantId::as_str).collect(),
            },
        );
        let mut c = self.conn();
        let (more, runs, next_due, weight): (u8, Vec<Value>, i64, u64) =
            self.bounded(inv.invoke_async(&mut c)).await?;
        Ok(StartBatch {
            started: runs_of(shard, runs)?,
            more: more == 1,
            next_due: due_in(next_due),
            weight,
        })
    }

    /// Every run `consumer` holds in one shard according to Redis, their leases extended (see
    /// `migrations-lua/adopt.lua`): what a lost `start` answer started is among them.
    ///
    /// `barrier` is the number of the worker's last start-capable call in the shard: every call
    /// up to it whose answer was lost either ran before this one (and what it started is in the
    /// answer) or starts nothing when it runs later.
    pub async fn adopt(
        &self,
        shard: Shard,
        consumer: &str,
        most: usize,
        lease_ttl: Duration,
        barrier: u64,
    ) -> Result<Vec<Started>, StoreError> {
        self.adopt_for(shard, consumer, most, lease_ttl, barrier, &[])
            .await
    }

    /// `adopt`, for the runs of the tenants `only` (none: every run): a pull lease that serves
    /// some tenants. Runs of other tenants are neither handed out nor extended.
    pub async fn adopt_for(
        &self,
        shard: Shard,
        consumer: &str,
        most: usize,
        lease_ttl: Duration,
        barrier: u64,
        only: &[TenantId],
    ) -> Result<Vec<Started>, StoreError> {
        let inv = self.shard_call(
            shard,
            &AdoptCall {
                held: shard.held(consumer),
                leases: shard.leases(),
                adopted: shard.adopted(consumer),
                consumer,
                most: most.max(1),
                lease_ttl_ms: lease_ttl.as_millis() as u64,
                barrier,
                only: only.iter().map(TenantId::as_str).collect(),
            },
        );
        let mut c = self.conn();
        let reply: Vec<Value> = self.bounded(inv.invoke_async(&mut c)).await?;
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
        self.heartbeat_for(shard, consumer, None, held, lease_ttl)
            .await
    }

    /// `heartbeat` for runs of `tenant` only (a pull worker's): a run of another tenant is
    /// `Lost` to it, whoever holds it.
    pub async fn heartbeat_for(
        &self,
        shard: Shard,
        consumer: &str,
        tenant: Option<&TenantId>,
        held: &[(ExecutionId, u64)],
        lease_ttl: Duration,
    ) -> Result<Vec<LeaseState>, StoreError> {
        if held.is_empty() {
            return Ok(Vec::new());
        }
        let inv = self.shard_call(
            shard,
            &HeartbeatCall {
                leases: shard.leases(),
                rows: held.iter().map(|(id, _)| shard.row(id)).collect(),
                lease_ttl_ms: lease_ttl.as_millis() as u64,
                consumer,
                tenant: tenant.map_or("", TenantId::as_str),
                held: held
                    .iter()
                    .map(|(id, fence)| (shard.stored_id(id), *fence))
                    .collect(),
            },
        );
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
        let (done, _) = self
            .complete_and_start(shard, id, fence, consumer, outcome, 0, Duration::ZERO, 0)
            .await?;
        Ok(done)
    }

    /// `complete` for a run of `tenant` only (a pull worker's): the report of a run of another
    /// tenant is refused (`Stale`), whoever holds it.
    pub async fn complete_for(
        &self,
        shard: Shard,
        id: &ExecutionId,
        fence: u64,
        consumer: &str,
        tenant: &TenantId,
        outcome: &Outcome,
    ) -> Result<Completion, StoreError> {
        let report = Report {
            id,
            fence,
            consumer,
            tenant: Some(tenant),
            outcome,
        };
        let (done, _) = self
            .report_and_start(shard, report, 0, Duration::ZERO, 0)
            .await?;
        Ok(done)
    }

    /// Reports how a run ended, as `complete` does, and in the same call starts up to `chain`
    /// executions of the shard for `consumer` (leases of `lease_ttl`) on the slot it frees, as
    /// `start` would (nothing starts after a `Stale` or `Repeat` report). An error leaves open
    /// whether it started any: the caller then adopts before it starts more in the shard.
    /// `call` numbers the call as `start`'s does. The report goes with the others of the
    /// shard that this process sends meanwhile, in one call (see `commit`).
    #[allow(clippy::too_many_arguments)]
    pub async fn complete_and_start(
        &self,
        shard: Shard,
        id: &ExecutionId,
        fence: u64,
        consumer: &str,
        outcome: &Outcome,
        chain: usize,
        lease_ttl: Duration,
        call: u64,
    ) -> Result<(Completion, StartBatch), StoreError> {
        let report = Report {
            id,
            fence,
            consumer,
            tenant: None,
            outcome,
        };
        self.report_and_start(shard, report, chain, lease_ttl, call)
            .await
    }

    /// What `complete_and_start` and `complete_for` send: one report, its chain.
    async fn report_and_start(
        &self,
        shard: Shard,
        report: Report<'_>,
        chain: usize,
        lease_ttl: Duration,
        call: u64,
    ) -> Result<(Completion, StartBatch), StoreError> {
        let Report {
            id,
            fence,
            consumer,
            tenant,
            outcome,
        } = report;
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
        let item: Item = ReportItem {
            row: shard.row(id),
            adopted: shard.adopted(consumer),
            id: shard.stored_id(id),
            fence,
            consumer,
            outcome: name,
            output: &output,
            kind,
            message,
            backoff: &backoff,
            chain,
            lease_ttl_ms: lease_ttl.as_millis() as u64,
            call,
            tenant: tenant.map_or("", TenantId::as_str),
        }
        .into();
        // Grouped with the reports of this process's other runs of the shard that end while a
        // call is in flight (see `commit`).
        let reply = match self.completions.submit(shard, item, None).await {
            Sent::Reply(reply) => reply,
            Sent::Lost(why) => return Err(StoreError::Unavailable(why)),
            Sent::Failed(e) => return Err(e),
            // Only an admission (one with a ticket) is ever withdrawn.
            Sent::Withdrawn => {
                return Err(StoreError::Corrupt("a report was withdrawn".into()));
            }
        };
        // A report that changed nothing alone in its call, and a pull worker's report (it
        // names its tenant and chains nothing), are answered by their outcome alone
        // (`migrations-lua/complete.lua`): nothing started, and nothing said of the shard.
        if reply.len() <= 2 {
            let mut parts = reply.into_iter();
            let what: String = match parts.next() {
                Some(what) => redis::from_redis_value(what)?,
                None => return Err(StoreError::Corrupt("complete replied nothing".into())),
            };
            let detail: String = match parts.next() {
                Some(detail) => redis::from_redis_value(detail)?,
                None => String::new(),
            };
            return Ok((completion_of(&what, &detail)?, StartBatch::default()));
        }
        // {what, detail, started} and the call's shard part, which the commit layer handed
        // to this report (`complete.lua` answers it once per call).
        let (what, detail, runs, next_due, weight): (String, String, Vec<Value>, i64, u64) =
            redis::from_redis_value(Value::Array(reply))?;
        let done = completion_of(&what, &detail)?;
        Ok((
            done,
            StartBatch {
                started: runs_of(shard, runs)?,
                // A completion does not say (see `StartBatch::more`).
                more: false,
                next_due: due_in(next_due),
                weight,
            },
        ))
    }

    /// Recovers up to `batch` executions of one shard whose lease expired, and is the worker's
    /// safety poll of the shard: due executions become runnable, and a doorbell whose
    /// token was lost is rung again (see `migrations-lua/reclaim.lua`). A retry's own worker
    /// wakes when it is due; this covers a worker that died or had no free slot then.
    pub async fn reclaim(&self, shard: Shard, batch: usize) -> Result<Reclaimed, StoreError> {
        let inv = self.shard_call(
            shard,
            &ReclaimCall {
                leases: shard.leases(),
                runnable: shard.runnable(),
                dead_letters: shard.dead_letters(),
                stats: shard.stats(),
                delayed: shard.delayed(),
                dead_letter_holders: shard.dead_letter_holders(),
                batch: batch.max(1),
                dlq_cap: self.dlq_cap(),
                dlq_tenant_cap: self.dlq_tenant_cap(),
            },
        );
        let mut c = self.conn();
        let (requeued, dead_lettered, unread, next_due): (u64, u64, u8, i64) =
            self.bounded(inv.invoke_async(&mut c)).await?;
        Ok(Reclaimed {
            requeued,
            dead_lettered,
            unread: unread == 1,
            next_due: due_in(next_due),
        })
    }
}

/// What one `start` call did in a shard.
#[derive(Debug, Default)]
pub struct StartBatch {
    /// The executions it started, for the caller to run.
    pub started: Vec<Started>,
    /// Whether a tenant of the shard can still start something: the caller asks again (with
    /// a free slot) instead of waiting for the doorbell. From `start`, `false` means nothing
    /// can start now (and the call cleared the shard's doorbell). A completion's chain does
    /// not tell (always `false` there: `complete.lua` does not answer it, since the worker
    /// learns it from its next start and the doorbell, see `start_entries` in
    /// `migrations-lua/common.lua`).
    pub more: bool,
    /// How long until the shard's earliest scheduled execution (or retry) is due, if any: the
    /// caller wakes then on its own timer (a Redis blocking time-out would fire only at `hz`
    /// granularity).
    pub next_due: Option<Duration>,
    /// The summed weight of the shard's runnable tenants after the call (0 when none; of the
    /// tenants a `start_for` names, when it names some): the
    /// worker gives a freed slot to shards in proportion to it.
    pub weight: u64,
}

/// What `complete.lua`'s `what` and `detail` of a report say.
fn completion_of(what: &str, detail: &str) -> Result<Completion, StoreError> {
    Ok(match what {
        "stale" => Completion::Stale,
        "repeat" => Completion::Repeat,
        "deleted" => Completion::Deleted,
        "recovered" => Completion::Recovered,
        "dead_lettered" => Completion::DeadLettered,
        "retrying" => Completion::Retrying,
        "released" => Completion::Released,
        "done" => Completion::Done(
            Status::parse(detail).ok_or_else(|| StoreError::Corrupt(format!("status {detail}")))?,
        ),
        other => return Err(StoreError::Corrupt(format!("complete replied {other}"))),
    })
}

/// A script's "milliseconds until due, -1 for none".
fn due_in(ms: i64) -> Option<Duration> {
    u64::try_from(ms).ok().map(Duration::from_millis)
}

/// What one orphan scan (`reclaim`) did in a shard.
#[derive(Debug, Default, Clone, Copy)]
pub struct Reclaimed {
    /// Orphans put back in their tenant's order.
    pub requeued: u64,
    /// Orphans whose attempts were used up: failed and dead-lettered.
    pub dead_lettered: u64,
    /// Whether a tenant of the shard can start something: work the caller may start
    /// although no doorbell woke it.
    pub unread: bool,
    /// How long until the shard's earliest scheduled execution is due, if any.
    pub next_due: Option<Duration>,
}

/// A run's fields as `adopt.lua` reports them, its id as `I`: (id, fence, attempt, tenant,
/// flow, version or '', params, max_attempts, traceparent or '', tracestate or '').
type RunFields<I> = (
    I,
    u64,
    u32,
    String,
    String,
    String,
    String,
    u32,
    String,
    String,
);

/// A run as read from a reply (`run_reply`).
type RunReply = RunFields<ExecutionId>;

/// A run as `adopt.lua` reports it (a list), or as `start.lua` and `complete.lua`'s chain do
/// (`start_entries` in `migrations-lua/common.lua`): one string of the same fields joined by
/// newlines, the params last (only they may hold a newline), since Redis turns each table of
/// a reply into its answer at about 1,500 instructions and 1,000 an element, a string at a
/// fraction (bench/README.md, "Round eight: the start's Lua"). The id leads in its stored
/// form (`ExecutionId::from_reply`): 32 hex digits, or 16 bytes that may hold a newline
/// themselves, so it is taken by its length, not split at the first newline.
fn run_reply(v: Value) -> Result<RunReply, StoreError> {
    let Value::BulkString(line) = v else {
        let (id, fence, attempt, tenant, flow, version, params, max_attempts, tp, ts): RunFields<
            Vec<u8>,
        > = redis::from_redis_value(v)?;
        let id = ExecutionId::from_reply(&id).map_err(StoreError::Corrupt)?;
        return Ok((
            id,
            fence,
            attempt,
            tenant,
            flow,
            version,
            params,
            max_attempts,
            tp,
            ts,
        ));
    };
    // A 32-hex id has a hex digit at 16; a binary one is followed by the newline there.
    let id_len = if line.get(16) == Some(&b'\n') { 16 } else { 32 };
    if line.get(id_len) != Some(&b'\n') {
        return Err(StoreError::Corrupt(format!(
            "a started run without its id: {:?}",
            String::from_utf8_lossy(&line)
        )));
    }
    let id = ExecutionId::from_reply(&line[..id_len]).map_err(StoreError::Corrupt)?;
    let line = std::str::from_utf8(&line[id_len + 1..])
        .map_err(|_| StoreError::Corrupt("a started run is not UTF-8".into()))?;
    let mut f = line.splitn(9, '\n').map(str::to_owned);
    let mut next = || {
        f.next().ok_or_else(|| {
            StoreError::Corrupt(format!("a started run of too few fields: {line:?}"))
        })
    };
    let (fence, attempt, tenant, flow, version) = (next()?, next()?, next()?, next()?, next()?);
    let (max_attempts, tp, ts, params) = (next()?, next()?, next()?, next()?);
    Ok((
        id,
        run_number(&fence)?,
        run_number(&attempt)?,
        tenant,
        flow,
        version,
        params,
        run_number(&max_attempts)?,
        tp,
        ts,
    ))
}

/// A number of a run's line.
fn run_number<T: std::str::FromStr>(text: &str) -> Result<T, StoreError> {
    text.parse()
        .map_err(|_| StoreError::Corrupt(format!("a started run's number {text:?}")))
}

fn runs_of(shard: Shard, reply: Vec<Value>) -> Result<Vec<Started>, StoreError> {
    reply
        .into_iter()
        .map(|v| {
            let (id, fence, attempt, tenant, flow, version, params, max_attempts, tp, tst) =
                run_reply(v)?;
            Ok(Started {
                shard,
                id: id.clone(),
                fence,
                attempt,
                max_attempts,
                tenant: TenantId::parse(&tenant)
                    .map_err(|_| StoreError::Corrupt(format!("tenant of {id}: {tenant:?}")))?,
                flow: FlowId::parse(&flow)
                    .map_err(|_| StoreError::Corrupt(format!("flow of {id}: {flow:?}")))?,
                version: (!version.is_empty()).then_some(version),
                params: serde_json::from_str(&params)
                    .map_err(|e| StoreError::Corrupt(format!("params of {id}: {e}")))?,
                // Written only when valid (admission checks it); read back the same way.
                trace: TraceContext::from_headers(
                    (!tp.is_empty()).then_some(tp.as_str()),
                    (!tst.is_empty()).then_some(tst.as_str()),
                ),
            })
        })
        .collect()
}

script_call! {
    /// `migrations-lua/start.lua`: starts up to `count` executions for one worker.
    pub(super) struct StartCall<'a> {
        keys { runnable, delayed, leases, dead_letters, stats, dead_letters_indexed, adopted }
        args {
            consumer: &'a str,
            count: usize,
            lease_ttl_ms: u64,
            dlq_cap: u64,
            call: u64,
            start_log: u8,
        }
        arg_tail { only: Vec<&'a str> }
    }
}

script_call! {
    /// `migrations-lua/adopt.lua`: every run a worker holds in one shard.
    pub(super) struct AdoptCall<'a> {
        keys { held, leases, adopted }
        args { consumer: &'a str, most: usize, lease_ttl_ms: u64, barrier: u64 }
        arg_tail { only: Vec<&'a str> }
    }
}

script_call! {
    /// `migrations-lua/heartbeat.lua`: extends the leases of the runs `held` (id, fence),
    /// whose rows are `rows`, in the same order.
    pub(super) struct HeartbeatCall<'a> {
        keys { leases }
        key_tail { rows: Vec<Vec<u8>> }
        args { lease_ttl_ms: u64, consumer: &'a str, tenant: &'a str }
        arg_tail { held: Vec<(super::keys::StoredId, u64)> }
    }
}

script_call! {
    /// `migrations-lua/reclaim.lua`: recovers runs of one shard whose lease expired.
    pub(super) struct ReclaimCall {
        keys { leases, runnable, dead_letters, stats, delayed, dead_letter_holders }
        args { batch: usize, dlq_cap: u64, dlq_tenant_cap: u64 }
    }
}

script_group! {
    /// One report of a `complete.lua` call (its header's `reports` tails).
    pub(super) struct ReportItem<'a> {
        keys { row: Vec<u8>, adopted }
        args {
            id: super::keys::StoredId,
            fence: u64,
            consumer: &'a str,
            outcome: &'a str,
            output: &'a str,
            kind: &'a str,
            message: &'a str,
            backoff: &'a str,
            chain: usize,
            lease_ttl_ms: u64,
            call: u64,
            tenant: &'a str,
        }
    }
}

/// One report of how a run ended, as `report_and_start` sends it.
struct Report<'a> {
    id: &'a ExecutionId,
    fence: u64,
    consumer: &'a str,
    /// The tenant whose run it must be (`complete_for`); `None` for any.
    tenant: Option<&'a TenantId>,
    outcome: &'a Outcome,
}
