//! What `serve` keeps for pull workers (`/api/worker/*`, in `http::worker`): the wake-ups
//! their long polls wait on, read from Redis once per server and fanned out in memory.
//!
//! - **Doorbells.** A lease long poll waits for a shard's doorbell, the marker every script
//!   sets when the shard has work a worker can start (see `ring()` in
//!   `migrations-lua/common.lua`). [`Doorbells`] has one reader task per shard, which reads
//!   the marker only while some long poll waits on that shard (on a pooled connection,
//!   `store::BellPools`), and tells all of them at once; each then asks `start.lua` for
//!   itself. A marker that comes when nobody waits any more is set again, for the next worker
//!   (a `sluice worker` or another server). A wake-up that started nothing for anybody while
//!   the marker stays set (the work belongs to tenants no waiting pull worker serves) makes
//!   the reader pause before it reads again, [`FRUITLESS_FIRST`] doubling up to
//!   [`FRUITLESS_MAX`]: so work no pull worker may take costs a call per pause, not a loop.
//! - **Stop messages.** A cancel or force delete of a running execution publishes its id on
//!   its holder's channel (`keys::stop_channel`). [`Stops`] hears every pull worker's channel
//!   on one Pub/Sub connection (a pattern subscription) and keeps each id for its worker's
//!   next stop poll ([`STOPS_KEPT`] at most, for [`MAILBOX_IDLE`] after its last poll).
//!   Mailboxes are bounded per credential and in all ([`MailboxLimits`]): a worker id is a
//!   name its caller makes up, so one key inventing names must not grow the server's memory
//!   nor push out other credentials' mailboxes. A credential at its bound makes room by
//!   forgetting its own mailbox idle the longest; the server at its total, by forgetting the
//!   idle-longest mailbox of the credential holding the most. A mailbox with a poll waiting on
//!   it is never forgotten: one that finds no room lives only as long as its polls (those are
//!   bounded by the waiter caps). A forgotten mailbox costs its worker nothing but the
//!   shortcut: its next heartbeat answers `cancel_requested` all the same.
//!
//! - **Shares between shards.** A lease that serves tenants of several shards (the platform
//!   admin's) gives its starts to the shards in proportion to their eligible weight, by the
//!   smooth weighted round robin `sluice worker` uses (`worker::ShardShare`). [`Shares`] keeps
//!   its state per pull worker (its consumer name), so a worker leasing one run at a time gets
//!   the same shares as one leasing a hundred: each shard's weight is what its last start
//!   call for that worker answered. A shard whose weight it does not know (not asked yet, or
//!   its answer that it had nothing runnable is older than [`PROBE_AFTER`]) is asked for one
//!   start first, outside the round robin, so a shard that turns out empty moves nobody's
//!   share.
//!
//! The first two are shortcuts: a lease poll also wakes when a scheduled execution of its
//! shards falls due, and a pull worker's heartbeat answers `cancel_requested` whatever was
//! missed while a connection was down.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::store::{BellNode, BellPools, Shard, Store, StoreError, keys};
use crate::worker::ShardShare;

/// How long one doorbell read blocks on Redis: a reader whose waiters left gives its
/// connection back to the pool within this.
pub const BELL_BLOCK: Duration = Duration::from_secs(2);

/// The first pause after a wake-up that started nothing, doubled up to [`FRUITLESS_MAX`].
pub const FRUITLESS_FIRST: Duration = Duration::from_millis(25);
/// The longest pause after wake-ups that started nothing.
pub const FRUITLESS_MAX: Duration = Duration::from_millis(500);

/// Pauses after a failed doorbell read, doubling.
const FAILING_FIRST: Duration = Duration::from_millis(100);
const FAILING_MAX: Duration = Duration::from_secs(2);

/// Stop ids kept for one pull worker between its polls.
pub const STOPS_KEPT: usize = 1024;
/// A pull worker's stop ids are kept this long after its last stop poll.
pub const MAILBOX_IDLE: Duration = Duration::from_secs(60);

