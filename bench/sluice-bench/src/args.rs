//! The benchmark's command line: every phase's size and duration, which phases run, and
//! `--smoke`'s small sizes.

use std::path::PathBuf;

use clap::Parser;

/// Measure sluice's admission and end-to-end speed against its own Redis and processes.
#[derive(Debug, Clone, Parser)]
#[command(name = "sluice-bench", version)]
pub struct Args {
    /// Print the report as JSON (progress still goes to stderr).
    #[arg(long)]
    pub(crate) json: bool,
    /// A few seconds in all, small counts: checks that the benchmark works, measures nothing.
    #[arg(long)]
    pub(crate) smoke: bool,
    /// Exit non-zero also when a speed target is missed (correctness always counts).
    #[arg(long)]
    pub(crate) strict: bool,
    /// Concurrent clients (connections, or direct calls in flight) in every phase.
    #[arg(long, default_value_t = 64)]
    pub(crate) clients: usize,
    /// Tenants the load is spread over.
    #[arg(long, default_value_t = 8)]
    pub(crate) tenants: usize,
    /// Seconds of the ceiling phase.
    #[arg(long, default_value_t = 6)]
    pub(crate) ceiling_secs: u64,
    /// Seconds of the HTTP admission phase (unique keys).
    #[arg(long, default_value_t = 8)]
    pub(crate) admission_secs: u64,
    /// Seconds of the HTTP admission phase with a tenant API key per tenant instead of the
    /// admin token (how many `{acl}` lookups an admission costs); 0 skips it.
    #[arg(long, default_value_t = 4)]
    pub(crate) api_key_secs: u64,
    /// Seconds of the HTTP admission phase with replays.
    #[arg(long, default_value_t = 6)]
    pub(crate) replay_secs: u64,
    /// Share of replayed keys in the replay phase, percent.
    #[arg(long, default_value_t = 10)]
    pub(crate) replay_percent: u64,
    /// Seconds of the fixed-rate phase.
    #[arg(long, default_value_t = 8)]
    pub(crate) fixed_rate_secs: u64,
    /// Seconds of each batch admission phase (batches alone; then one tenant's batches beside
    /// the other tenants' single admissions at the fixed rate); 0 skips them.
    #[arg(long, default_value_t = 4)]
    pub(crate) batch_secs: u64,
    /// Items per batch in the batch admission phases (1..=1000).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub(crate) batch_size: u64,
    /// Rate of the fixed-rate phase as a share of the measured admission maximum.
    #[arg(long, default_value_t = 0.5)]
    pub(crate) fixed_rate_share: f64,
    /// Seconds of admitting in the end-to-end phase.
    #[arg(long, default_value_t = 8)]
    pub(crate) e2e_secs: u64,
    /// Most seconds to wait afterwards for the workers to complete what was admitted.
    #[arg(long, default_value_t = 30)]
    pub(crate) e2e_drain_secs: u64,
    /// Rounds of the end-to-end phase and its BullMQ peer, alternating (sluice, peer; peer,
    /// sluice; ...): the report keeps each side's median round and their ratio.
    #[arg(long, default_value_t = 3)]
    pub(crate) e2e_rounds: usize,
    /// `sluice worker` processes in the end-to-end phase.
    #[arg(long, default_value_t = 2)]
    pub(crate) workers: usize,
    /// `--concurrency` of each worker. High, because `demo.echo` holds nothing while it runs
    /// and a slot stays busy for the start and completion round trips, which queue behind the
    /// admissions on Redis: with 64 per worker the workers fall behind the admissions.
    #[arg(long, default_value_t = 256)]
    pub(crate) worker_concurrency: usize,
    /// Executions queued for the memory measurement.
    #[arg(long, default_value_t = 100_000)]
    pub(crate) memory_count: u64,
    /// Most seconds each memory fill may take (fewer executions are then measured).
    #[arg(long, default_value_t = 30)]
    pub(crate) memory_max_secs: u64,
    /// Multiplexed Redis connections of every sluice process and of the direct phases (sluice's
    /// own default).
    #[arg(long, default_value_t = 2)]
    pub(crate) redis_connections: usize,
    /// The redis-server program.
    #[arg(long, default_value = "redis-server")]
    pub(crate) redis_server: PathBuf,
    /// The sluice program (default: `sluice` next to this binary).
    #[arg(long)]
    pub(crate) sluice: Option<PathBuf>,
    /// Threads of the benchmark's own runtime (the load generator). One keeps it from
    /// competing with the server for the CPU more than it must; raise it on bigger machines.
    #[arg(long, default_value_t = 1)]
    pub(crate) threads: usize,
    /// Runtime threads of `sluice serve` (`TOKIO_WORKER_THREADS`); 0 = one per CPU, sluice's
    /// default. On a small machine that also runs Redis and the load generator, 1 wakes less
    /// and batches more: more admissions per second, but a longer tail at the fixed rate.
    #[arg(long, default_value_t = 0)]
    pub(crate) serve_threads: usize,
    /// Runtime threads of each `sluice worker`; 0 = one per CPU.
    #[arg(long, default_value_t = 0)]
    pub(crate) worker_threads: usize,
    /// Run on a local Redis Cluster (masters only, no persistence) instead of one
    /// redis-server: sluice gets `--redis-cluster`, and the report adds each master's share.
    #[arg(long)]
    pub(crate) cluster: bool,
    /// Masters of the `--cluster` cluster.
    #[arg(long, default_value_t = 3)]
    pub(crate) cluster_masters: usize,
    /// Run the whole benchmark twice, on one redis-server and then on the cluster
    /// (`--cluster-masters`), and print both reports and a comparison table.
    #[arg(long, conflicts_with = "cluster")]
    pub(crate) compare_standalone: bool,

