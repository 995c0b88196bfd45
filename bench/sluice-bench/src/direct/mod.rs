//! What the benchmark does on Redis itself, without HTTP: the admission *ceiling* (sluice's own
//! `Store::admit`, i.e. one EVALSHA of `admit.lua` with the server's argument shape), the fast
//! fill for the memory measurement, the reset between phases, and the census every correctness
//! check reads (rows, queue entries, leases, dead letters; `census.rs`).
//!
//! The same on a Redis Cluster: what names a key goes through `sluice::store::Conn` (routed to
//! the master of the key's slot, one shard's keys at a time, since every key of a shard shares
//! its hash tag); what is node-wide (FLUSHALL, CONFIG RESETSTAT, INFO, SCAN) goes to every
//! master over its own connection and is summed, or kept per master where the report says so.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use redis::aio::MultiplexedConnection;
use redis::{AsyncCommands, Value};
use serde_json::json;
use sluice::domain::{AdmitInput, AdmitRequest, TenantId};
use sluice::store::keys::{self, KeyKind};
use sluice::store::{Admission, Conn, Shard, Store, StoreConfig};
use tokio::task::JoinSet;

mod census;
mod dlq;

pub use census::{Census, RowTimes};

use crate::load::{Latencies, LoadResult, Outcomes, Progress};

/// The benchmark's own handle on Redis: a `Store` configured like the server's, plus
/// connections for the census.
pub struct Direct {
    config: StoreConfig,
    store: Arc<Store>,
    /// Routed by key (on a cluster, to the master serving the key's slot).
    conn: Conn,
    /// One connection to each node (the server, or every master of a cluster), for commands
    /// that act on one node's whole keyspace.
    nodes: Vec<MultiplexedConnection>,
    /// `127.0.0.1:<port>` of each node, in `nodes` order.
    addrs: Vec<String>,
    tenants: Vec<TenantId>,
}

/// Which shards and tenants one node (a master of a cluster) serves.
#[derive(Debug, Clone, Default)]
pub struct NodeLoad {
    /// `127.0.0.1:<port>`.
    pub addr: String,
    pub shards: Vec<u16>,
    /// The benchmark's tenants whose shard is on this node.
    pub tenants: usize,
}

/// When a direct load stops.
#[derive(Clone, Copy)]
pub enum Until {
    Elapsed(Duration),
    /// This many admissions, or fewer if the time runs out first.
    Count(u64, Duration),
}

impl Direct {
    /// Connects with the server's data policy; `nodes` are the URLs of the server, or of every
    /// master of the cluster `config.redis` names.
    pub async fn connect(
        config: StoreConfig,
        tenants: &[String],
        nodes: &[String],
    ) -> anyhow::Result<Self> {
        let store = Store::connect(config.clone()).await?;
        let conn = Conn::open(&config.redis, 1, config.op_timeout, config.replica_acks)
            .await?
            .remove(0);
        let mut node_conns = Vec::with_capacity(nodes.len());
        // As patient as the store's own calls (the cost measurement's Redis may run under
        // callgrind, where a whole-keyspace read takes seconds).
        let patient = redis::AsyncConnectionConfig::new()
            .set_response_timeout(Some(config.op_timeout.max(Duration::from_secs(10))));
        for url in nodes {
            node_conns.push(
                redis::Client::open(url.as_str())?
                    .get_multiplexed_async_connection_with_config(&patient)
                    .await?,
            );
        }
        let tenants = tenants
            .iter()
            .map(|t| TenantId::parse(t).map_err(|e| anyhow::anyhow!("tenant {t}: {}", e.detail)))
            .collect::<anyhow::Result<_>>()?;
        Ok(Self {
            config,
            store: Arc::new(store),
            conn,
            nodes: node_conns,
            addrs: nodes
                .iter()
                .map(|u| u.trim_start_matches("redis://").to_owned())
                .collect(),
            tenants,
        })
    }

    /// Empties Redis (every node) and sets it up as a first `sluice serve` start with its
    /// defaults would (meta record and schema marker, scripts, published defaults), so each
    /// phase starts from the same state and measures what a deployment runs: without the start
    /// log (`--start-log` off), which costs every start a stream write.
    pub async fn reset(&mut self) -> anyhow::Result<()> {
        self.reset_as(false).await
    }

    /// [`Direct::reset`], with the start log kept (`--start-log`): for the phases whose
    /// checks read it (the weighted fair share, the throttle's start times). The phases'
    /// workers follow the published setting; a build from before it keeps the log anyway.
    pub async fn reset_with_start_log(&mut self) -> anyhow::Result<()> {
        self.reset_as(true).await
    }

