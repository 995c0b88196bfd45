//! Group commit of admissions (and of completions, below): while a call of `admit.lua` to a
//! shard is in flight, the admissions that arrive for that shard queue, and go together in
//! the next call.
//!
//! Why: every admission used to be one script call, and Redis's fixed cost per call (the
//! round trip, the dispatch, running the script's chunk and its guard) caps admissions per
//! shard well below what the script's own work would allow. Grouping pays that cost once per
//! call instead of once per admission.
//!
//! How it stays honest:
//! - No timer. A lone admission finds its shard idle and is sent at once; grouping only
//!   happens while a call is already on its way, when waiting costs nothing extra.
//! - Bounded: at most `--redis-admission-group` admissions (64 by default, 100 at most, as
//!   `admit.lua` takes) and about `GROUP_BYTES` of arguments per call, so one call never holds
//!   Redis for long.
//! - The script decides each admission in arrival order with one admission's semantics (see
//!   `migrations-lua/admit.lua`); each gets its own reply, or its own error.
//! - A call whose answer is lost hands every admission of it `Outcome::Lost`: the caller
//!   settles its own execution id with `abandon.lua` as it would after a lone call, so each
//!   request gets its honest 201 or 503.
//! - The call runs in a task of its own: a client that disconnects cancels its wait, never
//!   the call that carries other clients' admissions.
//!
//! Completions go the same way (a second committer, `Batched::Complete`): while a worker's
//! `complete.lua` call to a shard is in flight, the reports of its other runs that end queue
//! and go together in the next call, each recorded, and the runs it chains started, as if it
//! had come alone (see `migrations-lua/complete.lua`). A lost call hands each report
//! `Outcome::Lost`, which the worker treats as today: the report is repeated (a repeat is
//! recognised), and the shard is made unsure until `adopt` finds what a chained start began.
//!
//! Batch admissions (`Store::admit_batch`) do not queue here: a batch sends its own calls, of
//! at most `BATCH_CALL_ITEMS`, and before each call after its first it gives way to the
//! single admissions of this process (`yield_to_singles`), so that one tenant's batches do not
//! stand between every other tenant and Redis.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::{Cmd, Value};
use tokio::sync::{Notify, oneshot};

use super::call::{Call, script_call};
use super::conn::Conn;
use super::function::{self, Function, Invocation};
use super::keys::Shard;
use super::ticket::Ticket;
use super::{Policy, StoreError, compose, is_lost};
use crate::domain::ExecutionId;

/// About the most bytes of keys and arguments one call carries (one admission alone may be
/// more: it is sent on its own).
pub(super) const GROUP_BYTES: usize = 1 << 20;

/// The most admissions of a batch one call carries. A call holds Redis for its whole run
/// (about 60 µs per admission on a small machine): 16 keep that near a millisecond, which is
/// what a single admission of another tenant may wait behind one. Measured with
/// `sluice-bench` (2 cores), a batch's Redis time per admission in calls of 16 (62–70 µs) is
/// no more than it was in calls of 64 before `admit.lua` learnt to skip repeated reads
/// (68–74 µs), and its rate the same.
pub const BATCH_CALL_ITEMS: usize = 16;

/// About the most bytes of keys and arguments one call of a batch carries (one admission
/// alone may be more). Large params cost Redis by their bytes: 16 items of 16 KB held it for
/// about 1.7 ms a call, and another tenant's admission waited behind two of them (its p99 7
/// to 10 ms beside four batch bodies of 16 MiB, the benchmark's batch-memory phase); calls of
/// at most 64 KiB keep a batch's call near the millisecond of 16 small items.
pub const BATCH_CALL_BYTES: usize = 64 * 1024;

/// The most reports one `complete.lua` call carries. Each may chain starts, so a call's work
/// is this times (1 + the worker's free slots) at the most; 32 keeps it near what a call of
/// `start.lua` for a busy worker does.
pub(super) const COMPLETION_GROUP: usize = 32;

/// The script a group committer calls: what its calls carry besides the items.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Batched {
    /// `admit.lua` (and `dry_admit.lua`, one item).
    Admit,
    /// `complete.lua`.
    Complete,
}

impl Batched {
    fn name(self) -> &'static str {
        match self {
            Batched::Admit => "admit",
            Batched::Complete => "complete",
        }
    }
}

