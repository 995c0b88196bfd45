//! The properties read from when handlers ran: the journal's runs with their effective
//! intervals (one run at a time per execution and the accepted one the last, 3; tenant
//! limits, 5; never started before due, 8; concurrency key limits, 10) and the shards' start
//! logs (fair share by weight, 9; rates, 12). Separate from `checker.rs`, which holds the
//! verdict, the evidence and the properties read from the clients' answers and the end state;
//! the unit tests of the overlap rule (`held_together`) are at the bottom.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;

use super::{Evidence, P3, P5, P8, P9, P10, P12, Verdict};
use crate::faults::inject::FaultKind;
use crate::faults::journal::{Run, rel};
use crate::faults::load::Op;
use crate::faults::{
    DEFAULT_MAX_CONCURRENT, KEY_LIMIT, LATE_EFFECT_MS, RATE_LIMITED, STOP_SLACK_MS, TENANTS,
    weight_of,
};

/// The virtual time one start costs a tenant of weight 1 (`QUANTUM` in common.lua).
const QUANTUM: f64 = 1000.0;

/// Property 12: the rate-limited tenant's starts (every start, re-runs after a lost lease and
/// retries included), on Redis's clock from its shard's start log: no window of `per` holds
/// more than `starts + burst`.
pub(super) fn check_rate(ev: &Evidence<'_>, v: &mut Verdict, report: &mut String) {
    let (tenant, starts, per_ms, burst) = RATE_LIMITED;
    let times: Vec<u64> = ev
        .fin
        .start_logs
        .values()
        .flatten()
        .filter(|(t, ..)| t == tenant)
        .map(|(.., ms)| *ms)
        .collect();
    let bound = (starts + burst) as usize;
    let mut busiest = 0;
    for &t in &times {
        let n = times.iter().filter(|&&u| u >= t && u < t + per_ms).count();
        busiest = busiest.max(n);
        if n > bound {
            v.fail(
                P12,
                format!(
                    "{tenant}: {n} starts in the {per_ms} ms from {} (at most {bound})",
                    rel(t, ev.t0)
                ),
            );
        }
    }
    let _ = writeln!(
        report,
        "  rate limit: {tenant} started {} times, at most {busiest} in any {per_ms} ms (limit {starts} + burst {burst})",
        times.len()
    );
}

/// Property 10: per tenant and concurrency key, at every run start, the executions of that key
/// with a run in its effective interval are at most `KEY_LIMIT` (the tenants'
/// `max_concurrent_per_key`, set before any admission and never changed).
pub(super) fn check_key_limits(ev: &Evidence<'_>, v: &mut Verdict, report: &mut String) {
    let key_of = |id: &str| -> Option<&str> { ev.fin.execs.get(id)?["concurrency_key"].as_str() };
    // Per (tenant, key): each run's effective interval and execution id.
    type Spans<'a> = Vec<(u64, u64, &'a str)>;
    let mut by_key: BTreeMap<(&str, &str), Spans<'_>> = BTreeMap::new();
    for r in &ev.journal.runs {
        let Some(key) = key_of(&r.id) else { continue };
        let (s, e) = r.effective(ev.gone);
        if e > s {
            by_key
                .entry((r.tenant.as_str(), key))
                .or_default()
                .push((s, e, r.id.as_str()));
        }
    }
    let mut peak = 0;
    for ((t, key), runs) in &by_key {
        for &(s, _, _) in runs {
            let active: BTreeSet<&str> = runs
                .iter()
                .filter(|(s2, e2, _)| *s2 <= s && s < *e2)
                .map(|(_, _, id)| *id)
                .collect();
            peak = peak.max(active.len());
            if active.len() as u64 > KEY_LIMIT {
                v.fail(
                    P10,
                    format!(
                        "{t}/{key}: {} executions running at {} (limit {KEY_LIMIT}): {active:?}",
                        active.len(),
                        rel(s, ev.t0)
                    ),
                );
            }
        }
    }
    let _ = writeln!(
        report,
        "  concurrency keys: {} keys ran, peak {peak} handlers of one key at once (limit {KEY_LIMIT})",
        by_key.len()
    );
}

