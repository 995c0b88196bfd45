//! Waiting for executions to change, for many clients at the cost of one. Behind
//! `GET /api/executions/{id}?wait=...` and `GET /api/executions/{id}/events`; no HTTP here.
//!
//! - **Who is told.** A waiter first subscribes (through the hub) to its execution's channel,
//!   then calls `watch.lua` once: that reads the execution and makes the scripts announce its
//!   changes on the channel while anybody may still wait (see `notify()` in
//!   `migrations-lua/common.lua`). Subscribing first means no change can fall between the
//!   read and the subscription.
//! - **One subscriber per process.** The [`Hub`] owns one Pub/Sub connection (its listener
//!   task, [`Hub::listen`]) and a registry `execution → local waiters`, by tenant. It
//!   subscribes to a channel when the first local waiter of that execution arrives and
//!   unsubscribes when the last one leaves. On an announcement it reads the execution once
//!   and hands the result to every local waiter of it (a `tokio::sync::watch` each): N clients
//!   on one execution cost one read per change, and nothing while nothing changes.
//! - **Never dependent on delivery.** When the listener's connection breaks (or stops
//!   answering its pings), every waiter falls back to re-reading its execution itself every
//!   [`FALLBACK_READ`]; on reconnecting, the listener subscribes to every channel again and
//!   re-reads every watched execution once (announcements may have been missed meanwhile).
//! - **Access news too.** The same connection hears the access channel (a key revoked, a
//!   tenant deleted): the hub hands it to `crate::revocation`, which ends the open waits of
//!   that key or tenant (`http::executions::waiting` waits on both).
//! - **Bounded.** At most `max_waiters` waiters per process and `max_per_tenant` of one tenant
//!   ([`Hub::join`] refuses more); every wait has a deadline; the hub's stop token (the
//!   server's shutdown) ends every wait at once.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::domain::{Execution, ExecutionId, TenantId};
use crate::revocation::Revocations;
use crate::store::{Announcement, Events, Store, StoreError};

/// How often a waiter re-reads its execution itself while the listener is not subscribed
/// (its connection is down or being re-established).
pub const FALLBACK_READ: Duration = Duration::from_secs(3);

/// How long a new waiter waits for its subscription to be confirmed before it goes on
/// without (and re-reads on its own until the listener catches up).
const SUBSCRIBE_WAIT: Duration = Duration::from_secs(1);

/// How much longer than its wait a waiter asks the scripts to announce changes.
const HORIZON_SLACK: Duration = Duration::from_secs(1);

/// How often the listener checks that its connection still answers.
const PING_EVERY: Duration = Duration::from_secs(5);

/// Pauses between the listener's attempts to connect: doubling from the first to the last.
const RECONNECT_FIRST: Duration = Duration::from_millis(100);
const RECONNECT_MAX: Duration = Duration::from_secs(2);

/// A listener connection that served this long was a working one: after its end the pauses
/// start over from the first.
const STEADY_LINK: Duration = Duration::from_secs(5);

/// After failing this long the listener logs a warning (and again as long as it fails).
const FAILING_LOUDLY: Duration = Duration::from_secs(10);

/// After a failed read of a changed execution, how long the listener waits before trying
/// again.
const REREAD_PAUSE: Duration = Duration::from_millis(500);

/// An execution as a waiter sees it.
#[derive(Debug, Clone)]
pub enum Observed {
    Present(Arc<Execution>),
    /// Missing, force-deleted, or (never for a real waiter) another tenant's.
    Gone,
}

impl Observed {
    fn of(e: Option<Execution>) -> Self {
        match e {
            Some(e) => Observed::Present(Arc::new(e)),
            None => Observed::Gone,
        }
    }

    /// Whether nothing more will happen to it (terminal, or gone): a waiter is done.
    pub fn is_final(&self) -> bool {
        match self {
            Observed::Present(e) => e.status.is_terminal(),
            Observed::Gone => true,
        }
    }
}

/// Why [`Hub::join`] refused a waiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The process has `max_waiters` waiters.
    ServerFull,
    /// The tenant has `max_per_tenant` waiters in this process.
    TenantFull,
}

