//! The embedded default: a `redis-server` that `sluice dev` starts, owns and stops, with its
//! data (AOF on) in a local folder, so trying sluice needs nothing but the binary and Redis
//! installed.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::process::{Child, Command};

/// A redis-server child process on loopback.
pub struct ManagedRedis {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl ManagedRedis {
    /// Starts `program` on `port` (0 = a free one) with its data in `data_dir`, and waits until
    /// it answers PING (at most 10 s).
    pub async fn start(program: &Path, data_dir: &Path, port: u16) -> anyhow::Result<Self> {
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
    pub fn url(&self) -> String {
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
    pub async fn stop(mut self) {
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

fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("no free port on loopback")?;
    Ok(l.local_addr()?.port())
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(10)..].join("\n")
}