/// Property 8: an execution admitted with a `delay` never ran before its due time (its
/// admission's Redis time plus the delay), unless a retry of it (which makes it runnable at
/// once) was requested. Journal times and Redis times are one machine's clock.
pub(super) fn check_schedules(ev: &Evidence<'_>, v: &mut Verdict) {
    let retried: BTreeSet<&str> = ev
        .log
        .iter()
        .filter_map(|r| match &r.op {
            Op::Retry { id } => Some(id.as_str()),
            _ => None,
        })
        .collect();
    let mut first_start: HashMap<&str, u64> = HashMap::new();
    for r in &ev.journal.runs {
        let at = first_start.entry(r.id.as_str()).or_insert(r.start);
        *at = (*at).min(r.start);
    }
    for (id, plan) in ev.plans {
        let Some(delay) = plan.delay else { continue };
        if retried.contains(id.as_str()) {
            continue;
        }
        let (Some(e), Some(start)) = (ev.fin.execs.get(id), first_start.get(id.as_str())) else {
            continue;
        };
        let Some(created) = e["created_at"].as_str().and_then(ms_of_rfc3339) else {
            v.fail(P8, format!("{id}: no readable created_at: {e}"));
            continue;
        };
        if *start < created + delay {
            v.fail(
                P8,
                format!(
                    "{id}: admitted at {created} with delay {delay} ms, started at {start} ({} ms early)",
                    created + delay - start
                ),
            );
        }
    }
}

/// Property 9: each shard's start log shows start-time fair queueing: the virtual start tags
/// of successive starts never go down (the shard's clock only moves forward, and a tenant
/// comes back at the clock, never below it), and each tenant's own tags advance by at least
/// QUANTUM / weight per start (exactly that while it stays runnable; more after it came back).
/// Together: while two tenants both had work, their starts divided by their weights differ by
/// at most one start of each.
pub(super) fn check_fair_share(ev: &Evidence<'_>, v: &mut Verdict) {
    for (key, log) in &ev.fin.start_logs {
        let mut last = f64::MIN;
        let mut own: HashMap<&str, f64> = HashMap::new();
        for (i, (t, tag, w, _)) in log.iter().enumerate() {
            if !tag.is_finite() || !w.is_finite() {
                v.fail(P9, format!("{key}[{i}]: unreadable entry"));
                continue;
            }
            if *w != weight_of(t) as f64 {
                v.fail(P9, format!("{key}[{i}]: {t} logged weight {w}"));
            }
            if *tag < last - 1e-6 {
                v.fail(
                    P9,
                    format!("{key}[{i}]: {t}'s tag {tag} is below the last, {last}"),
                );
            }
            last = last.max(*tag);
            if let Some(prev) = own.get(t.as_str()) {
                let step = QUANTUM / w;
                if tag - prev < step - 1e-6 {
                    v.fail(
                        P9,
                        format!("{key}[{i}]: {t}'s tag advanced by {} < {step}", tag - prev),
                    );
                }
            }
            own.insert(t, *tag);
        }
    }
}

/// Unix ms of an RFC 3339 time.
fn ms_of_rfc3339(t: &str) -> Option<u64> {
    let t = time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok()?;
    u64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok()
}

/// Whether two runs' effective intervals (`Run::effective`, `[start, end)`) overlap. A run
/// that began only after its lease deadline (its worker paused between the start call and the
/// handler) has an empty interval: nothing it did could be accepted, so it overlaps nothing.
fn held_together((sa, ea): (u64, u64), (sb, eb): (u64, u64)) -> bool {
    sa < ea && sb < eb && sa < eb && sb < ea
}

