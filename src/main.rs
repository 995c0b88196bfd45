//! The `sluice` command: a thin shell over the library.

use anyhow::Context;

use sluice::app::{Application, shutdown_signal};
use sluice::config::{AppConfig, Cli, Command, RedisSettings};
use sluice::dev::ManagedRedis;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::load().unwrap_or_else(|e| e.exit());
    sluice::telemetry::init(cli.log_format);
    match cli.command {
        Command::Openapi => {
            println!("{}", sluice::http::openapi().to_pretty_json()?);
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
            tracing::info!(address = %app.address(), "sluice serving");
            app.run_until_stopped(shutdown_signal()).await?;
            Ok(())
        }
        Command::Dev(args) => {
            let redis = ManagedRedis::start(&args.redis_server, &args.data_dir, args.redis_port)
                .await
                .context("sluice dev could not start its redis-server")?;
            let mut api = args.api;
            api.dev_auth = true;
            let mut settings = RedisSettings::for_url(redis.url());
            settings.shards = args.shards;
            let result = async {
                let app = Application::build(AppConfig {
                    api,
                    redis: settings,
                })
                .await?;
                print_dev_banner(&app, &redis, &args.data_dir);
                app.run_until_stopped(shutdown_signal()).await?;
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
        "\nsluice dev is up (DEV AUTH: no credentials checked; never expose it)\n\
         \n  API        http://{addr}/api\
         \n  OpenAPI    http://{addr}/openapi.json\
         \n  Docs       http://{addr}/docs (Swagger UI)\
         \n  Redis      {} (data and AOF in {})\
         \n\nTry:\n  curl -s -X POST http://{addr}/api/executions -H 'X-Tenant-Id: acme' \
         -H 'Content-Type: application/json' -H 'Idempotency-Key: order-42' \
         -d '{{\"flow_id\":\"demo.echo\",\"params\":{{\"order\":42}}}}'\n\
         \nStop with Ctrl-C.\n",
        redis.url(),
        data_dir.display()
    );
}
