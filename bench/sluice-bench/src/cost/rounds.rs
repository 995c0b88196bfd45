//! Redis CPU per execution, end to end: each round gives every side a fresh redis-server (a
//! fresh cluster for sluice's cluster side), `CONFIG RESETSTAT`, `used_cpu_user +
//! used_cpu_sys` read before the first admission; a backlog of `--cost-backlog` admitted over
//! HTTP (64 connections, 8 tenants, a dedup key each), then drained by one worker of
//! concurrency 256 (sluice: `sluice worker --demo-flows`, `demo.echo`; BullMQ: a `Worker` per
//! queue with a no-op processor, jobs kept); read again after the last completion, divided by
//! the executions completed. Script calls and commands per execution from `INFO
//! commandstats`. The sides alternate (A B, B A, ...) so a drift of the machine falls on both;
//! the medians are compared. CPU time is not inflated by waiting for a core, but a busy
//! machine still moves it (caches, frequency): the rounds are printed.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::{CostReport, Ctx, command_calls, connect, info, peer, split_calls, wait_completed};
use crate::compare::{median, order};
use crate::direct::{Direct, used_cpu};
use crate::harness::{sluice_cmd, store_config};
use crate::load::{self, Workload};
use crate::procs;
use crate::report::Check;
use crate::{ADMIN_TOKEN, UNLIMITED};

/// The side names of the report.
pub const SLUICE: &str = "sluice";
pub const BULLMQ: &str = "BullMQ";

/// One side's round.
#[derive(Debug, Clone, Serialize)]
pub struct CpuRound {
    pub round: usize,
    pub system: String,
    pub admitted: u64,
    pub completed: u64,
    /// Admissions answered other than 201.
    pub errors: u64,
    pub redis_cpu_us_per_execution: f64,
    pub script_calls_per_execution: f64,
    /// Other commands (top-level, and those scripts ran) per execution.
    pub commands_per_execution: f64,
    pub admit_secs: f64,
    pub drain_secs: f64,
}

/// One side's medians.
#[derive(Debug, Clone, Serialize)]
pub struct CpuSide {
    pub system: String,
    pub rounds: usize,
    pub redis_cpu_us_per_execution: f64,
    pub script_calls_per_execution: f64,
    pub commands_per_execution: f64,
}

/// Every round and the medians.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CpuRounds {
    pub backlog: u64,
    pub rounds: Vec<CpuRound>,
    pub sides: Vec<CpuSide>,
}

