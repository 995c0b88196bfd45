//! Test fixtures: a real `redis-server` per test on a free port, and a `TestApp` (the real
//! application on port 0) whose methods speak the API as a client would.
//!
//! The fixtures live in `helpers/`: the Redis a test owns (`redis.rs`: `TestRedis`), the real
//! application (`app.rs`: `TestApp`), a `sluice worker` child process (`worker.rs`:
//! `TestWorker`) and a loopback proxy in front of Redis (`proxy.rs`: `TestProxy`). This file re-exports them under the names the tests import
//! (`crate::helpers::TestApp`, ...) and holds the small helpers that belong to no fixture.

mod app;
mod dedup;
mod proxy;
mod redis;
mod serve;
mod worker;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use reqwest::{Response, StatusCode};
use serde_json::{Value, json};

pub use self::app::{ADMIN_TOKEN, DedupMapping, METRICS_TOKEN, TestApp};
pub use self::dedup::dedup_orphans;
pub use self::proxy::{ProxiedConnection, TestProxy};
pub use self::redis::{
    TestRedis, binary_layout, cluster_mode, id_text, key_bytes, key_text, mapping_text, shard_no,
};
pub use self::serve::TestServe;
pub use self::worker::{FAST_WORKER, TestWorker, flows_file};

/// A loopback port that was free a moment ago (`sluice::redis_server::free_port`, shared with `sluice
/// dev` and the benchmark).
/// Whether a test of layout 4 itself (a move to it from an older layout, or data of an older
/// model) is skipped in this pass: a layout-5 Redis (`SLUICE_TEST_LAYOUT=5`) never holds an
/// older layout's data (a move from 4 to 5 is step 6 of docs/layout-5-plan.md).
pub fn skipped_at_layout_5(what: &str) -> bool {
    if binary_layout() {
        println!("{what}: layout 4 only; skipped at SLUICE_TEST_LAYOUT=5");
    }
    binary_layout()
}

pub fn free_port() -> u16 {
    sluice::redis_server::free_port().expect("a free loopback port")
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