/// Property 3: runs of one execution, from the journal.
pub(super) fn check_runs(ev: &Evidence<'_>, v: &mut Verdict) {
    let mut by_id: BTreeMap<&str, Vec<&Run>> = BTreeMap::new();
    for r in &ev.journal.runs {
        by_id.entry(&r.id).or_default().push(r);
    }
    for (id, runs) in &by_id {
        let mut fences: BTreeMap<u64, usize> = BTreeMap::new();
        for r in runs {
            *fences.entry(r.fence).or_default() += 1;
        }
        for (fence, n) in &fences {
            if *n > 1 {
                v.fail(P3, format!("{id}: fence {fence} started {n} times"));
            }
        }
        for (i, a) in runs.iter().enumerate() {
            for b in &runs[i + 1..] {
                if held_together(a.effective(ev.gone), b.effective(ev.gone)) {
                    v.fail(
                        P3,
                        format!(
                            "{id}: runs overlap while both held the lease: {} and {}",
                            a.describe(ev.gone, ev.t0),
                            b.describe(ev.gone, ev.t0)
                        ),
                    );
                }
            }
        }
    }
    // The intervals above trust each run's lease deadline; that holds because a worker stops a
    // handler once it cannot prove its lease. A run may end later only when its worker was
    // stopped across the deadline (it acts on SIGCONT).
    for r in &ev.journal.runs {
        let Some(end) = &r.end else { continue };
        if end.t <= end.lease_deadline + STOP_SLACK_MS {
            continue;
        }
        let paused = ev.faults.iter().any(|f| {
            f.kind == FaultKind::PauseWorker
                && f.pid == r.pid
                && f.from <= end.lease_deadline + STOP_SLACK_MS
                && end.t <= f.to + STOP_SLACK_MS
        });
        if !paused {
            v.fail(
                P3,
                format!(
                    "{}: run ended {} ms after its lease deadline, its worker not paused: {}",
                    r.id,
                    end.t - end.lease_deadline,
                    r.describe(ev.gone, ev.t0)
                ),
            );
        }
    }
    for (id, e) in &ev.fin.execs {
        if e["status"] != "completed" {
            continue;
        }
        let out = &e["output"];
        let Some(fence) = out["fence"].as_u64() else {
            v.fail(
                P3,
                format!("{id}: completed without a fence in its output: {out}"),
            );
            continue;
        };
        if out["nonce"] != e["params"]["nonce"] {
            v.fail(P3, format!("{id}: output {out} for params {}", e["params"]));
        }
        let runs = by_id.get(id.as_str()).cloned().unwrap_or_default();
        let highest = runs.iter().map(|r| r.fence).max();
        if highest != Some(fence) {
            v.fail(
                P3,
                format!(
                    "{id}: completed with fence {fence} but the highest fence started is \
                     {highest:?}; runs: {}",
                    runs.iter()
                        .map(|r| r.describe(ev.gone, ev.t0))
                        .collect::<Vec<_>>()
                        .join("; ")
                ),
            );
            continue;
        }
        let accepted = runs.iter().find(|r| r.fence == fence).expect("highest run");
        if accepted.attempt != out["attempt"].as_u64().unwrap_or(0)
            || accepted.end.as_ref().is_none_or(|e| e.how != "ok")
        {
            v.fail(
                P3,
                format!(
                    "{id}: output {out} but that run is {}",
                    accepted.describe(ev.gone, ev.t0)
                ),
            );
        }
    }
}

/// One `max_concurrent` setting and when it may have taken effect.
struct LimitChange {
    sent: u64,
    /// Latest instant it may take effect (its answer; +10 s when the answer was lost).
    latest: u64,
    /// When it was acknowledged (2xx).
    acked: Option<u64>,
    value: u64,
}

/// The highest limit that may have been in force at some instant of `[lo, t]`.
fn limit_bound(changes: &[LimitChange], lo: u64, t: u64) -> u64 {
    changes
        .iter()
        .filter(|p| p.sent <= t)
        .filter(|p| {
            // Certainly overwritten by `lo`: a change sent after p's latest effect was
            // acknowledged by then.
            !changes
                .iter()
                .any(|q| q.acked.is_some_and(|d| d <= lo) && q.sent >= p.latest && q.sent > p.sent)
        })
        .map(|p| p.value)
        .max()
        .unwrap_or(DEFAULT_MAX_CONCURRENT)
}

