//! What an admission no longer asks Redis, because a value it reads anyway answers
//! (`migrations-lua/admit.lua`'s header): the registries' `SADD`s, skipped while the tenant's
//! cfg field `reg_flow` names the flow (so the tenant and that flow are members already), and
//! the void marker's `EXISTS`, skipped while the tenant's `void_until` says no marker of it can
//! exist. Each test attacks the implication the skip rests on: flows admitted in any order,
//! many new tenants and flows at once, a tenant deleted and admitted again, an admission
//! abandoned before it ran.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use redis::Value as RedisValue;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::sync::Barrier;
use tokio::time::Instant;

use crate::helpers::{ADMIN_TOKEN, TestApp, TestRedis};
use sluice::domain::{ExecutionId, TenantId};

/// The members of a set.
async fn members(app: &TestApp, key: String) -> BTreeSet<String> {
    app.redis
        .query::<Vec<String>>(redis::cmd("SMEMBERS").arg(key))
        .await
        .into_iter()
        .collect()
}

/// The ids a status-only listing of `tenant`'s queued executions shows (every page), and the
/// total it states. Such a page reads the tenant's flows from its flows registry: a flow
/// missing there is an execution missing here.
async fn queued_listing(app: &TestApp, tenant: &str) -> (BTreeSet<String>, u64) {
    let mut ids = BTreeSet::new();
    let mut cursor: Option<String> = None;
    for _ in 0..100 {
        let query = match &cursor {
            Some(c) => format!("status=queued&limit=50&cursor={c}"),
            None => "status=queued&limit=50".to_owned(),
        };
        let page = app.page(tenant, &query).await;
        let total = page["total"].as_u64().expect("total");
        for e in page["executions"].as_array().unwrap() {
            ids.insert(e["execution_id"].as_str().unwrap().to_owned());
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => return (ids, total),
        }
    }
    panic!("the listing of {tenant} did not end within 100 pages");
}

/// The cfg field `reg_flow` of `tenant`.
async fn reg_flow(app: &TestApp, tenant: &str) -> Option<String> {
    let t = TenantId::parse(tenant).unwrap();
    app.redis
        .query(
            redis::cmd("HGET")
                .arg(app.shard(tenant).tenant_config(&t))
                .arg("reg_flow"),
        )
        .await
}

/// One tenant admits flows in an order that changes its last flow every time but one: each
/// flow is in its registry, so a status-only listing shows every execution, and the tenant is
/// in its shard's registry. (An admission that took `reg_flow` present for "this flow is
/// listed" would leave `f.b` and `f.c` out.)
#[tokio::test]
async fn status_only_listings_see_every_flow_a_tenant_admits_in_any_order() {
    let app = TestApp::spawn().await;
    let order = ["f.a", "f.b", "f.a", "f.a", "f.c", "f.b", "f.a"];
    let mut ids = BTreeSet::new();
    for flow in order {
        let e = app.admit("acme", flow).await;
        ids.insert(e["execution_id"].as_str().unwrap().to_owned());
    }
    let (listed, total) = queued_listing(&app, "acme").await;
    assert_eq!(total, order.len() as u64);
    assert_eq!(listed, ids);
    let t = TenantId::parse("acme").unwrap();
    let s = app.shard("acme");
    assert_eq!(
        members(&app, s.flows(&t)).await,
        ["f.a", "f.b", "f.c"].map(String::from).into()
    );
    assert_eq!(members(&app, s.tenants()).await, ["acme".to_owned()].into());
    // The last flow admitted is the one the cfg vouches for.
    assert_eq!(reg_flow(&app, "acme").await.as_deref(), Some("f.a"));
}

