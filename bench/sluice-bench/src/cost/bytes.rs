//! Bytes per execution: each figure on a fresh default-config redis-server (sluice's also on a
//! local cluster), 8 warm-up executions, `used_memory`, then `--cost-count` more (queued, or
//! completed by a worker and kept), `used_memory` again: (after − before) / N. Every key's
//! `MEMORY USAGE ... SAMPLES 0` is summed per key kind before and after (sluice's kinds from
//! `sluice::store::keys::parse`, BullMQ's from its key names), the growth per kind divided by
//! N, and what `used_memory` grew beyond the kinds is keyspace overhead (the main dictionary's
//! buckets, the expires table). Each kind's `OBJECT ENCODING`s are counted, and a hash or a
//! sorted set that is not listpack is flagged (`CONVERTED` in the report, by kind: a dedup
//! bucket of a tenant with more live mappings than its buckets hold shows as `DedupBucket`):
//! "small" when it holds at most Redis's default entries for listpack (512 for a hash, 128 for
//! a sorted set; so a value over 64 bytes converted it), else too big under the defaults.
//!
//! Long on purpose: sluice's and BullMQ's figures share the scan, the kinds and the arithmetic,
//! and read best side by side; the unit tests close the file.

use std::collections::BTreeMap;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use serde::Serialize;
use sluice::store::keys;

use super::{CostReport, Ctx, connect, info, peer, wait_completed, with_progress};
use crate::direct::{Direct, Until};
use crate::harness::{sluice_cmd, store_config};
use crate::procs;
use crate::report::Check;

/// Params sizes measured queued: the issue's ~30 bytes (the target) and 200 bytes.
const PARAMS: [usize; 2] = [30, 200];
/// Executions admitted before the first read: the tenants' own structures exist by then.
const WARM_UP: u64 = 8;
/// Redis's default `hash-max-listpack-entries` (512) and `zset-max-listpack-entries` (128).
fn listpack_entries(redis_type: &str) -> u64 {
    if redis_type == "hash" { 512 } else { 128 }
}

/// One bytes figure.
#[derive(Debug, Clone, Serialize)]
pub struct BytesPoint {
    /// `sluice`, `sluice, cluster of 3` or `BullMQ`.
    pub system: String,
    /// `queued` or `completed`.
    pub state: &'static str,
    pub params_bytes: usize,
    pub executions: u64,
    pub used_memory_growth: i64,
    pub bytes_per_execution: f64,
    /// Growth per execution by key kind, largest first.
    pub by_kind: Vec<KindBytes>,
    /// `used_memory` growth not in any key's `MEMORY USAGE`, per execution.
    pub keyspace_overhead: f64,
    /// Every kind's encodings after the fill.
    pub encodings: Vec<KindEncoding>,
}

/// One key kind's share of a bytes figure.
#[derive(Debug, Clone, Serialize)]
pub struct KindBytes {
    pub kind: String,
    /// Keys of this kind added.
    pub keys_added: i64,
    pub bytes_per_execution: f64,
}

/// One key kind's encodings.
#[derive(Debug, Clone, Serialize)]
pub struct KindEncoding {
    pub kind: String,
    pub redis_type: String,
    /// Keys by `OBJECT ENCODING`.
    pub encodings: BTreeMap<String, u64>,
    /// Hashes and sorted sets that are not listpack ...
    pub converted: u64,
    /// ... of them with at most the default entries (512 for a hash, 128 for a sorted set):
    /// converted by a value over 64 bytes.
    pub converted_small: u64,
}

/// What one node (or all) holds per kind.
#[derive(Debug, Default, Clone)]
struct KindStat {
    keys: u64,
    bytes: u64,
    redis_type: String,
    encodings: BTreeMap<String, u64>,
    converted: u64,
    converted_small: u64,
}

