//! Tenant quota: at most `max_concurrent` running (the slot is taken when an execution starts),
//! FIFO order beyond that (`queue_state` `ready` for the executions that would start now,
//! `waiting` for those behind the limit), `max_queued` queued at most (scheduled, waiting and
//! ready alike), and slots released exactly once.
//!
//! Where a test needs executions to start, it calls the store as a worker does (`start`,
//! `complete`): the same scripts as `sluice worker`, with exact counts and no timing.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice::domain::ExecutionId;
use sluice::store::{Completion, Outcome, Store};

use crate::helpers::{TestApp, problem_code};

async fn state_of(app: &TestApp, id: &str) -> Value {
    let e = app.execution("acme", id).await;
    e["queue_state"].clone()
}

async fn states_of(app: &TestApp, ids: &[String]) -> Vec<Value> {
    let mut states = Vec::new();
    for id in ids {
        states.push(state_of(app, id).await);
    }
    states
}

fn id_of(e: &Value) -> String {
    e["execution_id"].as_str().unwrap().to_owned()
}

const TTL: Duration = Duration::from_secs(60);

/// Starts as many of acme's shard's executions as the limits allow (asking for up to 10), as a
/// worker with 10 free slots would; the ids started, in start order.
async fn start_all(app: &TestApp, store: &Store, worker: &str) -> Vec<String> {
    let batch = store
        .start(app.shard("acme"), worker, 10, TTL, 0)
        .await
        .unwrap();
    batch
        .started
        .iter()
        .map(|s| s.id.as_str().to_owned())
        .collect()
}

/// The fence of acme's running execution `id` (as its worker was told).
async fn fence_of(app: &TestApp, id: &str) -> u64 {
    let row = app.shard("acme").row(&ExecutionId::parse(id).unwrap());
    app.redis
        .query(redis::cmd("HGET").arg(row).arg(sluice::domain::row::FENCE))
        .await
}

#[tokio::test]
async fn over_the_limit_executions_wait_and_the_oldest_moves_up_when_one_leaves() {
    let app = TestApp::spawn().await;
    let store = app.store().await;
    app.put_tenant("acme", &json!({"max_concurrent": 2})).await;
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(id_of(&app.admit("acme", "demo.echo").await));
    }
    assert_eq!(
        states_of(&app, &ids).await,
        ["ready", "ready", "waiting", "waiting", "waiting"]
    );
    // No slot is taken before an execution starts: all five are queued, in admission order.
    assert_eq!(
        app.usage("acme").await,
        json!({"running": 0, "waiting": 5, "scheduled": 0})
    );
    assert_eq!(app.queue_ids("acme").await, ids);

    // Cancelling a ready one moves exactly the oldest waiting one up.
    let res = app.cancel("acme", &ids[0]).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.json::<Value>().await.unwrap()["status"], "cancelled");
    assert_eq!(
        states_of(&app, &ids[1..]).await,
        ["ready", "ready", "waiting", "waiting"]
    );
    assert_eq!(
        app.usage("acme").await,
        json!({"running": 0, "waiting": 4, "scheduled": 0})
    );
    // The cancelled one left the queue; the others keep their order.
    assert_eq!(app.queue_ids("acme").await, ids[1..]);

    // Cancelling again (both verbs) changes nothing.
    for res in [
        app.cancel("acme", &ids[0]).await,
        app.delete("acme", &ids[0], false).await,
    ] {
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.json::<Value>().await.unwrap()["status"], "cancelled");
    }
    assert_eq!(
        app.usage("acme").await,
        json!({"running": 0, "waiting": 4, "scheduled": 0})
    );
    assert_eq!(state_of(&app, &ids[3]).await, "waiting");

    // Cancelling the last waiting one moves nobody up.
    app.cancel("acme", &ids[4]).await;
    assert_eq!(
        app.usage("acme").await,
        json!({"running": 0, "waiting": 3, "scheduled": 0})
    );
    assert_eq!(state_of(&app, &ids[3]).await, "waiting");

    // Force-deleting a ready one moves the next waiting one up, once.
    assert_eq!(
        app.delete("acme", &ids[1], true).await.status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(state_of(&app, &ids[3]).await, "ready");
    assert_eq!(
        app.usage("acme").await,
        json!({"running": 0, "waiting": 2, "scheduled": 0})
    );
    assert_eq!(
        app.queue_ids("acme").await,
        [ids[2].clone(), ids[3].clone()]
    );

    // A worker with room for ten starts exactly max_concurrent of them, oldest first; a newer
    // admission waits behind the running two.
    let newer = id_of(&app.admit("acme", "demo.echo").await);
    assert_eq!(start_all(&app, &store, "w1").await, ids[2..4]);
    assert_eq!(
        app.usage("acme").await,
        json!({"running": 2, "waiting": 1, "scheduled": 0})
    );
    assert_eq!(state_of(&app, &newer).await, "waiting");
    assert!(start_all(&app, &store, "w2").await.is_empty());

    // One of them ends: its slot goes to the newer one, once (a repeated report frees nothing).
    let (shard, done) = (app.shard("acme"), ExecutionId::parse(&ids[2]).unwrap());
    let fence = fence_of(&app, &ids[2]).await;
    let outcome = Outcome::Completed(json!({}));
    assert_eq!(
        store
            .complete(shard, &done, fence, "w1", &outcome)
            .await
            .unwrap(),
        Completion::Done(sluice::domain::Status::Completed)
    );
    assert_eq!(
        store
            .complete(shard, &done, fence, "w1", &outcome)
            .await
            .unwrap(),
        Completion::Repeat
    );
    assert_eq!(state_of(&app, &newer).await, "ready");
    assert_eq!(start_all(&app, &store, "w2").await, [newer]);
    assert!(start_all(&app, &store, "w2").await.is_empty());
    assert_eq!(
        app.usage("acme").await,
        json!({"running": 2, "waiting": 0, "scheduled": 0})
    );
}

