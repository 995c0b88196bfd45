//! Pinning a hot tenant to a dedicated shard (`POST /api/tenants/{t}/dedicated-shard`): its
//! keys move to a shard no other tenant hashes to, a server that has not yet learned the pin
//! is sent on by Redis (one id per Idempotency-Key across both), only a registered tenant
//! without executions can be pinned, and `DELETE` on the same path moves it back and frees
//! the shard. Runs on both suite modes.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{ADMIN_TOKEN, TestApp, TestWorker, problem_code};

async fn pin(app: &TestApp, tenant: &str) -> reqwest::Response {
    app.client
        .post(app.url(&format!("/api/tenants/{tenant}/dedicated-shard")))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
}

async fn unpin(app: &TestApp, tenant: &str) -> reqwest::Response {
    app.client
        .delete(app.url(&format!("/api/tenants/{tenant}/dedicated-shard")))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
}

/// The hash tag of the row of execution `id`, found among Redis's keys.
async fn row_tag(app: &TestApp, id: &str) -> String {
    let stored =
        crate::helpers::shard_no(0).stored_id(&sluice::domain::ExecutionId::parse(id).unwrap());
    let suffix = format!(":exec:{}", crate::helpers::key_text(stored));
    let key = app
        .redis
        .keys()
        .await
        .into_iter()
        .find(|k| k.ends_with(&suffix))
        .unwrap_or_else(|| panic!("no row for {id}"));
    key.split(['{', '}']).nth(1).unwrap().to_owned()
}

