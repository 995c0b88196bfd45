//! The report's dead-letter group (issue 38, defect 6): what `GET /api/dlq` costs Redis at a
//! full shard, its target and its section of the human report.

use std::fmt::Write;

use serde::Serialize;

use super::{Report, Target};

/// Redis time one listing may cost, µs per call (issue 38: ≤ 0.1 ms at a full shard).
pub const LISTING_US_LIMIT: f64 = 100.0;

/// One listing's cost: `calls` calls, one after the other.
#[derive(Debug, Clone, Serialize)]
pub struct ListingCost {
    /// Which listing: `empty` (the probe tenant's), `page` (a tenant's page), `every tenant`
    /// (the platform admin's), and the probe's `empty, old marker` and `empty, rebuilt`.
    pub listing: String,
    pub calls: u64,
    /// Calls not answered 200.
    pub failed: u64,
    /// Records the last call answered.
    pub records: u64,
    /// Script calls Redis counted meanwhile (one per call and shard read; more means other
    /// work ran in the window, and its time is in `redis_us_per_call` too).
    pub script_calls: u64,
    /// Redis's time per call, an upper bound: `INFO commandstats` `usec` of every command —
    /// the script call's (which includes the commands it ran) and each command's own, so the
    /// commands a script ran count twice, and a tenant page's record reads (a pipeline, not
    /// in the script) count once. What the target judges.
    pub redis_us_per_call: f64,
    /// The function call's time alone (`fcall_ro`).
    pub script_us_per_call: f64,
    /// redis-server's main-thread CPU time per call (`INFO cpu`; also its own background
    /// work meanwhile), which a busy machine does not inflate as it does the time above.
    pub redis_cpu_us_per_call: f64,
    /// Commands Redis ran per call besides the script call itself (inside it, or alone).
    pub commands_per_call: f64,
}

/// The dead-letter phase: listings at a full shard.
#[derive(Debug, Clone, Serialize)]
pub struct DeadLetters {
    /// The probe tenant (no records of its own) and its shard.
    pub tenant: String,
    pub shard: u16,
    /// `--dlq-cap` and `--dlq-tenant-cap` of the server (its defaults).
    pub shard_cap: u64,
    pub tenant_cap: u64,
    /// Tenants of the shard whose executions filled it.
    pub neighbours: usize,
    pub admitted: u64,
    pub dead_lettered: u64,
    /// Records the shard held after, and the holders counted.
    pub records: u64,
    pub holders: u64,
    /// The shard's first record then (the old marker was set below it).
    pub first_record: Option<String>,
    /// How long a new process's connect took, which rebuilt the shard's indexes and counts.
    pub rebuild_ms: f64,
    pub listings: Vec<ListingCost>,
}

impl Report {
    /// The group's targets: the probe's empty listing and a tenant's page of one record
    /// within `LISTING_US_LIMIT` of Redis per call at the full shard, also with the old marker
    /// and after the rebuild (a longer page costs its records: reported, not judged).
    pub(super) fn dead_letter_targets(&self, t: &mut Vec<Target>) {
        let Some(d) = &self.dead_letters else { return };
        for l in &d.listings {
            if !(l.listing.starts_with("empty")
                || l.listing.starts_with("page of 1,")
                || l.listing == "page of 1")
            {
                continue;
            }
            t.push(Target {
                name: format!("GET /api/dlq at a full shard, {}", l.listing),
                measured: l.redis_us_per_call,
                limit: LISTING_US_LIMIT,
                unit: "µs of Redis per call, at most",
                pass: l.redis_us_per_call <= LISTING_US_LIMIT,
            });
        }
    }

    /// The group for people.
    pub(super) fn human_dead_letters(&self, o: &mut String) {
        let Some(d) = &self.dead_letters else { return };
        let _ = writeln!(o, "\nDead letters (listing cost at a full shard):");
        let _ = writeln!(
            o,
            "  shard s{:02} of probe tenant {}: {} records of {} holders (--dlq-cap {}, \
             --dlq-tenant-cap {}), from {} dead-lettered of {} admitted by {} neighbours; \
             first record {}; a new process's connect rebuilt it in {:.1} ms",
            d.shard,
            d.tenant,
            d.records,
            d.holders,
            d.shard_cap,
            d.tenant_cap,
            d.dead_lettered,
            d.admitted,
            d.neighbours,
            d.first_record.as_deref().unwrap_or("none"),
            d.rebuild_ms
        );
        let _ = writeln!(
            o,
            "  {:<22} {:>6} {:>8} {:>14} {:>12} {:>12} {:>14} {:>13}",
            "listing",
            "calls",
            "records",
            "µs Redis/call",
            "of it script",
            "CPU µs/call",
            "commands/call",
            "script calls"
        );
        for l in &d.listings {
            let _ = writeln!(
                o,
                "  {:<22} {:>6} {:>8} {:>14.2} {:>12.2} {:>12.2} {:>14.2} {:>13}",
                l.listing,
                l.calls,
                l.records,
                l.redis_us_per_call,
                l.script_us_per_call,
                l.redis_cpu_us_per_call,
                l.commands_per_call,
                l.script_calls
            );
        }
    }
}
