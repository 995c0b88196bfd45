//! Webhook delivery: `serve` sends each tenant's outbox (the events the scripts appended when
//! they ended executions, see "Webhooks" in `migrations-lua/common.lua`) to the tenant's
//! address, signed the way the Standard Webhooks specification does it, and deletes an event
//! only once its receiver answered 2xx. So every event is delivered at least once whatever
//! stops — `serve` killed mid-delivery sends it again, with the same `webhook-id` and the same
//! body, and the receiver drops the duplicate by that id.
//!
//! - **Woken, not polled.** A script that appends to an empty outbox publishes the tenant on
//!   `keys::WEBHOOK_CHANNEL`; every `serve` listens and drains that tenant until its outbox is
//!   empty. A scan of the shards' webhook tenants (at start, after the listener reconnects,
//!   and every `--webhook-scan-ms`) finds what a lost message or a stopped server left.
//! - **One server per tenant at a time** (`Store::hold_delivery`, a lock with a time-out), so
//!   one execution's events go out in sequence order: the events of one execution one after
//!   another (a failure stops that execution's line until its retry), different executions'
//!   at once.
//! - **Retries** follow each event's own schedule: after its n-th failed attempt it is not
//!   sent again before `RETRY_FIRST` × 2^(n-1) (at most `RETRY_MAX`), whatever wakes the
//!   tenant meanwhile (a scan, news of another event, another server). Other executions'
//!   events may overtake it: the outbox is read again at least every `LOOK_WHILE_WAITING`
//!   while an event waits. The server that holds the tenant keeps holding it while an event
//!   waits (so no other server sends it early); the schedule is kept in that server's memory,
//!   and a server that takes over after it stopped starts again from `RETRY_FIRST`. Events
//!   older than `--webhook-max-age-secs` are dropped (and counted), as are those a full
//!   outbox evicts.
//! - **Private addresses refused.** The address is resolved at every delivery (no pooled
//!   connection outlives a delivery) and the connection goes to the very addresses checked:
//!   loopback, private, link-local, shared, unspecified, multicast, documentation and the
//!   like are refused unless `--webhook-allow-private` says otherwise. Redirects are not
//!   followed (a 3xx is a failed attempt).
//!
//! The signing is in `signing.rs`, the address rules and the checked resolver in
//! `address.rs`, one attempt (the signed POST and its record) in `attempt.rs`, each event's
//! retry schedule and the tenant's wake-up timer in `retry.rs`; this file is the deliverer:
//! who drains which tenant, when, and how often again.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt;
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use crate::domain::TenantId;
use crate::store::{DeliveryRecord, OutboxEntry, Store, StoreError, keys};

mod address;
mod attempt;
mod retry;
mod signing;

use address::CheckedResolver;
pub use address::{WEBHOOK_URL_PATTERN, check_url, is_private};
use retry::Retry;
pub use retry::{LOOK_WHILE_WAITING, RETRY_FIRST, RETRY_MAX, retry_pause};
pub use signing::{SECRET_PREFIX, new_secret, payload, signature, webhook_id};

/// Events read (and sent) per round.
const BATCH: usize = 64;
/// Tenants delivered at once by one server.
const TENANTS_AT_ONCE: usize = 32;
/// How `serve` delivers webhooks (from its settings).
#[derive(Debug, Clone)]
pub struct DeliveryConfig {
    /// Whether this server delivers at all (`--webhook-delivery`).
    pub enabled: bool,
    /// Deliver to loopback, private and link-local addresses too (tests, closed networks).
    pub allow_private: bool,
    /// How long one delivery may take, connection included.
    pub timeout: Duration,
    /// How often every shard's webhook tenants are looked at for events left behind; `None`:
    /// only at start and when the listener reconnects.
    pub scan: Option<Duration>,
    /// Events older than this are dropped undelivered (and counted).
    pub max_age: Duration,
    /// Root certificates trusted for `https` receivers besides the built-in ones
    /// (`--webhook-ca-file`; see `crate::tls`).
    pub extra_roots: Vec<rustls::pki_types::CertificateDer<'static>>,
}

/// How a tenant's deliveries stand in this server.
#[derive(Debug, Default)]
struct TenantRound {
    /// A drain of it runs now.
    active: bool,
    /// Woken while its drain ran: look again when it ends.
    again: bool,
    /// Rounds in a row that could not reach Redis (their backoff).
    failures: u32,
    /// Each event this server failed to deliver, by outbox entry id: its attempts (for the
    /// log) and when it may be sent again.
    retries: HashMap<String, Retry>,
    /// When a wake-up of the tenant is set for (one at a time).
    timer: Option<Instant>,
}

