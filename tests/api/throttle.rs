//! Rate limits (docs/DESIGN.md, "Dispatch"): a tenant's and each concurrency key's starts are
//! throttled when they start — over the rate executions wait in order, nothing is refused —
//! a throttled tenant or key leaves the eligible set until its next token is due (a wake-up on
//! the shard's timer set, which the workers sleep on), a throttled key never delays another,
//! and an idle tenant or key with a full bucket leaves nothing in Redis.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice::store::keys::{self, KeyKind};

use crate::helpers::{FAST_WORKER, TestApp, TestWorker, problem_code};

/// Starts up to `count` executions of `tenant`'s shard by hand.
async fn start(app: &TestApp, tenant: &str, count: usize) -> sluice::store::StartBatch {
    app.start_by_hand(tenant, count).await
}

async fn admit_n(app: &TestApp, tenant: &str, n: usize, key: Option<&str>) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        let mut body = json!({"flow_id": "demo.echo", "params": {"i": i}});
        if let Some(k) = key {
            body["concurrency_key"] = json!(k);
        }
        ids.push(app.admit_with(tenant, body).await);
    }
    ids
}

/// The Redis times (ms) of `tenant`'s starts, from its shard's start log.
async fn start_times(app: &TestApp, tenant: &str) -> Vec<u64> {
    let entries: Vec<(String, Vec<String>)> = app
        .redis
        .query(
            redis::cmd("XRANGE")
                .arg(app.shard(tenant).starts())
                .arg("-")
                .arg("+"),
        )
        .await;
    entries
        .into_iter()
        .filter(|(_, f)| f.chunks(2).any(|p| p[0] == "t" && p[1] == tenant))
        .map(|(id, _)| id.split('-').next().unwrap().parse().unwrap())
        .collect()
}

/// The most starts in any window of `window_ms` (starting at a start).
fn busiest_window(times: &[u64], window_ms: u64) -> usize {
    times
        .iter()
        .map(|&t| {
            times
                .iter()
                .filter(|&&u| u >= t && u < t + window_ms)
                .count()
        })
        .max()
        .unwrap_or(0)
}

/// Rate-limit state and wake-ups left on Redis.
async fn throttle_state(app: &TestApp) -> Vec<String> {
    let mut left: Vec<String> = app
        .redis
        .keys()
        .await
        .into_iter()
        .filter(|k| {
            keys::parse(k).is_some_and(|n| matches!(n.kind, KeyKind::Tat | KeyKind::KeyTat))
        })
        .collect();
    let members: Vec<String> = app
        .redis
        .query(
            redis::cmd("ZRANGE")
                .arg(app.shard("acme").delayed())
                .arg(0)
                .arg(-1),
        )
        .await;
    left.extend(members.into_iter().filter(|m| m.starts_with('r')));
    left
}

/// A backlog of 60 behind a rate of 20 per second with a burst of 3, drained by a real worker
/// with 8 slots: every window of a second holds at most 23 starts on Redis's clock, the drain
/// takes at least (60 − 3) / 20 s, and afterwards nothing of the throttle is left on Redis.
#[tokio::test]
async fn a_throttled_tenant_starts_at_its_rate_and_never_faster() {
    let app = TestApp::spawn().await;
    let t = app
        .put_tenant(
            "acme",
            &json!({"max_concurrent": 50, "rate_limit": {"starts": 20, "per": "1s", "burst": 3}}),
        )
        .await;
    assert_eq!(
        t["rate_limit"],
        json!({"starts": 20, "per": "1s", "burst": 3})
    );
    let ids = admit_n(&app, "acme", 60, None).await;
    let mut args = vec!["--concurrency", "8"];
    args.extend_from_slice(FAST_WORKER);
    let _w = TestWorker::spawn(&app.redis, &args);
    for id in &ids {
        let e = app.wait_terminal("acme", id, Duration::from_secs(60)).await;
        assert_eq!(e["status"], "completed");
        assert_eq!(e["attempt"], 1);
    }
    let times = start_times(&app, "acme").await;
    assert_eq!(times.len(), 60);
    let busiest = busiest_window(&times, 1_000);
    assert!(busiest <= 23, "{busiest} starts within one second");
    let span = times.last().unwrap() - times.first().unwrap();
    assert!(
        span >= 2_800,
        "60 starts in {span} ms: faster than the rate"
    );
    assert!(app.counter("throttled").await > 0);
    // The bucket fills up again within one interval (50 ms): nothing is left.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = throttle_state(&app).await;
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "left on Redis: {left:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// By hand, at 2 per minute with a burst of 2: two start, the tenant leaves the runnable set
/// with a wake-up on the timer set that the start's answer reports as its next due time; no
/// call starts more; dropping the limit lets the rest start at once.
#[tokio::test]
async fn a_throttled_tenant_leaves_the_runnable_set_until_its_next_token() {
    let app = TestApp::spawn().await;
    app.put_tenant(
        "acme",
        &json!({"max_concurrent": 10, "rate_limit": {"starts": 2, "per": "1m", "burst": 2}}),
    )
    .await;
    admit_n(&app, "acme", 5, None).await;
    let first = start(&app, "acme", 8).await;
    assert_eq!(first.started.len(), 2, "the burst");
    assert!(!first.more);
    let due = first.next_due.expect("a wake-up is due");
    assert!(
        due > Duration::from_secs(20) && due <= Duration::from_secs(30),
        "{due:?}"
    );
    assert!(app.runnable_tenants("acme").await.is_empty());
    assert!(start(&app, "acme", 8).await.started.is_empty());
    let dry = app
        .as_tenant(reqwest::Method::POST, "/api/executions/dry-run", "acme")
        .json(&json!({"flow_id": "demo.echo"}))
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap();
    assert_eq!(
        (dry["decision"].as_str(), dry["reason"].as_str()),
        (Some("wait"), Some("tenant_throttled")),
        "{dry}"
    );
    // The metrics say how long it is held back (about 30 s: one token every 30 s, burst 2).
    let metrics = app.metrics().await;
    let held: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("sluice_tenant_throttled_seconds{tenant=\"acme\"} "))
        .unwrap_or_else(|| panic!("no throttle gauge: {metrics}"))
        .parse()
        .unwrap();
    assert!(held > 20.0 && held <= 30.0, "{held}");
    let t = app.put_tenant("acme", &json!({"rate_limit": null})).await;
    assert_eq!(t["rate_limit"], Value::Null);
    assert_eq!(start(&app, "acme", 8).await.started.len(), 3);
}

