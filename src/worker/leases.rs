//! Leases, the one home of their logic: `Lease`, this worker's own view of a run's deadline
//! (the runtime stops a run whose deadline passes without renewal: `run.rs` checks it), the
//! heartbeat, which renews every lease of a shard in one call, and the stop listener, which
//! answers a cancel or force delete with a heartbeat of that run. Redis, not the message,
//! says whether and why a run stops.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::WorkerConfig;
use super::runs::{HeldMap, Stop};
use crate::domain::ExecutionId;
use crate::store::{LeaseState, Shard, Store};

/// This worker's own view of a lease: the time until which it can prove it holds it, counted
/// from when the call that granted or last renewed it was *sent* (Redis extended it no
/// earlier, so Redis's deadline is never before this one). The runtime stops a run whose lease
/// lapses without renewal; a handler may also ask before a side effect.
#[derive(Debug, Clone)]
pub struct Lease {
    inner: Arc<LeaseClock>,
}

#[derive(Debug)]
struct LeaseClock {
    /// Fixed points to convert between the monotonic and the wall clock.
    base: Instant,
    base_wall: SystemTime,
    /// The deadline, in microseconds after `base`.
    deadline_us: AtomicU64,
}

impl Lease {
    /// A lease granted by a call sent at `sent`, lasting `ttl`.
    pub fn granted(sent: Instant, ttl: Duration) -> Self {
        let base = Instant::now();
        let lease = Self {
            inner: Arc::new(LeaseClock {
                base,
                base_wall: SystemTime::now(),
                deadline_us: AtomicU64::new(0),
            }),
        };
        lease.renewed(sent, ttl);
        lease
    }

    /// Records a renewal by a call sent at `sent` (a later deadline only).
    pub fn renewed(&self, sent: Instant, ttl: Duration) {
        let until = (sent + ttl).saturating_duration_since(self.inner.base);
        let us = u64::try_from(until.as_micros()).unwrap_or(u64::MAX);
        self.inner.deadline_us.fetch_max(us, Ordering::SeqCst);
    }

    /// Until when this worker can prove it holds the lease.
    pub fn deadline(&self) -> Instant {
        self.inner.base + Duration::from_micros(self.inner.deadline_us.load(Ordering::SeqCst))
    }

    /// The deadline on the wall clock (for logs and journals).
    pub fn deadline_wall(&self) -> SystemTime {
        self.inner.base_wall + (self.deadline() - self.inner.base)
    }

    /// Whether the lease is still provably held.
    pub fn is_held(&self) -> bool {
        Instant::now() < self.deadline()
    }
}

/// Extends every held lease once per interval: one call per shard, not per execution, the
/// shards' calls at the same time.
/// `now` asks for a beat at once (stop messages may have been missed).
pub(super) async fn heartbeat_loop(
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
pub(super) async fn renew(
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
pub(super) async fn stop_listener(
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