#[tokio::test]
async fn a_full_backlog_answers_429_and_writes_nothing() {
    let app = TestApp::spawn().await;
    app.put_tenant("acme", &json!({"max_concurrent": 1, "max_queued": 2}))
        .await;
    // max_queued counts every queued execution: the one that would start now and one
    // scheduled for later fill it.
    app.admit("acme", "demo.echo").await;
    let res = app
        .post_execution("acme", &json!({"flow_id": "demo.echo", "delay": "1h"}))
        .await;
    assert_eq!(res.status(), StatusCode::CREATED);
    assert_eq!(
        res.json::<Value>().await.unwrap()["queue_state"],
        "scheduled"
    );
    let keys_before = app.redis.keys().await;
    let res = app
        .post_with_key("acme", "fresh-key", &json!({"flow_id": "demo.echo"}))
        .await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry_after: u64 = res.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry_after >= 1);
    assert_eq!(problem_code(res).await, "tenant_queue_full");
    assert_eq!(
        app.redis.keys().await,
        keys_before,
        "a refused admission leaves nothing"
    );
    assert_eq!(
        app.usage("acme").await,
        json!({"running": 0, "waiting": 1, "scheduled": 1})
    );
    // Another tenant is unaffected.
    app.admit("other", "demo.echo").await;
}

#[tokio::test]
async fn a_running_execution_does_not_count_toward_max_queued() {
    let app = TestApp::spawn().await;
    let store = app.store().await;
    app.put_tenant("acme", &json!({"max_concurrent": 2, "max_queued": 1}))
        .await;
    let first = id_of(&app.admit("acme", "demo.echo").await);
    let res = app
        .post_execution("acme", &json!({"flow_id": "demo.echo"}))
        .await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(start_all(&app, &store, "w").await, [first]);
    // Started, it is no longer queued: there is room for one more in the queue, not two.
    app.admit("acme", "demo.echo").await;
    let res = app
        .post_execution("acme", &json!({"flow_id": "demo.echo"}))
        .await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        app.usage("acme").await,
        json!({"running": 1, "waiting": 1, "scheduled": 0})
    );
}

#[tokio::test]
async fn force_deleting_a_waiting_execution_frees_no_slot() {
    let app = TestApp::spawn().await;
    let store = app.store().await;
    app.put_tenant("acme", &json!({"max_concurrent": 1})).await;
    let running = id_of(&app.admit("acme", "demo.echo").await);
    let waiting_a = id_of(&app.admit("acme", "demo.echo").await);
    let waiting_b = id_of(&app.admit("acme", "demo.echo").await);
    assert_eq!(
        start_all(&app, &store, "w").await,
        std::slice::from_ref(&running)
    );
    assert_eq!(
        app.delete("acme", &waiting_a, true).await.status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        app.usage("acme").await,
        json!({"running": 1, "waiting": 1, "scheduled": 0})
    );
    assert_eq!(app.execution("acme", &running).await["status"], "running");
    assert_eq!(state_of(&app, &waiting_b).await, "waiting");
    assert_eq!(app.queue_ids("acme").await, [waiting_b]);
    // The running one still holds the only slot: nothing starts.
    assert!(start_all(&app, &store, "w2").await.is_empty());
}