/// One request's part of a call: its keys and its values, in the script's order.
pub(super) struct Item {
    /// Bytes, not text: some keys hold an execution id (`Shard::stored_id`).
    pub keys: Vec<Vec<u8>>,
    /// The values, one after the other in one buffer (a `Cmd` used as such): an admission's
    /// 16 values are one allocation, not one each.
    pub args: Cmd,
}

impl Item {
    pub(super) fn bytes(&self) -> usize {
        self.keys.iter().map(Vec::len).sum::<usize>() + function::bytes_of(&self.args)
    }
}

/// What became of one item's part of a call.
pub(super) enum Outcome {
    /// The script's reply for it.
    Reply(Vec<Value>),
    /// The call was sent and its answer lost: it may have run, or may still run.
    Lost(String),
    /// Redis said the call did not run (or the script failed on this item).
    Failed(StoreError),
    /// Never sent: its request was withdrawn, or its time to be sent passed while it waited
    /// for its shard's call (see `Ticket`). Nothing of it was written.
    Withdrawn,
}

/// Whose admission an item is, for the group committer: the request's ticket (which may
/// withdraw it while it waits, and which records that it was sent) and the execution it mints.
pub(super) struct Sender {
    pub ticket: std::sync::Arc<Ticket>,
    pub id: ExecutionId,
}

struct Waiting {
    item: Item,
    answer: oneshot::Sender<Outcome>,
    sender: Option<Sender>,
}

/// A shard's queue: whether a call is in flight, and what waits for the next one.
#[derive(Default)]
struct Lane {
    busy: bool,
    queue: VecDeque<Waiting>,
}

/// A group committer of one `Store` (one for admissions, one for completions): one lane per
/// shard.
pub(super) struct GroupCommit {
    kind: Batched,
    lanes: Mutex<HashMap<Shard, Lane>>,
    conns: Vec<Conn>,
    next: Arc<AtomicUsize>,
    script: Function,
    policy: Arc<Policy>,
    op_timeout: Duration,
    /// The most items one call carries.
    pub(super) group_max: usize,
    /// Calls made, and the items they carried.
    calls: AtomicU64,
    sent: AtomicU64,
    /// Items whose call's answer was lost (each then settled by its caller).
    lost: AtomicU64,
    /// Admissions never sent: withdrawn from the queue, or left out of a batch's calls, because
    /// their request ran out of time or went away.
    withdrawn: AtomicU64,
    /// Lost admissions whose settling failed too (answered `admission_outcome_unknown`).
    unknown: AtomicU64,
    /// Items queued for their shard's next call now.
    waiting: AtomicUsize,
    /// Lanes with a call in flight or admissions queued, and the signal that the last of them
    /// went idle (what a batch waits for, see `yield_to_singles`).
    busy_lanes: AtomicUsize,
    quiet: Notify,
}

/// What a group committer has done so far (see `Store::group_commit_counts` and
/// `Store::completion_counts`).
#[derive(Debug, Clone, Copy, Default)]
pub struct GroupCommitCounts {
    /// Calls of its script made.
    pub calls: u64,
    /// Admissions (or reports) those calls carried (divided by `calls`: the mean group).
    pub carried: u64,
    /// Items waiting now for their shard's call in flight to end.
    pub waiting: u64,
    /// Items whose call's answer was lost (an admission is then settled, see `admit`; a report
    /// is repeated by its worker).
    pub lost: u64,
    /// Admissions never sent because their request ran out of time (or went away) while they
    /// waited: each answered "nothing admitted".
    pub withdrawn: u64,
    /// Lost admissions that could not be settled either: each answered
    /// `admission_outcome_unknown`, naming its execution.
    pub unknown: u64,
}

impl GroupCommit {
    pub(super) fn new(
        kind: Batched,
        conns: Vec<Conn>,
        next: Arc<AtomicUsize>,
        script: Function,
        policy: Arc<Policy>,
        op_timeout: Duration,
        group_max: usize,
    ) -> Self {
        Self {
            kind,
            lanes: Mutex::default(),
            conns,
            next,
            script,
            policy,
            op_timeout,
            group_max,
            calls: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            withdrawn: AtomicU64::new(0),
            unknown: AtomicU64::new(0),
            waiting: AtomicUsize::new(0),
            busy_lanes: AtomicUsize::new(0),
            quiet: Notify::new(),
        }
    }

