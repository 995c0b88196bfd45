//! The built-in `demo.*` flows, for development and tests:
//! - `demo.echo`: the output is the params.
//! - `demo.sleep`: sleeps `params.ms` milliseconds (default 1000), stopping early when told;
//!   the output is `{"slept_ms": ms, "attempt": n, "fence": f}`.
//! - `demo.fail`: fails with `params.message`; retryable unless `params.retryable` is false.
//! - `demo.panic`: panics (the runtime fails the execution as `handler_panic`).
//! - `demo.journal`: sleeps like `demo.sleep`, failing retryably while the attempt is at most
//!   `params.fail_attempts` (default 0), and appends a line for its start and one for its end
//!   to the file named by the worker's `SLUICE_JOURNAL` variable (when set). The fault-injection
//!   suite reads that journal to check that no two runs overlapped and that quotas held.

use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use super::handler::{Context, HandlerError, Registry};

/// Adds the demo flows to `registry`.
pub fn with_demo_flows(registry: Registry) -> Registry {
    registry
        .register("demo.echo", |ctx: Context| async move { Ok(ctx.params) })
        .register("demo.sleep", |ctx: Context| async move {
            let ms = ctx.params.get("ms").and_then(Value::as_u64).unwrap_or(1000);
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(ms)) => {
                    Ok(json!({"slept_ms": ms, "attempt": ctx.attempt, "fence": ctx.fence}))
                }
                _ = ctx.cancel.cancelled() => Err(HandlerError::permanent("stopped")),
            }
        })
        .register("demo.fail", |ctx: Context| async move {
            let message = ctx
                .params
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("demo.fail always fails")
                .to_owned();
            let retryable = ctx
                .params
                .get("retryable")
                .and_then(Value::as_bool)
                .unwrap_or(true);
            Err(HandlerError { message, retryable })
        })
        .register("demo.panic", |_ctx: Context| async move {
            if std::hint::black_box(true) {
                panic!("demo.panic panicked on purpose");
            }
            Ok(Value::Null)
        })
        .register("demo.journal", journal)
}

/// `demo.journal`: a run that leaves evidence of when it ran and under which fence.
async fn journal(ctx: Context) -> Result<Value, HandlerError> {
    let ms = ctx.params.get("ms").and_then(Value::as_u64).unwrap_or(100);
    let fail_attempts = ctx
        .params
        .get("fail_attempts")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let mut end = JournalEnd {
        ctx: ctx.clone(),
        how: "stopped",
    };
    journal_line(&ctx, json!({"ev": "start"}));
    tokio::select! {
        _ = tokio::time::sleep(Duration::from_millis(ms)) => {}
        _ = ctx.cancel.cancelled() => return Err(HandlerError::permanent("stopped")),
    }
    if u64::from(ctx.attempt) <= fail_attempts {
        end.how = "fail";
        return Err(HandlerError::retryable(format!(
            "demo.journal fails attempt {} of the first {fail_attempts}",
            ctx.attempt
        )));
    }
    end.how = "ok";
    Ok(json!({
        "fence": ctx.fence,
        "attempt": ctx.attempt,
        "nonce": ctx.params.get("nonce").cloned().unwrap_or(Value::Null),
    }))
}

/// Writes the end line of a `demo.journal` run when the run is over in any way, also when the
/// runtime drops it (cancel, lost lease, shutdown).
struct JournalEnd {
    ctx: Context,
    how: &'static str,
}

impl Drop for JournalEnd {
    fn drop(&mut self) {
        let deadline = ms_since_epoch(self.ctx.lease.deadline_wall());
        journal_line(
            &self.ctx,
            json!({"ev": "end", "how": self.how, "lease_deadline": deadline}),
        );
    }
}

/// Appends one line to `$SLUICE_JOURNAL`: the event plus who, which run and when (`t` in
/// milliseconds, `t_us` in microseconds since the epoch). One write per line on a file opened
/// for appending, so several worker processes can share the file.
fn journal_line(ctx: &Context, mut event: Value) {
    let Some(path) = std::env::var_os("SLUICE_JOURNAL") else {
        return;
    };
    event["id"] = json!(ctx.execution_id);
    event["tenant"] = json!(ctx.tenant_id);
    event["fence"] = json!(ctx.fence);
    event["attempt"] = json!(ctx.attempt);
    event["pid"] = json!(std::process::id());
    let now = SystemTime::now();
    event["t"] = json!(ms_since_epoch(now));
    // The same instant in microseconds: overlaps of short runs are told apart.
    event["t_us"] = json!(
        now.duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0)
    );
    let mut line = event.to_string();
    line.push('\n');
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = written {
        tracing::warn!(error = %e, "cannot write the demo.journal line");
    }
}

fn ms_since_epoch(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
