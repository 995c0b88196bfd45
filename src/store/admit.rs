//! Admission (`migrations-lua/admit.lua`) and the settling of an admission whose answer was
//! lost (`migrations-lua/abandon.lua`): the one operation after which "I do not know" is a
//! possible answer, so it lives apart with the rule that decides when it is.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use redis::Value;
use tokio::time::Instant;

use super::call::{script_call, script_group};
use super::commit::{Item, Outcome, Sender};
use super::row::{RowFields, first, from_fields, id_at, split_tag, string_at};
use super::storage::{self, Refused};
use super::ticket::Ticket;
use super::{Shard, StorageFull, Store, StoreError, keys};
use crate::domain::{
    AdmitRequest, DedupKey, Execution, ExecutionId, QueuePosition, QueueState, Schedule, TenantId,
};

/// Time kept back before a request's deadline when a waiting execution's forecast is read for
/// its answer: the forecast is skipped rather than make the answer late.
const FORECAST_MARGIN: Duration = Duration::from_millis(50);

/// Until when a lost admission of `ticket`'s request may be settled: its deadline, less a
/// margin for the answer to be written.
fn settle_by(ticket: &Ticket) -> Instant {
    let deadline = ticket.deadline();
    deadline.checked_sub(FORECAST_MARGIN).unwrap_or(deadline)
}

/// The error of an admission that was never sent: why (its request's time ran out while it
/// waited, or the request went away); nothing of it was admitted.
fn not_sent(ticket: &Ticket) -> StoreError {
    StoreError::NotSent(if ticket.may_send() {
        "not sent: the request's time ran out before it could be sent".into()
    } else {
        "not sent: the request was withdrawn before it could be sent".into()
    })
}

/// Most tries to settle one lost admission, and the pause between two: a settling call that
/// went unanswered is tried again while the request has time left (at least `SETTLE_TRY_MIN`).
const SETTLE_TRIES: u32 = 8;
const SETTLE_PAUSE: Duration = Duration::from_millis(25);
const SETTLE_TRY_MIN: Duration = Duration::from_millis(50);

/// Most times one admission is decided when each time its dedup key names an execution that
/// is gone before it is read (force-deleted or expired between `admit.lua` and the read). A
/// replay writes nothing, so deciding again is safe; a key whose executions keep going this
/// fast answers 503 rather than loop.
const REPLAY_TRIES: u32 = 4;

/// What `answer` made of an `admit.lua` reply.
enum Answered {
    /// The admission's outcome (boxed: the other two are empty).
    Done(Box<Admission>),
    /// The tenant is pinned to another shard since this process last read the pins: nothing
    /// written; send it there.
    Moved,
    /// A replay whose execution was gone when it was read: nothing written, and the dedup key
    /// may be free now; decide it again.
    Gone,
}

/// How long the marker of an abandoned admission lives: far longer than a call can stay in
/// flight (a Redis stalled for a day has bigger problems).
const VOID_TTL: Duration = Duration::from_secs(86_400);

/// Outcome of an admission.
#[derive(Debug)]
pub enum Admission {
    /// A new execution was written and enqueued.
    Created(Execution),
    /// The dedup key already maps to this execution, admitted with the same request.
    Replayed(Execution),
    /// The dedup key maps to `existing`, admitted with a different flow/version/params.
    Conflict { existing: ExecutionId },
    /// The tenant is disabled; nothing was written.
    Disabled,
    /// The tenant is being deleted (`Store::delete_tenant`); nothing was written.
    Deleting,
    /// The tenant has no free slot and its waiting set is full; nothing was written.
    QueueFull { waiting: u64 },
    /// The execution alone is larger (`size`, logical bytes) than the tenant's `max_bytes`:
    /// it can never be admitted; nothing was written.
    TooLarge { size: u64, max_bytes: u64 },
    /// The tenant keeps what a storage bound allows (see `storage`); nothing was written.
    StorageFull(StorageFull),
}

