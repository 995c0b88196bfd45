//! The benchmark's report: the measured numbers, the speed targets with PASS/FAIL, the CPU each
//! process used per phase (where the time goes), and the correctness checks. Printed for people
//! or, with `--json`, as one JSON document. On a Redis Cluster it also has each master's share
//! (admissions/s and script CPU); `--compare-standalone` puts two reports side by side.

use std::fmt::Write;

use serde::Serialize;

use crate::Args;
use crate::load::{LoadResult, Outcomes, Percentiles};

/// CPU a process used during a phase, in cores (1.0 = one core busy all the time).
#[derive(Debug, Clone, Serialize)]
pub struct CpuShare {
    pub process: String,
    pub cores: f64,
}

/// Throughput and latency of one load phase.
#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    /// New executions admitted per second (201s, or `Created` on the direct path).
    pub per_sec: f64,
    pub seconds: f64,
    pub outcomes: Outcomes,
    pub latency: Percentiles,
    pub cpu: Vec<CpuShare>,
    /// Redis's time in scripts per 2xx answer (new or replayed), µs, from `INFO commandstats`.
    pub redis_script_us_per_request: f64,
    /// On a cluster: each master's share of the phase.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_master: Option<Vec<MasterShare>>,
}

/// The admission phase's script calls (group commit): how many admissions each carried.
#[derive(Debug, Clone, Serialize)]
pub struct AdmissionCalls {
    pub calls: u64,
    pub admissions: u64,
}

/// The admission phase's load against the BullMQ HTTP peer (`peer.mjs --role http`).
#[derive(Debug, Clone, Serialize)]
pub struct PeerAdmission {
    pub versions: PeerVersions,
    pub phase: Phase,
}

/// HTTP admission with tenant API keys: what authentication costs the one `{acl}` slot.
#[derive(Debug, Clone, Serialize)]
pub struct ApiKeyAdmission {
    pub phase: Phase,
    /// Key lookups on `{acl}` during the phase (`api_key_auth.lua`, counted by its
    /// `SISMEMBER` in `INFO commandstats`).
    pub acl_lookups: u64,
    pub acl_lookups_per_admission: f64,
}

/// One master's share of a phase on a cluster.
#[derive(Debug, Clone, Serialize)]
pub struct MasterShare {
    /// `127.0.0.1:<port>`.
    pub node: String,
    /// Executions this master holds after the phase (admitted, or completed end-to-end).
    pub executions: u64,
    /// Those per second of the phase (end-to-end: of its span).
    pub per_sec: f64,
    /// Microseconds this master spent in scripts during the phase (`INFO commandstats`).
    pub script_us: u64,
    /// The same as a share of one core over the phase.
    pub script_cores: f64,
}

impl MasterShare {
    /// Shares of `executions[i]` per node over `secs`, with each node's script time.
    pub fn of(nodes: &[String], executions: &[u64], script_us: &[u64], secs: f64) -> Vec<Self> {
        let secs = secs.max(1e-3);
        nodes
            .iter()
            .enumerate()
            .map(|(i, node)| {
                let n = executions.get(i).copied().unwrap_or(0);
                let us = script_us.get(i).copied().unwrap_or(0);
                Self {
                    node: node.clone(),
                    executions: n,
                    per_sec: n as f64 / secs,
                    script_us: us,
                    script_cores: round2(us as f64 / 1e6 / secs),
                }
            })
            .collect()
    }
}

/// A master of the cluster and what it serves.
#[derive(Debug, Clone, Serialize)]
pub struct Master {
    /// `127.0.0.1:<port>`.
    pub node: String,
    /// The shards whose hash tag's slot it serves.
    pub shards: Vec<u16>,
    /// How many of the benchmark's tenants live in those shards.
    pub tenants: usize,
}

impl Phase {
    /// The phase's numbers; `script_us` is Redis's script time during it.
    pub fn from(r: &LoadResult, cpu: Vec<CpuShare>, script_us: u64) -> Self {
        let secs = r.elapsed.as_secs_f64().max(1e-3);
        let answered = (r.outcomes.created + r.outcomes.replayed).max(1);
        Self {
            per_sec: r.outcomes.created as f64 / secs,
            seconds: secs,
            outcomes: r.outcomes.clone(),
            latency: r.latencies.percentiles(),
            cpu,
            redis_script_us_per_request: round2(script_us as f64 / answered as f64),
            per_master: None,
        }
    }
}

/// The open-loop phase.
#[derive(Debug, Clone, Serialize)]
pub struct FixedRate {
    /// The scheduled rate (a share of the admission maximum).
    pub target_per_sec: f64,
    /// Latency counts from each request's scheduled send time.
    pub phase: Phase,
}

/// The batch admission phases.
#[derive(Debug, Clone, Serialize)]
pub struct BatchPhase {
    /// Items per batch.
    pub size: u64,
    /// Tenants sending batches at once (one client each) in the first phase.
    pub tenants: usize,
    /// Batches alone: `per_sec` counts items admitted; latency is one batch's.
    pub phase: Phase,
    /// The fixed rate the other tenants' single admissions were sent at beside one tenant's
    /// batches.
    pub singles_rate: f64,
    /// Those single admissions: latency from the scheduled time.
    pub singles_beside: Phase,
    /// Items the batches admitted meanwhile.
    pub batch_items_beside: u64,
}

/// The end-to-end phase.
#[derive(Debug, Clone, Serialize)]
pub struct E2e {
    pub admitted: u64,
    pub completed: u64,
    /// Admissions per second while admitting (with workers competing for the CPU).
    pub admission_per_sec: f64,
    /// Completed executions per second, from the first admission to the last completion.
    pub per_sec: f64,
    pub span_secs: f64,
    /// From the row's `created` to its `finished` (Redis clock, millisecond resolution).
    pub admit_to_completed: Option<Percentiles>,
    /// Redis's time in scripts (admit + start + complete) per completed execution, µs.
    pub redis_script_us_per_execution: f64,
    /// The HTTP side of the phase (and CPU of every process, workers included).
    pub http: Phase,
    /// On a cluster: each master's completed executions per second of the span, and its
    /// script time over the whole phase.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_master: Option<Vec<MasterShare>>,
}

/// Redis memory per queued execution.
#[derive(Debug, Clone, Serialize)]
pub struct Memory {
    /// `dispatched` (on a ready stream, holding a slot) or `waiting`.
    pub state: &'static str,
    /// Every execution with its own dedup key (what the target is judged on).
    pub with_dedup_key: MemoryPoint,
    /// The same without dedup keys (no mapping key with its TTL).
    pub without_dedup_key: Option<MemoryPoint>,
}

/// One memory measurement: `used_memory` before and after queueing `executions`.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryPoint {
    pub executions: u64,
    pub used_memory_before: u64,
    pub used_memory_after: u64,
    pub bytes_per_execution: f64,
    /// `MEMORY USAGE` per execution by key kind (rows, dedup mappings, indexes, ...).
    pub by_kind: std::collections::BTreeMap<&'static str, f64>,
}

