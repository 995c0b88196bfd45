//! sluice's Lua as one Redis Functions library: a master that lost it (`FUNCTION FLUSH`, a
//! restart without persistence, a master that never had it) gets it again from the first call
//! that finds it missing, and no request fails; the libraries of other builds are deleted only
//! once no process of theirs has said it runs for the grace period.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;
use tokio::sync::Barrier;

use crate::helpers::TestApp;

/// The library names each master holds (`FUNCTION LIST`), master by master.
async fn libraries_per_master(app: &TestApp) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for i in 0..app.redis.masters() {
        let mut c = app.redis.node_conn(i).await;
        let list: redis::Value = redis::cmd("FUNCTION")
            .arg("LIST")
            .query_async(&mut c)
            .await
            .unwrap();
        let mut names = Vec::new();
        if let redis::Value::Array(libs) = list {
            for lib in libs {
                let fields: Vec<redis::Value> = match lib {
                    redis::Value::Array(f) => f,
                    redis::Value::Map(p) => p.into_iter().flat_map(|(k, v)| [k, v]).collect(),
                    _ => continue,
                };
                for w in fields.windows(2) {
                    if let (redis::Value::BulkString(k), redis::Value::BulkString(v)) =
                        (&w[0], &w[1])
                        && k == b"library_name"
                    {
                        names.push(String::from_utf8(v.clone()).unwrap());
                    }
                }
            }
        }
        names.sort();
        out.push(names);
    }
    out
}

/// `FUNCTION LOAD` calls per master since the last `reset_stats`.
async fn loads_per_master(app: &TestApp) -> Vec<u64> {
    let mut out = Vec::new();
    for i in 0..app.redis.masters() {
        let mut c = app.redis.node_conn(i).await;
        let text: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut c)
            .await
            .unwrap();
        let n = text
            .lines()
            .find_map(|l| l.strip_prefix("cmdstat_function|load:"))
            .and_then(|s| s.split(',').find_map(|kv| kv.strip_prefix("calls=")))
            .map_or(0, |n| n.parse().unwrap());
        out.push(n);
    }
    out
}

/// Every master flushed of its functions between two rounds of admissions: the first call on
/// each master finds its function missing, loads the library and repeats, so every one of 48
/// concurrent admissions (over many tenants, so over every master) is answered 201, each is
/// admitted exactly once, and every master holds the library again.
#[tokio::test]
async fn a_function_flush_between_admissions_fails_no_request() {
    let app = TestApp::spawn().await;
    let own = sluice::store::library_name();
    let first = app.admit("before", "demo.echo").await;
    assert_eq!(first["status"], "queued");

    let _: () = app.redis.query(redis::cmd("FUNCTION").arg("FLUSH")).await;
    for (m, libs) in libraries_per_master(&app).await.iter().enumerate() {
        assert!(libs.is_empty(), "master {m} still holds {libs:?}");
    }
    app.redis.reset_stats().await;

    const N: usize = 48;
    let barrier = std::sync::Arc::new(Barrier::new(N));
    let mut tasks = Vec::new();
    for i in 0..N {
        let req = app
            .as_tenant(
                reqwest::Method::POST,
                "/api/executions",
                &format!("t{}", i % 16),
            )
            .header("Idempotency-Key", format!("k{i}"))
            .json(&json!({"flow_id": "demo.echo"}));
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let res = req.send().await.unwrap();
            let status = res.status();
            let body: serde_json::Value = res.json().await.unwrap();
            (status, body)
        }));
    }
    let mut ids = std::collections::BTreeSet::new();
    for t in tasks {
        let (status, body) = t.await.unwrap();
        assert_eq!(status, StatusCode::CREATED, "{body}");
        ids.insert(body["execution_id"].as_str().unwrap().to_owned());
    }
    assert_eq!(ids.len(), N, "one new execution per admission");
    let mut total = 0;
    for t in 0..16 {
        total += app.page(&format!("t{t}"), "").await["total"]
            .as_u64()
            .unwrap();
    }
    assert_eq!(total, N as u64, "every admission wrote its execution once");
    // The library is back on every master, by a load the calls themselves made.
    for (m, libs) in libraries_per_master(&app).await.iter().enumerate() {
        assert!(libs.contains(&own.to_owned()), "master {m} holds {libs:?}");
    }
    let loads = loads_per_master(&app).await;
    assert!(
        loads.iter().all(|n| *n >= 1),
        "FUNCTION LOAD per master: {loads:?}"
    );
    // Readiness agrees.
    let res = app.client.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
}

/// A tiny library named like another build's, with one function.
fn other_build(name: &str) -> String {
    format!(
        "#!lua name={name}\nredis.register_function{{function_name = '{name}_ping', \
         flags = {{ 'no-writes' }}, callback = function() return 'pong' end}}\n"
    )
}

