//! Reading the per-minute counters ("trends") the scripts keep: what happened each minute of
//! the last hours, per tenant or summed over every tenant, and which tenants have work now.
//! The writing side is the trends block at the end of `migrations-lua/common.lua`; the record
//! layout below mirrors it (change both together).
//!
//! A day key (`Shard::trends`, `Shard::shard_trends`) is a string of 1440 minute records of
//! `RECORD_BYTES` bytes, big-endian as `BITFIELD` writes them: five u32 counters, then
//! `WAIT_BUCKETS` u16 counts of starts by waiting time. A minute nobody wrote reads as zeros
//! (a missing key, or a string that ends before it). Reads are plain `GETRANGE`s of exactly the
//! minutes asked for, so the cost is bounded by the window (at most 24 hours = two day keys,
//! 51,840 bytes), never by traffic or by the number of tenants.

use super::{Shard, Store, StoreError, keys};
use crate::domain::{Status, TenantId};

/// Bytes of one minute record: five u32 counters and `WAIT_BUCKETS` u16 histogram counts.
pub const RECORD_BYTES: usize = 5 * 4 + WAIT_BUCKETS * 2;

/// Minutes in a UTC day: records in a day key.
pub const MINUTES_PER_DAY: u64 = 1440;

/// Milliseconds in a minute.
pub const MINUTE_MS: u64 = 60_000;

/// Upper bounds (inclusive, ms) of the waiting-time buckets but the last, which holds every
/// longer wait. Log-spaced, so a p99 reads to within a factor of about 4.
pub const WAIT_BOUNDS_MS: [u32; 7] = [10, 40, 150, 600, 2_500, 10_000, 30_000];

/// Buckets of the waiting-time histogram.
pub const WAIT_BUCKETS: usize = WAIT_BOUNDS_MS.len() + 1;

/// What a percentile in the open last bucket (waits over 30 s) reads as: one more than the
/// last bound, i.e. "more than 30 s".
pub const OVER_LAST_BOUND_MS: u32 = 30_001;

/// One minute's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Minute {
    /// Executions admitted (new ones; deduplicated requests and retries are not admissions).
    pub admitted: u64,
    /// Runs started (each attempt).
    pub started: u64,
    /// Executions that ended `completed`.
    pub completed: u64,
    /// Executions that ended `failed` (dead-lettered or not retryable; a failed attempt that
    /// is retried is not one).
    pub failed: u64,
    /// Executions that ended `cancelled`.
    pub cancelled: u64,
    /// Starts by waiting time, bucket `i` bounded by `WAIT_BOUNDS_MS[i]`.
    pub wait: [u64; WAIT_BUCKETS],
}

impl Minute {
    /// Reads a record; bytes missing at its end read as zeros.
    fn decode(bytes: &[u8]) -> Self {
        let mut full = [0u8; RECORD_BYTES];
        let n = bytes.len().min(RECORD_BYTES);
        full[..n].copy_from_slice(&bytes[..n]);
        let u32_at = |i: usize| {
            u64::from(u32::from_be_bytes([
                full[i],
                full[i + 1],
                full[i + 2],
                full[i + 3],
            ]))
        };
        let mut wait = [0u64; WAIT_BUCKETS];
        for (b, w) in wait.iter_mut().enumerate() {
            let at = 20 + 2 * b;
            *w = u64::from(u16::from_be_bytes([full[at], full[at + 1]]));
        }
        Self {
            admitted: u32_at(0),
            started: u32_at(4),
            completed: u32_at(8),
            failed: u32_at(12),
            cancelled: u32_at(16),
            wait,
        }
    }

    /// Adds another minute's counters (summing tenants or shards).
    fn add(&mut self, o: &Minute) {
        self.admitted += o.admitted;
        self.started += o.started;
        self.completed += o.completed;
        self.failed += o.failed;
        self.cancelled += o.cancelled;
        for (w, v) in self.wait.iter_mut().zip(o.wait) {
            *w += v;
        }
    }

