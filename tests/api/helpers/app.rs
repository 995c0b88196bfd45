//! `TestApp`: the real application, built in the test's process on port 0 with its own Redis,
//! and the methods that speak its API as a client would (admit, read, list, cancel, retry,
//! change a tenant, wait for a status) or look behind it (its shards' keys on Redis, starts by
//! hand through its store). Separate from the Redis it runs on (`redis.rs`) and from worker
//! processes (`worker.rs`).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use reqwest::{Response, StatusCode};
use serde_json::{Value, json};
use sluice::Application;
use sluice::config::{ApiSettings, AppConfig};
use sluice::domain::{ExecutionId, TenantId};
use sluice::store::keys::{self, KeyKind};
use sluice::store::{Shard, ShardMap};

use super::TestRedis;

/// The platform admin token every `TestApp` is configured with.
pub const ADMIN_TOKEN: &str = "test-admin-token-0123456789";

/// The token `/metrics` needs on every `TestApp` (`--metrics-token`), as a deployment's
/// scraper would have it.
pub const METRICS_TOKEN: &str = "test-metrics-token-0123456789";

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
        api.metrics_token = Some(METRICS_TOKEN.into());
        // Generous bounds: the suite runs many servers and workers at once on a small
        // machine, and a test of something else must not fail on a slow moment. Tests of
        // time-outs set their own.
        api.request_timeout_ms = 40_000;
        // The start log proves the fair share (dispatch, commands, throttle, guarantees): on
        // in every test app, so each proof reads the real start path; published, so the
        // tests' `sluice worker`s keep it too. `start_log_is_kept_only_when_asked` turns it
        // off.
        api.start_log = true;
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
            // Idle connections are dropped well before the server's idle cut (its
            // `--header-read-timeout-ms`, 10 s by default): a request sent on a connection the
            // server is closing at that moment fails with `IncompleteMessage` (a test idle
            // for exactly that long between two requests did).
            client: sluice::tls::client_builder(&[])
                .unwrap()
                .timeout(Duration::from_secs(60))
                .pool_idle_timeout(Duration::from_secs(5))
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

    /// Builds another server on the same Redis with this app's settings (as a second
    /// process would start), or the error its start ends with; it serves until the test ends.
    pub async fn try_spawn_beside(&self) -> anyhow::Result<SocketAddr> {
        let app = Application::build(self.config.clone()).await?;
        let addr = app.address();
        tokio::spawn(app.run_until_stopped(std::future::pending()));
        Ok(addr)
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

    /// The body of `GET path` as text (no credential: the console's files, ...).
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

    /// `/metrics` as a scraper with the metrics token reads it.
    pub async fn metrics(&self) -> String {
        let res = self
            .client
            .get(self.url("/metrics"))
            .bearer_auth(METRICS_TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK, "GET /metrics");
        res.text().await.unwrap()
    }

    /// GET `path` and parse the JSON answer: as the platform admin acting for `tenant`, or
    /// for no tenant when `None`.
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

    /// Every execution of `tenant` on Redis, by the `nonce` in its params: the ids of the
    /// executions that carry each nonce (a test that admits with nonces counts them here).
    pub async fn admitted_by_nonce(
        &self,
        tenant: &str,
    ) -> std::collections::HashMap<String, Vec<String>> {
        let mut found: std::collections::HashMap<String, Vec<String>> = Default::default();
        let mut cursor: Option<String> = None;
        for _ in 0..1_000 {
            let q = match &cursor {
                Some(c) => format!("limit=200&cursor={c}"),
                None => "limit=200".into(),
            };
            let page = self.page(tenant, &q).await;
            for e in page["executions"].as_array().unwrap() {
                if let Some(nonce) = e["params"]["nonce"].as_str() {
                    found
                        .entry(nonce.to_owned())
                        .or_default()
                        .push(e["execution_id"].as_str().unwrap().to_owned());
                }
            }
            match page["next_cursor"].as_str() {
                Some(c) => cursor = Some(c.to_owned()),
                None => return found,
            }
        }
        panic!("more pages than a test admits");
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
            .ids(redis::cmd("ZRANGE").arg(key).arg(0).arg(-1))
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

    /// `super::dedup_orphans` of everything Redis holds (empty: every mapping where it
    /// belongs).
    pub async fn dedup_orphans(&self) -> Vec<String> {
        let keys = self.redis.keys().await;
        let mut c = self.redis.conn().await;
        super::dedup_orphans(&mut c, keys).await
    }

    /// Where `tenant`'s mapping of dedup key `key` is on Redis (see `DedupMapping`). Panics
    /// when it is in both places: a mapping lives in one form at a time.
    pub async fn dedup_mapping(&self, tenant: &str, key: &str) -> DedupMapping {
        let s = self.shard(tenant);
        let t = TenantId::parse(tenant).unwrap();
        let digest = sluice::domain::DedupKey::parse(key).unwrap().digest();
        // (Values as layout 4 writes them, `mapping_text`: the id part in hex.)
        let field: Option<Vec<u8>> = self
            .redis
            .query(
                redis::cmd("HGET")
                    .arg(s.dedup_bucket(&t, &digest))
                    .arg(keys::dedup_field(&digest)),
            )
            .await;
        let key = s.dedup(&t, &digest);
        let value: Option<Vec<u8>> = self.redis.query(redis::cmd("GET").arg(&key)).await;
        // At layout 5 a mapping is `<id 16><fingerprint 8>` in either form.
        if s.binary_ids() {
            for v in field.iter().chain(&value) {
                assert_eq!(v.len(), 24, "{key}: {v:?}");
            }
        }
        let field = field.map(super::mapping_text);
        let value = value.map(super::mapping_text);
        let ttl: i64 = self.redis.query(redis::cmd("TTL").arg(&key)).await;
        match (field, value) {
            (Some(f), None) => DedupMapping::Live(f),
            (None, Some(v)) => DedupMapping::Ended(v, ttl),
            (None, None) => DedupMapping::Free,
            (Some(f), Some(v)) => {
                panic!("{key}: a bucket field {f} and a string key {v} ({ttl} s)")
            }
        }
    }
}

/// Where a dedup mapping is (`TestApp::dedup_mapping`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DedupMapping {
    /// A field of its tenant's bucket (its execution is live): `<id>:<fingerprint>` (the id
    /// in hex whatever the layout stores, `mapping_text`).
    Live(String),
    /// The string key, with its TTL in seconds (-1: none, an older build's live form).
    Ended(String, i64),
    /// Neither: the key is free.
    Free,
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