/// One side (sluice or BullMQ) of one rate of the pickup phase.
#[derive(Debug, Clone, Serialize)]
pub struct PickupSide {
    /// Executions admitted (sluice: 201 answers; BullMQ: jobs added).
    pub admitted: u64,
    /// Admissions that failed.
    pub errors: u64,
    pub completed: u64,
    /// Not started by the end of the drain (their age then is in `pickup`: a lower bound).
    pub not_started: u64,
    /// Creation → start (sluice: the row's `created`/`started`, Redis clock; BullMQ:
    /// `job.timestamp`/`job.processedOn`), ms resolution.
    pub pickup: Percentiles,
    /// Creation → completion (`finished` / `job.finishedOn`).
    pub admit_to_completed: Percentiles,
    /// CPU per process while admitting (sluice only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub cpu: Vec<CpuShare>,
}

/// One rate of the pickup phase, sluice and BullMQ side by side.
#[derive(Debug, Clone, Serialize)]
pub struct PickupRate {
    /// `idle`, `fixed`, or `50 % of max`.
    pub label: String,
    /// Admissions (jobs) per second, open loop.
    pub rate: f64,
    pub secs: f64,
    pub sluice: PickupSide,
    /// Absent when the peer did not run (see `Pickup::peer_note`).
    pub bullmq: Option<PickupSide>,
}

/// Versions of the BullMQ peer.
#[derive(Debug, Clone, Serialize)]
pub struct PeerVersions {
    pub bullmq: String,
    pub node: String,
}

/// The pickup phase: one `sluice worker` with default settings, and the BullMQ peer.
#[derive(Debug, Clone, Serialize)]
pub struct Pickup {
    /// The worker's command line (no settings: the defaults).
    pub worker: String,
    /// Where the rate "of max" came from: the admission phase of this run, or a probe.
    pub max_source: String,
    pub rates: Vec<PickupRate>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer: Option<PeerVersions>,
    /// Why the peer did not run, when it did not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer_note: Option<String>,
}

/// The cancel phase: how long a cancel of a running execution takes to stop its handler.
#[derive(Debug, Clone, Serialize)]
pub struct CancelPhase {
    /// Default workers (each with the default concurrency) that ran the samples at once.
    pub workers: usize,
    pub worker_concurrency: usize,
    pub requested: u64,
    /// Cancels answered 200 while the execution ran (`cancel_requested: true`).
    pub accepted: u64,
    /// Rows that became `cancelled`.
    pub cancelled: u64,
    /// Not cancelled within `timeout_secs` of the last send (counted at that age).
    pub not_reached: u64,
    /// The sends are spread evenly over this window.
    pub spread_ms: u64,
    pub timeout_secs: u64,
    /// Send (client clock) → the row's `finished` (Redis clock; the same machine).
    pub latency: Percentiles,
}

/// The idle phase: what an idle worker costs Redis.
#[derive(Debug, Clone, Serialize)]
pub struct IdleCost {
    /// Whether `sluice serve` ran meanwhile.
    pub serve: &'static str,
    pub window_secs: f64,
    /// Shards the worker serves (hashed + dedicated, from the shard map in force).
    pub shards: usize,
    /// The worker's safety-poll interval (`--scan-ms` default, from `sluice::config`).
    pub scan_ms: u64,
    /// Calls the worker sent (`MONITOR`: top-level commands, a script call counts once).
    pub calls: u64,
    pub calls_per_sec: f64,
    /// `INFO commandstats`: every command Redis ran, also inside scripts (the benchmark's
    /// own INFO excluded).
    pub commands_per_sec: f64,
    /// `INFO commandstats`: script calls (EVAL, EVALSHA, FCALL and their `_ro` forms).
    pub script_calls_per_sec: f64,
    /// `calls_per_sec × scan_ms / shards`: what the target is judged on.
    pub per_shard_per_interval: f64,
    /// The calls sent, by command.
    pub by_command: std::collections::BTreeMap<String, u64>,
}

/// One system's side of the noisy-neighbour phase (fairness group).
#[derive(Debug, Clone, Serialize)]
pub struct NoisySide {
    pub flood_admitted: u64,
    pub calm_admitted: u64,
    /// Admissions (jobs added) that failed.
    pub errors: u64,
    pub completed: u64,
    /// Not started by the end of the drain (counted at their age then: a lower bound).
    pub not_started: u64,
    /// Calm executions admitted before the flood's last start: the ones the flood could delay.
    pub calm_during_flood: u64,
    /// From the flood's first start to its last: how long it kept the worker busy.
    pub flood_span_secs: f64,
    /// The calm tenant's pickup (created → started), ms.
    pub calm: Percentiles,
    /// The flood's pickup.
    pub flood: Percentiles,
}

/// The noisy-neighbour phase: a flood and a calm tenant in one shard, sluice and BullMQ.
#[derive(Debug, Clone, Serialize)]
pub struct NoisyNeighbour {
    /// The worker's command line.
    pub worker: String,
    pub flood_tenant: String,
    pub calm_tenant: String,
    /// The shard both tenants hash to.
    pub shard: u16,
    pub flood_count: u64,
    /// Length of every execution (flood and calm), ms.
    pub execution_ms: u64,
    pub calm_rate: f64,
    pub sluice: NoisySide,
    pub bullmq: Option<NoisySide>,
    /// Why the peer did not run, when it did not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer_note: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer: Option<PeerVersions>,
}

/// The weighted-share phase: two backlogged tenants of one shard, weights 1 and 3.
#[derive(Debug, Clone, Serialize)]
pub struct WeightedShare {
    /// The tenant of weight 1 and the one of weight 3.
    pub light: String,
    pub heavy: String,
    pub shard: u16,
    /// Whether `PUT /api/tenants/{t}` took `weight` (a build without it answers 400).
    pub weights_supported: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weights_note: Option<String>,
    /// Executions admitted per tenant before the worker started.
    pub backlog: u64,
    /// The first starts counted.
    pub window: u64,
    /// `start log` (the shard's `starts` stream) or `rows by started` (the fallback).
    pub source: &'static str,
    /// Starts found in the window (fewer than `window` if the run fell short).
    pub counted: u64,
    pub light_share_pct: f64,
    pub heavy_share_pct: f64,
}

/// The scheduled-start lateness phase.
#[derive(Debug, Clone, Serialize)]
pub struct Lateness {
    /// Whether admission took `delay` (a build without it answers 400).
    pub supported: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    pub samples: u64,
    /// The delays are spread over this window (after `lead_ms`).
    pub spread_ms: u64,
    pub lead_ms: u64,
    /// Where the due time came from: the row's `run_at` (or `ready_at`), or `created` + the
    /// delay asked.
    pub due_from: String,
    /// Started − due, ms (Redis clock); early starts count as 0 here and in `early`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lateness: Option<Percentiles>,
    /// Starts before their due time: a correctness failure.
    pub early: u64,
    /// The earliest of them, ms before due.
    pub most_early_ms: u64,
    pub completed: u64,
}

