//! The cost report: every figure of the four measurements, the targets with a verdict
//! (PASS, FAIL, NOT RUN when a figure could not be taken, VOID when its run does not count),
//! and the correctness checks; for people, or as JSON.
//!
//! Long on purpose: each target's verdict and the text that prints it read best beside the
//! records they judge; the unit tests close the file.

use std::fmt::Write;

use serde::Serialize;

use super::Ctx;
use super::bytes::BytesPoint;
use super::callgrind::{E2eInstructions, Instructions};
use super::overhead::Overhead;
use super::rounds::{BULLMQ, CpuRounds, SLUICE};
use crate::report::{Check, PeerVersions, write_checks};

/// The limits.
const IR_RATIO: f64 = 1.10;
const CPU_RATIO: f64 = 1.2;
const OVERHEAD_IR: f64 = 20_000.0;
const QUEUED_BYTES: f64 = 512.0;

/// A target's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Verdict {
    #[serde(rename = "PASS")]
    Pass,
    #[serde(rename = "FAIL")]
    Fail,
    /// The figure could not be taken (no valgrind, no peer, a smoke run): never a pass.
    #[serde(rename = "NOT RUN")]
    NotRun,
    /// The run that took it does not count (an admission failed, a call timed out).
    #[serde(rename = "VOID")]
    Void,
}

impl Verdict {
    fn text(self) -> &'static str {
        match self {
            Self::Pass => "PASS",
            Self::Fail => "FAIL",
            Self::NotRun => "NOT RUN",
            Self::Void => "VOID",
        }
    }
}

/// One of the targets.
#[derive(Debug, Clone, Serialize)]
pub struct CostTarget {
    pub name: String,
    pub measured: Option<f64>,
    pub limit: f64,
    pub unit: &'static str,
    pub verdict: Verdict,
    /// Why NOT RUN or VOID, or what was compared.
    pub note: String,
}

/// The settings the figures depend on.
#[derive(Debug, Clone, Serialize)]
pub struct CostSettings {
    pub build: &'static str,
    pub cpus: usize,
    pub smoke: bool,
    pub clients: usize,
    pub tenants: usize,
    pub count: u64,
    pub completed_count: u64,
    pub rounds: usize,
    pub backlog: u64,
    pub callgrind_count: u64,
    pub callgrind_rate: f64,
    pub replays: u64,
    pub cluster_masters: Option<usize>,
}

/// The whole cost report.
#[derive(Debug, Clone, Serialize)]
pub struct CostReport {
    pub settings: CostSettings,
    /// The peer's versions, or why it did not run.
    pub peer_versions: Option<PeerVersions>,
    pub peer_note: Option<String>,
    pub bytes: Vec<BytesPoint>,
    pub cpu: Option<CpuRounds>,
    pub instructions: Option<Instructions>,
    pub overhead: Option<Overhead>,
    pub targets: Vec<CostTarget>,
    pub checks: Vec<Check>,
    /// Every check passed.
    pub correct: bool,
    /// Every target passed (NOT RUN and VOID are not passes).
    pub targets_met: bool,
}

impl CostReport {
    pub(super) fn new(ctx: &Ctx<'_>) -> Self {
        let a = ctx.args;
        Self {
            settings: CostSettings {
                build: if cfg!(debug_assertions) {
                    "debug"
                } else {
                    "release"
                },
                cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
                smoke: a.smoke,
                clients: a.clients,
                tenants: ctx.tenants.len(),
                count: a.cost_count,
                completed_count: a.cost_completed_count,
                rounds: a.cost_rounds,
                backlog: a.cost_backlog,
                callgrind_count: a.cost_callgrind_count,
                callgrind_rate: a.cost_callgrind_rate,
                replays: a.cost_replays,
                cluster_masters: (!a.cost_skip_cluster).then_some(a.cluster_masters),
            },
            peer_versions: None,
            peer_note: ctx.peer.as_ref().err().cloned(),
            bytes: Vec::new(),
            cpu: None,
            instructions: None,
            overhead: None,
            targets: Vec::new(),
            checks: Vec::new(),
            correct: false,
            targets_met: false,
        }
    }

    /// Judges the targets and the verdicts.
    pub(super) fn finish(&mut self) {
        let mut t = vec![self.instruction_target(), self.cpu_target()];
        t.extend(self.overhead_targets());
        t.push(self.bytes_target());
        self.targets_met = t.iter().all(|t| t.verdict == Verdict::Pass);
        self.targets = t;
        self.correct = !self.checks.is_empty() && self.checks.iter().all(|c| c.ok);
    }

