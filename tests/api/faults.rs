//! Fault injection ("chaos"): a real `redis-server` (AOF, `appendfsync always`), a real
//! `sluice serve` and real `sluice worker` processes are SIGSTOPped and SIGKILLed at random
//! while client tasks admit, cancel, retry and change limits; then everything is healed, the
//! system is left to finish its work, and a checker in the spirit of Jepsen's queue checker
//! compares what the clients were told and what the workers journaled with what Redis holds.
//!
//! ```sh
//! cargo test --test api faults -- --nocapture          # 45 s of faults, about a minute in all
//! SLUICE_FAULT_SECS=600 SLUICE_FAULT_SEED=7 cargo test --test api faults -- --nocapture
//! ```
//!
//! The seed (`SLUICE_FAULT_SEED`, printed in the report) drives every random choice: the
//! faults (which, when, how long) and the clients' requests. Some choices also follow what the
//! system did (a cancel picks among admitted executions, a paused worker is preferably one in
//! the middle of a run), and the operating system's interleaving is not seeded, so a seed that
//! found a bug usually finds it again, though not always in the same way.
//!
//! # What runs
//!
//! - `redis-server` on a free loopback port, AOF with `appendfsync always`: a SIGKILL loses no
//!   acknowledged write, so after a restart on the same port everything admitted is back.
//! - One `sluice serve` (Redis timeout 500 ms, request timeout 5 s, sweeper every 2 s).
//! - Three `sluice worker --demo-flows` (lease 1.5 s, heartbeat 300 ms, scan 300 ms) running
//!   the built-in `demo.journal` flow, which appends a `start` and an `end` line per run to one
//!   shared journal file (`SLUICE_JOURNAL`), with the run's fence, attempt, pid, wall-clock
//!   times and, at the end, the instant until which the worker could prove it held the lease.
//! - Three tenants with `max_concurrent` 1–3 and `max_queued` 12 (also the server default, so
//!   the queues, and the time to drain them, stay bounded).
//! - Client tasks admitting `demo.journal` executions: most sleep 50–400 ms, 15 % sleep 1–4 s
//!   (longer than the lease: they live on heartbeats, and a paused worker can wake up mid-run);
//!   some fail their first one or two attempts. Half carry an `Idempotency-Key` and are retried
//!   with the same key and body after a transport error or a 5xx; the others are never retried.
//!   The clients also cancel executions (often one whose run the journal shows about to end,
//!   so completion and cancel race), retry failed or cancelled ones (often one that ran, so its
//!   next run needs a fence it never had) and change tenants' `max_concurrent`.
//!   Every request and its answer is recorded with its send and answer times.
//! - Two fault lanes (one for the workers, one for `serve` and Redis), each one fault at a time:
//!   SIGSTOP for 0.2–4 s (often longer than the lease) then SIGCONT, or SIGKILL and a restart.
//!   Often the paused worker is one in the middle of a long run, paused past its lease but
//!   not past the run, so it wakes up as a zombie whose run another worker has taken over.
//!   Processes that exit on their own (a worker started while Redis was down) are restarted and
//!   listed in the report.
//!
//! Then every process is continued, the clients stop, every tenant's limit is raised to 3 (to
//! drain the backlog sooner), and the suite waits (at most 30 s) until no tenant has anything
//! running or queued.
//!
//! # What is asserted
//!
//! A run's *effective interval* is `[start.t, min(end.t, end.lease_deadline))`: the worker stops
//! a handler as soon as it cannot prove it holds the lease, and whatever the handler did after
//! its lease deadline cannot be accepted (a newer run may exist). A run with no `end` line
//! belongs to a worker that was SIGKILLed (or exited): it ends when that worker was known dead,
//! or one lease TTL after its start if that is earlier. Times are wall-clock milliseconds of
//! one machine, so the journal, the clients and the fault log share a clock.
//!
//! 1. **Acknowledged admissions are kept.** Every execution named by a 2xx admission exists at
//!    the end, is listed exactly once, and is `completed`, `failed` or `cancelled`. All 2xx
//!    answers for one `Idempotency-Key` name the same execution.
//! 2. **Nothing unacknowledged appears.** Executions are matched to requests by
//!    `params.nonce` (unique per logical request; a keyed request's retries share it). A
//!    request that got 2xx left exactly that execution; a 4xx, 429 or a 5xx other than
//!    `admission_outcome_unknown` left nothing; `admission_outcome_unknown` left at most the
//!    execution it named; each try that got no answer at all may have left one (a keyed request
//!    at most one in all). Every execution on Redis (listed through the API, and rows found by
//!    scanning Redis that the listing missed) belongs to some request.
//! 3. **No two runs at once, and the accepted one is the last.** Fences of one execution never
//!    repeat in the journal (also across `POST .../retry`). No two runs of one execution have
//!    overlapping effective intervals (zombie runs of a paused worker may overlap in wall time,
//!    but not past their lease deadline). A completed execution's output carries the highest
//!    fence journaled for it, that run's attempt and the request's nonce, and that run ended
//!    `ok`. And the lease deadlines are honest: a run ends at most 1 s after its lease deadline
//!    unless its worker was SIGSTOPped across that deadline (then at most 1 s after SIGCONT).
//! 4. **Cancels stick.** An execution whose cancel was answered with `cancel_requested: true` or
//!    status `cancelled` (and not with `completed`/`failed`: a cancel of a finished execution
//!    changes nothing) ends `cancelled` — unless a retry of it that may have been applied (2xx,
//!    5xx or no answer) was answered after the cancel was sent.
//! 5. **Quotas hold for handlers.** Per tenant, at every run start, the number of executions
//!    with a run in its effective interval is at most the highest `max_concurrent` that may
//!    have been in force since the latest of their admission requests was sent (its first try).
//!    Why that bound: each of them holds a slot; the last slot granted was granted when the
//!    others already held theirs, so under the limit of that moment; and that moment is after
//!    every one of them was requested.
//!    Lowering a limit stops nothing, which this allows. A limit change may be in force from
//!    when it was sent until a later change, sent after the first was answered, has been
//!    acknowledged; a change whose answer was lost (5xx, no answer) is taken to apply within
//!    10 s of that answer or never (the longest pause is 4 s).
//! 6. **Usage returns to zero**: `{running: 0, waiting: 0, scheduled: 0}` for every tenant, and
//!    nothing listed as `queued` or `running`.
//! 7. **Attempts stay in bounds**: no final execution shows `attempt > max_attempts`.
//! 8. **Never started before due.** An execution admitted with a `delay` (a quarter of them,
//!    100–1500 ms; 40 % also carry a priority 1–5) has no run in the journal that started
//!    before its admission's Redis time plus the delay (unless a retry of it was requested:
//!    that makes it runnable at once).
//! 9. **Fair share by weight.** The tenants have weights 1, 2 and 5. In every shard's start
//!    log the virtual start tags never go down, and each tenant's own tags advance by at least
//!    1000 / weight per start: start-time fair queueing, whose bound (two backlogged tenants'
//!    starts divided by their weights differ by at most one start of each) follows from both.
//! 10. **Concurrency key limits hold for handlers.** 60 % of the admissions carry one of three
//!     concurrency keys, and every tenant has `max_concurrent_per_key` 1 (never changed): per
//!     tenant and key, at every run start, at most one execution of the key has a run in its
//!     effective interval.
//! 11. **No position for what is not waiting.** No execution a client was shown (any answer,
//!     and the final listing) carries a `queue_position` or `estimated_start` unless it is
//!     queued and due.
//! 12. **Rates hold.** Tenant `chaos-c` has a rate limit of 4 starts per second with a burst
//!     of 2: on Redis's clock (its shard's start log), no second holds more than 6 of its
//!     starts — re-runs after lost leases and retries included, since every start takes a
//!     token.
//!
//! The report also counts admissions by answer, faults by kind, runs (by how they ended, and
//! how many lost their lease before ending), executions by final status, dead letters by reason,
//! shard counters (`fenced`, `reclaimed`, ...) and the highest concurrency seen per tenant.
//! Every violation is listed (up to 25 examples per property) in one assertion message. On
//! failure the processes' logs and the journal are kept, and their folder is printed.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use reqwest::Method;
use serde_json::{Value, json};
use sluice::redis_server::{self, Persistence};
use tokio::sync::Mutex as AsyncMutex;
use tokio_util::sync::CancellationToken;

use crate::helpers::{ADMIN_TOKEN, free_port, sluice_bin};

/// The flow every client admits (built into `sluice worker --demo-flows`).
const FLOW: &str = "demo.journal";
const TENANTS: [&str; 3] = ["chaos-a", "chaos-b", "chaos-c"];
const WORKERS: usize = 3;
const CLIENTS: usize = 4;
const LEASE_TTL_MS: u64 = 1_500;
/// `max_queued` of every tenant and the server default: bounds the backlog left to drain.
const MAX_QUEUED: u64 = 12;
/// `--default-max-concurrent` of `serve` (overridden per tenant before any admission).
const DEFAULT_MAX_CONCURRENT: u64 = 2;
/// `max_concurrent_per_key` of every tenant (property 10).
const KEY_LIMIT: u64 = 1;
/// The tenant with a rate limit (property 12): starts, per (ms), burst.
const RATE_LIMITED: (&str, u64, u64, u64) = ("chaos-c", 4, 1_000, 2);
/// The longest SIGSTOP the fault lanes inflict.
const MAX_PAUSE_MS: u64 = 4_000;
/// How long after its (lost) answer a request may still take effect (see property 5).
const LATE_EFFECT_MS: u64 = 10_000;
/// Bound on waiting for the system to finish its work after the faults.
const QUIESCE_LIMIT: Duration = Duration::from_secs(30);
/// Scheduling slack allowed to a worker between its lease deadline (or its SIGCONT) and the
/// end of a handler it must stop: generous, for two cores shared by every process of the test.
const STOP_SLACK_MS: u64 = 1_000;
/// Examples listed per violated property.
const EXAMPLES: usize = 25;

/// Wall-clock milliseconds since the epoch (the journal's clock).
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64
}

// ---------------------------------------------------------------------------------------------
// Settings and randomness

/// What the environment asks for.
struct Settings {
    seed: u64,
    chaos: Duration,
}

impl Settings {
    fn from_env() -> Self {
        let num = |var: &str, default: u64| match std::env::var(var) {
            Ok(v) => v
                .trim()
                .parse()
                .unwrap_or_else(|_| panic!("{var}={v:?} is not a number")),
            Err(_) => default,
        };
        Self {
            seed: num("SLUICE_FAULT_SEED", 42),
            chaos: Duration::from_secs(num("SLUICE_FAULT_SECS", 45)),
        }
    }
}

