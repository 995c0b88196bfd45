//! `--compare-keyed`: HTTP admission on one build without and with concurrency keys,
//! alternating runs on fresh processes, medians, and the keyed / plain target.

use std::fmt::Write;
use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use super::{DEFAULT_COMPARE_KEYS, set_key_limits};
use crate::compare::{median, order, rest, round2, script_stats};
use crate::direct::Direct;
use crate::harness::Pids;
use crate::load::{self, Workload};
use crate::procs::{self, Scratch};
use crate::report::{Check, Target};
use crate::{ADMIN_TOKEN, Args, UNLIMITED};

/// One run of one side of `--compare-keyed`.
#[derive(Debug, Clone, Serialize)]
pub struct KeyedRun {
    /// `plain` or `keyed`.
    pub side: &'static str,
    pub round: usize,
    pub admissions_per_sec: f64,
    pub p99_ms: f64,
    /// Redis's time per script call (µs, `INFO commandstats`).
    pub script_us_per_call: f64,
    /// Cores the rest of the machine (not this benchmark's processes) used meanwhile.
    pub rest_cores: f64,
    /// Non-2xx admissions (must be 0).
    pub errors: u64,
}

/// The medians of one side's runs.
#[derive(Debug, Clone, Serialize)]
pub struct KeyedMedians {
    pub admissions_per_sec: f64,
    pub p99_ms: f64,
    pub script_us_per_call: f64,
    pub rest_cores: f64,
}

/// `--compare-keyed`: HTTP admission without and with concurrency keys on one build.
#[derive(Debug, Clone, Serialize)]
pub struct KeyedComparison {
    /// The `sluice` program measured.
    pub program: String,
    pub secs: u64,
    pub clients: usize,
    pub tenants: usize,
    /// Concurrency keys per tenant on the keyed side, and every tenant's
    /// `max_concurrent_per_key` there.
    pub keys: u64,
    pub key_limit: u32,
    pub runs_per_side: usize,
    pub plain: KeyedMedians,
    pub keyed: KeyedMedians,
    /// keyed / plain admissions per second (medians).
    pub ratio: f64,
    pub target: Target,
    pub runs: Vec<KeyedRun>,
    /// The admission phase's check (what Redis holds vs what clients were told) of each run.
    pub checks: Vec<Check>,
    /// Every check passed.
    pub correct: bool,
}

/// One run of one side: a fresh `redis-server` and `serve`, (keyed: the tenants' per-key
/// limit,) the admission phase's closed loop, its correctness check.
async fn keyed_run(
    args: &Args,
    scratch: &Scratch,
    program: &Path,
    keys: u64,
    round: usize,
) -> anyhow::Result<(KeyedRun, Check)> {
    let side = if keys > 0 { "keyed" } else { "plain" };
    let tenants: Vec<String> = (0..args.tenants.max(1))
        .map(|i| format!("bench-t{i}"))
        .collect();
    let redis = procs::start_redis(&args.redis_server, scratch).await?;
    let cmd = crate::harness::sluice_cmd(args, program, redis.target());
    let (mut serve, addr) =
        procs::start_serve(&cmd, scratch, ADMIN_TOKEN, UNLIMITED, UNLIMITED).await?;
    let mut direct = Direct::connect(
        crate::harness::store_config(args, redis.target()),
        &tenants,
        &redis.urls,
    )
    .await?;
    if keys > 0 {
        set_key_limits(addr, ADMIN_TOKEN, &tenants, args.admission_key_limit).await?;
    }
    let w = Workload {
        addr,
        admin_token: ADMIN_TOKEN.into(),
        tenants,
        tag: format!("{side}-{round}"),
        flow: "demo.echo".into(),
        keys,
        tokens: Vec::new(),
    };
    let url = redis.urls[0].clone();
    let pids = Pids::of(&[&redis.nodes[0], &serve]);
    let (calls_before, us_before) = script_stats(&url).await?;
    let name = format!("{side} #{round} admission");
    let secs = Duration::from_secs(args.compare_secs);
    let (r, cpu) = crate::harness::phase(&name, &pids, |p| {
        load::closed_loop(&w, args.clients.max(1), secs, 0, p)
    })
    .await?;
    let (calls, us) = script_stats(&url).await?;
    let (check, _) = crate::harness::check_queued(&name, &r, &mut direct).await?;
    drop(direct);
    serve.ensure_running()?;
    serve.kill().await;
    redis.kill().await;
    let run = KeyedRun {
        side,
        round,
        admissions_per_sec: round2(r.outcomes.created as f64 / r.elapsed.as_secs_f64().max(1e-3)),
        p99_ms: r.latencies.percentiles().p99_ms,
        script_us_per_call: round2((us - us_before) as f64 / (calls - calls_before).max(1) as f64),
        rest_cores: rest(&cpu),
        errors: r.outcomes.errors,
    };
    eprintln!(
        "[compare-keyed] {side} #{round}: {:.0} admissions/s ({:.1} µs/script call); check {}",
        run.admissions_per_sec,
        run.script_us_per_call,
        if check.ok { "passed" } else { "FAILED" }
    );
    Ok((run, check))
}

