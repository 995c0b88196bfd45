//! Every Redis key name sluice uses, one function per key, and `parse` to read a name back.
//! Nothing else in the crate or the benchmark formats or matches key names (a few tests spell
//! names out on purpose, to pin the layout an operator sees); the Lua scripts build the same
//! names from the prefix in `migrations-lua/common.lua` and `acl_keys.lua` (change both
//! together: `tests/api/fences.rs` runs those builders on Redis and compares them with these).
//!
//! All keys of a tenant live in its shard and carry the shard's hash tag (`{s07.19}`, see
//! `layout`), so each script touches one slot on Redis Cluster. User input never forms a hash
//! tag: only validated ids appear after the tag.
//!
//! Long on purpose (about 700 lines before its tests): it is the only file that formats a key
//! name, so every key's layout, its hash tag and its kind are read and checked in one place.

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

use super::layout::Layout;
use crate::domain::{ExecutionId, Fingerprint, FlowId, Status, TenantId};

/// Every sluice key starts with this.
const ROOT: &str = "sluice:";

/// Hash tag of the cluster-wide records: the settings fixed at first start and the sweeper
/// lock.
const META_PREFIX: &str = "sluice:{meta}:";

/// The prefix of the `{meta}` keys (`ARGV[1]` of the scripts on them).
pub fn meta_prefix() -> &'static str {
    META_PREFIX
}

/// The freeze marker of the `{meta}` tag (see `Shard::frozen`).
pub fn meta_frozen() -> &'static str {
    "sluice:{meta}:hold"
}

/// The tenants pinned to dedicated shards (a hash: `t:<tenant>` → shard number, and
/// `s:<number>` → tenant; see `Store::pin_tenant`).
pub fn pins() -> &'static str {
    "sluice:{meta}:pins"
}

/// The Lua libraries of the builds that run (a hash: library name → when a process of that
/// build last said it runs, ms on Redis's clock; see `Store::retire_libraries`).
pub fn libraries() -> &'static str {
    "sluice:{meta}:libraries"
}

/// The character a status's members start with in a tenant's listing (`Shard::listing`);
/// `listing_char(None)` is the scheduled executions' second member. `LISTING_CHAR` in
/// `migrations-lua/common.lua` holds the same (a test checks them against each other).
pub fn listing_char(s: Option<Status>) -> char {
    match s {
        Some(Status::Queued) => 'q',
        Some(Status::Running) => 'r',
        Some(Status::Completed) => 'c',
        Some(Status::Failed) => 'f',
        Some(Status::Cancelled) => 'x',
        None => 's',
    }
}

/// An execution id in its stored form (see `Shard::stored_id`; also a request fingerprint's,
/// `Shard::stored_fingerprint`): bytes, since a binary id (layout 5) is not UTF-8. Sent to
/// Redis as one argument. Held inline (no allocation): it is
/// built several times per admission.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct StoredId {
    bytes: [u8; 32],
    len: u8,
}

impl AsRef<[u8]> for StoredId {
    fn as_ref(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

impl std::fmt::Debug for StoredId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(self.as_ref()))
    }
}

impl redis::ToRedisArgs for StoredId {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        out.write_arg(self.as_ref());
    }
}

impl redis::ToSingleRedisArg for StoredId {}

/// The lexical bounds (`[min`, `(max`) of the members of one status (`None`: the scheduled
/// ones) in a listing, all flows: for `ZLEXCOUNT` and `ZRANGE ... BYLEX`.
pub fn listing_range(s: Option<Status>) -> (String, String) {
    let c = listing_char(s);
    (format!("[{c}"), format!("({}", char::from(c as u8 + 1)))
}

/// The lock that makes one sweeper run at a time across all `serve` processes.
pub fn sweeper_lock() -> &'static str {
    "sluice:{meta}:sweeper"
}

/// The Pub/Sub channel a worker (by its consumer name) listens on to hear at once that an
/// execution it runs was cancelled or force-deleted (see `tell_holder` in
/// `migrations-lua/common.lua`). A channel, not a key: on a cluster a publish reaches every
/// node, so the worker may listen on any of them.
pub fn stop_channel(consumer: &str) -> String {
    format!("{ROOT}stop:{consumer}")
}

/// What every pull worker's consumer name starts with (no `sluice worker`'s has a `/`).
const PULL_CONSUMER: &str = "pull/";

/// The consumer name (the lease holder Redis records, in `held:<consumer>` and the stop
/// channel) of pull worker `worker` of the API: `pull/<tenant>/<worker>` for a tenant's
/// `worker` key, `pull/*/<worker>` for the platform admin (no tenant id has a `*` or a `/`,
/// and a worker id neither), so two tenants' workers never share a name.
pub fn pull_consumer(tenant: Option<&crate::domain::TenantId>, worker: &str) -> String {
    match tenant {
        Some(t) => format!("{PULL_CONSUMER}{}/{worker}", t.as_str()),
        None => format!("{PULL_CONSUMER}*/{worker}"),
    }
}

/// The pattern of every pull worker's stop channel (one `PSUBSCRIBE` hears them all), and the
/// prefix to strip from a channel to get its consumer name back.
pub fn pull_stop_pattern() -> (String, String) {
    (
        format!("{}*", stop_channel(PULL_CONSUMER)),
        stop_channel(""),
    )
}

/// What every execution's Pub/Sub channel name starts with (see `events_channel`).
const EVENTS_CHANNEL: &str = "sluice:ev:";

/// The Pub/Sub channel on which the scripts announce changes of execution `id` while a server
/// waits on it (`notify()` in `migrations-lua/common.lua`). Not a key: it has no hash tag, and
/// on a cluster a PUBLISH reaches the subscribers of every node.
pub fn events_channel(id: &ExecutionId) -> String {
    format!("{EVENTS_CHANNEL}{id}")
}

/// The Pub/Sub channel on which a script announces that a tenant's webhook outbox was empty
/// and is not any more (the message is the tenant id): it wakes `serve`'s deliverers. Mirrors
/// `WEBHOOK_CHANNEL` of `migrations-lua/common.lua`.
pub const WEBHOOK_CHANNEL: &str = "sluice:wh";

/// The execution a message on an `events_channel` is about; `None` for any other channel.
pub fn events_channel_execution(channel: &str) -> Option<ExecutionId> {
    channel
        .strip_prefix(EVENTS_CHANNEL)
        .and_then(|id| ExecutionId::parse(id).ok())
}

/// The Pub/Sub channel on which a change of who may call is announced (a key revoked, a
/// tenant deleted, a key created; see `crate::revocation`). Not a key: on a cluster a PUBLISH
/// reaches the subscribers of every node.
pub fn access_channel() -> &'static str {
    "sluice:access"
}

/// The consumer group of every ready stream.
pub const WORKER_GROUP: &str = "workers";

/// The cluster-wide record of settings fixed at first start (shard count, layout version).
pub fn meta() -> &'static str {
    "sluice:{meta}:config"
}

/// The shards `sluice migrate-layout` has converted to layout 3 while a move is under way (a
/// set of shard numbers; gone once the meta record says layout 3).
pub fn layout_converted() -> &'static str {
    "sluice:{meta}:converted"
}

