//! Key layouts: a Redis written with layout 1 (`{s07}` tags, which crowd some cluster masters)
//! keeps working, and `sluice migrate-layout` moves it to the current layout without losing an
//! execution, a dedup key, a waiting position or a stream entry. Runs on both suite modes.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{TestApp, TestRedis, TestWorker, sluice_bin};

#[tokio::test]
async fn migrate_layout_moves_every_key_and_old_processes_stop_writing() {
    let redis = TestRedis::start().await;
    // A Redis first written by a build of layout 1.
    let _: () = redis
        .query(
            redis::cmd("HSET")
                .arg(sluice::store::keys::meta())
                .arg("shards")
                .arg(16)
                .arg("layout")
                .arg(1),
        )
        .await;
    let mut app = TestApp::spawn_on(redis, |_| {}).await;
    assert_eq!(app.shard("acme").prefix(), "sluice:{s15}:");

    // beta has one completed execution and (below) one dispatched; acme may run one at a
    // time: one dispatched, one waiting behind it (with a dedup key). The worker that completes
    // beta's first is gone before acme's are admitted, so nothing of theirs has started.
    let done = app.admit("beta", "demo.echo").await["execution_id"].clone();
    {
        let mut worker = TestWorker::spawn(&app.redis, &["--concurrency", "1"]);
        app.wait_terminal("beta", done.as_str().unwrap(), Duration::from_secs(15))
            .await;
        worker.signal("TERM");
        assert!(worker.wait_exit(Duration::from_secs(15)).success());
    }
    app.put_tenant("acme", &json!({"max_concurrent": 1})).await;
    let first = app.admit("acme", "demo.echo").await["execution_id"].clone();
    let res = app
        .post_with_key("acme", "order-7", &json!({"flow_id": "demo.echo"}))
        .await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let waiting: Value = res.json().await.unwrap();
    assert_eq!(waiting["queue_state"], "waiting");
    let queued = app.admit("beta", "demo.echo").await["execution_id"].clone();
    let old_keys = app.redis.keys().await;

    let out = std::process::Command::new(sluice_bin())
        .arg("migrate-layout")
        .args(app.redis.args())
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{}", String::from_utf8_lossy(&out.stdout).trim());

    // The server still running with the old layout refuses (its shards are frozen).
    let res = app
        .post_execution("acme", &json!({"flow_id": "demo.echo"}))
        .await;
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    // Nothing is left under the old tags but their markers, and every key moved.
    let new_keys = app.redis.keys().await;
    let legacy: Vec<&String> = new_keys
        .iter()
        .filter(|k| k.starts_with("sluice:{s") && !k.contains('.'))
        .collect();
    assert!(legacy.iter().all(|k| k.ends_with(":frozen")), "{legacy:?}");
    assert_eq!(
        new_keys.len(),
        old_keys.len() + legacy.len(),
        "every key has its new name (plus the old markers)"
    );

    // A restarted server reads the new layout and finds everything where it was.
    app.addr = app.spawn_beside(|_| {}).await;
    let restarted = app.store().await;
    assert_eq!(
        restarted.shards().layout(),
        sluice::store::Layout::CURRENT,
        "the meta record names the new layout"
    );
    assert_ne!(
        restarted
            .shards()
            .shard_of(&sluice::domain::TenantId::parse("acme").unwrap())
            .prefix(),
        "sluice:{s15}:"
    );
    let replay = app
        .post_with_key("acme", "order-7", &json!({"flow_id": "demo.echo"}))
        .await;
    assert_eq!(replay.status(), StatusCode::OK);
    let replay: Value = replay.json().await.unwrap();
    assert_eq!(replay["execution_id"], waiting["execution_id"]);
    assert_eq!(
        app.execution("beta", done.as_str().unwrap()).await["status"],
        "completed"
    );
    // The queue moved with its consumer group: a worker runs what was waiting, in order.
    let _worker = TestWorker::spawn(&app.redis, &["--concurrency", "2"]);
    for (t, id) in [
        ("acme", &first),
        ("acme", &waiting["execution_id"]),
        ("beta", &queued),
    ] {
        let e = app
            .wait_terminal(t, id.as_str().unwrap(), Duration::from_secs(15))
            .await;
        assert_eq!(e["status"], "completed", "{e}");
    }
    let fresh = app.admit("acme", "demo.echo").await;
    assert_eq!(fresh["status"], "queued");
}

/// A deployment still on key layout 1 (16 shards) with `n` queued executions of `acme`: the
/// app and their ids.
async fn on_layout_1_with(n: usize) -> (TestApp, Vec<String>) {
    let redis = TestRedis::start().await;
    let _: () = redis
        .query(
            redis::cmd("HSET")
                .arg(sluice::store::keys::meta())
                .arg("shards")
                .arg(16)
                .arg("layout")
                .arg(1),
        )
        .await;
    let app = TestApp::spawn_on(redis, |_| {}).await;
    let mut ids = Vec::new();
    for _ in 0..n {
        ids.push(
            app.admit_with("acme", json!({"flow_id": "demo.echo"}))
                .await,
        );
    }
    (app, ids)
}

