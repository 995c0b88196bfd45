//! The end-to-end phase: `demo.echo` admitted over HTTP and completed by `sluice worker`
//! processes, or by pull workers in this process over the pull API.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::direct::Direct;
use crate::harness::{Pids, check_completed, phase};
use crate::load::{self, Workload};
use crate::procs::{self, Proc, Scratch, SluiceCmd};
use crate::report::{AdmissionCalls, CallsPerExecution, Check, E2e, MasterShare, Phase};
use crate::{ADMIN_TOKEN, Args};

/// The end-to-end phase: workers start, `demo.echo` is admitted over HTTP for the phase's
/// duration, and the phase ends when everything admitted has completed (or the drain limit).
/// With `pull` (the server's address), the workers are pull workers in this process
/// (`--pull-workers` of `--pull-batch` each, see `pull_worker`) instead of `sluice worker`s.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn end_to_end(
    args: &Args,
    cmd: &SluiceCmd,
    scratch: &Scratch,
    direct: &mut Direct,
    w: &Workload,
    others: &[&Proc],
    masters: Option<&[String]>,
    pull: Option<std::net::SocketAddr>,
) -> anyhow::Result<(E2e, Check)> {
    let mut workers = Vec::new();
    let extra = [
        "--concurrency".to_owned(),
        args.worker_concurrency.to_string(),
    ];
    let stop_pulling = Arc::new(AtomicBool::new(false));
    let mut pulling = tokio::task::JoinSet::new();
    match pull {
        None => {
            for n in 1..=args.workers.max(1) {
                workers.push(procs::start_worker(
                    cmd,
                    scratch,
                    &format!("worker-{n}"),
                    &extra,
                )?);
            }
            procs::wait_started(&mut workers).await?;
        }
        Some(addr) => {
            for n in 0..args.pull_workers {
                pulling.spawn(pull_worker(
                    addr,
                    format!("bench-{n}"),
                    w.tenants.clone(),
                    args.pull_batch.clamp(1, 100),
                    stop_pulling.clone(),
                ));
            }
        }
    }
    let mut all: Vec<&Proc> = others.to_vec();
    all.extend(workers.iter());
    let pids = Pids::of(&all);
    let commands_before = direct.command_calls().await?;
    let grouped_before = crate::harness::group_counts(w.addr).await?;
    let before = pids.sample();
    let started = Instant::now();
    let (r, _) = phase("end-to-end", &pids, |p| {
        load::closed_loop(
            w,
            args.clients.max(1),
            Duration::from_secs(args.e2e_secs),
            0,
            p,
        )
    })
    .await?;
    let drain_deadline = Instant::now() + Duration::from_secs(args.e2e_drain_secs);
    let mut last_print = Instant::now();
    loop {
        let done = direct.completed().await?;
        if done >= r.outcomes.created || Instant::now() > drain_deadline {
            break;
        }
        if last_print.elapsed() >= Duration::from_secs(1) {
            eprintln!(
                "[end-to-end] draining: completed={done}/{}",
                r.outcomes.created
            );
            last_print = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cpu = pids.since(&before, started.elapsed());
    let commands_after = direct.command_calls().await?;
    let grouped_after = crate::harness::group_counts(w.addr).await?;
    let scripts = direct.script_usec().await?;
    let script_us: u64 = scripts.iter().sum();
    stop_pulling.store(true, Ordering::SeqCst);
    while let Some(done) = pulling.join_next().await {
        done??;
    }
    for wk in &mut workers {
        wk.ensure_running()?;
    }
    for wk in workers {
        wk.kill().await;
    }
    let census = direct.census(true).await?;
    let completed = census.by_status.get("completed").copied().unwrap_or(0);
    let (lat, span) = census
        .e2e
        .as_ref()
        .map_or((None, Duration::ZERO), |(l, s)| (Some(l.percentiles()), *s));
    let check = check_completed("end-to-end", &r.outcomes, &census);
    let e2e = E2e {
        admitted: r.outcomes.created,
        completed,
        admission_per_sec: r.outcomes.created as f64 / r.elapsed.as_secs_f64(),
        per_sec: completed as f64 / span.as_secs_f64().max(1e-3),
        span_secs: span.as_secs_f64(),
        admit_to_completed: lat,
        redis_script_us_per_execution: (script_us as f64 / completed.max(1) as f64 * 100.0).round()
            / 100.0,
        calls: CallsPerExecution::of(&commands_before, &commands_after, completed),
        admission_calls: AdmissionCalls {
            calls: grouped_after.0.saturating_sub(grouped_before.0),
            admissions: grouped_after.1.saturating_sub(grouped_before.1),
        },
        http: Phase::from(&r, cpu, script_us),
        per_master: masters
            .map(|m| MasterShare::of(m, &census.completed_by_node, &scripts, span.as_secs_f64())),
    };
    Ok((e2e, check))
}

/// A pull worker of the end-to-end phase's pull run: leases up to `batch` executions of
/// `tenants` (as the platform-wide admin: no `X-Tenant-Id`, which would serve one tenant only;
/// long polls of 1 s), completes each with its params as output, one call each naming its
/// run's tenant, and leases again, until `stop`. One keep-alive connection.
pub(crate) async fn pull_worker(
    addr: std::net::SocketAddr,
    worker_id: String,
    tenants: Vec<String>,
    batch: usize,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    let mut conn = load::Conn::connect(addr).await?;
    let lease = serde_json::json!({
        "worker_id": worker_id, "max": batch, "tenants": tenants, "lease": "30s",
    })
    .to_string();
    while !stop.load(Ordering::SeqCst) {
        let (status, body) = conn
            .call(
                hyper::Method::POST,
                "/api/worker/lease?wait=1s",
                ADMIN_TOKEN,
                "",
                &lease,
            )
            .await?;
        anyhow::ensure!(status == 200, "lease answered {status}");
        let answer: serde_json::Value = serde_json::from_slice(&body)?;
        for run in answer["runs"].as_array().into_iter().flatten() {
            let report = serde_json::json!({
                "worker_id": worker_id,
                "fence": run["fence"],
                "outcome": "completed",
                "output": run["params"],
            })
            .to_string();
            let path = format!(
                "/api/worker/runs/{}/complete",
                run["execution_id"].as_str().unwrap_or_default()
            );
            let tenant = run["tenant_id"].as_str().unwrap_or_default();
            let (status, body) = conn
                .call(hyper::Method::POST, &path, ADMIN_TOKEN, tenant, &report)
                .await?;
            anyhow::ensure!(
                status == 200,
                "complete answered {status}: {}",
                String::from_utf8_lossy(&body)
            );
        }
    }
    Ok(())
}
