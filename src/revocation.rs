//! Credentials that stop working while they are in use, and credentials that never worked.
//! No HTTP here; `http::auth` asks, `waiters` delivers the news.
//!
//! - **One channel for news.** Revoking a key, deleting a tenant and creating a key publish an
//!   [`AccessChange`] on one Pub/Sub channel (`keys::access_channel`) after the change is on
//!   Redis. Every server hears it on the connection its waiters' listener already holds
//!   (`crate::waiters::Hub::listen`) and hands it to its [`Revocations`], which tells every open
//!   wait and stream of that key or tenant to end at once.
//! - **Never dependent on delivery.** A message can be lost (the listener reconnecting, a
//!   server that crashed between the change and the publish), so each open wait also re-checks
//!   its key on Redis every [`RECHECK_EVERY`], with an answer at most that old: a wait ends
//!   within about twice that (a second) of a revocation whose message never came. The
//!   lookup is shared by every wait of one key in this process (one per key per interval,
//!   whatever the number of its streams).
//! - **Strangers cost nothing.** A well-formed `sk_` token that Redis does not know is
//!   remembered (by key id and a digest of its secret, never the secret) for
//!   [`MISS_TTL`], at most [`MISS_CAP`] of them, so repeating it costs no Redis call. A key
//!   can only be remembered as missing if its exact token was presented before it existed; the
//!   key's creation announces its id anyway, and every server forgets the misses of that id.
//!   On a reconnect of the listener (news may have been missed) all misses are forgotten.
//!
//! - **Known keys cost (almost) nothing either.** A key Redis verified is remembered (by key
//!   id and the digest of its secret, with its tenant and role) for [`HIT_TTL`], at most
//!   [`HIT_CAP`] of them: within that time its requests make no `{acl}` call, so one Redis
//!   core no longer caps a cluster's authenticated request rate (one lookup per key per
//!   `HIT_TTL`, whatever the request rate). The news of a revocation or a tenant deletion
//!   forgets it at once (the server that made the change, before it answers; the others when
//!   the message arrives), and without the news it expires: a withdrawn key is refused by
//!   every server within `HIT_TTL` even when the message is lost. A reconnect of the listener
//!   forgets every one.
//! - **One lookup per key at a time, and a stall costs it one time-out.** The requests of a
//!   key that is not (or no longer) taken on trust wait for the one lookup under way; when
//!   that lookup cannot reach Redis, every request that waited for it gets its 503 at once,
//!   instead of each asking Redis in turn behind a stalled server.
//!
//! Later work that needs "this credential was withdrawn" (other kinds of sessions, caches of
//! keys) subscribes here ([`Revocations::subscribe`]) instead of inventing its own channel.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::broadcast;
use tokio::time::Instant;

use crate::access::{AccessChange, KeyId, KeyRole, PresentedKey};
use crate::domain::TenantId;
use crate::store::{Store, StoreError};

/// How old the check of an open wait's key may be: within about this long of a revocation
/// whose message was lost, the wait ends anyway.
pub const RECHECK_EVERY: Duration = Duration::from_millis(500);

/// How long a token Redis did not know is answered 401 without asking Redis again.
pub const MISS_TTL: Duration = Duration::from_secs(10);

/// Most unknown tokens remembered at once (about 100 bytes each); more are looked up each time.
pub const MISS_CAP: usize = 10_000;

/// Most keys whose last check is kept for open waits.
const CHECK_CAP: usize = 100_000;

/// How long a key Redis verified is taken on trust: the longest a withdrawn key may still be
/// served by a server that did not hear the news.
pub const HIT_TTL: Duration = Duration::from_millis(500);

/// Most verified keys remembered at once (about 200 bytes each); more are looked up each
/// time.
pub const HIT_CAP: usize = 10_000;

/// A presented token as the caches know it: its key id and the digest of its secret.
type TokenId = (String, [u8; 32]);

/// The lock the requests of one token take turns on while it is looked up, holding the last
/// lookup that failed: when it failed, and why. A request that waited while that lookup ran
/// into a Redis that could not answer gets the same answer at once instead of asking again:
/// behind a stalled Redis, N requests of one key then cost one lookup time-out, not N in turn.
type Gate = Arc<tokio::sync::Mutex<Option<(Instant, StoreError)>>>;