/// A glob (`SCAN ... MATCH`) matching every execution row of every shard.
pub fn row_pattern() -> &'static str {
    "sluice:{s*}:exec:*"
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

/// The freeze marker of the access data (see `Shard::frozen`).
pub fn acl_frozen() -> String {
    format!("{ACL_PREFIX}hold")
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

/// One shard: a number, a hash tag and the keys under it. Made by a `ShardMap` (which knows
/// the layout, and so the tag) or read back from a key name by `parse`.
///
/// Equal, ordered and hashed by number and tag only: a shard read back by `parse` is the same
/// shard as the map's, whatever id form the map gave it.
#[derive(Debug, Clone, Copy)]
pub struct Shard {
    number: u16,
    tag: &'static str,
    /// Whether its executions' ids are stored as their 16 bytes (layout 5, `Layout::Binary`)
    /// rather than 32 hex digits: known from the map's layout, so the one build and the one
    /// Lua library serve either, as told by what the store passes (`stored_id`).
    binary: bool,
}

impl PartialEq for Shard {
    fn eq(&self, other: &Self) -> bool {
        (self.number, self.tag) == (other.number, other.tag)
    }
}

impl Eq for Shard {}

impl PartialOrd for Shard {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Shard {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.number, self.tag).cmp(&(other.number, other.tag))
    }
}

impl std::hash::Hash for Shard {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (self.number, self.tag).hash(state);
    }
}

impl Shard {
    /// An execution id as this shard stores it: in a key name (`row`, `void`), a member
    /// (`listing_member`, the queues, the timer set, the slot sets, the dedup mapping) and
    /// every script argument that names an execution. The one place that decides the form:
    /// the 16 bytes (`ExecutionId::to_bytes`) at layout 5, the 32 hex digits before. Hex stays
    /// only where people or other processes read it (API answers, the dead-letter record's
    /// `execution_id`, the webhook outbox's `id`, channels), which the Lua formats itself.
    pub fn stored_id(self, id: &ExecutionId) -> StoredId {
        let mut bytes = [0u8; 32];
        if self.binary {
            bytes[..16].copy_from_slice(&id.to_bytes());
            return StoredId { bytes, len: 16 };
        }
        let hex = id.as_str().as_bytes();
        bytes[..hex.len()].copy_from_slice(hex);
        StoredId {
            bytes,
            len: hex.len() as u8,
        }
    }

    /// A request's fingerprint as this shard stores it in a dedup mapping: its 8 bytes at
    /// layout 5 (the mapping is then `<id 16><fingerprint 8>`, no separator: a reader tells
    /// the form by its length, 24), its 16 hex digits before (`<id>:<fingerprint>`, 49).
    /// Same rule as `stored_id`, so a mapping's two parts are always of one layout.
    /// A dedup key's digest (32 hex digits, `DedupKey::digest`, or '' for none) as this
    /// shard stores it in the row's `dh`: its 16 bytes at layout 5, so that the row keeps its
    /// listpack size class with the fingerprint (`fp`) beside it, which lets the completion
    /// move the mapping without reading it (`dedup_end()` in common.lua); hex before. Key
    /// names (`dd:`, `ddb:`) stay hex at every layout: the Lua formats them from the bytes.
    pub fn stored_digest(self, hex: &str) -> StoredId {
        let mut bytes = [0u8; 32];
        if self.binary && hex.len() == 32 {
            for (i, b) in bytes[..16].iter_mut().enumerate() {
                *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap_or(0);
            }
            return StoredId { bytes, len: 16 };
        }
        bytes[..hex.len().min(32)].copy_from_slice(&hex.as_bytes()[..hex.len().min(32)]);
        StoredId {
            bytes,
            len: hex.len().min(32) as u8,
        }
    }

    pub fn stored_fingerprint(self, fp: &Fingerprint) -> StoredId {
        let mut bytes = [0u8; 32];
        if self.binary {
            bytes[..8].copy_from_slice(&fp.to_bytes());
            return StoredId { bytes, len: 8 };
        }
        let hex = fp.as_str().as_bytes();
        bytes[..hex.len()].copy_from_slice(hex);
        StoredId {
            bytes,
            len: hex.len() as u8,
        }
    }

    /// Whether this shard stores ids as their 16 bytes (layout 5; see `stored_id`).
    pub fn binary_ids(self) -> bool {
        self.binary
    }

    /// An execution's member in its tenant's listing: `<status char><flow>\0<id>` (a flow id
    /// never holds a NUL, so the NUL ends it unambiguously, and the id after it may hold any
    /// byte). Bytes, not text: the id is in its stored form (`stored_id`).
    pub fn listing_member(self, s: Option<Status>, f: &FlowId, id: &ExecutionId) -> Vec<u8> {
        let id = self.stored_id(id);
        let mut m = Vec::with_capacity(2 + f.as_str().len() + id.as_ref().len());
        m.push(listing_char(s) as u8);
        m.extend_from_slice(f.as_str().as_bytes());
        m.push(0);
        m.extend_from_slice(id.as_ref());
        m
    }

    /// The bound, in this shard's stored id form, between the ids of executions admitted
    /// before `ms` and those admitted at or after it (an id, UUIDv7, starts with its 48-bit
    /// Unix time in ms): 6 bytes at layout 5, 12 hex digits before. Times beyond 48 bits are
    /// clamped (year 10889).
    pub fn id_time_bound(self, ms: u64) -> Vec<u8> {
        let ms = ms.min((1 << 48) - 1);
        match self.binary {
            true => ms.to_be_bytes()[2..].to_vec(),
            false => format!("{ms:012x}").into_bytes(),
        }
    }

    /// The shard's number.
    pub fn number(self) -> u16 {
        self.number
    }

