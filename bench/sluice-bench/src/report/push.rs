//! The report's wake-up group (pickup against the BullMQ peer, cancel, an idle worker's cost):
//! its records, its speed targets and its section of the human report.

use std::fmt::Write;

use serde::Serialize;

use super::{CpuShare, Report, Target};
use crate::load::Percentiles;

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

impl Report {
    /// Issue 12's targets: pickup p50 and p99 no worse than BullMQ's at each rate (both are
    /// whole milliseconds, so equal passes), a cancel reaching its handler in ≤ 100 ms p99,
    /// an idle worker making ≤ 1 call per shard per safety-poll interval.
    pub(super) fn push_targets(&self, t: &mut Vec<Target>) {
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
    pub(super) fn human_push(&self, o: &mut String) {
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
}
