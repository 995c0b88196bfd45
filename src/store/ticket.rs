//! What an admission request has sent to Redis so far, shared by the three parties that decide
//! its answer: the HTTP edge (which bounds the request's time), the handler, and the store
//! (which sends). It exists so that no answer can be untrue when the time bound passes:
//!
//! - while nothing of the request was sent, the edge may *withdraw* it: the store then never
//!   sends it (an admission still queued for its shard's next call is dropped from the queue
//!   unsent), and "503, nothing admitted" is true;
//! - once something was sent, nothing may withdraw it, and the answer must name what was sent:
//!   the edge gives the handler its bounded time to settle, and only if even that passes does it
//!   answer `admission_outcome_unknown` naming the execution it may have created.
//!
//! The store also reads the request's deadline from it: it stops sending (or never starts)
//! when what is left of the request's time could not cover a call and the settling of a lost
//! answer (`Ticket::send_by`), so that a handler that sent something answers before the edge's
//! bound in all but a starved process.
//!
//! A ticket is withdrawn, too, when the request goes away (the client disconnects, the edge's
//! future is dropped): `CloseOnDrop`.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::domain::ExecutionId;

/// Nothing was sent yet; the store may send.
const OPEN: u8 = 0;
/// Something was sent; the store may send more.
const SENT: u8 = 1;
/// Withdrawn before anything was sent: nothing will ever be sent.
const WITHDRAWN: u8 = 2;
/// Stopped after something was sent: what was sent stands, nothing more is sent.
const STOPPED: u8 = 3;

/// The fate of one admission request (single or batch): its deadline, and whether anything of
/// it was sent to Redis. See the module's documentation.
#[derive(Debug)]
pub struct Ticket {
    deadline: Instant,
    state: AtomicU8,
    /// The execution of the last single admission sent (the one a late answer must name).
    sent_id: Mutex<Option<ExecutionId>>,
}

/// What withdrawing a ticket found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Withdrawal {
    /// Nothing had been sent, and now nothing will be: the request admitted nothing.
    NothingSent,
    /// Something was sent already (a single admission names its execution): it stands, and
    /// nothing more will be sent.
    Sent(Option<ExecutionId>),
}

impl Ticket {
    /// A ticket for a request that must be answered by `deadline`.
    pub fn new(deadline: Instant) -> Self {
        Self {
            deadline,
            state: AtomicU8::new(OPEN),
            sent_id: Mutex::new(None),
        }
    }

    /// When the request must be answered.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The last moment a call may still be sent for this request, when one call and the
    /// settling of its lost answer may each take `op_timeout`: after it, what is left of the
    /// request's time could not cover them.
    pub fn send_by(&self, op_timeout: Duration) -> Instant {
        self.deadline
            .checked_sub(op_timeout * 2 + SETTLE_MARGIN)
            .unwrap_or_else(Instant::now)
    }

    /// Claims the right to send a call for this request now (and, for a single admission,
    /// records its execution): false when the ticket was withdrawn or stopped, or its time to
    /// send has passed. The store calls this at the moment it puts the request's admissions
    /// into a call, never earlier.
    pub(crate) fn claim_send(&self, op_timeout: Duration, id: Option<&ExecutionId>) -> bool {
        if Instant::now() > self.send_by(op_timeout) {
            return false;
        }
        let mut state = self.state.load(Ordering::Acquire);
        loop {
            if state != OPEN && state != SENT {
                return false;
            }
            match self
                .state
                .compare_exchange(state, SENT, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break,
                Err(now) => state = now,
            }
        }
        if let Some(id) = id {
            *self.sent_id.lock().expect("ticket id") = Some(id.clone());
        }
        true
    }

    /// Stops the request from sending anything more (the edge calls this when its bound
    /// passes, and `CloseOnDrop` when the request goes away), and says whether anything had been
    /// sent.
    pub fn withdraw(&self) -> Withdrawal {
        let mut state = self.state.load(Ordering::Acquire);
        loop {
            let next = match state {
                OPEN | WITHDRAWN => WITHDRAWN,
                _ => STOPPED,
            };
            match self
                .state
                .compare_exchange(state, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) if next == WITHDRAWN => return Withdrawal::NothingSent,
                Ok(_) => {
                    return Withdrawal::Sent(self.sent_id.lock().expect("ticket id").clone());
                }
                Err(now) => state = now,
            }
        }
    }

    /// Whether the request may still send (it was neither withdrawn nor stopped).
    pub fn may_send(&self) -> bool {
        matches!(self.state.load(Ordering::Acquire), OPEN | SENT)
    }
}

/// Time kept back beyond two Redis time-outs for what a handler does after its last call
/// (decoding the answer, writing the response), so that its answer comes before the edge's.
const SETTLE_MARGIN: Duration = Duration::from_millis(100);

/// Withdraws its ticket when dropped: held by the request's future, so a request that goes away
/// (its client disconnected, its future dropped) never has an admission sent after it.
#[derive(Debug)]
pub struct CloseOnDrop(pub std::sync::Arc<Ticket>);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        self.0.withdraw();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OP: Duration = Duration::from_millis(100);

    fn far() -> Ticket {
        Ticket::new(Instant::now() + Duration::from_secs(60))
    }

    #[test]
    fn a_ticket_withdrawn_before_any_send_never_sends() {
        let t = far();
        assert_eq!(t.withdraw(), Withdrawal::NothingSent);
        assert!(!t.claim_send(OP, None));
        assert!(!t.may_send());
        assert_eq!(t.withdraw(), Withdrawal::NothingSent);
    }

    #[test]
    fn a_ticket_that_sent_names_its_execution_and_sends_no_more() {
        let t = far();
        let id = ExecutionId::new();
        assert!(t.claim_send(OP, Some(&id)));
        assert!(t.claim_send(OP, None));
        assert_eq!(t.withdraw(), Withdrawal::Sent(Some(id.clone())));
        assert!(!t.claim_send(OP, None));
        assert_eq!(t.withdraw(), Withdrawal::Sent(Some(id)));
    }

    #[test]
    fn nothing_is_sent_once_the_time_left_cannot_cover_a_call_and_its_settling() {
        // 250 ms left: less than two time-outs of 100 ms and the margin.
        let t = Ticket::new(Instant::now() + Duration::from_millis(250));
        assert!(!t.claim_send(OP, None));
        // Nothing was sent: withdrawing it is still "nothing sent".
        assert_eq!(t.withdraw(), Withdrawal::NothingSent);
    }
}
