//! Fair, prioritized and scheduled dispatch (docs/api.md, "Admission control"): tenants of a
//! shard get starts in proportion to their weights, a calm tenant that arrives behind a flood
//! starts at the next free slot, priorities order a tenant's own executions, scheduled
//! executions never start early and can be moved, and a Redis written by the stream-model
//! build is migrated without losing or repeating anything.
//!
//! Long on purpose: a list of independent tests of one dispatch model (weights, priorities,
//! schedules), each measuring the model from the start log; splitting them would scatter one
//! contract.

use std::collections::HashMap;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{FAST_WORKER, TestApp, TestWorker, problem_code};

/// The virtual time one start costs a tenant of weight 1 (`QUANTUM` in common.lua).
const QUANTUM: f64 = 1000.0;

/// `POST /api/executions/{id}/reschedule` as tenant acme.
async fn reschedule(app: &TestApp, id: &str, body: &Value) -> reqwest::Response {
    app.as_tenant(
        reqwest::Method::POST,
        &format!("/api/executions/{id}/reschedule"),
        "acme",
    )
    .json(body)
    .send()
    .await
    .unwrap()
}

/// A tenant name other than `of` that lives in the same shard as `of`.
fn neighbour_of(app: &TestApp, of: &str, prefix: &str) -> String {
    (0..10_000)
        .map(|i| format!("{prefix}-{i}"))
        .find(|t| app.shard(t) == app.shard(of))
        .expect("a tenant in the same shard")
}

