//! The sweeper, run by `serve`: it walks every tenant's slot set, waiting set and listing
//! and removes members whose execution is terminal, gone or elsewhere (giving freed
//! slots to waiting executions). Each repair is logged and counted.
//!
//! One process sweeps at a time: at each interval, whichever `serve` takes the turn on Redis
//! first does the work. A turn has a budget of script calls, and the walk resumes where the
//! last turn of this process stopped, so a tenant with years of history costs a bounded amount
//! per interval instead of a full scan every time.
//!
//! Each shard is walked on its own, the shards of a turn at the same time, the budget shared
//! out over those with work: a shard whose calls fail (its Redis down, or data it cannot read)
//! is tried again next turn, and the other shards' walks go on meanwhile.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::store::{ANNOUNCE_EVERY, LIBRARY_GRACE, Shard, Store, StoreError, SweepStep};

/// Members checked per script call: keeps each call short.
const BATCH: usize = 200;
/// Script calls per turn of the periodic sweeper (up to ~200k members checked).
const CALLS_PER_TURN: usize = 1_000;

/// Repairs made, by kind (`slots`, `waiting`, `index`).
pub type Repairs = HashMap<&'static str, u64>;

/// What one turn of sweeping did.
#[derive(Debug, Default)]
pub struct Turn {
    pub repairs: Repairs,
    /// The round is complete: every shard was walked to its end, or gave up after an error.
    /// The next turn starts a new round.
    pub done: bool,
    /// Shards whose calls failed in this turn: each is tried again next turn, starting its
    /// walk over, while the other shards go on where they were.
    pub failed: Vec<(Shard, StoreError)>,
}

/// A resumable walk over everything the sweeper checks: one walk per shard, each with its own
/// position and errors, so a shard that fails or does not answer holds back no other shard.
pub struct Sweeper {
    store: Arc<Store>,
    shards: Vec<Shard>,
    /// The walk of each shard of `shards`, at the same position.
    walks: Vec<Walk>,
    /// Which shard gets the first share of a budget that does not divide evenly (rotates).
    next: usize,
}

/// Where the sweep of one shard stands in the current round.
enum Walk {
    /// To be started (its tenants read) at the next turn.
    Due,
    /// Walks not started yet, and the walk in progress with its SCAN cursor.
    Walking {
        queue: VecDeque<SweepStep>,
        /// Bytes: an index walk's cursor is a listing member, which holds an execution id.
        current: Option<(SweepStep, Vec<u8>)>,
    },
    /// Walked to the end in this round.
    Finished,
    /// A call failed in this round: tried again, from the start, next turn.
    Failed,
}

impl Walk {
    /// Whether this round needs nothing more of the shard (a failed shard does not hold the
    /// round up: it is tried again next turn, or in the next round).
    fn settled(&self) -> bool {
        matches!(self, Walk::Finished | Walk::Failed)
    }
}

impl Sweeper {
    /// A sweeper with nothing walked yet.
    pub fn new(store: Arc<Store>) -> Self {
        let shards: Vec<Shard> = store.shards().all().collect();
        let walks = shards.iter().map(|_| Walk::Due).collect();
        Self {
            store,
            shards,
            walks,
            next: 0,
        }
    }

    /// Sweeps for at most `calls` script calls, shared out over the shards that have work and
    /// made on all of them at once (a round starts over once everything was walked).
    pub async fn advance(&mut self, calls: usize) -> Turn {
        let mut turn = Turn::default();
        if self.walks.iter().all(Walk::settled) {
            self.walks.iter_mut().for_each(|w| *w = Walk::Due);
        }
        self.start_walks(&mut turn).await;
        let mut budget = calls;
        while budget > 0 {
            let walking: Vec<usize> = (0..self.walks.len())
                .map(|i| (self.next + i) % self.walks.len())
                .filter(|&i| matches!(self.walks[i], Walk::Walking { .. }))
                .collect();
            if walking.is_empty() {
                break;
            }
            self.next = (self.next + 1) % self.walks.len();
            let mut steps = JoinSet::new();
            for (k, &i) in walking.iter().enumerate() {
                let share = budget / walking.len() + usize::from(k < budget % walking.len());
                if share == 0 {
                    continue;
                }
                // Failed unless the task hands the walk back (it might panic).
                let walk = std::mem::replace(&mut self.walks[i], Walk::Failed);
                let store = self.store.clone();
                steps.spawn(async move { (i, walk_for(&store, walk, share).await) });
            }
            while let Some(stepped) = steps.join_next().await {
                let Ok((i, (walk, used, repairs, error))) = stepped else {
                    continue;
                };
                budget = budget.saturating_sub(used);
                for (k, n) in repairs {
                    *turn.repairs.entry(k).or_default() += n;
                }
                if let Some(e) = error {
                    turn.failed.push((self.shards[i], e));
                }
                self.walks[i] = walk;
            }
        }
        turn.done = self.walks.iter().all(Walk::settled);
        turn
    }