/// The bytes figures: sluice queued (each params size), completed, on a cluster; BullMQ the
/// same (not on a cluster).
pub(super) async fn measure(ctx: &Ctx<'_>, report: &mut CostReport) -> anyhow::Result<()> {
    let args = ctx.args;
    for params in PARAMS {
        let (p, check) = sluice_point(ctx, false, false, params, args.cost_count).await?;
        report.bytes.push(p);
        report.checks.push(check);
    }
    let (p, check) = sluice_point(ctx, false, true, PARAMS[0], args.cost_completed_count).await?;
    report.bytes.push(p);
    report.checks.push(check);
    if !args.cost_skip_cluster {
        let (p, check) = sluice_point(ctx, true, false, PARAMS[0], args.cost_count).await?;
        report.bytes.push(p);
        report.checks.push(check);
    }
    if ctx.peer.is_err() {
        return Ok(());
    }
    for params in PARAMS {
        let (p, check) = bullmq_point(ctx, report, false, params, args.cost_count).await?;
        report.bytes.push(p);
        report.checks.push(check);
    }
    let (p, check) = bullmq_point(ctx, report, true, PARAMS[0], args.cost_completed_count).await?;
    report.bytes.push(p);
    report.checks.push(check);
    Ok(())
}

/// sluice's figure: admitted through sluice's own `Store::admit` (the server's script and
/// arguments, without HTTP in between: the bytes are the script's), a unique dedup key each;
/// with `completed`, a `sluice worker --concurrency 256` runs them meanwhile.
async fn sluice_point(
    ctx: &Ctx<'_>,
    cluster: bool,
    completed: bool,
    params: usize,
    count: u64,
) -> anyhow::Result<(BytesPoint, Check)> {
    let args = ctx.args;
    let redis = if cluster {
        procs::start_cluster(&args.redis_server, ctx.scratch, args.cluster_masters).await?
    } else {
        procs::start_redis(&args.redis_server, ctx.scratch).await?
    };
    let mut system = if cluster {
        format!("sluice, cluster of {}", args.cluster_masters)
    } else {
        "sluice".to_owned()
    };
    if args.cost_layout != sluice::store::Layout::CURRENT.number() {
        system.push_str(&format!(", layout {}", args.cost_layout));
    }
    let state = if completed { "completed" } else { "queued" };
    let name = format!("bytes: {system}, {state}, {params} B params");
    eprintln!("[cost] {name}: {count} executions");
    let mut config = store_config(args, redis.target());
    // The fresh Redis records `--cost-layout` at the store's first start (the worker serves
    // what it records).
    config.initial_layout = sluice::store::Layout::from_number(args.cost_layout);
    let mut direct = Direct::connect(config, &ctx.tenants, &redis.urls).await?;
    direct.reset().await?;
    let mut worker = None;
    if completed {
        let cmd = sluice_cmd(args, &ctx.program, redis.target());
        let extra = ["--concurrency".to_owned(), "256".to_owned()];
        let mut w = vec![procs::start_worker(
            &cmd,
            ctx.scratch,
            "cost-worker",
            &extra,
        )?];
        procs::wait_started(&mut w).await?;
        worker = w.pop();
    }
    let limit = Duration::from_secs(args.cost_drain_secs);
    let clients = args.clients.max(1);
    let warm = with_progress(&name, |p| {
        direct.admit_sized(
            clients,
            Until::Count(WARM_UP, limit),
            "warm",
            true,
            Some(params),
            p,
        )
    })
    .await?;
    if completed {
        wait_completed(&mut direct, WARM_UP, limit).await?;
    }
    let before = direct.used_memory().await?;
    let kinds_before = scan_all(direct.nodes_mut(), &sluice_kind).await?;
    let r = with_progress(&name, |p| {
        direct.admit_sized(
            clients,
            Until::Count(count, limit),
            "mem",
            true,
            Some(params),
            p,
        )
    })
    .await?;
    let mut done = 0;
    if completed {
        done = wait_completed(&mut direct, WARM_UP + r.outcomes.created, limit)
            .await?
            .0;
    }
    let after = direct.used_memory().await?;
    let kinds_after = scan_all(direct.nodes_mut(), &sluice_kind).await?;
    let census = direct.census(false).await?;
    if let Some(w) = worker {
        w.kill().await;
    }
    redis.kill().await;
    let admitted = warm.outcomes.created + r.outcomes.created;
    let in_state = census.by_status.get(state).copied().unwrap_or(0);
    let ok = warm.outcomes.errors == 0
        && r.outcomes.errors == 0
        && r.outcomes.created == count
        && census.rows == admitted
        && in_state == admitted
        && (!completed || done == admitted);
    let check = Check {
        phase: name,
        ok,
        detail: format!(
            "admitted={admitted} of {} errors={}; rows={} {state}={in_state}",
            count + WARM_UP,
            warm.outcomes.errors + r.outcomes.errors,
            census.rows
        ),
    };
    let point = point(
        system,
        state,
        params,
        r.outcomes.created,
        (before, after),
        &kinds_before,
        &kinds_after,
    );
    Ok((point, check))
}

