//! The report `faults::guarantees_hold_under_faults` prints: what the run did (its phases'
//! times, the faults by kind, the processes that exited unasked, the answers by kind, the runs
//! journaled, the executions, dead letters and shard counters at the end) and, when a property
//! failed, the fault timeline to read the violations against. Separate from the checker: it
//! proves nothing, it counts and tells (the checker adds its own lines in between: the
//! concurrency per tenant, the key and rate limits).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use super::checker::Evidence;
use super::deployment::Exit;
use super::inject::{Fault, FaultKind};
use super::journal::rel;
use super::load::Op;
use super::{LEASE_TTL_MS, QUIESCE_LIMIT, Settings};

/// The report up to the concurrency per tenant (which the checker writes): the settings, the
/// phases' times, what was done and what came of it.
pub(super) fn overview(
    report: &mut String,
    settings: &Settings,
    ev: &Evidence<'_>,
    exits: &[Exit],
    began: Instant,
    startup: Duration,
    chaos_done: Duration,
) {
    let Evidence {
        t0,
        log,
        fin,
        journal,
        gone,
        faults,
        quiesced,
        ..
    } = *ev;
    let _ = writeln!(
        report,
        "== sluice fault-injection report: seed {}, {} s of faults ==",
        settings.seed,
        settings.chaos.as_secs()
    );
    let _ = writeln!(
        report,
        "time: start-up {:.1} s, faults and heal {:.1} s, quiesce {}, total {:.1} s",
        startup.as_secs_f64(),
        (chaos_done - startup).as_secs_f64(),
        match quiesced {
            Ok(d) => format!("{:.1} s", d.as_secs_f64()),
            Err(_) => format!("NOT REACHED in {QUIESCE_LIMIT:?}"),
        },
        began.elapsed().as_secs_f64()
    );
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for f in faults {
        *counts.entry(format!("{:?}", f.kind)).or_default() += 1;
    }
    let long_pauses = faults
        .iter()
        .filter(|f| {
            matches!(f.kind, FaultKind::PauseWorker | FaultKind::PauseRedis)
                && f.to - f.from > LEASE_TTL_MS
        })
        .count();
    let _ = writeln!(
        report,
        "faults: {counts:?}; {long_pauses} pause(s) of a worker or Redis longer than the lease"
    );
    if !exits.is_empty() {
        // A process that gives up starting while Redis is down is expected; one that had been
        // running a while and exited is worth a look (not a checked property).
        let settled = exits.iter().filter(|e| e.ran_ms > 5_000).count();
        let _ = writeln!(
            report,
            "exited unasked and restarted: {} ({settled} after running over 5 s)",
            exits.len()
        );
        let mut shown: Vec<&Exit> = exits.iter().filter(|e| e.ran_ms > 5_000).collect();
        shown.extend(exits.iter().filter(|e| e.ran_ms <= 5_000).take(3));
        for e in shown.into_iter().take(10) {
            let _ = writeln!(
                report,
                "  {} (pid {}) ran {:.1} s, noticed at {}: {}",
                e.name,
                e.pid,
                e.ran_ms as f64 / 1000.0,
                rel(e.at, t0),
                e.last_words.chars().take(300).collect::<String>()
            );
        }
    }
    for (kind, label) in [
        ("admit", "admission tries"),
        ("cancel", "cancels"),
        ("retry", "retries"),
        ("limit", "limit changes"),
    ] {
        let mut by: BTreeMap<String, usize> = BTreeMap::new();
        for r in log {
            let k = match &r.op {
                Op::Admit { .. } => "admit",
                Op::Cancel { .. } => "cancel",
                Op::Retry { .. } => "retry",
                Op::Limit { .. } => "limit",
            };
            if k == kind {
                let mut label = r.answer.label();
                if k == "cancel" && r.answer.is_2xx() {
                    // What the cancel found: a running execution is the interesting race.
                    let b = r.answer.body();
                    let _ = write!(label, " {}", b["status"].as_str().unwrap_or("?"));
                    if b["cancel_requested"] == true && b["status"] == "running" {
                        label.push_str(" (cancel requested)");
                    }
                }
                *by.entry(label).or_default() += 1;
            }
        }
        let _ = writeln!(report, "{label}: {by:?}");
    }
    let keyed_retries = log
        .iter()
        .filter(|r| matches!(r.op, Op::Admit { try_no, .. } if try_no > 1))
        .count();
    let _ = writeln!(report, "keyed admission re-tries: {keyed_retries}");
    let mut hows: BTreeMap<&str, usize> = BTreeMap::new();
    let (mut clipped, mut renewed) = (0, 0);
    for r in &journal.runs {
        *hows
            .entry(
                r.end
                    .as_ref()
                    .map_or("no end (worker killed)", |e| e.how.as_str()),
            )
            .or_default() += 1;
        if r.end.as_ref().is_some_and(|e| e.lease_deadline < e.t) {
            clipped += 1;
        }
        let (s, e) = r.effective(gone);
        if e - s > LEASE_TTL_MS {
            renewed += 1;
        }
    }
    let _ = writeln!(
        report,
        "runs journaled: {} {hows:?}; {renewed} outlived the lease on heartbeats; {clipped} \
         ended after losing their lease (zombies); {} bad journal line(s)",
        journal.runs.len(),
        journal.bad_lines.len()
    );
    let mut statuses: BTreeMap<String, usize> = BTreeMap::new();
    for e in fin.execs.values() {
        let status = e["status"].as_str().unwrap_or("?").to_owned();
        *statuses.entry(status).or_default() += 1;
    }
    let _ = writeln!(
        report,
        "executions at the end: {} {statuses:?}",
        fin.execs.len()
    );
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    for d in &fin.dead_letters {
        let reason = d["reason"].as_str().unwrap_or("?").to_owned();
        *reasons.entry(reason).or_default() += 1;
    }
    let _ = writeln!(
        report,
        "dead letters: {} {reasons:?}",
        fin.dead_letters.len()
    );
    let _ = writeln!(report, "shard counters: {:?}", fin.counters);
    let _ = writeln!(report, "concurrency per tenant:");
}

/// The end of the report: all is well, or the fault timeline (times from the start of the
/// test) and the violations (`summary`, from the checker's verdict).
pub(super) fn conclusion(report: &mut String, summary: &str, faults: &[Fault], t0: u64) {
    if summary.is_empty() {
        let _ = writeln!(report, "all properties hold");
    } else {
        // The timeline, to read the violations' times against.
        let _ = writeln!(report, "fault timeline (times from the start of the test):");
        for f in faults {
            let _ = writeln!(
                report,
                "  {} .. {} {:?} {} (pid {})",
                rel(f.from, t0),
                rel(f.to, t0),
                f.kind,
                f.target,
                f.pid
            );
        }
        let _ = write!(report, "VIOLATIONS\n{summary}");
    }
}
