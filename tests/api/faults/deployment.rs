//! The processes under test: where they live (`Layout`: fixed ports, one folder for Redis's
//! data, the logs and the journal), each child process (`Proc`, continued and killed when
//! dropped) and the set of them (`Deployment`: one `redis-server`, one `sluice serve`, the
//! workers), with starting them, restarting what exited on its own and healing after the
//! faults. Separate from the fault lanes (`inject.rs`), which only decide what to do to these
//! processes and when.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice::redis_server::{self, Persistence};
use tokio::sync::Mutex as AsyncMutex;

use super::inject::Fault;
use super::load::Api;
use super::{DEFAULT_MAX_CONCURRENT, LEASE_TTL_MS, MAX_QUEUED, WORKERS, now_ms};
use crate::helpers::{ADMIN_TOKEN, free_port, sluice_bin};

/// A child process of the suite. Dropping it continues and kills it, so a failing test leaves
/// nothing running (and nothing stopped).
pub(super) struct Proc {
    pub(super) name: String,
    child: Child,
    log: PathBuf,
    /// When it was started (wall ms): an exit soon after means it gave up starting.
    started: u64,
}

impl Proc {
    fn spawn(name: String, cmd: &mut Command, log: &Path) -> Proc {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("log file");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log file"))
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        Proc {
            name,
            child,
            log: log.to_owned(),
            started: now_ms(),
        }
    }

    /// What it exited unasked with: its age and the last line of its log.
    fn exit_note(&self, now: u64) -> Exit {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        Exit {
            name: self.name.clone(),
            pid: self.pid(),
            at: now,
            ran_ms: now - self.started,
            last_words: text.lines().last().unwrap_or_default().to_owned(),
        }
    }

    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }

    fn exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGKILL and reap: dead when this returns.
    pub(super) fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if !self.exited() {
            signal(self.pid(), "CONT");
            self.kill9();
        }
    }
}

/// Sends a signal by name (`STOP`, `CONT`, `KILL`) to a process.
pub(super) fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// A process that exited without being killed (it was restarted).
#[derive(Debug, Clone)]
pub(super) struct Exit {
    pub(super) name: String,
    pub(super) pid: u32,
    /// When the exit was noticed.
    pub(super) at: u64,
    pub(super) ran_ms: u64,
    pub(super) last_words: String,
}

/// Where the processes live: fixed ports (a restart reuses them, so clients and sluice find
/// the new process where the old one was) and one folder for Redis's data, logs and journal.
pub(super) struct Layout {
    dir: PathBuf,
    pub(super) journal: PathBuf,
    redis_port: u16,
    serve_port: u16,
}

impl Layout {
    pub(super) fn redis_url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.redis_port)
    }

    pub(super) fn spawn_redis(&self) -> Proc {
        // AOF with every write synced: a SIGKILL loses nothing Redis acknowledged.
        let mut cmd = redis_server::command(
            Path::new("redis-server"),
            self.redis_port,
            &self.dir.join("redis"),
            Persistence::Aof("always"),
        );
        Proc::spawn("redis".into(), &mut cmd, &self.dir.join("redis.log"))
    }

    pub(super) fn spawn_serve(&self) -> Proc {
        let mut cmd = Command::new(sluice_bin());
        cmd.arg("serve")
            .args(["--listen", &format!("127.0.0.1:{}", self.serve_port)])
            .args(["--redis-url", &self.redis_url()])
            .args(["--admin-token", ADMIN_TOKEN])
            .args(["--redis-timeout-ms", "500"])
            .args(["--request-timeout-ms", "5000"])
            .args(["--sweep-interval-secs", "2"])
            // The checker's fair-share property reads the shards' start logs.
            .arg("--start-log")
            .args(["--default-max-queued", &MAX_QUEUED.to_string()])
            .args([
                "--default-max-concurrent",
                &DEFAULT_MAX_CONCURRENT.to_string(),
            ])
            .env("RUST_LOG", "warn")
            // An error's last line in the log then says why it exited (panics keep theirs).
            .env("RUST_LIB_BACKTRACE", "0");
        Proc::spawn("serve".into(), &mut cmd, &self.dir.join("serve.log"))
    }

    fn spawn_worker(&self, n: usize) -> Proc {
        let name = format!("worker-{n}");
        let mut cmd = Command::new(sluice_bin());
        cmd.args(["worker", "--demo-flows", "--redis-url", &self.redis_url()])
            .args(["--lease-ttl-ms", &LEASE_TTL_MS.to_string()])
            .args(["--heartbeat-ms", "300", "--scan-ms", "300"])
            .args(["--retry-backoff-ms", "50"])
            .args(["--concurrency", "4", "--drain-timeout-ms", "1000"])
            // A Redis call must give up well within the lease it is meant to renew.
            .args(["--redis-timeout-ms", "500"])
            .env("SLUICE_JOURNAL", &self.journal)
            .env("RUST_LOG", "warn")
            // An error's last line in the log then says why it exited (panics keep theirs).
            .env("RUST_LIB_BACKTRACE", "0");
        let log = self.dir.join(format!("{name}.log"));
        Proc::spawn(name, &mut cmd, &log)
    }
}