/// Bounds of a hub.
#[derive(Debug, Clone, Copy)]
pub struct HubConfig {
    /// Waiters at once in this process.
    pub max_waiters: usize,
    /// Waiters of one tenant at once in this process.
    pub max_per_tenant: usize,
}

/// The registry of local waiters and the one Pub/Sub listener serving them (see the module
/// docs). Shared as `Arc<Hub>`.
pub struct Hub {
    store: Arc<Store>,
    /// Told what the access channel (heard on the listener's connection) announces.
    revocations: Arc<Revocations>,
    registry: Mutex<Registry>,
    /// Wakes the listener: some channel's subscription needs attention (`Registry::todo`).
    dirty: Notify,
    /// Orders reads: every read takes the next number before it is sent, so a waiter can tell
    /// a state read before its own from one read after.
    reads: AtomicU64,
    slots: Arc<Semaphore>,
    max_per_tenant: usize,
    stop: CancellationToken,
}

#[derive(Default)]
struct Registry {
    channels: HashMap<ExecutionId, Channel>,
    per_tenant: HashMap<TenantId, usize>,
    /// Channels whose subscription may not match the registry any more (new, left, stale).
    todo: HashSet<ExecutionId>,
    /// The listener's connection: whether it is up, and which one (counted from 1).
    up: bool,
    generation: u64,
}

/// The local waiters of one execution.
struct Channel {
    /// By tenant: in practice one (a waiter of another tenant's id is refused by its first
    /// read, and leaves).
    audiences: Vec<Audience>,
    /// Redis confirmed the subscription on the listener's current connection.
    live: bool,
    /// The execution must be read again once the subscription is live: announcements may have
    /// been missed (a reconnect, a waiter that did not wait for its subscription).
    stale: bool,
    /// A read by the listener is in flight; `again`: another change came meanwhile.
    reading: bool,
    again: bool,
}

struct Audience {
    tenant: TenantId,
    waiters: usize,
    tx: watch::Sender<Seen>,
}

/// What the listener last made known to the waiters of one execution (of one tenant).
#[derive(Debug, Clone)]
struct Seen {
    /// The read number of `state` (0: nothing read yet).
    seq: u64,
    state: Option<Observed>,
    /// The listener connection the subscription is live on; `None` while it is not.
    live: Option<u64>,
}