    fn instruction_target(&self) -> CostTarget {
        let mut t = CostTarget {
            name: "redis-server instructions per execution, sluice / BullMQ".into(),
            measured: None,
            limit: IR_RATIO,
            unit: "ratio, at most",
            verdict: Verdict::NotRun,
            note: String::new(),
        };
        let Some(i) = &self.instructions else {
            t.note = "not measured".into();
            return t;
        };
        let side = |name: &str| i.sides.iter().find(|s| s.system == name);
        let (Some(s), Some(b)) = (side(SLUICE), side(BULLMQ)) else {
            t.note = i
                .not_run
                .clone()
                .unwrap_or_else(|| "a side is missing".into());
            return t;
        };
        let ratio = s.ir_per_execution / b.ir_per_execution.max(1.0);
        t.measured = Some(round2(ratio));
        t.note = format!(
            "{:.0} / {:.0} instructions per execution",
            s.ir_per_execution, b.ir_per_execution
        );
        let void: Vec<String> = [s, b]
            .iter()
            .filter_map(|x| x.void.as_ref().map(|v| format!("{}: {v}", x.system)))
            .collect();
        t.verdict = if !void.is_empty() {
            t.note = format!("{}; the run is void: {}", t.note, void.join("; "));
            Verdict::Void
        } else if s.completed < 4_000 || b.completed < 4_000 {
            t.note = format!("{}; fewer than 4,000 executions counted", t.note);
            Verdict::NotRun
        } else {
            pass(ratio <= IR_RATIO)
        };
        t
    }

    fn cpu_target(&self) -> CostTarget {
        let mut t = CostTarget {
            name: "Redis CPU per execution, sluice / BullMQ (medians)".into(),
            measured: None,
            limit: CPU_RATIO,
            unit: "ratio, at most",
            verdict: Verdict::NotRun,
            note: String::new(),
        };
        let Some(c) = &self.cpu else {
            t.note = "not measured".into();
            return t;
        };
        let side = |name: &str| c.sides.iter().find(|s| s.system == name);
        let (Some(s), Some(b)) = (side(SLUICE), side(BULLMQ)) else {
            t.note = self
                .peer_note
                .clone()
                .unwrap_or_else(|| "a side is missing".into());
            return t;
        };
        let ratio = s.redis_cpu_us_per_execution / b.redis_cpu_us_per_execution.max(1e-9);
        t.measured = Some(round2(ratio));
        t.note = format!(
            "{:.1} / {:.1} µs, medians of {} and {} rounds",
            s.redis_cpu_us_per_execution, b.redis_cpu_us_per_execution, s.rounds, b.rounds
        );
        let failed = c
            .rounds
            .iter()
            .any(|r| r.errors > 0 || r.completed < r.admitted);
        t.verdict = if failed {
            t.note.push_str("; a round failed (see the checks)");
            Verdict::Void
        } else if s.rounds < 5 {
            t.note.push_str("; fewer than 5 rounds");
            Verdict::NotRun
        } else {
            pass(ratio <= CPU_RATIO)
        };
        t
    }

    fn overhead_targets(&self) -> Vec<CostTarget> {
        ["replayed admission", "repeated completion"]
            .iter()
            .map(|path| {
                let mut t = CostTarget {
                    name: format!("per-call overhead, {path}"),
                    measured: None,
                    limit: OVERHEAD_IR,
                    unit: "instructions, at most",
                    verdict: Verdict::NotRun,
                    note: String::new(),
                };
                let Some(o) = &self.overhead else {
                    t.note = "not measured".into();
                    return t;
                };
                match o.paths.iter().find(|p| p.path == *path) {
                    Some(p) => match (p.overhead_ir, p.call_ir, p.bare_ir) {
                        (Some(v), Some(call), Some(bare)) => {
                            t.measured = Some(v);
                            t.note = format!(
                                "{} per call − {} bare ({}, {} commands)",
                                call,
                                bare,
                                p.script,
                                p.commands.len()
                            );
                            t.verdict = pass(v <= OVERHEAD_IR);
                        }
                        _ => t.note = o.not_run.clone().unwrap_or_default(),
                    },
                    None => t.note = "no call captured (see the checks)".into(),
                }
                t
            })
            .collect()
    }

