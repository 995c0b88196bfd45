//! Picking up work from one shard. A worker runs one `Pickup` per shard, each on its own task
//! with its own doorbell connection, error state and `adopt` bookkeeping, so a shard whose
//! Redis is slow or down delays only its own executions. What pickups share is the worker's
//! slots (a semaphore of `concurrency` permits, reserved before a start call asks for that
//! many) and the runs it holds.
//!
//! A pickup never polls. It is in one of three states:
//!
//! - **serving**: it has free slots and the shard may have work, so it calls `start` again at
//!   once for as long as each call reads all it asked for;
//! - **listening**: the shard's stream had no unread entry at its last call, so it blocks on the
//!   shard's doorbell (`BZPOPMIN` on a connection of its own, see `store::wake`) and also wakes for
//!   a retry whose backoff ends (`Wake::due`), a nudge from the orphan scan (which found unread
//!   work nobody was woken for), and shutdown;
//! - **queued for a slot**: the shard has work but every slot is taken, so it waits its turn on
//!   the slots (first come, first served), then serves. A marker that arrives meanwhile is given
//!   back to the bell for a worker that has room.
//!
//! A wake-up costs one call per slot that freed or per doorbell rung, never a round of calls over
//! every shard; an idle worker sends nothing but its orphan scans.

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;

use super::Shared;
use super::wake::Wake;
use crate::store::{BellConn, Shard, StartBatch, Started, StoreError};

/// How long the slots of a lost call wait for the `adopt` that finds what it started: a third
/// of the lease, and no more than `KEPT_MAX`. Long enough for a short stall; short enough that a
/// master that died does not keep the other shards' work from the worker's slots for long (an
/// `adopt` answered later waits for slots instead, see `Shared::launch_when_free`).
fn keep_at_most(lease_ttl: Duration) -> Duration {
    (lease_ttl / 3).min(KEPT_MAX)
}
const KEPT_MAX: Duration = Duration::from_secs(1);

/// First pause after a failed call on the shard; it doubles up to `FAILING_PAUSE_MAX`.
const FAILING_PAUSE: Duration = Duration::from_millis(20);
const FAILING_PAUSE_MAX: Duration = Duration::from_secs(1);

/// A `BZPOPMIN` on the shard's doorbell that is out: kept across wake-ups of other kinds, so a
/// marker Redis hands to it is never dropped unread.
type BellWait = Pin<Box<dyn Future<Output = (Option<BellConn>, Result<(), StoreError>)> + Send>>;

/// What the last round of serving found.
enum Served {
    /// No unread entry is left: wait for a wake-up.
    Drained,
    /// Work may be left but no slot is free: wait for one.
    NoSlot,
    /// A call failed: pause before the next.
    Failed,
}

/// Starts executions of one shard for its worker.
pub(super) struct Pickup {
    shard: Shard,
    shared: Arc<Shared>,
    wake: Arc<Wake>,
    /// Most slots one start call reserves while the shard answers: every free one (a backlog
    /// is started in batches, one round trip for many starts). Shards take turns for slots
    /// that free up in the order they asked (`wait_for_slot`), so a busy shard cannot keep the
    /// others out. A failing shard reserves one at a time: its calls may hold their slots for a
    /// whole time-out.
    share: usize,
    /// The doorbell connection while no `BZPOPMIN` is out on it.
    bell: Option<BellConn>,
    /// The `BZPOPMIN` out on it, if any.
    ringing: Option<BellWait>,
    /// Pause before the next doorbell connection after one failed (doubling; zero once a
    /// marker came through).
    bell_pause: Duration,
    // A start whose answer was lost makes the shard unsure (`Wake::unsure`): its slots are
    // kept for the `adopt` (`Wake::kept`), so what it started finds them, but only briefly
    // (`keep_at_most`) — a shard whose master is down may stay unsure for long, and must not
    // starve the others. A run the `adopt` finds no slot for waits for one for half a lease
    // (`Shared::launch_when_free`), then is left to its lease (another worker reruns it), so the
    // concurrency still holds.
    /// Whether the last call failed: an outage is logged once when it begins and once when it
    /// ends, not at every retry.
    failing: bool,
}