/// SplitMix64: tiny, fast and good enough to pick faults and requests; no crate needed.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// Uniform in `lo..=hi`.
    fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    fn percent(&mut self, p: u64) -> bool {
        self.below(100) < p
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }

    /// An independent stream for another task, so tasks do not share a generator.
    fn fork(&mut self) -> Rng {
        Rng::new(self.next())
    }
}

// ---------------------------------------------------------------------------------------------
// Processes

/// A child process of the suite. Dropping it continues and kills it, so a failing test leaves
/// nothing running (and nothing stopped).
struct Proc {
    name: String,
    child: Child,
    log: PathBuf,
    /// When it was started (wall ms): an exit soon after means it gave up starting.
    started: u64,
}

impl Proc {
    fn spawn(name: String, cmd: &mut Command, log: &Path) -> Proc {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("log file");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log file"))
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        Proc {
            name,
            child,
            log: log.to_owned(),
            started: now_ms(),
        }
    }

    /// What it exited unasked with: its age and the last line of its log.
    fn exit_note(&self, now: u64) -> Exit {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        Exit {
            name: self.name.clone(),
            pid: self.pid(),
            at: now,
            ran_ms: now - self.started,
            last_words: text.lines().last().unwrap_or_default().to_owned(),
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGKILL and reap: dead when this returns.
    fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if !self.exited() {
            signal(self.pid(), "CONT");
            self.kill9();
        }
    }
}

/// Sends a signal by name (`STOP`, `CONT`, `KILL`) to a process.
fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// A process that exited without being killed (it was restarted).
#[derive(Debug, Clone)]
struct Exit {
    name: String,
    pid: u32,
    /// When the exit was noticed.
    at: u64,
    ran_ms: u64,
    last_words: String,
}

/// What a fault lane did to a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum FaultKind {
    PauseWorker,
    KillWorker,
    PauseServe,
    KillServe,
    PauseRedis,
    KillRedis,
}

/// One injected fault, for the report and the checker.
#[derive(Debug, Clone)]
struct Fault {
    kind: FaultKind,
    target: String,
    pid: u32,
    from: u64,
    to: u64,
}

/// Where the processes live: fixed ports (a restart reuses them, so clients and sluice find
/// the new process where the old one was) and one folder for Redis's data, logs and journal.
struct Layout {
    dir: PathBuf,
    journal: PathBuf,
    redis_port: u16,
    serve_port: u16,
}

impl Layout {
    fn redis_url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.redis_port)
    }

    fn spawn_redis(&self) -> Proc {
        // AOF with every write synced: a SIGKILL loses nothing Redis acknowledged.
        let mut cmd = redis_server::command(
            Path::new("redis-server"),
            self.redis_port,
            &self.dir.join("redis"),
            Persistence::Aof("always"),
        );
        Proc::spawn("redis".into(), &mut cmd, &self.dir.join("redis.log"))
    }

    fn spawn_serve(&self) -> Proc {
        let mut cmd = Command::new(sluice_bin());
        cmd.arg("serve")
            .args(["--listen", &format!("127.0.0.1:{}", self.serve_port)])
            .args(["--redis-url", &self.redis_url()])
            .args(["--admin-token", ADMIN_TOKEN])
            .args(["--redis-timeout-ms", "500"])
            .args(["--request-timeout-ms", "5000"])
            .args(["--sweep-interval-secs", "2"])
            .args(["--default-max-queued", &MAX_QUEUED.to_string()])
            .args([
                "--default-max-concurrent",
                &DEFAULT_MAX_CONCURRENT.to_string(),
            ])
            .env("RUST_LOG", "warn")
            // An error's last line in the log then says why it exited (panics keep theirs).
            .env("RUST_LIB_BACKTRACE", "0");
        Proc::spawn("serve".into(), &mut cmd, &self.dir.join("serve.log"))
    }

    fn spawn_worker(&self, n: usize) -> Proc {
        let name = format!("worker-{n}");
        let mut cmd = Command::new(sluice_bin());
        cmd.args(["worker", "--demo-flows", "--redis-url", &self.redis_url()])
            .args(["--lease-ttl-ms", &LEASE_TTL_MS.to_string()])
            .args(["--heartbeat-ms", "300", "--scan-ms", "300"])
            .args(["--retry-backoff-ms", "50"])
            .args(["--concurrency", "4", "--drain-timeout-ms", "1000"])
            // A Redis call must give up well within the lease it is meant to renew.
            .args(["--redis-timeout-ms", "500"])
            .env("SLUICE_JOURNAL", &self.journal)
            .env("RUST_LOG", "warn")
            // An error's last line in the log then says why it exited (panics keep theirs).
            .env("RUST_LIB_BACKTRACE", "0");
        let log = self.dir.join(format!("{name}.log"));
        Proc::spawn(name, &mut cmd, &log)
    }
}

/// The processes under test (one redis-server, one `sluice serve`, the workers; not a Redis
/// Cluster) and what was done to them.
struct Deployment {
    at: Layout,
    redis: Proc,
    serve: Proc,
    workers: Vec<Proc>,
    /// Workers started so far (names their logs).
    spawned: usize,
    /// Worker pid → the instant by which it was dead (SIGKILLed and reaped, or found exited):
    /// its runs without an `end` line end there.
    gone: HashMap<u32, u64>,
    /// Processes that exited without being killed (and were restarted).
    exits: Vec<Exit>,
    faults: Vec<Fault>,
}

impl Deployment {
    fn spawn_worker(&mut self) -> Proc {
        self.spawned += 1;
        self.at.spawn_worker(self.spawned)
    }

    /// Restarts whatever exited on its own (a worker or `serve` started while Redis was down
    /// gives up; so may one that lost Redis for long). Killed processes are restarted by the
    /// lane that killed them, so anything found here exited unasked.
    fn ensure_running(&mut self) {
        let now = now_ms();
        if self.redis.exited() {
            self.exits.push(self.redis.exit_note(now));
            self.redis = self.at.spawn_redis();
        }
        if self.serve.exited() {
            self.exits.push(self.serve.exit_note(now));
            self.serve = self.at.spawn_serve();
        }
        for i in 0..self.workers.len() {
            if self.workers[i].exited() {
                self.gone.insert(self.workers[i].pid(), now);
                self.exits.push(self.workers[i].exit_note(now));
                self.workers[i] = self.spawn_worker();
            }
        }
    }

    /// Every process continued (a SIGCONT to a running process does nothing).
    fn continue_all(&self) {
        signal(self.redis.pid(), "CONT");
        signal(self.serve.pid(), "CONT");
        for w in &self.workers {
            signal(w.pid(), "CONT");
        }
    }
}

/// Waits until Redis answers PING (after a restart it first loads the AOF).
async fn wait_redis(url: &str, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    let Ok(client) = redis::Client::open(url) else {
        return false;
    };
    while Instant::now() < deadline {
        let ping = async {
            let mut c = client.get_multiplexed_async_connection().await?;
            redis::cmd("PING").query_async::<String>(&mut c).await
        };
        if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(1), ping).await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// Waits until `serve` answers `/readyz` with 200.
async fn wait_serve(api: &Api, limit: Duration) -> bool {
    crate::helpers::wait_ready(&api.http, &api.base, limit).await
}

/// Starts Redis, `serve` and the workers, Redis and `serve` on free ports.
async fn start_deployment(dir: &Path) -> (Deployment, Api) {
    std::fs::create_dir_all(dir.join("redis")).expect("redis dir");
    // A free port can be taken between probing and binding: try a few.
    for _ in 0..5 {
        let at = Layout {
            dir: dir.to_owned(),
            journal: dir.join("journal.jsonl"),
            redis_port: free_port(),
            serve_port: free_port(),
        };
        let mut redis = at.spawn_redis();
        if !wait_redis(&at.redis_url(), Duration::from_secs(10)).await {
            redis.kill9();
            continue;
        }
        let mut serve = at.spawn_serve();
        let api = Api::new(at.serve_port);
        if !wait_serve(&api, Duration::from_secs(15)).await {
            serve.kill9();
            continue;
        }
        let workers = (1..=WORKERS).map(|n| at.spawn_worker(n)).collect();
        let deployment = Deployment {
            at,
            redis,
            serve,
            workers,
            spawned: WORKERS,
            gone: HashMap::new(),
            exits: Vec::new(),
            faults: Vec::new(),
        };
        return (deployment, api);
    }
    panic!("could not start redis-server and sluice serve on free ports");
}

/// Sleeps `ms` unless `stop` fires first; whether the whole sleep happened.
async fn nap(stop: &CancellationToken, ms: u64) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(Duration::from_millis(ms)) => true,
        _ = stop.cancelled() => false,
    }
}

/// Workers in the middle of a run with at least `LEASE_TTL_MS + 1100` ms of its sleep left
/// (the journal says what runs where, the clients what each execution sleeps): paused past
/// its lease but not past the run, such a worker wakes up as a zombie whose run another worker
/// has taken over meanwhile — the case fences exist for. Pids and the time left.
fn mid_run_workers(journal: &Path, cs: &Clients) -> Vec<(u32, u64)> {
    let journal = read_journal(journal);
    let now = now_ms();
    let plans = cs.plans.lock().expect("plans");
    journal
        .runs
        .iter()
        .filter(|r| r.end.is_none())
        .filter_map(|r| {
            let left = (r.start + plans.get(&r.id)?.ms).checked_sub(now)?;
            (left >= LEASE_TTL_MS + 1_100).then_some((r.pid, left))
        })
        .collect()
}

