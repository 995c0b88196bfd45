//! Picking up work from one shard. A worker runs one `Pickup` per shard, each on its own task
//! with its own schedule, error state and `adopt` bookkeeping, so a shard whose Redis is slow
//! or down delays only its own executions: the other shards' starts go on at their own pace.
//! What pickups share is the worker's slots (a semaphore of `concurrency` permits, reserved
//! before a start call asks for that many) and the runs it holds.
//!
//! Today a pickup polls its shard (again at once while it has work, with a doubling pause up to
//! `idle_poll` while it is empty or failing); a wake-up from Redis would replace `idle`, the
//! rest stays as it is.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;

use super::Shared;
use crate::store::{Shard, Started, StoreError};

/// The pause after a call that started something: none to speak of.
const FIRST_PAUSE: Duration = Duration::from_millis(1);

/// Starts executions of one shard for its worker.
pub(super) struct Pickup {
    shard: Shard,
    shared: Arc<Shared>,
    /// Most slots one start call reserves: the worker's concurrency shared out over the shards
    /// (at least one), so one busy shard cannot take every slot in one call.
    share: usize,
    /// Whether the shard's consumer group is known to exist: ensured before the first start
    /// and again after any failure (the shard's Redis may have come back without it).
    group_ready: bool,
    /// Whether a start call's answer was lost: it may have started runs, so nothing else starts
    /// in this shard until `adopt` tells what it holds. Its slots are given back meanwhile —
    /// a shard whose master is down may stay unsure for long, and must not starve the others.
    /// The runs it started hold no slot until adopted; any that then find no free slot are
    /// left to their lease (another worker reruns them), so the concurrency still holds.
    unsure: bool,
    /// Whether the last call failed: an outage is logged once when it begins and once when it
    /// ends, not at every poll.
    failing: bool,
}

impl Pickup {
    pub(super) fn new(shared: Arc<Shared>, shard: Shard) -> Self {
        let shards = usize::from(shared.store.shards().count()).max(1);
        let share = shared.config.concurrency.div_ceil(shards).max(1);
        Self {
            shard,
            shared,
            share,
            group_ready: false,
            unsure: false,
            failing: false,
        }
    }

    /// Picks up work until `stop` is cancelled. A call already sent is always awaited and what
    /// it started is run (drained like the rest): stopping never loses a start's answer.
    pub(super) async fn run(mut self, stop: CancellationToken) {
        let mut pause = FIRST_PAUSE;
        while let Some(launched) = self.pick_up(&stop).await {
            if launched > 0 {
                pause = FIRST_PAUSE;
                continue;
            }
            pause = (pause * 2).min(self.shared.config.idle_poll);
            if !idle(pause, &stop).await {
                return;
            }
        }
    }

    /// One call on the shard: `adopt` when a start's answer was lost, else a start of as many
    /// executions as slots could be reserved. How many runs it launched; `None` once `stop`
    /// is cancelled (checked before a call is sent, never while one is out).
    async fn pick_up(&mut self, stop: &CancellationToken) -> Option<usize> {
        if stop.is_cancelled() {
            return None;
        }
        if !self.group_ready {
            if let Err(e) = self.shared.store.ensure_group(self.shard).await {
                self.failed(&e, "cannot create the shard's consumer group");
                return Some(0);
            }
            self.group_ready = true;
        }
        if self.unsure {
            return Some(self.adopt().await);
        }
        let reserved = self.reserve(stop).await?;
        Some(self.start(reserved).await)
    }

    /// Waits for a free slot, then takes as many more as are free, up to `share`.
    async fn reserve(&self, stop: &CancellationToken) -> Option<OwnedSemaphorePermit> {
        let slots = &self.shared.slots;
        let mut reserved = tokio::select! {
            permit = slots.clone().acquire_owned() => permit.expect("the slots are never closed"),
            _ = stop.cancelled() => return None,
        };
        while reserved.num_permits() < self.share {
            match slots.clone().try_acquire_owned() {
                Ok(more) => reserved.merge(more),
                Err(_) => break,
            }
        }
        Some(reserved)
    }

