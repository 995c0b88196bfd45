//! `TestServe`: a `sluice serve` child process on a test's Redis, for tests that need what
//! only a process of its own shows (span export set up at start, a server killed mid-delivery).
//! Separate from `app.rs`, whose application runs inside the test.

use std::process::{Child, Command, Stdio};

use super::{ADMIN_TOKEN, TestRedis, sluice_bin};

/// A `sluice serve` process (admin token `ADMIN_TOKEN`); killed (SIGKILL) when dropped.
pub struct TestServe(Child);

impl TestServe {
    /// Starts `sluice serve --listen 127.0.0.1:<port>` against `redis` with `args` added.
    pub fn spawn(redis: &TestRedis, port: u16, args: &[&str]) -> Self {
        Self(
            Command::new(sluice_bin())
                .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
                .args(redis.args())
                .args(args)
                .env("SLUICE_ADMIN_TOKEN", ADMIN_TOKEN)
                .env("RUST_LOG", "warn")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("sluice serve starts"),
        )
    }

    /// Kills it now (SIGKILL: no goodbye, as a crash).
    pub fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for TestServe {
    fn drop(&mut self) {
        self.kill();
    }
}
