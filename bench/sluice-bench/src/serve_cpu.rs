//! `sluice serve`'s own CPU per HTTP admission (`--serve-cpu BUILD...`, issue 39 item 3): the
//! instructions `serve` executes in user space per admission over a fixed count of
//! admissions, counted by callgrind (serve run by `valgrind --tool=callgrind
//! --instr-atstart=no`, instrumentation switched on by `callgrind_control` after the warm-up
//! and the window dumped after the count) or, with `--serve-cpu-perf` on a machine with
//! hardware counters, by `perf stat -e instructions:u` attached to serve's pid; beside them
//! serve's and redis-server's CPU time (from `/proc`) per admission, which under callgrind is
//! valgrind's, not serve's (read it from a `--serve-cpu-perf` run or the throughput phases).
//!
//! Throughput on a shared 2-core machine swings by 15–40 % between runs; an instruction count
//! over a fixed number of requests does not (within a few percent: what still moves it is how
//! many admissions a group-commit call carries and how often the runtime parks, both of which
//! depend on timing). So a change of serve's request path is judged by this count, and the
//! throughput phases only report what follows.
//!
//! Each run: a fresh `redis-server` and the build's `serve`, `--serve-cpu-warmup` admissions
//! (connections open, pools and caches filled, the allocator grown), then `perf stat` attached
//! to serve's pid while the closed loop of the admission phase (`--clients` connections,
//! `--tenants` tenants, every key new) sends exactly `--serve-cpu-count` admissions. With two
//! builds they alternate A B, B A, ... for `--serve-cpu-runs` rounds; medians are printed.
//! Under callgrind serve runs some 50 times slower, so it groups more admissions per script
//! call than at full speed (the report gives the admissions per call of each run): its
//! per-call costs weigh less than they do on a machine where Redis is the slower side.
//! `--serve-cpu-perf` needs `perf` and `kernel.perf_event_paranoid` ≤ 2.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use serde::Serialize;

use crate::compare::{median, order, program, round2, script_stats};
use crate::load::{self, Progress, Workload};
use crate::procs::{self, Scratch};
use crate::{ADMIN_TOKEN, Args, UNLIMITED};

/// One run of one build.
#[derive(Debug, Clone, Serialize)]
pub struct ServeCpuRun {
    /// The build's program.
    pub build: String,
    pub round: usize,
    /// Admissions answered 201 in the counted window (a run with any other answer is void).
    pub admitted: u64,
    pub errors: u64,
    /// serve's user-space instructions per admission (`perf stat -e instructions:u`).
    pub serve_instructions: f64,
    /// serve's CPU time (user + system, `/proc`) per admission, µs.
    pub serve_cpu_us: f64,
    /// redis-server's CPU time per admission, µs.
    pub redis_cpu_us: f64,
    /// Admissions per script call (the mean group of group commit).
    pub admissions_per_call: f64,
    /// Admissions per second of the counted window (reported, not judged).
    pub admissions_per_sec: f64,
}

/// The medians of one build.
#[derive(Debug, Clone, Serialize)]
pub struct ServeCpuSide {
    pub build: String,
    pub serve_instructions: f64,
    pub serve_cpu_us: f64,
    pub redis_cpu_us: f64,
    pub admissions_per_call: f64,
    pub admissions_per_sec: f64,
}

/// The report of `--serve-cpu`.
#[derive(Debug, Clone, Serialize)]
pub struct ServeCpuReport {
    /// What counted the instructions: `callgrind` or `perf`.
    pub counter: &'static str,
    pub count: u64,
    pub clients: usize,
    pub sides: Vec<ServeCpuSide>,
    pub runs: Vec<ServeCpuRun>,
    /// Every counted admission was answered 201.
    pub correct: bool,
}

/// The `instructions:u` count in `perf stat -x,` output (its first field), if counted.
fn parse_perf_instructions(out: &str) -> Option<u64> {
    out.lines()
        .find(|l| l.contains("instructions"))
        .and_then(|l| l.split(',').next())
        .and_then(|n| n.trim().parse().ok())
}