/// The processes under test (one redis-server, one `sluice serve`, the workers; not a Redis
/// Cluster) and what was done to them.
pub(super) struct Deployment {
    pub(super) at: Layout,
    pub(super) redis: Proc,
    pub(super) serve: Proc,
    pub(super) workers: Vec<Proc>,
    /// Workers started so far (names their logs).
    spawned: usize,
    /// Worker pid → the instant by which it was dead (SIGKILLed and reaped, or found exited):
    /// its runs without an `end` line end there.
    pub(super) gone: HashMap<u32, u64>,
    /// Processes that exited without being killed (and were restarted).
    pub(super) exits: Vec<Exit>,
    pub(super) faults: Vec<Fault>,
}

impl Deployment {
    pub(super) fn spawn_worker(&mut self) -> Proc {
        self.spawned += 1;
        self.at.spawn_worker(self.spawned)
    }

    /// Restarts whatever exited on its own (a worker or `serve` started while Redis was down
    /// gives up; so may one that lost Redis for long). Killed processes are restarted by the
    /// lane that killed them, so anything found here exited unasked.
    pub(super) fn ensure_running(&mut self) {
        let now = now_ms();
        if self.redis.exited() {
            self.exits.push(self.redis.exit_note(now));
            self.redis = self.at.spawn_redis();
        }
        if self.serve.exited() {
            self.exits.push(self.serve.exit_note(now));
            self.serve = self.at.spawn_serve();
        }
        for i in 0..self.workers.len() {
            if self.workers[i].exited() {
                self.gone.insert(self.workers[i].pid(), now);
                self.exits.push(self.workers[i].exit_note(now));
                self.workers[i] = self.spawn_worker();
            }
        }
    }

    /// Every process continued (a SIGCONT to a running process does nothing).
    fn continue_all(&self) {
        signal(self.redis.pid(), "CONT");
        signal(self.serve.pid(), "CONT");
        for w in &self.workers {
            signal(w.pid(), "CONT");
        }
    }
}

/// Waits until Redis answers PING (after a restart it first loads the AOF).
pub(super) async fn wait_redis(url: &str, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    let Ok(client) = redis::Client::open(url) else {
        return false;
    };
    while Instant::now() < deadline {
        let ping = async {
            let mut c = client.get_multiplexed_async_connection().await?;
            redis::cmd("PING").query_async::<String>(&mut c).await
        };
        if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(1), ping).await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// Waits until `serve` answers `/readyz` with 200.
pub(super) async fn wait_serve(api: &Api, limit: Duration) -> bool {
    crate::helpers::wait_ready(&api.http, &api.base, limit).await
}

/// Starts Redis, `serve` and the workers, Redis and `serve` on free ports.
pub(super) async fn start_deployment(dir: &Path) -> (Deployment, Api) {
    std::fs::create_dir_all(dir.join("redis")).expect("redis dir");
    // A free port can be taken between probing and binding: try a few.
    for _ in 0..5 {
        let at = Layout {
            dir: dir.to_owned(),
            journal: dir.join("journal.jsonl"),
            redis_port: free_port(),
            serve_port: free_port(),
        };
        let mut redis = at.spawn_redis();
        if !wait_redis(&at.redis_url(), Duration::from_secs(10)).await {
            redis.kill9();
            continue;
        }
        let mut serve = at.spawn_serve();
        let api = Api::new(at.serve_port);
        if !wait_serve(&api, Duration::from_secs(15)).await {
            serve.kill9();
            continue;
        }
        let workers = (1..=WORKERS).map(|n| at.spawn_worker(n)).collect();
        let deployment = Deployment {
            at,
            redis,
            serve,
            workers,
            spawned: WORKERS,
            gone: HashMap::new(),
            exits: Vec::new(),
            faults: Vec::new(),
        };
        return (deployment, api);
    }
    panic!("could not start redis-server and sluice serve on free ports");
}

/// Continues every process, restarts any that exited, and waits until Redis and `serve` answer.
pub(super) async fn heal(deployment: &Arc<AsyncMutex<Deployment>>, api: &Api) {
    for _ in 0..5 {
        let url = {
            let mut c = deployment.lock().await;
            c.continue_all();
            c.ensure_running();
            c.at.redis_url()
        };
        if wait_redis(&url, Duration::from_secs(10)).await
            && wait_serve(api, Duration::from_secs(10)).await
        {
            return;
        }
    }
    panic!("redis-server or sluice serve did not come back after the faults");
}
