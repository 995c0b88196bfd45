//! Batch admission (`POST /api/executions/batch`): up to 1,000 executions of one tenant in one
//! request, each admitted as if it came alone and answered in order; the batch as a whole is
//! not atomic, and one batch per tenant runs at a time.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::helpers::TestApp;

/// POST /api/executions/batch as the platform admin acting for `tenant`.
async fn batch(app: &TestApp, tenant: &str, body: &Value) -> (StatusCode, Value) {
    let res = app
        .as_tenant(reqwest::Method::POST, "/api/executions/batch", tenant)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = res.status();
    (status, res.json().await.unwrap_or(Value::Null))
}

fn results(answer: &Value) -> &Vec<Value> {
    answer["results"].as_array().expect("results")
}

/// Every kind of answer single admission gives, each on its own item, in order: created,
/// replayed (of an earlier item and of an older execution), conflict, invalid, scheduled,
/// and refused once the tenant's queue is full.
#[tokio::test]
async fn each_item_gets_the_answer_it_would_have_had_alone_in_order() {
    let app = TestApp::spawn().await;
    app.put_tenant("acme", &json!({"max_queued": 5})).await;
    let old = app
        .post_with_key("acme", "old", &json!({"flow_id": "demo.echo"}))
        .await;
    assert_eq!(old.status(), StatusCode::CREATED);
    let old: Value = old.json().await.unwrap();
    let items = json!([
        {"flow_id": "demo.echo", "dedup_key": "a"},
        {"flow_id": "demo.echo", "dedup_key": "a"},
        {"flow_id": "demo.echo", "dedup_key": "a", "params": {"x": 1}},
        {"flow_id": "not a flow!"},
        {"flow_id": "demo.echo", "dedup_key": "old"},
        {"flow_id": "demo.echo", "priority": 1, "delay": "1h"},
        {"flow_id": "demo.echo"},
        {"flow_id": "demo.echo", "params": {"n": 7}},
        {"flow_id": "demo.echo", "params": {"n": 8}},
        42,
        {"flow_id": "demo.echo", "unknown": true},
    ]);
    let (status, answer) = batch(&app, "acme", &json!({"items": items})).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let r = results(&answer);
    let statuses: Vec<u64> = r.iter().map(|x| x["status"].as_u64().unwrap()).collect();
    assert_eq!(
        statuses,
        [201, 200, 422, 400, 200, 201, 201, 201, 429, 400, 400],
        "{answer}"
    );
    let id = |i: usize| {
        r[i]["execution"]["execution_id"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(id(1), id(0), "a key repeated in the batch is a replay");
    assert_eq!(r[2]["problem"]["code"], "idempotency_key_conflict");
    assert_eq!(r[2]["problem"]["execution_id"], id(0).as_str());
    assert_eq!(r[3]["problem"]["code"], "invalid_flow_id");
    assert_eq!(id(4), old["execution_id"].as_str().unwrap());
    assert_eq!(r[5]["execution"]["queue_state"], "scheduled");
    assert_eq!(r[8]["problem"]["code"], "tenant_queue_full");
    assert_eq!(r[9]["problem"]["code"], "invalid_body");
    assert_eq!(r[10]["problem"]["code"], "invalid_body");
    // What the answers say is what Redis holds: the old one and four new ones.
    let page = app.page("acme", "limit=200").await;
    assert_eq!(page["total"], 5);
    for i in [0, 5, 6, 7] {
        assert_eq!(app.execution("acme", &id(i)).await["status"], "queued");
    }
}

/// A batch larger than one call goes in several, in order: a dedup key that comes back 200
/// items later (in another call) is still a replay of its first.
#[tokio::test]
async fn a_batch_spans_calls_and_keeps_its_order_and_dedup() {
    let app = TestApp::spawn().await;
    let mut items: Vec<Value> = (0..250)
        .map(|n| json!({"flow_id": "demo.echo", "params": {"n": n}, "dedup_key": format!("k{n}")}))
        .collect();
    items[230] = json!({"flow_id": "demo.echo", "params": {"n": 3}, "dedup_key": "k3"});
    let calls = app.app_store.group_commit_counts().calls;
    let (status, answer) = batch(&app, "acme", &json!({"items": items})).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let r = results(&answer);
    assert_eq!(r.len(), 250);
    for (n, x) in r.iter().enumerate() {
        let want = if n == 230 { 200 } else { 201 };
        assert_eq!(x["status"], want, "item {n}: {x}");
    }
    assert_eq!(
        r[230]["execution"]["execution_id"],
        r[3]["execution"]["execution_id"]
    );
    // Admitted in order: the tenant's queue lists them as the items came.
    let queue = app.queue_ids("acme").await;
    let admitted: Vec<&str> = r
        .iter()
        .enumerate()
        .filter(|(n, _)| *n != 230)
        .map(|(_, x)| x["execution"]["execution_id"].as_str().unwrap())
        .collect();
    assert_eq!(queue, admitted);
    // 250 items, at most 16 per call (a batch's calls are shorter than the default group of
    // 64, see `sluice::store::BATCH_CALL_ITEMS`): 16 calls.
    assert_eq!(sluice::store::BATCH_CALL_ITEMS, 16);
    assert_eq!(app.app_store.group_commit_counts().calls - calls, 16);
}

/// A batch's admissions of one tenant go in one call, and each sees what those before it did,
/// as it would alone: the tenant's queued count (its `max_queued`), the slots its running
/// executions hold (`ready` only within the free ones) and its place in the shard's
/// runnable set (so its executions start).
#[tokio::test]
async fn each_item_of_a_call_sees_the_quota_and_slots_as_alone() {
    let app = TestApp::spawn().await;
    app.put_tenant("acme", &json!({"max_concurrent": 4, "max_queued": 12}))
        .await;
    for _ in 0..3 {
        app.admit("acme", "demo.echo").await;
    }
    assert_eq!(app.started_by_hand("acme", 2).await.len(), 2);
    // One queued, two running: 11 more fit in the queue, and two slots are free.
    let items: Vec<Value> = (0..14)
        .map(|n| json!({"flow_id": "demo.echo", "params": {"n": n}}))
        .collect();
    let calls = app.app_store.group_commit_counts().calls;
    let (status, answer) = batch(&app, "acme", &json!({"items": items})).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(app.app_store.group_commit_counts().calls - calls, 1);
    let r = results(&answer);
    let statuses: Vec<u64> = r.iter().map(|x| x["status"].as_u64().unwrap()).collect();
    assert_eq!(
        statuses,
        [[201; 11].as_slice(), &[429; 3]].concat(),
        "{answer}"
    );
    for (n, x) in r.iter().take(11).enumerate() {
        let e = &x["execution"];
        // The queued single is first in the tenant's order and takes one free slot.
        let want = if n == 0 { "ready" } else { "waiting" };
        assert_eq!(e["queue_state"], want, "item {n}: {e}");
        assert_eq!(e["queue_position"]["tenant"], n as u64 + 1, "item {n}: {e}");
        // What the answer said is what a read says now.
        let read = app
            .execution("acme", e["execution_id"].as_str().unwrap())
            .await;
        assert_eq!(read["queue_state"], want, "item {n}: {read}");
    }
    for x in &r[11..] {
        assert_eq!(x["problem"]["code"], "tenant_queue_full");
    }
    // Runnable: the two free slots start the queued single and the batch's first.
    assert_eq!(app.runnable_tenants("acme").await, ["acme"]);
    let started: Vec<String> = app
        .started_by_hand("acme", 10)
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(started.len(), 2);
    assert_eq!(
        started[1],
        r[0]["execution"]["execution_id"].as_str().unwrap()
    );
    // A tenant with nothing queued becomes runnable with its first call's admissions.
    let items: Vec<Value> = (0..3).map(|_| json!({"flow_id": "demo.echo"})).collect();
    let (status, answer) = batch(&app, "fresh", &json!({"items": items})).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert!(
        app.runnable_tenants("fresh")
            .await
            .contains(&"fresh".to_owned())
    );
    assert_eq!(app.queue_ids("fresh").await.len(), 3);
}

/// A call of many answers each admission's queue state and position (in its tenant's order
/// and in its concurrency key's queue, with the key's limit) as a read of it right after
/// does, keyed or not: the answer a call of one would have given.
#[tokio::test]
async fn a_batchs_states_and_positions_are_what_a_read_says_keyed_or_not() {
    let app = TestApp::spawn().await;
    app.put_tenant(
        "acme",
        &json!({"max_concurrent": 2, "max_concurrent_per_key": 1}),
    )
    .await;
    // Unkeyed, keyed "K" (four: three wait behind the first in K), and keys of their own.
    let items: Vec<Value> = (0..12)
        .map(|n| match n % 3 {
            0 => json!({"flow_id": "demo.echo", "params": {"n": n}}),
            1 => json!({"flow_id": "demo.echo", "params": {"n": n}, "concurrency_key": "K"}),
            _ => json!({"flow_id": "demo.echo", "params": {"n": n},
                        "concurrency_key": format!("k{n}")}),
        })
        .collect();
    let (status, answer) = batch(&app, "acme", &json!({"items": items})).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let mut behind_in_key = Vec::new();
    for (n, x) in results(&answer).iter().enumerate() {
        assert_eq!(x["status"], 201, "item {n}: {x}");
        let e = &x["execution"];
        let read = app
            .execution("acme", e["execution_id"].as_str().unwrap())
            .await;
        for f in ["queue_state", "queue_position"] {
            assert_eq!(e[f], read[f], "item {n}, {f}: {e} / {read}");
        }
        if let Some(k) = e["queue_position"]["key"].as_u64().filter(|k| *k > 0) {
            behind_in_key.push((n, k, e["queue_state"].clone()));
        }
    }
    assert_eq!(
        behind_in_key,
        [
            (4, 1, json!("waiting")),
            (7, 2, json!("waiting")),
            (10, 3, json!("waiting"))
        ]
    );
}

/// What is wrong with the request as a whole is refused whole, and nothing is written.
#[tokio::test]
async fn a_bad_batch_is_refused_whole() {
    let app = TestApp::spawn_with(|c| {
        c.api.body_limit = 2_048;
        c.api.batch_body_limit = 64 * 1024;
    })
    .await;
    let item = json!({"flow_id": "demo.echo", "params": {"pad": "x".repeat(100)}});
    let cases = [
        (
            "no items",
            json!({"items": []}),
            StatusCode::BAD_REQUEST,
            "invalid_batch",
        ),
        (
            "1,001 items",
            json!({"items": vec![json!({"flow_id": "demo.echo"}); 1_001]}),
            StatusCode::BAD_REQUEST,
            "invalid_batch",
        ),
        (
            "items not a list",
            json!({"items": {}}),
            StatusCode::BAD_REQUEST,
            "invalid_body",
        ),
        (
            "no items field",
            json!({"item": []}),
            StatusCode::BAD_REQUEST,
            "invalid_body",
        ),
        (
            "over --batch-body-limit",
            json!({"items": vec![item.clone(); 1_000]}),
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
        ),
    ];
    for (what, body, status, code) in cases {
        let res = app
            .as_tenant(reqwest::Method::POST, "/api/executions/batch", "acme")
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), status, "{what}");
        assert_eq!(crate::helpers::problem_code(res).await, code, "{what}");
    }
    // An Idempotency-Key on the batch itself is refused: each item has its own dedup_key.
    let res = app
        .as_tenant(reqwest::Method::POST, "/api/executions/batch", "acme")
        .header("Idempotency-Key", "whole")
        .json(&json!({"items": [{"flow_id": "demo.echo"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert_eq!(crate::helpers::problem_code(res).await, "invalid_batch");
    // Not JSON.
    let res = app
        .as_tenant(reqwest::Method::POST, "/api/executions/batch", "acme")
        .body("items=1")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    // Nothing was admitted by any of them.
    assert_eq!(app.page("acme", "").await["total"], 0);
    // A body over --body-limit but within --batch-body-limit is taken.
    let (status, answer) = batch(&app, "acme", &json!({"items": vec![item; 40]})).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(app.page("acme", "").await["total"], 40);
}

/// Only editors and above send batches, for their own tenant only.
#[tokio::test]
async fn a_batch_needs_the_editor_role_of_its_tenant() {
    let app = TestApp::spawn().await;
    app.create_tenant("acme").await;
    app.create_tenant("other").await;
    let body = json!({"items": [{"flow_id": "demo.echo"}]});
    for (role, want) in [
        ("viewer", StatusCode::FORBIDDEN),
        ("worker", StatusCode::FORBIDDEN),
        ("editor", StatusCode::OK),
        ("admin", StatusCode::OK),
    ] {
        let token = app.key_token("acme", role).await;
        let res = app
            .client
            .post(app.url("/api/executions/batch"))
            .bearer_auth(&token)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), want, "{role}");
    }
    assert_eq!(app.page("acme", "").await["total"], 2);
    assert_eq!(app.page("other", "").await["total"], 0);
    let res = app
        .client
        .post(app.url("/api/executions/batch"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
}

/// While a batch of the tenant is in flight (here: another server's, seen by its mark on
/// Redis) a second is refused with 409 and writes nothing; other tenants' batches go on.
#[tokio::test]
async fn one_batch_per_tenant_at_a_time() {
    let app = TestApp::spawn().await;
    let key = app
        .shard("acme")
        .batch_lock(&sluice::domain::TenantId::parse("acme").unwrap());
    let () = app
        .redis
        .query(
            redis::cmd("SET")
                .arg(&key)
                .arg("another-server")
                .arg("PX")
                .arg(60_000),
        )
        .await;
    let body = json!({"items": [{"flow_id": "demo.echo"}]});
    let (status, answer) = batch(&app, "acme", &body).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(answer["code"], "batch_in_flight");
    assert_eq!(app.page("acme", "").await["total"], 0);
    let (status, _) = batch(&app, "globex", &body).await;
    assert_eq!(status, StatusCode::OK);
    // Its right is the other server's: left alone. Once it is gone, batches go on, and a
    // finished batch gives its own right back.
    let held: Option<String> = app.redis.query(redis::cmd("GET").arg(&key)).await;
    assert_eq!(held.as_deref(), Some("another-server"));
    let () = app.redis.query(redis::cmd("DEL").arg(&key)).await;
    for _ in 0..2 {
        let (status, answer) = batch(&app, "acme", &body).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
    }
    let held: Option<String> = app.redis.query(redis::cmd("GET").arg(&key)).await;
    assert_eq!(held, None);
    assert_eq!(app.page("acme", "").await["total"], 2);
}

/// Redis stalls past the time-out under a batch: every item's answer is true of the data —
/// 201 names an execution that exists, 503 `redis_unavailable` (settled as void) or
/// `not_admitted` (never sent) one that never will.
///
/// Whether the stall lands inside a batch is up to the machine's timing, so each round checks
/// it instead of hoping: writes are paused once the batch's first items are written, and then
/// the queued executions of the tenant are counted (a read, which the pause lets through).
/// Fewer than the batch's 1,000 more than before the round means the stall caught the batch
/// with items unwritten, and then some item must lose its answer: the pause outlasts a call's
/// time-out (300 ms) by 1.2 s or more, so even a call the loaded machine sends late into the
/// pause runs out of time. Calls of 4 items
/// (250 of them, in turn) keep the batch under way long enough that rounds overlap on a busy
/// machine; the test fails if none did in 8 rounds, rather than pass having proven nothing.
#[tokio::test]
async fn a_stalled_batch_answers_each_item_truly() {
    let app = TestApp::spawn_with(|c| {
        c.redis.redis_timeout_ms = 300;
        c.redis.redis_admission_group = 4;
        // A stalled batch settles its lost call at once and sends nothing more: it answers
        // well within the request's bound, whatever its size.
        c.api.request_timeout_ms = 5_000;
    })
    .await;
    let tenant = sluice::domain::TenantId::parse("acme").unwrap();
    let listing = app.shard("acme").listing(&tenant);
    let (queued_min, queued_max) =
        sluice::store::keys::listing_range(Some(sluice::domain::Status::Queued));
    let mut overlapped = 0;
    for round in 0..8u64 {
        if overlapped >= 2 {
            break;
        }
        let items: Vec<Value> = (0..1_000)
            .map(|n| json!({"flow_id": "demo.echo", "params": {"nonce": format!("{round}-{n}")}}))
            .collect();
        let mut probe = app.redis.conn().await;
        // The tenant's queued executions: a read, so the write pause lets it through.
        let mut count_queued = redis::cmd("ZLEXCOUNT");
        count_queued.arg(&listing).arg(&queued_min).arg(&queued_max);
        let queued_before: u64 = count_queued.query_async(&mut probe).await.unwrap();
        // Once the batch has written its first items (it is under way and sending), writes
        // stop past the time-out: its calls from then on run into the stall.
        let pause = {
            let mut nodes = Vec::new();
            for i in 0..app.redis.masters() {
                nodes.push(app.redis.node_conn(i).await);
            }
            tokio::spawn(async move {
                let deadline = Instant::now() + Duration::from_secs(10);
                while Instant::now() < deadline {
                    let queued: u64 = count_queued.query_async(&mut probe).await.unwrap();
                    if queued > queued_before {
                        break;
                    }
                }
                for mut c in nodes {
                    let () = redis::cmd("CLIENT")
                        .arg("PAUSE")
                        .arg(1_500 + 250 * (round % 3))
                        .arg("WRITE")
                        .query_async(&mut c)
                        .await
                        .unwrap();
                }
                // Writes are paused from here: what is queued now is all the batch wrote.
                let queued: u64 = count_queued.query_async(&mut probe).await.unwrap();
                queued - queued_before
            })
        };
        let (status, answer) = batch(&app, "acme", &json!({"items": items})).await;
        let written_before_stall = pause.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{answer}");
        // Writes go through again: any late call has run.
        let deadline = Instant::now() + Duration::from_secs(15);
        while app
            .post_execution("acme", &json!({"flow_id": "demo.echo"}))
            .await
            .status()
            != StatusCode::CREATED
        {
            assert!(Instant::now() < deadline, "admissions did not come back");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let found = app.admitted_by_nonce("acme").await;
        let mut lost = 0;
        for (n, r) in results(&answer).iter().enumerate() {
            let nonce = format!("{round}-{n}");
            let here = found.get(&nonce).map_or(0, Vec::len);
            match (r["status"].as_u64(), r["problem"]["code"].as_str()) {
                (Some(201), _) => assert_eq!(here, 1, "{nonce}: {r}"),
                (Some(503), Some(code @ ("redis_unavailable" | "not_admitted"))) => {
                    // Settled as void, or never sent after a call went unanswered.
                    lost += 1;
                    assert_eq!(here, 0, "{nonce}: 503 {code}, yet admitted");
                }
                (Some(503), Some("admission_outcome_unknown")) => {
                    lost += 1;
                    assert!(here <= 1, "{nonce}");
                }
                other => panic!("{nonce}: unexpected {other:?}: {r}"),
            }
        }
        if written_before_stall < 1_000 {
            overlapped += 1;
            assert!(
                lost > 0,
                "round {round}: the stall caught the batch at {written_before_stall} of 1000 \
                 written, yet no item lost its answer"
            );
        }
    }
    assert!(
        overlapped > 0,
        "in 8 rounds the stall never caught a batch under way"
    );
}

/// Redis is slow but answers (kept busy by other clients' 100 ms scripts, far shorter than a
/// call's time-out), so a batch of 1,000 cannot be admitted within the request's bound. The
/// request is not answered 503 as a whole: it answers 200 with one result per item, the admitted ones
/// 201, the ones never sent 503 `not_admitted` (nothing of them on Redis), and its
/// `batch_in_flight` mark is given back, so the same batch sent again at once is admitted (the
/// first part as replays), not refused with 409. Before, the whole batch answered 503 although
/// hundreds of its items were admitted, and the mark stayed until it expired.
#[tokio::test]
async fn a_batch_cut_by_the_request_bound_answers_each_item_and_gives_back_its_mark() {
    let app = TestApp::spawn_with(|c| {
        c.redis.redis_timeout_ms = 500;
        c.api.request_timeout_ms = 5_000;
        c.api.webhook_delivery = false;
    })
    .await;
    let items: Vec<Value> = (0..1_000)
        .map(|n| {
            json!({"flow_id": "demo.echo", "dedup_key": format!("k-{n}"),
                   "params": {"nonce": format!("n-{n}")}})
        })
        .collect();
    let body = json!({ "items": items });
    // Redis kept busy: on the master holding the tenant's shard (the batch's every call and its
    // mark go there), one client after the other runs a script that spins for 100 ms. Redis
    // serves its clients in turn, so each of the batch's 63 calls waits for up to one of them
    // (about one: 16 calls took 1.9 s here): never as slow as its time-out (500 ms), and the
    // whole batch about 7 s, past the last moment to send (5 s − 2 × 500 ms − 100 ms). Its
    // first call must go out before that moment, and the body is read first, on the nice +10
    // parsing thread, which gets little of a core beside busy processes at nice 0: with every
    // master of a cluster spinning (three such processes on two cores) and a bound of 3 s, the
    // first call went out at that moment under load (1 or 2 calls of 16 items sent with 8
    // `yes` burners) or after it (none, or the whole request 503, with 16). One spinner and
    // 3.9 s to send leave the reading room: 36 calls sent idle, 28 with 8 burners, 20 with 16.
    let master = match app.redis.is_cluster() {
        true => app.master_of("acme").await,
        false => 0,
    };
    let slow = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let spinner = {
        let slow = slow.clone();
        let mut c = app.redis.node_conn(master).await;
        tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(60);
            let spin = "local t = redis.call('TIME') \
                        local start = t[1] * 1000000 + t[2] \
                        repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] - start >= 100000";
            while slow.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < deadline {
                let () = redis::cmd("EVAL")
                    .arg(spin)
                    .arg(0)
                    .query_async(&mut c)
                    .await
                    .unwrap();
            }
        })
    };
    let (status, answer) = batch(&app, "acme", &body).await;
    slow.store(false, std::sync::atomic::Ordering::Relaxed);
    spinner.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{answer}");
    let first = results(&answer);
    assert_eq!(first.len(), 1_000);
    // Writes go through again: any late call has run once an admission passes.
    let deadline = Instant::now() + Duration::from_secs(15);
    while app
        .post_execution("globex", &json!({"flow_id": "demo.echo"}))
        .await
        .status()
        != StatusCode::CREATED
    {
        assert!(Instant::now() < deadline, "admissions did not come back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let found = app.admitted_by_nonce("acme").await;
    let mut count = std::collections::BTreeMap::<String, usize>::new();
    for (n, r) in first.iter().enumerate() {
        let nonce = format!("n-{n}");
        let here = found.get(&nonce).map_or(0, Vec::len);
        let code = r["problem"]["code"].as_str().unwrap_or("");
        *count.entry(format!("{} {code}", r["status"])).or_default() += 1;
        match (r["status"].as_u64(), code) {
            (Some(201), _) => assert_eq!(here, 1, "{nonce}: {r}"),
            (Some(503), "not_admitted" | "redis_unavailable") => {
                assert_eq!(here, 0, "{nonce}: 503 {code}, yet admitted")
            }
            (Some(503), "admission_outcome_unknown") => assert!(here <= 1, "{nonce}"),
            other => panic!("{nonce}: unexpected {other:?}: {r}"),
        }
    }
    // The bound cut it: a first part was admitted, the rest never sent.
    assert!(count.get("201 ").copied().unwrap_or(0) > 0, "{count:?}");
    assert!(
        count.get("503 not_admitted").copied().unwrap_or(0) > 0,
        "{count:?}"
    );
    // Sent again at once: the mark was given back, so it is admitted (what the first admitted
    // replays), not refused. Then what is still out, as a client would, until all is in (a busy
    // machine may cut these too).
    let mut ids: Vec<Option<Value>> = first
        .iter()
        .map(|r| (r["status"] == 201).then(|| r["execution"]["execution_id"].clone()))
        .collect();
    for round in 0..20 {
        let out: Vec<usize> = match round {
            0 => (0..ids.len()).collect(),
            _ => (0..ids.len()).filter(|n| ids[*n].is_none()).collect(),
        };
        if out.is_empty() {
            break;
        }
        let items: Vec<Value> = out.iter().map(|n| body["items"][*n].clone()).collect();
        let (status, again) = batch(&app, "acme", &json!({ "items": items })).await;
        assert_eq!(status, StatusCode::OK, "round {round}: {again}");
        for (n, r) in out.iter().copied().zip(results(&again)) {
            match (r["status"].as_u64(), &ids[n]) {
                (Some(200), Some(id)) => assert_eq!(&r["execution"]["execution_id"], id),
                (Some(200 | 201), None) => ids[n] = Some(r["execution"]["execution_id"].clone()),
                // Not sent by this request (it was cut again): says nothing of earlier ones.
                (Some(503), _) if r["problem"]["code"] == "not_admitted" => {}
                _ => panic!("round {round}, item {n}: {r}"),
            }
        }
    }
    assert!(ids.iter().all(Option::is_some), "not every item got in");
    let found = app.admitted_by_nonce("acme").await;
    assert_eq!(found.len(), 1_000);
    assert!(found.values().all(|ids| ids.len() == 1));
}
