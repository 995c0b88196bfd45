//! What the benchmark does on Redis itself, without HTTP: the admission *ceiling* (sluice's own
//! `Store::admit`, i.e. one EVALSHA of `admit.lua` with the server's argument shape), the fast
//! fill for the memory measurement, the reset between phases, and the census every correctness
//! check reads (rows, queue entries, leases, dead letters).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use redis::aio::MultiplexedConnection;
use serde_json::json;
use sluice::admission::{AdmitInput, AdmitRequest, TenantId};
use sluice::store::keys::{self, KeyKind};
use sluice::store::{Admission, ShardMap, ShardStats, Store, StoreConfig};
use tokio::task::JoinSet;

use crate::load::{Latencies, LoadResult, Outcomes, Progress};

/// The benchmark's own handle on Redis: a `Store` configured like the server's, plus a plain
/// connection for the census.
pub struct Direct {
    config: StoreConfig,
    store: Arc<Store>,
    conn: MultiplexedConnection,
    tenants: Vec<TenantId>,
}

/// When a direct load stops.
#[derive(Clone, Copy)]
pub enum Until {
    Elapsed(Duration),
    /// This many admissions, or fewer if the time runs out first.
    Count(u64, Duration),
}

/// What Redis holds, summed over shards and the benchmark's tenants.
#[derive(Debug, Default)]
pub struct Census {
    /// Execution rows (found by SCAN, not through any index).
    pub rows: u64,
    /// Rows by `status` field.
    pub by_status: BTreeMap<String, u64>,
    /// Entries on the ready streams.
    pub ready: u64,
    /// Entries read by a worker and not acknowledged.
    pub pending: u64,
    /// Members of the tenants' waiting sets.
    pub waiting: u64,
    pub leases: u64,
    pub delayed: u64,
    pub dead_letters: u64,
    /// The shards' `completed` counters.
    pub completed_counter: u64,
    /// Admission→completion times of completed rows (ms, from the rows' Redis-clock
    /// `created` and `finished`), and the span from the first admission to the last completion.
    pub e2e: Option<(Latencies, Duration)>,
}

impl Direct {
    /// Connects with the server's data policy.
    pub async fn connect(config: StoreConfig, tenants: &[String]) -> anyhow::Result<Self> {
        let store = Store::connect(config.clone()).await?;
        let sluice::store::RedisTarget::Standalone(url) = &config.redis else {
            anyhow::bail!("the benchmark runs on standalone redis");
        };
        let conn = redis::Client::open(url.as_str())?
            .get_multiplexed_async_connection()
            .await?;
        let tenants = tenants
            .iter()
            .map(|t| TenantId::parse(t).map_err(|e| anyhow::anyhow!("tenant {t}: {}", e.detail)))
            .collect::<anyhow::Result<_>>()?;
        Ok(Self {
            config,
            store: Arc::new(store),
            conn,
            tenants,
        })
    }