impl Store {
    /// Admits one execution atomically (see `migrations-lua/admit.lua`), in its shard's next
    /// call, with the admissions that wait for it (see `commit`).
    ///
    /// The id is minted here, before the call. If the call's answer is lost (time-out, broken
    /// connection: the script may have run, or may still run when a stalled Redis resumes),
    /// `abandon.lua` settles it: the admission either happened (answered as created) or can no
    /// longer happen (`Unavailable`, nothing admitted). Only when that answer is lost too is
    /// the result `OutcomeUnknown`, naming the id. An error *reply* (a frozen shard's TRYAGAIN,
    /// a redirect, LOADING, OOM, ...) is not a lost answer: Redis said the script did not run.
    /// All this holds per admission when a call carries several.
    ///
    /// The request's `ticket` bounds it in time: the admission is sent only while the ticket
    /// allows (see `Ticket::send_by`): one still waiting for its shard's call when that moment
    /// passes, or whose request was withdrawn, is never sent (`NotSent`: nothing admitted).
    /// The work runs in a task of its own, so a request that goes away cancels only its wait:
    /// a call already sent is still settled.
    pub async fn admit(
        self: &Arc<Self>,
        tenant: TenantId,
        req: AdmitRequest,
        ticket: Arc<Ticket>,
    ) -> Result<Admission, StoreError> {
        let store = Arc::clone(self);
        tokio::spawn(async move { store.admit_in_time(&tenant, &req, &ticket).await })
            .await
            .unwrap_or_else(|e| Err(StoreError::Corrupt(format!("admission task: {e}"))))
    }

    async fn admit_in_time(
        &self,
        tenant: &TenantId,
        req: &AdmitRequest,
        ticket: &Arc<Ticket>,
    ) -> Result<Admission, StoreError> {
        let id = ExecutionId::new();
        // A tenant pinned since this process last read the pins is sent on (once at most); a
        // replay whose execution went before it was read is admitted again (see `Answered`).
        let (mut moves, mut gone) = (0, 0);
        loop {
            let shard = self.shard_of(tenant);
            let item = admission_item(shard, tenant, &id, req);
            let sender = Sender {
                ticket: Arc::clone(ticket),
                id: id.clone(),
            };
            let reply = match self.commits.submit(shard, item, Some(sender)).await {
                Outcome::Reply(reply) => reply,
                // Sent, answer lost: it may have run, or may still run.
                Outcome::Lost(why) => {
                    return self.abandon(tenant, &id, &why, settle_by(ticket)).await;
                }
                // Refused at connect, an error reply (Redis itself says the script did not
                // run, or failed before writing), or this admission's own script error.
                Outcome::Failed(e) => return Err(e),
                Outcome::Withdrawn => return Err(not_sent(ticket)),
            };
            let forecast_by = ticket
                .deadline()
                .checked_sub(FORECAST_MARGIN)
                .unwrap_or(ticket.deadline());
            match self
                .answer(shard, tenant, &id, req, reply, forecast_by)
                .await?
            {
                Answered::Done(admission) => return Ok(*admission),
                Answered::Moved if moves == 0 => {
                    moves += 1;
                    self.refresh_pins().await?;
                }
                Answered::Moved => {
                    return Err(StoreError::Corrupt(format!(
                        "tenant {tenant} was sent on twice"
                    )));
                }
                Answered::Gone if gone + 1 < REPLAY_TRIES => gone += 1,
                Answered::Gone => {
                    return Err(StoreError::Unavailable(format!(
                        "the execution its dedup key named went away before it could be \
                         read, {REPLAY_TRIES} times (nothing was admitted)"
                    )));
                }
            }
        }
    }