    /// The text of its hash tag, e.g. `s07.19` (layout 2) or `s07` (layout 1).
    pub fn tag(self) -> &'static str {
        self.tag
    }

    /// The prefix of every key in this shard, e.g. `sluice:{s07.19}:`; scripts get it as
    /// `ARGV[1]`.
    pub fn prefix(self) -> String {
        format!("{ROOT}{{{}}}:", self.tag)
    }

    /// The shard's label in metrics and logs, e.g. `s07` (the same in every layout).
    pub fn label(self) -> String {
        format!("s{:02}", self.number)
    }

    /// The freeze marker: while it exists every script of the shard refuses to run (with a
    /// TRYAGAIN error, before touching anything), so the shard's slot can be moved between
    /// cluster nodes without a script running half on each side.
    ///
    /// Named `hold` since layout 3: builds of layouts 1 and 2 check `frozen` (`old_frozen`),
    /// so `sluice migrate-layout` can stop them in a shard and let this build serve it, or
    /// the other way round.
    pub fn frozen(self) -> String {
        format!("{}hold", self.prefix())
    }

    /// The freeze marker a layout-5 build will check (`<p>hold:5`) instead of `frozen`, so
    /// that each build can be fenced out of a shard on its own during `sluice
    /// migrate-layout` to 5 (docs/layout-5-plan.md §2.2). This build's guard still checks
    /// `frozen`; whatever freezes a shard for a move (`Store::freeze_shard`: `sluice cluster
    /// move-shard`, `sluice migrate-layout`) sets and clears both, so a layout-5 process
    /// running beside this one is fenced out of a moving shard too.
    pub fn binary_hold(self) -> String {
        format!("{}hold:5", self.prefix())
    }

    /// The freeze marker builds of layouts 1 and 2 check (see `frozen`): `sluice
    /// migrate-layout` sets it when it converts the shard, and leaves it for them.
    pub fn old_frozen(self) -> String {
        format!("{}frozen", self.prefix())
    }

    /// The marker of an abandoned admission of `id` (see `migrations-lua/abandon.lua`): while it
    /// lives, an admission of that id that arrives late is refused.
    pub fn void(self, id: &ExecutionId) -> Vec<u8> {
        self.id_key("void:", id)
    }

    /// The key `<prefix><kind><id>` of an execution id in its stored form (`stored_id`), built
    /// in one allocation (a row and a void marker are named on every admission).
    fn id_key(self, kind: &str, id: &ExecutionId) -> Vec<u8> {
        let id = self.stored_id(id);
        let (tag, id) = (self.tag.as_bytes(), id.as_ref());
        let mut k = Vec::with_capacity(ROOT.len() + tag.len() + 3 + kind.len() + id.len());
        k.extend_from_slice(ROOT.as_bytes());
        k.push(b'{');
        k.extend_from_slice(tag);
        k.extend_from_slice(b"}:");
        k.extend_from_slice(kind.as_bytes());
        k.extend_from_slice(id);
        k
    }

    /// Schema 1's ready stream (consumer group `workers`), read only by the migration to
    /// schema 2 (`migrations-lua/migrate_dispatch.lua`), which deletes it.
    pub fn ready(self) -> String {
        format!("{}ready", self.prefix())
    }

    /// The tenants that can start something now (a queued runnable execution and a free
    /// slot), scored by virtual time: a start takes the least (see "Dispatch" in
    /// `migrations-lua/common.lua`).
    pub fn runnable(self) -> String {
        format!("{}runnable", self.prefix())
    }

    /// The fair share's bookkeeping (a hash): `clock` (the virtual start tag of the last start),
    /// `weight` (the sum of the runnable tenants' weights) and `vt:<tenant>` (the virtual time
    /// a tenant had when it last left the runnable set: read when it comes back, at the larger
    /// of it and the clock; left as it is meanwhile).
    pub fn sched(self) -> String {
        format!("{}sched", self.prefix())
    }

    /// The start log: a capped stream with one entry per start — tenant `t`, virtual start
    /// tag `vt`, weight `w` — from which tests and the fault suite's checker prove the fair
    /// share.
    pub fn starts(self) -> String {
        format!("{}starts", self.prefix())
    }

    /// The executions one worker (`consumer`) holds leases of in this shard (a set): what
    /// `adopt` reads after a start whose answer was lost.
    pub fn held(self, consumer: &str) -> String {
        format!("{}held:{consumer}", self.prefix())
    }

    /// The shard's doorbell: a wake-up marker (a sorted set of one member) set whenever a tenant
    /// can start something or a new earliest due time is set, that workers with a free slot
    /// wait on with `BZPOPMIN` instead of polling (see `ring` in `migrations-lua/common.lua`).
    /// Built inside the scripts from the prefix.
    pub fn bell(self) -> String {
        format!("{}bell", self.prefix())
    }

    /// The adoption barrier of one worker (`consumer`) in this shard: the number of the last
    /// start-capable call (a start, or a completion that asked for the next runs) that the
    /// worker's last `adopt` covered. A call of that number or lower that reaches Redis later
    /// (its answer was lost, and Redis ran it after the `adopt`: calls on two connections are
    /// resumed in any order after a stall) starts nothing, so it cannot start a run nobody
    /// knows of. Expires a day after the `adopt` that wrote it.
    pub fn adopted(self, consumer: &str) -> String {
        format!("{}adopted:{consumer}", self.prefix())
    }

    /// Running executions by lease expiry (ms): the orphan scan reads only expired ones.
    pub fn leases(self) -> String {
        format!("{}leases", self.prefix())
    }

    /// The shard's one timer set: queued executions not due yet — scheduled ones and retries
    /// waiting out their backoff — by due time (ms). They hold no slot.
    pub fn delayed(self) -> String {
        format!("{}delayed", self.prefix())
    }

    /// The dead-letter stream (capped; evictions are counted in `stats`).
    pub fn dead_letters(self) -> String {
        format!("{}dlq", self.prefix())
    }

    /// The marker of a shard whose dead-letter indexes and counts are being rebuilt from its
    /// stream (`migrations-lua/dlq_reindex.lua`, run when `serve` starts). An older build set it to the
    /// first record it indexed: the records below it were in no index.
    pub fn dead_letters_indexed(self) -> String {
        format!("{}dlq_indexed", self.prefix())
    }

    /// A tenant's dead-letter index: a stream holding the ids of its records in the shard's
    /// dead-letter stream (same ids, no data), so its listing reads only its own records, and
    /// its oldest record (the first an eviction takes) is found at once.
    pub fn tenant_dead_letters(self, t: &TenantId) -> String {
        format!("{}t:{t}:dlq", self.prefix())
    }

    /// The ids of the shard's dead-letter records that belong to no tenant (poison records
    /// of schema 1): their holder's index, as `tenant_dead_letters` is a tenant's.
    pub fn poison_dead_letters(self) -> String {
        format!("{}dlq_poison", self.prefix())
    }

    /// How many dead-letter records each holder (a tenant, or `""` for the records of no
    /// tenant) has in the shard's stream: a sorted set, so that the holder with the most — the
    /// one that loses its oldest when the shard's cap is hit — is found in O(log n).
    pub fn dead_letter_holders(self) -> String {
        format!("{}dlq_holders", self.prefix())
    }

    /// How many dead-letter records of each holder (a tenant, or `""`) the caps evicted: a
    /// hash, a field only for a holder that lost one, so a tenant can be told.
    pub fn dead_letters_evicted(self) -> String {
        format!("{}dlq_evicted", self.prefix())
    }

    /// The holders a rebuild of the shard's dead-letter indexes has met so far (see
    /// `dead_letters_indexed`); deleted with the marker when the rebuild ends.
    pub fn dead_letters_rebuilt(self) -> String {
        format!("{}dlq_rebuilt", self.prefix())
    }

    /// Counters of what happened in this shard (completed, fenced, reclaimed, dlq_evicted, ...).
    pub fn stats(self) -> String {
        format!("{}stats", self.prefix())
    }

    /// Tenants that ever admitted into this shard (walked by the sweeper).
    pub fn tenants(self) -> String {
        format!("{}tenants", self.prefix())
    }

    /// The shard's tenants being deleted (a set): each is marked in its cfg (`deleting`) and
    /// its data is removed in bounded steps (`migrations-lua/tenant_reap.lua`) by the server
    /// that deleted it, and by the sweeper for what a stopped server left.
    pub fn reaping(self) -> String {
        format!("{}reaping", self.prefix())
    }

    /// Flows a tenant ever admitted (walked by the sweeper to find flow indexes).
    pub fn flows(self, t: &TenantId) -> String {
        format!("{}t:{t}:flows", self.prefix())
    }

    /// An execution's row (a hash). Bytes, not text: the id is in its stored form
    /// (`stored_id`), which layout 5 makes binary.
    pub fn row(self, id: &ExecutionId) -> Vec<u8> {
        self.id_key("exec:", id)
    }

    /// A tenant's own limits (a hash; absent fields mean the server defaults).
    pub fn tenant_config(self, t: &TenantId) -> String {
        format!("{}t:{t}:cfg", self.prefix())
    }

    /// Ids of a tenant's executions holding a concurrency slot: the running ones.
    pub fn slots(self, t: &TenantId) -> String {
        format!("{}t:{t}:slots", self.prefix())
    }

    /// A tenant's queue: its runnable executions by order key (the time each became runnable,
    /// shifted by its priority), started first to last as the tenant gets slots.
    pub fn waiting(self, t: &TenantId) -> String {
        format!("{}t:{t}:waiting", self.prefix())
    }

    /// A concurrency key's runnable executions by order key (`digest`: the key's
    /// `ConcurrencyKey::digest`); only its first is in the tenant's queue, and only while the
    /// key has room (see "Concurrency keys" in `migrations-lua/common.lua`).
    pub fn key_queue(self, t: &TenantId, digest: &str) -> String {
        format!("{}t:{t}:k:{digest}:q", self.prefix())
    }

    /// A concurrency key's running executions (set): counted against the key's limit.
    pub fn key_running(self, t: &TenantId, digest: &str) -> String {
        format!("{}t:{t}:k:{digest}:run", self.prefix())
    }

    /// A tenant's per-key limit overrides (hash: key digest -> `<limit>:<key as given>`).
    pub fn key_limits(self, t: &TenantId) -> String {
        format!("{}t:{t}:klim", self.prefix())
    }

    /// A tenant's concurrency keys at their limit with work waiting (set of digests): what a
    /// raised limit walks.
    pub fn key_blocked(self, t: &TenantId) -> String {
        format!("{}t:{t}:kblk", self.prefix())
    }

    /// A tenant's rate limit state: the theoretical arrival time of its next start (ms, a
    /// string), expiring when the bucket is full again (see "Rate limits" in
    /// `migrations-lua/common.lua`).
    pub fn tat(self, t: &TenantId) -> String {
        format!("{}t:{t}:tat", self.prefix())
    }

    /// A concurrency key's rate limit state (as `tat`, for the tenant's per-key rate).
    pub fn key_tat(self, t: &TenantId, digest: &str) -> String {
        format!("{}t:{t}:k:{digest}:tat", self.prefix())
    }

    /// A tenant's webhook outbox (stream): the changes its webhook is still to be told of,
    /// appended by the scripts that make them (see "Webhooks" in `migrations-lua/common.lua`).
    pub fn outbox(self, t: &TenantId) -> String {
        format!("{}t:{t}:wh", self.prefix())
    }

    /// A tenant's webhook delivery log (stream, capped): the last attempts, each with its
    /// answer; written by `serve`'s deliverer only.
    pub fn delivery_log(self, t: &TenantId) -> String {
        format!("{}t:{t}:whlog", self.prefix())
    }

    /// Which `serve` delivers a tenant's outbox now (a string with a time-out): one at a
    /// time, so one execution's events go out in order.
    pub fn delivery_lock(self, t: &TenantId) -> String {
        format!("{}t:{t}:whlock", self.prefix())
    }

    /// The tenant's batch admission in flight (string: its holder, with a TTL): one batch per
    /// tenant at a time.
    pub fn batch_lock(self, t: &TenantId) -> String {
        format!("{}t:{t}:batch", self.prefix())
    }

    /// The shard's tenants that have a webhook (set): where a deliverer looks for outboxes.
    pub fn webhooks(self) -> String {
        format!("{}webhooks", self.prefix())
    }

    /// A tenant's retained terminal executions by expiry bucket (hash: the bucket's end, Unix
    /// seconds -> `<logical bytes>:<rows>`), drained from its storage counters when a bucket
    /// ends (see "Storage" in `migrations-lua/common.lua`).
    pub fn retained(self, t: &TenantId) -> String {
        format!("{}t:{t}:ret", self.prefix())
    }

    /// A tenant's force-deleted executions whose handlers still run (set): hidden from every
    /// read, still holding their slots, counted as running in the tenant's usage.
    pub fn deleting(self, t: &TenantId) -> String {
        format!("{}t:{t}:deleting", self.prefix())
    }

    /// A tenant's listing (layout 4, sorted set, all scores 0): one member per execution,
    /// `<status char><flow>\0<id>` (`listing_member`), and a second one under `s` while it is
    /// scheduled; so one status (of one flow) is one lexical range ordered by id, which is
    /// age (`listing_range`). What every listing, count and repair reads; see "Listing" in
    /// `migrations-lua/common.lua`.
    pub fn listing(self, t: &TenantId) -> String {
        format!("{}t:{t}:ls", self.prefix())
    }

    /// Layout 3 and older: a tenant's executions in one status (sorted set, all scores 0,
    /// ordered by id = age). Read only by `sluice migrate-layout`, which builds the listing
    /// from it.
    pub fn status_index(self, t: &TenantId, s: Status) -> String {
        format!("{}t:{t}:st:{}", self.prefix(), s.as_str())
    }

    /// Layout 3 and older: a tenant's scheduled executions (queued, on the timer set), same
    /// shape as `status_index` (read only by `sluice migrate-layout`).
    pub fn scheduled_index(self, t: &TenantId) -> String {
        format!("{}t:{t}:st:scheduled", self.prefix())
    }

    /// Layout 3 and older: a tenant's scheduled executions of one flow (same shape as
    /// `scheduled_index`; read only by `sluice migrate-layout`).
    pub fn scheduled_flow_index(self, t: &TenantId, f: &FlowId) -> String {
        format!("{}t:{t}:fl:{f}:scheduled", self.prefix())
    }

    /// Layout 3 and older: a tenant's executions of one flow in one status (same shape as
    /// `status_index`; read only by `sluice migrate-layout`).
    pub fn flow_index(self, t: &TenantId, f: &FlowId, s: Status) -> String {
        format!("{}t:{t}:fl:{f}:{}", self.prefix(), s.as_str())
    }

    /// A tenant's dedup mapping for a key digest: `<execution id>:<request fingerprint>` (at
    /// layout 5 `<id 16><fingerprint 8>`, see `stored_fingerprint`), as a
    /// string key once its execution ended (with the dedup TTL); a live one is a field of
    /// `dedup_bucket` instead.
    pub fn dedup(self, t: &TenantId, digest: &str) -> String {
        format!("{}t:{t}:dd:{digest}", self.prefix())
    }

    /// The hash of a tenant's live dedup mappings that holds the one of `digest` (one of 256,
    /// named by the digest's first two hex digits; the field is `dedup_field(digest)`). Live
    /// mappings are fields so that they stay listpack-encoded on Redis's default thresholds
    /// (about 80 bytes each instead of a key's 184); hash fields cannot expire on Redis 7.0,
    /// so an ended execution's mapping moves to `dedup`.
    pub fn dedup_bucket(self, t: &TenantId, digest: &str) -> String {
        format!(
            "{}t:{t}:ddb:{}",
            self.prefix(),
            digest.get(..2).unwrap_or(digest)
        )
    }

    /// A tenant's per-minute counters of one UTC day (`day` = Unix ms / 86,400,000): a string
    /// of fixed-size minute records the scripts update with `BITFIELD` (layout in
    /// `super::trends`). Built inside the scripts (the day comes from Redis's clock), expires
    /// 25 hours after its day.
    pub fn trends(self, t: &TenantId, day: u64) -> String {
        format!("{}t:{t}:m:{day}", self.prefix())
    }

    /// When a tenant's current burst of starts began (Unix ms; a string, expiring after 10
    /// minutes): written by a start that follows a minute without one, read by the forecast
    /// (`super::forecast`) so a tenant that just became busy is measured from its first
    /// start, not from the start of that minute. Built inside the scripts.
    pub fn burst(self, t: &TenantId) -> String {
        format!("{}t:{t}:burst", self.prefix())
    }

    /// The same counters summed over every tenant of the shard, so the platform-wide series
    /// costs one read per shard, not one per tenant.
    pub fn shard_trends(self, day: u64) -> String {
        format!("{}m:{day}", self.prefix())
    }

    /// Tenants of this shard that may have queued or running executions (a set, registered
    /// tenants or not): "tenants with work now" reads it and checks each member's indexes.
    pub fn busy(self) -> String {
        format!("{}busy", self.prefix())
    }
}