/// The process's view of revocations (see the module docs). Shared as `Arc<Revocations>`.
pub struct Revocations {
    store: Arc<Store>,
    /// Unknown tokens: (key id, digest of the secret) → until when.
    misses: Mutex<HashMap<TokenId, Instant>>,
    /// Verified tokens → their tenant and role, until when.
    hits: Mutex<HashMap<TokenId, (TenantId, KeyRole, Instant)>>,
    /// Tokens being looked up now, each with the lock its other requests wait on.
    lookups: Mutex<HashMap<TokenId, Gate>>,
    /// The last check of each key with open waits: when, and whether it was still live.
    checks: Mutex<HashMap<KeyId, (Instant, bool)>>,
    /// Counts the news that forgets verified keys: a lookup that overlapped one does not
    /// remember its answer.
    generation: AtomicU64,
    news: broadcast::Sender<AccessChange>,
}

impl Revocations {
    /// Nothing remembered yet; news arrives once a `waiters::Hub` listens with it.
    pub fn new(store: Arc<Store>) -> Arc<Self> {
        Arc::new(Self {
            store,
            misses: Mutex::default(),
            hits: Mutex::default(),
            lookups: Mutex::default(),
            checks: Mutex::default(),
            generation: AtomicU64::new(0),
            news: broadcast::channel(1024).0,
        })
    }

