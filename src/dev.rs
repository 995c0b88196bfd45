//! The embedded default, `sluice dev` (`run`): a `redis-server` it starts, owns and stops, with
//! its data (AOF on) in a local folder, the API in dev-auth mode and a worker with the demo
//! flows in the same process, so trying sluice needs nothing but the binary and Redis
//! installed. `sluice dev --cluster` starts a local three-master Redis Cluster instead. Both are
//! started with `crate::redis_server`, the launcher the tests and the benchmark use too.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use tokio::process::{Child, Command};

use crate::app::{Application, shutdown_signal};
use crate::config::{AppConfig, DevArgs, RedisSettings, WorkerSettings};
use crate::redis_server::{
    self, NotReady, Persistence, cluster_node_args, form_cluster, free_port,
};
use crate::store::RedisTarget;
use crate::worker::Worker;

/// Masters of the local cluster `sluice dev --cluster` starts.
const DEV_CLUSTER_MASTERS: usize = 3;

/// The embedded worker's timings, snappier than production's: a cancel missed by its stop
/// message is noticed within a 2 s heartbeat, and Ctrl-C returns within the 5 s drain.
const DEV_LEASE_TTL_MS: u64 = 10_000;
const DEV_HEARTBEAT_MS: u64 = 2_000;
const DEV_SCAN_MS: u64 = 2_000;
const DEV_DRAIN_TIMEOUT_MS: u64 = 5_000;

/// `sluice dev`: starts its Redis, serves the API (dev auth) with a worker running the demo
/// flows beside it until SIGINT/SIGTERM, then stops the worker, the server and Redis — Redis
/// also when the server or the worker failed.
pub async fn run(args: DevArgs) -> anyhow::Result<()> {
    let redis = if args.cluster {
        ManagedRedis::start_cluster(&args.redis_server, &args.data_dir, DEV_CLUSTER_MASTERS).await
    } else {
        ManagedRedis::start(&args.redis_server, &args.data_dir, args.redis_port).await
    }
    .context("sluice dev could not start its redis-server")?;
    let result = serve_with_worker(&args, &redis).await;
    redis.stop().await;
    result
}

/// The API and the embedded worker on `redis`, until a shutdown signal.
async fn serve_with_worker(args: &DevArgs, redis: &ManagedRedis) -> anyhow::Result<()> {
    let mut api = args.api.clone();
    api.dev_auth = true;
    let mut settings = RedisSettings::for_target(redis.target());
    settings.shards = args.shards;
    settings.initial_layout = args.initial_layout;
    let mut worker_settings = WorkerSettings::defaults();
    worker_settings.demo_flows = true;
    worker_settings.flows = args.flows.clone();
    worker_settings.concurrency = args.worker_concurrency;
    worker_settings.lease_ttl_ms = DEV_LEASE_TTL_MS;
    worker_settings.heartbeat_ms = DEV_HEARTBEAT_MS;
    worker_settings.scan_ms = DEV_SCAN_MS;
    worker_settings.drain_timeout_ms = DEV_DRAIN_TIMEOUT_MS;
    let registry = worker_settings.registry()?;
    let app = Application::build(AppConfig {
        api,
        redis: settings,
    })
    .await?;
    let worker = Worker::new(app.store(), registry, worker_settings.worker_config());
    print_banner(&app, redis, &args.data_dir);
    let stop = tokio_util::sync::CancellationToken::new();
    let worker_stop = stop.clone();
    let worker_task = tokio::spawn(async move { worker.run(worker_stop.cancelled_owned()).await });
    app.run_until_stopped(shutdown_signal()).await;
    stop.cancel();
    worker_task.await??;
    Ok(())
}