/// The field of a live dedup mapping in its bucket (`Shard::dedup_bucket`): the digest after
/// the two hex digits that name the bucket.
pub fn dedup_field(digest: &str) -> &str {
    digest.get(2..).unwrap_or("")
}

/// The one copy of each tag text: `Shard` stays `Copy` and cheap, and a process holds at most
/// a few dozen tags (its shard count, in one or two layouts, plus what `parse` read back).
fn intern(tag: String) -> &'static str {
    static TAGS: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
    let mut tags = TAGS.get_or_init(Mutex::default).lock().expect("tag table");
    if let Some(t) = tags.get(tag.as_str()) {
        return t;
    }
    let t: &'static str = Box::leak(tag.into_boxed_str());
    tags.insert(t);
    t
}

/// Maps tenants to shards. The count and the layout are fixed at first start and recorded in
/// `meta()`, since changing either would move tenants' keys. Tenants hash to the first `count`
/// shards; the `dedicated` ones after them are kept for tenants pinned to a shard of their
/// own (`Store::pin_tenant`).
#[derive(Debug, Clone, Copy)]
pub struct ShardMap {
    count: u16,
    dedicated: u16,
    layout: Layout,
    /// Each shard's tag, computed once.
    tags: &'static [&'static str],
}

impl ShardMap {
    /// Hashed shards a new deployment records at first start (`--shards`).
    pub const DEFAULT_SHARDS: u16 = 16;
    /// Dedicated shards a new deployment records at first start (`--dedicated-shards`).
    pub const DEFAULT_DEDICATED: u16 = 2;

