//! redis-server instructions per execution, counted by `valgrind --tool=callgrind`: for each
//! side, a redis-server run by callgrind, the side's processes started against it (sluice:
//! `serve` and `sluice worker --demo-flows --concurrency 256`; BullMQ: the HTTP admission
//! peer and a `Worker` of concurrency 256 per queue), then, with `callgrind_control`, counters
//! zeroed, an idle window of `--cost-idle-secs` dumped (the baseline: what Redis does with the
//! processes connected and no executions), zeroed again, `--cost-callgrind-count` executions
//! admitted over HTTP at `--cost-callgrind-rate` (open loop, 64 connections, a dedup key each)
//! while the worker runs them, and dumped once the last one completed. Instructions per
//! execution = (the executions' window − the idle window's instructions per second × its
//! length) / executions completed. Start-up and shutdown are outside both windows.
//!
//! Redis under callgrind is some 50 times slower, so sluice's processes get long Redis
//! time-outs here (`--redis-timeout-ms 30000`); an admission answered other than 201 (a 503),
//! a worker call that timed out or an execution not completed makes the run VOID, and the
//! report says why.
//!
//! Long on purpose: the callgrind handle (start, zero, dump, shutdown) and the two sides' runs
//! that use it; the unit tests close the file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use tokio::process::Command;

use super::rounds::{BULLMQ, SLUICE};
use super::{
    CostReport, Ctx, calls_by_name, command_calls, connect, info, peer, split_calls, wait_completed,
};
use crate::direct::Direct;
use crate::harness::{sluice_cmd, store_config};
use crate::load::{self, Workload};
use crate::procs::{self, Redis};
use crate::{ADMIN_TOKEN, UNLIMITED};

/// sluice's Redis time-out under callgrind (and the request time-out, which must exceed three
/// of them).
const SLOW_REDIS_MS: &str = "30000";
const SLOW_REQUEST_MS: &str = "100000";

/// valgrind and its `callgrind_control`, found and working.
#[derive(Debug, Clone)]
pub(crate) struct Valgrind {
    program: PathBuf,
    control: PathBuf,
    annotate: PathBuf,
    pub version: String,
}

impl Valgrind {
    /// `program --version` and `callgrind_control --version` (beside it, or on the `PATH`);
    /// why not, when either does not run.
    pub async fn find(program: &Path) -> Result<Self, String> {
        let version = match Command::new(program).arg("--version").output().await {
            Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_owned(),
            _ => {
                return Err(format!(
                    "`{}` does not run: install valgrind (Debian's package `valgrind`; \
                     scripts/bench.sh --cost does with apt-get)",
                    program.display()
                ));
            }
        };
        let beside = |tool: &str| {
            program
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .map(|d| d.join(tool))
                .filter(|p| p.exists())
                .unwrap_or_else(|| PathBuf::from(tool))
        };
        let control = beside("callgrind_control");
        match Command::new(&control).arg("--version").output().await {
            Ok(o) if o.status.success() => {}
            _ => return Err(format!("`{}` does not run", control.display())),
        }
        Ok(Self {
            program: program.to_owned(),
            control,
            annotate: beside("callgrind_annotate"),
            version,
        })
    }
}

/// A redis-server run by callgrind: zeroed and dumped by its process id.
pub(crate) struct Counted {
    pub redis: Redis,
    pid: u32,
    out: PathBuf,
    dumps: usize,
    vg: Valgrind,
}

impl Counted {
    /// Starts it (named `name`, its dumps in the scratch folder).
    pub async fn start(vg: &Valgrind, ctx: &Ctx<'_>, name: &str) -> anyhow::Result<Self> {
        let out = ctx.scratch.path().join(format!("{name}.callgrind"));
        eprintln!("[cost] {name}: redis-server under callgrind");
        let redis = procs::start_redis_callgrind(
            &vg.program,
            &ctx.args.redis_server,
            ctx.scratch,
            name,
            &out,
        )
        .await?;
        let pid = redis.nodes[0]
            .pid()
            .context("redis under callgrind exited")?;
        Ok(Self {
            redis,
            pid,
            out,
            dumps: 0,
            vg: vg.clone(),
        })
    }

