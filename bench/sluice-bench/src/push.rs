//! The wake-up phases (pickup, cancel, idle cost), each from an empty Redis and bounded in time
//! and count, each against `sluice worker --demo-flows` with sluice's DEFAULT worker settings
//! (no `--concurrency`, `--heartbeat-ms` or other flags), as an operator would run it:
//!
//! - **pickup**: one worker; `demo.echo` admitted over HTTP at fixed open-loop rates (an idle
//!   one, a fixed one, and a share of the admission maximum); per execution, pickup = the row's
//!   `started` − `created` and admit→completed = `finished` − `created` (ms, Redis clock). The
//!   BullMQ peer (`bullmq.rs`) runs at the same rates for the side-by-side comparison.
//! - **cancel**: long `demo.sleep` executions, each cancelled once it runs; latency = the row's
//!   `finished` (Redis clock) − the client's send time (same machine, same clock).
//! - **idle**: one worker, nothing admitted, `sluice serve` stopped (the worker's calls alone):
//!   the calls it sends to Redis per second (`MONITOR`, top-level calls only) and `INFO
//!   commandstats` (every command, also those scripts run inside Redis, and script calls
//!   apart), per shard per safety-poll interval (the worker's `--scan-ms` default, read from
//!   `sluice::config`).
//!
//! What the worker's defaults are is read from `sluice::config::WorkerSettings::defaults()`,
//! never repeated here, so a change of default is measured as such.
//!
//! Long on purpose: the three phases share the worker start and stop helpers at the top, and
//! the idle phase's MONITOR reader sits beside the one phase that uses it; the unit tests close
//! the file.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use serde_json::Value;
use sluice::config::WorkerSettings;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::task::JoinSet;

use crate::Args;
use crate::compare::round2;
use crate::direct::{Direct, RowTimes};
use crate::harness::Pids;
use crate::load::{self, Conn, Latencies, Workload};
use crate::procs::{self, Proc, Scratch, SluiceCmd};
use crate::report::{CancelPhase, Check, IdleCost, PickupSide};

/// Everything the phases share: the flags, the sluice processes' settings, the API.
pub struct Ctx<'a> {
    pub args: &'a Args,
    pub cmd: &'a SluiceCmd,
    pub scratch: &'a Scratch,
    /// `sluice serve` (for pickup and cancel; stopped for idle).
    pub addr: SocketAddr,
    pub admin_token: &'a str,
    pub tenants: &'a [String],
    /// The processes besides the worker whose CPU a phase reports (Redis, serve).
    pub others: Vec<&'a Proc>,
}

/// The worker settings `sluice worker` has without flags (this build's).
pub fn worker_defaults() -> WorkerSettings {
    WorkerSettings::defaults()
}

/// Extra worker arguments: none (the defaults), except in a smoke run, where the heartbeat is
/// shortened so that a cancel that travels with it (the polling worker) ends in a second
/// instead of ten: a smoke run measures nothing, it checks that the phases work.
pub(crate) fn worker_extra(args: &Args) -> Vec<String> {
    if args.smoke {
        vec!["--heartbeat-ms".into(), "200".into()]
    } else {
        Vec::new()
    }
}

/// Starts `n` default workers named `<prefix>-<i>` and waits until each says it started,
/// then `settle` more (a polling worker reaches its idle pause; a push worker its blocking
/// reads).
pub(crate) async fn start_workers(
    ctx: &Ctx<'_>,
    prefix: &str,
    n: usize,
    extra: &[String],
    settle: Duration,
) -> anyhow::Result<Vec<Proc>> {
    let mut workers = Vec::with_capacity(n);
    for i in 1..=n {
        workers.push(procs::start_worker(
            ctx.cmd,
            ctx.scratch,
            &format!("{prefix}-{i}"),
            extra,
        )?);
    }
    procs::wait_started(&mut workers).await?;
    tokio::time::sleep(settle).await;
    for w in &mut workers {
        w.ensure_running()?;
    }
    Ok(workers)
}

/// Kills the workers after checking they are still running.
pub(crate) async fn stop_workers(workers: Vec<Proc>) -> anyhow::Result<()> {
    let mut alive = Ok(());
    for mut w in workers {
        if alive.is_ok() {
            alive = w.ensure_running();
        }
        w.kill().await;
    }
    alive
}

