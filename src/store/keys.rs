//! Every Redis key name sluice uses, one function per key. Nothing else in the crate formats
//! key names; the Lua scripts build the same names from the shard prefix in
//! `migrations-lua/common.lua` (change both together).
//!
//! All keys of a tenant live in its shard and carry the shard's hash tag (`{s07}`), so each
//! script touches one slot on Redis Cluster. User input never forms a hash tag: only validated
//! ids appear after the tag.

use crate::admission::{ExecutionId, FlowId, Status, TenantId};

/// Version of the key layout this build reads and writes. A change of layout ships as a
/// numbered migration and bumps this.
pub const LAYOUT_VERSION: u32 = 1;

/// The lock that makes one sweeper run at a time across all `serve` processes.
pub fn sweeper_lock() -> &'static str {
    "sluice:{meta}:sweeper"
}

/// The consumer group of every ready stream.
pub const WORKER_GROUP: &str = "workers";

/// The cluster-wide record of settings fixed at first start (shard count, layout version).
pub fn meta() -> &'static str {
    "sluice:{meta}:config"
}

/// Hash tag of access-control data: API-key records, each tenant's set of key ids, and the
/// tenant registry.
///
/// A request carries only its key (`sk_<key id>_<secret>`), so the record must be found from
/// the key id alone, before the tenant (and so its shard) is known. Key ids are random and do
/// not encode a shard; instead all access data shares this one tag. That keeps key creation,
/// revocation and tenant deletion single-slot atomic scripts (also on Redis Cluster), at the
/// cost of one slot serving every authentication read — small hashes read in O(1).
const ACL_PREFIX: &str = "sluice:{acl}:";

/// The prefix of every access-control key; the access scripts get it as an argument.
pub fn acl_prefix() -> &'static str {
    ACL_PREFIX
}

/// An API key's record (a hash: tenant, role, name, created, SHA-256 of the secret). `key_id`
/// is validated (16 lowercase hex) before it gets here.
pub fn api_key(key_id: &str) -> String {
    format!("{ACL_PREFIX}key:{key_id}")
}

/// The ids of a tenant's live API keys (a set).
pub fn tenant_keys(t: &TenantId) -> String {
    format!("{ACL_PREFIX}t:{t}:keys")
}

/// The registry of tenants created through the API (a sorted set, all scores 0, so ordered by
/// id).
pub fn tenants() -> String {
    format!("{ACL_PREFIX}tenants")
}

/// One shard: a hash tag and the keys under it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shard(u16);

impl Shard {
    /// The shard with this number (0-based).
    pub fn new(n: u16) -> Self {
        Self(n)
    }

    /// The shard's number.
    pub fn number(self) -> u16 {
        self.0
    }

    /// The prefix of every key in this shard, e.g. `sluice:{s07}:`; scripts get it as ARGV[1].
    pub fn prefix(self) -> String {
        format!("sluice:{{s{:02}}}:", self.0)
    }

    /// The ready stream (consumer group `workers`): dispatched executions waiting for a worker.
    pub fn ready(self) -> String {
        format!("{}ready", self.prefix())
    }

    /// Running executions by lease expiry (ms): the orphan scan reads only expired ones.
    pub fn leases(self) -> String {
        format!("{}leases", self.prefix())
    }

    /// Failed executions waiting out their retry backoff, by due time (ms). They keep their slot.
    pub fn delayed(self) -> String {
        format!("{}delayed", self.prefix())
    }

    /// The dead-letter stream (capped; evictions are counted in `stats`).
    pub fn dead_letters(self) -> String {
        format!("{}dlq", self.prefix())
    }

    /// Counters of what happened in this shard (completed, fenced, reclaimed, dlq_evicted, ...).
    pub fn stats(self) -> String {
        format!("{}stats", self.prefix())
    }

    /// Tenants that ever admitted into this shard (walked by the sweeper).
    pub fn tenants(self) -> String {
        format!("{}tenants", self.prefix())
    }

    /// Flows a tenant ever admitted (walked by the sweeper to find flow indexes).
    pub fn flows(self, t: &TenantId) -> String {
        format!("{}t:{t}:flows", self.prefix())
    }

    /// An execution's row (a hash).
    pub fn row(self, id: &ExecutionId) -> String {
        format!("{}exec:{id}", self.prefix())
    }