/// What `sluice dev` prints once it is up: where everything is, and a first request to try.
fn print_banner(app: &Application, redis: &ManagedRedis, data_dir: &Path) {
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

/// The redis-server child processes `sluice dev` owns: one standalone server, or the nodes of
/// a local cluster.
pub struct ManagedRedis {
    nodes: Vec<ManagedNode>,
    cluster: bool,
}

impl ManagedRedis {
    /// One standalone server on `port` (0 = a free one) with its data in `data_dir`.
    pub async fn start(program: &Path, data_dir: &Path, port: u16) -> anyhow::Result<Self> {
        let node = ManagedNode::start(program, data_dir, port, &[]).await?;
        Ok(Self {
            nodes: vec![node],
            cluster: false,
        })
    }

    /// A local Redis Cluster of `masters` masters, each in `data_dir/node-<i>`. The ports are
    /// chosen at the first start and kept in `data_dir/cluster-ports` (each node's
    /// `nodes.conf` names its peers by port, so a restart must reuse them); the cluster is
    /// formed once and comes back by itself on later starts.
    pub async fn start_cluster(
        program: &Path,
        data_dir: &Path,
        masters: usize,
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(data_dir)
            .with_context(|| format!("cannot create data folder {}", data_dir.display()))?;
        let ports_file = data_dir.join("cluster-ports");
        let ports: Vec<u16> = match std::fs::read_to_string(&ports_file) {
            Ok(text) => text
                .split_whitespace()
                .map(str::parse)
                .collect::<Result<_, _>>()
                .with_context(|| format!("{} is damaged", ports_file.display()))?,
            Err(_) => {
                let ports = (0..masters)
                    .map(|_| free_port())
                    .collect::<anyhow::Result<Vec<_>>>()?;
                let text: Vec<String> = ports.iter().map(u16::to_string).collect();
                std::fs::write(&ports_file, text.join(" "))
                    .with_context(|| format!("cannot write {}", ports_file.display()))?;
                ports
            }
        };
        let mut nodes = Vec::with_capacity(ports.len());
        for (i, port) in ports.iter().enumerate() {
            let dir = data_dir.join(format!("node-{i}"));
            nodes.push(ManagedNode::start(program, &dir, *port, &cluster_node_args(5_000)).await?);
        }
        form_cluster(&ports, 0, Duration::from_secs(20)).await?;
        Ok(Self {
            nodes,
            cluster: true,
        })
    }

    /// Where sluice finds this Redis.
    pub fn target(&self) -> RedisTarget {
        if self.cluster {
            RedisTarget::Cluster(self.nodes.iter().map(ManagedNode::url).collect())
        } else {
            RedisTarget::Standalone(self.nodes[0].url())
        }
    }

    /// Stops every node cleanly (SHUTDOWN flushes the AOF).
    pub async fn stop(self) {
        for node in self.nodes {
            node.stop().await;
        }
    }
}

/// One redis-server child process on loopback.
struct ManagedNode {
    child: Child,
    port: u16,
}

impl ManagedNode {
    /// Starts `program` on `port` (0 = a free one) with its data in `data_dir` and `extra`
    /// arguments, and waits until it answers PING (at most 10 s).
    async fn start(
        program: &Path,
        data_dir: &Path,
        port: u16,
        extra: &[String],
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(data_dir)
            .with_context(|| format!("cannot create data folder {}", data_dir.display()))?;
        let data_dir = data_dir
            .canonicalize()
            .with_context(|| format!("cannot resolve {}", data_dir.display()))?;
        let log = data_dir.join("redis.log");
        let spawn = |port: u16| -> anyhow::Result<Child> {
            let mut cmd = Command::from(redis_server::command(
                program,
                port,
                &data_dir,
                Persistence::Aof("everysec"),
            ));
            cmd.arg("--logfile")
                .arg(&log)
                .args(extra)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .kill_on_drop(true);
            cmd.spawn().map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => anyhow::anyhow!(
                    "`{}` was not found. Install Redis (Debian/Ubuntu: `sudo apt-get install \
                     redis-server`, or run ./scripts/dev.sh which does it) or pass \
                     --redis-server /path/to/redis-server",
                    program.display()
                ),
                _ => anyhow::anyhow!("cannot start `{}`: {e}", program.display()),
            })
        };
        let exited = |c: &mut Child| c.try_wait().ok().flatten().is_some();
        let limit = Duration::from_secs(10);
        let not_ready = |why: NotReady| match why {
            NotReady::Exited => anyhow::anyhow!(
                "redis-server exited during start-up; its log ({}) ends with:\n{}",
                log.display(),
                tail(&log)
            ),
            NotReady::TimedOut => anyhow::anyhow!(
                "redis-server did not answer within {limit:?}; see {}",
                log.display()
            ),
        };
        let (child, port) = if port == 0 {
            redis_server::start_on_free_port(spawn, exited, limit).await?
        } else {
            let mut child = spawn(port)?;
            redis_server::wait_ready(port, || exited(&mut child), limit)
                .await
                .map_err(not_ready)?;
            (child, port)
        };
        Ok(Self { child, port })
    }

    /// `redis://127.0.0.1:<port>`.
    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Stops Redis cleanly (SHUTDOWN flushes the AOF), killing it if it does not comply.
    async fn stop(mut self) {
        if let Ok(client) = redis::Client::open(self.url())
            && let Ok(mut c) = client.get_multiplexed_async_connection().await
        {
            // The connection drops as the server exits; that error is the expected answer.
            let _ = redis::cmd("SHUTDOWN").query_async::<()>(&mut c).await;
        }
        if tokio::time::timeout(Duration::from_secs(5), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(10)..].join("\n")
}