/// Redis's clock, ms.
async fn redis_ms(app: &TestApp) -> u64 {
    let (s, us): (u64, u64) = app.redis.query(&mut redis::cmd("TIME")).await;
    s * 1000 + us / 1000
}

/// Another build's library stays while a process of that build says it runs, and goes (from
/// every master) once it has been silent for longer than the grace; one never recorded gets
/// its grace from the moment it is seen. This build's own library is never touched, and the
/// store keeps serving.
#[tokio::test]
async fn a_library_of_another_build_is_left_alone_while_in_use() {
    let app = TestApp::spawn().await;
    let store = app.store().await;
    let own = sluice::store::library_name().to_owned();
    let grace = Duration::from_secs(3600);
    let (older, unknown) = ("sluice_0123456789ab", "sluice_fedcba987654");
    for name in [older, unknown] {
        let _: redis::Value = app
            .redis
            .query(redis::cmd("FUNCTION").arg("LOAD").arg(other_build(name)))
            .await;
    }
    let libraries = sluice::store::keys::libraries();
    // The older build runs: one of its processes spoke a minute ago.
    let now = redis_ms(&app).await;
    let _: i64 = app
        .redis
        .query(
            redis::cmd("HSET")
                .arg(libraries)
                .arg(older)
                .arg(now - 60_000),
        )
        .await;

    let deleted = store.retire_libraries(grace).await.unwrap();
    assert!(deleted.is_empty(), "{deleted:?}");
    for (m, libs) in libraries_per_master(&app).await.iter().enumerate() {
        for name in [older, unknown, own.as_str()] {
            assert!(
                libs.contains(&name.to_owned()),
                "master {m} lost {name}: {libs:?}"
            );
        }
    }
    // The one nobody recorded now has its first sighting.
    let seen: Option<u64> = app
        .redis
        .query(redis::cmd("HGET").arg(libraries).arg(unknown))
        .await;
    assert!(seen.is_some_and(|at| at >= now), "{seen:?}");
    // Its functions still answer: a process of that build would not notice anything.
    let pong: String = app
        .redis
        .query(redis::cmd("FCALL_RO").arg(format!("{older}_ping")).arg(0))
        .await;
    assert_eq!(pong, "pong");

    // The older build's last process stopped two hours ago.
    let _: i64 = app
        .redis
        .query(
            redis::cmd("HSET")
                .arg(libraries)
                .arg(older)
                .arg(now - 2 * 3_600_000),
        )
        .await;
    let deleted = store.retire_libraries(grace).await.unwrap();
    assert_eq!(deleted, vec![older.to_owned()]);
    for (m, libs) in libraries_per_master(&app).await.iter().enumerate() {
        assert!(
            !libs.contains(&older.to_owned()),
            "master {m} keeps {older}: {libs:?}"
        );
        assert!(
            libs.contains(&own),
            "master {m} lost this build's library: {libs:?}"
        );
        assert!(libs.contains(&unknown.to_owned()), "master {m}: {libs:?}");
    }
    let record: Option<u64> = app
        .redis
        .query(redis::cmd("HGET").arg(libraries).arg(older))
        .await;
    assert_eq!(record, None, "the record goes with the library");
    // This build's record says it runs (the store announced it at connect).
    let mine: Option<u64> = app
        .redis
        .query(redis::cmd("HGET").arg(libraries).arg(&own))
        .await;
    assert!(mine.is_some(), "this build never said it runs");
    // And the store serves on.
    let e = app.admit("after", "demo.echo").await;
    assert_eq!(e["status"], "queued");
}

#[tokio::test]
async fn a_call_reads_the_limits_written_since_the_call_before() {
    // The library's locals outlive a call; begin_call() sets the per-call ones afresh (lazily:
    // a table only when the call before left something in it). An admission remembers its
    // tenant's limits for the rest of its call; the next call must read them again.
    let redis = crate::helpers::TestRedis::start_standalone().await;
    let mut c = redis.conn().await;
    sluice::store::load_library(&mut c).await.unwrap();
    let admit = format!("{}_admit", sluice::store::library_name());
    let s = crate::helpers::shard_no(2);
    let tag = crate::fences::admit_tag;
    let call = |id: sluice::domain::ExecutionId| {
        let (k, a) = crate::fences::admit_call(s, s, &id);
        let mut cmd = redis::cmd("FCALL");
        cmd.arg(&admit).arg(k.len()).arg(k).arg(a);
        cmd
    };
    let first: redis::Value = call(sluice::domain::ExecutionId::new())
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(tag(first), "new");
    // Another writer lowers the tenant's max_queued to the one it has queued.
    let cfg = s.tenant_config(&sluice::domain::TenantId::parse("acme").unwrap());
    let () = redis::cmd("HSET")
        .arg(&cfg)
        .arg("max_queued")
        .arg(1)
        .query_async(&mut c)
        .await
        .unwrap();
    let second: redis::Value = call(sluice::domain::ExecutionId::new())
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(
        tag(second),
        "full",
        "the call used the limits of the call before"
    );
}