    /// A map over `count` shards (at least 1) named by `layout`, none dedicated.
    pub fn new(count: u16, layout: Layout) -> Self {
        Self::with_dedicated(count, 0, layout)
    }

    /// A map over `count` hashed and `dedicated` dedicated shards named by `layout`.
    pub fn with_dedicated(count: u16, dedicated: u16, layout: Layout) -> Self {
        /// The tags of each (count, dedicated, layout) a map was made for.
        type Tags = Vec<(u16, u16, Layout, &'static [&'static str])>;
        static MAPS: OnceLock<Mutex<Tags>> = OnceLock::new();
        let count = count.max(1);
        let dedicated = dedicated.min(u16::MAX - count);
        let mut maps = MAPS.get_or_init(Mutex::default).lock().expect("map table");
        let found = maps
            .iter()
            .find(|(c, d, l, _)| *c == count && *d == dedicated && *l == layout);
        let tags = match found {
            Some((_, _, _, tags)) => *tags,
            None => {
                let tags: Vec<&'static str> = (0..count + dedicated)
                    .map(|n| intern(layout.tag(n, count)))
                    .collect();
                let tags: &'static [&'static str] = Box::leak(tags.into_boxed_slice());
                maps.push((count, dedicated, layout, tags));
                tags
            }
        };
        Self {
            count,
            dedicated,
            layout,
            tags,
        }
    }

    /// How many shards tenants hash to.
    pub fn count(self) -> u16 {
        self.count
    }

    /// How many shards are kept for pinned tenants (numbered from `count()` on).
    pub fn dedicated(self) -> u16 {
        self.dedicated
    }

    /// How shard tags are named.
    pub fn layout(self) -> Layout {
        self.layout
    }

    /// Shard `n` (taken modulo the number of all shards).
    pub fn shard(self, n: u16) -> Shard {
        let number = n % (self.count + self.dedicated);
        Shard {
            number,
            tag: self.tags[usize::from(number)],
            binary: self.layout == Layout::Binary,
        }
    }

    /// The shard of a tenant: FNV-1a of its id, modulo the shard count. Stable across
    /// processes, builds and platforms (unlike `std`'s hasher).
    pub fn shard_of(self, t: &TenantId) -> Shard {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in t.as_str().bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        self.shard((h % u64::from(self.count)) as u16)
    }

    /// Every shard, the dedicated ones last.
    pub fn all(self) -> impl Iterator<Item = Shard> {
        (0..self.count + self.dedicated).map(move |n| self.shard(n))
    }
}

/// What a sluice key is, read back from its name: the inverse of the builders above, for code
/// that walks Redis (the benchmark's census, the test suite's assertions) and must not match
/// names by hand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyKind {
    Row,
    Void,
    /// A worker's adoption barrier (`Shard::adopted`).
    Adopted,
    Frozen,
    /// Schema 1's ready stream (read by the migration only).
    Ready,
    Runnable,
    Sched,
    Starts,
    /// A worker's held set (`Shard::held`).
    Held,
    Bell,
    Leases,
    Delayed,
    DeadLetters,
    /// The marker of a dead-letter rebuild (`Shard::dead_letters_indexed`).
    DeadLettersIndexed,
    /// The ids of the records of no tenant (`Shard::poison_dead_letters`).
    PoisonDeadLetters,
    /// Dead-letter records per holder (`Shard::dead_letter_holders`).
    DeadLetterHolders,
    /// The holders a dead-letter rebuild met (`Shard::dead_letters_rebuilt`).
    DeadLettersRebuilt,
    /// Dead-letter records evicted per holder (`Shard::dead_letters_evicted`).
    DeadLettersEvicted,
    Stats,
    Tenants,
    TenantConfig,
    Slots,
    Waiting,
    Deleting,
    Flows,
    TenantDeadLetters,
    /// A tenant's listing (`Shard::listing`).
    Listing,
    /// Layout 3 and older: a status index (`Shard::status_index`).
    StatusIndex,
    /// Layout 3 and older: a flow's status index (`Shard::flow_index`).
    FlowIndex,
    /// A dedup mapping as a string key (`Shard::dedup`): an ended execution's, with its TTL.
    Dedup,
    /// A hash of live dedup mappings (`Shard::dedup_bucket`).
    DedupBucket,
    /// A tenant's per-minute counters of one day (`Shard::trends`).
    TenantTrends,
    /// When a tenant's current burst of starts began (`Shard::burst`).
    Burst,
    /// A shard's per-minute counters of one day (`Shard::shard_trends`).
    ShardTrends,
    /// The shard's tenants that may have work (`Shard::busy`).
    Busy,
    /// A concurrency key's queue (`Shard::key_queue`).
    KeyQueue,
    /// A concurrency key's running set (`Shard::key_running`).
    KeyRunning,
    /// A tenant's per-key limit overrides (`Shard::key_limits`).
    KeyLimits,
    /// A tenant's blocked concurrency keys (`Shard::key_blocked`).
    KeyBlocked,
    /// A tenant's rate limit state (`Shard::tat`).
    Tat,
    /// A concurrency key's rate limit state (`Shard::key_tat`).
    KeyTat,
    /// A tenant's webhook outbox (`Shard::outbox`).
    Outbox,
    /// A tenant's webhook delivery log (`Shard::delivery_log`).
    DeliveryLog,
    /// Which server delivers a tenant's outbox (`Shard::delivery_lock`).
    DeliveryLock,
    /// The shard's tenants with a webhook (`Shard::webhooks`).
    Webhooks,
    /// The shard's tenants being deleted (`Shard::reaping`).
    Reaping,
    /// A tenant's retained executions by expiry bucket (`Shard::retained`).
    Retained,
    /// Anything under the `{acl}` tag (key records, key sets, the registry, its marker).
    Access,
    /// Anything under the `{meta}` tag.
    Meta,
}