    pub(super) fn counts(&self) -> GroupCommitCounts {
        GroupCommitCounts {
            calls: self.calls.load(Ordering::Relaxed),
            carried: self.sent.load(Ordering::Relaxed),
            waiting: self.waiting.load(Ordering::Relaxed) as u64,
            lost: self.lost.load(Ordering::Relaxed),
            withdrawn: self.withdrawn.load(Ordering::Relaxed),
            unknown: self.unknown.load(Ordering::Relaxed),
        }
    }

    /// Counts `n` admissions never sent (see `GroupCommitCounts::withdrawn`).
    pub(super) fn withdrew(&self, n: usize) {
        self.withdrawn.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Counts a lost admission that could not be settled (see `GroupCommitCounts::unknown`).
    pub(super) fn left_unknown(&self) {
        self.unknown.fetch_add(1, Ordering::Relaxed);
    }

    /// Sends `item` (an admission or a report) to shard `shard` in the next call that shard
    /// makes. An admission comes with its `sender`: it is sent only if its ticket still allows
    /// it when its call is made up, and answered `Outcome::Withdrawn` otherwise.
    pub(super) async fn submit(
        self: &Arc<Self>,
        shard: Shard,
        item: Item,
        sender: Option<Sender>,
    ) -> Outcome {
        let (answer, outcome) = oneshot::channel();
        let start = {
            let mut lanes = self.lanes.lock().expect("group commit lanes");
            let lane = lanes.entry(shard).or_default();
            lane.queue.push_back(Waiting {
                item,
                answer,
                sender,
            });
            self.waiting.fetch_add(1, Ordering::Relaxed);
            let start = !std::mem::replace(&mut lane.busy, true);
            if start {
                self.busy_lanes.fetch_add(1, Ordering::SeqCst);
            }
            start
        };
        if start {
            tokio::spawn(Arc::clone(self).drain(shard));
        }
        // The sender goes only with a task that ended mid-call (a panic, the runtime shutting
        // down): whether the call ran is not known.
        outcome.await.unwrap_or_else(|_| {
            Outcome::Lost(format!("the {} call was abandoned", self.kind.name()))
        })
    }

    /// Sends the shard's queued items, a group per call, until none is left.
    async fn drain(self: Arc<Self>, shard: Shard) {
        loop {
            let group = {
                let mut lanes = self.lanes.lock().expect("group commit lanes");
                let lane = lanes.get_mut(&shard).expect("a busy lane exists");
                let mut group = Vec::new();
                let mut bytes = 0;
                while let Some(next) = lane.queue.front() {
                    let size = next.item.bytes();
                    if group.len() == self.group_max
                        || (!group.is_empty() && bytes + size > GROUP_BYTES)
                    {
                        break;
                    }
                    let next = lane.queue.pop_front().expect("a front");
                    // The moment it is put in a call is the moment it counts as sent: a
                    // request withdrawn before, or out of time to settle a lost answer, is
                    // answered unsent and leaves nothing behind.
                    if let Some(s) = &next.sender
                        && !s.ticket.claim_send(self.op_timeout, Some(&s.id))
                    {
                        self.waiting.fetch_sub(1, Ordering::Relaxed);
                        self.withdrew(1);
                        let _ = next.answer.send(Outcome::Withdrawn);
                        continue;
                    }
                    bytes += size;
                    group.push(next);
                }
                if group.is_empty() {
                    lane.busy = false;
                    if self.busy_lanes.fetch_sub(1, Ordering::SeqCst) == 1 {
                        self.quiet.notify_waiters();
                    }
                    return;
                }
                self.waiting.fetch_sub(group.len(), Ordering::Relaxed);
                group
            };
            let items: Vec<&Item> = group.iter().map(|w| &w.item).collect();
            let outcomes = self.call(shard, &items).await;
            for (w, outcome) in group.into_iter().zip(outcomes) {
                // A client that went away no longer listens; its admission (or report) stands.
                let _ = w.answer.send(outcome);
            }
        }
    }

    /// Waits until no single admission of this process is queued or in a call, `most` at the
    /// longest: a batch calls this between its calls, so that the single admissions that
    /// came meanwhile go first, and a batch still gets about half of Redis's time when they
    /// never stop (it waits at most as long as its own last call took).
    pub(super) async fn yield_to_singles(&self, most: Duration) {
        let deadline = tokio::time::Instant::now() + most;
        loop {
            let quiet = self.quiet.notified();
            tokio::pin!(quiet);
            // Registered before the count is read: a lane that goes idle after the read
            // still wakes this wait.
            quiet.as_mut().enable();
            if self.busy_lanes.load(Ordering::SeqCst) == 0 {
                return;
            }
            if tokio::time::timeout_at(deadline, quiet).await.is_err() {
                return;
            }
        }
    }

    /// One call of the script with `items`: one outcome per item, in order.
    pub(super) async fn call(&self, shard: Shard, items: &[&Item]) -> Vec<Outcome> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.sent.fetch_add(items.len() as u64, Ordering::Relaxed);
        let inv = invocation(self.kind, &self.script, shard, &self.policy, items);
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.conns.len();
        let mut c = self.conns[i].clone();
        let all = |f: &dyn Fn() -> Outcome| items.iter().map(|_| f()).collect();
        let replies: Vec<Value> =
            match tokio::time::timeout(self.op_timeout, inv.invoke_async(&mut c)).await {
                Ok(Ok(Value::Array(replies))) => replies,
                // A call of one item may answer that item's reply as one string (see
                // `short_reply`).
                Ok(Ok(Value::BulkString(short))) if items.len() == 1 => {
                    vec![short_reply(self.kind, short)]
                }
                Ok(Ok(other)) => {
                    let e = StoreError::Corrupt(format!("{} answered {other:?}", self.kind.name()));
                    return all(&|| Outcome::Failed(e.clone()));
                }
                // Refused at connect: the call never left this process.
                Ok(Err(e)) if e.is_connection_refusal() => {
                    let e = StoreError::from(e);
                    return all(&|| Outcome::Failed(e.clone()));
                }
                Ok(Err(e)) if is_lost(&e) => {
                    self.lost.fetch_add(items.len() as u64, Ordering::Relaxed);
                    let why = e.to_string();
                    return all(&|| Outcome::Lost(why.clone()));
                }
                Err(_) => {
                    self.lost.fetch_add(items.len() as u64, Ordering::Relaxed);
                    let why = format!("no answer within {:?}", self.op_timeout);
                    return all(&|| Outcome::Lost(why.clone()));
                }
                // An error reply: Redis says the script did not run (a frozen shard's
                // TRYAGAIN, a redirect, OOM, ...), or it failed before writing.
                Ok(Err(e)) => {
                    let e = StoreError::from(e);
                    return all(&|| Outcome::Failed(e.clone()));
                }
            };
        // `complete.lua` answers the shard's part ({next_due, weight}) once, after the reports,
        // when a report asked for it: each such report (its {what, detail, started}) is
        // handed it here, so every report reads as if it had come alone. (A call of one
        // report has it in the report already: {what, detail, started, next_due, weight}.)
        let mut replies = replies;
        let shard_part = match self.kind {
            Batched::Complete if replies.len() == items.len() + 1 => replies.pop(),
            _ => None,
        };
        let shard_part: Vec<Value> = match shard_part.map(redis::from_redis_value) {
            None => Vec::new(),
            Some(Ok(part)) => part,
            Some(Err(e)) => {
                let e = StoreError::Corrupt(format!("complete's shard part: {e}"));
                return all(&|| Outcome::Failed(e.clone()));
            }
        };
        if replies.len() != items.len() {
            let e = StoreError::Corrupt(format!(
                "{} answered {} replies for {} items",
                self.kind.name(),
                replies.len(),
                items.len()
            ));
            return all(&|| Outcome::Failed(e.clone()));
        }
        replies
            .into_iter()
            .map(|reply| match reply {
                // An admission of a call of many answered as one string (see `joined_reply`).
                Value::BulkString(joined) if self.kind == Batched::Admit => {
                    Outcome::Reply(joined_reply(&joined))
                }
                // A report of a call of many that started nothing, as one string (see
                // `joined_report`).
                Value::BulkString(joined) if self.kind == Batched::Complete => {
                    Outcome::Reply(joined_report(&joined, &shard_part))
                }
                reply => self.item_reply(reply, &shard_part),
            })
            .collect()
    }