/// How long a shard's answer that it has nothing runnable for a pull worker is believed: a
/// lease kept busy by other shards asks it again after this, so work that came meanwhile waits
/// at most this long for its share (a lease that has slots left asks it at once).
pub const PROBE_AFTER: Duration = Duration::from_millis(500);
/// Most pull workers whose shares between shards one server keeps; beyond it the one idle
/// longest is forgotten (it starts over, from equal credit, on its next lease). Only leases
/// that serve several shards keep one: the platform admin's, never a `worker` key's.
pub const SHARES_KEPT: usize = 4096;

/// How many pull workers' mailboxes one server keeps (`--pull-mailboxes-per-credential`,
/// `--pull-mailboxes`; see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MailboxLimits {
    /// Most mailboxes of one credential (a worker key, or the platform admin).
    pub per_credential: usize,
    /// Most mailboxes of the whole server.
    pub total: usize,
}

/// What `serve` keeps for the pull API: the wake-ups, the stop mailboxes, each pull worker's
/// share between shards, and the retry policy it applies to pull workers' failed runs
/// (`--retry-backoff-ms`, `--retry-backoff-max-ms`).
pub struct Pull {
    pub doorbells: Arc<Doorbells>,
    pub stops: Arc<Stops>,
    pub shares: Shares,
    pub retry_backoff: Duration,
    pub retry_backoff_max: Duration,
    /// How often this server looks for expired leases in each shard (`--orphan-scan-ms`);
    /// `None`: never.
    pub orphan_scan: Option<Duration>,
}

impl Pull {
    /// The backoff before the attempt after `attempt` failed: `retry_backoff` doubling per
    /// attempt, capped (as `sluice worker` computes it).
    pub fn backoff(&self, attempt: u32) -> Duration {
        crate::worker::retry_backoff(self.retry_backoff, self.retry_backoff_max, attempt)
    }

    /// Runs the doorbell readers, the stop listener and the orphan scans until `stop`.
    pub async fn run(self: Arc<Self>, store: Arc<Store>, stop: CancellationToken) {
        let mut tasks = tokio::task::JoinSet::new();
        tasks.spawn(self.doorbells.clone().run(stop.clone()));
        tasks.spawn(self.stops.clone().run(stop.clone()));
        if let Some(every) = self.orphan_scan {
            for shard in store.shards().all() {
                tasks.spawn(scan_orphans(store.clone(), shard, every, stop.clone()));
            }
        }
        while tasks.join_next().await.is_some() {}
    }
}

/// Recovers a shard's runs whose lease expired, every `every`: a pull worker that died (or
/// any worker) is noticed here even when no `sluice worker` runs. Idempotent, so several
/// servers (and workers) may scan the same shard.
async fn scan_orphans(store: Arc<Store>, shard: Shard, every: Duration, stop: CancellationToken) {
    const BATCH: usize = 100;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = stop.cancelled() => return,
        }
        // Bounded: at most 100 batches per tick.
        for _ in 0..100 {
            match store.reclaim(shard, BATCH).await {
                Ok(r) => {
                    if r.requeued + r.dead_lettered > 0 {
                        tracing::info!(
                            shard = shard.number(),
                            requeued = r.requeued,
                            dead = r.dead_lettered,
                            "orphans recovered"
                        );
                    }
                    if ((r.requeued + r.dead_lettered) as usize) < BATCH {
                        break;
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, shard = shard.number(), "orphan scan failed");
                    break;
                }
            }
        }
    }
}

/// One shard's doorbell as the server's long polls see it.
struct Bell {
    /// Counts the wake-ups handed to the waiters.
    rung: watch::Sender<u64>,
    /// Long polls waiting on this shard now.
    waiting: AtomicUsize,
    /// Told when the first waiter arrives (the reader reads only while somebody waits).
    arrived: Notify,
    /// Counts the long polls' start calls that started something (see the module docs).
    fruitful: AtomicU64,
}

