//! What each `sluice` subcommand does, so `main.rs` only parses and dispatches. `sluice dev`
//! lives in `dev.rs` with the managed Redis it starts.

use std::sync::Arc;

use anyhow::Context;

use crate::app::{Application, shutdown_signal};
use crate::config::{ApiSettings, AppConfig, ClusterCommand, RedisSettings, ServeArgs, WorkerArgs};
use crate::reshard::Cluster;
use crate::worker::{Worker, connect_store};

/// `sluice openapi`: the OpenAPI document on stdout.
pub fn openapi() -> anyhow::Result<()> {
    println!("{}", crate::http::openapi().to_pretty_json()?);
    Ok(())
}

/// `sluice migrate-layout`: moves a Redis to the current key layout (see `migrate`).
pub async fn migrate_layout(redis: RedisSettings) -> anyhow::Result<()> {
    match crate::migrate::migrate_layout(redis.store_config(&ApiSettings::defaults())).await? {
        None => println!("already on the current key layout; nothing to do"),
        Some(m) => println!(
            "key layout {} -> {}: {} shards converted ({} rows and other records; {} rows no \
             index named; {} live dedup mappings moved into buckets), {} keys renamed ({} copied by an earlier run kept), longest freeze \
             of a shard {:?}, in {:?}. Stop every process of the older build: they answer 503 \
             for every shard.",
            m.from.number(),
            m.to.number(),
            m.shards,
            m.converted,
            m.stragglers,
            m.dedup_mappings,
            m.keys,
            m.kept,
            m.longest_freeze,
            m.took,
        ),
    }
    Ok(())
}

/// `sluice cluster shards` / `sluice cluster move-shard` (see `reshard`).
pub async fn cluster(command: ClusterCommand) -> anyhow::Result<()> {
    match command {
        ClusterCommand::Shards { redis } => {
            let cluster = Cluster::connect(redis.store_config(&ApiSettings::defaults())).await?;
            println!("{:>5}  {:>5}  {:<22}  frozen", "shard", "slot", "master");
            for p in cluster.shards().await? {
                println!(
                    "{:>5}  {:>5}  {:<22}  {}",
                    p.shard.number(),
                    p.slot,
                    p.master,
                    if p.frozen { "yes" } else { "no" }
                );
            }
        }
        ClusterCommand::MoveShard {
            shard,
            to,
            keys_per_call,
            redis,
        } => {
            let cluster = Cluster::connect(redis.store_config(&ApiSettings::defaults())).await?;
            let moved = cluster.move_shard(shard, &to, keys_per_call).await?;
            println!(
                "shard {shard} (slot {}) moved from {} to {}: {} keys in {:?}",
                moved.slot, moved.from, moved.to, moved.keys, moved.took
            );
        }
    }
    Ok(())
}

/// `sluice serve`: the API and the sweeper, until SIGINT/SIGTERM.
pub async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    if args.api.dev_auth {
        tracing::warn!(
            "DEV AUTH IS ON: no credentials are checked and every caller is platform \
             admin. Never expose this server."
        );
    } else if args.api.admin_token.is_none() {
        tracing::warn!("no --admin-token configured: every API call will answer 401");
    }
    let app = Application::build(AppConfig {
        api: args.api,
        redis: args.redis,
    })
    .await?;
    tracing::info!(
        address = %app.address(),
        console = %format!("http://{}/console/", app.address()),
        "sluice serving"
    );
    app.run_until_stopped(shutdown_signal()).await;
    Ok(())
}

/// `sluice worker`: runs flows until SIGINT/SIGTERM. It may start before its Redis and waits
/// for it (stopping still works meanwhile).
pub async fn worker(args: WorkerArgs) -> anyhow::Result<()> {
    let registry = args.worker.registry()?;
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    let store = tokio::select! {
        store = connect_store(args.redis.store_config(&ApiSettings::defaults())) => store
            .with_context(|| format!("cannot use redis at {}", args.redis.target()))?,
        _ = &mut shutdown => return Ok(()),
    };
    if let Err(e) = store.refresh_defaults().await {
        tracing::warn!(error = %e, "cannot read the server defaults yet; will retry");
    }
    let worker = Worker::new(Arc::new(store), registry, args.worker.worker_config());
    worker.run(shutdown).await?;
    Ok(())
}
