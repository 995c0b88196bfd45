//! The BullMQ peer of the pickup phase: `bench/bullmq/peer.mjs` (a default BullMQ `Worker`
//! with a no-op processor, a `Queue` adding jobs at fixed rates) run with `node` against a
//! `redis-server` of its own that this module starts on a free loopback port, so sluice and
//! BullMQ are measured in one run on one machine at the same rates. `scripts/bench.sh`
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
use crate::load::Latencies;
use crate::procs::{self, Scratch};
use crate::report::{Check, PeerVersions, PickupSide};

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
    measure(args, scratch, &script, rates)
        .await
        .map_err(NoPeer::Failed)
}

async fn measure(
    args: &Args,
    scratch: &Scratch,
    script: &Path,
    rates: &[(f64, f64)],
) -> anyhow::Result<PeerRun> {
    let redis = procs::start_redis_named(&args.redis_server, scratch, "redis-bullmq").await?;
    let port = redis.urls[0]
        .rsplit(':')
        .next()
        .context("redis url without a port")?
        .to_owned();
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
