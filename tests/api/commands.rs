//! What an execution's script calls ask Redis, command by command (issue 39: Redis work per
//! execution). Each call reads what it does not know yet once: a fact a call has just read
//! or written (its tenant is outside the runnable set, its order is not empty, how many slots
//! it holds, the shard's clock and eligible weight) is not asked for again in the same call.
//! The commands come from `MONITOR` on every master (its `lua` lines follow the `fcall` that
//! ran them), so each test sees exactly what one operation's call ran.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

use crate::helpers::TestApp;

/// The marker that ends a recording (an `ECHO` on every master).
const END: &str = "sluice-commands-end";

/// `MONITOR` on every master, from `start` until `finish`.
struct Recording {
    readers: Vec<JoinHandle<Vec<String>>>,
}

impl Recording {
    /// Starts recording; returns once every master has acknowledged `MONITOR`.
    async fn start(app: &TestApp) -> Self {
        let mut readers = Vec::new();
        for i in 0..app.redis.masters() {
            let mut stream = TcpStream::connect(app.redis.node_address(i)).await.unwrap();
            stream.write_all(b"MONITOR\r\n").await.unwrap();
            let mut lines = BufReader::new(stream).lines();
            let ok = lines.next_line().await.unwrap().unwrap();
            assert_eq!(ok, "+OK");
            readers.push(tokio::spawn(async move {
                let mut out = Vec::new();
                // Bounded: the marker comes within seconds, and no test records 100 000 lines.
                while out.len() < 100_000 {
                    let Ok(Ok(Some(line))) =
                        tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await
                    else {
                        panic!("MONITOR ended without the end marker");
                    };
                    if line.contains(END) {
                        break;
                    }
                    out.push(line);
                }
                out
            }));
        }
        Recording { readers }
    }

    /// Ends the recording: every call each master ran meanwhile, as (operation, commands).
    async fn finish(self, app: &TestApp) -> Vec<(String, Vec<Vec<String>>)> {
        for i in 0..app.redis.masters() {
            let mut c = app.redis.node_conn(i).await;
            let _: String = redis::cmd("ECHO")
                .arg(END)
                .query_async(&mut c)
                .await
                .unwrap();
        }
        let mut calls = Vec::new();
        for r in self.readers {
            calls.extend(script_calls(&r.await.unwrap()));
        }
        calls
    }
}

/// A `MONITOR` line's client (`lua` for a command a script ran) and arguments.
fn parse(line: &str) -> Option<(String, Vec<String>)> {
    let (_, rest) = line.split_once(" [")?;
    let (client, mut rest) = rest.split_once("] ")?;
    let client = client.split_once(' ').map_or(client, |(_, c)| c).to_owned();
    let mut args = Vec::new();
    while let Some(start) = rest.find('"') {
        let mut arg = String::new();
        let mut chars = rest[start + 1..].char_indices();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, e)) = chars.next() {
                        arg.push(e);
                    }
                }
                '"' => {
                    end = Some(start + 1 + i + 1);
                    break;
                }
                c => arg.push(c),
            }
        }
        args.push(arg);
        rest = &rest[end?..];
    }
    Some((client, args))
}

/// The script calls of one master's lines, in order: each `fcall`'s operation (the library
/// function's name without its library prefix) and the commands it ran (lower-case names).
fn script_calls(lines: &[String]) -> Vec<(String, Vec<Vec<String>>)> {
    let mut calls: Vec<(String, Vec<Vec<String>>)> = Vec::new();
    let mut open = false;
    for line in lines {
        let Some((client, mut args)) = parse(line) else {
            continue;
        };
        if args.is_empty() {
            continue;
        }
        args[0] = args[0].to_lowercase();
        if client == "lua" {
            if open {
                calls.last_mut().unwrap().1.push(args);
            }
        } else if args[0].starts_with("fcall") && args.len() > 1 {
            let op = args[1].rsplit('_').next().unwrap().to_owned();
            calls.push((op, Vec::new()));
            open = true;
        } else {
            open = false;
        }
    }
    calls
}

/// The commands of the one call of `op` in `calls`.
fn one_call<'a>(calls: &'a [(String, Vec<Vec<String>>)], op: &str) -> &'a [Vec<String>] {
    let found: Vec<_> = calls.iter().filter(|(o, _)| o == op).collect();
    assert_eq!(found.len(), 1, "calls of {op}: {calls:?}");
    &found[0].1
}

/// How many of `commands` are `name` on a key ending in `key_suffix`.
fn count(commands: &[Vec<String>], name: &str, key_suffix: &str) -> usize {
    commands
        .iter()
        .filter(|c| c[0] == name && c.get(1).is_some_and(|k| k.ends_with(key_suffix)))
        .count()
}

