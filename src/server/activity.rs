//! What the connection watchdog knows of one connection: requests in flight, the last
//! answer byte written, the silence a long poll is allowed, whether it is to retire. Counters
//! are atomics, so the service, the watched stream and the watchdog share them without a lock.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::anonymous::Unproven;
use super::shares::{Place, Shares};
use crate::http::{ConnectionControl, ConnectionHolder, ConnectionRefusal};

/// What the watchdog knows of one connection: requests in flight, and when it last became
/// idle, made progress or wrote a byte of an answer (milliseconds since it was accepted).
pub(super) struct Activity {
    started: Instant,
    /// Past this age the connection is closed once no request is in flight.
    max_age: Duration,
    in_flight: AtomicUsize,
    idle_since_ms: AtomicU64,
    /// The last answer byte written or request begun: what the stalled-peer rule counts from.
    progress_ms: AtomicU64,
    /// The last answer byte written (control frames excluded): what the idle rule counts from.
    last_write_ms: AtomicU64,
    /// Until when the requests in flight may be silent (a long poll's allowance), reset when
    /// none is in flight any more.
    quiet_until_ms: AtomicU64,
    /// An answer asked to close the connection: it is retired once nothing is in flight.
    retiring: AtomicBool,
    /// Wakes the watchdog when a connection to retire has nothing in flight any more.
    pub(super) close: Notify,
    /// The connection's place in its address's unauthenticated count, until a request of it
    /// authenticates.
    unproven: Mutex<Option<Unproven>>,
    /// The credentials' shares of connections, which its first authenticated request takes
    /// a place in.
    shares: Arc<Shares>,
    /// Its place in a credential's share, from its first authenticated request on.
    holding: Mutex<Holding>,
}

/// Where a connection stands in the credentials' shares of connections.
enum Holding {
    /// No request of it authenticated yet.
    Nobody,
    /// Counted against the credential of its first authenticated request until it closes
    /// (dropping the place gives it back).
    Held { _place: Place },
    /// Its first authenticated request found that credential's share full: it is closing, and
    /// every request on it is refused the same way.
    Refused(ConnectionRefusal),
    /// The connection ended; its place was given back.
    Ended,
}

impl Activity {
    pub(super) fn new(max_age: Duration, unproven: Unproven, shares: Arc<Shares>) -> Self {
        Self {
            started: Instant::now(),
            max_age,
            in_flight: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(0),
            progress_ms: AtomicU64::new(0),
            last_write_ms: AtomicU64::new(0),
            quiet_until_ms: AtomicU64::new(0),
            retiring: AtomicBool::new(false),
            close: Notify::new(),
            unproven: Mutex::new(Some(unproven)),
            shares,
            holding: Mutex::new(Holding::Nobody),
        }
    }

    /// The connection ended: gives back its places (its address's unauthenticated count, a
    /// credential's share) now, whatever still holds this `Activity` (a request's extensions).
    pub(super) fn ended(&self) {
        drop(
            self.unproven
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take(),
        );
        let place = std::mem::replace(
            &mut *self.holding.lock().unwrap_or_else(|e| e.into_inner()),
            Holding::Ended,
        );
        drop(place);
    }

    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn at(&self, ms: u64) -> Instant {
        self.started + Duration::from_millis(ms)
    }

    /// A request started; the guard ends it.
    pub(super) fn begin(self: &Arc<Self>) -> InFlight {
        self.progress_ms.store(self.elapsed_ms(), Ordering::Relaxed);
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(self.clone())
    }

    pub(super) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Whether the connection is beyond its address's unauthenticated ones and has not
    /// authenticated a request yet.
    pub(super) fn on_probation(&self) -> bool {
        self.unproven
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_some_and(|u| u.probation)
    }

    /// When the connection reaches its maximum age.
    pub(super) fn retire_at(&self) -> Instant {
        self.started + self.max_age
    }

    pub(super) fn too_old(&self) -> bool {
        self.started.elapsed() >= self.max_age
    }

    /// Whether the connection is to be closed as soon as nothing is in flight on it: past its
    /// age, or asked by an answer.
    pub(super) fn to_retire(&self) -> bool {
        self.retiring.load(Ordering::SeqCst) || self.too_old()
    }

    /// Asks the watchdog to close the connection gracefully (GOAWAY over HTTP/2) once its
    /// other requests, if any, are done (they are not cut: an HTTP/2 client may have long
    /// polls and streams on the same connection).
    pub(super) fn close_soon(&self) {
        self.retiring.store(true, Ordering::SeqCst);
        if self.in_flight() == 0 {
            self.close.notify_one();
        }
    }

    /// When the connection will have waited `timeout` for a request, counting from when it
    /// last became idle or, later, last wrote a byte of an answer.
    pub(super) fn idle_deadline(&self, timeout: Duration) -> Instant {
        let idle = self.idle_since_ms.load(Ordering::Acquire);
        let wrote = self.last_write_ms.load(Ordering::Relaxed);
        self.at(idle.max(wrote)) + timeout
    }

    /// The last progress of the requests in flight, or the end of a silence allowed, whichever
    /// is later: what the stalled-peer rule counts from.
    pub(super) fn last_progress_or_allowance(&self) -> Instant {
        let progress = self.progress_ms.load(Ordering::Relaxed);
        let quiet = self.quiet_until_ms.load(Ordering::Relaxed);
        self.at(progress.max(quiet))
    }

    pub(super) fn last_write(&self) -> Instant {
        self.at(self.last_write_ms.load(Ordering::Relaxed))
    }

    /// Bytes of an answer went out.
    pub(super) fn wrote_answer(&self) {
        let now = self.elapsed_ms();
        self.progress_ms.store(now, Ordering::Relaxed);
        self.last_write_ms.store(now, Ordering::Relaxed);
    }
}

/// One request in flight on a connection; dropping it ends the request.
pub(super) struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        // Set before the count drops, so a watchdog that sees zero sees the new idle start.
        self.0
            .idle_since_ms
            .store(self.0.elapsed_ms(), Ordering::Release);
        if self.0.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            // The allowance was for the requests that were in flight, not for the next ones.
            self.0.quiet_until_ms.store(0, Ordering::Relaxed);
            if self.0.to_retire() {
                // Its last request is done: now is the time to retire it.
                self.0.close.notify_one();
            }
        }
    }
}

impl ConnectionControl for Activity {
    fn allow_silence_until(&self, until: Instant) {
        let ms = u64::try_from(until.saturating_duration_since(self.started).as_millis())
            .unwrap_or(u64::MAX);
        self.quiet_until_ms.fetch_max(ms, Ordering::Relaxed);
    }

    fn authenticated(&self, holder: &ConnectionHolder) -> Result<(), ConnectionRefusal> {
        let taken = self
            .unproven
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        drop(taken);
        let mut holding = self.holding.lock().unwrap_or_else(|e| e.into_inner());
        match &*holding {
            Holding::Nobody => match self.shares.take(holder) {
                Ok(place) => {
                    *holding = Holding::Held { _place: place };
                    Ok(())
                }
                Err(refusal) => {
                    *holding = Holding::Refused(refusal);
                    Err(refusal)
                }
            },
            // Counted once, against the first credential: a later one (a proxy's connection
            // carrying several clients' requests) is served on it and counted nowhere else.
            Holding::Held { .. } | Holding::Ended => Ok(()),
            Holding::Refused(refusal) => Err(*refusal),
        }
    }
}
