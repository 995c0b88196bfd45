//! The Redis one test owns (`TestRedis`): a standalone `redis-server` on a free port, or the
//! nodes of a local Redis Cluster (`SLUICE_TEST_CLUSTER=1`), killed when dropped and
//! restartable on the same ports and data; with what tests ask of it directly (its keys, a
//! dump of everything it holds, pauses, command counts). Separate from `app.rs`: a test may
//! own a Redis without an application (to start workers or servers as processes on it).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use sluice::config::RedisSettings;
use sluice::redis_server::{self, Persistence};
use sluice::store::{Conn, Layout, RedisTarget, Shard, ShardMap};

/// Whether this run of the suite puts every test on a local 3-master Redis Cluster instead of
/// one server (`SLUICE_TEST_CLUSTER=1`; `scripts/test.sh` runs the suite both ways).
pub fn cluster_mode() -> bool {
    std::env::var("SLUICE_TEST_CLUSTER").is_ok_and(|v| v == "1")
}

/// The key layout every test's fresh Redis records at its first start: `Layout::CURRENT`, or
/// layout 5 (binary ids) when the suite runs with `SLUICE_TEST_LAYOUT=5` (like
/// `SLUICE_TEST_CLUSTER=1`, a whole pass of the suite: `TestRedis::settings` and `args` carry
/// it to every application, store and `sluice` process the test starts on it).
pub fn test_layout() -> Layout {
    match std::env::var("SLUICE_TEST_LAYOUT").as_deref() {
        Ok("5") => Layout::Binary,
        Ok("4") | Err(_) => Layout::CURRENT,
        Ok(other) => panic!("SLUICE_TEST_LAYOUT={other}: 4 or 5"),
    }
}

/// Whether this pass stores ids as their 16 bytes (`SLUICE_TEST_LAYOUT=5`, see `test_layout`).
pub fn binary_layout() -> bool {
    test_layout() == Layout::Binary
}

/// The Redis one test owns: a standalone `redis-server`, or the nodes of a local Redis
/// Cluster. Killed when dropped, restartable on the same ports and data.
pub struct TestRedis {
    nodes: Vec<TestNode>,
    cluster: bool,
    /// How many of `nodes` are masters (the rest are replicas).
    masters: usize,
    /// Only the standalone port, for tests that talk to one server.
    pub port: u16,
}

/// One `redis-server` process.
struct TestNode {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    extra: Vec<String>,
}

impl TestNode {
    /// Starts a node on a free port (`sluice::redis_server`, the launcher `sluice dev` and the
    /// benchmark use too: it retries on another port when one is taken meanwhile).
    async fn start(extra: &[String]) -> Self {
        let spawn = |port: u16| -> anyhow::Result<Self> {
            let mut node = Self {
                child: None,
                port,
                dir: tempfile::tempdir()?,
                extra: extra.to_vec(),
            };
            node.spawn();
            Ok(node)
        };
        let (node, _) = redis_server::start_on_free_port(
            spawn,
            |node: &mut Self| node.exited(),
            Duration::from_secs(10),
        )
        .await
        .expect("redis-server starts (scripts/test.sh installs it)");
        node
    }

    /// Starts the process on this node's port and folder (AOF on, so a restart keeps the
    /// data), without waiting for it.
    fn spawn(&mut self) {
        let child = redis_server::command(
            Path::new("redis-server"),
            self.port,
            self.dir.path(),
            Persistence::Aof("everysec"),
        )
        .args(&self.extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server must be installed (scripts/test.sh installs it)");
        self.child = Some(child);
    }

    /// Whether the process is gone (killed, or exited by itself).
    fn exited(&mut self) -> bool {
        self.child
            .as_mut()
            .is_none_or(|c| c.try_wait().ok().flatten().is_some())
    }

    /// Starts the node again on its port and folder and waits until it answers.
    async fn respawn(&mut self) {
        self.spawn();
        let port = self.port;
        redis_server::wait_ready(port, || self.exited(), Duration::from_secs(10))
            .await
            .expect("redis-server comes back on its port");
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    async fn direct(&self) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
        redis::Client::open(self.url())?
            .get_multiplexed_async_connection()
            .await
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("redis-server runs").id();
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &pid.to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{sig} failed");
    }
}

impl TestRedis {
    /// A fresh Redis (AOF on, so a restart keeps the data) that answers: a 3-master cluster
    /// in cluster mode (`cluster_mode()`), else one server.
    pub async fn start() -> Self {
        if cluster_mode() {
            Self::start_cluster(3, 0).await
        } else {
            Self::start_standalone().await
        }
    }