/// The workers' fault lane: one worker at a time paused (half the time past its lease; often
/// one caught in the middle of a long run) or killed and replaced. Every turn draws the same
/// random numbers, so the schedule of a seed does not depend on what the journal shows.
async fn worker_faults(
    deployment: Arc<AsyncMutex<Deployment>>,
    cs: Arc<Clients>,
    mut rng: Rng,
    stop: CancellationToken,
) {
    for _ in 0..100_000 {
        let gap = rng.between(300, 2_500);
        let (aim, aim_at, aim_len) = (rng.percent(40), rng.next(), rng.next());
        let (any, pause_it) = (rng.next(), rng.percent(50));
        let short_ms = rng.between(200, LEASE_TTL_MS);
        let long_ms = rng.between(LEASE_TTL_MS + 200, MAX_PAUSE_MS);
        let long = rng.percent(50);
        if !nap(&stop, gap).await {
            return;
        }
        let mut c = deployment.lock().await;
        c.ensure_running();
        let mut i = (any % c.workers.len() as u64) as usize;
        let mut pause = None;
        let mid_run = if aim {
            mid_run_workers(&c.at.journal, &cs)
        } else {
            Vec::new()
        };
        if !mid_run.is_empty() {
            let (pid, left) = mid_run[(aim_at % mid_run.len() as u64) as usize];
            if let Some(n) = c.workers.iter().position(|w| w.pid() == pid) {
                i = n;
                // Past the lease, and at least 400 ms short of the run's end.
                let lo = LEASE_TTL_MS + 200;
                pause = Some(lo + aim_len % (left - 400 - lo + 1));
            }
        }
        let (pid, target) = (c.workers[i].pid(), c.workers[i].name.clone());
        if pause.is_some() || pause_it {
            let ms = pause.unwrap_or(if long { long_ms } else { short_ms });
            let from = now_ms();
            signal(pid, "STOP");
            drop(c);
            nap(&stop, ms).await;
            signal(pid, "CONT");
            let to = now_ms();
            deployment.lock().await.faults.push(Fault {
                kind: FaultKind::PauseWorker,
                target,
                pid,
                from,
                to,
            });
        } else {
            let from = now_ms();
            c.workers[i].kill9();
            let dead = now_ms();
            c.gone.insert(pid, dead);
            c.workers[i] = c.spawn_worker();
            c.faults.push(Fault {
                kind: FaultKind::KillWorker,
                target,
                pid,
                from,
                to: dead,
            });
        }
    }
}

/// The infrastructure's fault lane: `serve` or Redis paused (Redis sometimes past the
/// workers' lease), or killed and restarted on the same port (Redis from its AOF).
async fn infra_faults(
    deployment: Arc<AsyncMutex<Deployment>>,
    api: Api,
    mut rng: Rng,
    stop: CancellationToken,
) {
    for _ in 0..100_000 {
        if !nap(&stop, rng.between(500, 3_000)).await {
            return;
        }
        let roll = rng.below(100);
        let mut c = deployment.lock().await;
        c.ensure_running();
        let redis_url = c.at.redis_url();
        let (kind, pid) = match roll {
            0..30 => (FaultKind::PauseServe, c.serve.pid()),
            30..45 => (FaultKind::KillServe, c.serve.pid()),
            45..80 => (FaultKind::PauseRedis, c.redis.pid()),
            _ => (FaultKind::KillRedis, c.redis.pid()),
        };
        let from = now_ms();
        match kind {
            FaultKind::PauseServe | FaultKind::PauseRedis => {
                let ms = if kind == FaultKind::PauseRedis && rng.percent(35) {
                    rng.between(LEASE_TTL_MS + 200, MAX_PAUSE_MS - 500)
                } else {
                    rng.between(300, 3_000)
                };
                signal(pid, "STOP");
                drop(c);
                nap(&stop, ms).await;
                signal(pid, "CONT");
                c = deployment.lock().await;
            }
            FaultKind::KillServe => {
                c.serve.kill9();
                c.serve = c.at.spawn_serve();
                drop(c);
                wait_serve(&api, Duration::from_secs(15)).await;
                c = deployment.lock().await;
            }
            FaultKind::KillRedis => {
                c.redis.kill9();
                c.redis = c.at.spawn_redis();
                drop(c);
                wait_redis(&redis_url, Duration::from_secs(15)).await;
                c = deployment.lock().await;
            }
            FaultKind::PauseWorker | FaultKind::KillWorker => unreachable!("worker lane"),
        }
        let target = match kind {
            FaultKind::PauseServe | FaultKind::KillServe => "serve",
            _ => "redis",
        };
        c.faults.push(Fault {
            kind,
            target: target.into(),
            pid,
            from,
            to: now_ms(),
        });
    }
}

/// Continues every process, restarts any that exited, and waits until Redis and `serve` answer.
async fn heal(deployment: &Arc<AsyncMutex<Deployment>>, api: &Api) {
    for _ in 0..5 {
        let url = {
            let mut c = deployment.lock().await;
            c.continue_all();
            c.ensure_running();
            c.at.redis_url()
        };
        if wait_redis(&url, Duration::from_secs(10)).await
            && wait_serve(api, Duration::from_secs(10)).await
        {
            return;
        }
    }
    panic!("redis-server or sluice serve did not come back after the faults");
}

// ---------------------------------------------------------------------------------------------
// Clients

/// The HTTP API as the platform admin.
#[derive(Clone)]
struct Api {
    http: reqwest::Client,
    base: String,
}

/// What a request got back.
#[derive(Debug, Clone)]
enum Answer {
    /// An HTTP answer with its (JSON, else null) body.
    Http { status: u16, body: Value },
    /// No answer: a transport error or the client's timeout. Anything may have happened.
    Lost(String),
}

impl Answer {
    fn status(&self) -> Option<u16> {
        match self {
            Answer::Http { status, .. } => Some(*status),
            Answer::Lost(_) => None,
        }
    }

    fn is_2xx(&self) -> bool {
        self.status().is_some_and(|s| (200..300).contains(&s))
    }

    /// 4xx: the request was refused and changed nothing.
    fn is_refusal(&self) -> bool {
        self.status().is_some_and(|s| (400..500).contains(&s))
    }

    fn body(&self) -> &Value {
        match self {
            Answer::Http { body, .. } => body,
            Answer::Lost(_) => &Value::Null,
        }
    }

    fn code(&self) -> Option<&str> {
        self.body()["code"].as_str()
    }

    /// `execution_id` of a 2xx body or of a problem that names one.
    fn execution_id(&self) -> Option<&str> {
        self.body()["execution_id"].as_str()
    }

    /// The label, with the transport error of a lost answer (for violation messages).
    fn detail(&self) -> String {
        match self {
            Answer::Lost(why) => format!("no answer ({why})"),
            _ => self.label(),
        }
    }

    /// `201`, `503 redis_unavailable`, `no answer`: how the report groups answers.
    fn label(&self) -> String {
        match self {
            Answer::Lost(_) => "no answer".into(),
            Answer::Http { status, .. } => match self.code() {
                Some(code) if *status >= 400 => format!("{status} {code}"),
                _ => status.to_string(),
            },
        }
    }
}

