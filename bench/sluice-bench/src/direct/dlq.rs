//! What the dead-letter phase reads and writes on Redis itself: the shards' `dead_lettered`
//! counters, one shard's records and counts by holder, the marker an older build left (set by
//! hand to recreate its state), a new `Store` connecting and rebuilding what that marker names
//! (as `serve` does at start), and the time and calls of each command since the last reset.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use sluice::store::{Shard, Store};

use super::Direct;

/// One shard's dead letters as Redis holds them.
#[derive(Debug, Clone, Copy, Default)]
pub struct DlqShard {
    /// Records in the shard's stream.
    pub records: u64,
    /// The sum of the counts by holder (`dlq_holders`): equal to `records` when in step.
    pub counted: u64,
    /// Holders counted.
    pub holders: u64,
    /// Whether a rebuild marker (`dlq_indexed`) is there.
    pub marker: bool,
}

/// Calls and microseconds of one command since the last `CONFIG RESETSTAT`, every node summed.
#[derive(Debug, Clone, Copy, Default)]
pub struct CommandStat {
    pub calls: u64,
    pub usec: u64,
}

impl Direct {
    /// The shards' `dead_lettered` counters, summed.
    pub async fn dead_lettered(&mut self) -> anyhow::Result<u64> {
        let mut sum = 0;
        for shard in self.store.shards().all() {
            let n: Option<u64> = self.conn.hget(shard.stats(), "dead_lettered").await?;
            sum += n.unwrap_or(0);
        }
        Ok(sum)
    }

    /// The shard whose records the phase measures, as Redis holds them.
    pub async fn dlq_shard(&mut self, shard: Shard) -> anyhow::Result<DlqShard> {
        let records: u64 = self.conn.xlen(shard.dead_letters()).await?;
        let counts: Vec<(String, u64)> = self
            .conn
            .zrange_withscores(shard.dead_letter_holders(), 0, -1)
            .await?;
        let marker: bool = self.conn.exists(shard.dead_letters_indexed()).await?;
        Ok(DlqShard {
            records,
            counted: counts.iter().map(|(_, n)| n).sum(),
            holders: counts.len() as u64,
            marker,
        })
    }

    /// The state an older build left: its marker naming `id` as the first record it indexed
    /// (set once, and never moved when the cap trimmed past it).
    pub async fn set_dlq_marker(&mut self, shard: Shard, id: &str) -> anyhow::Result<()> {
        let () = self.conn.set(shard.dead_letters_indexed(), id).await?;
        Ok(())
    }

    /// The first record id of the shard's stream.
    pub async fn first_dead_letter(&mut self, shard: Shard) -> anyhow::Result<Option<String>> {
        let first: Vec<(String, BTreeMap<String, String>)> = redis::cmd("XRANGE")
            .arg(shard.dead_letters())
            .arg("-")
            .arg("+")
            .arg("COUNT")
            .arg(1)
            .query_async(&mut self.conn)
            .await?;
        Ok(first.into_iter().next().map(|(id, _)| id))
    }

    /// Connects a new `Store` and rebuilds the dead-letter indexes and counts a marker names,
    /// as a new `sluice serve` does at start; how long that took.
    pub async fn connect_again(&mut self) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let store = Store::connect(self.config.clone()).await?;
        store.ensure_dead_letter_counts().await;
        let took = started.elapsed();
        self.store = std::sync::Arc::new(store);
        Ok(took)
    }

    /// CPU time (user + system) every node's main thread has used so far, in seconds (`INFO
    /// cpu`, microsecond resolution): unlike `INFO commandstats` times, not inflated while
    /// redis-server waits for a core on a busy machine.
    pub async fn redis_cpu_seconds(&mut self) -> anyhow::Result<f64> {
        let mut sum = 0.0;
        for node in &mut self.nodes {
            let info: String = redis::cmd("INFO").arg("cpu").query_async(node).await?;
            sum += info
                .lines()
                .filter_map(|l| {
                    l.strip_prefix("used_cpu_user_main_thread:")
                        .or_else(|| l.strip_prefix("used_cpu_sys_main_thread:"))
                })
                .filter_map(|v| v.trim().parse::<f64>().ok())
                .sum::<f64>();
        }
        Ok(sum)
    }

    /// `CONFIG RESETSTAT` on every node.
    pub async fn reset_command_stats(&mut self) -> anyhow::Result<()> {
        for node in &mut self.nodes {
            let () = redis::cmd("CONFIG")
                .arg("RESETSTAT")
                .query_async(node)
                .await?;
        }
        Ok(())
    }

    /// Every command's calls and time since `reset_command_stats`, every node summed (commands
    /// scripts ran are counted too, and their time is also in the script's).
    pub async fn command_stats(&mut self) -> anyhow::Result<BTreeMap<String, CommandStat>> {
        let mut out: BTreeMap<String, CommandStat> = BTreeMap::new();
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
                let field = |key: &str| {
                    fields
                        .split(',')
                        .find_map(|f| f.strip_prefix(key))
                        .and_then(|v| v.parse::<u64>().ok())
                        .unwrap_or(0)
                };
                let stat = out.entry(name.to_owned()).or_default();
                stat.calls += field("calls=");
                stat.usec += field("usec=");
            }
        }
        Ok(out)
    }
}
