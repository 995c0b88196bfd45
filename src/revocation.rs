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
//! - **Strangers cost nothing.** Anybody can make up well-formed `sk_` tokens, each with a
//!   new random key id, faster than a cache of misses could remember them. So a server knows
//!   which key ids exist: it reads them all when its listener (re)connects
//!   (`Store::all_key_ids`, at most [`KNOWN_CAP`]), learns each key's creation from the news
//!   (the server that creates it before it answers) and every id Redis verified. A token whose
//!   id is none of those is looked up only within a per-server budget
//!   (`--unknown-key-lookups-per-second`, with a burst of [`BURST_SECONDS`] of it): a flood of
//!   made-up tokens costs Redis at most that rate, and past it such a token is answered 503
//!   `key_lookups_busy` (a real key whose news was lost gets its answer on a retry, a made-up
//!   one costs nothing). An id Redis did not know is remembered for [`MISS_TTL`] (at most
//!   [`MISS_CAP`], which the budget keeps a flood from filling): repeating it costs nothing.
//!   Its creation announces its id anyway, and every server forgets the miss.
//!   On a reconnect of the listener (news may have been missed) all misses are forgotten.
//!
//! - **Known keys cost (almost) nothing either.** A key Redis verified is remembered (by key
//!   id, with its tenant, role and the stored hash of its secret) for [`HIT_TTL`], at most
//!   [`HIT_CAP`] of them: within that time its requests make no `{acl}` call, so one Redis
//!   core no longer caps a cluster's authenticated request rate (one lookup per key per
//!   `HIT_TTL`, whatever the request rate), and a wrong secret presented with its id is
//!   refused without one too. The news of a revocation or a tenant deletion
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

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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

/// How long a key id Redis did not know is answered 401 without asking Redis again.
pub const MISS_TTL: Duration = Duration::from_secs(10);

/// Most unknown key ids remembered at once (about 60 bytes each); more are looked up each
/// time, within the budget for unknown ids.
pub const MISS_CAP: usize = 10_000;

/// Most key ids a server knows to exist (8 bytes each); ids beyond it are looked up within
/// the budget for unknown ids, like made-up ones.
pub const KNOWN_CAP: usize = 250_000;

/// The budget for looking up key ids a server does not know to exist may be saved up for
/// this long: its burst is this many seconds of its rate.
pub const BURST_SECONDS: u32 = 10;

/// Most keys whose last check is kept for open waits.
const CHECK_CAP: usize = 100_000;

/// How long a key Redis verified is taken on trust: the longest a withdrawn key may still be
/// served by a server that did not hear the news.
pub const HIT_TTL: Duration = Duration::from_millis(500);

/// Most verified keys remembered at once (about 250 bytes each); more are looked up each
/// time.
pub const HIT_CAP: usize = 10_000;

/// What a presented key turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyVerdict {
    /// A live key with this secret: its tenant and role.
    Valid(TenantId, KeyRole),
    /// No live key with this id and secret (a 401).
    Unknown,
    /// Its id is not known to exist and the budget for looking such ids up is spent now:
    /// not asked (a 503; a retry a moment later is looked up).
    Throttled,
}

/// A verified key as remembered: its tenant, role and stored secret hash, until when.
struct Record {
    tenant: TenantId,
    role: KeyRole,
    hash: String,
    until: Instant,
}