/// `serve`'s webhook deliverer.
pub struct Deliverer {
    store: Arc<Store>,
    config: DeliveryConfig,
    /// This server's name on a delivery lock.
    holder: String,
    http: reqwest::Client,
    rounds: Mutex<HashMap<TenantId, TenantRound>>,
    wake: mpsc::UnboundedSender<TenantId>,
    woken: Mutex<Option<mpsc::UnboundedReceiver<TenantId>>>,
    /// Whether wake-ups are heard now (subscribed, and the scan that follows done).
    up: AtomicBool,
    /// Attempts this server made that the receiver took (2xx), and that it did not.
    delivered: AtomicU64,
    failed: AtomicU64,
    /// Events this server dropped for age.
    dropped: AtomicU64,
}

/// What one server's deliverer did since it started (`/metrics` reports it): attempts the
/// receiver took, attempts that failed (non-2xx, time-out, refused address or certificate),
/// and events dropped for age. Events a full outbox evicted are counted on Redis per tenant
/// (`GET /api/tenants/{t}/webhook`), not here: no server saw them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeliveryCounts {
    pub delivered: u64,
    pub failed: u64,
    pub dropped: u64,
}

impl Deliverer {
    pub fn new(store: Arc<Store>, config: DeliveryConfig) -> anyhow::Result<Arc<Self>> {
        let http = crate::tls::client_builder(&config.extra_roots)?
            .dns_resolver(Arc::new(CheckedResolver {
                allow_private: config.allow_private,
            }))
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .pool_max_idle_per_host(0)
            .timeout(config.timeout)
            .connect_timeout(config.timeout)
            .user_agent(concat!("sluice-webhooks/", env!("CARGO_PKG_VERSION")))
            .build()?;
        let (wake, woken) = mpsc::unbounded_channel();
        Ok(Arc::new(Self {
            store,
            holder: format!("serve-{}", uuid::Uuid::new_v4().simple()),
            config,
            http,
            rounds: Mutex::new(HashMap::new()),
            wake,
            woken: Mutex::new(Some(woken)),
            up: AtomicBool::new(false),
            delivered: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        }))
    }

    /// What this server's deliveries came to so far.
    pub fn counts(&self) -> DeliveryCounts {
        DeliveryCounts {
            delivered: self.delivered.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
        }
    }

    /// Whether wake-ups are heard now: subscribed, and the scan that follows a subscription
    /// done (for tests and health).
    pub fn listening(&self) -> bool {
        self.up.load(Ordering::SeqCst)
    }

    fn rounds(&self) -> std::sync::MutexGuard<'_, HashMap<TenantId, TenantRound>> {
        self.rounds.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How long this server may deliver a tenant before another may take over: three
    /// delivery time-outs (a round stops sending new events after one).
    fn lock_ttl(&self) -> Duration {
        (self.config.timeout * 3).max(Duration::from_secs(1))
    }