/// The fairness group (issue 20): noisy neighbour, weighted share, scheduled-start lateness.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Fairness {
    pub noisy: Option<NoisyNeighbour>,
    pub weighted: Option<WeightedShare>,
    pub lateness: Option<Lateness>,
}

/// The throttle-accuracy phase: one rate-limited tenant's backlog drained by one worker.
#[derive(Debug, Clone, Serialize)]
pub struct Throttle {
    /// Whether `PUT /api/tenants/{t}` took `rate_limit` (a build without it answers 400).
    pub supported: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    pub tenant: String,
    pub shard: u16,
    /// The limit: `rate` starts per second, `burst` at once.
    pub rate: u32,
    pub burst: u32,
    /// Executions queued before the worker started (rate × `--throttle-secs`).
    pub backlog: u64,
    /// The worker's command line.
    pub worker: String,
    /// `start log` (the shard's `starts` stream), or `rows by started` when the log had been
    /// trimmed below the backlog.
    pub source: &'static str,
    /// Starts found (all of the backlog's, unless the run fell short).
    pub starts: u64,
    pub completed: u64,
    /// The most starts in any window of one second (`[t, t + 1000 ms)`, Redis clock).
    pub busiest_window: u64,
    /// `rate + burst`: what any window may hold; more is a correctness failure.
    pub window_limit: u64,
    /// From the first start to the last, s.
    pub span_secs: f64,
    /// The starts after the first `burst`, per second: (starts − burst − 1) intervals over
    /// the time from the (burst + 1)-th start to the last.
    pub steady_per_sec: f64,
    /// The same as a share of `rate`, %.
    pub steady_pct: f64,
}

/// The key-isolation phase: key A at its limit (1) with a long queue, key B admitted at a
/// steady rate beside it, in one tenant.
#[derive(Debug, Clone, Serialize)]
pub struct KeyIsolation {
    /// Whether `PUT /api/tenants/{t}` took `max_concurrent_per_key` (a build without
    /// concurrency keys answers 400).
    pub supported: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    pub tenant: String,
    /// The worker's command line.
    pub worker: String,
    /// The tenant's `max_concurrent_per_key`.
    pub key_limit: u32,
    /// Key A's executions admitted (`demo.sleep` of `a_exec_ms`) before B's samples.
    pub a_admitted: u64,
    pub a_exec_ms: u64,
    /// Key B's `demo.echo` executions: the rate they were admitted at and how many were.
    pub b_rate: f64,
    pub b_admitted: u64,
    /// Admissions (A's and B's) that failed.
    pub errors: u64,
    /// B's pickup (created → started, Redis clock), ms; one not started counted at its age.
    pub b_pickup: Percentiles,
    pub b_not_started: u64,
    /// A's executions started and completed by the end (the phase does not wait for A).
    pub a_started: u64,
    pub a_completed: u64,
    /// A's completions per second from its first start to its last end.
    pub a_per_sec: f64,
    /// The most of A's executions running at once, from the rows' `started`/`finished` (a
    /// hand-over in the same millisecond is no overlap); more than the key limit is a
    /// correctness failure.
    pub a_most_at_once: u64,
}

/// The limits group: throttle accuracy, key isolation.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Limits {
    pub throttle: Option<Throttle>,
    pub key_isolation: Option<KeyIsolation>,
}

/// One correctness check.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub phase: String,
    pub ok: bool,
    /// The counts compared: what clients were told, what Redis holds.
    pub detail: String,
}

/// One speed target.
#[derive(Debug, Clone, Serialize)]
pub struct Target {
    pub name: String,
    pub measured: f64,
    pub limit: f64,
    pub unit: &'static str,
    pub pass: bool,
}

/// Settings the numbers depend on.
#[derive(Debug, Clone, Serialize)]
pub struct Settings {
    pub build: &'static str,
    pub cpus: usize,
    pub smoke: bool,
    pub clients: usize,
    pub tenants: usize,
    pub replay_percent: u64,
    pub fixed_rate_share: f64,
    pub workers: usize,
    pub worker_concurrency: usize,
    pub redis_connections: usize,
    /// 0 = tokio's default (one per CPU).
    pub serve_threads: usize,
    pub worker_threads: usize,
    pub bench_threads: usize,
    /// Concurrency keys per tenant the admission phase's requests carried (`--admission-keys`;
    /// absent: none), and every tenant's `max_concurrent_per_key` then.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admission_keys: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admission_key_limit: Option<u32>,
    /// Masters of the Redis Cluster the run used (absent: one standalone server).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster_masters: Option<usize>,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub settings: Settings,
    /// On a cluster: its masters, the shards each serves and the tenants in them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub masters: Option<Vec<Master>>,
    pub ceiling: Option<Phase>,
    pub admission: Option<Phase>,
    /// The admission phase's calls of `admit.lua` (group commit).
    pub admission_calls: Option<AdmissionCalls>,
    /// The admission phase's load against the BullMQ HTTP peer.
    pub admission_peer: Option<PeerAdmission>,
    /// Why the HTTP peer did not run, when it did not.
    pub admission_peer_note: Option<String>,
    /// The admission phase with a tenant API key per tenant.
    pub api_key_admission: Option<ApiKeyAdmission>,
    pub replay_mix: Option<Phase>,
    pub fixed_rate: Option<FixedRate>,
    /// Batch admission, alone and beside single admissions.
    pub batch: Option<BatchPhase>,
    pub e2e: Option<E2e>,
    /// The end-to-end phase again, run by pull workers over HTTP (`/api/worker/*`).
    pub e2e_pull: Option<E2e>,
    pub memory: Option<Memory>,
    /// Issue 12's phases.
    pub pickup: Option<Pickup>,
    pub cancel: Option<CancelPhase>,
    pub idle: Option<IdleCost>,
    /// Issue 20's fairness group.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fairness: Option<Fairness>,
    /// The limits group (concurrency keys, rate limits).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limits: Option<Limits>,
    pub targets: Vec<Target>,
    pub checks: Vec<Check>,
    /// Every check passed.
    pub correct: bool,
    /// Every target met.
    pub targets_met: bool,
}

impl Report {
    pub fn new(args: &Args) -> Self {
        Self {
            settings: Settings {
                build: if cfg!(debug_assertions) {
                    "debug"
                } else {
                    "release"
                },
                cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
                smoke: args.smoke,
                clients: args.clients,
                tenants: args.tenants,
                replay_percent: args.replay_percent,
                fixed_rate_share: args.fixed_rate_share,
                workers: args.workers,
                worker_concurrency: args.worker_concurrency,
                redis_connections: args.redis_connections,
                serve_threads: args.serve_threads,
                worker_threads: args.worker_threads,
                bench_threads: args.threads,
                admission_keys: args.admission_keys(),
                admission_key_limit: args.admission_keys().map(|_| args.admission_key_limit),
                cluster_masters: args.cluster.then_some(args.cluster_masters),
            },
            masters: None,
            ceiling: None,
            admission: None,
            admission_calls: None,
            admission_peer: None,
            admission_peer_note: None,
            api_key_admission: None,
            replay_mix: None,
            fixed_rate: None,
            batch: None,
            e2e: None,
            e2e_pull: None,
            memory: None,
            pickup: None,
            cancel: None,
            idle: None,
            fairness: None,
            limits: None,
            targets: Vec::new(),
            checks: Vec::new(),
            correct: false,
            targets_met: false,
        }
    }

