//! Launching runs and passing their slots on: each started execution runs in a task of its
//! own, reports its outcome, and its freed slot either starts the shard's next run in the
//! same call (a chain), goes to another shard's waiting pickup (picked by weight), or goes
//! back to the worker's free slots.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Instant, SystemTime};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::report::{Asked, report};
use super::run::run_one;
use super::runs::{Held, HeldMap, StopReason};
use super::wake::Wake;
use super::{Lease, Registry, ShardShare, WorkerConfig};
use crate::store::{Outcome, Shard, Started, Store};

/// What the worker's tasks share: the pickups (one per shard) reserve slots and launch runs.
pub(super) struct Shared {
    pub(super) store: Arc<Store>,
    pub(super) registry: Arc<Registry>,
    pub(super) config: WorkerConfig,
    pub(super) held: HeldMap,
    /// One permit per execution this worker may run at once. A pickup reserves permits before
    /// its start call asks for that many; each run keeps one until its end was reported (or
    /// given up on), so however many shards race, no more than `concurrency` handlers run.
    pub(super) slots: Arc<Semaphore>,
    /// The tasks of running executions; taken out and drained at shutdown.
    pub(super) runs: Mutex<JoinSet<()>>,
    /// Per shard: how its pickup is woken besides its doorbell (the orphan scan's nudge, a
    /// retry coming due), and the lock that keeps `adopt` apart from the shard's other starts.
    pub(super) wakes: HashMap<Shard, Arc<Wake>>,
    /// Cancelled when the worker stops reading (shutdown): no run starts another then.
    pub(super) reading: CancellationToken,
    /// Pickups waiting for a free slot (their shards have work): while there are any, a freed
    /// slot goes to a shard picked by weight (`pass_on`).
    pub(super) waiting_for_slot: AtomicUsize,
    /// The smooth weighted round robin between shards (`pick_shard`).
    pub(super) share: Mutex<ShardShare>,
    /// This `Shared`, for the run tasks (which must not keep it alive: it owns their set).
    pub(super) me: Weak<Shared>,
}

/// Where a run's freed slot goes.
pub(super) enum Next {
    /// To the shard's next run, started by the completion call (the guard keeps `adopt` out
    /// until what it started is known).
    Chain(tokio::sync::OwnedRwLockReadGuard<()>),
    /// To another shard's pickup, picked by weight.
    Hand(Arc<Wake>),
    /// Back to the worker's free slots.
    Free,
}

impl Shared {
    /// Runs each started execution on a slot of `reserved` (or one free now); the slots left
    /// over go back when `reserved` is dropped. The runs no slot was free for come back.
    pub(super) fn launch_all(
        &self,
        started: Vec<Started>,
        sent: Instant,
        mut reserved: Option<OwnedSemaphorePermit>,
    ) -> Vec<Started> {
        let mut left = Vec::new();
        for s in started {
            // A start reads no more than it was asked for; an adopt answer can exceed the
            // slots it has when the lost calls' slots were given back (`Wake::kept`), or when
            // this worker forgot runs it could not report (more than `UNREPORTED_KEPT`).
            let slot = reserved
                .as_mut()
                .and_then(|r| r.split(1))
                .or_else(|| self.slots.clone().try_acquire_owned().ok());
            match slot {
                Some(slot) => self.launch(s, sent, slot),
                None => left.push(s),
            }
        }
        left
    }

    /// Runs adopted executions that found no free slot as slots free up (first come, first
    /// served with the other shards), for up to half a lease after the `adopt` call that
    /// extended their leases was sent at `sent`; one still waiting then is left to its lease
    /// (another worker reruns it). Called with the shard's start lock held exclusively, so no
    /// other `adopt` can name these runs meanwhile.
    pub(super) async fn launch_when_free(&self, left: Vec<Started>, sent: Instant) {
        let deadline = sent + self.config.lease_ttl / 2;
        for s in left {
            let slot =
                tokio::time::timeout_at(deadline.into(), self.slots.clone().acquire_owned()).await;
            match slot {
                Ok(slot) => {
                    let slot = slot.expect("the slots are never closed");
                    self.launch(s, sent, slot);
                }
                Err(_) => tracing::warn!(
                    id = %s.id,
                    fence = s.fence,
                    shard = s.shard.number(),
                    "no slot freed within half a lease for a run Redis names as this worker's; \
                     its lease will expire"
                ),
            }
        }
    }

