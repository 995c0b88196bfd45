//! `--cost`: what one execution costs Redis, sluice beside its BullMQ peer in one run (issue
//! 39, the method of `COST-METHOD`): the instrument the redesign of the key layout and the Lua
//! is judged with, not the redesign.
//!
//! Four measurements, each on redis-servers of its own, sluice's and BullMQ's alike:
//!
//! 1. **bytes** (`bytes.rs`): `used_memory` growth per queued execution (a dedup key, ~30-byte
//!    and 200-byte params) and per retained completed one, split by structure (`MEMORY USAGE`
//!    summed per key kind; the rest is keyspace overhead) with every structure's `OBJECT
//!    ENCODING`, flagging those that left listpack;
//! 2. **Redis CPU** (`rounds.rs`): `used_cpu_user + used_cpu_sys` per execution of a backlog
//!    admitted over HTTP and drained by a worker, alternating rounds on fresh servers, medians;
//!    with script calls and commands per execution from `INFO commandstats`;
//! 3. **instructions** (`callgrind.rs`): redis-server under `valgrind --tool=callgrind` for an
//!    end-to-end run at a rate no call times out at, less the idle rate measured in the same
//!    server; NOT RUN (never PASS) without valgrind, and in a smoke run;
//! 4. **per-call overhead** (`overhead.rs`): one replayed admission and one repeated completion
//!    captured with `MONITOR` and replayed under callgrind, beside a bare script that issues the
//!    same commands with the same arguments.
//!
//! sluice's figures on a local cluster (`--cluster-masters`) come beside (bytes and CPU). Key
//! kinds come from `sluice::store::keys::parse`, BullMQ's from its key names, so a new layout
//! is measured without a change here. The report (`report.rs`) prints PASS/FAIL (or NOT RUN,
//! or VOID for a callgrind run where an admission failed) against the targets; like
//! every other target they fail the exit status only with `--strict`, the correctness checks
//! always.

mod bytes;
mod callgrind;
mod overhead;
mod peer;
mod report;
mod rounds;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

pub use report::CostReport;

use crate::Args;
use crate::direct::Direct;
use crate::harness::sluice_program;
use crate::load::{self, Progress};
use crate::procs::Scratch;

/// What every cost measurement shares: the flags, the programs, the scratch folder, the
/// tenants (sluice) whose queues are also the peer's (`t-<tenant>`).
pub(crate) struct Ctx<'a> {
    pub args: &'a Args,
    /// The `sluice` program.
    pub program: PathBuf,
    pub scratch: &'a Scratch,
    pub tenants: Vec<String>,
    /// The peer's `peer.mjs`, or why it cannot run.
    pub peer: Result<PathBuf, String>,
    /// valgrind and callgrind_control, or why the instruction counts are not run.
    pub valgrind: Result<callgrind::Valgrind, String>,
}

impl Ctx<'_> {
    /// The peer's queue of each tenant, as its HTTP role names them.
    pub fn queues(&self) -> Vec<String> {
        self.tenants.iter().map(|t| format!("t-{t}")).collect()
    }
}

/// Runs the cost measurements the flags allow and returns the finished report.
pub(crate) async fn run(args: &Args) -> anyhow::Result<CostReport> {
    if cfg!(debug_assertions) && !args.smoke {
        eprintln!("sluice-bench: WARNING: a debug build; measure with --release");
    }
    let scratch = Scratch::create()?;
    let valgrind = if args.smoke {
        Err("smoke run: callgrind is not run".to_owned())
    } else {
        callgrind::Valgrind::find(&args.valgrind).await
    };
    let peer = if args.cost_overhead_only {
        Err("--cost-overhead-only: the peer is not run".to_owned())
    } else {
        match crate::bullmq::locate(args).await {
            Ok(p) => Ok(p),
            Err(crate::bullmq::NoPeer::Skipped(note)) => Err(note),
            Err(crate::bullmq::NoPeer::Failed(e)) => Err(format!("{e:#}")),
        }
    };
    if let Err(note) = &peer {
        eprintln!("sluice-bench: WARNING: the BullMQ peer cannot run: {note}");
    }
    if let Err(why) = &valgrind {
        eprintln!("sluice-bench: instructions NOT RUN: {why}");
    }
    let ctx = Ctx {
        args,
        program: sluice_program(args)?,
        scratch: &scratch,
        tenants: (0..args.tenants.max(1))
            .map(|i| format!("bench-t{i}"))
            .collect(),
        peer,
        valgrind,
    };
    let mut report = CostReport::new(&ctx);
    let started = Instant::now();
    if args.cost_overhead_only {
        overhead::measure(&ctx, &mut report).await?;
        eprintln!("[cost] done after {:.0} s", started.elapsed().as_secs_f64());
        report.finish();
        return Ok(report);
    }
    bytes::measure(&ctx, &mut report).await?;
    eprintln!(
        "[cost] bytes done after {:.0} s",
        started.elapsed().as_secs_f64()
    );
    if args.cost_bytes_only {
        report.finish();
        return Ok(report);
    }
    rounds::measure(&ctx, &mut report).await?;
    eprintln!(
        "[cost] CPU rounds done after {:.0} s",
        started.elapsed().as_secs_f64()
    );
    callgrind::measure(&ctx, &mut report).await?;
    overhead::measure(&ctx, &mut report).await?;
    eprintln!("[cost] done after {:.0} s", started.elapsed().as_secs_f64());
    report.finish();
    Ok(report)
}

