//! The report's records of the core phases: the direct-Lua ceiling, HTTP admission and its
//! variants (replays, a fixed rate, group commit, batches, API keys, the peer), end to end,
//! memory, and the CPU and per-master shares measured beside them.

use serde::Serialize;

use super::PeerVersions;
use crate::compare::round2;
use crate::load::{LoadResult, Outcomes, Percentiles};

/// CPU a process used during a phase, in cores (1.0 = one core busy all the time).
#[derive(Debug, Clone, Serialize)]
pub struct CpuShare {
    pub process: String,
    pub cores: f64,
    /// The same as CPU seconds (utime + stime of `/proc/<pid>/stat`, 10 ms ticks): a count,
    /// not a share of the wall time, so it divides into CPU per execution on a busy machine.
    pub seconds: f64,
}

/// CPU microseconds per execution of each process (`cpu` summed by name: the `worker-N`
/// processes are one `worker`), over `executions`; "bench" (the load generator) and "rest"
/// (the machine's other work) are left out: they are not the system measured.
pub fn cpu_us_per_execution(cpu: &[CpuShare], executions: u64) -> Vec<(String, f64)> {
    let mut out: Vec<(String, f64)> = Vec::new();
    for c in cpu {
        let name = c.process.split('-').next().unwrap_or(&c.process);
        if name == "bench" || name == "rest" {
            continue;
        }
        let us = c.seconds * 1e6 / executions.max(1) as f64;
        match out.iter_mut().find(|(n, _)| n == name) {
            Some((_, v)) => *v += us,
            None => out.push((name.to_owned(), us)),
        }
    }
    for (_, v) in &mut out {
        *v = (*v * 10.0).round() / 10.0;
    }
    out
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
    /// Redis calls per completed execution over the phase (admission, start, completion and
    /// everything else the processes sent meanwhile).
    pub calls: CallsPerExecution,
    /// `serve`'s admission script calls during the phase and the admissions they carried
    /// (group commit: fewer per call when admissions come slower).
    pub admission_calls: AdmissionCalls,
    /// The HTTP side of the phase (and CPU of every process, workers included).
    pub http: Phase,
    /// On a cluster: each master's completed executions per second of the span, and its
    /// script time over the whole phase.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_master: Option<Vec<MasterShare>>,
}

/// The end-to-end peer: the HTTP admission peer (`peer.mjs --role http`) adding jobs with the
/// dedup key as `jobId`, and BullMQ `Worker`s with a no-op processor completing them
/// (`peer.mjs --role drain`), measured as sluice's end-to-end phase is.
#[derive(Debug, Clone, Serialize)]
pub struct PeerE2e {
    pub versions: PeerVersions,
    /// The `--role drain` processes (as many as sluice's `sluice worker`s).
    pub worker_processes: usize,
    /// Each process runs one `Worker` per tenant queue of this concurrency: in all, the
    /// processes × the tenants × this = sluice's workers × `--worker-concurrency`.
    pub concurrency_per_queue: usize,
    pub admitted: u64,
    pub completed: u64,
    /// Jobs added while admitting, per second.
    pub admission_per_sec: f64,
    /// Completed jobs per second, from the first job's `timestamp` to the last `finishedOn`.
    pub per_sec: f64,
    pub span_secs: f64,
    /// `finishedOn` − `timestamp` of each job (Node's clock, millisecond resolution).
    pub admit_to_completed: Percentiles,
    /// CPU of each process over the whole phase (admitting and draining): `front`'s
    /// processes, the `worker-N`s, `redis-bullmq`.
    pub cpu: Vec<CpuShare>,
}

/// Redis calls per execution from `INFO commandstats` deltas: the script calls (`FCALL`,
/// `FCALL_RO`, `EVALSHA`, `EVAL`), and every command, inside scripts too (Redis counts a
/// script's commands in the same table), each per execution.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CallsPerExecution {
    pub script_calls: f64,
    pub commands: f64,
    /// Each command's calls per execution (at least 0.01).
    pub by_command: std::collections::BTreeMap<String, f64>,
}

impl CallsPerExecution {
    /// The deltas between two `INFO commandstats` readings over `executions`.
    pub fn of(
        before: &std::collections::BTreeMap<String, u64>,
        after: &std::collections::BTreeMap<String, u64>,
        executions: u64,
    ) -> Self {
        let n = executions.max(1) as f64;
        let per = |calls: u64| (calls as f64 / n * 100.0).round() / 100.0;
        let mut out = Self::default();
        let (mut scripts, mut all) = (0u64, 0u64);
        for (name, a) in after {
            // The benchmark's own INFO readings are not the system's calls.
            if name == "info" {
                continue;
            }
            let d = a.saturating_sub(before.get(name).copied().unwrap_or(0));
            all += d;
            if matches!(name.as_str(), "fcall" | "fcall_ro" | "evalsha" | "eval") {
                scripts += d;
            }
            if per(d) >= 0.01 {
                out.by_command.insert(name.clone(), per(d));
            }
        }
        out.script_calls = per(scripts);
        out.commands = per(all);
        out
    }
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn share(process: &str, seconds: f64) -> CpuShare {
        CpuShare {
            process: process.into(),
            cores: 0.0,
            seconds,
        }
    }

    #[test]
    fn cpu_per_execution_sums_the_workers_and_leaves_out_the_load_and_the_machine() {
        let cpu = [
            share("redis", 0.5),
            share("serve", 0.25),
            share("worker-1", 0.1),
            share("worker-2", 0.05),
            share("bench", 9.0),
            share("rest", 9.0),
        ];
        let per = cpu_us_per_execution(&cpu, 1000);
        assert_eq!(
            per,
            vec![
                ("redis".to_owned(), 500.0),
                ("serve".to_owned(), 250.0),
                ("worker".to_owned(), 150.0),
            ]
        );
        // No executions: divided by one, not by zero.
        assert_eq!(cpu_us_per_execution(&cpu[..1], 0)[0].1, 500_000.0);
    }

    #[test]
    fn the_median_round_is_kept() {
        let median = |v: Vec<f64>| super::super::median_of(v, |r| *r);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(
            median(vec![4.0, 1.0, 3.0, 2.0]),
            Some(2.0),
            "the lower middle one"
        );
        assert_eq!(median(vec![5.0]), Some(5.0));
        assert_eq!(median(Vec::new()), None);
    }

    #[test]
    fn calls_per_execution_count_the_deltas_and_not_the_benchmarks_own_info() {
        let before: BTreeMap<String, u64> = [("fcall", 100), ("hset", 1000), ("info", 5)]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        let after: BTreeMap<String, u64> = [
            ("fcall", 180),
            ("evalsha", 20),
            ("hset", 1400),
            ("info", 9),
            ("xadd", 100),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let c = CallsPerExecution::of(&before, &after, 100);
        assert_eq!(c.script_calls, 1.0, "fcall 80 + evalsha 20 over 100");
        assert_eq!(c.commands, 6.0, "80 + 20 + 400 + 100, not the 4 INFOs");
        assert_eq!(c.by_command.get("hset"), Some(&4.0));
        assert_eq!(c.by_command.get("info"), None);
    }
}
