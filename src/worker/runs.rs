//! The runs a worker holds: each with its lease, stop token and stop reason, and the runs it
//! must never start again (ended while an `adopt` was out, or never reported). The heartbeat,
//! the stop listener, the launcher and `adopt` all read and change this one map.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

use super::Lease;
use crate::domain::ExecutionId;
use crate::store::Shard;

/// Why a running execution was told to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum Stop {
    /// Its cancel was requested: it ends `cancelled`.
    Cancel = 1,
    /// Its lease is no longer this worker's (force-deleted, reclaimed or superseded).
    Lost = 2,
    /// The worker shuts down past its drain timeout: the run is released, not counted.
    Shutdown = 3,
    /// This worker can no longer prove it holds the lease: the run is abandoned.
    Expired = 4,
}

/// The stop reason of one run, shared by its runner and whoever stops it (the heartbeat, the
/// lease deadline, the shutdown): none until one is recorded.
#[derive(Default)]
pub(super) struct StopReason(AtomicU8);

impl StopReason {
    /// Records `why` unless a reason is already recorded (the first one wins).
    pub(super) fn record(&self, why: Stop) {
        let _ = self
            .0
            .compare_exchange(0, why as u8, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// Records `why` over any earlier reason (a shutdown's release wins).
    pub(super) fn overrule(&self, why: Stop) {
        self.0.store(why as u8, Ordering::SeqCst);
    }

    /// The reason recorded, if any.
    pub(super) fn get(&self) -> Option<Stop> {
        match self.0.load(Ordering::SeqCst) {
            1 => Some(Stop::Cancel),
            2 => Some(Stop::Lost),
            3 => Some(Stop::Shutdown),
            4 => Some(Stop::Expired),
            _ => None,
        }
    }
}

/// An execution this worker runs.
pub(super) struct Held {
    pub(super) shard: Shard,
    pub(super) fence: u64,
    pub(super) lease: Lease,
    pub(super) stop: CancellationToken,
    pub(super) why: Arc<StopReason>,
}

/// What a worker runs, and what it must never start again: a run (execution, fence) is
/// started at most once by a worker, whatever an `adopt` answer says.
#[derive(Default)]
pub(super) struct Runs {
    pub(super) held: HashMap<ExecutionId, Held>,
    /// Per shard with an `adopt` call out: runs that ended meanwhile. Redis may have run the
    /// call before it heard of their end, so its answer can still name them.
    pub(super) ended_while_adopting: HashMap<Shard, HashSet<(ExecutionId, u64)>>,
    /// Runs whose end could not be reported (Redis unreachable for a lease): Redis shows them
    /// held by this worker until their lease expires. The newest `UNREPORTED_KEPT`.
    pub(super) unreported: VecDeque<(ExecutionId, u64)>,
}

/// How many unreported runs a worker remembers (they are rare: each took a lease-long outage).
const UNREPORTED_KEPT: usize = 1024;

impl Runs {
    /// Whether an `adopt` answer naming this run of `shard` may be run here.
    pub(super) fn may_adopt(&self, shard: Shard, id: &ExecutionId, fence: u64) -> bool {
        let run = (id.clone(), fence);
        !self.held.contains_key(id)
            && !self
                .ended_while_adopting
                .get(&shard)
                .is_some_and(|ended| ended.contains(&run))
            && !self.unreported.contains(&run)
    }

    /// A run is over (reported, or given up on when `reported` is false).
    pub(super) fn ended(&mut self, shard: Shard, id: &ExecutionId, fence: u64, reported: bool) {
        if let Some(ended) = self.ended_while_adopting.get_mut(&shard) {
            ended.insert((id.clone(), fence));
        }
        if !reported {
            if self.unreported.len() >= UNREPORTED_KEPT {
                self.unreported.pop_front();
            }
            self.unreported.push_back((id.clone(), fence));
        }
        // Only this run: the execution's next run may have started here already (its report
        // re-queued it and a pickup started it again before this task got here), and it is
        // held under the same id. Removing that one would leave it without heartbeats.
        if self.held.get(id).is_some_and(|h| h.fence == fence) {
            self.held.remove(id);
        }
    }
}

pub(super) type HeldMap = Arc<Mutex<Runs>>;