/// Runs `f` with a progress line per second on stderr.
pub(crate) async fn with_progress<T, F: Future<Output = T>>(
    name: &str,
    f: impl FnOnce(Arc<Progress>) -> F,
) -> T {
    let progress = Arc::new(Progress::default());
    let stop = Arc::new(AtomicBool::new(false));
    let ticker = load::progress(name, progress.clone(), stop.clone());
    let out = f(progress).await;
    stop.store(true, Ordering::Relaxed);
    ticker.abort();
    out
}

/// Waits (polling every 100 ms, at most `limit`) until the shards' `completed` counters reach
/// `want`; the count reached and the polls made (each one `HGET` per shard, which the caller
/// takes out of the commands it counts).
pub(crate) async fn wait_completed(
    direct: &mut Direct,
    want: u64,
    limit: Duration,
) -> anyhow::Result<(u64, u64)> {
    let deadline = Instant::now() + limit;
    let mut polls = 0;
    let mut last_print = Instant::now();
    loop {
        let done = direct.completed().await?;
        polls += 1;
        if done >= want || Instant::now() > deadline {
            return Ok((done, polls));
        }
        if last_print.elapsed() >= Duration::from_secs(2) {
            eprintln!("[cost] draining: completed={done}/{want}");
            last_print = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Calls per command name of an `INFO commandstats` text.
pub(crate) fn command_calls(info: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for line in info.lines() {
        let Some((name, fields)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        let calls = fields
            .split(',')
            .find_map(|f| f.strip_prefix("calls="))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        *out.entry(name.to_owned()).or_default() += calls;
    }
    out
}

/// Script calls and other commands (top-level and those scripts ran) in `calls`, leaving out
/// the benchmark's own reads (`INFO`, `CONFIG`) and `own_hgets` `HGET`s of its polls.
pub(crate) fn split_calls(calls: &BTreeMap<String, u64>, own_hgets: u64) -> (u64, u64) {
    let (mut scripts, mut commands) = (0, 0);
    for (name, n) in calls {
        if name == "info" || name.starts_with("config") {
            continue;
        }
        if name.starts_with("eval") || name.starts_with("fcall") {
            scripts += n;
        } else if name == "hget" {
            commands += n.saturating_sub(own_hgets);
        } else {
            commands += n;
        }
    }
    (scripts, commands)
}

/// Calls per command name in `calls` (script calls under their own names, `fcall` or
/// `evalsha`, beside the commands they ran), divided by `n`, largest first: what
/// `split_calls` sums, by name, with the same things left out.
pub(crate) fn calls_by_name(
    calls: &BTreeMap<String, u64>,
    own_hgets: u64,
    n: f64,
) -> Vec<(String, f64)> {
    let mut out: Vec<(String, f64)> = calls
        .iter()
        .filter(|(name, _)| *name != "info" && !name.starts_with("config"))
        .map(|(name, &c)| {
            let c = if name == "hget" {
                c.saturating_sub(own_hgets)
            } else {
                c
            };
            (name.clone(), c as f64 / n.max(1.0))
        })
        .filter(|(_, per)| *per > 0.0)
        .collect();
    out.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    out
}

/// `INFO <section>` of one connection.
pub(crate) async fn info(
    conn: &mut redis::aio::MultiplexedConnection,
    section: &str,
) -> anyhow::Result<String> {
    Ok(redis::cmd("INFO").arg(section).query_async(conn).await?)
}

/// A multiplexed connection to a node's URL that waits up to two minutes for a reply (not
/// redis-rs's default 500 ms: a pipeline of script calls to a Redis under callgrind takes
/// seconds).
pub(crate) async fn connect(url: &str) -> anyhow::Result<redis::aio::MultiplexedConnection> {
    let patient = redis::AsyncConnectionConfig::new()
        .set_response_timeout(Some(Duration::from_secs(120)))
        .set_connection_timeout(Some(Duration::from_secs(30)));
    Ok(redis::Client::open(url)?
        .get_multiplexed_async_connection_with_config(&patient)
        .await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_split_into_scripts_and_commands_without_the_benchmarks_own() {
        let info = "# Commandstats\r\n\
            cmdstat_evalsha:calls=10,usec=100,usec_per_call=10.00,rejected_calls=0,failed_calls=0\r\n\
            cmdstat_fcall:calls=2,usec=1,usec_per_call=0.5,rejected_calls=0,failed_calls=0\r\n\
            cmdstat_hget:calls=40,usec=4,usec_per_call=0.1,rejected_calls=0,failed_calls=0\r\n\
            cmdstat_zadd:calls=7,usec=4,usec_per_call=0.1,rejected_calls=0,failed_calls=0\r\n\
            cmdstat_info:calls=3,usec=4,usec_per_call=0.1,rejected_calls=0,failed_calls=0\r\n\
            cmdstat_config|resetstat:calls=1,usec=4,usec_per_call=0.1,rejected_calls=0,failed_calls=0\r\n";
        let calls = command_calls(info);
        assert_eq!(calls["evalsha"], 10);
        assert_eq!(calls["config|resetstat"], 1);
        // 18 of the HGETs were the benchmark's polls.
        assert_eq!(split_calls(&calls, 18), (12, 40 - 18 + 7));
        // By name, per execution (10 of them), largest first, the same left out.
        let by_name = calls_by_name(&calls, 18, 10.0);
        assert_eq!(
            by_name,
            vec![
                ("hget".to_owned(), 2.2),
                ("evalsha".to_owned(), 1.0),
                ("zadd".to_owned(), 0.7),
                ("fcall".to_owned(), 0.2),
            ]
        );
    }
}
