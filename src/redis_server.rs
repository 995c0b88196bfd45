//! Starting `redis-server` on loopback: the one launcher `sluice dev`, the tests and the
//! benchmark share. The command line (`command`), the wait until a server answers
//! (`wait_ready`), the retry on another port when a free one was taken meanwhile
//! (`start_on_free_port`), the arguments of a cluster node and the forming of a local Redis
//! Cluster are written here once. Each user keeps its own handle on the process: `sluice dev`
//! shuts its server down cleanly, the tests kill, pause and restart theirs, the benchmark
//! reads its CPU time.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// How a redis-server keeps its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Persistence {
    /// Nothing written: the benchmark's data, gone with the process.
    Off,
    /// An append-only file synced as the value says (`always`, `everysec`): a restart, even
    /// after a SIGKILL, finds the data again.
    Aof(&'static str),
}

/// The command that runs `program` as a redis-server in the foreground, on loopback `port`,
/// with its files in `dir` and persisting as `persistence` says (no RDB snapshots). The caller
/// adds its own arguments (a cluster node's, a log file) and its stdio.
pub fn command(
    program: &Path,
    port: u16,
    dir: &Path,
    persistence: Persistence,
) -> std::process::Command {
    let mut cmd = std::process::Command::new(program);
    cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .arg("--dir")
        .arg(dir)
        .args(["--save", "", "--daemonize", "no"]);
    match persistence {
        Persistence::Off => cmd.args(["--appendonly", "no"]),
        Persistence::Aof(fsync) => cmd.args(["--appendonly", "yes", "--appendfsync", fsync]),
    };
    cmd
}

/// Why a redis-server did not become ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotReady {
    /// The process exited first (its port was taken, an argument refused: see its log).
    Exited,
    /// It did not answer PING in time.
    TimedOut,
}

/// Waits until the redis-server on loopback `port` answers PING, for at most `limit`.
/// `exited` is asked between tries and ends the wait once the process is gone.
pub async fn wait_ready(
    port: u16,
    mut exited: impl FnMut() -> bool,
    limit: Duration,
) -> Result<(), NotReady> {
    let url = format!("redis://127.0.0.1:{port}");
    let client = redis::Client::open(url.as_str()).map_err(|_| NotReady::Exited)?;
    let deadline = Instant::now() + limit;
    loop {
        if exited() {
            return Err(NotReady::Exited);
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
            return Err(NotReady::TimedOut);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Starts a redis-server on a free loopback port and waits (up to `limit`) until it answers:
/// `spawn(port)` starts the caller's process (built with `command`), `exited` says whether it
/// is gone. A free port can be taken between probing and binding, so a start that exits is
/// retried on another port, five times at most. The caller's handle must kill its process
/// when dropped (a start that timed out is dropped before the next try).
pub async fn start_on_free_port<P>(
    mut spawn: impl FnMut(u16) -> anyhow::Result<P>,
    mut exited: impl FnMut(&mut P) -> bool,
    limit: Duration,
) -> anyhow::Result<(P, u16)> {
    let mut last = NotReady::Exited;
    for _ in 0..5 {
        let port = free_port()?;
        let mut process = spawn(port)?;
        match wait_ready(port, || exited(&mut process), limit).await {
            Ok(()) => return Ok((process, port)),
            Err(why) => last = why,
        }
    }
    bail!("could not start redis-server on a free loopback port ({last:?} on the last try)")
}

/// A loopback port that was free a moment ago: the one helper `sluice dev`, the tests and the
/// benchmark share. Another process may take it before it is bound, so a caller that starts
/// a server on it retries on a new one when the start fails.
pub fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("no free port on loopback")?;
    Ok(l.local_addr()?.port())
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
