//! The BullMQ peer of the pickup phase: `bench/bullmq/peer.mjs` (a default BullMQ `Worker`
//! with a no-op processor, a `Queue` adding jobs at fixed rates) run with `node` against a
//! `redis-server` of its own that this module starts on a free loopback port, so sluice and
//! BullMQ are measured in one run on one machine at the same rates. The same peer runs the
//! fairness group's noisy-neighbour phase (`noisy`, `peer.mjs --noisy`): one queue, one worker
//! of sluice's concurrency, a flood and then calm jobs in that queue. The admission phase's
//! HTTP peer (`http_admission`, `peer.mjs --role http`) and the end-to-end peer (`http_e2e`:
//! that HTTP front plus `peer.mjs --role drain` workers) run on a Redis of their own too.
//! `scripts/bench.sh`
//! installs the peer (`npm ci` of `bench/bullmq`'s lock) under the cargo target folder; when it
//! is not there, or `node` is missing, the peer is skipped and the report says so loudly.
//!
//! The peer prints one JSON line with each job's raw latencies; the percentiles are computed
//! here, with the same nearest-rank code as sluice's.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use serde::Deserialize;
use tokio::process::Command;

use crate::Args;
use crate::load::{Latencies, LoadResult, Workload};
use crate::procs::{self, Scratch};
use crate::report::{Check, NoisySide, PeerE2e, PeerVersions, PickupSide};

/// What the peer prints for one rate.
#[derive(Debug, Deserialize)]
struct RawRate {
    scheduled: u64,
    added: u64,
    add_errors: u64,
    completed: u64,
    unfinished: u64,
    /// Jobs never picked up (no `processedOn`) by the end of the drain.
    unpicked: u64,
    pickup_ms: Vec<u64>,
    done_ms: Vec<u64>,
}

/// The peer's one line of output.
#[derive(Debug, Deserialize)]
struct RawRun {
    bullmq: String,
    node: String,
    rates: Vec<RawRate>,
}

/// The peer's results: its versions, one side per rate asked (in order), and the check.
pub struct PeerRun {
    pub versions: PeerVersions,
    pub rates: Vec<PickupSide>,
    pub check: Check,
}

/// Why the peer did not run.
pub enum NoPeer {
    /// Not installed, or no `node`: the report says so, the run goes on.
    Skipped(String),
    /// It was there and failed: a correctness failure (so `--smoke` catches a peer that rots).
    Failed(anyhow::Error),
}

/// The folder the peer is installed in: `--bullmq-dir`, else `bench-bullmq` in the cargo
/// target folder this binary was built into (`target/release/sluice-bench` →
/// `target/bench-bullmq`, where `scripts/bench.sh` puts it).
fn peer_dir(args: &Args) -> Option<PathBuf> {
    if let Some(d) = &args.bullmq_dir {
        return Some(d.clone());
    }
    let exe = std::env::current_exe().ok()?;
    Some(exe.parent()?.parent()?.join("bench-bullmq"))
}

/// Runs the peer at `rates` (per second, seconds each).
pub async fn run(args: &Args, scratch: &Scratch, rates: &[(f64, f64)]) -> Result<PeerRun, NoPeer> {
    let script = locate(args).await?;
    measure(args, scratch, &script, rates)
        .await
        .map_err(NoPeer::Failed)
}

/// The peer's `peer.mjs`, when it is installed and `node` runs.
pub(crate) async fn locate(args: &Args) -> Result<PathBuf, NoPeer> {
    let Some(dir) = peer_dir(args) else {
        return Err(NoPeer::Skipped("no folder for the BullMQ peer".into()));
    };
    let script = dir.join("peer.mjs");
    if !dir.join("node_modules/bullmq/package.json").exists() || !script.exists() {
        return Err(NoPeer::Skipped(format!(
            "the BullMQ peer is not installed in {} (scripts/bench.sh installs it with npm ci)",
            dir.display()
        )));
    }
    match Command::new(&args.node).arg("--version").output().await {
        Ok(o) if o.status.success() => {}
        _ => {
            return Err(NoPeer::Skipped(format!(
                "`{}` does not run: install Node.js (scripts/bench.sh does with apt-get)",
                args.node.display()
            )));
        }
    }
    Ok(script)
}