impl Hub {
    /// A hub reading through `store`, telling `revocations` what the access channel says,
    /// ending every wait when `stop` is cancelled. Nothing is subscribed until [`Hub::listen`]
    /// runs.
    pub fn new(
        store: Arc<Store>,
        revocations: Arc<Revocations>,
        config: HubConfig,
        stop: CancellationToken,
    ) -> Arc<Self> {
        Arc::new(Self {
            store,
            revocations,
            registry: Mutex::default(),
            dirty: Notify::new(),
            reads: AtomicU64::new(1),
            slots: Arc::new(Semaphore::new(config.max_waiters.max(1))),
            max_per_tenant: config.max_per_tenant.max(1),
            stop,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Registry> {
        // A panic while holding the lock leaves plain bookkeeping behind: keep going.
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn next_read(&self) -> u64 {
        self.reads.fetch_add(1, Ordering::Relaxed)
    }

    /// Cancelled when the server shuts down: every wait ends then.
    pub fn stopping(&self) -> CancellationToken {
        self.stop.clone()
    }

    /// Waiters registered now (for tests and metrics).
    pub fn waiters(&self) -> usize {
        self.lock()
            .channels
            .values()
            .flat_map(|c| c.audiences.iter().map(|a| a.waiters))
            .sum()
    }

    /// Registers a waiter of `tenant` for execution `id` (subscribing to its channel if it is
    /// the first local one), or refuses it when the bounds are reached.
    pub fn join(self: &Arc<Self>, tenant: &TenantId, id: &ExecutionId) -> Result<Waiter, Refusal> {
        let slot = self
            .slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| Refusal::ServerFull)?;
        let mut reg = self.lock();
        let count = reg.per_tenant.entry(tenant.clone()).or_default();
        if *count >= self.max_per_tenant {
            return Err(Refusal::TenantFull);
        }
        *count += 1;
        let live = reg.up.then_some(reg.generation);
        let mut new_channel = false;
        let channel = reg.channels.entry(id.clone()).or_insert_with(|| {
            new_channel = true;
            Channel {
                audiences: Vec::new(),
                live: false,
                stale: false,
                reading: false,
                again: false,
            }
        });
        let live = if channel.live { live } else { None };
        let rx = match channel.audiences.iter_mut().find(|a| &a.tenant == tenant) {
            Some(a) => {
                a.waiters += 1;
                a.tx.subscribe()
            }
            None => {
                let (tx, rx) = watch::channel(Seen {
                    seq: 0,
                    state: None,
                    live,
                });
                channel.audiences.push(Audience {
                    tenant: tenant.clone(),
                    waiters: 1,
                    tx,
                });
                rx
            }
        };
        if new_channel {
            reg.todo.insert(id.clone());
        }
        drop(reg);
        if new_channel {
            self.dirty.notify_one();
        }
        Ok(Waiter {
            hub: self.clone(),
            tenant: tenant.clone(),
            id: id.clone(),
            rx,
            seq: 0,
            last_read: Instant::now(),
            _slot: slot,
        })
    }

    /// Counts a waiter that waits on no execution (a pull worker's long poll) in the same
    /// bounds: one of the process's `max_waiters`, and one of `max_per_tenant` of each tenant
    /// in `tenants` (none: the process's bound only). Released when the answer is dropped.
    pub fn reserve(self: &Arc<Self>, tenants: &[TenantId]) -> Result<Reserved, Refusal> {
        let slot = self
            .slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| Refusal::ServerFull)?;
        let mut reg = self.lock();
        if tenants
            .iter()
            .any(|t| reg.per_tenant.get(t).copied().unwrap_or(0) >= self.max_per_tenant)
        {
            return Err(Refusal::TenantFull);
        }
        for t in tenants {
            *reg.per_tenant.entry(t.clone()).or_default() += 1;
        }
        Ok(Reserved {
            hub: self.clone(),
            tenants: tenants.to_vec(),
            _slot: slot,
        })
    }

    fn uncount(reg: &mut Registry, tenant: &TenantId) {
        if let Some(n) = reg.per_tenant.get_mut(tenant) {
            *n -= 1;
            if *n == 0 {
                reg.per_tenant.remove(tenant);
            }
        }
    }

    fn leave(&self, tenant: &TenantId, id: &ExecutionId) {
        let mut reg = self.lock();
        Self::uncount(&mut reg, tenant);
        let Some(channel) = reg.channels.get_mut(id) else {
            return;
        };
        if let Some(i) = channel.audiences.iter().position(|a| &a.tenant == tenant) {
            channel.audiences[i].waiters -= 1;
            if channel.audiences[i].waiters == 0 {
                channel.audiences.swap_remove(i);
            }
        }
        if channel.audiences.is_empty() {
            reg.channels.remove(id);
            reg.todo.insert(id.clone());
            drop(reg);
            self.dirty.notify_one();
        }
    }

    /// A waiter went on without its subscription: read its execution again once the
    /// subscription is live.
    fn mark_stale(&self, id: &ExecutionId) {
        let mut reg = self.lock();
        if let Some(c) = reg.channels.get_mut(id) {
            c.stale = true;
            reg.todo.insert(id.clone());
            drop(reg);
            self.dirty.notify_one();
        }
    }

    /// The listener: keeps one Pub/Sub connection (reconnecting with a pause when it breaks),
    /// keeps its subscriptions in line with the registry, and turns announcements into reads
    /// for the waiters. Runs until the hub's stop token is cancelled.
    pub async fn listen(self: Arc<Self>) {
        let mut attempt = 0usize;
        let mut pause = RECONNECT_FIRST;
        let mut failing_since: Option<Instant> = None;
        loop {
            let opened = tokio::select! {
                () = self.stop.cancelled() => return,
                opened = self.store.open_events(attempt) => opened,
            };
            let failure = match opened {
                Err(e) => e,
                Ok(mut events) => {
                    let began = Instant::now();
                    let generation = self.link_up();
                    // Access news may have been missed while no connection listened.
                    self.revocations.resync();
                    tracing::debug!(node = events.node(), generation, "waiters: listening");
                    let ended = self.serve_link(&mut events, generation).await;
                    self.link_down();
                    match ended {
                        Ok(()) => return,
                        Err(e) if began.elapsed() >= STEADY_LINK => {
                            // A connection that served for a while: its end is news, and the
                            // next attempt comes quickly.
                            tracing::info!(error = %e, node = events.node(), "waiters: pub/sub connection lost; reconnecting");
                            failing_since = None;
                            pause = RECONNECT_FIRST;
                            e
                        }
                        Err(e) => e,
                    }
                }
            };
            // Loud once failing lasts; each failed attempt on its own is a debug line.
            let since = *failing_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= FAILING_LOUDLY {
                tracing::warn!(error = %failure, "waiters: no pub/sub connection; waiters re-read on their own meanwhile");
                failing_since = Some(Instant::now());
            } else {
                tracing::debug!(error = %failure, "waiters: pub/sub connection failed");
            }
            attempt = attempt.wrapping_add(1);
            tokio::select! {
                () = self.stop.cancelled() => return,
                () = tokio::time::sleep(pause) => {}
            }
            pause = (pause * 2).min(RECONNECT_MAX);
        }
    }

    /// A new listener connection: its generation. Every channel is to be subscribed on it, and
    /// after a reconnect read again: it may have changed unannounced while no connection
    /// listened.
    fn link_up(&self) -> u64 {
        let mut reg = self.lock();
        reg.generation += 1;
        reg.up = true;
        let reconnect = reg.generation > 1;
        let ids: Vec<ExecutionId> = reg.channels.keys().cloned().collect();
        for c in reg.channels.values_mut() {
            c.stale |= reconnect;
        }
        reg.todo.extend(ids);
        reg.generation
    }

    /// The listener connection is gone: no subscription is live (waiters read on their own).
    fn link_down(&self) {
        let mut reg = self.lock();
        reg.up = false;
        for c in reg.channels.values_mut() {
            c.live = false;
            for a in &c.audiences {
                a.tx.send_modify(|s| s.live = None);
            }
        }
    }

    /// Whether the listener has a connection now (for tests and health).
    pub fn listening(&self) -> bool {
        self.lock().up
    }

    /// Serves one connection until it fails (`Err`) or the hub stops (`Ok`).
    async fn serve_link(
        self: &Arc<Self>,
        events: &mut Events,
        generation: u64,
    ) -> Result<(), StoreError> {
        let mut subscribed: HashSet<ExecutionId> = HashSet::new();
        let mut ping = tokio::time::interval_at(Instant::now() + PING_EVERY, PING_EVERY);
        ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            self.reconcile(events, generation, &mut subscribed).await?;
            tokio::select! {
                biased;
                () = self.stop.cancelled() => return Ok(()),
                () = self.dirty.notified() => {}
                msg = events.next() => match msg {
                    None => return Err(StoreError::Unavailable("pub/sub connection closed".into())),
                    Some(Announcement::Changed(id)) => self.changed(&id),
                    Some(Announcement::Access(change)) => self.revocations.notice(change),
                    Some(Announcement::Other) => {}
                },
                _ = ping.tick() => events.ping().await?,
            }
        }
    }

    /// Brings the subscriptions of the channels in `todo` in line with the registry, marks
    /// confirmed ones live and reads the stale ones.
    async fn reconcile(
        self: &Arc<Self>,
        events: &mut Events,
        generation: u64,
        subscribed: &mut HashSet<ExecutionId>,
    ) -> Result<(), StoreError> {
        let (subscribe, settled, unsubscribe) = {
            let mut reg = self.lock();
            if reg.todo.is_empty() {
                return Ok(());
            }
            let todo: Vec<ExecutionId> = reg.todo.drain().collect();
            let (mut subscribe, mut settled, mut unsubscribe) =
                (Vec::new(), Vec::new(), Vec::new());
            for id in todo {
                match (reg.channels.contains_key(&id), subscribed.contains(&id)) {
                    (true, false) => subscribe.push(id),
                    (true, true) => settled.push(id),
                    (false, true) => unsubscribe.push(id),
                    (false, false) => {}
                }
            }
            (subscribe, settled, unsubscribe)
        };
        events.subscribe(&subscribe).await?;
        subscribed.extend(subscribe.iter().cloned());
        events.unsubscribe(&unsubscribe).await?;
        for id in &unsubscribe {
            subscribed.remove(id);
        }
        let mut reads = Vec::new();
        {
            let mut reg = self.lock();
            for id in subscribe.into_iter().chain(settled) {
                let Some(c) = reg.channels.get_mut(&id) else {
                    continue;
                };
                if !c.live {
                    c.live = true;
                    for a in &c.audiences {
                        a.tx.send_modify(|s| s.live = Some(generation));
                    }
                }
                if c.stale {
                    c.stale = false;
                    if c.reading {
                        // The read in flight may have started before what it must see.
                        c.again = true;
                    } else {
                        c.reading = true;
                        reads.push(id);
                    }
                }
            }
        }
        for id in reads {
            tokio::spawn(self.clone().read(id));
        }
        Ok(())
    }

    /// An announcement for `id`: read it (once, however many wait), or note that another
    /// read is due when one is in flight.
    fn changed(self: &Arc<Self>, id: &ExecutionId) {
        let mut reg = self.lock();
        let Some(c) = reg.channels.get_mut(id) else {
            return;
        };
        if c.reading {
            c.again = true;
            return;
        }
        c.reading = true;
        drop(reg);
        tokio::spawn(self.clone().read(id.clone()));
    }

    /// Reads `id` for each tenant waiting on it and hands the state to its waiters; again while
    /// more changes were announced during the read.
    async fn read(self: Arc<Self>, id: ExecutionId) {
        loop {
            let seq = self.next_read();
            let tenants: Vec<TenantId> = match self.lock().channels.get(&id) {
                Some(c) => c.audiences.iter().map(|a| a.tenant.clone()).collect(),
                None => return,
            };
            let mut failed = false;
            for tenant in tenants {
                match self.store.get(&tenant, &id).await {
                    Ok(e) => {
                        let state = Observed::of(e);
                        let reg = self.lock();
                        if let Some(a) = reg
                            .channels
                            .get(&id)
                            .and_then(|c| c.audiences.iter().find(|a| a.tenant == tenant))
                        {
                            a.tx.send_if_modified(|s| {
                                if s.seq >= seq {
                                    return false;
                                }
                                s.seq = seq;
                                s.state = Some(state);
                                true
                            });
                        }
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, execution_id = %id, "waiters: cannot read a changed execution");
                        failed = true;
                    }
                }
            }
            if failed {
                // Tried again through the listener (when its subscription is live), after a
                // pause; the waiters' own fallback reads cover a listener that is down.
                tokio::select! {
                    () = self.stop.cancelled() => return,
                    () = tokio::time::sleep(REREAD_PAUSE) => {}
                }
                let mut reg = self.lock();
                if let Some(c) = reg.channels.get_mut(&id) {
                    c.reading = false;
                    c.again = false;
                    c.stale = true;
                    reg.todo.insert(id.clone());
                    drop(reg);
                    self.dirty.notify_one();
                }
                return;
            }
            let mut reg = self.lock();
            let Some(c) = reg.channels.get_mut(&id) else {
                return;
            };
            if c.again {
                c.again = false;
                continue;
            }
            c.reading = false;
            return;
        }
    }
}

