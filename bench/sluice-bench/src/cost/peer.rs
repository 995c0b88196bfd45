//! The BullMQ peer's cost roles (`bench/bullmq/peer.mjs --role fill` and `--role drain`): run
//! with `node` against a redis-server the caller started, each bounded in time and killed
//! with its handle.

use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use serde::Deserialize;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

use super::Ctx;
use crate::report::PeerVersions;

/// What `--role fill` prints.
#[derive(Debug, Deserialize)]
pub struct Filled {
    pub bullmq: String,
    pub node: String,
    pub added: u64,
    pub errors: u64,
}

impl Filled {
    pub fn versions(&self) -> PeerVersions {
        PeerVersions {
            bullmq: self.bullmq.clone(),
            node: self.node.clone(),
        }
    }
}

/// What `--role drain` prints at its end.
#[derive(Debug, Deserialize)]
pub struct Drained {
    pub completed: u64,
    pub failed: u64,
}

fn node(ctx: &Ctx<'_>, role: &str, port: &str) -> anyhow::Result<Command> {
    let script = ctx.peer.as_ref().map_err(|n| anyhow::anyhow!("{n}"))?;
    let mut cmd = Command::new(&ctx.args.node);
    cmd.arg(script)
        .args(["--role", role, "--port", port])
        .args(["--queues", &ctx.queues().join(",")])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    Ok(cmd)
}

/// Adds `count` jobs (`<tag>-<k>`, data of `data_bytes`) over the tenants' queues and waits
/// for the peer to exit (at most `limit`).
pub async fn fill(
    ctx: &Ctx<'_>,
    port: &str,
    tag: &str,
    count: u64,
    data_bytes: usize,
    limit: Duration,
) -> anyhow::Result<Filled> {
    let child = node(ctx, "fill", port)?
        .args(["--count", &count.to_string(), "--tag", tag])
        .args(["--data-bytes", &data_bytes.to_string()])
        .spawn()
        .context("cannot start the BullMQ peer")?;
    let out = tokio::time::timeout(limit, child.wait_with_output())
        .await
        .with_context(|| format!("the BullMQ filler did not finish in {limit:?}"))??;
    anyhow::ensure!(
        out.status.success(),
        "the BullMQ filler exited ({})",
        out.status
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .context("the BullMQ filler printed no result")?;
    serde_json::from_str(line).context("the BullMQ filler's result")
}

/// A running `--role drain`: workers on every queue until `expect` jobs completed.
pub struct Drain {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
    /// It ends by itself after `--cost-drain-secs`; this adds a minute for closing.
    limit: Duration,
}

impl Drain {
    /// Starts the workers (concurrency 256 each) and waits until every one is connected (at
    /// most 120 s: Redis may run under callgrind).
    pub async fn start(ctx: &Ctx<'_>, port: &str, expect: u64) -> anyhow::Result<Self> {
        let mut child = node(ctx, "drain", port)?
            .args(["--concurrency", "256", "--expect", &expect.to_string()])
            .args(["--timeout-secs", &ctx.args.cost_drain_secs.to_string()])
            .spawn()
            .context("cannot start the BullMQ peer")?;
        let stdout = child.stdout.take().context("the drain's stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let first = tokio::time::timeout(Duration::from_secs(120), lines.next_line())
            .await
            .context("the BullMQ workers did not connect within 120 s")??
            .context("the BullMQ drain exited before its workers connected")?;
        anyhow::ensure!(
            first.contains("\"ready\""),
            "the BullMQ drain said {first:?}"
        );
        Ok(Self {
            child,
            lines,
            limit: Duration::from_secs(ctx.args.cost_drain_secs + 60),
        })
    }

    /// Waits for its result (it ends by itself at `expect` jobs or `--cost-drain-secs`).
    pub async fn finish(mut self) -> anyhow::Result<Drained> {
        let line = tokio::time::timeout(self.limit, self.lines.next_line())
            .await
            .context("the BullMQ drain did not end")??
            .context("the BullMQ drain exited without its result")?;
        let _ = self.child.wait().await;
        serde_json::from_str(&line).context("the BullMQ drain's result")
    }

    /// Stops it at once (its jobs will not all come: an admission failed).
    pub async fn kill(mut self) {
        let _ = self.child.kill().await;
    }
}
