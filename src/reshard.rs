//! Moving a shard to another master of a Redis Cluster without losing anything.
//!
//! Redis 7.0 has no atomic slot migration: the classic move (`SETSLOT ... MIGRATING` /
//! `IMPORTING`, then `MIGRATE` key by key) leaves the slot split between two nodes for a while,
//! and a script redirected (`ASK`) to the target would run on a partial copy of the shard —
//! a second id for one Idempotency-Key, a quota exceeded. So `sluice cluster move-shard`
//! first **freezes** the shard: it writes the shard's marker key (`keys::frozen`), and every
//! sluice script refuses with a retryable `TRYAGAIN` while the marker exists (scripts are
//! atomic, so once the marker is written no script is half-way). The marker moves last, so
//! while any key is still on the source the source refuses, and a call sent to the target
//! finds the marker missing among its declared keys and gets `TRYAGAIN` from Redis itself.
//! Then the slot is handed to the target and the marker deleted there.
//!
//! Every step can be repeated: a move interrupted at any point (the command killed, a node
//! restarted) leaves the shard frozen — refusing, never wrong — and running the same command
//! again finishes it.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use redis::aio::MultiplexedConnection;
use redis::{ConnectionAddr, IntoConnectionInfo};

use crate::store::{RedisTarget, Shard, Store, StoreConfig};

/// A master of the cluster as `CLUSTER NODES` describes it.
#[derive(Debug, Clone)]
pub struct Master {
    pub id: String,
    pub host: String,
    pub port: u16,
    /// Slot ranges it serves (inclusive).
    pub slots: Vec<(u16, u16)>,
}

impl Master {
    /// `host:port`.
    pub fn address(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|(a, b)| (*a..=*b).contains(&slot))
    }
}

/// Where one shard lives now.
#[derive(Debug, Clone)]
pub struct ShardPlace {
    pub shard: Shard,
    pub slot: u16,
    pub master: String,
    pub frozen: bool,
}

/// What a move did.
#[derive(Debug, Clone)]
pub struct Moved {
    pub slot: u16,
    pub from: String,
    pub to: String,
    pub keys: usize,
    pub took: Duration,
}

/// Talks to the nodes of one cluster directly (node-wide commands cannot be routed by key).
pub struct Cluster {
    store: Store,
    seed: redis::ConnectionInfo,
}

impl Cluster {
    /// Connects to the cluster `config` names (it must name one).
    pub async fn connect(config: StoreConfig) -> anyhow::Result<Self> {
        Self::open(config, false).await
    }

    /// Connects as `sluice migrate-layout` does: on whatever layout the data has (see
    /// `Store::connect_for_migration`).
    pub async fn connect_for_migration(config: StoreConfig) -> anyhow::Result<Self> {
        Self::open(config, true).await
    }

    async fn open(config: StoreConfig, migrating: bool) -> anyhow::Result<Self> {
        let RedisTarget::Cluster(seeds) = &config.redis else {
            bail!("shards move between the masters of a Redis Cluster: pass --redis-cluster");
        };
        let seed = seeds
            .first()
            .context("no seed node")?
            .as_str()
            .into_connection_info()
            .context("bad seed node address")?;
        let store = if migrating {
            Store::connect_for_migration(config.clone()).await
        } else {
            Store::connect(config.clone()).await
        }
        .context("cannot use the cluster")?;
        Ok(Self { store, seed })
    }

    /// A direct connection to the node at `host:port`, with the seed's credentials.
    pub async fn node(&self, host: &str, port: u16) -> anyhow::Result<MultiplexedConnection> {
        let info = self
            .seed
            .clone()
            .set_addr(ConnectionAddr::Tcp(host.to_owned(), port));
        let c = redis::Client::open(info)?
            .get_multiplexed_async_connection()
            .await
            .with_context(|| format!("cannot reach node {host}:{port}"))?;
        Ok(c)
    }

