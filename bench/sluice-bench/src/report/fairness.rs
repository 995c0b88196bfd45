//! The report's fairness group (noisy neighbour, weighted share, scheduled-start lateness):
//! its records, its speed targets and its section of the human report.

use std::fmt::Write;

use serde::Serialize;

use super::{PeerVersions, Report, Target};
use crate::load::Percentiles;

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

impl Report {
    /// Issue 20's targets: the calm tenant's pickup p99 behind a flood at most one flood
    /// execution + 10 ms; the weight-3 tenant's share of the first starts 75 % ± 5 points;
    /// scheduled starts at most 100 ms late at p99.
    pub(super) fn fairness_targets(&self, t: &mut Vec<Target>) {
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
    pub(super) fn human_fairness(&self, o: &mut String) {
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
