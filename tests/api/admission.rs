//! Admission through the API: dedup, conflicts, force delete, tenant isolation, and the race
//! the design document opens with (`docs/DESIGN.md`, "Non-atomic dedup at admission").

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::sync::Barrier;

use sluice::store::keys::{self, KeyKind};

use crate::helpers::{TestApp, problem_code};

#[derive(Clone, Copy)]
enum KeyIn {
    Header,
    Body,
}

/// 50 dedup keys × 20 identical POSTs each, all released at once by a barrier.
async fn race(key_in: KeyIn) {
    const KEYS: usize = 50;
    const COPIES: usize = 20;
    // 1,000 connections from one address, opened at once: beyond the anonymous-connection cap
    // (64) the server closes any that has not sent its request within 2 s, which a loaded
    // machine can miss. That defence is tested in connections.rs; here it is off.
    let app =
        Arc::new(TestApp::spawn_with(|c| c.api.max_anonymous_connections_per_address = 0).await);
    // Room for 20 running: 20 are ready to start, the other 30 wait behind them, so both
    // queue states are exercised.
    app.put_tenant("racer", &json!({"max_concurrent": 20}))
        .await;
    let barrier = Arc::new(Barrier::new(KEYS * COPIES));
    let mut tasks = Vec::new();
    for k in 0..KEYS {
        for _ in 0..COPIES {
            let (app, barrier) = (app.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                let key = format!("order-{k}");
                let mut body = json!({"flow_id": "demo.echo", "params": {"order": k}});
                barrier.wait().await;
                let res = match key_in {
                    KeyIn::Header => app.post_with_key("racer", &key, &body).await,
                    KeyIn::Body => {
                        body["dedup_key"] = json!(key);
                        app.post_execution("racer", &body).await
                    }
                };
                let status = res.status();
                let replayed = res.headers().get("idempotent-replayed").is_some();
                let body: Value = res.json().await.unwrap();
                (k, status, replayed, body)
            }));
        }
    }
    let mut ids_by_key: HashMap<usize, HashSet<String>> = HashMap::new();
    let mut created_by_key: HashMap<usize, usize> = HashMap::new();
    for t in tasks {
        let (k, status, replayed, body) = t.await.unwrap();
        match status {
            StatusCode::CREATED => {
                assert!(!replayed);
                assert_eq!(body["deduplicated"], false);
                *created_by_key.entry(k).or_default() += 1;
            }
            StatusCode::OK => {
                assert!(replayed, "a 200 replay carries Idempotent-Replayed");
                assert_eq!(body["deduplicated"], true);
            }
            other => panic!("unexpected {other}: {body}"),
        }
        ids_by_key
            .entry(k)
            .or_default()
            .insert(body["execution_id"].as_str().unwrap().to_owned());
    }
    assert_eq!(ids_by_key.len(), KEYS);
    for k in 0..KEYS {
        assert_eq!(ids_by_key[&k].len(), 1, "key {k} mapped to several ids");
        assert_eq!(created_by_key.get(&k), Some(&1), "key {k}: exactly one 201");
    }
    let all_ids: HashSet<_> = ids_by_key.values().flatten().cloned().collect();
    assert_eq!(all_ids.len(), KEYS);

    // Through the API: 50 executions, all queued (none started: no slot taken), 20 of them
    // ready to start and 30 waiting behind them.
    let page = app.page("racer", "limit=200").await;
    assert_eq!(page["total"], KEYS);
    let listed: HashSet<_> = page["executions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["execution_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(listed, all_ids);
    let mut states: HashMap<String, usize> = HashMap::new();
    for e in page["executions"].as_array().unwrap() {
        *states
            .entry(e["queue_state"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    assert_eq!(
        states,
        HashMap::from([("ready".to_owned(), 20), ("waiting".to_owned(), 30)])
    );
    let usage = app.usage("racer").await;
    assert_eq!(usage, json!({"running": 0, "waiting": 50, "scheduled": 0}));

    // On Redis: 50 rows, one queue entry each, no slot taken.
    assert_eq!(app.row_count().await, KEYS);
    let queue = app.queue_ids("racer").await;
    assert_eq!(queue.len(), KEYS);
    assert_eq!(queue.into_iter().collect::<HashSet<_>>(), all_ids);
    let tenant = sluice::domain::TenantId::parse("racer").unwrap();
    let slots: u64 = app
        .redis
        .query(redis::cmd("SCARD").arg(app.shard("racer").slots(&tenant)))
        .await;
    assert_eq!(slots, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_identical_posts_admit_once_per_key_in_header() {
    race(KeyIn::Header).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_identical_posts_admit_once_per_key_in_body() {
    race(KeyIn::Body).await;
}

#[tokio::test]
async fn new_admission_answers_201_with_location_and_a_full_row() {
    let app = TestApp::spawn().await;
    let res = app
        .post_execution("acme", &json!({"flow_id": "demo.echo", "version": "v2", "params": {"a": 1}, "max_attempts": 3}))
        .await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let location = res.headers()["location"].to_str().unwrap().to_owned();
    let body: Value = res.json().await.unwrap();
    let id = body["execution_id"].as_str().unwrap();
    assert_eq!(location, format!("/api/executions/{id}"));
    assert_eq!(id.len(), 32);
    assert_eq!(body["tenant_id"], "acme");
    assert_eq!(body["flow_id"], "demo.echo");
    assert_eq!(body["version"], "v2");
    assert_eq!(body["params"], json!({"a": 1}));
    assert_eq!(body["status"], "queued");
    assert_eq!(body["queue_state"], "ready");
    assert_eq!(body["priority"], 3);
    assert_eq!(body["run_at"], Value::Null);
    assert_eq!(body["attempt"], 0);
    assert_eq!(body["max_attempts"], 3);
    assert_eq!(body["dedup_key"], Value::Null);

    // The Location resolves to the same execution.
    let got = app.get_json(Some("acme"), &location).await;
    assert_eq!(got, body);
    // Non-terminal rows never expire.
    assert_eq!(app.row_ttl("acme", id).await, -1);
}

/// The answers of `POST /api/executions` are written by hand into a sized buffer
/// (`execution_json`): they must stay what `axum::Json` gave, header for header and byte for
/// byte. GET still answers through `axum::Json`, so a fresh execution's GET body is the
/// reference for the 201's bytes; the 200 of a replay is checked for the same headers.
/// The admission's answers byte for byte (the 201 is written by hand since round ten,
/// `src/http/executions/answer.rs`): every member in its place, escaped as serde_json
/// escapes, only the id and the times taken from the answer itself; and the refusals' problem
/// bodies beside them.
#[tokio::test]
async fn admission_answers_are_pinned_byte_for_byte() {
    let app = TestApp::spawn().await;
    let body = json!({
        "flow_id": "demo.echo",
        "version": "v\"2\"",
        "params": {"text": "é \"quoted\" \\ \u{1}", "b": [1, 2.5], "a": null},
        "priority": 2,
        "concurrency_key": "customer-7",
        "max_attempts": 4,
    });
    let res = app
        .as_tenant(reqwest::Method::POST, "/api/executions", "acme")
        .header("Idempotency-Key", "pin-\\1")
        .header(
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        )
        .header("tracestate", "congo=t61rcWkgMzE")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    let created = res.text().await.unwrap();
    let first: Value = serde_json::from_str(&created).unwrap();
    let (id, at) = (
        first["execution_id"].as_str().unwrap(),
        first["created_at"].as_str().unwrap(),
    );
    let answer = |deduplicated: bool| {
        format!(
            r#"{{"execution_id":"{id}","tenant_id":"acme","flow_id":"demo.echo","version":"v\"2\"","params":{{"a":null,"b":[1,2.5],"text":"é \"quoted\" \\ \u0001"}},"status":"queued","queue_state":"ready","queue_position":{{"tenant":0,"key":0}},"estimated_start":null,"priority":2,"run_at":null,"dedup_key":"pin-\\1","concurrency_key":"customer-7","traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01","tracestate":"congo=t61rcWkgMzE","deduplicated":{deduplicated},"attempt":0,"max_attempts":4,"cancel_requested":false,"created_at":"{at}","started_at":null,"finished_at":null,"updated_at":"{at}","output":null,"error":null}}"#
        )
    };
    assert_eq!(created, answer(false));

    let replayed = app.post_with_key("acme", "pin-\\1", &body).await;
    assert_eq!(replayed.status(), StatusCode::OK);
    assert_eq!(replayed.text().await.unwrap(), answer(true));

    let conflict = app
        .post_with_key("acme", "pin-\\1", &json!({"flow_id": "demo.echo"}))
        .await;
    assert_eq!(conflict.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        conflict.headers()["content-type"],
        "application/problem+json"
    );
    assert_eq!(
        conflict.text().await.unwrap(),
        format!(
            r#"{{"type":"urn:sluice:problem:idempotency_key_conflict","title":"Unprocessable Entity","status":422,"detail":"the dedup key is already used by execution {id} with a different flow, version or params","code":"idempotency_key_conflict","execution_id":"{id}"}}"#
        )
    );
    let invalid = app
        .post_execution("acme", &json!({"flow_id": "demo.echo", "priority": 9}))
        .await;
    assert_eq!(invalid.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        invalid.headers()["content-type"],
        "application/problem+json"
    );
    assert_eq!(
        invalid.text().await.unwrap(),
        r#"{"type":"urn:sluice:problem:invalid_priority","title":"Bad Request","status":400,"detail":"priority must be an integer from 1 (first) to 5 (last)","code":"invalid_priority"}"#
    );
}

#[tokio::test]
async fn admission_answers_carry_the_headers_and_bytes_of_their_json() {
    let app = TestApp::spawn().await;
    let body = json!({"flow_id": "demo.echo", "params": {"text": "é \"quoted\" \u{1}"}});
    let names = |res: &reqwest::Response| {
        let mut n: Vec<String> = res.headers().keys().map(|k| k.to_string()).collect();
        n.sort();
        n
    };
    let created = app.post_with_key("acme", "bytes-1", &body).await;
    assert_eq!(created.status(), StatusCode::CREATED);
    assert_eq!(
        names(&created),
        [
            "content-length",
            "content-type",
            "date",
            "location",
            "x-request-id"
        ]
    );
    assert_eq!(created.headers()["content-type"], "application/json");
    let location = created.headers()["location"].to_str().unwrap().to_owned();
    let length: usize = created.headers()["content-length"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let bytes = created.bytes().await.unwrap();
    assert_eq!(bytes.len(), length);
    let got = app
        .as_tenant(reqwest::Method::GET, &location, "acme")
        .send()
        .await
        .unwrap();
    assert_eq!(got.headers()["content-type"], "application/json");
    let got = got.bytes().await.unwrap();
    assert_eq!(
        String::from_utf8_lossy(&bytes),
        String::from_utf8_lossy(&got),
        "the 201's body is not the bytes axum::Json gives the same execution"
    );

    let replayed = app.post_with_key("acme", "bytes-1", &body).await;
    assert_eq!(replayed.status(), StatusCode::OK);
    assert_eq!(
        names(&replayed),
        [
            "content-length",
            "content-type",
            "date",
            "idempotent-replayed",
            "x-request-id"
        ]
    );
    assert_eq!(replayed.headers()["content-type"], "application/json");
    assert_eq!(replayed.headers()["idempotent-replayed"], "true");
    let again: Value = replayed.json().await.unwrap();
    let first: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(again["execution_id"], first["execution_id"]);
    assert_eq!(again["deduplicated"], true);
}

#[tokio::test]
async fn same_key_with_a_different_request_is_a_conflict_and_writes_nothing() {
    let app = TestApp::spawn().await;
    let first = app
        .post_with_key(
            "acme",
            "k1",
            &json!({"flow_id": "demo.echo", "params": {"n": 1}}),
        )
        .await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let first: Value = first.json().await.unwrap();
    let keys_before = app.redis.keys().await;
    for body in [
        json!({"flow_id": "demo.echo", "params": {"n": 2}}),
        json!({"flow_id": "demo.sleep", "params": {"n": 1}}),
        json!({"flow_id": "demo.echo", "version": "2", "params": {"n": 1}}),
    ] {
        let res = app.post_with_key("acme", "k1", &body).await;
        assert_eq!(res.status(), StatusCode::UNPROCESSABLE_ENTITY);
        let problem: Value = res.json().await.unwrap();
        assert_eq!(problem["code"], "idempotency_key_conflict");
        assert_eq!(problem["execution_id"], first["execution_id"]);
    }
    assert_eq!(app.redis.keys().await, keys_before);
    // Same params in another key order is the same request: a replay, not a conflict.
    let res = app
        .post_with_key(
            "acme",
            "k1",
            &json!({"params": {"n": 1}, "flow_id": "demo.echo"}),
        )
        .await;
    assert_eq!(res.status(), StatusCode::OK);
}

#[tokio::test]
async fn force_delete_frees_the_key_for_a_new_execution() {
    let app = TestApp::spawn().await;
    app.put_tenant("acme", &json!({})).await;
    let body = json!({"flow_id": "demo.echo"});
    let first: Value = app
        .post_with_key("acme", "k", &body)
        .await
        .json()
        .await
        .unwrap();
    let id = first["execution_id"].as_str().unwrap();

    let res = app.delete("acme", id, true).await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        app.get_execution("acme", id).await.status(),
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        app.delete("acme", id, true).await.status(),
        StatusCode::NOT_FOUND
    );
    // Nothing of it is left: no row, no index entry, no queue entry, the tenant no longer
    // runnable, no dedup key.
    assert_eq!(app.row_count().await, 0);
    assert!(app.queue_ids("acme").await.is_empty());
    assert!(app.runnable_tenants("acme").await.is_empty());
    let usage = app.usage("acme").await;
    assert_eq!(usage, json!({"running": 0, "waiting": 0, "scheduled": 0}));

    let res = app.post_with_key("acme", "k", &body).await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let second: Value = res.json().await.unwrap();
    assert_ne!(second["execution_id"], first["execution_id"]);
}

#[tokio::test]
async fn the_same_key_in_two_tenants_is_two_executions() {
    let app = TestApp::spawn().await;
    let body = json!({"flow_id": "demo.echo"});
    let a = app.post_with_key("tenant-a", "shared", &body).await;
    let b = app.post_with_key("tenant-b", "shared", &body).await;
    assert_eq!(a.status(), StatusCode::CREATED);
    assert_eq!(b.status(), StatusCode::CREATED);
    let a: Value = a.json().await.unwrap();
    let b: Value = b.json().await.unwrap();
    assert_ne!(a["execution_id"], b["execution_id"]);
    assert_eq!(b["tenant_id"], "tenant-b");
}

#[tokio::test]
async fn another_tenants_execution_is_not_found_for_every_call() {
    let app = TestApp::spawn().await;
    let mine = app.admit("tenant-a", "demo.echo").await;
    let id = mine["execution_id"].as_str().unwrap();
    let keys_before = app.redis.keys().await;

    for res in [
        app.get_execution("tenant-b", id).await,
        app.cancel("tenant-b", id).await,
        app.delete("tenant-b", id, false).await,
        app.delete("tenant-b", id, true).await,
    ] {
        assert_eq!(res.status(), StatusCode::NOT_FOUND);
        assert_eq!(problem_code(res).await, "execution_not_found");
    }
    let page = app.page("tenant-b", "").await;
    assert_eq!(page["total"], 0);
    assert_eq!(app.redis.keys().await, keys_before);
    // Still intact for its owner.
    let got = app.execution("tenant-a", id).await;
    assert_eq!(got["status"], "queued");
}

#[tokio::test]
async fn cancelled_rows_get_the_retention_ttl_and_dedup_keys_expire_in_seven_days() {
    let app = TestApp::spawn().await;
    let e: Value = app
        .post_with_key("acme", "k", &json!({"flow_id": "demo.echo"}))
        .await
        .json()
        .await
        .unwrap();
    let id = e["execution_id"].as_str().unwrap();
    let cancelled: Value = app.cancel("acme", id).await.json().await.unwrap();
    assert_eq!(cancelled["status"], "cancelled");
    assert_eq!(cancelled["queue_state"], Value::Null);
    assert!(cancelled["finished_at"].is_string());
    let ttl = app.row_ttl("acme", id).await;
    let thirty_days = 30 * 86_400;
    assert!(ttl > thirty_days - 60 && ttl <= thirty_days, "ttl {ttl}");

    let dedup_keys: Vec<String> = app
        .redis
        .keys()
        .await
        .into_iter()
        .filter(|k| k.contains(":dd:"))
        .collect();
    assert_eq!(dedup_keys.len(), 1);
    let ttl: i64 = app.redis.query(redis::cmd("TTL").arg(&dedup_keys[0])).await;
    let week = 7 * 86_400;
    assert!(ttl > week - 60 && ttl <= week, "dedup ttl {ttl}");
    // A replay of a cancelled execution still answers with it.
    let res = app
        .post_with_key("acme", "k", &json!({"flow_id": "demo.echo"}))
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    let replay: Value = res.json().await.unwrap();
    assert_eq!(replay["status"], "cancelled");
}

#[tokio::test]
async fn a_disabled_tenant_is_refused_with_403_and_nothing_written() {
    let app = TestApp::spawn().await;
    app.put_tenant("acme", &json!({"enabled": false})).await;
    let keys_before = app.redis.keys().await;
    let res = app
        .post_execution("acme", &json!({"flow_id": "demo.echo"}))
        .await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    assert_eq!(problem_code(res).await, "tenant_disabled");
    assert_eq!(app.redis.keys().await, keys_before);
    app.put_tenant("acme", &json!({"enabled": true})).await;
    app.admit("acme", "demo.echo").await;
}

#[tokio::test]
async fn keys_of_a_tenant_share_one_hash_tag() {
    let app = TestApp::spawn().await;
    app.post_with_key("acme", "k", &json!({"flow_id": "demo.echo"}))
        .await;
    app.put_tenant("acme", &json!({"max_concurrent": 1})).await;
    app.admit("acme", "demo.echo").await; // waits
    let tag = app.shard("acme").prefix();
    let keys: Vec<String> = app
        .redis
        .keys()
        .await
        .into_iter()
        .filter(|k| {
            keys::parse(k).is_some_and(|n| n.tenant == Some("acme") || n.kind == KeyKind::Row)
        })
        .collect();
    assert!(keys.len() >= 6, "{keys:?}");
    for k in keys {
        assert!(k.starts_with(&tag), "{k} outside {tag}");
    }
}

/// A new execution's time is written once as text (`admit.lua` formats it itself, for the
/// row's `c` and, at the default priority, its order key in the tenant's queue): the time the
/// admission answered is the one its row gives back, and its place in the queue is that time
/// (the default priority) or a step of a minute per priority level before it.
#[tokio::test]
async fn a_new_executions_time_is_its_answer_its_row_and_its_order_key() {
    let app = TestApp::spawn().await;
    let t = sluice::domain::TenantId::parse("acme").unwrap();
    let s = app.shard("acme");
    for (priority, ahead) in [(None, 0), (Some(1), 2 * 60_000), (Some(5), -2 * 60_000)] {
        let mut body = json!({"flow_id": "demo.echo"});
        if let Some(p) = priority {
            body["priority"] = json!(p);
        }
        let res = app.post_execution("acme", &body).await;
        assert_eq!(res.status(), StatusCode::CREATED);
        let admitted: Value = res.json().await.unwrap();
        let id = admitted["execution_id"].as_str().unwrap();
        let read: Value = app.get_execution("acme", id).await.json().await.unwrap();
        assert_eq!(read["created_at"], admitted["created_at"], "{priority:?}");
        let c: i64 = app
            .redis
            .query(
                redis::cmd("HGET")
                    .arg(s.row(&sluice::domain::ExecutionId::parse(id).unwrap()))
                    .arg("c"),
            )
            .await;
        let score: i64 = app
            .redis
            .query(
                redis::cmd("ZSCORE")
                    .arg(s.waiting(&t))
                    .arg(s.stored_id(&sluice::domain::ExecutionId::parse(id).unwrap())),
            )
            .await;
        assert_eq!(score, c - ahead, "{priority:?}");
    }
}
