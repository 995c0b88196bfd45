//! The `sluice` command: a thin shell over the library.

/// mimalloc instead of glibc's malloc: the request path allocates many small, short-lived
/// buffers, and the benchmark measured glibc's allocator at ~16 % of the server's CPU. Its v2
/// line (the `v2` feature), which gives freed memory back to the system after 10 ms: v3 keeps
/// it for a second, and four concurrent 16 MiB batch admissions, whose live heap peaks at
/// about 28 MiB, then raised serve's RSS by 70–96 MiB instead of 39–45 (bench/README.md,
/// Batch memory).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

use sluice::commands;
use sluice::config::{Cli, Command};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::load().unwrap_or_else(|e| e.exit());
    sluice::telemetry::init(cli.log_format);
    let service = match &cli.command {
        Command::Serve(_) => Some("sluice-serve"),
        Command::Worker(_) => Some("sluice-worker"),
        Command::Dev(_) => Some("sluice-dev"),
        _ => None,
    };
    if let (Some(endpoint), Some(service)) = (&cli.otlp_endpoint, service) {
        sluice::otel::init(endpoint, service)?;
    }
    let result = match cli.command {
        Command::Openapi => commands::openapi(),
        Command::MigrateLayout { redis } => commands::migrate_layout(redis).await,
        Command::Cluster(command) => commands::cluster(command).await,
        Command::Serve(args) => commands::serve(args).await,
        Command::Worker(args) => commands::worker(args).await,
        Command::Dev(args) => sluice::dev::run(args).await,
    };
    sluice::otel::shutdown().await;
    result
}