impl Pickup {
    pub(super) fn new(shared: Arc<Shared>, shard: Shard, wake: Arc<Wake>) -> Self {
        let share = shared.config.concurrency.max(1);
        Self {
            shard,
            shared,
            wake,
            share,
            bell: None,
            ringing: None,
            bell_pause: Duration::ZERO,
            failing: false,
        }
    }

    /// Picks up work until `stop` is cancelled. A call already sent is always awaited and what
    /// it started is run (drained like the rest): stopping never loses a start's answer.
    pub(super) async fn run(mut self, stop: CancellationToken) {
        let mut pause = FAILING_PAUSE;
        // A worker that starts looks once: work may be waiting from before.
        let mut slot: Option<OwnedSemaphorePermit> = None;
        loop {
            if stop.is_cancelled() {
                return;
            }
            let mut first = slot.take();
            if let Some(given) = self.wake.take_given() {
                match first.as_mut() {
                    Some(f) => f.merge(given),
                    None => first = Some(given),
                }
            }
            let served = self.serve(first).await;
            let next = match served {
                Served::Failed => {
                    // Whichever call failed (the `adopt`, or the group's creation before it),
                    // the slots kept for the `adopt` go back once they waited long enough.
                    self.wake
                        .expire_kept(keep_at_most(self.shared.config.lease_ttl));
                    let wait = pause;
                    pause = (pause * 2).min(FAILING_PAUSE_MAX);
                    self.pause(wait, &stop).await
                }
                Served::NoSlot => {
                    pause = FAILING_PAUSE;
                    self.wait_for_slot(&stop).await
                }
                Served::Drained => {
                    pause = FAILING_PAUSE;
                    self.listen(&stop).await
                }
            };
            match next {
                Some(permit) => slot = permit,
                None => return,
            }
        }
    }

    /// Serves the shard while it has work and the worker has room: `adopt` after a lost start
    /// answer, then start calls, each of as many executions as slots could be reserved
    /// (`first` is a slot reserved already), again at once while a call reads all it asked for.
    async fn serve(&mut self, mut first: Option<OwnedSemaphorePermit>) -> Served {
        loop {
            if self.wake.is_unsure() {
                // The slot this pickup queued for goes to what `adopt` finds (with the slots
                // of the lost calls): with one slot, holding it would leave an adopted run none.
                if !self.adopt(first.take()).await {
                    return Served::Failed;
                }
                continue;
            }
            let Some(reserved) = first
                .take()
                .map(|p| self.top_up(p))
                .or_else(|| self.reserve())
            else {
                return Served::NoSlot;
            };
            match self.start(reserved).await {
                Some(batch) if batch.more => {}
                Some(_) => return Served::Drained,
                None => return Served::Failed,
            }
        }
    }

    /// Takes as many free slots as there are, up to `share`, without waiting; `None` when none
    /// is free.
    fn reserve(&self) -> Option<OwnedSemaphorePermit> {
        let first = self.shared.slots.clone().try_acquire_owned().ok()?;
        Some(self.top_up(first))
    }

    /// Adds free slots to `reserved`, up to `share` (one in all while the shard is failing).
    fn top_up(&self, mut reserved: OwnedSemaphorePermit) -> OwnedSemaphorePermit {
        let most = if self.failing { 1 } else { self.share };
        while reserved.num_permits() < most {
            match self.shared.slots.clone().try_acquire_owned() {
                Ok(more) => reserved.merge(more),
                Err(_) => break,
            }
        }
        reserved
    }

    /// Starts up to `reserved` executions and runs them; the unused slots go back. `None` when
    /// the call failed (its answer may be lost: the shard is then `unsure`).
    async fn start(&mut self, reserved: OwnedSemaphorePermit) -> Option<StartBatch> {
        let (store, config) = (&self.shared.store, &self.shared.config);
        // Until what it started is launched, no `adopt` of the shard runs (see `Wake::starts`).
        let _starting = self.wake.starts.clone().read_owned().await;
        let call = self.wake.next_call();
        let sent = Instant::now();
        match store
            .start(
                self.shard,
                &config.consumer,
                reserved.num_permits(),
                config.lease_ttl,
                call,
            )
            .await
        {
            Ok(mut batch) => {
                self.answered();
                self.wake.learn(batch.next_due, batch.weight);
                let started = std::mem::take(&mut batch.started);
                // A start reads no more than it has slots for; should one ever read more,
                // the extra runs wait for a slot as an adopt's do (never dropped silently).
                let left = self.shared.launch_all(started, sent, Some(reserved));
                self.shared.launch_when_free(left, sent).await;
                Some(batch)
            }
            Err(e) => {
                self.failed(
                    &e,
                    "cannot start executions; will adopt what the call may have started",
                );
                // Its slots wait for what the call may have started (see `Wake::kept`).
                self.wake.keep(reserved);
                self.wake.unsure.store(true, Ordering::SeqCst);
                None
            }
        }
    }