/// How many runs this scratch folder has seen (a distinct dump name per run).
fn runs_so_far(scratch: &Scratch) -> usize {
    std::fs::read_dir(scratch.path())
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().ends_with(".sh"))
                .count()
        })
        .unwrap_or(0)
}

/// `callgrind_control <flag> [value] <pid>` (beside `--valgrind`, or on the `PATH`), bounded.
async fn callgrind_control(args: &Args, flag: &str, value: &str, pid: u32) -> anyhow::Result<()> {
    let control = args
        .valgrind
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .map(|d| d.join("callgrind_control"))
        .filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("callgrind_control"));
    let mut cmd = tokio::process::Command::new(&control);
    cmd.arg(flag);
    if !value.is_empty() {
        cmd.arg(value);
    }
    let o = tokio::time::timeout(Duration::from_secs(120), cmd.arg(pid.to_string()).output())
        .await
        .context("callgrind_control did not answer within 120 s")?
        .with_context(|| format!("cannot run {}", control.display()))?;
    anyhow::ensure!(
        o.status.success(),
        "callgrind_control {flag}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    Ok(())
}

/// Stops `perf stat` (SIGINT makes it print its counts) and reads its count.
async fn perf_count(perf: tokio::process::Child) -> anyhow::Result<u64> {
    let perf_pid = perf.id().context("perf has no pid")?;
    let _ = tokio::process::Command::new("kill")
        .args(["-INT", &perf_pid.to_string()])
        .status()
        .await;
    let out = tokio::time::timeout(Duration::from_secs(10), perf.wait_with_output())
        .await
        .context("perf did not exit")??;
    let text = String::from_utf8_lossy(&out.stderr);
    match parse_perf_instructions(&text) {
        Some(n) => Ok(n),
        None => bail!(
            "perf counted nothing (no hardware counters here, or perf_event_paranoid > 2; \
             leave out --serve-cpu-perf to count under callgrind): {text}"
        ),
    }
}

