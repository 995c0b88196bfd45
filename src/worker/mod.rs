//! The worker runtime: asks for executions only while it has free slots (Redis picks them by
//! fair share and starts them in the same atomic step), runs each under a lease that one heartbeat per shard
//! keeps alive, reports the outcome fenced by the run's token, and recovers orphans (expired
//! leases only, never live ones). `sluice worker` runs it with flows from a file; Rust programs
//! run it through `Worker::new` with their own `Registry`.
//!
//! Each shard is served on its own: one pickup task per shard starts its executions
//! (`pickup.rs`), one orphan scan per shard, and the heartbeat renews each shard's leases in a
//! call of its own, all at the same time. So a shard whose Redis is slow or down (on a cluster,
//! a master) delays only its own executions. The shards share the worker's slots: a start call
//! asks for no more executions than slots it reserved first. A run that ends reports its
//! outcome and starts the shard's next execution on its slot in the same call (one call per
//! execution while the shard has work, as BullMQ's moveToFinished does). While other shards
//! wait for a slot, a freed slot goes to the shards in proportion to their runnable weight
//! (each call says its shard's): the run's own shard chains only when it is the one picked,
//! else the slot is handed to the picked shard's pickup (`Shared::pass_on`).
//!
//! Nothing here polls: a pickup with room waits on its shard's doorbell (`store::wake`), and a
//! cancel or force delete of a run reaches it as a stop message (`stop_listener`), answered
//! with a heartbeat of that run. A shard's scheduled executions and retries are started on the
//! pickup's own timer, set from the earliest due time each call reports. The orphan scan is
//! the slow safety net under all three: it makes due executions runnable and re-rings a
//! doorbell whose wake-up was lost.
//!
//! What it does under faults:
//! - a handler runs in its own task: a panic fails the execution like an error, and the
//!   worker keeps its slot accounting;
//! - a run whose lease this worker can no longer prove (no renewal got through before the
//!   deadline: Redis stalled, or this process was paused) is stopped at once and reported as
//!   abandoned, since another worker may already run it;
//! - a start call whose answer was lost is followed by `adopt` before anything else starts in
//!   that shard (its slots kept for it until then), so what it started runs here instead of
//!   being declared lost a lease later; the `adopt` raises a barrier that stops the lost call
//!   from starting anything if Redis runs it only afterwards;
//! - a shard that cannot be reached, also at start, is retried by its own pickup; the other
//!   shards go on.
//!
//! Where each part lives: `config.rs` (the settings), `runs.rs` (the runs held and what must
//! never start again), `pickup.rs` (one start loop per shard, and `adopt`), `wake.rs` (what
//! wakes a pickup, and the lost-call state `adopt` needs), `launch.rs` (a run's task, and
//! where its freed slot goes), `run.rs` (one handler to an outcome),
//! `report.rs` (the fenced report, which may start the shard's next runs), `leases.rs` (the
//! lease: its local deadline, the heartbeat and the stop listener), `orphans.rs` (the orphan
//! scan), `share.rs` (the weighted round robin between shards, which the pull API uses too), and `handler.rs`, `builtin.rs`, `external.rs` (what a flow is). This file starts
//! them all and stops them in order.

mod builtin;
mod config;
mod external;
mod handler;
mod launch;
mod leases;
mod orphans;
mod pickup;
mod report;
mod run;
mod runs;
mod share;
mod wake;

use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::store::{Shard, Store, StoreConfig, StoreError};
pub use builtin::with_demo_flows;
pub use config::{WorkerConfig, default_consumer};
pub use external::{FlowSpec, FlowsFile, load_flows};
pub use handler::{Context, Handler, HandlerError, HandlerFuture, Registry};
use launch::Shared;
pub use leases::Lease;
use leases::{heartbeat_loop, stop_listener};
use orphans::reclaim_loop;
use pickup::Pickup;
pub use run::retry_backoff;
use runs::{HeldMap, Stop};
pub use share::ShardShare;
use wake::Wake;

/// A worker bound to a store and a registry of flows.
pub struct Worker {
    store: Arc<Store>,
    registry: Arc<Registry>,
    config: WorkerConfig,
}

impl Worker {
    /// A worker; `run` starts it.
    pub fn new(store: Arc<Store>, registry: Registry, config: WorkerConfig) -> Self {
        Self {
            store,
            registry: Arc::new(registry),
            config,
        }
    }