    async fn control(&self, flag: &str) -> anyhow::Result<()> {
        let o = tokio::time::timeout(
            Duration::from_secs(120),
            Command::new(&self.vg.control)
                .arg(flag)
                .arg(self.pid.to_string())
                .output(),
        )
        .await
        .context("callgrind_control did not answer in 120 s")??;
        anyhow::ensure!(
            o.status.success(),
            "callgrind_control {flag} failed: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        Ok(())
    }

    /// Zeroes the counters.
    pub async fn zero(&self) -> anyhow::Result<()> {
        self.control("-z").await
    }

    /// Dumps the counters since the last zero; their instructions and the dump's file.
    pub async fn dump(&mut self) -> anyhow::Result<(u64, PathBuf)> {
        self.control("-d").await?;
        self.dumps += 1;
        let file = PathBuf::from(format!("{}.{}", self.out.display(), self.dumps));
        Ok((summary_ir(&file)?, file))
    }

    /// Zeroes, runs `f`, dumps: the instructions of `f` and how long it took.
    pub async fn window<T, F: Future<Output = anyhow::Result<T>>>(
        &mut self,
        f: F,
    ) -> anyhow::Result<(T, Window)> {
        self.zero().await?;
        let t = Instant::now();
        let out = f.await?;
        let (ir, file) = self.dump().await?;
        Ok((
            out,
            Window {
                ir,
                secs: t.elapsed().as_secs_f64(),
                file,
            },
        ))
    }

    /// An idle window of `secs`: the instructions per second Redis spends with nothing to do.
    pub async fn idle_rate(&mut self, secs: f64) -> anyhow::Result<f64> {
        let ((), w) = self
            .window(async {
                tokio::time::sleep(Duration::from_secs_f64(secs)).await;
                Ok(())
            })
            .await?;
        Ok(w.ir as f64 / w.secs.max(1e-3))
    }

    /// `SHUTDOWN NOSAVE`, and waits for the process (callgrind writes its last file).
    pub async fn shutdown(self) -> anyhow::Result<()> {
        if let Ok(mut c) = connect(&self.redis.urls[0]).await {
            // The connection closes instead of answering.
            let _: redis::RedisResult<()> = redis::cmd("SHUTDOWN")
                .arg("NOSAVE")
                .query_async(&mut c)
                .await;
        }
        let mut nodes = self.redis.nodes;
        match nodes.pop() {
            Some(p) => p.wait_exit(Duration::from_secs(120)).await,
            None => Ok(()),
        }
    }

    /// The functions with the most instructions of a dump (`callgrind_annotate`), as it
    /// prints them; empty when it does not run.
    pub async fn top_functions(&self, file: &Path, n: usize) -> Vec<String> {
        let Ok(Ok(o)) = tokio::time::timeout(
            Duration::from_secs(120),
            Command::new(&self.vg.annotate)
                .arg("--inclusive=no")
                .arg(file)
                .output(),
        )
        .await
        else {
            return Vec::new();
        };
        top_lines(&String::from_utf8_lossy(&o.stdout), n)
    }
}

/// A counted window.
pub(crate) struct Window {
    pub ir: u64,
    pub secs: f64,
    pub file: PathBuf,
}

/// The `summary:` line of a callgrind dump: its instructions (`Ir`).
fn summary_ir(file: &Path) -> anyhow::Result<u64> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("callgrind wrote no {}", file.display()))?;
    parse_summary(&text).with_context(|| format!("no summary line in {}", file.display()))
}