async fn measure(
    args: &Args,
    scratch: &Scratch,
    script: &Path,
    rates: &[(f64, f64)],
) -> anyhow::Result<PeerRun> {
    let redis = procs::start_redis_named(&args.redis_server, scratch, "redis-bullmq").await?;
    let port = port_of(&redis)?;
    let plan: Vec<serde_json::Value> = rates
        .iter()
        .map(|(rate, secs)| serde_json::json!({"rate": rate, "secs": secs}))
        .collect();
    // Bounded: every rate's schedule, drain and settle, and 20 s for starting Node and the
    // worker child, reading the jobs back.
    let bound: f64 = rates
        .iter()
        .map(|(_, secs)| {
            secs + args.pickup_drain_secs as f64 + args.pickup_settle_ms as f64 / 1000.0 + 20.0
        })
        .sum();
    eprintln!("[bullmq] peer: {} at the same rates", script.display());
    let child = Command::new(&args.node)
        .arg(script)
        .args(["--port", &port])
        .args(["--rates", &serde_json::to_string(&plan)?])
        .args(["--drain-secs", &args.pickup_drain_secs.to_string()])
        .args(["--settle-ms", &args.pickup_settle_ms.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot start {}", args.node.display()))?;
    let out = tokio::time::timeout(Duration::from_secs_f64(bound), child.wait_with_output())
        .await
        .with_context(|| format!("the BullMQ peer did not finish in {bound:.0} s"))??;
    redis.kill().await;
    anyhow::ensure!(
        out.status.success(),
        "the BullMQ peer exited ({})",
        out.status
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .context("the BullMQ peer printed no result")?;
    let raw: RawRun = serde_json::from_str(line).context("the BullMQ peer's result")?;
    anyhow::ensure!(
        raw.rates.len() == rates.len(),
        "the BullMQ peer measured {} rates of {}",
        raw.rates.len(),
        rates.len()
    );
    let mut ok = true;
    let mut details = Vec::new();
    let mut sides = Vec::new();
    for ((rate, _), r) in rates.iter().zip(raw.rates) {
        ok &= r.add_errors == 0
            && r.added == r.scheduled
            && r.completed == r.added
            && r.unfinished == 0;
        details.push(format!(
            "{rate:.0}/s: scheduled={} added={} add errors={} completed={} unfinished={}",
            r.scheduled, r.added, r.add_errors, r.completed, r.unfinished
        ));
        let us = |v: Vec<u64>| -> Vec<u32> {
            v.into_iter()
                .map(|ms| ms.saturating_mul(1000).min(u64::from(u32::MAX)) as u32)
                .collect()
        };
        sides.push(PickupSide {
            admitted: r.added,
            errors: r.add_errors,
            completed: r.completed,
            not_started: r.unpicked,
            pickup: Latencies::new(us(r.pickup_ms)).percentiles(),
            admit_to_completed: Latencies::new(us(r.done_ms)).percentiles(),
            cpu: Vec::new(),
        });
    }
    Ok(PeerRun {
        versions: PeerVersions {
            bullmq: raw.bullmq,
            node: raw.node,
        },
        rates: sides,
        check: Check {
            phase: "bullmq peer".into(),
            ok,
            detail: details.join("; "),
        },
    })
}

/// The noisy-neighbour phase as the peer runs it (see `fairness::noisy`): one queue, one
/// worker of `concurrency`, `flood` jobs of `ms` added at once, then `calm_count` at
/// `calm_rate` per second into the same queue.
#[derive(Debug, Clone, serde::Serialize)]
pub struct NoisyPlan {
    pub flood: u64,
    pub ms: u64,
    pub concurrency: usize,
    pub calm_rate: f64,
    pub calm_count: u64,
}

/// What the peer prints for the noisy-neighbour phase.
#[derive(Debug, Deserialize)]
struct RawNoisy {
    flood_added: u64,
    calm_added: u64,
    add_errors: u64,
    completed: u64,
    unfinished: u64,
    unpicked: u64,
    calm_during_flood: u64,
    flood_span_ms: u64,
    flood_pickup_ms: Vec<u64>,
    calm_pickup_ms: Vec<u64>,
}

/// The peer's one line of output in the noisy-neighbour mode.
#[derive(Debug, Deserialize)]
struct RawNoisyRun {
    bullmq: String,
    node: String,
    noisy: RawNoisy,
}

/// Runs the noisy-neighbour phase on the peer; its side of the report and its check.
pub async fn noisy(
    args: &Args,
    scratch: &Scratch,
    plan: &NoisyPlan,
    drain_secs: u64,
) -> Result<(NoisySide, Check, PeerVersions), NoPeer> {
    let script = locate(args).await?;
    measure_noisy(args, scratch, &script, plan, drain_secs)
        .await
        .map_err(NoPeer::Failed)
}

async fn measure_noisy(
    args: &Args,
    scratch: &Scratch,
    script: &Path,
    plan: &NoisyPlan,
    drain_secs: u64,
) -> anyhow::Result<(NoisySide, Check, PeerVersions)> {
    let redis = procs::start_redis_named(&args.redis_server, scratch, "redis-bullmq").await?;
    let port = port_of(&redis)?;
    // Bounded: the calm schedule, the drain, and a minute for adding the flood, starting Node
    // and reading the jobs back.
    let bound = plan.calm_count as f64 / plan.calm_rate.max(0.1) + drain_secs as f64 + 60.0;
    eprintln!("[bullmq] noisy neighbour: {}", script.display());
    let child = Command::new(&args.node)
        .arg(script)
        .args(["--port", &port])
        .args(["--noisy", &serde_json::to_string(plan)?])
        .args(["--drain-secs", &drain_secs.to_string()])
        .args(["--settle-ms", &args.pickup_settle_ms.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot start {}", args.node.display()))?;
    let out = tokio::time::timeout(Duration::from_secs_f64(bound), child.wait_with_output())
        .await
        .with_context(|| format!("the BullMQ peer did not finish in {bound:.0} s"))??;
    redis.kill().await;
    anyhow::ensure!(
        out.status.success(),
        "the BullMQ peer exited ({})",
        out.status
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .context("the BullMQ peer printed no result")?;
    let raw: RawNoisyRun = serde_json::from_str(line).context("the BullMQ peer's result")?;
    let versions = PeerVersions {
        bullmq: raw.bullmq,
        node: raw.node,
    };
    let r = raw.noisy;
    let added = r.flood_added + r.calm_added;
    let ok = r.add_errors == 0
        && r.flood_added == plan.flood
        && r.calm_added == plan.calm_count
        && r.completed == added
        && r.unfinished == 0;
    let check = Check {
        phase: "bullmq noisy".into(),
        ok,
        detail: format!(
            "flood added={} of {} calm added={} of {} add errors={} completed={} unfinished={}",
            r.flood_added,
            plan.flood,
            r.calm_added,
            plan.calm_count,
            r.add_errors,
            r.completed,
            r.unfinished
        ),
    };
    let us = |v: Vec<u64>| -> Vec<u32> {
        v.into_iter()
            .map(|ms| ms.saturating_mul(1000).min(u64::from(u32::MAX)) as u32)
            .collect()
    };
    let side = NoisySide {
        flood_admitted: r.flood_added,
        calm_admitted: r.calm_added,
        errors: r.add_errors,
        completed: r.completed,
        not_started: r.unpicked,
        calm_during_flood: r.calm_during_flood,
        flood_span_secs: r.flood_span_ms as f64 / 1000.0,
        calm: Latencies::new(us(r.calm_pickup_ms)).percentiles(),
        flood: Latencies::new(us(r.flood_pickup_ms)).percentiles(),
    };
    Ok((side, check, versions))
}

/// The HTTP admission peer's result: the same closed loop as sluice's admission phase, against
/// `peer.mjs --role http` (BullMQ `Queue.add` with the key as `jobId`, behind Node's HTTP).
pub struct PeerAdmission {
    pub versions: PeerVersions,
    pub load: LoadResult,
    pub check: Check,
}

/// Runs `workload` (its address replaced by the peer's) for `secs` from `clients` connections
/// against the HTTP admission peer on a `redis-server` of its own; checks that every 201 is
/// one job in its tenant's queue.
pub async fn http_admission(
    args: &Args,
    scratch: &Scratch,
    workload: &Workload,
    clients: usize,
    secs: u64,
) -> Result<PeerAdmission, NoPeer> {
    let script = locate(args).await?;
    measure_http(args, scratch, &script, workload, clients, secs)
        .await
        .map_err(NoPeer::Failed)
}

/// What the HTTP peer prints once it listens.
#[derive(Debug, Deserialize)]
struct Listening {
    listening: u16,
    bullmq: String,
    node: String,
}

/// A running HTTP admission peer (`peer.mjs --role http`); killed when dropped.
pub(crate) struct HttpPeer {
    /// Held so the peer lives as long as this handle (`kill_on_drop`).
    child: tokio::process::Child,
    /// Where it listens (loopback).
    pub addr: std::net::SocketAddr,
    pub versions: PeerVersions,
}

/// Starts the HTTP admission peer against the `redis-server` on loopback `port` and waits
/// (at most 30 s) until every one of its processes listens.
pub(crate) async fn start_http_peer(
    args: &Args,
    script: &Path,
    port: &str,
) -> anyhow::Result<HttpPeer> {
    use tokio::io::AsyncBufReadExt;

    eprintln!("[bullmq http] peer: {} --role http", script.display());
    let mut child = Command::new(&args.node)
        .arg(script)
        .args(["--role", "http", "--port", port])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot start {}", args.node.display()))?;
    let stdout = child.stdout.take().context("the peer's stdout")?;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .context("the BullMQ HTTP peer did not listen within 30 s")??
        .context("the BullMQ HTTP peer exited before it listened")?;
    let up: Listening = serde_json::from_str(&first).context("the HTTP peer's first line")?;
    Ok(HttpPeer {
        child,
        addr: std::net::SocketAddr::from(([127, 0, 0, 1], up.listening)),
        versions: PeerVersions {
            bullmq: up.bullmq,
            node: up.node,
        },
    })
}

async fn measure_http(
    args: &Args,
    scratch: &Scratch,
    script: &Path,
    workload: &Workload,
    clients: usize,
    secs: u64,
) -> anyhow::Result<PeerAdmission> {
    let redis = procs::start_redis_named(&args.redis_server, scratch, "redis-bullmq").await?;
    let port = port_of(&redis)?;
    let peer = start_http_peer(args, script, &port).await?;
    let mut w = workload.clone();
    w.addr = peer.addr;
    let progress = std::sync::Arc::new(crate::load::Progress::default());
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let ticker = crate::load::progress("admission, BullMQ peer", progress.clone(), stop.clone());
    let load = crate::load::closed_loop(&w, clients, Duration::from_secs(secs), 0, progress).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    ticker.abort();
    let load = load?;
    // Every 201 is one job waiting in its tenant's queue (no worker runs).
    let client = redis::Client::open(redis.urls[0].as_str())?;
    let mut c = client.get_multiplexed_async_connection().await?;
    let mut jobs = 0u64;
    for t in &w.tenants {
        let n: u64 = redis::cmd("LLEN")
            .arg(format!("bull:t-{t}:wait"))
            .query_async(&mut c)
            .await?;
        jobs += n;
    }
    let versions = peer.versions.clone();
    drop(peer);
    redis.kill().await;
    let o = &load.outcomes;
    let ok = o.errors == 0 && o.replay_anomalies == 0 && jobs == o.created && o.created > 0;
    Ok(PeerAdmission {
        versions,
        check: Check {
            phase: "admission, BullMQ peer".into(),
            ok,
            detail: format!(
                "201={} errors={} jobs waiting in Redis={jobs}",
                o.created, o.errors
            ),
        },
        load,
    })
}

impl HttpPeer {
    /// The peer's processes: the `node:cluster` primary (`front`) and each process it forked
    /// that answers requests (`front-<pid>`), for their CPU.
    pub(crate) fn pids(&self) -> Vec<(String, u32)> {
        let Some(primary) = self.child.id() else {
            return Vec::new();
        };
        let mut v = vec![("front".to_owned(), primary)];
        v.extend(
            procs::children_of(primary)
                .into_iter()
                .map(|pid| (format!("front-{pid}"), pid)),
        );
        v
    }
}

/// Each `Worker`'s concurrency in the peer's end-to-end phase, where each of as many
/// processes as sluice has `sluice worker`s runs one `Worker` per queue: a `sluice worker`'s
/// `concurrency` spread over the `queues`, rounded up, at least 1 — so the peer's processes
/// hold (at least) as many jobs at once as sluice's.
pub(crate) fn concurrency_per_queue(concurrency: usize, queues: usize) -> usize {
    concurrency.div_ceil(queues.max(1)).max(1)
}

/// Runs the end-to-end phase against the peer (its own `redis-server`): `--workers` drain
/// processes connect, `workload` (its address replaced by the peer's) runs closed-loop from
/// `clients` connections for `--e2e-secs`, then the phase waits (at most `--e2e-drain-secs`)
/// until every added job completed, and reads each job's times back.
pub async fn http_e2e(
    args: &Args,
    scratch: &Scratch,
    workload: &Workload,
    clients: usize,
) -> Result<(PeerE2e, Check), NoPeer> {
    let script = locate(args).await?;
    measure_e2e(args, scratch, &script, workload, clients)
        .await
        .map_err(NoPeer::Failed)
}

/// Starts one `--role drain` process on `queues` and waits (at most 30 s) until its workers
/// are connected. It would end by itself after `timeout_secs`; the caller kills it sooner.
async fn start_drain(
    args: &Args,
    script: &Path,
    port: &str,
    queues: &[String],
    concurrency: usize,
    timeout_secs: u64,
) -> anyhow::Result<tokio::process::Child> {
    use tokio::io::AsyncBufReadExt;

    let mut child = Command::new(&args.node)
        .arg(script)
        .args(["--role", "drain", "--port", port])
        .args(["--queues", &queues.join(",")])
        .args(["--concurrency", &concurrency.to_string()])
        // Never reached: the phase ends it when Redis says every job completed.
        .args(["--expect", &u64::from(u32::MAX).to_string()])
        .args(["--timeout-secs", &timeout_secs.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot start {}", args.node.display()))?;
    let stdout = child.stdout.take().context("the drain's stdout")?;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .context("the BullMQ workers did not connect within 30 s")??
        .context("the BullMQ drain exited before its workers connected")?;
    anyhow::ensure!(
        first.contains("\"ready\""),
        "the BullMQ drain said {first:?}"
    );
    Ok(child)
}

async fn measure_e2e(
    args: &Args,
    scratch: &Scratch,
    script: &Path,
    workload: &Workload,
    clients: usize,
) -> anyhow::Result<(PeerE2e, Check)> {
    let redis = procs::start_redis_named(&args.redis_server, scratch, "redis-bullmq").await?;
    let port = port_of(&redis)?;
    let peer = start_http_peer(args, script, &port).await?;
    let queues: Vec<String> = workload.tenants.iter().map(|t| format!("t-{t}")).collect();
    let processes = args.workers.max(1);
    let per_queue = concurrency_per_queue(args.worker_concurrency, queues.len());
    let limit = args.e2e_secs + args.e2e_drain_secs + 60;
    let mut drains = Vec::new();
    for _ in 0..processes {
        drains.push(start_drain(args, script, &port, &queues, per_queue, limit).await?);
    }
    let mut named = peer.pids();
    named.extend(
        drains
            .iter()
            .enumerate()
            .filter_map(|(n, c)| c.id().map(|pid| (format!("worker-{}", n + 1), pid))),
    );
    named.extend(
        redis
            .nodes
            .iter()
            .filter_map(|n| n.pid().map(|pid| (n.name.clone(), pid))),
    );
    let pids = crate::harness::Pids::named(named);
    let mut w = workload.clone();
    w.addr = peer.addr;
    let before = pids.sample();
    let started = std::time::Instant::now();
    let (load, _) = crate::harness::phase("end-to-end, BullMQ peer", &pids, |p| {
        crate::load::closed_loop(&w, clients, Duration::from_secs(args.e2e_secs), 0, p)
    })
    .await?;
    let client = redis::Client::open(redis.urls[0].as_str())?;
    let mut c = client.get_multiplexed_async_connection().await?;
    let completed_count = |c: &mut redis::aio::MultiplexedConnection| {
        let mut pipe = redis::pipe();
        for q in &queues {
            pipe.cmd("ZCARD").arg(format!("bull:{q}:completed"));
        }
        let mut c = c.clone();
        async move {
            let n: Vec<u64> = pipe.query_async(&mut c).await?;
            anyhow::Ok(n.iter().sum::<u64>())
        }
    };
    // Bounded: the drain limit, 20 ms apart.
    let deadline = std::time::Instant::now() + Duration::from_secs(args.e2e_drain_secs);
    let mut last_print = std::time::Instant::now();
    loop {
        let done = completed_count(&mut c).await?;
        if done >= load.outcomes.created || std::time::Instant::now() > deadline {
            break;
        }
        if last_print.elapsed() >= Duration::from_secs(1) {
            eprintln!(
                "[end-to-end, BullMQ peer] draining: completed={done}/{}",
                load.outcomes.created
            );
            last_print = std::time::Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cpu = pids.since(&before, started.elapsed());
    for mut d in drains {
        anyhow::ensure!(
            d.try_wait()?.is_none(),
            "a BullMQ drain process exited during the phase"
        );
        let _ = d.kill().await;
    }
    // Every job of every queue, with its times: the same census as sluice's rows.
    let (mut lat, mut first, mut last, mut jobs, mut completed) =
        (Vec::new(), u64::MAX, 0u64, 0u64, 0u64);
    for q in &queues {
        let ids: Vec<String> = redis::cmd("ZRANGE")
            .arg(format!("bull:{q}:completed"))
            .arg(0)
            .arg(-1)
            .query_async(&mut c)
            .await?;
        let waiting: u64 = redis::cmd("LLEN")
            .arg(format!("bull:{q}:wait"))
            .query_async(&mut c)
            .await?;
        let active: u64 = redis::cmd("LLEN")
            .arg(format!("bull:{q}:active"))
            .query_async(&mut c)
            .await?;
        jobs += ids.len() as u64 + waiting + active;
        for page in ids.chunks(1000) {
            let mut pipe = redis::pipe();
            for id in page {
                pipe.cmd("HMGET")
                    .arg(format!("bull:{q}:{id}"))
                    .arg("timestamp")
                    .arg("finishedOn");
            }
            let rows: Vec<(Option<u64>, Option<u64>)> = pipe.query_async(&mut c).await?;
            for (a, b) in rows {
                if let (Some(a), Some(b)) = (a, b) {
                    completed += 1;
                    lat.push((b.saturating_sub(a) * 1000).min(u64::from(u32::MAX)) as u32);
                    first = first.min(a);
                    last = last.max(b);
                }
            }
        }
    }
    let versions = peer.versions.clone();
    drop(peer);
    redis.kill().await;
    let span = Duration::from_millis(last.saturating_sub(first.min(last)));
    let o = &load.outcomes;
    let ok = o.errors == 0
        && o.replay_anomalies == 0
        && o.created > 0
        && jobs == o.created
        && completed == o.created;
    let check = Check {
        phase: "end-to-end, BullMQ peer".into(),
        ok,
        detail: format!(
            "201={} errors={} jobs in Redis={jobs} completed={completed}",
            o.created, o.errors
        ),
    };
    let e2e = PeerE2e {
        versions,
        worker_processes: processes,
        concurrency_per_queue: per_queue,
        admitted: o.created,
        completed,
        admission_per_sec: o.created as f64 / load.elapsed.as_secs_f64().max(1e-3),
        per_sec: completed as f64 / span.as_secs_f64().max(1e-3),
        span_secs: span.as_secs_f64(),
        admit_to_completed: Latencies::new(lat).percentiles(),
        cpu,
    };
    Ok((e2e, check))
}

/// The port of the peer's own `redis-server` (its one URL ends in it).
pub(crate) fn port_of(redis: &procs::Redis) -> anyhow::Result<String> {
    Ok(redis.urls[0]
        .rsplit(':')
        .next()
        .context("redis url without a port")?
        .to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peers_workers_hold_at_least_as_many_jobs_as_sluices() {
        // 2 processes of a Worker per queue: each process holds what one `sluice worker` does.
        assert_eq!(concurrency_per_queue(256, 8), 32);
        // Rounded up, never 0.
        assert_eq!(concurrency_per_queue(10, 8), 2);
        assert_eq!(concurrency_per_queue(1, 8), 1);
        assert_eq!(concurrency_per_queue(0, 8), 1);
        assert_eq!(concurrency_per_queue(256, 0), 256);
    }

    #[test]
    fn children_of_finds_a_child_process() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .expect("sleep runs");
        let found = procs::children_of(std::process::id());
        let _ = child.kill();
        let _ = child.wait();
        assert!(
            found.contains(&child.id()),
            "{} not among {found:?}",
            child.id()
        );
    }
}