/// Connections for an open loop at `rate`: about one per 10/s, at least 2, at most
/// `clients`. Not always `clients`: at 2/s each of 64 connections would wait half a minute
/// between requests, past the server's idle keep-alive timeout, and its next request would
/// meet a closed connection.
fn pickup_clients(clients: usize, rate: f64) -> usize {
    ((rate / 10.0).ceil() as usize).clamp(2, clients.max(2))
}

/// Milliseconds as the microseconds `Latencies` holds, saturating.
pub(crate) fn ms_to_us(ms: u64) -> u32 {
    ms.saturating_mul(1000).min(u64::from(u32::MAX)) as u32
}

/// Pickup and admit→completed of the rows, the ones not started (finished) by `now_ms`
/// counted at their age then: a lower bound, so a worker that falls behind cannot hide it.
pub fn pickup_side(rows: &[RowTimes], now_ms: u64, admitted: u64, errors: u64) -> PickupSide {
    let (mut pickup, mut done) = (Vec::new(), Vec::new());
    let (mut not_started, mut completed) = (0, 0);
    for r in rows {
        let Some(created) = r.created else { continue };
        pickup.push(ms_to_us(
            r.started.unwrap_or(now_ms).saturating_sub(created),
        ));
        done.push(ms_to_us(
            r.finished.unwrap_or(now_ms).saturating_sub(created),
        ));
        not_started += u64::from(r.started.is_none());
        completed += u64::from(r.status == "completed");
    }
    PickupSide {
        admitted,
        errors,
        completed,
        not_started,
        pickup: Latencies::new(pickup).percentiles(),
        admit_to_completed: Latencies::new(done).percentiles(),
        cpu: Vec::new(),
    }
}