    /// Starts up to `reserved` executions and runs them; the unused slots go back.
    async fn start(&mut self, reserved: OwnedSemaphorePermit) -> usize {
        let (store, config) = (&self.shared.store, &self.shared.config);
        let sent = Instant::now();
        match store
            .start(
                self.shard,
                &config.consumer,
                reserved.num_permits(),
                config.lease_ttl,
            )
            .await
        {
            Ok(started) => {
                self.answered();
                self.launch_all(started, sent, Some(reserved))
            }
            Err(e) => {
                self.failed(
                    &e,
                    "cannot start executions; will adopt what the call may have started",
                );
                self.unsure = true;
                0
            }
        }
    }

    /// Asks Redis what this worker holds in the shard after a start whose answer was lost, and
    /// runs what it does not know of, never a run it already ended (see `Runs::may_adopt`).
    async fn adopt(&mut self) -> usize {
        let (store, config, shard) = (&self.shared.store, &self.shared.config, self.shard);
        self.shared
            .held
            .lock()
            .expect("held map")
            .ended_while_adopting
            .insert(shard, HashSet::new());
        let sent = Instant::now();
        let result = store
            .adopt(
                shard,
                &config.consumer,
                config.concurrency,
                config.lease_ttl,
            )
            .await;
        let adopted: Vec<Started> = {
            let mut runs = self.shared.held.lock().expect("held map");
            let adopted = match &result {
                Ok(held) => held
                    .iter()
                    .filter(|s| runs.may_adopt(shard, &s.id, s.fence))
                    .cloned()
                    .collect(),
                Err(_) => Vec::new(),
            };
            runs.ended_while_adopting.remove(&shard);
            adopted
        };
        match result {
            Ok(_) => {
                self.answered();
                self.unsure = false;
                // The slots free now (none is waited for: a run that finds none is left to
                // its lease, see `unsure`).
                let free = self.shared.slots.available_permits().min(adopted.len());
                let reserved = u32::try_from(free)
                    .ok()
                    .filter(|n| *n > 0)
                    .and_then(|n| self.shared.slots.clone().try_acquire_many_owned(n).ok());
                self.launch_all(adopted, sent, reserved)
            }
            Err(e) => {
                self.failed(&e, "cannot find out what a lost start call started");
                0
            }
        }
    }

    /// Runs each started execution on a slot of `reserved` (or one free now); the slots left
    /// over go back when `reserved` is dropped.
    fn launch_all(
        &self,
        started: Vec<Started>,
        sent: Instant,
        mut reserved: Option<OwnedSemaphorePermit>,
    ) -> usize {
        let mut launched = 0;
        for s in started {
            // A start reads no more than it was asked for; an adopt answer can exceed the
            // reservation only if this worker forgot runs it could not report (more than
            // `UNREPORTED_KEPT`): then a free slot is needed, or the run is left to expire.
            let slot = reserved
                .as_mut()
                .and_then(|r| r.split(1))
                .or_else(|| self.shared.slots.clone().try_acquire_owned().ok());
            let Some(slot) = slot else {
                tracing::warn!(
                    id = %s.id,
                    fence = s.fence,
                    shard = self.shard.number(),
                    "no free slot for a run Redis names as this worker's; its lease will expire"
                );
                continue;
            };
            self.shared.launch(s, sent, slot);
            launched += 1;
        }
        launched
    }

    /// A call failed: the shard may be down, or may have lost its group with its data.
    fn failed(&mut self, e: &StoreError, what: &str) {
        self.group_ready = false;
        if self.failing {
            tracing::debug!(error = %e, shard = self.shard.number(), "{what}");
        } else {
            tracing::warn!(error = %e, shard = self.shard.number(), "{what}");
            self.failing = true;
        }
    }

    /// A call was answered.
    fn answered(&mut self) {
        if self.failing {
            tracing::info!(shard = self.shard.number(), "shard answers again");
            self.failing = false;
        }
    }
}

/// Waits `pause` before the next poll; false when `stop` was cancelled meanwhile.
async fn idle(pause: Duration, stop: &CancellationToken) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(pause) => true,
        _ = stop.cancelled() => false,
    }
}