    /// Evaluates the targets and the overall verdicts.
    pub fn finish(&mut self) {
        let mut t = Vec::new();
        if let (Some(c), Some(a)) = (&self.ceiling, &self.admission) {
            let ratio = a.per_sec / c.per_sec.max(1e-9);
            t.push(Target {
                name: "admission / single-call ceiling".into(),
                measured: round2(ratio),
                limit: 1.0,
                unit: "ratio, at least",
                pass: ratio >= 1.0,
            });
        }
        if let (Some(p), Some(a)) = (&self.admission_peer, &self.admission) {
            let ratio = a.per_sec / p.phase.per_sec.max(1e-9);
            t.push(Target {
                name: "admission / BullMQ HTTP peer".into(),
                measured: round2(ratio),
                limit: 1.5,
                unit: "ratio, at least",
                pass: ratio >= 1.5,
            });
        }
        if let Some(k) = &self.api_key_admission {
            t.push(Target {
                name: "{acl} lookups per admission with API keys".into(),
                measured: (k.acl_lookups_per_admission * 10_000.0).round() / 10_000.0,
                limit: 0.01,
                unit: "calls, at most",
                pass: k.acl_lookups_per_admission <= 0.01,
            });
        }
        if let Some(f) = &self.fixed_rate {
            t.push(Target {
                name: "p99 at fixed rate".into(),
                measured: f.phase.latency.p99_ms,
                limit: 5.0,
                unit: "ms, at most",
                pass: f.phase.latency.p99_ms <= 5.0,
            });
        }
        if let (Some(b), Some(a)) = (&self.batch, &self.admission) {
            let ratio = b.phase.per_sec / a.per_sec.max(1e-9);
            t.push(Target {
                name: "batch admission / single admission".into(),
                measured: round2(ratio),
                limit: 5.0,
                unit: "ratio, at least",
                pass: ratio >= 5.0,
            });
            t.push(Target {
                name: "other tenants' p99 beside batches".into(),
                measured: b.singles_beside.latency.p99_ms,
                limit: 5.0,
                unit: "ms, at most",
                pass: b.singles_beside.latency.p99_ms <= 5.0,
            });
        }
        if let (Some(e), Some(a)) = (&self.e2e, &self.admission) {
            let ratio = e.per_sec / a.per_sec.max(1e-9);
            t.push(Target {
                name: "end-to-end / admission".into(),
                measured: round2(ratio),
                limit: 0.5,
                unit: "ratio, at least",
                pass: ratio >= 0.5,
            });
        }
        if let Some(m) = &self.memory {
            t.push(Target {
                name: "Redis memory per queued execution".into(),
                measured: m.with_dedup_key.bytes_per_execution.round(),
                limit: 1024.0,
                unit: "bytes, at most",
                pass: m.with_dedup_key.bytes_per_execution <= 1024.0,
            });
        }
        self.push_targets(&mut t);
        self.fairness_targets(&mut t);
        self.limits_targets(&mut t);
        self.targets_met = t.iter().all(|t| t.pass);
        self.targets = t;
        self.correct = !self.checks.is_empty() && self.checks.iter().all(|c| c.ok);
    }