    /// A tenant's own limits (a hash; absent fields mean the server defaults).
    pub fn tenant_config(self, t: &TenantId) -> String {
        format!("{}t:{t}:cfg", self.prefix())
    }

    /// Ids of a tenant's executions holding a concurrency slot (dispatched or running).
    pub fn slots(self, t: &TenantId) -> String {
        format!("{}t:{t}:slots", self.prefix())
    }

    /// A tenant's executions over its concurrency limit, FIFO by admission time (a sorted set).
    pub fn waiting(self, t: &TenantId) -> String {
        format!("{}t:{t}:waiting", self.prefix())
    }

    /// A tenant's force-deleted executions whose handlers still run (set): hidden from every
    /// read, still holding their slots, counted as running in the tenant's usage.
    pub fn deleting(self, t: &TenantId) -> String {
        format!("{}t:{t}:deleting", self.prefix())
    }

    /// A tenant's executions in one status (sorted set, all scores 0, ordered by id = age).
    pub fn status_index(self, t: &TenantId, s: Status) -> String {
        format!("{}t:{t}:st:{}", self.prefix(), s.as_str())
    }

    /// A tenant's executions of one flow in one status (same shape as `status_index`).
    pub fn flow_index(self, t: &TenantId, f: &FlowId, s: Status) -> String {
        format!("{}t:{t}:fl:{f}:{}", self.prefix(), s.as_str())
    }

    /// A tenant's dedup mapping for a key digest: `<execution id>:<request fingerprint>`.
    pub fn dedup(self, t: &TenantId, digest: &str) -> String {
        format!("{}t:{t}:dd:{digest}", self.prefix())
    }
}

/// Maps tenants to shards. The count is fixed at first start and recorded in `meta()`, since
/// changing it would move tenants' keys.
#[derive(Debug, Clone, Copy)]
pub struct ShardMap {
    count: u16,
}

impl ShardMap {
    /// A map over `count` shards (at least 1).
    pub fn new(count: u16) -> Self {
        Self {
            count: count.max(1),
        }
    }

    /// How many shards there are.
    pub fn count(self) -> u16 {
        self.count
    }

    /// The shard of a tenant: FNV-1a of its id, modulo the shard count. Stable across
    /// processes, builds and platforms (unlike `std`'s hasher).
    pub fn shard_of(self, t: &TenantId) -> Shard {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in t.as_str().bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        Shard((h % u64::from(self.count)) as u16)
    }

    /// Every shard.
    pub fn all(self) -> impl Iterator<Item = Shard> {
        (0..self.count).map(Shard)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_always_maps_to_the_same_shard() {
        let map = ShardMap::new(16);
        let t = TenantId::parse("acme").unwrap();
        assert_eq!(map.shard_of(&t), map.shard_of(&t));
        assert!(map.shard_of(&t).number() < 16);
        // Pinned: a change would move existing tenants away from their keys. FNV-1a-64 of
        // "acme" is 0x0724d383f4f6de0f (reference implementation), and that mod 16 is 15.
        assert_eq!(map.shard_of(&t).number(), 15);
    }

    #[test]
    fn every_key_of_a_tenant_carries_its_shard_tag() {
        let t = TenantId::parse("acme").unwrap();
        let s = ShardMap::new(16).shard_of(&t);
        let tag = format!("{{s{:02}}}", s.number());
        let id = ExecutionId::new();
        let f = FlowId::parse("demo.echo").unwrap();
        for k in [
            s.ready(),
            s.row(&id),
            s.slots(&t),
            s.waiting(&t),
            s.tenant_config(&t),
            s.status_index(&t, Status::Queued),
            s.flow_index(&t, &f, Status::Failed),
            s.dedup(&t, "ab"),
        ] {
            assert_eq!(k.find('{'), Some(7), "{k}");
            assert!(k.contains(&tag), "{k}");
        }
    }

    #[test]
    fn access_keys_share_one_tag() {
        let t = TenantId::parse("acme").unwrap();
        for k in [api_key("0123456789abcdef"), tenant_keys(&t), tenants()] {
            assert!(k.starts_with(acl_prefix()), "{k}");
            assert!(k.starts_with("sluice:{acl}:"), "{k}");
        }
    }
}