/// Per key, at 5 per minute: key A's first start throttles A (its 9 others wait in its queue),
/// yet B and the keyless ones start in the same call; dropping the per-key rate lets A and B
/// go on at once, in order.
#[tokio::test]
async fn a_throttled_key_never_delays_another_key() {
    let app = TestApp::spawn().await;
    app.put_tenant(
        "acme",
        &json!({"max_concurrent": 100, "rate_limit_per_key": {"starts": 5, "per": "1m"}}),
    )
    .await;
    let a = admit_n(&app, "acme", 10, Some("A")).await;
    let b = admit_n(&app, "acme", 3, Some("B")).await;
    let plain = admit_n(&app, "acme", 3, None).await;
    let batch = start(&app, "acme", 8).await;
    let mut got: Vec<String> = batch.started.iter().map(|s| s.id.to_string()).collect();
    got.sort();
    let mut want = vec![a[0].clone(), b[0].clone()];
    want.extend(plain.iter().cloned());
    want.sort();
    assert_eq!(got, want);
    assert!(
        start(&app, "acme", 8).await.started.is_empty(),
        "A and B wait for a token"
    );
    let tenant = app.get_json(None, "/api/tenants/acme").await;
    assert_eq!(tenant["concurrency_keys"]["blocked"], 2);
    let dry = app
        .as_tenant(reqwest::Method::POST, "/api/executions/dry-run", "acme")
        .json(&json!({"flow_id": "demo.echo", "concurrency_key": "A"}))
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap();
    assert_eq!(
        (dry["decision"].as_str(), dry["reason"].as_str()),
        (Some("wait"), Some("key_throttled")),
        "{dry}"
    );
    app.put_tenant("acme", &json!({"rate_limit_per_key": null}))
        .await;
    let rest = start(&app, "acme", 20).await;
    let order: Vec<String> = rest.started.iter().map(|s| s.id.to_string()).collect();
    assert_eq!(order.len(), 11);
    let a_order: Vec<&String> = order.iter().filter(|id| a.contains(id)).collect();
    assert_eq!(
        a_order,
        a[1..].iter().collect::<Vec<_>>(),
        "A in admission order"
    );
}

/// Rate limits are checked like every setting.
#[tokio::test]
async fn rate_limits_are_validated() {
    let app = TestApp::spawn().await;
    for bad in [
        json!({"starts": 0, "per": "1s"}),
        json!({"starts": 1, "per": "0ms"}),
        json!({"starts": 1, "per": "2d"}),
        json!({"starts": 1, "per": "soon"}),
        json!({"starts": 1, "per": "1s", "burst": 0}),
        json!({"starts": 1_000_001, "per": "1s"}),
        json!({"starts": 1, "per": "1s", "extra": 1}),
        json!({"per": "1s"}),
    ] {
        for field in ["rate_limit", "rate_limit_per_key"] {
            let res = app
                .client
                .put(app.url("/api/tenants/acme"))
                .bearer_auth(crate::helpers::ADMIN_TOKEN)
                .json(&json!({ field: bad }))
                .send()
                .await
                .unwrap();
            assert_eq!(res.status(), StatusCode::BAD_REQUEST, "{field}: {bad}");
            let code = problem_code(res).await;
            assert!(
                code == "invalid_rate_limit" || code == "invalid_body",
                "{field}: {bad}: {code}"
            );
        }
    }
    let t = app
        .put_tenant(
            "acme",
            &json!({"rate_limit": {"starts": 100, "per": "60000ms"},
                    "rate_limit_per_key": {"starts": 3, "per": "90s", "burst": 2}}),
        )
        .await;
    assert_eq!(
        t["rate_limit"],
        json!({"starts": 100, "per": "1m", "burst": 1})
    );
    assert_eq!(
        t["rate_limit_per_key"],
        json!({"starts": 3, "per": "90s", "burst": 2})
    );
}
