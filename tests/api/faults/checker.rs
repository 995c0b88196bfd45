//! The checker: everything the test collected (`Evidence`: the clients' requests and
//! answers, the journal, the faults, the end state) judged against the properties listed in
//! `faults.rs` (1–13), every violation recorded by property (`Verdict`). This file holds the
//! properties read from what the clients were told and what the system holds at the end
//! (1, 2, 4, 6, 7, 11, 13); those read from when handlers ran (3, 5, 8, 9, 10, 12) are in
//! `checker/runs.rs`, with the unit tests of the overlap rule.

mod runs;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::time::Duration;

use serde_json::{Value, json};

use super::end_state::Final;
use super::inject::Fault;
use super::journal::{Journal, rel};
use super::load::{Answer, Op, Plan, Rec};
use super::{EXAMPLES, QUIESCE_LIMIT};
use runs::{
    check_fair_share, check_key_limits, check_limits, check_rate, check_runs, check_schedules,
};

/// Violations by property.
#[derive(Default)]
pub(super) struct Verdict {
    by_prop: BTreeMap<&'static str, Vec<String>>,
}

impl Verdict {
    pub(super) fn fail(&mut self, prop: &'static str, what: String) {
        self.by_prop.entry(prop).or_default().push(what);
    }

    pub(super) fn summary(&self) -> String {
        let mut s = String::new();
        for (prop, v) in &self.by_prop {
            let _ = writeln!(s, "{prop}: {} violation(s)", v.len());
            for what in v.iter().take(EXAMPLES) {
                let _ = writeln!(s, "  - {what}");
            }
            if v.len() > EXAMPLES {
                let _ = writeln!(s, "  ... and {} more", v.len() - EXAMPLES);
            }
        }
        s
    }
}

const P1: &str = "1. acknowledged admissions kept, terminal, once";
const P2: &str = "2. nothing unacknowledged admitted";
pub(super) const P3: &str = "3. one run at a time, the last one accepted";
const P4: &str = "4. cancels stick";
const P5: &str = "5. tenant limits hold for running handlers";
const P6: &str = "6. usage back to zero";
const P7: &str = "7. attempt <= max_attempts";
const P8: &str = "8. never started before due";
const P9: &str = "9. fair share by weight (start log)";
const P10: &str = "10. concurrency key limits hold for running handlers";
const P11: &str = "11. no queue position for an execution that is not queued";
const P12: &str = "12. never more starts in a window than the rate allows";
const P13: &str = "13. dedup mappings where they belong (live: bucket field; ended: key with TTL)";

/// Everything the checker reads.
pub(super) struct Evidence<'a> {
    pub(super) t0: u64,
    pub(super) log: &'a [Rec],
    pub(super) fin: &'a Final,
    pub(super) journal: &'a Journal,
    pub(super) gone: &'a HashMap<u32, u64>,
    pub(super) faults: &'a [Fault],
    pub(super) quiesced: &'a Result<Duration, String>,
    pub(super) plans: &'a HashMap<String, Plan>,
}

pub(super) fn check(ev: &Evidence<'_>, report: &mut String) -> Verdict {
    let mut v = Verdict::default();
    check_admissions(ev, &mut v);
    check_runs(ev, &mut v);
    check_cancels(ev, &mut v);
    check_limits(ev, &mut v, report);
    check_schedules(ev, &mut v);
    check_fair_share(ev, &mut v);
    check_key_limits(ev, &mut v, report);
    check_rate(ev, &mut v, report);
    if let Err(busy) = ev.quiesced {
        v.fail(
            P6,
            format!("still busy {QUIESCE_LIMIT:?} after the faults: {busy}"),
        );
    }
    for (t, u) in &ev.fin.usage {
        if u != &json!({"running": 0, "waiting": 0, "scheduled": 0}) {
            v.fail(P6, format!("{t}: usage {u}"));
        }
    }
    // Every execution body a client was answered, and every final one: a position (and a
    // forecast) only while queued and due.
    let bodies = ev.log.iter().filter_map(|r| match &r.answer {
        Answer::Http { body, .. } if body["execution_id"].is_string() => Some(body),
        _ => None,
    });
    for e in bodies.chain(ev.fin.execs.values()) {
        let runnable = e["status"] == "queued" && e["queue_state"] != "scheduled";
        let shown = !e["queue_position"].is_null() || !e["estimated_start"].is_null();
        if shown && !runnable {
            v.fail(
                P11,
                format!(
                    "{}: {} / {} with position {} and estimate {}",
                    e["execution_id"],
                    e["status"],
                    e["queue_state"],
                    e["queue_position"],
                    e["estimated_start"]
                ),
            );
        }
    }
    for what in &ev.fin.dedup_orphans {
        v.fail(P13, what.clone());
    }
    // The sweeper settles a field an end left (what a build before the buckets does); here
    // every process is of this build, so it must have found none.
    if let Some(n) = ev.fin.counters.get("repaired_dedup").filter(|n| **n > 0) {
        v.fail(
            P13,
            format!("the sweeper settled {n} dedup mapping(s) an end of an execution left"),
        );
    }
    for (id, e) in &ev.fin.execs {
        let (a, m) = (e["attempt"].as_u64(), e["max_attempts"].as_u64());
        if let (Some(a), Some(m)) = (a, m)
            && a > m
        {
            v.fail(P7, format!("{id}: attempt {a} of {m} ({})", e["status"]));
        }
    }
    v
}

fn is_terminal(e: &Value) -> bool {
    matches!(
        e["status"].as_str(),
        Some("completed" | "failed" | "cancelled")
    )
}

