//! The admission forecast: when a waiting execution is expected to start, from where it
//! stands (`QueuePosition`, read by the scripts in O(log n)) and how fast its tenant has been
//! starting work lately (the per-minute counters of `super::trends`).
//!
//! The model, stated so a user can judge it: starts of a tenant are taken as a Poisson process
//! at the rate its counters measured over the last five minutes (from its first minute with a
//! start, so a tenant that just became busy is not diluted by idle minutes); an execution with
//! `n` runnable executions ahead of it starts at the (n+1)-th start, whose time is Gamma
//! distributed. A keyed execution behind others of its key also waits for its key: the key
//! runs at most `limit` at once, and by Little's law a run lasts about `running / rate`, so
//! the key starts at most `limit / running` of the tenant's rate; it starts at the later of the
//! two. It is an estimate: fair share, priorities, other keys and lost leases move it, and a
//! tenant with no start measured has none.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::trends::MINUTE_MS;
use super::{Store, StoreError};
use crate::domain::{EstimatedStart, Execution, QueuePosition, TenantId, rfc3339_from_ms};

/// How long a tenant's measured pace is reused before it is read again: the forecast costs
/// one read per tenant per this long, not one per answer.
const PACE_TTL: Duration = Duration::from_secs(2);

/// Tenants whose pace is kept at once; the cache is emptied when it would grow past this.
const PACE_CACHE_CAP: usize = 10_000;

/// Minutes the pace is measured over (the current one included, in part).
const PACE_MINUTES: u64 = 6;

/// How fast a tenant has been starting work lately.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pace {
    /// Starts per millisecond; 0 when none was measured.
    pub per_ms: f64,
    /// Executions of the tenant running when it was measured.
    pub running: u64,
}

/// The per-tenant paces read lately (see `PACE_TTL`).
#[derive(Default)]
pub(super) struct PaceCache(Mutex<HashMap<TenantId, (Instant, Pace)>>);

/// The Gamma(k, 1) quantile at standard normal score `z` (Wilson and Hilferty's cube-root
/// approximation: within a few percent for k >= 1, which is all this needs).
fn gamma_quantile(k: f64, z: f64) -> f64 {
    let c = 1.0 / (9.0 * k);
    k * (1.0 - c + z * c.sqrt()).max(0.0).powi(3)
}

/// The normal score of the 90th percentile.
const Z90: f64 = 1.281_551_565_5;

/// Milliseconds from now until an execution at `pos` is expected to start (p50, p90), given
/// its tenant's `pace`; `None` when no start was measured.
pub fn estimate(pos: &QueuePosition, pace: &Pace) -> Option<(u64, u64)> {
    if pace.per_ms.is_nan() || pace.per_ms <= 0.0 {
        return None;
    }
    let wait = |ahead: u64, rate: f64, z: f64| gamma_quantile(ahead as f64 + 1.0, z) / rate;
    let both = |z: f64| {
        let mut ms = wait(pos.tenant, pace.per_ms, z);
        if let Some(k) = pos.key.filter(|k| *k > 0) {
            let share = match pos.key_limit {
                Some(limit) => (f64::from(limit) / pace.running.max(1) as f64).min(1.0),
                None => 1.0,
            };
            if share > 0.0 {
                ms = ms.max(wait(k, pace.per_ms * share, z));
            } else {
                return f64::INFINITY;
            }
        }
        ms
    };
    let (p50, p90) = (both(0.0), both(Z90));
    // A key held at 0 never starts: no estimate.
    if !p90.is_finite() {
        return None;
    }
    Some((p50.round() as u64, p90.round() as u64))
}