    /// Waits for a wake-up: the doorbell, a due retry, a nudge, or `stop` (`None`). With the
    /// doorbell comes a reserved slot if one is free (else the doorbell is set again and the pickup
    /// waits for a slot, see `wait_for_slot`).
    async fn listen(&mut self, stop: &CancellationToken) -> Option<Option<OwnedSemaphorePermit>> {
        loop {
            let (due_now, due_at) = self.wake.take_due();
            if due_now || self.wake.is_unsure() {
                return Some(None);
            }
            if let Some(given) = self.wake.take_given() {
                return Some(Some(given));
            }
            let mut ringing = self.ringing.take().unwrap_or_else(|| self.ring());
            let due = async move {
                match due_at {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                (conn, rung) = &mut ringing => {
                    self.bell = conn;
                    match rung {
                        Ok(_) => {
                            self.bell_pause = Duration::ZERO;
                            return Some(self.slot_for_ring().await);
                        }
                        Err(e) => {
                            // The connection is gone or was sent away (a failover, a slot
                            // move): another is opened after a pause, and the shard is looked
                            // at once in case a marker went with the old one.
                            tracing::debug!(error = %e, shard = self.shard.number(), "doorbell wait failed");
                            self.bell_pause = (self.bell_pause * 2).clamp(FAILING_PAUSE, FAILING_PAUSE_MAX);
                            return Some(None);
                        }
                    }
                }
                _ = self.wake.notify.notified() => {
                    if !self.wake.nudged.swap(false, Ordering::SeqCst) {
                        // A new due time (or the shard became unsure: the loop's first check
                        // sends it to adopt): wait for it (or for the doorbell) again.
                        self.ringing = Some(ringing);
                        continue;
                    }
                    // A nudge: the orphan scan saw unread work that no doorbell brought here. The
                    // doorbell connection may be stuck on a node that lost the shard (a paused
                    // master a failover replaced): it is opened again, and the shard looked at.
                    drop(ringing);
                    self.bell = None;
                    return Some(None);
                }
                _ = due => self.ringing = Some(ringing),
                _ = stop.cancelled() => return None,
            }
        }
    }

    /// A `BZPOPMIN` on the shard's doorbell, on its connection (opened first when there is none,
    /// after `bell_pause` when the last one failed). The future owns the connection and hands
    /// it back with the answer, so it can be kept across other wake-ups without losing a marker.
    fn ring(&mut self) -> BellWait {
        let (store, shard, pause, conn) = (
            self.shared.store.clone(),
            self.shard,
            self.bell_pause,
            self.bell.take(),
        );
        Box::pin(async move {
            tokio::time::sleep(pause).await;
            let mut conn = match conn {
                Some(c) => c,
                None => match store.open_bell(shard).await {
                    Ok(c) => c,
                    Err(e) => return (None, Err(e)),
                },
            };
            let r = conn.wait().await;
            // A connection whose wait failed is not used again.
            (r.is_ok().then_some(conn), r)
        })
    }

    /// The doorbell rang: a free slot to serve with, or none (the bell is set again for
    /// a worker with room, and the pickup queues for a slot).
    async fn slot_for_ring(&mut self) -> Option<OwnedSemaphorePermit> {
        if let Ok(p) = self.shared.slots.clone().try_acquire_owned() {
            return Some(p);
        }
        self.give_back().await;
        None
    }

    /// Sets the shard's bell again for a wake-up this pickup cannot use.
    async fn give_back(&mut self) {
        if let Err(e) = self.shared.store.ring(self.shard).await {
            tracing::debug!(error = %e, shard = self.shard.number(), "cannot set the doorbell again");
        }
    }

    /// Waits for a free slot (first come, first served among the shards that have work),
    /// passing on any wake-up its doorbell hands over meanwhile. `None` on `stop`.
    async fn wait_for_slot(
        &mut self,
        stop: &CancellationToken,
    ) -> Option<Option<OwnedSemaphorePermit>> {
        let _queued = Queued::join(self.shared.clone(), self.wake.clone());
        loop {
            if self.wake.is_unsure() {
                return Some(None);
            }
            if let Some(given) = self.wake.take_given() {
                return Some(Some(given));
            }
            let slots = self.shared.slots.clone();
            let mut ringing = self.ringing.take();
            let rung = async {
                match ringing.as_mut() {
                    Some(r) => r.await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                permit = slots.acquire_owned() => {
                    self.ringing = ringing;
                    return Some(Some(permit.expect("the slots are never closed")));
                }
                (conn, rung) = rung => {
                    self.bell = conn;
                    if rung.is_ok() {
                        self.give_back().await;
                    }
                }
                // A lost call may have started runs here: they are adopted at once (with the
                // slots the call had), not after this pickup's turn for a slot comes, by which
                // time their leases may have run out.
                _ = self.wake.notify.notified() => self.ringing = ringing,
                _ = stop.cancelled() => return None,
            }
        }
    }

    /// Waits `wait` (a failing shard), or for `stop` (`None`).
    async fn pause(
        &mut self,
        wait: Duration,
        stop: &CancellationToken,
    ) -> Option<Option<OwnedSemaphorePermit>> {
        let until = tokio::time::Instant::now() + wait;
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(until) => return Some(None),
                // A completion's lost call made the shard unsure: adopt now.
                _ = self.wake.notify.notified() => {
                    if self.wake.is_unsure() {
                        return Some(None);
                    }
                }
                _ = stop.cancelled() => return None,
            }
        }
    }

