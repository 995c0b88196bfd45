//! The hub's listener: the one Pub/Sub connection of the process, kept subscribed to the
//! channels the registry needs and to the access channel, reconnecting with growing pauses,
//! and turning each announcement into one read handed to every local waiter of it.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{Hub, Observed};
use crate::domain::{ExecutionId, TenantId};
use crate::store::{Announcement, Events, StoreError};

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

impl Hub {
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
