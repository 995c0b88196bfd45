//! The report's limits group (throttle accuracy, key isolation): its records, its speed
//! target and its section of the human report.

use std::fmt::Write;

use serde::Serialize;

use super::{Report, Target};
use crate::load::Percentiles;

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

impl Report {
    /// The limits group's target: with a backlog, a rate-limited tenant starts at ≥ 95 % of
    /// its rate (that it never goes faster is a correctness check).
    pub(super) fn limits_targets(&self, t: &mut Vec<Target>) {
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
    pub(super) fn human_limits(&self, o: &mut String) {
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
