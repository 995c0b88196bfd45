//! Group commit: admissions that arrive for a shard while its admission call is in flight go
//! together in the next call, each decided as if it came alone (`src/store/commit.rs`); a
//! worker's reports of ended runs likewise, in calls of `complete.lua`. The tests hold the
//! first call in Redis (`CLIENT PAUSE WRITE`) until the server counts the others queued behind
//! it (`Store::group_commit_counts`, what `/metrics` shows as `sluice_admissions_grouping`;
//! read in process, since `/metrics` itself reads Redis; `Store::completion_counts` for
//! reports), so the grouping is certain, not a matter of timing.
//!
//! Long on purpose: a list of independent tests of one mechanism (grouped admission and
//! completion calls), each holding a group to what a lone call does.

use std::collections::HashMap;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::helpers::TestApp;

/// A group commit count of the app, by its `/metrics` name.
async fn metric(app: &TestApp, name: &str) -> u64 {
    let c = app.app_store.group_commit_counts();
    match name {
        "sluice_admission_calls_total" => c.calls,
        "sluice_admission_calls_carried_total" => c.carried,
        "sluice_admissions_grouping" => c.waiting,
        "sluice_admission_answers_lost_total" => c.lost,
        "sluice_admissions_withdrawn_total" => c.withdrawn,
        "sluice_admission_outcomes_unknown_total" => c.unknown,
        other => panic!("no metric {other}"),
    }
}

