//! `sluice migrate-layout`: moves a Redis written with an older key layout to the current one
//! (layout 4), shard by shard, while processes of the older build keep serving the shards not
//! converted yet (from layouts 1 and 2; a layout-3 build checks the same marker as this one,
//! so its processes must be stopped first: docs/operations.md, "Key layout 4").
//!
//! Layout 1 named shards `{s00}`..`{s15}`, which crowd some masters of a Redis Cluster (see
//! `store::layout`); layout 2 gave them slot-aligned tags; layout 3 keeps those tags and gives
//! rows compact field names (`domain::row`); layout 4 lists each tenant's executions in one
//! sorted set (`Shard::listing`) instead of a status index and a flow index each. Builds of layouts 1 and 2 refuse a shard's
//! scripts while `<prefix>frozen` exists; this build checks `<prefix>hold` instead. So a move
//! can stop each build where it must not run:
//!
//! 1. every shard not converted yet is held (this build's processes refuse it, 503), then
//!    the meta record says a move to 4 is under way (`layout_to`): this build's `serve` and
//!    `worker` may start from now on and serve the converted shards;
//! 2. from layout 1 only: every old shard is frozen and its keys renamed to the new tags
//!    (`DUMP` + `RESTORE ... ABSTTL`, which keeps each key's expiry time to the millisecond,
//!    and streams' groups and pending entries), as the move 1 → 2 did (below);
//! 3. per shard: its old marker is set (processes of the older build refuse it from now on,
//!    for good: they must be stopped), the conversion `STEPS` run over it in bounded batches,
//!    the shard is recorded as converted and its hold removed (this build serves it);
//! 4. shard by shard, while each serves, live dedup mappings of the older form (a string key
//!    each) become fields of their tenants' buckets (`Store::relayout_dedup_step`; every
//!    reader takes both forms, so this needs no hold);
//! 5. a SCAN of every node converts rows no index named (none, unless a crash or a bug left
//!    one), then the meta record says layout 4.
//!
//! So a shard is refused by both builds only while its own conversion runs — provided
//! processes of both builds run during the move; a deployment that stopped its old processes
//! first has the unconverted shards refused until their turn. An interrupted move is finished
//! by running the command again: converted shards stay converted (the `{meta}` set of
//! converted shards), a shard half converted is held still and converted again (each step is
//! safe to repeat), and the renames of layout 1 are decided per key by Redis, as below.
//!
//! The renames of layout 1. An interrupted rename is finished by running it again: the old
//! shards stay frozen, a key already copied and deleted is not seen again, and an old key
//! whose new name exists already is deleted without being copied. That decision is made per
//! key by Redis itself (`RESTORE` without `REPLACE` refuses with `BUSYKEY`): the new name is
//! the record that the key was copied. The frozen old shard changes only through writers that
//! do not check the marker — older builds that bring an empty ready stream or a doorbell back
//! under the old name — so the copy is always the one to keep.

use std::time::{Duration, Instant};

use anyhow::Context;
use redis::aio::MultiplexedConnection;

use crate::domain::{FlowId, Status, TenantId, row};
use crate::reshard::Cluster;
use crate::store::{Conn, Layout, RedisTarget, Shard, ShardMap, Store, StoreConfig, keys};

/// What a migration did.
#[derive(Debug, Clone)]
pub struct Migrated {
    pub from: Layout,
    pub to: Layout,
    /// Keys copied to their new name (a move from layout 1).
    pub keys: usize,
    /// Old keys whose new name an earlier, interrupted run had written already: deleted, the
    /// copy kept.
    pub kept: usize,
    /// What the conversion steps changed (rows given compact names, ...), all shards.
    pub converted: u64,
    /// Live dedup mappings moved from a string key each into their tenants' buckets (after
    /// the shards' conversion, while they serve).
    pub dedup_mappings: u64,
    /// Shards converted by this run (an earlier, interrupted run may have done others).
    pub shards: usize,
    /// Rows no index named, converted by the SCAN after the shards (0 unless a bug or a crash
    /// left one).
    pub stragglers: u64,
    /// The longest a shard was refused by both builds (its own conversion).
    pub longest_freeze: Duration,
    pub took: Duration,
    /// False when `Limits::max_batches` stopped it first (tests): run it again.
    pub done: bool,
}

/// Bounds of one run (tests interrupt it; the command uses the defaults).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Rows a conversion batch converts at most (one script call each).
    pub batch: usize,
    /// Stop after this many conversion batches in all (`None`: run to the end).
    pub max_batches: Option<usize>,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            batch: 1_000,
            max_batches: None,
        }
    }
}