    /// What `admit.lua` answered for the admission of `req` as `id` in `shard` (see
    /// `Answered`). A replay's execution is read here (`view_in`, as GET reads it). A waiting
    /// execution's forecast is added if it can be read by `forecast_by`.
    async fn answer(
        &self,
        shard: Shard,
        tenant: &TenantId,
        id: &ExecutionId,
        req: &AdmitRequest,
        reply: Vec<Value>,
        forecast_by: Instant,
    ) -> Result<Answered, StoreError> {
        let (tag, rest) = split_tag(reply)?;
        let admission = match tag.as_str() {
            "new" => {
                let (qstate, now) = (string_at(&rest, 0)?, string_at(&rest, 1)?);
                let due = string_at(&rest, 2)?;
                let qstate = QueueState::parse(&qstate)
                    .ok_or_else(|| StoreError::Corrupt(format!("admit: queue state {qstate}")))?;
                let due = (!due.is_empty()).then_some(due);
                let field = |i: usize| string_at(&rest, i).ok().filter(|v| !v.is_empty());
                let (tpos, kpos, klimit) = (field(3), field(4), field(5));
                let position =
                    QueuePosition::from_fields(tpos.as_deref(), kpos.as_deref(), klimit.as_deref());
                let mut e = Execution::admitted(
                    id.as_str(),
                    tenant.as_str(),
                    req,
                    qstate,
                    position,
                    &now,
                    due,
                )
                .map_err(StoreError::Corrupt)?;
                self.forecast_by(&mut e, forecast_by).await;
                Ok(Admission::Created(e))
            }
            "dup" => {
                // The script wrote nothing and named the execution; its row is read now, with
                // plain commands. Between the two it may have changed (answered as it is now,
                // as a GET just after would) or gone (force-deleted, expired): the key may be
                // free, and the admission is decided again.
                let existing = id_at(&rest, 0)?;
                let Some(mut e) = self.view_in(shard, tenant, &existing, true).await? else {
                    tracing::debug!(%existing, "replayed execution went before it was read");
                    return Ok(Answered::Gone);
                };
                self.forecast_by(&mut e, forecast_by).await;
                Ok(Admission::Replayed(e))
            }
            "conflict" => Ok(Admission::Conflict {
                existing: id_at(&rest, 0)?,
            }),
            "disabled" => Ok(Admission::Disabled),
            "deleting" => Ok(Admission::Deleting),
            "full" => Ok(Admission::QueueFull {
                waiting: redis::from_redis_value(first(&rest)?.clone())?,
            }),
            "moved" => return Ok(Answered::Moved),
            other => match storage::refused(other, &rest)? {
                Some(Refused::TooLarge { size, max_bytes }) => {
                    Ok(Admission::TooLarge { size, max_bytes })
                }
                Some(Refused::Full(full)) => Ok(Admission::StorageFull(full)),
                None => Err(StoreError::Corrupt(format!("admit replied {other}"))),
            },
        };
        admission.map(|a| Answered::Done(Box::new(a)))
    }

    /// The forecast of `e` (see `forecast`), if it can be read by `until`: an admission's
    /// answer never waits past its request's time for it (it is an estimate; without it the
    /// answer is still whole).
    ///
    /// `forecast` writes `e.estimated_start` only after its read, in one assignment, so a
    /// forecast cut off by `until` leaves `e` as it was: no copy of `e` is needed to keep a
    /// half-made one out of the answer (cloning the execution was about 2 % of `serve`'s
    /// instructions per admission).
    async fn forecast_by(&self, e: &mut Execution, until: Instant) {
        let _ = tokio::time::timeout_at(until, self.forecast(e)).await;
    }

    /// Admits `reqs` (one tenant's batch) in order, in calls of at most `BATCH_CALL_ITEMS`
    /// (or `--redis-admission-group`, if fewer) admissions and about `BATCH_CALL_BYTES`, one
    /// call after the
    /// other, each after the single admissions that came meanwhile (see
    /// `GroupCommit::yield_to_singles`): each admission decided as `admit` would (a dedup key
    /// repeated in the batch is a replay of its first), each with its own answer. Not atomic
    /// as a whole: a call that fails leaves the calls before it admitted. A lost answer is
    /// settled admission by admission (all of a call's at once); once Redis did not answer,
    /// the rest is not sent. The `ticket` bounds it like a single admission: no call is sent
    /// once what is left of the request's time could not settle it, nor after the request was
    /// withdrawn. What was not sent answers `NotSent` (nothing of it admitted). Runs in a task
    /// of its own, like `admit`.
    pub async fn admit_batch(
        self: &Arc<Self>,
        tenant: TenantId,
        reqs: Vec<AdmitRequest>,
        ticket: Arc<Ticket>,
    ) -> Vec<Result<Admission, StoreError>> {
        let store = Arc::clone(self);
        let n = reqs.len();
        match tokio::spawn(async move { store.admit_batch_in_time(&tenant, &reqs, &ticket).await })
            .await
        {
            Ok(out) => out,
            Err(e) => (0..n)
                .map(|_| Err(StoreError::Corrupt(format!("batch admission task: {e}"))))
                .collect(),
        }
    }

