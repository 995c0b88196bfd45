//! Reporting a run's outcome to Redis (fenced by the run's token, repeated safely while Redis
//! is unavailable for up to a lease), and, in the same call, starting the shard's next runs on
//! the freed slots.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OwnedSemaphorePermit;

use super::WorkerConfig;
use super::wake::Wake;
use crate::domain::ExecutionId;
use crate::store::{Completion, Outcome, Shard, Started, Store};

/// A completion that also asks for the shard's next runs: how many, the call's number (see
/// `Wake::next_call`), the slots they will run on, and the shard's start lock (held shared
/// until what the call started is launched, see `Wake::starts`).
pub(super) struct Asked {
    pub(super) count: usize,
    pub(super) call: u64,
    pub(super) slot: Option<OwnedSemaphorePermit>,
    pub(super) _guard: tokio::sync::OwnedRwLockReadGuard<()>,
    pub(super) wake: Arc<Wake>,
}

/// What reporting a run's outcome came to.
pub(super) struct Reported {
    /// Whether Redis answered (else the run was given up on: its lease will expire).
    pub(super) reported: bool,
    /// What the completion call started on the run's slot (when it asked).
    pub(super) started: Vec<Started>,
    /// What the answered call said of the shard: its next due time and runnable weight.
    pub(super) learned: Option<(Option<Duration>, u64)>,
}

/// Reports an outcome, retrying while Redis is unavailable for up to one lease TTL (after that
/// the lease has expired and the orphan scan re-runs the execution anyway). Repeating is safe:
/// a report applied before is recognised (`Repeat`). With `asked`, the first call also starts
/// up to `count` of the shard's next runs for this worker; a repeat never does. If that first
/// call goes unanswered it may have started some: `asked` is given up at once (its lock
/// released, the shard made unsure), so the pickup adopts them as soon as Redis answers,
/// while this report is still being repeated.
pub(super) async fn report(
    store: &Store,
    shard: Shard,
    id: &ExecutionId,
    fence: u64,
    outcome: &Outcome,
    config: &WorkerConfig,
    asked: &mut Option<Asked>,
) -> Reported {
    let deadline = tokio::time::Instant::now() + config.lease_ttl;
    let mut pause = Duration::from_millis(50);
    loop {
        let (next, call) = asked.as_ref().map_or((0, 0), |a| (a.count, a.call));
        match store
            .complete_and_start(
                shard,
                id,
                fence,
                &config.consumer,
                outcome,
                next,
                config.lease_ttl,
                call,
            )
            .await
        {
            Ok((Completion::Stale, _)) => {
                tracing::warn!(%id, fence, "late completion refused: the run is no longer current");
                return Reported {
                    reported: true,
                    started: Vec::new(),
                    learned: None,
                };
            }
            // A repeat's answer says nothing of the shard (`complete.lua` answers it from the
            // row alone): the next start call tells its due time and weight, and a retry this
            // run reported sets its own timer (`launch.rs`).
            Ok((Completion::Repeat, _)) => {
                tracing::debug!(%id, fence, "execution reported (a repeat of a report taken)");
                return Reported {
                    reported: true,
                    started: Vec::new(),
                    learned: None,
                };
            }
            Ok((done, batch)) => {
                tracing::debug!(%id, fence, ?done, "execution reported");
                return Reported {
                    reported: true,
                    learned: Some((batch.next_due, batch.weight)),
                    started: batch.started,
                };
            }
            Err(e) => {
                if let Some(mut gone) = asked.take() {
                    // Its slots wait for the `adopt` (the run they were kept for is over),
                    // and the shard is made unsure before the lock goes: no start can slip in
                    // between.
                    if let Some(slot) = gone.slot.take() {
                        gone.wake.keep(slot);
                    }
                    gone.wake.make_unsure();
                }
                if tokio::time::Instant::now() >= deadline {
                    tracing::error!(%id, error = %e, "giving up reporting; the orphan scan will re-run it");
                    return Reported {
                        reported: false,
                        started: Vec::new(),
                        learned: None,
                    };
                }
                tracing::warn!(%id, error = %e, "cannot report completion yet; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
            }
        }
    }
}