/// One step of a shard's conversion to layout 4: `(shard, cursor) -> (next cursor,
/// converted)`, run in bounded batches from the empty cursor until the next cursor is empty
/// again, while the shard is held by both builds. Every step must be safe to repeat (a run
/// interrupted mid-shard converts the shard again). A conversion that another part of layout
/// 3 needs (a structure that changes shape) is one more variant here, run by `run_step`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Rows get their compact names (`migrations-lua/layout/3_compact_rows.lua`), found
    /// through the shard's own indexes: its tenants (registered and being reaped), each one's
    /// five status indexes and its force-deleted runs. That costs the shard's rows, not the
    /// node's keys (a SCAN of a node holding many shards would read them all for each one);
    /// a row no index names is found by the SCAN that follows every shard (`stragglers`).
    /// Only from layouts 1 and 2.
    Rows,
    /// Each tenant's status and flow indexes become its listing (layout 4,
    /// `migrations-lua/layout/4_listing.lua`): its five status indexes and its scheduled
    /// ones' are moved into the listing batch by batch (each id listed as its row says, then
    /// taken out of the old index, so an interrupted move goes on where it stopped), then the
    /// flow indexes, duplicates of those, are deleted. Runs after `Rows`: it reads compact
    /// rows.
    Listing,
}

impl Step {
    /// Whether a store at layout `from` needs this step.
    pub fn applies(self, from: Layout) -> bool {
        match self {
            Step::Rows => from.number() < Layout::Compact.number(),
            Step::Listing => from.number() < Layout::Listing.number(),
        }
    }
}

/// The steps of a shard's conversion, in order.
pub const STEPS: &[Step] = &[Step::Rows, Step::Listing];

/// Migrates the Redis `config` names to the current layout; `None` when it already has it.
pub async fn migrate_layout(config: StoreConfig) -> anyhow::Result<Option<Migrated>> {
    migrate_layout_with(config, Limits::default()).await
}