#[tokio::test]
async fn raising_max_concurrent_lets_waiting_executions_start_at_once() {
    let app = TestApp::spawn().await;
    let store = app.store().await;
    app.put_tenant("acme", &json!({"max_concurrent": 1})).await;
    let ids: Vec<String> = {
        let mut v = Vec::new();
        for _ in 0..4 {
            v.push(id_of(&app.admit("acme", "demo.echo").await));
        }
        v
    };
    // One runs, and the tenant has no slot left: nothing else can start.
    assert_eq!(start_all(&app, &store, "w1").await, [ids[0].clone()]);
    assert!(app.runnable_tenants("acme").await.is_empty());
    let tenant = app.put_tenant("acme", &json!({"max_concurrent": 3})).await;
    assert_eq!(tenant["max_concurrent"], 3);
    assert_eq!(
        tenant["usage"],
        json!({"running": 1, "waiting": 3, "scheduled": 0})
    );
    assert_eq!(
        states_of(&app, &ids[1..]).await,
        ["ready", "ready", "waiting"]
    );
    // A worker with room starts the two that fit now, oldest first, and no more.
    assert_eq!(start_all(&app, &store, "w2").await, ids[1..3]);
    assert_eq!(
        app.usage("acme").await,
        json!({"running": 3, "waiting": 1, "scheduled": 0})
    );
    assert_eq!(state_of(&app, &ids[3]).await, "waiting");
    // Absent fields keep their values; null returns one to the server default.
    let tenant = app.put_tenant("acme", &json!({"max_queued": 7})).await;
    assert_eq!(tenant["max_concurrent"], 3);
    assert_eq!(tenant["max_queued"], 7);
    assert_eq!(tenant["usage"]["waiting"], 1);
    let tenant = app
        .put_tenant("acme", &json!({"max_concurrent": null}))
        .await;
    assert_eq!(tenant["max_concurrent"], 100);
    assert_eq!(tenant["max_queued"], 7);
    assert_eq!(tenant["enabled"], true);
    assert_eq!(
        tenant["usage"],
        json!({"running": 3, "waiting": 1, "scheduled": 0})
    );
    assert_eq!(state_of(&app, &ids[3]).await, "ready");
    assert_eq!(start_all(&app, &store, "w2").await, [ids[3].clone()]);
}

#[tokio::test]
async fn concurrent_cancels_release_a_slot_exactly_once() {
    let app = std::sync::Arc::new(TestApp::spawn().await);
    let store = std::sync::Arc::new(app.store().await);
    app.put_tenant("acme", &json!({"max_concurrent": 1})).await;
    let first = id_of(&app.admit("acme", "demo.echo").await);
    let mut waiting = Vec::new();
    for _ in 0..3 {
        waiting.push(id_of(&app.admit("acme", "demo.echo").await));
    }
    assert_eq!(
        start_all(&app, &store, "w").await,
        std::slice::from_ref(&first)
    );

    // 20 cancels of the running one at once (both verbs): each asks, none frees its slot (its
    // handler still runs).
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(20));
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let (app, barrier, id) = (app.clone(), barrier.clone(), first.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                let res = if i % 2 == 0 {
                    app.cancel("acme", &id).await
                } else {
                    app.delete("acme", &id, false).await
                };
                (res.status(), res.json::<Value>().await.unwrap())
            })
        })
        .collect();
    for t in tasks {
        let (status, body) = t.await.unwrap();
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body["status"], "running", "{body}");
        assert_eq!(body["cancel_requested"], true, "{body}");
    }
    assert_eq!(
        app.usage("acme").await,
        json!({"running": 1, "waiting": 3, "scheduled": 0})
    );
    assert_eq!(state_of(&app, &waiting[0]).await, "waiting");

    // The worker's report, sent 20 times at once (as after lost replies): one release.
    let fence = fence_of(&app, &first).await;
    let id = ExecutionId::parse(&first).unwrap();
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(20));
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let (app, store, barrier, id) =
                (app.clone(), store.clone(), barrier.clone(), id.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                store
                    .complete(app.shard("acme"), &id, fence, "w", &Outcome::Cancelled)
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut done = 0;
    for t in tasks {
        match t.await.unwrap() {
            Completion::Done(sluice::domain::Status::Cancelled) => done += 1,
            Completion::Repeat => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(done, 1);
    assert_eq!(app.execution("acme", &first).await["status"], "cancelled");
    // One release: exactly one waiting execution moved up, and exactly one starts.
    assert_eq!(
        app.usage("acme").await,
        json!({"running": 0, "waiting": 3, "scheduled": 0})
    );
    assert_eq!(
        states_of(&app, &waiting).await,
        ["ready", "waiting", "waiting"]
    );
    assert_eq!(start_all(&app, &store, "w").await, [waiting[0].clone()]);
    assert!(start_all(&app, &store, "w").await.is_empty());
}