/// Properties 1 and 2: admissions against the executions found at the end.
fn check_admissions(ev: &Evidence<'_>, v: &mut Verdict) {
    let fin = ev.fin;
    for id in &fin.listed_twice {
        v.fail(P1, format!("{id} listed twice"));
    }
    for id in &fin.unlisted {
        v.fail(
            P1,
            format!(
                "{id} is on Redis but no listing returned it: {}",
                fin.execs[id]
            ),
        );
    }
    // Tries of each logical request (one nonce each).
    let mut by_nonce: BTreeMap<&str, Vec<&Rec>> = BTreeMap::new();
    for r in ev.log {
        if let Op::Admit { nonce, .. } = &r.op {
            by_nonce.entry(nonce).or_default().push(r);
        }
    }
    // Executions at the end, by the nonce they carry.
    let mut found: HashMap<&str, Vec<&str>> = HashMap::new();
    for (id, e) in &fin.execs {
        match e["params"]["nonce"].as_str() {
            Some(n) => found.entry(n).or_default().push(id),
            None => v.fail(P2, format!("{id} carries no nonce: {e}")),
        }
    }
    for (nonce, tries) in &by_nonce {
        let Op::Admit { tenant, key, .. } = &tries[0].op else {
            continue;
        };
        let exists: Vec<&str> = found.get(nonce).cloned().unwrap_or_default();
        let acked: BTreeSet<&str> = tries
            .iter()
            .filter(|r| r.answer.is_2xx())
            .filter_map(|r| r.answer.execution_id())
            .collect();
        for r in tries.iter().filter(|r| r.answer.is_2xx()) {
            if r.answer.execution_id().is_none() {
                v.fail(P1, format!("2xx admission without an id: {r:?}"));
            }
        }
        if acked.len() > 1 {
            v.fail(
                P1,
                format!("key {key:?} answered with several executions: {acked:?}"),
            );
        }
        for id in &acked {
            match fin.execs.get(*id) {
                None => v.fail(
                    P1,
                    format!("{tenant}/{id} (nonce {nonce}) was acknowledged and is gone"),
                ),
                Some(e) if !is_terminal(e) => v.fail(
                    P1,
                    format!("{tenant}/{id} ends {} ({})", e["status"], e["queue_state"]),
                ),
                Some(e) if e["tenant_id"] != tenant.as_str() => {
                    v.fail(P1, format!("{id} belongs to {}", e["tenant_id"]))
                }
                Some(_) => {}
            }
        }
        if !acked.is_empty() {
            let extra: Vec<&&str> = exists.iter().filter(|id| !acked.contains(**id)).collect();
            if !extra.is_empty() {
                v.fail(
                    P2,
                    format!(
                        "nonce {nonce}: acknowledged as {acked:?} but also admitted as {extra:?}"
                    ),
                );
            }
            continue;
        }
        // No 2xx: what may each try have left?
        let named: BTreeSet<&str> = tries
            .iter()
            .filter(|r| r.answer.code() == Some("admission_outcome_unknown"))
            .filter_map(|r| r.answer.execution_id())
            .collect();
        let lost = tries
            .iter()
            .filter(|r| matches!(r.answer, Answer::Lost(_)))
            .count();
        let unnamed: Vec<&&str> = exists.iter().filter(|id| !named.contains(**id)).collect();
        let answers: Vec<String> = tries
            .iter()
            .map(|r| format!("{} at {}", r.answer.detail(), rel(r.done, ev.t0)))
            .collect();
        if unnamed.len() > lost {
            v.fail(
                P2,
                format!(
                    "{tenant} nonce {nonce}: answers {answers:?} but executions {unnamed:?} exist \
                     (unnamed by any answer)"
                ),
            );
        }
        // One request leaves at most one execution: its tries share a dedup key, or there is
        // only one try.
        if exists.len() > 1 {
            v.fail(
                P2,
                format!(
                    "{tenant} nonce {nonce} (key {key:?}): answers {answers:?}, executions \
                     {exists:?}"
                ),
            );
        }
    }
    for (nonce, ids) in &found {
        if !by_nonce.contains_key(nonce) {
            v.fail(P2, format!("{ids:?} carry nonce {nonce} no client sent"));
        }
    }
}

/// Property 4: accepted cancels are final unless retried after.
fn check_cancels(ev: &Evidence<'_>, v: &mut Verdict) {
    for c in ev.log {
        let Op::Cancel { tenant, id } = &c.op else {
            continue;
        };
        let b = c.answer.body();
        let accepted = c.answer.status() == Some(200)
            && (b["cancel_requested"] == true || b["status"] == "cancelled")
            && !matches!(b["status"].as_str(), Some("completed" | "failed"));
        if !accepted {
            continue;
        }
        let retried = ev.log.iter().any(|r| {
            matches!(&r.op, Op::Retry { id: rid, .. } if rid == id)
                && !r.answer.is_refusal()
                && r.done >= c.sent
        });
        if retried {
            continue;
        }
        let Some(e) = ev.fin.execs.get(id) else {
            continue; // gone: property 1 says so if it was acknowledged
        };
        if e["status"] != "cancelled" {
            v.fail(
                P4,
                format!(
                    "{tenant}/{id}: cancel answered {} at {} (status {}), ends {} (attempt {}, \
                     output {})",
                    c.answer.label(),
                    rel(c.done, ev.t0),
                    b["status"],
                    e["status"],
                    e["attempt"],
                    e["output"]
                ),
            );
        }
    }
}