    /// One item's reply of a call, as a list: its `{'error', message}` as its own failure.
    fn item_reply(&self, reply: Value, shard_part: &[Value]) -> Outcome {
        let (sha, name) = (self.script.name(), self.kind.name());
        match redis::from_redis_value::<Vec<Value>>(reply) {
            Ok(reply) if is_error(&reply) => {
                let message = match reply.get(1) {
                    Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
                    other => format!("{other:?}"),
                };
                Outcome::Failed(StoreError::Corrupt(compose::locate(&format!(
                    "{name}: {message} (script: {sha})"
                ))))
            }
            Ok(mut reply) => {
                if reply.len() == 3 {
                    reply.extend(shard_part.iter().cloned());
                }
                Outcome::Reply(reply)
            }
            Err(e) => Outcome::Failed(StoreError::Corrupt(format!("{name} reply: {e}"))),
        }
    }
}

/// An admission's reply given as one string in a call of many (`admit.lua`: a runnable new
/// execution's `new:<qstate>:<now>::<tpos>:<kpos>:<klimit>`), as the list it stands for: its
/// values split at ':', which none of them holds. Redis makes one string of a reply for a
/// fraction of what a table of seven values costs it (about 4,700 instructions per admission
/// of a batch, bench/README.md "Round seven"), and this process reads one value instead of
/// eight.
fn joined_reply(joined: &[u8]) -> Vec<Value> {
    joined
        .split(|&b| b == b':')
        .map(|p| Value::BulkString(p.to_vec()))
        .collect()
}