    // Issue 12's phases (push, not poll): pickup (+ the BullMQ peer), cancel, idle.
    /// Run only the wake-up phases (pickup, the BullMQ peer, cancel, idle), none of the others.
    #[arg(long)]
    pub(crate) push_only: bool,
    /// Skip the pickup phase (and with it the BullMQ peer).
    #[arg(long)]
    pub(crate) skip_pickup: bool,
    /// Skip the BullMQ peer of the pickup phase.
    #[arg(long)]
    pub(crate) skip_bullmq: bool,
    /// Skip the cancel phase.
    #[arg(long)]
    pub(crate) skip_cancel: bool,
    /// Skip the idle-cost phase.
    #[arg(long)]
    pub(crate) skip_idle: bool,
    /// Pull workers (HTTP clients of `/api/worker/*`, in this process) of the end-to-end
    /// phase's pull run; 0 skips that run.
    #[arg(long, default_value_t = 16)]
    pub(crate) pull_workers: usize,
    /// Executions each pull worker leases per call (its concurrency).
    #[arg(long, default_value_t = 32)]
    pub(crate) pull_batch: usize,
    /// The pickup phase's idle rate, admissions per second.
    #[arg(long, default_value_t = 2.0)]
    pub(crate) pickup_idle_rate: f64,
    /// Seconds at the idle rate (20 s at 2/s: 40 samples, enough for a p99 to mean something).
    #[arg(long, default_value_t = 20.0)]
    pub(crate) pickup_idle_secs: f64,
    /// The pickup phase's fixed rate, admissions per second (0 skips it).
    #[arg(long, default_value_t = 50.0)]
    pub(crate) pickup_rate: f64,
    /// Seconds at the fixed rate and at the share of the maximum.
    #[arg(long, default_value_t = 5.0)]
    pub(crate) pickup_secs: f64,
    /// The third rate as a share of the HTTP admission maximum (measured by the admission
    /// phase of this run, or by a short probe when it is skipped); 0 skips it.
    #[arg(long, default_value_t = 0.5)]
    pub(crate) pickup_max_share: f64,
    /// Seconds of the admission probe that stands in for a skipped admission phase.
    #[arg(long, default_value_t = 3)]
    pub(crate) pickup_probe_secs: u64,
    /// Most seconds to wait after each rate for everything admitted to complete.
    #[arg(long, default_value_t = 30)]
    pub(crate) pickup_drain_secs: u64,
    /// Milliseconds between a worker's start and the first admission (a polling worker
    /// reaches its idle pause by then, a push worker its blocking reads).
    #[arg(long, default_value_t = 2000)]
    pub(crate) pickup_settle_ms: u64,
    /// The `node` program for the BullMQ peer.
    #[arg(long, default_value = "node")]
    pub(crate) node: PathBuf,
    /// Where the BullMQ peer is installed (`npm ci` of bench/bullmq; default:
    /// `bench-bullmq` in the cargo target folder, where scripts/bench.sh installs it).
    #[arg(long, env = "SLUICE_BENCH_BULLMQ_DIR")]
    pub(crate) bullmq_dir: Option<PathBuf>,
    /// Running executions cancelled in the cancel phase.
    #[arg(long, default_value_t = 32)]
    pub(crate) cancel_samples: usize,
    /// The cancels are sent spread evenly over this many milliseconds.
    #[arg(long, default_value_t = 3000)]
    pub(crate) cancel_spread_ms: u64,
    /// Most seconds after the last cancel for the handlers to stop.
    #[arg(long, default_value_t = 15)]
    pub(crate) cancel_timeout_secs: u64,
    /// `ms` of the `demo.sleep` executions cancelled (longer than the phase).
    #[arg(long, default_value_t = 60_000)]
    pub(crate) cancel_sleep_ms: u64,
    /// Seconds the idle worker's calls are counted.
    #[arg(long, default_value_t = 10)]
    pub(crate) idle_secs: u64,
    /// Milliseconds between the idle worker's start and the measurement.
    #[arg(long, default_value_t = 3000)]
    pub(crate) idle_settle_ms: u64,

