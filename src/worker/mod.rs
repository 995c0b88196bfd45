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

mod builtin;
mod external;
mod handler;
mod pickup;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::admission::ExecutionId;
use crate::store::{
    Completion, LeaseState, Outcome, Shard, Started, Store, StoreConfig, StoreError,
};
pub use builtin::with_demo_flows;
pub use external::{FlowSpec, FlowsFile, load_flows};
pub use handler::{Context, Handler, HandlerError, HandlerFuture, Lease, Registry};
use pickup::{Pickup, Wake};

/// How a worker behaves. The defaults suit production; tests shorten the times.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Executions run at once; the worker reads only this many.
    pub concurrency: usize,
    /// How long a lease lasts without a heartbeat.
    pub lease_ttl: Duration,
    /// How often held leases are extended (well under `lease_ttl`).
    pub heartbeat_interval: Duration,
    /// How often expired leases are looked for, in each shard. The same call is the worker's
    /// safety poll: it puts due retries back and finds work whose wake-up was lost.
    pub scan_interval: Duration,
    /// On shutdown, how long running executions may finish before their leases are released.
    pub drain_timeout: Duration,
    /// Backoff before the 2nd attempt after a retryable failure; doubles per attempt.
    pub retry_backoff: Duration,
    /// Cap of that backoff.
    pub retry_backoff_max: Duration,
    /// Consumer name in the `workers` group (unique per worker process).
    pub consumer: String,
}

/// The production defaults: the one home of these numbers (`sluice worker`'s flags default to
/// them too).
impl WorkerConfig {
    /// `concurrency`.
    pub const DEFAULT_CONCURRENCY: usize = 8;
    /// `lease_ttl`.
    pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(30);
    /// `heartbeat_interval`: a third of the lease, so two renewals may fail before it lapses.
    pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(10);
    /// `scan_interval`.
    pub const DEFAULT_SCAN: Duration = Duration::from_secs(5);
    /// `drain_timeout`.
    pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
    /// `retry_backoff`.
    pub const DEFAULT_RETRY_BACKOFF: Duration = Duration::from_secs(1);
    /// `retry_backoff_max`.
    pub const DEFAULT_RETRY_BACKOFF_MAX: Duration = Duration::from_secs(300);
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            concurrency: Self::DEFAULT_CONCURRENCY,
            lease_ttl: Self::DEFAULT_LEASE_TTL,
            heartbeat_interval: Self::DEFAULT_HEARTBEAT,
            scan_interval: Self::DEFAULT_SCAN,
            drain_timeout: Self::DEFAULT_DRAIN_TIMEOUT,
            retry_backoff: Self::DEFAULT_RETRY_BACKOFF,
            retry_backoff_max: Self::DEFAULT_RETRY_BACKOFF_MAX,
            consumer: default_consumer(),
        }
    }
}

/// `<hostname>-<pid>-<random>`: unique per process, readable in Redis.
pub fn default_consumer() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "worker".into());
    let salt = &uuid::Uuid::new_v4().simple().to_string()[..6];
    format!("{host}-{}-{salt}", std::process::id())
}

/// Why a running execution was told to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Stop {
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
struct StopReason(AtomicU8);

