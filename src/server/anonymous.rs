//! The per-address count of connections that have not authenticated a request yet (the
//! "Per address" rule of the server's module docs): a connection takes a place in its
//! address's count when there is room, else goes on probation, and gives the place back on
//! its first authenticated request or when it ends.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// The connections of each client address that have not authenticated a request yet.
pub(super) struct Anonymous {
    max: usize,
    by_address: Mutex<HashMap<IpAddr, usize>>,
}

impl Anonymous {
    pub(super) fn new(max: usize) -> Self {
        Self {
            max,
            by_address: Mutex::new(HashMap::new()),
        }
    }

    /// A new connection of `ip`: counted when its address has room, else on probation.
    pub(super) fn admit(self: &Arc<Self>, ip: IpAddr) -> Unproven {
        let ip = ip.to_canonical();
        let mut counted = false;
        if self.max > 0 {
            let mut map = self.by_address.lock().unwrap_or_else(|e| e.into_inner());
            let n = map.entry(ip).or_insert(0);
            if *n < self.max {
                *n += 1;
                counted = true;
            }
        }
        Unproven {
            registry: self.clone(),
            ip,
            probation: self.max > 0 && !counted,
        }
    }
}

/// A connection that has not authenticated a request yet: one of its address's
/// `max_anonymous_per_address`, or beyond them on probation. Dropping it (on the first
/// authenticated request, or when the connection ends) frees its place.
pub(super) struct Unproven {
    registry: Arc<Anonymous>,
    ip: IpAddr,
    /// Beyond the address's cap: its first request must authenticate, and come soon.
    pub(super) probation: bool,
}

impl Drop for Unproven {
    fn drop(&mut self) {
        if self.registry.max == 0 || self.probation {
            return;
        }
        let mut map = self
            .registry
            .by_address
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(n) = map.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.ip);
            }
        }
    }
}
