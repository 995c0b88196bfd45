//! Concurrency keys (docs/api.md, "Admission control"): executions of one key run at most
//! the key's limit at once, inside the tenant's `max_concurrent`; a key at its limit leaves its
//! tenant's order, so it never delays another key and nothing skips over it; limits can be
//! raised, lowered and dropped while work waits; and a key with nothing left leaves nothing in
//! Redis.
//!
//! Long on purpose: a list of independent tests of concurrency keys, each one rule of the key's
//! limit; together they are its contract.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sluice::domain::ExecutionId;
use sluice::store::Outcome;
use sluice::store::keys::{self, KeyKind};

use crate::helpers::{FAST_WORKER, TestApp, TestWorker, problem_code};

/// A request on a tenant's concurrency key as the platform admin (`key` percent-encoded).
fn key_call(app: &TestApp, method: Method, tenant: &str, key: &str) -> reqwest::RequestBuilder {
    let key = urlencoding(key);
    app.as_tenant(
        method,
        &format!("/api/tenants/{tenant}/concurrency-keys/{key}"),
        tenant,
    )
}

/// Percent-encodes every byte outside the unreserved set (RFC 3986).
fn urlencoding(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Sets a key's override; returns the key's view.
async fn set_key(app: &TestApp, tenant: &str, key: &str, limit: u32) -> Value {
    let res = key_call(app, Method::PUT, tenant, key)
        .json(&json!({ "max_concurrent": limit }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    res.json().await.unwrap()
}

async fn get_key(app: &TestApp, tenant: &str, key: &str) -> Value {
    let res = key_call(app, Method::GET, tenant, key)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    res.json().await.unwrap()
}

/// Admits a `demo.echo` with `key` (None: no key); returns its id.
async fn admit_keyed(app: &TestApp, tenant: &str, key: Option<&str>, i: usize) -> String {
    let mut body = json!({"flow_id": "demo.echo", "params": {"i": i}});
    if let Some(k) = key {
        body["concurrency_key"] = json!(k);
    }
    app.admit_with(tenant, body).await
}

/// Starts up to `count` executions of `tenant`'s shard by hand: (id, fence), in start order.
async fn start(app: &TestApp, tenant: &str, count: usize) -> Vec<(String, u64)> {
    app.started_by_hand(tenant, count).await
}

async fn complete(app: &TestApp, tenant: &str, id: &str, fence: u64) {
    let store = app.store().await;
    let id = ExecutionId::parse(id).unwrap();
    store
        .complete(
            app.shard(tenant),
            &id,
            fence,
            "w",
            &Outcome::Completed(json!({})),
        )
        .await
        .unwrap();
}

fn ids(started: &[(String, u64)]) -> Vec<String> {
    started.iter().map(|(id, _)| id.clone()).collect()
}

/// The key structures (queues, running sets, blocked sets) on Redis.
async fn key_structures(app: &TestApp) -> Vec<String> {
    app.redis
        .keys()
        .await
        .into_iter()
        .filter(|k| {
            keys::parse(k).is_some_and(|n| {
                matches!(
                    n.kind,
                    KeyKind::KeyQueue | KeyKind::KeyRunning | KeyKind::KeyBlocked
                )
            })
        })
        .collect()
}

/// The case: key A full (limit 1) with 1,000 more waiting; key B, and an execution with
/// no key, admitted after all of them, start at the next pick — and A's next starts only when
/// its run ends, in admission order.
#[tokio::test]
async fn a_full_key_never_delays_another_key() {
    let app = TestApp::spawn().await;
    app.put_tenant(
        "acme",
        &json!({"max_concurrent": 50, "max_queued": 5000, "max_concurrent_per_key": 1}),
    )
    .await;
    let mut a = Vec::new();
    for i in 0..1001 {
        a.push(admit_keyed(&app, "acme", Some("A"), i).await);
    }
    let first = start(&app, "acme", 8).await;
    assert_eq!(
        ids(&first),
        [a[0].clone()],
        "one of key A, the first admitted"
    );
    let b = admit_keyed(&app, "acme", Some("B"), 0).await;
    let plain = admit_keyed(&app, "acme", None, 0).await;
    let e = app.execution("acme", &b).await;
    assert_eq!(e["concurrency_key"], "B");
    assert_eq!(e["queue_state"], "ready");
    assert_eq!(app.execution("acme", &a[1]).await["queue_state"], "waiting");
    let mut next = ids(&start(&app, "acme", 8).await);
    next.sort();
    let mut want = vec![b, plain];
    want.sort();
    assert_eq!(next, want, "B and the keyless one start; nothing of A");
    assert!(start(&app, "acme", 8).await.is_empty(), "A is at its limit");

    let key_a = get_key(&app, "acme", "A").await;
    assert_eq!(
        key_a,
        json!({"key": "A", "max_concurrent": 1, "override": false, "running": 1, "queued": 1000})
    );
    let usage = app.usage("acme").await;
    assert_eq!(
        usage,
        json!({"running": 3, "waiting": 1000, "scheduled": 0})
    );
    let tenant = app.get_json(None, "/api/tenants/acme").await;
    assert_eq!(
        tenant["concurrency_keys"],
        json!({"overrides": 0, "blocked": 1})
    );
    assert_eq!(tenant["max_concurrent_per_key"], 1);
    // Saturation in the metrics, per tenant: keys are never labels.
    let metrics = app.metrics().await;
    assert!(
        metrics.contains("sluice_tenant_blocked_keys{tenant=\"acme\"} 1"),
        "{metrics}"
    );
    assert!(!metrics.contains("\"A\""), "a key named in a label");

    // A's run ends: its next one, in admission order, and only that one.
    complete(&app, "acme", &a[0], first[0].1).await;
    assert_eq!(ids(&start(&app, "acme", 8).await), [a[1].clone()]);
}

/// Limits change while work waits: a raised override starts what now fits, in order; a
/// lowered tenant default stops new starts until enough runs end; dropping the override and
/// the default leaves the key unlimited; 0 holds a key.
#[tokio::test]
async fn raising_lowering_and_dropping_a_key_limit() {
    let app = TestApp::spawn().await;
    app.put_tenant("acme", &json!({"max_concurrent": 100}))
        .await;
    set_key(&app, "acme", "K", 1).await;
    let mut k = Vec::new();
    for i in 0..8 {
        k.push(admit_keyed(&app, "acme", Some("K"), i).await);
    }
    let mut held = start(&app, "acme", 8).await;
    assert_eq!(ids(&held), [k[0].clone()]);
    // Raised: two more, the next two in order.
    let view = set_key(&app, "acme", "K", 3).await;
    assert_eq!(
        view,
        json!({"key": "K", "max_concurrent": 3, "override": true, "running": 1, "queued": 7})
    );
    let more = start(&app, "acme", 8).await;
    assert_eq!(ids(&more), [k[1].clone(), k[2].clone()]);
    held.extend(more);
    // Lowered to 1 while 3 run: none is stopped, none starts until two have ended.
    set_key(&app, "acme", "K", 1).await;
    assert!(start(&app, "acme", 8).await.is_empty());
    complete(&app, "acme", &held[0].0, held[0].1).await;
    assert!(
        start(&app, "acme", 8).await.is_empty(),
        "2 still run, limit 1"
    );
    complete(&app, "acme", &held[1].0, held[1].1).await;
    assert!(
        start(&app, "acme", 8).await.is_empty(),
        "1 still runs, limit 1"
    );
    complete(&app, "acme", &held[2].0, held[2].1).await;
    let one = start(&app, "acme", 8).await;
    assert_eq!(ids(&one), [k[3].clone()]);
    // Held at 0: nothing of it starts, even with its run over.
    set_key(&app, "acme", "K", 0).await;
    complete(&app, "acme", &one[0].0, one[0].1).await;
    assert!(
        start(&app, "acme", 8).await.is_empty(),
        "a key at 0 is held"
    );
    // The override goes, the tenant's default (2) applies; then the default goes: no limit.
    app.put_tenant("acme", &json!({"max_concurrent_per_key": 2}))
        .await;
    let res = key_call(&app, Method::DELETE, "acme", "K")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        get_key(&app, "acme", "K").await,
        json!({"key": "K", "max_concurrent": 2, "override": false, "running": 0, "queued": 4})
    );
    assert_eq!(
        ids(&start(&app, "acme", 8).await),
        [k[4].clone(), k[5].clone()]
    );
    let t = app
        .put_tenant("acme", &json!({"max_concurrent_per_key": null}))
        .await;
    assert_eq!(t["max_concurrent_per_key"], Value::Null);
    assert_eq!(
        ids(&start(&app, "acme", 8).await),
        [k[6].clone(), k[7].clone()]
    );
}

/// Cancelling or force-deleting the first of a key hands the key's place on to its next one;
/// retrying a cancelled one queues it in its key again.
#[tokio::test]
async fn the_keys_place_passes_on_when_its_first_leaves() {
    let app = TestApp::spawn().await;
    app.put_tenant("acme", &json!({"max_concurrent_per_key": 1}))
        .await;
    let k: Vec<String> = {
        let mut v = Vec::new();
        for i in 0..4 {
            v.push(admit_keyed(&app, "acme", Some("K"), i).await);
        }
        v
    };
    assert_eq!(
        app.queue_ids("acme").await,
        [k[0].clone()],
        "one entry per key"
    );
    assert_eq!(app.cancel("acme", &k[0]).await.status(), StatusCode::OK);
    assert_eq!(app.queue_ids("acme").await, [k[1].clone()]);
    assert_eq!(
        app.delete("acme", &k[1], true).await.status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(app.queue_ids("acme").await, [k[2].clone()]);
    // A retried execution re-enters its key's order by the time of the retry: after k[3].
    assert_eq!(app.retry("acme", &k[0]).await.status(), StatusCode::OK);
    let mut order = Vec::new();
    for _ in 0..3 {
        let s = start(&app, "acme", 8).await;
        assert_eq!(s.len(), 1, "the key runs one at a time");
        complete(&app, "acme", &s[0].0, s[0].1).await;
        order.push(s[0].0.clone());
    }
    assert_eq!(order, [k[2].clone(), k[3].clone(), k[0].clone()]);
    assert!(key_structures(&app).await.is_empty());
}

/// Many real workers, three keys with limits 2, 2 and 3 and keyless work beside them: every
/// execution completes once, and at no instant did more of one key run than its limit (runs
/// hold their slot from `started_at` to `finished_at`). Afterwards no key structure is left.
#[tokio::test]
async fn key_limits_hold_with_many_workers() {
    let app = TestApp::spawn().await;
    app.put_tenant(
        "acme",
        &json!({"max_concurrent": 12, "max_concurrent_per_key": 2}),
    )
    .await;
    set_key(&app, "acme", "k2", 3).await;
    let limits = BTreeMap::from([("k0", 2), ("k1", 2), ("k2", 3)]);
    let mut all: Vec<(String, Option<&str>)> = Vec::new();
    for i in 0..20 {
        for key in [Some("k0"), Some("k1"), Some("k2"), None] {
            let body = match key {
                Some(k) => {
                    json!({"flow_id": "demo.sleep", "params": {"ms": 30, "i": i}, "concurrency_key": k})
                }
                None => json!({"flow_id": "demo.sleep", "params": {"ms": 30, "i": i}}),
            };
            all.push((app.admit_with("acme", body).await, key));
        }
    }
    let mut args = vec!["--concurrency", "6"];
    args.extend_from_slice(FAST_WORKER);
    let _w1 = TestWorker::spawn(&app.redis, &args);
    let _w2 = TestWorker::spawn(&app.redis, &args);
    let mut runs: HashMap<&str, Vec<(u64, u64)>> = HashMap::new();
    for (id, key) in &all {
        let e = app.wait_terminal("acme", id, Duration::from_secs(60)).await;
        assert_eq!(e["status"], "completed", "{e}");
        assert_eq!(e["attempt"], 1, "{e}");
        if let Some(k) = key {
            assert_eq!(e["concurrency_key"], *k);
            runs.entry(k)
                .or_default()
                .push((ms_of(&e["started_at"]), ms_of(&e["finished_at"])));
        }
    }
    for (key, limit) in limits {
        let spans = &runs[key];
        assert_eq!(spans.len(), 20);
        // Half-open spans: a run that ends at t frees its slot for a start at t.
        let peak = spans
            .iter()
            .map(|&(s, _)| spans.iter().filter(|&&(s2, f2)| s2 <= s && s < f2).count())
            .max()
            .unwrap();
        assert!(peak <= limit, "{key}: {peak} ran at once, limit {limit}");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = key_structures(&app).await;
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "left on Redis: {left:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `concurrency_key` is checked like a dedup key, shown back, and part of what a replay must
/// match.
#[tokio::test]
async fn a_concurrency_key_is_validated_and_part_of_the_dedup_fingerprint() {
    let app = TestApp::spawn().await;
    for bad in [
        json!(""),
        json!("x".repeat(129)),
        json!("a\u{200B}b"),
        json!("."),
        json!(".."),
        json!(7),
    ] {
        let res = app
            .post_execution(
                "acme",
                &json!({"flow_id": "demo.echo", "concurrency_key": bad}),
            )
            .await;
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "{bad}");
        let code = problem_code(res).await;
        assert!(
            code == "invalid_concurrency_key" || code == "invalid_body",
            "{bad}: {code}"
        );
    }
    let body = json!({"flow_id": "demo.echo", "concurrency_key": "customer-7"});
    let first = app.post_with_key("acme", "d-1", &body).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let first: Value = first.json().await.unwrap();
    assert_eq!(first["concurrency_key"], "customer-7");
    let again = app.post_with_key("acme", "d-1", &body).await;
    assert_eq!(again.status(), StatusCode::OK);
    let again: Value = again.json().await.unwrap();
    assert_eq!(again["execution_id"], first["execution_id"]);
    assert_eq!(again["concurrency_key"], "customer-7");
    for other in [
        json!({"flow_id": "demo.echo", "concurrency_key": "customer-8"}),
        json!({"flow_id": "demo.echo"}),
    ] {
        let res = app.post_with_key("acme", "d-1", &other).await;
        assert_eq!(res.status(), StatusCode::UNPROCESSABLE_ENTITY, "{other}");
    }
    // Without a key the fingerprint is the one of before keys (a replay still matches).
    let plain = json!({"flow_id": "demo.echo"});
    assert_eq!(
        app.post_with_key("acme", "d-2", &plain).await.status(),
        StatusCode::CREATED
    );
    assert_eq!(
        app.post_with_key("acme", "d-2", &plain).await.status(),
        StatusCode::OK
    );
    let e = app.admit("acme", "demo.echo").await;
    assert_eq!(e["concurrency_key"], Value::Null);
}

/// Overrides: any key (percent-encoded in the path) can be set before it is used, listed in
/// key order, read and dropped; a tenant has at most 10,000 (the 10,001st is 409, changing an
/// existing one still works); a tenant admin key manages its own tenant's, no other's.
#[tokio::test]
async fn key_overrides_are_listed_capped_and_scoped_to_their_tenant() {
    let app = TestApp::spawn().await;
    app.put_tenant("acme", &json!({})).await;
    set_key(&app, "acme", "b/ä key", 4).await;
    set_key(&app, "acme", "a", 1).await;
    let list = app
        .get_json(Some("acme"), "/api/tenants/acme/concurrency-keys")
        .await;
    assert_eq!(
        list,
        json!({"keys": [
            {"key": "a", "max_concurrent": 1, "override": true, "running": 0, "queued": 0},
            {"key": "b/ä key", "max_concurrent": 4, "override": true, "running": 0, "queued": 0},
        ], "max_concurrent_per_key": null})
    );
    let tenant = app.get_json(None, "/api/tenants/acme").await;
    assert_eq!(tenant["concurrency_keys"]["overrides"], 2);

    // A tenant's admin key: its own tenant's keys, not another's.
    app.put_tenant("other", &json!({})).await;
    let res = app
        .client
        .post(app.url("/api/tenants/acme/api-keys"))
        .bearer_auth(crate::helpers::ADMIN_TOKEN)
        .json(&json!({"role": "admin"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    let token = res.json::<Value>().await.unwrap()["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let own = app
        .client
        .put(app.url("/api/tenants/acme/concurrency-keys/c"))
        .bearer_auth(&token)
        .json(&json!({"max_concurrent": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(own.status(), StatusCode::OK);
    let foreign = app
        .client
        .put(app.url("/api/tenants/other/concurrency-keys/c"))
        .bearer_auth(&token)
        .json(&json!({"max_concurrent": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(foreign.status(), StatusCode::FORBIDDEN);
    // Fill up to the cap directly (10,000 PUTs would only slow the test down).
    let t = sluice::domain::TenantId::parse("acme").unwrap();
    let hash = app.shard("acme").key_limits(&t);
    let mut fill = redis::cmd("HSET");
    fill.arg(&hash);
    for i in 0..9_997 {
        let k = sluice::domain::ConcurrencyKey::parse(&format!("fill-{i}")).unwrap();
        fill.arg(k.digest()).arg(format!("5:fill-{i}"));
    }
    let _: u64 = app.redis.query(&mut fill).await;
    let res = key_call(&app, Method::PUT, "acme", "one-too-many")
        .json(&json!({"max_concurrent": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CONFLICT);
    assert_eq!(problem_code(res).await, "too_many_key_overrides");
    assert_eq!(set_key(&app, "acme", "a", 2).await["max_concurrent"], 2);
    let res = key_call(&app, Method::DELETE, "acme", "fill-0")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        set_key(&app, "acme", "one-too-many", 1).await["override"],
        true
    );

    // Bad input.
    for (key, body) in [
        ("x".repeat(129), json!({"max_concurrent": 1})),
        ("ok".into(), json!({"max_concurrent": -1})),
        ("ok".into(), json!({"max_concurrent": 1, "extra": true})),
        ("ok".into(), json!({})),
    ] {
        let res = key_call(&app, Method::PUT, "acme", &key)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "{key} {body}");
    }
    let res = app
        .client
        .put(app.url("/api/tenants/acme"))
        .bearer_auth(crate::helpers::ADMIN_TOKEN)
        .json(&json!({"max_concurrent_per_key": 0}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert_eq!(problem_code(res).await, "invalid_max_concurrent_per_key");
}

/// Unix milliseconds of an RFC 3339 time of the API.
fn ms_of(t: &Value) -> u64 {
    let t = time::OffsetDateTime::parse(
        t.as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap();
    (t.unix_timestamp_nanos() / 1_000_000) as u64
}

/// A tenant's key limits, overrides and rates move with it when it is pinned to a dedicated
/// shard and back, and keep working there.
#[tokio::test]
async fn key_limits_and_rates_move_with_a_pinned_tenant() {
    let app = TestApp::spawn().await;
    app.put_tenant(
        "acme",
        &json!({"max_concurrent_per_key": 2, "rate_limit": {"starts": 50, "per": "1s", "burst": 5},
                "rate_limit_per_key": {"starts": 600, "per": "1m"}}),
    )
    .await;
    set_key(&app, "acme", "K", 1).await;
    let before = app.get_json(None, "/api/tenants/acme").await;
    let keys_before = app
        .get_json(Some("acme"), "/api/tenants/acme/concurrency-keys")
        .await;
    for (method, status) in [
        (Method::POST, StatusCode::OK),
        (Method::DELETE, StatusCode::NO_CONTENT),
        (Method::POST, StatusCode::OK),
    ] {
        let res = app
            .client
            .request(method, app.url("/api/tenants/acme/dedicated-shard"))
            .bearer_auth(crate::helpers::ADMIN_TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), status);
        assert_eq!(app.get_json(None, "/api/tenants/acme").await, before);
        assert_eq!(
            app.get_json(Some("acme"), "/api/tenants/acme/concurrency-keys")
                .await,
            keys_before
        );
    }
    // On the dedicated shard the override holds: one of K at a time, by a real worker.
    let mut ids = Vec::new();
    for i in 0..4 {
        ids.push(
            app.admit_with(
                "acme",
                json!({"flow_id": "demo.sleep", "params": {"ms": 100, "i": i}, "concurrency_key": "K"}),
            )
            .await,
        );
    }
    let mut args = vec!["--concurrency", "4"];
    args.extend_from_slice(FAST_WORKER);
    let _w = TestWorker::spawn(&app.redis, &args);
    let mut spans = Vec::new();
    for id in &ids {
        let e = app.wait_terminal("acme", id, Duration::from_secs(30)).await;
        assert_eq!(e["status"], "completed");
        spans.push((ms_of(&e["started_at"]), ms_of(&e["finished_at"])));
    }
    for &(s, _) in &spans {
        let at_once = spans.iter().filter(|&&(s2, f2)| s2 <= s && s < f2).count();
        assert_eq!(at_once, 1, "{spans:?}");
    }
}

/// A key whose running set names an execution that is not running (a row edited or lost by
/// hand) would be held forever: the sweeper's slot walk removes the stale member and the key's
/// next execution becomes startable.
#[tokio::test]
async fn the_sweeper_frees_a_key_held_by_a_stale_member() {
    let app = TestApp::spawn().await;
    app.put_tenant("acme", &json!({"max_concurrent_per_key": 1}))
        .await;
    let k = admit_keyed(&app, "acme", Some("K"), 0).await;
    let t = sluice::domain::TenantId::parse("acme").unwrap();
    let digest = sluice::domain::ConcurrencyKey::parse("K").unwrap().digest();
    let running = app.shard("acme").key_running(&t, &digest);
    // A ghost takes the key's one place, and the key's first leaves the tenant's order.
    let ghost = ExecutionId::new();
    let _: u64 = app
        .redis
        .query(redis::cmd("SADD").arg(&running).arg(ghost.as_str()))
        .await;
    let _: u64 = app
        .redis
        .query(
            redis::cmd("ZREM")
                .arg(app.shard("acme").waiting(&t))
                .arg(&k),
        )
        .await;
    let _: u64 = app
        .redis
        .query(
            redis::cmd("SADD")
                .arg(app.shard("acme").key_blocked(&t))
                .arg(&digest),
        )
        .await;
    assert!(start(&app, "acme", 8).await.is_empty(), "held by the ghost");
    let store = std::sync::Arc::new(app.store().await);
    let repaired = sluice::sweeper::sweep_once(store, "test", Duration::from_millis(200))
        .await
        .expect("took the sweeper turn");
    assert!(
        repaired.get("slots").copied().unwrap_or(0) >= 1,
        "{repaired:?}"
    );
    assert_eq!(ids(&start(&app, "acme", 8).await), [k]);
}