    /// One standalone server, whatever the mode (for tests of one server's behaviour).
    pub async fn start_standalone() -> Self {
        let node = TestNode::start(&[]).await;
        Self {
            port: node.port,
            nodes: vec![node],
            cluster: false,
            masters: 1,
        }
    }

    /// A local Redis Cluster of `masters` masters with `replicas` replicas each, formed and
    /// serving every slot (peers are declared failed after 2 s, so failovers are quick).
    pub async fn start_cluster(masters: usize, replicas: usize) -> Self {
        let args = sluice::redis_server::cluster_node_args(2_000);
        let mut nodes = Vec::new();
        for _ in 0..masters * (1 + replicas) {
            nodes.push(TestNode::start(&args).await);
        }
        let ports: Vec<u16> = nodes.iter().map(|n| n.port).collect();
        sluice::redis_server::form_cluster(&ports, replicas, Duration::from_secs(30))
            .await
            .expect("the test cluster forms");
        Self {
            port: 0,
            nodes,
            cluster: true,
            masters,
        }
    }

    /// Adds an empty master (no slots) to a cluster without replicas, as an operator adds a
    /// node before moving shards to it; waits until every node knows it. Its index.
    pub async fn add_master(&mut self) -> usize {
        assert!(
            self.cluster && self.masters == self.nodes.len(),
            "a cluster without replicas"
        );
        let node = TestNode::start(&sluice::redis_server::cluster_node_args(2_000)).await;
        let port = node.port;
        let mut seed = self.nodes[0].direct().await.expect("redis connection");
        let () = redis::cmd("CLUSTER")
            .arg("MEET")
            .arg("127.0.0.1")
            .arg(port)
            .query_async(&mut seed)
            .await
            .unwrap();
        self.nodes.push(node);
        self.masters += 1;
        // Every node lists every other as connected and serves (bounded: gossip takes about a
        // second).
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let mut known = true;
            for n in &self.nodes {
                let mut c = n.direct().await.expect("redis connection");
                let text: String = redis::cmd("CLUSTER")
                    .arg("NODES")
                    .query_async(&mut c)
                    .await
                    .unwrap();
                let connected = text
                    .lines()
                    .filter(|l| l.contains("master") && l.contains(" connected"))
                    .count();
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query_async(&mut c)
                    .await
                    .unwrap();
                known &= connected == self.nodes.len() && info.contains("cluster_state:ok");
            }
            if known {
                return self.nodes.len() - 1;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the cluster never learned of the new master"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Whether this is a cluster.
    pub fn is_cluster(&self) -> bool {
        self.cluster
    }

    /// Where sluice finds this Redis.
    pub fn target(&self) -> RedisTarget {
        if self.cluster {
            RedisTarget::Cluster(self.nodes.iter().map(TestNode::url).collect())
        } else {
            RedisTarget::Standalone(self.nodes[0].url())
        }
    }

    /// The settings that point sluice at this Redis.
    pub fn settings(&self) -> RedisSettings {
        let mut settings = RedisSettings::for_target(self.target());
        if binary_layout() {
            settings.initial_layout = Some(Layout::Binary.number());
        }
        settings
    }

    /// The command-line arguments that point a `sluice` process at this Redis.
    pub fn args(&self) -> Vec<String> {
        let mut args: Vec<String> = match self.target() {
            RedisTarget::Standalone(url) => vec!["--redis-url".into(), url],
            RedisTarget::Cluster(seeds) => vec!["--redis-cluster".into(), seeds.join(",")],
        };
        if binary_layout() {
            args.extend([
                "--initial-layout".into(),
                Layout::Binary.number().to_string(),
            ]);
        }
        args
    }

    /// A connection for asserting what Redis holds (on a cluster, routed by key; KEYS, DBSIZE
    /// and the like go to every master).
    pub async fn conn(&self) -> Conn {
        Conn::open(&self.target(), 1, Duration::from_secs(10), 0)
            .await
            .expect("redis connection")
            .remove(0)
    }

    /// Kills every node (SIGKILL: no goodbye to clients).
    pub fn kill(&mut self) {
        for n in &mut self.nodes {
            n.kill();
        }
    }

    /// Kills node `i` only (on a cluster, node `i < masters` is a master).
    pub fn kill_node(&mut self, i: usize) {
        self.nodes[i].kill();
    }

    /// Sends a signal by name (`STOP`, `CONT`) to every node.
    pub fn signal(&self, sig: &str) {
        for n in &self.nodes {
            n.signal(sig);
        }
    }

    /// A direct connection to node `i` (for node-wide or slot-migration commands).
    pub async fn node_conn(&self, i: usize) -> redis::aio::MultiplexedConnection {
        self.nodes[i].direct().await.expect("redis connection")
    }

    /// `127.0.0.1:<port>` of node `i`, as the cluster names it.
    pub fn node_address(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.nodes[i].port)
    }

    /// `CONFIG SET appendfsync always` on every master: every acknowledged write is on disk
    /// before its answer leaves, so a SIGKILL loses only what nobody was told of.
    pub async fn fsync_always(&self) {
        for i in 0..self.masters {
            let mut c = self.node_conn(i).await;
            let () = redis::cmd("CONFIG")
                .arg("SET")
                .arg("appendfsync")
                .arg("always")
                .query_async(&mut c)
                .await
                .unwrap();
        }
    }

    /// How many masters the cluster was formed with (1 when standalone).
    pub fn masters(&self) -> usize {
        self.masters
    }

    /// Starts every node again on the same port and data folder (a cluster re-forms from its
    /// nodes.conf) and waits until it serves.
    pub async fn restart(&mut self) {
        self.kill();
        for n in &mut self.nodes {
            n.respawn().await;
        }
        if self.cluster {
            let ports: Vec<u16> = self.nodes.iter().map(|n| n.port).collect();
            sluice::redis_server::form_cluster(&ports, 0, Duration::from_secs(30))
                .await
                .expect("the test cluster re-forms");
        }
    }

    /// The first node that was not killed (to ask the cluster about itself).
    fn live_node(&self) -> &TestNode {
        self.nodes
            .iter()
            .find(|n| n.child.is_some())
            .expect("a node that runs")
    }

    /// The index (into the nodes this Redis was started with) of the master serving `slot`
    /// now, by the cluster's own slot table.
    pub async fn master_of_slot(&self, slot: u16) -> usize {
        let mut c = self.live_node().direct().await.expect("redis connection");
        let table: Vec<redis::Value> = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(&mut c)
            .await
            .unwrap();
        for range in table {
            let redis::Value::Array(range) = range else {
                continue;
            };
            let from: u16 = redis::from_redis_value(range[0].clone()).unwrap();
            let to: u16 = redis::from_redis_value(range[1].clone()).unwrap();
            if (from..=to).contains(&slot) {
                let redis::Value::Array(master) = &range[2] else {
                    panic!("CLUSTER SLOTS without a master");
                };
                let port: u16 = redis::from_redis_value(master[1].clone()).unwrap();
                return self.nodes.iter().position(|n| n.port == port).unwrap();
            }
        }
        panic!("slot {slot} is not served");
    }

    /// The hash slot of `key`.
    pub async fn slot_of(&self, key: &str) -> u16 {
        let mut c = self.live_node().direct().await.expect("redis connection");
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query_async(&mut c)
            .await
            .unwrap()
    }

    /// Every key on the server (on a cluster, on every master), sorted.
    pub async fn keys(&self) -> BTreeSet<String> {
        let mut all = BTreeSet::new();
        for n in &self.nodes[..self.masters] {
            let mut c = n.direct().await.expect("redis connection");
            all.extend(all_keys(&mut c).await.iter().map(key_text));
        }
        all
    }

    /// Everything the server holds (on a cluster, every master): each key with its type, its
    /// value as `DUMP` serializes it (members, fields, stream entries, consumer groups and
    /// their pending lists) and its absolute expiry (`PEXPIRETIME`, -1 for none). Two equal
    /// dumps mean nothing was written in between, not merely that no key came or went.
    pub async fn dump(&self) -> BTreeMap<String, (String, Vec<u8>, i64)> {
        let mut all = BTreeMap::new();
        for n in &self.nodes[..self.masters] {
            let mut c = n.direct().await.expect("redis connection");
            for raw in all_keys(&mut c).await {
                let k = key_text(&raw);
                let (kind, value, expires): (String, Vec<u8>, i64) = redis::pipe()
                    .cmd("TYPE")
                    .arg(&raw)
                    .cmd("DUMP")
                    .arg(&raw)
                    .cmd("PEXPIRETIME")
                    .arg(&raw)
                    .query_async(&mut c)
                    .await
                    .unwrap_or_else(|e| panic!("dump of {k}: {e}"));
                all.insert(k, (kind, value, expires));
            }
        }
        all
    }

    /// `CLIENT PAUSE <ms> <mode>` on every node: the whole Redis stalls (`ALL`) or holds its
    /// writes (`WRITE`), as one stuck server would.
    pub async fn pause(&self, ms: u64, mode: &str) {
        for n in &self.nodes {
            let mut c = n.direct().await.expect("redis connection");
            let () = redis::cmd("CLIENT")
                .arg("PAUSE")
                .arg(ms)
                .arg(mode)
                .query_async(&mut c)
                .await
                .unwrap();
        }
    }

    /// Ends a `pause` early on every node.
    pub async fn unpause(&self) {
        for n in &self.nodes {
            let mut c = n.direct().await.expect("redis connection");
            let () = redis::cmd("CLIENT")
                .arg("UNPAUSE")
                .query_async(&mut c)
                .await
                .unwrap();
        }
    }

    /// Calls per command over every master since the last `reset_stats` (from `INFO
    /// commandstats`: also the commands scripts run, and each function call as `fcall` or `fcall_ro`).
    pub async fn command_calls(&self) -> Vec<(String, u64)> {
        let text = self.info("commandstats").await;
        let mut out: Vec<(String, u64)> = Vec::new();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("cmdstat_") else {
                continue;
            };
            let (name, stats) = rest.split_once(':').unwrap();
            let n: u64 = stats
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))
                .unwrap()
                .parse()
                .unwrap();
            match out.iter_mut().find(|(c, _)| c == name) {
                Some((_, total)) => *total += n,
                None => out.push((name.to_owned(), n)),
            }
        }
        out
    }

    /// `CONFIG RESETSTAT` on every master: the command counters start from zero.
    pub async fn reset_stats(&self) {
        for i in 0..self.masters() {
            let mut c = self.node_conn(i).await;
            let () = redis::cmd("CONFIG")
                .arg("RESETSTAT")
                .query_async(&mut c)
                .await
                .unwrap();
        }
    }

    /// `INFO <section>` of every master, one after the other.
    pub async fn info(&self, section: &str) -> String {
        let mut all = String::new();
        for n in &self.nodes[..self.masters] {
            let mut c = n.direct().await.expect("redis connection");
            let text: String = redis::cmd("INFO")
                .arg(section)
                .query_async(&mut c)
                .await
                .unwrap();
            all.push_str(&text);
        }
        all
    }

    /// Runs one command answering execution ids (members of a queue, a slot set, ...) and
    /// gives each as its hex (`id_text`), whatever the layout stores.
    pub async fn ids(&self, cmd: &mut redis::Cmd) -> Vec<String> {
        let stored: Vec<Vec<u8>> = self.query(cmd).await;
        stored.iter().map(id_text).collect()
    }

    /// Runs one command and parses the reply.
    pub async fn query<T: redis::FromRedisValue>(&self, cmd: &mut redis::Cmd) -> T {
        let mut c = self.conn().await;
        cmd.query_async(&mut c).await.unwrap()
    }
}