    fn bytes_target(&self) -> CostTarget {
        let mut t = CostTarget {
            name: "bytes per queued execution (dedup key, 30 B params)".into(),
            measured: None,
            limit: QUEUED_BYTES,
            unit: "bytes, at most",
            verdict: Verdict::NotRun,
            note: String::new(),
        };
        if let Some(p) = self
            .bytes
            .iter()
            .find(|p| p.system == SLUICE && p.state == "queued" && p.params_bytes == 30)
        {
            t.measured = Some(p.bytes_per_execution);
            t.note = format!("over {} executions", p.executions);
            t.verdict = pass(p.bytes_per_execution <= QUEUED_BYTES);
        }
        t
    }

    /// The report for people.
    pub fn human(&self) -> String {
        let mut o = String::new();
        let s = &self.settings;
        let _ = writeln!(
            o,
            "\nsluice cost per execution (issue 39) — {} build, {} CPUs, {} clients, {} tenants{}",
            s.build,
            s.cpus,
            s.clients,
            s.tenants,
            if s.smoke {
                " (SMOKE RUN: numbers mean nothing)"
            } else {
                ""
            }
        );
        match (&self.peer_versions, &self.peer_note) {
            (Some(v), _) => {
                let _ = writeln!(o, "peer: BullMQ {} on Node {}", v.bullmq, v.node);
            }
            (None, Some(n)) => {
                let _ = writeln!(o, "peer: THE BULLMQ PEER DID NOT RUN: {n}");
            }
            _ => {}
        }
        self.human_bytes(&mut o);
        self.human_cpu(&mut o);
        self.human_instructions(&mut o);
        self.human_overhead(&mut o);
        let _ = writeln!(o, "\nTargets (issue 39):");
        for t in &self.targets {
            let _ = writeln!(
                o,
                "  {:<7} {:<60} {:>10} (limit {} {})  {}",
                t.verdict.text(),
                t.name,
                t.measured.map_or("-".to_owned(), |m| format!("{m}")),
                t.limit,
                t.unit,
                t.note
            );
        }
        write_checks(&mut o, &self.checks, 44);
        let _ = writeln!(
            o,
            "\nRESULT: {}\n",
            if self.correct {
                "correct"
            } else {
                "CORRECTNESS CHECK FAILED"
            }
        );
        o
    }

    fn human_bytes(&self, o: &mut String) {
        if self.bytes.is_empty() {
            return;
        }
        let _ = writeln!(
            o,
            "\nBytes per execution (used_memory growth after 8 warm-up executions, default \
             config; by structure: MEMORY USAGE summed per key kind):"
        );
        for p in &self.bytes {
            let _ = writeln!(
                o,
                "\n  {}, {}, {} B params, {} executions: {:.1} B each",
                p.system, p.state, p.params_bytes, p.executions, p.bytes_per_execution
            );
            for k in p
                .by_kind
                .iter()
                .filter(|k| k.bytes_per_execution.abs() >= 0.05)
            {
                let _ = writeln!(
                    o,
                    "    {:<28} {:>9.1} B   (+{} keys)",
                    k.kind, k.bytes_per_execution, k.keys_added
                );
            }
            let _ = writeln!(
                o,
                "    {:<28} {:>9.1} B",
                "keyspace overhead", p.keyspace_overhead
            );
            let lines: Vec<String> = p
                .encodings
                .iter()
                .map(|e| {
                    let encs: Vec<String> = e
                        .encodings
                        .iter()
                        .map(|(enc, n)| format!("{enc} ×{n}"))
                        .collect();
                    // Redis's default listpack entries: 512 for a hash, 128 for a sorted set.
                    let max = if e.redis_type == "hash" { 512 } else { 128 };
                    let flag = if e.converted_small > 0 {
                        format!(
                            "  CONVERTED: {} of {} with ≤{max} entries (a value over 64 bytes)",
                            e.converted_small, e.converted
                        )
                    } else if e.converted > 0 {
                        format!("  CONVERTED: {} over {max} entries", e.converted)
                    } else {
                        String::new()
                    };
                    format!("{} ({}): {}{flag}", e.kind, e.redis_type, encs.join(", "))
                })
                .collect();
            let _ = writeln!(o, "    encodings:");
            for line in lines {
                let _ = writeln!(o, "      {line}");
            }
        }
    }

