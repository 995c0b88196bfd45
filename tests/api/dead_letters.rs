//! Dead letters against real `sluice worker` processes and a real Redis: what the caps evict
//! (a tenant's flood only its own records; at the shard's cap the tenant holding the most),
//! what a listing costs Redis (the page, never the shard), and the indexes and counts an older
//! build left behind, rebuilt when `serve` starts.

use std::collections::BTreeSet;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice::domain::TenantId;
use sluice::store::{Layout, Shard, ShardMap};

use crate::helpers::{FAST_WORKER, TestApp, TestRedis, TestWorker};

fn with(extra: &[&'static str]) -> Vec<&'static str> {
    FAST_WORKER.iter().chain(extra).copied().collect()
}

/// Dead-letters `n` `demo.fail` executions of `tenant` (one attempt each, a retryable failure)
/// with `message`; their ids in admission order, once every one ended `failed`.
async fn dead_lettered(app: &TestApp, tenant: &str, n: usize, message: &str) -> Vec<String> {
    let mut ids = Vec::new();
    for _ in 0..n {
        ids.push(
            app.admit_with(
                tenant,
                json!({"flow_id": "demo.fail", "max_attempts": 1, "params": {"message": message}}),
            )
            .await,
        );
    }
    for id in &ids {
        let e = app.wait_terminal(tenant, id, Duration::from_secs(30)).await;
        assert_eq!(e["status"], "failed", "{e}");
    }
    ids
}

/// The default shard map a test's app will use (16 shards, the current layout), for data
/// written before the app connects.
fn default_shards() -> ShardMap {
    ShardMap::new(16, Layout::CURRENT)
}

/// `count` tenants of `tenant`'s shard, `tenant` first, the others named `<prefix><n>`.
fn shard_mates(tenant: &str, prefix: &str, count: usize) -> Vec<String> {
    let map = default_shards();
    let shard = map.shard_of(&TenantId::parse(tenant).unwrap());
    let mut out = vec![tenant.to_owned()];
    out.extend(
        (0..100_000)
            .map(|i| format!("{prefix}{i}"))
            .filter(|t| map.shard_of(&TenantId::parse(t).unwrap()) == shard)
            .take(count - 1),
    );
    assert_eq!(out.len(), count, "not enough tenants in one shard");
    out
}

/// `GET /api/dlq` of `tenant` (every tenant's with `None`), asserting 200.
async fn dlq_page(app: &TestApp, tenant: Option<&str>, query: &str) -> Value {
    app.get_json(tenant, &format!("/api/dlq{query}")).await
}

/// The execution ids of a page, in its order.
fn listed(page: &Value) -> Vec<String> {
    page["dead_letters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["execution_id"].as_str().unwrap().to_owned())
        .collect()
}

/// The shard's records per holder as its counts say (`dlq_holders`), and each holder's index
/// length: they must agree.
async fn holders(app: &TestApp, shard: Shard) -> Vec<(String, u64)> {
    let counts: Vec<(String, u64)> = app
        .redis
        .query(
            redis::cmd("ZRANGE")
                .arg(shard.dead_letter_holders())
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES"),
        )
        .await;
    for (holder, n) in &counts {
        let index = match holder.as_str() {
            "" => shard.poison_dead_letters(),
            t => shard.tenant_dead_letters(&TenantId::parse(t).unwrap()),
        };
        let len: u64 = app.redis.query(redis::cmd("XLEN").arg(&index)).await;
        assert_eq!(len, *n, "{holder:?}: counted {n}, indexed {len}");
    }
    counts
}

/// Issue 38, defect 5: the shard's cap of 10,000 records used to evict the shard's oldest, so
/// a tenant dead-lettering 10,500 executions erased its neighbour's 3 records. Now each tenant
/// keeps at most `--dlq-tenant-cap` records and its flood evicts its own oldest: here (caps
/// scaled down: 8 per tenant, 20 per shard) two workers fail 30 executions of `flood` beside
/// `calm`'s 3 on the same shard; calm keeps all 3, flood its newest 8, and each of flood's 22
/// evictions is counted, for the shard and for flood.
#[tokio::test]
async fn a_tenants_flood_of_dead_letters_evicts_only_its_own() {
    let app = TestApp::spawn_with(|c| {
        c.api.dlq_cap = 20;
        c.api.dlq_tenant_cap = 8;
    })
    .await;
    let mates = shard_mates("calm", "flood", 2);
    let (calm, flood) = (mates[0].as_str(), mates[1].as_str());
    let shard = app.shard(calm);
    assert_eq!(app.shard(flood), shard);
    let _a = TestWorker::spawn(&app.redis, &with(&["--concurrency", "8"]));
    let calm_ids = dead_lettered(&app, calm, 3, "calm").await;
    let _b = TestWorker::spawn(&app.redis, &with(&["--concurrency", "8"]));
    let flood_ids = dead_lettered(&app, flood, 30, "flood").await;

    let page = dlq_page(&app, Some(calm), "").await;
    let mine: BTreeSet<String> = listed(&page).into_iter().collect();
    assert_eq!(
        mine,
        calm_ids.iter().cloned().collect(),
        "the neighbour's flood evicted calm's records: {page}"
    );
    assert_eq!(
        (&page["total"], &page["evicted"], &page["cap"]),
        (&json!(3), &json!(0), &json!(8)),
        "{page}"
    );
    let page = dlq_page(&app, Some(flood), "?limit=200").await;
    let kept = listed(&page);
    assert_eq!(kept.len(), 8, "{page}");
    assert_eq!(
        kept.iter().collect::<BTreeSet<_>>().len(),
        8,
        "each record once"
    );
    assert!(kept.iter().all(|id| flood_ids.contains(id)));
    assert_eq!(
        (&page["total"], &page["evicted"]),
        (&json!(8), &json!(22)),
        "{page}"
    );
    assert_eq!(app.counter("dead_lettered").await, 33);
    assert_eq!(app.counter("dlq_evicted").await, 22);
    let len: u64 = app
        .redis
        .query(redis::cmd("XLEN").arg(shard.dead_letters()))
        .await;
    assert_eq!(len, 11);
    assert_eq!(
        holders(&app, shard).await,
        vec![(calm.to_owned(), 3), (flood.to_owned(), 8)]
    );
    // An evicted record's execution is still readable as failed.
    let evicted = flood_ids.iter().find(|id| !kept.contains(id)).unwrap();
    assert_eq!(app.execution(flood, evicted).await["status"], "failed");
}

/// At the shard's cap (10 here, the tenant cap no lower), the tenant holding the most records
/// loses its oldest, whoever adds; a tenant that holds as many as the largest loses its own.
/// One worker of concurrency 1 fails each tenant's executions in admission order, so "oldest"
/// is the first admitted.
#[tokio::test]
async fn at_the_shard_cap_the_tenant_holding_the_most_loses_its_oldest() {
    let app = TestApp::spawn_with(|c| {
        c.api.dlq_cap = 10;
        c.api.dlq_tenant_cap = 10;
    })
    .await;
    let mut mates = shard_mates("x-holder", "holder-", 3);
    mates.sort();
    // ZREVRANGE lists equal counts in reverse name order: y would come before x on a tie.
    let (x, y, z) = (mates[0].clone(), mates[1].clone(), mates[2].clone());
    let shard = app.shard(&x);
    let _w = TestWorker::spawn(&app.redis, &with(&["--concurrency", "1"]));
    let mut xs = dead_lettered(&app, &x, 4, "x").await;
    let ys = dead_lettered(&app, &y, 4, "y").await;
    let mut zs = dead_lettered(&app, &z, 2, "z").await;
    assert_eq!(app.counter("dlq_evicted").await, 0, "10 records fit");

    // x holds as many as y, the largest: x's own oldest goes, not y's.
    xs.extend(dead_lettered(&app, &x, 1, "x").await);
    assert_eq!(kept_of(&app, &x, &xs[1..]).await, 1, "x lost x0");
    assert_eq!(kept_of(&app, &y, &ys).await, 0, "y lost nothing yet");
    // z holds fewer than the largest (y, 4): y's oldest goes.
    zs.extend(dead_lettered(&app, &z, 1, "z").await);
    assert_eq!(kept_of(&app, &y, &ys[1..]).await, 1, "y lost y0");
    // Now x holds the most (4 against 3 and 3): x's oldest goes.
    zs.extend(dead_lettered(&app, &z, 1, "z").await);

    assert_eq!(kept_of(&app, &x, &xs[2..]).await, 2, "x lost x0 and x1");
    assert_eq!(kept_of(&app, &y, &ys[1..]).await, 1, "y lost y0");
    assert_eq!(kept_of(&app, &z, &zs).await, 0, "z lost nothing");
    assert_eq!(app.counter("dlq_evicted").await, 3);
    assert_eq!(
        holders(&app, shard).await,
        vec![(x.clone(), 3), (y.clone(), 3), (z.clone(), 4)]
    );
    let every = dlq_page(&app, None, "?limit=200").await;
    assert_eq!(every["total"], 10, "{every}");
    assert_eq!(every["evicted"], 3, "{every}");
    assert_eq!(every["cap"], Value::Null, "{every}");
}

/// Asserts that `tenant` lists exactly the executions `ids`; its `evicted` count.
async fn kept_of(app: &TestApp, tenant: &str, ids: &[String]) -> u64 {
    let page = dlq_page(app, Some(tenant), "").await;
    let got: BTreeSet<String> = listed(&page).into_iter().collect();
    assert_eq!(got, ids.iter().cloned().collect(), "{tenant}: {page}");
    page["evicted"].as_u64().unwrap()
}

/// The commands Redis ran (also inside scripts) for one request, by name; the server's own
/// background work is off in the tests that use it, so nothing else runs meanwhile.
async fn commands_of(app: &TestApp, request: impl std::future::Future<Output = Value>) -> Value {
    app.redis.reset_stats().await;
    let answer = request.await;
    let calls: serde_json::Map<String, Value> = app
        .redis
        .command_calls()
        .await
        .into_iter()
        .filter(|(name, _)| !name.starts_with("config") && !name.starts_with("info"))
        .map(|(name, n)| (name, json!(n)))
        .collect();
    json!({"answer": answer, "calls": calls})
}

/// Issue 38, defect 6: once the shard's cap had evicted the first record a tenant index was
/// started with, every tenant's `GET /api/dlq` ended in an XREVRANGE of the shard's whole
/// stream (Redis 7.0 walks all of it when the range's end lies below the first entry): 2 ms of
/// Redis for an empty answer. Now a tenant's listing is one script call (its counts, and the
/// page's ids from its index) and one read per record of the page: the same commands at 40 and
/// at 120 records of the neighbours, no XREVRANGE at all when nothing is older than the bound
/// (an empty tenant, the end of the pages). The platform admin's page: one call per shard.
#[tokio::test]
async fn a_dead_letter_listing_costs_the_page_not_the_shard() {
    let app = TestApp::spawn_with(|c| {
        c.api.dlq_cap = 120;
        c.api.dlq_tenant_cap = 30;
        c.api.orphan_scan_ms = 0;
        c.api.sweep_interval_secs = 0;
        c.api.webhook_delivery = false;
    })
    .await;
    let mates = shard_mates("empty", "busy", 6);
    let (empty, few, busy) = (&mates[0], &mates[1], &mates[2..]);
    let mut worker = TestWorker::spawn(&app.redis, &with(&["--concurrency", "8"]));
    let few_ids = dead_lettered(&app, few, 4, "few").await;
    dead_lettered(&app, &busy[0], 40, &"x".repeat(1024)).await;
    worker.kill9();

    let cost = || listing_costs(&app, empty, few);
    let small = cost().await;
    // An empty tenant: one script call, its two counts and a look at its (absent) index.
    assert_eq!(small[0]["answer"]["dead_letters"], json!([]));
    assert_eq!(
        small[0]["calls"],
        json!({"fcall_ro": 1, "exists": 1, "zscore": 1, "hget": 1, "xrange": 1}),
        "{}",
        small[0]
    );
    // Pages of 2 of 4: one XREVRANGE of the index each, then the 2 records.
    for page in &small[1..3] {
        assert_eq!(listed(&page["answer"]).len(), 2, "{page}");
        assert_eq!(page["calls"]["xrevrange"], 1, "{page}");
        assert_eq!(page["calls"]["xrange"], 3, "{page}");
    }
    let both: BTreeSet<String> = small[1..3]
        .iter()
        .flat_map(|p| listed(&p["answer"]))
        .collect();
    assert_eq!(both, few_ids.iter().cloned().collect());
    // Past the oldest: nothing older, found without an XREVRANGE.
    assert_eq!(small[3]["answer"]["dead_letters"], json!([]));
    assert_eq!(small[3]["calls"].get("xrevrange"), None, "{}", small[3]);

    // Three times the neighbours' records (the shard now full: 4 + 4 × 30 = 124 > 120, so the
    // cap evicts): the same commands for the same answers.
    let mut worker = TestWorker::spawn(&app.redis, &with(&["--concurrency", "8"]));
    for t in &busy[1..] {
        dead_lettered(&app, t, 30, &"x".repeat(1024)).await;
    }
    worker.kill9();
    let len: u64 = app
        .redis
        .query(redis::cmd("XLEN").arg(app.shard(empty).dead_letters()))
        .await;
    assert_eq!(len, 120, "the shard is at its cap");
    assert!(app.counter("dlq_evicted").await > 0);
    let full = cost().await;
    for (s, f) in small.iter().zip(&full) {
        assert_eq!(s["calls"], f["calls"], "{s} / {f}");
        assert_eq!(listed(&s["answer"]), listed(&f["answer"]));
    }
    // The platform admin's page of every tenant: one call per shard, each reading at most
    // the page.
    let every = commands_of(&app, dlq_page(&app, None, "?limit=5")).await;
    let shards = app.store().await.shards().all().count() as u64;
    assert_eq!(listed(&every["answer"]).len(), 5);
    assert_eq!(every["calls"]["fcall_ro"], shards, "{every}");
    assert_eq!(
        every["calls"]["xrevrange"], 1,
        "only one shard holds records: {every}"
    );
}

/// The commands of four listings: `empty`'s, then `few`'s in pages of 2 to past its oldest.
async fn listing_costs(app: &TestApp, empty: &str, few: &str) -> [Value; 4] {
    let a = commands_of(app, dlq_page(app, Some(empty), "")).await;
    let b = commands_of(app, dlq_page(app, Some(few), "?limit=2")).await;
    let cursor = b["answer"]["next_before"].as_str().unwrap().to_owned();
    let c = commands_of(
        app,
        dlq_page(app, Some(few), &format!("?limit=2&before={cursor}")),
    )
    .await;
    let cursor = c["answer"]["next_before"].as_str().unwrap().to_owned();
    let d = commands_of(
        app,
        dlq_page(app, Some(few), &format!("?limit=2&before={cursor}")),
    )
    .await;
    [a, b, c, d]
}

/// The ids of a stream's entries, oldest first.
async fn stream_ids(app: &TestApp, key: String) -> Vec<String> {
    let raw: Vec<(String, Vec<String>)> = app
        .redis
        .query(redis::cmd("XRANGE").arg(key).arg("-").arg("+"))
        .await;
    raw.into_iter().map(|(id, _)| id).collect()
}

/// Writes a dead-letter record by hand with id `id`, as an older build wrote them (`tenant`
/// `None`: a poison record of schema 1); returns its id.
async fn legacy_record(redis: &TestRedis, shard: Shard, id: &str, tenant: Option<&str>) -> String {
    let mut cmd = redis::cmd("XADD");
    cmd.arg(shard.dead_letters()).arg(id);
    cmd.arg("execution_id")
        .arg(format!("{:032x}", rand_like(id)));
    if let Some(t) = tenant {
        cmd.arg("tenant_id").arg(t).arg("flow_id").arg("demo.fail");
    }
    cmd.arg("reason")
        .arg(if tenant.is_some() {
            "handler_error"
        } else {
            "poison"
        })
        .arg("attempts")
        .arg(1)
        .arg("source_entry")
        .arg("0-1")
        .arg("at")
        .arg(1_700_000_000_000u64)
        .arg("message")
        .arg("written by an older build");
    redis.query(&mut cmd).await
}

/// A number derived from a record id, for distinct execution ids.
fn rand_like(id: &str) -> u128 {
    id.bytes().fold(0xcbf2_9ce4_8422_2325u128, |h, b| {
        (h ^ u128::from(b)).wrapping_mul(0x1000_0000_01b3)
    })
}

/// An older build's index entry: record `id` in `tenant`'s index.
async fn legacy_index(redis: &TestRedis, shard: Shard, tenant: &str, id: &str) {
    let index = shard.tenant_dead_letters(&TenantId::parse(tenant).unwrap());
    let _: String = redis
        .query(redis::cmd("XADD").arg(index).arg(id).arg("r").arg("1"))
        .await;
}

/// What an older build left: records below its marker in no index, records above it indexed,
/// nothing counted by holder (and a shard of a build before indexes: records only). Connecting
/// rebuilds the indexes in the stream's order and counts every holder, the poison record's
/// too; the marker goes. The rebuild, run again, interrupted after a few calls and then run
/// by two stores at once, ends in the same state.
#[tokio::test]
async fn dead_letters_an_older_build_left_are_indexed_and_counted_when_serve_starts() {
    let redis = TestRedis::start().await;
    let mates = shard_mates("mine", "theirs", 2);
    let (mine, theirs) = (mates[0].as_str(), mates[1].as_str());
    let map = default_shards();
    let shard = map.shard_of(&TenantId::parse(mine).unwrap());
    // Below the marker: the build before indexes.
    let r1 = legacy_record(&redis, shard, "1000-1", Some(mine)).await;
    let r2 = legacy_record(&redis, shard, "1000-2", Some(theirs)).await;
    let r3 = legacy_record(&redis, shard, "1001-0", Some(mine)).await;
    let r4 = legacy_record(&redis, shard, "1002-0", None).await;
    // From the marker on: the build with indexes, which counted nothing by holder.
    let r5 = legacy_record(&redis, shard, "2000-0", Some(mine)).await;
    legacy_index(&redis, shard, mine, &r5).await;
    let r6 = legacy_record(&redis, shard, "2001-0", Some(theirs)).await;
    legacy_index(&redis, shard, theirs, &r6).await;
    let _: () = redis
        .query(redis::cmd("SET").arg(shard.dead_letters_indexed()).arg(&r5))
        .await;
    // Another shard, of a build before indexes: no marker, no index.
    let other = (0..10_000)
        .map(|i| format!("other{i}"))
        .find(|t| map.shard_of(&TenantId::parse(t).unwrap()) != shard)
        .unwrap();
    let other_shard = map.shard_of(&TenantId::parse(&other).unwrap());
    let o1 = legacy_record(&redis, other_shard, "3000-0", Some(&other)).await;
    let o2 = legacy_record(&redis, other_shard, "3001-0", Some(&other)).await;

    let app = TestApp::spawn_on(redis, |_| {}).await;
    let index = |t: &str| {
        app.shard(t)
            .tenant_dead_letters(&TenantId::parse(t).unwrap())
    };
    let state = || async {
        let markers: u64 = app
            .redis
            .query(
                redis::cmd("EXISTS")
                    .arg(shard.dead_letters_indexed())
                    .arg(shard.dead_letters_rebuilt()),
            )
            .await;
        (
            stream_ids(&app, index(mine)).await,
            stream_ids(&app, index(theirs)).await,
            stream_ids(&app, shard.poison_dead_letters()).await,
            holders(&app, shard).await,
            stream_ids(&app, index(&other)).await,
            holders(&app, other_shard).await,
            markers,
        )
    };
    let want = (
        vec![r1.clone(), r3.clone(), r5.clone()],
        vec![r2.clone(), r6.clone()],
        vec![r4.clone()],
        vec![
            (String::new(), 1),
            (theirs.to_owned(), 2),
            (mine.to_owned(), 3),
        ],
        vec![o1.clone(), o2.clone()],
        vec![(other.clone(), 2)],
        0,
    );
    assert_eq!(state().await, want);
    // mine's listing: newest first, the older build's records included; the admin's shows the
    // poison record.
    let page = dlq_page(&app, Some(mine), "").await;
    let entries: Vec<&str> = page["dead_letters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["entry_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        entries,
        vec![r5.as_str(), r3.as_str(), r1.as_str()],
        "{page}"
    );
    assert_eq!(page["total"], 3);
    let every = dlq_page(&app, None, "?limit=200").await;
    assert!(
        every["dead_letters"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["entry_id"] == r4.as_str() && r["tenant_id"] == Value::Null),
        "{every}"
    );

    // Run again: nothing to do.
    let store = app.store().await;
    let again = store.reindex_dead_letters(1_000, usize::MAX).await;
    assert_eq!((again.indexed, again.unfinished.len()), (0, 0));
    assert_eq!(state().await, want);
    // The older build's state again (its marker back, the counts gone); a rebuild cut off
    // after three calls leaves its marker; then two stores finish it at once.
    let _: () = app
        .redis
        .query(redis::cmd("SET").arg(shard.dead_letters_indexed()).arg(&r5))
        .await;
    let _: () = app
        .redis
        .query(redis::cmd("DEL").arg(shard.dead_letter_holders()))
        .await;
    // Every shard before this one answers "done" in one call; this one gets two batches.
    let before = store.shards().all().position(|s| s == shard).unwrap();
    let cut = store.reindex_dead_letters(2, before + 2).await;
    assert!(!cut.unfinished.is_empty());
    let marker: u64 = app
        .redis
        .query(redis::cmd("EXISTS").arg(shard.dead_letters_indexed()))
        .await;
    assert_eq!(marker, 1, "an unfinished rebuild keeps its marker");
    let other_store = app.store().await;
    let (a, b) = tokio::join!(
        store.reindex_dead_letters(1, usize::MAX),
        other_store.reindex_dead_letters(1, usize::MAX)
    );
    assert!(a.unfinished.is_empty() && b.unfinished.is_empty());
    assert_eq!(state().await, want);
}

/// `GET /api/dlq` of a tenant used to scan its shard's whole dead-letter stream, reading the
/// neighbours' records to find its own (#19: 2 MB read for 382 bytes returned). Now a tenant's
/// listing goes through its own index of record ids: with a neighbour's 60 records of 8 KB on
/// the shard, listing the tenant's 3 (and one record an older build wrote, indexed when the app started)
/// costs Redis well under one neighbour record per returned one. Paging and dismissal keep the
/// index in step.
#[tokio::test]
async fn a_tenants_dead_letter_listing_reads_only_its_own_records() {
    let redis = TestRedis::start().await;
    let mates = shard_mates("mine", "n", 2);
    let (mine, neighbour) = (mates[0].as_str(), mates[1].as_str());
    let shard = default_shards().shard_of(&TenantId::parse(mine).unwrap());
    // A record written by a build without the index.
    let legacy = legacy_record(&redis, shard, "1700000000000-0", Some(mine)).await;
    let app = TestApp::spawn_on(redis, |_| {}).await;
    let mut worker = TestWorker::spawn(&app.redis, &with(&["--concurrency", "8"]));
    let own = dead_lettered(&app, mine, 3, "mine").await;
    dead_lettered(&app, neighbour, 60, &"x".repeat(8 * 1024)).await;
    worker.kill9();

    let before = redis_output_bytes(&app).await;
    let page = dlq_page(&app, Some(mine), "?limit=50").await;
    let read = redis_output_bytes(&app).await - before;
    let records = page["dead_letters"].as_array().unwrap();
    let ids = listed(&page);
    // Newest first: its three (dead-lettered in whatever order the worker failed them), then
    // the legacy record.
    assert_eq!(ids.len(), 4, "{page}");
    let newest: BTreeSet<String> = ids[..3].iter().cloned().collect();
    assert_eq!(newest, own.iter().cloned().collect(), "{page}");
    assert_eq!(records[3]["entry_id"], legacy.as_str(), "{page}");
    let entry_ids: Vec<&str> = records
        .iter()
        .map(|r| r["entry_id"].as_str().unwrap())
        .collect();
    let mut sorted = entry_ids.clone();
    sorted.sort_by_key(|e| {
        let (ms, seq) = e.split_once('-').unwrap();
        std::cmp::Reverse((ms.parse::<u64>().unwrap(), seq.parse::<u64>().unwrap()))
    });
    assert_eq!(entry_ids, sorted, "newest first");
    assert!(records.iter().all(|r| r["tenant_id"] == mine));
    assert!(
        read < 32 * 1024,
        "listing 4 small records read {read} bytes from Redis (the neighbour's are 8 KB each)"
    );

    // Pages of 2: the newest two, then the third and the legacy record.
    let first = dlq_page(&app, Some(mine), "?limit=2").await;
    assert_eq!(listed(&first).len(), 2);
    let cursor = first["next_before"].as_str().unwrap().to_owned();
    let second = dlq_page(&app, Some(mine), &format!("?limit=2&before={cursor}")).await;
    assert_eq!(listed(&second), ids[2..].to_vec(), "{second}");

    // Dismissing a record takes it out of the tenant's index and count too.
    let newest = &records[0];
    let res = app
        .as_tenant(
            reqwest::Method::DELETE,
            &format!(
                "/api/dlq/{}/{}",
                newest["shard"],
                newest["entry_id"].as_str().unwrap()
            ),
            mine,
        )
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    let after = dlq_page(&app, Some(mine), "").await;
    assert_eq!(listed(&after), ids[1..].to_vec(), "{after}");
    assert_eq!(after["total"], 3, "{after}");
    assert_eq!(
        holders(&app, shard).await,
        vec![(mine.to_owned(), 3), (neighbour.to_owned(), 60)]
    );
}

/// Bytes Redis has sent to its clients, over every master.
async fn redis_output_bytes(app: &TestApp) -> u64 {
    app.redis
        .info("stats")
        .await
        .lines()
        .filter_map(|l| l.strip_prefix("total_net_output_bytes:"))
        .map(|n| n.trim().parse::<u64>().unwrap())
        .sum()
}