/// A report's reply given as one string in a call of many (`complete.lua`: a report that
/// started nothing), as the list it stands for: `what:detail` is {what, detail} (a report that
/// asks for its outcome alone), `what:detail:` is {what, detail, started} with nothing started,
/// which is handed the call's shard part as a report's table is (`item_reply`). Redis makes a
/// string of a reply for a fraction of what a table costs it (bench/README.md, "Round eight:
/// the completion's Lua"), and this process reads one value instead of four.
fn joined_report(joined: &[u8], shard_part: &[Value]) -> Vec<Value> {
    let mut parts = joined.split(|&b| b == b':');
    let mut reply: Vec<Value> = parts
        .by_ref()
        .take(2)
        .map(|p| Value::BulkString(p.to_vec()))
        .collect();
    if parts.next().is_some() {
        reply.push(Value::Array(Vec::new()));
        reply.extend(shard_part.iter().cloned());
    }
    reply
}

/// An item's reply given as one string, as the list it stands for. A script answers a call
/// of one item so when the answer is that short: Redis turns each Lua table of a reply into
/// its answer at a cost of some thousands of instructions, a string at a fraction of it
/// (bench/README.md, "Per-call overhead, round two"). `admit.lua` answers a replay so, with
/// the id its dedup key maps to alone (`{'dup', id}`: the id is a string the call has made
/// already, `dup:<id>` was one more, about 800 instructions: "Round five: admission");
/// `complete.lua` answers `<tag>` or `<tag>:<value>` (`{tag[, value]}`, a repeated report's
/// `repeat`). A new runnable admission alone in its call is answered as its joined string
/// (`new:...`, see `joined_reply`), which no id starts with: the table of one entry around it
/// cost Redis more than the rest of the reply (bench/README.md, "Round eight").
fn short_reply(kind: Batched, short: Vec<u8>) -> Value {
    match kind {
        Batched::Admit if short.starts_with(b"new:") => Value::Array(joined_reply(&short)),
        Batched::Admit => Value::Array(vec![
            Value::BulkString(b"dup".to_vec()),
            Value::BulkString(short),
        ]),
        Batched::Complete => Value::Array(
            short
                .splitn(2, |&b| b == b':')
                .map(|p| Value::BulkString(p.to_vec()))
                .collect(),
        ),
    }
}

/// Whether an item's reply is the script's `{'error', message}` (admissions only: a report of
/// `complete.lua` never starts with 'error').
fn is_error(reply: &[Value]) -> bool {
    matches!(reply.first(), Some(Value::BulkString(b)) if b == b"error")
}

