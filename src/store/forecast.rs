//! The admission forecast: when a waiting execution is expected to start, from where it
//! stands (`QueuePosition`, read by the scripts in O(log n)) and how fast its tenant has been
//! starting work lately (the per-minute counters of `super::trends`).
//!
//! The model, stated so a user can judge it: starts of a tenant are taken as a Poisson process
//! at the rate its counters measured over the last five minutes, from its first minute with a
//! start, so a tenant that just became busy is not diluted by idle minutes — and when its
//! current burst of starts began within that minute (`keys::Shard::burst`, written once per
//! burst), from that first start, so it is not diluted by the idle part of the minute either
//! (the starts after the first over the time since); an execution with
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

/// Starts per millisecond of a tenant whose counters read `trends` (ending with the minute of
/// `now`), whose current burst of starts began at `burst` (Unix ms), if known; 0 without a
/// start. Measured from its first minute with a start; when the burst began in that very
/// minute, from the burst's first start, counting the starts after it (so a rate that began
/// mid-minute is not spread over the whole minute).
fn measured_rate(trends: &super::trends::Trends, burst: Option<u64>, now: u64) -> f64 {
    let Some(i) = trends.minutes.iter().position(|m| m.started > 0) else {
        return 0.0;
    };
    let starts: u64 = trends.minutes[i..].iter().map(|m| m.started).sum();
    let minute = trends.first_minute + i as u64;
    let (from, counted) = match burst {
        Some(b) if b / MINUTE_MS == minute && b <= now => (b, starts.saturating_sub(1).max(1)),
        _ => (minute * MINUTE_MS, starts),
    };
    counted as f64 / (now.saturating_sub(from).max(1_000)) as f64
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
        let shard = self.shard_of(tenant);
        // One round trip: the window's counters, the burst's start, the running count.
        let mut p = redis::pipe();
        let read = super::trends::TrendsRead::add(&mut p, PACE_MINUTES, now, |day| {
            shard.trends(tenant, day)
        });
        p.get(shard.burst(tenant)).scard(shard.slots(tenant));
        let mut c = self.conn();
        let replies: Vec<redis::Value> = self.bounded(p.query_async(&mut c)).await?;
        let n = read.replies();
        if replies.len() != n + 2 {
            return Err(StoreError::Corrupt("short pace reply".into()));
        }
        let ranges = replies[..n]
            .iter()
            .map(|v| redis::from_redis_value::<Vec<u8>>(v.clone()))
            .collect::<Result<Vec<_>, _>>()?;
        let trends = read.decode(&ranges)?;
        let burst: Option<u64> = redis::from_redis_value(replies[n].clone())?;
        let running: u64 = redis::from_redis_value(replies[n + 1].clone())?;
        let per_ms = measured_rate(&trends, burst, now);
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
    fn a_burst_that_began_mid_minute_is_measured_from_its_first_start() {
        use super::super::trends::{Minute, Trends};
        // Six minutes, starts only in the last: 6 of them since 10 s before now, which is
        // 50 s into that minute (the burst began 40 s into it).
        let first_minute = 29_000_000;
        let mut minutes = vec![Minute::default(); 6];
        minutes[5].started = 6;
        let trends = Trends {
            first_minute,
            minutes,
        };
        let minute_ms = (first_minute + 5) * MINUTE_MS;
        let now = minute_ms + 50_000;
        let burst = minute_ms + 40_000;
        // 5 starts after the first, in 10 s: one per 2 s.
        let rate = measured_rate(&trends, Some(burst), now);
        assert!((rate - 5.0 / 10_000.0).abs() < 1e-12, "{rate}");
        // Without it: 6 over the 50 s since the minute began, five times too slow.
        let diluted = measured_rate(&trends, None, now);
        assert!((diluted - 6.0 / 50_000.0).abs() < 1e-12, "{diluted}");
        // A burst from before the window's first minute with a start changes nothing.
        assert_eq!(
            measured_rate(&trends, Some(minute_ms - 90_000), now),
            diluted
        );
        assert_eq!(
            measured_rate(
                &Trends {
                    first_minute,
                    minutes: vec![Minute::default(); 6]
                },
                Some(burst),
                now
            ),
            0.0
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