/// Admissions at once, twice: first 8 new tenants each admit one flow (new tenants together),
/// then 96 more (each tenant × 6 flows, 5 of them new to it, each pair twice; the group
/// commit puts many in one call, after the tenants' cfg already names a flow). Every tenant is
/// in its shard's registry, every tenant's registry holds exactly its 6 flows, and each
/// status-only listing shows exactly its 13 executions.
#[tokio::test]
async fn concurrent_admissions_of_new_tenants_and_flows_register_every_one() {
    let app = Arc::new(TestApp::spawn().await);
    let tenants: Vec<String> = (0..8).map(|i| format!("new-{i}")).collect();
    let flows: Vec<String> = (0..6).map(|i| format!("flow.{i}")).collect();
    let mut admitted: Vec<(String, String)> = Vec::new();
    for phase in 0..2 {
        let mut pairs: Vec<(String, String, u32)> = Vec::new();
        if phase == 0 {
            pairs.extend(tenants.iter().map(|t| (t.clone(), flows[0].clone(), 0)));
        } else {
            for round in 1..3 {
                for t in &tenants {
                    pairs.extend(flows.iter().map(|f| (t.clone(), f.clone(), round)));
                }
            }
        }
        let barrier = Arc::new(Barrier::new(pairs.len()));
        let mut tasks = Vec::new();
        for (t, f, round) in pairs {
            let (app, barrier) = (Arc::clone(&app), Arc::clone(&barrier));
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                let res = app
                    .post_execution(&t, &json!({"flow_id": f, "params": {"round": round}}))
                    .await;
                assert_eq!(res.status(), StatusCode::CREATED);
                let e: Value = res.json().await.unwrap();
                (t, e["execution_id"].as_str().unwrap().to_owned())
            }));
        }
        for task in tasks {
            admitted.push(task.await.unwrap());
        }
    }
    assert_eq!(admitted.len(), tenants.len() * (1 + 2 * flows.len()));
    let want_flows: BTreeSet<String> = flows.iter().cloned().collect();
    let mut registered = BTreeSet::new();
    for t in &tenants {
        let tid = TenantId::parse(t).unwrap();
        let s = app.shard(t);
        assert_eq!(members(&app, s.flows(&tid)).await, want_flows, "{t}");
        registered.extend(members(&app, s.tenants()).await);
        let ids: BTreeSet<String> = admitted
            .iter()
            .filter(|(at, _)| at == t)
            .map(|(_, id)| id.clone())
            .collect();
        assert_eq!(ids.len(), 1 + 2 * flows.len());
        let (listed, total) = queued_listing(&app, t).await;
        assert_eq!(total, ids.len() as u64, "{t}");
        assert_eq!(listed, ids, "{t}");
    }
    assert_eq!(registered, tenants.iter().cloned().collect());
}