/// The shard's own keys a call of `complete.lua` names (see `shard_keys`; `admit.lua` builds
/// its shard keys inside), and the freeze marker and prefix every group call names.
struct ShardKeys {
    /// The freeze marker (`Shard::frozen`), the first key of every shard script.
    frozen: String,
    /// The shard's prefix (`Shard::prefix`), the first value of every shard script.
    prefix: String,
    runnable: String,
    delayed: String,
    leases: String,
    dead_letters: String,
    stats: String,
    dead_letter_holders: String,
}

/// The keys of `shard` its group calls name, formatted once and then cloned (a `format!` of
/// the prefix and the name costs about 1,800 instructions under callgrind, a clone about
/// 150; a call names three to six of them). A name is a pure function of the shard (its hash
/// tag carries the layout), so remembering it can never name another key; there are as many
/// entries as shards.
fn shard_keys(shard: Shard) -> Arc<ShardKeys> {
    static MEMORY: std::sync::OnceLock<Mutex<HashMap<Shard, Arc<ShardKeys>>>> =
        std::sync::OnceLock::new();
    let memory = MEMORY.get_or_init(Mutex::default);
    if let Some(k) = memory.lock().expect("shard keys").get(&shard) {
        return Arc::clone(k);
    }
    let keys = Arc::new(ShardKeys {
        frozen: shard.frozen(),
        prefix: shard.prefix(),
        runnable: shard.runnable(),
        delayed: shard.delayed(),
        leases: shard.leases(),
        dead_letters: shard.dead_letters(),
        stats: shard.stats(),
        dead_letter_holders: shard.dead_letter_holders(),
    });
    memory
        .lock()
        .expect("shard keys")
        .insert(shard, Arc::clone(&keys));
    keys
}

/// The call of `admit.lua` (or `dry_admit.lua`, with one item) or of `complete.lua` for
/// `items` in `shard`: the shard's keys and the common arguments (and for `complete.lua` the
/// dead-letter cap), then each item's keys and values.
pub(super) fn invocation<'a>(
    kind: Batched,
    script: &'a Function,
    shard: Shard,
    policy: &Policy,
    items: &[&Item],
) -> Invocation<'a> {
    let keys = shard_keys(shard);
    match kind {
        Batched::Admit => group_invocation(
            script,
            &keys,
            policy,
            &AdmitCall {
                count: items.len(),
                max_bytes: policy.max_bytes.load(Ordering::Relaxed),
                max_retained: policy.max_retained.load(Ordering::Relaxed),
                admissions: items,
            },
        ),
        Batched::Complete => group_invocation(
            script,
            &keys,
            policy,
            &CompleteCall {
                runnable: keys.runnable.clone(),
                leases: keys.leases.clone(),
                delayed: keys.delayed.clone(),
                dead_letters: keys.dead_letters.clone(),
                stats: keys.stats.clone(),
                dead_letter_holders: keys.dead_letter_holders.clone(),
                dlq_cap: policy.dlq_cap.load(Ordering::Relaxed),
                dlq_tenant_cap: policy.dlq_tenant_cap.load(Ordering::Relaxed),
                start_log: u8::from(policy.start_log.load(Ordering::Relaxed)),
                count: items.len(),
                reports: items,
            },
        ),
    }
}

/// `shard_invocation` (the same keys and values in the same order) with the shard's freeze
/// marker and prefix remembered in `keys` instead of formatted per call: three `format!`s,
/// some 760 instructions of `serve`'s per admission under callgrind.
fn group_invocation<'s, C: Call>(
    script: &'s Function,
    keys: &ShardKeys,
    policy: &Policy,
    call: &C,
) -> Invocation<'s> {
    let mut inv = script.key(keys.frozen.as_str());
    call.keys(&mut inv);
    policy.common_args_of_prefix(&mut inv, &keys.prefix);
    call.args(&mut inv);
    inv
}

script_call! {
    /// `migrations-lua/admit.lua`: a group of admissions of one shard, in arrival order.
    pub(super) struct AdmitCall<'a> {
        keys { }
        args { count: usize, max_bytes: u64, max_retained: u64 }
        items { admissions: super::admit::AdmitItem<'static> }
    }
}