/// A migration interrupted half-way — one row copied but its original not yet deleted,
/// another copied and deleted, the rest untouched — is finished by running it again: every
/// execution is found once under its new name, and runs.
#[tokio::test]
async fn an_interrupted_migration_is_finished_by_running_it_again() {
    use sluice::store::{Layout, ShardMap};
    let (mut app, ids) = on_layout_1_with(3).await;
    // What a first run had done when it stopped.
    let old = app.shard("acme");
    let new = ShardMap::with_dedicated(16, 2, Layout::CURRENT).shard(old.number());
    app.store().await.freeze_shard(old).await.unwrap();
    for (i, id) in ids.iter().take(2).enumerate() {
        let id = sluice::domain::ExecutionId::parse(id).unwrap();
        let dump: Vec<u8> = app.redis.query(redis::cmd("DUMP").arg(old.row(&id))).await;
        let () = app
            .redis
            .query(redis::cmd("RESTORE").arg(new.row(&id)).arg(0).arg(dump))
            .await;
        if i == 1 {
            let _: u64 = app.redis.query(redis::cmd("DEL").arg(old.row(&id))).await;
        }
    }

    let out = std::process::Command::new(sluice_bin())
        .arg("migrate-layout")
        .args(app.redis.args())
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let keys = app.redis.keys().await;
    let stale: Vec<&String> = keys
        .iter()
        .filter(|k| k.starts_with(&old.prefix()) && **k != old.frozen())
        .collect();
    assert!(stale.is_empty(), "{stale:?}");
    app.addr = app.spawn_beside(|_| {}).await;
    let _worker = TestWorker::spawn(&app.redis, &["--concurrency", "2"]);
    for id in &ids {
        let e = app.wait_terminal("acme", id, Duration::from_secs(15)).await;
        assert_eq!(e["status"], "completed", "{e}");
    }
    let page = app.get_json(Some("acme"), "/api/executions?limit=10").await;
    assert_eq!(page["total"], 3, "{page}");
}

/// An interrupted migration run again while processes of the old layout still run (#19): the
/// first run had moved acme's queue (five queued executions) when it stopped; then an old
/// worker starts and an old server answers `GET /api/queues`. (With the stream model both used
/// to create the old ready stream again, empty, and the second run copied that empty stream
/// over the real one: the five never ran.) The old processes write nothing under the frozen
/// old names, and even an old key brought back (as an older build would) is not copied over a
/// key the first run moved. The five run, once each.
#[tokio::test]
async fn an_interrupted_migration_rerun_while_old_processes_run_loses_nothing() {
    use sluice::store::{Layout, ShardMap};
    let (mut app, ids) = on_layout_1_with(5).await;
    // What a first run had done when it stopped: every old shard frozen, acme's queue copied
    // to its new name and deleted.
    let old_map = app.store().await.shards();
    let new_map = ShardMap::with_dedicated(16, old_map.dedicated(), Layout::CURRENT);
    let old = app.shard("acme");
    let new = new_map.shard(old.number());
    let store = app.store().await;
    for shard in old_map.all() {
        store.freeze_shard(shard).await.unwrap();
    }
    let acme = sluice::domain::TenantId::parse("acme").unwrap();
    let dump: Vec<u8> = app
        .redis
        .query(redis::cmd("DUMP").arg(old.waiting(&acme)))
        .await;
    let () = app
        .redis
        .query(
            redis::cmd("RESTORE")
                .arg(new.waiting(&acme))
                .arg(0)
                .arg(dump),
        )
        .await;
    let _: u64 = app
        .redis
        .query(redis::cmd("DEL").arg(old.waiting(&acme)))
        .await;

    // Old processes go on: a worker starts (it creates its groups) and the server is asked for
    // the queue statistics (which creates a missing group).
    let mut old_worker = TestWorker::spawn(&app.redis, &["--concurrency", "2"]);
    let stats = app.get_json(None, "/api/queues").await;
    assert!(stats["shards"].is_array(), "{stats}");
    let old_queue: u64 = app
        .redis
        .query(redis::cmd("EXISTS").arg(old.waiting(&acme)))
        .await;
    assert_eq!(
        old_queue, 0,
        "an old process wrote the frozen shard's queue"
    );
    // A writer without the freeze check could bring the old key back all the same.
    let _: u64 = app
        .redis
        .query(
            redis::cmd("ZADD")
                .arg(old.waiting(&acme))
                .arg(0)
                .arg("0123456789abcdef0123456789abcdef"),
        )
        .await;

    let out = std::process::Command::new(sluice_bin())
        .arg("migrate-layout")
        .args(app.redis.args())
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let len: u64 = app
        .redis
        .query(redis::cmd("ZCARD").arg(new.waiting(&acme)))
        .await;
    assert_eq!(len, 5, "the migrated queue lost its entries");
    let keys = app.redis.keys().await;
    let stale: Vec<&String> = keys
        .iter()
        .filter(|k| k.starts_with("sluice:{s") && !k.contains('.') && !k.ends_with(":frozen"))
        .collect();
    assert!(stale.is_empty(), "{stale:?}");

    // The old processes are restarted (docs/operations.md, Upgrades): everything runs, once.
    old_worker.signal("TERM");
    assert!(old_worker.wait_exit(Duration::from_secs(15)).success());
    app.addr = app.spawn_beside(|_| {}).await;
    let _worker = TestWorker::spawn(&app.redis, &["--concurrency", "2"]);
    for id in &ids {
        let e = app.wait_terminal("acme", id, Duration::from_secs(15)).await;
        assert_eq!(e["status"], "completed", "{e}");
        assert_eq!(e["attempt"], 1, "{e}");
    }
}
