//! `sluice-bench`: the benchmark of sluice's speed targets, measured in one run on loopback.
//!
//! It starts its own `redis-server` (no persistence) — or, with `--cluster`, a local Redis
//! Cluster of `--cluster-masters` masters — and `sluice serve` (and, for the end-to-end phase,
//! `sluice worker` processes) from the `sluice` binary next to its own, then runs these phases,
//! each from an empty Redis and each bounded in time:
//!
//! 1. **ceiling**: `admit.lua` called directly (sluice's `Store::admit`), 64 in flight;
//! 2. **admission**: `POST /api/executions` over 64 keep-alive connections, unique keys;
//! 3. **replay mix**: the same with 10 % replays of earlier keys;
//! 4. **fixed rate**: open loop at 50 % of the admission maximum, latency from the schedule;
//! 5. **end-to-end**: `demo.echo` admitted over HTTP and completed by workers; then again
//!    completed by pull workers over HTTP (`--pull-workers` in this process, `/api/worker/*`);
//! 6. **memory**: Redis `used_memory` per queued execution at 100k executions;
//!
//! and the wake-up phases (`push.rs`), each with sluice's DEFAULT worker
//! settings so they measure whatever pickup and cancel the worker in the tree has:
//!
//! 7. **pickup**: one default worker, `demo.echo` admitted at an idle rate, a fixed rate and
//!    50 % of the admission maximum; row `started` − `created`; and the **BullMQ peer**
//!    (`bullmq.rs`, `bench/bullmq/`) at the same rates on a Redis of its own, side by side;
//! 8. **cancel**: running `demo.sleep` executions cancelled, until their rows are `cancelled`;
//! 9. **idle**: the calls an idle default worker sends to Redis (`serve` stopped).
//!
//! `--push-only` runs only 7–9; `--skip-pickup`, `--skip-bullmq`, `--skip-cancel`,
//! `--skip-idle` leave one out. Then the fairness group (`fairness.rs`, issue 20):
//!
//! 10. **noisy neighbour**: a flood tenant keeps one worker of concurrency 8 busy for 30 s
//!     while a calm tenant of the same shard admits 4/s; both tenants' pickup, and the BullMQ
//!     peer's single queue in the same run beside it;
//! 11. **weighted share**: two backlogged tenants of weights 1 and 3, their shares of the first
//!     2,000 starts (the shard's start log);
//! 12. **scheduled-start lateness**: executions admitted with `delay`, started − due.
//!
//! `--fairness-only` runs only 10–12, `--skip-fairness` leaves them out. Then the limits group
//! (`limits.rs`: concurrency keys and rate limits):
//!
//! 13. **throttle accuracy**: a tenant with `rate_limit` 200/s, burst 20, drains a backlog of
//!     2 000 with one worker; from the start log, the most starts in any second (at most rate +
//!     burst, a correctness check) and the steady rate after the burst (target ≥ 95 %);
//! 14. **key isolation**: key A of a tenant with `max_concurrent_per_key` 1 has 10 000 queued
//!     `demo.sleep` executions, key B admits 10/s beside it: B's pickup, and A never more than
//!     one at a time.
//!
//! `--limits-only` runs only 13–14, `--skip-limits` leaves them out; `--admission-keys N` gives
//! the admission phase (2) a `concurrency_key` on every request. `--compare-builds BEFORE
//! AFTER` runs none of the above: it measures two builds of `sluice` against each other
//! (`compare.rs`: HTTP admission and end-to-end, alternating runs, medians); `--compare-keyed`
//! neither: it measures HTTP admission on this build without and with concurrency keys
//! (`limits.rs`: alternating runs, medians, keyed / plain).
//!
//! After every phase it checks what Redis holds against what the clients were told; the
//! report says so and the exit status is non-zero when a check fails. On a cluster the report
//! adds each master's admissions/s and script CPU; `--compare-standalone` runs the standalone
//! and the cluster benchmark one after the other and prints both with a comparison table. It
//! is a program with a report, never part of `cargo test`; `--smoke` runs it for a few seconds
//! in CI so it cannot rot.

mod bullmq;
mod compare;
mod direct;
mod fairness;
mod limits;
mod load;
mod procs;
mod push;
mod report;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use sluice::config::{ApiSettings, RedisSettings};
use sluice::store::{RedisTarget, StoreConfig};

use direct::{Census, Direct, Until};
use load::{LoadResult, Progress, Workload};
use procs::{Proc, Scratch, SluiceCmd};
use report::{
    Check, Comparison, CpuShare, E2e, FixedRate, Master, MasterShare, Memory, MemoryPoint, Phase,
    Pickup, PickupRate, Report,
};

/// Quotas high enough that admission never rejects: every execution is dispatched at once.
const UNLIMITED: u32 = 1_000_000_000;
/// The platform admin token of the benchmark's own server (loopback only, never exposed).
const ADMIN_TOKEN: &str = "sluice-bench-admin-token";

/// Measure sluice's admission and end-to-end speed against its own Redis and processes.
#[derive(Debug, Clone, Parser)]
#[command(name = "sluice-bench", version)]
pub struct Args {
    /// Print the report as JSON (progress still goes to stderr).
    #[arg(long)]
    json: bool,
    /// A few seconds in all, small counts: checks that the benchmark works, measures nothing.
    #[arg(long)]
    smoke: bool,
    /// Exit non-zero also when a speed target is missed (correctness always counts).
    #[arg(long)]
    strict: bool,
    /// Concurrent clients (connections, or direct calls in flight) in every phase.
    #[arg(long, default_value_t = 64)]
    clients: usize,
    /// Tenants the load is spread over.
    #[arg(long, default_value_t = 8)]
    tenants: usize,
    /// Seconds of the ceiling phase.
    #[arg(long, default_value_t = 6)]
    ceiling_secs: u64,
    /// Seconds of the HTTP admission phase (unique keys).
    #[arg(long, default_value_t = 8)]
    admission_secs: u64,
    /// Seconds of the HTTP admission phase with a tenant API key per tenant instead of the
    /// admin token (how many `{acl}` lookups an admission costs); 0 skips it.
    #[arg(long, default_value_t = 4)]
    api_key_secs: u64,
    /// Seconds of the HTTP admission phase with replays.
    #[arg(long, default_value_t = 6)]
    replay_secs: u64,
    /// Share of replayed keys in the replay phase, percent.
    #[arg(long, default_value_t = 10)]
    replay_percent: u64,
    /// Seconds of the fixed-rate phase.
    #[arg(long, default_value_t = 8)]
    fixed_rate_secs: u64,
    /// Seconds of each batch admission phase (batches alone; then one tenant's batches beside
    /// the other tenants' single admissions at the fixed rate); 0 skips them.
    #[arg(long, default_value_t = 4)]
    batch_secs: u64,
    /// Items per batch in the batch admission phases (1..=1000).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=1000))]
    batch_size: u64,
    /// Rate of the fixed-rate phase as a share of the measured admission maximum.
    #[arg(long, default_value_t = 0.5)]
    fixed_rate_share: f64,
    /// Seconds of admitting in the end-to-end phase.
    #[arg(long, default_value_t = 8)]
    e2e_secs: u64,
    /// Most seconds to wait afterwards for the workers to complete what was admitted.
    #[arg(long, default_value_t = 30)]
    e2e_drain_secs: u64,
    /// `sluice worker` processes in the end-to-end phase.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// `--concurrency` of each worker. High, because `demo.echo` holds nothing while it runs
    /// and a slot stays busy for the start and completion round trips, which queue behind the
    /// admissions on Redis: with 64 per worker the workers fall behind the admissions.
    #[arg(long, default_value_t = 256)]
    worker_concurrency: usize,
    /// Executions queued for the memory measurement.
    #[arg(long, default_value_t = 100_000)]
    memory_count: u64,
    /// Most seconds each memory fill may take (fewer executions are then measured).
    #[arg(long, default_value_t = 30)]
    memory_max_secs: u64,
    /// Multiplexed Redis connections of every sluice process and of the direct phases (sluice's
    /// own default).
    #[arg(long, default_value_t = 2)]
    redis_connections: usize,
    /// The redis-server program.
    #[arg(long, default_value = "redis-server")]
    redis_server: PathBuf,
    /// The sluice program (default: `sluice` next to this binary).
    #[arg(long)]
    sluice: Option<PathBuf>,
    /// Threads of the benchmark's own runtime (the load generator). One keeps it from
    /// competing with the server for the CPU more than it must; raise it on bigger machines.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Runtime threads of `sluice serve` (`TOKIO_WORKER_THREADS`); 0 = one per CPU, sluice's
    /// default. On a small machine that also runs Redis and the load generator, 1 wakes less
    /// and batches more: more admissions per second, but a longer tail at the fixed rate.
    #[arg(long, default_value_t = 0)]
    serve_threads: usize,
    /// Runtime threads of each `sluice worker`; 0 = one per CPU.
    #[arg(long, default_value_t = 0)]
    worker_threads: usize,
    /// Run on a local Redis Cluster (masters only, no persistence) instead of one
    /// redis-server: sluice gets `--redis-cluster`, and the report adds each master's share.
    #[arg(long)]
    cluster: bool,
    /// Masters of the `--cluster` cluster.
    #[arg(long, default_value_t = 3)]
    cluster_masters: usize,
    /// Run the whole benchmark twice, on one redis-server and then on the cluster
    /// (`--cluster-masters`), and print both reports and a comparison table.
    #[arg(long, conflicts_with = "cluster")]
    compare_standalone: bool,