    /// The five event counts by their names in `/metrics` (the `event` label).
    pub fn events(&self) -> [(&'static str, u64); 5] {
        [
            ("admitted", self.admitted),
            ("started", self.started),
            ("completed", self.completed),
            ("failed", self.failed),
            ("cancelled", self.cancelled),
        ]
    }

    /// The waiting time at quantile `q` (0..1) of this minute's starts, as the upper bound of
    /// the bucket it falls in (`OVER_LAST_BOUND_MS` for the open last one); `None` without
    /// starts.
    pub fn wait_quantile_ms(&self, q: f64) -> Option<u32> {
        let total: u64 = self.wait.iter().sum();
        if total == 0 {
            return None;
        }
        // The rank of the quantile among the starts, 1-based: the smallest count that covers it.
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (b, n) in self.wait.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Some(WAIT_BOUNDS_MS.get(b).copied().unwrap_or(OVER_LAST_BOUND_MS));
            }
        }
        Some(OVER_LAST_BOUND_MS)
    }
}

/// What `Store::tenants_last_minute` reads of one shard: each busy-set member with its
/// executions now and its counters of the last complete minute.
pub type ShardTenantMinutes = Result<Vec<(TenantWork, Minute)>, StoreError>;

/// Consecutive minutes of counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trends {
    /// The first minute, in minutes since the Unix epoch (UTC).
    pub first_minute: u64,
    /// One entry per minute from `first_minute` on, the current (incomplete) minute last.
    pub minutes: Vec<Minute>,
}

impl Trends {
    fn zeros(first_minute: u64, len: usize) -> Self {
        Self {
            first_minute,
            minutes: vec![Minute::default(); len],
        }
    }

    fn add(&mut self, o: &Trends) {
        for (m, v) in self.minutes.iter_mut().zip(&o.minutes) {
            m.add(v);
        }
    }
}

/// A tenant with queued or running executions now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantWork {
    pub tenant: TenantId,
    pub queued: u64,
    pub running: u64,
    /// Its concurrency keys at their limit with executions waiting behind it.
    pub blocked_keys: u64,
    /// How long until its rate limit lets it start again (0: not held back now).
    pub throttled_ms: u64,
}

/// Milliseconds until a tenant whose rate limit state is `tat` (its theoretical arrival time,
/// ms) under the stored limit `rate` may start again, at `now_ms` (see "Rate limits" in
/// `migrations-lua/common.lua`): 0 when it may now.
fn throttled_for(tat: Option<&str>, rate: Option<&str>, now_ms: u64) -> u64 {
    let (Some(tat), Some(rate)) = (
        tat.and_then(|t| t.parse::<f64>().ok()),
        rate.and_then(super::RateLimit::parse),
    ) else {
        return 0;
    };
    let interval = rate.per_ms as f64 / f64::from(rate.starts.max(1));
    let tolerance = f64::from(rate.burst.saturating_sub(1)) * interval;
    (tat - tolerance - now_ms as f64).max(0.0).ceil() as u64
}

/// The summed series and the tenants with work, with the shards that could not be read.
#[derive(Debug)]
pub struct PlatformTrends {
    pub trends: Trends,
    /// Every tenant with queued or running executions in a shard that answered, by id.
    pub busy: Vec<TenantWork>,
    /// Shards that did not answer (their counters are missing from the sums).
    pub unavailable: Vec<(Shard, StoreError)>,
}

/// The `GETRANGE`s of `minutes` minutes ending with the minute of `now_ms`: per day number,
/// the first record and how many, in time order. At most two days when `minutes` <= 1440.
fn day_ranges(now_ms: u64, minutes: u64) -> (u64, Vec<(u64, u64, u64)>) {
    let last = now_ms / MINUTE_MS;
    let first = (last + 1).saturating_sub(minutes);
    let mut out = Vec::new();
    let mut m = first;
    while m <= last {
        let day = m / MINUTES_PER_DAY;
        let at = m % MINUTES_PER_DAY;
        let n = (MINUTES_PER_DAY - at).min(last - m + 1);
        out.push((day, at, n));
        m += n;
    }
    (first, out)
}

/// The `GETRANGE`s of a window of minutes added to a pipeline (with other reads of the same
/// shard, in one round trip), and how to read their replies back.
pub(super) struct TrendsRead {
    first: u64,
    ranges: Vec<(u64, u64, u64)>,
}