/// The budget for looking up key ids not known to exist: a token bucket.
struct Budget {
    per_second: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl Budget {
    fn new(per_second: u32) -> Self {
        let per_second = f64::from(per_second.max(1));
        let burst = per_second * f64::from(BURST_SECONDS);
        Self {
            per_second,
            burst,
            tokens: burst,
            at: Instant::now(),
        }
    }

    /// Takes one lookup if the budget has it.
    fn take(&mut self) -> bool {
        let now = Instant::now();
        let refill = now.duration_since(self.at).as_secs_f64() * self.per_second;
        self.tokens = (self.tokens + refill).min(self.burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// A key id as the set of known ids holds it: its 64 bits.
fn id_bits(id: &KeyId) -> u64 {
    // A `KeyId` is 16 lowercase hex characters: always 64 bits.
    u64::from_str_radix(id.as_str(), 16).unwrap_or(0)
}

/// The lock the requests of one token take turns on while it is looked up, holding the last
/// lookup that failed: when it failed, and why. A request that waited while that lookup ran
/// into a Redis that could not answer gets the same answer at once instead of asking again:
/// behind a stalled Redis, N requests of one key then cost one lookup time-out, not N in turn.
type Gate = Arc<tokio::sync::Mutex<Option<(Instant, StoreError)>>>;

/// The process's view of revocations (see the module docs). Shared as `Arc<Revocations>`.
pub struct Revocations {
    store: Arc<Store>,
    /// Key ids Redis had no live key for → until when.
    misses: Mutex<HashMap<KeyId, Instant>>,
    /// Verified keys by id.
    hits: Mutex<HashMap<KeyId, Record>>,
    /// Key ids known to exist (or to have existed: Redis says which).
    known: Mutex<HashSet<u64>>,
    /// The budget for looking up the other ids.
    budget: Mutex<Budget>,
    /// Whether a read of every key id is under way.
    learning: AtomicBool,
    /// Key ids being looked up now, each with the lock its other requests wait on.
    lookups: Mutex<HashMap<KeyId, Gate>>,
    /// The last check of each key with open waits: when, and whether it was still live.
    checks: Mutex<HashMap<KeyId, (Instant, bool)>>,
    /// Counts the news that forgets verified keys: a lookup that overlapped one does not
    /// remember its answer.
    generation: AtomicU64,
    news: broadcast::Sender<AccessChange>,
}

impl Revocations {
    /// Nothing remembered yet; news arrives once a `waiters::Hub` listens with it (and then
    /// the key ids that exist are read). Key ids not known to exist are looked up at most
    /// `unknown_lookups_per_second` (at least 1) a second, with a burst of `BURST_SECONDS`.
    pub fn new(store: Arc<Store>, unknown_lookups_per_second: u32) -> Arc<Self> {
        Arc::new(Self {
            store,
            misses: Mutex::default(),
            hits: Mutex::default(),
            known: Mutex::default(),
            budget: Mutex::new(Budget::new(unknown_lookups_per_second)),
            learning: AtomicBool::new(false),
            lookups: Mutex::default(),
            checks: Mutex::default(),
            generation: AtomicU64::new(0),
            news: broadcast::channel(1024).0,
        })
    }

    fn misses(&self) -> MutexGuard<'_, HashMap<KeyId, Instant>> {
        self.misses.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn hits(&self) -> MutexGuard<'_, HashMap<KeyId, Record>> {
        self.hits.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn known(&self) -> MutexGuard<'_, HashSet<u64>> {
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lookups(&self) -> MutexGuard<'_, HashMap<KeyId, Gate>> {
        self.lookups.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn checks(&self) -> MutexGuard<'_, HashMap<KeyId, (Instant, bool)>> {
        self.checks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Remembers that `id` exists (up to `KNOWN_CAP` ids).
    fn learn(&self, id: &KeyId) {
        let mut known = self.known();
        if known.len() < KNOWN_CAP {
            known.insert(id_bits(id));
        }
    }

    /// What is remembered of `key` now, if anything: a verified key (its secret checked
    /// against the stored hash here) or an id Redis did not know.
    fn remembered(&self, key: &PresentedKey, accept_dev_auth: bool) -> Option<KeyVerdict> {
        let now = Instant::now();
        if let Some(r) = self.hits().get(&key.id)
            && r.until > now
        {
            return Some(verdict(key, r, accept_dev_auth));
        }
        self.misses()
            .get(&key.id)
            .is_some_and(|until| *until > now)
            .then_some(KeyVerdict::Unknown)
    }

    /// Whether a presented key is live with this secret (see `Store::key_record`; a dev-auth
    /// key matches only when `accept_dev_auth`). A verified key is remembered for `HIT_TTL`,
    /// an unknown id for `MISS_TTL`; an id not known to exist is looked up only within the
    /// budget (see the module docs).
    pub async fn authenticate(
        &self,
        key: &PresentedKey,
        accept_dev_auth: bool,
    ) -> Result<KeyVerdict, StoreError> {
        if let Some(v) = self.remembered(key, accept_dev_auth) {
            return Ok(v);
        }
        // One lookup per key id at a time: the requests that find its trust run out together
        // wait for the first one's answer instead of each asking Redis.
        let gate = {
            let mut lookups = self.lookups();
            if lookups.len() >= HIT_CAP {
                // Handles left by requests that were dropped while they waited.
                lookups.retain(|_, g| Arc::strong_count(g) > 1);
            }
            lookups
                .entry(key.id.clone())
                .or_insert_with(|| Arc::new(tokio::sync::Mutex::new(None)))
                .clone()
        };
        let arrived = Instant::now();
        let mut turn = gate.lock().await;
        let answer = match (self.remembered(key, accept_dev_auth), turn.as_ref()) {
            (Some(v), _) => Ok(v),
            // A lookup that failed while this request waited: Redis could not answer then.
            (None, Some((failed, why))) if *failed >= arrived => Err(why.clone()),
            (None, _) if !self.known().contains(&id_bits(&key.id)) && !self.within_budget() => {
                Ok(KeyVerdict::Throttled)
            }
            (None, _) => {
                let found = self.look_up(key, accept_dev_auth).await;
                *turn = found.as_ref().err().map(|e| (Instant::now(), e.clone()));
                found
            }
        };
        drop(turn);
        let mut lookups = self.lookups();
        // The map's handle and this one: nobody else waits on it.
        if Arc::strong_count(&gate) <= 2 {
            lookups.remove(&key.id);
        }
        answer
    }

    /// Takes one lookup of an id not known to exist from the budget, if it has one.
    fn within_budget(&self) -> bool {
        let taken = self.budget.lock().unwrap_or_else(|e| e.into_inner()).take();
        if !taken {
            tracing::debug!("auth: the budget for looking up unknown key ids is spent");
        }
        taken
    }

    /// Asks Redis about a key id and remembers the answer (see `authenticate`).
    async fn look_up(
        &self,
        key: &PresentedKey,
        accept_dev_auth: bool,
    ) -> Result<KeyVerdict, StoreError> {
        let now = Instant::now();
        let generation = self.generation.load(Ordering::SeqCst);
        let Some((tenant, role, hash)) = self.store.key_record(&key.id).await? else {
            self.known().remove(&id_bits(&key.id));
            let mut misses = self.misses();
            if misses.len() >= MISS_CAP {
                misses.retain(|_, until| *until > now);
            }
            if misses.len() < MISS_CAP {
                misses.insert(key.id.clone(), now + MISS_TTL);
            }
            return Ok(KeyVerdict::Unknown);
        };
        self.learn(&key.id);
        let record = Record {
            tenant,
            role,
            hash,
            until: now + HIT_TTL,
        };
        // The answer is true as read, whatever the news since.
        let answer = verdict(key, &record, accept_dev_auth);
        let mut hits = self.hits();
        // News heard while Redis was asked may be about this key: what was read is not
        // remembered then.
        if self.generation.load(Ordering::SeqCst) == generation {
            if hits.len() >= HIT_CAP {
                hits.retain(|_, r| r.until > now);
            }
            if hits.len() < HIT_CAP {
                hits.insert(key.id.clone(), record);
            }
        }
        Ok(answer)
    }

    /// Reads every key id that exists, in the background (one read at a time): after the
    /// listener (re)connected, so ids whose creation news was missed are known again.
    fn learn_all(self: &Arc<Self>) {
        if self.learning.swap(true, Ordering::SeqCst) {
            return;
        }
        let me = self.clone();
        tokio::spawn(async move {
            match me.store.all_key_ids(KNOWN_CAP).await {
                Ok(ids) => {
                    let mut known = me.known();
                    for id in &ids {
                        if known.len() >= KNOWN_CAP {
                            break;
                        }
                        known.insert(id_bits(id));
                    }
                    tracing::debug!(keys = ids.len(), "auth: key ids read");
                }
                Err(e) => {
                    tracing::warn!(error = %e, "auth: could not read the key ids; unknown ids are looked up within their budget");
                }
            }
            me.learning.store(false, Ordering::SeqCst);
        });
    }

    /// News from the access channel (or from this process): forget what it makes stale and
    /// tell the open waits.
    pub fn notice(&self, change: AccessChange) {
        match &change {
            AccessChange::KeyCreated(id) => {
                self.misses().remove(id);
                self.learn(id);
            }
            AccessChange::KeyRevoked(id) => {
                self.generation.fetch_add(1, Ordering::SeqCst);
                self.hits().remove(id);
                self.checks().insert(id.clone(), (Instant::now(), false));
            }
            AccessChange::TenantDeleted(t) => {
                self.generation.fetch_add(1, Ordering::SeqCst);
                self.hits().retain(|_, r| &r.tenant != t);
            }
        }
        // No receiver is fine: nobody waits.
        let _ = self.news.send(change);
    }

    /// The listener (re)connected: news may have been missed, so nothing remembered is
    /// trusted, and the key ids that exist are read again (the ids known so far stay: an id
    /// known to exist is only looked up without the budget, and Redis says whether it is
    /// live).
    pub fn resync(self: &Arc<Self>) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.hits().clear();
        self.misses().clear();
        self.checks().clear();
        self.learn_all();
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

/// What `record` says of a presented key: valid when the secret is the one stored.
fn verdict(key: &PresentedKey, record: &Record, accept_dev_auth: bool) -> KeyVerdict {
    if key.matches(&record.hash, accept_dev_auth) {
        KeyVerdict::Valid(record.tenant.clone(), record.role)
    } else {
        KeyVerdict::Unknown
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
