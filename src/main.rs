//! The `sluice` command: a thin shell over the library.

/// mimalloc instead of glibc's malloc: the request path allocates many small, short-lived
/// buffers, and the benchmark measured glibc's allocator at ~16 % of the server's CPU.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

use anyhow::Context;

use sluice::app::{Application, shutdown_signal};
use std::sync::Arc;

use sluice::config::{
    ApiSettings, AppConfig, Cli, ClusterCommand, Command, RedisSettings, WorkerSettings,
};
use sluice::dev::ManagedRedis;
use sluice::reshard::Cluster;
use sluice::worker::{Worker, connect_store};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::load().unwrap_or_else(|e| e.exit());
    sluice::telemetry::init(cli.log_format);
    match cli.command {
        Command::Openapi => {
            println!("{}", sluice::http::openapi().to_pretty_json()?);
            Ok(())
        }
        Command::MigrateLayout { redis } => {
            match sluice::migrate::migrate_layout(redis.store_config(&ApiSettings::defaults()))
                .await?
            {
                None => println!("already on the current key layout; nothing to do"),
                Some(m) => println!(
                    "key layout {} -> {}: {} keys in {:?}. Restart every sluice process: \
                     those still running answer 503 for the old shards.",
                    m.from.number(),
                    m.to.number(),
                    m.keys,
                    m.took
                ),
            }
            Ok(())
        }
        Command::Cluster(ClusterCommand::Shards { redis }) => {
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
            Ok(())
        }
        Command::Cluster(ClusterCommand::MoveShard {
            shard,
            to,
            keys_per_call,
            redis,
        }) => {
            let cluster = Cluster::connect(redis.store_config(&ApiSettings::defaults())).await?;
            let moved = cluster.move_shard(shard, &to, keys_per_call).await?;
            println!(
                "shard {shard} (slot {}) moved from {} to {}: {} keys in {:?}",
                moved.slot, moved.from, moved.to, moved.keys, moved.took
            );
            Ok(())
        }
        Command::Serve(args) => {
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
            app.run_until_stopped(shutdown_signal()).await?;
            Ok(())
        }
        Command::Worker(args) => {
            let registry = args.worker.registry()?;
            let shutdown = shutdown_signal();
            tokio::pin!(shutdown);
            // A worker may start before its Redis: it waits for it (stopping still works).
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
        Command::Dev(args) => {
            let redis = if args.cluster {
                ManagedRedis::start_cluster(&args.redis_server, &args.data_dir, 3).await
            } else {
                ManagedRedis::start(&args.redis_server, &args.data_dir, args.redis_port).await
            }
            .context("sluice dev could not start its redis-server")?;
            let mut api = args.api;
            api.dev_auth = true;
            let mut settings = RedisSettings::for_target(redis.target());
            settings.shards = args.shards;
            let mut worker_settings = WorkerSettings::defaults();
            worker_settings.demo_flows = true;
            worker_settings.flows = args.flows.clone();
            worker_settings.concurrency = args.worker_concurrency;
            // Snappier than production: a cancel is noticed within 2 s, Ctrl-C returns in 5 s.
            worker_settings.lease_ttl_ms = 10_000;
            worker_settings.heartbeat_ms = 2_000;
            worker_settings.scan_ms = 2_000;
            worker_settings.drain_timeout_ms = 5_000;
            let result = async {
                let registry = worker_settings.registry()?;
                let app = Application::build(AppConfig {
                    api,
                    redis: settings,
                })
                .await?;
                let worker = Worker::new(app.store(), registry, worker_settings.worker_config());
                print_dev_banner(&app, &redis, &args.data_dir);
                let stop = tokio_util::sync::CancellationToken::new();
                let worker_stop = stop.clone();
                let worker_task =
                    tokio::spawn(async move { worker.run(worker_stop.cancelled_owned()).await });
                let served = app.run_until_stopped(shutdown_signal()).await;
                stop.cancel();
                worker_task.await??;
                served?;
                anyhow::Ok(())
            }
            .await;
            redis.stop().await;
            result
        }
    }
}

fn print_dev_banner(app: &Application, redis: &ManagedRedis, data_dir: &std::path::Path) {
    let addr = app.address();
    println!(
        "\nsluice dev is up: API, sweeper and a worker with the demo flows\n\
         (DEV AUTH: no credentials checked; never expose it)\n\
         \n  Console    http://{addr}/console/\
         \n  API        http://{addr}/api\
         \n  OpenAPI    http://{addr}/openapi.json\
         \n  Docs       http://{addr}/docs (Swagger UI)\
         \n  Redis      {} (data and AOF in {})\
         \n\nTry:\n  curl -s -X POST http://{addr}/api/executions -H 'X-Tenant-Id: acme' \
         -H 'Content-Type: application/json' -H 'Idempotency-Key: order-42' \
         -d '{{\"flow_id\":\"demo.echo\",\"params\":{{\"order\":42}}}}'\n\
         \nStop with Ctrl-C.\n",
        redis.target(),
        data_dir.display()
    );
}
