//! The processes a benchmark run owns: a `redis-server` or the masters of a local Redis Cluster
//! (no persistence, data in a temporary folder) and `sluice serve` / `sluice worker` children, all on loopback. Every child is killed
//! when its handle drops (`kill_on_drop`), so an error, a panic or Ctrl-C never leaves one
//! behind; the temporary folder goes with the `Scratch` guard.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use sluice::redis_server::{self, Persistence};
use sluice::store::RedisTarget;
use tokio::process::{Child, Command};

use crate::UNLIMITED_BYTES;
use crate::load::Conn;

/// A temporary folder removed on drop (the logs of the children and Redis's working folder).
pub struct Scratch(PathBuf);

impl Scratch {
    /// Creates `$TMPDIR/sluice-bench-<pid>`.
    pub fn create() -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(format!("sluice-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        Ok(Self(dir))
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child process with a name (for reports) and its log file (for errors).
pub struct Proc {
    /// `redis`, `serve`, `worker-1`, ...
    pub name: String,
    child: Child,
    log: PathBuf,
}

impl Proc {
    fn spawn(name: &str, cmd: &mut Command, log: PathBuf) -> anyhow::Result<Self> {
        let file = std::fs::File::create(&log)?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {name}"))?;
        Ok(Self {
            name: name.to_owned(),
            child,
            log,
        })
    }

    /// The operating system's process id (for CPU accounting); `None` once it exited.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Fails when the process has exited, quoting the end of its log.
    pub fn ensure_running(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "{} exited ({status}); its log ends with:\n{}",
                self.name,
                tail(&self.log)
            );
        }
        Ok(())
    }

    /// Whether the process's log contains `needle` (how a worker says it is polling: an idle
    /// poll leaves no trace on Redis).
    pub fn log_contains(&self, needle: &str) -> bool {
        std::fs::read_to_string(&self.log).is_ok_and(|t| t.contains(needle))
    }

    /// The first line of its log that contains any of `needles` (a warning, an error).
    pub fn first_log_line(&self, needles: &[&str]) -> Option<String> {
        let text = std::fs::read_to_string(&self.log).ok()?;
        text.lines()
            .find(|l| needles.iter().any(|n| l.contains(n)))
            .map(str::to_owned)
    }

    /// Kills (SIGKILL) and reaps the process.
    pub async fn kill(mut self) {
        let _ = self.child.kill().await;
    }

    /// Waits at most `limit` for the process to exit by itself (a redis-server told to
    /// `SHUTDOWN`, whose callgrind writes its file on the way out); killed after that.
    pub async fn wait_exit(mut self, limit: Duration) -> anyhow::Result<()> {
        match tokio::time::timeout(limit, self.child.wait()).await {
            Ok(status) => {
                status?;
                Ok(())
            }
            Err(_) => {
                let _ = self.child.kill().await;
                bail!("{} did not exit within {limit:?}", self.name)
            }
        }
    }
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    // An error's backtrace would push the error itself out of the last lines.
    let text = text.split("\nStack backtrace:").next().unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

/// The Redis a run owns: one `redis-server`, or the masters of a local Redis Cluster (no
/// replicas), each a child process without persistence.
pub struct Redis {
    /// `redis`, or `redis-1` ... `redis-<N>` (the names CPU shares are reported under).
    pub nodes: Vec<Proc>,
    /// `redis://127.0.0.1:<port>` of each node, in `nodes` order.
    pub urls: Vec<String>,
    cluster: bool,
}

impl Redis {
    /// Where sluice finds this Redis (a cluster is named by all its masters as seeds).
    pub fn target(&self) -> RedisTarget {
        if self.cluster {
            RedisTarget::Cluster(self.urls.clone())
        } else {
            RedisTarget::Standalone(self.urls[0].clone())
        }
    }

    /// Fails when a node has exited.
    pub fn ensure_running(&mut self) -> anyhow::Result<()> {
        self.nodes.iter_mut().try_for_each(Proc::ensure_running)
    }

    /// Kills every node.
    pub async fn kill(self) {
        for n in self.nodes {
            n.kill().await;
        }
    }
}

/// Starts `redis-server` on a free loopback port without persistence and waits for PING.
pub async fn start_redis(program: &Path, scratch: &Scratch) -> anyhow::Result<Redis> {
    start_redis_named(program, scratch, "redis").await
}

/// The same under another name (its folder and log in the scratch folder, its CPU share in
/// the report): the BullMQ peer's own Redis is `redis-bullmq`.
pub async fn start_redis_named(
    program: &Path,
    scratch: &Scratch,
    name: &str,
) -> anyhow::Result<Redis> {
    let (proc, url) = start_node(program, scratch, name, &[]).await?;
    Ok(Redis {
        nodes: vec![proc],
        urls: vec![url],
        cluster: false,
    })
}

/// Starts `masters` cluster-enabled `redis-server`s (`sluice::redis_server::cluster_node_args`, no
/// persistence) and forms a cluster of them with `sluice::redis_server::form_cluster`: masters only,
/// the 16384 slots shared evenly.
pub async fn start_cluster(
    program: &Path,
    scratch: &Scratch,
    masters: usize,
) -> anyhow::Result<Redis> {
    anyhow::ensure!(masters >= 1, "a cluster needs at least one master");
    let args = sluice::redis_server::cluster_node_args(5_000);
    let mut nodes = Vec::with_capacity(masters);
    let mut urls = Vec::with_capacity(masters);
    for i in 1..=masters {
        let (proc, url) = start_node(program, scratch, &format!("redis-{i}"), &args).await?;
        nodes.push(proc);
        urls.push(url);
    }
    let ports: Vec<u16> = urls
        .iter()
        .map(|u| u.rsplit(':').next().and_then(|p| p.parse().ok()))
        .collect::<Option<_>>()
        .context("a node url without a port")?;
    sluice::redis_server::form_cluster(&ports, 0, Duration::from_secs(30)).await?;
    Ok(Redis {
        nodes,
        urls,
        cluster: true,
    })
}

/// Starts a `redis-server` named `name` like `start_redis_named`, but run by `valgrind
/// --tool=callgrind` (its dumps go to `out`, `out.1`, `out.2`, ...; `callgrind_control` zeroes
/// and dumps it by the process id). Its start is ~50 times slower: it gets two minutes.
pub async fn start_redis_callgrind(
    valgrind: &Path,
    program: &Path,
    scratch: &Scratch,
    name: &str,
    out: &Path,
) -> anyhow::Result<Redis> {
    let wrap = Wrapper {
        program: valgrind.to_owned(),
        args: vec![
            "--tool=callgrind".into(),
            format!("--callgrind-out-file={}", out.display()),
        ],
    };
    let (proc, url) = start_node_as(program, scratch, name, &[], Some(&wrap)).await?;
    Ok(Redis {
        nodes: vec![proc],
        urls: vec![url],
        cluster: false,
    })
}

/// A program that runs redis-server (valgrind), with its own arguments before redis-server's.
struct Wrapper {
    program: PathBuf,
    args: Vec<String>,
}

/// Starts one `redis-server` named `name` (its folder and log in the scratch folder) on a free
/// loopback port without persistence, with `extra` arguments, and waits for PING
/// (`sluice::redis_server`, the launcher `sluice dev` and the tests use too).
async fn start_node(
    program: &Path,
    scratch: &Scratch,
    name: &str,
    extra: &[String],
) -> anyhow::Result<(Proc, String)> {
    start_node_as(program, scratch, name, extra, None).await
}

/// `start_node`, run by `wrapper` when given.
async fn start_node_as(
    program: &Path,
    scratch: &Scratch,
    name: &str,
    extra: &[String],
    wrapper: Option<&Wrapper>,
) -> anyhow::Result<(Proc, String)> {
    let dir = scratch.path().join(name);
    // A fresh folder: a cluster node would otherwise load the `nodes.conf` of an earlier node
    // of the same name (the cost measurement starts several clusters in one run).
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let log = scratch.path().join(format!("{name}.log"));
    let spawn = |port: u16| {
        let plain = redis_server::command(program, port, &dir, Persistence::Off);
        let mut cmd = match wrapper {
            None => Command::from(plain),
            Some(w) => {
                let mut cmd = Command::new(&w.program);
                cmd.args(&w.args)
                    .arg(plain.get_program())
                    .args(plain.get_args());
                cmd
            }
        };
        cmd.args(extra);
        Proc::spawn(name, &mut cmd, log.clone()).map_err(|e| {
            e.context(format!(
                "`{}` must be installed (scripts/test.sh installs it)",
                program.display()
            ))
        })
    };
    let limit = Duration::from_secs(if wrapper.is_some() { 120 } else { 10 });
    let (proc, port) =
        redis_server::start_on_free_port(spawn, |p: &mut Proc| p.ensure_running().is_err(), limit)
            .await?;
    Ok((proc, format!("redis://127.0.0.1:{port}")))
}

/// Settings every sluice child shares.
pub struct SluiceCmd {
    /// The `sluice` program (normally next to this benchmark's binary).
    pub program: PathBuf,
    /// The Redis every child uses (`--redis-url` or `--redis-cluster`).
    pub redis: RedisTarget,
    /// Multiplexed Redis connections per process.
    pub redis_connections: usize,
    /// Runtime threads of `serve` and of each worker (`TOKIO_WORKER_THREADS`); 0 = tokio's
    /// default, one per CPU.
    pub serve_threads: usize,
    pub worker_threads: usize,
}

impl SluiceCmd {
    /// The arguments that point a sluice process at the Redis.
    fn redis_args(&self) -> [String; 2] {
        match &self.redis {
            RedisTarget::Standalone(url) => ["--redis-url".into(), url.clone()],
            RedisTarget::Cluster(seeds) => ["--redis-cluster".into(), seeds.join(",")],
        }
    }
}

/// Sets `TOKIO_WORKER_THREADS` (read by `#[tokio::main]`) unless `threads` is 0.
fn runtime_threads(cmd: &mut Command, threads: usize) -> &mut Command {
    if threads > 0 {
        cmd.env("TOKIO_WORKER_THREADS", threads.to_string());
    }
    cmd
}

/// Starts `sluice serve` on a free port and waits until `/readyz` answers 200.
pub async fn start_serve(
    s: &SluiceCmd,
    scratch: &Scratch,
    admin_token: &str,
    max_concurrent: u32,
    max_queued: u32,
) -> anyhow::Result<(Proc, SocketAddr)> {
    start_serve_as(
        "serve",
        &[],
        s,
        scratch,
        admin_token,
        max_concurrent,
        max_queued,
    )
    .await
}

/// `start_serve` with `extra` arguments (the cost benchmark's longer Redis time-outs for a
/// Redis under callgrind); it then waits up to 120 s for `/readyz`.
pub async fn start_serve_with(
    s: &SluiceCmd,
    scratch: &Scratch,
    admin_token: &str,
    max_concurrent: u32,
    max_queued: u32,
    extra: &[String],
) -> anyhow::Result<(Proc, SocketAddr)> {
    start_serve_as(
        "serve",
        extra,
        s,
        scratch,
        admin_token,
        max_concurrent,
        max_queued,
    )
    .await
}

/// The same, named `name` (its log `<name>-<attempt>.log`), with `extra` arguments (with any,
/// it waits up to 120 s for `/readyz`).
pub async fn start_serve_as(
    name: &str,
    extra: &[String],
    s: &SluiceCmd,
    scratch: &Scratch,
    admin_token: &str,
    max_concurrent: u32,
    max_queued: u32,
) -> anyhow::Result<(Proc, SocketAddr)> {
    for attempt in 0..3 {
        let addr: SocketAddr =
            format!("127.0.0.1:{}", sluice::redis_server::free_port()?).parse()?;
        let mut proc = Proc::spawn(
            name,
            runtime_threads(&mut Command::new(&s.program), s.serve_threads)
                .arg("serve")
                .args(extra)
                .args(["--listen", &addr.to_string()])
                .args(s.redis_args())
                .args(["--redis-connections", &s.redis_connections.to_string()])
                .args(["--default-max-concurrent", &max_concurrent.to_string()])
                .args(["--default-max-queued", &max_queued.to_string()])
                // The sweeper would add Redis work the admission numbers should not contain.
                .args(["--sweep-interval-secs", "0"])
                // No storage bound stops a long run. As variables, not flags: a build from
                // before the bounds (`--compare-builds`) ignores them.
                .env("SLUICE_DEFAULT_MAX_BYTES", UNLIMITED_BYTES.to_string())
                .env("SLUICE_DEFAULT_MAX_RETAINED", UNLIMITED_BYTES.to_string())
                .env("SLUICE_ADMIN_TOKEN", admin_token)
                // The benchmark reads serve's counters from `/metrics` on loopback (a variable,
                // not the flag: a build from before the flag, under --compare-builds, ignores it).
                .env("SLUICE_METRICS_OPEN", "true")
                .env("RUST_LOG", "warn"),
            scratch.path().join(format!("{name}-{attempt}.log")),
        )?;
        let ready_within = if extra.is_empty() { 15 } else { 120 };
        let deadline = Instant::now() + Duration::from_secs(ready_within);
        while Instant::now() < deadline {
            if let Err(e) = proc.ensure_running() {
                if attempt == 2 {
                    return Err(e);
                }
                break;
            }
            if let Ok(mut c) = Conn::connect(addr).await
                && let Ok((status, _)) = c.get("/readyz").await
                && status == 200
            {
                return Ok((proc, addr));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        proc.kill().await;
    }
    bail!("sluice serve did not become ready")
}

/// Starts `sluice worker --demo-flows` named `name` (its log `<name>.log`) with `extra`
/// arguments; none gives sluice's default worker settings (the pickup, cancel and idle
/// phases), the end-to-end phase passes `--concurrency`.
pub fn start_worker(
    s: &SluiceCmd,
    scratch: &Scratch,
    name: &str,
    extra: &[String],
) -> anyhow::Result<Proc> {
    Proc::spawn(
        name,
        runtime_threads(&mut Command::new(&s.program), s.worker_threads)
            .args(["worker", "--demo-flows"])
            .args(s.redis_args())
            .args(["--redis-connections", &s.redis_connections.to_string()])
            .args(extra)
            // Info logs nothing per execution, and says "worker started" (see `wait_started`).
            .env("RUST_LOG", "info"),
        scratch.path().join(format!("{name}.log")),
    )
}

/// Waits until every worker's log says "worker started" (at most 15 s), failing when one
/// exits.
pub async fn wait_started(workers: &mut [Proc]) -> anyhow::Result<()> {
    wait_started_within(workers, Duration::from_secs(15)).await
}

/// `wait_started` with another bound (a worker of a Redis under callgrind starts slowly).
pub async fn wait_started_within(workers: &mut [Proc], limit: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    while !workers.iter().all(|wk| wk.log_contains("worker started")) {
        for wk in workers.iter_mut() {
            wk.ensure_running()?;
        }
        anyhow::ensure!(Instant::now() < deadline, "workers did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// CPU time (user + system) a process has used so far, in seconds; `None` when unreadable
/// (not Linux, or the process is gone).
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may contain spaces) start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line, i.e. 11 and 12 after ')'.
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    // USER_HZ is 100 on every Linux architecture sluice targets.
    Some(ticks / 100.0)
}

/// The processes whose parent is `pid` (from `/proc/*/stat`); empty when `/proc` is
/// unreadable. The HTTP peer's `node:cluster` processes, whose CPU its primary's does not hold.
pub fn children_of(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in dir.flatten() {
        let Some(child) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        // The parent is the second field after the command name's closing ')'.
        let parent = stat
            .rfind(')')
            .and_then(|i| stat[i + 2..].split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if parent == Some(pid) {
            out.push(child);
        }
    }
    out.sort_unstable();
    out
}

/// CPU time the whole machine has been busy (all CPUs: user, nice, system, interrupts, steal),
/// in seconds; `None` when `/proc/stat` is unreadable. Minus the benchmark's own processes this
/// is everything else the machine did — a run disturbed by other work shows it.
pub fn machine_busy_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let v: Vec<f64> = line
        .split_whitespace()
        .map(|f| f.parse::<f64>().unwrap_or(0.0))
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is inside user already).
    let busy: f64 = v.iter().take(8).sum::<f64>() - v.get(3)? - v.get(4)?;
    Some(busy / 100.0)
}
