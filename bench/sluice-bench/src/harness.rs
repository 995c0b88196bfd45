//! What the phases share: where the `sluice` program is, tenants and their API keys, the CPU
//! each process used, a phase run with its progress line, the store the ceiling calls, and the
//! checks of what Redis holds after a phase against what the clients were told.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use sluice::config::{ApiSettings, RedisSettings};
use sluice::store::{RedisTarget, StoreConfig};

use crate::direct::{Census, Direct};
use crate::load::{self, LoadResult, Progress};
use crate::procs::{self, Proc};
use crate::report::{Check, CpuShare, MasterShare, Phase};
use crate::{ADMIN_TOKEN, Args, UNLIMITED};

/// Where the `sluice` program is: the flag, else next to this binary.
pub(crate) fn sluice_program(args: &Args) -> anyhow::Result<PathBuf> {
    if let Some(p) = &args.sluice {
        return Ok(p.clone());
    }
    let exe = std::env::current_exe()?;
    let p = exe.with_file_name("sluice");
    anyhow::ensure!(
        p.exists(),
        "{} not found: build it too (`cargo build --release --bin sluice --bin sluice-bench`) \
         or pass --sluice",
        p.display()
    );
    Ok(p)
}

/// Registers each tenant and makes it an `editor` API key (after a reset: the keys live on
/// Redis like everything else); the tokens, in the order of `tenants`.
pub(crate) async fn tenant_keys(
    addr: std::net::SocketAddr,
    tenants: &[String],
) -> anyhow::Result<Vec<String>> {
    let mut conn = load::Conn::connect(addr).await?;
    let mut tokens = Vec::new();
    for t in tenants {
        let (status, _) = conn
            .call(
                hyper::Method::PUT,
                &format!("/api/tenants/{t}"),
                ADMIN_TOKEN,
                t,
                "{}",
            )
            .await?;
        anyhow::ensure!(status == 200, "registering {t} answered {status}");
        let (status, body) = conn
            .call(
                hyper::Method::POST,
                &format!("/api/tenants/{t}/api-keys"),
                ADMIN_TOKEN,
                t,
                r#"{"role":"editor","name":"bench"}"#,
            )
            .await?;
        anyhow::ensure!(status == 201, "a key for {t} answered {status}");
        let key: serde_json::Value = serde_json::from_slice(&body)?;
        tokens.push(
            key["token"]
                .as_str()
                .ok_or_else(|| anyhow::anyhow!("no token for {t}"))?
                .to_owned(),
        );
    }
    Ok(tokens)
}

/// Every process whose CPU time a phase reports.
pub(crate) struct Pids(Vec<(String, u32)>);

impl Pids {
    pub(crate) fn of(procs: &[&Proc]) -> Self {
        let mut v: Vec<(String, u32)> = procs
            .iter()
            .filter_map(|p| p.pid().map(|pid| (p.name.clone(), pid)))
            .collect();
        v.push(("bench".into(), std::process::id()));
        Self(v)
    }

    /// Processes named by hand (the BullMQ peer's, which are not `Proc`s), and this one.
    pub(crate) fn named(mut v: Vec<(String, u32)>) -> Self {
        v.push(("bench".into(), std::process::id()));
        Self(v)
    }

    /// CPU seconds of each process, then of the whole machine.
    pub(crate) fn sample(&self) -> Vec<f64> {
        self.0
            .iter()
            .map(|(_, pid)| procs::cpu_seconds(*pid).unwrap_or(0.0))
            .chain([procs::machine_busy_seconds().unwrap_or(0.0)])
            .collect()
    }

    /// CPU use since `before` over `wall`, in cores, per process and for the rest of the
    /// machine (other processes, interrupts).
    pub(crate) fn since(&self, before: &[f64], wall: Duration) -> Vec<CpuShare> {
        let after = self.sample();
        let cores = |d: f64| (d / wall.as_secs_f64().max(1e-3) * 100.0).round() / 100.0;
        let deltas: Vec<f64> = before.iter().zip(&after).map(|(b, a)| a - b).collect();
        let (machine, ours) = deltas.split_last().unwrap_or((&0.0, &[]));
        let mut out: Vec<CpuShare> = self
            .0
            .iter()
            .zip(ours)
            .map(|((name, _), d)| CpuShare {
                process: name.clone(),
                cores: cores(*d),
                seconds: *d,
            })
            .collect();
        let rest = (machine - ours.iter().sum::<f64>()).max(0.0);
        out.push(CpuShare {
            process: "rest".into(),
            cores: cores(rest),
            seconds: rest,
        });
        out
    }
}

/// The Redis nodes and `serve` (the processes every phase's CPU shares name).
pub(crate) fn redis_and<'a>(redis: &'a procs::Redis, serve: &'a Proc) -> Vec<&'a Proc> {
    redis.nodes.iter().chain([serve]).collect()
}

/// Runs a phase with a progress line per second; returns its result and CPU shares.
pub(crate) async fn phase<F: Future<Output = anyhow::Result<LoadResult>>>(
    name: &str,
    pids: &Pids,
    f: impl FnOnce(Arc<Progress>) -> F,
) -> anyhow::Result<(LoadResult, Vec<CpuShare>)> {
    let progress = Arc::new(Progress::default());
    let stop = Arc::new(AtomicBool::new(false));
    let ticker = load::progress(name, progress.clone(), stop.clone());
    let before = pids.sample();
    let started = Instant::now();
    let result = f(progress).await;
    let cpu = pids.since(&before, started.elapsed());
    stop.store(true, Ordering::Relaxed);
    ticker.abort();
    Ok((result?, cpu))
}

