//! What a flow is to the runtime: a `Handler` that turns params into an output, told through
//! its `Context` which attempt it runs and when to stop. Rust programs implement the trait;
//! `sluice worker` fills a `Registry` from a flows file and the built-in demo flows.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::Lease;
use crate::domain::{ExecutionId, FlowId, TenantId, TraceContext};

/// Everything a handler learns about the execution it runs.
#[derive(Debug, Clone)]
pub struct Context {
    pub execution_id: ExecutionId,
    pub tenant_id: TenantId,
    pub flow_id: FlowId,
    pub version: Option<String>,
    pub params: Value,
    /// The W3C trace context the execution's admission carried: hand it on (as the
    /// `traceparent` and `tracestate` headers of an outgoing call) so the caller's trace goes
    /// on through the handler.
    pub trace: Option<TraceContext>,
    /// Starts of this run of the execution: 1 on the first (a retry starts over at 1).
    pub attempt: u32,
    pub max_attempts: u32,
    /// The fencing token of this run: grows with every start of the execution and never
    /// repeats, also across retries. Hand it to systems the handler writes to, so they can
    /// refuse a write from a run that is no longer current (a paused, superseded worker).
    pub fence: u64,
    /// How long this worker can prove it holds the execution's lease. Check it before a side
    /// effect: after it lapses another worker may already run the execution.
    pub lease: Lease,
    /// Cancelled when the execution is cancelled, its lease is lost, or the worker shuts
    /// down past its drain timeout. The runtime also drops the handler's future then, so a
    /// handler only needs to watch it to clean up or to stop a loop early.
    pub cancel: CancellationToken,
}

/// A handler's failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerError {
    pub message: String,
    /// Whether another attempt may succeed (then it is retried with backoff while attempts
    /// last, and dead-lettered as `handler_error` after the last).
    pub retryable: bool,
}

impl HandlerError {
    /// A failure worth retrying (a dependency was down, a timeout).
    pub fn retryable(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            retryable: true,
        }
    }

    /// A failure no retry can fix (bad params); the execution fails at once.
    pub fn permanent(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            retryable: false,
        }
    }
}

/// The future a handler returns.
pub type HandlerFuture = Pin<Box<dyn Future<Output = Result<Value, HandlerError>> + Send>>;

/// Runs one flow.
pub trait Handler: Send + Sync + 'static {
    /// Runs the execution described by `ctx`; `Ok` is its output.
    fn run(&self, ctx: Context) -> HandlerFuture;
}

impl<F, Fut> Handler for F
where
    F: Fn(Context) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Value, HandlerError>> + Send + 'static,
{
    fn run(&self, ctx: Context) -> HandlerFuture {
        Box::pin(self(ctx))
    }
}

/// Flow name → handler.
#[derive(Clone, Default)]
pub struct Registry {
    handlers: HashMap<String, Arc<dyn Handler>>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) the handler of `flow`.
    pub fn register(mut self, flow: impl Into<String>, handler: impl Handler) -> Self {
        self.handlers.insert(flow.into(), Arc::new(handler));
        self
    }

    /// The handler of `flow`, if any.
    pub fn get(&self, flow: &str) -> Option<Arc<dyn Handler>> {
        self.handlers.get(flow).cloned()
    }

    /// Registered flow names, sorted.
    pub fn flows(&self) -> Vec<String> {
        let mut v: Vec<String> = self.handlers.keys().cloned().collect();
        v.sort();
        v
    }
}