/// BullMQ's figure: `Queue.add(name, data, { jobId })` over the tenants' queues (the peer's
/// filler, which exits before each read); with `completed`, its drain completes them (and
/// exits) before the read.
async fn bullmq_point(
    ctx: &Ctx<'_>,
    report: &mut CostReport,
    completed: bool,
    params: usize,
    count: u64,
) -> anyhow::Result<(BytesPoint, Check)> {
    let args = ctx.args;
    let state = if completed { "completed" } else { "queued" };
    let name = format!("bytes: BullMQ, {state}, {params} B params");
    eprintln!("[cost] {name}: {count} jobs");
    let redis = procs::start_redis_named(&args.redis_server, ctx.scratch, "redis-bullmq").await?;
    let port = crate::bullmq::port_of(&redis)?;
    let mut conn = connect(&redis.urls[0]).await?;
    let limit = Duration::from_secs(args.cost_drain_secs);
    let (warm, warm_drained) =
        bullmq_fill(ctx, &port, completed, "warm", WARM_UP, params, limit).await?;
    let before = used_memory(&mut conn).await?;
    let kinds_before = scan_all(std::slice::from_mut(&mut conn), &bullmq_kind).await?;
    let (filled, drained) = bullmq_fill(ctx, &port, completed, "mem", count, params, limit).await?;
    let after = used_memory(&mut conn).await?;
    let kinds_after = scan_all(std::slice::from_mut(&mut conn), &bullmq_kind).await?;
    drop(conn);
    redis.kill().await;
    report
        .peer_versions
        .get_or_insert_with(|| filled.versions());
    let done = |d: &Option<peer::Drained>| d.as_ref().map_or(0, |d| d.completed);
    let ok = warm.errors == 0
        && filled.errors == 0
        && filled.added == count
        && (!completed || (done(&warm_drained) == WARM_UP && done(&drained) == count));
    let check = Check {
        phase: name,
        ok,
        detail: format!(
            "added={} of {} errors={}{}",
            warm.added + filled.added,
            count + WARM_UP,
            warm.errors + filled.errors,
            if completed {
                format!(
                    "; completed={} failed={}",
                    done(&warm_drained) + done(&drained),
                    drained.as_ref().map_or(0, |d| d.failed)
                )
            } else {
                String::new()
            }
        ),
    };
    let point = point(
        "BullMQ".to_owned(),
        state,
        params,
        filled.added,
        (before, after),
        &kinds_before,
        &kinds_after,
    );
    Ok((point, check))
}

/// The peer's filler adds `n` jobs tagged `tag`; with `completed`, its drain (started first)
/// completes them.
async fn bullmq_fill(
    ctx: &Ctx<'_>,
    port: &str,
    completed: bool,
    tag: &str,
    n: u64,
    params: usize,
    limit: Duration,
) -> anyhow::Result<(peer::Filled, Option<peer::Drained>)> {
    let drain = if completed {
        Some(peer::Drain::start(ctx, port, n).await?)
    } else {
        None
    };
    let filled = peer::fill(ctx, port, tag, n, params, limit).await?;
    let drained = match drain {
        Some(d) => Some(d.finish().await?),
        None => None,
    };
    Ok((filled, drained))
}

