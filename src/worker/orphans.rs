//! The orphan scan, one loop per shard: expired leases (never live ones) are re-queued or
//! dead-lettered, due retries put back, and a pickup nudged when its shard has unread work
//! (a doorbell's wake-up may have been lost).

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::WorkerConfig;
use super::wake::Wake;
use crate::store::{Shard, Store};

/// Looks for expired leases in one shard once per scan interval. Each shard has its own loop,
/// so a shard that does not answer delays no other shard's orphans. The same call is the
/// shard's safety poll: it puts due retries back and tells of unread work (its pickup is
/// nudged: a doorbell's wake-up may have been lost).
pub(super) async fn reclaim_loop(
    store: Arc<Store>,
    shard: Shard,
    wake: Arc<Wake>,
    config: WorkerConfig,
    stop: CancellationToken,
) {
    const BATCH: usize = 100;
    let mut tick = tokio::time::interval(config.scan_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.cancelled() => return,
        }
        // This build's library is in use (at most once per ANNOUNCE_EVERY, whichever shard's
        // loop comes first).
        if let Err(e) = store.announce_library(false).await {
            tracing::debug!(error = %e, "cannot record that this build's Lua library is in use");
        }
        // Bounded: at most 100 batches per tick.
        for _ in 0..100 {
            match store.reclaim(shard, BATCH).await {
                Ok(r) => {
                    if let Some(due) = r.next_due {
                        wake.set_due_in(due);
                    }
                    if r.requeued + r.dead_lettered > 0 {
                        tracing::info!(
                            shard = shard.number(),
                            requeued = r.requeued,
                            dead = r.dead_lettered,
                            "orphans recovered"
                        );
                    }
                    if ((r.requeued + r.dead_lettered) as usize) < BATCH {
                        if r.unread {
                            wake.nudge();
                        }
                        break;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, shard = shard.number(), "orphan scan failed");
                    break;
                }
            }
        }
    }
}