#[tokio::test]
async fn only_a_registered_tenant_is_pinned_and_an_unpin_moves_it_back_and_frees_the_shard() {
    let mut app = TestApp::spawn().await;
    // A name nobody registered takes no dedicated shard (the cross-site requests of issue 19
    // used both up with made-up names).
    for _ in 0..3 {
        let res = pin(&app, "ghost").await;
        assert_eq!(res.status(), StatusCode::NOT_FOUND);
        assert_eq!(problem_code(res).await, "tenant_not_found");
    }
    for t in ["hot-a", "hot-b", "hot-c"] {
        app.put_tenant(t, &json!({})).await;
    }
    let a: Value = pin(&app, "hot-a").await.json().await.unwrap();
    let b: Value = pin(&app, "hot-b").await.json().await.unwrap();
    assert!(a["shard"].is_u64() && b["shard"].is_u64(), "{a} {b}");
    assert_eq!(
        problem_code(pin(&app, "hot-c").await).await,
        "no_dedicated_shard_free"
    );
    // Limits set while pinned live on the dedicated shard, and come back with the tenant.
    app.put_tenant("hot-a", &json!({"max_queued": 7, "enabled": false}))
        .await;
    // A server that learned the pin at its start, and still believes it after the unpin.
    let fresh = app.addr;
    let stale = app.spawn_beside(|_| {}).await;

    // A tenant with executions on its dedicated shard stays there.
    let held = app.admit("hot-b", "demo.echo").await;
    let res = unpin(&app, "hot-b").await;
    assert_eq!(res.status(), StatusCode::CONFLICT);
    assert_eq!(problem_code(res).await, "tenant_has_executions");
    let id = held["execution_id"].as_str().unwrap();
    assert_eq!(row_tag(&app, id).await, b["hash_tag"].as_str().unwrap());

    // Unpinning is idempotent, and frees the shard for another tenant.
    assert_eq!(unpin(&app, "hot-a").await.status(), StatusCode::NO_CONTENT);
    assert_eq!(unpin(&app, "hot-a").await.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        unpin(&app, "never-pinned").await.status(),
        StatusCode::NO_CONTENT
    );
    let t = app.get_json(None, "/api/tenants/hot-a").await;
    assert_eq!(
        (t["max_queued"].as_u64(), &t["enabled"]),
        (Some(7), &json!(false)),
        "{t}"
    );
    app.put_tenant("hot-a", &json!({"enabled": true})).await;
    let c: Value = pin(&app, "hot-c").await.json().await.unwrap();
    assert_eq!(
        c["shard"], a["shard"],
        "hot-c gets the shard hot-a gave back"
    );

    // The stale server is sent back to the hashed shard by Redis; both servers agree.
    app.addr = stale;
    let res = app
        .post_with_key("hot-a", "k-1", &json!({"flow_id": "demo.echo"}))
        .await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let id = res.json::<Value>().await.unwrap()["execution_id"]
        .as_str()
        .unwrap()
        .to_owned();
    app.addr = fresh;
    let res = app
        .post_with_key("hot-a", "k-1", &json!({"flow_id": "demo.echo"}))
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    let hashed_tag = row_tag(&app, &id).await;
    assert_ne!(hashed_tag, a["hash_tag"].as_str().unwrap());
    assert_eq!(hashed_tag, app.shard("hot-a").tag());

    // Pinned, unpinned and pinned again: the way back is open each time.
    assert_eq!(unpin(&app, "hot-c").await.status(), StatusCode::NO_CONTENT);
    let again: Value = pin(&app, "hot-c").await.json().await.unwrap();
    assert_eq!(again["shard"], c["shard"]);
    let admitted = app.admit("hot-c", "demo.echo").await;
    assert_eq!(admitted["status"], "queued", "{admitted}");
    let id = admitted["execution_id"].as_str().unwrap();
    assert_eq!(row_tag(&app, id).await, again["hash_tag"].as_str().unwrap());

    // Only the platform admin unpins.
    let res = app
        .client
        .delete(app.url("/api/tenants/hot-c/dedicated-shard"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_pinned_tenant_gets_a_shard_of_its_own_and_stale_servers_are_sent_on() {
    let mut app = TestApp::spawn().await;
    // A second server, started before the pin: it routes `hot` to its hashed shard.
    let fresh = app.addr;
    let stale = app.spawn_beside(|_| {}).await;
    app.put_tenant("hot", &json!({"max_queued": 500, "weight": 7}))
        .await;

    let res = pin(&app, "hot").await;
    assert_eq!(res.status(), StatusCode::OK);
    let pinned: Value = res.json().await.unwrap();
    let number = pinned["shard"].as_u64().unwrap();
    assert!(
        number >= 16,
        "a dedicated shard comes after the 16 hashed ones: {pinned}"
    );
    let tag = pinned["hash_tag"].as_str().unwrap().to_owned();
    // Pinning again answers the same shard.
    let again: Value = pin(&app, "hot").await.json().await.unwrap();
    assert_eq!(again, pinned);

    // The stale server admits first; Redis sends it on, so both agree on one execution.
    app.addr = stale;
    let res = app
        .post_with_key("hot", "order-1", &json!({"flow_id": "demo.echo"}))
        .await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let id = res.json::<Value>().await.unwrap()["execution_id"].clone();
    app.addr = fresh;
    let res = app
        .post_with_key("hot", "order-1", &json!({"flow_id": "demo.echo"}))
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.json::<Value>().await.unwrap()["execution_id"], id);
    let stored = app
        .shard("hot")
        .stored_id(&sluice::domain::ExecutionId::parse(id.as_str().unwrap()).unwrap());
    let row = format!("sluice:{{{tag}}}:exec:{}", crate::helpers::key_text(stored));
    assert!(
        app.redis.keys().await.contains(&row),
        "the row is under {tag}"
    );
    // Its own limits went with it, and a change through the stale server lands there too.
    app.addr = stale;
    app.put_tenant("hot", &json!({"max_concurrent": 3})).await;
    app.addr = fresh;
    let t = app.get_json(None, "/api/tenants/hot").await;
    assert_eq!(
        (
            t["max_queued"].as_u64(),
            t["max_concurrent"].as_u64(),
            t["weight"].as_u64()
        ),
        (Some(500), Some(3), Some(7)),
        "{t}"
    );

    // Workers serve the dedicated shard like any other.
    let _worker = TestWorker::spawn(&app.redis, &["--concurrency", "2"]);
    let done = app
        .wait_terminal("hot", id.as_str().unwrap(), Duration::from_secs(15))
        .await;
    assert_eq!(done["status"], "completed", "{done}");
}

#[tokio::test]
async fn only_a_tenant_without_executions_can_be_pinned_and_dedicated_shards_run_out() {
    let app = TestApp::spawn().await;
    for t in ["busy", "hot-a", "hot-b", "hot-c"] {
        app.put_tenant(t, &json!({})).await;
    }
    app.admit("busy", "demo.echo").await;
    let res = pin(&app, "busy").await;
    assert_eq!(res.status(), StatusCode::CONFLICT);
    assert_eq!(problem_code(res).await, "tenant_has_executions");
    // Nothing changed: it still admits where it was.
    let again = app.admit("busy", "demo.echo").await;
    assert_eq!(again["status"], "queued");

    // Two dedicated shards by default: the third pin finds none free.
    for t in ["hot-a", "hot-b"] {
        assert_eq!(pin(&app, t).await.status(), StatusCode::OK);
    }
    let res = pin(&app, "hot-c").await;
    assert_eq!(res.status(), StatusCode::CONFLICT);
    assert_eq!(problem_code(res).await, "no_dedicated_shard_free");
    // The busy tenant's refusal freed the shard it had claimed: both pins got distinct ones.
    let a: Value = pin(&app, "hot-a").await.json().await.unwrap();
    let b: Value = pin(&app, "hot-b").await.json().await.unwrap();
    assert_ne!(a["shard"], b["shard"]);
}

/// A server that has not learned a pin yet (it rereads the pins every 2 s) used to answer 404
/// for an execution another server had just acknowledged (#19): pin a tenant through server
/// A, admit through A (201), then read, wait on and cancel it through server B. Each is asked
/// right after a fresh pin, so each finds its execution on its own.
#[tokio::test]
async fn a_server_that_has_not_seen_a_pin_yet_finds_the_tenants_executions() {
    let mut app = TestApp::spawn_with(|c| c.redis.dedicated_shards = 3).await;
    let a = app.addr;
    let b = app.spawn_beside(|_| {}).await;
    let pinned_and_admitted = async |app: &mut TestApp, tenant: &str| {
        app.addr = a;
        // Only a registered tenant is pinned.
        app.put_tenant(tenant, &json!({})).await;
        assert_eq!(pin(app, tenant).await.status(), StatusCode::OK);
        let res = app
            .post_execution(tenant, &json!({"flow_id": "demo.echo"}))
            .await;
        assert_eq!(res.status(), StatusCode::CREATED);
        let id = res.json::<Value>().await.unwrap()["execution_id"]
            .as_str()
            .unwrap()
            .to_owned();
        app.addr = b;
        id
    };

    let id = pinned_and_admitted(&mut app, "pin-get").await;
    let res = app.get_execution("pin-get", &id).await;
    assert_eq!(res.status(), StatusCode::OK, "GET through the other server");

    let id = pinned_and_admitted(&mut app, "pin-wait").await;
    let res = app
        .as_tenant(
            reqwest::Method::GET,
            &format!("/api/executions/{id}?wait=100ms"),
            "pin-wait",
        )
        .send()
        .await
        .unwrap();
    assert_eq!(
        res.status(),
        StatusCode::OK,
        "?wait= through the other server"
    );

    let id = pinned_and_admitted(&mut app, "pin-cancel").await;
    let res = app.cancel("pin-cancel", &id).await;
    assert_eq!(
        res.status(),
        StatusCode::OK,
        "cancel through the other server"
    );
    let e: Value = res.json().await.unwrap();
    assert_eq!(e["status"], "cancelled", "{e}");
}
