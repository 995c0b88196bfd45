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

mod listener;
mod waiter;

pub use waiter::{Reserved, Waiter};

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::domain::{Execution, ExecutionId, TenantId};
use crate::revocation::Revocations;
use crate::store::Store;

/// How often a waiter re-reads its execution itself while the listener is not subscribed
/// (its connection is down or being re-established).
pub const FALLBACK_READ: Duration = Duration::from_secs(3);

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
}