    // Issue 12's phases (push, not poll): pickup (+ the BullMQ peer), cancel, idle.
    /// Run only the wake-up phases (pickup, the BullMQ peer, cancel, idle), none of the others.
    #[arg(long)]
    push_only: bool,
    /// Skip the pickup phase (and with it the BullMQ peer).
    #[arg(long)]
    skip_pickup: bool,
    /// Skip the BullMQ peer of the pickup phase.
    #[arg(long)]
    skip_bullmq: bool,
    /// Skip the cancel phase.
    #[arg(long)]
    skip_cancel: bool,
    /// Skip the idle-cost phase.
    #[arg(long)]
    skip_idle: bool,
    /// Pull workers (HTTP clients of `/api/worker/*`, in this process) of the end-to-end
    /// phase's pull run; 0 skips that run.
    #[arg(long, default_value_t = 16)]
    pull_workers: usize,
    /// Executions each pull worker leases per call (its concurrency).
    #[arg(long, default_value_t = 32)]
    pull_batch: usize,
    /// The pickup phase's idle rate, admissions per second.
    #[arg(long, default_value_t = 2.0)]
    pickup_idle_rate: f64,
    /// Seconds at the idle rate (20 s at 2/s: 40 samples, enough for a p99 to mean something).
    #[arg(long, default_value_t = 20.0)]
    pickup_idle_secs: f64,
    /// The pickup phase's fixed rate, admissions per second (0 skips it).
    #[arg(long, default_value_t = 50.0)]
    pickup_rate: f64,
    /// Seconds at the fixed rate and at the share of the maximum.
    #[arg(long, default_value_t = 5.0)]
    pickup_secs: f64,
    /// The third rate as a share of the HTTP admission maximum (measured by the admission
    /// phase of this run, or by a short probe when it is skipped); 0 skips it.
    #[arg(long, default_value_t = 0.5)]
    pickup_max_share: f64,
    /// Seconds of the admission probe that stands in for a skipped admission phase.
    #[arg(long, default_value_t = 3)]
    pickup_probe_secs: u64,
    /// Most seconds to wait after each rate for everything admitted to complete.
    #[arg(long, default_value_t = 30)]
    pickup_drain_secs: u64,
    /// Milliseconds between a worker's start and the first admission (a polling worker
    /// reaches its idle pause by then, a push worker its blocking reads).
    #[arg(long, default_value_t = 2000)]
    pickup_settle_ms: u64,
    /// The `node` program for the BullMQ peer.
    #[arg(long, default_value = "node")]
    node: PathBuf,
    /// Where the BullMQ peer is installed (`npm ci` of bench/bullmq; default:
    /// `bench-bullmq` in the cargo target folder, where scripts/bench.sh installs it).
    #[arg(long, env = "SLUICE_BENCH_BULLMQ_DIR")]
    bullmq_dir: Option<PathBuf>,
    /// Running executions cancelled in the cancel phase.
    #[arg(long, default_value_t = 32)]
    cancel_samples: usize,
    /// The cancels are sent spread evenly over this many milliseconds.
    #[arg(long, default_value_t = 3000)]
    cancel_spread_ms: u64,
    /// Most seconds after the last cancel for the handlers to stop.
    #[arg(long, default_value_t = 15)]
    cancel_timeout_secs: u64,
    /// `ms` of the `demo.sleep` executions cancelled (longer than the phase).
    #[arg(long, default_value_t = 60_000)]
    cancel_sleep_ms: u64,
    /// Seconds the idle worker's calls are counted.
    #[arg(long, default_value_t = 10)]
    idle_secs: u64,
    /// Milliseconds between the idle worker's start and the measurement.
    #[arg(long, default_value_t = 3000)]
    idle_settle_ms: u64,

    // Issue 20's fairness group: noisy neighbour (+ the BullMQ peer), weighted share,
    // scheduled-start lateness (`fairness.rs`).
    /// Run only the fairness group, none of the other phases.
    #[arg(long, conflicts_with_all = ["push_only", "skip_fairness"])]
    fairness_only: bool,
    /// Skip the fairness group.
    #[arg(long)]
    skip_fairness: bool,
    /// `--concurrency` of the noisy-neighbour phase's one worker.
    #[arg(long, default_value_t = 8)]
    noisy_concurrency: usize,
    /// Length of every noisy-neighbour execution (`demo.sleep`), ms.
    #[arg(long, default_value_t = 20)]
    noisy_exec_ms: u64,
    /// Seconds the flood keeps the worker busy: it admits concurrency × this ÷ the execution
    /// length executions (8 × 30 s ÷ 20 ms = 12 000).
    #[arg(long, default_value_t = 30.0)]
    noisy_flood_secs: f64,
    /// The calm tenant's admissions per second.
    #[arg(long, default_value_t = 4.0)]
    noisy_calm_rate: f64,
    /// The calm tenant's admissions in all (100 at 4/s: 25 s, inside the flood).
    #[arg(long, default_value_t = 100)]
    noisy_calm_samples: u64,
    /// Executions each weighted tenant has queued before the worker starts.
    #[arg(long, default_value_t = 2000)]
    weighted_backlog: u64,
    /// The first starts whose shares are counted.
    #[arg(long, default_value_t = 2000)]
    weighted_window: u64,
    /// Scheduled executions of the lateness phase.
    #[arg(long, default_value_t = 200)]
    lateness_samples: u64,
    /// Their delays are spread evenly over this many milliseconds ...
    #[arg(long, default_value_t = 3000)]
    lateness_spread_ms: u64,
    /// ... after this many (so every one is admitted before it is due).
    #[arg(long, default_value_t = 1000)]
    lateness_lead_ms: u64,

