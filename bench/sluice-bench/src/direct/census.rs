//! The census every correctness check reads: what Redis holds after a phase (rows by status,
//! queue entries, leases, dead letters, the shards' counters), found by SCAN on every node
//! rather than through sluice's own indexes, and each row's times for the latency phases.

use std::collections::BTreeMap;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncCommands, Value};
use sluice::domain::{TenantId, row};
use sluice::store::keys::{self, KeyKind};
use sluice::store::{Shard, ShardMap, WORKER_GROUP};

use super::Direct;
use crate::load::Latencies;

/// Rows read per pipeline when a phase's rows are read back.
const ROW_PAGE: usize = 5000;

/// What Redis holds, summed over shards and the benchmark's tenants.
#[derive(Debug, Default)]
pub struct Census {
    /// Execution rows (found by SCAN, not through any index).
    pub rows: u64,
    /// Rows on each node (in `Direct`'s node order), and of those the completed ones.
    pub rows_by_node: Vec<u64>,
    pub completed_by_node: Vec<u64>,
    /// Rows by `status` field.
    pub by_status: BTreeMap<String, u64>,
    /// Entries on the ready streams.
    pub ready: u64,
    /// Entries read by a worker and not acknowledged.
    pub pending: u64,
    /// Members of the tenants' waiting sets.
    pub waiting: u64,
    /// Members of the concurrency keys' queues (found by SCAN): keyed executions waiting
    /// for their key. Of each queue only the first, and only while its key has room, is also
    /// in its tenant's waiting set ...
    pub key_queued: u64,
    /// ... and these are those firsts: queued executions are `waiting + key_queued −
    /// key_heads_waiting`.
    pub key_heads_waiting: u64,
    pub leases: u64,
    pub delayed: u64,
    pub dead_letters: u64,
    /// The shards' `completed` counters.
    pub completed_counter: u64,
    /// Admission→completion times of completed rows (ms, from the rows' Redis-clock
    /// `created` and `finished`), and the span from the first admission to the last completion.
    pub e2e: Option<(Latencies, Duration)>,
}

/// One execution row's status and times (ms since the epoch, Redis clock), as the pickup and
/// cancel phases read them back.
#[derive(Debug, Clone)]
pub struct RowTimes {
    pub id: String,
    pub status: String,
    /// The tenant the row belongs to (the fairness phases tell their tenants apart by it).
    pub tenant: Option<String>,
    pub created: Option<u64>,
    pub started: Option<u64>,
    pub finished: Option<u64>,
    /// When the execution became runnable (its admission, or its due time when it was
    /// scheduled); absent on a build without scheduled starts.
    pub ready_at: Option<u64>,
    /// When a scheduled execution is (was) due; absent when it never was scheduled.
    pub run_at: Option<u64>,
}

impl Direct {
    /// The shards' `completed` counters, summed (cheap: for polling while workers drain).
    pub async fn completed(&mut self) -> anyhow::Result<u64> {
        let mut sum = 0;
        for shard in self.store.shards().all() {
            let n: Option<u64> = self.conn.hget(shard.stats(), "completed").await?;
            sum += n.unwrap_or(0);
        }
        Ok(sum)
    }

    /// One shard's queue sizes and `completed` counter, in one call to the master of its slot
    /// (all the shard's keys share its hash tag). Not `Store::queue_stats`, whose single
    /// pipeline over all shards a cluster refuses (cross-slot).
    async fn shard_counts(&mut self, s: Shard) -> anyhow::Result<ShardCounts> {
        let mut p = redis::pipe();
        p.xlen(s.ready())
            .exists(s.ready())
            .zcard(s.leases())
            .zcard(s.delayed())
            .xlen(s.dead_letters())
            .hget(s.stats(), "completed");
        let (ready, stream, leases, delayed, dead_letters, completed): (
            u64,
            bool,
            u64,
            u64,
            u64,
            Option<u64>,
        ) = p.query_async(&mut self.conn).await?;
        // Entries read and not acknowledged, when the shard has a ready stream (a build that
        // dispatches through ordered sets has none, and nothing pending: its running
        // executions are the leases). XPENDING's summary form: [count, first, last, consumers].
        let pending = if stream {
            let v: Value = redis::cmd("XPENDING")
                .arg(s.ready())
                .arg(WORKER_GROUP)
                .query_async(&mut self.conn)
                .await?;
            match v {
                Value::Array(v) => v
                    .first()
                    .map(redis::from_redis_value_ref::<u64>)
                    .transpose()?
                    .unwrap_or(0),
                _ => 0,
            }
        } else {
            0
        };
        Ok(ShardCounts {
            ready,
            pending,
            leases,
            delayed,
            dead_letters,
            completed: completed.unwrap_or(0),
        })
    }

