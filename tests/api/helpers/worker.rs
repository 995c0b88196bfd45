//! `TestWorker`: a `sluice worker --demo-flows` child process on a test's Redis, with
//! signals (a `STOP` that returns only once every thread has stopped), and what starting one
//! needs (short worker timings, a flows file). Separate from `app.rs`: a worker is another
//! process, as in production, not part of the application under test.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{TestRedis, sluice_bin};

/// Worker timings short enough for tests: lease 500 ms, heartbeat 100 ms, scan 100 ms.
pub const FAST_WORKER: &[&str] = &[
    "--lease-ttl-ms",
    "500",
    "--heartbeat-ms",
    "100",
    "--scan-ms",
    "100",
    "--retry-backoff-ms",
    "50",
];

/// A `sluice worker` process with the demo flows; killed (SIGKILL) when dropped.
pub struct TestWorker {
    child: Child,
}

impl TestWorker {
    /// Starts `sluice worker --demo-flows` against `redis` with `args` added.
    pub fn spawn(redis: &TestRedis, args: &[&str]) -> Self {
        Self::spawn_env(redis, args, &[])
    }

    /// Like `spawn`, with environment variables set (e.g. `SLUICE_JOURNAL`).
    /// `SLUICE_TEST_WORKER_LOG=debug cargo test ... -- --nocapture` shows the worker's log at
    /// that level, for debugging a test.
    pub fn spawn_env(redis: &TestRedis, args: &[&str], env: &[(&str, &str)]) -> Self {
        let log = std::env::var("SLUICE_TEST_WORKER_LOG").ok();
        let shown = || match log {
            Some(_) => Stdio::inherit(),
            None => Stdio::null(),
        };
        let child = Command::new(sluice_bin())
            .args(["worker", "--demo-flows"])
            .args(redis.args())
            .args(args)
            .envs(env.iter().copied())
            .env("RUST_LOG", log.as_deref().unwrap_or("warn"))
            .stdout(shown())
            .stderr(shown())
            .spawn()
            .expect("sluice worker starts");
        Self { child }
    }

    /// Sends a signal by name (`KILL`, `STOP`, `CONT`, `TERM`). `STOP` returns only once every
    /// thread of the worker has stopped: the kernel stops a thread that is running when it next
    /// enters the kernel, and on a loaded machine one may still act (e.g. send a start call on
    /// a wake-up that just came in) after `kill` returned.
    pub fn signal(&self, sig: &str) {
        let pid = self.child.id();
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &pid.to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{sig} failed");
        if sig == "STOP" {
            let deadline = Instant::now() + Duration::from_secs(10);
            while !all_threads_stopped(pid) {
                assert!(Instant::now() < deadline, "worker {pid} did not stop");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    /// SIGKILL and reap.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for the process to exit (at most `limit`); its exit status.
    pub fn wait_exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "worker did not exit within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl TestWorker {
    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for TestWorker {
    fn drop(&mut self) {
        // A stopped process must be continued to die promptly. One already reaped (`kill9`,
        // `wait_exit`, `is_running` saw it exit) is gone, and its pid may be another
        // process's by now: `kill` would print "No such process" into the suite's output.
        // One not reaped is still there (stopped, running or a zombie), so this cannot race.
        if let Ok(None) = self.child.try_wait() {
            let _ = Command::new("kill")
                .args(["-CONT", &self.child.id().to_string()])
                .status();
        }
        self.kill9();
    }
}
/// Whether every thread of process `pid` is stopped (state `T` in `/proc/<pid>/task/*/stat`).
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|task| {
        std::fs::read_to_string(task.path().join("stat")).is_ok_and(|stat| {
            // `pid (name) state ...`: the state follows the last ')'.
            stat.rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with(['T', 't']))
        })
    })
}

/// A flows file with `toml` in a temporary folder: the folder (kept while it lives) and the
/// file's path, for `sluice worker --flows`.
pub fn flows_file(toml: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flows.toml");
    std::fs::write(&path, toml).unwrap();
    (dir, path)
}