    /// Runs until `shutdown` completes, then stops reading, lets running executions finish
    /// for up to the drain timeout, and releases the leases of the rest so another worker
    /// takes them at once.
    ///
    /// Every shard is served on its own: its pickup (starts), its orphan scan and its
    /// heartbeat call run beside the other shards', so a shard that does not answer (its
    /// Redis down or stuck) delays only its own executions. A shard that cannot be reached at
    /// start is picked up once it answers; nothing here fails the worker.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> Result<(), StoreError> {
        let wakes: HashMap<Shard, Arc<Wake>> = self
            .store
            .shards()
            .all()
            .map(|shard| (shard, Arc::new(Wake::default())))
            .collect();
        let stop_reading = CancellationToken::new();
        let shared = Arc::new_cyclic(|me| Shared {
            store: self.store.clone(),
            registry: self.registry.clone(),
            config: self.config.clone(),
            held: HeldMap::default(),
            slots: Arc::new(Semaphore::new(
                self.config.concurrency.min(Semaphore::MAX_PERMITS),
            )),
            runs: Mutex::new(JoinSet::new()),
            wakes: wakes.clone(),
            reading: stop_reading.clone(),
            waiting_for_slot: AtomicUsize::new(0),
            share: Mutex::new(ShardShare::default()),
            me: me.clone(),
        });
        let stop_background = CancellationToken::new();
        let mut background = JoinSet::new();
        let beat_now = Arc::new(Notify::new());
        background.spawn(heartbeat_loop(
            self.store.clone(),
            shared.held.clone(),
            self.config.clone(),
            beat_now.clone(),
            stop_background.clone(),
        ));
        background.spawn(stop_listener(
            self.store.clone(),
            shared.held.clone(),
            self.config.clone(),
            beat_now,
            stop_background.clone(),
        ));
        background.spawn(policy_loop(self.store.clone(), stop_background.clone()));
        let mut pickups = JoinSet::new();
        for (shard, wake) in wakes {
            background.spawn(reclaim_loop(
                self.store.clone(),
                shard,
                wake.clone(),
                self.config.clone(),
                stop_background.clone(),
            ));
            pickups.spawn(Pickup::new(shared.clone(), shard, wake).run(stop_reading.clone()));
        }
        tracing::info!(
            consumer = %self.config.consumer,
            concurrency = self.config.concurrency,
            shards = self.store.shards().count(),
            flows = ?self.registry.flows(),
            "worker started"
        );

        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                // Pickups end only when told to; one that panicked is a bug: fail loudly, as
                // the worker did when it read all shards in one loop.
                Some(ended) = pickups.join_next() => {
                    if let Err(e) = ended && e.is_panic() {
                        std::panic::resume_unwind(e.into_panic());
                    }
                }
            }
        }
        stop_reading.cancel();
        // Each pickup finishes the call it has out and launches what that call started; so
        // does every completion that asked for a next run (it holds its shard's lock).
        while pickups.join_next().await.is_some() {}
        for wake in shared.wakes.values() {
            drop(wake.starts.write().await);
        }

        // Drain: wait for running executions, up to the drain timeout.
        let mut runs = std::mem::take(&mut *shared.runs.lock().expect("run set"));
        tracing::info!(running = runs.len(), "worker draining");
        let drained = tokio::time::timeout(self.config.drain_timeout, async {
            while runs.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            for h in shared.held.lock().expect("held map").held.values() {
                h.why.overrule(Stop::Shutdown);
                h.stop.cancel();
            }
            // Their tasks now report `Released`; bounded, as completion calls are.
            while runs.join_next().await.is_some() {}
        }
        stop_background.cancel();
        while background.join_next().await.is_some() {}
        tracing::info!("worker stopped");
        Ok(())
    }
}

/// Connects to Redis for a worker, waiting for it when it cannot be reached yet (a worker may
/// start before its Redis): retried with a warning, every few seconds at most. Only an error
/// that waiting cannot cure (a malformed URL, data sluice does not understand) ends it.
pub async fn connect_store(config: StoreConfig) -> Result<Store, StoreError> {
    if let Err(e) = config.redis.check() {
        return Err(StoreError::Corrupt(e));
    }
    let mut pause = Duration::from_millis(250);
    loop {
        match Store::connect(config.clone()).await {
            Err(StoreError::Unavailable(e)) => {
                tracing::warn!(error = %e, retry_in = ?pause, "redis cannot be reached yet; the worker waits for it");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
            }
            other => return other,
        }
    }
}

/// How often the data policy `serve` publishes is read again. It changes only when `serve`
/// restarts with other settings, so this is slow: an idle worker's calls are its orphan scans.
const POLICY_REFRESH: Duration = Duration::from_secs(60);

/// Follows the data policy `serve` publishes (tenant limit defaults, retention, dead-letter
/// cap), read again every `POLICY_REFRESH`.
async fn policy_loop(store: Arc<Store>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(POLICY_REFRESH);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.cancelled() => return,
        }
        if let Err(e) = store.refresh_defaults().await {
            tracing::warn!(error = %e, "cannot refresh server defaults");
        }
    }
}
