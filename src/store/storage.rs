//! What a tenant keeps on Redis, and the two bounds on it (`migrations-lua/common.lua`, section
//! "Storage"): the logical size the scripts count per execution (`ROW_BYTES` + params +
//! output + error message, as stored; not `MEMORY USAGE`, so the measure keeps its meaning
//! through a change of layout), the refusals of an admission or a retry over a bound as the
//! scripts reply them, and a tenant's usage as `GET /api/tenants/{t}` shows it: the counters
//! with the expiry buckets that have ended taken off, as the tenant's next decision would.
//! The counters themselves are written by the scripts only.

use std::collections::HashMap;
use std::time::Duration;

use redis::Value;

use super::StoreError;

/// The per-execution constant of the logical size, in bytes (`ROW_BYTES` in `common.lua`):
/// what an execution stands for beyond its params, output and error message — the rest of its
/// row, its index entries, its dedup mapping. A convention, not a measurement: with this
/// layout Redis 7.0 takes about 800 bytes for a small completed execution with a dedup key
/// (`used_memory` over 1,000 of them), so the logical bytes are of the order of the memory
/// they bound, and keep their meaning when a layout makes executions cheaper.
pub const ROW_BYTES: u64 = 512;

/// The bound that refused an admission or a retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageBound {
    /// `max_bytes`: the logical bytes of the tenant's queued, running and retained terminal
    /// executions.
    Bytes,
    /// `max_retained`: its terminal executions kept until they expire.
    Retained,
}

impl StorageBound {
    /// The API's name of the bound (the tenant's field).
    pub fn as_str(self) -> &'static str {
        match self {
            StorageBound::Bytes => "max_bytes",
            StorageBound::Retained => "max_retained",
        }
    }
}

/// A refusal by a storage bound: nothing was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageFull {
    pub bound: StorageBound,
    /// What the tenant keeps now: logical bytes, or retained rows.
    pub count: u64,
    /// The bound in force.
    pub limit: u64,
    /// Until the tenant's next expiry bucket drains (its oldest retained executions have
    /// expired by then): the soonest its usage falls by itself. `None`: it retains nothing,
    /// so nothing drains until its queued and running executions have ended and expired.
    pub drains_in: Option<Duration>,
}

/// What a storage refusal of `admit.lua`, `retry.lua` or `dry_admit.lua` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Refused {
    /// The execution alone is larger than the tenant's `max_bytes`: it can never fit.
    TooLarge { size: u64, max_bytes: u64 },
    /// A bound is reached.
    Full(StorageFull),
}

/// The refusal a script replied with `tag` and `rest` (see `storage_refusal()` in
/// `common.lua`), or `None` for any other reply.
pub(super) fn refused(tag: &str, rest: &[Value]) -> Result<Option<Refused>, StoreError> {
    let number = |i: usize| -> Result<i64, StoreError> {
        let v = rest
            .get(i)
            .ok_or_else(|| StoreError::Corrupt(format!("{tag} reply too short")))?;
        Ok(redis::from_redis_value(v.clone())?)
    };
    let whole = |n: i64| u64::try_from(n).unwrap_or(0);
    Ok(match tag {
        "too_large" => Some(Refused::TooLarge {
            size: whole(number(0)?),
            max_bytes: whole(number(1)?),
        }),
        "storage_full" => {
            let bound: String = redis::from_redis_value(
                rest.first()
                    .cloned()
                    .ok_or_else(|| StoreError::Corrupt("storage_full reply too short".into()))?,
            )?;
            let bound = match bound.as_str() {
                "bytes" => StorageBound::Bytes,
                "retained" => StorageBound::Retained,
                other => {
                    return Err(StoreError::Corrupt(format!(
                        "storage_full names bound {other}"
                    )));
                }
            };
            let wait = number(3)?;
            Some(Refused::Full(StorageFull {
                bound,
                count: whole(number(1)?),
                limit: whole(number(2)?),
                drains_in: (wait >= 0).then(|| Duration::from_millis(whole(wait))),
            }))
        }
        _ => None,
    })
}

