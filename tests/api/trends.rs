//! Trends: the per-minute counters the scripts keep (admissions, starts, completions,
//! failures, cancellations, waiting time) read back through `GET /api/tenants/{tenant}/trends`
//! and `GET /api/trends`, the tenants with work now (registered or not), the bytes a tenant's
//! day of counters costs on Redis, and who may read them.
//!
//! Long on purpose: a list of independent tests of one set of counters, read back through each
//! of their endpoints.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::fences::eval;
use crate::helpers::{ADMIN_TOKEN, FAST_WORKER, TestApp, TestWorker, problem_code};
use sluice::domain::TenantId;
use sluice::store::composed_source;

impl TestApp {
    /// `GET /api/tenants/{tenant}/trends` as the platform admin.
    async fn tenant_trends(&self, tenant: &str, query: &str) -> Value {
        let res = self
            .client
            .get(self.url(&format!("/api/tenants/{tenant}/trends{query}")))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        res.json().await.unwrap()
    }

    /// `GET /api/trends` as the platform admin.
    async fn trends(&self) -> Value {
        let res = self
            .client
            .get(self.url("/api/trends"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        res.json().await.unwrap()
    }

    /// Admits `flow` with `params`; returns the id.
    async fn admit_params(&self, tenant: &str, flow: &str, params: Value) -> String {
        self.admit_with(
            tenant,
            json!({"flow_id": flow, "params": params, "max_attempts": 1}),
        )
        .await
    }
}

/// The five totals of a series, in the order admissions, starts, completions, failures,
/// cancellations.
fn totals(series: &Value) -> [u64; 5] {
    let t = &series["totals"];
    [
        "admissions",
        "starts",
        "completions",
        "failures",
        "cancellations",
    ]
    .map(|k| t[k].as_u64().unwrap_or_else(|| panic!("{k}: {t}")))
}

/// The sum of one per-minute array: it must agree with the total.
fn summed(series: &Value, name: &str) -> u64 {
    series[name]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .sum()
}

/// The tenants with work now, as (id, registered, queued, running).
fn with_work(trends: &Value) -> Vec<(String, bool, u64, u64)> {
    trends["tenants_with_work"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            (
                w["tenant_id"].as_str().unwrap().to_owned(),
                w["registered"].as_bool().unwrap(),
                w["queued"].as_u64().unwrap(),
                w["running"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[tokio::test]
async fn every_admission_start_and_end_is_counted_once_per_tenant_and_in_the_sum() {
    let app = TestApp::spawn().await;
    app.put_tenant("acme", &json!({})).await;

    // Before any worker runs: two queued executions cancelled (cancel.lua), one admission
    // repeated with its dedup key (a replay, not an admission).
    let mut cancelled = Vec::new();
    for _ in 0..2 {
        cancelled.push(app.admit_params("acme", "demo.echo", json!({})).await);
    }
    for id in &cancelled {
        assert_eq!(app.cancel("acme", id).await.status(), StatusCode::OK);
    }
    for expected in [StatusCode::CREATED, StatusCode::OK] {
        let res = app
            .post_with_key("acme", "once", &json!({"flow_id": "demo.echo"}))
            .await;
        assert_eq!(res.status(), expected);
    }
    // Then: 4 more that complete, 3 that fail for good, 1 that is cancelled while running, and
    // 2 of another (unregistered) tenant.
    let mut ends = Vec::new();
    for _ in 0..4 {
        ends.push((
            "acme",
            app.admit_params("acme", "demo.echo", json!({})).await,
        ));
    }
    // One retryable (dead-lettered: its one attempt is spent), two not.
    for i in 0..3 {
        let p = json!({"retryable": i == 0});
        ends.push(("acme", app.admit_params("acme", "demo.fail", p).await));
    }
    let long = app
        .admit_params("acme", "demo.sleep", json!({"ms": 60_000}))
        .await;
    for _ in 0..2 {
        ends.push((
            "beta",
            app.admit_params("beta", "demo.echo", json!({})).await,
        ));
    }
    // While they are queued, both tenants have work, whether registered or not.
    let now = with_work(&app.trends().await);
    assert_eq!(
        now,
        vec![
            ("acme".to_owned(), true, 9, 0),
            ("beta".to_owned(), false, 2, 0)
        ]
    );

    let _worker = TestWorker::spawn(&app.redis, FAST_WORKER);
    for (t, id) in &ends {
        app.wait_terminal(t, id, Duration::from_secs(30)).await;
    }
    app.wait_running("acme", &long, 1).await;
    assert_eq!(app.cancel("acme", &long).await.status(), StatusCode::OK);
    let e = app
        .wait_terminal("acme", &long, Duration::from_secs(30))
        .await;
    assert_eq!(e["status"], "cancelled");

    // acme: 2 + 1 + 4 + 3 + 1 = 11 admitted; 1 + 4 + 3 + 1 = 9 started (the two cancelled
    // while queued never started); 1 + 4 completed; 3 failed; 2 + 1 cancelled.
    let acme = app.tenant_trends("acme", "").await;
    assert_eq!(acme["tenant_id"], "acme");
    assert_eq!(acme["hours"], 24);
    let s = &acme["series"];
    assert_eq!(totals(s), [11, 9, 5, 3, 3], "{}", s["totals"]);
    assert_eq!(s["minutes"].as_array().unwrap().len(), 1440);
    for (name, total) in [
        ("admissions", 11),
        ("starts", 9),
        ("completions", 5),
        ("failures", 3),
        ("cancellations", 3),
    ] {
        assert_eq!(summed(s, name), total, "{name}");
        assert_eq!(s[name].as_array().unwrap().len(), 1440, "{name}");
    }
    // A waiting time exactly where there were starts, and read as a bucket bound.
    let bounds: Vec<u64> = s["wait_bounds_ms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b.as_u64().unwrap())
        .collect();
    assert_eq!(bounds, [10, 40, 150, 600, 2_500, 10_000, 30_000]);
    for (i, starts) in s["starts"].as_array().unwrap().iter().enumerate() {
        for p in ["wait_p50_ms", "wait_p99_ms"] {
            let v = &s[p][i];
            if starts.as_u64() == Some(0) {
                assert!(v.is_null(), "{p} of minute {i}: {v}");
            } else {
                let v = v.as_u64().unwrap();
                assert!(bounds.contains(&v) || v == 30_001, "{p} of minute {i}: {v}");
            }
        }
    }
    assert!(s["totals"]["wait_p99_ms"].as_u64().is_some());
    // The last hour holds the same (this test takes seconds), in 60 minutes.
    let hour = app.tenant_trends("acme", "?hours=1").await;
    assert_eq!(hour["series"]["minutes"].as_array().unwrap().len(), 60);
    assert_eq!(totals(&hour["series"]), [11, 9, 5, 3, 3]);

    // beta, never registered: 2 admitted, started and completed.
    let beta = app.tenant_trends("beta", "").await;
    assert_eq!(totals(&beta["series"]), [2, 2, 2, 0, 0]);

    // The platform-wide series is the sum, and nobody has work any more.
    let all = app.trends().await;
    assert_eq!(totals(&all["series"]), [13, 11, 7, 3, 3]);
    assert_eq!(summed(&all["series"], "starts"), 11);
    assert_eq!(with_work(&all), vec![]);
    assert_eq!(all["unavailable"], json!([]));
}

/// A batch's admissions go in calls of up to 16, whose counters are written once per tenant
/// and call (`admit.lua`'s TALLIED): each admission is still counted once, in the tenant's
/// series and in the sum, and what was not admitted (a replay of an earlier item, an item
/// refused by `max_queued`) not at all — whichever calls the items share.
#[tokio::test]
async fn a_batchs_admissions_are_counted_once_each_whatever_calls_they_share() {
    let app = TestApp::spawn().await;
    app.put_tenant("acme", &json!({"max_queued": 30})).await;
    // 35 new keys, then 5 repeats of the first five: 30 admitted (201), 5 refused (429: the
    // queue holds 30), 5 replays (200).
    let items: Vec<Value> = (0..40)
        .map(|n| json!({"flow_id": "demo.echo", "params": {"n": n % 35}, "dedup_key": format!("k{}", n % 35)}))
        .collect();
    let res = app
        .as_tenant(reqwest::Method::POST, "/api/executions/batch", "acme")
        .json(&json!({"items": items}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let answer: Value = res.json().await.unwrap();
    let statuses: Vec<u64> = answer["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"].as_u64().unwrap())
        .collect();
    let want: Vec<u64> = (0..40)
        .map(|n| match n {
            0..30 => 201,
            30..35 => 429,
            _ => 200,
        })
        .collect();
    assert_eq!(statuses, want);
    // And two more, each alone in its call: counted as before.
    app.put_tenant("beta", &json!({})).await;
    for _ in 0..2 {
        app.admit_params("beta", "demo.echo", json!({})).await;
    }

    let acme = app.tenant_trends("acme", "?hours=1").await;
    assert_eq!(totals(&acme["series"]), [30, 0, 0, 0, 0]);
    assert_eq!(summed(&acme["series"], "admissions"), 30);
    let beta = app.tenant_trends("beta", "?hours=1").await;
    assert_eq!(totals(&beta["series"]), [2, 0, 0, 0, 0]);
    let all = app.trends().await;
    assert_eq!(totals(&all["series"]), [32, 0, 0, 0, 0]);
    assert_eq!(summed(&all["series"], "admissions"), 32);
}

#[tokio::test]
async fn tenants_with_work_are_listed_registered_or_not_until_their_work_is_done() {
    let app = TestApp::spawn().await;
    app.put_tenant("registered", &json!({"max_concurrent": 1}))
        .await;
    // Never registered, as every tenant of `sluice dev` is.
    let mut ids = Vec::new();
    for t in ["dev-1", "dev-2", "registered", "registered", "dev-1"] {
        ids.push((t, app.admit_params(t, "demo.echo", json!({})).await));
    }
    // An idle registered tenant is not listed.
    app.put_tenant("idle", &json!({})).await;
    let got = with_work(&app.trends().await);
    assert_eq!(
        got,
        vec![
            ("dev-1".to_owned(), false, 2, 0),
            ("dev-2".to_owned(), false, 1, 0),
            ("registered".to_owned(), true, 2, 0),
        ]
    );
    // Cancelling a tenant's last queued execution takes it off the list at once.
    for (t, id) in &ids {
        if *t == "dev-1" {
            assert_eq!(app.cancel(t, id).await.status(), StatusCode::OK);
        }
    }
    let got = with_work(&app.trends().await);
    let names: Vec<&str> = got.iter().map(|w| w.0.as_str()).collect();
    assert_eq!(names, ["dev-2", "registered"]);
    // A tenant with work that its busy set lost (work an older build queued, a repair) is
    // listed again after the sweeper's pass.
    let _: i64 = app
        .redis
        .query(
            redis::cmd("SREM")
                .arg(app.shard("dev-2").busy())
                .arg("dev-2"),
        )
        .await;
    let got = with_work(&app.trends().await);
    let names: Vec<&str> = got.iter().map(|w| w.0.as_str()).collect();
    assert_eq!(names, ["registered"]);
    let store = std::sync::Arc::new(app.store().await);
    sluice::sweeper::sweep_once(store.clone(), "test", Duration::from_millis(200))
        .await
        .expect("took the sweeper turn");
    let got = with_work(&app.trends().await);
    let names: Vec<&str> = got.iter().map(|w| w.0.as_str()).collect();
    assert_eq!(names, ["dev-2", "registered"]);
    // A worker runs the rest: nobody has work.
    let _worker = TestWorker::spawn(&app.redis, FAST_WORKER);
    for (t, id) in &ids {
        app.wait_terminal(t, id, Duration::from_secs(30)).await;
    }
    assert_eq!(with_work(&app.trends().await), vec![]);
    // Their shards' busy sets still name them (a completion does not take a tenant out); the
    // sweeper's next pass does, and admits nothing else.
    assert!(
        in_busy_set(&app, "dev-2").await,
        "dev-2 left the busy set before a sweep"
    );
    sluice::sweeper::sweep_once(store, "test", Duration::from_millis(200))
        .await
        .expect("took the sweeper turn");
    for t in ["dev-1", "dev-2", "registered"] {
        assert!(
            !in_busy_set(&app, t).await,
            "{t} is still in its shard's busy set"
        );
    }
}

/// Runs `op`, a script of common.lua's helpers, in `tenant`'s shard with ARGV[6] = the
/// tenant and ARGV[7] = `at` (ms): the counters written the way the scripts write them.
async fn run_helpers(app: &TestApp, tenant: &str, at: u64, op: &str) {
    let shard = app.shard(tenant);
    let args: Vec<String> = vec![
        shard.prefix(),
        "10".into(),
        "100".into(),
        "60".into(),
        "60".into(),
        tenant.into(),
        at.to_string(),
    ];
    eval(
        &app.redis,
        &composed_source("shard", op),
        &[shard.frozen()],
        &args,
    )
    .await
    .unwrap();
}

/// Whether tenant `t` is a member of its shard's busy set.
async fn in_busy_set(app: &TestApp, t: &str) -> bool {
    app.redis
        .query(redis::cmd("SISMEMBER").arg(app.shard(t).busy()).arg(t))
        .await
}

#[tokio::test]
async fn a_tenants_day_of_counters_stays_under_64_kb() {
    let app = TestApp::spawn().await;
    let tenant = "acme";
    let t = TenantId::parse(tenant).unwrap();
    let shard = app.shard(tenant);
    // Redis's day (the scripts' clock), and its last minute, when the day key is longest.
    let time: Vec<String> = app.redis.query(&mut redis::cmd("TIME")).await;
    let now_ms = time[0].parse::<u64>().unwrap() * 1000 + time[1].parse::<u64>().unwrap() / 1000;
    let day = now_ms / 86_400_000;
    let last_minute = day * 86_400_000 + 1439 * 60_000 + 59_999;
    // The scripts' own helpers (common.lua), at that minute: every counter and every
    // waiting-time bucket written, so the record is complete.
    let op = r#"#!lua
local t, now = ARGV[6], tonumber(ARGV[7])
for _, what in ipairs({ 'admitted', 'completed', 'failed', 'cancelled' }) do
  tally(t, what, now)
end
-- One start in each waiting-time bucket (upper bounds 10, 40, 150, 600, 2500, 10000,
-- 30000 ms, then every longer wait).
for _, waited in ipairs({ 0, 20, 100, 500, 2000, 9000, 20000, 40000 }) do
  tally_start(t, now - waited, now)
end
flush_trends()
return 1"#;
    run_helpers(&app, tenant, last_minute, op).await;
    let key = shard.trends(&t, day);
    let len: u64 = app.redis.query(redis::cmd("STRLEN").arg(&key)).await;
    assert_eq!(len, 1440 * 36);
    let bytes: u64 = app
        .redis
        .query(redis::cmd("MEMORY").arg("USAGE").arg(&key))
        .await;
    println!("a tenant's day of counters: {len} bytes of records, MEMORY USAGE {bytes} bytes");
    assert!(bytes <= 64 * 1024, "{bytes} bytes");
    // The shard's sum is the same size, and both expire 25 hours after the day ends.
    let sum_bytes: u64 = app
        .redis
        .query(
            redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(shard.shard_trends(day)),
        )
        .await;
    assert!(sum_bytes <= 64 * 1024, "{sum_bytes} bytes");
    for k in [key.clone(), shard.shard_trends(day)] {
        let at: u64 = app.redis.query(redis::cmd("EXPIRETIME").arg(&k)).await;
        assert_eq!(at, (day + 1) * 86_400 + 25 * 3_600, "{k}");
    }
    // The last minute reads back as written (the window ends there only at that minute, so
    // read the record itself).
    let record: Vec<u8> = app
        .redis
        .query(
            redis::cmd("GETRANGE")
                .arg(&key)
                .arg(1439 * 36)
                .arg(1440 * 36 - 1),
        )
        .await;
    let u32_at = |i: usize| u32::from_be_bytes(record[i..i + 4].try_into().unwrap());
    assert_eq!(
        [u32_at(0), u32_at(4), u32_at(8), u32_at(12), u32_at(16)],
        [1, 8, 1, 1, 1]
    );
}

#[tokio::test]
async fn trends_need_the_tenants_admin_or_the_platform_admin() {
    let app = TestApp::spawn().await;
    for t in ["acme", "beta"] {
        app.put_tenant(t, &json!({})).await;
    }
    let key = |role: &'static str| {
        let app = &app;
        async move {
            let res = app
                .client
                .post(app.url("/api/tenants/acme/api-keys"))
                .bearer_auth(ADMIN_TOKEN)
                .json(&json!({"role": role, "name": role}))
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
    let admin = key("admin").await;
    let viewer = key("viewer").await;
    let get = |token: Option<String>, path: &'static str| {
        let app = &app;
        async move {
            let mut req = app.client.get(app.url(path));
            if let Some(t) = token {
                req = req.bearer_auth(t);
            }
            req.send().await.unwrap()
        }
    };
    // Its own tenant's admin key reads its trends; another tenant's are refused as
    // GET /api/tenants/{tenant} refuses them.
    assert_eq!(
        get(Some(admin.clone()), "/api/tenants/acme/trends")
            .await
            .status(),
        StatusCode::OK
    );
    let res = get(Some(admin.clone()), "/api/tenants/beta/trends").await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    assert_eq!(problem_code(res).await, "tenant_mismatch");
    let res = get(Some(admin.clone()), "/api/tenants/beta").await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    // A viewer may not, nor may anyone but the platform admin read every tenant's.
    let res = get(Some(viewer), "/api/tenants/acme/trends").await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    let res = get(Some(admin), "/api/trends").await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    assert_eq!(problem_code(res).await, "insufficient_role");
    assert_eq!(
        get(None, "/api/trends").await.status(),
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        get(Some(ADMIN_TOKEN.into()), "/api/trends").await.status(),
        StatusCode::OK
    );
    // The window is 1 to 24 hours.
    for bad in ["/api/trends?hours=0", "/api/tenants/acme/trends?hours=25"] {
        let res = get(Some(ADMIN_TOKEN.into()), bad).await;
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "{bad}");
        assert_eq!(problem_code(res).await, "invalid_hours");
    }
}

#[tokio::test]
async fn metrics_expose_the_last_complete_minute_of_the_same_counters() {
    let app = TestApp::spawn().await;
    let tenant = "acme";
    let shard = app.shard(tenant);
    let time: Vec<String> = app.redis.query(&mut redis::cmd("TIME")).await;
    let now_ms = time[0].parse::<u64>().unwrap() * 1000 + time[1].parse::<u64>().unwrap() / 1000;
    // The same counts in this minute and the one before, written by the scripts' helpers: the
    // last complete minute holds them whether or not the minute turns before the scrape.
    let op = r#"#!lua
local t, now = ARGV[6], tonumber(ARGV[7])
for _, at in ipairs({ now, now - 60000 }) do
  for _ = 1, 3 do tally(t, 'completed', at) end
  tally(t, 'failed', at)
  -- Two starts that waited 100 ms: the third waiting-time bucket (at most 150 ms).
  for _ = 1, 2 do tally_start(t, at - 100, at) end
end
-- The tenant has work (as an admission would say): /metrics lists it.
redis.call('SADD', K.busy(), t)
flush_trends()
return 1"#;
    run_helpers(&app, tenant, now_ms, op).await;
    let text = app.metrics().await;
    let label = shard.label();
    for line in [
        format!("sluice_last_minute_events{{shard=\"{label}\",event=\"completed\"}} 3"),
        format!("sluice_last_minute_events{{shard=\"{label}\",event=\"failed\"}} 1"),
        format!("sluice_last_minute_events{{shard=\"{label}\",event=\"started\"}} 2"),
        format!("sluice_last_minute_events{{shard=\"{label}\",event=\"admitted\"}} 0"),
        // Both starts waited at most 150 ms (the third bucket).
        format!("sluice_last_minute_wait_ms{{shard=\"{label}\",quantile=\"0.99\"}} 150"),
        // The same per tenant, for a tenant of the shard's busy set.
        "sluice_tenant_last_minute_events{tenant=\"acme\",event=\"completed\"} 3".into(),
        "sluice_tenant_last_minute_events{tenant=\"acme\",event=\"started\"} 2".into(),
        "sluice_tenant_last_minute_wait_ms{tenant=\"acme\",quantile=\"0.99\"} 150".into(),
        "sluice_tenant_executions{tenant=\"acme\",state=\"queued\"} 0".into(),
    ] {
        assert!(text.lines().any(|l| l == line), "{line} not in:\n{text}");
    }
    // Admitted through the API (no worker runs): the tenant's queued executions, read at the
    // scrape.
    for _ in 0..2 {
        app.admit_params(tenant, "demo.echo", json!({})).await;
    }
    let text = app.metrics().await;
    let line = "sluice_tenant_executions{tenant=\"acme\",state=\"queued\"} 2";
    assert!(text.lines().any(|l| l == line), "{line} not in:\n{text}");
}

#[tokio::test]
async fn an_execution_held_back_by_its_limit_shows_in_the_waiting_time() {
    let app = TestApp::spawn().await;
    app.put_tenant("slow", &json!({"max_concurrent": 1})).await;
    // The first holds the tenant's only slot for at least 400 ms; the second, admitted right
    // after, waits for it: its wait is at least 400 ms, whatever the machine's load.
    let first = app
        .admit_params("slow", "demo.sleep", json!({"ms": 400}))
        .await;
    let second = app.admit_params("slow", "demo.echo", json!({})).await;
    let _worker = TestWorker::spawn(&app.redis, FAST_WORKER);
    for id in [&first, &second] {
        let e = app.wait_terminal("slow", id, Duration::from_secs(30)).await;
        assert_eq!(e["status"], "completed");
    }
    let s = &app.tenant_trends("slow", "?hours=1").await["series"];
    assert_eq!(totals(s)[1], 2, "{}", s["totals"]);
    // More than 150 ms: the bucket read is 600 ms or a later one.
    let p99 = s["totals"]["wait_p99_ms"].as_u64().unwrap();
    assert!(p99 >= 600, "p99 {p99} ms");
    let per_minute_max = s["wait_p99_ms"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_u64)
        .max()
        .unwrap();
    assert!(per_minute_max >= 600, "{per_minute_max} ms");
}
