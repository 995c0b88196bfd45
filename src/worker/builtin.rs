//! The built-in `demo.*` flows, for development and tests:
//! - `demo.echo`: the output is the params.
//! - `demo.sleep`: sleeps `params.ms` milliseconds (default 1000), stopping early when told;
//!   the output is `{"slept_ms": ms, "attempt": n}`.
//! - `demo.fail`: fails with `params.message`; retryable unless `params.retryable` is false.

use std::time::Duration;

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
                    Ok(json!({"slept_ms": ms, "attempt": ctx.attempt}))
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
}