impl TrendsRead {
    /// Adds the reads of `minutes` minutes ending with the minute of `now_ms` from the day
    /// keys `key(day)` names to `p` (`replies()` of them, first).
    pub(super) fn add(
        p: &mut redis::Pipeline,
        minutes: u64,
        now_ms: u64,
        key: impl Fn(u64) -> String,
    ) -> Self {
        let (first, ranges) = day_ranges(now_ms, minutes);
        for &(day, at, n) in &ranges {
            let from = at as usize * RECORD_BYTES;
            let to = from + n as usize * RECORD_BYTES - 1;
            p.cmd("GETRANGE").arg(key(day)).arg(from).arg(to);
        }
        Self { first, ranges }
    }

    /// How many replies the reads take.
    pub(super) fn replies(&self) -> usize {
        self.ranges.len()
    }

    /// The minutes, from the replies of the reads.
    pub(super) fn decode(&self, replies: &[Vec<u8>]) -> Result<Trends, StoreError> {
        if replies.len() != self.ranges.len() {
            return Err(StoreError::Corrupt("short trends reply".into()));
        }
        let mut out = Vec::new();
        for (bytes, &(_, _, n)) in replies.iter().zip(&self.ranges) {
            for i in 0..n as usize {
                let from = (i * RECORD_BYTES).min(bytes.len());
                let to = ((i + 1) * RECORD_BYTES).min(bytes.len());
                out.push(Minute::decode(&bytes[from..to]));
            }
        }
        Ok(Trends {
            first_minute: self.first,
            minutes: out,
        })
    }
}

impl Store {
    /// Tenant `tenant`'s counters for the `minutes` minutes ending with the minute of `now_ms`
    /// (the caller's clock; minutes are UTC). One round trip to its shard: at most two
    /// `GETRANGE`s, at most `minutes * RECORD_BYTES` bytes.
    pub async fn tenant_trends(
        &self,
        tenant: &TenantId,
        minutes: u64,
        now_ms: u64,
    ) -> Result<Trends, StoreError> {
        let shard = self.shard_of(tenant);
        self.read_trends(minutes, now_ms, |day| shard.trends(tenant, day))
            .await
    }

    /// The counters summed over every tenant (each shard keeps its own sum, so this reads one
    /// key range per shard and day, all shards at once), and the tenants with queued or running
    /// executions now, registered or not (two round trips per shard: the shard's busy set,
    /// then the queued and running counts of its members). A shard that does not answer is
    /// reported and the others are summed.
    pub async fn platform_trends(&self, minutes: u64, now_ms: u64) -> PlatformTrends {
        let reads = self.shards.all().map(|shard| async move {
            let trends = self
                .read_trends(minutes, now_ms, |day| shard.shard_trends(day))
                .await;
            let busy = match trends {
                Ok(_) => self.busy_tenants(shard).await,
                Err(_) => Ok(Vec::new()),
            };
            (shard, trends.and_then(|t| busy.map(|b| (t, b))))
        });
        let (first, _) = day_ranges(now_ms, minutes);
        let mut out = PlatformTrends {
            trends: Trends::zeros(first, minutes as usize),
            busy: Vec::new(),
            unavailable: Vec::new(),
        };
        for (shard, read) in futures_util::future::join_all(reads).await {
            match read {
                Ok((t, busy)) => {
                    out.trends.add(&t);
                    out.busy.extend(busy);
                }
                Err(e) => out.unavailable.push((shard, e)),
            }
        }
        out.busy
            .sort_by(|a, b| a.tenant.as_str().cmp(b.tenant.as_str()));
        out
    }

    /// The records of `minutes` minutes ending with the minute of `now_ms` from the day keys
    /// `key(day)` names (all in one shard): one pipeline.
    async fn read_trends(
        &self,
        minutes: u64,
        now_ms: u64,
        key: impl Fn(u64) -> String,
    ) -> Result<Trends, StoreError> {
        let mut p = redis::pipe();
        let read = TrendsRead::add(&mut p, minutes, now_ms, key);
        let mut c = self.conn();
        let replies: Vec<Vec<u8>> = self.bounded(p.query_async(&mut c)).await?;
        read.decode(&replies)
    }