script_call! {
    /// `migrations-lua/dry_admit.lua`: takes exactly what `admit.lua` takes, with one item.
    pub(super) struct DryAdmitCall<'a> {
        keys { }
        args { count: usize, max_bytes: u64, max_retained: u64 }
        items { admissions: super::admit::AdmitItem<'static> }
    }
}

script_call! {
    /// `migrations-lua/complete.lua`: a group of reports of ended runs of one shard.
    pub(super) struct CompleteCall<'a> {
        keys { runnable, leases, delayed, dead_letters, stats, dead_letter_holders }
        args { dlq_cap: u64, dlq_tenant_cap: u64, start_log: u8, count: usize }
        items { reports: super::lease::ReportItem<'static> }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Layout, ShardMap};

    /// A joined admission reply reads as the list `admit.lua` answers for a call of one: its
    /// seven values in order, the empty ones empty.
    #[test]
    fn a_joined_admission_reply_is_its_seven_values() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        assert_eq!(
            joined_reply(b"new:ready:1765100000123::12::"),
            ["new", "ready", "1765100000123", "", "12", "", ""].map(bulk)
        );
        assert_eq!(
            joined_reply(b"new:waiting:1765100000123::3:0:-1"),
            ["new", "waiting", "1765100000123", "", "3", "0", "-1"].map(bulk)
        );
    }

    /// A joined report reads as the table `complete.lua` answers for it otherwise: a pull
    /// worker's {what, detail}, with no shard part; a worker's {what, detail, started} with
    /// nothing started and the call's shard part after it, as `item_reply` hands it.
    #[test]
    fn a_joined_report_is_its_outcome_and_the_shards_part_when_it_asks() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let shard_part = [Value::Int(-1), Value::Int(3)];
        assert_eq!(
            joined_report(b"done:completed", &shard_part),
            ["done", "completed"].map(bulk)
        );
        assert_eq!(
            joined_report(b"stale:", &shard_part),
            ["stale", ""].map(bulk)
        );
        assert_eq!(
            joined_report(b"retrying:1765100060123:", &shard_part),
            [
                bulk("retrying"),
                bulk("1765100060123"),
                Value::Array(Vec::new()),
                Value::Int(-1),
                Value::Int(3),
            ]
        );
        assert_eq!(
            joined_report(b"stale::", &shard_part),
            [
                bulk("stale"),
                bulk(""),
                Value::Array(Vec::new()),
                Value::Int(-1),
                Value::Int(3),
            ]
        );
    }

    /// A call of one answers a new runnable admission as its joined string and a replay as
    /// the id alone: each reads as the list the store's reader takes.
    #[test]
    fn a_lone_admissions_short_reply_is_its_list() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        assert_eq!(
            short_reply(
                Batched::Admit,
                b"new:waiting:1765100000123::3:0:-1".to_vec()
            ),
            Value::Array(
                ["new", "waiting", "1765100000123", "", "3", "0", "-1"]
                    .map(bulk)
                    .to_vec()
            )
        );
        let id = "0193b2c4d5e6f708192a3b4c5d6e7f80";
        assert_eq!(
            short_reply(Batched::Admit, id.as_bytes().to_vec()),
            Value::Array(vec![bulk("dup"), bulk(id)])
        );
    }

    /// The remembered names are the names `keys.rs` gives, for every shard of two layouts
    /// whose tags differ (the same shard number names other keys in each).
    #[test]
    fn remembered_shard_keys_are_the_shards_own_names() {
        for map in [
            ShardMap::with_dedicated(16, 2, Layout::CURRENT),
            ShardMap::new(16, Layout::Legacy),
        ] {
            for shard in map.all().chain(map.all()) {
                let k = shard_keys(shard);
                assert_eq!(k.frozen, shard.frozen());
                assert_eq!(k.prefix, shard.prefix());
                assert_eq!(k.runnable, shard.runnable());
                assert_eq!(k.delayed, shard.delayed());
                assert_eq!(k.leases, shard.leases());
                assert_eq!(k.dead_letters, shard.dead_letters());
                assert_eq!(k.stats, shard.stats());
                assert_eq!(k.dead_letter_holders, shard.dead_letter_holders());
            }
        }
    }
}
