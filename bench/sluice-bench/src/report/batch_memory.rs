//! The report's batch-memory phase (issue 38): its record, its targets and its section of the
//! human report.

use std::fmt::Write;

use serde::Serialize;

use super::{CpuShare, Report, Target};
use crate::load::Percentiles;

/// One of the phase's four bodies, over every round.
#[derive(Debug, Clone, Serialize)]
pub struct BatchMemoryShape {
    pub name: &'static str,
    pub bytes: usize,
    /// Times it was sent (once per round).
    pub sent: u64,
    /// Answers that were the expected one.
    pub as_expected: u64,
    /// Of the others, `429 batch_memory_full`.
    pub refused_for_memory: u64,
    /// The first few unexpected answers.
    pub failed: Vec<String>,
}

/// Four batch bodies at `--batch-body-limit` at once, round after round, and another
/// tenant's calls beside them.
#[derive(Debug, Clone, Serialize)]
pub struct BatchMemory {
    /// The phase's `serve`'s `--batch-body-limit`, bytes (each body's size).
    pub body_limit: usize,
    pub rounds: usize,
    pub secs: f64,
    pub shapes: Vec<BatchMemoryShape>,
    /// Serve's RSS before the first round, KiB.
    pub baseline_rss_kib: u64,
    /// Its highest RSS during the rounds (sampled every 2 ms, and `VmHWM` when it rose), KiB.
    pub peak_rss_kib: u64,
    pub rise_kib: u64,
    /// 4 × `body_limit`, KiB: the target's bound.
    pub rise_limit_kib: u64,
    /// The other tenant's calls of each kind per second.
    pub rate: f64,
    /// Its `GET /api/me` and single admissions, latency from their schedule.
    pub me: Percentiles,
    pub admission: Percentiles,
    /// CPU during the rounds, in cores: Redis, the phase's serve, the benchmark, the rest of
    /// the machine.
    pub cpu: Vec<CpuShare>,
}

impl Report {
    /// Serve's peak RSS rise at most 4 × the limit; the other tenant's p99s at most 5 ms.
    pub(super) fn batch_memory_targets(&self, t: &mut Vec<Target>) {
        let Some(m) = &self.batch_memory else { return };
        let mib = |kib: u64| (kib as f64 / 1024.0 * 10.0).round() / 10.0;
        t.push(Target {
            name: format!(
                "serve's RSS rise beside 4 batch bodies (limit 4 × {:.1} MiB)",
                m.body_limit as f64 / 1048576.0
            ),
            measured: mib(m.rise_kib),
            limit: mib(m.rise_limit_kib),
            unit: "MiB, at most",
            pass: m.rise_kib <= m.rise_limit_kib,
        });
        for (what, p) in [("GET /api/me", &m.me), ("admission", &m.admission)] {
            t.push(Target {
                name: format!("other tenant's {what} p99 beside batch bodies"),
                measured: p.p99_ms,
                limit: 5.0,
                unit: "ms, at most",
                pass: p.p99_ms <= 5.0,
            });
        }
    }

    /// The batch-memory phase for people.
    pub(super) fn human_batch_memory(&self, o: &mut String) {
        let Some(m) = &self.batch_memory else { return };
        let mib = |kib: u64| kib as f64 / 1024.0;
        let _ = writeln!(
            o,
            "\nBatch memory (4 bodies of {:.2} MiB at once, {} rounds in {:.1} s, on a serve of \
             its own):",
            m.body_limit as f64 / 1048576.0,
            m.rounds,
            m.secs
        );
        for s in &m.shapes {
            let _ = writeln!(
                o,
                "  {:<14} {:>9} bytes: {}/{} answered as expected{}{}",
                s.name,
                s.bytes,
                s.as_expected,
                s.sent,
                if s.refused_for_memory > 0 {
                    format!(", {} refused 429 batch_memory_full", s.refused_for_memory)
                } else {
                    String::new()
                },
                if s.failed.is_empty() {
                    String::new()
                } else {
                    format!(" (!!! {})", s.failed.join("; "))
                }
            );
        }
        let _ = writeln!(
            o,
            "  serve's RSS: {:.1} MiB before, peak {:.1} MiB: a rise of {:.1} MiB = {:.2} × \
             the limit (at most 4)",
            mib(m.baseline_rss_kib),
            mib(m.peak_rss_kib),
            mib(m.rise_kib),
            m.rise_kib as f64 * 1024.0 / m.body_limit.max(1) as f64
        );
        for (what, p) in [("GET /api/me", &m.me), ("admission  ", &m.admission)] {
            let _ = writeln!(
                o,
                "  other tenant's {what} at {}/s: p50/p99/max {:.2}/{:.2}/{:.2} ms over {} \
                 calls",
                m.rate, p.p50_ms, p.p99_ms, p.max_ms, p.samples
            );
        }
        let cpu: Vec<String> = m
            .cpu
            .iter()
            .map(|c| format!("{} {:.2}", c.process, c.cores))
            .collect();
        let _ = writeln!(o, "  CPU meanwhile, cores: {}", cpu.join(", "));
    }
}