/// `(what, how many)` of each `(what, name, key suffix)` in `commands`: one assertion compares
/// them all, so a failure shows every count that moved.
fn counts(
    commands: &[Vec<String>],
    wanted: &[(&'static str, &str, &str)],
) -> Vec<(&'static str, usize)> {
    wanted
        .iter()
        .map(|&(what, name, suffix)| (what, count(commands, name, suffix)))
        .collect()
}

/// The commands as text, one per line, for a failure's message.
fn listing(commands: &[Vec<String>]) -> String {
    commands
        .iter()
        .map(|c| c.join(" "))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Leases up to `max` runs of `tenant` through the pull API (worker `ops`): (id, fence).
async fn lease(app: &TestApp, tenant: &str, max: usize) -> Vec<(String, u64)> {
    let res = app
        .as_tenant(Method::POST, "/api/worker/lease", tenant)
        .json(&json!({"worker_id": "ops", "max": max, "tenants": [tenant], "lease": "60s"}))
        .send()
        .await
        .unwrap();
    let status = res.status();
    let answer: Value = res.json().await.unwrap();
    assert_eq!(status, StatusCode::OK, "{answer}");
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

/// Reports run `(id, fence)` of worker `ops` completed.
async fn complete(app: &TestApp, tenant: &str, run: &(String, u64)) {
    let res = app
        .as_tenant(
            Method::POST,
            &format!("/api/worker/runs/{}/complete", run.0),
            tenant,
        )
        .json(&json!({"worker_id": "ops", "fence": run.1, "outcome": "completed", "output": {}}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        res.status(),
        StatusCode::OK,
        "{}",
        res.text().await.unwrap()
    );
}

#[tokio::test]
async fn an_admission_that_makes_its_tenant_runnable_asks_each_thing_once() {
    let app = TestApp::spawn().await;
    let rec = Recording::start(&app).await;
    let res = app
        .post_execution(
            "acme",
            &json!({"flow_id": "demo.echo", "params": {}, "dedup_key": "k-1"}),
        )
        .await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let answer: Value = res.json().await.unwrap();
    let calls = rec.finish(&app).await;
    let admit = one_call(&calls, "admit");
    let text = listing(admit);
    // It put the tenant in the runnable set: whether it was there is not read (it had nothing
    // queued, and the set holds only tenants with a queue; the entry is NX), its order is
    // known not to be empty (the admission has just joined it), and the slots it holds are
    // counted once, for its eligibility and its queue state both.
    let got = counts(
        admit,
        &[
            ("joins the runnable set", "zadd", ":runnable"),
            ("reads whether it is in it", "zscore", ":runnable"),
            (
                "asks whether its order is empty",
                "exists",
                ":t:acme:waiting",
            ),
            ("counts its slots", "scard", ":t:acme:slots"),
        ],
    );
    assert_eq!(
        got,
        vec![
            ("joins the runnable set", 1),
            ("reads whether it is in it", 0),
            ("asks whether its order is empty", 0),
            ("counts its slots", 1),
        ],
        "the admission's commands:\n{text}"
    );
    // And its answer (from the slot count it took once) still says where it stands: ready,
    // first of its tenant.
    assert_eq!(answer["queue_state"], "ready", "{answer}");
    assert_eq!(answer["queue_position"]["tenant"], 0, "{answer}");
}

#[tokio::test]
async fn an_admission_behind_queued_work_reads_whether_its_tenant_is_runnable_and_stays_put() {
    // A tenant with work queued may be in the runnable set: the admission asks (once) and,
    // finding it there, leaves its place in the fair share and the shard's weight as they are.
    let app = TestApp::spawn().await;
    let shard = app.shard("acme");
    app.admit_with("acme", json!({"flow_id": "demo.echo", "params": {"n": 0}}))
        .await;
    let score = || async {
        let s: Option<String> = app
            .redis
            .query(redis::cmd("ZSCORE").arg(shard.runnable()).arg("acme"))
            .await;
        s
    };
    let before = (score().await, sched_field(&app, "acme", "weight").await);
    assert_eq!(before.1.as_deref(), Some("1"));
    let rec = Recording::start(&app).await;
    let res = app
        .post_execution("acme", &json!({"flow_id": "demo.echo", "params": {"n": 1}}))
        .await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let answer: Value = res.json().await.unwrap();
    let calls = rec.finish(&app).await;
    let admit = one_call(&calls, "admit");
    let text = listing(admit);
    assert_eq!(
        counts(
            admit,
            &[
                ("reads whether it is in it", "zscore", ":runnable"),
                ("joins the runnable set", "zadd", ":runnable"),
                ("adds to the eligible weight", "hincrby", ":sched"),
            ],
        ),
        vec![
            ("reads whether it is in it", 1),
            ("joins the runnable set", 0),
            ("adds to the eligible weight", 0),
        ],
        "the admission's commands:\n{text}"
    );
    let after = (score().await, sched_field(&app, "acme", "weight").await);
    assert_eq!(before, after);
    assert_eq!(answer["queue_position"]["tenant"], 1, "{answer}");
}

#[tokio::test]
async fn an_idle_tenant_found_in_the_runnable_set_keeps_its_place_and_weight_once() {
    // An admission of a tenant with nothing queued does not ask whether it is runnable (the
    // set holds tenants with a queue). Should the set hold it all the same (drift the
    // sweeper repairs; here written by hand), the entry must not move its virtual time nor
    // count its weight a second time: what the ZSCORE used to guard, the ZADD's NX does.
    let app = TestApp::spawn().await;
    let shard = app.shard("acme");
    let stale_score = "7000";
    let _: i64 = app
        .redis
        .query(
            redis::cmd("ZADD")
                .arg(shard.runnable())
                .arg(stale_score)
                .arg("acme"),
        )
        .await;
    let _: i64 = app
        .redis
        .query(redis::cmd("HSET").arg(shard.sched()).arg("weight").arg("1"))
        .await;
    let rec = Recording::start(&app).await;
    let res = app
        .post_execution("acme", &json!({"flow_id": "demo.echo", "params": {}}))
        .await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let calls = rec.finish(&app).await;
    let admit = one_call(&calls, "admit");
    let text = listing(admit);
    assert_eq!(
        counts(
            admit,
            &[("reads whether it is in it", "zscore", ":runnable")]
        ),
        vec![("reads whether it is in it", 0)],
        "the admission's commands:\n{text}"
    );
    let score: Option<String> = app
        .redis
        .query(redis::cmd("ZSCORE").arg(shard.runnable()).arg("acme"))
        .await;
    assert_eq!(score.as_deref(), Some(stale_score));
    assert_eq!(
        sched_field(&app, "acme", "weight").await.as_deref(),
        Some("1")
    );
    // And the run starts, as from any runnable tenant.
    let runs = lease(&app, "acme", 1).await;
    assert_eq!(runs.len(), 1);
}

#[tokio::test]
async fn a_start_that_empties_its_tenant_writes_the_schedule_once() {
    let app = TestApp::spawn().await;
    let id = app
        .admit_with("acme", json!({"flow_id": "demo.echo", "params": {}}))
        .await;
    let rec = Recording::start(&app).await;
    let runs = lease(&app, "acme", 1).await;
    let calls = rec.finish(&app).await;
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].0, id);
    let start = one_call(&calls, "start");
    let text = listing(start);
    // The tenant leaves the runnable set with nothing left: the shard's clock and the
    // tenant's virtual time go in one write, and the clock is not read back.
    let got = counts(
        start,
        &[
            ("leaves the runnable set", "zrem", ":runnable"),
            ("reads the schedule", "hget", ":sched"),
            ("writes the schedule", "hset", ":sched"),
        ],
    );
    assert_eq!(
        got,
        vec![
            ("leaves the runnable set", 1),
            ("reads the schedule", 0),
            ("writes the schedule", 1),
        ],
        "the start's commands:\n{text}"
    );
    let writes: Vec<_> = start
        .iter()
        .filter(|c| c[0] == "hset" && c[1].ends_with(":sched"))
        .collect();
    assert!(
        writes[0].contains(&"clock".to_owned()) && writes[0].contains(&"vt:acme".to_owned()),
        "{text}"
    );
}

#[tokio::test]
async fn a_pull_completion_reads_nothing_of_the_shard_it_does_not_answer() {
    // The pull API answers a completion's outcome alone: the call reads neither the shard's
    // next due time nor its eligible weight, which the worker's completions answer.
    let app = TestApp::spawn().await;
    app.admit_with("acme", json!({"flow_id": "demo.echo", "params": {"n": 1}}))
        .await;
    // Something on the timer set, so a due time would be there to read.
    app.admit_with(
        "acme",
        json!({"flow_id": "demo.echo", "params": {"n": 2}, "delay": "1h"}),
    )
    .await;
    let runs = lease(&app, "acme", 1).await;
    assert_eq!(runs.len(), 1);
    let rec = Recording::start(&app).await;
    complete(&app, "acme", &runs[0]).await;
    let calls = rec.finish(&app).await;
    let done = one_call(&calls, "complete");
    let text = listing(done);
    assert_eq!(
        counts(
            done,
            &[
                ("reads the next due time", "zrange", ":delayed"),
                ("reads the eligible weight", "hget", ":sched"),
            ],
        ),
        vec![
            ("reads the next due time", 0),
            ("reads the eligible weight", 0),
        ],
        "the completion's commands:\n{text}"
    );
}

#[tokio::test]
async fn a_completion_that_frees_a_slot_asks_each_thing_once() {
    let app = TestApp::spawn().await;
    app.put_tenant("acme", &json!({"max_concurrent": 1})).await;
    let first = app
        .admit_with("acme", json!({"flow_id": "demo.echo", "params": {"n": 1}}))
        .await;
    let second = app
        .admit_with("acme", json!({"flow_id": "demo.echo", "params": {"n": 2}}))
        .await;
    let runs = lease(&app, "acme", 2).await;
    assert_eq!(runs.len(), 1, "max_concurrent 1 starts one");
    assert_eq!(runs[0].0, first);
    let rec = Recording::start(&app).await;
    complete(&app, "acme", &runs[0]).await;
    let calls = rec.finish(&app).await;
    let done = one_call(&calls, "complete");
    let text = listing(done);
    // The freed slot makes the waiting tenant runnable again: whether it was runnable is read
    // once, and the eligible weight the call answers is the one its own write returned.
    let got = counts(
        done,
        &[
            ("joins the runnable set", "zadd", ":runnable"),
            ("reads whether it is in it", "zscore", ":runnable"),
            ("adds to the eligible weight", "hincrby", ":sched"),
            ("reads the schedule", "hget", ":sched"),
        ],
    );
    assert_eq!(
        got,
        vec![
            ("joins the runnable set", 1),
            ("reads whether it is in it", 1),
            ("adds to the eligible weight", 1),
            ("reads the schedule", 0),
        ],
        "the completion's commands:\n{text}"
    );
    // The second one starts next.
    let next = lease(&app, "acme", 1).await;
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].0, second);
}

#[tokio::test]
async fn the_eligible_weight_a_call_answers_is_the_shards() {
    // A start and a completion answer the shard's eligible weight (the worker shares its
    // slots between shards by it) from their own write of it, not from a read: it must be
    // what a read after the call finds.
    use sluice::store::Outcome;
    let app = TestApp::spawn().await;
    app.put_tenant("acme", &json!({"max_concurrent": 1, "weight": 5}))
        .await;
    let shard = app.shard("acme");
    for n in 0..2 {
        app.admit_with("acme", json!({"flow_id": "demo.echo", "params": {"n": n}}))
            .await;
    }
    let store = app.store().await;
    let weight_on_redis = || async {
        let w: Option<u64> = app
            .redis
            .query(
                redis::cmd("HGET")
                    .arg(format!("{}sched", shard.prefix()))
                    .arg("weight"),
            )
            .await;
        w.unwrap_or(0)
    };
    let ttl = Duration::from_secs(60);
    // The start takes its one slot: the tenant leaves the runnable set, its weight with it.
    let batch = store.start(shard, "w", 4, ttl, 0).await.unwrap();
    assert_eq!(batch.started.len(), 1);
    assert_eq!((batch.weight, weight_on_redis().await), (0, 0));
    // The completion frees it: the tenant, with its second execution, is back.
    let run = &batch.started[0];
    let (_, chained) = store
        .complete_and_start(
            shard,
            &run.id,
            run.fence,
            "w",
            &Outcome::Completed(json!({})),
            0,
            ttl,
            0,
        )
        .await
        .unwrap();
    assert_eq!((chained.weight, weight_on_redis().await), (5, 5));
}

#[tokio::test]
async fn a_completion_that_leaves_nothing_runnable_answers_a_weight_of_zero_unread() {
    // A completion that looks for the next run on its slot (a busy worker's) and finds no
    // runnable tenant knows the shard's eligible weight is 0: it answers that without a read,
    // and a read after the call agrees. Nor does it read its worker's adoption barrier (which
    // only bars starts: there is nothing to start).
    use sluice::store::Outcome;
    let app = TestApp::spawn().await;
    let shard = app.shard("acme");
    app.admit_with("acme", json!({"flow_id": "demo.echo", "params": {}}))
        .await;
    let store = app.store().await;
    let ttl = Duration::from_secs(60);
    let batch = store.start(shard, "w", 4, ttl, 0).await.unwrap();
    assert_eq!(batch.started.len(), 1);
    let run = &batch.started[0];
    let rec = Recording::start(&app).await;
    let (_, chained) = store
        .complete_and_start(
            shard,
            &run.id,
            run.fence,
            "w",
            &Outcome::Completed(json!({})),
            1,
            ttl,
            // A numbered call, as `sluice worker` makes them (0 would skip the barrier).
            1,
        )
        .await
        .unwrap();
    let calls = rec.finish(&app).await;
    let done = one_call(&calls, "complete");
    let text = listing(done);
    assert!(chained.started.is_empty());
    let got = counts(
        done,
        &[
            ("looks for a runnable tenant", "zrange", ":runnable"),
            ("reads the schedule", "hget", ":sched"),
            ("reads the adoption barrier", "get", ":adopted:w"),
        ],
    );
    assert_eq!(
        got,
        vec![
            ("looks for a runnable tenant", 1),
            ("reads the schedule", 0),
            ("reads the adoption barrier", 0),
        ],
        "the completion's commands:\n{text}"
    );
    let on_redis: Option<u64> = app
        .redis
        .query(
            redis::cmd("HGET")
                .arg(format!("{}sched", shard.prefix()))
                .arg("weight"),
        )
        .await;
    assert_eq!((chained.weight, on_redis.unwrap_or(0)), (0, 0));
}

/// A tenant of `tenant`'s shard other than it (bounded search over generated names).
fn shard_mate(app: &TestApp, tenant: &str) -> String {
    (0..10_000)
        .map(|i| format!("mate{i}"))
        .find(|t| app.shard(t) == app.shard(tenant))
        .expect("a tenant of the same shard among 10 000 names")
}

/// A field of a shard's `sched` hash (the fair share's bookkeeping), if set.
#[tokio::test]
async fn a_start_of_many_runs_writes_the_shards_clock_once_as_the_last_round_left_it() {
    // A worker's start of five runs of one tenant that stays runnable: each round moves the
    // shard's clock to the tenant's virtual time, and only the last survives the call, so it
    // is written once, to what five calls of one would leave (the virtual time before the
    // last start: each start adds the same QUANTUM / weight).
    let app = TestApp::spawn().await;
    let shard = app.shard("acme");
    let store = app.store().await;
    for n in 0..8 {
        app.admit_with("acme", json!({"flow_id": "demo.echo", "params": {"n": n}}))
            .await;
    }
    let score = || async {
        let s: f64 = app
            .redis
            .query(redis::cmd("ZSCORE").arg(shard.runnable()).arg("acme"))
            .await;
        s
    };
    let before = score().await;
    let rec = Recording::start(&app).await;
    let five = store
        .start(shard, "w", 5, Duration::from_secs(60), 0)
        .await
        .unwrap();
    let calls = rec.finish(&app).await;
    assert_eq!(five.started.len(), 5);
    let after = score().await;
    let start = one_call(&calls, "start");
    let text = listing(start);
    assert_eq!(
        counts(start, &[("writes the schedule", "hset", ":sched")]),
        vec![("writes the schedule", 1)],
        "the start's commands:\n{text}"
    );
    let clock: f64 = sched_field(&app, "acme", "clock")
        .await
        .unwrap()
        .parse()
        .unwrap();
    assert!(after > before, "{before} {after}");
    let last = before + (after - before) * 4.0 / 5.0;
    assert!(
        (clock - last).abs() < 1e-9,
        "clock {clock}, last round's {last}"
    );
}

async fn sched_field(app: &TestApp, tenant: &str, field: &str) -> Option<String> {
    app.redis
        .query(redis::cmd("HGET").arg(app.shard(tenant).sched()).arg(field))
        .await
}

#[tokio::test]
async fn a_tenant_back_in_the_runnable_set_gets_no_credit_from_its_kept_virtual_time() {
    // The shard keeps a tenant's virtual time (`vt:<tenant>`) when it leaves the runnable set
    // and reads it only when it comes back, at max(kept, clock); every leave writes it, so an
    // entry leaves it as it stands (no HDEL). What must hold: a tenant coming back after the
    // clock passed its kept time starts at the clock, not before it — the start log's tags
    // never go down — and its next leave writes its new time.
    let app = TestApp::spawn().await;
    let beta = shard_mate(&app, "acme");
    let shard = app.shard("acme");
    let store = app.store().await;
    let ttl = Duration::from_secs(60);
    app.admit_with("acme", json!({"flow_id": "demo.echo", "params": {"n": 0}}))
        .await;
    let first = store.start(shard, "w", 1, ttl, 0).await.unwrap();
    assert_eq!(first.started.len(), 1);
    // acme left with its time 0 + 1000 kept.
    assert_eq!(
        sched_field(&app, "acme", "vt:acme").await.as_deref(),
        Some("1000")
    );
    // beta starts five of six: tags 0..4000, the clock at 4000, beta stays at 5000.
    for n in 0..6 {
        app.admit_with(&beta, json!({"flow_id": "demo.echo", "params": {"n": n}}))
            .await;
    }
    let flood = store.start(shard, "w", 5, ttl, 0).await.unwrap();
    assert_eq!(flood.started.len(), 5);
    assert!(flood.started.iter().all(|r| r.tenant.as_str() == beta));
    // acme comes back: the admission puts it in the set and writes nothing of its kept time.
    let rec = Recording::start(&app).await;
    app.admit_with("acme", json!({"flow_id": "demo.echo", "params": {"n": 1}}))
        .await;
    let calls = rec.finish(&app).await;
    let admit = one_call(&calls, "admit");
    let text = listing(admit);
    let got = counts(
        admit,
        &[
            ("joins the runnable set", "zadd", ":runnable"),
            ("reads the schedule", "hmget", ":sched"),
            ("deletes from the schedule", "hdel", ":sched"),
        ],
    );
    assert_eq!(
        got,
        vec![
            ("joins the runnable set", 1),
            ("reads the schedule", 1),
            ("deletes from the schedule", 0),
        ],
        "the admission's commands:\n{text}"
    );
    // At the clock (4000), ahead of beta (5000): it starts next, at tag 4000, not 1000.
    let next = store.start(shard, "w", 1, ttl, 0).await.unwrap();
    assert_eq!(next.started.len(), 1);
    assert_eq!(next.started[0].tenant.as_str(), "acme");
    let log = app.start_log("acme").await;
    let tags: Vec<(String, f64)> = log.iter().map(|(t, vt, _)| (t.clone(), *vt)).collect();
    assert_eq!(tags.len(), 7, "{tags:?}");
    assert_eq!(tags[6], ("acme".to_owned(), 4000.0), "{tags:?}");
    assert!(
        tags.windows(2).all(|w| w[0].1 <= w[1].1),
        "the start log's tags went down: {tags:?}"
    );
    // It left again: its kept time is the new one.
    assert_eq!(
        sched_field(&app, "acme", "vt:acme").await.as_deref(),
        Some("5000")
    );
}

#[tokio::test]
async fn a_start_knows_from_the_eligible_weight_whether_a_tenant_is_left() {
    // A start whose tenant leaves the runnable set learns from its own HINCRBY of the
    // eligible weight whether any tenant is left (weights are at least 1): it asks the set
    // nothing more, and still answers `more`, sets or clears the doorbell and answers the
    // weight exactly as a read would.
    let app = TestApp::spawn().await;
    let beta = shard_mate(&app, "acme");
    let shard = app.shard("acme");
    let store = app.store().await;
    let ttl = Duration::from_secs(60);
    app.put_tenant(&beta, &json!({"weight": 3})).await;
    app.admit_with("acme", json!({"flow_id": "demo.echo", "params": {}}))
        .await;
    app.admit_with(&beta, json!({"flow_id": "demo.echo", "params": {}}))
        .await;
    let bell = || async {
        let n: u64 = app.redis.query(redis::cmd("ZCARD").arg(shard.bell())).await;
        n
    };
    // One start of the two: its tenant leaves, the other is left.
    let rec = Recording::start(&app).await;
    let one = store.start(shard, "w", 1, ttl, 0).await.unwrap();
    let calls = rec.finish(&app).await;
    assert_eq!(one.started.len(), 1);
    let first = one.started[0].tenant.as_str().to_owned();
    let start = one_call(&calls, "start");
    let text = listing(start);
    assert_eq!(
        counts(
            start,
            &[
                ("looks at the set", "zrange", ":runnable"),
                ("asks whether it is empty", "exists", ":runnable"),
            ]
        ),
        vec![("looks at the set", 1), ("asks whether it is empty", 0)],
        "the start's commands:\n{text}"
    );
    let left_weight = if first == "acme" { 3 } else { 1 };
    assert!(one.more, "a tenant is left");
    assert_eq!(one.weight, left_weight);
    assert_eq!(bell().await, 1, "the doorbell is set for what is left");
    assert_eq!(app.runnable_tenants("acme").await.len(), 1);
    // A start of up to four: the other one, and the set is empty; no second look at it.
    let rec = Recording::start(&app).await;
    let rest = store.start(shard, "w", 4, ttl, 0).await.unwrap();
    let calls = rec.finish(&app).await;
    assert_eq!(rest.started.len(), 1);
    assert_ne!(rest.started[0].tenant.as_str().to_owned(), first);
    let start = one_call(&calls, "start");
    let text = listing(start);
    assert_eq!(
        counts(
            start,
            &[
                ("looks at the set", "zrange", ":runnable"),
                ("asks whether it is empty", "exists", ":runnable"),
                ("clears the doorbell", "del", ":bell"),
            ]
        ),
        vec![
            ("looks at the set", 1),
            ("asks whether it is empty", 0),
            ("clears the doorbell", 1),
        ],
        "the start's commands:\n{text}"
    );
    assert!(!rest.more, "nothing is left");
    assert_eq!(rest.weight, 0);
    assert_eq!(bell().await, 0, "the doorbell is clear");
    assert!(app.runnable_tenants("acme").await.is_empty());
    // The pull API's start (served tenants named) that empties the set asks nothing more
    // either, and answers the same.
    app.admit_with("acme", json!({"flow_id": "demo.echo", "params": {"n": 2}}))
        .await;
    let rec = Recording::start(&app).await;
    let runs = lease(&app, "acme", 4).await;
    let calls = rec.finish(&app).await;
    assert_eq!(runs.len(), 1);
    let start = one_call(&calls, "start");
    let text = listing(start);
    assert_eq!(
        counts(
            start,
            &[
                ("looks at the set", "zrange", ":runnable"),
                ("asks whether it is empty", "exists", ":runnable"),
                ("scores the served tenants", "zmscore", ":runnable"),
            ]
        ),
        vec![
            ("looks at the set", 1),
            ("asks whether it is empty", 0),
            // To pick among them; their weight after the call is known to be 0 unread.
            ("scores the served tenants", 1),
        ],
        "the pull start's commands:\n{text}"
    );
    assert_eq!(bell().await, 0, "the doorbell is clear");
}

#[tokio::test]
async fn a_completion_whose_chain_finds_nothing_leaves_the_doorbell_be() {
    // A busy worker's completion looks for the next run on its slot. On a quiet shard it
    // finds the runnable set empty: the start that emptied the set cleared the doorbell, so
    // the chain does not clear it again (one DEL less per completion). With the set empty
    // the doorbell can only have been set for a due time, which idle workers should hear of:
    // one of them wakes, its start finds nothing, answers the due time and clears it. A
    // chain that rang or started something still leaves the doorbell as the set says.
    let app = TestApp::spawn().await;
    let shard = app.shard("acme");
    let store = app.store().await;
    let ttl = Duration::from_secs(60);
    let bell = || async {
        let n: u64 = app.redis.query(redis::cmd("ZCARD").arg(shard.bell())).await;
        n
    };
    app.admit_with("acme", json!({"flow_id": "demo.echo", "params": {"n": 0}}))
        .await;
    let batch = store.start(shard, "w", 4, ttl, 0).await.unwrap();
    assert_eq!(batch.started.len(), 1);
    assert_eq!(bell().await, 0, "the start that emptied the set cleared it");
    // The chain finds nothing: no DEL, and the doorbell stays clear.
    let run = &batch.started[0];
    let rec = Recording::start(&app).await;
    let chained = chain_after(&store, shard, run).await;
    let calls = rec.finish(&app).await;
    let complete = one_call(&calls, "complete");
    let text = listing(complete);
    assert!(chained.started.is_empty());
    assert_eq!(
        counts(complete, &[("clears the doorbell", "del", ":bell")]),
        vec![("clears the doorbell", 0)],
        "the completion's commands:\n{text}"
    );
    assert_eq!(bell().await, 0);

    // A due time set while a run goes on rings the doorbell; a chain that finds nothing
    // leaves it, and the idle worker it wakes learns the due time and clears it.
    app.admit_with("acme", json!({"flow_id": "demo.echo", "params": {"n": 1}}))
        .await;
    let run = store.start(shard, "w", 4, ttl, 0).await.unwrap().started;
    assert_eq!(run.len(), 1);
    app.admit_with(
        "acme",
        json!({"flow_id": "demo.echo", "params": {"n": 2}, "delay": "1h"}),
    )
    .await;
    assert_eq!(bell().await, 1, "a new earliest due time rings");
    let chained = chain_after(&store, shard, &run[0]).await;
    assert!(chained.started.is_empty());
    assert_eq!(bell().await, 1, "left for the idle workers");
    let woken = store.start(shard, "idle", 4, ttl, 0).await.unwrap();
    assert!(woken.started.is_empty() && !woken.more);
    let due = woken.next_due.expect("the scheduled execution's due time");
    assert!(due > Duration::from_secs(3500), "{due:?}");
    assert_eq!(bell().await, 0, "the woken worker's start cleared it");

    // A chain whose own completion made its tenant runnable (the doorbell rang) and that
    // started that tenant's next run, emptying the set, clears it.
    app.put_tenant("acme", &json!({"max_concurrent": 1})).await;
    for n in 3..5 {
        app.admit_with("acme", json!({"flow_id": "demo.echo", "params": {"n": n}}))
            .await;
    }
    let run = store.start(shard, "w", 4, ttl, 0).await.unwrap().started;
    assert_eq!(run.len(), 1, "max_concurrent 1");
    assert_eq!(bell().await, 0, "capped: nothing runnable");
    let chained = chain_after(&store, shard, &run[0]).await;
    assert_eq!(chained.started.len(), 1);
    assert_eq!(
        bell().await,
        0,
        "nothing is left: the chain cleared what it rang"
    );
}

#[tokio::test]
async fn a_chained_completion_reads_the_runnable_sets_first_member_once_for_slot_and_chain() {
    // A busy worker's completion frees a slot (is its tenant runnable?) and its chain looks
    // for the next run (which tenant is first?): one ZRANGE of the set answers both when it
    // is empty or holds the tenant first; another tenant first takes a ZSCORE more, and the
    // chain still reads nothing of its own. Whatever the set held, the chain starts what a
    // fresh read would have found.
    let app = TestApp::spawn().await;
    let shard = app.shard("acme");
    let store = app.store().await;
    let ttl = Duration::from_secs(60);
    let asks = |calls: &[(String, Vec<Vec<String>>)]| {
        let complete = one_call(calls, "complete");
        let text = listing(complete);
        (
            counts(
                complete,
                &[
                    ("reads the set's first", "zrange", ":runnable"),
                    ("reads a tenant's score", "zscore", ":runnable"),
                ],
            ),
            text,
        )
    };

    // An idle tenant's only run: the set is empty, one read, nothing starts.
    app.admit_with("acme", json!({"flow_id": "demo.echo", "params": {"n": 0}}))
        .await;
    let run = store.start(shard, "w", 1, ttl, 0).await.unwrap().started;
    assert_eq!(run.len(), 1);
    let rec = Recording::start(&app).await;
    let chained = chain_after(&store, shard, &run[0]).await;
    let (got, text) = asks(&rec.finish(&app).await);
    assert!(chained.started.is_empty());
    assert_eq!(
        got,
        vec![("reads the set's first", 1), ("reads a tenant's score", 0)],
        "an idle tenant's chained completion:\n{text}"
    );

    // A backlog of one tenant: it is first, one read, and its next run starts.
    let mut queued = Vec::new();
    for n in 1..4 {
        queued.push(
            app.admit_with("acme", json!({"flow_id": "demo.echo", "params": {"n": n}}))
                .await,
        );
    }
    let run = store.start(shard, "w", 1, ttl, 0).await.unwrap().started;
    assert_eq!(run[0].id.to_string(), queued[0]);
    let rec = Recording::start(&app).await;
    let chained = chain_after(&store, shard, &run[0]).await;
    let (got, text) = asks(&rec.finish(&app).await);
    assert_eq!(chained.started.len(), 1);
    assert_eq!(chained.started[0].id.to_string(), queued[1]);
    assert_eq!(
        got,
        vec![("reads the set's first", 1), ("reads a tenant's score", 0)],
        "a backlog's chained completion:\n{text}"
    );

    // Another tenant of the shard first (it enters at the clock, behind which acme's virtual
    // time moved with its starts): acme's score is read too, and the chain starts the other's.
    let mate = shard_mate(&app, "acme");
    let theirs = app
        .admit_with(&mate, json!({"flow_id": "demo.echo", "params": {"n": 9}}))
        .await;
    let rec = Recording::start(&app).await;
    let next = chain_after(&store, shard, &chained.started[0]).await;
    let (got, text) = asks(&rec.finish(&app).await);
    assert_eq!(next.started.len(), 1);
    assert_eq!(next.started[0].id.to_string(), theirs);
    assert_eq!(
        got,
        vec![("reads the set's first", 1), ("reads a tenant's score", 1)],
        "a chained completion behind another tenant:\n{text}"
    );
    // acme stays runnable with its last queued run.
    let last = store.start(shard, "w", 4, ttl, 0).await.unwrap().started;
    assert_eq!(last.len(), 1);
    assert_eq!(last[0].id.to_string(), queued[2]);
}

#[tokio::test]
async fn a_lone_completion_reads_its_tenants_counters_alone_unless_its_chain_starts_more() {
    // A completion counts its output in its tenant's bytes and retains its row: it needs the
    // cfg's counters and webhook, 4 fields, not the limits' 17. Alone in its call, with no
    // chain or a chain that finds nothing, it reads those alone; a chain that starts the
    // tenant's next run needs its limits, and reads the cfg once, whole.
    let app = TestApp::spawn().await;
    let shard = app.shard("acme");
    let store = app.store().await;
    let ttl = Duration::from_secs(60);
    let cfg_reads = |calls: &[(String, Vec<Vec<String>>)]| {
        one_call(calls, "complete")
            .iter()
            .filter(|c| c[0] == "hmget" && c[1].ends_with(":cfg"))
            .map(|c| c[2..].join(" "))
            .collect::<Vec<_>>()
    };
    let alone = vec!["u_bytes u_rows u_next wh_url".to_owned()];

    // The pull API's completion.
    app.admit_with("acme", json!({"flow_id": "demo.echo", "params": {"n": 0}}))
        .await;
    let runs = lease(&app, "acme", 1).await;
    let rec = Recording::start(&app).await;
    complete(&app, "acme", &runs[0]).await;
    assert_eq!(cfg_reads(&rec.finish(&app).await), alone);

    // A worker's, whose chain finds the runnable set empty.
    app.admit_with("acme", json!({"flow_id": "demo.echo", "params": {"n": 1}}))
        .await;
    let run = store.start(shard, "w", 1, ttl, 0).await.unwrap().started;
    let rec = Recording::start(&app).await;
    let chained = chain_after(&store, shard, &run[0]).await;
    assert!(chained.started.is_empty());
    assert_eq!(cfg_reads(&rec.finish(&app).await), alone);

    // A worker's in a backlog: the chain starts the next run, and the cfg is read once.
    for n in 2..5 {
        app.admit_with("acme", json!({"flow_id": "demo.echo", "params": {"n": n}}))
            .await;
    }
    let run = store.start(shard, "w", 1, ttl, 0).await.unwrap().started;
    let rec = Recording::start(&app).await;
    let chained = chain_after(&store, shard, &run[0]).await;
    assert_eq!(chained.started.len(), 1);
    let reads = cfg_reads(&rec.finish(&app).await);
    assert_eq!(reads.len(), 1, "{reads:?}");
    assert!(reads[0].starts_with("max_concurrent "), "{reads:?}");
    assert_eq!(reads[0].split(' ').count(), 17, "{reads:?}");

    // The counters kept through the lone reads: the three completed rows are retained.
    let cfg = shard.tenant_config(&sluice::domain::TenantId::parse("acme").unwrap());
    let rows: String = app
        .redis
        .query(redis::cmd("HGET").arg(cfg).arg("u_rows"))
        .await;
    assert_eq!(rows, "3");
}

#[tokio::test]
async fn a_start_reads_the_limits_it_needs_and_a_later_need_reads_the_rest() {
    // A start needs a tenant's concurrency, weight and rates: the cfg's first eight fields,
    // not the storage counters, webhook and marks after them. A pull lease's start and a
    // worker's read those alone.
    let app = TestApp::spawn().await;
    let shard = app.shard("acme");
    let store = app.store().await;
    let head = "max_concurrent max_queued enabled pinned weight max_concurrent_per_key rate \
                key_rate"
        .to_owned();
    let cfg_reads = |calls: &[(String, Vec<Vec<String>>)], op: &str| {
        one_call(calls, op)
            .iter()
            .filter(|c| c[0] == "hmget" && c[1].ends_with(":cfg"))
            .map(|c| c[2..].join(" "))
            .collect::<Vec<_>>()
    };
    for n in 0..3 {
        app.admit_with("acme", json!({"flow_id": "demo.echo", "params": {"n": n}}))
            .await;
    }
    let rec = Recording::start(&app).await;
    let runs = lease(&app, "acme", 1).await;
    assert_eq!(runs.len(), 1);
    assert_eq!(
        cfg_reads(&rec.finish(&app).await, "start"),
        vec![head.clone()]
    );
    let rec = Recording::start(&app).await;
    let started = store
        .start(shard, "w", 1, Duration::from_secs(60), 0)
        .await
        .unwrap()
        .started;
    assert_eq!(started.len(), 1);
    assert_eq!(cfg_reads(&rec.finish(&app).await, "start"), vec![head]);
    // The lease's run completes (its counters read alone): the bytes and rows it counted are
    // the whole cfg's, as a later read of it finds them.
    complete(&app, "acme", &runs[0]).await;
    let cfg = shard.tenant_config(&sluice::domain::TenantId::parse("acme").unwrap());
    let rows: String = app
        .redis
        .query(redis::cmd("HGET").arg(cfg).arg("u_rows"))
        .await;
    assert_eq!(rows, "1");
}

/// `run` (of worker "w") reported completed by a numbered call that asks for one next run on
/// its slot, as a busy `sluice worker` does: what the chain started.
async fn chain_after(
    store: &sluice::store::Store,
    shard: sluice::store::Shard,
    run: &sluice::store::Started,
) -> sluice::store::StartBatch {
    let (_, chained) = store
        .complete_and_start(
            shard,
            &run.id,
            run.fence,
            "w",
            &sluice::store::Outcome::Completed(json!({})),
            1,
            Duration::from_secs(60),
            1,
        )
        .await
        .unwrap();
    chained
}

#[tokio::test]
async fn concurrent_starts_and_completions_keep_the_weight_and_the_doorbell_exact() {
    // The starts' cut rests on the shard's eligible weight being, whenever a start's own
    // HINCRBY answers it, the sum of the runnable tenants' weights (so 0 exactly when none is
    // left). Eight workers start and complete (chaining the next run, as busy workers do),
    // all at once, over four tenants of one shard with weights 1 to 4 and two slots each,
    // which enter and leave the runnable set many times, full or capped. Every execution runs
    // exactly once, each start is logged once with tags that never go down, and at the end
    // the set is empty, its weight 0 and the doorbell clear.
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};
    const EACH: usize = 30;
    let app = TestApp::spawn().await;
    let mut tenants = vec!["acme".to_owned()];
    while tenants.len() < 4 {
        let next = (tenants.len()..10_000)
            .map(|i| format!("mate{i}"))
            .find(|t| app.shard(t) == app.shard("acme") && !tenants.contains(t))
            .expect("a tenant of the same shard");
        tenants.push(next);
    }
    for (w, t) in tenants.iter().enumerate() {
        app.put_tenant(t, &json!({"weight": w + 1, "max_concurrent": 2}))
            .await;
        for n in 0..EACH {
            app.admit_with(t, json!({"flow_id": "demo.echo", "params": {"n": n}}))
                .await;
        }
    }
    let shard = app.shard("acme");
    let store = Arc::new(app.store().await);
    let done: Arc<Mutex<Vec<String>>> = Arc::default();
    let total = EACH * tenants.len();
    let workers: Vec<_> = (0..8)
        .map(|w| {
            let (store, done) = (store.clone(), done.clone());
            tokio::spawn(async move {
                let consumer = format!("w{w}");
                let ttl = Duration::from_secs(120);
                // Bounded: each round starts something or finds nothing; all end in far fewer.
                for _ in 0..20_000 {
                    if done.lock().unwrap().len() >= total {
                        return;
                    }
                    let mut runs = store
                        .start(shard, &consumer, 2, ttl, 0)
                        .await
                        .unwrap()
                        .started;
                    if runs.is_empty() {
                        tokio::task::yield_now().await;
                    }
                    while let Some(run) = runs.pop() {
                        let (what, chained) = store
                            .complete_and_start(
                                shard,
                                &run.id,
                                run.fence,
                                &consumer,
                                &sluice::store::Outcome::Completed(json!({})),
                                1,
                                ttl,
                                0,
                            )
                            .await
                            .unwrap();
                        assert_eq!(
                            what,
                            sluice::store::Completion::Done(sluice::domain::Status::Completed)
                        );
                        done.lock().unwrap().push(run.id.to_string());
                        runs.extend(chained.started);
                    }
                }
                panic!("worker {consumer} did not finish");
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
    let mut ids = done.lock().unwrap().clone();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), total, "each execution completed exactly once");
    assert_eq!(done.lock().unwrap().len(), total);
    let log = app.start_log("acme").await;
    assert_eq!(log.len(), total, "one start logged per execution");
    let mut per_tenant: BTreeMap<String, usize> = BTreeMap::new();
    for (t, _, _) in &log {
        *per_tenant.entry(t.clone()).or_default() += 1;
    }
    assert!(per_tenant.values().all(|&n| n == EACH), "{per_tenant:?}");
    assert!(
        log.windows(2).all(|w| w[0].1 <= w[1].1),
        "the start log's tags went down"
    );
    let weight = sched_field(&app, "acme", "weight").await;
    assert_eq!(weight.as_deref().unwrap_or("0"), "0");
    assert!(app.runnable_tenants("acme").await.is_empty());
    let bell: u64 = app.redis.query(redis::cmd("ZCARD").arg(shard.bell())).await;
    assert_eq!(bell, 0, "nothing runnable: the doorbell is clear");
}

/// At layout 5 the row carries the request's fingerprint (`fp`) beside its binary dedup
/// digest, so a keyed completion moves its mapping from the bucket to the `dd:` key without
/// reading it (`dedup_end()` in common.lua): an `HDEL` of the field, a `SET` of the key, no
/// bucket `HGET`. Layout 4's row has no `fp` and still reads it first. Either way the key
/// replays the same execution afterwards.
#[tokio::test]
async fn a_keyed_completion_at_layout_5_moves_its_mapping_without_reading_it() {
    let app = TestApp::spawn().await;
    let body = json!({"flow_id": "demo.echo", "params": {"n": 1}});
    let res = app.post_with_key("acme", "order-1", &body).await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let id = res.json::<Value>().await.unwrap()["execution_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let runs = lease(&app, "acme", 1).await;
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].0, id);
    let rec = Recording::start(&app).await;
    complete(&app, "acme", &runs[0]).await;
    let calls = rec.finish(&app).await;
    let done = one_call(&calls, "complete");
    let text = listing(done);
    let on_bucket = |name: &str| {
        done.iter()
            .filter(|c| c[0] == name && c.get(1).is_some_and(|k| k.contains(":ddb:")))
            .count()
    };
    let got = [
        ("reads the bucket field", on_bucket("hget")),
        ("deletes the bucket field", on_bucket("hdel")),
        ("writes the ended mapping", count(done, "set", "")),
    ];
    let reads = if crate::helpers::binary_layout() {
        0
    } else {
        1
    };
    assert_eq!(
        got,
        [
            ("reads the bucket field", reads),
            ("deletes the bucket field", 1),
            ("writes the ended mapping", 1),
        ],
        "the completion's commands:\n{text}"
    );
    let res = app.post_with_key("acme", "order-1", &body).await;
    assert_eq!(
        res.status(),
        StatusCode::OK,
        "a replay after the completion"
    );
    let replay: Value = res.json().await.unwrap();
    assert_eq!(replay["execution_id"], id.as_str());
    assert_eq!(replay["deduplicated"], true);
}
