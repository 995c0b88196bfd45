//! The embedded default, `sluice dev` (`run`): a `redis-server` it starts, owns and stops, with
//! its data (AOF on) in a local folder, the API in dev-auth mode and a worker with the demo
//! flows in the same process, so trying sluice needs nothing but the binary and Redis
//! installed. `sluice dev --cluster` starts a local three-master Redis Cluster instead, formed
//! by `form_cluster` (which the test suite and the benchmark use too).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::process::{Child, Command};

use crate::app::{Application, shutdown_signal};
use crate::config::{AppConfig, DevArgs, RedisSettings, WorkerSettings};
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

/// The arguments that make a redis-server a cluster node: its cluster state in `nodes.conf`
/// beside its data, peers declared failed after `node_timeout_ms`, and a master's outage
/// taking down only its own slots (sluice keeps serving the shards on the other masters).
pub fn cluster_node_args(node_timeout_ms: u64) -> Vec<String> {
    [
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        "--cluster-node-timeout",
        &node_timeout_ms.to_string(),
        "--cluster-require-full-coverage",
        "no",
    ]
    .map(String::from)
    .to_vec()
}

/// Forms a Redis Cluster of the loopback nodes on `ports` (started with `cluster_node_args`):
/// the first `ports.len() / (1 + replicas)` are masters sharing the 16384 slots evenly, the
/// rest replicate them in turn. Waits until every node sees the whole cluster and all slots
/// served. A cluster formed before (its nodes restarted with their `nodes.conf`) is only
/// waited for.
///
/// Nodes that were just started on a loaded machine (a test suite forming many clusters at
/// once beside other work) can take longer than the client's default 500 ms to answer: each
/// call may take up to `CLUSTER_CALL_TIMEOUT`, and a state read that fails is read again
/// until `limit`.
pub async fn form_cluster(ports: &[u16], replicas: usize, limit: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    let masters = ports.len() / (1 + replicas);
    anyhow::ensure!(masters >= 1, "a cluster needs a master");
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(CLUSTER_CALL_TIMEOUT))
        .set_response_timeout(Some(CLUSTER_CALL_TIMEOUT));
    let mut conns = Vec::with_capacity(ports.len());
    for port in ports {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
        conns.push(
            client
                .get_multiplexed_async_connection_with_config(&config)
                .await?,
        );
    }
    let info = |c: &redis::aio::MultiplexedConnection| {
        let mut c = c.clone();
        async move {
            redis::cmd("CLUSTER")
                .arg("INFO")
                .query_async::<String>(&mut c)
                .await
        }
    };
    let field = |text: &str, name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    let fresh = field(&info(&conns[0]).await?, "cluster_slots_assigned") == 0;
    if fresh {
        for (m, conn) in conns.iter().enumerate().take(masters) {
            let first = m * 16_384 / masters;
            let last = (m + 1) * 16_384 / masters - 1;
            let () = redis::cmd("CLUSTER")
                .arg("ADDSLOTSRANGE")
                .arg(first)
                .arg(last)
                .query_async(&mut conn.clone())
                .await?;
        }
        for port in &ports[1..] {
            let () = redis::cmd("CLUSTER")
                .arg("MEET")
                .arg("127.0.0.1")
                .arg(*port)
                .query_async(&mut conns[0].clone())
                .await?;
        }
    }
    // Bounded by `limit`: gossip needs a second or two on loopback.
    let mut replicated = !fresh || replicas == 0;
    loop {
        let mut ok = true;
        for conn in &conns {
            // A node too busy to answer in time is not ready yet; past the deadline its error
            // is the answer.
            let text = match info(conn).await {
                Ok(text) => text,
                Err(e) if Instant::now() > deadline => return Err(e.into()),
                Err(_) => String::new(),
            };
            ok &= text.contains("cluster_state:ok")
                && field(&text, "cluster_known_nodes") == ports.len() as u64
                && field(&text, "cluster_slots_ok") == 16_384;
        }
        if ok && !replicated {
            for r in masters..ports.len() {
                let master = (r - masters) % masters;
                let id: String = redis::cmd("CLUSTER")
                    .arg("MYID")
                    .query_async(&mut conns[master].clone())
                    .await?;
                let () = redis::cmd("CLUSTER")
                    .arg("REPLICATE")
                    .arg(id)
                    .query_async(&mut conns[r].clone())
                    .await?;
            }
            replicated = true;
            continue;
        }
        if ok {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the redis cluster on ports {ports:?} did not form within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How long `form_cluster` waits for one reply of a node.
const CLUSTER_CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// One redis-server child process on loopback.
struct ManagedNode {
    child: Child,
    port: u16,
    log: PathBuf,
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
        let port = if port == 0 { free_port()? } else { port };
        let log = data_dir.join("redis.log");
        let child = Command::new(program)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(&data_dir)
            .args(["--appendonly", "yes", "--appendfsync", "everysec"])
            .args(["--save", "", "--daemonize", "no"])
            .arg("--logfile")
            .arg(&log)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => anyhow::anyhow!(
                    "`{}` was not found. Install Redis (Debian/Ubuntu: `sudo apt-get install \
                     redis-server`, or run ./scripts/dev.sh which does it) or pass \
                     --redis-server /path/to/redis-server",
                    program.display()
                ),
                _ => anyhow::anyhow!("cannot start `{}`: {e}", program.display()),
            })?;
        let mut redis = Self { child, port, log };
        redis.wait_ready(Duration::from_secs(10)).await?;
        Ok(redis)
    }

    /// `redis://127.0.0.1:<port>`.
    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    async fn wait_ready(&mut self, limit: Duration) -> anyhow::Result<()> {
        let client = redis::Client::open(self.url())?;
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "redis-server exited ({status}) during start-up; its log ({}) ends with:\n{}",
                    self.log.display(),
                    tail(&self.log)
                );
            }
            if let Ok(mut c) = client.get_multiplexed_async_connection().await
                && redis::cmd("PING")
                    .query_async::<String>(&mut c)
                    .await
                    .is_ok()
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "redis-server did not answer within {limit:?}; see {}",
                    self.log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
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

/// A loopback port that was free a moment ago: the one helper `sluice dev`, the tests and the
/// benchmark share. Another process may take it before it is bound, so a caller that starts
/// a server on it retries on a new one when the start fails.
pub fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("no free port on loopback")?;
    Ok(l.local_addr()?.port())
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(10)..].join("\n")
}
