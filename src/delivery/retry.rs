//! When a failed event goes again: each event's own pause, doubling with its failed attempts
//! (`retry_pause`), and the one wake-up timer per tenant that brings the deliverer back when
//! the first waiting event may go (`Deliverer::wake_at`). Kept in the delivering server's
//! memory; the deliverer (`mod.rs`) holds the tenant's delivery lock while an event waits, so
//! no other server sends it early.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::Deliverer;
use crate::domain::TenantId;

/// How long after its first failed attempt an event is sent again; the pause doubles with
/// each failed attempt of the same event.
pub const RETRY_FIRST: Duration = Duration::from_secs(1);
/// The longest pause before an event is sent again (and after a round that could not reach
/// Redis).
pub const RETRY_MAX: Duration = Duration::from_secs(300);
/// While an event waits out its pause, the tenant's outbox is read again at least this often,
/// so other executions' events go out meanwhile.
pub const LOOK_WHILE_WAITING: Duration = Duration::from_secs(5);

/// The pause before an event whose `attempts`-th attempt failed is sent again:
/// `RETRY_FIRST` doubling per failed attempt, at most `RETRY_MAX`.
pub fn retry_pause(attempts: u32) -> Duration {
    let exp = attempts.saturating_sub(1).min(16);
    (RETRY_FIRST * 2u32.pow(exp)).min(RETRY_MAX)
}

/// A failed event's schedule: its attempts by this server (for the delivery log) and when it
/// may be sent again.
#[derive(Debug, Clone, Copy)]
pub(super) struct Retry {
    pub(super) attempts: u32,
    pub(super) not_before: Instant,
}

impl Deliverer {
    /// Wakes `tenant` at `at`, unless a wake-up no later than that is set already.
    pub(super) fn wake_at(
        self: &Arc<Self>,
        tenant: &TenantId,
        at: Instant,
        stop: &CancellationToken,
    ) {
        {
            let mut rounds = self.rounds();
            let round = rounds.entry(tenant.clone()).or_default();
            if round.timer.is_some_and(|t| t <= at) {
                return;
            }
            round.timer = Some(at);
        }
        let me = self.clone();
        let tenant = tenant.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                () = tokio::time::sleep_until(at.into()) => {
                    if let Some(round) = me.rounds().get_mut(&tenant)
                        && round.timer == Some(at)
                    {
                        round.timer = None;
                    }
                    me.wake(tenant);
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pause_doubles_per_failed_attempt_up_to_its_cap() {
        let pauses: Vec<u64> = (1..=11).map(|n| retry_pause(n).as_secs()).collect();
        assert_eq!(pauses, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
        assert_eq!(retry_pause(u32::MAX), RETRY_MAX);
        assert_eq!(retry_pause(0), RETRY_FIRST);
    }
}
