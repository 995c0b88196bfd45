//! How a shard's pickup learns it has something to do besides its doorbell, and the state
//! the worker's tasks share with it about the shard: the lost-call bookkeeping `adopt` needs
//! (unsure, the call barrier, the kept slots), the shard's weight for passing slots on, and a
//! slot handed over by another shard. One [`Wake`] per shard, shared by the pickup, the
//! launcher, the reporter and the orphan scan.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, OwnedSemaphorePermit, RwLock};

/// How a shard's pickup is woken besides its doorbell: by the orphan scan (`nudge`), by the
/// end of a retry backoff this worker scheduled (`set_due_in`), and by a completion whose
/// call may have started a run nobody heard of (`make_unsure`). Shared between the pickup and
/// the worker's other tasks.
#[derive(Default)]
pub(super) struct Wake {
    pub(super) notify: Notify,
    /// Whether the orphan scan nudged since the pickup last looked.
    pub(super) nudged: AtomicBool,
    /// The earliest known end of a retry backoff in the shard.
    due: Mutex<Option<Instant>>,
    /// Whether a call that starts runs (a start, or a completion that asked for the next run)
    /// went unanswered: it may have started runs, so nothing else starts in this shard until
    /// `adopt` tells what the worker holds there.
    pub(super) unsure: AtomicBool,
    /// Held shared by every call that starts runs in the shard until what it started is
    /// launched, and exclusively by `adopt`: so an `adopt` answer never names a run whose
    /// start is still on its way back, which would then run twice.
    pub(super) starts: Arc<RwLock<()>>,
    /// The number of the last call that may start runs in the shard (taken with `starts` held
    /// shared, see `next_call`). `adopt` sends it as its barrier: a lost call that Redis runs
    /// only after the `adopt` (calls on different connections resume in any order after a
    /// stall) then starts nothing, instead of a run nobody knows of.
    pub(super) calls: AtomicU64,
    /// The slots of calls whose answer was lost, kept for what `adopt` finds they started (a
    /// call starts at most as many runs as it had slots), with when the first was kept: other
    /// shards cannot take them meanwhile and leave an adopted run without a slot. Given back
    /// when the `adopt` is answered, or at the first failed call of the shard after
    /// `keep_at_most` (a shard that is down must not hold the worker's slots).
    kept: Mutex<Option<(OwnedSemaphorePermit, Instant)>>,
    /// The summed weight of the shard's runnable tenants, as its last answered call said: the
    /// worker shares freed slots between shards in proportion to it (`Shared::pass_on`).
    weight: AtomicU64,
    /// Whether the pickup waits for a slot (`wait_for_slot`): only then is a slot handed to it.
    pub(super) waiting: AtomicBool,
    /// A slot another shard's run handed to this shard (its turn by weight), until the pickup
    /// takes it.
    given: Mutex<Option<OwnedSemaphorePermit>>,
}

impl Wake {
    /// A call that starts runs went unanswered: the pickup adopts before it starts more.
    pub(super) fn make_unsure(&self) {
        self.unsure.store(true, Ordering::SeqCst);
        self.notify.notify_one();
    }

    /// Numbers a call that may start runs; call it with `starts` held shared.
    pub(super) fn next_call(&self) -> u64 {
        self.calls.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Keeps the slots of a call whose answer was lost for the `adopt` that follows.
    pub(super) fn keep(&self, slots: OwnedSemaphorePermit) {
        let mut kept = self.kept.lock().expect("kept slots");
        match kept.as_mut() {
            Some((all, _)) => all.merge(slots),
            None => *kept = Some((slots, Instant::now())),
        }
    }

    /// The kept slots, if any.
    pub(super) fn take_kept(&self) -> Option<OwnedSemaphorePermit> {
        self.kept.lock().expect("kept slots").take().map(|(p, _)| p)
    }

    /// Gives the kept slots back to the worker if they were kept for longer than `most`.
    pub(super) fn expire_kept(&self, most: Duration) {
        let mut kept = self.kept.lock().expect("kept slots");
        if kept
            .as_ref()
            .is_some_and(|(_, since)| since.elapsed() >= most)
        {
            *kept = None;
        }
    }

    /// Whether the shard waits for an `adopt`.
    pub(super) fn is_unsure(&self) -> bool {
        self.unsure.load(Ordering::SeqCst)
    }

    /// The shard may have work nobody was woken for: look now.
    pub(super) fn nudge(&self) {
        self.nudged.store(true, Ordering::SeqCst);
        self.notify.notify_one();
    }

    /// The shard's runnable weight, as a call just answered.
    fn set_weight(&self, weight: u64) {
        self.weight.store(weight, Ordering::SeqCst);
    }

    /// The shard's runnable weight as last seen.
    pub(super) fn weight(&self) -> u64 {
        self.weight.load(Ordering::SeqCst)
    }

    /// Whether the pickup waits for a slot now.
    pub(super) fn is_waiting(&self) -> bool {
        self.waiting.load(Ordering::SeqCst)
    }

    /// Hands a freed slot to this shard's pickup (the shard's turn by weight).
    pub(super) fn give(&self, slot: OwnedSemaphorePermit) {
        let mut given = self.given.lock().expect("given slot");
        match given.as_mut() {
            Some(all) => all.merge(slot),
            None => *given = Some(slot),
        }
        drop(given);
        self.notify.notify_one();
    }

    /// The slot handed to the pickup, if any.
    pub(super) fn take_given(&self) -> Option<OwnedSemaphorePermit> {
        self.given.lock().expect("given slot").take()
    }

    /// What an answered call said of the shard: when its earliest scheduled execution is due
    /// and how much runnable weight it has.
    pub(super) fn learn(&self, next_due: Option<Duration>, weight: u64) {
        self.set_weight(weight);
        if let Some(wait) = next_due {
            self.set_due_in(wait);
        }
    }

    /// An execution of the shard (a scheduled one, or a retry) is due after `wait`.
    pub(super) fn set_due_in(&self, wait: Duration) {
        let at = Instant::now() + wait;
        let mut due = self.due.lock().expect("due");
        if due.is_none_or(|d| at < d) {
            *due = Some(at);
            drop(due);
            self.notify.notify_one();
        }
    }

    /// The due time if it has come (and forgets it), else when it comes.
    pub(super) fn take_due(&self) -> (bool, Option<Instant>) {
        let mut due = self.due.lock().expect("due");
        match *due {
            Some(d) if d <= Instant::now() => {
                *due = None;
                (true, None)
            }
            other => (false, other),
        }
    }
}