    /// Asks Redis what this worker holds in the shard after a start whose answer was lost, and
    /// runs what it does not know of, never a run it already ended (see `Runs::may_adopt`).
    /// Whether Redis answered.
    ///
    /// `extra` is a slot the pickup holds already; with the slots kept from the lost calls
    /// (`Wake::kept`) and any free one, it runs what the answer names.
    async fn adopt(&mut self, extra: Option<OwnedSemaphorePermit>) -> bool {
        let (store, config, shard) = (&self.shared.store, &self.shared.config, self.shard);
        // Every call that may have started runs here has launched them first.
        let _alone = self.wake.starts.clone().write_owned().await;
        // No call is out now: every one numbered so far is covered.
        let barrier = self.wake.calls.load(Ordering::SeqCst);
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
                barrier,
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
                self.wake.unsure.store(false, Ordering::SeqCst);
                // The lost calls' slots, the pickup's, then any free one (a run that finds
                // none is left to its lease: only possible once kept slots were given back
                // after a lease TTL without an answer).
                let mut reserved = extra;
                if let Some(kept) = self.wake.take_kept() {
                    match reserved.as_mut() {
                        Some(r) => r.merge(kept),
                        None => reserved = Some(kept),
                    }
                }
                let left = self.shared.launch_all(adopted, sent, reserved);
                self.shared.launch_when_free(left, sent).await;
                true
            }
            Err(e) => {
                self.failed(&e, "cannot find out what a lost start call started");
                false
            }
        }
    }

    /// A call failed: the shard may be down.
    fn failed(&mut self, e: &StoreError, what: &str) {
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

/// A pickup counted among those waiting for a slot while this lives.
struct Queued(Arc<Shared>, Arc<Wake>);

impl Queued {
    fn join(shared: Arc<Shared>, wake: Arc<Wake>) -> Self {
        shared.waiting_for_slot.fetch_add(1, Ordering::SeqCst);
        wake.waiting.store(true, Ordering::SeqCst);
        Self(shared, wake)
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        self.1.waiting.store(false, Ordering::SeqCst);
        self.0.waiting_for_slot.fetch_sub(1, Ordering::SeqCst);
        // A slot handed over as the pickup stopped waiting goes back to the worker.
        drop(self.1.take_given());
    }
}