    /// The report for people.
    pub fn human(&self) -> String {
        let mut o = String::new();
        let s = &self.settings;
        let _ = writeln!(
            o,
            "\nsluice benchmark — {} build, {} CPUs, {} clients, {} tenants{}{}",
            s.build,
            s.cpus,
            s.clients,
            s.tenants,
            match s.cluster_masters {
                Some(n) => format!(", Redis Cluster of {n} masters (no replicas)"),
                None => String::new(),
            },
            if s.smoke {
                " (SMOKE RUN: numbers mean nothing)"
            } else {
                ""
            }
        );
        let _ = writeln!(
            o,
            "\n{:<24} {:>12} {:>9} {:>9} {:>9}   notes",
            "phase", "per second", "p50 ms", "p99 ms", "p99.9 ms"
        );
        let line = |o: &mut String, name: &str, rate: f64, l: &Percentiles, note: String| {
            let _ = writeln!(
                o,
                "{name:<24} {rate:>12.0} {:>9.2} {:>9.2} {:>9.2}   {note}",
                l.p50_ms, l.p99_ms, l.p999_ms
            );
        };
        if let Some(p) = &self.ceiling {
            line(
                &mut o,
                "ceiling (one call each)",
                p.per_sec,
                &p.latency,
                format!("{} admitted in {:.1} s", p.outcomes.created, p.seconds),
            );
        }
        let ceiling = self.ceiling.as_ref().map(|c| c.per_sec).unwrap_or(0.0);
        if let Some(p) = &self.admission {
            line(
                &mut o,
                "admission (HTTP)",
                p.per_sec,
                &p.latency,
                format!(
                    "{:.2} × ceiling{}{}",
                    p.per_sec / ceiling.max(1e-9),
                    match &self.admission_calls {
                        Some(c) => format!(
                            "; {} script calls carried {} admissions (mean group {:.2})",
                            c.calls,
                            c.admissions,
                            c.admissions as f64 / c.calls.max(1) as f64
                        ),
                        None => String::new(),
                    },
                    match (s.admission_keys, s.admission_key_limit) {
                        (Some(n), Some(l)) => format!(
                            "; each request with a concurrency_key, {n} per tenant \
                             (max_concurrent_per_key {l})"
                        ),
                        _ => String::new(),
                    }
                ),
            );
        }
        if let Some(p) = &self.admission_peer {
            let sluice = self.admission.as_ref().map(|a| a.per_sec).unwrap_or(0.0);
            line(
                &mut o,
                "admission, BullMQ peer",
                p.phase.per_sec,
                &p.phase.latency,
                format!(
                    "Node {} HTTP + BullMQ {} Queue.add (jobId dedup, no quota), one process \
                     per CPU; sluice is {:.2} × this",
                    p.versions.node,
                    p.versions.bullmq,
                    sluice / p.phase.per_sec.max(1e-9)
                ),
            );
        } else if let Some(note) = &self.admission_peer_note {
            let _ = writeln!(o, "{:<24} {note}", "admission, BullMQ peer");
        }
        if let Some(k) = &self.api_key_admission {
            let admin = self.admission.as_ref().map(|a| a.per_sec).unwrap_or(0.0);
            line(
                &mut o,
                "admission (API keys)",
                k.phase.per_sec,
                &k.phase.latency,
                format!(
                    "{:.2} × admin-token admission; {} {{acl}} lookups ({:.4} per admission)",
                    k.phase.per_sec / admin.max(1e-9),
                    k.acl_lookups,
                    k.acl_lookups_per_admission
                ),
            );
        }
        if let Some(p) = &self.replay_mix {
            line(
                &mut o,
                &format!("admission, {} % replays", s.replay_percent),
                p.per_sec,
                &p.latency,
                format!(
                    "new only; plus {} replays answered 200",
                    p.outcomes.replayed
                ),
            );
        }
        if let Some(f) = &self.fixed_rate {
            line(
                &mut o,
                "fixed rate (open loop)",
                f.phase.per_sec,
                &f.phase.latency,
                format!(
                    "scheduled {:.0}/s ({:.0} % of admission); latency from schedule",
                    f.target_per_sec,
                    s.fixed_rate_share * 100.0
                ),
            );
        }
        if let Some(b) = &self.batch {
            let single = self.admission.as_ref().map(|a| a.per_sec).unwrap_or(0.0);
            line(
                &mut o,
                "batch admission",
                b.phase.per_sec,
                &b.phase.latency,
                format!(
                    "executions/s in batches of {} ({} tenants at once; latency per batch); \
                     {:.2} × single admission",
                    b.size,
                    b.tenants,
                    b.phase.per_sec / single.max(1e-9)
                ),
            );
            line(
                &mut o,
                "  singles beside a batch",
                b.singles_beside.per_sec,
                &b.singles_beside.latency,
                format!(
                    "other tenants at {:.0}/s (open loop, latency from schedule) while one \
                     tenant's batches admitted {} executions",
                    b.singles_rate, b.batch_items_beside
                ),
            );
        }
        if let Some(e) = &self.e2e
            && let Some(l) = &e.admit_to_completed
        {
            line(
                &mut o,
                "end-to-end (demo.echo)",
                e.per_sec,
                l,
                format!(
                    "admit→completed; {} completed in {:.1} s, admitted at {:.0}/s",
                    e.completed, e.span_secs, e.admission_per_sec
                ),
            );
        }
        if let Some(e) = &self.e2e {
            line(
                &mut o,
                "  its HTTP admissions",
                e.http.per_sec,
                &e.http.latency,
                "while workers run what is admitted".into(),
            );
        }
        if let Some(p) = &self.e2e_pull
            && let Some(l) = &p.admit_to_completed
        {
            let ratio = self
                .e2e
                .as_ref()
                .map(|e| p.per_sec / e.per_sec.max(1e-9))
                .unwrap_or(0.0);
            line(
                &mut o,
                "end-to-end, pull API",
                p.per_sec,
                l,
                format!(
                    "pull workers over HTTP; {} completed in {:.1} s; {:.2} × `sluice worker`",
                    p.completed, p.span_secs, ratio
                ),
            );
        }
        if let Some(m) = &self.memory {
            let points = [
                ("memory, dedup key", Some(&m.with_dedup_key)),
                ("memory, no dedup key", m.without_dedup_key.as_ref()),
            ];
            for (name, p) in points {
                let Some(p) = p else { continue };
                let _ = writeln!(
                    o,
                    "{name:<24} {:>12.0} bytes of Redis used_memory per {} execution \
                     ({} executions: {} → {})",
                    p.bytes_per_execution,
                    m.state,
                    p.executions,
                    p.used_memory_before,
                    p.used_memory_after
                );
                let parts: Vec<String> = p
                    .by_kind
                    .iter()
                    .filter(|(_, b)| **b >= 1.0)
                    .map(|(k, b)| format!("{k} {b:.0}"))
                    .collect();
                let _ = writeln!(
                    o,
                    "{:<24} {:>12}   by key kind: {}",
                    "",
                    "",
                    parts.join(", ")
                );
            }
        }

        self.human_per_master(&mut o);
        self.human_push(&mut o);
        self.human_fairness(&mut o);
        self.human_limits(&mut o);

        self.human_cpu(&mut o);
        self.human_targets_and_checks(&mut o);
        o
    }

    /// CPU per phase (the phases before the wake-up ones; theirs is in the JSON report).
    fn human_cpu(&self, o: &mut String) {
        if self.ceiling.is_none()
            && self.admission.is_none()
            && self.replay_mix.is_none()
            && self.fixed_rate.is_none()
            && self.e2e.is_none()
        {
            return;
        }
        let _ = writeln!(o, "\nCPU per phase, in cores (where the time goes):");
        let _ = writeln!(
            o,
            "  (rest = everything else on the machine: other processes, interrupts; and Redis's"
        );
        let _ = writeln!(
            o,
            "  own time in scripts per request, or per execution end-to-end)"
        );
        let mut cpu_line = |name: &str, cpu: &[CpuShare], script_us: f64| {
            let parts: Vec<String> = cpu
                .iter()
                .map(|c| format!("{} {:.2}", c.process, c.cores))
                .collect();
            let _ = writeln!(
                o,
                "  {name:<14} {}   redis scripts {script_us:.1} µs",
                parts.join("  ")
            );
        };
        if let Some(p) = &self.ceiling {
            cpu_line("ceiling", &p.cpu, p.redis_script_us_per_request);
        }
        if let Some(p) = &self.admission {
            cpu_line("admission", &p.cpu, p.redis_script_us_per_request);
        }
        if let Some(p) = &self.replay_mix {
            cpu_line("replay mix", &p.cpu, p.redis_script_us_per_request);
        }
        if let Some(f) = &self.fixed_rate {
            cpu_line(
                "fixed rate",
                &f.phase.cpu,
                f.phase.redis_script_us_per_request,
            );
        }
        if let Some(b) = &self.batch {
            cpu_line("batch", &b.phase.cpu, b.phase.redis_script_us_per_request);
        }
        if let Some(e) = &self.e2e {
            cpu_line("end-to-end", &e.http.cpu, e.redis_script_us_per_execution);
        }
    }

    /// The targets with PASS/FAIL, the correctness checks, the verdict.
    fn human_targets_and_checks(&self, o: &mut String) {
        let _ = writeln!(o, "\nTargets:");
        for t in &self.targets {
            let _ = writeln!(
                o,
                "  {}  {:<40} {:>10}  (limit {} {})",
                if t.pass { "PASS" } else { "FAIL" },
                t.name,
                t.measured,
                t.limit,
                t.unit
            );
        }
        let _ = writeln!(
            o,
            "\nCorrectness (what Redis holds vs what clients were told):"
        );
        for c in &self.checks {
            let _ = writeln!(
                o,
                "  {}  {:<18} {}",
                if c.ok { "PASS" } else { "FAIL" },
                c.phase,
                c.detail
            );
        }
        let met = self.targets.iter().filter(|t| t.pass).count();
        let _ = writeln!(
            o,
            "\nRESULT: {}; targets met: {met} of {}\n",
            if self.correct {
                "correct"
            } else {
                "CORRECTNESS CHECK FAILED"
            },
            self.targets.len()
        );
    }
}

