//! Deleting a tenant (issue 38, 8b): a tenant id deleted and registered again starts empty.
//! The old tenant's executions (queued, scheduled, running, force-deleted, terminal), dedup
//! keys, dead letters, API keys, webhook, concurrency keys, rate state and trends are
//! unreachable to the new one and reaped from Redis in bounded steps; meanwhile the id admits
//! nothing and cannot be registered again; a running execution's late report writes nothing.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sluice::domain::TenantId;
use sluice::store::keys::{self, KeyKind};
use sluice::store::{REAP_BATCH, Reaped};
use tokio::time::Instant;

use crate::helpers::{ADMIN_TOKEN, TestApp, problem_code};

/// A webhook receiver on a free loopback port that takes every POST (204) and counts them.
async fn receiver() -> (String, Arc<AtomicUsize>) {
    let got = Arc::new(AtomicUsize::new(0));
    let counted = got.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move || {
            let counted = counted.clone();
            async move {
                counted.fetch_add(1, Ordering::SeqCst);
                StatusCode::NO_CONTENT
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/hook"), got)
}

/// A pull-API call as the platform admin acting for `tenant` (a worker of its own, `ops`).
async fn pull(app: &TestApp, tenant: &str, path: &str, mut body: Value) -> reqwest::Response {
    body["worker_id"] = json!("ops");
    app.as_tenant(Method::POST, path, tenant)
        .json(&body)
        .send()
        .await
        .unwrap()
}

/// Leases up to `max` runs of `tenant` as the platform admin's worker `ops`: (id, fence).
async fn lease(app: &TestApp, tenant: &str, max: usize) -> Vec<(String, u64)> {
    let body = json!({"max": max, "tenants": [tenant], "lease": "60s"});
    let res = pull(app, tenant, "/api/worker/lease", body).await;
    assert_eq!(res.status(), StatusCode::OK);
    let answer: Value = res.json().await.unwrap();
    answer["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["execution_id"].as_str().unwrap().to_owned(),
                r["fence"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// Reports the end of run `(id, fence)` of worker `ops`.
async fn complete(
    app: &TestApp,
    tenant: &str,
    run: &(String, u64),
    body: Value,
) -> reqwest::Response {
    let mut body = body;
    body["fence"] = json!(run.1);
    pull(
        app,
        tenant,
        &format!("/api/worker/runs/{}/complete", run.0),
        body,
    )
    .await
}

/// Renews run `(id, fence)` of worker `ops`.
async fn heartbeat(app: &TestApp, tenant: &str, run: &(String, u64)) -> reqwest::Response {
    let body = json!({"fence": run.1, "lease": "60s"});
    pull(
        app,
        tenant,
        &format!("/api/worker/runs/{}/heartbeat", run.0),
        body,
    )
    .await
}

/// `DELETE /api/tenants/{tenant}`: 204 when it is gone at once, 202 while it is reaped.
async fn delete_tenant(app: &TestApp, tenant: &str) -> reqwest::Response {
    app.client
        .delete(app.url(&format!("/api/tenants/{tenant}")))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
}

/// `GET /api/tenants/{tenant}` as the platform admin: its status.
async fn tenant_status(app: &TestApp, tenant: &str) -> StatusCode {
    app.client
        .get(app.url(&format!("/api/tenants/{tenant}")))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
        .status()
}

/// Waits (at most `limit`) until the deleted tenant is gone: `GET` answers 404.
async fn until_gone(app: &TestApp, tenant: &str, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let status = tenant_status(app, tenant).await;
        if status == StatusCode::NOT_FOUND {
            return;
        }
        assert_eq!(
            status,
            StatusCode::OK,
            "a tenant being deleted reads as such"
        );
        assert!(
            Instant::now() < deadline,
            "{tenant} not reaped within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Everything on Redis that still belongs to `tenant` or names one of `ids`, described: keys
/// of the tenant (shard keys under `t:<tenant>:`, its key set under `{acl}`), rows of it, key
/// records of it, and its places in the shard's sets (tenants, busy, webhooks, reaping,
/// runnable, the fair share's bookkeeping, the timer set, the leases, held sets) and in its
/// dead-letter stream, dead-letter counts and the registry.
async fn leftovers(app: &TestApp, tenant: &str, ids: &BTreeSet<String>) -> Vec<String> {
    let shard = app.shard(tenant);
    let mut found = Vec::new();
    let marker = format!(":t:{tenant}:");
    for k in app.redis.keys().await {
        if k.contains(&marker) {
            found.push(format!("key {k}"));
            continue;
        }
        let kind = keys::parse(&k).map(|n| n.kind);
        let owner_field = match kind {
            Some(KeyKind::Row) => Some(sluice::domain::row::TENANT),
            Some(KeyKind::Access) if k.contains("}:key:") => Some("tenant"),
            _ => None,
        };
        if let Some(field) = owner_field {
            let owner: Option<String> = app
                .redis
                .query(
                    redis::cmd("HGET")
                        .arg(crate::helpers::key_bytes(&k))
                        .arg(field),
                )
                .await;
            if owner.as_deref() == Some(tenant) {
                found.push(format!("{k} of {tenant}"));
            }
        }
        if kind == Some(KeyKind::Held) {
            let held = app.redis.ids(redis::cmd("SMEMBERS").arg(&k)).await;
            for id in held.iter().filter(|id| ids.contains(*id)) {
                found.push(format!("{id} in {k}"));
            }
        }
    }
    for set in [
        shard.tenants(),
        shard.busy(),
        shard.webhooks(),
        shard.reaping(),
    ] {
        let member: bool = app
            .redis
            .query(redis::cmd("SISMEMBER").arg(&set).arg(tenant))
            .await;
        if member {
            found.push(format!("{tenant} in {set}"));
        }
    }
    let holding: Option<f64> = app
        .redis
        .query(
            redis::cmd("ZSCORE")
                .arg(shard.dead_letter_holders())
                .arg(tenant),
        )
        .await;
    let evicted: bool = app
        .redis
        .query(
            redis::cmd("HEXISTS")
                .arg(shard.dead_letters_evicted())
                .arg(tenant),
        )
        .await;
    if holding.is_some() || evicted {
        found.push(format!("{tenant}'s dead-letter count"));
    }
    let registered: Option<f64> = app
        .redis
        .query(redis::cmd("ZSCORE").arg(keys::tenants()).arg(tenant))
        .await;
    if registered.is_some() {
        found.push(format!("{tenant} in the registry"));
    }
    let runnable: Option<f64> = app
        .redis
        .query(redis::cmd("ZSCORE").arg(shard.runnable()).arg(tenant))
        .await;
    if runnable.is_some() {
        found.push(format!("{tenant} runnable"));
    }
    let vt: bool = app
        .redis
        .query(
            redis::cmd("HEXISTS")
                .arg(shard.sched())
                .arg(format!("vt:{tenant}")),
        )
        .await;
    if vt {
        found.push(format!("vt:{tenant} in {}", shard.sched()));
    }
    for set in [shard.delayed(), shard.leases()] {
        let members = app
            .redis
            .ids(redis::cmd("ZRANGE").arg(&set).arg(0).arg(-1))
            .await;
        for m in members {
            if ids.contains(&m)
                || m == format!("rt:{tenant}")
                || m.starts_with(&format!("rk:{tenant}:"))
            {
                found.push(format!("{m} in {set}"));
            }
        }
    }
    let records: Vec<(String, std::collections::HashMap<String, String>)> = app
        .redis
        .query(
            redis::cmd("XRANGE")
                .arg(shard.dead_letters())
                .arg("-")
                .arg("+"),
        )
        .await;
    for (id, fields) in records {
        if fields.get("tenant_id").map(String::as_str) == Some(tenant) {
            found.push(format!("dead letter {id} of {tenant}"));
        }
    }
    found
}

/// Everything a tenant can hold, then `DELETE`: the new tenant of the same id sees none of
/// it, and Redis keeps none of it; the old runs were told to stop and their late reports
/// change nothing. Before the fix the new owner's viewer listed the old executions, its
/// dedup key replayed the old execution, and the old rows, keys and dead letters stayed.
#[tokio::test]
async fn a_tenant_registered_again_starts_empty_and_the_old_one_leaves_nothing() {
    let app = TestApp::spawn_with(|c| c.api.webhook_allow_private = true).await;
    let (hook, delivered) = receiver().await;
    app.put_tenant(
        "acme",
        &json!({"max_concurrent": 3, "max_concurrent_per_key": 1, "weight": 7,
                "rate_limit": {"starts": 1000, "per": "1s", "burst": 100}}),
    )
    .await;
    let token = |role: &'static str| {
        let app = &app;
        async move {
            let res = app
                .client
                .post(app.url("/api/tenants/acme/api-keys"))
                .bearer_auth(ADMIN_TOKEN)
                .json(&json!({"role": role}))
                .send()
                .await
                .unwrap();
            assert_eq!(res.status(), StatusCode::CREATED);
            res.json::<Value>().await.unwrap()["token"]
                .as_str()
                .unwrap()
                .to_owned()
        }
    };
    let old_keys = [
        token("admin").await,
        token("viewer").await,
        token("worker").await,
    ];
    let res = app
        .as_tenant(Method::PUT, "/api/tenants/acme/webhook", "acme")
        .json(&json!({"url": hook}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let res = app
        .as_tenant(Method::PUT, "/api/tenants/acme/concurrency-keys/k9", "acme")
        .json(&json!({"max_concurrent": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);

    let mut ids = BTreeSet::new();
    let admit = |body: Value| {
        let app = &app;
        async move { app.admit_with("acme", body).await }
    };
    // A dead letter: one attempt, failed for good.
    let failed = admit(json!({"flow_id": "py.fail", "max_attempts": 1, "dedup_key": "dead"})).await;
    let run = lease(&app, "acme", 1).await.remove(0);
    let res = complete(
        &app,
        "acme",
        &run,
        json!({"outcome": "failed", "retryable": true, "error": {"message": "no"}}),
    )
    .await;
    assert_eq!(
        res.json::<Value>().await.unwrap()["result"],
        "dead_lettered"
    );
    // A completed one and a cancelled one.
    let done = admit(json!({"flow_id": "py.echo"})).await;
    let run = lease(&app, "acme", 1).await.remove(0);
    let res = complete(
        &app,
        "acme",
        &run,
        json!({"outcome": "completed", "output": {}}),
    )
    .await;
    assert_eq!(res.status(), StatusCode::OK);
    let cancelled = admit(json!({"flow_id": "py.echo"})).await;
    assert_eq!(
        app.cancel("acme", &cancelled).await.status(),
        StatusCode::OK
    );
    // Three running: one with the dedup key the new tenant repeats, one of a concurrency key,
    // and one force-deleted while it runs.
    let running = admit(json!({"flow_id": "py.sleep", "dedup_key": "k-old"})).await;
    let keyed = admit(json!({"flow_id": "py.sleep", "concurrency_key": "k1"})).await;
    let doomed = admit(json!({"flow_id": "py.sleep"})).await;
    let runs = lease(&app, "acme", 3).await;
    assert_eq!(runs.len(), 3, "{runs:?}");
    assert_eq!(
        app.delete("acme", &doomed, true).await.status(),
        StatusCode::NO_CONTENT
    );
    // Queued: one behind its key's limit, two behind the tenant's, one scheduled for later.
    let blocked = admit(json!({"flow_id": "py.sleep", "concurrency_key": "k1"})).await;
    let waiting = [
        admit(json!({"flow_id": "py.sleep"})).await,
        admit(json!({"flow_id": "py.echo", "dedup_key": "queued"})).await,
    ];
    let scheduled = admit(json!({"flow_id": "py.echo", "delay": "1h"})).await;
    ids.extend([
        failed,
        done,
        cancelled,
        running.clone(),
        keyed,
        doomed,
        blocked,
        scheduled,
    ]);
    ids.extend(waiting);
    assert_eq!(
        app.usage("acme").await,
        json!({"running": 3, "waiting": 3, "scheduled": 1})
    );
    assert_eq!(
        app.get_json(Some("acme"), "/api/dlq").await["dead_letters"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    // The webhook has delivered (so the tenant has a delivery log too).
    let deadline = Instant::now() + Duration::from_secs(30);
    while delivered.load(Ordering::SeqCst) < 4 {
        assert!(
            Instant::now() < deadline,
            "the webhook delivered {delivered:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let shard = app.shard("acme");
    let acme = TenantId::parse("acme").unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let logged: u64 = app
            .redis
            .query(redis::cmd("XLEN").arg(shard.delivery_log(&acme)))
            .await;
        if logged >= 4 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the deliveries were never logged"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        leftovers(&app, "acme", &ids).await.len() > 20,
        "the tenant holds its data"
    );

    // The worker's stop poll listens, so it hears that its runs must stop.
    let stops = {
        let (addr, client) = (app.url("/api/worker/stops?wait=30s"), app.client.clone());
        tokio::spawn(async move {
            let res = client
                .post(addr)
                .bearer_auth(ADMIN_TOKEN)
                .header("X-Tenant-Id", "acme")
                .json(&json!({"worker_id": "ops"}))
                .send()
                .await
                .unwrap();
            assert_eq!(res.status(), StatusCode::OK);
            res.json::<Value>().await.unwrap()
        })
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    while !(app.pull.stops.kept().contains("pull/*/ops") && app.pull.stops.listening()) {
        assert!(Instant::now() < deadline, "the stop poll never waited");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let res = delete_tenant(&app, "acme").await;
    assert!(
        [StatusCode::NO_CONTENT, StatusCode::ACCEPTED].contains(&res.status()),
        "{}",
        res.status()
    );
    // Its runs are told to stop, and the runs are lost to their worker: nothing it reports
    // now is heard.
    let told = stops.await.unwrap();
    let told: Vec<String> = told["stop"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    assert!(
        !told.is_empty() && told.iter().all(|id| ids.contains(id)),
        "{told:?}"
    );
    for run in &runs {
        let res = heartbeat(&app, "acme", run).await;
        assert_eq!(res.status(), StatusCode::CONFLICT);
        assert_eq!(problem_code(res).await, "lease_lost");
    }
    for token in &old_keys {
        let res = app
            .client
            .get(app.url("/api/me"))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    }
    until_gone(&app, "acme", Duration::from_secs(60)).await;
    assert_eq!(leftovers(&app, "acme", &ids).await, Vec::<String>::new());
    // A late completion of a run of the deleted tenant resurrects nothing.
    for run in &runs {
        let res = complete(
            &app,
            "acme",
            run,
            json!({"outcome": "completed", "output": {}}),
        )
        .await;
        assert_eq!(res.status(), StatusCode::CONFLICT);
        assert_eq!(problem_code(res).await, "lease_lost");
    }
    assert_eq!(leftovers(&app, "acme", &ids).await, Vec::<String>::new());

    // Registered again: the server defaults, and nothing of the old tenant.
    let fresh = app.put_tenant("acme", &json!({})).await;
    assert_eq!(fresh["deleting"], false);
    assert_eq!(fresh["weight"], 1);
    assert_eq!(fresh["max_concurrent_per_key"], Value::Null);
    assert_eq!(fresh["rate_limit"], Value::Null);
    assert_eq!(
        fresh["usage"],
        json!({"running": 0, "waiting": 0, "scheduled": 0})
    );
    assert_eq!(
        fresh["concurrency_keys"],
        json!({"overrides": 0, "blocked": 0})
    );
    let viewer = token("viewer").await;
    let res = app
        .client
        .get(app.url("/api/executions"))
        .bearer_auth(&viewer)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let page: Value = res.json().await.unwrap();
    assert_eq!(page["executions"], json!([]), "{page}");
    assert_eq!(page["total"], 0);
    for id in &ids {
        let res = app
            .client
            .get(app.url(&format!("/api/executions/{id}")))
            .bearer_auth(&viewer)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::NOT_FOUND, "{id}");
    }
    assert_eq!(
        app.get_json(Some("acme"), "/api/dlq").await["dead_letters"],
        json!([])
    );
    let res = app
        .as_tenant(Method::GET, "/api/tenants/acme/webhook", "acme")
        .send()
        .await
        .unwrap();
    assert_eq!(problem_code(res).await, "webhook_not_found");
    let keys = app
        .get_json(Some("acme"), "/api/tenants/acme/concurrency-keys")
        .await;
    assert_eq!(keys["keys"], json!([]));
    // The old dedup key admits anew, it does not replay the old execution.
    let res = app
        .post_execution(
            "acme",
            &json!({"flow_id": "py.sleep", "dedup_key": "k-old"}),
        )
        .await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let again: Value = res.json().await.unwrap();
    assert_ne!(again["execution_id"], json!(running));
    assert_eq!(again["deduplicated"], false);
    // Its trends count only what the new tenant did.
    let trends = app.get_json(None, "/api/tenants/acme/trends?hours=1").await;
    let totals = &trends["series"]["totals"];
    assert_eq!(
        [
            "admissions",
            "starts",
            "completions",
            "failures",
            "cancellations"
        ]
        .map(|k| totals[k].as_u64()),
        [Some(1), Some(0), Some(0), Some(0), Some(0)],
        "{totals}"
    );
}

/// While its data is reaped, a deleted tenant answers for itself: `GET` shows it deleting,
/// every admission (the platform admin's too, dry runs and batches) and its registration
/// answer 409 `tenant_deleting` with `Retry-After`, and nothing of that is written. Once the
/// reap is done — by the server that deleted it, in the background — the id is free again.
/// The reap is held here by a webhook delivery round in flight (its lock), which it waits for.
#[tokio::test]
async fn a_tenant_being_deleted_refuses_admissions_and_registration_until_reaped() {
    let app = TestApp::spawn().await;
    app.put_tenant("acme", &json!({"max_concurrent": 0})).await;
    for _ in 0..3 {
        app.admit_with("acme", json!({"flow_id": "demo.echo"}))
            .await;
    }
    // A delivery round in flight (as `serve` takes it: SET NX PX).
    let lock = app
        .shard("acme")
        .delivery_lock(&TenantId::parse("acme").unwrap());
    let _: () = app
        .redis
        .query(
            redis::cmd("SET")
                .arg(&lock)
                .arg("serve-elsewhere")
                .arg("PX")
                .arg(120_000),
        )
        .await;

    let res = delete_tenant(&app, "acme").await;
    assert_eq!(res.status(), StatusCode::ACCEPTED);
    assert_eq!(res.headers()["retry-after"], "1");
    let state: Value = res.json().await.unwrap();
    assert_eq!(state["deleting"], true, "{state}");
    // What it held is gone already; the round in flight is all that is waited for.
    assert_eq!(
        state["usage"],
        json!({"running": 0, "waiting": 0, "scheduled": 0})
    );
    let read = app.get_json(None, "/api/tenants/acme").await;
    assert_eq!(read["deleting"], true);
    let listed = app.get_json(None, "/api/tenants").await;
    assert_eq!(
        listed["tenants"],
        json!([]),
        "a tenant being deleted is not registered"
    );

    let before = app.redis.dump().await;
    let refused = |res: reqwest::Response| async move {
        assert_eq!(res.status(), StatusCode::CONFLICT);
        assert_eq!(res.headers()["retry-after"], "1");
        assert_eq!(problem_code(res).await, "tenant_deleting");
    };
    refused(
        app.post_execution("acme", &json!({"flow_id": "demo.echo"}))
            .await,
    )
    .await;
    refused(
        app.client
            .put(app.url("/api/tenants/acme"))
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({"max_concurrent": 5}))
            .send()
            .await
            .unwrap(),
    )
    .await;
    refused(
        app.as_tenant(Method::PUT, "/api/tenants/acme/concurrency-keys/k", "acme")
            .json(&json!({"max_concurrent": 1}))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let res = app
        .as_tenant(Method::POST, "/api/executions/batch", "acme")
        .json(&json!({"items": [{"flow_id": "demo.echo"}, {"flow_id": "demo.echo", "dedup_key": "b"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let batch: Value = res.json().await.unwrap();
    for item in batch["results"].as_array().unwrap() {
        assert_eq!(item["status"], 409, "{item}");
        assert_eq!(item["problem"]["code"], "tenant_deleting", "{item}");
    }
    let res = app
        .as_tenant(Method::POST, "/api/executions/dry-run", "acme")
        .json(&json!({"flow_id": "demo.echo"}))
        .send()
        .await
        .unwrap();
    let dry: Value = res.json().await.unwrap();
    assert_eq!(
        (&dry["decision"], &dry["reason"]),
        (&json!("refuse"), &json!("tenant_deleting")),
        "{dry}"
    );
    let res = app
        .client
        .post(app.url("/api/tenants/acme/api-keys"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"role": "admin"}))
        .send()
        .await
        .unwrap();
    assert_eq!(problem_code(res).await, "tenant_not_found");
    // Nothing of those was written (the batch's mark came and went).
    let after = app.redis.dump().await;
    let changed: BTreeSet<&String> = after
        .keys()
        .chain(before.keys())
        .filter(|k| after.get(*k) != before.get(*k))
        .filter(|k| keys::parse(k).is_none_or(|n| n.kind != KeyKind::Stats))
        .collect();
    assert_eq!(changed, BTreeSet::new());
    // A second DELETE finds it still deleting.
    assert_eq!(
        delete_tenant(&app, "acme").await.status(),
        StatusCode::ACCEPTED
    );

    // The round ends: the background reap finishes, and the id is free.
    let _: i64 = app.redis.query(redis::cmd("DEL").arg(&lock)).await;
    until_gone(&app, "acme", Duration::from_secs(30)).await;
    assert_eq!(
        leftovers(&app, "acme", &BTreeSet::new()).await,
        Vec::<String>::new()
    );
    let fresh = app.put_tenant("acme", &json!({})).await;
    assert_eq!(fresh["deleting"], false);
    assert_eq!(
        fresh["max_concurrent"], 100,
        "the server default, not the old 0"
    );
    assert_eq!(
        delete_tenant(&app, "acme").await.status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        delete_tenant(&app, "acme").await.status(),
        StatusCode::NOT_FOUND
    );
}

/// The reap is bounded work per call (at most `REAP_BATCH` executions), resumes wherever it
/// stopped — from any server — and a tenant a stopped server left half reaped is finished by
/// the sweeper.
#[tokio::test]
async fn reaping_is_bounded_per_call_and_any_server_or_the_sweeper_finishes_it() {
    let app = TestApp::spawn().await;
    app.put_tenant("acme", &json!({"max_concurrent": 0})).await;
    const N: usize = 5 * REAP_BATCH / 2;
    let items: Vec<Value> = (0..N)
        .map(|i| json!({"flow_id": "demo.echo", "dedup_key": format!("d{i}")}))
        .collect();
    for chunk in items.chunks(250) {
        let res = app
            .as_tenant(Method::POST, "/api/executions/batch", "acme")
            .json(&json!({"items": chunk}))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
    }
    let tenant = TenantId::parse("acme").unwrap();
    let shard = app.shard("acme");
    let rows = || async {
        let mut n = 0;
        for k in app.redis.keys().await {
            if keys::parse(&k).is_some_and(|p| p.kind == KeyKind::Row) {
                n += 1;
            }
        }
        n
    };
    assert_eq!(rows().await, N);
    // Deleted as a server would, which then stops before it reaped anything.
    let other = app.store().await;
    assert_ne!(
        other.delete_tenant(&tenant).await.unwrap(),
        sluice::store::Deletion::Unknown
    );
    assert_eq!(rows().await, N, "the mark alone removes nothing");
    let res = app
        .post_execution("acme", &json!({"flow_id": "demo.echo"}))
        .await;
    assert_eq!(problem_code(res).await, "tenant_deleting");
    // Steps by two servers in turn: each removes at most REAP_BATCH executions.
    let mut left = N;
    let mut steps = 0;
    while left > REAP_BATCH {
        let store = if steps % 2 == 0 {
            &other
        } else {
            &*app.app_store
        };
        assert_eq!(store.reap_step(shard, &tenant).await.unwrap(), Reaped::More);
        let now = rows().await;
        assert!(
            left - now <= REAP_BATCH,
            "one step removed {} rows",
            left - now
        );
        assert!(now < left, "a step made no progress");
        left = now;
        steps += 1;
    }
    assert!(steps >= 2, "{steps} steps");
    // The sweeper finds it in the shard's reaping set and finishes it.
    let repairs = sluice::sweeper::sweep_once(
        app.app_store.clone(),
        "test-sweeper",
        Duration::from_secs(30),
    )
    .await
    .expect("the sweeper's turn");
    assert_eq!(
        repairs.values().sum::<u64>(),
        0,
        "reaping is not drift: {repairs:?}"
    );
    assert_eq!(rows().await, 0);
    assert_eq!(tenant_status(&app, "acme").await, StatusCode::NOT_FOUND);
    assert_eq!(
        leftovers(&app, "acme", &BTreeSet::new()).await,
        Vec::<String>::new()
    );
    assert_eq!(other.reap_step(shard, &tenant).await.unwrap(), Reaped::Done);
}