    /// Runs a started execution on `slot`, its lease granted by a call sent at `sent`.
    pub(super) fn launch(&self, s: Started, sent: Instant, slot: OwnedSemaphorePermit) {
        let stop = CancellationToken::new();
        let why = Arc::new(StopReason::default());
        let lease = Lease::granted(sent, self.config.lease_ttl);
        self.held.lock().expect("held map").held.insert(
            s.id.clone(),
            Held {
                shard: s.shard,
                fence: s.fence,
                lease: lease.clone(),
                stop: stop.clone(),
                why: why.clone(),
            },
        );
        // The task holds what it needs, and `Shared` only weakly: dropping the worker aborts
        // the runs.
        let (store, registry, config, held, wake, me) = (
            self.store.clone(),
            self.registry.clone(),
            self.config.clone(),
            self.held.clone(),
            self.wakes.get(&s.shard).cloned(),
            self.me.clone(),
        );
        let mut runs = self.runs.lock().expect("run set");
        // Reap finished tasks so the set does not grow.
        while runs.try_join_next().is_some() {}
        // Spans (crate::otel): the start call ran from `sent` until now.
        let answered = SystemTime::now();
        let sent_at = answered.checked_sub(sent.elapsed()).unwrap_or(answered);
        runs.spawn(async move {
            let (shard, id, fence) = (s.shard, s.id.clone(), s.fence);
            let spans = crate::otel::RunSpans::begin(&s, sent_at, answered);
            let mut s = s;
            if let Some(spans) = &spans {
                s.trace = Some(spans.handler_trace());
            }
            let outcome = run_one(&registry, s, lease, stop, &why, &config).await;
            let reported_from = SystemTime::now();
            // Whether this slot starts the shard's next run in the same call, and with how many
            // slots: this one, and while no other shard waits for a slot, every free one (a
            // backlog is then started in batches, as a pickup's start call does).
            let mut hand = None;
            let chain = me
                .upgrade()
                .and_then(|shared| match shared.pass_on(shard, &outcome) {
                    Next::Chain(g) => Some((shared, g)),
                    Next::Hand(other) => {
                        hand = Some(other);
                        None
                    }
                    Next::Free => None,
                });
            let mut slot = slot;
            if let Some((shared, _)) = &chain
                && shared.waiting_for_slot.load(Ordering::SeqCst) == 0
            {
                while slot.num_permits() < shared.config.concurrency {
                    match shared.slots.clone().try_acquire_owned() {
                        Ok(more) => slot.merge(more),
                        Err(_) => break,
                    }
                }
            }
            let sent = Instant::now();
            let (shared, guard) = chain.unzip();
            // With a chain, the slots go with the call: to the runs it starts, or, if its
            // answer is lost, to the `adopt` that finds them (see `Wake::kept`).
            let (mut asked, slot) = match (guard, &wake) {
                (Some(guard), Some(wake)) => (
                    Some(Asked {
                        count: slot.num_permits(),
                        call: wake.next_call(),
                        slot: Some(slot),
                        _guard: guard,
                        wake: wake.clone(),
                    }),
                    None,
                ),
                _ => match hand {
                    // The report does not wait for the other shard's start.
                    Some(other) => {
                        other.give(slot);
                        (None, None)
                    }
                    None => (None, Some(slot)),
                },
            };
            let report = report(&store, shard, &id, fence, &outcome, &config, &mut asked).await;
            if let Some(spans) = spans {
                let (name, error) = match &outcome {
                    Outcome::Completed(_) => ("completed", None),
                    Outcome::Failed { message, .. } => ("failed", Some(message.as_str())),
                    Outcome::Cancelled => ("cancelled", None),
                    Outcome::Released => ("released", None),
                    Outcome::Abandoned => ("abandoned", Some("lease not renewed in time")),
                };
                spans.end(name, error, reported_from);
            }
            // A retry after a backoff: this worker looks again when it is due (any worker's
            // orphan scan would put it back too, later).
            if let (
                Outcome::Failed {
                    retry_after: Some(wait),
                    ..
                },
                Some(wake),
            ) = (&outcome, &wake)
            {
                wake.set_due_in(*wait);
            }
            if let (Some(wake), Some((due, weight))) = (&wake, report.learned) {
                wake.learn(due, weight);
            }
            held.lock()
                .expect("held map")
                .ended(shard, &id, fence, report.reported);
            let (Some(shared), Some(mut asked)) = (shared, asked) else {
                drop(slot);
                return;
            };
            let mut slot = asked.slot.take();
            for next in report.started {
                // A start reads no more entries than it was asked for: one slot each.
                match slot
                    .as_mut()
                    .and_then(|s| s.split(1))
                    .or_else(|| shared.slots.clone().try_acquire_owned().ok())
                {
                    Some(s) => shared.launch(next, sent, s),
                    None => tracing::warn!(
                        id = %next.id,
                        "no free slot for a run Redis names as this worker's; its lease will expire"
                    ),
                }
            }
            // The slots it did not use go back.
            drop(slot);
            // Until here no `adopt` of the shard could run: what this call started is known
            // before Redis is asked what the worker holds.
            drop(asked);
        });
    }