    // The limits group (concurrency keys and rate limits, `limits.rs`): throttle accuracy and
    // key isolation; and `--compare-keyed`.
    /// Run only the limits group (throttle accuracy, key isolation), none of the other phases.
    #[arg(long, conflicts_with_all = ["push_only", "fairness_only", "skip_limits"])]
    limits_only: bool,
    /// Skip the limits group.
    #[arg(long)]
    skip_limits: bool,
    /// The throttled tenant's `rate_limit`: starts per second.
    #[arg(long, default_value_t = 200)]
    throttle_rate: u32,
    /// Its `burst`: starts at once after an idle spell (any second may hold rate + burst).
    #[arg(long, default_value_t = 20)]
    throttle_burst: u32,
    /// Seconds of backlog: rate × this executions are queued before the worker starts (200 ×
    /// 10 = 2 000).
    #[arg(long, default_value_t = 10.0)]
    throttle_secs: f64,
    /// `--concurrency` of the throttle phase's one worker.
    #[arg(long, default_value_t = 64)]
    throttle_concurrency: usize,
    /// Key A's executions in the key-isolation phase (`demo.sleep`, queued before key B's
    /// samples; the phase does not wait for them).
    #[arg(long, default_value_t = 10_000)]
    key_isolation_backlog: u64,
    /// Length of each of key A's executions, ms.
    #[arg(long, default_value_t = 50)]
    key_isolation_exec_ms: u64,
    /// Key B's executions (`demo.echo`), whose pickup is measured ...
    #[arg(long, default_value_t = 100)]
    key_isolation_samples: u64,
    /// ... admitted at this rate, per second.
    #[arg(long, default_value_t = 10.0)]
    key_isolation_rate: f64,
    /// `--concurrency` of the key-isolation phase's one worker.
    #[arg(long, default_value_t = 8)]
    key_isolation_concurrency: usize,
    /// Every request of the admission phase carries a `concurrency_key`, one of N per tenant
    /// (every tenant with `max_concurrent_per_key` `--admission-key-limit`); also the keyed
    /// side of `--compare-keyed` (default there: 1000). 0 = none.
    #[arg(long, value_name = "N")]
    admission_keys: Option<u64>,
    /// Every tenant's `max_concurrent_per_key` when admissions carry keys.
    #[arg(long, default_value_t = 10)]
    admission_key_limit: u32,

    /// Instead of the phases: compare two builds of `sluice` (each a program, or a folder
    /// holding `sluice`), BEFORE then AFTER: HTTP admission and end-to-end, `--compare-runs`
    /// alternating runs per build, medians of throughput and of Redis's script time per call.
    #[arg(
        long,
        num_args = 2,
        value_names = ["BEFORE", "AFTER"],
        conflicts_with_all = ["compare_standalone", "cluster"]
    )]
    compare_builds: Option<Vec<PathBuf>>,
    /// Instead of the phases: HTTP admission on this build without concurrency keys (plain)
    /// and with them (keyed: `--admission-keys`, 1000 by default, per tenant, each tenant with
    /// `max_concurrent_per_key` `--admission-key-limit`), `--compare-runs` alternating runs per
    /// side of `--compare-secs`, each on a fresh Redis; medians and keyed / plain (target ≥
    /// 0.85).
    #[arg(long, conflicts_with_all = ["compare_standalone", "cluster", "compare_builds"])]
    compare_keyed: bool,
    /// Runs per build of `--compare-builds` (per side of `--compare-keyed`).
    #[arg(long, default_value_t = 5)]
    compare_runs: usize,
    /// Seconds of each phase of each `--compare-builds` (`--compare-keyed`) run.
    #[arg(long, default_value_t = 5)]
    compare_secs: u64,
}

impl Args {
    /// Concurrency keys per tenant of the admission phase (`--admission-keys`; 0 is none).
    fn admission_keys(&self) -> Option<u64> {
        self.admission_keys.filter(|n| *n > 0)
    }

    fn smoke_sized(mut self) -> Self {
        if self.smoke {
            self.clients = self.clients.min(16);
            self.ceiling_secs = 1;
            self.admission_secs = 1;
            self.api_key_secs = self.api_key_secs.min(1);
            self.replay_secs = 1;
            self.fixed_rate_secs = 1;
            self.batch_secs = self.batch_secs.min(1);
            self.batch_size = self.batch_size.min(100);
            self.e2e_secs = 1;
            self.e2e_drain_secs = self.e2e_drain_secs.min(20);
            self.workers = 1;
            self.pull_workers = self.pull_workers.min(2);
            self.memory_count = self.memory_count.min(2_000);
            self.pickup_idle_secs = self.pickup_idle_secs.min(0.5);
            self.pickup_secs = self.pickup_secs.min(0.5);
            self.pickup_probe_secs = 1;
            self.pickup_drain_secs = self.pickup_drain_secs.min(10);
            self.pickup_settle_ms = self.pickup_settle_ms.min(100);
            self.cancel_samples = self.cancel_samples.min(2);
            self.cancel_spread_ms = self.cancel_spread_ms.min(100);
            self.cancel_timeout_secs = self.cancel_timeout_secs.min(10);
            self.idle_secs = 1;
            self.idle_settle_ms = self.idle_settle_ms.min(300);
            // 8 × 0.5 s ÷ 20 ms = 200 flood executions, 4 calm ones in half a second.
            self.noisy_flood_secs = self.noisy_flood_secs.min(0.5);
            self.noisy_calm_samples = self.noisy_calm_samples.min(4);
            self.noisy_calm_rate = self.noisy_calm_rate.max(8.0);
            self.weighted_backlog = self.weighted_backlog.min(100);
            self.weighted_window = self.weighted_window.min(100);
            self.lateness_samples = self.lateness_samples.min(10);
            self.lateness_spread_ms = self.lateness_spread_ms.min(300);
            self.lateness_lead_ms = self.lateness_lead_ms.min(300);
            // 200/s × 0.5 s = 100 throttled starts; 100 of key A, 4 of key B in 0.2 s.
            self.throttle_secs = self.throttle_secs.min(0.5);
            self.key_isolation_backlog = self.key_isolation_backlog.min(100);
            self.key_isolation_samples = self.key_isolation_samples.min(4);
            self.key_isolation_rate = self.key_isolation_rate.max(20.0);
            self.compare_secs = 1;
        }
        self
    }
}