/// A parsed key name (see `parse`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyName<'a> {
    pub kind: KeyKind,
    /// The shard of a shard key.
    pub shard: Option<Shard>,
    /// The tenant a per-tenant key belongs to.
    pub tenant: Option<&'a str>,
    /// The execution id of a row or void marker.
    pub id: Option<&'a str>,
}

/// Reads a key name back; `None` for a name no builder here makes.
pub fn parse(key: &str) -> Option<KeyName<'_>> {
    let name = |kind| KeyName {
        kind,
        shard: None,
        tenant: None,
        id: None,
    };
    if key.starts_with(ACL_PREFIX) {
        return Some(name(KeyKind::Access));
    }
    if key.starts_with(META_PREFIX) {
        return Some(name(KeyKind::Meta));
    }
    let rest = key.strip_prefix(ROOT)?.strip_prefix('{')?;
    let (tag, rest) = rest.split_once("}:")?;
    // `s07` (layout 1) or `s07.19` (layout 2).
    let (number, suffix) = tag
        .strip_prefix('s')?
        .split_once('.')
        .unwrap_or((&tag[1..], "0"));
    let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
    if number.len() < 2 || !digits(number) || !digits(suffix) {
        return None;
    }
    // The id form is not in a name: a parsed shard is for telling keys apart, not for
    // building them (its `stored_id` is hex).
    let shard = Some(Shard {
        number: number.parse().ok()?,
        tag: intern(tag.to_owned()),
        binary: false,
    });
    let at = |kind| {
        Some(KeyName {
            shard,
            ..name(kind)
        })
    };
    if let Some(id) = rest.strip_prefix("exec:") {
        return Some(KeyName {
            id: Some(id),
            ..at(KeyKind::Row)?
        });
    }
    if rest.starts_with("adopted:") {
        return at(KeyKind::Adopted);
    }
    if rest.starts_with("held:") {
        return at(KeyKind::Held);
    }
    if let Some(id) = rest.strip_prefix("void:") {
        return Some(KeyName {
            id: Some(id),
            ..at(KeyKind::Void)?
        });
    }
    let Some(per_tenant) = rest.strip_prefix("t:") else {
        return match rest {
            "hold" | "hold:5" | "frozen" => at(KeyKind::Frozen),
            "ready" => at(KeyKind::Ready),
            "runnable" => at(KeyKind::Runnable),
            "sched" => at(KeyKind::Sched),
            "starts" => at(KeyKind::Starts),
            "bell" => at(KeyKind::Bell),
            "leases" => at(KeyKind::Leases),
            "delayed" => at(KeyKind::Delayed),
            "dlq" => at(KeyKind::DeadLetters),
            "dlq_indexed" => at(KeyKind::DeadLettersIndexed),
            "dlq_poison" => at(KeyKind::PoisonDeadLetters),
            "dlq_holders" => at(KeyKind::DeadLetterHolders),
            "dlq_rebuilt" => at(KeyKind::DeadLettersRebuilt),
            "dlq_evicted" => at(KeyKind::DeadLettersEvicted),
            "stats" => at(KeyKind::Stats),
            "tenants" => at(KeyKind::Tenants),
            "busy" => at(KeyKind::Busy),
            "webhooks" => at(KeyKind::Webhooks),
            "reaping" => at(KeyKind::Reaping),
            _ if rest.starts_with("m:") => at(KeyKind::ShardTrends),
            _ => None,
        };
    };
    // Tenant ids contain no colon (`TenantId::parse`), so the first colon ends it.
    let (tenant, tail) = per_tenant.split_once(':')?;
    let kind = match tail {
        "cfg" => KeyKind::TenantConfig,
        "slots" => KeyKind::Slots,
        "waiting" => KeyKind::Waiting,
        "deleting" => KeyKind::Deleting,
        "flows" => KeyKind::Flows,
        "dlq" => KeyKind::TenantDeadLetters,
        "klim" => KeyKind::KeyLimits,
        "kblk" => KeyKind::KeyBlocked,
        "tat" => KeyKind::Tat,
        "burst" => KeyKind::Burst,
        "wh" => KeyKind::Outbox,
        "whlog" => KeyKind::DeliveryLog,
        "whlock" => KeyKind::DeliveryLock,
        "ret" => KeyKind::Retained,
        "ls" => KeyKind::Listing,
        _ if tail.starts_with("k:") && tail.ends_with(":tat") => KeyKind::KeyTat,
        _ if tail.starts_with("k:") && tail.ends_with(":q") => KeyKind::KeyQueue,
        _ if tail.starts_with("k:") && tail.ends_with(":run") => KeyKind::KeyRunning,
        _ if tail.starts_with("st:") => KeyKind::StatusIndex,
        _ if tail.starts_with("fl:") => KeyKind::FlowIndex,
        _ if tail.starts_with("dd:") => KeyKind::Dedup,
        _ if tail.starts_with("ddb:") => KeyKind::DedupBucket,
        _ if tail.starts_with("m:") => KeyKind::TenantTrends,
        _ => return None,
    };
    Some(KeyName {
        tenant: Some(tenant),
        ..at(kind)?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Redis Cluster slot of a key: CRC16 (XMODEM) of its hash tag, mod 16384.
    /// Bytes: a key holding a binary id (layout 5) is not text; only its first `{...}` counts.
    fn cluster_slot(key: impl AsRef<[u8]>) -> u16 {
        let key = key.as_ref();
        let mut tagged = key;
        if let Some(open) = key.iter().position(|&b| b == b'{')
            && let Some(len) = key[open + 1..].iter().position(|&b| b == b'}')
            && len > 0
        {
            tagged = &key[open + 1..open + 1 + len];
        }
        let mut crc: u16 = 0;
        for &b in tagged {
            crc ^= u16::from(b) << 8;
            for _ in 0..8 {
                crc = if crc & 0x8000 != 0 {
                    (crc << 1) ^ 0x1021
                } else {
                    crc << 1
                };
            }
        }
        crc % 16384
    }

    #[test]
    fn ids_are_stored_as_layout_4_writes_them() {
        // Layout 4 (CURRENT): the 32 hex digits, in every key, member and argument.
        let id = ExecutionId::new();
        let s = ShardMap::new(16, Layout::CURRENT).shard(7);
        assert!(!s.binary_ids());
        assert_eq!(s.stored_id(&id).as_ref(), id.as_str().as_bytes());
        assert_eq!(s.row(&id), format!("{}exec:{id}", s.prefix()).into_bytes());
        assert_eq!(s.void(&id), format!("{}void:{id}", s.prefix()).into_bytes());
        let f = FlowId::parse("demo.echo").unwrap();
        assert_eq!(
            s.listing_member(Some(Status::Running), &f, &id),
            format!("rdemo.echo\0{id}").into_bytes()
        );
        assert_eq!(s.id_time_bound(0x0193_b2c4_d5e6), b"0193b2c4d5e6");
        assert_eq!(s.binary_hold(), format!("{}hold:5", s.prefix()));
    }

    /// The row's `dh`: the digest's 16 bytes at layout 5 (the Lua formats the key names
    /// back from them), its hex before, and '' (no dedup key) as ''.
    #[test]
    fn a_dedup_digest_is_stored_as_its_16_bytes_at_layout_5() {
        let hex = "00ff10a0b1c2d3e4f5061728394a5b6c";
        let binary = ShardMap::new(16, Layout::Binary).shard(7);
        let text = ShardMap::new(16, Layout::Listing).shard(7);
        assert_eq!(
            binary.stored_digest(hex).as_ref(),
            &[
                0x00, 0xff, 0x10, 0xa0, 0xb1, 0xc2, 0xd3, 0xe4, 0xf5, 0x06, 0x17, 0x28, 0x39, 0x4a,
                0x5b, 0x6c
            ][..]
        );
        assert_eq!(text.stored_digest(hex).as_ref(), hex.as_bytes());
        assert!(binary.stored_digest("").as_ref().is_empty());
        assert!(text.stored_digest("").as_ref().is_empty());
    }

    #[test]
    fn ids_are_stored_as_their_16_bytes_at_layout_5() {
        let id = ExecutionId::new();
        let s = ShardMap::new(16, Layout::Binary).shard(7);
        let hex = ShardMap::new(16, Layout::Listing).shard(7);
        assert!(s.binary_ids());
        // The same shard (tag, number) in either form: only the ids differ.
        assert_eq!(s, hex);
        assert_eq!(s.prefix(), hex.prefix());
        let raw = id.to_bytes();
        assert_eq!(s.stored_id(&id).as_ref(), &raw[..]);
        let mut row = s.prefix().into_bytes();
        row.extend_from_slice(b"exec:");
        row.extend_from_slice(&raw);
        assert_eq!(s.row(&id), row);
        let mut void = s.prefix().into_bytes();
        void.extend_from_slice(b"void:");
        void.extend_from_slice(&raw);
        assert_eq!(s.void(&id), void);
        let f = FlowId::parse("demo.echo").unwrap();
        let mut member = b"rdemo.echo\0".to_vec();
        member.extend_from_slice(&raw);
        assert_eq!(s.listing_member(Some(Status::Running), &f, &id), member);
        // A time bound is the ids' first 6 bytes, and sorts between two milliseconds' ids.
        let ms = u64::from_str_radix(&id.as_str()[..12], 16).unwrap();
        assert_eq!(s.id_time_bound(ms), &raw[..6]);
        assert!(s.id_time_bound(ms + 1).as_slice() > &raw[..]);
        assert_eq!(s.id_time_bound(u64::MAX), [0xff; 6]);
    }

    #[test]
    fn cluster_slot_matches_redis() {
        // `CLUSTER KEYSLOT` answers of Redis 7.0.
        assert_eq!(cluster_slot("foo"), 12182);
        assert_eq!(
            cluster_slot("{user1000}.following"),
            cluster_slot("user1000")
        );
        assert_eq!(cluster_slot("123456789"), 12739); // 0x31c3
    }

    #[test]
    fn a_tenant_maps_to_a_pinned_shard() {
        // Pinned: a change would move existing tenants away from their keys. FNV-1a-64 of
        // "acme" is 0x0724d383f4f6de0f (reference implementation): 15 of 16, 3 of 4.
        let t = TenantId::parse("acme").unwrap();
        assert_eq!(ShardMap::new(16, Layout::CURRENT).shard_of(&t).number(), 15);
        assert_eq!(ShardMap::new(4, Layout::CURRENT).shard_of(&t).number(), 3);
        assert_eq!(ShardMap::new(1, Layout::CURRENT).shard_of(&t).number(), 0);
        // More tenants, so a changed hash cannot keep them all by chance: FNV-1a-64 of "a" is
        // the reference test vector 0xaf63dc4c8601ec8c (12 of 16); "initech" 0x5e655c2d2050ac41
        // (1); "umbrella" 0x60c0318649ec0b45 (5).
        let map = ShardMap::new(16, Layout::CURRENT);
        for (tenant, shard) in [("a", 12), ("initech", 1), ("umbrella", 5)] {
            let t = TenantId::parse(tenant).unwrap();
            assert_eq!(map.shard_of(&t).number(), shard, "{tenant}");
        }
        assert_eq!(ShardMap::new(0, Layout::CURRENT).count(), 1);
        // Tenants spread: 64 tenants over 16 shards reach more than half of them.
        let map = ShardMap::new(16, Layout::CURRENT);
        let used: std::collections::HashSet<u16> = (0..64)
            .map(|i| {
                map.shard_of(&TenantId::parse(&format!("tenant-{i}")).unwrap())
                    .number()
            })
            .collect();
        assert!(used.len() > 8, "{used:?}");
    }

    #[test]
    fn every_key_of_a_tenant_is_in_its_shard_slot() {
        for (layout, tag) in [(Layout::Legacy, "s15"), (Layout::SlotAligned, "s15.59")] {
            keys_of_a_tenant_share_the_slot_of(ShardMap::new(16, layout), tag);
        }
    }

    fn keys_of_a_tenant_share_the_slot_of(map: ShardMap, tag: &str) {
        let t = TenantId::parse("acme").unwrap();
        let s = map.shard_of(&t);
        assert_eq!(s.prefix(), format!("sluice:{{{tag}}}:"));
        let slot = cluster_slot(tag);
        let id = ExecutionId::new();
        let f = FlowId::parse("demo.echo").unwrap();
        let keys = [
            s.frozen(),
            s.ready(),
            s.bell(),
            s.adopted("host-1-abc"),
            s.leases(),
            s.delayed(),
            s.dead_letters(),
            s.dead_letters_indexed(),
            s.poison_dead_letters(),
            s.dead_letter_holders(),
            s.dead_letters_rebuilt(),
            s.dead_letters_evicted(),
            s.tenant_dead_letters(&t),
            s.stats(),
            s.tenants(),
            s.flows(&t),
            s.slots(&t),
            s.waiting(&t),
            s.deleting(&t),
            s.tenant_config(&t),
            s.listing(&t),
            s.status_index(&t, Status::Queued),
            s.flow_index(&t, &f, Status::Failed),
            s.dedup(&t, "ab"),
            s.dedup_bucket(&t, "ab"),
            s.trends(&t, 20_423),
            s.burst(&t),
            s.shard_trends(20_423),
            s.busy(),
            s.key_queue(&t, "00ff"),
            s.key_running(&t, "00ff"),
            s.key_limits(&t),
            s.key_blocked(&t),
            s.tat(&t),
            s.key_tat(&t, "00ff"),
            s.outbox(&t),
            s.delivery_log(&t),
            s.delivery_lock(&t),
            s.webhooks(),
            s.reaping(),
        ];
        for k in &keys {
            assert!(k.starts_with(&s.prefix()), "{k}");
            assert_eq!(cluster_slot(k), slot, "{k}");
        }
        // The keys that hold an execution id are bytes (see `stored_id`).
        for k in [s.row(&id), s.void(&id)] {
            assert!(k.starts_with(s.prefix().as_bytes()), "{k:?}");
            assert_eq!(cluster_slot(&k), slot, "{k:?}");
        }
        // Another shard is another slot.
        assert_ne!(cluster_slot(map.shard(3).ready()), slot);
    }

    #[test]
    fn access_and_meta_keys_share_their_own_slots() {
        let t = TenantId::parse("acme").unwrap();
        let acl = cluster_slot("acl");
        for k in [
            api_key("0123456789abcdef"),
            tenant_keys(&t),
            tenants(),
            acl_frozen(),
        ] {
            assert!(k.starts_with("sluice:{acl}:"), "{k}");
            assert_eq!(cluster_slot(&k), acl, "{k}");
        }
        let meta_slot = cluster_slot("meta");
        for k in [meta(), sweeper_lock(), meta_frozen(), libraries()] {
            assert!(k.starts_with(meta_prefix()), "{k}");
            assert_eq!(cluster_slot(k), meta_slot, "{k}");
        }
        assert_eq!(acl_prefix(), "sluice:{acl}:");
        assert_eq!(meta_prefix(), "sluice:{meta}:");
    }

    #[test]
    fn key_names_read_back_as_what_they_are() {
        let t = TenantId::parse("acme").unwrap();
        let s = ShardMap::new(16, Layout::CURRENT).shard(7);
        let id = ExecutionId::new();
        let f = FlowId::parse("demo.echo").unwrap();
        let tenant_keys = [
            (s.tenant_config(&t), KeyKind::TenantConfig),
            (s.slots(&t), KeyKind::Slots),
            (s.waiting(&t), KeyKind::Waiting),
            (s.deleting(&t), KeyKind::Deleting),
            (s.flows(&t), KeyKind::Flows),
            (s.tenant_dead_letters(&t), KeyKind::TenantDeadLetters),
            (s.listing(&t), KeyKind::Listing),
            (s.status_index(&t, Status::Running), KeyKind::StatusIndex),
            (s.flow_index(&t, &f, Status::Queued), KeyKind::FlowIndex),
            (s.dedup(&t, "00ff"), KeyKind::Dedup),
            (s.dedup_bucket(&t, "00ff"), KeyKind::DedupBucket),
            (s.trends(&t, 20_423), KeyKind::TenantTrends),
            (s.burst(&t), KeyKind::Burst),
            (s.key_queue(&t, "00ff"), KeyKind::KeyQueue),
            (s.key_running(&t, "00ff"), KeyKind::KeyRunning),
            (s.key_limits(&t), KeyKind::KeyLimits),
            (s.key_blocked(&t), KeyKind::KeyBlocked),
            (s.tat(&t), KeyKind::Tat),
            (s.key_tat(&t, "00ff"), KeyKind::KeyTat),
            (s.outbox(&t), KeyKind::Outbox),
            (s.delivery_log(&t), KeyKind::DeliveryLog),
            (s.delivery_lock(&t), KeyKind::DeliveryLock),
            (s.retained(&t), KeyKind::Retained),
        ];
        for (k, kind) in tenant_keys {
            let n = parse(&k).unwrap_or_else(|| panic!("{k}"));
            assert_eq!(
                (n.kind, n.shard, n.tenant),
                (kind, Some(s), Some("acme")),
                "{k}"
            );
        }
        for (k, kind) in [
            (s.frozen(), KeyKind::Frozen),
            (s.ready(), KeyKind::Ready),
            (s.runnable(), KeyKind::Runnable),
            (s.sched(), KeyKind::Sched),
            (s.starts(), KeyKind::Starts),
            (s.held("w-1"), KeyKind::Held),
            (s.bell(), KeyKind::Bell),
            (s.adopted("host-1-abc"), KeyKind::Adopted),
            (s.leases(), KeyKind::Leases),
            (s.delayed(), KeyKind::Delayed),
            (s.dead_letters(), KeyKind::DeadLetters),
            (s.dead_letters_indexed(), KeyKind::DeadLettersIndexed),
            (s.poison_dead_letters(), KeyKind::PoisonDeadLetters),
            (s.dead_letter_holders(), KeyKind::DeadLetterHolders),
            (s.dead_letters_rebuilt(), KeyKind::DeadLettersRebuilt),
            (s.dead_letters_evicted(), KeyKind::DeadLettersEvicted),
            (s.stats(), KeyKind::Stats),
            (s.tenants(), KeyKind::Tenants),
            (s.shard_trends(20_423), KeyKind::ShardTrends),
            (s.busy(), KeyKind::Busy),
            (s.webhooks(), KeyKind::Webhooks),
            (s.reaping(), KeyKind::Reaping),
        ] {
            let n = parse(&k).unwrap();
            assert_eq!((n.kind, n.shard, n.tenant), (kind, Some(s), None), "{k}");
        }
        // Layout 4's stored ids are hex, so these names are still text.
        let row_key = String::from_utf8(s.row(&id)).unwrap();
        let row = parse(&row_key).unwrap();
        assert_eq!((row.kind, row.id), (KeyKind::Row, Some(id.as_str())));
        let void_key = String::from_utf8(s.void(&id)).unwrap();
        assert_eq!(parse(&void_key).unwrap().kind, KeyKind::Void);
        assert_eq!(parse(&s.binary_hold()).unwrap().kind, KeyKind::Frozen);
        assert_eq!(parse(&tenants()).unwrap().kind, KeyKind::Access);
        assert_eq!(parse(meta()).unwrap().kind, KeyKind::Meta);
        for foreign in [
            "other",
            "sluice:x",
            "sluice:{s7x}:ready",
            "sluice:{s07}:nope",
            "sluice:{s07.x}:ready",
        ] {
            assert_eq!(parse(foreign), None, "{foreign}");
        }
        // A layout-1 key reads back as the layout-1 shard.
        let legacy = ShardMap::new(16, Layout::Legacy).shard(7);
        assert_eq!(parse(&legacy.ready()).unwrap().shard, Some(legacy));
        assert_ne!(Some(legacy), Some(s));
    }
}
