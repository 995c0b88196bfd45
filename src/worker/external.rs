//! Handlers configured in a flows file: `http` (POST the params to a URL) and `command` (run a
//! program with the params on stdin).
//!
//! ```toml
//! [flows."billing.invoice"]
//! kind = "http"
//! url = "http://127.0.0.1:9000/invoice"
//! timeout_secs = 30
//!
//! [flows."report.build"]
//! kind = "command"
//! program = "/usr/local/bin/build-report"
//! args = ["--json"]
//! timeout_secs = 600
//! ```

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;
use serde::Deserialize;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::handler::{Context, HandlerError, HandlerFuture, Registry};
use crate::domain::FlowId;

/// Longest excerpt of a failing response body or stderr kept in the error message.
const EXCERPT: usize = 512;

/// The flows file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlowsFile {
    #[serde(default)]
    pub flows: BTreeMap<String, FlowSpec>,
}

/// How one flow runs.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum FlowSpec {
    /// POST the params as JSON; a 2xx JSON body is the output (an empty body is `null`).
    Http {
        url: String,
        #[serde(default = "default_timeout")]
        timeout_secs: u64,
    },
    /// Run `program args...` with the params as JSON on stdin; stdout (JSON, or empty for
    /// `null`) is the output; a non-zero exit is a failure. Killed on cancel or timeout.
    Command {
        program: String,
        #[serde(default)]
        args: Vec<String>,
        #[serde(default = "default_timeout")]
        timeout_secs: u64,
    },
}

fn default_timeout() -> u64 {
    300
}

/// Reads a flows file and adds its handlers to `registry`.
pub fn load_flows(registry: Registry, path: &Path) -> anyhow::Result<Registry> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read flows file {}", path.display()))?;
    let file: FlowsFile =
        toml::from_str(&text).with_context(|| format!("invalid flows file {}", path.display()))?;
    let client = crate::tls::client_builder(&[])?.build()?;
    let mut registry = registry;
    for (name, spec) in file.flows {
        FlowId::parse(&name).map_err(|e| anyhow::anyhow!("flow {name:?}: {}", e.detail))?;
        registry = match spec {
            FlowSpec::Http { url, timeout_secs } => {
                let url = reqwest::Url::parse(&url)
                    .with_context(|| format!("flow {name}: invalid url {url}"))?;
                registry.register(
                    name,
                    HttpHandler {
                        client: client.clone(),
                        url,
                        timeout: Duration::from_secs(timeout_secs),
                    },
                )
            }
            FlowSpec::Command {
                program,
                args,
                timeout_secs,
            } => registry.register(
                name,
                CommandHandler {
                    program,
                    args,
                    timeout: Duration::from_secs(timeout_secs),
                },
            ),
        };
    }
    Ok(registry)
}

fn excerpt(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut s: String = text.chars().take(EXCERPT).collect();
    if text.chars().count() > EXCERPT {
        s.push('…');
    }
    s
}

fn output_of(bytes: &[u8], what: &str) -> Result<Value, HandlerError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Null);
    }
    serde_json::from_slice(bytes).map_err(|e| {
        HandlerError::permanent(format!("{what} is not JSON ({e}): {}", excerpt(bytes)))
    })
}

/// Refuses to start a side effect once the lease can no longer be proven held (the runtime
/// stops such a run anyway; this closes the gap between a resumed process and that stop).
fn lease_check(ctx: &Context) -> Result<(), HandlerError> {
    if ctx.lease.is_held() {
        Ok(())
    } else {
        Err(HandlerError::retryable(
            "lease lapsed before the handler started",
        ))
    }
}

struct HttpHandler {
    client: reqwest::Client,
    url: reqwest::Url,
    timeout: Duration,
}