    fn human_cpu(&self, o: &mut String) {
        let Some(c) = &self.cpu else { return };
        let _ = writeln!(
            o,
            "\nRedis CPU per execution (a backlog of {} over HTTP, then drained; fresh \
             redis-server per round; used_cpu_user + used_cpu_sys):",
            c.backlog
        );
        let _ = writeln!(
            o,
            "  {:<22} {:>5} {:>9} {:>10} {:>12} {:>13} {:>9} {:>9}",
            "side", "round", "executed", "CPU µs", "script calls", "commands", "admit s", "drain s"
        );
        for r in &c.rounds {
            let _ = writeln!(
                o,
                "  {:<22} {:>5} {:>9} {:>10.1} {:>12.2} {:>13.2} {:>9.1} {:>9.1}",
                r.system,
                r.round,
                r.completed,
                r.redis_cpu_us_per_execution,
                r.script_calls_per_execution,
                r.commands_per_execution,
                r.admit_secs,
                r.drain_secs
            );
        }
        for m in &c.sides {
            let _ = writeln!(
                o,
                "  median {:<15} {:>5} {:>9} {:>10.1} {:>12.2} {:>13.2}",
                m.system,
                m.rounds,
                "",
                m.redis_cpu_us_per_execution,
                m.script_calls_per_execution,
                m.commands_per_execution
            );
        }
        let _ = writeln!(
            o,
            "  (per execution; commands = every other command, top-level and inside scripts, \
             from INFO commandstats)"
        );
    }

    fn human_instructions(&self, o: &mut String) {
        let Some(i) = &self.instructions else { return };
        let _ = writeln!(
            o,
            "\nredis-server instructions per execution (callgrind; {} admitted over HTTP at \
             {}/s while the worker runs them; idle rate taken out):",
            i.executions, i.rate
        );
        if let Some(why) = &i.not_run {
            let _ = writeln!(o, "  NOT RUN: {why}");
        }
        for s in &i.sides {
            let _ = writeln!(
                o,
                "  {:<8} {:>12.0} instructions per execution over {} completed ({} Ir in \
                 {:.0} s, idle {:.0} Ir/s); {:.2} script calls and {:.2} commands per \
                 execution{}",
                s.system,
                s.ir_per_execution,
                s.completed,
                s.window_ir,
                s.window_secs,
                s.idle_ir_per_sec,
                s.script_calls_per_execution,
                s.commands_per_execution,
                s.void
                    .as_ref()
                    .map_or(String::new(), |v| format!("  VOID: {v}"))
            );
            for f in &s.top_functions {
                let _ = writeln!(o, "           {f}");
            }
        }
        Self::human_commands_by_name(o, &i.sides);
    }

    /// The end-to-end run's commands per execution by name, the sides side by side (script
    /// calls under their own names beside the commands they ran).
    fn human_commands_by_name(o: &mut String, sides: &[E2eInstructions]) {
        if sides.is_empty() {
            return;
        }
        let mut names: Vec<&str> = Vec::new();
        for s in sides {
            for (name, _) in &s.commands_by_name {
                if !names.contains(&name.as_str()) {
                    names.push(name);
                }
            }
        }
        let _ = write!(
            o,
            "  commands per execution by name:\n    {:<18}",
            "command"
        );
        for s in sides {
            let _ = write!(o, " {:>10}", s.system);
        }
        let _ = writeln!(o);
        for name in names {
            let _ = write!(o, "    {name:<18}");
            for s in sides {
                let per = s
                    .commands_by_name
                    .iter()
                    .find(|(n, _)| n == name)
                    .map_or(0.0, |(_, v)| *v);
                let _ = write!(o, " {per:>10.2}");
            }
            let _ = writeln!(o);
        }
        let _ = write!(o, "    {:<18}", "(idle share)");
        for s in sides {
            let _ = write!(o, " {:>10.2}", s.idle_commands_per_execution);
        }
        let _ = writeln!(
            o,
            "\n    (the idle share: the idle window's commands per second times the run's length, \
             per execution; counted in the commands above, taken out of the instructions)"
        );
    }

    fn human_overhead(&self, o: &mut String) {
        let Some(ov) = &self.overhead else { return };
        let _ = writeln!(
            o,
            "\nPer-call overhead (a captured call replayed, minus a bare script of the same \
             commands and arguments):"
        );
        if let Some(why) = &ov.not_run {
            let _ = writeln!(o, "  instructions NOT RUN: {why}");
        }
        for p in &ov.paths {
            let n = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.0}"));
            let _ = writeln!(
                o,
                "  {:<20} {} ({} args, {} commands: {}): {} per call, bare {}, overhead {}; \
                 as a composed script (EVALSHA) {}, overhead {}; the whole step ({} commands \
                 from serve: {}) {} per request",
                p.path,
                p.script,
                p.call_args,
                p.commands.len(),
                p.commands.join(" "),
                n(p.call_ir),
                n(p.bare_ir),
                n(p.overhead_ir),
                n(p.composed_ir),
                n(p.composed_ir.zip(p.bare_ir).map(|(a, b)| a - b)),
                p.step_commands.len(),
                p.step_commands.join(" "),
                n(p.step_ir)
            );
        }
    }
}