/// `migrate_layout` within `limits`.
pub async fn migrate_layout_with(
    config: StoreConfig,
    limits: Limits,
) -> anyhow::Result<Option<Migrated>> {
    let began = Instant::now();
    let store = Store::connect_for_migration(config.clone())
        .await
        .with_context(|| format!("cannot use redis at {}", config.redis))?;
    let old = store.shards();
    let mut conn = Conn::open(&config.redis, 1, config.op_timeout, 0)
        .await?
        .remove(0);
    let layout_to: Option<u32> = redis::cmd("HGET")
        .arg(keys::meta())
        .arg("layout_to")
        .query_async(&mut conn)
        .await?;
    if old.layout() == Layout::CURRENT && layout_to.is_none() {
        return Ok(None);
    }
    let new = ShardMap::with_dedicated(old.count(), old.dedicated(), Layout::CURRENT);
    // A move to an older layout, interrupted (by that build's command): the shards it
    // converted lack this layout's steps, so every shard is converted again (each step is
    // safe to repeat, and skips what is done).
    if layout_to.is_some_and(|to| to != Layout::CURRENT.number()) {
        let () = redis::cmd("DEL")
            .arg(keys::layout_converted())
            .query_async(&mut conn)
            .await
            .map(|_: i64| ())?;
    }
    let converted: Vec<u16> = redis::cmd("SMEMBERS")
        .arg(keys::layout_converted())
        .query_async(&mut conn)
        .await?;
    // 1. Hold what this build must not serve yet, then say that a move is under way.
    for shard in new.all().filter(|s| !converted.contains(&s.number())) {
        store.freeze_shard(shard).await?;
    }
    let () = redis::cmd("HSET")
        .arg(keys::meta())
        .arg("layout_to")
        .arg(Layout::CURRENT.number())
        .query_async(&mut conn)
        .await?;
    let mut nodes = node_connections(&config).await?;
    let mut out = Migrated {
        from: old.layout(),
        to: Layout::CURRENT,
        keys: 0,
        kept: 0,
        converted: 0,
        dedup_mappings: 0,
        shards: 0,
        stragglers: 0,
        longest_freeze: Duration::ZERO,
        took: Duration::ZERO,
        done: false,
    };
    // 2. The renames of layout 1.
    if !old.layout().slot_aligned() {
        for shard in old.all() {
            set_key(&mut conn, &shard.old_frozen()).await?;
        }
        (out.keys, out.kept) = rename(&old, &new, &mut nodes, &mut conn).await?;
    }
    // 3. Shard by shard.
    let mut batches = 0usize;
    for shard in new.all().filter(|s| !converted.contains(&s.number())) {
        let frozen_at = Instant::now();
        set_key(&mut conn, &shard.old_frozen()).await?;
        let node = node_of(&mut nodes, shard);
        for &step in STEPS.iter().filter(|s| s.applies(out.from)) {
            let mut cursor = String::new();
            // Bounded: a step walks a held shard, which does not grow.
            for _ in 0..100_000_000u64 {
                if limits.max_batches.is_some_and(|m| batches >= m) {
                    out.took = began.elapsed();
                    return Ok(Some(out));
                }
                batches += 1;
                let (next, n) = run_step(step, node, shard, &cursor, limits.batch).await?;
                out.converted += n;
                cursor = next;
                if cursor.is_empty() {
                    break;
                }
            }
        }
        let () = redis::cmd("SADD")
            .arg(keys::layout_converted())
            .arg(shard.number())
            .query_async(&mut conn)
            .await
            .map(|_: i64| ())?;
        store.unfreeze_shard(shard).await?;
        out.shards += 1;
        out.longest_freeze = out.longest_freeze.max(frozen_at.elapsed());
    }
    // Live dedup mappings of the older form (a string key each) into their tenants' buckets,
    // shard by shard while it serves: every reader and every end of an execution takes both
    // forms (`dedup_holder` in common.lua), so this only gives back bytes and needs no hold.
    // Run for every shard on every run (each batch is atomic and safe to repeat).
    for shard in new.all() {
        let mut cursor = 0u64;
        // Bounded: SCAN ends when its cursor returns to 0.
        for _ in 0..100_000_000u64 {
            if limits.max_batches.is_some_and(|m| batches >= m) {
                out.took = began.elapsed();
                return Ok(Some(out));
            }
            batches += 1;
            let (next, n) = store
                .relayout_dedup_step(shard, cursor, limits.batch)
                .await?;
            out.dedup_mappings += n;
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
    }
    // Rows no index named (none, unless a bug or a crash left one): every shard serves again,
    // and each row is converted atomically on its own.
    if Step::Rows.applies(out.from) {
        out.stragglers = stragglers(&new, &mut nodes).await?;
    }
    out.converted += out.stragglers;
    // 5. Done.
    let () = redis::pipe()
        .cmd("HSET")
        .arg(keys::meta())
        .arg("layout")
        .arg(Layout::CURRENT.number())
        .ignore()
        .cmd("HDEL")
        .arg(keys::meta())
        .arg("layout_to")
        .ignore()
        .cmd("DEL")
        .arg(keys::layout_converted())
        .ignore()
        .query_async(&mut conn)
        .await?;
    out.took = began.elapsed();
    out.done = true;
    Ok(Some(out))
}

/// The conversion script (see `Step::Rows`).
fn compact_rows() -> &'static redis::Script {
    static SCRIPT: std::sync::OnceLock<redis::Script> = std::sync::OnceLock::new();
    SCRIPT.get_or_init(|| {
        redis::Script::new(include_str!("../migrations-lua/layout/3_compact_rows.lua"))
    })
}

/// The listing script (see `Step::Listing`).
fn build_listing() -> &'static redis::Script {
    static SCRIPT: std::sync::OnceLock<redis::Script> = std::sync::OnceLock::new();
    SCRIPT
        .get_or_init(|| redis::Script::new(include_str!("../migrations-lua/layout/4_listing.lua")))
}

/// The old indexes a tenant's listing is built from, in order: its five status indexes,
/// then its scheduled ones' (`None`).
const LISTED: [Option<Status>; 6] = [
    Some(Status::Queued),
    Some(Status::Running),
    Some(Status::Completed),
    Some(Status::Failed),
    Some(Status::Cancelled),
    None,
];

/// The shard's tenants a conversion walks (registered and being reaped), sorted: a cursor
/// names one by its place.
async fn shard_tenants(
    node: &mut MultiplexedConnection,
    shard: Shard,
) -> anyhow::Result<Vec<String>> {
    let mut tenants: Vec<String> = redis::cmd("SUNION")
        .arg(shard.tenants())
        .arg(shard.reaping())
        .query_async(node)
        .await?;
    tenants.sort();
    Ok(tenants)
}

/// The pairs of names the conversion script takes (`ARGV[5..]`).
fn name_pairs(inv: &mut redis::ScriptInvocation<'_>) {
    for (legacy, compact) in row::LEGACY {
        inv.arg(legacy).arg(compact);
    }
}