/// The doorbell readers of every shard (see the module docs).
pub struct Doorbells {
    store: Arc<Store>,
    pools: BellPools,
    bells: HashMap<Shard, Arc<Bell>>,
    /// Long polls listening now.
    polls: Arc<AtomicUsize>,
}

impl Doorbells {
    /// Readers for every shard of `store`, on pools of at most one connection per shard and
    /// node. Nothing is read until [`Doorbells::run`] runs and a long poll waits.
    pub fn new(store: Arc<Store>) -> Arc<Self> {
        let shards: Vec<Shard> = store.shards().all().collect();
        let bells = shards
            .iter()
            .map(|s| {
                let bell = Bell {
                    rung: watch::channel(0).0,
                    waiting: AtomicUsize::new(0),
                    arrived: Notify::new(),
                    fruitful: AtomicU64::new(0),
                };
                (*s, Arc::new(bell))
            })
            .collect();
        Arc::new(Self {
            store,
            pools: BellPools::new(shards.len(), BELL_BLOCK),
            bells,
            polls: Arc::default(),
        })
    }

    /// Runs a reader per shard until `stop` is cancelled.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        let mut readers = tokio::task::JoinSet::new();
        for (shard, bell) in &self.bells {
            readers.spawn(self.clone().read(*shard, bell.clone(), stop.clone()));
        }
        while readers.join_next().await.is_some() {}
    }

    /// Long polls listening now (for tests).
    pub fn waiting(&self) -> usize {
        self.polls.load(Ordering::SeqCst)
    }

    /// Blocking connections the readers hold now, idle or in use.
    pub fn connections(&self) -> usize {
        self.pools.connections()
    }

    /// Starts listening to the doorbells of `shards`: wake-ups from now on are seen by
    /// [`Listening::rung`]. Call it before looking for work, so none falls in between.
    pub fn listen(&self, shards: &[Shard]) -> Listening {
        let bells = shards
            .iter()
            .filter_map(|s| self.bells.get(s).map(|b| (*s, b.clone())))
            .map(|(s, b)| {
                b.waiting.fetch_add(1, Ordering::SeqCst);
                b.arrived.notify_one();
                let rx = b.rung.subscribe();
                let seen = *rx.borrow();
                (s, b, rx, seen)
            })
            .collect();
        self.polls.fetch_add(1, Ordering::SeqCst);
        Listening {
            bells,
            polls: self.polls.clone(),
        }
    }

    /// One shard's reader.
    async fn read(self: Arc<Self>, shard: Shard, bell: Arc<Bell>, stop: CancellationToken) {
        let mut node: Option<BellNode> = None;
        let mut failing = Duration::ZERO;
        let mut fruitless = Duration::ZERO;
        // `fruitful` when the last wake-up was handed out (`None` after a fruitless one).
        let mut handed: Option<u64> = None;
        loop {
            // Read only while somebody waits.
            loop {
                let arrived = bell.arrived.notified();
                tokio::pin!(arrived);
                arrived.as_mut().enable();
                if bell.waiting.load(Ordering::SeqCst) > 0 {
                    break;
                }
                tokio::select! {
                    () = arrived => {}
                    () = stop.cancelled() => return,
                }
            }
            let pause = failing.max(fruitless);
            if !pause.is_zero() {
                tokio::select! {
                    () = tokio::time::sleep(pause) => {}
                    () = stop.cancelled() => return,
                }
            }
            let at = match &node {
                Some(n) => n.clone(),
                None => match self.store.bell_node(shard).await {
                    Ok(n) => node.insert(n).clone(),
                    Err(e) => {
                        failing = next_pause(failing, FAILING_FIRST, FAILING_MAX);
                        tracing::debug!(error = %e, shard = shard.number(), "pull: cannot find the doorbell's node");
                        continue;
                    }
                },
            };
            let rang = tokio::select! {
                rang = self.store.wait_bell_pooled(&self.pools, &at, shard) => rang,
                () = stop.cancelled() => return,
            };
            match rang {
                Ok(false) => failing = Duration::ZERO,
                Ok(true) => {
                    failing = Duration::ZERO;
                    let fruitful = bell.fruitful.load(Ordering::SeqCst);
                    if handed == Some(fruitful) {
                        // The last wake-up started nothing, and the marker is set again:
                        // what is there is not for these waiters. Back for the others, and
                        // a pause before the next read.
                        fruitless = next_pause(fruitless, FRUITLESS_FIRST, FRUITLESS_MAX);
                        handed = None;
                        self.give_back(shard).await;
                        continue;
                    }
                    if handed.is_some() {
                        // Something started since the last wake-up was handed out.
                        fruitless = Duration::ZERO;
                    }
                    if bell.waiting.load(Ordering::SeqCst) == 0 {
                        self.give_back(shard).await;
                        continue;
                    }
                    handed = Some(fruitful);
                    bell.rung.send_modify(|n| *n += 1);
                }
                Err(e) => {
                    // Another node may hold the shard now (a failover, a slot move).
                    node = None;
                    failing = next_pause(failing, FAILING_FIRST, FAILING_MAX);
                    tracing::debug!(error = %e, shard = shard.number(), "pull: doorbell read failed");
                }
            }
        }
    }

    /// Sets a shard's doorbell again for a wake-up no waiter here takes.
    async fn give_back(&self, shard: Shard) {
        if let Err(e) = self.store.ring(shard).await {
            tracing::debug!(error = %e, shard = shard.number(), "pull: cannot set the doorbell again");
        }
    }
}