    async fn reset_as(&mut self, start_log: bool) -> anyhow::Result<()> {
        for node in &mut self.nodes {
            let () = redis::cmd("FLUSHALL").arg("SYNC").query_async(node).await?;
        }
        let mut config = self.config.clone();
        config.start_log = start_log;
        let store = Store::connect(config).await?;
        store.publish_defaults().await?;
        self.store = Arc::new(store);
        for node in &mut self.nodes {
            let () = redis::cmd("CONFIG")
                .arg("RESETSTAT")
                .query_async(node)
                .await?;
        }
        Ok(())
    }

    /// Which shards (and how many of the benchmark's tenants) each master of a cluster serves,
    /// by the slot of each shard's hash tag and `CLUSTER SLOTS`.
    pub async fn layout(&mut self) -> anyhow::Result<Vec<NodeLoad>> {
        let addrs = &self.addrs;
        let mut out: Vec<NodeLoad> = addrs
            .iter()
            .map(|a| NodeLoad {
                addr: a.clone(),
                ..NodeLoad::default()
            })
            .collect();
        let shards = self.store.shards();
        // (first slot, last slot, node index) of every slot range.
        let mut ranges = Vec::new();
        let slots: Vec<Value> = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(&mut self.nodes[0])
            .await?;
        for range in slots {
            let Value::Array(r) = range else { continue };
            let (Some(first), Some(last), Some(Value::Array(master))) =
                (r.first(), r.get(1), r.get(2))
            else {
                continue;
            };
            let first: u16 = redis::from_redis_value_ref(first)?;
            let last: u16 = redis::from_redis_value_ref(last)?;
            let port: u16 = redis::from_redis_value_ref(
                master.get(1).context("CLUSTER SLOTS without a port")?,
            )?;
            let node = addrs
                .iter()
                .position(|a| a.ends_with(&format!(":{port}")))
                .context("CLUSTER SLOTS names a node the benchmark did not start")?;
            ranges.push((first, last, node));
        }
        let mut node_of: Vec<usize> = Vec::new();
        for shard in shards.all() {
            let slot: u16 = redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(shard.ready())
                .query_async(&mut self.nodes[0])
                .await?;
            let node = ranges
                .iter()
                .find(|(a, b, _)| (*a..=*b).contains(&slot))
                .map(|r| r.2)
                .with_context(|| format!("slot {slot} is served by no node"))?;
            node_of.push(node);
        }
        for shard in shards.all() {
            out[node_of[usize::from(shard.number())]]
                .shards
                .push(shard.number());
        }
        for t in &self.tenants {
            out[node_of[usize::from(shards.shard_of(t).number())]].tenants += 1;
        }
        Ok(out)
    }

    /// Microseconds each node spent running scripts and functions (EVAL*, FCALL*) since the
    /// last `reset`, by
    /// its own `INFO commandstats`: Redis's CPU cost of the phase's work, unaffected by how
    /// busy the rest of the machine is.
    pub async fn script_usec(&mut self) -> anyhow::Result<Vec<u64>> {
        let mut out = Vec::with_capacity(self.nodes.len());
        for node in &mut self.nodes {
            let info: String = redis::cmd("INFO")
                .arg("commandstats")
                .query_async(node)
                .await?;
            out.push(
                info.lines()
                    .filter(|l| l.starts_with("cmdstat_eval") || l.starts_with("cmdstat_fcall"))
                    .filter_map(|l| {
                        l.split(',')
                            .find_map(|f| f.strip_prefix("usec="))
                            .and_then(|v| v.parse::<u64>().ok())
                    })
                    .sum(),
            );
        }
        Ok(out)
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
        self.admit_sized(clients, until, tag, dedup, None, progress)
            .await
    }

