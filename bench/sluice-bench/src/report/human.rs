//! The report for people: the settings, each phase's numbers, where the CPU went, the
//! targets with PASS/FAIL and the correctness checks, then each group's own section.

use std::fmt::Write;

use super::{CpuShare, MasterShare, Report};
use crate::load::Percentiles;

impl Report {
    /// The report for people.
    pub fn human(&self) -> String {
        let mut o = String::new();
        let s = &self.settings;
        let _ = writeln!(
            o,
            "\nsluice benchmark — {} build, {} CPUs, {} clients, {} tenants{}{}",
            s.build,
            s.cpus,
            s.clients,
            s.tenants,
            match s.cluster_masters {
                Some(n) => format!(", Redis Cluster of {n} masters (no replicas)"),
                None => String::new(),
            },
            if s.smoke {
                " (SMOKE RUN: numbers mean nothing)"
            } else {
                ""
            }
        );
        let _ = writeln!(
            o,
            "\n{:<24} {:>12} {:>9} {:>9} {:>9}   notes",
            "phase", "per second", "p50 ms", "p99 ms", "p99.9 ms"
        );
        let line = |o: &mut String, name: &str, rate: f64, l: &Percentiles, note: String| {
            let _ = writeln!(
                o,
                "{name:<24} {rate:>12.0} {:>9.2} {:>9.2} {:>9.2}   {note}",
                l.p50_ms, l.p99_ms, l.p999_ms
            );
        };
        if let Some(p) = &self.ceiling {
            line(
                &mut o,
                "ceiling (one call each)",
                p.per_sec,
                &p.latency,
                format!("{} admitted in {:.1} s", p.outcomes.created, p.seconds),
            );
        }
        let ceiling = self.ceiling.as_ref().map(|c| c.per_sec).unwrap_or(0.0);
        if let Some(p) = &self.admission {
            line(
                &mut o,
                "admission (HTTP)",
                p.per_sec,
                &p.latency,
                format!(
                    "{:.2} × ceiling{}{}",
                    p.per_sec / ceiling.max(1e-9),
                    match &self.admission_calls {
                        Some(c) => format!(
                            "; {} script calls carried {} admissions (mean group {:.2})",
                            c.calls,
                            c.admissions,
                            c.admissions as f64 / c.calls.max(1) as f64
                        ),
                        None => String::new(),
                    },
                    match (s.admission_keys, s.admission_key_limit) {
                        (Some(n), Some(l)) => format!(
                            "; each request with a concurrency_key, {n} per tenant \
                             (max_concurrent_per_key {l})"
                        ),
                        _ => String::new(),
                    }
                ),
            );
        }
        if let Some(p) = &self.admission_peer {
            let sluice = self.admission.as_ref().map(|a| a.per_sec).unwrap_or(0.0);
            line(
                &mut o,
                "admission, BullMQ peer",
                p.phase.per_sec,
                &p.phase.latency,
                format!(
                    "Node {} HTTP + BullMQ {} Queue.add (jobId dedup, no quota), one process \
                     per CPU; sluice is {:.2} × this",
                    p.versions.node,
                    p.versions.bullmq,
                    sluice / p.phase.per_sec.max(1e-9)
                ),
            );
        } else if let Some(note) = &self.admission_peer_note {
            let _ = writeln!(o, "{:<24} {note}", "admission, BullMQ peer");
        }
        if let Some(k) = &self.api_key_admission {
            let admin = self.admission.as_ref().map(|a| a.per_sec).unwrap_or(0.0);
            line(
                &mut o,
                "admission (API keys)",
                k.phase.per_sec,
                &k.phase.latency,
                format!(
                    "{:.2} × admin-token admission; {} {{acl}} lookups ({:.4} per admission)",
                    k.phase.per_sec / admin.max(1e-9),
                    k.acl_lookups,
                    k.acl_lookups_per_admission
                ),
            );
        }
        if let Some(p) = &self.replay_mix {
            line(
                &mut o,
                &format!("admission, {} % replays", s.replay_percent),
                p.per_sec,
                &p.latency,
                format!(
                    "new only; plus {} replays answered 200",
                    p.outcomes.replayed
                ),
            );
        }
        if let Some(f) = &self.fixed_rate {
            line(
                &mut o,
                "fixed rate (open loop)",
                f.phase.per_sec,
                &f.phase.latency,
                format!(
                    "scheduled {:.0}/s ({:.0} % of admission); latency from schedule",
                    f.target_per_sec,
                    s.fixed_rate_share * 100.0
                ),
            );
        }
        if let Some(b) = &self.batch {
            let single = self.admission.as_ref().map(|a| a.per_sec).unwrap_or(0.0);
            line(
                &mut o,
                "batch admission",
                b.phase.per_sec,
                &b.phase.latency,
                format!(
                    "executions/s in batches of {} ({} tenants at once; latency per batch); \
                     {:.2} × single admission",
                    b.size,
                    b.tenants,
                    b.phase.per_sec / single.max(1e-9)
                ),
            );
            line(
                &mut o,
                "  singles beside a batch",
                b.singles_beside.per_sec,
                &b.singles_beside.latency,
                format!(
                    "other tenants at {:.0}/s (open loop, latency from schedule) while one \
                     tenant's batches admitted {} executions",
                    b.singles_rate, b.batch_items_beside
                ),
            );
        }
        if let Some(e) = &self.e2e
            && let Some(l) = &e.admit_to_completed
        {
            line(
                &mut o,
                "end-to-end (demo.echo)",
                e.per_sec,
                l,
                format!(
                    "admit→completed; {} completed in {:.1} s, admitted at {:.0}/s",
                    e.completed, e.span_secs, e.admission_per_sec
                ),
            );
        }
        if let Some(e) = &self.e2e {
            line(
                &mut o,
                "  its HTTP admissions",
                e.http.per_sec,
                &e.http.latency,
                format!(
                    "while workers run what is admitted; {} script calls carried {} \
                     admissions (mean group {:.2})",
                    e.admission_calls.calls,
                    e.admission_calls.admissions,
                    e.admission_calls.admissions as f64 / e.admission_calls.calls.max(1) as f64
                ),
            );
            let mut top: Vec<(&String, &f64)> = e.calls.by_command.iter().collect();
            top.sort_by(|a, b| b.1.total_cmp(a.1));
            let top: Vec<String> = top
                .iter()
                .take(8)
                .map(|(c, n)| format!("{c} {n:.2}"))
                .collect();
            let _ = writeln!(
                o,
                "{:<24} {:>12.2} script calls and {:.2} commands per execution (inside \
                 scripts too); most: {}",
                "  its Redis calls",
                e.calls.script_calls,
                e.calls.commands,
                top.join(", ")
            );
        }
        if let Some(p) = &self.e2e_pull
            && let Some(l) = &p.admit_to_completed
        {
            let ratio = self
                .e2e
                .as_ref()
                .map(|e| p.per_sec / e.per_sec.max(1e-9))
                .unwrap_or(0.0);
            line(
                &mut o,
                "end-to-end, pull API",
                p.per_sec,
                l,
                format!(
                    "pull workers over HTTP; {} completed in {:.1} s; {:.2} × `sluice worker`",
                    p.completed, p.span_secs, ratio
                ),
            );
        }
        if let Some(p) = &self.e2e_peer {
            let sluice = self.e2e.as_ref().map(|e| e.per_sec).unwrap_or(0.0);
            line(
                &mut o,
                "end-to-end, BullMQ peer",
                p.per_sec,
                &p.admit_to_completed,
                format!(
                    "HTTP add + {} process(es) of a Worker per queue (concurrency {} each), \
                     Node {} BullMQ {}; {} completed in {:.1} s, added at {:.0}/s; sluice is \
                     {:.2} × this",
                    p.worker_processes,
                    p.concurrency_per_queue,
                    p.versions.node,
                    p.versions.bullmq,
                    p.completed,
                    p.span_secs,
                    p.admission_per_sec,
                    sluice / p.per_sec.max(1e-9)
                ),
            );
        } else if let Some(note) = &self.e2e_peer_note {
            let _ = writeln!(o, "{:<24} {note}", "end-to-end, BullMQ peer");
        }
        if self.e2e_rounds.sluice_per_sec.len() > 1 {
            let show = |v: &[f64]| {
                v.iter()
                    .map(|r| format!("{r:.0}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let _ = writeln!(
                o,
                "{:<24} {:>12} rounds alternating (the lines above are the medians): sluice {}; \
                 BullMQ {}",
                "  end-to-end rounds",
                self.e2e_rounds.sluice_per_sec.len(),
                show(&self.e2e_rounds.sluice_per_sec),
                show(&self.e2e_rounds.peer_per_sec)
            );
        }
        if let Some(m) = &self.memory {
            let points = [
                ("memory, dedup key", Some(&m.with_dedup_key)),
                ("memory, no dedup key", m.without_dedup_key.as_ref()),
            ];
            for (name, p) in points {
                let Some(p) = p else { continue };
                let _ = writeln!(
                    o,
                    "{name:<24} {:>12.0} bytes of Redis used_memory per {} execution \
                     ({} executions: {} → {})",
                    p.bytes_per_execution,
                    m.state,
                    p.executions,
                    p.used_memory_before,
                    p.used_memory_after
                );
                let parts: Vec<String> = p
                    .by_kind
                    .iter()
                    .filter(|(_, b)| **b >= 1.0)
                    .map(|(k, b)| format!("{k} {b:.0}"))
                    .collect();
                let _ = writeln!(
                    o,
                    "{:<24} {:>12}   by key kind: {}",
                    "",
                    "",
                    parts.join(", ")
                );
            }
        }

        self.human_per_master(&mut o);
        self.human_push(&mut o);
        self.human_fairness(&mut o);
        self.human_limits(&mut o);
        self.human_dead_letters(&mut o);
        self.human_batch_memory(&mut o);

        self.human_cpu(&mut o);
        self.human_targets_and_checks(&mut o);
        o
    }

    /// CPU per phase (the phases before the wake-up ones; theirs is in the JSON report).
    fn human_cpu(&self, o: &mut String) {
        if self.ceiling.is_none()
            && self.admission.is_none()
            && self.replay_mix.is_none()
            && self.fixed_rate.is_none()
            && self.e2e.is_none()
        {
            return;
        }
        let _ = writeln!(o, "\nCPU per phase, in cores (where the time goes):");
        let _ = writeln!(
            o,
            "  (rest = everything else on the machine: other processes, interrupts; and Redis's"
        );
        let _ = writeln!(
            o,
            "  own time in scripts per request, or per execution end-to-end)"
        );
        let mut cpu_line = |name: &str, cpu: &[CpuShare], script_us: f64| {
            let parts: Vec<String> = cpu
                .iter()
                .map(|c| format!("{} {:.2}", c.process, c.cores))
                .collect();
            let _ = writeln!(
                o,
                "  {name:<14} {}   redis scripts {script_us:.1} µs",
                parts.join("  ")
            );
        };
        if let Some(p) = &self.ceiling {
            cpu_line("ceiling", &p.cpu, p.redis_script_us_per_request);
        }
        if let Some(p) = &self.admission {
            cpu_line("admission", &p.cpu, p.redis_script_us_per_request);
        }
        if let Some(p) = &self.replay_mix {
            cpu_line("replay mix", &p.cpu, p.redis_script_us_per_request);
        }
        if let Some(f) = &self.fixed_rate {
            cpu_line(
                "fixed rate",
                &f.phase.cpu,
                f.phase.redis_script_us_per_request,
            );
        }
        if let Some(b) = &self.batch {
            cpu_line("batch", &b.phase.cpu, b.phase.redis_script_us_per_request);
        }
        if let Some(e) = &self.e2e {
            cpu_line("end-to-end", &e.http.cpu, e.redis_script_us_per_execution);
        }
        if let Some(p) = &self.e2e_peer {
            let parts: Vec<String> = p
                .cpu
                .iter()
                .map(|c| format!("{} {:.2}", c.process, c.cores))
                .collect();
            let _ = writeln!(o, "  {:<14} {}", "e2e, BullMQ", parts.join("  "));
        }
        self.human_cpu_per_execution(o);
    }

    /// CPU per execution of each process (counts of `/proc/<pid>/stat`, not shares of the
    /// wall time): what an admission, a batch item and an execution end to end cost serve,
    /// the workers and Redis — and the BullMQ peer's processes beside them.
    fn human_cpu_per_execution(&self, o: &mut String) {
        // (phase, µs per execution by process, executions)
        type Row<'a> = (&'a str, Vec<(String, f64)>, u64);
        let mut rows: Vec<Row> = Vec::new();
        if let Some(p) = &self.admission {
            rows.push((
                "admission",
                super::cpu_us_per_execution(&p.cpu, p.outcomes.created),
                p.outcomes.created,
            ));
        }
        if let Some(b) = &self.batch {
            let n = b.phase.outcomes.created;
            rows.push((
                "batch item",
                super::cpu_us_per_execution(&b.phase.cpu, n),
                n,
            ));
        }
        if let Some(e) = &self.e2e {
            rows.push((
                "end-to-end",
                super::cpu_us_per_execution(&e.http.cpu, e.completed),
                e.completed,
            ));
        }
        if let Some(p) = &self.e2e_peer {
            rows.push((
                "e2e, BullMQ",
                super::cpu_us_per_execution(&p.cpu, p.completed),
                p.completed,
            ));
        }
        if rows.is_empty() {
            return;
        }
        let _ = writeln!(
            o,
            "\nCPU per execution, µs (utime+stime over the phase ÷ executions; worker = all \
             worker processes, front = the peer's HTTP processes):"
        );
        for (name, parts, n) in rows {
            let total: f64 = parts.iter().map(|(_, v)| v).sum();
            let parts: Vec<String> = parts.iter().map(|(p, v)| format!("{p} {v:.1}")).collect();
            let _ = writeln!(
                o,
                "  {name:<14} {}   total {total:.1}   ({n} executions)",
                parts.join("  ")
            );
        }
    }

    /// The targets with PASS/FAIL, the correctness checks, the verdict.
    fn human_targets_and_checks(&self, o: &mut String) {
        let _ = writeln!(o, "\nTargets:");
        for t in &self.targets {
            let _ = writeln!(
                o,
                "  {}  {:<40} {:>10}  (limit {} {})",
                if t.pass { "PASS" } else { "FAIL" },
                t.name,
                t.measured,
                t.limit,
                t.unit
            );
        }
        super::write_checks(o, &self.checks, 18);
        let met = self.targets.iter().filter(|t| t.pass).count();
        let _ = writeln!(
            o,
            "\nRESULT: {}; targets met: {met} of {}\n",
            if self.correct {
                "correct"
            } else {
                "CORRECTNESS CHECK FAILED"
            },
            self.targets.len()
        );
    }
}

impl Report {
    /// On a cluster: which shards each master serves, its executions per second in each phase,
    /// and its script time in each phase as a share of a core.
    fn human_per_master(&self, o: &mut String) {
        let Some(masters) = &self.masters else { return };
        let phases: [(&str, Option<&Vec<MasterShare>>); 5] = [
            (
                "ceiling/s",
                self.ceiling.as_ref().and_then(|p| p.per_master.as_ref()),
            ),
            (
                "admission/s",
                self.admission.as_ref().and_then(|p| p.per_master.as_ref()),
            ),
            (
                "replay mix/s",
                self.replay_mix.as_ref().and_then(|p| p.per_master.as_ref()),
            ),
            (
                "fixed rate/s",
                self.fixed_rate
                    .as_ref()
                    .and_then(|f| f.phase.per_master.as_ref()),
            ),
            (
                "e2e/s",
                self.e2e.as_ref().and_then(|e| e.per_master.as_ref()),
            ),
        ];
        let _ = writeln!(
            o,
            "\nPer master (a tenant's executions go to the master serving its shard's slot):"
        );
        let mut head = format!("  {:<18} {:>6} {:>7}", "master", "shards", "tenants");
        for (name, _) in &phases {
            let _ = write!(head, " {name:>12}");
        }
        let _ = writeln!(o, "{head}");
        for (i, m) in masters.iter().enumerate() {
            let mut line = format!("  {:<18} {:>6} {:>7}", m.node, m.shards.len(), m.tenants);
            for (_, shares) in &phases {
                match shares.and_then(|v| v.get(i)) {
                    Some(sh) => {
                        let _ = write!(line, " {:>12.0}", sh.per_sec);
                    }
                    None => {
                        let _ = write!(line, " {:>12}", "-");
                    }
                }
            }
            let _ = writeln!(o, "{line}");
        }
        let _ = writeln!(
            o,
            "  redis script CPU per master, in cores (INFO commandstats usec / phase seconds):"
        );
        for (i, m) in masters.iter().enumerate() {
            let mut line = format!("  {:<18} {:>6} {:>7}", m.node, "", "");
            for (_, shares) in &phases {
                match shares.and_then(|v| v.get(i)) {
                    Some(sh) => {
                        let _ = write!(line, " {:>12.2}", sh.script_cores);
                    }
                    None => {
                        let _ = write!(line, " {:>12}", "-");
                    }
                }
            }
            let _ = writeln!(o, "{line}");
        }
    }
}