    /// The masters, as the seed node sees them.
    pub async fn masters(&self) -> anyhow::Result<Vec<Master>> {
        let (host, port) = match self.seed.addr() {
            ConnectionAddr::Tcp(h, p) => (h.clone(), *p),
            other => bail!("unsupported seed address {other:?}"),
        };
        let mut c = self.node(&host, port).await?;
        let text: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async(&mut c)
            .await?;
        Ok(parse_masters(&text))
    }

    /// The hash slot of a shard (its tag's).
    pub async fn slot_of(&self, shard: Shard) -> anyhow::Result<u16> {
        let masters = self.masters().await?;
        let m = masters.first().context("no master")?;
        let mut c = self.node(&m.host, m.port).await?;
        Ok(redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(shard.prefix())
            .query_async(&mut c)
            .await?)
    }

    /// Every shard with its slot and master.
    pub async fn shards(&self) -> anyhow::Result<Vec<ShardPlace>> {
        let masters = self.masters().await?;
        let mut out = Vec::new();
        for shard in self.store.shards().all() {
            let slot = self.slot_of(shard).await?;
            let master = masters
                .iter()
                .find(|m| m.serves(slot))
                .map(Master::address)
                .unwrap_or_else(|| "(unserved)".into());
            let frozen = self.store.is_frozen(shard).await?;
            out.push(ShardPlace {
                shard,
                slot,
                master,
                frozen,
            });
        }
        Ok(out)
    }