impl StopReason {
    /// Records `why` unless a reason is already recorded (the first one wins).
    fn record(&self, why: Stop) {
        let _ = self
            .0
            .compare_exchange(0, why as u8, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// Records `why` over any earlier reason (a shutdown's release wins).
    fn overrule(&self, why: Stop) {
        self.0.store(why as u8, Ordering::SeqCst);
    }

    /// The reason recorded, if any.
    fn get(&self) -> Option<Stop> {
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
struct Held {
    shard: Shard,
    fence: u64,
    lease: Lease,
    stop: CancellationToken,
    why: Arc<StopReason>,
}

/// What a worker runs, and what it must never start again: a run (execution, fence) is
/// started at most once by a worker, whatever an `adopt` answer says.
#[derive(Default)]
struct Runs {
    held: HashMap<ExecutionId, Held>,
    /// Per shard with an `adopt` call out: runs that ended meanwhile. Redis may have run the
    /// call before it heard of their end, so its answer can still name them.
    ended_while_adopting: HashMap<Shard, HashSet<(ExecutionId, u64)>>,
    /// Runs whose end could not be reported (Redis unreachable for a lease): Redis shows them
    /// held by this worker until their lease expires. The newest `UNREPORTED_KEPT`.
    unreported: VecDeque<(ExecutionId, u64)>,
}

/// How many unreported runs a worker remembers (they are rare: each took a lease-long outage).
const UNREPORTED_KEPT: usize = 1024;

impl Runs {
    /// Whether an `adopt` answer naming this run of `shard` may be run here.
    fn may_adopt(&self, shard: Shard, id: &ExecutionId, fence: u64) -> bool {
        let run = (id.clone(), fence);
        !self.held.contains_key(id)
            && !self
                .ended_while_adopting
                .get(&shard)
                .is_some_and(|ended| ended.contains(&run))
            && !self.unreported.contains(&run)
    }

    /// A run is over (reported, or given up on when `reported` is false).
    fn ended(&mut self, shard: Shard, id: &ExecutionId, fence: u64, reported: bool) {
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

type HeldMap = Arc<Mutex<Runs>>;

/// What the worker's tasks share: the pickups (one per shard) reserve slots and launch runs.
struct Shared {
    store: Arc<Store>,
    registry: Arc<Registry>,
    config: WorkerConfig,
    held: HeldMap,
    /// One permit per execution this worker may run at once. A pickup reserves permits before
    /// its start call asks for that many; each run keeps one until its end was reported (or
    /// given up on), so however many shards race, no more than `concurrency` handlers run.
    slots: Arc<Semaphore>,
    /// The tasks of running executions; taken out and drained at shutdown.
    runs: Mutex<JoinSet<()>>,
    /// Per shard: how its pickup is woken besides its doorbell (the orphan scan's nudge, a
    /// retry coming due), and the lock that keeps `adopt` apart from the shard's other starts.
    wakes: HashMap<Shard, Arc<Wake>>,
    /// Cancelled when the worker stops reading (shutdown): no run starts another then.
    reading: CancellationToken,
    /// Pickups waiting for a free slot (their shards have work): while there are any, a freed
    /// slot goes to a shard picked by weight (`pass_on`).
    waiting_for_slot: AtomicUsize,
    /// The smooth weighted round robin's credit per shard (`pick_shard`).
    credits: Mutex<HashMap<Shard, i64>>,
    /// This `Shared`, for the run tasks (which must not keep it alive: it owns their set).
    me: Weak<Shared>,
}

/// Where a run's freed slot goes.
enum Next {
    /// To the shard's next run, started by the completion call (the guard keeps `adopt` out
    /// until what it started is known).
    Chain(tokio::sync::OwnedRwLockReadGuard<()>),
    /// To another shard's pickup, picked by weight.
    Hand(Arc<Wake>),
    /// Back to the worker's free slots.
    Free,
}

impl Shared {
    /// Runs a started execution on `slot`, its lease granted by a call sent at `sent`.
    fn launch(&self, s: Started, sent: Instant, slot: OwnedSemaphorePermit) {
        let stop = CancellationToken::new();
        let why = Arc::new(StopReason::default());
        let lease = Lease::granted(sent, self.config.lease_ttl);
        self.held.lock().expect("held map").held.insert(
            s.id.clone(),
            Held {
                shard: s.shard,
                fence: s.fence,
                lease: lease.clone(),
                stop: stop.clone(),
                why: why.clone(),
            },
        );
        // The task holds what it needs, and `Shared` only weakly: dropping the worker aborts
        // the runs.
        let (store, registry, config, held, wake, me) = (
            self.store.clone(),
            self.registry.clone(),
            self.config.clone(),
            self.held.clone(),
            self.wakes.get(&s.shard).cloned(),
            self.me.clone(),
        );
        let mut runs = self.runs.lock().expect("run set");
        // Reap finished tasks so the set does not grow.
        while runs.try_join_next().is_some() {}
        // Spans (crate::otel): the start call ran from `sent` until now.
        let answered = SystemTime::now();
        let sent_at = answered.checked_sub(sent.elapsed()).unwrap_or(answered);
        runs.spawn(async move {
            let (shard, id, fence) = (s.shard, s.id.clone(), s.fence);
            let spans = crate::otel::RunSpans::begin(&s, sent_at, answered);
            let mut s = s;
            if let Some(spans) = &spans {
                s.trace = Some(spans.handler_trace());
            }
            let outcome = run_one(&registry, s, lease, stop, &why, &config).await;
            let reported_from = SystemTime::now();
            // Whether this slot starts the shard's next run in the same call, and with how many
            // slots: this one, and while no other shard waits for a slot, every free one (a
            // backlog is then started in batches, as a pickup's start call does).
            let mut hand = None;
            let chain = me
                .upgrade()
                .and_then(|shared| match shared.pass_on(shard, &outcome) {
                    Next::Chain(g) => Some((shared, g)),
                    Next::Hand(other) => {
                        hand = Some(other);
                        None
                    }
                    Next::Free => None,
                });
            let mut slot = slot;
            if let Some((shared, _)) = &chain
                && shared.waiting_for_slot.load(Ordering::SeqCst) == 0
            {
                while slot.num_permits() < shared.config.concurrency {
                    match shared.slots.clone().try_acquire_owned() {
                        Ok(more) => slot.merge(more),
                        Err(_) => break,
                    }
                }
            }
            let sent = Instant::now();
            let (shared, guard) = chain.unzip();
            // With a chain, the slots go with the call: to the runs it starts, or, if its
            // answer is lost, to the `adopt` that finds them (see `Wake::kept`).
            let (mut asked, slot) = match (guard, &wake) {
                (Some(guard), Some(wake)) => (
                    Some(Asked {
                        count: slot.num_permits(),
                        call: wake.next_call(),
                        slot: Some(slot),
                        _guard: guard,
                        wake: wake.clone(),
                    }),
                    None,
                ),
                _ => match hand {
                    // The report does not wait for the other shard's start.
                    Some(other) => {
                        other.give(slot);
                        (None, None)
                    }
                    None => (None, Some(slot)),
                },
            };
            let report = report(&store, shard, &id, fence, &outcome, &config, &mut asked).await;
            if let Some(spans) = spans {
                let (name, error) = match &outcome {
                    Outcome::Completed(_) => ("completed", None),
                    Outcome::Failed { message, .. } => ("failed", Some(message.as_str())),
                    Outcome::Cancelled => ("cancelled", None),
                    Outcome::Released => ("released", None),
                    Outcome::Abandoned => ("abandoned", Some("lease not renewed in time")),
                };
                spans.end(name, error, reported_from);
            }
            // A retry after a backoff: this worker looks again when it is due (any worker's
            // orphan scan would put it back too, later).
            if let (
                Outcome::Failed {
                    retry_after: Some(wait),
                    ..
                },
                Some(wake),
            ) = (&outcome, &wake)
            {
                wake.set_due_in(*wait);
            }
            if let (Some(wake), Some((due, weight))) = (&wake, report.learned) {
                wake.learn(due, weight);
            }
            held.lock()
                .expect("held map")
                .ended(shard, &id, fence, report.reported);
            let (Some(shared), Some(mut asked)) = (shared, asked) else {
                drop(slot);
                return;
            };
            let mut slot = asked.slot.take();
            for next in report.started {
                // A start reads no more entries than it was asked for: one slot each.
                match slot
                    .as_mut()
                    .and_then(|s| s.split(1))
                    .or_else(|| shared.slots.clone().try_acquire_owned().ok())
                {
                    Some(s) => shared.launch(next, sent, s),
                    None => tracing::warn!(
                        id = %next.id,
                        "no free slot for a run Redis names as this worker's; its lease will expire"
                    ),
                }
            }
            // The slots it did not use go back.
            drop(slot);
            // Until here no `adopt` of the shard could run: what this call started is known
            // before Redis is asked what the worker holds.
            drop(asked);
        });
    }

    /// Where the slot of a run of `shard` that ended with `outcome` goes. While other shards'
    /// pickups wait for a slot, the shards with runnable work take turns by weight
    /// (`pick_shard`): the run's own shard chains its next run only when it is picked, else the
    /// slot is handed to the picked shard. The own shard never chains while stopping, after a
    /// run that lost its lease or is handed back, or while it awaits an `adopt`.
    fn pass_on(&self, shard: Shard, outcome: &Outcome) -> Next {
        if self.reading.is_cancelled() || matches!(outcome, Outcome::Released | Outcome::Abandoned)
        {
            return Next::Free;
        }
        if self.waiting_for_slot.load(Ordering::SeqCst) > 0
            && let Some(other) = self.pick_shard(shard)
            && other != shard
        {
            return match self.wakes.get(&other) {
                Some(w) => Next::Hand(w.clone()),
                None => Next::Free,
            };
        }
        let Some(wake) = self.wakes.get(&shard) else {
            return Next::Free;
        };
        let Ok(guard) = wake.starts.clone().try_read_owned() else {
            return Next::Free;
        };
        // Checked with the guard held: shutdown takes every shard's lock once it has stopped
        // reading, so a run that passes this check is launched before the drain begins.
        if self.reading.is_cancelled() || wake.is_unsure() {
            return Next::Free;
        }
        Next::Chain(guard)
    }

    /// The shard a freed slot goes to, among `own` and the shards whose pickups wait for a
    /// slot, in proportion to their runnable weight (a smooth weighted round robin: each pick
    /// adds every candidate's weight to its credit and takes the largest credit, which then
    /// pays the total). `None` when no candidate has runnable work.
    fn pick_shard(&self, own: Shard) -> Option<Shard> {
        let candidates: Vec<(Shard, i64)> = self
            .wakes
            .iter()
            .filter(|(s, w)| **s == own || w.is_waiting())
            .map(|(s, w)| {
                let weight = i64::try_from(w.weight()).unwrap_or(i64::MAX / 4);
                // A pickup waits for a slot only when its shard has work; one that has not
                // been answered since (its first call, or a doorbell after a drain) counts as
                // weight 1 until its call tells.
                let weight = if *s != own { weight.max(1) } else { weight };
                (*s, weight)
            })
            .filter(|(_, w)| *w > 0)
            .collect();
        if candidates.is_empty() {
            return None;
        }
        let total: i64 = candidates.iter().map(|(_, w)| *w).sum();
        let mut credits = self.credits.lock().expect("credits");
        let mut best: Option<(Shard, i64)> = None;
        for (s, w) in &candidates {
            let c = credits.entry(*s).or_insert(0);
            *c += w;
            if best.is_none_or(|(b, bc)| *c > bc || (*c == bc && s.number() < b.number())) {
                best = Some((*s, *c));
            }
        }
        let (picked, _) = best?;
        *credits.entry(picked).or_insert(0) -= total;
        // Credits of shards that are not candidates now are forgotten: no credit is banked
        // while a shard has nothing to run.
        credits.retain(|s, _| candidates.iter().any(|(c, _)| c == s));
        Some(picked)
    }
}

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
            credits: Mutex::new(HashMap::new()),
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

/// Runs one execution's handler to an outcome: in its own task (so a panic is caught), and no
/// longer than this worker can prove it holds the lease.
async fn run_one(
    registry: &Registry,
    s: Started,
    lease: Lease,
    stop: CancellationToken,
    why: &StopReason,
    config: &WorkerConfig,
) -> Outcome {
    let Some(handler) = registry.get(s.flow.as_str()) else {
        return Outcome::Failed {
            kind: "unknown_flow".into(),
            message: format!(
                "no handler for flow {:?} on worker {}",
                s.flow.as_str(),
                config.consumer
            ),
            retry_after: None,
        };
    };
    let ctx = Context {
        execution_id: s.id,
        tenant_id: s.tenant,
        flow_id: s.flow,
        version: s.version,
        params: s.params,
        trace: s.trace,
        attempt: s.attempt,
        max_attempts: s.max_attempts,
        fence: s.fence,
        lease: lease.clone(),
        cancel: stop.clone(),
    };
    // The lease ran out before the handler could begin (this process was paused, or starved,
    // between the start call and here): a newer run may exist, so this one never begins. It
    // ends as a lease that expired mid-run would: unreported, re-run after the orphan scan.
    if !lease.is_held() {
        why.record(Stop::Expired);
        return Outcome::Abandoned;
    }
    let mut task = tokio::spawn(handler.run(ctx));
    let result = loop {
        tokio::select! {
            r = &mut task => break Some(r),
            _ = stop.cancelled() => break None,
            _ = tokio::time::sleep_until(lease.deadline().into()) => {
                // A renewal may have moved the deadline while this slept.
                if !lease.is_held() {
                    why.record(Stop::Expired);
                    stop.cancel();
                    break None;
                }
            }
        }
    };
    if result.is_none() {
        // The handler is dropped before the run is reported: nothing of it runs past that.
        task.abort();
        let _ = task.await;
    }
    // A stop decided by the runtime wins over whatever the handler returned while stopping.
    match (why.get(), result) {
        (Some(Stop::Shutdown), _) => Outcome::Released,
        (Some(Stop::Expired), _) => Outcome::Abandoned,
        (Some(Stop::Cancel | Stop::Lost), _) | (_, None) => Outcome::Cancelled,
        (_, Some(Ok(Ok(output)))) => Outcome::Completed(output),
        (_, Some(Ok(Err(e)))) => Outcome::Failed {
            kind: "handler_error".into(),
            retry_after: e.retryable.then(|| backoff(config, s.attempt)),
            message: e.message,
        },
        (_, Some(Err(join))) => Outcome::Failed {
            kind: "handler_panic".into(),
            retry_after: Some(backoff(config, s.attempt)),
            message: panic_message(join),
        },
    }
}

/// What a handler's panic said, as far as it can be told.
fn panic_message(e: tokio::task::JoinError) -> String {
    match e.try_into_panic() {
        Ok(payload) => {
            let text = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a non-text panic payload".into());
            format!("handler panicked: {text}")
        }
        Err(e) => format!("handler task ended abnormally: {e}"),
    }
}

/// Backoff before the attempt after `attempt`: base × 2^(attempt-1), capped.
fn backoff(config: &WorkerConfig, attempt: u32) -> Duration {
    retry_backoff(config.retry_backoff, config.retry_backoff_max, attempt)
}

/// The pause before the attempt after failed attempt `attempt`: `first` doubling per attempt,
/// at most `most`. `sluice worker` and the pull API (`crate::pull::Pull::backoff`) both use it.
pub fn retry_backoff(first: Duration, most: Duration, attempt: u32) -> Duration {
    let factor = 1u32 << attempt.saturating_sub(1).min(20);
    first.saturating_mul(factor).min(most)
}

/// A completion that also asks for the shard's next runs: how many, the call's number (see
/// `Wake::next_call`), the slots they will run on, and the shard's start lock (held shared
/// until what the call started is launched, see `Wake::starts`).
struct Asked {
    count: usize,
    call: u64,
    slot: Option<OwnedSemaphorePermit>,
    _guard: tokio::sync::OwnedRwLockReadGuard<()>,
    wake: Arc<Wake>,
}

/// What reporting a run's outcome came to.
struct Reported {
    /// Whether Redis answered (else the run was given up on: its lease will expire).
    reported: bool,
    /// What the completion call started on the run's slot (when it asked).
    started: Vec<Started>,
    /// What the answered call said of the shard: its next due time and runnable weight.
    learned: Option<(Option<Duration>, u64)>,
}

/// Reports an outcome, retrying while Redis is unavailable for up to one lease TTL (after that
/// the lease has expired and the orphan scan re-runs the execution anyway). Repeating is safe:
/// a report applied before is recognised (`Repeat`). With `asked`, the first call also starts
/// up to `count` of the shard's next runs for this worker; a repeat never does. If that first
/// call goes unanswered it may have started some: `asked` is given up at once (its lock
/// released, the shard made unsure), so the pickup adopts them as soon as Redis answers,
/// while this report is still being repeated.
async fn report(
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

/// Extends every held lease once per interval: one call per shard, not per execution, the
/// shards' calls at the same time.
/// `now` asks for a beat at once (stop messages may have been missed).
async fn heartbeat_loop(
    store: Arc<Store>,
    held: HeldMap,
    config: WorkerConfig,
    now: Arc<Notify>,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(config.heartbeat_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = now.notified() => {}
            _ = stop.cancelled() => return,
        }
        let by_shard: HashMap<Shard, Vec<(ExecutionId, u64)>> = {
            let runs = held.lock().expect("held map");
            let mut m: HashMap<Shard, Vec<(ExecutionId, u64)>> = HashMap::new();
            for (id, h) in runs.held.iter() {
                m.entry(h.shard).or_default().push((id.clone(), h.fence));
            }
            m
        };
        // Each shard's renewal on its own task: one slow shard must not hold back the others'
        // (their runs would be stopped when their local lease deadline passes).
        let mut beats = JoinSet::new();
        for (shard, list) in by_shard {
            let (store, held, config) = (store.clone(), held.clone(), config.clone());
            beats.spawn(async move { renew(&store, &held, &config, shard, list).await });
        }
        while beats.join_next().await.is_some() {}
    }
}

/// Renews the leases this worker holds in one shard, and stops the runs Redis says to stop.
async fn renew(
    store: &Store,
    held: &HeldMap,
    config: &WorkerConfig,
    shard: Shard,
    list: Vec<(ExecutionId, u64)>,
) {
    let sent = Instant::now();
    let answers = match store
        .heartbeat(shard, &config.consumer, &list, config.lease_ttl)
        .await
    {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!(error = %e, shard = shard.number(), "heartbeat failed");
            return;
        }
    };
    let runs = held.lock().expect("held map");
    for ((id, fence), state) in list.iter().zip(answers) {
        let Some(h) = runs.held.get(id).filter(|h| h.fence == *fence) else {
            continue;
        };
        if state != LeaseState::Lost {
            h.lease.renewed(sent, config.lease_ttl);
        }
        let why = match state {
            LeaseState::Held => continue,
            LeaseState::CancelRequested => Stop::Cancel,
            LeaseState::Lost => Stop::Lost,
        };
        tracing::info!(%id, ?state, "stopping execution");
        h.why.record(why);
        h.stop.cancel();
    }
}

/// Listens for the stop messages of this worker's runs (a cancel or a force delete published
/// by Redis, see `store::wake`) and answers each with a heartbeat of that run alone: Redis, not
/// the message, says whether and why to stop, so a stray or repeated message is harmless. While
/// the listener is disconnected the regular heartbeat still catches every stop; after each
/// (re)connection one beat runs at once for what may have been missed.
async fn stop_listener(
    store: Arc<Store>,
    held: HeldMap,
    config: WorkerConfig,
    beat_now: Arc<Notify>,
    stop: CancellationToken,
) {
    let mut pause = Duration::from_millis(100);
    let mut connected_once = false;
    loop {
        let listener = tokio::select! {
            l = store.listen_for_stops(&config.consumer) => l,
            _ = stop.cancelled() => return,
        };
        let mut listener = match listener {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, retry_in = ?pause, "cannot listen for stop messages; heartbeats still bring them");
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = stop.cancelled() => return,
                }
                pause = (pause * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        pause = Duration::from_millis(100);
        if connected_once {
            beat_now.notify_one();
        }
        connected_once = true;
        loop {
            let id = tokio::select! {
                id = listener.next() => id,
                _ = stop.cancelled() => return,
            };
            let Some(id) = id else { break };
            let Ok(id) = ExecutionId::parse(&id) else {
                continue;
            };
            let run = {
                let runs = held.lock().expect("held map");
                runs.held.get(&id).map(|h| (h.shard, h.fence))
            };
            if let Some((shard, fence)) = run {
                let (store, held, config) = (store.clone(), held.clone(), config.clone());
                tokio::spawn(async move {
                    renew(&store, &held, &config, shard, vec![(id, fence)]).await;
                });
            }
        }
        tracing::debug!("stop message connection ended; reconnecting");
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

/// Looks for expired leases in one shard once per scan interval. Each shard has its own loop,
/// so a shard that does not answer delays no other shard's orphans. The same call is the
/// shard's safety poll: it puts due retries back and tells of unread work (its pickup is
/// nudged: a doorbell's wake-up may have been lost).
async fn reclaim_loop(
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

#[cfg(test)]
mod tests {
    use super::*;

    fn started() -> Started {
        Started {
            shard: crate::store::ShardMap::new(16, crate::store::Layout::CURRENT).shard(0),
            id: ExecutionId::new(),
            fence: 1,
            attempt: 1,
            max_attempts: 3,
            tenant: crate::admission::TenantId::parse("acme").unwrap(),
            flow: crate::admission::FlowId::parse("count").unwrap(),
            version: None,
            params: serde_json::json!({}),
            trace: None,
        }
    }

    /// A run whose lease ran out before its handler began (its worker paused between the start
    /// call and the handler) never begins: the fault suite once saw such a handler start 1 ms
    /// past its lease, beside the newer run that had taken over.
    #[tokio::test]
    async fn a_run_whose_lease_ran_out_before_it_began_never_begins() {
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = runs.clone();
        let registry = Registry::new().register("count", move |_ctx: Context| {
            counted.fetch_add(1, Ordering::SeqCst);
            async { Ok(serde_json::json!({})) }
        });
        let run = |lease: Lease| {
            let registry = &registry;
            async move {
                let why = StopReason(AtomicU8::new(0));
                run_one(
                    registry,
                    started(),
                    lease,
                    CancellationToken::new(),
                    &why,
                    &WorkerConfig::default(),
                )
                .await
            }
        };
        let sent = std::time::Instant::now() - Duration::from_secs(2);
        let outcome = run(Lease::granted(sent, Duration::from_secs(1))).await;
        assert!(matches!(outcome, Outcome::Abandoned));
        assert_eq!(runs.load(Ordering::SeqCst), 0);
        // The same run with its lease held runs its handler.
        let outcome = run(Lease::granted(
            std::time::Instant::now(),
            Duration::from_secs(60),
        ))
        .await;
        assert!(matches!(outcome, Outcome::Completed(_)));
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }
}
