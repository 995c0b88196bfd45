//! Two builds of `sluice` measured against each other (`--compare-builds OLD NEW`): issue 20
//! asks that a change of dispatch keep Redis's script time per call within 5 % of before, and
//! that throughput be judged as the median of at least 5 alternating runs per build.
//!
//! Each run gives one build two phases, each on a fresh `redis-server` with that build's
//! `sluice serve` (and workers): **HTTP admission** (the closed loop of the admission phase,
//! `--compare-secs`, unique keys) and **end-to-end** (`demo.echo` admitted the same way for
//! `--compare-secs` while `--workers` workers of `--worker-concurrency` run it, until every
//! admitted execution completed). Redis's script time comes from `INFO commandstats` (every
//! `eval*`/`fcall*` command: `usec` / `calls`), so it is Redis's own CPU per call, unaffected by
//! how busy the rest of the machine is. The builds alternate in the order A B B A A B ..., so a
//! drift of the machine over the session falls on both alike; the medians are of `--compare-runs`
//! runs per build.
//!
//! Only the `sluice` program differs between the two sides: everything is done over HTTP and
//! through `INFO`, and completion is read from the API's listing (`total` of
//! `status=completed`), so no key layout of either build is assumed. The direct `admit.lua`
//! ceiling is not compared: it calls the store linked into this benchmark, which is always the
//! new build's.
//!
//! Long on purpose: one mode read top to bottom (a run, the alternation, the medians, the
//! report), plus the small statistics helpers (`median`, `order`, `round2`, `rest`) that
//! `--compare-keyed` reuses; the unit tests close the file.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use serde_json::Value;

use crate::harness::Pids;
use crate::load::{self, Conn, Workload};
use crate::procs::{self, Proc, Scratch, SluiceCmd};
use crate::report::CpuShare;
use crate::{ADMIN_TOKEN, Args, UNLIMITED};

/// One run of one build.
#[derive(Debug, Clone, Serialize)]
pub struct BuildRun {
    /// `before` or `after`.
    pub build: &'static str,
    pub round: usize,
    pub admissions_per_sec: f64,
    /// Redis's time per script call during the admission phase (µs, `INFO commandstats`:
    /// wall time inside Redis, so it grows when other processes take Redis's core).
    pub admission_script_us_per_call: f64,
    /// redis-server's CPU time (user + system, from `/proc`) per script call: also parsing and
    /// replies, but not inflated by waiting for a core.
    pub admission_redis_cpu_us_per_call: f64,
    /// Cores the rest of the machine (not this benchmark's processes) used meanwhile.
    pub admission_rest_cores: f64,
    pub e2e_admitted: u64,
    pub e2e_completed: u64,
    /// Completed executions per second, from the first admission to the moment the last one
    /// was seen completed (polled every 20 ms).
    pub e2e_per_sec: f64,
    /// Redis's time per script call during the end-to-end phase (admit, start, complete).
    pub e2e_script_us_per_call: f64,
    /// redis-server's CPU time per script call, as for admission.
    pub e2e_redis_cpu_us_per_call: f64,
    pub e2e_rest_cores: f64,
    /// Redis's script time per completed execution.
    pub e2e_script_us_per_execution: f64,
    /// Non-2xx admissions in both phases (must be 0).
    pub errors: u64,
}

/// The medians of one build's runs.
#[derive(Debug, Clone, Serialize)]
pub struct BuildMedians {
    pub program: String,
    pub runs: usize,
    pub admissions_per_sec: f64,
    pub admission_script_us_per_call: f64,
    pub admission_redis_cpu_us_per_call: f64,
    pub e2e_per_sec: f64,
    pub e2e_script_us_per_call: f64,
    pub e2e_redis_cpu_us_per_call: f64,
    pub e2e_script_us_per_execution: f64,
    /// Cores the rest of the machine used during the phases (median): how disturbed they were.
    pub admission_rest_cores: f64,
    pub e2e_rest_cores: f64,
}