    /// Delivers until `stop` is cancelled.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        if !self.config.enabled {
            return;
        }
        let Some(mut woken) = self.woken.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return;
        };
        tokio::spawn(self.clone().listen(stop.clone()));
        if let Some(every) = self.config.scan {
            let me = self.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(every);
                tick.tick().await;
                loop {
                    tokio::select! {
                        () = stop.cancelled() => return,
                        _ = tick.tick() => me.scan().await,
                    }
                }
            });
        }
        let slots = Arc::new(Semaphore::new(TENANTS_AT_ONCE));
        loop {
            let tenant = tokio::select! {
                () = stop.cancelled() => return,
                t = woken.recv() => match t { Some(t) => t, None => return },
            };
            {
                let mut rounds = self.rounds();
                let round = rounds.entry(tenant.clone()).or_default();
                if round.active {
                    round.again = true;
                    continue;
                }
                round.active = true;
            }
            let Ok(permit) = slots.clone().acquire_owned().await else {
                return;
            };
            let me = self.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                let _permit = permit;
                me.drain(&tenant, &stop).await;
            });
        }
    }

    /// Asks for `tenant`'s outbox to be delivered.
    fn wake(&self, tenant: TenantId) {
        let _ = self.wake.send(tenant);
    }

    /// Wakes every tenant of every shard that has a webhook (those with nothing to send cost
    /// one read each).
    async fn scan(&self) {
        for shard in self.store.shards().all() {
            match self.store.webhook_tenants(shard).await {
                Ok(tenants) => tenants.into_iter().for_each(|t| self.wake(t)),
                Err(e) => tracing::debug!(error = %e, "webhooks: scan of a shard failed"),
            }
        }
    }

    /// Listens for outboxes that were empty and are not any more, reconnecting after a
    /// pause when the connection breaks; scans after each (re)connection.
    async fn listen(self: Arc<Self>, stop: CancellationToken) {
        let mut pause = Duration::from_millis(100);
        for attempt in 0.. {
            let began = Instant::now();
            tokio::select! {
                () = stop.cancelled() => return,
                ended = self.listen_once(attempt) => {
                    self.up.store(false, Ordering::SeqCst);
                    if let Err(e) = ended {
                        tracing::debug!(error = %e, "webhooks: listener failed");
                    }
                }
            }
            if began.elapsed() > Duration::from_secs(5) {
                pause = Duration::from_millis(100);
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(pause) => {}
            }
            pause = (pause * 2).min(Duration::from_secs(5));
        }
    }

    async fn listen_once(&self, attempt: usize) -> Result<(), StoreError> {
        let url = self.store.pubsub_node(attempt)?;
        let client = redis::Client::open(url.as_str())?;
        let mut pubsub = tokio::time::timeout(self.store.config().op_timeout, async {
            let mut p = client.get_async_pubsub().await?;
            p.subscribe(keys::WEBHOOK_CHANNEL).await?;
            Ok::<_, redis::RedisError>(p)
        })
        .await
        .map_err(|_| StoreError::Unavailable("webhook listener: no answer".into()))??;
        // Whatever was published while nobody listened is found by a scan.
        self.scan().await;
        self.up.store(true, Ordering::SeqCst);
        let mut messages = pubsub.on_message();
        while let Some(msg) = messages.next().await {
            if let Some(t) = msg
                .get_payload::<String>()
                .ok()
                .and_then(|t| TenantId::parse(&t).ok())
            {
                self.wake(t);
            }
        }
        Err(StoreError::Unavailable("webhook listener closed".into()))
    }

    /// Delivers `tenant`'s outbox until it is empty, only events waiting out their pause are
    /// left (then again when the first may go, or sooner to look for others), another server
    /// holds it, Redis cannot be reached (then again after a backoff), or `stop`.
    async fn drain(self: Arc<Self>, tenant: &TenantId, stop: &CancellationToken) {
        let (retry_in, keep_hold) = loop {
            if stop.is_cancelled() {
                break (None, false);
            }
            match self.round(tenant).await {
                Ok(RoundEnd::More) => continue,
                Ok(RoundEnd::Idle) => {
                    let mut rounds = self.rounds();
                    let round = rounds.entry(tenant.clone()).or_default();
                    round.failures = 0;
                    round.retries.clear();
                    break (None, false);
                }
                Ok(RoundEnd::Wait(until)) => {
                    self.rounds().entry(tenant.clone()).or_default().failures = 0;
                    let pause = until
                        .saturating_duration_since(Instant::now())
                        .min(LOOK_WHILE_WAITING);
                    // Still this server's to deliver while its events wait: another server
                    // would not know their schedule.
                    let held = self
                        .store
                        .hold_delivery(tenant, &self.holder, pause + self.lock_ttl())
                        .await;
                    break (Some(pause), matches!(held, Ok(None)));
                }
                // Another server delivers it; look again when its right would run out (it
                // may have stopped mid-delivery).
                Ok(RoundEnd::Held(left)) => break (Some(left + Duration::from_millis(50)), true),
                Err(e) => {
                    tracing::debug!(tenant = %tenant, error = %e, "webhooks: a round failed");
                    let mut rounds = self.rounds();
                    let round = rounds.entry(tenant.clone()).or_default();
                    round.failures = round.failures.saturating_add(1);
                    break (Some(retry_pause(round.failures)), false);
                }
            }
        };
        if !keep_hold {
            let _ = self.store.release_delivery(tenant, &self.holder).await;
        }
        let again = {
            let mut rounds = self.rounds();
            let round = rounds.entry(tenant.clone()).or_default();
            round.active = false;
            let again = std::mem::take(&mut round.again);
            if round.failures == 0 && !again && round.retries.is_empty() && round.timer.is_none() {
                rounds.remove(tenant);
            }
            again
        };
        match retry_in {
            Some(pause) => self.wake_at(tenant, Instant::now() + pause, stop),
            None if again => self.wake(tenant.clone()),
            None => {}
        }
    }

    /// One round: hold the tenant, drop what is too old, send up to `BATCH` events, except
    /// each execution's whose first event waits out its pause. An error when Redis could not
    /// be reached.
    async fn round(&self, tenant: &TenantId) -> Result<RoundEnd, StoreError> {
        if let Some(left) = self
            .store
            .hold_delivery(tenant, &self.holder, self.lock_ttl())
            .await?
        {
            return Ok(RoundEnd::Held(left));
        }
        let now = unix_ms();
        let dropped = self
            .store
            .trim_outbox(tenant, now, self.config.max_age)
            .await?;
        if dropped > 0 {
            self.dropped.fetch_add(dropped, Ordering::Relaxed);
            tracing::warn!(tenant = %tenant, dropped, "webhooks: events older than the age bound dropped");
        }
        let Some(hook) = self.store.webhook(tenant).await? else {
            return Ok(RoundEnd::Idle);
        };
        let batch = self.store.outbox_head(tenant, BATCH).await?;
        if batch.is_empty() {
            return Ok(RoundEnd::Idle);
        }
        // One line per execution, in outbox order; lines go at once.
        let mut lines: Vec<Vec<OutboxEntry>> = Vec::new();
        let mut line_of: HashMap<String, usize> = HashMap::new();
        for e in batch {
            let i = *line_of.entry(e.execution_id.clone()).or_insert_with(|| {
                lines.push(Vec::new());
                lines.len() - 1
            });
            lines[i].push(e);
        }
        // A line whose first event waits out its pause waits whole (order per execution);
        // the others go. Schedules of events no longer at the head of the outbox are
        // forgotten (delivered by another server, dropped or evicted).
        let now = Instant::now();
        let mut waiting_until: Option<Instant> = None;
        {
            let mut rounds = self.rounds();
            let round = rounds.entry(tenant.clone()).or_default();
            let heads: HashSet<&str> = lines.iter().map(|l| l[0].entry_id.as_str()).collect();
            round.retries.retain(|id, _| heads.contains(id.as_str()));
            lines.retain(|line| match round.retries.get(&line[0].entry_id) {
                Some(r) if r.not_before > now => {
                    waiting_until =
                        Some(waiting_until.map_or(r.not_before, |w| w.min(r.not_before)));
                    false
                }
                _ => true,
            });
        }
        if lines.is_empty() {
            return Ok(RoundEnd::Wait(waiting_until.unwrap_or(now)));
        }
        let started = Instant::now();
        let budget = self.config.timeout;
        let sends = lines.into_iter().map(|line| {
            let hook = &hook;
            async move {
                let mut done = Vec::new();
                for e in line {
                    if started.elapsed() > budget {
                        break;
                    }
                    let attempt = self
                        .rounds()
                        .get(tenant)
                        .and_then(|r| r.retries.get(&e.entry_id))
                        .map_or(1, |r| r.attempts + 1);
                    let record = self
                        .send(tenant, &hook.url, &hook.secret, &e, attempt)
                        .await;
                    let ok = record.delivered();
                    {
                        // The pause counts from the failure, so a receiver sees at least
                        // that long between two attempts of one event.
                        let mut rounds = self.rounds();
                        let retries = &mut rounds.entry(tenant.clone()).or_default().retries;
                        if ok {
                            retries.remove(&e.entry_id);
                        } else {
                            retries.insert(
                                e.entry_id.clone(),
                                Retry {
                                    attempts: attempt,
                                    not_before: Instant::now() + retry_pause(attempt),
                                },
                            );
                        }
                    }
                    done.push((e.entry_id, record));
                    if !ok {
                        break;
                    }
                }
                done
            }
        });
        let attempts: Vec<(String, DeliveryRecord)> = futures_util::future::join_all(sends)
            .await
            .into_iter()
            .flatten()
            .collect();
        let failed: HashSet<&str> = attempts
            .iter()
            .filter(|(_, r)| !r.delivered())
            .map(|(id, _)| id.as_str())
            .collect();
        // Counted as made, whether or not the record below reaches Redis.
        self.failed
            .fetch_add(failed.len() as u64, Ordering::Relaxed);
        self.delivered
            .fetch_add((attempts.len() - failed.len()) as u64, Ordering::Relaxed);
        self.store.record_deliveries(tenant, &attempts).await?;
        if failed.len() == attempts.len() {
            // Nothing went out: wait for the first event that may go again.
            let rounds = self.rounds();
            let until = rounds
                .get(tenant)
                .and_then(|r| r.retries.values().map(|r| r.not_before).min())
                .into_iter()
                .chain(waiting_until)
                .min();
            return Ok(RoundEnd::Wait(until.unwrap_or_else(Instant::now)));
        }
        // Read again, until a read finds the outbox empty: an event appended while this round
        // ran found it not empty, so it published nothing, and only this drain can see it.
        Ok(RoundEnd::More)
    }
}

/// How a round of deliveries ended.
enum RoundEnd {
    /// It sent what it read: there may be more.
    More,
    /// Nothing (more) to send.
    Idle,
    /// Another server holds the tenant for this long.
    Held(Duration),
    /// What is left waits out its pause: the first may go at this time.
    Wait(Instant),
}

/// Now, in milliseconds since the epoch (the delivery log's times and the signatures').
fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