/// Property 5, and the concurrency table of the report.
pub(super) fn check_limits(ev: &Evidence<'_>, v: &mut Verdict, report: &mut String) {
    // Each execution was admitted, and got its slot, after the first try of the request that
    // carries its nonce was sent (whichever try admitted it, named or not).
    let mut first_try: HashMap<&str, u64> = HashMap::new();
    for r in ev.log {
        if let Op::Admit { nonce, .. } = &r.op {
            let at = first_try.entry(nonce).or_insert(r.sent);
            *at = (*at).min(r.sent);
        }
    }
    let admitted: HashMap<&str, u64> = ev
        .fin
        .execs
        .iter()
        .filter_map(|(id, e)| {
            let nonce = e["params"]["nonce"].as_str()?;
            Some((id.as_str(), *first_try.get(nonce)?))
        })
        .collect();
    for t in TENANTS {
        let mut changes = vec![LimitChange {
            sent: 0,
            latest: 0,
            acked: Some(0),
            value: DEFAULT_MAX_CONCURRENT,
        }];
        for r in ev.log {
            if let Op::Limit {
                tenant,
                max_concurrent,
            } = &r.op
                && tenant == t
                && !r.answer.is_refusal()
            {
                let acked = r.answer.is_2xx().then_some(r.done);
                changes.push(LimitChange {
                    sent: r.sent,
                    latest: if acked.is_some() {
                        r.done
                    } else {
                        r.done + LATE_EFFECT_MS
                    },
                    acked,
                    value: *max_concurrent,
                });
            }
        }
        let max_set = changes.iter().skip(1).map(|c| c.value).max().unwrap_or(0);
        let mut runs: Vec<(u64, u64, &str)> = ev
            .journal
            .runs
            .iter()
            .filter(|r| r.tenant == t)
            .map(|r| {
                let (s, e) = r.effective(ev.gone);
                (s, e, r.id.as_str())
            })
            .filter(|(s, e, _)| e > s)
            .collect();
        runs.sort();
        let mut peak = 0;
        let mut over = 0;
        for &(s, _, _) in &runs {
            let active: BTreeSet<&str> = runs
                .iter()
                .filter(|(s2, e2, _)| *s2 <= s && s < *e2)
                .map(|(_, _, id)| *id)
                .collect();
            let k = active.len() as u64;
            peak = peak.max(k);
            let lo = active
                .iter()
                .map(|id| admitted.get(id).copied().unwrap_or(0))
                .max()
                .unwrap_or(0);
            let bound = limit_bound(&changes, lo, s);
            if k > bound {
                over += 1;
                v.fail(
                    P5,
                    format!(
                        "{t}: {k} executions running at {} (limit at most {bound} since {}): \
                         {active:?}",
                        rel(s, ev.t0),
                        rel(lo, ev.t0)
                    ),
                );
            }
        }
        let _ = writeln!(
            report,
            "  {t}: peak {peak} handlers at once; highest limit set {max_set}; \
             {over} start(s) over the limit in force"
        );
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::held_together;
    use crate::faults::journal::{Run, RunEnd};

    /// The checker's overlap rule on the cases that matter: overlapping runs are caught, runs
    /// that only touch are not, and a run whose handler began after its lease deadline (an empty
    /// interval, even one that lies inside another run's) overlaps nothing.
    #[test]
    fn an_empty_effective_interval_overlaps_nothing() {
        let run = |start: u64, end: Option<(u64, u64)>| Run {
            id: "e".into(),
            tenant: "t".into(),
            fence: 1,
            attempt: 1,
            pid: 7,
            start,
            end: end.map(|(t, lease_deadline)| RunEnd {
                t,
                lease_deadline,
                how: "completed".into(),
            }),
        };
        let gone = HashMap::new();
        // Began at 500 with its lease running out at 400: empty, inside [0, 1000).
        let late = run(500, Some((600, 400))).effective(&gone);
        assert_eq!(late, (500, 500));
        let long = run(0, Some((1000, 1200))).effective(&gone);
        assert_eq!(long, (0, 1000));
        assert!(!held_together(late, long));
        assert!(!held_together(long, late));
        // Ended by its lease deadline, not its report; then a second run overlaps it.
        let cut = run(0, Some((900, 300))).effective(&gone);
        assert_eq!(cut, (0, 300));
        assert!(held_together(cut, (200, 400)));
        assert!(!held_together(cut, (300, 400)));
        // No end seen, its worker gone at 250: held until then.
        let gone = HashMap::from([(7, 250)]);
        assert_eq!(run(100, None).effective(&gone), (100, 250));
        assert!(held_together(run(100, None).effective(&gone), (240, 260)));
    }
}