fn pass(ok: bool) -> Verdict {
    if ok { Verdict::Pass } else { Verdict::Fail }
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blank() -> CostReport {
        CostReport {
            settings: CostSettings {
                build: "release",
                cpus: 2,
                smoke: false,
                clients: 64,
                tenants: 8,
                count: 100_000,
                completed_count: 20_000,
                rounds: 5,
                backlog: 20_000,
                callgrind_count: 4_000,
                callgrind_rate: 25.0,
                replays: 2_000,
                cluster_masters: None,
            },
            peer_versions: None,
            peer_note: None,
            bytes: Vec::new(),
            cpu: None,
            instructions: None,
            overhead: None,
            targets: Vec::new(),
            checks: Vec::new(),
            correct: false,
            targets_met: false,
        }
    }

    fn side(system: &str, ir: f64, completed: u64) -> E2eInstructions {
        E2eInstructions {
            system: system.into(),
            admitted: completed,
            completed,
            errors: 0,
            void: None,
            window_ir: 0,
            window_secs: 0.0,
            idle_ir_per_sec: 0.0,
            ir_per_execution: ir,
            script_calls_per_execution: 0.0,
            commands_per_execution: 0.0,
            idle_commands_per_execution: 0.0,
            commands_by_name: Vec::new(),
            top_functions: Vec::new(),
        }
    }

    #[test]
    fn commands_by_name_stand_side_by_side() {
        let mut a = side(SLUICE, 1.0, 10);
        a.commands_by_name = vec![("fcall".into(), 3.0), ("zadd".into(), 5.5)];
        a.idle_commands_per_execution = 1.5;
        let mut b = side(BULLMQ, 1.0, 10);
        b.commands_by_name = vec![("evalsha".into(), 5.0), ("zadd".into(), 2.0)];
        let mut o = String::new();
        CostReport::human_commands_by_name(&mut o, &[a, b]);
        let lines: Vec<&str> = o.lines().map(str::trim_end).collect();
        assert!(
            lines.contains(&"    fcall                    3.00       0.00"),
            "{o}"
        );
        assert!(
            lines.contains(&"    zadd                     5.50       2.00"),
            "{o}"
        );
        assert!(
            lines.contains(&"    evalsha                  0.00       5.00"),
            "{o}"
        );
        assert!(
            lines.contains(&"    (idle share)             1.50       0.00"),
            "{o}"
        );
    }

    fn verdict_of(r: &CostReport) -> Verdict {
        r.instruction_target().verdict
    }

    #[test]
    fn instructions_pass_only_when_both_sides_were_counted_in_full() {
        let mut r = blank();
        // No valgrind: NOT RUN, never a pass, and the target set is not met.
        r.instructions = Some(Instructions {
            not_run: Some("`valgrind` does not run".into()),
            ..Instructions::default()
        });
        assert_eq!(verdict_of(&r), Verdict::NotRun);
        r.finish();
        assert!(!r.targets_met);

        let counted = |s: f64, b: f64, n: u64| Instructions {
            sides: vec![side(SLUICE, s, n), side(BULLMQ, b, n)],
            ..Instructions::default()
        };
        r.instructions = Some(counted(1_090.0, 1_000.0, 4_000));
        assert_eq!(verdict_of(&r), Verdict::Pass);
        r.instructions = Some(counted(1_200.0, 1_000.0, 4_000));
        assert_eq!(verdict_of(&r), Verdict::Fail);
        // Too few executions to judge.
        r.instructions = Some(counted(1_000.0, 1_000.0, 3_999));
        assert_eq!(verdict_of(&r), Verdict::NotRun);
        // A 503 voids the run, however good its figure.
        let mut i = counted(900.0, 1_000.0, 4_000);
        i.sides[0].void = Some("1 admission answered other than 201".into());
        r.instructions = Some(i);
        assert_eq!(verdict_of(&r), Verdict::Void);
    }
}