fn parse_summary(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("summary:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// The first `n` function lines of `callgrind_annotate`'s table (`1,234 (12.3%)  file:fn`);
/// none when one line holds everything (after `callgrind_control` zeroed the counters,
/// `callgrind_annotate` puts a dumped window's whole cost on the program's entry).
fn top_lines(text: &str, n: usize) -> Vec<String> {
    let lines: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| l.contains("%)") && !l.contains("PROGRAM TOTALS"))
        .filter(|l| l.chars().next().is_some_and(|c| c.is_ascii_digit()))
        .take(n)
        .map(|l| l.split(" [").next().unwrap_or(l).to_owned())
        .collect();
    if lines.first().is_some_and(|l| l.contains("(100.0%)")) {
        return Vec::new();
    }
    lines
}

/// One side's end-to-end count.
#[derive(Debug, Clone, Serialize)]
pub struct E2eInstructions {
    pub system: String,
    pub admitted: u64,
    pub completed: u64,
    /// Admissions answered other than 201 (a 503 voids the run).
    pub errors: u64,
    /// Why the run does not count, when it does not.
    pub void: Option<String>,
    pub window_ir: u64,
    pub window_secs: f64,
    pub idle_ir_per_sec: f64,
    pub ir_per_execution: f64,
    pub script_calls_per_execution: f64,
    pub commands_per_execution: f64,
    /// Of those, what the idle rate adds at this run's rate: the commands of the idle window
    /// per second (orphan scans, safety polls: what runs whatever the load) times the
    /// window's length, per execution. Unlike the instructions, the command counts keep it.
    pub idle_commands_per_execution: f64,
    /// Calls per execution by command name (script calls and the commands they ran, as
    /// `INFO commandstats` names them), largest first.
    pub commands_by_name: Vec<(String, f64)>,
    /// Where the instructions went (`callgrind_annotate`, self cost).
    pub top_functions: Vec<String>,
}

/// The end-to-end counts, or why not.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Instructions {
    pub not_run: Option<String>,
    pub valgrind: Option<String>,
    pub rate: f64,
    pub executions: u64,
    pub sides: Vec<E2eInstructions>,
}

/// Both sides' runs, or NOT RUN.
pub(super) async fn measure(ctx: &Ctx<'_>, report: &mut CostReport) -> anyhow::Result<()> {
    let args = ctx.args;
    let mut out = Instructions {
        rate: args.cost_callgrind_rate,
        executions: args.cost_callgrind_count,
        ..Instructions::default()
    };
    match &ctx.valgrind {
        Err(why) => out.not_run = Some(why.clone()),
        Ok(vg) => {
            out.valgrind = Some(vg.version.clone());
            out.sides.push(sluice_e2e(ctx, vg).await?);
            match ctx.peer {
                Ok(_) => out.sides.push(bullmq_e2e(ctx, vg).await?),
                Err(ref why) => {
                    out.not_run = Some(format!("the BullMQ peer cannot run: {why}"));
                }
            }
        }
    }
    report.instructions = Some(out);
    Ok(())
}

fn workload(ctx: &Ctx<'_>, addr: std::net::SocketAddr) -> Workload {
    Workload {
        addr,
        admin_token: ADMIN_TOKEN.into(),
        tenants: ctx.tenants.clone(),
        tag: "cg".into(),
        flow: "demo.echo".into(),
        keys: 0,
        tokens: Vec::new(),
    }
}

/// The open loop's length: `count` admissions at `rate`.
fn span(ctx: &Ctx<'_>) -> Duration {
    let a = ctx.args;
    Duration::from_secs_f64(a.cost_callgrind_count as f64 / a.cost_callgrind_rate.max(0.1))
}