    async fn admit_batch_in_time(
        self: &Arc<Self>,
        tenant: &TenantId,
        reqs: &[AdmitRequest],
        ticket: &Arc<Ticket>,
    ) -> Vec<Result<Admission, StoreError>> {
        let ids: Vec<ExecutionId> = reqs.iter().map(|_| ExecutionId::new()).collect();
        let mut out: Vec<Option<Result<Admission, StoreError>>> =
            reqs.iter().map(|_| None).collect();
        let mut moved = Vec::new();
        // Replays whose execution went before it was read: admitted again, alone.
        let mut again = Vec::new();
        let most = self.commits.group_max.min(super::commit::BATCH_CALL_ITEMS);
        let op_timeout = self.config.op_timeout;
        let forecast_by = ticket
            .deadline()
            .checked_sub(FORECAST_MARGIN)
            .unwrap_or(ticket.deadline());
        let mut next = 0;
        let mut last_call = None;
        while next < reqs.len() {
            if let Some(took) = last_call {
                let send_by = ticket.send_by(op_timeout);
                let most = std::cmp::min(took, send_by.saturating_duration_since(Instant::now()));
                self.commits.yield_to_singles(most).await;
            }
            // The moment a call is made up is the moment its items count as sent.
            if !ticket.claim_send(op_timeout, None) {
                self.commits.withdrew(reqs.len() - next);
                for slot in out.iter_mut().skip(next) {
                    *slot = Some(Err(not_sent(ticket)));
                }
                break;
            }
            let shard = self.shard_of(tenant);
            let mut items = Vec::new();
            let mut bytes = 0;
            while next + items.len() < reqs.len() && items.len() < most {
                let i = next + items.len();
                let item = admission_item(shard, tenant, &ids[i], &reqs[i]);
                if !items.is_empty() && bytes + item.bytes() > super::commit::BATCH_CALL_BYTES {
                    break;
                }
                bytes += item.bytes();
                items.push(item);
            }
            let refs: Vec<&Item> = items.iter().collect();
            let sent = std::time::Instant::now();
            let outcomes = self.commits.call(shard, &refs).await;
            last_call = Some(sent.elapsed());
            let mut lost = Vec::new();
            let mut unavailable = false;
            for (k, outcome) in outcomes.into_iter().enumerate() {
                let i = next + k;
                out[i] = match outcome {
                    Outcome::Reply(reply) => {
                        match self
                            .answer(shard, tenant, &ids[i], &reqs[i], reply, forecast_by)
                            .await
                        {
                            Ok(Answered::Done(a)) => Some(Ok(*a)),
                            Ok(Answered::Moved) => {
                                moved.push(i);
                                None
                            }
                            Ok(Answered::Gone) => {
                                again.push(i);
                                None
                            }
                            Err(e) => Some(Err(e)),
                        }
                    }
                    Outcome::Lost(why) => {
                        lost.push((i, why));
                        None
                    }
                    Outcome::Failed(e) => {
                        unavailable |= matches!(e, StoreError::Unavailable(_));
                        Some(Err(e))
                    }
                    Outcome::Withdrawn => Some(Err(not_sent(ticket))),
                };
            }
            next += items.len();
            // A call without an answer: its admissions are settled all at once (each may
            // take a time-out), and nothing more is sent to a Redis that does not answer.
            if !lost.is_empty() {
                let settled = futures_util::future::join_all(
                    lost.iter()
                        .map(|(i, why)| self.abandon(tenant, &ids[*i], why, settle_by(ticket))),
                )
                .await;
                for ((i, _), answer) in lost.iter().zip(settled) {
                    out[*i] = Some(answer);
                }
                unavailable = true;
            }
            if unavailable {
                for slot in out.iter_mut().skip(next) {
                    *slot = Some(Err(StoreError::NotSent(
                        "not sent: Redis did not answer an earlier call of this batch".into(),
                    )));
                }
                break;
            }
        }
        for i in again {
            out[i] = Some(self.admit_in_time(tenant, &reqs[i], ticket).await);
        }
        // A tenant pinned elsewhere meanwhile: what the old shard sent on, alone, in order.
        if !moved.is_empty() {
            let refreshed = self.refresh_pins().await;
            for i in moved {
                out[i] = Some(match &refreshed {
                    Ok(()) => self.admit_in_time(tenant, &reqs[i], ticket).await,
                    Err(e) => Err(e.clone()),
                });
            }
        }
        out.into_iter()
            .map(|r| {
                r.unwrap_or_else(|| {
                    Err(StoreError::Corrupt(
                        "an admission of the batch went unanswered".into(),
                    ))
                })
            })
            .collect()
    }