/// `serve`'s admission script calls so far and the admissions they carried (group commit),
/// from its `/metrics`.
pub(crate) async fn group_counts(addr: std::net::SocketAddr) -> anyhow::Result<(u64, u64)> {
    let mut c = load::Conn::connect(addr).await?;
    let (status, body) = c.get("/metrics").await?;
    anyhow::ensure!(status == 200, "GET /metrics answered {status}");
    let text = String::from_utf8_lossy(&body);
    let value = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok())
            .map_or(0, |v| v as u64)
    };
    Ok((
        value("sluice_admission_calls_total"),
        value("sluice_admission_calls_carried_total"),
    ))
}

/// How every `sluice` child of a run is started: `program` against `redis`, with the run's
/// connection and thread settings.
pub(crate) fn sluice_cmd(
    args: &Args,
    program: impl Into<PathBuf>,
    redis: RedisTarget,
) -> procs::SluiceCmd {
    procs::SluiceCmd {
        program: program.into(),
        redis,
        redis_connections: args.redis_connections,
        serve_threads: args.serve_threads,
        worker_threads: args.worker_threads,
    }
}

/// The store the ceiling phase calls directly (and the census reads through): `sluice serve`'s
/// defaults (the flags' own), with the benchmark's quotas, connections and a generous time
/// bound.
pub(crate) fn store_config(args: &Args, target: RedisTarget) -> StoreConfig {
    let mut redis_settings = RedisSettings::for_target(target);
    redis_settings.redis_connections = args.redis_connections;
    redis_settings.redis_timeout_ms = 10_000;
    // The ceiling is the single-call one: every admission its own EVALSHA, as before group
    // commit, so HTTP admission (which groups) is measured against what one call per
    // admission allows.
    redis_settings.redis_admission_group = 1;
    let mut api = ApiSettings::defaults();
    api.default_max_concurrent = UNLIMITED;
    api.default_max_queued = UNLIMITED;
    api.default_max_bytes = crate::UNLIMITED_BYTES;
    api.default_max_retained = crate::UNLIMITED_BYTES;
    redis_settings.store_config(&api)
}

/// After a phase with workers: every 2xx admission is a row and completed (also by the shards'
/// counters), nothing left on a ready stream, pending, leased, waiting, delayed or
/// dead-lettered.
pub(crate) fn check_completed(phase: &str, o: &load::Outcomes, census: &Census) -> Check {
    let completed = census.by_status.get("completed").copied().unwrap_or(0);
    let ok = o.errors == 0
        && census.rows == o.created
        && completed == o.created
        && census.completed_counter == o.created
        && census.ready == 0
        && census.pending == 0
        && census.leases == 0
        && census.waiting == 0
        && census.delayed == 0
        && census.dead_letters == 0;
    Check {
        phase: phase.into(),
        ok,
        detail: format!(
            "2xx={} non-2xx={}; rows={} completed={} (counter {}); ready={} pending={} \
             leases={} waiting={} delayed={} dead letters={}",
            o.created,
            o.errors,
            census.rows,
            completed,
            census.completed_counter,
            census.ready,
            census.pending,
            census.leases,
            census.waiting,
            census.delayed,
            census.dead_letters
        ),
    }
}

/// A phase's numbers from its load, CPU shares and each node's script time; on a cluster
/// (`masters`) with each master's share of the rows the census found.
pub(crate) fn phase_report(
    r: &LoadResult,
    cpu: Vec<CpuShare>,
    script_us: &[u64],
    census: &Census,
    masters: Option<&[String]>,
) -> Phase {
    let mut p = Phase::from(r, cpu, script_us.iter().sum());
    p.per_master = masters
        .map(|m| MasterShare::of(m, &census.rows_by_node, script_us, r.elapsed.as_secs_f64()));
    p
}

/// After an admission phase without workers: every 2xx is one row, queued once (all are
/// dispatched: quotas are unlimited): on a ready stream (schema 1), in its tenant's waiting
/// set, or in its concurrency key's queue (of which only the first is also in the waiting
/// set); nothing pending, leased or dead-lettered. Returns the census too.
pub(crate) async fn check_queued(
    phase: &str,
    r: &LoadResult,
    direct: &mut Direct,
) -> anyhow::Result<(Check, Census)> {
    let c = direct
        .census(false)
        .await
        .with_context(|| format!("census after {phase}"))?;
    let queued = c.by_status.get("queued").copied().unwrap_or(0);
    let o = &r.outcomes;
    let ok = o.errors == 0
        && o.replay_anomalies == 0
        && c.rows == o.created
        && queued == o.created
        && c.ready + c.waiting + c.key_queued - c.key_heads_waiting.min(c.key_queued) == o.created
        && c.pending == 0
        && c.leases == 0
        && c.dead_letters == 0;
    let check = Check {
        phase: phase.into(),
        ok,
        detail: format!(
            "2xx new={} replayed={} non-2xx={} replay anomalies={}; rows={} queued={}; \
             ready={} waiting={}{} pending={} dead letters={}",
            o.created,
            o.replayed,
            o.errors,
            o.replay_anomalies,
            c.rows,
            queued,
            c.ready,
            c.waiting,
            if c.key_queued > 0 {
                format!(
                    " key queues={} (their firsts also waiting: {})",
                    c.key_queued, c.key_heads_waiting
                )
            } else {
                String::new()
            },
            c.pending,
            c.dead_letters
        ),
    };
    Ok((check, c))
}
