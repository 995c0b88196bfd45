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
//! 13. **Dedup mappings where they belong.** With everything ended, no dedup bucket holds a
//!     field and every string mapping has its TTL (`helpers::dedup_orphans`), and the
//!     sweeper repaired none (`repaired_dedup` 0): no end of an execution, however
//!     interrupted, left its mapping live.
//!
//! The report also counts admissions by answer, faults by kind, runs (by how they ended, and
//! how many lost their lease before ending), executions by final status, dead letters by reason,
//! shard counters (`fenced`, `reclaimed`, ...) and the highest concurrency seen per tenant.
//! Every violation is listed (up to 25 examples per property) in one assertion message. On
//! failure the processes' logs and the journal are kept, and their folder is printed.
//!
//! # Where the harness lives
//!
//! This file holds the settings and the test; the harness is in `faults/`: the processes
//! (`deployment.rs`), the fault lanes (`inject.rs`), the clients (`load.rs`), what the system
//! holds at the end (`end_state.rs`), the workers' journal (`journal.rs`), the properties
//! (`checker.rs` and `checker/runs.rs`) and the report (`report.rs`).

mod checker;
mod deployment;
mod end_state;
mod inject;
mod journal;
mod load;
mod report;

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::json;
use tokio::sync::Mutex as AsyncMutex;
use tokio_util::sync::CancellationToken;

use checker::{Evidence, P3, check};
use deployment::{heal, start_deployment};
use end_state::{final_state, quiesce};
use inject::{infra_faults, worker_faults};
use journal::{open_runs, read_journal};
use load::{Clients, client, set_limit};

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

/// The weight each tenant is given at setup.
fn weight_of(tenant: &str) -> u64 {
    match tenant {
        "chaos-a" => 1,
        "chaos-b" => 2,
        _ => 5,
    }
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

    // Report and verdict (the checker adds its lines to the report).
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
    let mut report = String::new();
    report::overview(
        &mut report,
        &settings,
        &ev,
        &exits,
        began,
        startup,
        chaos_done,
    );
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
    report::conclusion(&mut report, &summary, &faults, t0);
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