impl Drop for TestRedis {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Every key of one node (`KEYS *`: test data is small), as Redis holds it (bytes: a layout-5
/// name holds a binary id).
async fn all_keys(c: &mut redis::aio::MultiplexedConnection) -> Vec<Vec<u8>> {
    let keys: Vec<Vec<u8>> = redis::cmd("KEYS").arg("*").query_async(c).await.unwrap();
    keys
}

/// A key name (or member) as the text `TestRedis::keys` and `TestRedis::dump` list it under: the
/// name itself when it is printable text (every name of layout 4, whose stored ids are hex),
/// else each byte outside printable ASCII, and `\`, as `\xNN` (a layout-5 name holding a
/// binary id). One text per name, so a test builds the expected text from `Shard::row` etc.
/// with the same function.
pub fn key_text(key: impl AsRef<[u8]>) -> String {
    let key = key.as_ref();
    if let Ok(text) = std::str::from_utf8(key)
        && !text.chars().any(|c| c.is_control() || c == '\\')
    {
        return text.to_owned();
    }
    let mut out = String::with_capacity(key.len() * 2);
    for &b in key {
        match b {
            b' '..=b'~' if b != b'\\' => out.push(char::from(b)),
            _ => out.push_str(&format!("\\x{b:02x}")),
        }
    }
    out
}

/// The bytes a `key_text` stands for (its inverse): to name a key found by `TestRedis::keys`
/// in a command, or to take a stored id out of a name read back by `keys::parse`.
pub fn key_bytes(text: &str) -> Vec<u8> {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && b.get(i + 1) == Some(&b'x') && i + 4 <= b.len() {
            let hex = std::str::from_utf8(&b[i + 2..i + 4]).expect("escaped byte");
            out.push(u8::from_str_radix(hex, 16).expect("escaped byte"));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// An execution id as Redis stores it (32 hex digits, or 16 bytes at layout 5), as its hex:
/// what the API answers, so tests compare ids read from Redis with the API's whatever the
/// layout. Anything else as its `key_text`.
pub fn id_text(stored: impl AsRef<[u8]>) -> String {
    let stored = stored.as_ref();
    match sluice::domain::ExecutionId::from_reply(stored) {
        Ok(id) => id.as_str().to_owned(),
        Err(_) => key_text(stored),
    }
}

/// A dedup mapping's value (`<stored id>:<fingerprint>`, the fingerprint 16 hex digits, or
/// layout 5's `<id 16><fingerprint 8>`, told by its length, 24) as layout 4 writes it:
/// `<hex id>:<fingerprint>`, so tests read either layout's alike.
pub fn mapping_text(mapped: impl AsRef<[u8]>) -> String {
    let mapped = mapped.as_ref();
    if mapped.len() == 24 {
        let (id, fp) = mapped.split_at(16);
        return format!("{}:{}", id_text(id), hex::encode(fp));
    }
    if mapped.len() < 17 {
        return key_text(mapped);
    }
    let (id, fp) = mapped.split_at(mapped.len() - 17);
    format!("{}{}", id_text(id), key_text(fp))
}

/// Shard `n` of a default store (16 shards, the current layout): for tests that call scripts
/// or read keys of a shard directly.
pub fn shard_no(n: u16) -> Shard {
    ShardMap::new(16, test_layout()).shard(n)
}