impl Report {
    /// Issue 12's targets: pickup p50 and p99 no worse than BullMQ's at each rate (both are
    /// whole milliseconds, so equal passes), a cancel reaching its handler in ≤ 100 ms p99,
    /// an idle worker making ≤ 1 call per shard per safety-poll interval.
    fn push_targets(&self, t: &mut Vec<Target>) {
        if let Some(p) = &self.pickup {
            for r in &p.rates {
                let Some(b) = &r.bullmq else { continue };
                for (q, ours, theirs) in [
                    ("p50", r.sluice.pickup.p50_ms, b.pickup.p50_ms),
                    ("p99", r.sluice.pickup.p99_ms, b.pickup.p99_ms),
                ] {
                    t.push(Target {
                        name: format!("pickup {q} at {:.0}/s ({})", r.rate, r.label),
                        measured: ours,
                        limit: theirs,
                        unit: "ms, at most (BullMQ's)",
                        pass: ours <= theirs,
                    });
                }
            }
        }
        if let Some(c) = &self.cancel {
            t.push(Target {
                name: "cancel → handler stopped p99".into(),
                measured: c.latency.p99_ms,
                limit: 100.0,
                unit: "ms, at most",
                pass: c.not_reached == 0 && c.latency.p99_ms <= 100.0,
            });
        }
        if let Some(i) = &self.idle {
            t.push(Target {
                name: "idle calls / shard / safety poll".into(),
                measured: i.per_shard_per_interval,
                limit: 1.0,
                unit: "calls, at most",
                pass: i.per_shard_per_interval <= 1.0,
            });
        }
    }

    /// Issue 12's phases for people: pickup side by side with BullMQ, cancel, idle cost.
    fn human_push(&self, o: &mut String) {
        if self.pickup.is_none() && self.cancel.is_none() && self.idle.is_none() {
            return;
        }
        let _ = writeln!(o, "\nWake-ups (pickup, cancel, idle cost):");
        if let Some(p) = &self.pickup {
            let _ = writeln!(o, "  pickup: {} ({})", p.worker, p.max_source);
            match (&p.peer, &p.peer_note) {
                (Some(v), _) => {
                    let _ = writeln!(
                        o,
                        "  BullMQ peer: bullmq {} on Node {}, default Worker (concurrency 1), \
                         no-op processor, its own redis-server",
                        v.bullmq, v.node
                    );
                }
                (None, Some(note)) => {
                    let _ = writeln!(o, "  !!! BullMQ PEER NOT MEASURED: {note}");
                }
                (None, None) => {}
            }
            let _ = writeln!(
                o,
                "  {:<22} {:>7} {:>22} {:>22} {:>15} {:>22}",
                "rate",
                "samples",
                "sluice p50/p99/max ms",
                "BullMQ p50/p99/max ms",
                "ratio p50/p99",
                "admit→done p50/p99 ms"
            );
            let ppm = |l: &Percentiles| format!("{:.0}/{:.0}/{:.0}", l.p50_ms, l.p99_ms, l.max_ms);
            let ratio = |a: f64, b: f64| {
                if b > 0.0 {
                    format!("{:.1}", a / b)
                } else if a == 0.0 {
                    "1.0".to_owned()
                } else {
                    "-".to_owned()
                }
            };
            for r in &p.rates {
                let s = &r.sluice;
                let (theirs, ratios, their_done) = match &r.bullmq {
                    Some(b) => (
                        ppm(&b.pickup),
                        format!(
                            "{}/{}",
                            ratio(s.pickup.p50_ms, b.pickup.p50_ms),
                            ratio(s.pickup.p99_ms, b.pickup.p99_ms)
                        ),
                        format!(
                            " (BullMQ {:.0}/{:.0})",
                            b.admit_to_completed.p50_ms, b.admit_to_completed.p99_ms
                        ),
                    ),
                    None => ("-".into(), "-".into(), String::new()),
                };
                let _ = writeln!(
                    o,
                    "  {:<22} {:>7} {:>22} {:>22} {:>15} {:>22}{their_done}",
                    format!("{:.0}/s {} ({} s)", r.rate, r.label, r.secs),
                    s.pickup.samples,
                    ppm(&s.pickup),
                    theirs,
                    ratios,
                    format!(
                        "{:.0}/{:.0}",
                        s.admit_to_completed.p50_ms, s.admit_to_completed.p99_ms
                    )
                );
                for (who, side) in [("sluice", Some(s)), ("BullMQ", r.bullmq.as_ref())] {
                    if let Some(side) = side
                        && (side.not_started > 0 || side.completed < side.admitted)
                    {
                        let _ = writeln!(
                            o,
                            "  {:<22} {who}: {} of {} not started, {} completed by the end of \
                             the drain (counted at their age then: a lower bound)",
                            "", side.not_started, side.admitted, side.completed
                        );
                    }
                }
            }
        }
        if let Some(c) = &self.cancel {
            let _ = writeln!(
                o,
                "  cancel → handler stopped: p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms over {} \
                 running executions ({} default worker(s) of {}; sends spread over {} ms; {} \
                 not reached in {} s)",
                c.latency.p50_ms,
                c.latency.p99_ms,
                c.latency.max_ms,
                c.latency.samples,
                c.workers,
                c.worker_concurrency,
                c.spread_ms,
                c.not_reached,
                c.timeout_secs
            );
        }
        if let Some(i) = &self.idle {
            let top: Vec<String> = {
                let mut v: Vec<(&String, &u64)> = i.by_command.iter().collect();
                v.sort_by(|a, b| b.1.cmp(a.1));
                v.iter().take(6).map(|(k, n)| format!("{k} {n}")).collect()
            };
            let _ = writeln!(
                o,
                "  idle worker ({}; {:.1} s): {:.1} calls/s sent = {:.2} per shard per {} ms \
                 safety poll ({} shards); commandstats {:.1} commands/s (also inside scripts), \
                 {:.1} script calls/s; sent: {}",
                i.serve,
                i.window_secs,
                i.calls_per_sec,
                i.per_shard_per_interval,
                i.scan_ms,
                i.shards,
                i.commands_per_sec,
                i.script_calls_per_sec,
                if top.is_empty() {
                    "none".to_owned()
                } else {
                    top.join(", ")
                }
            );
        }
    }