fn next_pause(now: Duration, first: Duration, most: Duration) -> Duration {
    (now * 2).clamp(first, most)
}

/// A long poll's hold on some shards' doorbells; dropping it stops listening.
pub struct Listening {
    /// Each shard's bell, its wake-ups, and the count of them this poll has seen.
    bells: Vec<(Shard, Arc<Bell>, watch::Receiver<u64>, u64)>,
    polls: Arc<AtomicUsize>,
}

impl Listening {
    /// Waits for a wake-up of any of its shards; the shards that rang since the last call.
    /// Never returns when there are no shards.
    pub async fn rung(&mut self) -> Vec<Shard> {
        loop {
            let mut ready = Vec::new();
            for (s, _, rx, seen) in &mut self.bells {
                let now = *rx.borrow();
                if now != *seen {
                    *seen = now;
                    ready.push(*s);
                }
            }
            if !ready.is_empty() {
                return ready;
            }
            if self.bells.is_empty() {
                std::future::pending::<()>().await;
            }
            // Compared by value above: `changed()` resolving is only the cue to look.
            let changes = self
                .bells
                .iter_mut()
                .map(|(_, _, rx, _)| Box::pin(rx.changed()));
            let _ = futures_util::future::select_all(changes).await;
        }
    }

    /// A start call in `shard` started something: the wake-up was of use (see the module
    /// docs).
    pub fn started(&self, shard: Shard) {
        if let Some((_, b, _, _)) = self.bells.iter().find(|(s, _, _, _)| *s == shard) {
            b.fruitful.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Drop for Listening {
    fn drop(&mut self) {
        for (_, b, _, _) in &self.bells {
            b.waiting.fetch_sub(1, Ordering::SeqCst);
        }
        self.polls.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The stop ids waiting for one pull worker.
struct Mailbox {
    ids: VecDeque<String>,
    /// Polls waiting on it now.
    polls: usize,
    /// When the last poll left (kept [`MAILBOX_IDLE`] after).
    left: Instant,
    news: Arc<Notify>,
    /// The credential that polled it last: whose bound it counts in.
    owner: Arc<str>,
    /// Found no room: forgotten as soon as its last poll leaves.
    transient: bool,
}

/// The mailboxes, with what the bounds need: each credential's count and its idle mailboxes
/// by when their last poll left (oldest first).
#[derive(Default)]
struct Mail {
    boxes: HashMap<String, Mailbox>,
    owned: HashMap<Arc<str>, usize>,
    idle: HashMap<Arc<str>, BTreeSet<(Instant, String)>>,
}

impl Mail {
    /// Takes `consumer`'s mailbox off its owner's idle list (a poll arrived).
    fn busy(&mut self, consumer: &str) {
        if let Some(m) = self.boxes.get(consumer)
            && m.polls == 0
            && let Some(idle) = self.idle.get_mut(&m.owner)
        {
            idle.remove(&(m.left, consumer.to_owned()));
            if idle.is_empty() {
                self.idle.remove(&m.owner);
            }
        }
    }

    /// Forgets one mailbox.
    fn forget(&mut self, consumer: &str) {
        self.busy(consumer);
        if let Some(m) = self.boxes.remove(consumer)
            && let Some(n) = self.owned.get_mut(&m.owner)
        {
            *n -= 1;
            if *n == 0 {
                self.owned.remove(&m.owner);
            }
        }
    }

    /// Forgets `owner`'s mailbox idle the longest; whether it had one.
    fn forget_oldest_of(&mut self, owner: &str) -> bool {
        let oldest = self
            .idle
            .get(owner)
            .and_then(|idle| idle.first().map(|(_, c)| c.clone()));
        match oldest {
            Some(consumer) => {
                self.forget(&consumer);
                true
            }
            None => false,
        }
    }

    /// Makes room for a new mailbox of `owner` under `limits`; whether there is room.
    fn make_room(&mut self, owner: &str, limits: MailboxLimits) -> bool {
        if self.owned.get(owner).copied().unwrap_or(0) >= limits.per_credential
            && !self.forget_oldest_of(owner)
        {
            return false;
        }
        if self.boxes.len() >= limits.total {
            // The credential holding the most with an idle mailbox gives one up (of two
            // holding as many, the one idle the longest).
            let most = self
                .idle
                .iter()
                .filter_map(|(o, idle)| Some((o, idle.first()?.0)))
                .max_by_key(|(o, oldest)| {
                    (
                        self.owned.get(*o).copied().unwrap_or(0),
                        std::cmp::Reverse(*oldest),
                    )
                })
                .map(|(o, _)| o.clone());
            return most.is_some_and(|o| self.forget_oldest_of(&o));
        }
        true
    }
}

/// The stop messages of every pull worker (see the module docs).
pub struct Stops {
    store: Arc<Store>,
    mail: Mutex<Mail>,
    limits: MailboxLimits,
    /// Whether the pattern subscription is confirmed on a live connection.
    up: std::sync::atomic::AtomicBool,
}

impl Stops {
    pub fn new(store: Arc<Store>, limits: MailboxLimits) -> Arc<Self> {
        Arc::new(Self {
            store,
            mail: Mutex::default(),
            limits,
            up: std::sync::atomic::AtomicBool::new(false),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Mail> {
        self.mail.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts keeping the stop ids of `consumer` for `owner`, the credential polling (if not
    /// kept already), and takes what is kept; with nothing kept, waits until `deadline` for
    /// some.
    pub async fn next(&self, consumer: &str, owner: &str, deadline: Instant) -> Vec<String> {
        let news = {
            let mut mail = self.lock();
            if mail.boxes.contains_key(consumer) {
                mail.busy(consumer);
                let m = mail.boxes.get_mut(consumer).expect("just seen");
                let moved =
                    (*m.owner != *owner).then(|| std::mem::replace(&mut m.owner, Arc::from(owner)));
                m.polls += 1;
                let news = m.news.clone();
                if let Some(before) = moved {
                    if let Some(n) = mail.owned.get_mut(&before) {
                        *n -= 1;
                        if *n == 0 {
                            mail.owned.remove(&before);
                        }
                    }
                    *mail.owned.entry(Arc::from(owner)).or_insert(0) += 1;
                }
                news
            } else {
                let transient = !mail.make_room(owner, self.limits);
                let owner: Arc<str> = Arc::from(owner);
                *mail.owned.entry(owner.clone()).or_insert(0) += 1;
                let news = Arc::new(Notify::new());
                mail.boxes.insert(
                    consumer.to_owned(),
                    Mailbox {
                        ids: VecDeque::new(),
                        polls: 1,
                        left: Instant::now(),
                        news: news.clone(),
                        owner,
                        transient,
                    },
                );
                news
            }
        };
        let _leave = Leave(self, consumer);
        loop {
            let notified = news.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let taken: Vec<String> = self
                .lock()
                .boxes
                .get_mut(consumer)
                .map(|m| m.ids.drain(..).collect())
                .unwrap_or_default();
            if !taken.is_empty() {
                return taken;
            }
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep_until(deadline) => return Vec::new(),
            }
        }
    }

    /// A stop message for `consumer`: kept for its polls, if it has polled lately.
    fn deliver(&self, consumer: &str, id: String) {
        let mut mail = self.lock();
        if let Some(m) = mail.boxes.get_mut(consumer) {
            if !m.ids.contains(&id) {
                if m.ids.len() >= STOPS_KEPT {
                    m.ids.pop_front();
                }
                m.ids.push_back(id);
            }
            m.news.notify_waiters();
        }
    }

    /// Forgets the mailboxes of workers that stopped polling.
    fn prune(&self) {
        let mut mail = self.lock();
        let stale: Vec<String> = mail
            .boxes
            .iter()
            .filter(|(_, m)| m.polls == 0 && m.left.elapsed() >= MAILBOX_IDLE)
            .map(|(c, _)| c.clone())
            .collect();
        for consumer in stale {
            mail.forget(&consumer);
        }
    }

    /// Whether stop messages are heard now (for tests and health).
    pub fn listening(&self) -> bool {
        self.up.load(Ordering::SeqCst)
    }

    /// Workers whose stops are kept now (for tests).
    pub fn kept(&self) -> HashSet<String> {
        self.lock().boxes.keys().cloned().collect()
    }

    /// Listens on one Pub/Sub connection (reconnecting after a pause when it breaks) until
    /// `stop` is cancelled.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        let mut pause = FAILING_FIRST;
        for attempt in 0.. {
            let began = Instant::now();
            let ended = tokio::select! {
                () = stop.cancelled() => return,
                ended = self.listen_once(attempt) => ended,
            };
            self.up.store(false, Ordering::SeqCst);
            if let Err(e) = ended {
                tracing::debug!(error = %e, "pull: stop listener failed");
            }
            if began.elapsed() > Duration::from_secs(5) {
                pause = FAILING_FIRST;
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(pause) => {}
            }
            pause = next_pause(pause, FAILING_FIRST, FAILING_MAX);
        }
    }

    async fn listen_once(&self, attempt: usize) -> Result<(), StoreError> {
        let url = self.store.pubsub_node(attempt)?;
        let (pattern, prefix) = keys::pull_stop_pattern();
        let client = redis::Client::open(url.as_str())?;
        let mut pubsub = tokio::time::timeout(self.store.config().op_timeout, async {
            let mut p = client.get_async_pubsub().await?;
            p.psubscribe(&pattern).await?;
            Ok::<_, redis::RedisError>(p)
        })
        .await
        .map_err(|_| StoreError::Unavailable("stop listener: no answer".into()))??;
        self.up.store(true, Ordering::SeqCst);
        let mut messages = pubsub.on_message();
        let mut prune = tokio::time::interval(MAILBOX_IDLE / 4);
        loop {
            tokio::select! {
                msg = messages.next() => {
                    let Some(msg) = msg else {
                        return Err(StoreError::Unavailable("stop listener closed".into()));
                    };
                    let channel = msg.get_channel_name();
                    if let (Some(consumer), Ok(id)) =
                        (channel.strip_prefix(&prefix), msg.get_payload::<String>())
                    {
                        self.deliver(consumer, id);
                    }
                }
                _ = prune.tick() => self.prune(),
            }
        }
    }
}

/// Each pull worker's share between shards (see the module docs): per consumer name, the
/// round robin's credits and what each shard's last start call answered.
#[derive(Default)]
pub struct Shares {
    workers: Mutex<HashMap<String, WorkerShare>>,
}

/// One pull worker's share between shards.
struct WorkerShare {
    share: ShardShare,
    /// Each shard's eligible weight (of the tenants this worker serves there) as its last
    /// start call answered, and when.
    weights: HashMap<Shard, (u64, Instant)>,
    /// When a start call of this worker last answered: the one idle longest is forgotten
    /// first.
    used: Instant,
}

/// The starts a lease asks for in one round: how many of each shard, in the order to ask.
#[derive(Debug)]
pub struct Round {
    pub asks: Vec<(Shard, usize)>,
    /// The candidates the picks were made among (for taking back the unserved ones).
    candidates: Vec<(Shard, i64)>,
}

impl Round {
    /// All `n` starts from the one shard a lease serves: nothing to share, nothing kept.
    pub fn alone(shard: Shard, n: usize) -> Self {
        Self {
            asks: if n == 0 { Vec::new() } else { vec![(shard, n)] },
            candidates: Vec::new(),
        }
    }
}

impl Shares {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, WorkerShare>> {
        self.workers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The shards of `shards` whose eligible weight the pull worker `consumer` does not know:
    /// never asked, or whose answer that it had nothing runnable is older than
    /// [`PROBE_AFTER`]. A lease asks each for one start before it shares the rest.
    pub fn unknown(&self, consumer: &str, shards: &[Shard]) -> Vec<Shard> {
        let now = Instant::now();
        let workers = self.lock();
        let known = workers.get(consumer).map(|w| &w.weights);
        shards
            .iter()
            .copied()
            .filter(|s| match known.and_then(|k| k.get(s)) {
                None => true,
                Some((0, at)) => now.duration_since(*at) >= PROBE_AFTER,
                Some(_) => false,
            })
            .collect()
    }

    /// Shares `n` starts between those of `shards` that the pull worker `consumer` knows to
    /// have runnable work, in proportion to their eligible weight. Empty when none does. A
    /// lease that serves one shard needs no share: it asks that shard and keeps nothing here
    /// (`Round::alone`).
    pub fn plan(&self, consumer: &str, shards: &[Shard], n: usize) -> Round {
        let mut workers = self.lock();
        let Some(worker) = workers.get_mut(consumer).filter(|_| n > 0) else {
            return Round {
                asks: Vec::new(),
                candidates: Vec::new(),
            };
        };
        let candidates: Vec<(Shard, i64)> = shards
            .iter()
            .filter_map(|s| {
                let (w, _) = worker.weights.get(s)?;
                Some((*s, i64::try_from(*w).unwrap_or(i64::MAX / 4)))
            })
            .filter(|(_, w)| *w > 0)
            .collect();
        let mut asks: Vec<(Shard, usize)> = Vec::new();
        for _ in 0..n {
            let Some(picked) = worker.share.pick(&candidates) else {
                break;
            };
            match asks.iter_mut().find(|(s, _)| *s == picked) {
                Some((_, count)) => *count += 1,
                None => asks.push((picked, 1)),
            }
        }
        Round { asks, candidates }
    }

    /// What a start call of `round` in `shard` did for `consumer`: it started `started` of the
    /// `asked`, and its shard's eligible weight is now `weight` (`None`: the call failed, and
    /// nothing is learned). The picks it did not serve are taken back.
    pub fn learn(
        &self,
        consumer: &str,
        round: &Round,
        shard: Shard,
        asked: usize,
        started: usize,
        weight: Option<u64>,
    ) {
        if round.candidates.is_empty() {
            // `Round::alone`: nothing was shared.
            return;
        }
        let mut workers = self.lock();
        let Some(worker) = workers.get_mut(consumer) else {
            return;
        };
        for _ in started..asked {
            worker.share.unpick(&round.candidates, shard);
        }
        if let Some(w) = weight {
            worker.weights.insert(shard, (w, Instant::now()));
        }
    }

    /// A start call outside the round robin (a shard's first, or slots left over) answered
    /// `weight` for `shard`.
    pub fn heard(&self, consumer: &str, shard: Shard, weight: u64) {
        let now = Instant::now();
        let mut workers = self.lock();
        if !workers.contains_key(consumer) && workers.len() >= SHARES_KEPT {
            // Bounded: the worker idle longest makes room (one pass over at most SHARES_KEPT).
            if let Some(oldest) = workers
                .iter()
                .min_by_key(|(_, w)| w.used)
                .map(|(k, _)| k.clone())
            {
                workers.remove(&oldest);
            }
        }
        let worker = workers
            .entry(consumer.to_owned())
            .or_insert_with(|| WorkerShare {
                share: ShardShare::default(),
                weights: HashMap::new(),
                used: now,
            });
        worker.used = now;
        worker.weights.insert(shard, (weight, now));
    }

    /// How many pull workers' shares are kept now.
    pub fn kept(&self) -> usize {
        self.lock().len()
    }
}

/// Leaves a mailbox when a stop poll ends.
struct Leave<'a>(&'a Stops, &'a str);

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        let mut mail = self.0.lock();
        let Some(m) = mail.boxes.get_mut(self.1) else {
            return;
        };
        m.polls -= 1;
        if m.polls > 0 {
            return;
        }
        if m.transient {
            mail.forget(self.1);
            return;
        }
        m.left = Instant::now();
        let (left, owner) = (m.left, m.owner.clone());
        mail.idle
            .entry(owner)
            .or_default()
            .insert((left, self.1.to_owned()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Layout, ShardMap};

    /// However many worker ids lease, a server keeps the shares of at most `SHARES_KEPT`, and
    /// the one idle longest makes room.
    #[test]
    fn shares_are_kept_for_a_bounded_number_of_workers() {
        let shards = ShardMap::new(16, Layout::SlotAligned);
        let shares = Shares::default();
        for i in 0..SHARES_KEPT + 100 {
            shares.heard(&format!("pull/*/w{i}"), shards.shard(0), 1);
        }
        assert_eq!(shares.kept(), SHARES_KEPT);
        let known = |i: usize| {
            shares
                .unknown(&format!("pull/*/w{i}"), &[shards.shard(0)])
                .is_empty()
        };
        assert!(!known(0), "the first worker was forgotten");
        assert!(known(SHARES_KEPT + 99), "the last worker is kept");
    }

    /// A shard that answered it had nothing is left out of the round robin, and asked again
    /// (counted unknown) once its answer is `PROBE_AFTER` old.
    #[test]
    fn an_empty_shard_is_asked_again_once_its_answer_is_old() {
        let shards = ShardMap::new(16, Layout::SlotAligned);
        let (a, b) = (shards.shard(0), shards.shard(1));
        let shares = Shares::default();
        shares.heard("w", a, 3);
        shares.heard("w", b, 0);
        assert!(shares.unknown("w", &[a, b]).is_empty());
        assert_eq!(shares.plan("w", &[a, b], 4).asks, vec![(a, 4)]);
        // Its answer, as if given PROBE_AFTER ago.
        let then = Instant::now()
            .checked_sub(PROBE_AFTER)
            .expect("a clock past 0.5 s");
        shares
            .lock()
            .get_mut("w")
            .unwrap()
            .weights
            .insert(b, (0, then));
        assert_eq!(shares.unknown("w", &[a, b]), vec![b]);
        // A shard with work is never unknown, however old its answer.
        shares
            .lock()
            .get_mut("w")
            .unwrap()
            .weights
            .insert(a, (3, then));
        assert_eq!(shares.unknown("w", &[a, b]), vec![b]);
    }
}
