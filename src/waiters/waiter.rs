//! What a request handler holds while it waits: a [`Waiter`] on one execution (subscribed
//! through the hub, re-reading on its own while the listener is down), or a [`Reserved`]
//! place for a wait on no execution. Dropping either gives its place back.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, watch};
use tokio::time::Instant;

use super::{FALLBACK_READ, Hub, Observed, Seen};
use crate::domain::{ExecutionId, TenantId};
use crate::store::StoreError;

/// How long a new waiter waits for its subscription to be confirmed before it goes on
/// without (and re-reads on its own until the listener catches up).
const SUBSCRIBE_WAIT: Duration = Duration::from_secs(1);

/// How much longer than its wait a waiter asks the scripts to announce changes.
const HORIZON_SLACK: Duration = Duration::from_secs(1);

/// A place among the hub's waiters held by a wait on no execution (see [`Hub::reserve`]).
pub struct Reserved {
    pub(super) hub: Arc<Hub>,
    pub(super) tenants: Vec<TenantId>,
    pub(super) _slot: OwnedSemaphorePermit,
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
    pub(super) hub: Arc<Hub>,
    pub(super) tenant: TenantId,
    pub(super) id: ExecutionId,
    pub(super) rx: watch::Receiver<Seen>,
    /// The read number of the state last handed out: older reads are not news.
    pub(super) seq: u64,
    pub(super) last_read: Instant,
    pub(super) _slot: OwnedSemaphorePermit,
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