/// One rate of the pickup phase on sluice: from an empty Redis, one default worker, `rate`
/// admissions per second of `demo.echo` for `secs`, then until everything completed (at most
/// `--pickup-drain-secs`); the rows read back.
pub async fn pickup_rate(
    ctx: &Ctx<'_>,
    direct: &mut Direct,
    label: &str,
    rate: f64,
    secs: f64,
) -> anyhow::Result<(PickupSide, Check)> {
    let args = ctx.args;
    direct.reset().await?;
    let settle = Duration::from_millis(args.pickup_settle_ms);
    let workers = start_workers(ctx, "pickup-worker", 1, &worker_extra(args), settle).await?;
    let w = Workload {
        addr: ctx.addr,
        admin_token: ctx.admin_token.into(),
        tenants: ctx.tenants.to_vec(),
        tag: format!("pickup-{label}"),
        flow: "demo.echo".into(),
        keys: 0,
        tokens: Vec::new(),
    };
    let mut all = ctx.others.clone();
    all.extend(workers.iter());
    let pids = Pids::of(&all);
    let name = format!("pickup {label}");
    let (r, cpu) = crate::harness::phase(&name, &pids, |p| {
        load::open_loop(
            &w,
            pickup_clients(args.clients, rate),
            rate,
            Duration::from_secs_f64(secs),
            p,
        )
    })
    .await?;
    let deadline = Instant::now() + Duration::from_secs(args.pickup_drain_secs);
    let mut last_print = Instant::now();
    loop {
        let done = direct.completed().await?;
        if done >= r.outcomes.created || Instant::now() > deadline {
            break;
        }
        if last_print.elapsed() >= Duration::from_secs(1) {
            eprintln!("[{name}] draining: completed={done}/{}", r.outcomes.created);
            last_print = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let now = direct.redis_now_ms().await?;
    let rows = direct.row_times().await?;
    stop_workers(workers).await?;
    let mut side = pickup_side(&rows, now, r.outcomes.created, r.outcomes.errors);
    side.cpu = cpu;
    let census = direct.census(false).await?;
    let check = crate::harness::check_completed(&format!("pickup {label}"), &r.outcomes, &census);
    Ok((side, check))
}

/// The cancel phase: `--cancel-samples` `demo.sleep` executions (`--cancel-sleep-ms`), run by
/// as many default workers as their default concurrency needs to run them all at once; once
/// every one is running, each is cancelled (`POST /api/executions/{id}/cancel`), the sends
/// spread evenly over `--cancel-spread-ms` so they fall at different points of whatever
/// schedule the worker keeps; latency = the row's `finished` − the send time. Bounded: the
/// rows must run within 20 s, and be cancelled within `--cancel-timeout-secs` of the last send
/// (a cancel not reached by then counts at that age, a lower bound).
pub async fn cancel(ctx: &Ctx<'_>, direct: &mut Direct) -> anyhow::Result<(CancelPhase, Check)> {
    let args = ctx.args;
    let samples = args.cancel_samples.max(1);
    let per_worker = worker_defaults().concurrency.max(1);
    let n_workers = samples.div_ceil(per_worker);
    direct.reset().await?;
    let settle = Duration::from_millis(args.pickup_settle_ms);
    let workers =
        start_workers(ctx, "cancel-worker", n_workers, &worker_extra(args), settle).await?;

    // Admit.
    let mut conn = Conn::connect(ctx.addr).await?;
    let body = format!(
        r#"{{"flow_id":"demo.sleep","params":{{"ms":{}}}}}"#,
        args.cancel_sleep_ms
    );
    let mut execs: Vec<(String, String)> = Vec::with_capacity(samples);
    for i in 0..samples {
        let tenant = &ctx.tenants[i % ctx.tenants.len()];
        let (status, answer) = conn
            .call(
                hyper::Method::POST,
                "/api/executions",
                ctx.admin_token,
                tenant,
                &body,
            )
            .await?;
        anyhow::ensure!(status == 201, "cancel phase: admission answered {status}");
        let v: Value = serde_json::from_slice(&answer)?;
        let id = v["execution_id"]
            .as_str()
            .context("admission answer without execution_id")?;
        execs.push((tenant.clone(), id.to_owned()));
    }

    // Wait until every one runs (a queued one would be cancelled at once, by the API).
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let rows = direct.row_times().await?;
        let running = rows.iter().filter(|r| r.status == "running").count();
        if running >= samples {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "cancel phase: only {running} of {samples} executions running after 20 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Cancel, the sends spread over the window.
    eprintln!(
        "[cancel] {samples} running on {n_workers} default worker(s); cancelling over {} ms",
        args.cancel_spread_ms
    );
    let start = Instant::now();
    let spread = Duration::from_millis(args.cancel_spread_ms);
    let mut set = JoinSet::new();
    for (i, (tenant, id)) in execs.iter().cloned().enumerate() {
        let at = start + spread.mul_f64(i as f64 / samples as f64);
        let (addr, token) = (ctx.addr, ctx.admin_token.to_owned());
        set.spawn(async move {
            let mut conn = Conn::connect(addr).await?;
            tokio::time::sleep_until(at.into()).await;
            let sent_ms = epoch_ms();
            let path = format!("/api/executions/{id}/cancel");
            let (status, answer) = conn
                .call(hyper::Method::POST, &path, &token, &tenant, "")
                .await?;
            let v: Value = serde_json::from_slice(&answer).unwrap_or(Value::Null);
            // Accepted for a running execution: still running, with the request recorded.
            let accepted = status == 200
                && v["status"] == "running"
                && v["cancel_requested"].as_bool() == Some(true);
            anyhow::Ok((id, sent_ms, accepted))
        });
    }
    let mut sent: HashMap<String, (u64, bool)> = HashMap::new();
    while let Some(r) = set.join_next().await {
        let (id, at, accepted) = r.context("a cancel client failed")??;
        sent.insert(id, (at, accepted));
    }

    // Wait until every one is cancelled, bounded.
    let deadline = Instant::now() + Duration::from_secs(args.cancel_timeout_secs);
    let mut last_print = Instant::now();
    let rows = loop {
        let rows = direct.row_times().await?;
        let cancelled = rows.iter().filter(|r| r.status == "cancelled").count();
        if cancelled >= samples || Instant::now() > deadline {
            break rows;
        }
        if last_print.elapsed() >= Duration::from_secs(1) {
            eprintln!("[cancel] waiting: cancelled={cancelled}/{samples}");
            last_print = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let now = epoch_ms();
    stop_workers(workers).await?;
    let (mut lat, mut cancelled, mut not_reached, mut accepted) = (Vec::new(), 0u64, 0u64, 0u64);
    for r in &rows {
        let Some(&(at, ok)) = sent.get(&r.id) else {
            continue;
        };
        accepted += u64::from(ok);
        match (r.status.as_str(), r.finished) {
            ("cancelled", Some(f)) => {
                cancelled += 1;
                lat.push(ms_to_us(f.saturating_sub(at)));
            }
            _ => {
                not_reached += 1;
                lat.push(ms_to_us(now.saturating_sub(at)));
            }
        }
    }
    let census = direct.census(false).await?;
    let in_status = census.by_status.get("cancelled").copied().unwrap_or(0);
    let n = samples as u64;
    let ok = accepted == n
        && cancelled == n
        && census.rows == n
        && in_status == n
        && census.ready == 0
        && census.pending == 0
        && census.leases == 0
        && census.waiting == 0
        && census.dead_letters == 0;
    let check = Check {
        phase: "cancel".into(),
        ok,
        detail: format!(
            "admitted={n} accepted while running={accepted} cancelled={cancelled} not reached \
             in {} s={not_reached}; rows={} cancelled={in_status} ready={} pending={} \
             leases={} waiting={} dead letters={}",
            args.cancel_timeout_secs,
            census.rows,
            census.ready,
            census.pending,
            census.leases,
            census.waiting,
            census.dead_letters
        ),
    };
    Ok((
        CancelPhase {
            workers: n_workers,
            worker_concurrency: per_worker,
            requested: n,
            accepted,
            cancelled,
            not_reached,
            spread_ms: args.cancel_spread_ms,
            timeout_secs: args.cancel_timeout_secs,
            latency: Latencies::new(lat).percentiles(),
        },
        check,
    ))
}

fn epoch_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Script calls in `INFO commandstats`.
const SCRIPT_COMMANDS: [&str; 6] = [
    "eval",
    "evalsha",
    "eval_ro",
    "evalsha_ro",
    "fcall",
    "fcall_ro",
];

/// The idle phase: one default worker against an empty Redis with `sluice serve` stopped (the
/// caller stops it), measured over `--idle-secs` after `--idle-settle-ms`.
pub async fn idle(ctx: &Ctx<'_>, direct: &mut Direct) -> anyhow::Result<(IdleCost, Check)> {
    let args = ctx.args;
    direct.reset().await?;
    let settle = Duration::from_millis(args.idle_settle_ms);
    // The defaults, also in a smoke run: nothing here waits for a heartbeat.
    let workers = start_workers(ctx, "idle-worker", 1, &[], settle).await?;
    let own = direct.own_addrs().await?;
    let mut monitors = Vec::new();
    for addr in direct.node_addrs().to_vec() {
        monitors.push(Monitor::start(&addr).await?);
    }
    eprintln!("[idle] measuring for {} s", args.idle_secs);
    let before = direct.command_calls().await?;
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(args.idle_secs)).await;
    let after = direct.command_calls().await?;
    let secs = started.elapsed().as_secs_f64().max(1e-3);
    let mut sent: BTreeMap<String, u64> = BTreeMap::new();
    for m in monitors {
        for (cmd, n) in m.stop(&own) {
            *sent.entry(cmd).or_default() += n;
        }
    }
    let mut alive = workers;
    let worker_ok = alive.iter_mut().all(|w| w.ensure_running().is_ok());
    stop_workers(alive).await.ok();
    let delta = |names: &[&str]| -> u64 {
        after
            .iter()
            .filter(|(k, _)| names.is_empty() || names.contains(&k.as_str()))
            .map(|(k, v)| v.saturating_sub(before.get(k).copied().unwrap_or(0)))
            .sum()
    };
    // The benchmark's own first INFO is in the second's counts (a command is counted once it
    // ran), one per node; nothing else of the benchmark runs on Redis in the window.
    let commands = delta(&[]).saturating_sub(direct.node_addrs().len() as u64);
    let scripts = delta(&SCRIPT_COMMANDS);
    let calls: u64 = sent.values().sum();
    let shards = direct.shards_served();
    let scan_ms = worker_defaults().scan_ms;
    let per_sec = calls as f64 / secs;
    let census = direct.census(false).await?;
    let check = Check {
        phase: "idle".into(),
        ok: worker_ok && census.rows == 0 && census.pending == 0 && census.leases == 0,
        detail: format!(
            "worker ran throughout: {worker_ok}; rows={} pending={} leases={}",
            census.rows, census.pending, census.leases
        ),
    };
    Ok((
        IdleCost {
            serve: "stopped: the worker's calls alone",
            window_secs: round2(secs),
            shards,
            scan_ms,
            calls,
            calls_per_sec: round2(per_sec),
            commands_per_sec: round2(commands as f64 / secs),
            script_calls_per_sec: round2(scripts as f64 / secs),
            per_shard_per_interval: round2(
                per_sec * scan_ms as f64 / 1000.0 / shards.max(1) as f64,
            ),
            by_command: sent,
        },
        check,
    ))
}

/// A `MONITOR` connection to one node, counting the commands clients send by name (the
/// commands scripts run inside Redis are shown as coming from `lua` and not counted).
struct Monitor {
    counts: Arc<Mutex<HashMap<(String, String), u64>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Monitor {
    /// Connects to `addr` (`127.0.0.1:<port>`) and starts counting once Redis said OK.
    async fn start(addr: &str) -> anyhow::Result<Self> {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .with_context(|| format!("MONITOR connection to {addr}"))?;
        let (read, mut write) = stream.into_split();
        write.write_all(b"MONITOR\r\n").await?;
        let mut lines = BufReader::new(read).lines();
        let first = tokio::time::timeout(Duration::from_secs(5), lines.next_line())
            .await
            .context("MONITOR did not answer")??;
        anyhow::ensure!(
            first.as_deref().map(str::trim_end) == Some("+OK"),
            "MONITOR answered {first:?}"
        );
        let counts: Arc<Mutex<HashMap<(String, String), u64>>> = Arc::default();
        let c = counts.clone();
        let task = tokio::spawn(async move {
            let _write = write; // the connection stays open while the task runs
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some((client, cmd)) = parse_monitor_line(&line) {
                    *c.lock()
                        .expect("monitor counts")
                        .entry((client, cmd))
                        .or_default() += 1;
                }
            }
        });
        Ok(Self { counts, task })
    }

    /// Stops counting; calls per command of every client but `lua` and the `own` ones.
    fn stop(self, own: &[String]) -> BTreeMap<String, u64> {
        self.task.abort();
        let counts = self.counts.lock().expect("monitor counts");
        let mut out = BTreeMap::new();
        for ((client, cmd), n) in counts.iter() {
            if client != "lua" && !own.contains(client) {
                *out.entry(cmd.clone()).or_default() += n;
            }
        }
        out
    }
}

/// `+1700000000.123456 [0 127.0.0.1:5000] "XREADGROUP" "GROUP" ...` → (client, command).
fn parse_monitor_line(line: &str) -> Option<(String, String)> {
    let rest = line.strip_prefix('+')?;
    let (_, rest) = rest.split_once('[')?;
    let (inside, rest) = rest.split_once(']')?;
    let client = inside.split_whitespace().nth(1)?.to_owned();
    let cmd = rest.trim_start().strip_prefix('"')?.split('"').next()?;
    Some((client, cmd.to_ascii_lowercase()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monitor_lines_name_the_client_and_the_command() {
        assert_eq!(
            parse_monitor_line(r#"+1700000000.123456 [0 127.0.0.1:5000] "XREADGROUP" "GROUP" "w""#),
            Some(("127.0.0.1:5000".into(), "xreadgroup".into()))
        );
        assert_eq!(
            parse_monitor_line(r#"+1700000000.1 [0 lua] "hget" "k" "f""#),
            Some(("lua".into(), "hget".into()))
        );
        assert_eq!(parse_monitor_line("+OK"), None);
    }

    #[test]
    fn rows_not_started_count_at_their_age() {
        let row = |started: Option<u64>| RowTimes {
            id: "x".into(),
            status: if started.is_some() {
                "completed"
            } else {
                "queued"
            }
            .into(),
            tenant: None,
            created: Some(1000),
            started,
            finished: started.map(|s| s + 1),
            ready_at: None,
            run_at: None,
        };
        let side = pickup_side(&[row(Some(1003)), row(None)], 1500, 2, 0);
        assert_eq!(side.not_started, 1);
        assert_eq!(side.completed, 1);
        assert_eq!(side.pickup.max_ms, 500.0);
        assert_eq!(side.pickup.p50_ms, 3.0);
    }
}