/// The indexes a shard's rows are found through, for the tenants of `tenants`: each one's
/// five status indexes, then its force-deleted runs.
const INDEXES_PER_TENANT: usize = Status::ALL.len() + 1;

/// One batch of `step` in `shard` from `cursor`, on the node that holds the shard.
async fn run_step(
    step: Step,
    node: &mut MultiplexedConnection,
    shard: Shard,
    cursor: &str,
    batch: usize,
) -> anyhow::Result<(String, u64)> {
    match step {
        Step::Rows => {
            // The cursor: "<tenant>:<index>:<rank>" into the sorted tenants (registered and
            // being reaped) and each one's indexes.
            let tenants = shard_tenants(node, shard).await?;
            let mut at = cursor.split(':').map(|n| n.parse::<usize>().unwrap_or(0));
            let (t, i, rank) = (
                at.next().unwrap_or(0),
                at.next().unwrap_or(0),
                at.next().unwrap_or(0),
            );
            let Some(tenant) = tenants.get(t) else {
                return Ok((String::new(), 0));
            };
            let tenant = TenantId::parse(tenant).map_err(|e| anyhow::anyhow!("{}", e.detail))?;
            let index = match Status::ALL.get(i) {
                Some(&s) => shard.status_index(&tenant, s),
                None => shard.deleting(&tenant),
            };
            let mut inv = compact_rows().prepare_invoke();
            inv.key(index)
                .arg("index")
                .arg(shard.prefix())
                .arg(rank)
                .arg(batch.max(1));
            name_pairs(&mut inv);
            let (done, n): (u8, u64) = inv.invoke_async(node).await?;
            let next = match (done == 1, i + 1 < INDEXES_PER_TENANT) {
                (false, _) => format!("{t}:{i}:{}", rank + batch.max(1)),
                (true, true) => format!("{t}:{}:0", i + 1),
                (true, false) if t + 1 < tenants.len() => format!("{}:0:0", t + 1),
                (true, false) => String::new(),
            };
            Ok((next, n))
        }
        Step::Listing => {
            // The cursor: "<tenant>:<index>" into the sorted tenants and `LISTED`; index 6
            // is the deletion of the flow indexes. No rank: a batch takes its ids out of the
            // old index.
            let tenants = shard_tenants(node, shard).await?;
            let mut at = cursor.split(':').map(|n| n.parse::<usize>().unwrap_or(0));
            let (t, i) = (at.next().unwrap_or(0), at.next().unwrap_or(0));
            let Some(tenant) = tenants.get(t) else {
                return Ok((String::new(), 0));
            };
            let tenant = TenantId::parse(tenant).map_err(|e| anyhow::anyhow!("{}", e.detail))?;
            let after = || match t + 1 < tenants.len() {
                true => format!("{}:0", t + 1),
                false => String::new(),
            };
            let Some(&status) = LISTED.get(i) else {
                // The flow indexes (and the emptied status indexes, should a batch have
                // left one): duplicates of the listing now.
                let flows: Vec<String> = redis::cmd("SMEMBERS")
                    .arg(shard.flows(&tenant))
                    .query_async(node)
                    .await?;
                let mut inv = build_listing().prepare_invoke();
                for f in flows.iter().filter_map(|f| FlowId::parse(f).ok()) {
                    for s in Status::ALL {
                        inv.key(shard.flow_index(&tenant, &f, s));
                    }
                    inv.key(shard.scheduled_flow_index(&tenant, &f));
                }
                for s in Status::ALL {
                    inv.key(shard.status_index(&tenant, s));
                }
                inv.key(shard.scheduled_index(&tenant));
                inv.arg("drop");
                let (_, n): (u8, u64) = inv.invoke_async(node).await?;
                return Ok((after(), n));
            };
            let index = match status {
                Some(s) => shard.status_index(&tenant, s),
                None => shard.scheduled_index(&tenant),
            };
            let mut inv = build_listing().prepare_invoke();
            inv.key(index)
                .key(shard.listing(&tenant))
                .key(shard.flows(&tenant))
                .arg("index")
                .arg(shard.prefix())
                .arg(tenant.as_str())
                .arg(status.map(Status::as_str).unwrap_or("scheduled"))
                .arg(batch.max(1));
            let (done, n): (u8, u64) = inv.invoke_async(node).await?;
            let next = match done == 1 {
                false => format!("{t}:{i}"),
                true => format!("{t}:{}", i + 1),
            };
            Ok((next, n))
        }
    }
}

