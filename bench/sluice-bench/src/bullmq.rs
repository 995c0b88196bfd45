//! The BullMQ peer of the pickup phase: `bench/bullmq/peer.mjs` (a default BullMQ `Worker`
//! with a no-op processor, a `Queue` adding jobs at fixed rates) run with `node` against a
//! `redis-server` of its own that this module starts on a free loopback port, so sluice and
//! BullMQ are measured in one run on one machine at the same rates. The same peer runs the
//! fairness group's noisy-neighbour phase (`noisy`, `peer.mjs --noisy`): one queue, one worker
//! of sluice's concurrency, a flood and then calm jobs in that queue. `scripts/bench.sh`
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
use crate::report::{Check, NoisySide, PeerVersions, PickupSide};

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
    _child: tokio::process::Child,
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
        _child: child,
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

/// The port of the peer's own `redis-server` (its one URL ends in it).
pub(crate) fn port_of(redis: &procs::Redis) -> anyhow::Result<String> {
    Ok(redis.urls[0]
        .rsplit(':')
        .next()
        .context("redis url without a port")?
        .to_owned())
}