    /// Counts what Redis holds. With `times`, also reads every completed row's admission and
    /// completion time.
    pub async fn census(&mut self, times: bool) -> anyhow::Result<Census> {
        let mut c = Census::default();
        let shards: ShardMap = self.store.shards();
        for shard in shards.all() {
            let s = self.shard_counts(shard).await?;
            c.ready += s.ready;
            c.pending += s.pending;
            c.leases += s.leases;
            c.delayed += s.delayed;
            c.dead_letters += s.dead_letters;
            c.completed_counter += s.completed;
        }
        for t in &self.tenants {
            let n: u64 = self.conn.zcard(shards.shard_of(t).waiting(t)).await?;
            c.waiting += n;
        }
        for node in &mut self.nodes {
            let (queued, heads) = key_queues(node).await?;
            c.key_queued += queued;
            c.key_heads_waiting += heads;
        }

        let mut e2e = Vec::new();
        let (mut first, mut last) = (u64::MAX, 0u64);
        for node in &mut self.nodes {
            let (mut rows_here, mut completed_here) = (0, 0);
            // Every key found is on this node, so one pipeline per page reads them.
            for keys in row_keys(node).await?.chunks(ROW_PAGE) {
                let rows: Vec<(Option<String>, Option<u64>, Option<u64>)> =
                    rows_page(keys, &[row::STATUS, row::CREATED, row::FINISHED])
                        .query_async(node)
                        .await?;
                for (status, created, finished) in rows {
                    let Some(status) = status else { continue }; // deleted between SCAN and HMGET
                    rows_here += 1;
                    if times && let (Some(a), Some(b)) = (created, finished) {
                        e2e.push((b.saturating_sub(a) * 1000).min(u64::from(u32::MAX)) as u32);
                        first = first.min(a);
                        last = last.max(b);
                    }
                    if status == "completed" {
                        completed_here += 1;
                    }
                    *c.by_status.entry(status).or_default() += 1;
                }
            }
            c.rows += rows_here;
            c.rows_by_node.push(rows_here);
            c.completed_by_node.push(completed_here);
        }
        if times {
            let span = Duration::from_millis(last.saturating_sub(first.min(last)));
            c.e2e = Some((Latencies::new(e2e), span));
        }
        Ok(c)
    }

    /// Every execution row with its status and times, found by SCAN on every node (not
    /// through an index).
    pub async fn row_times(&mut self) -> anyhow::Result<Vec<RowTimes>> {
        let mut out = Vec::new();
        for node in &mut self.nodes {
            for keys in row_keys(node).await?.chunks(ROW_PAGE) {
                type Row = (
                    Option<String>,
                    Option<u64>,
                    Option<u64>,
                    Option<u64>,
                    Option<String>,
                    Option<u64>,
                    Option<u64>,
                );
                let fields = [
                    row::STATUS,
                    row::CREATED,
                    row::STARTED,
                    row::FINISHED,
                    row::TENANT,
                    row::READY_AT,
                    row::RUN_AT,
                ];
                let rows: Vec<Row> = rows_page(keys, &fields).query_async(node).await?;
                for (k, (status, created, started, finished, tenant, ready_at, run_at)) in
                    keys.iter().zip(rows)
                {
                    let (Some(status), Some(id)) = (status, row_id(k)) else {
                        continue; // deleted between SCAN and HMGET
                    };
                    out.push(RowTimes {
                        id,
                        status,
                        tenant,
                        created,
                        started,
                        finished,
                        ready_at,
                        run_at,
                    });
                }
            }
        }
        Ok(out)
    }
}