/// A tenant that admitted, was deleted (its registries' members and its cfg reaped) and admits
/// the same flow again is in both registries again, and its new execution is listed.
#[tokio::test]
async fn a_deleted_tenant_admitted_again_is_in_the_registries_again() {
    let app = TestApp::spawn().await;
    app.admit("acme", "f.a").await;
    assert_eq!(reg_flow(&app, "acme").await.as_deref(), Some("f.a"));
    let res = app
        .client
        .delete(app.url("/api/tenants/acme"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert!(
        [StatusCode::NO_CONTENT, StatusCode::ACCEPTED].contains(&res.status()),
        "{}",
        res.status()
    );
    // Reaped: GET answers 404 (the server reaps in the background).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = app
            .client
            .get(app.url("/api/tenants/acme"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap()
            .status();
        if status == StatusCode::NOT_FOUND {
            break;
        }
        assert!(Instant::now() < deadline, "acme not reaped: {status}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let t = TenantId::parse("acme").unwrap();
    let s = app.shard("acme");
    assert!(members(&app, s.tenants()).await.is_empty());
    assert!(members(&app, s.flows(&t)).await.is_empty());

    let e = app.admit("acme", "f.a").await;
    assert_eq!(members(&app, s.tenants()).await, ["acme".to_owned()].into());
    assert_eq!(members(&app, s.flows(&t)).await, ["f.a".to_owned()].into());
    let (listed, total) = queued_listing(&app, "acme").await;
    assert_eq!(total, 1);
    assert_eq!(
        listed,
        [e["execution_id"].as_str().unwrap().to_owned()].into()
    );
}

/// An admission settled as abandoned (abandon.lua ran first, as when the settling call
/// overtakes it) refuses and writes nothing, although the admission no longer looks for a
/// void marker unless its tenant's `void_until` says one may exist; the tenant's other
/// admissions go on. The library is called directly (FCALL), so which call runs first is
/// fixed, not raced; on a standalone Redis (the scripts are the same on a cluster).
#[tokio::test]
async fn an_abandoned_admission_stays_unadmitted_and_its_tenant_admits_others() {
    let redis = TestRedis::start_standalone().await;
    let mut c = redis.conn().await;
    sluice::store::load_library(&mut c).await.unwrap();
    let s = crate::helpers::shard_no(3);
    let acme = TenantId::parse("acme").unwrap();
    let fcall = |op: &'static str, keys: Vec<Vec<u8>>, args: Vec<Vec<u8>>| {
        let redis = &redis;
        async move {
            let mut c = redis.conn().await;
            redis::cmd("FCALL")
                .arg(format!("{}_{op}", sluice::store::library_name()))
                .arg(keys.len())
                .arg(keys)
                .arg(args)
                .query_async::<RedisValue>(&mut c)
                .await
                .unwrap()
        }
    };
    // The tenant admitted before: its cfg exists, without `void_until`.
    let first = ExecutionId::new();
    let (k, a) = crate::fences::admit_call(s, s, &first);
    let k = k.into_iter().map(Into::into).collect();
    assert_eq!(crate::fences::admit_tag(fcall("admit", k, a).await), "new");

    let lost = ExecutionId::new();
    let mut args: Vec<Vec<u8>> = vec![
        s.prefix().into(),
        "10".into(),
        "100".into(),
        "60".into(),
        "60".into(),
    ];
    // The id in its stored form, as the store sends it.
    args.extend([
        "acme".into(),
        s.stored_id(&lost).as_ref().to_vec(),
        "300".into(),
    ]);
    let settled = fcall(
        "abandon",
        vec![
            s.frozen().into(),
            s.row(&lost),
            s.void(&lost),
            s.tenant_config(&acme).into(),
        ],
        args,
    )
    .await;
    let settled: Vec<String> = redis::from_redis_value(settled).unwrap();
    assert_eq!(settled, ["void"]);
    let until: u64 = redis
        .query(
            redis::cmd("HGET")
                .arg(s.tenant_config(&acme))
                .arg("void_until"),
        )
        .await;
    let ttl: i64 = redis.query(redis::cmd("PTTL").arg(s.void(&lost))).await;
    assert!(ttl > 0 && ttl <= 300_000, "{ttl}");
    let expires: u64 = redis
        .query(redis::cmd("PEXPIRETIME").arg(s.void(&lost)))
        .await;
    assert_eq!(until, expires, "void_until is the marker's own expiry");

    // The late admission: refused, nothing written.
    let before = redis.keys().await;
    let (k, a) = crate::fences::admit_call(s, s, &lost);
    let k = k.into_iter().map(Into::into).collect();
    assert_eq!(crate::fences::admit_tag(fcall("admit", k, a).await), "void");
    assert_eq!(
        redis.keys().await,
        before,
        "a void admission wrote something"
    );
    let row: bool = redis.query(redis::cmd("EXISTS").arg(s.row(&lost))).await;
    assert!(!row);

    // Another admission of the tenant, while `void_until` is ahead: admitted.
    let other = ExecutionId::new();
    let (k, a) = crate::fences::admit_call(s, s, &other);
    let k = k.into_iter().map(Into::into).collect();
    assert_eq!(crate::fences::admit_tag(fcall("admit", k, a).await), "new");
    let row: bool = redis.query(redis::cmd("EXISTS").arg(s.row(&other))).await;
    assert!(row);
}