    /// The tenants of `shard` with queued or running executions: the members of its busy set
    /// (a superset) whose indexes say so.
    async fn busy_tenants(&self, shard: Shard) -> Result<Vec<TenantWork>, StoreError> {
        let mut members = self.busy_members(shard).await?;
        members.retain(|w| w.queued + w.running > 0);
        Ok(members)
    }

    /// Every member of `shard`'s busy set with its queued and running counts: the tenants with
    /// work now and, until the sweeper's next pass over them, those whose work ended lately
    /// (with zeros). Two round trips.
    async fn busy_members(&self, shard: Shard) -> Result<Vec<TenantWork>, StoreError> {
        Ok(self
            .busy_read(shard, None)
            .await?
            .into_iter()
            .map(|(w, _)| w)
            .collect())
    }

    /// `busy_members`, and with `record` = (day, byte offset) each member's minute record at
    /// that offset of its day key, read in the same second round trip.
    async fn busy_read(
        &self,
        shard: Shard,
        record: Option<(u64, usize)>,
    ) -> Result<Vec<(TenantWork, Minute)>, StoreError> {
        let mut c = self.conn();
        let members: Vec<String> = self
            .bounded(redis::cmd("SMEMBERS").arg(shard.busy()).query_async(&mut c))
            .await?;
        // Members were written by the scripts from validated ids; anything else is skipped.
        let tenants: Vec<TenantId> = members
            .iter()
            .filter_map(|m| TenantId::parse(m).ok())
            .collect();
        if tenants.is_empty() {
            return Ok(Vec::new());
        }
        let mut p = redis::pipe();
        for t in &tenants {
            let (queued, running) = (
                keys::listing_range(Some(Status::Queued)),
                keys::listing_range(Some(Status::Running)),
            );
            p.zlexcount(shard.listing(t), queued.0, queued.1)
                .zlexcount(shard.listing(t), running.0, running.1)
                .scard(shard.key_blocked(t))
                .get(shard.tat(t))
                .hget(shard.tenant_config(t), "rate");
            if let Some((day, from)) = record {
                p.cmd("GETRANGE")
                    .arg(shard.trends(t, day))
                    .arg(from)
                    .arg(from + RECORD_BYTES - 1);
            }
        }
        let per = if record.is_some() { 6 } else { 5 };
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let replies: Vec<redis::Value> = self.bounded(p.query_async(&mut c)).await?;
        if replies.len() != tenants.len() * per {
            return Err(StoreError::Corrupt("short busy reply".into()));
        }
        let corrupt = |e: redis::ParsingError| StoreError::Corrupt(format!("busy reply: {e}"));
        tenants
            .into_iter()
            .zip(replies.chunks(per))
            .map(|(tenant, r)| {
                let text = |i: usize| -> Option<String> {
                    redis::from_redis_value::<Option<String>>(r[i].clone())
                        .ok()
                        .flatten()
                };
                let minute = match r.get(5) {
                    Some(v) => Minute::decode(
                        &redis::from_redis_value::<Vec<u8>>(v.clone()).map_err(corrupt)?,
                    ),
                    None => Minute::default(),
                };
                Ok((
                    TenantWork {
                        tenant,
                        queued: redis::from_redis_value(r[0].clone()).map_err(corrupt)?,
                        running: redis::from_redis_value(r[1].clone()).map_err(corrupt)?,
                        blocked_keys: redis::from_redis_value(r[2].clone()).map_err(corrupt)?,
                        throttled_ms: throttled_for(text(3).as_deref(), text(4).as_deref(), now_ms),
                    },
                    minute,
                ))
            })
            .collect()
    }

    /// For `/metrics`: each shard's busy-set members (see `busy_members`) with their counters
    /// of the last complete minute before `now_ms`. Two round trips per shard, all shards at
    /// once; 36 bytes read per member.
    pub async fn tenants_last_minute(&self, now_ms: u64) -> Vec<(Shard, ShardTenantMinutes)> {
        let before = now_ms.saturating_sub(MINUTE_MS);
        let day = before / (MINUTES_PER_DAY * MINUTE_MS);
        let from = ((before / MINUTE_MS) % MINUTES_PER_DAY) as usize * RECORD_BYTES;
        let reads = self
            .shards
            .all()
            .map(|shard| async move { (shard, self.busy_read(shard, Some((day, from))).await) });
        futures_util::future::join_all(reads).await
    }