    fn misses(&self) -> MutexGuard<'_, HashMap<TokenId, Instant>> {
        self.misses.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn hits(&self) -> MutexGuard<'_, HashMap<TokenId, (TenantId, KeyRole, Instant)>> {
        self.hits.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lookups(&self) -> MutexGuard<'_, HashMap<TokenId, Gate>> {
        self.lookups.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn checks(&self) -> MutexGuard<'_, HashMap<KeyId, (Instant, bool)>> {
        self.checks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The tenant and role of a presented key, or `None` when Redis does not know it (see
    /// `Store::authenticate_key`); a verified token is remembered for `HIT_TTL`, an unknown
    /// one for `MISS_TTL`.
    pub async fn authenticate(
        &self,
        key: &PresentedKey,
        accept_dev_auth: bool,
    ) -> Result<Option<(TenantId, KeyRole)>, StoreError> {
        let entry = (key.id.as_str().to_owned(), key.fingerprint());
        let now = Instant::now();
        if let Some((tenant, role, until)) = self.hits().get(&entry)
            && *until > now
        {
            return Ok(Some((tenant.clone(), *role)));
        }
        if self.misses().get(&entry).is_some_and(|until| *until > now) {
            return Ok(None);
        }
        // One lookup per token at a time: the requests that find its trust run out together
        // wait for the first one's answer instead of each asking Redis.
        let gate = {
            let mut lookups = self.lookups();
            if lookups.len() >= HIT_CAP {
                // Handles left by requests that were dropped while they waited.
                lookups.retain(|_, g| Arc::strong_count(g) > 1);
            }
            lookups
                .entry(entry.clone())
                .or_insert_with(|| Arc::new(tokio::sync::Mutex::new(None)))
                .clone()
        };
        let arrived = Instant::now();
        let mut turn = gate.lock().await;
        let now = Instant::now();
        let cached = self
            .hits()
            .get(&entry)
            .filter(|(_, _, until)| *until > now)
            .map(|(tenant, role, _)| (tenant.clone(), *role));
        let answer = match (cached, turn.as_ref()) {
            (Some(hit), _) => Ok(Some(hit)),
            (None, _) if self.misses().get(&entry).is_some_and(|until| *until > now) => Ok(None),
            // A lookup that failed while this request waited: Redis could not answer then.
            (None, Some((failed, why))) if *failed >= arrived => Err(why.clone()),
            (None, _) => {
                let found = self.look_up(key, accept_dev_auth, entry.clone()).await;
                *turn = found.as_ref().err().map(|e| (Instant::now(), e.clone()));
                found
            }
        };
        drop(turn);
        let mut lookups = self.lookups();
        // The map's handle and this one: nobody else waits on it.
        if Arc::strong_count(&gate) <= 2 {
            lookups.remove(&entry);
        }
        answer
    }

    /// Asks Redis about a token and remembers the answer (see `authenticate`).
    async fn look_up(
        &self,
        key: &PresentedKey,
        accept_dev_auth: bool,
        entry: TokenId,
    ) -> Result<Option<(TenantId, KeyRole)>, StoreError> {
        let now = Instant::now();
        let generation = self.generation.load(Ordering::SeqCst);
        let found = self.store.authenticate_key(key, accept_dev_auth).await?;
        if let Some((tenant, role)) = &found {
            let mut hits = self.hits();
            // News heard while Redis was asked may be about this key: what was read is not
            // remembered then (it is still this request's answer: it was true when read).
            if self.generation.load(Ordering::SeqCst) == generation {
                if hits.len() >= HIT_CAP {
                    hits.retain(|_, (_, _, until)| *until > now);
                }
                if hits.len() < HIT_CAP {
                    hits.insert(entry, (tenant.clone(), *role, now + HIT_TTL));
                }
            }
        } else {
            let mut misses = self.misses();
            if misses.len() >= MISS_CAP {
                misses.retain(|_, until| *until > now);
            }
            if misses.len() < MISS_CAP {
                misses.insert(entry, now + MISS_TTL);
            }
        }
        Ok(found)
    }

    /// News from the access channel (or from this process): forget what it makes stale and
    /// tell the open waits.
    pub fn notice(&self, change: AccessChange) {
        match &change {
            AccessChange::KeyCreated(id) => {
                self.misses().retain(|(k, _), _| k != id.as_str());
            }
            AccessChange::KeyRevoked(id) => {
                self.generation.fetch_add(1, Ordering::SeqCst);
                self.hits().retain(|(k, _), _| k != id.as_str());
                self.checks().insert(id.clone(), (Instant::now(), false));
            }
            AccessChange::TenantDeleted(t) => {
                self.generation.fetch_add(1, Ordering::SeqCst);
                self.hits().retain(|_, (owner, _, _)| owner != t);
            }
        }
        // No receiver is fine: nobody waits.
        let _ = self.news.send(change);
    }

    /// The listener reconnected: news may have been missed, so nothing remembered is trusted.
    pub fn resync(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.hits().clear();
        self.misses().clear();
        self.checks().clear();
    }

    /// News as it arrives (see the module docs).
    pub fn subscribe(&self) -> broadcast::Receiver<AccessChange> {
        self.news.subscribe()
    }

    /// Whether `key` of `tenant` is still live, by a check at most `RECHECK_EVERY` old (shared
    /// by every wait of the key in this process).
    async fn still_live(&self, key: &KeyId, tenant: &TenantId) -> Result<bool, StoreError> {
        let now = Instant::now();
        if let Some((at, live)) = self.checks().get(key).copied()
            && now.duration_since(at) < RECHECK_EVERY
        {
            return Ok(live);
        }
        let live = self
            .store
            .key_tenant(key)
            .await?
            .is_some_and(|owner| &owner == tenant);
        let mut checks = self.checks();
        if checks.len() >= CHECK_CAP {
            checks.retain(|_, (at, _)| now.duration_since(*at) < RECHECK_EVERY);
        }
        // A revocation noticed during the lookup wins over what the lookup read.
        if let Some((at, false)) = checks.get(key)
            && *at >= now
        {
            return Ok(false);
        }
        checks.insert(key.clone(), (now, live));
        Ok(live)
    }

    /// A watch on one key for an open wait or stream.
    pub fn watch(self: &Arc<Self>, key: KeyId, tenant: TenantId) -> KeyWatch {
        let mut tick = tokio::time::interval_at(Instant::now() + RECHECK_EVERY, RECHECK_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        KeyWatch {
            revocations: self.clone(),
            news: self.subscribe(),
            tick,
            key,
            tenant,
        }
    }
}

/// What an open wait of an API key holds to learn that the key was withdrawn.
pub struct KeyWatch {
    revocations: Arc<Revocations>,
    news: broadcast::Receiver<AccessChange>,
    /// The re-checks, kept across calls of `revoked` (a wait calls it once per change).
    tick: tokio::time::Interval,
    key: KeyId,
    tenant: TenantId,
}

impl KeyWatch {
    /// Resolves once the key is revoked or its tenant deleted: at once when the news arrives,
    /// else by the next re-check (at most about `RECHECK_EVERY` later). A re-check that cannot
    /// reach Redis does not end the wait (the wait's own reads fail then).
    pub async fn revoked(&mut self) {
        loop {
            tokio::select! {
                news = self.news.recv() => match news {
                    Ok(AccessChange::KeyRevoked(id)) if id == self.key => return,
                    Ok(AccessChange::TenantDeleted(t)) if t == self.tenant => return,
                    Ok(_) => {}
                    // Missed news: the next check decides.
                    Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => std::future::pending().await,
                },
                _ = self.tick.tick() => {
                    if let Ok(false) = self.revocations.still_live(&self.key, &self.tenant).await {
                        return;
                    }
                }
            }
        }
    }
}