    /// Moves shard `number` to the master at `to` (`host:port`): freeze, copy every key of
    /// its slot (the marker last), hand the slot over, unfreeze. Safe to run again after an
    /// interruption.
    pub async fn move_shard(
        &self,
        number: u16,
        to: &str,
        keys_per_call: usize,
    ) -> anyhow::Result<Moved> {
        let began = Instant::now();
        anyhow::ensure!(
            number < self.store.shards().count(),
            "there is no shard {number} (shards 0 to {})",
            self.store.shards().count() - 1
        );
        // A move of the key layout holds every shard it has not converted yet; this move
        // lifts the hold of the shard it moved (step 3 below), which would let this build run
        // on rows not converted yet.
        if self.store.layout_move_under_way().await? {
            bail!(
                "a move of the key layout is under way (`sluice migrate-layout`): run it to the \
                 end first, then move shard {number}"
            );
        }
        let shard = self.store.shards().shard(number);
        let slot = self.slot_of(shard).await?;
        let masters = self.masters().await?;
        let target = masters
            .iter()
            .find(|m| m.address() == to || m.id == to)
            .with_context(|| {
                let known: Vec<String> = masters.iter().map(Master::address).collect();
                format!(
                    "no master {to} in the cluster (masters: {})",
                    known.join(", ")
                )
            })?
            .clone();
        let source = masters
            .iter()
            .find(|m| m.serves(slot))
            .with_context(|| format!("slot {slot} has no master"))?
            .clone();
        let frozen_key = shard.frozen();
        // Both builds' markers (see `Store::freeze_shard`) are copied last.
        let markers = [
            shard.frozen().into_bytes(),
            shard.binary_hold().into_bytes(),
        ];
        let mut moved = 0;
        if source.id != target.id {
            let mut src = self.node(&source.host, source.port).await?;
            let mut tgt = self.node(&target.host, target.port).await?;
            // 0. The target gets this build's Lua library before any of the slot is its own
            // (a cluster does not copy libraries between masters; a master added for this
            // move has none): the first call routed there finds it. Idempotent.
            crate::store::load_library(&mut tgt)
                .await
                .with_context(|| format!("cannot load the Lua library on {}", target.address()))?;
            // 1. Open the slot on the target (idempotent; nothing is redirected to it before
            // the source is MIGRATING), so the target can be asked whether it already holds
            // the marker. A run interrupted after handing the slot to the target finds the
            // target owning it already (it refuses to import its own slot) while the seed may
            // not have heard yet: only the hand-over is left.
            let opened: redis::RedisResult<()> = redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg("IMPORTING")
                .arg(&source.id)
                .query_async(&mut tgt)
                .await;
            let handed_over = match opened {
                Ok(()) => false,
                Err(e) if e.to_string().contains("already the owner") => true,
                Err(e) => return Err(e.into()),
            };
            if !handed_over {
                // 2. Freeze: from here on every script of this shard refuses. A run interrupted
                // after the marker was copied left it on the target, and the source then answers
                // ASK for it: the shard is frozen already (scripts sent to the source find a
                // declared key missing and get TRYAGAIN; those sent on to the target find the
                // marker), so it is not written again.
                let (_, on_target): ((), bool) = redis::pipe()
                    .cmd("ASKING")
                    .cmd("EXISTS")
                    .arg(&frozen_key)
                    .query_async(&mut tgt)
                    .await?;
                if !on_target {
                    self.store.freeze_shard(shard).await?;
                }
                let () = redis::cmd("CLUSTER")
                    .arg("SETSLOT")
                    .arg(slot)
                    .arg("MIGRATING")
                    .arg(&target.id)
                    .query_async(&mut src)
                    .await?;
                // 3. Copy every key, the marker last. REPLACE: the source is the truth while the
                // shard is frozen, so a copy left by an interrupted run is overwritten. Bounded:
                // each round moves up to `keys_per_call` keys, and a frozen shard does not grow.
                let per_call = keys_per_call.max(1);
                for _ in 0..1_000_000 {
                    // A batch and the markers, so markers among them still leave a full batch
                    // of other keys (Redis 7.0 lists the newest keys of a slot first).
                    // Bytes: a layout-5 name holds a binary execution id.
                    let keys: Vec<Vec<u8>> = redis::cmd("CLUSTER")
                        .arg("GETKEYSINSLOT")
                        .arg(slot)
                        .arg(per_call + markers.len())
                        .query_async(&mut src)
                        .await?;
                    let batch = next_batch(&keys, &markers, per_call);
                    if batch.is_empty() {
                        break;
                    }
                    let mut migrate = redis::cmd("MIGRATE");
                    migrate
                        .arg(&target.host)
                        .arg(target.port)
                        .arg("")
                        .arg(0)
                        .arg(10_000)
                        .arg("REPLACE");
                    if let Some(password) = self.seed.redis_settings().password() {
                        match self.seed.redis_settings().username() {
                            Some(user) => migrate.arg("AUTH2").arg(user).arg(password),
                            None => migrate.arg("AUTH").arg(password),
                        };
                    }
                    migrate.arg("KEYS").arg(&batch);
                    let _: redis::Value = migrate.query_async(&mut src).await?;
                    moved += batch.len();
                }
            }
            // 4. Hand the slot over: the target first (it then answers for it), then the
            // source and every other master.
            let () = redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg("NODE")
                .arg(&target.id)
                .query_async(&mut tgt)
                .await?;
            for m in &masters {
                if m.id == target.id {
                    continue;
                }
                let mut c = self.node(&m.host, m.port).await?;
                let () = redis::cmd("CLUSTER")
                    .arg("SETSLOT")
                    .arg(slot)
                    .arg("NODE")
                    .arg(&target.id)
                    .query_async(&mut c)
                    .await?;
            }
        }
        // 5. Unfreeze, on the shard's new master (also finishes an interrupted move whose slot
        // was already handed over).
        self.store.unfreeze_shard(shard).await?;
        Ok(Moved {
            slot,
            from: source.address(),
            to: target.address(),
            keys: moved,
            took: began.elapsed(),
        })
    }
}

/// The keys of one `MIGRATE` call, out of what `CLUSTER GETKEYSINSLOT` listed (up to
/// `per_call` keys and the markers): up to `per_call` keys other than the freeze `markers`,
/// and the markers (together) only once they are the last keys of the slot — so the source
/// refuses the shard's scripts until everything else has arrived, and an interrupted move can
/// always freeze again.
/// Key names are bytes in use (`Vec<u8>`: a layout-5 name holds a binary id).
fn next_batch<'a, K: PartialEq>(listed: &'a [K], markers: &[K], per_call: usize) -> Vec<&'a K> {
    let others: Vec<&K> = listed
        .iter()
        .filter(|k| !markers.contains(k))
        .take(per_call)
        .collect();
    if others.is_empty() {
        listed.iter().filter(|k| markers.contains(k)).collect()
    } else {
        others
    }
}