    /// Where the slot of a run of `shard` that ended with `outcome` goes. While other shards'
    /// pickups wait for a slot, the shards with runnable work take turns by weight
    /// (`pick_shard`): the run's own shard chains its next run only when it is picked, else the
    /// slot is handed to the picked shard. The own shard never chains while stopping, after a
    /// run that lost its lease or is handed back, or while it awaits an `adopt`.
    pub(super) fn pass_on(&self, shard: Shard, outcome: &Outcome) -> Next {
        if self.reading.is_cancelled() || matches!(outcome, Outcome::Released | Outcome::Abandoned)
        {
            return Next::Free;
        }
        if self.waiting_for_slot.load(Ordering::SeqCst) > 0
            && let Some(other) = self.pick_shard(shard)
            && other != shard
        {
            return match self.wakes.get(&other) {
                Some(w) => Next::Hand(w.clone()),
                None => Next::Free,
            };
        }
        let Some(wake) = self.wakes.get(&shard) else {
            return Next::Free;
        };
        let Ok(guard) = wake.starts.clone().try_read_owned() else {
            return Next::Free;
        };
        // Checked with the guard held: shutdown takes every shard's lock once it has stopped
        // reading, so a run that passes this check is launched before the drain begins.
        if self.reading.is_cancelled() || wake.is_unsure() {
            return Next::Free;
        }
        Next::Chain(guard)
    }

    /// The shard a freed slot goes to, among `own` and the shards whose pickups wait for a
    /// slot, in proportion to their runnable weight (`ShardShare`). `None` when no candidate
    /// has runnable work.
    pub(super) fn pick_shard(&self, own: Shard) -> Option<Shard> {
        let candidates: Vec<(Shard, i64)> = self
            .wakes
            .iter()
            .filter(|(s, w)| **s == own || w.is_waiting())
            .map(|(s, w)| {
                let weight = i64::try_from(w.weight()).unwrap_or(i64::MAX / 4);
                // A pickup waits for a slot only when its shard has work; one that has not
                // been answered since (its first call, or a doorbell after a drain) counts as
                // weight 1 until its call tells.
                let weight = if *s != own { weight.max(1) } else { weight };
                (*s, weight)
            })
            .collect();
        self.share.lock().expect("share").pick(&candidates)
    }
}