/// The comparison: every run, and each build's medians.
#[derive(Debug, Clone, Serialize)]
pub struct BuildComparison {
    pub admission_secs: u64,
    pub e2e_secs: u64,
    pub workers: usize,
    pub worker_concurrency: usize,
    pub before: BuildMedians,
    pub after: BuildMedians,
    pub runs: Vec<BuildRun>,
    /// Every admission answered 2xx and everything admitted completed.
    pub correct: bool,
}

/// `path` itself, or `path/sluice` when it is a folder.
pub(crate) fn program(path: &Path) -> PathBuf {
    if path.is_dir() {
        path.join("sluice")
    } else {
        path.to_owned()
    }
}

/// The median (the mean of the middle two for an even count); 0 without values.
pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The order of the builds in each round: A B, B A, A B, ... (0 = before, 1 = after).
pub(crate) fn order(round: usize) -> [usize; 2] {
    if round.is_multiple_of(2) {
        [0, 1]
    } else {
        [1, 0]
    }
}

/// Script calls and microseconds in `INFO commandstats` (every `eval*` and `fcall*`).
pub(crate) async fn script_stats(url: &str) -> anyhow::Result<(u64, u64)> {
    let mut c = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut c)
        .await?;
    Ok(parse_script_stats(&info))
}