    // Issue 20's fairness group: noisy neighbour (+ the BullMQ peer), weighted share,
    // scheduled-start lateness (`fairness.rs`).
    /// Run only the fairness group, none of the other phases.
    #[arg(long, conflicts_with_all = ["push_only", "skip_fairness"])]
    pub(crate) fairness_only: bool,
    /// Skip the fairness group.
    #[arg(long)]
    pub(crate) skip_fairness: bool,
    /// `--concurrency` of the noisy-neighbour phase's one worker.
    #[arg(long, default_value_t = 8)]
    pub(crate) noisy_concurrency: usize,
    /// Length of every noisy-neighbour execution (`demo.sleep`), ms.
    #[arg(long, default_value_t = 20)]
    pub(crate) noisy_exec_ms: u64,
    /// Seconds the flood keeps the worker busy: it admits concurrency × this ÷ the execution
    /// length executions (8 × 30 s ÷ 20 ms = 12 000).
    #[arg(long, default_value_t = 30.0)]
    pub(crate) noisy_flood_secs: f64,
    /// The calm tenant's admissions per second.
    #[arg(long, default_value_t = 4.0)]
    pub(crate) noisy_calm_rate: f64,
    /// The calm tenant's admissions in all (100 at 4/s: 25 s, inside the flood).
    #[arg(long, default_value_t = 100)]
    pub(crate) noisy_calm_samples: u64,
    /// Executions each weighted tenant has queued before the worker starts.
    #[arg(long, default_value_t = 2000)]
    pub(crate) weighted_backlog: u64,
    /// The first starts whose shares are counted.
    #[arg(long, default_value_t = 2000)]
    pub(crate) weighted_window: u64,
    /// Scheduled executions of the lateness phase.
    #[arg(long, default_value_t = 200)]
    pub(crate) lateness_samples: u64,
    /// Their delays are spread evenly over this many milliseconds ...
    #[arg(long, default_value_t = 3000)]
    pub(crate) lateness_spread_ms: u64,
    /// ... after this many (so every one is admitted before it is due).
    #[arg(long, default_value_t = 1000)]
    pub(crate) lateness_lead_ms: u64,

