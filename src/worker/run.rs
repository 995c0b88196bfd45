//! Running one handler to an outcome: in its own task (a panic fails the execution like an
//! error), never past the lease this worker can prove, and with the retry backoff a failure
//! asks for.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::runs::{Stop, StopReason};
use super::{Context, Lease, Registry, WorkerConfig};
use crate::store::{Outcome, Started};

/// Runs one execution's handler to an outcome: in its own task (so a panic is caught), and no
/// longer than this worker can prove it holds the lease.
pub(super) async fn run_one(
    registry: &Registry,
    s: Started,
    lease: Lease,
    stop: CancellationToken,
    why: &StopReason,
    config: &WorkerConfig,
) -> Outcome {
    let Some(handler) = registry.get(s.flow.as_str()) else {
        return Outcome::Failed {
            kind: "unknown_flow".into(),
            message: format!(
                "no handler for flow {:?} on worker {}",
                s.flow.as_str(),
                config.consumer
            ),
            retry_after: None,
        };
    };
    let ctx = Context {
        execution_id: s.id,
        tenant_id: s.tenant,
        flow_id: s.flow,
        version: s.version,
        params: s.params,
        trace: s.trace,
        attempt: s.attempt,
        max_attempts: s.max_attempts,
        fence: s.fence,
        lease: lease.clone(),
        cancel: stop.clone(),
    };
    // The lease ran out before the handler could begin (this process was paused, or starved,
    // between the start call and here): a newer run may exist, so this one never begins. It
    // ends as a lease that expired mid-run would: unreported, re-run after the orphan scan.
    if !lease.is_held() {
        why.record(Stop::Expired);
        return Outcome::Abandoned;
    }
    let mut task = tokio::spawn(handler.run(ctx));
    let result = loop {
        tokio::select! {
            r = &mut task => break Some(r),
            _ = stop.cancelled() => break None,
            _ = tokio::time::sleep_until(lease.deadline().into()) => {
                // A renewal may have moved the deadline while this slept.
                if !lease.is_held() {
                    why.record(Stop::Expired);
                    stop.cancel();
                    break None;
                }
            }
        }
    };
    if result.is_none() {
        // The handler is dropped before the run is reported: nothing of it runs past that.
        task.abort();
        let _ = task.await;
    }
    // A stop decided by the runtime wins over whatever the handler returned while stopping.
    match (why.get(), result) {
        (Some(Stop::Shutdown), _) => Outcome::Released,
        (Some(Stop::Expired), _) => Outcome::Abandoned,
        (Some(Stop::Cancel | Stop::Lost), _) | (_, None) => Outcome::Cancelled,
        (_, Some(Ok(Ok(output)))) => Outcome::Completed(output),
        (_, Some(Ok(Err(e)))) => Outcome::Failed {
            kind: "handler_error".into(),
            retry_after: e.retryable.then(|| backoff(config, s.attempt)),
            message: e.message,
        },
        (_, Some(Err(join))) => Outcome::Failed {
            kind: "handler_panic".into(),
            retry_after: Some(backoff(config, s.attempt)),
            message: panic_message(join),
        },
    }
}

/// What a handler's panic said, as far as it can be told.
fn panic_message(e: tokio::task::JoinError) -> String {
    match e.try_into_panic() {
        Ok(payload) => {
            let text = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a non-text panic payload".into());
            format!("handler panicked: {text}")
        }
        Err(e) => format!("handler task ended abnormally: {e}"),
    }
}

/// Backoff before the attempt after `attempt`: base × 2^(attempt-1), capped.
fn backoff(config: &WorkerConfig, attempt: u32) -> Duration {
    retry_backoff(config.retry_backoff, config.retry_backoff_max, attempt)
}

/// The pause before the attempt after failed attempt `attempt`: `first` doubling per attempt,
/// at most `most`. `sluice worker` and the pull API (`crate::pull::Pull::backoff`) both use it.
pub fn retry_backoff(first: Duration, most: Duration, attempt: u32) -> Duration {
    let factor = 1u32 << attempt.saturating_sub(1).min(20);
    first.saturating_mul(factor).min(most)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::domain::ExecutionId;

    fn started() -> Started {
        Started {
            shard: crate::store::ShardMap::new(16, crate::store::Layout::CURRENT).shard(0),
            id: ExecutionId::new(),
            fence: 1,
            attempt: 1,
            max_attempts: 3,
            tenant: crate::domain::TenantId::parse("acme").unwrap(),
            flow: crate::domain::FlowId::parse("count").unwrap(),
            version: None,
            params: serde_json::json!({}),
            trace: None,
        }
    }

    /// A run whose lease ran out before its handler began (its worker paused between the start
    /// call and the handler) never begins: the fault suite once saw such a handler start 1 ms
    /// past its lease, beside the newer run that had taken over.
    #[tokio::test]
    async fn a_run_whose_lease_ran_out_before_it_began_never_begins() {
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = runs.clone();
        let registry = Registry::new().register("count", move |_ctx: Context| {
            counted.fetch_add(1, Ordering::SeqCst);
            async { Ok(serde_json::json!({})) }
        });
        let run = |lease: Lease| {
            let registry = &registry;
            async move {
                let why = StopReason::default();
                run_one(
                    registry,
                    started(),
                    lease,
                    CancellationToken::new(),
                    &why,
                    &WorkerConfig::default(),
                )
                .await
            }
        };
        let sent = std::time::Instant::now() - Duration::from_secs(2);
        let outcome = run(Lease::granted(sent, Duration::from_secs(1))).await;
        assert!(matches!(outcome, Outcome::Abandoned));
        assert_eq!(runs.load(Ordering::SeqCst), 0);
        // The same run with its lease held runs its handler.
        let outcome = run(Lease::granted(
            std::time::Instant::now(),
            Duration::from_secs(60),
        ))
        .await;
        assert!(matches!(outcome, Outcome::Completed(_)));
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }
}