async fn sluice_e2e(ctx: &Ctx<'_>, vg: &Valgrind) -> anyhow::Result<E2eInstructions> {
    let args = ctx.args;
    let mut cg = Counted::start(vg, ctx, "redis-callgrind-sluice").await?;
    let cmd = sluice_cmd(args, &ctx.program, cg.redis.target());
    let serve_extra = slow_args(true);
    let (serve, addr) = procs::start_serve_with(
        &cmd,
        ctx.scratch,
        ADMIN_TOKEN,
        UNLIMITED,
        UNLIMITED,
        &serve_extra,
    )
    .await?;
    let mut worker_extra = vec!["--concurrency".to_owned(), "256".to_owned()];
    worker_extra.extend(slow_args(false));
    let mut workers = vec![procs::start_worker(
        &cmd,
        ctx.scratch,
        "cost-callgrind-worker",
        &worker_extra,
    )?];
    procs::wait_started_within(&mut workers, Duration::from_secs(120)).await?;
    let mut direct = Direct::connect(
        store_config(args, cg.redis.target()),
        &ctx.tenants,
        &cg.redis.urls,
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    eprintln!(
        "[cost] callgrind, {SLUICE}: idle for {} s",
        args.cost_idle_secs
    );
    direct.reset_stats().await?;
    let idle = cg.idle_rate(args.cost_idle_secs as f64).await?;
    let idle_calls = direct.command_calls().await?;
    direct.reset_stats().await?;
    let w = workload(ctx, addr);
    let limit = Duration::from_secs(args.cost_drain_secs);
    let name = format!("callgrind, {SLUICE}");
    eprintln!(
        "[cost] {name}: {} executions at {}/s",
        args.cost_callgrind_count, args.cost_callgrind_rate
    );
    let ((r, completed, polls), win) = cg
        .window(async {
            let r = super::with_progress(&name, |p| {
                load::open_loop(&w, args.clients, args.cost_callgrind_rate, span(ctx), p)
            })
            .await?;
            let (completed, polls) = wait_completed(&mut direct, r.outcomes.created, limit).await?;
            anyhow::Ok((r, completed, polls))
        })
        .await?;
    let calls = direct.command_calls().await?;
    // A worker's failed call to Redis (a time-out under callgrind) is logged as a warning.
    let warned = workers
        .iter()
        .find_map(|p| p.first_log_line(&["WARN", "ERROR"]));
    for w in workers {
        w.kill().await;
    }
    serve.kill().await;
    let top = cg.top_functions(&win.file, 12).await;
    cg.shutdown().await?;
    let own = polls * direct.shards_served() as u64;
    let void = warned.map(|line| format!("the worker logged: {line}"));
    Ok(side(
        SLUICE,
        &r.outcomes,
        completed,
        &win,
        (idle, idle_commands_per_sec(&idle_calls, args)),
        (&calls, own),
        void,
        top,
    ))
}

async fn bullmq_e2e(ctx: &Ctx<'_>, vg: &Valgrind) -> anyhow::Result<E2eInstructions> {
    let args = ctx.args;
    let script = ctx.peer.as_ref().map_err(|n| anyhow::anyhow!("{n}"))?;
    let mut cg = Counted::start(vg, ctx, "redis-callgrind-bullmq").await?;
    let port = crate::bullmq::port_of(&cg.redis)?;
    let http = crate::bullmq::start_http_peer(args, script, &port).await?;
    let planned = (args.cost_callgrind_rate * span(ctx).as_secs_f64())
        .floor()
        .max(1.0) as u64;
    let drain = peer::Drain::start(ctx, &port, planned).await?;
    let mut conn = connect(&cg.redis.urls[0]).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    eprintln!(
        "[cost] callgrind, {BULLMQ}: idle for {} s",
        args.cost_idle_secs
    );
    let () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await?;
    let idle = cg.idle_rate(args.cost_idle_secs as f64).await?;
    let idle_calls = command_calls(&info(&mut conn, "commandstats").await?);
    let () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await?;
    let w = workload(ctx, http.addr);
    let name = format!("callgrind, {BULLMQ}");
    eprintln!(
        "[cost] {name}: {planned} executions at {}/s",
        args.cost_callgrind_rate
    );
    let ((r, completed), win) = cg
        .window(async {
            let r = super::with_progress(&name, |p| {
                load::open_loop(&w, args.clients, args.cost_callgrind_rate, span(ctx), p)
            })
            .await?;
            let completed = if r.outcomes.errors == 0 {
                drain.finish().await?.completed
            } else {
                // Not every job will come: the run is void anyway.
                drain.kill().await;
                0
            };
            anyhow::Ok((r, completed))
        })
        .await?;
    let calls = command_calls(&info(&mut conn, "commandstats").await?);
    drop(http);
    drop(conn);
    let top = cg.top_functions(&win.file, 12).await;
    cg.shutdown().await?;
    Ok(side(
        BULLMQ,
        &r.outcomes,
        completed,
        &win,
        (idle, idle_commands_per_sec(&idle_calls, args)),
        (&calls, 0),
        None,
        top,
    ))
}

/// sluice's Redis time-outs for a Redis under callgrind (`serve` also its request time-out).
fn slow_args(serve: bool) -> Vec<String> {
    let mut v = vec!["--redis-timeout-ms".to_owned(), SLOW_REDIS_MS.to_owned()];
    if serve {
        v.extend([
            "--request-timeout-ms".to_owned(),
            SLOW_REQUEST_MS.to_owned(),
        ]);
    }
    v
}

/// The commands (script calls left out) per second of an idle window's `INFO commandstats`.
fn idle_commands_per_sec(calls: &BTreeMap<String, u64>, args: &crate::Args) -> f64 {
    split_calls(calls, 0).1 as f64 / (args.cost_idle_secs as f64).max(1.0)
}

/// One side's record. `idle` is the idle window's instructions and commands per second;
/// `calls` the run's `INFO commandstats` and the benchmark's own `HGET`s in it.
#[allow(clippy::too_many_arguments)]
fn side(
    system: &str,
    o: &load::Outcomes,
    completed: u64,
    win: &Window,
    (idle_per_sec, idle_commands_per_sec): (f64, f64),
    (calls, own_hgets): (&BTreeMap<String, u64>, u64),
    void: Option<String>,
    top_functions: Vec<String>,
) -> E2eInstructions {
    let n = completed.max(1) as f64;
    let (scripts, commands) = split_calls(calls, own_hgets);
    let net = win.ir as f64 - idle_per_sec * win.secs;
    let void = if o.errors > 0 {
        Some(format!(
            "{} admissions answered other than 201 (or not at all)",
            o.errors
        ))
    } else if completed < o.created {
        Some(format!("only {completed} of {} completed", o.created))
    } else {
        void
    };
    E2eInstructions {
        system: system.to_owned(),
        admitted: o.created,
        completed,
        errors: o.errors,
        void,
        window_ir: win.ir,
        window_secs: (win.secs * 10.0).round() / 10.0,
        idle_ir_per_sec: idle_per_sec.round(),
        ir_per_execution: (net / n).round(),
        script_calls_per_execution: (scripts as f64 / n * 100.0).round() / 100.0,
        commands_per_execution: (commands as f64 / n * 100.0).round() / 100.0,
        idle_commands_per_execution: (idle_commands_per_sec * win.secs / n * 100.0).round() / 100.0,
        commands_by_name: calls_by_name(calls, own_hgets, n),
        top_functions,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dump_s_instructions_are_its_summary_line() {
        let text = "version: 1\ncreator: callgrind-3.19.0\npart: 1\nevents: Ir\n\
                    summary: 353496\n\nfn=main\n1 2\ntotals: 378813\n";
        assert_eq!(parse_summary(text), Some(353_496));
        assert_eq!(parse_summary("events: Ir\n"), None);
    }

    #[test]
    fn the_top_functions_are_the_annotated_lines() {
        let text = "--------\nIr\n--------\n1,033,291 (100.0%)  PROGRAM TOTALS\n\n\
                    --------\nIr  file:function\n--------\n\
                    500,000 (48.39%)  ???:luaV_execute [/usr/bin/redis-server]\n\
                    200,000 (19.36%)  ???:lpFind [/usr/bin/redis-server]\n";
        let stripped = "1,000 (100.0%)  ./csu/../csu/libc-start.c:__libc_start_main\n";
        assert!(top_lines(stripped, 5).is_empty());
        assert_eq!(
            top_lines(text, 5),
            vec![
                "500,000 (48.39%)  ???:luaV_execute",
                "200,000 (19.36%)  ???:lpFind"
            ]
        );
    }
}