/// Now, in Unix ms (this process's clock: the estimate is relative to the answer).
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Store {
    /// Fills in `e.estimated_start` when it has a position and its tenant's pace is known. A
    /// pace that cannot be read leaves it out (the answer is never failed for a forecast).
    pub async fn forecast(&self, e: &mut Execution) {
        let Some(pos) = e.queue_position else { return };
        let Ok(tenant) = TenantId::parse(&e.tenant_id) else {
            return;
        };
        let Ok(pace) = self.pace(&tenant).await else {
            return;
        };
        e.estimated_start = estimate(&pos, &pace).and_then(|(p50, p90)| {
            let now = now_ms();
            Some(EstimatedStart {
                p50: rfc3339_from_ms(&(now + p50).to_string())?,
                p90: rfc3339_from_ms(&(now + p90).to_string())?,
            })
        });
    }

    /// How fast `tenant` has been starting work lately (cached for `PACE_TTL`).
    pub async fn pace(&self, tenant: &TenantId) -> Result<Pace, StoreError> {
        if let Some((at, pace)) = self.paces.0.lock().expect("pace cache").get(tenant)
            && at.elapsed() < PACE_TTL
        {
            return Ok(*pace);
        }
        let now = now_ms();
        let trends = self.tenant_trends(tenant, PACE_MINUTES, now).await?;
        let mut c = self.conn();
        let running: u64 = self
            .bounded(
                redis::cmd("SCARD")
                    .arg(self.shard_of(tenant).slots(tenant))
                    .query_async(&mut c),
            )
            .await?;
        let first = trends.minutes.iter().position(|m| m.started > 0);
        let per_ms = match first {
            None => 0.0,
            Some(i) => {
                let starts: u64 = trends.minutes[i..].iter().map(|m| m.started).sum();
                let from = (trends.first_minute + i as u64) * MINUTE_MS;
                starts as f64 / (now.saturating_sub(from).max(1_000)) as f64
            }
        };
        let pace = Pace { per_ms, running };
        let mut cache = self.paces.0.lock().expect("pace cache");
        if cache.len() >= PACE_CACHE_CAP {
            cache.clear();
        }
        cache.insert(tenant.clone(), (Instant::now(), pace));
        Ok(pace)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(tenant: u64, key: Option<u64>, key_limit: Option<u32>) -> QueuePosition {
        QueuePosition {
            tenant,
            key,
            key_limit,
        }
    }

    #[test]
    fn gamma_quantiles_are_close_to_the_exact_ones() {
        // Exact values (k = 1 is the exponential: median ln 2, p90 ln 10).
        assert!((gamma_quantile(1.0, 0.0) - 0.693).abs() < 0.05);
        assert!((gamma_quantile(1.0, Z90) - 2.303).abs() < 0.12);
        // k = 10: median 9.669, p90 14.206.
        assert!((gamma_quantile(10.0, 0.0) - 9.669).abs() < 0.02);
        assert!((gamma_quantile(10.0, Z90) - 14.206).abs() < 0.05);
    }

    #[test]
    fn the_estimate_grows_with_the_position_and_shrinks_with_the_rate() {
        let pace = Pace {
            per_ms: 0.01,
            running: 4,
        };
        let (a50, a90) = estimate(&at(0, None, None), &pace).unwrap();
        let (b50, b90) = estimate(&at(99, None, None), &pace).unwrap();
        assert!(a50 < a90 && b50 < b90);
        assert!(a50 < b50);
        // 100 starts at 10 per second: about 10 s.
        assert!((9_000..=10_500).contains(&b50), "{b50}");
        let fast = Pace {
            per_ms: 0.02,
            ..pace
        };
        assert!(estimate(&at(99, None, None), &fast).unwrap().0 < b50);
        assert_eq!(
            estimate(
                &at(0, None, None),
                &Pace {
                    per_ms: 0.0,
                    running: 0
                }
            ),
            None
        );
    }

    #[test]
    fn a_key_behind_its_own_waits_for_its_key() {
        let pace = Pace {
            per_ms: 0.01,
            running: 4,
        };
        // Tenant order: it is next; its key (limit 1 of 4 running) has 9 ahead: about 40 runs
        // of the tenant's pace.
        let (k50, _) = estimate(&at(0, Some(9), Some(1)), &pace).unwrap();
        let (t50, _) = estimate(&at(0, None, None), &pace).unwrap();
        assert!(k50 > 30 * t50, "{k50} vs {t50}");
        // A key without a limit of its own moves at the tenant's pace: 10 starts at 10/s.
        let (u50, _) = estimate(&at(0, Some(9), None), &pace).unwrap();
        assert!((900..=1_050).contains(&u50), "{u50}");
        // A key held at 0 has no estimate.
        assert_eq!(estimate(&at(0, Some(1), Some(0)), &pace), None);
    }
}