fn main() -> ExitCode {
    let args = Args::parse().smoke_sized();
    let runtime = if args.threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(args.threads)
            .enable_all()
            .build()
    };
    match runtime {
        Ok(rt) => rt.block_on(bench_main(args)),
        Err(e) => {
            eprintln!("sluice-bench: cannot start the runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn bench_main(args: Args) -> ExitCode {
    // Returning from `run` (or dropping it here on a signal) kills every child process.
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("sluice-bench: cannot watch SIGTERM: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = tokio::select! {
        r = run_all(args.clone()) => r,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
        _ = term.recv() => Err(anyhow::anyhow!("terminated")),
    };
    let passed = |r: &Report| r.correct && (!args.strict || r.targets_met);
    match result {
        Ok(reports) => {
            let (text, ok) = match &reports {
                Outcome::One(report) => (
                    if args.json {
                        serde_json::to_string_pretty(report).map(|t| t + "\n")
                    } else {
                        Ok(report.human())
                    },
                    passed(report),
                ),
                Outcome::Compared(c) => (
                    if args.json {
                        serde_json::to_string_pretty(c).map(|t| t + "\n")
                    } else {
                        Ok(c.human())
                    },
                    passed(&c.standalone) && passed(&c.cluster),
                ),
                Outcome::Builds(c) => (
                    if args.json {
                        serde_json::to_string_pretty(c).map(|t| t + "\n")
                    } else {
                        Ok(c.human())
                    },
                    c.correct,
                ),
                Outcome::Keyed(c) => (
                    if args.json {
                        serde_json::to_string_pretty(c).map(|t| t + "\n")
                    } else {
                        Ok(c.human())
                    },
                    c.correct && (!args.strict || c.target.pass),
                ),
            };
            match text {
                Ok(text) => print!("{text}"),
                Err(e) => {
                    eprintln!("sluice-bench: {e}");
                    return ExitCode::FAILURE;
                }
            }
            if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("sluice-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// One report, or a standalone and a cluster one (`--compare-standalone`), or two builds
/// (`--compare-builds`), or admission without and with keys (`--compare-keyed`).
enum Outcome {
    One(Box<Report>),
    Compared(Box<Comparison>),
    Builds(Box<compare::BuildComparison>),
    Keyed(Box<limits::KeyedComparison>),
}

/// The run the flags ask for: one, or standalone then cluster, or two builds, or plain and
/// keyed admission.
async fn run_all(args: Args) -> anyhow::Result<Outcome> {
    if let Some(builds) = &args.compare_builds {
        return Ok(Outcome::Builds(Box::new(
            compare::compare(&args, builds).await?,
        )));
    }
    if args.compare_keyed {
        return Ok(Outcome::Keyed(Box::new(
            limits::compare_keyed(&args).await?,
        )));
    }
    if !args.compare_standalone {
        return Ok(Outcome::One(Box::new(run(args).await?)));
    }
    eprintln!(
        "sluice-bench: standalone first, then a cluster of {} masters",
        args.cluster_masters
    );
    let standalone = run(Args {
        cluster: false,
        ..args.clone()
    })
    .await?;
    let cluster = run(Args {
        cluster: true,
        ..args
    })
    .await?;
    Ok(Outcome::Compared(Box::new(Comparison {
        standalone,
        cluster,
    })))
}

/// Where the `sluice` program is: the flag, else next to this binary.
fn sluice_program(args: &Args) -> anyhow::Result<PathBuf> {
    if let Some(p) = &args.sluice {
        return Ok(p.clone());
    }
    let exe = std::env::current_exe()?;
    let p = exe.with_file_name("sluice");
    anyhow::ensure!(
        p.exists(),
        "{} not found: build it too (`cargo build --release --bin sluice --bin sluice-bench`) \
         or pass --sluice",
        p.display()
    );
    Ok(p)
}

/// Registers each tenant and makes it an `editor` API key (after a reset: the keys live on
/// Redis like everything else); the tokens, in the order of `tenants`.
async fn tenant_keys(
    addr: std::net::SocketAddr,
    tenants: &[String],
) -> anyhow::Result<Vec<String>> {
    let mut conn = load::Conn::connect(addr).await?;
    let mut tokens = Vec::new();
    for t in tenants {
        let (status, _) = conn
            .call(
                hyper::Method::PUT,
                &format!("/api/tenants/{t}"),
                ADMIN_TOKEN,
                t,
                "{}",
            )
            .await?;
        anyhow::ensure!(status == 200, "registering {t} answered {status}");
        let (status, body) = conn
            .call(
                hyper::Method::POST,
                &format!("/api/tenants/{t}/api-keys"),
                ADMIN_TOKEN,
                t,
                r#"{"role":"editor","name":"bench"}"#,
            )
            .await?;
        anyhow::ensure!(status == 201, "a key for {t} answered {status}");
        let key: serde_json::Value = serde_json::from_slice(&body)?;
        tokens.push(
            key["token"]
                .as_str()
                .ok_or_else(|| anyhow::anyhow!("no token for {t}"))?
                .to_owned(),
        );
    }
    Ok(tokens)
}

/// Every process whose CPU time a phase reports.
struct Pids(Vec<(String, u32)>);

impl Pids {
    fn of(procs: &[&Proc]) -> Self {
        let mut v: Vec<(String, u32)> = procs
            .iter()
            .filter_map(|p| p.pid().map(|pid| (p.name.clone(), pid)))
            .collect();
        v.push(("bench".into(), std::process::id()));
        Self(v)
    }

    /// CPU seconds of each process, then of the whole machine.
    fn sample(&self) -> Vec<f64> {
        self.0
            .iter()
            .map(|(_, pid)| procs::cpu_seconds(*pid).unwrap_or(0.0))
            .chain([procs::machine_busy_seconds().unwrap_or(0.0)])
            .collect()
    }

    /// CPU use since `before` over `wall`, in cores, per process and for the rest of the
    /// machine (other processes, interrupts).
    fn since(&self, before: &[f64], wall: Duration) -> Vec<CpuShare> {
        let after = self.sample();
        let cores = |d: f64| (d / wall.as_secs_f64().max(1e-3) * 100.0).round() / 100.0;
        let deltas: Vec<f64> = before.iter().zip(&after).map(|(b, a)| a - b).collect();
        let (machine, ours) = deltas.split_last().unwrap_or((&0.0, &[]));
        let mut out: Vec<CpuShare> = self
            .0
            .iter()
            .zip(ours)
            .map(|((name, _), d)| CpuShare {
                process: name.clone(),
                cores: cores(*d),
            })
            .collect();
        out.push(CpuShare {
            process: "rest".into(),
            cores: cores((machine - ours.iter().sum::<f64>()).max(0.0)),
        });
        out
    }
}

/// The Redis nodes and `serve` (the processes every phase's CPU shares name).
fn redis_and<'a>(redis: &'a procs::Redis, serve: &'a Proc) -> Vec<&'a Proc> {
    redis.nodes.iter().chain([serve]).collect()
}

/// Runs a phase with a progress line per second; returns its result and CPU shares.
async fn phase<F: Future<Output = anyhow::Result<LoadResult>>>(
    name: &str,
    pids: &Pids,
    f: impl FnOnce(Arc<Progress>) -> F,
) -> anyhow::Result<(LoadResult, Vec<CpuShare>)> {
    let progress = Arc::new(Progress::default());
    let stop = Arc::new(AtomicBool::new(false));
    let ticker = load::progress(name, progress.clone(), stop.clone());
    let before = pids.sample();
    let started = Instant::now();
    let result = f(progress).await;
    let cpu = pids.since(&before, started.elapsed());
    stop.store(true, Ordering::Relaxed);
    ticker.abort();
    Ok((result?, cpu))
}

/// `serve`'s admission script calls so far and the admissions they carried (group commit),
/// from its `/metrics`.
async fn group_counts(addr: std::net::SocketAddr) -> anyhow::Result<(u64, u64)> {
    let mut c = load::Conn::connect(addr).await?;
    let (status, body) = c.get("/metrics").await?;
    anyhow::ensure!(status == 200, "GET /metrics answered {status}");
    let text = String::from_utf8_lossy(&body);
    let value = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok())
            .map_or(0, |v| v as u64)
    };
    Ok((
        value("sluice_admission_calls_total"),
        value("sluice_admission_calls_carried_total"),
    ))
}

/// The store the ceiling phase calls directly (and the census reads through): `sluice serve`'s
/// defaults (the flags' own), with the benchmark's quotas, connections and a generous time
/// bound.
fn store_config(args: &Args, target: RedisTarget) -> StoreConfig {
    let mut redis_settings = RedisSettings::for_target(target);
    redis_settings.redis_connections = args.redis_connections;
    redis_settings.redis_timeout_ms = 10_000;
    // The ceiling is the single-call one: every admission its own EVALSHA, as before group
    // commit, so HTTP admission (which groups) is measured against what one call per
    // admission allows.
    redis_settings.redis_admission_group = 1;
    let mut api = ApiSettings::defaults();
    api.default_max_concurrent = UNLIMITED;
    api.default_max_queued = UNLIMITED;
    redis_settings.store_config(&api)
}

async fn run(args: Args) -> anyhow::Result<Report> {
    if cfg!(debug_assertions) && !args.smoke {
        eprintln!("sluice-bench: WARNING: a debug build; measure with --release");
    }
    let program = sluice_program(&args)?;
    let scratch = Scratch::create()?;
    let mut redis = if args.cluster {
        procs::start_cluster(&args.redis_server, &scratch, args.cluster_masters).await?
    } else {
        procs::start_redis(&args.redis_server, &scratch).await?
    };
    let target = redis.target();
    let cmd = SluiceCmd {
        program,
        redis: target.clone(),
        redis_connections: args.redis_connections,
        serve_threads: args.serve_threads,
        worker_threads: args.worker_threads,
    };
    let (mut serve, addr) =
        procs::start_serve(&cmd, &scratch, ADMIN_TOKEN, UNLIMITED, UNLIMITED).await?;
    let redis_pids: Vec<String> = redis
        .nodes
        .iter()
        .map(|n| n.pid().unwrap_or(0).to_string())
        .collect();
    eprintln!(
        "sluice-bench: redis at {target} (pid {}), sluice serve at http://{addr} (pid {})",
        redis_pids.join(", "),
        serve.pid().unwrap_or(0)
    );

    let tenants: Vec<String> = (0..args.tenants.max(1))
        .map(|i| format!("bench-t{i}"))
        .collect();
    let mut direct =
        Direct::connect(store_config(&args, target.clone()), &tenants, &redis.urls).await?;
    // Each master's address, for the per-master shares (none when standalone).
    let masters: Option<Vec<String>> = args.cluster.then(|| {
        redis
            .urls
            .iter()
            .map(|u| u.trim_start_matches("redis://").to_owned())
            .collect()
    });
    let masters = masters.as_deref();
    let workload = |tag: &str| Workload {
        addr,
        admin_token: ADMIN_TOKEN.into(),
        tenants: tenants.clone(),
        tag: tag.into(),
        flow: "demo.echo".into(),
        keys: 0,
        tokens: Vec::new(),
    };
    let mut report = Report::new(&args);
    let pids = Pids::of(&redis_and(&redis, &serve));
    let clients = args.clients.max(1);

    if !args.push_only && !args.fairness_only && !args.limits_only {
        // 1. Ceiling.
        direct.reset().await?;
        let (r, cpu) = phase("ceiling", &pids, |p| {
            direct.admit_loop(
                clients,
                Until::Elapsed(Duration::from_secs(args.ceiling_secs)),
                "ceiling",
                true,
                p,
            )
        })
        .await?;
        let script_us = direct.script_usec().await?;
        if masters.is_some() {
            report.masters = Some(
                direct
                    .layout()
                    .await?
                    .into_iter()
                    .map(|n| Master {
                        node: n.addr,
                        shards: n.shards,
                        tenants: n.tenants,
                    })
                    .collect(),
            );
        }
        let (check, census) = check_queued("ceiling", &r, &mut direct).await?;
        report.checks.push(check);
        report.ceiling = Some(phase_report(&r, cpu, &script_us, &census, masters));

        // 2. Admission, unique keys (with `--admission-keys`, each with a concurrency key).
        direct.reset().await?;
        let mut w = workload("adm");
        if let Some(keys) = args.admission_keys() {
            limits::set_key_limits(addr, ADMIN_TOKEN, &tenants, args.admission_key_limit).await?;
            w.keys = keys;
        }
        let grouped_before = group_counts(addr).await?;
        let (r, cpu) = phase("admission", &pids, |p| {
            load::closed_loop(&w, clients, Duration::from_secs(args.admission_secs), 0, p)
        })
        .await?;
        let grouped_after = group_counts(addr).await?;
        report.admission_calls = Some(report::AdmissionCalls {
            calls: grouped_after.0.saturating_sub(grouped_before.0),
            admissions: grouped_after.1.saturating_sub(grouped_before.1),
        });
        let script_us = direct.script_usec().await?;
        let (check, census) = check_queued("admission", &r, &mut direct).await?;
        report.checks.push(check);
        report.admission = Some(phase_report(&r, cpu, &script_us, &census, masters));

        // 2a. The same load against the BullMQ HTTP peer (its own Redis), in this run.
        if args.skip_bullmq {
            report.admission_peer_note = Some("skipped (--skip-bullmq)".into());
        } else {
            let w = workload("peer");
            match bullmq::http_admission(&args, &scratch, &w, clients, args.admission_secs).await {
                Ok(p) => {
                    report.checks.push(p.check);
                    report.admission_peer = Some(report::PeerAdmission {
                        versions: p.versions,
                        phase: report::Phase::from(&p.load, Vec::new(), 0),
                    });
                }
                Err(bullmq::NoPeer::Skipped(note)) => {
                    eprintln!("sluice-bench: WARNING: BullMQ HTTP peer skipped: {note}");
                    report.admission_peer_note = Some(note);
                }
                Err(bullmq::NoPeer::Failed(e)) => {
                    eprintln!("sluice-bench: the BullMQ HTTP peer failed: {e:#}");
                    report.checks.push(Check {
                        phase: "admission, BullMQ peer".into(),
                        ok: false,
                        detail: format!("failed: {e:#}"),
                    });
                    report.admission_peer_note = Some(format!("failed: {e:#}"));
                }
            }
        }

        // 2b. Admission with tenant API keys: what authentication costs the `{acl}` slot.
        if args.api_key_secs > 0 {
            direct.reset().await?;
            let mut w = workload("key");
            w.tokens = tenant_keys(addr, &tenants).await?;
            let before = direct.command_calls().await?;
            let (r, cpu) = phase("api-key admission", &pids, |p| {
                load::closed_loop(&w, clients, Duration::from_secs(args.api_key_secs), 0, p)
            })
            .await?;
            let after = direct.command_calls().await?;
            let script_us = direct.script_usec().await?;
            let (check, census) = check_queued("api-key admission", &r, &mut direct).await?;
            report.checks.push(check);
            // api_key_auth.lua's SISMEMBER: no other script sends one.
            let calls = |m: &std::collections::BTreeMap<String, u64>| {
                m.get("sismember").copied().unwrap_or(0)
            };
            let lookups = calls(&after).saturating_sub(calls(&before));
            report.api_key_admission = Some(report::ApiKeyAdmission {
                acl_lookups: lookups,
                acl_lookups_per_admission: lookups as f64 / r.outcomes.created.max(1) as f64,
                phase: phase_report(&r, cpu, &script_us, &census, masters),
            });
        }

        // 3. Admission with replays.
        direct.reset().await?;
        let w = workload("mix");
        let (r, cpu) = phase("replay-mix", &pids, |p| {
            load::closed_loop(
                &w,
                clients,
                Duration::from_secs(args.replay_secs),
                args.replay_percent,
                p,
            )
        })
        .await?;
        let script_us = direct.script_usec().await?;
        let (check, census) = check_queued("replay mix", &r, &mut direct).await?;
        report.checks.push(check);
        report.replay_mix = Some(phase_report(&r, cpu, &script_us, &census, masters));
        serve.ensure_running()?;

        // 4. Fixed rate: open loop at a share of the measured admission maximum.
        direct.reset().await?;
        let max = report.admission.as_ref().map(|a| a.per_sec).unwrap_or(0.0);
        let rate = (max * args.fixed_rate_share).max(10.0);
        let w = workload("fixed");
        let (r, cpu) = phase("fixed-rate", &pids, |p| {
            load::open_loop(
                &w,
                clients,
                rate,
                Duration::from_secs(args.fixed_rate_secs),
                p,
            )
        })
        .await?;
        let script_us = direct.script_usec().await?;
        let (check, census) = check_queued("fixed rate", &r, &mut direct).await?;
        report.checks.push(check);
        report.fixed_rate = Some(FixedRate {
            target_per_sec: rate,
            phase: phase_report(&r, cpu, &script_us, &census, masters),
        });

        // 4b. Batch admission: its rate, and the fixed-rate tenants' latency beside it.
        if args.batch_secs > 0 {
            direct.reset().await?;
            let mut w = workload("batch");
            w.tenants.truncate(4);
            let (r, cpu) = phase("batch admission", &pids, |p| {
                load::batch_loop(
                    &w,
                    args.batch_size as usize,
                    Duration::from_secs(args.batch_secs),
                    p,
                )
            })
            .await?;
            let script_us = direct.script_usec().await?;
            let (check, census) = check_queued("batch admission", &r, &mut direct).await?;
            report.checks.push(check);
            let alone = phase_report(&r, cpu, &script_us, &census, masters);

            // One tenant sends batches; the others admit one by one at the fixed rate.
            direct.reset().await?;
            let mut batcher = workload("beside-batch");
            batcher.tenants.truncate(1);
            let mut singles = workload("beside");
            singles.tenants.remove(0);
            let secs = Duration::from_secs(args.batch_secs);
            let batch_items_beside = std::sync::atomic::AtomicU64::new(0);
            let (r, cpu) = phase("singles beside a batch", &pids, |p| async {
                let (b, o) = tokio::join!(
                    load::batch_loop(
                        &batcher,
                        args.batch_size as usize,
                        secs,
                        Arc::new(Progress::default())
                    ),
                    load::open_loop(&singles, clients, rate, secs, p)
                );
                let (b, o) = (b?, o?);
                batch_items_beside.store(b.outcomes.created, Ordering::Relaxed);
                let mut outcomes = o.outcomes.clone();
                outcomes.created += b.outcomes.created;
                outcomes.errors += b.outcomes.errors;
                Ok(LoadResult {
                    outcomes,
                    latencies: o.latencies,
                    elapsed: o.elapsed,
                })
            })
            .await?;
            let script_us = direct.script_usec().await?;
            let (check, census) = check_queued("singles beside a batch", &r, &mut direct).await?;
            report.checks.push(check);
            let batched = batch_items_beside.load(Ordering::Relaxed);
            let mut beside = phase_report(&r, cpu, &script_us, &census, masters);
            beside.per_sec =
                (r.outcomes.created - batched) as f64 / r.elapsed.as_secs_f64().max(1e-3);
            report.batch = Some(report::BatchPhase {
                size: args.batch_size,
                tenants: w.tenants.len(),
                phase: alone,
                singles_rate: rate,
                singles_beside: beside,
                batch_items_beside: batched,
            });
        }

        // 5. End-to-end with workers.
        direct.reset().await?;
        let (e2e, check) = end_to_end(
            &args,
            &cmd,
            &scratch,
            &mut direct,
            &workload("e2e"),
            &redis_and(&redis, &serve),
            masters,
            None,
        )
        .await?;
        report.checks.push(check);
        report.e2e = Some(e2e);
        // 5b. The same through the pull API: HTTP workers beside the same server.
        if args.pull_workers > 0 {
            direct.reset().await?;
            let (e2e, check) = end_to_end(
                &args,
                &cmd,
                &scratch,
                &mut direct,
                &workload("e2e-pull"),
                &redis_and(&redis, &serve),
                masters,
                Some(addr),
            )
            .await?;
            report.checks.push(check);
            report.e2e_pull = Some(e2e);
        }

        // 6. Memory per queued execution, with a dedup key each (as above) and without.
        let mut points = Vec::new();
        for dedup in [true, false] {
            direct.reset().await?;
            let before = direct.used_memory().await?;
            let name = if dedup { "memory" } else { "memory-no-key" };
            let (r, _) = phase(name, &pids, |p| {
                let until =
                    Until::Count(args.memory_count, Duration::from_secs(args.memory_max_secs));
                direct.admit_loop(clients, until, "mem", dedup, p)
            })
            .await?;
            let after = direct.used_memory().await?;
            report
                .checks
                .push(check_queued(name, &r, &mut direct).await?.0);
            let n = r.outcomes.created.max(1);
            let by_kind = direct
                .memory_by_kind()
                .await?
                .into_iter()
                .map(|(kind, bytes)| (kind, (bytes as f64 / n as f64).round()))
                .collect();
            points.push(MemoryPoint {
                by_kind,
                executions: r.outcomes.created,
                used_memory_before: before,
                used_memory_after: after,
                bytes_per_execution: after.saturating_sub(before) as f64
                    / r.outcomes.created.max(1) as f64,
            });
        }
        let without = points.pop();
        report.memory = points.pop().map(|with_key| Memory {
            state: "dispatched",
            with_dedup_key: with_key,
            without_dedup_key: without,
        });
    }

    // Issue 12's phases: default workers against the same server and Redis; the idle cost last,
    // with `serve` stopped so that only the worker's calls are counted.
    serve.ensure_running()?;
    redis.ensure_running()?;
    let ctx = push::Ctx {
        args: &args,
        cmd: &cmd,
        scratch: &scratch,
        addr,
        admin_token: ADMIN_TOKEN,
        tenants: &tenants,
        others: redis_and(&redis, &serve),
    };
    let push_phases = !args.fairness_only && !args.limits_only;
    if push_phases && !args.skip_pickup {
        pickup_phase(&ctx, &mut direct, &mut report).await?;
    }
    if push_phases && !args.skip_cancel {
        let (c, check) = push::cancel(&ctx, &mut direct).await?;
        report.checks.push(check);
        report.cancel = Some(c);
    }
    // Issue 20's fairness group, against the same server and Redis.
    if !args.push_only && !args.limits_only && !args.skip_fairness {
        let mut f = report::Fairness::default();
        let (noisy, checks) = fairness::noisy(&ctx, &mut direct).await?;
        report.checks.extend(checks);
        f.noisy = Some(noisy);
        let (weighted, check) = fairness::weighted(&ctx, &mut direct).await?;
        report.checks.push(check);
        f.weighted = Some(weighted);
        let (lateness, check) = fairness::lateness(&ctx, &mut direct).await?;
        report.checks.push(check);
        f.lateness = Some(lateness);
        report.fairness = Some(f);
    }
    // The limits group (concurrency keys, rate limits), against the same server and Redis.
    if !args.push_only && !args.fairness_only && !args.skip_limits {
        let mut l = report::Limits::default();
        let (throttle, check) = limits::throttle(&ctx, &mut direct).await?;
        report.checks.push(check);
        l.throttle = Some(throttle);
        let (isolation, check) = limits::key_isolation(&ctx, &mut direct).await?;
        report.checks.push(check);
        l.key_isolation = Some(isolation);
        report.limits = Some(l);
    }
    serve.ensure_running()?;
    serve.kill().await;
    if push_phases && !args.skip_idle {
        let ctx = push::Ctx {
            args: &args,
            cmd: &cmd,
            scratch: &scratch,
            addr,
            admin_token: ADMIN_TOKEN,
            tenants: &tenants,
            others: redis.nodes.iter().collect(),
        };
        let (i, check) = push::idle(&ctx, &mut direct).await?;
        report.checks.push(check);
        report.idle = Some(i);
    }
    redis.ensure_running()?;
    redis.kill().await;
    report.finish();
    Ok(report)
}

/// The end-to-end phase: workers start, `demo.echo` is admitted over HTTP for the phase's
/// duration, and the phase ends when everything admitted has completed (or the drain limit).
/// With `pull` (the server's address), the workers are pull workers in this process
/// (`--pull-workers` of `--pull-batch` each, see `pull_worker`) instead of `sluice worker`s.
#[allow(clippy::too_many_arguments)]
async fn end_to_end(
    args: &Args,
    cmd: &SluiceCmd,
    scratch: &Scratch,
    direct: &mut Direct,
    w: &Workload,
    others: &[&Proc],
    masters: Option<&[String]>,
    pull: Option<std::net::SocketAddr>,
) -> anyhow::Result<(E2e, Check)> {
    let mut workers = Vec::new();
    let extra = [
        "--concurrency".to_owned(),
        args.worker_concurrency.to_string(),
    ];
    let stop_pulling = Arc::new(AtomicBool::new(false));
    let mut pulling = tokio::task::JoinSet::new();
    match pull {
        None => {
            for n in 1..=args.workers.max(1) {
                workers.push(procs::start_worker(
                    cmd,
                    scratch,
                    &format!("worker-{n}"),
                    &extra,
                )?);
            }
            procs::wait_started(&mut workers).await?;
        }
        Some(addr) => {
            for n in 0..args.pull_workers {
                pulling.spawn(pull_worker(
                    addr,
                    format!("bench-{n}"),
                    w.tenants.clone(),
                    args.pull_batch.clamp(1, 100),
                    stop_pulling.clone(),
                ));
            }
        }
    }
    let mut all: Vec<&Proc> = others.to_vec();
    all.extend(workers.iter());
    let pids = Pids::of(&all);
    let before = pids.sample();
    let started = Instant::now();
    let (r, _) = phase("end-to-end", &pids, |p| {
        load::closed_loop(
            w,
            args.clients.max(1),
            Duration::from_secs(args.e2e_secs),
            0,
            p,
        )
    })
    .await?;
    let drain_deadline = Instant::now() + Duration::from_secs(args.e2e_drain_secs);
    let mut last_print = Instant::now();
    loop {
        let done = direct.completed().await?;
        if done >= r.outcomes.created || Instant::now() > drain_deadline {
            break;
        }
        if last_print.elapsed() >= Duration::from_secs(1) {
            eprintln!(
                "[end-to-end] draining: completed={done}/{}",
                r.outcomes.created
            );
            last_print = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cpu = pids.since(&before, started.elapsed());
    let scripts = direct.script_usec().await?;
    let script_us: u64 = scripts.iter().sum();
    stop_pulling.store(true, Ordering::SeqCst);
    while let Some(done) = pulling.join_next().await {
        done??;
    }
    for wk in &mut workers {
        wk.ensure_running()?;
    }
    for wk in workers {
        wk.kill().await;
    }
    let census = direct.census(true).await?;
    let completed = census.by_status.get("completed").copied().unwrap_or(0);
    let (lat, span) = census
        .e2e
        .as_ref()
        .map_or((None, Duration::ZERO), |(l, s)| (Some(l.percentiles()), *s));
    let check = check_completed("end-to-end", &r.outcomes, &census);
    let e2e = E2e {
        admitted: r.outcomes.created,
        completed,
        admission_per_sec: r.outcomes.created as f64 / r.elapsed.as_secs_f64(),
        per_sec: completed as f64 / span.as_secs_f64().max(1e-3),
        span_secs: span.as_secs_f64(),
        admit_to_completed: lat,
        redis_script_us_per_execution: (script_us as f64 / completed.max(1) as f64 * 100.0).round()
            / 100.0,
        http: Phase::from(&r, cpu, script_us),
        per_master: masters
            .map(|m| MasterShare::of(m, &census.completed_by_node, &scripts, span.as_secs_f64())),
    };
    Ok((e2e, check))
}

/// A pull worker of the end-to-end phase's pull run: leases up to `batch` executions of
/// `tenants` (as the platform admin, long polls of 1 s), completes each with its params as
/// output, one call each, and leases again, until `stop`. One keep-alive connection.
async fn pull_worker(
    addr: std::net::SocketAddr,
    worker_id: String,
    tenants: Vec<String>,
    batch: usize,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    let mut conn = load::Conn::connect(addr).await?;
    let lease = serde_json::json!({
        "worker_id": worker_id, "max": batch, "tenants": tenants, "lease": "30s",
    })
    .to_string();
    while !stop.load(Ordering::SeqCst) {
        let (status, body) = conn
            .call(
                hyper::Method::POST,
                "/api/worker/lease?wait=1s",
                ADMIN_TOKEN,
                &tenants[0],
                &lease,
            )
            .await?;
        anyhow::ensure!(status == 200, "lease answered {status}");
        let answer: serde_json::Value = serde_json::from_slice(&body)?;
        for run in answer["runs"].as_array().into_iter().flatten() {
            let report = serde_json::json!({
                "worker_id": worker_id,
                "fence": run["fence"],
                "outcome": "completed",
                "output": run["params"],
            })
            .to_string();
            let path = format!(
                "/api/worker/runs/{}/complete",
                run["execution_id"].as_str().unwrap_or_default()
            );
            let tenant = run["tenant_id"].as_str().unwrap_or_default();
            let (status, body) = conn
                .call(hyper::Method::POST, &path, ADMIN_TOKEN, tenant, &report)
                .await?;
            anyhow::ensure!(
                status == 200,
                "complete answered {status}: {}",
                String::from_utf8_lossy(&body)
            );
        }
    }
    Ok(())
}

/// After a phase with workers: every 2xx admission is a row and completed (also by the shards'
/// counters), nothing left on a ready stream, pending, leased, waiting, delayed or
/// dead-lettered.
fn check_completed(phase: &str, o: &load::Outcomes, census: &Census) -> Check {
    let completed = census.by_status.get("completed").copied().unwrap_or(0);
    let ok = o.errors == 0
        && census.rows == o.created
        && completed == o.created
        && census.completed_counter == o.created
        && census.ready == 0
        && census.pending == 0
        && census.leases == 0
        && census.waiting == 0
        && census.delayed == 0
        && census.dead_letters == 0;
    Check {
        phase: phase.into(),
        ok,
        detail: format!(
            "2xx={} non-2xx={}; rows={} completed={} (counter {}); ready={} pending={} \
             leases={} waiting={} delayed={} dead letters={}",
            o.created,
            o.errors,
            census.rows,
            completed,
            census.completed_counter,
            census.ready,
            census.pending,
            census.leases,
            census.waiting,
            census.delayed,
            census.dead_letters
        ),
    }
}

/// The pickup phase: sluice at each rate (`push::pickup_rate`), then the BullMQ
/// peer at the same rates (`bullmq::run`), side by side in the report. The third rate is a
/// share of the HTTP admission maximum: the admission phase's, or a short probe's when that
/// phase was skipped.
async fn pickup_phase(
    ctx: &push::Ctx<'_>,
    direct: &mut Direct,
    report: &mut Report,
) -> anyhow::Result<()> {
    let args = ctx.args;
    let mut plan: Vec<(String, f64, f64)> = vec![(
        "idle".into(),
        args.pickup_idle_rate.max(0.1),
        args.pickup_idle_secs,
    )];
    if args.pickup_rate > 0.0 {
        plan.push(("fixed".into(), args.pickup_rate, args.pickup_secs));
    }
    let mut max_source = "no rate as a share of the maximum (--pickup-max-share 0)".to_owned();
    if args.pickup_max_share > 0.0 {
        let (max, source) = match &report.admission {
            Some(a) => (a.per_sec, "measured by the admission phase of this run"),
            None => {
                direct.reset().await?;
                let w = Workload {
                    addr: ctx.addr,
                    admin_token: ctx.admin_token.into(),
                    tenants: ctx.tenants.to_vec(),
                    tag: "probe".into(),
                    flow: "demo.echo".into(),
                    keys: 0,
                    tokens: Vec::new(),
                };
                let pids = Pids::of(&ctx.others);
                let (r, _) = phase("admission probe", &pids, |p| {
                    load::closed_loop(
                        &w,
                        args.clients.max(1),
                        Duration::from_secs(args.pickup_probe_secs),
                        0,
                        p,
                    )
                })
                .await?;
                (
                    r.outcomes.created as f64 / r.elapsed.as_secs_f64().max(1e-3),
                    "probed: the admission phase was skipped",
                )
            }
        };
        let mut rate = (max * args.pickup_max_share).round().max(1.0);
        if args.smoke {
            rate = rate.min(100.0);
        }
        let share = args.pickup_max_share * 100.0;
        plan.push((format!("{share:.0} % of max"), rate, args.pickup_secs));
        max_source = format!("{share:.0} % of the HTTP admission maximum {max:.0}/s, {source}");
    }
    let mut rates = Vec::new();
    for (label, rate, secs) in &plan {
        let (side, check) = push::pickup_rate(ctx, direct, label, *rate, *secs).await?;
        report.checks.push(check);
        rates.push(PickupRate {
            label: label.clone(),
            rate: *rate,
            secs: *secs,
            sluice: side,
            bullmq: None,
        });
    }
    let (mut peer, mut peer_note) = (None, None);
    if args.skip_bullmq {
        peer_note = Some("skipped (--skip-bullmq)".to_owned());
    } else {
        let asked: Vec<(f64, f64)> = plan.iter().map(|(_, r, s)| (*r, *s)).collect();
        match bullmq::run(args, ctx.scratch, &asked).await {
            Ok(run) => {
                for (r, side) in rates.iter_mut().zip(run.rates) {
                    r.bullmq = Some(side);
                }
                report.checks.push(run.check);
                peer = Some(run.versions);
            }
            Err(bullmq::NoPeer::Skipped(note)) => {
                eprintln!("sluice-bench: WARNING: BullMQ peer skipped: {note}");
                peer_note = Some(note);
            }
            Err(bullmq::NoPeer::Failed(e)) => {
                eprintln!("sluice-bench: the BullMQ peer failed: {e:#}");
                report.checks.push(Check {
                    phase: "bullmq peer".into(),
                    ok: false,
                    detail: format!("failed: {e:#}"),
                });
                peer_note = Some(format!("failed: {e:#}"));
            }
        }
    }
    let d = push::worker_defaults();
    report.pickup = Some(Pickup {
        worker: format!(
            "one `sluice worker --demo-flows` with default settings (concurrency {}, safety \
             poll every {} ms){}",
            d.concurrency,
            d.scan_ms,
            if args.smoke {
                ", --heartbeat-ms 200 (smoke)"
            } else {
                ""
            }
        ),
        max_source,
        rates,
        peer,
        peer_note,
    });
    Ok(())
}

/// A phase's numbers from its load, CPU shares and each node's script time; on a cluster
/// (`masters`) with each master's share of the rows the census found.
fn phase_report(
    r: &LoadResult,
    cpu: Vec<CpuShare>,
    script_us: &[u64],
    census: &Census,
    masters: Option<&[String]>,
) -> Phase {
    let mut p = Phase::from(r, cpu, script_us.iter().sum());
    p.per_master = masters
        .map(|m| MasterShare::of(m, &census.rows_by_node, script_us, r.elapsed.as_secs_f64()));
    p
}

/// After an admission phase without workers: every 2xx is one row, queued once (all are
/// dispatched: quotas are unlimited): on a ready stream (schema 1), in its tenant's waiting
/// set, or in its concurrency key's queue (of which only the first is also in the waiting
/// set); nothing pending, leased or dead-lettered. Returns the census too.
async fn check_queued(
    phase: &str,
    r: &LoadResult,
    direct: &mut Direct,
) -> anyhow::Result<(Check, Census)> {
    let c = direct
        .census(false)
        .await
        .with_context(|| format!("census after {phase}"))?;
    let queued = c.by_status.get("queued").copied().unwrap_or(0);
    let o = &r.outcomes;
    let ok = o.errors == 0
        && o.replay_anomalies == 0
        && c.rows == o.created
        && queued == o.created
        && c.ready + c.waiting + c.key_queued - c.key_heads_waiting.min(c.key_queued) == o.created
        && c.pending == 0
        && c.leases == 0
        && c.dead_letters == 0;
    let check = Check {
        phase: phase.into(),
        ok,
        detail: format!(
            "2xx new={} replayed={} non-2xx={} replay anomalies={}; rows={} queued={}; \
             ready={} waiting={}{} pending={} dead letters={}",
            o.created,
            o.replayed,
            o.errors,
            o.replay_anomalies,
            c.rows,
            queued,
            c.ready,
            c.waiting,
            if c.key_queued > 0 {
                format!(
                    " key queues={} (their firsts also waiting: {})",
                    c.key_queued, c.key_heads_waiting
                )
            } else {
                String::new()
            },
            c.pending,
            c.dead_letters
        ),
    };
    Ok((check, c))
}
