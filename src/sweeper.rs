//! The sweeper, run by `serve`: at each interval one process (whichever takes the turn on
//! Redis first) walks every tenant's slot set, waiting set and indexes and removes members
//! whose execution is terminal, gone or elsewhere. Each repair is logged and counted.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::store::Store;

/// Members checked per script call: keeps each call short.
const BATCH: usize = 200;

/// Sweeps every `interval` until `stop` is cancelled.
pub async fn run(store: Arc<Store>, interval: Duration, stop: CancellationToken) {
    let owner = crate::worker::default_consumer();
    // The first sweep waits one interval: a fresh process has nothing to repair yet.
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.cancelled() => return,
        }
        sweep_once(&store, &owner, interval).await;
    }
}

/// One sweep if this process gets the turn; returns the repairs made (None: not our turn).
pub async fn sweep_once(
    store: &Store,
    owner: &str,
    hold: Duration,
) -> Option<std::collections::HashMap<&'static str, u64>> {
    match store.take_sweeper_turn(owner, hold).await {
        Ok(true) => {}
        Ok(false) => return None,
        Err(e) => {
            tracing::warn!(error = %e, "sweeper cannot take its turn");
            return None;
        }
    }
    match store.sweep(BATCH).await {
        Ok(repaired) => {
            for (kind, n) in &repaired {
                if *n > 0 {
                    tracing::warn!(kind, repaired = n, "sweeper repaired drift");
                }
            }
            Some(repaired)
        }
        Err(e) => {
            tracing::warn!(error = %e, "sweep failed");
            None
        }
    }
}