/// A place among the hub's waiters held by a wait on no execution (see [`Hub::reserve`]).
pub struct Reserved {
    hub: Arc<Hub>,
    tenants: Vec<TenantId>,
    _slot: OwnedSemaphorePermit,
}

impl Drop for Reserved {
    fn drop(&mut self) {
        let mut reg = self.hub.lock();
        for t in &self.tenants {
            Hub::uncount(&mut reg, t);
        }
    }
}

/// One registered waiter: what a request handler waits through. Dropping it leaves the hub
/// (and unsubscribes when it was the execution's last local waiter).
pub struct Waiter {
    hub: Arc<Hub>,
    tenant: TenantId,
    id: ExecutionId,
    rx: watch::Receiver<Seen>,
    /// The read number of the state last handed out: older reads are not news.
    seq: u64,
    last_read: Instant,
    _slot: OwnedSemaphorePermit,
}

impl Waiter {
    /// The execution now, read with `watch.lua` after the subscription is confirmed (waiting
    /// for that at most `SUBSCRIBE_WAIT`, or not at all while the listener is down), so that
    /// every change until `deadline` (the end of this waiter's wait) is announced. `Gone` when
    /// it does not exist for this tenant.
    pub async fn start(&mut self, deadline: Instant) -> Result<Observed, StoreError> {
        let now = Instant::now();
        let live = self.subscribed(deadline.min(now + SUBSCRIBE_WAIT)).await;
        // A little longer than the wait: a Redis whose clock runs ahead of ours (a promoted
        // replica) still announces until the wait is over.
        let horizon = deadline.saturating_duration_since(now) + HORIZON_SLACK;
        if live.is_none() {
            self.hub.mark_stale(&self.id);
        }
        self.seq = self.hub.next_read();
        let state = Observed::of(
            self.hub
                .store
                .watch(&self.tenant, &self.id, horizon)
                .await?,
        );
        self.last_read = Instant::now();
        Ok(state)
    }