    // The batch-memory phase (`batch_memory.rs`, issue 38): four batch bodies at the limit at
    // once, serve's peak RSS and another tenant's latency beside them.
    /// Run only the batch-memory phase, none of the others.
    #[arg(long, conflicts_with_all = ["push_only", "fairness_only", "limits_only", "dlq_only", "skip_batch_memory"])]
    pub(crate) batch_memory_only: bool,
    /// Skip the batch-memory phase.
    #[arg(long)]
    pub(crate) skip_batch_memory: bool,
    /// The `--batch-body-limit` of the phase's own `serve`, and the size of each of its four
    /// bodies, in bytes.
    #[arg(long, default_value_t = 16 * 1024 * 1024)]
    pub(crate) batch_memory_body_limit: usize,
    /// Seconds of rounds of four bodies (at least one round).
    #[arg(long, default_value_t = 4.0)]
    pub(crate) batch_memory_secs: f64,
    /// The other tenant's `GET /api/me` and single admissions meanwhile, each per second.
    #[arg(long, default_value_t = 200.0)]
    pub(crate) batch_memory_rate: f64,

    // The limits group (concurrency keys and rate limits, `limits.rs`): throttle accuracy and
    // key isolation; and `--compare-keyed`.
    /// Run only the limits group (throttle accuracy, key isolation), none of the other phases.
    #[arg(long, conflicts_with_all = ["push_only", "fairness_only", "skip_limits"])]
    pub(crate) limits_only: bool,
    /// Skip the limits group.
    #[arg(long)]
    pub(crate) skip_limits: bool,
    /// The throttled tenant's `rate_limit`: starts per second.
    #[arg(long, default_value_t = 200)]
    pub(crate) throttle_rate: u32,
    /// Its `burst`: starts at once after an idle spell (any second may hold rate + burst).
    #[arg(long, default_value_t = 20)]
    pub(crate) throttle_burst: u32,
    /// Seconds of backlog: rate × this executions are queued before the worker starts (200 ×
    /// 10 = 2 000).
    #[arg(long, default_value_t = 10.0)]
    pub(crate) throttle_secs: f64,
    /// `--concurrency` of the throttle phase's one worker.
    #[arg(long, default_value_t = 64)]
    pub(crate) throttle_concurrency: usize,
    /// Key A's executions in the key-isolation phase (`demo.sleep`, queued before key B's
    /// samples; the phase does not wait for them).
    #[arg(long, default_value_t = 10_000)]
    pub(crate) key_isolation_backlog: u64,
    /// Length of each of key A's executions, ms.
    #[arg(long, default_value_t = 50)]
    pub(crate) key_isolation_exec_ms: u64,
    /// Key B's executions (`demo.echo`), whose pickup is measured ...
    #[arg(long, default_value_t = 100)]
    pub(crate) key_isolation_samples: u64,
    /// ... admitted at this rate, per second.
    #[arg(long, default_value_t = 10.0)]
    pub(crate) key_isolation_rate: f64,
    /// `--concurrency` of the key-isolation phase's one worker.
    #[arg(long, default_value_t = 8)]
    pub(crate) key_isolation_concurrency: usize,
    /// Every request of the admission phase carries a `concurrency_key`, one of N per tenant
    /// (every tenant with `max_concurrent_per_key` `--admission-key-limit`); also the keyed
    /// side of `--compare-keyed` (default there: 1000). 0 = none.
    #[arg(long, value_name = "N")]
    pub(crate) admission_keys: Option<u64>,
    /// Every tenant's `max_concurrent_per_key` when admissions carry keys.
    #[arg(long, default_value_t = 10)]
    pub(crate) admission_key_limit: u32,

    // The dead-letter group (`dead_letters.rs`): what `GET /api/dlq` costs Redis at a full
    // shard.
    /// Run only the dead-letter group, none of the other phases.
    #[arg(long, conflicts_with_all = ["push_only", "fairness_only", "limits_only", "skip_dlq"])]
    pub(crate) dlq_only: bool,
    /// Skip the dead-letter group.
    #[arg(long)]
    pub(crate) skip_dlq: bool,
    /// Executions of the neighbour tenants dead-lettered in the probe tenant's shard (more
    /// than `--dlq-cap`, 10 000 by default, so the shard is full).
    #[arg(long, default_value_t = 10_500)]
    pub(crate) dlq_records: u64,
    /// Records of the tenant whose page is listed, and the page size.
    #[arg(long, default_value_t = 50)]
    pub(crate) dlq_page: u64,
    /// Calls of each listing measured.
    #[arg(long, default_value_t = 500)]
    pub(crate) dlq_calls: u64,