    /// Reads the tenants of every shard whose walk is due (or failed before), all at once.
    async fn start_walks(&mut self, turn: &mut Turn) {
        let mut reads = JoinSet::new();
        for (i, walk) in self.walks.iter().enumerate() {
            if matches!(walk, Walk::Due | Walk::Failed) {
                let store = self.store.clone();
                let shard = self.shards[i];
                reads.spawn(async move { (i, store.shard_sweep_targets(shard).await) });
            }
        }
        while let Some(read) = reads.join_next().await {
            let Ok((i, targets)) = read else { continue };
            self.walks[i] = match targets {
                Ok(targets) => {
                    let queue: VecDeque<SweepStep> =
                        targets.iter().flat_map(|t| t.steps()).collect();
                    if queue.is_empty() {
                        Walk::Finished
                    } else {
                        Walk::Walking {
                            queue,
                            current: None,
                        }
                    }
                }
                Err(e) => {
                    turn.failed.push((self.shards[i], e));
                    Walk::Failed
                }
            };
        }
    }
}

/// Walks one shard for at most `calls` script calls: the walk as it stands afterwards, the
/// calls made, the repairs, and the error that ended it early.
async fn walk_for(
    store: &Store,
    walk: Walk,
    calls: usize,
) -> (Walk, usize, Repairs, Option<StoreError>) {
    let mut repairs = Repairs::new();
    let Walk::Walking {
        mut queue,
        mut current,
    } = walk
    else {
        return (walk, 0, repairs, None);
    };
    for used in 0..calls {
        let (step, cursor) = match current.take() {
            Some(c) => c,
            None => match queue.pop_front() {
                Some(step) => (step, b"0".to_vec()),
                None => return (Walk::Finished, used, repairs, None),
            },
        };
        match store.sweep_step(&step, &cursor, BATCH).await {
            Ok((next, n)) => {
                if n > 0 {
                    *repairs.entry(step.mode.as_str()).or_default() += n;
                }
                if next != b"0" {
                    current = Some((step, next));
                }
            }
            Err(e) => return (Walk::Failed, used + 1, repairs, Some(e)),
        }
    }
    let walk = if queue.is_empty() && current.is_none() {
        Walk::Finished
    } else {
        Walk::Walking { queue, current }
    };
    (walk, calls, repairs, None)
}

/// Sweeps every `interval` until `stop` is cancelled.
pub async fn run(store: Arc<Store>, interval: Duration, stop: CancellationToken) {
    let owner = crate::worker::default_consumer();
    let mut sweeper = Sweeper::new(store.clone());
    // The first sweep waits one interval: a fresh process has nothing to repair yet.
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // When this process last looked for other builds' Lua libraries to delete.
    let mut retired: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.cancelled() => return,
        }
        // This build's library is in use (at most once per ANNOUNCE_EVERY).
        if let Err(e) = store.announce_library(false).await {
            tracing::warn!(error = %e, "cannot record that this build's Lua library is in use");
        }
        // The turn is held at most one interval (a stuck process cannot keep it) and given
        // back when done, so the next interval's turn is free for whoever comes first.
        match store.take_sweeper_turn(&owner, interval).await {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "sweeper cannot take its turn");
                continue;
            }
        }
        let turn = sweeper.advance(CALLS_PER_TURN).await;
        log(&turn.repairs);
        log_failures(&turn.failed);
        if retired.is_none_or(|at| at.elapsed() >= ANNOUNCE_EVERY) {
            retired = Some(tokio::time::Instant::now());
            if let Err(e) = store.retire_libraries(LIBRARY_GRACE).await {
                tracing::warn!(error = %e, "cannot delete the Lua libraries of older builds");
            }
        }
        if let Err(e) = store.end_sweeper_turn(&owner).await {
            tracing::warn!(error = %e, "sweeper cannot give back its turn");
        }
    }
}

/// One complete sweep if this process gets the turn (held for `hold`); the repairs made, or
/// `None` when another process has the turn.
pub async fn sweep_once(store: Arc<Store>, owner: &str, hold: Duration) -> Option<Repairs> {
    match store.take_sweeper_turn(owner, hold).await {
        Ok(true) => {}
        Ok(false) => return None,
        Err(e) => {
            tracing::warn!(error = %e, "sweeper cannot take its turn");
            return None;
        }
    }
    let mut sweeper = Sweeper::new(store.clone());
    let mut total = Repairs::new();
    // Bounded: one round of a store this size needs far fewer calls. A shard that fails is
    // left out of this sweep (the others are swept all the same) and logged.
    for _ in 0..10_000 {
        let turn = sweeper.advance(CALLS_PER_TURN).await;
        for (k, n) in turn.repairs {
            *total.entry(k).or_default() += n;
        }
        log_failures(&turn.failed);
        if turn.done {
            break;
        }
    }
    log(&total);
    if let Err(e) = store.end_sweeper_turn(owner).await {
        tracing::warn!(error = %e, "sweeper cannot give back its turn");
    }
    Some(total)
}

fn log(repairs: &Repairs) {
    for (kind, n) in repairs {
        if *n > 0 {
            tracing::warn!(kind, repaired = n, "sweeper repaired drift");
        }
    }
}

fn log_failures(failed: &[(Shard, StoreError)]) {
    for (shard, e) in failed {
        tracing::warn!(
            shard = shard.number(),
            error = %e,
            "cannot sweep this shard now; it starts over next turn, the others go on"
        );
    }
}