/// The masters in a `CLUSTER NODES` answer (failed ones left out).
fn parse_masters(text: &str) -> Vec<Master> {
    let mut out = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 8 {
            continue;
        }
        let flags: Vec<&str> = fields[2].split(',').collect();
        if !flags.contains(&"master") || flags.iter().any(|f| f.starts_with("fail")) {
            continue;
        }
        // ip:port@cport[,hostname]
        let addr = fields[1].split('@').next().unwrap_or_default();
        let Some((host, port)) = addr.rsplit_once(':') else {
            continue;
        };
        let Ok(port) = port.parse() else { continue };
        let slots = fields[8..]
            .iter()
            .filter(|s| !s.starts_with('['))
            .filter_map(|s| match s.split_once('-') {
                Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                None => s.parse().ok().map(|a| (a, a)),
            })
            .collect();
        out.push(Master {
            id: fields[0].to_owned(),
            host: host.to_owned(),
            port,
            slots,
        });
    }
    out
}

/// Slots per master, for a summary.
pub fn slot_counts(masters: &[Master]) -> HashMap<String, u32> {
    masters
        .iter()
        .map(|m| {
            let n = m.slots.iter().map(|(a, b)| u32::from(b - a) + 1).sum();
            (m.address(), n)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_nodes_lines_are_read_into_masters() {
        let text = "\
e7d1 127.0.0.1:30001@40001 myself,master - 0 0 1 connected 0-5460 6000 [5461->-f00]
a1b2 127.0.0.1:30002@40002 master - 0 1 2 connected 5461-5999 6001-10922
c3d4 127.0.0.1:30003@40003 master,fail - 0 1 3 disconnected 10923-16383
f5e6 127.0.0.1:30004@40004 slave e7d1 0 1 1 connected
";
        let masters = parse_masters(text);
        assert_eq!(masters.len(), 2);
        assert_eq!(masters[0].id, "e7d1");
        assert_eq!(masters[0].slots, vec![(0, 5460), (6000, 6000)]);
        assert!(masters[0].serves(6000) && !masters[0].serves(5461));
        assert_eq!(masters[1].address(), "127.0.0.1:30002");
        assert_eq!(slot_counts(&masters)["127.0.0.1:30002"], 539 + 4922);
    }

    #[test]
    fn the_marker_is_moved_only_when_it_is_the_last_key() {
        let keys = |ks: &[&str]| ks.iter().map(|k| k.to_string()).collect::<Vec<_>>();
        let m = keys(&["m"]);
        // Redis 7.0 lists the newest key (the marker) first.
        let listed = keys(&["m", "a"]);
        assert_eq!(next_batch(&listed, &m, 1), vec!["a"]);
        let listed = keys(&["a", "b", "m"]);
        assert_eq!(next_batch(&listed, &m, 2), vec!["a", "b"]);
        let listed = keys(&["a", "b", "c"]);
        assert_eq!(next_batch(&listed, &m, 2), vec!["a", "b"]);
        assert_eq!(next_batch(&keys(&["m"]), &m, 1), vec!["m"]);
        assert!(next_batch(&[], &m, 1).is_empty());
    }

    #[test]
    fn both_builds_markers_are_moved_together_after_every_other_key() {
        let keys = |ks: &[&str]| ks.iter().map(|k| k.to_string()).collect::<Vec<_>>();
        let markers = keys(&["m", "m5"]);
        let listed = keys(&["m5", "m", "a"]);
        assert_eq!(next_batch(&listed, &markers, 1), vec!["a"]);
        assert_eq!(next_batch(&listed[..2], &markers, 1), vec!["m5", "m"]);
        // One left behind by an interrupted run goes on its own.
        assert_eq!(next_batch(&keys(&["m5"]), &markers, 1), vec!["m5"]);
    }
}