/// The figure from the two reads and the two scans.
fn point(
    system: String,
    state: &'static str,
    params_bytes: usize,
    executions: u64,
    (before, after): (u64, u64),
    kinds_before: &BTreeMap<String, KindStat>,
    kinds_after: &BTreeMap<String, KindStat>,
) -> BytesPoint {
    let n = executions.max(1) as f64;
    let growth = after as i64 - before as i64;
    let mut by_kind: Vec<KindBytes> = Vec::new();
    let mut in_kinds = 0i64;
    for (kind, a) in kinds_after {
        let b = kinds_before.get(kind).cloned().unwrap_or_default();
        let bytes = a.bytes as i64 - b.bytes as i64;
        in_kinds += bytes;
        by_kind.push(KindBytes {
            kind: kind.clone(),
            keys_added: a.keys as i64 - b.keys as i64,
            bytes_per_execution: round1(bytes as f64 / n),
        });
    }
    by_kind.sort_by(|a, b| b.bytes_per_execution.total_cmp(&a.bytes_per_execution));
    let encodings = kinds_after
        .iter()
        .map(|(kind, s)| KindEncoding {
            kind: kind.clone(),
            redis_type: s.redis_type.clone(),
            encodings: s.encodings.clone(),
            converted: s.converted,
            converted_small: s.converted_small,
        })
        .collect();
    BytesPoint {
        system,
        state,
        params_bytes,
        executions,
        used_memory_growth: growth,
        bytes_per_execution: round1(growth as f64 / n),
        by_kind,
        keyspace_overhead: round1((growth - in_kinds) as f64 / n),
        encodings,
    }
}

fn round1(v: f64) -> f64 {
    (v * 10.0).round() / 10.0
}

/// `used_memory` of one node.
async fn used_memory(conn: &mut MultiplexedConnection) -> anyhow::Result<u64> {
    let text = info(conn, "memory").await?;
    text.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| anyhow::anyhow!("INFO memory has no used_memory"))
}

/// A sluice key's kind: the keys module's own name for it (`Row`, `Dedup`, `StatusIndex`,
/// ...), so a new layout's kinds are reported as they come.
fn sluice_kind(key: &str) -> String {
    keys::parse(key).map_or_else(|| "other".to_owned(), |n| format!("{:?}", n.kind))
}

/// A BullMQ key's kind: `bull:<queue>:<rest>`; a job's own keys (its id is `warm-<k>` or
/// `mem-<k>`, the filler's tags) are `job` (and `job:logs`, ...), the queue's are named by
/// their first part (`wait`, `events`, `meta`, `completed`, ...).
fn bullmq_kind(key: &str) -> String {
    let Some(rest) = key
        .strip_prefix("bull:")
        .and_then(|r| r.split_once(':'))
        .map(|(_, rest)| rest)
    else {
        return "other".to_owned();
    };
    let mut parts = rest.splitn(2, ':');
    let first = parts.next().unwrap_or_default();
    let is_job = ["warm-", "mem-"].iter().any(|t| first.starts_with(t));
    match (is_job, parts.next()) {
        (true, None) => "job".to_owned(),
        (true, Some(sub)) => format!("job:{sub}"),
        (false, _) => first.to_owned(),
    }
}

