//! Tenant quota: at most `max_concurrent` dispatched or running, FIFO waiting beyond that,
//! `max_queued` waiting at most, and slots released exactly once.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{TestApp, problem_code};

async fn state_of(app: &TestApp, id: &str) -> Value {
    let e = app.execution("acme", id).await;
    e["queue_state"].clone()
}

fn id_of(e: &Value) -> String {
    e["execution_id"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn over_the_limit_executions_wait_and_the_oldest_is_dispatched_on_release() {
    let app = TestApp::spawn().await;
    app.put_tenant("acme", &json!({"max_concurrent": 2})).await;
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(id_of(&app.admit("acme", "demo.echo").await));
    }
    for (i, id) in ids.iter().enumerate() {
        let expected = if i < 2 { "dispatched" } else { "waiting" };
        assert_eq!(state_of(&app, id).await, expected, "execution {i}");
    }
    assert_eq!(
        app.usage("acme").await,
        json!({"running": 0, "dispatched": 2, "waiting": 3})
    );
    assert_eq!(app.ready_len("acme").await, 2);

    // Cancelling a dispatched one dispatches exactly the oldest waiting one.
    let res = app.cancel("acme", &ids[0]).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.json::<Value>().await.unwrap()["status"], "cancelled");
    assert_eq!(state_of(&app, &ids[2]).await, "dispatched");
    assert_eq!(state_of(&app, &ids[3]).await, "waiting");
    assert_eq!(state_of(&app, &ids[4]).await, "waiting");
    assert_eq!(
        app.usage("acme").await,
        json!({"running": 0, "dispatched": 2, "waiting": 2})
    );
    // The cancelled one's stream entry is gone; the promoted one's is there.
    assert_eq!(app.ready_len("acme").await, 2);

    // Cancelling again (both verbs) changes nothing: the slot was released once.
    for res in [
        app.cancel("acme", &ids[0]).await,
        app.delete("acme", &ids[0], false).await,
    ] {
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.json::<Value>().await.unwrap()["status"], "cancelled");
    }
    assert_eq!(
        app.usage("acme").await,
        json!({"running": 0, "dispatched": 2, "waiting": 2})
    );
    assert_eq!(state_of(&app, &ids[3]).await, "waiting");

    // Cancelling a waiting one frees no slot and dispatches nothing.
    app.cancel("acme", &ids[4]).await;
    assert_eq!(
        app.usage("acme").await,
        json!({"running": 0, "dispatched": 2, "waiting": 1})
    );
    assert_eq!(state_of(&app, &ids[3]).await, "waiting");

    // Force-deleting a dispatched one releases its slot to the next waiting one, once.
    assert_eq!(
        app.delete("acme", &ids[1], true).await.status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(state_of(&app, &ids[3]).await, "dispatched");
    assert_eq!(
        app.usage("acme").await,
        json!({"running": 0, "dispatched": 2, "waiting": 0})
    );
    assert_eq!(app.ready_len("acme").await, 2);
}

#[tokio::test]
async fn a_full_backlog_answers_429_and_writes_nothing() {
    let app = TestApp::spawn().await;
    app.put_tenant("acme", &json!({"max_concurrent": 1, "max_queued": 2}))
        .await;
    for _ in 0..3 {
        app.admit("acme", "demo.echo").await;
    }
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
        json!({"running": 0, "dispatched": 1, "waiting": 2})
    );
    // Another tenant is unaffected.
    app.admit("other", "demo.echo").await;
}

#[tokio::test]
async fn force_deleting_a_waiting_execution_dispatches_nothing() {
    let app = TestApp::spawn().await;
    app.put_tenant("acme", &json!({"max_concurrent": 1})).await;
    let running = id_of(&app.admit("acme", "demo.echo").await);
    let waiting_a = id_of(&app.admit("acme", "demo.echo").await);
    let waiting_b = id_of(&app.admit("acme", "demo.echo").await);
    assert_eq!(
        app.delete("acme", &waiting_a, true).await.status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        app.usage("acme").await,
        json!({"running": 0, "dispatched": 1, "waiting": 1})
    );
    assert_eq!(state_of(&app, &running).await, "dispatched");
    assert_eq!(state_of(&app, &waiting_b).await, "waiting");
}

#[tokio::test]
async fn raising_max_concurrent_dispatches_waiting_executions_at_once() {
    let app = TestApp::spawn().await;
    app.put_tenant("acme", &json!({"max_concurrent": 1})).await;
    let ids: Vec<String> = {
        let mut v = Vec::new();
        for _ in 0..4 {
            v.push(id_of(&app.admit("acme", "demo.echo").await));
        }
        v
    };
    let tenant = app.put_tenant("acme", &json!({"max_concurrent": 3})).await;
    assert_eq!(tenant["max_concurrent"], 3);
    assert_eq!(
        tenant["usage"],
        json!({"running": 0, "dispatched": 3, "waiting": 1})
    );
    assert_eq!(state_of(&app, &ids[2]).await, "dispatched");
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
    assert_eq!(tenant["usage"]["waiting"], 0);
}

#[tokio::test]
async fn concurrent_cancels_release_a_slot_exactly_once() {
    let app = std::sync::Arc::new(TestApp::spawn().await);
    app.put_tenant("acme", &json!({"max_concurrent": 1})).await;
    let first = id_of(&app.admit("acme", "demo.echo").await);
    let mut waiting = Vec::new();
    for _ in 0..3 {
        waiting.push(id_of(&app.admit("acme", "demo.echo").await));
    }
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(20));
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let (app, barrier, id) = (app.clone(), barrier.clone(), first.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                if i % 2 == 0 {
                    app.cancel("acme", &id).await.status()
                } else {
                    app.delete("acme", &id, false).await.status()
                }
            })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap(), StatusCode::OK);
    }
    // One release: exactly one waiting execution moved up.
    assert_eq!(
        app.usage("acme").await,
        json!({"running": 0, "dispatched": 1, "waiting": 2})
    );
    assert_eq!(state_of(&app, &waiting[0]).await, "dispatched");
}