    /// Takes the right to run `tenant`'s one batch admission for at most `ttl` (the request's
    /// own bound), as `holder`: false when another batch of the tenant holds it.
    pub async fn hold_batch(
        &self,
        tenant: &TenantId,
        holder: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let key = self.shard_of(tenant).batch_lock(tenant);
        let mut c = self.conn();
        let taken: Option<String> = self
            .bounded(
                redis::cmd("SET")
                    .arg(&key)
                    .arg(holder)
                    .arg("NX")
                    .arg("PX")
                    .arg(ttl.as_millis().max(1) as u64)
                    .query_async(&mut c),
            )
            .await?;
        Ok(taken.is_some())
    }

    /// Gives up `tenant`'s batch right, if `holder` has it (after its TTL it may be another's).
    pub async fn release_batch(&self, tenant: &TenantId, holder: &str) -> Result<(), StoreError> {
        self.release_mark(&self.shard_of(tenant).batch_lock(tenant), holder)
            .await
    }

    /// Settles an admission whose answer was lost (see `migrations-lua/abandon.lua`), trying
    /// again while its request has time left (`settle_by`): a try that went unanswered may
    /// still run later, which is harmless (whichever of the admission and a settling call runs
    /// first decides, and every later one agrees), so a Redis that stalls for less than the
    /// request's bound gets a definite answer rather than `OutcomeUnknown`.
    async fn abandon(
        &self,
        tenant: &TenantId,
        id: &ExecutionId,
        lost: &str,
        settle_by: Instant,
    ) -> Result<Admission, StoreError> {
        tracing::warn!(%id, error = %lost, "admission answer lost; settling it");
        let shard = self.shard_of(tenant);
        let inv = self.shard_call(
            shard,
            &AbandonCall {
                row: shard.row(id),
                void: shard.void(id),
                cfg: shard.tenant_config(tenant),
                tenant: tenant.as_str(),
                id: shard.stored_id(id),
                void_ttl_secs: VOID_TTL.as_secs(),
            },
        );
        let mut tries = 0;
        let reply: Vec<Value> = loop {
            tries += 1;
            let mut c = self.conn();
            let bound = settle_by
                .saturating_duration_since(Instant::now())
                .min(self.config.op_timeout)
                .max(SETTLE_TRY_MIN);
            let answer = match tokio::time::timeout(bound, inv.invoke_async(&mut c)).await {
                Ok(r) => r.map_err(StoreError::from),
                Err(_) => Err(StoreError::Unavailable(format!(
                    "no answer within {bound:?}"
                ))),
            };
            match answer {
                Ok(reply) => break reply,
                Err(StoreError::Unavailable(e))
                    if tries < SETTLE_TRIES
                        && settle_by.saturating_duration_since(Instant::now())
                            >= SETTLE_TRY_MIN + SETTLE_PAUSE =>
                {
                    tracing::debug!(%id, error = %e, tries, "settling try went unanswered");
                    tokio::time::sleep(SETTLE_PAUSE).await;
                }
                Err(e) => {
                    self.commits.left_unknown();
                    return Err(StoreError::OutcomeUnknown {
                        execution_id: id.clone(),
                        detail: format!("{lost}; then, settling it ({tries} tries): {e}"),
                    });
                }
            }
        };
        let (tag, rest) = split_tag(reply)?;
        match tag.as_str() {
            "admitted" => {
                let RowFields(fields) = redis::from_redis_value(first(&rest)?.clone())?;
                from_fields(id.as_str(), fields, false).map(Admission::Created)
            }
            "void" => Err(StoreError::Unavailable(format!(
                "{lost} (nothing was admitted)"
            ))),
            other => Err(StoreError::Corrupt(format!("abandon replied {other}"))),
        }
    }
}