/// (calls, usec) summed over the script commands of an `INFO commandstats` text.
fn parse_script_stats(info: &str) -> (u64, u64) {
    let (mut calls, mut usec) = (0, 0);
    for line in info.lines() {
        let Some((name, fields)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        if !(name.starts_with("eval") || name.starts_with("fcall")) {
            continue;
        }
        let field = |k: &str| {
            fields
                .split(',')
                .find_map(|f| f.strip_prefix(k))
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        calls += field("calls=");
        usec += field("usec=");
    }
    (calls, usec)
}

/// Executions in status `completed` over `tenants`, by the API's listing totals.
async fn completed(conn: &mut Conn, tenants: &[String]) -> anyhow::Result<u64> {
    let mut sum = 0;
    for t in tenants {
        let (status, body) = conn
            .call(
                hyper::Method::GET,
                "/api/executions?status=completed&limit=1",
                ADMIN_TOKEN,
                t,
                "",
            )
            .await?;
        anyhow::ensure!(status == 200, "listing answered {status}");
        let v: Value = serde_json::from_slice(&body)?;
        sum += v["total"].as_u64().context("a listing without total")?;
    }
    Ok(sum)
}

pub(crate) fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

/// CPU seconds a process used so far (0 when unreadable).
fn cpu_of(p: &Proc) -> f64 {
    p.pid().and_then(procs::cpu_seconds).unwrap_or(0.0)
}

/// The "rest of the machine" share of a phase's CPU shares.
pub(crate) fn rest(cpu: &[CpuShare]) -> f64 {
    cpu.iter()
        .find(|c| c.process == "rest")
        .map_or(0.0, |c| c.cores)
}

/// One run of `program`: admission, then end-to-end, each on a fresh Redis.
async fn one_run(
    args: &Args,
    scratch: &Scratch,
    program: &Path,
    build: &'static str,
    round: usize,
) -> anyhow::Result<BuildRun> {
    let tenants: Vec<String> = (0..args.tenants.max(1))
        .map(|i| format!("bench-t{i}"))
        .collect();
    let clients = args.clients.max(1);
    let secs = Duration::from_secs(args.compare_secs);

    // HTTP admission.
    let redis = procs::start_redis(&args.redis_server, scratch).await?;
    let cmd = crate::harness::sluice_cmd(args, program, redis.target());
    let (mut serve, addr) =
        procs::start_serve(&cmd, scratch, ADMIN_TOKEN, UNLIMITED, UNLIMITED).await?;
    let url = redis.urls[0].clone();
    let workload = |tag: &str| Workload::echo(addr, &tenants, tag);
    let pids = Pids::of(&[&redis.nodes[0], &serve]);
    let (before_calls, before_us) = script_stats(&url).await?;
    let cpu_before = cpu_of(&redis.nodes[0]);
    let name = format!("{build} #{round} admission");
    let w = workload("cmp-adm");
    let (adm, adm_cpu) =
        crate::harness::phase(&name, &pids, |p| load::closed_loop(&w, clients, secs, 0, p)).await?;
    let (calls, us) = script_stats(&url).await?;
    let adm_redis_cpu = cpu_of(&redis.nodes[0]) - cpu_before;
    let (adm_calls, adm_us) = (calls - before_calls, us - before_us);
    serve.ensure_running()?;
    serve.kill().await;
    redis.kill().await;

    // End to end.
    let redis = procs::start_redis(&args.redis_server, scratch).await?;
    let cmd = SluiceCmd {
        redis: redis.target(),
        ..cmd
    };
    let (mut serve, addr) =
        procs::start_serve(&cmd, scratch, ADMIN_TOKEN, UNLIMITED, UNLIMITED).await?;
    let url = redis.urls[0].clone();
    let extra = [
        "--concurrency".to_owned(),
        args.worker_concurrency.to_string(),
    ];
    let mut workers: Vec<Proc> = Vec::new();
    for n in 1..=args.workers.max(1) {
        workers.push(procs::start_worker(
            &cmd,
            scratch,
            &format!("cmp-worker-{n}"),
            &extra,
        )?);
    }
    procs::wait_started(&mut workers).await?;
    let mut all: Vec<&Proc> = vec![&redis.nodes[0], &serve];
    all.extend(workers.iter());
    let pids = Pids::of(&all);
    let (before_calls, before_us) = script_stats(&url).await?;
    let cpu_before = cpu_of(&redis.nodes[0]);
    let shares_before = pids.sample();
    let started = Instant::now();
    let w = Workload {
        addr,
        ..workload("cmp-e2e")
    };
    let name = format!("{build} #{round} end-to-end");
    let (e2e, _) =
        crate::harness::phase(&name, &pids, |p| load::closed_loop(&w, clients, secs, 0, p)).await?;
    let mut conn = Conn::connect(addr).await?;
    let deadline = Instant::now() + Duration::from_secs(args.e2e_drain_secs);
    let mut done = 0;
    while Instant::now() < deadline {
        done = completed(&mut conn, &tenants).await?;
        if done >= e2e.outcomes.created {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let span = started.elapsed().as_secs_f64().max(1e-3);
    let (calls, us) = script_stats(&url).await?;
    let e2e_redis_cpu = cpu_of(&redis.nodes[0]) - cpu_before;
    let e2e_rest = rest(&pids.since(&shares_before, started.elapsed()));
    let (e2e_calls, e2e_us) = (calls - before_calls, us - before_us);
    for w in &mut workers {
        w.ensure_running()?;
    }
    serve.ensure_running()?;
    for w in workers {
        w.kill().await;
    }
    serve.kill().await;
    redis.kill().await;

    let run = BuildRun {
        build,
        round,
        admissions_per_sec: round2(
            adm.outcomes.created as f64 / adm.elapsed.as_secs_f64().max(1e-3),
        ),
        admission_script_us_per_call: round2(adm_us as f64 / adm_calls.max(1) as f64),
        admission_redis_cpu_us_per_call: round2(adm_redis_cpu * 1e6 / adm_calls.max(1) as f64),
        admission_rest_cores: rest(&adm_cpu),
        e2e_admitted: e2e.outcomes.created,
        e2e_completed: done,
        e2e_per_sec: round2(done as f64 / span),
        e2e_script_us_per_call: round2(e2e_us as f64 / e2e_calls.max(1) as f64),
        e2e_redis_cpu_us_per_call: round2(e2e_redis_cpu * 1e6 / e2e_calls.max(1) as f64),
        e2e_rest_cores: e2e_rest,
        e2e_script_us_per_execution: round2(e2e_us as f64 / done.max(1) as f64),
        errors: adm.outcomes.errors + e2e.outcomes.errors,
    };
    eprintln!(
        "[compare] {build} #{round}: {:.0} admissions/s ({:.1} µs/script call), {:.0} \
         completed/s ({:.1} µs/script call, {:.1} µs/execution)",
        run.admissions_per_sec,
        run.admission_script_us_per_call,
        run.e2e_per_sec,
        run.e2e_script_us_per_call,
        run.e2e_script_us_per_execution
    );
    Ok(run)
}

/// Runs the comparison of `builds` = [before, after].
pub async fn compare(args: &Args, builds: &[PathBuf]) -> anyhow::Result<BuildComparison> {
    anyhow::ensure!(builds.len() == 2, "--compare-builds takes two programs");
    let programs = [program(&builds[0]), program(&builds[1])];
    for p in &programs {
        anyhow::ensure!(p.exists(), "{} not found", p.display());
    }
    let scratch = Scratch::create()?;
    let names = ["before", "after"];
    let mut runs = Vec::new();
    for round in 1..=args.compare_runs.max(1) {
        for b in order(round - 1) {
            runs.push(one_run(args, &scratch, &programs[b], names[b], round).await?);
        }
    }
    let medians = |b: usize| {
        let of = |f: fn(&BuildRun) -> f64| {
            round2(median(
                runs.iter().filter(|r| r.build == names[b]).map(f).collect(),
            ))
        };
        BuildMedians {
            program: programs[b].display().to_string(),
            runs: args.compare_runs.max(1),
            admissions_per_sec: of(|r| r.admissions_per_sec),
            admission_script_us_per_call: of(|r| r.admission_script_us_per_call),
            admission_redis_cpu_us_per_call: of(|r| r.admission_redis_cpu_us_per_call),
            e2e_per_sec: of(|r| r.e2e_per_sec),
            e2e_script_us_per_call: of(|r| r.e2e_script_us_per_call),
            e2e_redis_cpu_us_per_call: of(|r| r.e2e_redis_cpu_us_per_call),
            e2e_script_us_per_execution: of(|r| r.e2e_script_us_per_execution),
            admission_rest_cores: of(|r| r.admission_rest_cores),
            e2e_rest_cores: of(|r| r.e2e_rest_cores),
        }
    };
    let correct = runs
        .iter()
        .all(|r| r.errors == 0 && r.e2e_completed == r.e2e_admitted);
    Ok(BuildComparison {
        admission_secs: args.compare_secs,
        e2e_secs: args.compare_secs,
        workers: args.workers.max(1),
        worker_concurrency: args.worker_concurrency,
        before: medians(0),
        after: medians(1),
        runs,
        correct,
    })
}

impl BuildComparison {
    /// The table for people: medians before and after, the change, and every run.
    pub fn human(&self) -> String {
        use std::fmt::Write;
        let mut o = String::new();
        let (b, a) = (&self.before, &self.after);
        let _ = writeln!(
            o,
            "\nsluice before/after — medians of {} alternating runs per build (A B B A ...), \
             each phase on a fresh redis-server\n  before: {}\n  after:  {}\n  admission: {} s \
             closed loop; end-to-end: {} s of admissions, {} worker(s) of concurrency {}, until \
             all completed\n",
            b.runs,
            b.program,
            a.program,
            self.admission_secs,
            self.e2e_secs,
            self.workers,
            self.worker_concurrency
        );
        let change = |x: f64, y: f64| {
            // Not for a number that rounds to nothing (an undisturbed machine's "rest").
            if x >= 0.05 {
                format!("{:+.1} %", (y - x) / x * 100.0)
            } else {
                "-".to_owned()
            }
        };
        let _ = writeln!(
            o,
            "  {:<44} {:>10} {:>10} {:>9}",
            "", "before", "after", "change"
        );
        let rows = [
            (
                "HTTP admissions/s",
                b.admissions_per_sec,
                a.admissions_per_sec,
            ),
            (
                "  Redis script µs per call (target ≤ +5 %)",
                b.admission_script_us_per_call,
                a.admission_script_us_per_call,
            ),
            (
                "  redis-server CPU µs per script call",
                b.admission_redis_cpu_us_per_call,
                a.admission_redis_cpu_us_per_call,
            ),
            (
                "  rest of the machine, cores",
                b.admission_rest_cores,
                a.admission_rest_cores,
            ),
            ("end-to-end completed/s", b.e2e_per_sec, a.e2e_per_sec),
            (
                "  Redis script µs per call (target ≤ +5 %)",
                b.e2e_script_us_per_call,
                a.e2e_script_us_per_call,
            ),
            (
                "  redis-server CPU µs per script call",
                b.e2e_redis_cpu_us_per_call,
                a.e2e_redis_cpu_us_per_call,
            ),
            (
                "  Redis script µs per execution",
                b.e2e_script_us_per_execution,
                a.e2e_script_us_per_execution,
            ),
            (
                "  rest of the machine, cores",
                b.e2e_rest_cores,
                a.e2e_rest_cores,
            ),
        ];
        for (name, x, y) in rows {
            let _ = writeln!(o, "  {name:<44} {x:>10.1} {y:>10.1} {:>9}", change(x, y));
        }
        // Issue 20's target: script time per call within 5 % of before, in both phases.
        let within = |x: f64, y: f64| x > 0.0 && y <= x * 1.05;
        let met = within(
            b.admission_script_us_per_call,
            a.admission_script_us_per_call,
        ) && within(b.e2e_script_us_per_call, a.e2e_script_us_per_call);
        let _ = writeln!(
            o,
            "\n  {}  Redis script time per call within 5 % of before (admission and end-to-end \
             medians)",
            if met { "PASS" } else { "FAIL" }
        );
        let _ = writeln!(
            o,
            "\n  (µs/call: INFO commandstats, cpu/call: redis-server CPU time per script call, \
             rest: cores used by other processes meanwhile)\n  {:<6} {:>5} {:>12} {:>8} {:>8} \
             {:>5} {:>11} {:>8} {:>8} {:>5} {:>6}",
            "build",
            "round",
            "admissions/s",
            "µs/call",
            "cpu/call",
            "rest",
            "completed/s",
            "µs/call",
            "cpu/call",
            "rest",
            "errors"
        );
        for r in &self.runs {
            let _ = writeln!(
                o,
                "  {:<6} {:>5} {:>12.0} {:>8.1} {:>8.1} {:>5.2} {:>11.0} {:>8.1} {:>8.1} {:>5.2} \
                 {:>6}",
                r.build,
                r.round,
                r.admissions_per_sec,
                r.admission_script_us_per_call,
                r.admission_redis_cpu_us_per_call,
                r.admission_rest_cores,
                r.e2e_per_sec,
                r.e2e_script_us_per_call,
                r.e2e_redis_cpu_us_per_call,
                r.e2e_rest_cores,
                r.errors
            );
        }
        let _ = writeln!(
            o,
            "\nRESULT: {}\n",
            if self.correct {
                "correct (every admission 2xx, everything admitted completed)"
            } else {
                "CORRECTNESS CHECK FAILED (an admission failed or an execution did not complete)"
            }
        );
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_order() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(vec![]), 0.0);
        assert_eq!(order(0), [0, 1]);
        assert_eq!(order(1), [1, 0]);
    }

    #[test]
    fn script_stats_sum_every_script_command() {
        let info = "# Commandstats\r\n\
            cmdstat_evalsha:calls=10,usec=400,usec_per_call=40.00,rejected_calls=0,failed_calls=0\r\n\
            cmdstat_eval:calls=2,usec=100,usec_per_call=50.00\r\n\
            cmdstat_fcall:calls=3,usec=30,usec_per_call=10.00\r\n\
            cmdstat_hget:calls=99,usec=99,usec_per_call=1.00\r\n";
        assert_eq!(parse_script_stats(info), (15, 530));
    }
}