/// One shard's queue sizes.
struct ShardCounts {
    ready: u64,
    pending: u64,
    leases: u64,
    delayed: u64,
    dead_letters: u64,
    completed: u64,
}

/// On one node: the members of every concurrency key's queue, and how many of the queues'
/// firsts are also in their tenant's waiting set. The queues are found by SCAN (every key,
/// read back by `keys::parse`: no other code matches key names). Bounded like `row_keys`.
async fn key_queues(node: &mut MultiplexedConnection) -> anyhow::Result<(u64, u64)> {
    let mut queues = Vec::new();
    let mut cursor = 0u64;
    for _ in 0..10_000_000 {
        // Bytes: a layout-5 row's name holds a binary id (a queue's never does).
        let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("COUNT")
            .arg(ROW_PAGE)
            .query_async(node)
            .await?;
        queues.extend(
            keys.into_iter()
                .filter_map(|k| String::from_utf8(k).ok())
                .filter(|k| keys::parse(k).is_some_and(|n| n.kind == KeyKind::KeyQueue)),
        );
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    let (mut queued, mut heads) = (0u64, 0u64);
    for page in queues.chunks(ROW_PAGE) {
        let mut p = redis::pipe();
        for q in page {
            p.zcard(q).cmd("ZRANGE").arg(q).arg(0).arg(0);
        }
        let v: Vec<(u64, Vec<Vec<u8>>)> = {
            let flat: Vec<Value> = p.query_async(node).await?;
            flat.chunks(2)
                .map(|pair| -> anyhow::Result<(u64, Vec<Vec<u8>>)> {
                    Ok((
                        redis::from_redis_value_ref(&pair[0])?,
                        redis::from_redis_value_ref(&pair[1])?,
                    ))
                })
                .collect::<anyhow::Result<_>>()?
        };
        let mut p = redis::pipe();
        let mut asked = 0;
        for (q, (n, first)) in page.iter().zip(&v) {
            queued += n;
            let (Some(name), Some(first)) = (keys::parse(q), first.first()) else {
                continue;
            };
            let (Some(shard), Some(t)) = (name.shard, name.tenant) else {
                continue;
            };
            let t = TenantId::parse(t).map_err(|e| anyhow::anyhow!("tenant {t}: {}", e.detail))?;
            p.zscore(shard.waiting(&t), first);
            asked += 1;
        }
        if asked > 0 {
            let scores: Vec<Option<f64>> = p.query_async(node).await?;
            heads += scores.iter().filter(|s| s.is_some()).count() as u64;
        }
    }
    Ok((queued, heads))
}

/// The execution id (hex) a row's name holds, in either stored form: the bytes after the
/// first `}:exec:` (the hash tag holds no `}`), 32 hex digits or 16 bytes (layout 5).
fn row_id(key: &[u8]) -> Option<String> {
    let at = key.windows(7).position(|w| w == b"}:exec:")?;
    let id = sluice::domain::ExecutionId::from_reply(&key[at + 7..]).ok()?;
    Some(id.as_str().to_owned())
}

/// One pipeline reading `fields` of every row of `keys` (a page of `row_keys`, all on one
/// node).
fn rows_page(keys: &[Vec<u8>], fields: &[&str]) -> redis::Pipeline {
    let mut p = redis::pipe();
    for k in keys {
        p.cmd("HMGET").arg(k).arg(fields);
    }
    p
}

/// The names of every execution row on one node, found by SCAN (not through an index).
/// Bounded: SCAN ends when its cursor returns to 0; the cap guards against a server bug.
async fn row_keys(node: &mut MultiplexedConnection) -> anyhow::Result<Vec<Vec<u8>>> {
    let mut all = Vec::new();
    let mut cursor = 0u64;
    for _ in 0..10_000_000 {
        // Bytes: a layout-5 row's name holds a binary id.
        let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(keys::row_pattern())
            .arg("COUNT")
            .arg(ROW_PAGE)
            .query_async(node)
            .await?;
        all.extend(keys);
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    Ok(all)
}