/// Every key of every node: `MEMORY USAGE`, `TYPE`, `OBJECT ENCODING` summed per kind, and
/// the entries of each hash or sorted set that is not listpack.
async fn scan_all(
    nodes: &mut [MultiplexedConnection],
    kind_of: &dyn Fn(&str) -> String,
) -> anyhow::Result<BTreeMap<String, KindStat>> {
    let mut out: BTreeMap<String, KindStat> = BTreeMap::new();
    for node in nodes {
        let mut cursor = 0u64;
        // Bounded: SCAN ends when its cursor returns to 0; the cap guards against a bug.
        for _ in 0..10_000_000 {
            // Bytes: a layout-5 name holds a binary id (its kind is read from its text part).
            let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("COUNT")
                .arg(2000)
                .query_async(node)
                .await?;
            if !keys.is_empty() {
                scan_page(node, &keys, kind_of, &mut out).await?;
            }
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
    }
    Ok(out)
}

async fn scan_page(
    node: &mut MultiplexedConnection,
    keys: &[Vec<u8>],
    kind_of: &dyn Fn(&str) -> String,
    out: &mut BTreeMap<String, KindStat>,
) -> anyhow::Result<()> {
    let mut p = redis::pipe();
    for k in keys {
        p.cmd("MEMORY").arg("USAGE").arg(k).arg("SAMPLES").arg(0);
        p.cmd("TYPE").arg(k);
        p.cmd("OBJECT").arg("ENCODING").arg(k);
    }
    let v: Vec<redis::Value> = p.query_async(node).await?;
    let mut converted = Vec::new();
    for (k, chunk) in keys.iter().zip(v.chunks(3)) {
        let bytes: Option<u64> = redis::from_redis_value_ref(&chunk[0])?;
        let redis_type: String = redis::from_redis_value_ref(&chunk[1])?;
        let encoding: Option<String> = redis::from_redis_value_ref(&chunk[2])?;
        let (Some(bytes), Some(encoding)) = (bytes, encoding) else {
            continue; // gone between SCAN and the pipeline
        };
        let kind = kind_of(&String::from_utf8_lossy(k));
        let s = out.entry(kind.clone()).or_default();
        s.keys += 1;
        s.bytes += bytes;
        s.redis_type.clone_from(&redis_type);
        *s.encodings.entry(encoding.clone()).or_default() += 1;
        let len_cmd = match (redis_type.as_str(), encoding.as_str()) {
            ("hash", "hashtable") => Some("HLEN"),
            ("zset", "skiplist") => Some("ZCARD"),
            _ => None,
        };
        if let Some(cmd) = len_cmd {
            s.converted += 1;
            converted.push((kind, cmd, k, listpack_entries(&redis_type)));
        }
    }
    if converted.is_empty() {
        return Ok(());
    }
    let mut p = redis::pipe();
    for (_, cmd, k, _) in &converted {
        p.cmd(cmd).arg(*k);
    }
    let lens: Vec<u64> = p.query_async(node).await?;
    for ((kind, _, _, limit), len) in converted.iter().zip(lens) {
        if len <= *limit
            && let Some(s) = out.get_mut(kind)
        {
            s.converted_small += 1;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bullmq_keys_are_told_apart_by_their_names() {
        assert_eq!(bullmq_kind("bull:t-bench-t0:mem-17"), "job");
        assert_eq!(bullmq_kind("bull:t-bench-t0:warm-3:logs"), "job:logs");
        assert_eq!(bullmq_kind("bull:t-bench-t0:wait"), "wait");
        assert_eq!(bullmq_kind("bull:t-bench-t0:events"), "events");
        assert_eq!(
            bullmq_kind("bull:t-bench-t0:stalled-check"),
            "stalled-check"
        );
        assert_eq!(bullmq_kind("something"), "other");
    }

    #[test]
    fn sluice_keys_are_named_by_the_keys_module() {
        assert_eq!(sluice_kind("sluice:{s03.7}:exec:0123"), "Row");
        assert_eq!(sluice_kind("sluice:{s03.7}:t:acme:dd:abcd"), "Dedup");
        assert_eq!(sluice_kind("sluice:{s03.7}:t:acme:ddb:ab"), "DedupBucket");
        assert_eq!(sluice_kind("unrelated"), "other");
    }

    #[test]
    fn the_rest_of_the_growth_is_keyspace_overhead() {
        let stat = |keys, bytes| KindStat {
            keys,
            bytes,
            redis_type: "hash".into(),
            ..KindStat::default()
        };
        let before = BTreeMap::from([("Row".to_owned(), stat(8, 800))]);
        let after = BTreeMap::from([
            ("Row".to_owned(), stat(108, 10_800)),
            ("Dedup".to_owned(), stat(100, 5_000)),
        ]);
        let p = point(
            "x".into(),
            "queued",
            30,
            100,
            (1_000, 17_000),
            &before,
            &after,
        );
        assert_eq!(p.bytes_per_execution, 160.0);
        assert_eq!(p.by_kind[0].kind, "Row");
        assert_eq!(p.by_kind[0].bytes_per_execution, 100.0);
        assert_eq!(p.by_kind[1].bytes_per_execution, 50.0);
        assert_eq!(p.keyspace_overhead, 10.0);
    }
}