    /// `admit_loop` with params of `params_bytes` bytes of JSON (`padded_params`) when given,
    /// `{"n":i}` otherwise.
    pub async fn admit_sized(
        &self,
        clients: usize,
        until: Until,
        tag: &str,
        dedup: bool,
        params_bytes: Option<usize>,
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
                        params: serde_json::value::to_raw_value(&match params_bytes {
                            Some(b) => padded_params(i, b),
                            None => json!({ "n": i }),
                        })
                        .ok(),
                        dedup_key: None,
                        max_attempts: None,
                        priority: None,
                        run_at: None,
                        delay: None,
                        concurrency_key: None,
                    };
                    let tenant = &tenants[i as usize % tenants.len()];
                    let ok = match AdmitRequest::parse(body, dedup.then_some(key.as_str()), 5) {
                        Ok(req) => {
                            // A far deadline: this loop measures Redis, not request bounds.
                            let ticket = std::sync::Arc::new(sluice::store::Ticket::new(
                                tokio::time::Instant::now() + std::time::Duration::from_secs(60),
                            ));
                            matches!(
                                store.admit(tenant.clone(), req, ticket).await,
                                Ok(Admission::Created(_))
                            )
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

    /// Every node's connection (the server, or each master), for what acts on a node's whole
    /// keyspace or its statistics.
    pub fn nodes_mut(&mut self) -> &mut [MultiplexedConnection] {
        &mut self.nodes
    }

    /// `CONFIG RESETSTAT` on every node: `INFO commandstats` counts from here.
    pub async fn reset_stats(&mut self) -> anyhow::Result<()> {
        for node in &mut self.nodes {
            let () = redis::cmd("CONFIG")
                .arg("RESETSTAT")
                .query_async(node)
                .await?;
        }
        Ok(())
    }

    /// The CPU seconds redis-server has used so far (`used_cpu_user + used_cpu_sys` of `INFO
    /// cpu`, every thread of the process), summed over the nodes.
    pub async fn used_cpu(&mut self) -> anyhow::Result<f64> {
        let mut sum = 0.0;
        for node in &mut self.nodes {
            let info: String = redis::cmd("INFO").arg("cpu").query_async(node).await?;
            sum += used_cpu(&info)?;
        }
        Ok(sum)
    }

    /// Redis's `used_memory`, bytes, summed over the nodes.
    pub async fn used_memory(&mut self) -> anyhow::Result<u64> {
        let mut sum = 0;
        for node in &mut self.nodes {
            let info: String = redis::cmd("INFO").arg("memory").query_async(node).await?;
            sum += info
                .lines()
                .find_map(|l| l.strip_prefix("used_memory:"))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .context("INFO memory has no used_memory")?;
        }
        Ok(sum)
    }

    /// `MEMORY USAGE` of every key summed by kind (rows, dedup mappings, status and flow
    /// indexes, slot sets, ready streams, the rest): where the memory of an execution goes.
    /// Excludes the keyspace's own hash tables (bucket arrays, the TTL table), so the sum is a
    /// little under the `used_memory` growth.
    pub async fn memory_by_kind(&mut self) -> anyhow::Result<BTreeMap<&'static str, u64>> {
        let mut out = BTreeMap::new();
        for node in &mut self.nodes {
            let mut cursor = 0u64;
            // Bounded like `census`.
            for _ in 0..10_000_000 {
                // Bytes: a layout-5 name holds a binary id.
                let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("COUNT")
                    .arg(5000)
                    .query_async(node)
                    .await?;
                if keys.is_empty() {
                    // An empty pipeline is refused by the client ("empty command").
                    cursor = next;
                    if cursor == 0 {
                        break;
                    }
                    continue;
                }
                let mut p = redis::pipe();
                for k in &keys {
                    p.cmd("MEMORY").arg("USAGE").arg(k).arg("SAMPLES").arg(0);
                }
                let sizes: Vec<Option<u64>> = p.query_async(node).await?;
                for (k, size) in keys.iter().zip(sizes) {
                    *out.entry(key_kind(&String::from_utf8_lossy(k)))
                        .or_default() += size.unwrap_or(0);
                }
                cursor = next;
                if cursor == 0 {
                    break;
                }
            }
        }
        Ok(out)
    }
}

impl Direct {
    /// The shards a worker serves: every shard of the map in force, hashed and dedicated
    /// (`sluice worker` runs one pickup, orphan scan and heartbeat per shard of `all()`).
    pub fn shards_served(&self) -> usize {
        self.store.shards().all().count()
    }

    /// The shard holding `tenant`'s keys (sluice's own mapping, `Store::shard_of`), so the
    /// fairness phases can put their tenants in one shard.
    pub fn shard_of(&self, tenant: &TenantId) -> Shard {
        self.store.shard_of(tenant)
    }

    /// The tenants of the first `count` entries of `shard`'s start log (oldest first), or
    /// `None` when the shard has no start log (a build without fair dispatch).
    pub async fn start_log(
        &mut self,
        shard: Shard,
        count: usize,
    ) -> anyhow::Result<Option<Vec<String>>> {
        Ok(self
            .start_log_times(shard, count)
            .await?
            .map(|log| log.into_iter().map(|(_, t)| t).collect()))
    }