/// Waits until `name` reads `want` (30 s at most).
async fn await_metric(app: &TestApp, name: &str, want: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = metric(app, name).await;
        if got == want {
            return;
        }
        assert!(Instant::now() < deadline, "{name} is {got}, not {want}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Sends an admission for `tenant` in a task of its own: (status, body).
fn send(app: &TestApp, tenant: &str, body: Value) -> tokio::task::JoinHandle<(StatusCode, Value)> {
    let (client, url, tenant) = (
        app.client.clone(),
        app.url("/api/executions"),
        tenant.to_owned(),
    );
    let mut body = body;
    let key = body
        .as_object_mut()
        .and_then(|o| o.remove("key"))
        .and_then(|k| k.as_str().map(str::to_owned));
    tokio::spawn(async move {
        let mut req = client
            .post(url)
            .bearer_auth(crate::helpers::ADMIN_TOKEN)
            .header("X-Tenant-Id", tenant)
            .json(&body);
        if let Some(key) = key {
            req = req.header("Idempotency-Key", key);
        }
        let res = req.send().await.unwrap();
        let status = res.status();
        (status, res.json().await.unwrap_or(Value::Null))
    })
}

/// Held behind one stalled call, 62 admissions go in one call, and each gets exactly the
/// answer it would have got alone: dedup keys repeated inside the group are replays of their
/// first, the tenant's `max_queued` admits exactly as many as it allows, and the ones beyond
/// it are refused.
#[tokio::test]
async fn admissions_held_behind_a_call_go_together_and_each_gets_its_own_answer() {
    let app = TestApp::spawn_with(|c| {
        c.redis.redis_timeout_ms = 20_000;
        c.api.request_timeout_ms = 61_000;
    })
    .await;
    app.put_tenant("acme", &json!({"max_queued": 40})).await;
    let calls = metric(&app, "sluice_admission_calls_total").await;
    app.redis.pause(60_000, "WRITE").await;
    let first = send(
        &app,
        "acme",
        json!({"flow_id": "demo.echo", "params": {"n": -1}}),
    );
    await_metric(&app, "sluice_admission_calls_total", calls + 1).await;
    // 20 dedup keys sent twice each, and 22 admissions without one: 62 behind the first.
    let mut sent = Vec::new();
    for n in 0..20 {
        for _ in 0..2 {
            let body = json!({"flow_id": "demo.echo", "params": {"n": n}, "key": format!("k{n}")});
            sent.push((Some(format!("k{n}")), send(&app, "acme", body)));
        }
    }
    for n in 20..42 {
        sent.push((
            None,
            send(
                &app,
                "acme",
                json!({"flow_id": "demo.echo", "params": {"n": n}}),
            ),
        ));
    }
    await_metric(&app, "sluice_admissions_grouping", 62).await;
    app.redis.unpause().await;

    let (status, body) = first.await.unwrap();
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let mut created = 1;
    let mut by_key: HashMap<String, Vec<(StatusCode, Value)>> = HashMap::new();
    for (key, task) in sent {
        let (status, body) = task.await.unwrap();
        match status {
            StatusCode::CREATED => created += 1,
            StatusCode::OK | StatusCode::TOO_MANY_REQUESTS => {}
            other => panic!("unexpected {other}: {body}"),
        }
        if let Some(key) = key {
            by_key.entry(key).or_default().push((status, body));
        } else {
            assert_ne!(status, StatusCode::OK, "a replay without a key: {body}");
        }
    }
    // The quota admitted exactly 40, in one call after the first.
    assert_eq!(created, 40);
    assert_eq!(app.page("acme", "limit=200").await["total"], 40);
    assert_eq!(
        metric(&app, "sluice_admission_calls_total").await,
        calls + 2
    );
    // Each key: refused both times (the queue was full when it came), or created once and
    // replayed once with the same execution.
    for (key, answers) in by_key {
        let statuses: Vec<StatusCode> = answers.iter().map(|a| a.0).collect();
        match statuses[..] {
            [StatusCode::TOO_MANY_REQUESTS, StatusCode::TOO_MANY_REQUESTS] => {}
            _ => {
                let mut sorted = statuses.clone();
                sorted.sort();
                assert_eq!(
                    sorted,
                    [StatusCode::OK, StatusCode::CREATED],
                    "{key}: {answers:?}"
                );
                assert_eq!(
                    answers[0].1["execution_id"], answers[1].1["execution_id"],
                    "{key}"
                );
            }
        }
    }
}

/// A script error on one admission in the middle of a group (its tenant's data is not what
/// sluice wrote) fails that admission alone: the admissions before and after it in the same
/// call are admitted and answered 201.
#[tokio::test]
async fn a_script_error_part_way_through_a_group_fails_only_its_admission() {
    let app = TestApp::spawn_with(|c| {
        c.redis.redis_timeout_ms = 20_000;
        c.api.request_timeout_ms = 61_000;
    })
    .await;
    let shard = app.shard("acme");
    let broken = (0..10_000)
        .map(|i| format!("other{i}"))
        .find(|t| app.shard(t) == shard)
        .expect("a tenant in acme's shard");
    app.admit(&broken, "demo.echo").await;
    // The broken tenant's listing is a string now: its admission fails in place().
    let index = shard.listing(&sluice::domain::TenantId::parse(&broken).unwrap());
    let () = app
        .redis
        .query(redis::cmd("SET").arg(&index).arg("not a sorted set"))
        .await;
    let acme = |n: u32| json!({"flow_id": "demo.echo", "params": {"n": n}});
    let calls = metric(&app, "sluice_admission_calls_total").await;
    app.redis.pause(60_000, "WRITE").await;
    let mut ok = vec![send(&app, "acme", acme(0))];
    await_metric(&app, "sluice_admission_calls_total", calls + 1).await;
    for n in 1..5 {
        ok.push(send(&app, "acme", acme(n)));
    }
    await_metric(&app, "sluice_admissions_grouping", 4).await;
    let bad = send(&app, &broken, json!({"flow_id": "demo.echo"}));
    await_metric(&app, "sluice_admissions_grouping", 5).await;
    for n in 5..10 {
        ok.push(send(&app, "acme", acme(n)));
    }
    await_metric(&app, "sluice_admissions_grouping", 10).await;
    app.redis.unpause().await;

    let (status, body) = bad.await.unwrap();
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    let mut ids = Vec::new();
    for task in ok {
        let (status, body) = task.await.unwrap();
        assert_eq!(status, StatusCode::CREATED, "{body}");
        ids.push(body["execution_id"].as_str().unwrap().to_owned());
    }
    for id in &ids {
        assert_eq!(app.execution("acme", id).await["status"], "queued");
    }
    assert_eq!(app.page("acme", "limit=200").await["total"], 10);
    assert_eq!(
        metric(&app, "sluice_admission_calls_total").await,
        calls + 2
    );
}

/// Redis stalls past the time-out while groups are in flight: every admission of a lost call
/// is settled on its own, so each answer is true of the data — 201 names an execution that
/// exists, 503 `redis_unavailable` one that never will, and an unknown outcome at most one.
///
/// Whether a round loses answers, and whether its admissions queue behind a call, depends on
/// when the requests reach the server, which a loaded machine decides: so rounds go on (each
/// in a tenant of its own) until both have happened, 16 rounds at most. Every answer of every
/// round is checked.
#[tokio::test]
async fn each_admission_of_a_lost_group_is_settled_on_its_own() {
    let app = TestApp::spawn_with(|c| {
        c.redis.redis_timeout_ms = 300;
        c.api.request_timeout_ms = 5_000;
    })
    .await;
    app.admit("acme", "demo.echo").await;
    let (calls, carried) = (
        metric(&app, "sluice_admission_calls_total").await,
        metric(&app, "sluice_admission_calls_carried_total").await,
    );
    let lost_before = metric(&app, "sluice_admission_answers_lost_total").await;
    let (mut lost, mut grouped, mut rounds) = (0, false, 0u64);
    while rounds < 16 && (lost == 0 || !grouped) {
        let tenant = format!("acme-{rounds}");
        app.redis.pause(350 + 150 * (rounds % 3), "WRITE").await;
        rounds += 1;
        let tasks: Vec<_> = (0..16)
            .map(|n| {
                let nonce = format!("{n}");
                let body = json!({"flow_id": "demo.echo", "params": {"nonce": nonce}});
                (nonce, send(&app, &tenant, body))
            })
            .collect();
        let mut answers = Vec::new();
        for (nonce, task) in tasks {
            answers.push((nonce, task.await.unwrap()));
        }
        // Writes go through again: any late call has run.
        let deadline = Instant::now() + Duration::from_secs(15);
        while app
            .post_execution(&tenant, &json!({"flow_id": "demo.echo"}))
            .await
            .status()
            != StatusCode::CREATED
        {
            assert!(Instant::now() < deadline, "admissions did not come back");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let page = app.page(&tenant, "limit=100").await;
        for (nonce, (status, body)) in answers {
            let found: Vec<&Value> = page["executions"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|e| e["params"]["nonce"] == nonce.as_str())
                .collect();
            match (status, body["code"].as_str()) {
                (StatusCode::CREATED, _) => {
                    assert_eq!(found.len(), 1, "201 but not admitted: {body}");
                    assert_eq!(found[0]["execution_id"], body["execution_id"]);
                }
                (StatusCode::SERVICE_UNAVAILABLE, Some("redis_unavailable")) => {
                    assert!(
                        found.is_empty(),
                        "503 redis_unavailable, yet admitted: {body}"
                    );
                }
                (StatusCode::SERVICE_UNAVAILABLE, Some("admission_outcome_unknown")) => {
                    assert!(found.len() <= 1, "{found:?}");
                    if let Some(e) = found.first() {
                        assert_eq!(e["execution_id"], body["execution_id"]);
                    }
                }
                other => panic!("unexpected answer {other:?}: {body}"),
            }
        }
        grouped = metric(&app, "sluice_admission_calls_total").await - calls
            < metric(&app, "sluice_admission_calls_carried_total").await - carried;
        // Answers lost in the stall (each settled before its client was answered: as a 201
        // when the stalled call ran first, which a settling try that waits behind it finds).
        lost = metric(&app, "sluice_admission_answers_lost_total").await - lost_before;
    }
    // The scenario happened: answers lost in a stall, and calls that carried several.
    assert!(lost > 0, "no admission lost its answer in {rounds} rounds");
    assert!(
        grouped,
        "no call carried several admissions in {rounds} rounds"
    );
}

/// `--redis-admission-group 1`: admissions held behind a call go one per call.
#[tokio::test]
async fn a_group_of_one_sends_each_admission_alone() {
    let app = TestApp::spawn_with(|c| {
        c.redis.redis_timeout_ms = 20_000;
        c.api.request_timeout_ms = 61_000;
        c.redis.redis_admission_group = 1;
    })
    .await;
    let calls = metric(&app, "sluice_admission_calls_total").await;
    let carried = metric(&app, "sluice_admission_calls_carried_total").await;
    app.redis.pause(60_000, "WRITE").await;
    let mut sent = vec![send(&app, "acme", json!({"flow_id": "demo.echo"}))];
    await_metric(&app, "sluice_admission_calls_total", calls + 1).await;
    for _ in 0..4 {
        sent.push(send(&app, "acme", json!({"flow_id": "demo.echo"})));
    }
    await_metric(&app, "sluice_admissions_grouping", 4).await;
    app.redis.unpause().await;
    for task in sent {
        let (status, body) = task.await.unwrap();
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    assert_eq!(
        metric(&app, "sluice_admission_calls_total").await,
        calls + 5
    );
    assert_eq!(
        metric(&app, "sluice_admission_calls_carried_total").await,
        carried + 5
    );
}

/// A tenant `acme` of `admitted` executions, `started` of them running for worker `w1` (its
/// call 1), on a server whose calls wait out a stalled Redis (timeouts of 20 s and 61 s): what
/// the tests that hold reports behind one stalled call start from (`held_runs`).
struct Held {
    app: TestApp,
    store: std::sync::Arc<sluice::store::Store>,
    shard: sluice::store::Shard,
    runs: Vec<sluice::store::Started>,
    ttl: Duration,
}

/// Makes the `Held` start: admits `admitted` executions to `acme` and starts `started`.
async fn held_runs(admitted: usize, started: usize) -> Held {
    let app = TestApp::spawn_with(|c| {
        c.redis.redis_timeout_ms = 20_000;
        c.api.request_timeout_ms = 61_000;
    })
    .await;
    app.put_tenant("acme", &json!({"max_concurrent": 50})).await;
    let store = std::sync::Arc::new(app.store().await);
    let shard = app.shard("acme");
    for _ in 0..admitted {
        app.admit("acme", "demo.echo").await;
    }
    let ttl = Duration::from_secs(60);
    let runs = store
        .start(shard, "w1", started, ttl, 1)
        .await
        .unwrap()
        .started;
    assert_eq!(runs.len(), started);
    Held {
        app,
        store,
        shard,
        runs,
        ttl,
    }
}

/// Waits until the store's completion committer has made `calls` calls and holds `waiting`
/// reports (30 s at most).
async fn await_completions(store: &sluice::store::Store, calls: u64, waiting: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let c = store.completion_counts();
        if c.calls == calls && c.waiting == waiting {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "completion calls {} waiting {}, not {calls} and {waiting}",
            c.calls,
            c.waiting
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Held behind one stalled call, the reports of 12 runs go together in one call of
/// `complete.lua`, and each gets exactly the answer it would have got alone: completions,
/// a retry, a failure for good, a cancel, a stale fence refused, a repeat recognised, a
/// chained start barred by the worker's adopt barrier, and two chained starts that share out
/// the queue between them, in order.
#[tokio::test]
async fn reports_held_behind_a_call_go_together_and_each_gets_its_own_answer() {
    use sluice::domain::Status;
    use sluice::store::{Completion, Outcome};

    let Held {
        app,
        store,
        shard,
        runs,
        ttl,
    } = held_runs(16, 12).await;
    // The barrier of an adopt covers the worker's calls up to 5.
    assert_eq!(
        store.adopt(shard, "w1", 16, ttl, 5).await.unwrap().len(),
        12
    );

    let report = |i: usize, fence_off: u64, outcome: Outcome, chain: usize, call: u64| {
        let (store, run) = (store.clone(), runs[i].clone());
        tokio::spawn(async move {
            store
                .complete_and_start(
                    shard,
                    &run.id,
                    run.fence + fence_off,
                    "w1",
                    &outcome,
                    chain,
                    ttl,
                    call,
                )
                .await
                .unwrap()
        })
    };
    let done = || Outcome::Completed(json!({"ok": true}));
    let failed = |retry: Option<Duration>| Outcome::Failed {
        kind: "handler_error".into(),
        message: "no".into(),
        retry_after: retry,
    };
    let before = store.completion_counts().calls;
    app.redis.pause(60_000, "WRITE").await;
    let first = report(0, 0, done(), 0, 0);
    await_completions(&store, before + 1, 0).await;
    let held = vec![
        report(1, 0, done(), 0, 0),
        report(2, 0, done(), 0, 0),
        report(1, 0, done(), 0, 0),
        report(3, 0, failed(Some(Duration::from_secs(60))), 0, 0),
        report(4, 0, failed(None), 0, 0),
        report(5, 1, done(), 0, 0),
        report(6, 0, Outcome::Cancelled, 0, 0),
        report(7, 0, done(), 1, 4),
        report(8, 0, done(), 3, 6),
        report(9, 0, done(), 3, 7),
        report(10, 0, done(), 0, 0),
        report(11, 0, done(), 0, 0),
    ];
    await_completions(&store, before + 1, 12).await;
    app.redis.unpause().await;

    let (c, _) = first.await.unwrap();
    assert_eq!(c, Completion::Done(Status::Completed));
    let mut answers = Vec::new();
    for task in held {
        answers.push(task.await.unwrap());
    }
    assert_eq!(
        store.completion_counts().calls,
        before + 2,
        "one call for the 12"
    );
    let what: Vec<&Completion> = answers.iter().map(|(c, _)| c).collect();
    use Completion::*;
    assert_eq!(
        what,
        [
            &Done(Status::Completed),
            &Done(Status::Completed),
            &Repeat,
            &Retrying,
            &Done(Status::Failed),
            &Stale,
            &Done(Status::Cancelled),
            &Done(Status::Completed),
            &Done(Status::Completed),
            &Done(Status::Completed),
            &Done(Status::Completed),
            &Done(Status::Completed),
        ]
    );
    // The barred report started nothing; the next took 3 of the 4 queued, the one after it
    // the last.
    let started: Vec<usize> = answers.iter().map(|(_, b)| b.started.len()).collect();
    assert_eq!(started, [0, 0, 0, 0, 0, 0, 0, 0, 3, 1, 0, 0]);
    // The call answers the shard's due time and weight once; each report is handed the same.
    let shard: Vec<_> = answers
        .iter()
        .map(|(_, b)| (b.next_due, b.weight))
        .collect();
    assert!(shard.iter().all(|s| *s == shard[0]), "{shard:?}");
    let mut new: Vec<String> = answers
        .iter()
        .flat_map(|(_, b)| b.started.iter().map(|s| s.id.to_string()))
        .collect();
    assert!(
        new.iter()
            .all(|id| !runs.iter().any(|r| r.id.to_string() == *id))
    );
    new.sort();
    new.dedup();
    assert_eq!(new.len(), 4);
    // Every run of the shard's answer sees the state after the whole call: the retry is due in
    // about a minute.
    let due = answers[11].1.next_due.expect("the retry is due later");
    assert!(due > Duration::from_secs(50), "{due:?}");

    let total = |status: &'static str| {
        let app = &app;
        async move { app.page("acme", &format!("status={status}")).await["total"].clone() }
    };
    assert_eq!(total("completed").await, 8);
    assert_eq!(total("failed").await, 1);
    assert_eq!(total("cancelled").await, 1);
    assert_eq!(total("queued").await, 1);
    // The stale report's run, and the 4 chained starts.
    assert_eq!(total("running").await, 5);
}

/// Held behind one stalled call, ten reports of runs that are not current (a fence the run
/// never had) and two that are go together in one call: each stale report is refused and
/// counted once in `fenced` (the call writes the count once, at its end), the two current
/// ones complete, and the stale runs are still running.
#[tokio::test]
async fn each_stale_report_of_a_call_of_many_is_counted_once_as_fenced() {
    use sluice::domain::Status;
    use sluice::store::{Completion, Outcome};

    let Held {
        app,
        store,
        shard,
        runs,
        ..
    } = held_runs(13, 13).await;
    let report = |i: usize, fence_off: u64| {
        let (store, run) = (store.clone(), runs[i].clone());
        tokio::spawn(async move {
            let outcome = Outcome::Completed(json!({"ok": true}));
            store
                .complete(shard, &run.id, run.fence + fence_off, "w1", &outcome)
                .await
                .unwrap()
        })
    };
    let before = store.completion_counts().calls;
    app.redis.pause(60_000, "WRITE").await;
    let first = report(0, 0);
    await_completions(&store, before + 1, 0).await;
    let held: Vec<_> = (1..13).map(|i| report(i, u64::from(i > 2))).collect();
    await_completions(&store, before + 1, 12).await;
    app.redis.unpause().await;

    assert_eq!(first.await.unwrap(), Completion::Done(Status::Completed));
    let mut answers = Vec::new();
    for task in held {
        answers.push(task.await.unwrap());
    }
    assert_eq!(
        store.completion_counts().calls,
        before + 2,
        "one call for the 12"
    );
    let mut want = vec![Completion::Done(Status::Completed); 2];
    want.extend((0..10).map(|_| Completion::Stale));
    assert_eq!(answers, want);
    assert_eq!(app.counter("fenced").await, 10);
    let total = |status: &'static str| {
        let app = &app;
        async move { app.page("acme", &format!("status={status}")).await["total"].clone() }
    };
    assert_eq!(total("completed").await, 3);
    assert_eq!(total("running").await, 10);
}

/// A call of reports whose answer is lost (Redis stalled past the time-out) answers each
/// report with an error, never with an outcome it made up; Redis runs the call once it is
/// back, and each report repeated then is recognised as applied: every run is recorded once.
#[tokio::test]
async fn each_report_of_a_lost_group_is_an_error_and_its_repeat_is_recognised() {
    use sluice::store::{Completion, Outcome};

    let app = TestApp::spawn_with(|c| {
        c.redis.redis_timeout_ms = 300;
        c.api.request_timeout_ms = 5_000;
    })
    .await;
    let store = std::sync::Arc::new(app.store().await);
    let shard = app.shard("acme");
    for _ in 0..6 {
        app.admit("acme", "demo.echo").await;
    }
    let ttl = Duration::from_secs(60);
    let runs = store.start(shard, "w1", 6, ttl, 0).await.unwrap().started;
    assert_eq!(runs.len(), 6);
    let report = |i: usize| {
        let (store, run) = (store.clone(), runs[i].clone());
        tokio::spawn(async move {
            let outcome = Outcome::Completed(json!({"i": i}));
            store
                .complete(shard, &run.id, run.fence, "w1", &outcome)
                .await
        })
    };
    app.redis.pause(60_000, "WRITE").await;
    let tasks: Vec<_> = (0..6).map(report).collect();
    for task in tasks {
        let answer = task.await.unwrap();
        assert!(answer.is_err(), "a lost call answered {answer:?}");
    }
    assert!(store.completion_counts().carried >= 6);
    app.redis.unpause().await;

    // The lost calls run now; repeated, each report is recognised.
    let deadline = Instant::now() + Duration::from_secs(15);
    while app.page("acme", "status=completed").await["total"] != 6 {
        assert!(Instant::now() < deadline, "the lost calls did not run");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for (i, run) in runs.iter().enumerate() {
        let outcome = Outcome::Completed(json!({"i": i}));
        let again = store
            .complete(shard, &run.id, run.fence, "w1", &outcome)
            .await
            .unwrap();
        assert_eq!(again, Completion::Repeat, "run {i}");
    }
    assert_eq!(app.page("acme", "status=running").await["total"], 0);
    assert_eq!(app.page("acme", "status=completed").await["total"], 6);
}

/// The server's own completion calls (the pull API's reports go through them) are counted on
/// `/metrics`: every report once, in at most as many calls.
#[tokio::test]
async fn metrics_count_the_completion_calls_and_the_reports_they_carried() {
    use sluice::store::Outcome;

    let app = TestApp::spawn().await;
    let shard = app.shard("acme");
    for _ in 0..3 {
        app.admit("acme", "demo.echo").await;
    }
    let ttl = Duration::from_secs(60);
    let store = &app.app_store;
    let runs = store.start(shard, "w1", 3, ttl, 0).await.unwrap().started;
    assert_eq!(runs.len(), 3);
    for run in &runs {
        let done = Outcome::Completed(json!({}));
        store
            .complete(shard, &run.id, run.fence, "w1", &done)
            .await
            .unwrap();
    }
    let text = app.metrics().await;
    let value = |name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name} in /metrics"))
            .trim()
            .parse()
            .unwrap()
    };
    assert_eq!(value("sluice_completion_calls_carried_total"), 3);
    assert!((1..=3).contains(&value("sluice_completion_calls_total")));
}