    /// Empties Redis and sets it up as a first `sluice serve` start would (meta record, scripts,
    /// published defaults, consumer groups), so each phase starts from the same state.
    pub async fn reset(&mut self) -> anyhow::Result<()> {
        let () = redis::cmd("FLUSHALL")
            .arg("SYNC")
            .query_async(&mut self.conn)
            .await?;
        let store = Store::connect(self.config.clone()).await?;
        store.publish_defaults().await?;
        store.ensure_groups().await?;
        self.store = Arc::new(store);
        let () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut self.conn)
            .await?;
        Ok(())
    }

    /// Microseconds Redis spent running scripts (EVALSHA, EVAL) since the last `reset`, by its
    /// own `INFO commandstats`: Redis's CPU cost of the phase's work, unaffected by how busy
    /// the rest of the machine is.
    pub async fn script_usec(&mut self) -> anyhow::Result<u64> {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut self.conn)
            .await?;
        Ok(info
            .lines()
            .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
            .filter_map(|l| {
                l.split(',')
                    .find_map(|f| f.strip_prefix("usec="))
                    .and_then(|v| v.parse::<u64>().ok())
            })
            .sum())
    }

    /// Admits `{"flow_id":"demo.echo","params":{"n":i}}` (with a unique dedup key when `dedup`)
    /// through `Store::admit` from `clients` tasks at once, until `until`.
    pub async fn admit_loop(
        &self,
        clients: usize,
        until: Until,
        tag: &str,
        dedup: bool,
        progress: Arc<Progress>,
    ) -> anyhow::Result<LoadResult> {
        let start = Instant::now();
        let next = Arc::new(AtomicU64::new(0));
        let mut set = JoinSet::new();
        for _ in 0..clients {
            let (store, next, progress) = (self.store.clone(), next.clone(), progress.clone());
            let tenants = self.tenants.clone();
            let tag = tag.to_owned();
            set.spawn(async move {
                let mut out = Outcomes::default();
                let mut lat = Vec::with_capacity(4096);
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let more = match until {
                        Until::Elapsed(d) => start.elapsed() < d,
                        Until::Count(n, d) => i < n && start.elapsed() < d,
                    };
                    if !more {
                        break;
                    }
                    let t = Instant::now();
                    let key = format!("{tag}-{i}");
                    let body = AdmitInput {
                        flow_id: "demo.echo".into(),
                        version: None,
                        params: Some(json!({ "n": i })),
                        dedup_key: None,
                        max_attempts: None,
                    };
                    let tenant = &tenants[i as usize % tenants.len()];
                    let ok = match AdmitRequest::parse(body, dedup.then_some(key.as_str()), 5) {
                        Ok(req) => {
                            matches!(store.admit(tenant, &req).await, Ok(Admission::Created(_)))
                        }
                        Err(_) => false,
                    };
                    lat.push(t.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
                    if ok {
                        out.created += 1;
                    } else {
                        out.errors += 1;
                        progress.errors.fetch_add(1, Ordering::Relaxed);
                    }
                    progress.done.fetch_add(1, Ordering::Relaxed);
                }
                (out, lat)
            });
        }
        let mut outcomes = Outcomes::default();
        let mut all = Vec::new();
        while let Some(r) = set.join_next().await {
            let (o, lat) = r.context("a direct client failed")?;
            outcomes.created += o.created;
            outcomes.errors += o.errors;
            all.extend(lat);
        }
        Ok(LoadResult {
            outcomes,
            latencies: Latencies::new(all),
            elapsed: start.elapsed(),
        })
    }

    /// Redis's `used_memory`, bytes.
    pub async fn used_memory(&mut self) -> anyhow::Result<u64> {
        let info: String = redis::cmd("INFO")
            .arg("memory")
            .query_async(&mut self.conn)
            .await?;
        info.lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|v| v.trim().parse().ok())
            .context("INFO memory has no used_memory")
    }

    /// `MEMORY USAGE` of every key summed by kind (rows, dedup mappings, status and flow
    /// indexes, slot sets, ready streams, the rest): where the memory of an execution goes.
    /// Excludes the keyspace's own hash tables (bucket arrays, the TTL table), so the sum is a
    /// little under the `used_memory` growth.
    pub async fn memory_by_kind(&mut self) -> anyhow::Result<BTreeMap<&'static str, u64>> {
        let mut out = BTreeMap::new();
        let mut cursor = 0u64;
        // Bounded like `census`.
        for _ in 0..10_000_000 {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("COUNT")
                .arg(5000)
                .query_async(&mut self.conn)
                .await?;
            let mut p = redis::pipe();
            for k in &keys {
                p.cmd("MEMORY").arg("USAGE").arg(k).arg("SAMPLES").arg(0);
            }
            let sizes: Vec<Option<u64>> = p.query_async(&mut self.conn).await?;
            for (k, size) in keys.iter().zip(sizes) {
                *out.entry(key_kind(k)).or_default() += size.unwrap_or(0);
            }
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
        Ok(out)
    }

    /// The shards' `completed` counters, summed (cheap: for polling while workers drain).
    pub async fn completed(&self) -> anyhow::Result<u64> {
        Ok(self
            .shard_stats()
            .await?
            .iter()
            .map(|s| s.counters.get("completed").copied().unwrap_or(0))
            .sum())
    }

    /// Every shard's statistics; an error when any shard did not answer (a census counts all).
    async fn shard_stats(&self) -> anyhow::Result<Vec<ShardStats>> {
        let mut out = Vec::new();
        for report in self.store.queue_stats().await {
            out.push(
                report
                    .stats
                    .with_context(|| format!("shard {}", report.shard.label()))?,
            );
        }
        Ok(out)
    }

    /// Counts what Redis holds. With `times`, also reads every completed row's admission and
    /// completion time.
    pub async fn census(&mut self, times: bool) -> anyhow::Result<Census> {
        let mut c = Census::default();
        for s in self.shard_stats().await? {
            c.ready += s.ready;
            c.pending += s.pending;
            c.leases += s.leases;
            c.delayed += s.delayed;
            c.dead_letters += s.dead_letters;
            c.completed_counter += s.counters.get("completed").copied().unwrap_or(0);
        }
        let shards: ShardMap = self.store.shards();
        let mut p = redis::pipe();
        for t in &self.tenants {
            p.zcard(shards.shard_of(t).waiting(t));
        }
        let waiting: Vec<u64> = p.query_async(&mut self.conn).await?;
        c.waiting = waiting.iter().sum();

        let mut e2e = Vec::new();
        let (mut first, mut last) = (u64::MAX, 0u64);
        let mut cursor = 0u64;
        // Bounded: SCAN ends when the cursor returns to 0; the cap guards against a server bug.
        for _ in 0..10_000_000 {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(keys::row_pattern())
                .arg("COUNT")
                .arg(5000)
                .query_async(&mut self.conn)
                .await?;
            let mut p = redis::pipe();
            for k in &keys {
                p.cmd("HMGET")
                    .arg(k)
                    .arg("status")
                    .arg("created")
                    .arg("finished");
            }
            let rows: Vec<(Option<String>, Option<u64>, Option<u64>)> =
                p.query_async(&mut self.conn).await?;
            for (status, created, finished) in rows {
                let Some(status) = status else { continue }; // deleted between SCAN and HMGET
                c.rows += 1;
                if times && let (Some(a), Some(b)) = (created, finished) {
                    e2e.push((b.saturating_sub(a) * 1000).min(u64::from(u32::MAX)) as u32);
                    first = first.min(a);
                    last = last.max(b);
                }
                *c.by_status.entry(status).or_default() += 1;
            }
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
        if times {
            let span = Duration::from_millis(last.saturating_sub(first.min(last)));
            c.e2e = Some((Latencies::new(e2e), span));
        }
        Ok(c)
    }
}

/// The kind of a sluice key, as the keys module reads it back.
fn key_kind(k: &str) -> &'static str {
    match keys::parse(k).map(|n| n.kind) {
        Some(KeyKind::Row) => "rows",
        Some(KeyKind::Dedup) => "dedup mappings",
        Some(KeyKind::StatusIndex) => "status indexes",
        Some(KeyKind::FlowIndex) => "flow indexes",
        Some(KeyKind::Slots) => "slot sets",
        Some(KeyKind::Waiting) => "waiting sets",
        Some(KeyKind::Ready) => "ready streams",
        _ => "other",
    }
}