    /// On a cluster: which shards each master serves, its executions per second in each phase,
    /// and its script time in each phase as a share of a core.
    fn human_per_master(&self, o: &mut String) {
        let Some(masters) = &self.masters else { return };
        let phases: [(&str, Option<&Vec<MasterShare>>); 5] = [
            (
                "ceiling/s",
                self.ceiling.as_ref().and_then(|p| p.per_master.as_ref()),
            ),
            (
                "admission/s",
                self.admission.as_ref().and_then(|p| p.per_master.as_ref()),
            ),
            (
                "replay mix/s",
                self.replay_mix.as_ref().and_then(|p| p.per_master.as_ref()),
            ),
            (
                "fixed rate/s",
                self.fixed_rate
                    .as_ref()
                    .and_then(|f| f.phase.per_master.as_ref()),
            ),
            (
                "e2e/s",
                self.e2e.as_ref().and_then(|e| e.per_master.as_ref()),
            ),
        ];
        let _ = writeln!(
            o,
            "\nPer master (a tenant's executions go to the master serving its shard's slot):"
        );
        let mut head = format!("  {:<18} {:>6} {:>7}", "master", "shards", "tenants");
        for (name, _) in &phases {
            let _ = write!(head, " {name:>12}");
        }
        let _ = writeln!(o, "{head}");
        for (i, m) in masters.iter().enumerate() {
            let mut line = format!("  {:<18} {:>6} {:>7}", m.node, m.shards.len(), m.tenants);
            for (_, shares) in &phases {
                match shares.and_then(|v| v.get(i)) {
                    Some(sh) => {
                        let _ = write!(line, " {:>12.0}", sh.per_sec);
                    }
                    None => {
                        let _ = write!(line, " {:>12}", "-");
                    }
                }
            }
            let _ = writeln!(o, "{line}");
        }
        let _ = writeln!(
            o,
            "  redis script CPU per master, in cores (INFO commandstats usec / phase seconds):"
        );
        for (i, m) in masters.iter().enumerate() {
            let mut line = format!("  {:<18} {:>6} {:>7}", m.node, "", "");
            for (_, shares) in &phases {
                match shares.and_then(|v| v.get(i)) {
                    Some(sh) => {
                        let _ = write!(line, " {:>12.2}", sh.script_cores);
                    }
                    None => {
                        let _ = write!(line, " {:>12}", "-");
                    }
                }
            }
            let _ = writeln!(o, "{line}");
        }
    }
}

impl Report {
    /// Issue 20's targets: the calm tenant's pickup p99 behind a flood at most one flood
    /// execution + 10 ms; the weight-3 tenant's share of the first starts 75 % ± 5 points;
    /// scheduled starts at most 100 ms late at p99.
    fn fairness_targets(&self, t: &mut Vec<Target>) {
        let Some(f) = &self.fairness else { return };
        if let Some(n) = &f.noisy {
            let limit = n.execution_ms as f64 + 10.0;
            t.push(Target {
                name: "calm pickup p99 behind a flood".into(),
                measured: n.sluice.calm.p99_ms,
                limit,
                unit: "ms, at most",
                pass: n.sluice.not_started == 0 && n.sluice.calm.p99_ms <= limit,
            });
        }
        if let Some(w) = &f.weighted {
            t.push(Target {
                name: "weight-3 share of the first starts".into(),
                measured: w.heavy_share_pct,
                limit: 75.0,
                unit: "%, within ±5 points",
                pass: w.weights_supported && (w.heavy_share_pct - 75.0).abs() <= 5.0,
            });
        }
        // A build without scheduled starts has no lateness to judge (the report says so).
        if let Some(l) = &f.lateness
            && let Some(p) = l.lateness
        {
            t.push(Target {
                name: "scheduled start lateness p99".into(),
                measured: p.p99_ms,
                limit: 100.0,
                unit: "ms, at most",
                pass: l.early == 0 && p.p99_ms <= 100.0,
            });
        }
    }

    /// Issue 20's phases for people.
    fn human_fairness(&self, o: &mut String) {
        let Some(f) = &self.fairness else { return };
        let _ = writeln!(
            o,
            "\nFairness (noisy neighbour, weighted share, scheduled starts):"
        );
        let ppm = |l: &Percentiles| {
            format!(
                "{:.0}/{:.0}/{:.0}/{:.0}",
                l.p50_ms, l.p90_ms, l.p99_ms, l.max_ms
            )
        };
        if let Some(n) = &f.noisy {
            let _ = writeln!(
                o,
                "  noisy neighbour: {}; tenant {} floods {} × {} ms demo.sleep \
                 (max_concurrent 1000), tenant {} (same shard s{:02}) admits {}/s",
                n.worker,
                n.flood_tenant,
                n.flood_count,
                n.execution_ms,
                n.calm_tenant,
                n.shard,
                n.calm_rate
            );
            match (&n.peer, &n.peer_note) {
                (Some(v), _) => {
                    let _ = writeln!(
                        o,
                        "  BullMQ peer: bullmq {} on Node {}, one queue, one Worker of \
                         concurrency {}, the same jobs, its own redis-server",
                        v.bullmq,
                        v.node,
                        n.worker
                            .split("--concurrency ")
                            .nth(1)
                            .and_then(|r| r.split('`').next())
                            .unwrap_or("?")
                    );
                }
                (None, Some(note)) => {
                    let _ = writeln!(o, "  !!! BullMQ PEER NOT MEASURED: {note}");
                }
                (None, None) => {}
            }
            let _ = writeln!(
                o,
                "  {:<28} {:>26} {:>26} {:>13}",
                "pickup (created → started)",
                "sluice p50/p90/p99/max ms",
                "BullMQ p50/p90/p99/max ms",
                "ratio p50/p99"
            );
            let ratio = |a: f64, b: f64| {
                if b > 0.0 {
                    format!("{:.2}", a / b)
                } else if a == 0.0 {
                    "1.00".to_owned()
                } else {
                    "-".to_owned()
                }
            };
            for (name, ours, theirs) in [
                (
                    "calm tenant",
                    &n.sluice.calm,
                    n.bullmq.as_ref().map(|b| &b.calm),
                ),
                (
                    "flood tenant",
                    &n.sluice.flood,
                    n.bullmq.as_ref().map(|b| &b.flood),
                ),
            ] {
                let _ = writeln!(
                    o,
                    "  {:<28} {:>26} {:>26} {:>13}",
                    format!("{name} ({} samples)", ours.samples),
                    ppm(ours),
                    theirs.map_or("-".to_owned(), ppm),
                    theirs.map_or("-".to_owned(), |t| format!(
                        "{}/{}",
                        ratio(ours.p50_ms, t.p50_ms),
                        ratio(ours.p99_ms, t.p99_ms)
                    ))
                );
            }
            for (who, side) in [("sluice", Some(&n.sluice)), ("BullMQ", n.bullmq.as_ref())] {
                let Some(s) = side else { continue };
                let _ = writeln!(
                    o,
                    "  {who}: the flood kept the worker busy {:.1} s; {} of {} calm executions \
                     admitted before its last start; {} not started by the end (counted at \
                     their age)",
                    s.flood_span_secs, s.calm_during_flood, s.calm_admitted, s.not_started
                );
            }
        }
        if let Some(w) = &f.weighted {
            let _ = writeln!(
                o,
                "  weighted share: {} (weight 1) and {} (weight 3), shard s{:02}, {} each queued \
                 before one default worker started; first {} starts from the {}: {:.1} % / \
                 {:.1} % ({} counted){}",
                w.light,
                w.heavy,
                w.shard,
                w.backlog,
                w.window,
                w.source,
                w.light_share_pct,
                w.heavy_share_pct,
                w.counted,
                match &w.weights_note {
                    Some(note) => format!("\n  !!! WEIGHTS UNSUPPORTED: {note}"),
                    None => String::new(),
                }
            );
        }
        if let Some(l) = &f.lateness {
            match &l.lateness {
                Some(p) if l.supported => {
                    let _ = writeln!(
                        o,
                        "  scheduled start lateness (started − due, Redis clock; due from {}): \
                         p50/p90/p99/max {} ms over {} executions (delays {}–{} ms, one default \
                         worker); started early: {}{}",
                        l.due_from,
                        ppm(p),
                        p.samples,
                        l.lead_ms,
                        l.lead_ms + l.spread_ms,
                        l.early,
                        if l.early > 0 {
                            format!(" (!!! up to {} ms early)", l.most_early_ms)
                        } else {
                            String::new()
                        }
                    );
                }
                _ => {
                    let _ = writeln!(
                        o,
                        "  scheduled start lateness: {}",
                        l.note.as_deref().unwrap_or("unsupported")
                    );
                }
            }
        }
    }
}