/// Runs `--compare-keyed`.
pub async fn compare_keyed(args: &Args) -> anyhow::Result<KeyedComparison> {
    let program = crate::harness::sluice_program(args)?;
    let scratch = Scratch::create()?;
    let keys = args.admission_keys().unwrap_or(DEFAULT_COMPARE_KEYS);
    let runs_per_side = args.compare_runs.max(1);
    let (mut runs, mut checks) = (Vec::new(), Vec::new());
    for round in 1..=runs_per_side {
        for side in order(round - 1) {
            let k = if side == 1 { keys } else { 0 };
            let (run, check) = keyed_run(args, &scratch, &program, k, round).await?;
            runs.push(run);
            checks.push(check);
        }
    }
    let medians = |side: &str| {
        let of = |f: fn(&KeyedRun) -> f64| {
            round2(median(
                runs.iter().filter(|r| r.side == side).map(f).collect(),
            ))
        };
        KeyedMedians {
            admissions_per_sec: of(|r| r.admissions_per_sec),
            p99_ms: of(|r| r.p99_ms),
            script_us_per_call: of(|r| r.script_us_per_call),
            rest_cores: of(|r| r.rest_cores),
        }
    };
    let (plain, keyed) = (medians("plain"), medians("keyed"));
    let ratio = round2(keyed.admissions_per_sec / plain.admissions_per_sec.max(1e-9));
    let correct = checks.iter().all(|c| c.ok);
    Ok(KeyedComparison {
        program: program.display().to_string(),
        secs: args.compare_secs,
        clients: args.clients.max(1),
        tenants: args.tenants.max(1),
        keys,
        key_limit: args.admission_key_limit,
        runs_per_side,
        plain,
        keyed,
        ratio,
        target: Target {
            name: "keyed / plain HTTP admissions (medians)".into(),
            measured: ratio,
            limit: 0.85,
            unit: "ratio, at least",
            pass: ratio >= 0.85,
        },
        runs,
        checks,
        correct,
    })
}

impl KeyedComparison {
    /// The table for people: medians of each side, the ratio with PASS/FAIL, every run, the
    /// checks.
    pub fn human(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(
            o,
            "\nsluice keyed admission — medians of {} alternating runs per side (plain keyed \
             keyed plain ...), each on a fresh redis-server and serve\n  program: {}\n  {} s \
             closed loop, {} clients, {} tenants; keyed: every request with a concurrency_key, \
             one of {} per tenant, every tenant with max_concurrent_per_key {}\n",
            self.runs_per_side,
            self.program,
            self.secs,
            self.clients,
            self.tenants,
            self.keys,
            self.key_limit
        );
        let _ = writeln!(
            o,
            "  {:<36} {:>10} {:>10} {:>9}",
            "", "plain", "keyed", "change"
        );
        let (p, k) = (&self.plain, &self.keyed);
        let change = |x: f64, y: f64| {
            if x >= 0.05 {
                format!("{:+.1} %", (y - x) / x * 100.0)
            } else {
                "-".to_owned()
            }
        };
        for (name, x, y) in [
            (
                "HTTP admissions/s",
                p.admissions_per_sec,
                k.admissions_per_sec,
            ),
            ("  p99 latency, ms", p.p99_ms, k.p99_ms),
            (
                "  Redis script µs per call",
                p.script_us_per_call,
                k.script_us_per_call,
            ),
            ("  rest of the machine, cores", p.rest_cores, k.rest_cores),
        ] {
            let _ = writeln!(o, "  {name:<36} {x:>10.1} {y:>10.1} {:>9}", change(x, y));
        }
        let t = &self.target;
        let _ = writeln!(
            o,
            "\n  {}  {:<40} {:>10}  (limit {} {})",
            if t.pass { "PASS" } else { "FAIL" },
            t.name,
            t.measured,
            t.limit,
            t.unit
        );
        let _ = writeln!(
            o,
            "\n  {:<6} {:>5} {:>12} {:>8} {:>8} {:>5} {:>6}",
            "side", "round", "admissions/s", "p99 ms", "µs/call", "rest", "errors"
        );
        for r in &self.runs {
            let _ = writeln!(
                o,
                "  {:<6} {:>5} {:>12.0} {:>8.2} {:>8.1} {:>5.2} {:>6}",
                r.side,
                r.round,
                r.admissions_per_sec,
                r.p99_ms,
                r.script_us_per_call,
                r.rest_cores,
                r.errors
            );
        }
        crate::report::write_checks(&mut o, &self.checks, 24);
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
}
