//! The memory a server's batch admissions may hold at once (`--batch-memory-limit`), and what
//! one batch reserves of it: its worst case before its body is read, then what its items keep
//! until its answer is written.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::http::StatusCode;

use crate::http::error::ApiError;
use crate::http::executions::MAX_BATCH;

/// Memory one item of a batch holds besides its params, reserved for it: its admission
/// request, the execution (or problem) of its answer, their strings, and its share of the
/// Redis calls' buffers. Measured with a counting allocator: a batch of 1,000 small items
/// peaked at 1.6 MiB of heap; rounded up.
pub const ITEM_ALLOWANCE: usize = 2 * 1024;

/// Seconds a client refused for a full budget should wait: batches end within the request
/// bound, most within a second.
const BUDGET_RETRY_AFTER: u64 = 1;

/// The memory of a batch whose body is `body_bytes` long, at most: the body's bytes (its
/// params, kept as text, are not longer once canonical, bar exponent notation, which is
/// counted as it is met) and [`ITEM_ALLOWANCE`] for every item it could hold (an item takes
/// at least two bytes, `0,`).
pub fn worst_case(body_bytes: usize) -> usize {
    let items = (body_bytes / 2 + 1).min(MAX_BATCH);
    body_bytes.saturating_add(items * ITEM_ALLOWANCE)
}

/// The bytes batch admissions being processed on this server may hold at once
/// (`--batch-memory-limit`): each batch reserves its worst case before its body is read, and
/// one that does not fit is refused with 429 `batch_memory_full` before anything is read or
/// written.
#[derive(Debug)]
pub struct BatchBudget {
    total: usize,
    used: AtomicUsize,
}

impl BatchBudget {
    /// `--batch-memory-limit`, or room for four full batches; a budget that cannot hold one
    /// full batch (a body of `--batch-body-limit` with 1,000 items) is refused.
    pub fn new(limit: Option<usize>, body_limit: usize) -> Result<Arc<Self>, String> {
        let full = worst_case(body_limit);
        let total = limit.unwrap_or_else(|| Self::default_for(body_limit));
        if total < full {
            return Err(format!(
                "--batch-memory-limit ({total}) must hold at least one full batch: \
                 --batch-body-limit ({body_limit}) plus {ITEM_ALLOWANCE} bytes for each of \
                 {MAX_BATCH} items, {full} bytes"
            ));
        }
        Ok(Arc::new(Self {
            total,
            used: AtomicUsize::new(0),
        }))
    }

    /// The default budget for a `--batch-body-limit`: four full batches.
    pub fn default_for(body_limit: usize) -> usize {
        worst_case(body_limit).saturating_mul(4)
    }

    /// The budget, in bytes.
    pub fn total(&self) -> usize {
        self.total
    }

    /// Bytes reserved now.
    pub fn in_use(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Reserves `bytes` if they fit.
    pub fn reserve(self: &Arc<Self>, bytes: usize) -> Option<Reservation> {
        self.take(bytes).then(|| Reservation {
            budget: self.clone(),
            bytes,
        })
    }

    fn take(&self, bytes: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&n| n <= self.total)
            })
            .is_ok()
    }
}

/// Bytes of the [`BatchBudget`] one batch holds; given back when dropped (the answer holds
/// it until its last byte is written).
#[derive(Debug)]
pub struct Reservation {
    budget: Arc<BatchBudget>,
    bytes: usize,
}

impl Reservation {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Holds `bytes` from now on: more if they fit (false if not, holding what it held), or
    /// fewer.
    pub fn resize(&mut self, bytes: usize) -> bool {
        if bytes > self.bytes {
            if !self.budget.take(bytes - self.bytes) {
                return false;
            }
        } else {
            self.budget
                .used
                .fetch_sub(self.bytes - bytes, Ordering::AcqRel);
        }
        self.bytes = bytes;
        true
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// The refusal of a batch the budget has no room for now.
pub(super) fn budget_full(budget: &BatchBudget, need: usize) -> ApiError {
    ApiError::Busy {
        status: StatusCode::TOO_MANY_REQUESTS,
        code: "batch_memory_full",
        detail: format!(
            "the server is processing other batches: this one needs {need} bytes of its \
             {} for batches; nothing was admitted, send it again shortly",
            budget.total()
        ),
        retry_after: BUDGET_RETRY_AFTER,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_holds_what_is_reserved_and_no_more() {
        assert!(BatchBudget::new(Some(worst_case(100) - 1), 100).is_err());
        let budget = BatchBudget::new(None, 100).unwrap();
        assert_eq!(budget.total(), 4 * (100 + 51 * ITEM_ALLOWANCE));
        let mut a = budget.reserve(budget.total() - 10).unwrap();
        assert!(budget.reserve(11).is_none());
        let b = budget.reserve(10).unwrap();
        assert!(!a.resize(a.bytes() + 1), "no room to grow");
        assert_eq!(budget.in_use(), budget.total());
        assert!(a.resize(5));
        assert_eq!(budget.in_use(), 15);
        drop(b);
        drop(a);
        assert_eq!(budget.in_use(), 0);
        // A full batch's worst case: the body and a thousand items.
        assert_eq!(
            worst_case(16 << 20),
            (16 << 20) + MAX_BATCH * ITEM_ALLOWANCE
        );
    }
}