/// The keys of one tenant that every admission of it names (see `tenant_keys`): its listing
/// (`admit.lua` builds the others inside), and the heads of its dedup mapping's two names,
/// which an admission with a dedup key ends with its digest (`TenantKeys::dedup_bucket`,
/// `TenantKeys::dedup`).
struct TenantKeys {
    listing: String,
    /// `Shard::dedup_bucket` of the tenant and an empty digest: the name less its digest part.
    dedup_bucket_head: String,
    /// `Shard::dedup` of the tenant and an empty digest.
    dedup_head: String,
}

impl TenantKeys {
    /// `Shard::dedup_bucket(tenant, digest)`, from the remembered head: a copy and an append
    /// where a `format!` of the prefix, the tenant and the digest cost about 2,000
    /// instructions per admission under callgrind (bench/README.md, "Round seven").
    fn dedup_bucket(&self, digest: &str) -> String {
        joined(&self.dedup_bucket_head, digest.get(..2).unwrap_or(digest))
    }

    /// `Shard::dedup(tenant, digest)`, likewise.
    fn dedup(&self, digest: &str) -> String {
        joined(&self.dedup_head, digest)
    }
}

/// `head` followed by `tail`, in one allocation.
fn joined(head: &str, tail: &str) -> String {
    let mut s = String::with_capacity(head.len() + tail.len());
    s.push_str(head);
    s.push_str(tail);
    s
}

/// Tenants whose keys are remembered at most: past it the memory is cleared and refilled (a
/// server with more active tenants formats them again, as before the memory).
const TENANT_KEYS_CAP: usize = 4096;

/// The keys of `tenant` in `shard` that an admission names, formatted once and then cloned:
/// formatting them was a tenth of `serve`'s instructions per HTTP admission (then five
/// `format!`s of the prefix and the tenant, about 1,800 instructions each under callgrind,
/// against about 150 for a clone). The names are pure functions of the shard (its hash tag,
/// which carries the layout) and the tenant, so remembering them can never name another
/// key; a tenant sent to another shard (pinned) is formatted again for it.
fn tenant_keys(shard: Shard, tenant: &TenantId) -> Arc<TenantKeys> {
    /// Each tenant's keys, and the shard they name.
    type Memory = Mutex<HashMap<TenantId, (Shard, Arc<TenantKeys>)>>;
    static MEMORY: OnceLock<Memory> = OnceLock::new();
    let memory = MEMORY.get_or_init(Mutex::default);
    if let Some((at, k)) = memory.lock().expect("tenant keys").get(tenant)
        && *at == shard
    {
        return Arc::clone(k);
    }
    let keys = Arc::new(TenantKeys {
        listing: shard.listing(tenant),
        dedup_bucket_head: shard.dedup_bucket(tenant, ""),
        dedup_head: shard.dedup(tenant, ""),
    });
    let mut memory = memory.lock().expect("tenant keys");
    if memory.len() >= TENANT_KEYS_CAP {
        memory.clear();
    }
    memory.insert(tenant.clone(), (shard, Arc::clone(&keys)));
    keys
}