    /// Instead of the phases: compare two builds of `sluice` (each a program, or a folder
    /// holding `sluice`), BEFORE then AFTER: HTTP admission and end-to-end, `--compare-runs`
    /// alternating runs per build, medians of throughput and of Redis's script time per call.
    #[arg(
        long,
        num_args = 2,
        value_names = ["BEFORE", "AFTER"],
        conflicts_with_all = ["compare_standalone", "cluster"]
    )]
    pub(crate) compare_builds: Option<Vec<PathBuf>>,
    /// Instead of the phases: HTTP admission on this build without concurrency keys (plain)
    /// and with them (keyed: `--admission-keys`, 1000 by default, per tenant, each tenant with
    /// `max_concurrent_per_key` `--admission-key-limit`), `--compare-runs` alternating runs per
    /// side of `--compare-secs`, each on a fresh Redis; medians and keyed / plain (target ≥
    /// 0.85).
    #[arg(long, conflicts_with_all = ["compare_standalone", "cluster", "compare_builds"])]
    pub(crate) compare_keyed: bool,
    /// Instead of the phases: what one execution costs Redis, sluice beside its BullMQ peer in
    /// one run (issue 39; `cost/`): bytes by structure, Redis CPU and calls per execution
    /// (`--cost-rounds` alternating rounds), redis-server instructions per execution and the
    /// per-call overhead under callgrind (`--valgrind`; NOT RUN without it), and sluice on a
    /// local cluster of `--cluster-masters` beside; PASS/FAIL against the targets.
    #[arg(long, conflicts_with_all = ["compare_standalone", "cluster", "compare_builds", "compare_keyed"])]
    pub(crate) cost: bool,
    /// `--cost`: executions queued for each bytes figure (after 8 warm-up admissions).
    #[arg(long, default_value_t = 100_000)]
    pub(crate) cost_count: u64,
    /// `--cost`: executions completed (and kept) for the bytes per retained completed one.
    #[arg(long, default_value_t = 20_000)]
    pub(crate) cost_completed_count: u64,
    /// `--cost`: rounds of the Redis CPU measurement, each side on a fresh redis-server per
    /// round, in the order A B, B A, ...; the medians are compared.
    #[arg(long, default_value_t = 5)]
    pub(crate) cost_rounds: usize,
    /// `--cost`: executions each CPU round admits over HTTP as a backlog before draining it.
    #[arg(long, default_value_t = 20_000)]
    pub(crate) cost_backlog: u64,
    /// `--cost`: executions of each side's end-to-end run under callgrind (at least 4,000 for
    /// the target to be judged).
    #[arg(long, default_value_t = 4_000)]
    pub(crate) cost_callgrind_count: u64,
    /// `--cost`: admissions per second of the callgrind run (open loop): low enough that no
    /// call times out against a Redis ~50 times slower.
    #[arg(long, default_value_t = 25.0)]
    pub(crate) cost_callgrind_rate: f64,
    /// `--cost`: seconds of the idle window measured under callgrind before the executions
    /// (its instructions per second are subtracted from the executions' window).
    #[arg(long, default_value_t = 10)]
    pub(crate) cost_idle_secs: u64,
    /// `--cost`: replays of each captured call, and of its bare script, under callgrind.
    #[arg(long, default_value_t = 2_000)]
    pub(crate) cost_replays: u64,
    /// `--cost`: most seconds a drain (workers completing what was admitted) may take.
    #[arg(long, default_value_t = 180)]
    pub(crate) cost_drain_secs: u64,
    /// `--cost`: leave out sluice's figures on a local Redis Cluster.
    #[arg(long)]
    pub(crate) cost_skip_cluster: bool,
    /// `--cost`: the key layout sluice's fresh Redis records for the bytes figures (4, the
    /// current one, or 5: binary ids, reached only by a first start told so; see
    /// `--initial-layout`), so a storage change of layout 5 is measured before it is current.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(4..=5))]
    pub(crate) cost_layout: u32,
    /// `--cost`: only the bytes by structure (no CPU rounds, no callgrind): seconds instead of
    /// minutes, for checking a storage change.
    #[arg(long)]
    pub(crate) cost_bytes_only: bool,
    /// `--cost`: measure only the per-call overhead (the replayed admission and the repeated
    /// completion under callgrind), not bytes, Redis CPU or instructions per execution, and
    /// without the BullMQ peer: a minute or two, for working on the Lua.
    #[arg(long)]
    pub(crate) cost_overhead_only: bool,
    /// The valgrind program (`--cost`'s instruction counts; Debian's package `valgrind`).
    #[arg(long, default_value = "valgrind")]
    pub(crate) valgrind: PathBuf,

    /// Instead of the phases: `sluice serve`'s own CPU per HTTP admission (`serve_cpu.rs`):
    /// serve's user-space instructions (under callgrind, `--valgrind`; or `--serve-cpu-perf`)
    /// and the CPU time of serve and redis-server, per admission over exactly
    /// `--serve-cpu-count` admissions; one build, or two (BEFORE AFTER) alternating for
    /// `--serve-cpu-runs` rounds (each a program or a folder holding `sluice`).
    #[arg(
        long,
        num_args = 1..=2,
        value_names = ["BUILD"],
        conflicts_with_all = ["compare_standalone", "cluster", "compare_builds", "compare_keyed", "cost"]
    )]
    pub(crate) serve_cpu: Option<Vec<PathBuf>>,
    /// `--serve-cpu`: count with `perf stat -e instructions:u` (needs hardware counters)
    /// instead of callgrind.
    #[arg(long)]
    pub(crate) serve_cpu_perf: bool,
    /// `--serve-cpu`: admissions counted per run.
    #[arg(long, default_value_t = 4_000)]
    pub(crate) serve_cpu_count: u64,
    /// `--serve-cpu`: admissions sent before the count starts (connections, pools, allocator).
    #[arg(long, default_value_t = 1_000)]
    pub(crate) serve_cpu_warmup: u64,
    /// `--serve-cpu`: rounds (each build once per round, alternating).
    #[arg(long, default_value_t = 3)]
    pub(crate) serve_cpu_runs: usize,
    /// The perf program (`--serve-cpu --serve-cpu-perf`).
    #[arg(long, default_value = "perf")]
    pub(crate) perf: PathBuf,

    /// Runs per build of `--compare-builds` (per side of `--compare-keyed`).
    #[arg(long, default_value_t = 5)]
    pub(crate) compare_runs: usize,
    /// Seconds of each phase of each `--compare-builds` (`--compare-keyed`) run.
    #[arg(long, default_value_t = 5)]
    pub(crate) compare_secs: u64,
}