/// A tenant's storage bounds and what it keeps (`GET /api/tenants/{t}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantStorage {
    /// Its bound on logical bytes (its own, else the server's).
    pub max_bytes: u64,
    /// Its bound on retained terminal executions (its own, else the server's).
    pub max_retained: u64,
    /// Logical bytes of its queued, running and retained terminal executions.
    pub bytes: u64,
    /// Terminal executions kept until they expire.
    pub retained: u64,
    /// When its next expiry bucket ends (Unix ms): its oldest retained executions have
    /// expired by then, and its next decision takes them off. `None`: it retains nothing.
    pub next_drain_ms: Option<u64>,
}

/// The counters of a tenant as its cfg hash holds them (`u_bytes`, `u_rows`, `u_next`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Counters {
    pub bytes: i64,
    pub rows: i64,
    /// The end of its earliest expiry bucket, Unix seconds.
    pub next: Option<u64>,
}

impl Counters {
    /// Whether a bucket has ended by `now_ms`, so the stored counts are higher than what the
    /// tenant keeps (the buckets must be read to say by how much).
    pub fn due(&self, now_ms: u64) -> bool {
        self.next.is_some_and(|n| n.saturating_mul(1000) <= now_ms)
    }

    /// The counts once every bucket of `buckets` (the tenant's expiry hash: end in Unix
    /// seconds -> `<bytes>:<rows>`) that ended by `now_ms` is taken off, as `drain()` in
    /// `common.lua` does; and the end of the next bucket (Unix ms). Counts that drifted below
    /// zero read as zero, as the scripts' decisions read them.
    pub fn drained(
        &self,
        buckets: &HashMap<String, String>,
        now_ms: u64,
    ) -> (u64, u64, Option<u64>) {
        let (mut bytes, mut rows, mut next) = (self.bytes, self.rows, None::<u64>);
        for (end, value) in buckets {
            let (Ok(end), Some((b, r))) = (end.parse::<u64>(), value.split_once(':')) else {
                continue;
            };
            let (Ok(b), Ok(r)) = (b.parse::<i64>(), r.parse::<i64>()) else {
                continue;
            };
            if end.saturating_mul(1000) <= now_ms {
                bytes -= b;
                rows -= r;
            } else if next.is_none_or(|n| end < n) {
                next = Some(end);
            }
        }
        (
            u64::try_from(bytes).unwrap_or(0),
            u64::try_from(rows).unwrap_or(0),
            next.map(|s| s.saturating_mul(1000)),
        )
    }

    /// The counts as stored (nothing has ended), and the end of the next bucket in Unix ms.
    pub fn as_stored(&self) -> (u64, u64, Option<u64>) {
        (
            u64::try_from(self.bytes).unwrap_or(0),
            u64::try_from(self.rows).unwrap_or(0),
            self.next.map(|s| s.saturating_mul(1000)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_that_ended_are_taken_off_and_the_next_one_is_named() {
        let c = Counters {
            bytes: 10_000,
            rows: 7,
            next: Some(100),
        };
        let buckets: HashMap<String, String> = [
            ("100", "3000:2"),
            ("200", "5000:4"),
            ("300", "-512:-1"),
            ("junk", "1:1"),
        ]
        .into_iter()
        .map(|(a, b)| (a.to_owned(), b.to_owned()))
        .collect();
        assert!(!c.due(99_999));
        assert!(c.due(100_000));
        assert_eq!(c.drained(&buckets, 99_999), (10_000, 7, Some(100_000)));
        assert_eq!(c.drained(&buckets, 100_000), (7_000, 5, Some(200_000)));
        assert_eq!(c.drained(&buckets, 250_000), (2_000, 1, Some(300_000)));
        // A negative bucket (a row taken out of a bucket it was not counted in) gives back.
        assert_eq!(c.drained(&buckets, 300_000), (2_512, 2, None));
        // Drift below zero reads as zero.
        let low = Counters {
            bytes: 100,
            rows: 1,
            next: Some(100),
        };
        assert_eq!(low.drained(&buckets, 200_000), (0, 0, Some(300_000)));
    }
}