impl super::handler::Handler for HttpHandler {
    fn run(&self, ctx: Context) -> HandlerFuture {
        let mut request = self
            .client
            .post(self.url.clone())
            .timeout(self.timeout)
            .header("X-Sluice-Execution-Id", ctx.execution_id.as_str())
            .header("X-Sluice-Tenant-Id", ctx.tenant_id.as_str())
            .header("X-Sluice-Attempt", ctx.attempt.to_string())
            .header("X-Sluice-Fence", ctx.fence.to_string())
            .json(&ctx.params);
        // The caller's trace goes on into the handler (W3C Trace Context headers).
        if let Some(t) = &ctx.trace {
            request = request.header("traceparent", &t.traceparent);
            if let Some(state) = &t.tracestate {
                request = request.header("tracestate", state);
            }
        }
        Box::pin(async move {
            lease_check(&ctx)?;
            let res = request
                .send()
                .await
                .map_err(|e| HandlerError::retryable(format!("request failed: {e}")))?;
            let status = res.status();
            let body = res
                .bytes()
                .await
                .map_err(|e| HandlerError::retryable(format!("reading the response: {e}")))?;
            if status.is_success() {
                return output_of(&body, "response body");
            }
            let message = format!("HTTP {status}: {}", excerpt(&body));
            // A 4xx other than 408/429 says the request itself is wrong: retrying cannot help.
            if status.is_client_error() && status.as_u16() != 408 && status.as_u16() != 429 {
                Err(HandlerError::permanent(message))
            } else {
                Err(HandlerError::retryable(message))
            }
        })
    }
}

struct CommandHandler {
    program: String,
    args: Vec<String>,
    timeout: Duration,
}

impl super::handler::Handler for CommandHandler {
    fn run(&self, ctx: Context) -> HandlerFuture {
        let mut cmd = tokio::process::Command::new(&self.program);
        cmd.args(&self.args)
            .env("SLUICE_EXECUTION_ID", ctx.execution_id.as_str())
            .env("SLUICE_TENANT_ID", ctx.tenant_id.as_str())
            .env("SLUICE_FLOW_ID", ctx.flow_id.as_str())
            .env("SLUICE_ATTEMPT", ctx.attempt.to_string())
            .env("SLUICE_FENCE", ctx.fence.to_string())
            // Never the worker's own: a run without trace context must not join another trace.
            .env_remove("TRACEPARENT")
            .env_remove("TRACESTATE")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Dropping the future (cancel, lease lost, shutdown) kills the program.
            .kill_on_drop(true);
        // The caller's trace goes on into the program (the environment variables
        // OpenTelemetry's SDKs read a parent context from).
        if let Some(t) = &ctx.trace {
            cmd.env("TRACEPARENT", &t.traceparent);
            if let Some(state) = &t.tracestate {
                cmd.env("TRACESTATE", state);
            }
        }
        let program = self.program.clone();
        let timeout = self.timeout;
        Box::pin(async move {
            lease_check(&ctx)?;
            let mut child = cmd
                .spawn()
                .map_err(|e| HandlerError::permanent(format!("cannot start {program}: {e}")))?;
            let input = ctx.params.to_string();
            let mut stdin = child.stdin.take();
            let mut stdout = child.stdout.take();
            let mut stderr = child.stderr.take();
            let run = async {
                if let Some(mut s) = stdin.take() {
                    // A program that does not read its input is not an error.
                    let _ = s.write_all(input.as_bytes()).await;
                }
                let (mut out, mut err) = (Vec::new(), Vec::new());
                let read_out = async {
                    if let Some(s) = stdout.as_mut() {
                        let _ = s.read_to_end(&mut out).await;
                    }
                };
                let read_err = async {
                    if let Some(s) = stderr.as_mut() {
                        let _ = s.read_to_end(&mut err).await;
                    }
                };
                tokio::join!(read_out, read_err);
                let status = child.wait().await;
                (status, out, err)
            };
            let (status, out, err) = tokio::time::timeout(timeout, run).await.map_err(|_| {
                HandlerError::retryable(format!("{program} timed out after {timeout:?}"))
            })?;
            let status = status
                .map_err(|e| HandlerError::retryable(format!("waiting for {program}: {e}")))?;
            if status.success() {
                output_of(&out, "stdout")
            } else {
                Err(HandlerError::retryable(format!(
                    "{program} exited with {status}: {}",
                    excerpt(&err)
                )))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flows_file_parses_both_kinds_and_refuses_unknown_keys() {
        let file: FlowsFile = toml::from_str(
            r#"
            [flows."a.http"]
            kind = "http"
            url = "http://127.0.0.1:1/x"
            [flows."b.cmd"]
            kind = "command"
            program = "cat"
            timeout_secs = 5
            "#,
        )
        .unwrap();
        assert_eq!(file.flows.len(), 2);
        assert!(
            toml::from_str::<FlowsFile>("[flows.x]\nkind = \"http\"\nurl = \"u\"\nuri = 1")
                .is_err()
        );
        assert!(toml::from_str::<FlowsFile>("[flows.x]\nkind = \"ftp\"").is_err());
    }
}
