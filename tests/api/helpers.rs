//! Test fixtures: a real `redis-server` per test on a free port, and a `TestApp` (the real
//! application on port 0) whose methods speak the API as a client would.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::{Response, StatusCode};
use serde_json::{Value, json};
use sluice::Application;
use sluice::config::{ApiSettings, AppConfig, RedisSettings};
use sluice::domain::{ExecutionId, TenantId};
use sluice::redis_server::{self, Persistence};
use sluice::store::keys::{self, KeyKind};
use sluice::store::{Conn, RedisTarget, Shard, ShardMap};

/// The platform admin token every `TestApp` is configured with.
pub const ADMIN_TOKEN: &str = "test-admin-token-0123456789";

/// Whether this run of the suite puts every test on a local 3-master Redis Cluster instead of
/// one server (`SLUICE_TEST_CLUSTER=1`; `scripts/test.sh` runs the suite both ways).
pub fn cluster_mode() -> bool {
    std::env::var("SLUICE_TEST_CLUSTER").is_ok_and(|v| v == "1")
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
        RedisSettings::for_target(self.target())
    }

    /// The command-line arguments that point a `sluice` process at this Redis.
    pub fn args(&self) -> Vec<String> {
        match self.target() {
            RedisTarget::Standalone(url) => vec!["--redis-url".into(), url],
            RedisTarget::Cluster(seeds) => vec!["--redis-cluster".into(), seeds.join(",")],
        }
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
            all.extend(all_keys(&mut c).await);
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
            for k in all_keys(&mut c).await {
                let (kind, value, expires): (String, Vec<u8>, i64) = redis::pipe()
                    .cmd("TYPE")
                    .arg(&k)
                    .cmd("DUMP")
                    .arg(&k)
                    .cmd("PEXPIRETIME")
                    .arg(&k)
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
    /// commandstats`: also the commands scripts run, and each script call as `evalsha`).
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

/// Shard `n` of a default store (16 shards, the current layout): for tests that call scripts
/// or read keys of a shard directly.
/// Every key of one node (`KEYS *`: test data is small).
async fn all_keys(c: &mut redis::aio::MultiplexedConnection) -> Vec<String> {
    redis::cmd("KEYS").arg("*").query_async(c).await.unwrap()
}

pub fn shard_no(n: u16) -> Shard {
    ShardMap::new(16, sluice::store::Layout::CURRENT).shard(n)
}

/// A loopback port that was free a moment ago (`sluice::redis_server::free_port`, shared with `sluice
/// dev` and the benchmark).
pub fn free_port() -> u16 {
    sluice::redis_server::free_port().expect("a free loopback port")
}

/// The real application on a free port, with its own Redis.
pub struct TestApp {
    pub addr: SocketAddr,
    /// Where `/metrics` is served when it has its own listener (`--metrics-listen`).
    pub metrics_addr: Option<SocketAddr>,
    pub redis: TestRedis,
    pub client: reqwest::Client,
    /// The app's registry of waiting clients (`?wait`, `/events`), to await their number.
    pub waiters: std::sync::Arc<sluice::waiters::Hub>,
    /// The app's pull API state (its doorbell connections, its stop mailboxes).
    pub pull: std::sync::Arc<sluice::pull::Pull>,
    /// The app's webhook deliverer.
    pub deliverer: std::sync::Arc<sluice::delivery::Deliverer>,
    /// The app's own store (its group commit's counts, without a Redis call).
    pub app_store: std::sync::Arc<sluice::store::Store>,
    shards: ShardMap,
    config: AppConfig,
}

impl TestApp {
    /// An app with default settings.
    pub async fn spawn() -> Self {
        Self::spawn_with(|_| {}).await
    }

    /// An app whose settings `adjust` may change first.
    pub async fn spawn_with(adjust: impl FnOnce(&mut AppConfig)) -> Self {
        Self::spawn_on(TestRedis::start().await, adjust).await
    }

    /// An app on a Redis the test started (e.g. to put something in between).
    pub async fn spawn_on(redis: TestRedis, adjust: impl FnOnce(&mut AppConfig)) -> Self {
        let mut api = ApiSettings::defaults();
        api.listen = "127.0.0.1:0".parse().unwrap();
        api.admin_token = Some(ADMIN_TOKEN.into());
        // Generous bounds: the suite runs many servers and workers at once on a small
        // machine, and a test of something else must not fail on a slow moment. Tests of
        // time-outs set their own.
        api.request_timeout_ms = 40_000;
        let mut redis_settings = redis.settings();
        redis_settings.redis_timeout_ms = 10_000;
        let mut config = AppConfig {
            api,
            redis: redis_settings,
        };
        adjust(&mut config);
        let app = Application::build(config.clone())
            .await
            .expect("app builds");
        let addr = app.address();
        let metrics_addr = app.metrics_address();
        let shards = app.store().shards();
        let waiters = app.waiters();
        let pull = app.pull();
        let deliverer = app.deliverer();
        let app_store = app.store();
        tokio::spawn(app.run_until_stopped(std::future::pending()));
        Self {
            addr,
            metrics_addr,
            waiters,
            pull,
            deliverer,
            app_store,
            redis,
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()
                .unwrap(),
            shards,
            config,
        }
    }

    /// Another server on the same Redis, with this app's settings as `adjust` changes them
    /// (as a second process would run); its address. It serves until the test ends.
    pub async fn spawn_beside(&self, adjust: impl FnOnce(&mut AppConfig)) -> SocketAddr {
        let mut config = self.config.clone();
        adjust(&mut config);
        let app = Application::build(config).await.expect("app builds");
        let addr = app.address();
        tokio::spawn(app.run_until_stopped(std::future::pending()));
        addr
    }

    /// A second store handle on the app's Redis (as another process would have).
    pub async fn store(&self) -> sluice::store::Store {
        sluice::store::Store::connect(self.config.store())
            .await
            .expect("store connects")
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// A request as the platform admin acting for `tenant`.
    pub fn as_tenant(
        &self,
        method: reqwest::Method,
        path: &str,
        tenant: &str,
    ) -> reqwest::RequestBuilder {
        self.client
            .request(method, self.url(path))
            .bearer_auth(ADMIN_TOKEN)
            .header("X-Tenant-Id", tenant)
    }

    /// GET `path` and parse the JSON answer: as the platform admin acting for `tenant`, or
    /// for no tenant when `None`.
    /// The body of `GET path` as text (no credential: metrics, the console's files, ...).
    pub async fn get_text(&self, path: &str) -> String {
        self.client
            .get(self.url(path))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    pub async fn get_json(&self, tenant: Option<&str>, path: &str) -> Value {
        let req = match tenant {
            Some(t) => self.as_tenant(reqwest::Method::GET, path, t),
            None => self.client.get(self.url(path)).bearer_auth(ADMIN_TOKEN),
        };
        req.send().await.unwrap().json().await.unwrap()
    }

    pub async fn post_execution(&self, tenant: &str, body: &Value) -> Response {
        self.as_tenant(reqwest::Method::POST, "/api/executions", tenant)
            .json(body)
            .send()
            .await
            .unwrap()
    }

    pub async fn post_with_key(&self, tenant: &str, key: &str, body: &Value) -> Response {
        self.as_tenant(reqwest::Method::POST, "/api/executions", tenant)
            .header("Idempotency-Key", key)
            .json(body)
            .send()
            .await
            .unwrap()
    }

    /// Admits an execution of `flow` and returns its body (asserting 201).
    pub async fn admit(&self, tenant: &str, flow: &str) -> Value {
        let res = self
            .post_execution(tenant, &json!({ "flow_id": flow }))
            .await;
        assert_eq!(res.status(), StatusCode::CREATED);
        res.json().await.unwrap()
    }

    pub async fn get_execution(&self, tenant: &str, id: &str) -> Response {
        self.as_tenant(
            reqwest::Method::GET,
            &format!("/api/executions/{id}"),
            tenant,
        )
        .send()
        .await
        .unwrap()
    }

    /// An execution's body (for one that exists).
    pub async fn execution(&self, tenant: &str, id: &str) -> Value {
        self.get_execution(tenant, id).await.json().await.unwrap()
    }

    /// A listing page's body.
    pub async fn page(&self, tenant: &str, query: &str) -> Value {
        self.list(tenant, query).await.json().await.unwrap()
    }

    pub async fn list(&self, tenant: &str, query: &str) -> Response {
        self.as_tenant(
            reqwest::Method::GET,
            &format!("/api/executions?{query}"),
            tenant,
        )
        .send()
        .await
        .unwrap()
    }

    pub async fn cancel(&self, tenant: &str, id: &str) -> Response {
        self.as_tenant(
            reqwest::Method::POST,
            &format!("/api/executions/{id}/cancel"),
            tenant,
        )
        .send()
        .await
        .unwrap()
    }

    pub async fn delete(&self, tenant: &str, id: &str, force: bool) -> Response {
        let q = if force { "?force=true" } else { "" };
        self.as_tenant(
            reqwest::Method::DELETE,
            &format!("/api/executions/{id}{q}"),
            tenant,
        )
        .send()
        .await
        .unwrap()
    }

    pub async fn put_tenant(&self, tenant: &str, body: &Value) -> Value {
        let res = self
            .client
            .put(self.url(&format!("/api/tenants/{tenant}")))
            .bearer_auth(ADMIN_TOKEN)
            .json(body)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        res.json().await.unwrap()
    }

    /// The tenant's `usage` object.
    pub async fn usage(&self, tenant: &str) -> Value {
        let res = self
            .client
            .get(self.url(&format!("/api/tenants/{tenant}")))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        res.json::<Value>().await.unwrap()["usage"].clone()
    }

    /// The index of the master serving `tenant`'s shard (on a cluster).
    pub async fn master_of(&self, tenant: &str) -> usize {
        let slot = self.redis.slot_of(&self.shard(tenant).prefix()).await;
        self.redis.master_of_slot(slot).await
    }

    /// The shard holding a tenant's keys (to assert on Redis directly).
    pub fn shard(&self, tenant: &str) -> Shard {
        self.shards.shard_of(&TenantId::parse(tenant).unwrap())
    }

    /// Rows of executions on Redis (all tenants).
    pub async fn row_count(&self) -> usize {
        self.redis
            .keys()
            .await
            .iter()
            .filter(|k| keys::parse(k).is_some_and(|n| n.kind == KeyKind::Row))
            .count()
    }

    /// The execution ids of a tenant's queue (runnable, not started), first to start first.
    pub async fn queue_ids(&self, tenant: &str) -> Vec<String> {
        let t = TenantId::parse(tenant).unwrap();
        let key = self.shard(tenant).waiting(&t);
        self.redis
            .query(redis::cmd("ZRANGE").arg(key).arg(0).arg(-1))
            .await
    }

    /// The tenants of a tenant's shard that can start something now (the runnable set).
    pub async fn runnable_tenants(&self, tenant: &str) -> Vec<String> {
        let key = self.shard(tenant).runnable();
        self.redis
            .query(redis::cmd("ZRANGE").arg(key).arg(0).arg(-1))
            .await
    }

    /// The start log of a tenant's shard, oldest first: (tenant, virtual start tag, weight).
    pub async fn start_log(&self, tenant: &str) -> Vec<(String, f64, u32)> {
        let entries: Vec<(String, Vec<String>)> = self
            .redis
            .query(
                redis::cmd("XRANGE")
                    .arg(self.shard(tenant).starts())
                    .arg("-")
                    .arg("+"),
            )
            .await;
        entries
            .into_iter()
            .map(|(_, fields)| {
                let get = |name: &str| {
                    fields
                        .chunks(2)
                        .find(|f| f[0] == name)
                        .map(|f| f[1].clone())
                        .unwrap_or_default()
                };
                (
                    get("t"),
                    get("vt").parse().unwrap(),
                    get("w").parse().unwrap(),
                )
            })
            .collect()
    }

    /// Members of a tenant's queue (runnable executions not started).
    pub async fn waiting_len(&self, tenant: &str) -> u64 {
        let t = TenantId::parse(tenant).unwrap();
        let key = self.shard(tenant).waiting(&t);
        self.redis.query(redis::cmd("ZCARD").arg(key)).await
    }

    /// The TTL (seconds) of an execution's row: -1 none, -2 gone.
    pub async fn row_ttl(&self, tenant: &str, id: &str) -> i64 {
        let key = self.shard(tenant).row(&ExecutionId::parse(id).unwrap());
        self.redis.query(redis::cmd("TTL").arg(key)).await
    }
}

/// The `code` of a problem+json response, checking its content type.
pub async fn problem_code(res: Response) -> String {
    let ct = res
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned());
    assert_eq!(ct.as_deref(), Some("application/problem+json"));
    let body: Value = res.json().await.unwrap();
    body["code"]
        .as_str()
        .expect("problem has a code")
        .to_owned()
}

/// Path of the built `sluice` binary.
pub fn sluice_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_sluice"))
}

/// Worker timings short enough for tests: lease 500 ms, heartbeat 100 ms, scan 100 ms.
pub const FAST_WORKER: &[&str] = &[
    "--lease-ttl-ms",
    "500",
    "--heartbeat-ms",
    "100",
    "--scan-ms",
    "100",
    "--retry-backoff-ms",
    "50",
];

/// A `sluice worker` process with the demo flows; killed (SIGKILL) when dropped.
pub struct TestWorker {
    child: Child,
}

impl TestWorker {
    /// Starts `sluice worker --demo-flows` against `redis` with `args` added.
    pub fn spawn(redis: &TestRedis, args: &[&str]) -> Self {
        Self::spawn_env(redis, args, &[])
    }

    /// Like `spawn`, with environment variables set (e.g. `SLUICE_JOURNAL`).
    /// `SLUICE_TEST_WORKER_LOG=debug cargo test ... -- --nocapture` shows the worker's log at
    /// that level, for debugging a test.
    pub fn spawn_env(redis: &TestRedis, args: &[&str], env: &[(&str, &str)]) -> Self {
        let log = std::env::var("SLUICE_TEST_WORKER_LOG").ok();
        let shown = || match log {
            Some(_) => Stdio::inherit(),
            None => Stdio::null(),
        };
        let child = Command::new(sluice_bin())
            .args(["worker", "--demo-flows"])
            .args(redis.args())
            .args(args)
            .envs(env.iter().copied())
            .env("RUST_LOG", log.as_deref().unwrap_or("warn"))
            .stdout(shown())
            .stderr(shown())
            .spawn()
            .expect("sluice worker starts");
        Self { child }
    }

    /// Sends a signal by name (`KILL`, `STOP`, `CONT`, `TERM`). `STOP` returns only once every
    /// thread of the worker has stopped: the kernel stops a thread that is running when it next
    /// enters the kernel, and on a loaded machine one may still act (e.g. send a start call on
    /// a wake-up that just came in) after `kill` returned.
    pub fn signal(&self, sig: &str) {
        let pid = self.child.id();
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &pid.to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{sig} failed");
        if sig == "STOP" {
            let deadline = Instant::now() + Duration::from_secs(10);
            while !all_threads_stopped(pid) {
                assert!(Instant::now() < deadline, "worker {pid} did not stop");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    /// SIGKILL and reap.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for the process to exit (at most `limit`); its exit status.
    pub fn wait_exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "worker did not exit within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl TestWorker {
    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for TestWorker {
    fn drop(&mut self) {
        // A stopped process must be continued to die promptly.
        let _ = Command::new("kill")
            .args(["-CONT", &self.child.id().to_string()])
            .status();
        self.kill9();
    }
}

impl TestApp {
    /// Starts up to `count` executions of `tenant`'s shard by hand, as worker "w" with a
    /// lease far longer than any test (no worker process: the test decides when runs end).
    pub async fn start_by_hand(&self, tenant: &str, count: usize) -> sluice::store::StartBatch {
        self.store()
            .await
            .start(self.shard(tenant), "w", count, Duration::from_secs(120), 0)
            .await
            .expect("start.lua answers")
    }

    /// `start_by_hand`, as (id, fence) in start order.
    pub async fn started_by_hand(&self, tenant: &str, count: usize) -> Vec<(String, u64)> {
        self.start_by_hand(tenant, count)
            .await
            .started
            .into_iter()
            .map(|s| (s.id.to_string(), s.fence))
            .collect()
    }

    /// Polls an execution until `done` holds (at most `limit`); returns it.
    pub async fn wait_for(
        &self,
        tenant: &str,
        id: &str,
        limit: Duration,
        what: &str,
        done: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + limit;
        loop {
            let e = self.execution(tenant, id).await;
            if done(&e) {
                return e;
            }
            assert!(
                Instant::now() < deadline,
                "{what} not reached within {limit:?}: {e}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until the execution is running with `attempt`.
    pub async fn wait_running(&self, tenant: &str, id: &str, attempt: u64) -> Value {
        self.wait_for(tenant, id, Duration::from_secs(15), "running", |e| {
            e["status"] == "running" && e["attempt"] == attempt
        })
        .await
    }

    /// Waits until the execution is in a terminal status.
    pub async fn wait_terminal(&self, tenant: &str, id: &str, limit: Duration) -> Value {
        self.wait_for(tenant, id, limit, "a terminal status", |e| {
            matches!(
                e["status"].as_str(),
                Some("completed" | "failed" | "cancelled")
            )
        })
        .await
    }

    /// Admits `flow` with `params` (and optional max_attempts); returns its id.
    pub async fn admit_with(&self, tenant: &str, body: Value) -> String {
        let res = self.post_execution(tenant, &body).await;
        assert_eq!(res.status(), StatusCode::CREATED);
        res.json::<Value>().await.unwrap()["execution_id"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// Counters summed over all shards (from `GET /api/queues`).
    pub async fn counter(&self, name: &str) -> u64 {
        let stats = self.get_json(None, "/api/queues").await;
        stats["shards"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["counters"][name].as_u64().unwrap_or(0))
            .sum()
    }

    /// Dead letters (platform-wide, newest first).
    pub async fn dead_letters(&self) -> Vec<Value> {
        let page = self.get_json(None, "/api/dlq?limit=200").await;
        page["dead_letters"].as_array().unwrap().clone()
    }

    /// POST /api/executions/{id}/retry.
    pub async fn retry(&self, tenant: &str, id: &str) -> Response {
        self.as_tenant(
            reqwest::Method::POST,
            &format!("/api/executions/{id}/retry"),
            tenant,
        )
        .send()
        .await
        .unwrap()
    }
}

/// Whether every thread of process `pid` is stopped (state `T` in `/proc/<pid>/task/*/stat`).
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|task| {
        std::fs::read_to_string(task.path().join("stat")).is_ok_and(|stat| {
            // `pid (name) state ...`: the state follows the last ')'.
            stat.rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with(['T', 't']))
        })
    })
}

/// Whether the server at `base` (`http://host:port`) answered `/readyz` with 200 within
/// `limit` (each probe bounded to a second).
pub async fn wait_ready(client: &reqwest::Client, base: &str, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        let res = client
            .get(format!("{base}/readyz"))
            .timeout(Duration::from_secs(1))
            .send()
            .await;
        if res.is_ok_and(|r| r.status() == StatusCode::OK) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// The W3C trace headers a handler received, as a test's echo service answers them:
/// `{"traceparent": ..., "tracestate": ...}` (null for an absent one).
pub fn trace_headers(headers: &axum::http::HeaderMap) -> Value {
    let get = |n: &str| headers.get(n).map(|v| v.to_str().unwrap().to_owned());
    json!({"traceparent": get("traceparent"), "tracestate": get("tracestate")})
}

/// A flows file with `toml` in a temporary folder: the folder (kept while it lives) and the
/// file's path, for `sluice worker --flows`.
pub fn flows_file(toml: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flows.toml");
    std::fs::write(&path, toml).unwrap();
    (dir, path)
}