    /// Waits until the subscription is live (returns its connection) or `limit`.
    async fn subscribed(&mut self, limit: Instant) -> Option<u64> {
        loop {
            if let Some(g) = self.rx.borrow_and_update().live {
                return Some(g);
            }
            if !self.hub.lock().up {
                return None;
            }
            tokio::select! {
                changed = self.rx.changed() => changed.ok()?,
                () = tokio::time::sleep_until(limit) => return None,
                () = self.hub.stop.cancelled() => return None,
            }
        }
    }

    /// The next state of the execution read after the last one handed out (it may equal it:
    /// fallback reads are made whether or not anything changed), or `None` once `deadline`
    /// passed or the server is stopping.
    pub async fn next(&mut self, deadline: Instant) -> Option<Observed> {
        loop {
            let (fresh, live) = {
                let seen = self.rx.borrow_and_update();
                let fresh = (seen.seq > self.seq)
                    .then(|| seen.state.clone().map(|s| (seen.seq, s)))
                    .flatten();
                (fresh, seen.live)
            };
            if let Some((seq, state)) = fresh {
                self.seq = seq;
                return Some(state);
            }
            let fallback = self.last_read + FALLBACK_READ;
            tokio::select! {
                biased;
                () = self.hub.stop.cancelled() => return None,
                () = tokio::time::sleep_until(deadline) => return None,
                changed = self.rx.changed() => {
                    if changed.is_err() {
                        return None;
                    }
                }
                () = tokio::time::sleep_until(fallback), if live.is_none() => {
                    match self.current().await {
                        Ok(state) => return Some(state),
                        Err(e) => tracing::debug!(error = %e, execution_id = %self.id, "waiter: fallback read failed"),
                    }
                }
            }
        }
    }

    /// The execution now, read again: the answer at the end of a wait (one read per wait,
    /// not per poll), and the fallback read while the listener is down. At the end of a wait
    /// the state comes from Redis, not from the announcements, so it is right even if one
    /// never arrived (a cluster node that could not forward it).
    pub async fn current(&mut self) -> Result<Observed, StoreError> {
        let seq = self.hub.next_read();
        self.last_read = Instant::now();
        let state = Observed::of(self.hub.store.get(&self.tenant, &self.id).await?);
        self.seq = self.seq.max(seq);
        Ok(state)
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        self.hub.leave(&self.tenant, &self.id);
    }
}