/// One admission's keys and values in `admit.lua`'s order (`dry_admit.lua` takes the same).
pub(super) fn admission_item(
    shard: Shard,
    tenant: &TenantId,
    id: &ExecutionId,
    req: &AdmitRequest,
) -> Item {
    let tk = tenant_keys(shard, tenant);
    let dedup_digest = req.dedup.as_ref().map(DedupKey::digest).unwrap_or_default();
    // One value (admit.lua's header): '@' and a time, '+' and a delay, or '' for now.
    let start_at = match req.schedule {
        Some(Schedule::At(ms)) => format!("@{ms}"),
        Some(Schedule::After(ms)) => format!("+{ms}"),
        None => String::new(),
    };
    let (ckey, ckey_digest) = match &req.concurrency_key {
        Some(k) => (k.as_str(), k.digest()),
        None => ("", String::new()),
    };
    let (traceparent, tracestate) = match &req.trace {
        Some(t) => (
            t.traceparent.as_str(),
            t.tracestate.as_deref().unwrap_or(""),
        ),
        None => ("", ""),
    };
    AdmitItem {
        listing: tk.listing.clone(),
        dedup_bucket: req.dedup.is_some().then(|| tk.dedup_bucket(&dedup_digest)),
        dedup: req.dedup.is_some().then(|| tk.dedup(&dedup_digest)),
        tenant: tenant.as_str(),
        id: shard.stored_id(id),
        flow: req.flow.as_str(),
        version: req.version.as_ref().map(|v| v.as_str()).unwrap_or(""),
        params: &req.params,
        max_attempts: req.max_attempts,
        dedup_key: req.dedup.as_ref().map(|d| d.as_str()).unwrap_or(""),
        dedup_digest: shard.stored_digest(&dedup_digest),
        fingerprint: shard.stored_fingerprint(&req.fingerprint),
        priority: req.priority,
        start_at,
        ckey,
        ckey_digest: &ckey_digest,
        traceparent,
        tracestate,
        // The one place the field is cut from the digest (`keys::dedup_field`; the test
        // `fences::lua_and_rust_cut_the_same_dedup_field` pins common.lua's to it).
        dedup_field: keys::dedup_field(&dedup_digest),
    }
    .into()
}

script_call! {
    /// `migrations-lua/abandon.lua`: settles an admission whose answer was lost.
    pub(super) struct AbandonCall<'a> {
        keys { row: Vec<u8>, void: Vec<u8>, cfg }
        args { tenant: &'a str, id: super::keys::StoredId, void_ttl_secs: u64 }
    }
}

script_group! {
    /// One admission of an `admit.lua` call (its header's `admissions` tails).
    pub(super) struct AdmitItem<'a> {
        keys { listing }
        optional_keys { dedup_bucket, dedup }
        args {
            tenant: &'a str,
            id: super::keys::StoredId,
            flow: &'a str,
            version: &'a str,
            params: &'a str,
            max_attempts: u32,
            dedup_key: &'a str,
            dedup_digest: super::keys::StoredId,
            fingerprint: super::keys::StoredId,
            priority: u8,
            start_at: String,
            ckey: &'a str,
            ckey_digest: &'a str,
            traceparent: &'a str,
            tracestate: &'a str,
            dedup_field: &'a str,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Layout, ShardMap};

    /// The remembered names are the names `keys.rs` gives, in every layout's tags and in
    /// every shard a tenant is served from, also when the same tenant moves to another shard
    /// (pinned) and back.
    #[test]
    fn remembered_tenant_keys_are_the_shards_own_names() {
        let tenants = ["t-a", "t-b", "tenant.with-dots_9"].map(|t| TenantId::parse(t).unwrap());
        for map in [
            ShardMap::with_dedicated(16, 2, Layout::CURRENT),
            ShardMap::new(4, Layout::Legacy),
        ] {
            for t in &tenants {
                // Its own shard, a dedicated one, its own again: each time the names of the
                // shard asked about.
                for shard in [map.shard_of(t), map.shard(map.count()), map.shard_of(t)] {
                    let k = tenant_keys(shard, t);
                    assert_eq!(k.listing, shard.listing(t));
                    for key in ["k", "another key", "ключ"] {
                        let digest = DedupKey::parse(key).unwrap().digest();
                        assert_eq!(k.dedup_bucket(&digest), shard.dedup_bucket(t, &digest));
                        assert_eq!(k.dedup(&digest), shard.dedup(t, &digest));
                    }
                }
            }
        }
    }
}