/// Rows of an older layout that no index named, found by SCAN of every node and converted:
/// the number. Bounded: SCAN ends when its cursor returns to 0.
async fn stragglers(map: &ShardMap, nodes: &mut [Node]) -> anyhow::Result<u64> {
    let mut converted = 0;
    for node in nodes.iter_mut() {
        let node = &mut node.conn;
        let mut cursor = 0u64;
        for _ in 0..100_000_000u64 {
            let (next, found): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(keys::row_pattern())
                .arg("COUNT")
                .arg(10_000)
                .query_async(node)
                .await?;
            for shard in map.all() {
                let prefix = shard.prefix();
                let mine: Vec<&String> = found.iter().filter(|k| k.starts_with(&prefix)).collect();
                if mine.is_empty() {
                    continue;
                }
                let mut inv = compact_rows().prepare_invoke();
                for k in mine {
                    inv.key(k);
                }
                inv.arg("keys").arg("").arg(0).arg(0);
                name_pairs(&mut inv);
                let (_, n): (u8, u64) = inv.invoke_async(node).await?;
                converted += n;
            }
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
    }
    Ok(converted)
}

/// The node holding `shard`'s slot (the only node of a standalone Redis).
fn node_of(nodes: &mut [Node], shard: Shard) -> &mut MultiplexedConnection {
    let slot = crate::store::slot_of_tag(shard.tag());
    let i = nodes
        .iter()
        .position(|n| n.slots.iter().any(|&(a, b)| (a..=b).contains(&slot)))
        .unwrap_or(0);
    &mut nodes[i].conn
}

async fn set_key(conn: &mut impl redis::aio::ConnectionLike, key: &str) -> anyhow::Result<()> {
    let () = redis::cmd("SET").arg(key).arg(1).query_async(conn).await?;
    Ok(())
}

/// Renames every key of layout `old` (1) to its name in `new`: keys copied, and old keys
/// whose copy an earlier run made.
async fn rename(
    old: &ShardMap,
    new: &ShardMap,
    nodes: &mut [Node],
    conn: &mut impl redis::aio::ConnectionLike,
) -> anyhow::Result<(usize, usize)> {
    let (mut moved, mut kept) = (0, 0);
    for shard in old.all() {
        let (from, to) = (shard.prefix(), new.shard(shard.number()).prefix());
        let markers = [shard.old_frozen(), shard.frozen()];
        for node in nodes.iter_mut() {
            let node = &mut node.conn;
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
                for key in found.into_iter().filter(|k| !markers.contains(k)) {
                    let Some(rest) = key.strip_prefix(&from) else {
                        continue;
                    };
                    // The expiry as a time (PEXPIRETIME, RESTORE ... ABSTTL), not a TTL: a
                    // terminal row's retention bucket is found from its exact expiry.
                    let (dump, at): (Option<Vec<u8>>, i64) = redis::pipe()
                        .cmd("DUMP")
                        .arg(&key)
                        .cmd("PEXPIRETIME")
                        .arg(&key)
                        .query_async(node)
                        .await?;
                    // Expired between SCAN and DUMP: nothing to keep.
                    let Some(dump) = dump else { continue };
                    // Never REPLACE: a new name that exists was copied by an earlier run.
                    let restored: redis::RedisResult<()> = redis::cmd("RESTORE")
                        .arg(format!("{to}{rest}"))
                        .arg(at.max(0))
                        .arg(dump)
                        .arg("ABSTTL")
                        .query_async(conn)
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
    Ok((moved, kept))
}

/// A direct connection to a node holding data, and the slots it serves.
struct Node {
    conn: MultiplexedConnection,
    slots: Vec<(u16, u16)>,
}

/// A direct connection to every node holding data: the server, or each cluster master.
async fn node_connections(config: &StoreConfig) -> anyhow::Result<Vec<Node>> {
    match &config.redis {
        RedisTarget::Standalone(url) => Ok(vec![Node {
            conn: redis::Client::open(url.as_str())?
                .get_multiplexed_async_connection()
                .await?,
            slots: vec![(0, u16::MAX)],
        }]),
        RedisTarget::Cluster(_) => {
            let cluster = Cluster::connect_for_migration(config.clone()).await?;
            let mut out = Vec::new();
            for m in cluster.masters().await? {
                out.push(Node {
                    conn: cluster.node(&m.host, m.port).await?,
                    slots: m.slots.clone(),
                });
            }
            Ok(out)
        }
    }
}