impl Args {
    /// Concurrency keys per tenant of the admission phase (`--admission-keys`; 0 is none).
    pub(crate) fn admission_keys(&self) -> Option<u64> {
        self.admission_keys.filter(|n| *n > 0)
    }

    pub(crate) fn smoke_sized(mut self) -> Self {
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
            self.e2e_rounds = 1;
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
            // 300 dead letters of 1 neighbour and 5 of the page tenant, 20 calls per listing.
            self.dlq_records = self.dlq_records.min(300);
            self.dlq_page = self.dlq_page.min(5);
            self.dlq_calls = self.dlq_calls.min(20);
            self.compare_secs = 1;
            // Four bodies of 256 KiB (1,000 items of about 260 bytes), one round or two.
            self.batch_memory_body_limit = self.batch_memory_body_limit.min(256 * 1024);
            self.batch_memory_secs = self.batch_memory_secs.min(0.5);
            // The cost measurement at tiny counts and without callgrind (see `cost`).
            self.cost_count = self.cost_count.min(500);
            self.cost_completed_count = self.cost_completed_count.min(200);
            self.cost_rounds = self.cost_rounds.min(1);
            self.cost_backlog = self.cost_backlog.min(300);
            self.cost_replays = self.cost_replays.min(20);
            self.cost_drain_secs = self.cost_drain_secs.min(30);
        }
        self
    }
}
