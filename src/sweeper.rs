//! The sweeper, run by `serve`: it walks every tenant's slot set, waiting set and status
//! indexes and removes members whose execution is terminal, gone or elsewhere (giving freed
//! slots to waiting executions). Each repair is logged and counted.
//!
//! One process sweeps at a time: at each interval, whichever `serve` takes the turn on Redis
//! first does the work. A turn has a budget of script calls, and the walk resumes where the
//! last turn of this process stopped, so a tenant with years of history costs a bounded amount
//! per interval instead of a full scan every time.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::store::{Store, StoreError, SweepStep};

/// Members checked per script call: keeps each call short.
const BATCH: usize = 200;
/// Script calls per turn of the periodic sweeper (up to ~200k members checked).
const CALLS_PER_TURN: usize = 1_000;

/// Repairs made, by kind (`slots`, `waiting`, `index`).
pub type Repairs = HashMap<&'static str, u64>;

/// A resumable walk over everything the sweeper checks.
pub struct Sweeper {
    store: Arc<Store>,
    /// Walks not started yet in this round.
    queue: VecDeque<SweepStep>,
    /// The walk in progress and its SCAN cursor.
    current: Option<(SweepStep, String)>,
}

impl Sweeper {
    /// A sweeper with nothing walked yet.
    pub fn new(store: Arc<Store>) -> Self {
        Self {
            store,
            queue: VecDeque::new(),
            current: None,
        }
    }

    /// Sweeps for at most `calls` script calls (a round starts over once everything was
    /// walked); returns the repairs made and whether the round is complete.
    pub async fn advance(&mut self, calls: usize) -> Result<(Repairs, bool), StoreError> {
        let mut repairs = Repairs::new();
        if self.queue.is_empty() && self.current.is_none() {
            for target in self.store.sweep_targets().await? {
                self.queue.extend(target.steps());
            }
        }
        for _ in 0..calls {
            let (step, cursor) = match self.current.take() {
                Some(c) => c,
                None => match self.queue.pop_front() {
                    Some(step) => (step, "0".to_owned()),
                    None => return Ok((repairs, true)),
                },
            };
            let (next, n) = self.store.sweep_step(&step, &cursor, BATCH).await?;
            if n > 0 {
                *repairs.entry(step.mode.as_str()).or_default() += n;
            }
            if next != "0" {
                self.current = Some((step, next));
            }
        }
        Ok((repairs, self.queue.is_empty() && self.current.is_none()))
    }
}

/// Sweeps every `interval` until `stop` is cancelled.
pub async fn run(store: Arc<Store>, interval: Duration, stop: CancellationToken) {
    let owner = crate::worker::default_consumer();
    let mut sweeper = Sweeper::new(store.clone());
    // The first sweep waits one interval: a fresh process has nothing to repair yet.
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.cancelled() => return,
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
        match sweeper.advance(CALLS_PER_TURN).await {
            Ok((repairs, _)) => log(&repairs),
            Err(e) => {
                tracing::warn!(error = %e, "sweep failed; starting over next turn");
                sweeper = Sweeper::new(store.clone());
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
    // Bounded: one round of a store this size needs far fewer calls.
    for _ in 0..10_000 {
        match sweeper.advance(CALLS_PER_TURN).await {
            Ok((repairs, done)) => {
                for (k, n) in repairs {
                    *total.entry(k).or_default() += n;
                }
                if done {
                    break;
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "sweep failed");
                return None;
            }
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