/// The `totals:` line of a callgrind dump (its only event, `Ir`).
fn parse_callgrind_totals(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("totals:"))
        .and_then(|n| n.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

/// One counted run of `program`.
async fn one_run(
    args: &Args,
    scratch: &Scratch,
    program: &Path,
    round: usize,
) -> anyhow::Result<ServeCpuRun> {
    let tenants: Vec<String> = (0..args.tenants.max(1))
        .map(|i| format!("bench-t{i}"))
        .collect();
    let clients = args.clients.max(1);
    let redis = procs::start_redis(&args.redis_server, scratch).await?;
    // Under callgrind: serve started by a script that execs valgrind (so its pid is
    // valgrind's), with time-outs a 50 times slower process keeps.
    let out = scratch.path().join(format!(
        "serve-cpu-{round}-{}.callgrind",
        runs_so_far(scratch)
    ));
    let (started, extra): (PathBuf, Vec<String>) = if args.serve_cpu_perf {
        (program.to_owned(), Vec::new())
    } else {
        let wrapper = out.with_extension("sh");
        std::fs::write(
            &wrapper,
            format!(
                "#!/bin/sh\nexec '{}' --tool=callgrind --instr-atstart=no \
                 --callgrind-out-file='{}' '{}' \"$@\"\n",
                args.valgrind.display(),
                out.display(),
                program.display()
            ),
        )?;
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))?;
        (
            wrapper,
            [
                "--redis-timeout-ms",
                "5000",
                "--request-timeout-ms",
                "30000",
            ]
            .map(String::from)
            .to_vec(),
        )
    };
    let cmd = crate::harness::sluice_cmd(args, started, redis.target());
    let (mut serve, addr) =
        procs::start_serve_with(&cmd, scratch, ADMIN_TOKEN, UNLIMITED, UNLIMITED, &extra).await?;
    let workload = |tag: &str| Workload::echo(addr, &tenants, tag);
    let limit = Duration::from_secs(300);
    let warm = workload("scpu-warm");
    load::closed_loop_count(
        &warm,
        clients,
        args.serve_cpu_warmup,
        limit,
        Arc::new(Progress::default()),
    )
    .await?;

    let pid = serve.pid().context("serve has no pid")?;
    let counter = if args.serve_cpu_perf {
        let perf = tokio::process::Command::new(&args.perf)
            .args([
                "stat",
                "-x,",
                "-e",
                "instructions:u",
                "-p",
                &pid.to_string(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot run {}", args.perf.display()))?;
        // perf attaches asynchronously: what it misses of the first requests is bounded
        // (a few of tens of thousands), not a race on the result.
        tokio::time::sleep(Duration::from_millis(300)).await;
        Some(perf)
    } else {
        callgrind_control(args, "-i", "on", pid).await?;
        None
    };
    let url = redis.urls[0].clone();
    let (calls0, _) = script_stats(&url).await?;
    let serve_cpu0 = procs::cpu_seconds(pid).unwrap_or(0.0);
    let redis_cpu0 = redis.nodes[0]
        .pid()
        .and_then(procs::cpu_seconds)
        .unwrap_or(0.0);
    let w = workload("scpu");
    let res = load::closed_loop_count(
        &w,
        clients,
        args.serve_cpu_count,
        limit,
        Arc::new(Progress::default()),
    )
    .await?;
    let serve_cpu = procs::cpu_seconds(pid).unwrap_or(0.0) - serve_cpu0;
    let redis_cpu = redis.nodes[0]
        .pid()
        .and_then(procs::cpu_seconds)
        .unwrap_or(0.0)
        - redis_cpu0;
    let (calls1, _) = script_stats(&url).await?;
    let instructions = match counter {
        Some(perf) => perf_count(perf).await?,
        None => {
            callgrind_control(args, "-d", "", pid).await?;
            let dump = format!("{}.1", out.display());
            let text = std::fs::read_to_string(&dump)
                .with_context(|| format!("no callgrind dump at {dump}"))?;
            parse_callgrind_totals(&text).context("callgrind dump without totals")?
        }
    };
    serve.ensure_running()?;
    serve.kill().await;
    redis.kill().await;
    let n = res.outcomes.created.max(1) as f64;
    let run = ServeCpuRun {
        build: program.display().to_string(),
        round,
        admitted: res.outcomes.created,
        errors: res.outcomes.errors,
        serve_instructions: (instructions as f64 / n).round(),
        serve_cpu_us: round2(serve_cpu * 1e6 / n),
        redis_cpu_us: round2(redis_cpu * 1e6 / n),
        admissions_per_call: round2(n / (calls1 - calls0).max(1) as f64),
        admissions_per_sec: round2(n / res.elapsed.as_secs_f64().max(1e-3)),
    };
    eprintln!(
        "[serve-cpu] {} #{round}: {:.0} instructions, {:.1} µs serve CPU, {:.1} µs Redis CPU per \
         admission; {:.2} admissions per call, {:.0}/s",
        run.build,
        run.serve_instructions,
        run.serve_cpu_us,
        run.redis_cpu_us,
        run.admissions_per_call,
        run.admissions_per_sec
    );
    Ok(run)
}

/// Runs `--serve-cpu` on one build or alternates two.
pub async fn run(args: &Args, builds: &[PathBuf]) -> anyhow::Result<ServeCpuReport> {
    let programs: Vec<PathBuf> = builds.iter().map(|b| program(b)).collect();
    for p in &programs {
        anyhow::ensure!(p.exists(), "no sluice program at {}", p.display());
    }
    let scratch = Scratch::create()?;
    let mut runs = Vec::new();
    for round in 0..args.serve_cpu_runs.max(1) {
        let sides: Vec<usize> = if programs.len() == 2 {
            order(round).to_vec()
        } else {
            (0..programs.len()).collect()
        };
        for i in sides {
            runs.push(one_run(args, &scratch, &programs[i], round + 1).await?);
        }
    }
    let sides = programs
        .iter()
        .map(|p| {
            let name = p.display().to_string();
            let of = |f: fn(&ServeCpuRun) -> f64| {
                median(runs.iter().filter(|r| r.build == name).map(f).collect())
            };
            ServeCpuSide {
                serve_instructions: of(|r| r.serve_instructions).round(),
                serve_cpu_us: round2(of(|r| r.serve_cpu_us)),
                redis_cpu_us: round2(of(|r| r.redis_cpu_us)),
                admissions_per_call: round2(of(|r| r.admissions_per_call)),
                admissions_per_sec: round2(of(|r| r.admissions_per_sec)),
                build: name,
            }
        })
        .collect();
    let correct = runs.iter().all(|r| r.errors == 0);
    Ok(ServeCpuReport {
        counter: if args.serve_cpu_perf {
            "perf"
        } else {
            "callgrind"
        },
        count: args.serve_cpu_count,
        clients: args.clients,
        sides,
        runs,
        correct,
    })
}

impl ServeCpuReport {
    /// The human report: medians per build, the change, every run.
    pub fn human(&self) -> String {
        let mut s = format!(
            "serve's CPU per HTTP admission: {} admissions counted per run ({}), {} \
             connections\n\n| median | {} |\n|---|{}\n",
            self.count,
            self.counter,
            self.clients,
            self.sides
                .iter()
                .map(|x| x.build.as_str())
                .collect::<Vec<_>>()
                .join(" | "),
            "---:|".repeat(self.sides.len()),
        );
        let row = |name: &str, f: fn(&ServeCpuSide) -> f64| {
            format!(
                "| {name} | {} |\n",
                self.sides
                    .iter()
                    .map(|x| format!("{:.2}", f(x)))
                    .collect::<Vec<_>>()
                    .join(" | ")
            )
        };
        s += &row("serve instructions per admission", |x| x.serve_instructions);
        s += &row("serve CPU per admission (µs)", |x| x.serve_cpu_us);
        s += &row("redis-server CPU per admission (µs)", |x| x.redis_cpu_us);
        s += &row("admissions per script call", |x| x.admissions_per_call);
        s += &row("admissions/s (reported, not judged)", |x| {
            x.admissions_per_sec
        });
        if let [a, b] = self.sides.as_slice() {
            s += &format!(
                "\nserve instructions per admission: {:+.1} %\n",
                (b.serve_instructions / a.serve_instructions.max(1.0) - 1.0) * 100.0
            );
        }
        s += "\nruns:\n";
        for r in &self.runs {
            s += &format!(
                "  {} #{}: {:.0} instr, {:.1} µs serve, {:.1} µs redis, {:.2}/call, {:.0}/s, \
                 {} admitted, {} errors\n",
                r.build,
                r.round,
                r.serve_instructions,
                r.serve_cpu_us,
                r.redis_cpu_us,
                r.admissions_per_call,
                r.admissions_per_sec,
                r.admitted,
                r.errors
            );
        }
        if !self.correct {
            s += "\nVOID: some admission was not answered 201\n";
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perf_csv_output_gives_the_instruction_count() {
        let out = "\n123456789,,instructions:u,2003456,100.00,,\n";
        assert_eq!(parse_perf_instructions(out), Some(123_456_789));
        assert_eq!(
            parse_perf_instructions("<not supported>,,instructions:u,0,100.00,,\n"),
            None
        );
    }

    #[test]
    fn a_callgrind_dump_gives_its_totals() {
        let dump = "events: Ir\nsummary: 0\n\nfn=main\n1 2\ntotals: 555774668\n";
        assert_eq!(parse_callgrind_totals(dump), Some(555_774_668));
        assert_eq!(parse_callgrind_totals("events: Ir\n"), None);
    }
}