/// Runs `--cost-rounds` rounds: sluice and BullMQ alternating, then sluice on a cluster.
pub(super) async fn measure(ctx: &Ctx<'_>, report: &mut CostReport) -> anyhow::Result<()> {
    let args = ctx.args;
    let cluster_name = format!("{SLUICE}, cluster of {}", args.cluster_masters);
    let mut out = CpuRounds {
        backlog: args.cost_backlog,
        ..CpuRounds::default()
    };
    for round in 0..args.cost_rounds.max(1) {
        for side in order(round) {
            let r = match side {
                0 => Some(sluice_round(ctx, round, false).await?),
                _ if ctx.peer.is_ok() => Some(bullmq_round(ctx, round).await?),
                _ => None,
            };
            if let Some((r, check)) = r {
                out.rounds.push(r);
                report.checks.push(check);
            }
        }
        if !args.cost_skip_cluster {
            let (mut r, check) = sluice_round(ctx, round, true).await?;
            r.system.clone_from(&cluster_name);
            out.rounds.push(r);
            report.checks.push(check);
        }
    }
    for system in [SLUICE, BULLMQ, cluster_name.as_str()] {
        let mine: Vec<&CpuRound> = out.rounds.iter().filter(|r| r.system == system).collect();
        if mine.is_empty() {
            continue;
        }
        let m = |f: fn(&CpuRound) -> f64| round2(median(mine.iter().map(|r| f(r)).collect()));
        out.sides.push(CpuSide {
            system: system.to_owned(),
            rounds: mine.len(),
            redis_cpu_us_per_execution: m(|r| r.redis_cpu_us_per_execution),
            script_calls_per_execution: m(|r| r.script_calls_per_execution),
            commands_per_execution: m(|r| r.commands_per_execution),
        });
    }
    report.cpu = Some(out);
    Ok(())
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

/// The workload of a round: `demo.echo` to the tenants round robin, a new dedup key each.
fn workload(ctx: &Ctx<'_>, addr: std::net::SocketAddr, tag: String) -> Workload {
    Workload {
        addr,
        admin_token: ADMIN_TOKEN.into(),
        tenants: ctx.tenants.clone(),
        tag,
        flow: "demo.echo".into(),
        keys: 0,
        tokens: Vec::new(),
    }
}

/// One sluice round (on a fresh cluster with `cluster`).
async fn sluice_round(
    ctx: &Ctx<'_>,
    round: usize,
    cluster: bool,
) -> anyhow::Result<(CpuRound, Check)> {
    let args = ctx.args;
    let redis = if cluster {
        procs::start_cluster(&args.redis_server, ctx.scratch, args.cluster_masters).await?
    } else {
        procs::start_redis(&args.redis_server, ctx.scratch).await?
    };
    let cmd = sluice_cmd(args, &ctx.program, redis.target());
    let (serve, addr) =
        procs::start_serve(&cmd, ctx.scratch, ADMIN_TOKEN, UNLIMITED, UNLIMITED).await?;
    let mut direct = Direct::connect(
        store_config(args, redis.target()),
        &ctx.tenants,
        &redis.urls,
    )
    .await?;
    let name = format!(
        "cpu round {round}: {SLUICE}{}",
        if cluster { ", cluster" } else { "" }
    );
    eprintln!("[cost] {name}: a backlog of {}", args.cost_backlog);
    direct.reset_stats().await?;
    let cpu_before = direct.used_cpu().await?;
    let limit = Duration::from_secs(args.cost_drain_secs);
    let started = Instant::now();
    let w = workload(ctx, addr, format!("cpu{round}"));
    let r = super::with_progress(&name, |p| {
        load::closed_loop_count(&w, args.clients, args.cost_backlog, limit, p)
    })
    .await?;
    let admit_secs = started.elapsed().as_secs_f64();
    let extra = ["--concurrency".to_owned(), "256".to_owned()];
    let mut workers = vec![procs::start_worker(
        &cmd,
        ctx.scratch,
        "cost-worker",
        &extra,
    )?];
    procs::wait_started(&mut workers).await?;
    let (completed, polls) = wait_completed(&mut direct, r.outcomes.created, limit).await?;
    let cpu_after = direct.used_cpu().await?;
    let calls = direct.command_calls().await?;
    let drain_secs = started.elapsed().as_secs_f64() - admit_secs;
    for w in workers {
        w.kill().await;
    }
    serve.kill().await;
    redis.kill().await;
    let own_hgets = polls * direct.shards_served() as u64;
    let (scripts, commands) = split_calls(&calls, own_hgets);
    Ok(finish(
        name,
        round,
        SLUICE,
        &r.outcomes,
        completed,
        cpu_after - cpu_before,
        (scripts, commands),
        (admit_secs, drain_secs),
    ))
}

/// One BullMQ round: the HTTP admission peer (`peer.mjs --role http`) takes the backlog, its
/// drain (`--role drain`) completes it.
async fn bullmq_round(ctx: &Ctx<'_>, round: usize) -> anyhow::Result<(CpuRound, Check)> {
    let args = ctx.args;
    let script = ctx.peer.as_ref().map_err(|n| anyhow::anyhow!("{n}"))?;
    let redis = procs::start_redis_named(&args.redis_server, ctx.scratch, "redis-bullmq").await?;
    let port = crate::bullmq::port_of(&redis)?;
    let http = crate::bullmq::start_http_peer(args, script, &port).await?;
    let mut conn = connect(&redis.urls[0]).await?;
    let name = format!("cpu round {round}: {BULLMQ}");
    eprintln!("[cost] {name}: a backlog of {}", args.cost_backlog);
    let () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await?;
    let cpu_before = used_cpu(&info(&mut conn, "cpu").await?)?;
    let limit = Duration::from_secs(args.cost_drain_secs);
    let started = Instant::now();
    let w = workload(ctx, http.addr, format!("cpu{round}"));
    let r = super::with_progress(&name, |p| {
        load::closed_loop_count(&w, args.clients, args.cost_backlog, limit, p)
    })
    .await?;
    let admit_secs = started.elapsed().as_secs_f64();
    let drained = peer::Drain::start(ctx, &port, r.outcomes.created)
        .await?
        .finish()
        .await?;
    let cpu_after = used_cpu(&info(&mut conn, "cpu").await?)?;
    let calls = command_calls(&info(&mut conn, "commandstats").await?);
    let drain_secs = started.elapsed().as_secs_f64() - admit_secs;
    drop(http);
    drop(conn);
    redis.kill().await;
    Ok(finish(
        name,
        round,
        BULLMQ,
        &r.outcomes,
        drained.completed,
        cpu_after - cpu_before,
        split_calls(&calls, 0),
        (admit_secs, drain_secs),
    ))
}

/// A round's record and its check (every admission answered 201, every one completed).
#[allow(clippy::too_many_arguments)]
fn finish(
    name: String,
    round: usize,
    system: &str,
    o: &load::Outcomes,
    completed: u64,
    cpu_secs: f64,
    (scripts, commands): (u64, u64),
    (admit_secs, drain_secs): (f64, f64),
) -> (CpuRound, Check) {
    let n = completed.max(1) as f64;
    let check = Check {
        phase: name,
        ok: o.errors == 0 && o.created > 0 && completed == o.created,
        detail: format!("201={} other={} completed={completed}", o.created, o.errors),
    };
    let r = CpuRound {
        round,
        system: system.to_owned(),
        admitted: o.created,
        completed,
        errors: o.errors,
        redis_cpu_us_per_execution: round2(cpu_secs * 1e6 / n),
        script_calls_per_execution: round2(scripts as f64 / n),
        commands_per_execution: round2(commands as f64 / n),
        admit_secs: round2(admit_secs),
        drain_secs: round2(drain_secs),
    };
    (r, check)
}
