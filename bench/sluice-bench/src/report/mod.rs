//! The benchmark's report: the measured numbers, the speed targets with PASS/FAIL, the CPU each
//! process used per phase (where the time goes), and the correctness checks. Printed for people
//! or, with `--json`, as one JSON document. On a Redis Cluster it also has each master's share
//! (admissions/s and script CPU); `--compare-standalone` puts two reports side by side.
//!
//! This file holds the report itself, its settings, targets and checks, and the ratios
//! `finish` judges; the records of each group, and the text for people, live beside it.

mod batch_memory;
mod comparison;
mod dead_letters;
mod fairness;
mod human;
mod limits;
mod phases;
mod push;

pub use batch_memory::{BatchMemory, BatchMemoryShape};
pub use comparison::Comparison;
pub use dead_letters::{DeadLetters, ListingCost};
pub use fairness::{Fairness, Lateness, NoisyNeighbour, NoisySide, WeightedShare};
pub use limits::{KeyIsolation, Limits, Throttle};
pub use phases::{
    AdmissionCalls, ApiKeyAdmission, BatchPhase, CallsPerExecution, CpuShare, E2e, FixedRate,
    Master, MasterShare, Memory, MemoryPoint, PeerAdmission, PeerE2e, Phase, cpu_us_per_execution,
};
pub use push::{CancelPhase, IdleCost, PeerVersions, Pickup, PickupRate, PickupSide};

use serde::Serialize;

use crate::Args;
use crate::compare::round2;

/// One correctness check.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub phase: String,
    pub ok: bool,
    /// The counts compared: what clients were told, what Redis holds.
    pub detail: String,
}

/// Writes the correctness table both reports end with: a heading, then each check as `PASS`
/// or `FAIL`, its phase (padded to `width`) and what was compared.
pub fn write_checks(o: &mut String, checks: &[Check], width: usize) {
    use std::fmt::Write;
    let _ = writeln!(
        o,
        "\nCorrectness (what Redis holds vs what clients were told):"
    );
    for c in checks {
        let _ = writeln!(
            o,
            "  {}  {:<width$} {}",
            if c.ok { "PASS" } else { "FAIL" },
            c.phase,
            c.detail
        );
    }
}

/// The end-to-end rounds' rates, in the order they ran (sluice's and the peer's alternate).
#[derive(Debug, Clone, Default, Serialize)]
pub struct E2eRounds {
    pub sluice_per_sec: Vec<f64>,
    pub peer_per_sec: Vec<f64>,
}

/// The element of `v` whose `key` is the median (of an even count, the lower middle one);
/// `None` when `v` is empty.
pub fn median_of<T>(mut v: Vec<T>, key: impl Fn(&T) -> f64) -> Option<T> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| key(a).total_cmp(&key(b)));
    let mid = (v.len() - 1) / 2;
    Some(v.swap_remove(mid))
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
    /// The end-to-end phase against the BullMQ peer (HTTP add + `Worker`s), right after
    /// sluice's.
    pub e2e_peer: Option<PeerE2e>,
    /// Why the end-to-end peer did not run, when it did not.
    pub e2e_peer_note: Option<String>,
    /// Every round's completed/s of the end-to-end phase and of its peer (`e2e` and
    /// `e2e_peer` are the median rounds).
    pub e2e_rounds: E2eRounds,
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
    /// The dead-letter group (listing cost at a full shard).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dead_letters: Option<DeadLetters>,
    /// Issue 38's batch-memory phase.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_memory: Option<BatchMemory>,
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
            e2e_peer: None,
            e2e_peer_note: None,
            e2e_rounds: E2eRounds::default(),
            memory: None,
            pickup: None,
            cancel: None,
            idle: None,
            fairness: None,
            limits: None,
            dead_letters: None,
            batch_memory: None,
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
        if let (Some(e), Some(p)) = (&self.e2e, &self.e2e_peer) {
            let ratio = e.per_sec / p.per_sec.max(1e-9);
            t.push(Target {
                name: "end-to-end / BullMQ end-to-end peer".into(),
                measured: round2(ratio),
                limit: 1.0,
                unit: "ratio, at least",
                pass: ratio >= 1.0,
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
        self.dead_letter_targets(&mut t);
        self.batch_memory_targets(&mut t);
        self.targets_met = t.iter().all(|t| t.pass);
        self.targets = t;
        self.correct = !self.checks.is_empty() && self.checks.iter().all(|c| c.ok);
    }
}
