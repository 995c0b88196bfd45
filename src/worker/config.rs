//! How a worker behaves: its settings (`WorkerConfig`, built from flags by `crate::config`)
//! and the consumer name it is known by in Redis.

use std::time::Duration;

/// How a worker behaves. The defaults suit production; tests shorten the times.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Executions run at once; the worker reads only this many.
    pub concurrency: usize,
    /// How long a lease lasts without a heartbeat.
    pub lease_ttl: Duration,
    /// How often held leases are extended (well under `lease_ttl`).
    pub heartbeat_interval: Duration,
    /// How often expired leases are looked for, in each shard. The same call is the worker's
    /// safety poll: it puts due retries back and finds work whose wake-up was lost.
    pub scan_interval: Duration,
    /// On shutdown, how long running executions may finish before their leases are released.
    pub drain_timeout: Duration,
    /// Backoff before the 2nd attempt after a retryable failure; doubles per attempt.
    pub retry_backoff: Duration,
    /// Cap of that backoff.
    pub retry_backoff_max: Duration,
    /// Consumer name in the `workers` group (unique per worker process).
    pub consumer: String,
}

/// The production defaults: the one home of these numbers (`sluice worker`'s flags default to
/// them too).
impl WorkerConfig {
    /// `concurrency`.
    pub const DEFAULT_CONCURRENCY: usize = 8;
    /// `lease_ttl`.
    pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(30);
    /// `heartbeat_interval`: a third of the lease, so two renewals may fail before it lapses.
    pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(10);
    /// `scan_interval`.
    pub const DEFAULT_SCAN: Duration = Duration::from_secs(5);
    /// `drain_timeout`.
    pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
    /// `retry_backoff`.
    pub const DEFAULT_RETRY_BACKOFF: Duration = Duration::from_secs(1);
    /// `retry_backoff_max`.
    pub const DEFAULT_RETRY_BACKOFF_MAX: Duration = Duration::from_secs(300);
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            concurrency: Self::DEFAULT_CONCURRENCY,
            lease_ttl: Self::DEFAULT_LEASE_TTL,
            heartbeat_interval: Self::DEFAULT_HEARTBEAT,
            scan_interval: Self::DEFAULT_SCAN,
            drain_timeout: Self::DEFAULT_DRAIN_TIMEOUT,
            retry_backoff: Self::DEFAULT_RETRY_BACKOFF,
            retry_backoff_max: Self::DEFAULT_RETRY_BACKOFF_MAX,
            consumer: default_consumer(),
        }
    }
}

/// `<hostname>-<pid>-<random>`: unique per process, readable in Redis.
pub fn default_consumer() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "worker".into());
    let salt = &uuid::Uuid::new_v4().simple().to_string()[..6];
    format!("{host}-{}-{salt}", std::process::id())
}
