//! `sluice migrate-layout`: moves a Redis written with an older key layout to the current one.
//!
//! Layout 1 named shards `{s00}`..`{s15}`, which crowd some masters of a Redis Cluster (see
//! `store::layout`). The migration renames every shard key to its layout-2 name:
//!
//! 1. every old shard is frozen (its scripts refuse, retryably, from now on);
//! 2. each key of each old shard is copied to its new name (`DUMP` + `RESTORE ... REPLACE`,
//!    which keeps its TTL, and for streams their consumer groups and pending entries), then
//!    deleted — on a cluster the new name usually lives on another master;
//! 3. the meta record is set to the new layout.
//!
//! Processes still running with the old layout keep answering 503 (their shards stay frozen:
//! the old markers are left in place for them); restarted, they read the new layout. An
//! interrupted migration is finished by running it again: the old shards stay frozen, a key
//! already copied and deleted is not seen again, and one copied but not yet deleted is copied
//! again over its copy.

use std::time::{Duration, Instant};

use anyhow::Context;
use redis::aio::MultiplexedConnection;

use crate::reshard::Cluster;
use crate::store::{Conn, Layout, RedisTarget, ShardMap, Store, StoreConfig, keys};

/// What a migration did.
#[derive(Debug, Clone)]
pub struct Migrated {
    pub from: Layout,
    pub to: Layout,
    pub keys: usize,
    pub took: Duration,
}

/// Migrates the Redis `config` names to the current layout; `None` when it already has it.
pub async fn migrate_layout(config: StoreConfig) -> anyhow::Result<Option<Migrated>> {
    let began = Instant::now();
    let store = Store::connect(config.clone())
        .await
        .with_context(|| format!("cannot use redis at {}", config.redis))?;
    let old = store.shards();
    if old.layout() == Layout::CURRENT {
        return Ok(None);
    }
    let new = ShardMap::with_dedicated(old.count(), old.dedicated(), Layout::CURRENT);
    for shard in old.all() {
        store.freeze_shard(shard).await?;
    }
    let mut nodes = node_connections(&config).await?;
    let mut conn = Conn::open(&config.redis, 1, config.op_timeout, 0)
        .await?
        .remove(0);
    let mut moved = 0;
    for shard in old.all() {
        let (from, to) = (shard.prefix(), new.shard(shard.number()).prefix());
        let marker = shard.frozen();
        for node in &mut nodes {
            let mut cursor = 0u64;
            // Bounded: SCAN ends when the cursor returns to 0 (a frozen shard does not grow).
            for _ in 0..10_000_000 {
                let (next, found): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(format!("{from}*"))
                    .arg("COUNT")
                    .arg(1_000)
                    .query_async(node)
                    .await?;
                for key in found.into_iter().filter(|k| *k != marker) {
                    let Some(rest) = key.strip_prefix(&from) else {
                        continue;
                    };
                    let (dump, ttl): (Option<Vec<u8>>, i64) = redis::pipe()
                        .cmd("DUMP")
                        .arg(&key)
                        .cmd("PTTL")
                        .arg(&key)
                        .query_async(node)
                        .await?;
                    // Expired between SCAN and DUMP: nothing to keep.
                    let Some(dump) = dump else { continue };
                    let () = redis::cmd("RESTORE")
                        .arg(format!("{to}{rest}"))
                        .arg(ttl.max(0))
                        .arg(dump)
                        .arg("REPLACE")
                        .query_async(&mut conn)
                        .await?;
                    let () = redis::cmd("DEL").arg(&key).query_async(node).await?;
                    moved += 1;
                }
                cursor = next;
                if cursor == 0 {
                    break;
                }
            }
        }
    }
    let () = redis::cmd("HSET")
        .arg(keys::meta())
        .arg("layout")
        .arg(Layout::CURRENT.number())
        .query_async(&mut conn)
        .await?;
    Ok(Some(Migrated {
        from: old.layout(),
        to: Layout::CURRENT,
        keys: moved,
        took: began.elapsed(),
    }))
}

/// A direct connection to every node holding data: the server, or each cluster master.
async fn node_connections(config: &StoreConfig) -> anyhow::Result<Vec<MultiplexedConnection>> {
    match &config.redis {
        RedisTarget::Standalone(url) => Ok(vec![
            redis::Client::open(url.as_str())?
                .get_multiplexed_async_connection()
                .await?,
        ]),
        RedisTarget::Cluster(_) => {
            let cluster = Cluster::connect(config.clone()).await?;
            let mut out = Vec::new();
            for m in cluster.masters().await? {
                out.push(cluster.node(&m.host, m.port).await?);
            }
            Ok(out)
        }
    }
}