impl Report {
    /// The limits group's target: with a backlog, a rate-limited tenant starts at ≥ 95 % of
    /// its rate (that it never goes faster is a correctness check).
    fn limits_targets(&self, t: &mut Vec<Target>) {
        let Some(l) = &self.limits else { return };
        if let Some(th) = &l.throttle
            && th.supported
        {
            t.push(Target {
                name: "throttled steady rate / its limit".into(),
                measured: th.steady_pct,
                limit: 95.0,
                unit: "%, at least",
                pass: th.steady_pct >= 95.0,
            });
        }
    }

    /// The limits group for people.
    fn human_limits(&self, o: &mut String) {
        let Some(l) = &self.limits else { return };
        let _ = writeln!(o, "\nLimits (throttle accuracy, key isolation):");
        if let Some(th) = &l.throttle {
            if th.supported {
                let _ = writeln!(
                    o,
                    "  throttle accuracy: tenant {} (shard s{:02}), rate_limit {} per 1s, burst \
                     {}; {} demo.echo queued before {} started; {} starts in {:.2} s (from the \
                     {}), {} completed",
                    th.tenant,
                    th.shard,
                    th.rate,
                    th.burst,
                    th.backlog,
                    th.worker,
                    th.starts,
                    th.span_secs,
                    th.source,
                    th.completed
                );
                let _ = writeln!(
                    o,
                    "  busiest 1 s window: {} starts (at most {} = rate + burst{}); steady rate \
                     after the burst: {:.1}/s = {:.1} % of {}/s",
                    th.busiest_window,
                    th.window_limit,
                    if th.busiest_window > th.window_limit {
                        ": !!! OVER THE LIMIT"
                    } else {
                        ""
                    },
                    th.steady_per_sec,
                    th.steady_pct,
                    th.rate
                );
            } else {
                let _ = writeln!(
                    o,
                    "  throttle accuracy: {}",
                    th.note.as_deref().unwrap_or("unsupported")
                );
            }
        }
        if let Some(k) = &l.key_isolation {
            if k.supported {
                let p = &k.b_pickup;
                let _ = writeln!(
                    o,
                    "  key isolation: tenant {}, max_concurrent_per_key {}, {}; key A: {} × {} \
                     ms demo.sleep queued, then key B: {} demo.echo at {}/s",
                    k.tenant,
                    k.key_limit,
                    k.worker,
                    k.a_admitted,
                    k.a_exec_ms,
                    k.b_admitted,
                    k.b_rate
                );
                let _ = writeln!(
                    o,
                    "  key B pickup (created → started): p50/p90/p99/max {:.0}/{:.0}/{:.0}/{:.0} \
                     ms over {} samples, {} not started",
                    p.p50_ms, p.p90_ms, p.p99_ms, p.max_ms, p.samples, k.b_not_started
                );
                let _ = writeln!(
                    o,
                    "  key A meanwhile: {} started, {} completed ({:.1}/s), at most {} running \
                     at once{}; the rest of its queue was dropped with the phase",
                    k.a_started,
                    k.a_completed,
                    k.a_per_sec,
                    k.a_most_at_once,
                    if k.a_most_at_once > u64::from(k.key_limit) {
                        " (!!! over its limit)"
                    } else {
                        ""
                    }
                );
            } else {
                let _ = writeln!(
                    o,
                    "  key isolation: {}",
                    k.note.as_deref().unwrap_or("unsupported")
                );
            }
        }
    }
}

/// Standalone and cluster runs of the same settings, side by side (`--compare-standalone`).
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    pub standalone: Report,
    pub cluster: Report,
}

impl Comparison {
    /// Both reports, then the table of the numbers that matter for the comparison.
    pub fn human(&self) -> String {
        let mut o = String::new();
        o.push_str(&self.standalone.human());
        o.push_str(&self.cluster.human());
        let masters = self.cluster.settings.cluster_masters.unwrap_or(0);
        let rate = |p: Option<&Phase>| p.map_or("-".to_owned(), |p| format!("{:.0}", p.per_sec));
        let per_master = |p: Option<&Phase>| {
            p.and_then(|p| p.per_master.as_ref()).map_or_else(
                || "-".to_owned(),
                |v| {
                    v.iter()
                        .map(|m| format!("{:.0}", m.per_sec))
                        .collect::<Vec<_>>()
                        .join(" / ")
                },
            )
        };
        let e2e = |r: &Report| {
            r.e2e
                .as_ref()
                .map_or("-".to_owned(), |e| format!("{:.0}", e.per_sec))
        };
        let (s, c) = (&self.standalone, &self.cluster);
        let _ = writeln!(
            o,
            "standalone vs cluster ({masters} masters), one session on this machine:\n"
        );
        let _ = writeln!(o, "  {:<34} {:>12} {:>24}", "", "standalone", "cluster");
        let rows = [
            (
                "ceiling admissions/s",
                rate(s.ceiling.as_ref()),
                rate(c.ceiling.as_ref()),
            ),
            (
                "  per master",
                rate(s.ceiling.as_ref()),
                per_master(c.ceiling.as_ref()),
            ),
            (
                "HTTP admissions/s",
                rate(s.admission.as_ref()),
                rate(c.admission.as_ref()),
            ),
            (
                "  per master",
                rate(s.admission.as_ref()),
                per_master(c.admission.as_ref()),
            ),
            ("e2e completed/s", e2e(s), e2e(c)),
        ];
        for (name, a, b) in rows {
            let _ = writeln!(o, "  {name:<34} {a:>12} {b:>24}");
        }
        let _ = writeln!(
            o,
            "\nRESULT: standalone {}, cluster {}\n",
            if s.correct {
                "correct"
            } else {
                "CORRECTNESS CHECK FAILED"
            },
            if c.correct {
                "correct"
            } else {
                "CORRECTNESS CHECK FAILED"
            }
        );
        o
    }
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}