    /// Each shard's counters of the last complete minute before `now_ms` (for `/metrics`):
    /// one `GETRANGE` of 36 bytes per shard, all shards at once.
    pub async fn last_minute(&self, now_ms: u64) -> Vec<(Shard, Result<Minute, StoreError>)> {
        let before = now_ms.saturating_sub(MINUTE_MS);
        let reads = self.shards.all().map(|shard| async move {
            let read = self
                .read_trends(1, before, |day| shard.shard_trends(day))
                .await
                .map(|t| t.minutes.first().copied().unwrap_or_default());
            (shard, read)
        });
        futures_util::future::join_all(reads).await
    }

    /// Which of `tenants` are in the registry (`PUT /api/tenants/{tenant}`): one round trip.
    pub async fn registered(&self, tenants: &[TenantId]) -> Result<Vec<bool>, StoreError> {
        if tenants.is_empty() {
            return Ok(Vec::new());
        }
        let mut p = redis::pipe();
        for t in tenants {
            p.zscore(keys::tenants(), t.as_str());
        }
        let mut c = self.conn();
        let scores: Vec<Option<f64>> = self.bounded(p.query_async(&mut c)).await?;
        Ok(scores.into_iter().map(|s| s.is_some()).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_is_throttled_until_its_next_token() {
        // 10 per second (100 ms apart), burst 3: tolerance 200 ms.
        let rate = Some("10:1000:3");
        assert_eq!(throttled_for(None, rate, 1_000), 0, "a full bucket");
        assert_eq!(
            throttled_for(Some("1100.5"), rate, 1_000),
            0,
            "within the burst"
        );
        assert_eq!(throttled_for(Some("1450"), rate, 1_000), 250);
        assert_eq!(
            throttled_for(Some("1450"), None, 1_000),
            0,
            "no rate any more"
        );
    }

    #[test]
    fn a_record_reads_as_bitfield_wrote_it() {
        let mut r = vec![0u8; RECORD_BYTES];
        r[3] = 7; // admitted = 7
        r[4..8].copy_from_slice(&70_000u32.to_be_bytes());
        r[16..20].copy_from_slice(&u32::MAX.to_be_bytes());
        r[20 + 2 * 7..22 + 2 * 7].copy_from_slice(&3u16.to_be_bytes());
        let m = Minute::decode(&r);
        assert_eq!(
            (m.admitted, m.started, m.cancelled),
            (7, 70_000, 4_294_967_295)
        );
        assert_eq!(m.wait[7], 3);
        // A short string: the rest reads as zeros.
        assert_eq!(Minute::decode(&r[..4]).admitted, 7);
        assert_eq!(Minute::decode(&[]), Minute::default());
    }

    #[test]
    fn quantiles_read_the_upper_bound_of_their_bucket() {
        let mut m = Minute::default();
        assert_eq!(m.wait_quantile_ms(0.5), None);
        m.wait[0] = 98; // <= 10 ms
        m.wait[3] = 1; // <= 600 ms
        m.wait[7] = 1; // over 30 s
        assert_eq!(m.wait_quantile_ms(0.5), Some(10));
        assert_eq!(m.wait_quantile_ms(0.99), Some(600));
        assert_eq!(m.wait_quantile_ms(1.0), Some(OVER_LAST_BOUND_MS));
    }

    #[test]
    fn a_window_spans_at_most_two_days() {
        // 00:30 UTC of day 20423: the last 24 hours are 23.5 h of day 20422 and 31 minutes.
        let now = 20_423 * 86_400_000 + 30 * 60_000 + 5_000;
        let (first, ranges) = day_ranges(now, 1440);
        assert_eq!(ranges, vec![(20_422, 31, 1409), (20_423, 0, 31)]);
        assert_eq!(first, 20_422 * 1440 + 31);
        assert_eq!(
            day_ranges(now, 1),
            (20_423 * 1440 + 30, vec![(20_423, 30, 1)])
        );
        assert_eq!(RECORD_BYTES * MINUTES_PER_DAY as usize, 51_840);
    }
}