    /// The first `count` entries of `shard`'s start log (oldest first) as (the start's Redis
    /// time in ms — the entry id's first part —, tenant), or `None` when the shard has no
    /// start log.
    pub async fn start_log_times(
        &mut self,
        shard: Shard,
        count: usize,
    ) -> anyhow::Result<Option<Vec<(u64, String)>>> {
        let key = shard.starts();
        let exists: bool = self.conn.exists(&key).await?;
        if !exists {
            return Ok(None);
        }
        let entries: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
            .arg(&key)
            .arg("-")
            .arg("+")
            .arg("COUNT")
            .arg(count)
            .query_async(&mut self.conn)
            .await?;
        let mut out = Vec::with_capacity(entries.ids.len());
        for e in entries.ids {
            let ms =
                e.id.split_once('-')
                    .and_then(|(ms, _)| ms.parse::<u64>().ok())
                    .with_context(|| format!("a start-log entry id {:?} without its time", e.id))?;
            let t: Option<String> = e.get("t");
            out.push((ms, t.context("a start-log entry without its tenant (`t`)")?));
        }
        Ok(Some(out))
    }

    /// `127.0.0.1:<port>` of each node, in node order.
    pub fn node_addrs(&self) -> &[String] {
        &self.addrs
    }

    /// Redis's clock (`TIME` on the first node), ms since the epoch.
    pub async fn redis_now_ms(&mut self) -> anyhow::Result<u64> {
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut self.nodes[0]).await?;
        Ok(secs * 1000 + micros / 1000)
    }

    /// `INFO commandstats` of every node, summed: calls per command (`fcall`,
    /// `config|resetstat`, ...). Commands that scripts run inside Redis are counted too (Redis
    /// counts them like any other).
    pub async fn command_calls(&mut self) -> anyhow::Result<BTreeMap<String, u64>> {
        let mut out = BTreeMap::new();
        for node in &mut self.nodes {
            let info: String = redis::cmd("INFO")
                .arg("commandstats")
                .query_async(node)
                .await?;
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
        }
        Ok(out)
    }

    /// The address each node sees the benchmark's own node connection come from (`CLIENT
    /// INFO`'s `addr`, as `MONITOR` names clients), so its commands can be told apart.
    pub async fn own_addrs(&mut self) -> anyhow::Result<Vec<String>> {
        let mut out = Vec::new();
        for node in &mut self.nodes {
            let info: String = redis::cmd("CLIENT").arg("INFO").query_async(node).await?;
            out.push(
                info.split_whitespace()
                    .find_map(|f| f.strip_prefix("addr="))
                    .context("CLIENT INFO without addr")?
                    .to_owned(),
            );
        }
        Ok(out)
    }
}

/// `used_cpu_user + used_cpu_sys` of an `INFO cpu` text, seconds.
pub fn used_cpu(info: &str) -> anyhow::Result<f64> {
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .with_context(|| format!("INFO cpu has no {name}"))
    };
    Ok(field("used_cpu_user:")? + field("used_cpu_sys:")?)
}

/// `{"n":i,"p":"xx..."}` padded with `x` to `bytes` bytes of JSON (never shorter than with an
/// empty `p`): params of a chosen size, the same data the BullMQ peer gives its jobs
/// (`paddedData` in `bench/bullmq/peer.mjs`).
pub fn padded_params(i: u64, bytes: usize) -> serde_json::Value {
    let bare = format!(r#"{{"n":{i},"p":""}}"#).len();
    json!({ "n": i, "p": "x".repeat(bytes.saturating_sub(bare)) })
}

/// The kind of a sluice key, as the keys module reads it back.
fn key_kind(k: &str) -> &'static str {
    match keys::parse(k).map(|n| n.kind) {
        Some(KeyKind::Row) => "rows",
        Some(KeyKind::Dedup) => "dedup mappings",
        Some(KeyKind::DedupBucket) => "dedup buckets",
        Some(KeyKind::Listing) => "listings",
        Some(KeyKind::StatusIndex) => "status indexes",
        Some(KeyKind::FlowIndex) => "flow indexes",
        Some(KeyKind::Slots) => "slot sets",
        Some(KeyKind::Waiting) => "waiting sets",
        Some(KeyKind::Ready) => "ready streams",
        Some(KeyKind::Runnable) => "runnable sets",
        Some(KeyKind::Starts) => "start logs",
        _ => "other",
    }
}
