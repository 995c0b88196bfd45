//! `sluice migrate-layout`: moves a Redis written with an older key layout to the current one.
//!
//! Layout 1 named shards `{s00}`..`{s15}`, which crowd some masters of a Redis Cluster (see
//! `store::layout`). The migration renames every shard key to its layout-2 name:
//!
//! 1. every old shard is frozen (its scripts refuse, retryably, from now on);
//! 2. each key of each old shard is copied to its new name (`DUMP` + `RESTORE`, which keeps
//!    its TTL, and for streams their consumer groups and pending entries), then deleted — on a
//!    cluster the new name usually lives on another master;
//! 3. the meta record is set to the new layout.
//!
//! Processes still running with the old layout keep answering 503 (their shards stay frozen:
//! the old markers are left in place for them); restarted, they read the new layout. An
//! interrupted migration is finished by running it again: the old shards stay frozen, a key
//! already copied and deleted is not seen again, and an old key whose new name exists already
//! is deleted without being copied. That decision is made per key by Redis itself (`RESTORE`
//! without `REPLACE` refuses with `BUSYKEY`): the new name is the record that the key was
//! copied. Nothing writes new names before the meta record names the new layout, and the
//! frozen old shard changes only through writers that do not check the marker — older builds
//! that bring an empty ready stream or a doorbell back under the old name (this build creates
//! its consumer groups and rings its doorbells through scripts, which refuse while frozen). So
//! the copy is always the one to keep; copying the old key over it would replace a ready
//! stream full of queued executions with an empty one.

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
    /// Keys copied to their new name.
    pub keys: usize,
    /// Old keys whose new name an earlier, interrupted run had written already: deleted, the
    /// copy kept.
    pub kept: usize,
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
    let (mut moved, mut kept) = (0, 0);
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
                    // Never REPLACE: a new name that exists was copied by an earlier run.
                    let restored: redis::RedisResult<()> = redis::cmd("RESTORE")
                        .arg(format!("{to}{rest}"))
                        .arg(ttl.max(0))
                        .arg(dump)
                        .query_async(&mut conn)
                        .await;
                    match restored {
                        Ok(()) => moved += 1,
                        Err(e) if e.code() == Some("BUSYKEY") => kept += 1,
                        Err(e) => return Err(e.into()),
                    }
                    let () = redis::cmd("DEL").arg(&key).query_async(node).await?;
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
        kept,
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