/// The start log of `tenant`'s shard with each start's Redis time (ms): (ms, tenant, tag).
async fn timed_start_log(app: &TestApp, tenant: &str) -> Vec<(u64, String, f64)> {
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
        .map(|(id, fields)| {
            let get = |name: &str| {
                fields
                    .chunks(2)
                    .find(|f| f[0] == name)
                    .map(|f| f[1].clone())
                    .unwrap()
            };
            let ms = id.split('-').next().unwrap().parse().unwrap();
            (ms, get("t"), get("vt").parse().unwrap())
        })
        .collect()
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

/// The start log is kept only when `serve` is asked to (`--start-log`, off by default), and a
/// `sluice worker` follows what `serve` published: without it the worker starts and completes
/// every execution (its completions chaining the next starts) and the shard holds no start
/// log; with it (no flag given to the worker) each start, chained or not, is one entry.
#[tokio::test]
async fn start_log_is_kept_only_when_asked() {
    const N: usize = 12;
    for keep in [false, true] {
        let app = TestApp::spawn_with(|c| c.api.start_log = keep).await;
        for i in 0..N {
            app.admit_with("acme", json!({"flow_id": "demo.echo", "params": {"i": i}}))
                .await;
        }
        let _w = TestWorker::spawn(&app.redis, &["--concurrency", "2"]);
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while app.page("acme", "status=completed&limit=1").await["total"] != N {
            assert!(std::time::Instant::now() < deadline, "not all completed");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let exists: u8 = app
            .redis
            .query(redis::cmd("EXISTS").arg(app.shard("acme").starts()))
            .await;
        let log = app.start_log("acme").await;
        if keep {
            assert_eq!(log.len(), N, "one entry per start: {log:?}");
            assert!(log.iter().all(|(t, _, w)| t == "acme" && *w == 1));
        } else {
            assert_eq!(exists, 0, "a start log without --start-log: {log:?}");
        }
    }
}

/// Two backlogged tenants of one shard, weights 3 and 1: the start log shows start-time fair
/// queueing at work. The virtual start tags of successive starts never go down; each tenant's
/// own tags advance by exactly QUANTUM / weight per start; and at every point while both had
/// work, their starts divided by their weights differ by at most one quantum of each
/// (1/3 + 1/1) — so the heavy tenant gets three starts of every four.
#[tokio::test]
async fn starts_go_to_backlogged_tenants_in_proportion_to_their_weights() {
    let app = TestApp::spawn().await;
    let heavy = "heavy";
    let light = neighbour_of(&app, heavy, "light");
    app.put_tenant(heavy, &json!({"weight": 3})).await;
    let t = app.put_tenant(&light, &json!({"weight": 1})).await;
    assert_eq!(t["weight"], 1);
    const EACH: usize = 120;
    for i in 0..EACH {
        for tenant in [heavy, light.as_str()] {
            app.admit_with(tenant, json!({"flow_id": "demo.echo", "params": {"i": i}}))
                .await;
        }
    }
    let _w = TestWorker::spawn(&app.redis, &["--concurrency", "4"]);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while app.page(heavy, "status=completed&limit=1").await["total"] != EACH
        || app.page(&light, "status=completed&limit=1").await["total"] != EACH
    {
        assert!(std::time::Instant::now() < deadline, "not all completed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log = app.start_log(heavy).await;
    assert_eq!(log.len(), 2 * EACH, "one log entry per start");
    let weight = HashMap::from([(heavy.to_owned(), 3.0), (light.clone(), 1.0)]);
    let mut last_tag = f64::MIN;
    let mut own_last: HashMap<&str, f64> = HashMap::new();
    let mut count: HashMap<&str, f64> = HashMap::new();
    let mut worst: f64 = 0.0;
    for (tenant, tag, w) in &log {
        assert_eq!(f64::from(*w), weight[tenant], "weight logged for {tenant}");
        assert!(*tag >= last_tag - 1e-6, "start tags went down: {log:?}");
        last_tag = *tag;
        if let Some(prev) = own_last.get(tenant.as_str()) {
            let step = QUANTUM / weight[tenant];
            assert!(
                (tag - prev - step).abs() < 1e-6,
                "{tenant}'s tag advanced by {} instead of {step}",
                tag - prev
            );
        }
        own_last.insert(tenant, *tag);
        *count.entry(tenant).or_default() += 1.0;
        let (h, l) = (
            count.get(heavy).copied(),
            count.get(light.as_str()).copied(),
        );
        // While both have work (neither has run out yet).
        if h.unwrap_or(0.0) < EACH as f64 && l.unwrap_or(0.0) < EACH as f64 {
            worst = worst.max((h.unwrap_or(0.0) / 3.0 - l.unwrap_or(0.0)).abs());
        }
    }
    assert!(
        worst <= 1.0 / 3.0 + 1.0 + 1e-6,
        "normalized starts drifted apart by {worst}"
    );
    let first: Vec<&str> = log[..80].iter().map(|(t, _, _)| t.as_str()).collect();
    let heavy_share = first.iter().filter(|t| **t == heavy).count();
    assert!(
        (59..=61).contains(&heavy_share),
        "{heavy_share} of the first 80 starts went to the weight-3 tenant"
    );
}

/// A tenant that arrives behind another's flood, in the same shard, starts at the next start
/// the shard makes: it comes in at the shard's clock, below the flood's virtual time. From the
/// start log: after a calm execution's admission (Redis time), no flood execution starts
/// before it.
#[tokio::test]
async fn a_calm_tenant_behind_a_flood_starts_at_the_next_free_slot() {
    let app = TestApp::spawn().await;
    let flood = "flood";
    let calm = neighbour_of(&app, flood, "calm");
    app.put_tenant(flood, &json!({"max_concurrent": 1000}))
        .await;
    let mut flood_ids = Vec::new();
    for i in 0..150 {
        flood_ids.push(
            app.admit_with(
                flood,
                json!({"flow_id": "demo.sleep", "params": {"ms": 20, "i": i}}),
            )
            .await,
        );
    }
    let _w = TestWorker::spawn(&app.redis, &["--concurrency", "2"]);
    // The flood is under way: its first execution started (at 20 ms it may be over by the
    // time anyone looks, so waiting to see it running could miss it).
    app.wait_for(
        flood,
        &flood_ids[0],
        Duration::from_secs(15),
        "a start",
        |e| !e["started_at"].is_null(),
    )
    .await;
    let mut calm_ids = Vec::new();
    for i in 0..5 {
        let id = app
            .admit_with(&calm, json!({"flow_id": "demo.echo", "params": {"i": i}}))
            .await;
        app.wait_terminal(&calm, &id, Duration::from_secs(20)).await;
        calm_ids.push(id);
    }
    let log = timed_start_log(&app, flood).await;
    // The calm executions ran one after the other: the k-th calm start of the log is theirs.
    let calm_starts: Vec<usize> = (0..log.len()).filter(|i| log[*i].1 == calm).collect();
    assert_eq!(calm_starts.len(), calm_ids.len());
    for (id, &at) in calm_ids.iter().zip(&calm_starts) {
        let e = app.execution(&calm, id).await;
        assert_eq!(e["status"], "completed");
        let (created, started) = (ms_of(&e["created_at"]), ms_of(&e["started_at"]));
        let overtaking: Vec<_> = log[..at]
            .iter()
            .filter(|(ms, t, _)| t == flood && *ms > created)
            .collect();
        assert!(
            overtaking.is_empty(),
            "flood starts after the calm admission at {created} and before its start at \
             {started}: {overtaking:?}"
        );
        // The flood was still going: fairness, not an idle worker, let it through.
        assert!(
            log[at + 1..].iter().any(|(_, t, _)| t == flood),
            "the flood had ended"
        );
    }
}

/// Priorities order a tenant's own executions: by the time each became runnable shifted by
/// a minute per priority step, FIFO within a priority, never re-ordered later. What starts
/// first is what the queue says; `queue_state` says which are within the free slots.
#[tokio::test]
async fn priorities_order_a_tenants_executions_and_fifo_holds_within_one() {
    let app = TestApp::spawn().await;
    app.put_tenant("acme", &json!({"max_concurrent": 2})).await;
    let mut by_priority = Vec::new();
    for p in [5, 3, 1, 3, 2] {
        let res = app
            .post_execution("acme", &json!({"flow_id": "demo.echo", "priority": p}))
            .await;
        assert_eq!(res.status(), StatusCode::CREATED);
        let e: Value = res.json().await.unwrap();
        assert_eq!(e["priority"], p);
        by_priority.push((p, e["execution_id"].as_str().unwrap().to_owned()));
    }
    let id = |i: usize| by_priority[i].1.clone();
    // p1, p2, then the two p3 in admission order, then p5.
    let expected = vec![id(2), id(4), id(1), id(3), id(0)];
    assert_eq!(app.queue_ids("acme").await, expected);
    for (rank, id) in expected.iter().enumerate() {
        let e = app.execution("acme", id).await;
        let want = if rank < 2 { "ready" } else { "waiting" };
        assert_eq!(e["queue_state"], want, "rank {rank}: {e}");
    }
    // The default is 3.
    let res = app
        .post_execution("acme", &json!({"flow_id": "demo.echo"}))
        .await;
    assert_eq!(res.json::<Value>().await.unwrap()["priority"], 3);
    for bad in [json!(0), json!(6), json!(2.5), json!("1")] {
        let res = app
            .post_execution("acme", &json!({"flow_id": "demo.echo", "priority": bad}))
            .await;
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "priority {bad}");
    }
    // One worker slot: they start in the queue's order.
    let _w = TestWorker::spawn(&app.redis, &["--concurrency", "1"]);
    let mut started = Vec::new();
    for id in &expected {
        let e = app.wait_terminal("acme", id, Duration::from_secs(20)).await;
        started.push((ms_of(&e["started_at"]), e["priority"].as_u64().unwrap()));
    }
    let mut sorted = started.clone();
    sorted.sort();
    assert_eq!(started, sorted, "started out of queue order");
}

/// `run_at`/`delay`: a scheduled execution is queued / scheduled, holds its dedup key (a
/// retried request is a replay), counts toward `max_queued`, is listed with the
/// `queue_state=scheduled` filter, can be cancelled and rescheduled, and never starts before
/// its due time (Redis's clock on both sides).
#[tokio::test]
async fn scheduled_executions_wait_their_time_and_can_be_moved() {
    let app = TestApp::spawn().await;
    let _w = TestWorker::spawn(&app.redis, FAST_WORKER);
    // Bad schedules.
    for (body, code) in [
        (
            json!({"flow_id": "demo.echo", "delay": "1s", "run_at": "2026-01-01T00:00:00Z"}),
            "invalid_schedule",
        ),
        (
            json!({"flow_id": "demo.echo", "delay": "366d"}),
            "invalid_delay",
        ),
        (
            json!({"flow_id": "demo.echo", "delay": "soon"}),
            "invalid_delay",
        ),
        (
            json!({"flow_id": "demo.echo", "run_at": "2999-01-01T00:00:00Z"}),
            "invalid_run_at",
        ),
        (
            json!({"flow_id": "demo.echo", "run_at": "noon"}),
            "invalid_run_at",
        ),
    ] {
        let res = app.post_execution("acme", &body).await;
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(problem_code(res).await, code, "{body}");
    }
    // A time that has passed means now.
    let past = app
        .admit_with(
            "acme",
            json!({"flow_id": "demo.echo", "run_at": "2020-01-01T00:00:00Z"}),
        )
        .await;
    assert_eq!(
        app.wait_terminal("acme", &past, Duration::from_secs(10))
            .await["status"],
        "completed"
    );

    // Twenty due over the next ~1.5 s: none starts early.
    let mut due = Vec::new();
    for i in 0..20u64 {
        let res = app
            .post_execution(
                "acme",
                &json!({"flow_id": "demo.echo", "delay": format!("{}ms", 300 + 60 * i)}),
            )
            .await;
        assert_eq!(res.status(), StatusCode::CREATED);
        let e: Value = res.json().await.unwrap();
        assert_eq!(e["queue_state"], "scheduled", "{e}");
        assert_eq!(
            ms_of(&e["run_at"]),
            ms_of(&e["created_at"]) + 300 + 60 * i,
            "{e}"
        );
        due.push(e["execution_id"].as_str().unwrap().to_owned());
    }
    // Held back from the tenant's order, listed as scheduled (some may be due already).
    let listed = app.page("acme", "queue_state=scheduled&limit=200").await;
    assert!(listed["total"].as_u64().unwrap() <= 20, "{listed}");
    assert!(
        listed["executions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["queue_state"] == "scheduled"),
        "{listed}"
    );
    for id in &due {
        let e = app.wait_terminal("acme", id, Duration::from_secs(15)).await;
        assert_eq!(e["status"], "completed", "{e}");
        assert!(
            ms_of(&e["started_at"]) >= ms_of(&e["run_at"]),
            "started before its time: {e}"
        );
    }

    // Holds its dedup key: the same request again (a client's retry) is a replay, even with
    // another delay; other params under the key are a conflict.
    let body = json!({"flow_id": "demo.echo", "params": {"n": 1}, "delay": "1h"});
    let first = app.post_with_key("acme", "later-1", &body).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let first: Value = first.json().await.unwrap();
    let again = app
        .post_with_key(
            "acme",
            "later-1",
            &json!({"flow_id": "demo.echo", "params": {"n": 1}, "delay": "2h"}),
        )
        .await;
    assert_eq!(again.status(), StatusCode::OK);
    let again: Value = again.json().await.unwrap();
    assert_eq!(again["execution_id"], first["execution_id"]);
    assert_eq!(
        again["run_at"], first["run_at"],
        "the first admission's schedule"
    );
    let other = app
        .post_with_key(
            "acme",
            "later-1",
            &json!({"flow_id": "demo.echo", "params": {"n": 2}, "delay": "1h"}),
        )
        .await;
    assert_eq!(other.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let later = first["execution_id"].as_str().unwrap().to_owned();
    assert_eq!(app.usage("acme").await["scheduled"], 1);
    let listed = app.page("acme", "queue_state=scheduled").await;
    assert_eq!(listed["total"], 1, "{listed}");
    assert_eq!(listed["executions"][0]["execution_id"], later.as_str());

    // Counts toward max_queued: with one queued (the scheduled one), a limit of 1 refuses.
    app.put_tenant("acme", &json!({"max_queued": 1})).await;
    let res = app
        .post_execution("acme", &json!({"flow_id": "demo.echo"}))
        .await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    app.put_tenant("acme", &json!({"max_queued": null})).await;

    // Rescheduled: to later, then to soon; it runs after the new time.
    let moved = reschedule(&app, &later, &json!({"delay": "2h"})).await;
    assert_eq!(moved.status(), StatusCode::OK);
    let moved: Value = moved.json().await.unwrap();
    assert!(ms_of(&moved["run_at"]) > ms_of(&first["run_at"]), "{moved}");
    let soon = reschedule(&app, &later, &json!({"delay": "200ms"})).await;
    assert_eq!(soon.status(), StatusCode::OK);
    let soon: Value = soon.json().await.unwrap();
    assert_eq!(soon["queue_state"], "scheduled");
    let done = app
        .wait_terminal("acme", &later, Duration::from_secs(10))
        .await;
    assert_eq!(done["status"], "completed");
    assert!(
        ms_of(&done["started_at"]) >= ms_of(&soon["run_at"]),
        "{done}"
    );
    // Only while scheduled.
    let res = reschedule(&app, &later, &json!({"delay": "1s"})).await;
    assert_eq!(res.status(), StatusCode::CONFLICT);
    assert_eq!(problem_code(res).await, "not_scheduled");
    for body in [
        json!({}),
        json!({"delay": "1s", "run_at": "2026-01-01T00:00:00Z"}),
    ] {
        let res = reschedule(&app, &later, &body).await;
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "{body}");
    }

    // Cancelled while scheduled: off the timer set, never runs.
    let doomed = app
        .admit_with("acme", json!({"flow_id": "demo.echo", "delay": "300ms"}))
        .await;
    assert_eq!(app.cancel("acme", &doomed).await.status(), StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(600)).await;
    let e = app.execution("acme", &doomed).await;
    assert_eq!(e["status"], "cancelled");
    assert!(e["started_at"].is_null(), "{e}");
    assert_eq!(app.page("acme", "queue_state=scheduled").await["total"], 0);
    let res = app.list("acme", "queue_state=waiting").await;
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    // Filters combine: a scheduled execution is queued, so with another status none matches.
    app.admit_with("acme", json!({"flow_id": "demo.echo", "delay": "1h"}))
        .await;
    assert_eq!(app.page("acme", "queue_state=scheduled").await["total"], 1);
    assert_eq!(
        app.page("acme", "queue_state=scheduled&status=queued")
            .await["total"],
        1
    );
    let none = app
        .page("acme", "queue_state=scheduled&status=running")
        .await;
    assert_eq!(none["total"], 0, "{none}");
}

/// A Redis written by the stream-model build (schema 1) — dispatched executions on the ready
/// stream holding slots, a waiting one, a retry waiting out its backoff with its slot, a
/// running one read by a worker that is gone — is migrated by the first process of this build
/// (also when an earlier run was interrupted), and every execution then runs to the end
/// exactly once more.
#[tokio::test]
async fn a_stream_model_redis_is_migrated_and_nothing_is_lost_or_repeated() {
    if crate::helpers::skipped_at_layout_5("a schema-1 (stream model) Redis") {
        return;
    }
    let app = TestApp::spawn().await;
    let store = app.store().await;
    let tenant = sluice::domain::TenantId::parse("acme").unwrap();
    let s = app.shard("acme");
    let now: u64 = {
        let t: (String, String) = app.redis.query(&mut redis::cmd("TIME")).await;
        t.0.parse::<u64>().unwrap() * 1000 + t.1.parse::<u64>().unwrap() / 1000
    };
    let mut c = app.redis.conn().await;
    let mint = || sluice::domain::ExecutionId::new();
    let row = |id: &sluice::domain::ExecutionId, extra: &[(&str, String)]| {
        let mut cmd = redis::cmd("HSET");
        cmd.arg(s.row(id));
        for (k, v) in [
            ("tenant", "acme".to_owned()),
            (sluice::domain::row::FLOW, "demo.echo".to_owned()),
            (sluice::domain::row::PARAMS, "{}".to_owned()),
            (sluice::domain::row::STATUS, "queued".to_owned()),
            (sluice::domain::row::ATTEMPT, "0".to_owned()),
            (sluice::domain::row::MAX_ATTEMPTS, "3".to_owned()),
            (sluice::domain::row::CREATED, now.to_string()),
            (sluice::domain::row::UPDATED, now.to_string()),
        ]
        .into_iter()
        .chain(extra.iter().map(|(k, v)| (*k, v.clone())))
        {
            // Written by the old names (as that build did), stored by this layout's.
            cmd.arg(sluice::domain::row::compact_name(k).unwrap_or(k))
                .arg(v);
        }
        cmd
    };
    let index = |id: &sluice::domain::ExecutionId, status| {
        let mut p = redis::pipe();
        p.zadd(
            s.listing(&tenant),
            s.listing_member(
                Some(status),
                &sluice::domain::FlowId::parse("demo.echo").unwrap(),
                id,
            ),
            0,
        );
        p
    };
    use sluice::domain::Status;
    let _: () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(s.ready())
        .arg("workers")
        .arg("0")
        .arg("MKSTREAM")
        .query_async(&mut c)
        .await
        .unwrap();
    let _: i64 = redis::cmd("SADD")
        .arg(s.tenants())
        .arg("acme")
        .query_async(&mut c)
        .await
        .unwrap();
    // Two dispatched (on the stream, each holding a slot).
    let mut ids = Vec::new();
    for _ in 0..2 {
        let id = mint();
        let entry: String = redis::cmd("XADD")
            .arg(s.ready())
            .arg("*")
            .arg("id")
            .arg(id.as_str())
            .query_async(&mut c)
            .await
            .unwrap();
        let _: i64 = row(
            &id,
            &[
                (sluice::domain::row::QSTATE, "dispatched".into()),
                (sluice::domain::row::ENTRY, entry.clone()),
            ],
        )
        .query_async(&mut c)
        .await
        .unwrap();
        let _: i64 = redis::cmd("SADD")
            .arg(s.slots(&tenant))
            .arg(id.as_str())
            .query_async(&mut c)
            .await
            .unwrap();
        let _: () = index(&id, Status::Queued)
            .query_async(&mut c)
            .await
            .unwrap();
        ids.push((id, 1));
    }
    // One waiting (FIFO set scored by admission time).
    let waiting = mint();
    let _: i64 = row(&waiting, &[(sluice::domain::row::QSTATE, "waiting".into())])
        .query_async(&mut c)
        .await
        .unwrap();
    let _: i64 = redis::cmd("ZADD")
        .arg(s.waiting(&tenant))
        .arg(now)
        .arg(waiting.as_str())
        .query_async(&mut c)
        .await
        .unwrap();
    let _: () = index(&waiting, Status::Queued)
        .query_async(&mut c)
        .await
        .unwrap();
    ids.push((waiting, 1));
    // One retry waiting out its backoff, holding its slot (attempt 1 failed).
    let retry = mint();
    let _: i64 = row(
        &retry,
        &[
            (sluice::domain::row::QSTATE, "dispatched".into()),
            ("attempt", "1".into()),
            ("fence", "1".into()),
        ],
    )
    .query_async(&mut c)
    .await
    .unwrap();
    let _: i64 = redis::cmd("ZADD")
        .arg(s.delayed())
        .arg(now + 300)
        .arg(retry.as_str())
        .query_async(&mut c)
        .await
        .unwrap();
    let _: i64 = redis::cmd("SADD")
        .arg(s.slots(&tenant))
        .arg(retry.as_str())
        .query_async(&mut c)
        .await
        .unwrap();
    let _: () = index(&retry, Status::Queued)
        .query_async(&mut c)
        .await
        .unwrap();
    ids.push((retry, 2));
    // One running, read by a worker that is gone (its lease runs out soon).
    let running = mint();
    let entry: String = redis::cmd("XADD")
        .arg(s.ready())
        .arg("*")
        .arg("id")
        .arg(running.as_str())
        .query_async(&mut c)
        .await
        .unwrap();
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("workers")
        .arg("gone-worker")
        .arg("STREAMS")
        .arg(s.ready())
        .arg(">")
        .query_async(&mut c)
        .await
        .unwrap();
    // (The read also delivered the two dispatched entries to that consumer: as a stall of the
    // old build could leave them. They stay queued rows, so they are migrated as queued.)
    let _: i64 = row(
        &running,
        &[
            ("status", "running".into()),
            ("attempt", "1".into()),
            ("fence", "1".into()),
            ("entry", entry),
            ("lease_owner", "gone-worker".into()),
            ("lease_until", (now + 1500).to_string()),
            ("started", now.to_string()),
        ],
    )
    .query_async(&mut c)
    .await
    .unwrap();
    let _: i64 = redis::cmd("ZADD")
        .arg(s.leases())
        .arg(now + 1500)
        .arg(running.as_str())
        .query_async(&mut c)
        .await
        .unwrap();
    let _: i64 = redis::cmd("SADD")
        .arg(s.slots(&tenant))
        .arg(running.as_str())
        .query_async(&mut c)
        .await
        .unwrap();
    let _: () = index(&running, Status::Running)
        .query_async(&mut c)
        .await
        .unwrap();
    ids.push((running.clone(), 2));
    // This Redis says schema 1 (no field).
    let _: i64 = redis::cmd("HDEL")
        .arg(sluice::store::keys::meta())
        .arg("schema")
        .query_async(&mut c)
        .await
        .unwrap();

    // A first run is interrupted after two calls of one member each.
    let first = store.migrate_dispatch(1, 2).await.unwrap();
    assert!(!first.done);
    let schema: Option<u32> = app
        .redis
        .query(
            redis::cmd("HGET")
                .arg(sluice::store::keys::meta())
                .arg("schema"),
        )
        .await;
    assert_eq!(schema, None, "an interrupted migration is not recorded");
    // The next process of this build finishes it at connect.
    let _store = app.store().await;
    let schema: Option<u32> = app
        .redis
        .query(
            redis::cmd("HGET")
                .arg(sluice::store::keys::meta())
                .arg("schema"),
        )
        .await;
    assert_eq!(schema, Some(sluice::store::SCHEMA));
    let stream: i64 = app.redis.query(redis::cmd("EXISTS").arg(s.ready())).await;
    assert_eq!(stream, 0, "the ready stream is gone");
    let slots: Vec<String> = app
        .redis
        .query(redis::cmd("SMEMBERS").arg(s.slots(&tenant)))
        .await;
    assert_eq!(
        slots,
        [running.to_string()],
        "only the running one holds a slot"
    );
    let held: Vec<String> = app
        .redis
        .query(redis::cmd("SMEMBERS").arg(s.held("gone-worker")))
        .await;
    assert_eq!(held, [running.to_string()]);
    assert_eq!(
        app.execution("acme", &ids[3].0.to_string()).await["queue_state"],
        "scheduled"
    );

    // Everything runs once more: the running one after its lease ran out (a counted attempt),
    // the retry after its backoff.
    let _w = TestWorker::spawn(&app.redis, FAST_WORKER);
    for (id, attempt) in &ids {
        let e = app
            .wait_terminal("acme", id.as_str(), Duration::from_secs(20))
            .await;
        assert_eq!(e["status"], "completed", "{e}");
        assert_eq!(e["attempt"], *attempt, "{e}");
    }
    assert_eq!(app.counter("completed").await, ids.len() as u64);
    assert_eq!(
        app.usage("acme").await,
        json!({"running": 0, "waiting": 0, "scheduled": 0})
    );
}

/// A weight is an integer from 1 to 1000; anything else is refused before anything is written
/// (a tenant that did not exist is not registered by a refused request), and `null` restores
/// the default, 1.
#[tokio::test]
async fn a_weight_out_of_range_is_refused_and_registers_nothing() {
    let app = TestApp::spawn().await;
    for bad in [json!(0), json!(1001), json!(2.5), json!("3")] {
        let res = app
            .client
            .put(app.url("/api/tenants/newcomer"))
            .bearer_auth(crate::helpers::ADMIN_TOKEN)
            .json(&json!({"weight": bad}))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "weight {bad}");
    }
    let registered: Option<f64> = app
        .redis
        .query(
            redis::cmd("ZSCORE")
                .arg(sluice::store::keys::tenants())
                .arg("newcomer"),
        )
        .await;
    assert_eq!(registered, None, "a refused PUT registered it");
    assert_eq!(
        app.put_tenant("newcomer", &json!({"weight": 1000})).await["weight"],
        1000
    );
    assert_eq!(
        app.put_tenant("newcomer", &json!({"weight": null})).await["weight"],
        1
    );
}

/// The `weight` field of a shard's fair-share bookkeeping: its runnable tenants' weights.
async fn eligible_weight(app: &TestApp, shard: sluice::store::Shard) -> i64 {
    let w: Option<i64> = app
        .redis
        .query(redis::cmd("HGET").arg(shard.sched()).arg("weight"))
        .await;
    w.unwrap_or(0)
}

/// The shard's eligible weight (what workers share their slots by) follows the runnable
/// tenants' weights through every change: a weight set while runnable, its work cancelled
/// (nothing runnable), a tenant deleted with work queued (it leaves the runnable set with its
/// weight at once).
#[tokio::test]
async fn the_shards_eligible_weight_follows_its_runnable_tenants() {
    let app = TestApp::spawn().await;
    let shard = app.shard("acme");
    app.put_tenant("acme", &json!({"weight": 5})).await;
    assert_eq!(
        eligible_weight(&app, shard).await,
        0,
        "nothing runnable yet"
    );
    let id = app
        .admit_with("acme", json!({"flow_id": "demo.echo"}))
        .await;
    assert_eq!(eligible_weight(&app, shard).await, 5);
    app.put_tenant("acme", &json!({"weight": 8})).await;
    assert_eq!(eligible_weight(&app, shard).await, 8);
    assert_eq!(app.cancel("acme", &id).await.status(), StatusCode::OK);
    assert_eq!(eligible_weight(&app, shard).await, 0, "nothing runnable");
    app.admit_with("acme", json!({"flow_id": "demo.echo"}))
        .await;
    assert_eq!(eligible_weight(&app, shard).await, 8);
    let res = app
        .client
        .delete(app.url("/api/tenants/acme"))
        .bearer_auth(crate::helpers::ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        eligible_weight(&app, shard).await,
        0,
        "a deleted tenant is not runnable"
    );
}