impl Api {
    fn new(port: u16) -> Self {
        Self {
            http: reqwest::Client::builder()
                // Above serve's own 5 s request timeout: a paused serve still answers.
                .timeout(Duration::from_secs(7))
                .connect_timeout(Duration::from_secs(2))
                .build()
                .expect("http client"),
            base: format!("http://127.0.0.1:{port}"),
        }
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        tenant: Option<&str>,
        key: Option<&str>,
        body: Option<&Value>,
    ) -> Answer {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(ADMIN_TOKEN);
        if let Some(t) = tenant {
            req = req.header("X-Tenant-Id", t);
        }
        if let Some(k) = key {
            req = req.header("Idempotency-Key", k);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        match req.send().await {
            Err(e) => Answer::Lost(e.to_string()),
            Ok(res) => {
                let status = res.status().as_u16();
                match res.bytes().await {
                    Ok(b) => Answer::Http {
                        status,
                        body: serde_json::from_slice(&b).unwrap_or(Value::Null),
                    },
                    Err(e) => Answer::Lost(format!("status {status}, body lost: {e}")),
                }
            }
        }
    }

    /// A read for the checker, after healing: retried a few times over a transient error.
    async fn read(&self, tenant: Option<&str>, path: &str) -> Value {
        let mut last = String::new();
        for _ in 0..10 {
            match self.call(Method::GET, path, tenant, None, None).await {
                Answer::Http { status: 200, body } => return body,
                other => last = format!("{other:?}"),
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        panic!("GET {path} kept failing after the faults were healed: {last}");
    }
}

/// One request a client made.
#[derive(Debug, Clone)]
enum Op {
    Admit {
        tenant: String,
        nonce: String,
        key: Option<String>,
        try_no: u32,
    },
    Cancel {
        tenant: String,
        id: String,
    },
    Retry {
        id: String,
    },
    Limit {
        tenant: String,
        max_concurrent: u64,
    },
}

/// A request, its answer and when (wall-clock ms).
#[derive(Debug, Clone)]
struct Rec {
    op: Op,
    sent: u64,
    done: u64,
    answer: Answer,
}

/// What an admission asked for (by execution id).
#[derive(Debug, Clone, Copy)]
struct Plan {
    /// `params.ms`: how long each run sleeps.
    ms: u64,
    max_attempts: u64,
    /// The admission's `delay` (ms), if it was scheduled.
    delay: Option<u64>,
}

/// What the client tasks share.
struct Clients {
    api: Api,
    seed: u64,
    until: Instant,
    log: Mutex<Vec<Rec>>,
    /// Executions some admission named: (tenant, id), targets of cancels and retries.
    known: Mutex<Vec<(String, String)>>,
    /// Executions last seen cancelled or failed: the likeliest to accept a retry.
    ended: Mutex<Vec<(String, String)>>,
    /// What each named execution was asked to do, to aim faults, cancels and retries.
    plans: Mutex<HashMap<String, Plan>>,
    /// The workers' journal, to aim cancels at runs about to end.
    journal: PathBuf,
}

impl Clients {
    fn record(&self, op: Op, sent: u64, answer: &Answer) {
        self.log.lock().expect("log").push(Rec {
            op,
            sent,
            done: now_ms(),
            answer: answer.clone(),
        });
    }

    fn any_known(&self, rng: &mut Rng) -> Option<(String, String)> {
        let known = self.known.lock().expect("known");
        (!known.is_empty()).then(|| rng.pick(&known).clone())
    }

    /// Often an execution whose run the journal shows ending within 300 ms (its worker will
    /// report the outcome before a heartbeat can tell it of the cancel: the completion races
    /// the cancel), else mostly one of the latest admissions (likely waiting or running), else
    /// any.
    fn cancel_target(&self, rng: &mut Rng, journal: &Path) -> Option<(String, String)> {
        let (closing, pick) = (rng.percent(40), rng.next());
        if closing {
            let runs = read_journal(journal).runs;
            let now = now_ms();
            let plans = self.plans.lock().expect("plans");
            let ending: Vec<&Run> = runs
                .iter()
                .filter(|r| r.end.is_none())
                .filter(|r| {
                    plans
                        .get(&r.id)
                        .is_some_and(|p| (now..now + 300).contains(&(r.start + p.ms)))
                })
                .collect();
            if !ending.is_empty() {
                let r = ending[(pick % ending.len() as u64) as usize];
                return Some((r.tenant.clone(), r.id.clone()));
            }
        }
        let known = self.known.lock().expect("known");
        if known.is_empty() {
            return None;
        }
        let recent = &known[known.len().saturating_sub(8)..];
        let from = if rng.percent(75) { recent } else { &known[..] };
        Some(rng.pick(from).clone())
    }

    /// Often an execution whose latest journaled run was stopped (cancelled) or failed its
    /// last attempt: it ran, so a retry must give it a fence it never had (the case a reset
    /// fence gets wrong); else mostly one last seen cancelled or failed, else any.
    fn retry_target(&self, rng: &mut Rng, journal: &Path) -> Option<(String, String)> {
        let (ran, pick, seen) = (rng.percent(50), rng.next(), rng.percent(70));
        if ran {
            let runs = read_journal(journal).runs;
            let plans = self.plans.lock().expect("plans");
            let mut latest: HashMap<&str, &Run> = HashMap::new();
            for r in &runs {
                latest.insert(&r.id, r);
            }
            let over: Vec<&Run> = latest
                .values()
                .filter(|r| {
                    r.end.as_ref().is_some_and(|e| {
                        e.how == "stopped"
                            || (e.how == "fail"
                                && plans
                                    .get(&r.id)
                                    .is_some_and(|p| r.attempt >= p.max_attempts))
                    })
                })
                .copied()
                .collect();
            if !over.is_empty() {
                let r = over[(pick % over.len() as u64) as usize];
                return Some((r.tenant.clone(), r.id.clone()));
            }
        }
        let target = {
            let ended = self.ended.lock().expect("ended");
            (!ended.is_empty() && seen).then(|| rng.pick(&ended).clone())
        };
        target.or_else(|| self.any_known(rng))
    }

    /// Remembers an execution that may accept a retry (cancelled, failed, or about to be).
    fn note_status(&self, tenant: &str, id: &str, body: &Value) {
        if matches!(body["status"].as_str(), Some("cancelled" | "failed"))
            || body["cancel_requested"] == true
        {
            let mut ended = self.ended.lock().expect("ended");
            if ended.len() < 10_000 {
                ended.push((tenant.to_owned(), id.to_owned()));
            }
        }
    }
}

/// One client: until the chaos ends, a random request every 100–500 ms.
async fn client(cs: Arc<Clients>, n: usize, mut rng: Rng) {
    for seq in 0..100_000u64 {
        if Instant::now() >= cs.until {
            return;
        }
        let tenant = rng.pick(&TENANTS).to_string();
        match rng.below(100) {
            0..68 => admit(&cs, &mut rng, tenant, format!("{:x}-{n}-{seq}", cs.seed)).await,
            68..80 => {
                if let Some((t, id)) = cs.cancel_target(&mut rng, &cs.journal) {
                    let path = format!("/api/executions/{id}/cancel");
                    let sent = now_ms();
                    let ans = cs.api.call(Method::POST, &path, Some(&t), None, None).await;
                    cs.record(
                        Op::Cancel {
                            tenant: t.clone(),
                            id: id.clone(),
                        },
                        sent,
                        &ans,
                    );
                    if ans.is_2xx() {
                        cs.note_status(&t, &id, ans.body());
                    }
                }
            }
            80..90 => {
                if let Some((t, id)) = cs.retry_target(&mut rng, &cs.journal) {
                    let path = format!("/api/executions/{id}/retry");
                    let sent = now_ms();
                    let ans = cs.api.call(Method::POST, &path, Some(&t), None, None).await;
                    cs.record(Op::Retry { id }, sent, &ans);
                }
            }
            90..96 => {
                if let Some((t, id)) = cs.any_known(&mut rng) {
                    let path = format!("/api/executions/{id}");
                    let ans = cs.api.call(Method::GET, &path, Some(&t), None, None).await;
                    if ans.status() == Some(200) {
                        cs.note_status(&t, &id, ans.body());
                    }
                }
            }
            _ => {
                let n = rng.between(1, 3);
                set_limit(&cs, &tenant, json!({ "max_concurrent": n }), n).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.between(100, 500))).await;
    }
}

/// One logical admission: a fresh nonce; with a key, retried (same key, same body) after a
/// transport error or a 5xx, at most 4 tries; without one, never retried.
async fn admit(cs: &Clients, rng: &mut Rng, tenant: String, nonce: String) {
    let fail_attempts = match rng.below(100) {
        0..15 => 1,
        15..20 => 2,
        _ => 0,
    };
    // Most runs are short; some outlive the lease several times, so they live on heartbeats
    // (renewed through Redis pauses, or lost) and a paused worker wakes up mid-run (a zombie).
    let ms = if rng.percent(15) {
        rng.between(1_000, 4_000)
    } else {
        rng.between(50, 400)
    };
    let max_attempts = rng.between(1, 4);
    let mut body = json!({
        "flow_id": FLOW,
        "params": {"ms": ms, "nonce": nonce, "fail_attempts": fail_attempts},
        "max_attempts": max_attempts,
    });
    // Some are prioritized, some scheduled a little later (the same on every try: a retried
    // request with a relative delay is a replay, and keeps the first admission's schedule).
    if rng.percent(40) {
        body["priority"] = json!(rng.between(1, 5));
    }
    let delay = rng.percent(25).then(|| rng.between(100, 1_500));
    if let Some(d) = delay {
        body["delay"] = json!(format!("{d}ms"));
    }
    // Most carry a concurrency key of a few (limit KEY_LIMIT each, property 10).
    if rng.percent(60) {
        body["concurrency_key"] = json!(format!("ck-{}", rng.below(3)));
    }
    let key = rng.percent(50).then(|| format!("key-{nonce}"));
    for try_no in 1..=4 {
        let sent = now_ms();
        let ans = cs
            .api
            .call(
                Method::POST,
                "/api/executions",
                Some(&tenant),
                key.as_deref(),
                Some(&body),
            )
            .await;
        let op = Op::Admit {
            tenant: tenant.clone(),
            nonce: nonce.clone(),
            key: key.clone(),
            try_no,
        };
        cs.record(op, sent, &ans);
        if let Some(id) = ans.execution_id() {
            let mut known = cs.known.lock().expect("known");
            if known.len() < 100_000 {
                known.push((tenant.clone(), id.to_owned()));
                let plan = Plan {
                    ms,
                    max_attempts,
                    delay,
                };
                cs.plans.lock().expect("plans").insert(id.to_owned(), plan);
            }
        }
        let unsure = ans.status().is_none_or(|s| s >= 500);
        let late = Instant::now() > cs.until + Duration::from_secs(3);
        if key.is_none() || !unsure || late {
            return;
        }
        tokio::time::sleep(Duration::from_millis(rng.between(100, 600))).await;
    }
}

/// `PUT /api/tenants/{t}` with `body`, recorded as a limit change to `max_concurrent`.
async fn set_limit(cs: &Clients, tenant: &str, body: Value, max_concurrent: u64) -> Answer {
    let sent = now_ms();
    let path = format!("/api/tenants/{tenant}");
    let ans = cs
        .api
        .call(Method::PUT, &path, None, None, Some(&body))
        .await;
    let op = Op::Limit {
        tenant: tenant.to_owned(),
        max_concurrent,
    };
    cs.record(op, sent, &ans);
    ans
}

// ---------------------------------------------------------------------------------------------
// The end state

/// Waits until every tenant's usage is zero and nothing is listed queued or running; on
/// timeout, what was still busy.
async fn quiesce(api: &Api, limit: Duration) -> Result<Duration, String> {
    let start = Instant::now();
    let mut busy = Vec::new();
    while start.elapsed() < limit {
        busy.clear();
        for t in TENANTS {
            let tenant = api.read(None, &format!("/api/tenants/{t}")).await;
            let usage = &tenant["usage"];
            if usage != &json!({"running": 0, "waiting": 0, "scheduled": 0}) {
                busy.push(format!("{t} usage {usage}"));
            }
            for status in ["queued", "running"] {
                let page = api
                    .read(Some(t), &format!("/api/executions?status={status}&limit=1"))
                    .await;
                if page["total"] != 0 {
                    busy.push(format!("{t} {status} {}", page["total"]));
                }
            }
        }
        if busy.is_empty() {
            return Ok(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(busy.join(", "))
}

/// What the system holds at the end.
struct Final {
    /// Every execution, by id (API bodies).
    execs: BTreeMap<String, Value>,
    /// Ids the listing returned more than once.
    listed_twice: Vec<String>,
    /// Rows found on Redis that no listing returned.
    unlisted: Vec<String>,
    usage: BTreeMap<String, Value>,
    dead_letters: Vec<Value>,
    counters: BTreeMap<String, u64>,
    /// Each shard's start log: (tenant, virtual start tag, weight) per start, oldest first.
    start_logs: BTreeMap<String, Vec<(String, f64, f64, u64)>>,
}

async fn final_state(api: &Api, redis_url: &str) -> Final {
    let mut execs = BTreeMap::new();
    let mut listed_twice = Vec::new();
    let mut usage = BTreeMap::new();
    for t in TENANTS {
        let mut cursor: Option<String> = None;
        for _ in 0..10_000 {
            let path = match &cursor {
                Some(c) => format!("/api/executions?limit=200&cursor={c}"),
                None => "/api/executions?limit=200".into(),
            };
            let page = api.read(Some(t), &path).await;
            for e in page["executions"].as_array().into_iter().flatten() {
                let id = e["execution_id"].as_str().unwrap_or_default().to_owned();
                if execs.insert(id.clone(), e.clone()).is_some() {
                    listed_twice.push(id);
                }
            }
            cursor = page["next_cursor"].as_str().map(str::to_owned);
            if cursor.is_none() {
                break;
            }
        }
        usage.insert(
            t.to_owned(),
            api.read(None, &format!("/api/tenants/{t}")).await["usage"].clone(),
        );
    }

    // Rows on Redis the listing missed (indexes out of step with rows).
    let mut unlisted = Vec::new();
    let mut conn = redis::Client::open(redis_url)
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .expect("redis connection after healing");
    let mut start_logs = BTreeMap::new();
    let mut cursor = 0u64;
    for _ in 0..100_000 {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg("sluice:{*}:starts")
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await
            .expect("SCAN");
        for key in keys {
            let entries: Vec<(String, Vec<String>)> = redis::cmd("XRANGE")
                .arg(&key)
                .arg("-")
                .arg("+")
                .query_async(&mut conn)
                .await
                .expect("XRANGE");
            let log = entries
                .into_iter()
                .map(|(id, f)| {
                    let get = |n: &str| {
                        f.chunks(2)
                            .find(|c| c[0] == n)
                            .map(|c| c[1].clone())
                            .unwrap_or_default()
                    };
                    (
                        get("t"),
                        get("vt").parse().unwrap_or(f64::NAN),
                        get("w").parse().unwrap_or(f64::NAN),
                        // The entry id is the start's time on Redis's clock (ms).
                        id.split('-')
                            .next()
                            .and_then(|ms| ms.parse().ok())
                            .unwrap_or(0),
                    )
                })
                .collect();
            start_logs.insert(key, log);
        }
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    let mut cursor = 0u64;
    for _ in 0..100_000 {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(sluice::store::keys::row_pattern())
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await
            .expect("SCAN");
        for key in keys {
            let Some(id) = sluice::store::keys::parse(&key).and_then(|n| n.id) else {
                continue;
            };
            let id = id.to_owned();
            if execs.contains_key(&id) {
                continue;
            }
            let tenant: Option<String> = redis::cmd("HGET")
                .arg(&key)
                .arg("tenant")
                .query_async(&mut conn)
                .await
                .expect("HGET");
            let Some(tenant) = tenant else { continue };
            let body = api
                .call(
                    Method::GET,
                    &format!("/api/executions/{id}"),
                    Some(&tenant),
                    None,
                    None,
                )
                .await;
            let row = match body {
                Answer::Http { status: 200, body } => body,
                other => {
                    json!({"execution_id": id, "tenant_id": tenant, "unreadable": other.label()})
                }
            };
            unlisted.push(id.clone());
            execs.insert(id, row);
        }
        cursor = next;
        if cursor == 0 {
            break;
        }
    }

    let mut dead_letters = Vec::new();
    let mut before: Option<String> = None;
    for _ in 0..10_000 {
        let path = match &before {
            Some(b) => format!("/api/dlq?limit=200&before={b}"),
            None => "/api/dlq?limit=200".into(),
        };
        let page = api.read(None, &path).await;
        dead_letters.extend(page["dead_letters"].as_array().cloned().unwrap_or_default());
        before = page["next_before"].as_str().map(str::to_owned);
        if before.is_none() {
            break;
        }
    }
    let mut counters = BTreeMap::new();
    let queues = api.read(None, "/api/queues").await;
    for shard in queues["shards"].as_array().into_iter().flatten() {
        if let Some(c) = shard["counters"].as_object() {
            for (k, v) in c {
                *counters.entry(k.clone()).or_default() += v.as_u64().unwrap_or(0);
            }
        }
    }
    Final {
        execs,
        listed_twice,
        unlisted,
        usage,
        dead_letters,
        counters,
        start_logs,
    }
}

// ---------------------------------------------------------------------------------------------
// The journal

/// One run of a handler, from its `start` line and (if written) its `end` line.
#[derive(Debug, Clone)]
struct Run {
    id: String,
    tenant: String,
    fence: u64,
    attempt: u64,
    pid: u32,
    start: u64,
    end: Option<RunEnd>,
}

#[derive(Debug, Clone)]
struct RunEnd {
    t: u64,
    lease_deadline: u64,
    how: String,
}

impl Run {
    /// `[start, end)` in which this run could prove it held the lease (empty: `end <= start`).
    fn effective(&self, gone: &HashMap<u32, u64>) -> (u64, u64) {
        let end = match &self.end {
            Some(e) => e.t.min(e.lease_deadline),
            None => gone
                .get(&self.pid)
                .copied()
                .unwrap_or(u64::MAX)
                .min(self.start + LEASE_TTL_MS),
        };
        (self.start, end.max(self.start))
    }

    fn describe(&self, gone: &HashMap<u32, u64>, t0: u64) -> String {
        let (s, e) = self.effective(gone);
        let how = self.end.as_ref().map_or("no end", |e| e.how.as_str());
        format!(
            "fence {} attempt {} pid {} [{}, {}) {how}",
            self.fence,
            self.attempt,
            self.pid,
            rel(s, t0),
            rel(e, t0)
        )
    }
}

/// The journal: runs in start order, and lines that did not parse or match.
struct Journal {
    runs: Vec<Run>,
    bad_lines: Vec<String>,
}

fn read_journal(path: &Path) -> Journal {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut runs: Vec<Run> = Vec::new();
    let mut open: HashMap<(String, u64, u32), Vec<usize>> = HashMap::new();
    let mut bad_lines = Vec::new();
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            bad_lines.push(line.to_owned());
            continue;
        };
        let (Some(ev), Some(id), Some(fence), Some(pid), Some(t)) = (
            v["ev"].as_str(),
            v["id"].as_str(),
            v["fence"].as_u64(),
            v["pid"].as_u64(),
            v["t"].as_u64(),
        ) else {
            bad_lines.push(line.to_owned());
            continue;
        };
        let key = (id.to_owned(), fence, pid as u32);
        match ev {
            "start" => {
                open.entry(key).or_default().push(runs.len());
                runs.push(Run {
                    id: id.to_owned(),
                    tenant: v["tenant"].as_str().unwrap_or_default().to_owned(),
                    fence,
                    attempt: v["attempt"].as_u64().unwrap_or(0),
                    pid: pid as u32,
                    start: t,
                    end: None,
                });
            }
            "end" => {
                let slot = open.get_mut(&key).filter(|v| !v.is_empty());
                let Some(waiting) = slot else {
                    bad_lines.push(format!("end without start: {line}"));
                    continue;
                };
                let i = waiting.remove(0);
                runs[i].end = Some(RunEnd {
                    t,
                    lease_deadline: v["lease_deadline"].as_u64().unwrap_or(0),
                    how: v["how"].as_str().unwrap_or("?").to_owned(),
                });
            }
            _ => bad_lines.push(line.to_owned()),
        }
    }
    Journal { runs, bad_lines }
}

/// Runs without an `end` line whose worker is still alive.
fn open_runs(j: &Journal, gone: &HashMap<u32, u64>) -> usize {
    j.runs
        .iter()
        .filter(|r| r.end.is_none() && !gone.contains_key(&r.pid))
        .count()
}

/// `+12.345s` relative to the start of the test.
fn rel(ms: u64, t0: u64) -> String {
    if ms == u64::MAX {
        return "∞".into();
    }
    format!("+{:.3}s", (ms as f64 - t0 as f64) / 1000.0)
}

// ---------------------------------------------------------------------------------------------
// The checker

/// Violations by property.
#[derive(Default)]
struct Verdict {
    by_prop: BTreeMap<&'static str, Vec<String>>,
}

impl Verdict {
    fn fail(&mut self, prop: &'static str, what: String) {
        self.by_prop.entry(prop).or_default().push(what);
    }

    fn summary(&self) -> String {
        let mut s = String::new();
        for (prop, v) in &self.by_prop {
            let _ = writeln!(s, "{prop}: {} violation(s)", v.len());
            for what in v.iter().take(EXAMPLES) {
                let _ = writeln!(s, "  - {what}");
            }
            if v.len() > EXAMPLES {
                let _ = writeln!(s, "  ... and {} more", v.len() - EXAMPLES);
            }
        }
        s
    }
}

const P1: &str = "1. acknowledged admissions kept, terminal, once";
const P2: &str = "2. nothing unacknowledged admitted";
const P3: &str = "3. one run at a time, the last one accepted";
const P4: &str = "4. cancels stick";
const P5: &str = "5. tenant limits hold for running handlers";
const P6: &str = "6. usage back to zero";
const P7: &str = "7. attempt <= max_attempts";
const P8: &str = "8. never started before due";
const P9: &str = "9. fair share by weight (start log)";
const P10: &str = "10. concurrency key limits hold for running handlers";
const P11: &str = "11. no queue position for an execution that is not queued";
const P12: &str = "12. never more starts in a window than the rate allows";

/// The weight each tenant is given at setup.
fn weight_of(tenant: &str) -> u64 {
    match tenant {
        "chaos-a" => 1,
        "chaos-b" => 2,
        _ => 5,
    }
}

/// The virtual time one start costs a tenant of weight 1 (`QUANTUM` in common.lua).
const QUANTUM: f64 = 1000.0;

/// Everything the checker reads.
struct Evidence<'a> {
    t0: u64,
    log: &'a [Rec],
    fin: &'a Final,
    journal: &'a Journal,
    gone: &'a HashMap<u32, u64>,
    faults: &'a [Fault],
    quiesced: &'a Result<Duration, String>,
    plans: &'a HashMap<String, Plan>,
}

fn check(ev: &Evidence<'_>, report: &mut String) -> Verdict {
    let mut v = Verdict::default();
    check_admissions(ev, &mut v);
    check_runs(ev, &mut v);
    check_cancels(ev, &mut v);
    check_limits(ev, &mut v, report);
    check_schedules(ev, &mut v);
    check_fair_share(ev, &mut v);
    check_key_limits(ev, &mut v, report);
    check_rate(ev, &mut v, report);
    if let Err(busy) = ev.quiesced {
        v.fail(
            P6,
            format!("still busy {QUIESCE_LIMIT:?} after the faults: {busy}"),
        );
    }
    for (t, u) in &ev.fin.usage {
        if u != &json!({"running": 0, "waiting": 0, "scheduled": 0}) {
            v.fail(P6, format!("{t}: usage {u}"));
        }
    }
    // Every execution body a client was answered, and every final one: a position (and a
    // forecast) only while queued and due.
    let bodies = ev.log.iter().filter_map(|r| match &r.answer {
        Answer::Http { body, .. } if body["execution_id"].is_string() => Some(body),
        _ => None,
    });
    for e in bodies.chain(ev.fin.execs.values()) {
        let runnable = e["status"] == "queued" && e["queue_state"] != "scheduled";
        let shown = !e["queue_position"].is_null() || !e["estimated_start"].is_null();
        if shown && !runnable {
            v.fail(
                P11,
                format!(
                    "{}: {} / {} with position {} and estimate {}",
                    e["execution_id"],
                    e["status"],
                    e["queue_state"],
                    e["queue_position"],
                    e["estimated_start"]
                ),
            );
        }
    }
    for (id, e) in &ev.fin.execs {
        let (a, m) = (e["attempt"].as_u64(), e["max_attempts"].as_u64());
        if let (Some(a), Some(m)) = (a, m)
            && a > m
        {
            v.fail(P7, format!("{id}: attempt {a} of {m} ({})", e["status"]));
        }
    }
    v
}

/// Property 12: the rate-limited tenant's starts (every start, re-runs after a lost lease and
/// retries included), on Redis's clock from its shard's start log: no window of `per` holds
/// more than `starts + burst`.
fn check_rate(ev: &Evidence<'_>, v: &mut Verdict, report: &mut String) {
    let (tenant, starts, per_ms, burst) = RATE_LIMITED;
    let times: Vec<u64> = ev
        .fin
        .start_logs
        .values()
        .flatten()
        .filter(|(t, ..)| t == tenant)
        .map(|(.., ms)| *ms)
        .collect();
    let bound = (starts + burst) as usize;
    let mut busiest = 0;
    for &t in &times {
        let n = times.iter().filter(|&&u| u >= t && u < t + per_ms).count();
        busiest = busiest.max(n);
        if n > bound {
            v.fail(
                P12,
                format!(
                    "{tenant}: {n} starts in the {per_ms} ms from {} (at most {bound})",
                    rel(t, ev.t0)
                ),
            );
        }
    }
    let _ = writeln!(
        report,
        "  rate limit: {tenant} started {} times, at most {busiest} in any {per_ms} ms (limit {starts} + burst {burst})",
        times.len()
    );
}

/// Property 10: per tenant and concurrency key, at every run start, the executions of that key
/// with a run in its effective interval are at most `KEY_LIMIT` (the tenants'
/// `max_concurrent_per_key`, set before any admission and never changed).
fn check_key_limits(ev: &Evidence<'_>, v: &mut Verdict, report: &mut String) {
    let key_of = |id: &str| -> Option<&str> { ev.fin.execs.get(id)?["concurrency_key"].as_str() };
    // Per (tenant, key): each run's effective interval and execution id.
    type Spans<'a> = Vec<(u64, u64, &'a str)>;
    let mut by_key: BTreeMap<(&str, &str), Spans<'_>> = BTreeMap::new();
    for r in &ev.journal.runs {
        let Some(key) = key_of(&r.id) else { continue };
        let (s, e) = r.effective(ev.gone);
        if e > s {
            by_key
                .entry((r.tenant.as_str(), key))
                .or_default()
                .push((s, e, r.id.as_str()));
        }
    }
    let mut peak = 0;
    for ((t, key), runs) in &by_key {
        for &(s, _, _) in runs {
            let active: BTreeSet<&str> = runs
                .iter()
                .filter(|(s2, e2, _)| *s2 <= s && s < *e2)
                .map(|(_, _, id)| *id)
                .collect();
            peak = peak.max(active.len());
            if active.len() as u64 > KEY_LIMIT {
                v.fail(
                    P10,
                    format!(
                        "{t}/{key}: {} executions running at {} (limit {KEY_LIMIT}): {active:?}",
                        active.len(),
                        rel(s, ev.t0)
                    ),
                );
            }
        }
    }
    let _ = writeln!(
        report,
        "  concurrency keys: {} keys ran, peak {peak} handlers of one key at once (limit {KEY_LIMIT})",
        by_key.len()
    );
}

fn is_terminal(e: &Value) -> bool {
    matches!(
        e["status"].as_str(),
        Some("completed" | "failed" | "cancelled")
    )
}

/// Property 8: an execution admitted with a `delay` never ran before its due time (its
/// admission's Redis time plus the delay), unless a retry of it (which makes it runnable at
/// once) was requested. Journal times and Redis times are one machine's clock.
fn check_schedules(ev: &Evidence<'_>, v: &mut Verdict) {
    let retried: BTreeSet<&str> = ev
        .log
        .iter()
        .filter_map(|r| match &r.op {
            Op::Retry { id } => Some(id.as_str()),
            _ => None,
        })
        .collect();
    let mut first_start: HashMap<&str, u64> = HashMap::new();
    for r in &ev.journal.runs {
        let at = first_start.entry(r.id.as_str()).or_insert(r.start);
        *at = (*at).min(r.start);
    }
    for (id, plan) in ev.plans {
        let Some(delay) = plan.delay else { continue };
        if retried.contains(id.as_str()) {
            continue;
        }
        let (Some(e), Some(start)) = (ev.fin.execs.get(id), first_start.get(id.as_str())) else {
            continue;
        };
        let Some(created) = e["created_at"].as_str().and_then(ms_of_rfc3339) else {
            v.fail(P8, format!("{id}: no readable created_at: {e}"));
            continue;
        };
        if *start < created + delay {
            v.fail(
                P8,
                format!(
                    "{id}: admitted at {created} with delay {delay} ms, started at {start} ({} ms early)",
                    created + delay - start
                ),
            );
        }
    }
}

/// Property 9: each shard's start log shows start-time fair queueing: the virtual start tags
/// of successive starts never go down (the shard's clock only moves forward, and a tenant
/// comes back at the clock, never below it), and each tenant's own tags advance by at least
/// QUANTUM / weight per start (exactly that while it stays runnable; more after it came back).
/// Together: while two tenants both had work, their starts divided by their weights differ by
/// at most one start of each.
fn check_fair_share(ev: &Evidence<'_>, v: &mut Verdict) {
    for (key, log) in &ev.fin.start_logs {
        let mut last = f64::MIN;
        let mut own: HashMap<&str, f64> = HashMap::new();
        for (i, (t, tag, w, _)) in log.iter().enumerate() {
            if !tag.is_finite() || !w.is_finite() {
                v.fail(P9, format!("{key}[{i}]: unreadable entry"));
                continue;
            }
            if *w != weight_of(t) as f64 {
                v.fail(P9, format!("{key}[{i}]: {t} logged weight {w}"));
            }
            if *tag < last - 1e-6 {
                v.fail(
                    P9,
                    format!("{key}[{i}]: {t}'s tag {tag} is below the last, {last}"),
                );
            }
            last = last.max(*tag);
            if let Some(prev) = own.get(t.as_str()) {
                let step = QUANTUM / w;
                if tag - prev < step - 1e-6 {
                    v.fail(
                        P9,
                        format!("{key}[{i}]: {t}'s tag advanced by {} < {step}", tag - prev),
                    );
                }
            }
            own.insert(t, *tag);
        }
    }
}

/// Unix ms of an RFC 3339 time.
fn ms_of_rfc3339(t: &str) -> Option<u64> {
    let t = time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok()?;
    u64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok()
}

/// Properties 1 and 2: admissions against the executions found at the end.
fn check_admissions(ev: &Evidence<'_>, v: &mut Verdict) {
    let fin = ev.fin;
    for id in &fin.listed_twice {
        v.fail(P1, format!("{id} listed twice"));
    }
    for id in &fin.unlisted {
        v.fail(
            P1,
            format!(
                "{id} is on Redis but no listing returned it: {}",
                fin.execs[id]
            ),
        );
    }
    // Tries of each logical request (one nonce each).
    let mut by_nonce: BTreeMap<&str, Vec<&Rec>> = BTreeMap::new();
    for r in ev.log {
        if let Op::Admit { nonce, .. } = &r.op {
            by_nonce.entry(nonce).or_default().push(r);
        }
    }
    // Executions at the end, by the nonce they carry.
    let mut found: HashMap<&str, Vec<&str>> = HashMap::new();
    for (id, e) in &fin.execs {
        match e["params"]["nonce"].as_str() {
            Some(n) => found.entry(n).or_default().push(id),
            None => v.fail(P2, format!("{id} carries no nonce: {e}")),
        }
    }
    for (nonce, tries) in &by_nonce {
        let Op::Admit { tenant, key, .. } = &tries[0].op else {
            continue;
        };
        let exists: Vec<&str> = found.get(nonce).cloned().unwrap_or_default();
        let acked: BTreeSet<&str> = tries
            .iter()
            .filter(|r| r.answer.is_2xx())
            .filter_map(|r| r.answer.execution_id())
            .collect();
        for r in tries.iter().filter(|r| r.answer.is_2xx()) {
            if r.answer.execution_id().is_none() {
                v.fail(P1, format!("2xx admission without an id: {r:?}"));
            }
        }
        if acked.len() > 1 {
            v.fail(
                P1,
                format!("key {key:?} answered with several executions: {acked:?}"),
            );
        }
        for id in &acked {
            match fin.execs.get(*id) {
                None => v.fail(
                    P1,
                    format!("{tenant}/{id} (nonce {nonce}) was acknowledged and is gone"),
                ),
                Some(e) if !is_terminal(e) => v.fail(
                    P1,
                    format!("{tenant}/{id} ends {} ({})", e["status"], e["queue_state"]),
                ),
                Some(e) if e["tenant_id"] != tenant.as_str() => {
                    v.fail(P1, format!("{id} belongs to {}", e["tenant_id"]))
                }
                Some(_) => {}
            }
        }
        if !acked.is_empty() {
            let extra: Vec<&&str> = exists.iter().filter(|id| !acked.contains(**id)).collect();
            if !extra.is_empty() {
                v.fail(
                    P2,
                    format!(
                        "nonce {nonce}: acknowledged as {acked:?} but also admitted as {extra:?}"
                    ),
                );
            }
            continue;
        }
        // No 2xx: what may each try have left?
        let named: BTreeSet<&str> = tries
            .iter()
            .filter(|r| r.answer.code() == Some("admission_outcome_unknown"))
            .filter_map(|r| r.answer.execution_id())
            .collect();
        let lost = tries
            .iter()
            .filter(|r| matches!(r.answer, Answer::Lost(_)))
            .count();
        let unnamed: Vec<&&str> = exists.iter().filter(|id| !named.contains(**id)).collect();
        let answers: Vec<String> = tries
            .iter()
            .map(|r| format!("{} at {}", r.answer.detail(), rel(r.done, ev.t0)))
            .collect();
        if unnamed.len() > lost {
            v.fail(
                P2,
                format!(
                    "{tenant} nonce {nonce}: answers {answers:?} but executions {unnamed:?} exist \
                     (unnamed by any answer)"
                ),
            );
        }
        // One request leaves at most one execution: its tries share a dedup key, or there is
        // only one try.
        if exists.len() > 1 {
            v.fail(
                P2,
                format!(
                    "{tenant} nonce {nonce} (key {key:?}): answers {answers:?}, executions \
                     {exists:?}"
                ),
            );
        }
    }
    for (nonce, ids) in &found {
        if !by_nonce.contains_key(nonce) {
            v.fail(P2, format!("{ids:?} carry nonce {nonce} no client sent"));
        }
    }
}

/// Whether two runs' effective intervals (`Run::effective`, `[start, end)`) overlap. A run
/// that began only after its lease deadline (its worker paused between the start call and the
/// handler) has an empty interval: nothing it did could be accepted, so it overlaps nothing.
fn held_together((sa, ea): (u64, u64), (sb, eb): (u64, u64)) -> bool {
    sa < ea && sb < eb && sa < eb && sb < ea
}

/// The checker's overlap rule on the cases that matter: overlapping runs are caught, runs
/// that only touch are not, and a run whose handler began after its lease deadline (an empty
/// interval, even one that lies inside another run's) overlaps nothing.
#[test]
fn an_empty_effective_interval_overlaps_nothing() {
    let run = |start: u64, end: Option<(u64, u64)>| Run {
        id: "e".into(),
        tenant: "t".into(),
        fence: 1,
        attempt: 1,
        pid: 7,
        start,
        end: end.map(|(t, lease_deadline)| RunEnd {
            t,
            lease_deadline,
            how: "completed".into(),
        }),
    };
    let gone = HashMap::new();
    // Began at 500 with its lease running out at 400: empty, inside [0, 1000).
    let late = run(500, Some((600, 400))).effective(&gone);
    assert_eq!(late, (500, 500));
    let long = run(0, Some((1000, 1200))).effective(&gone);
    assert_eq!(long, (0, 1000));
    assert!(!held_together(late, long));
    assert!(!held_together(long, late));
    // Ended by its lease deadline, not its report; then a second run overlaps it.
    let cut = run(0, Some((900, 300))).effective(&gone);
    assert_eq!(cut, (0, 300));
    assert!(held_together(cut, (200, 400)));
    assert!(!held_together(cut, (300, 400)));
    // No end seen, its worker gone at 250: held until then.
    let gone = HashMap::from([(7, 250)]);
    assert_eq!(run(100, None).effective(&gone), (100, 250));
    assert!(held_together(run(100, None).effective(&gone), (240, 260)));
}

/// Property 3: runs of one execution, from the journal.
fn check_runs(ev: &Evidence<'_>, v: &mut Verdict) {
    let mut by_id: BTreeMap<&str, Vec<&Run>> = BTreeMap::new();
    for r in &ev.journal.runs {
        by_id.entry(&r.id).or_default().push(r);
    }
    for (id, runs) in &by_id {
        let mut fences: BTreeMap<u64, usize> = BTreeMap::new();
        for r in runs {
            *fences.entry(r.fence).or_default() += 1;
        }
        for (fence, n) in &fences {
            if *n > 1 {
                v.fail(P3, format!("{id}: fence {fence} started {n} times"));
            }
        }
        for (i, a) in runs.iter().enumerate() {
            for b in &runs[i + 1..] {
                if held_together(a.effective(ev.gone), b.effective(ev.gone)) {
                    v.fail(
                        P3,
                        format!(
                            "{id}: runs overlap while both held the lease: {} and {}",
                            a.describe(ev.gone, ev.t0),
                            b.describe(ev.gone, ev.t0)
                        ),
                    );
                }
            }
        }
    }
    // The intervals above trust each run's lease deadline; that holds because a worker stops a
    // handler once it cannot prove its lease. A run may end later only when its worker was
    // stopped across the deadline (it acts on SIGCONT).
    for r in &ev.journal.runs {
        let Some(end) = &r.end else { continue };
        if end.t <= end.lease_deadline + STOP_SLACK_MS {
            continue;
        }
        let paused = ev.faults.iter().any(|f| {
            f.kind == FaultKind::PauseWorker
                && f.pid == r.pid
                && f.from <= end.lease_deadline + STOP_SLACK_MS
                && end.t <= f.to + STOP_SLACK_MS
        });
        if !paused {
            v.fail(
                P3,
                format!(
                    "{}: run ended {} ms after its lease deadline, its worker not paused: {}",
                    r.id,
                    end.t - end.lease_deadline,
                    r.describe(ev.gone, ev.t0)
                ),
            );
        }
    }
    for (id, e) in &ev.fin.execs {
        if e["status"] != "completed" {
            continue;
        }
        let out = &e["output"];
        let Some(fence) = out["fence"].as_u64() else {
            v.fail(
                P3,
                format!("{id}: completed without a fence in its output: {out}"),
            );
            continue;
        };
        if out["nonce"] != e["params"]["nonce"] {
            v.fail(P3, format!("{id}: output {out} for params {}", e["params"]));
        }
        let runs = by_id.get(id.as_str()).cloned().unwrap_or_default();
        let highest = runs.iter().map(|r| r.fence).max();
        if highest != Some(fence) {
            v.fail(
                P3,
                format!(
                    "{id}: completed with fence {fence} but the highest fence started is \
                     {highest:?}; runs: {}",
                    runs.iter()
                        .map(|r| r.describe(ev.gone, ev.t0))
                        .collect::<Vec<_>>()
                        .join("; ")
                ),
            );
            continue;
        }
        let accepted = runs.iter().find(|r| r.fence == fence).expect("highest run");
        if accepted.attempt != out["attempt"].as_u64().unwrap_or(0)
            || accepted.end.as_ref().is_none_or(|e| e.how != "ok")
        {
            v.fail(
                P3,
                format!(
                    "{id}: output {out} but that run is {}",
                    accepted.describe(ev.gone, ev.t0)
                ),
            );
        }
    }
}

/// Property 4: accepted cancels are final unless retried after.
fn check_cancels(ev: &Evidence<'_>, v: &mut Verdict) {
    for c in ev.log {
        let Op::Cancel { tenant, id } = &c.op else {
            continue;
        };
        let b = c.answer.body();
        let accepted = c.answer.status() == Some(200)
            && (b["cancel_requested"] == true || b["status"] == "cancelled")
            && !matches!(b["status"].as_str(), Some("completed" | "failed"));
        if !accepted {
            continue;
        }
        let retried = ev.log.iter().any(|r| {
            matches!(&r.op, Op::Retry { id: rid, .. } if rid == id)
                && !r.answer.is_refusal()
                && r.done >= c.sent
        });
        if retried {
            continue;
        }
        let Some(e) = ev.fin.execs.get(id) else {
            continue; // gone: property 1 says so if it was acknowledged
        };
        if e["status"] != "cancelled" {
            v.fail(
                P4,
                format!(
                    "{tenant}/{id}: cancel answered {} at {} (status {}), ends {} (attempt {}, \
                     output {})",
                    c.answer.label(),
                    rel(c.done, ev.t0),
                    b["status"],
                    e["status"],
                    e["attempt"],
                    e["output"]
                ),
            );
        }
    }
}

/// One `max_concurrent` setting and when it may have taken effect.
struct LimitChange {
    sent: u64,
    /// Latest instant it may take effect (its answer; +10 s when the answer was lost).
    latest: u64,
    /// When it was acknowledged (2xx).
    acked: Option<u64>,
    value: u64,
}

/// The highest limit that may have been in force at some instant of `[lo, t]`.
fn limit_bound(changes: &[LimitChange], lo: u64, t: u64) -> u64 {
    changes
        .iter()
        .filter(|p| p.sent <= t)
        .filter(|p| {
            // Certainly overwritten by `lo`: a change sent after p's latest effect was
            // acknowledged by then.
            !changes
                .iter()
                .any(|q| q.acked.is_some_and(|d| d <= lo) && q.sent >= p.latest && q.sent > p.sent)
        })
        .map(|p| p.value)
        .max()
        .unwrap_or(DEFAULT_MAX_CONCURRENT)
}

/// Property 5, and the concurrency table of the report.
fn check_limits(ev: &Evidence<'_>, v: &mut Verdict, report: &mut String) {
    // Each execution was admitted, and got its slot, after the first try of the request that
    // carries its nonce was sent (whichever try admitted it, named or not).
    let mut first_try: HashMap<&str, u64> = HashMap::new();
    for r in ev.log {
        if let Op::Admit { nonce, .. } = &r.op {
            let at = first_try.entry(nonce).or_insert(r.sent);
            *at = (*at).min(r.sent);
        }
    }
    let admitted: HashMap<&str, u64> = ev
        .fin
        .execs
        .iter()
        .filter_map(|(id, e)| {
            let nonce = e["params"]["nonce"].as_str()?;
            Some((id.as_str(), *first_try.get(nonce)?))
        })
        .collect();
    for t in TENANTS {
        let mut changes = vec![LimitChange {
            sent: 0,
            latest: 0,
            acked: Some(0),
            value: DEFAULT_MAX_CONCURRENT,
        }];
        for r in ev.log {
            if let Op::Limit {
                tenant,
                max_concurrent,
            } = &r.op
                && tenant == t
                && !r.answer.is_refusal()
            {
                let acked = r.answer.is_2xx().then_some(r.done);
                changes.push(LimitChange {
                    sent: r.sent,
                    latest: if acked.is_some() {
                        r.done
                    } else {
                        r.done + LATE_EFFECT_MS
                    },
                    acked,
                    value: *max_concurrent,
                });
            }
        }
        let max_set = changes.iter().skip(1).map(|c| c.value).max().unwrap_or(0);
        let mut runs: Vec<(u64, u64, &str)> = ev
            .journal
            .runs
            .iter()
            .filter(|r| r.tenant == t)
            .map(|r| {
                let (s, e) = r.effective(ev.gone);
                (s, e, r.id.as_str())
            })
            .filter(|(s, e, _)| e > s)
            .collect();
        runs.sort();
        let mut peak = 0;
        let mut over = 0;
        for &(s, _, _) in &runs {
            let active: BTreeSet<&str> = runs
                .iter()
                .filter(|(s2, e2, _)| *s2 <= s && s < *e2)
                .map(|(_, _, id)| *id)
                .collect();
            let k = active.len() as u64;
            peak = peak.max(k);
            let lo = active
                .iter()
                .map(|id| admitted.get(id).copied().unwrap_or(0))
                .max()
                .unwrap_or(0);
            let bound = limit_bound(&changes, lo, s);
            if k > bound {
                over += 1;
                v.fail(
                    P5,
                    format!(
                        "{t}: {k} executions running at {} (limit at most {bound} since {}): \
                         {active:?}",
                        rel(s, ev.t0),
                        rel(lo, ev.t0)
                    ),
                );
            }
        }
        let _ = writeln!(
            report,
            "  {t}: peak {peak} handlers at once; highest limit set {max_set}; \
             {over} start(s) over the limit in force"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The test

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guarantees_hold_under_faults() {
    // This suite kills and pauses the one redis-server it starts; the cluster's own faults
    // (a master killed, failed over, a slot moved) are tested in `cluster.rs`.
    if crate::helpers::cluster_mode() {
        println!("faults: standalone only (SLUICE_TEST_CLUSTER=1 is set); skipped");
        return;
    }
    let settings = Settings::from_env();
    let began = Instant::now();
    let t0 = now_ms();
    let mut rng = Rng::new(settings.seed);
    let dir = tempfile::tempdir().expect("temp dir");
    println!(
        "faults: seed {} (SLUICE_FAULT_SEED), {} s of faults (SLUICE_FAULT_SECS), files in {}",
        settings.seed,
        settings.chaos.as_secs(),
        dir.path().display()
    );

    let (deployment, api) = start_deployment(dir.path()).await;
    let redis_url = deployment.at.redis_url();
    let journal_path = deployment.at.journal.clone();
    let deployment = Arc::new(AsyncMutex::new(deployment));

    let cs = Arc::new(Clients {
        api: api.clone(),
        seed: settings.seed,
        until: Instant::now() + settings.chaos,
        log: Mutex::default(),
        known: Mutex::default(),
        ended: Mutex::default(),
        plans: Mutex::default(),
        journal: journal_path.clone(),
    });
    for t in TENANTS {
        let n = rng.between(1, 3);
        let mut body = json!({"max_concurrent": n, "max_queued": MAX_QUEUED, "weight": weight_of(t),
            "max_concurrent_per_key": KEY_LIMIT});
        let (limited, starts, per_ms, burst) = RATE_LIMITED;
        if t == limited {
            body["rate_limit"] =
                json!({"starts": starts, "per": format!("{per_ms}ms"), "burst": burst});
        }
        let ans = set_limit(&cs, t, body, n).await;
        assert!(ans.is_2xx(), "setting up {t}: {ans:?}");
    }
    let startup = began.elapsed();

    // Chaos.
    let stop = CancellationToken::new();
    let lanes = [
        tokio::spawn(worker_faults(
            deployment.clone(),
            cs.clone(),
            rng.fork(),
            stop.clone(),
        )),
        tokio::spawn(infra_faults(
            deployment.clone(),
            api.clone(),
            rng.fork(),
            stop.clone(),
        )),
    ];
    let clients: Vec<_> = (0..CLIENTS)
        .map(|n| tokio::spawn(client(cs.clone(), n, rng.fork())))
        .collect();
    tokio::time::sleep_until(cs.until.into()).await;
    stop.cancel();
    for lane in lanes {
        lane.await.expect("fault lane");
    }
    heal(&deployment, &api).await;
    for c in clients {
        c.await.expect("client");
    }
    // Raising the limits dispatches the waiting backlog (FIFO) and drains it sooner.
    for t in TENANTS {
        let body = json!({ "max_concurrent": 3 });
        let ans = set_limit(&cs, t, body, 3).await;
        assert!(ans.is_2xx(), "raising the limit of {t}: {ans:?}");
    }
    let chaos_done = began.elapsed();

    // Let the system finish, then let zombie runs notice their lost leases and journal an end.
    let quiesced = quiesce(&api, QUIESCE_LIMIT).await;
    let gone = deployment.lock().await.gone.clone();
    let settle = Instant::now() + Duration::from_millis(LEASE_TTL_MS + 3_000);
    let mut journal = read_journal(&journal_path);
    while open_runs(&journal, &gone) > 0 && Instant::now() < settle {
        tokio::time::sleep(Duration::from_millis(100)).await;
        journal = read_journal(&journal_path);
    }
    let fin = final_state(&api, &redis_url).await;
    let log = cs.log.lock().expect("log").clone();
    let plans = cs.plans.lock().expect("plans").clone();
    let (mut faults, exits) = {
        let mut c = deployment.lock().await;
        c.ensure_running();
        (c.faults.clone(), c.exits.clone())
    };
    faults.sort_by_key(|f| f.from);

    // Report.
    let mut report = String::new();
    let _ = writeln!(
        report,
        "== sluice fault-injection report: seed {}, {} s of faults ==",
        settings.seed,
        settings.chaos.as_secs()
    );
    let _ = writeln!(
        report,
        "time: start-up {:.1} s, faults and heal {:.1} s, quiesce {}, total {:.1} s",
        startup.as_secs_f64(),
        (chaos_done - startup).as_secs_f64(),
        match &quiesced {
            Ok(d) => format!("{:.1} s", d.as_secs_f64()),
            Err(_) => format!("NOT REACHED in {QUIESCE_LIMIT:?}"),
        },
        began.elapsed().as_secs_f64()
    );
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for f in &faults {
        *counts.entry(format!("{:?}", f.kind)).or_default() += 1;
    }
    let long_pauses = faults
        .iter()
        .filter(|f| {
            matches!(f.kind, FaultKind::PauseWorker | FaultKind::PauseRedis)
                && f.to - f.from > LEASE_TTL_MS
        })
        .count();
    let _ = writeln!(
        report,
        "faults: {counts:?}; {long_pauses} pause(s) of a worker or Redis longer than the lease"
    );
    if !exits.is_empty() {
        // A process that gives up starting while Redis is down is expected; one that had been
        // running a while and exited is worth a look (not a checked property).
        let settled = exits.iter().filter(|e| e.ran_ms > 5_000).count();
        let _ = writeln!(
            report,
            "exited unasked and restarted: {} ({settled} after running over 5 s)",
            exits.len()
        );
        let mut shown: Vec<&Exit> = exits.iter().filter(|e| e.ran_ms > 5_000).collect();
        shown.extend(exits.iter().filter(|e| e.ran_ms <= 5_000).take(3));
        for e in shown.into_iter().take(10) {
            let _ = writeln!(
                report,
                "  {} (pid {}) ran {:.1} s, noticed at {}: {}",
                e.name,
                e.pid,
                e.ran_ms as f64 / 1000.0,
                rel(e.at, t0),
                e.last_words.chars().take(300).collect::<String>()
            );
        }
    }
    for (kind, label) in [
        ("admit", "admission tries"),
        ("cancel", "cancels"),
        ("retry", "retries"),
        ("limit", "limit changes"),
    ] {
        let mut by: BTreeMap<String, usize> = BTreeMap::new();
        for r in &log {
            let k = match &r.op {
                Op::Admit { .. } => "admit",
                Op::Cancel { .. } => "cancel",
                Op::Retry { .. } => "retry",
                Op::Limit { .. } => "limit",
            };
            if k == kind {
                let mut label = r.answer.label();
                if k == "cancel" && r.answer.is_2xx() {
                    // What the cancel found: a running execution is the interesting race.
                    let b = r.answer.body();
                    let _ = write!(label, " {}", b["status"].as_str().unwrap_or("?"));
                    if b["cancel_requested"] == true && b["status"] == "running" {
                        label.push_str(" (cancel requested)");
                    }
                }
                *by.entry(label).or_default() += 1;
            }
        }
        let _ = writeln!(report, "{label}: {by:?}");
    }
    let keyed_retries = log
        .iter()
        .filter(|r| matches!(r.op, Op::Admit { try_no, .. } if try_no > 1))
        .count();
    let _ = writeln!(report, "keyed admission re-tries: {keyed_retries}");
    let mut hows: BTreeMap<&str, usize> = BTreeMap::new();
    let (mut clipped, mut renewed) = (0, 0);
    for r in &journal.runs {
        *hows
            .entry(
                r.end
                    .as_ref()
                    .map_or("no end (worker killed)", |e| e.how.as_str()),
            )
            .or_default() += 1;
        if r.end.as_ref().is_some_and(|e| e.lease_deadline < e.t) {
            clipped += 1;
        }
        let (s, e) = r.effective(&gone);
        if e - s > LEASE_TTL_MS {
            renewed += 1;
        }
    }
    let _ = writeln!(
        report,
        "runs journaled: {} {hows:?}; {renewed} outlived the lease on heartbeats; {clipped} \
         ended after losing their lease (zombies); {} bad journal line(s)",
        journal.runs.len(),
        journal.bad_lines.len()
    );
    let mut statuses: BTreeMap<String, usize> = BTreeMap::new();
    for e in fin.execs.values() {
        let status = e["status"].as_str().unwrap_or("?").to_owned();
        *statuses.entry(status).or_default() += 1;
    }
    let _ = writeln!(
        report,
        "executions at the end: {} {statuses:?}",
        fin.execs.len()
    );
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    for d in &fin.dead_letters {
        let reason = d["reason"].as_str().unwrap_or("?").to_owned();
        *reasons.entry(reason).or_default() += 1;
    }
    let _ = writeln!(
        report,
        "dead letters: {} {reasons:?}",
        fin.dead_letters.len()
    );
    let _ = writeln!(report, "shard counters: {:?}", fin.counters);
    let _ = writeln!(report, "concurrency per tenant:");

    let ev = Evidence {
        t0,
        log: &log,
        fin: &fin,
        journal: &journal,
        gone: &gone,
        faults: &faults,
        quiesced: &quiesced,
        plans: &plans,
    };
    let mut verdict = check(&ev, &mut report);
    let scheduled = plans.values().filter(|p| p.delay.is_some()).count();
    let starts: usize = fin.start_logs.values().map(Vec::len).sum();
    let _ = writeln!(
        report,
        "scheduled admissions: {scheduled}; starts in the shards' start logs: {starts}"
    );
    if journal.runs.is_empty() {
        verdict.fail(
            P3,
            format!("the workers journaled no run: does this build have the {FLOW} flow?"),
        );
    }
    for line in journal.bad_lines.iter().take(EXAMPLES) {
        verdict.fail(P3, format!("journal line not understood: {line}"));
    }
    let summary = verdict.summary();
    if summary.is_empty() {
        let _ = writeln!(report, "all properties hold");
    } else {
        // The timeline, to read the violations' times against.
        let _ = writeln!(report, "fault timeline (times from the start of the test):");
        for f in &faults {
            let _ = writeln!(
                report,
                "  {} .. {} {:?} {} (pid {})",
                rel(f.from, t0),
                rel(f.to, t0),
                f.kind,
                f.target,
                f.pid
            );
        }
        let _ = write!(report, "VIOLATIONS\n{summary}");
    }
    println!("{report}");

    drop(deployment);
    if !summary.is_empty() {
        let kept = dir.keep();
        panic!(
            "fault injection (seed {}) found violations; logs and journal kept in {}\n{summary}",
            settings.seed,
            kept.display()
        );
    }
}
