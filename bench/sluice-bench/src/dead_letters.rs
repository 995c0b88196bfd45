//! The dead-letter group (issue 38, defects 5 and 6): what `GET /api/dlq` costs Redis at a
//! full shard. One phase, from an empty Redis, bounded in time and count:
//!
//! - `--dlq-records` (10 500) `demo.fail` executions (one attempt each, so each one is
//!   dead-lettered) of neighbour tenants, as many neighbours as the tenant cap needs (11 at
//!   the default 1 000), all in the shard of the probe tenant `dlq-probe`, and `--dlq-page`
//!   (50) of one more tenant there; admitted over HTTP, failed by two `sluice worker
//!   --concurrency 256`. The shard then holds `--dlq-cap` (10 000) records: its cap evicted the
//!   rest, from the largest holders.
//! - `--dlq-calls` (200) calls, one after the other on one keep-alive connection, of each
//!   listing: the probe's (empty), the page tenant's page of `--dlq-page` records, and the
//!   platform admin's page of every tenant (one script call per shard); then the probe's again
//!   in the state an older build left (its marker `dlq_indexed` naming a record below the
//!   shard's first, the state in which every listing walked the whole stream), and once more
//!   after a new process connected (which rebuilds the indexes and counts, and drops the
//!   marker; its time is reported). Per listing: Redis's time per call (`INFO commandstats`
//!   `usec` of every command: the script's, which includes the commands it ran, plus each
//!   command's own — those a script ran counted twice, so an upper bound), the script's alone,
//!   redis-server's main-thread CPU per call (`INFO cpu`), and the commands it ran per call.
//!
//! Target: the probe's empty listing, and the page tenant's page of one, each ≤ 100 µs of Redis per
//! call at the full shard, with the old marker and after the rebuild. Check: every admission
//! dead-lettered, the shard at its cap with its counts in step, the probe listing nothing and
//! the page tenant its whole page, the marker gone after the rebuild.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice::config::ApiSettings;
use sluice::domain::TenantId;

use crate::direct::Direct;
use crate::fairness::{ADMIT_CONNECTIONS, admit_all, tenant};
use crate::load::Conn;
use crate::push::{self, Ctx};
use crate::report::{Check, DeadLetters, ListingCost};

/// `count` tenants of `anchor`'s shard other than it, named `<stem>-<n>` (by
/// `Store::shard_of`, the function the server uses). Bounded: 1 000 000 names.
fn shard_mates(
    direct: &Direct,
    anchor: &TenantId,
    stem: &str,
    count: usize,
) -> anyhow::Result<Vec<TenantId>> {
    let shard = direct.shard_of(anchor);
    let mut out = Vec::with_capacity(count);
    for i in 0..1_000_000u32 {
        if out.len() == count {
            return Ok(out);
        }
        let t = tenant(&format!("{stem}-{i}"))?;
        if direct.shard_of(&t) == shard {
            out.push(t);
        }
    }
    anyhow::bail!("fewer than {count} tenants named {stem}-<n> share a shard with {anchor}")
}

/// `calls` calls of `GET path` as the platform admin for `tenant` (`None`: every tenant), one
/// after the other on one connection; what they cost Redis, and the records the last answered.
async fn listing_cost(
    ctx: &Ctx<'_>,
    direct: &mut Direct,
    label: &str,
    tenant: Option<&TenantId>,
    path: &str,
    calls: u64,
) -> anyhow::Result<ListingCost> {
    let mut conn = Conn::connect(ctx.addr).await?;
    direct.reset_command_stats().await?;
    let cpu_before = direct.redis_cpu_seconds().await?;
    let mut records = 0;
    let mut failed = 0;
    for _ in 0..calls {
        let (status, body) = conn
            .call(
                hyper::Method::GET,
                path,
                ctx.admin_token,
                tenant.map(TenantId::as_str).unwrap_or(""),
                "",
            )
            .await?;
        if status != 200 {
            failed += 1;
            continue;
        }
        let page: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        records = page["dead_letters"]
            .as_array()
            .map_or(0, |a| a.len() as u64);
    }
    let cpu = direct.redis_cpu_seconds().await? - cpu_before;
    let stats = direct.command_stats().await?;
    // The listing is a read: `dlq_list` is called with FCALL_RO.
    let script = stats.get("fcall_ro").copied().unwrap_or_default();
    let ours = |name: &str| !name.starts_with("config") && !name.starts_with("info");
    // Every command's time: the script's (which includes what it ran) and each command's own,
    // those a script ran counted again. An upper bound of Redis's time.
    let usec: u64 = stats
        .iter()
        .filter(|(name, _)| ours(name))
        .map(|(_, s)| s.usec)
        .sum();
    let others: u64 = stats
        .iter()
        .filter(|(name, _)| name.as_str() != "fcall_ro" && ours(name))
        .map(|(_, s)| s.calls)
        .sum();
    let n = calls.max(1) as f64;
    Ok(ListingCost {
        listing: label.into(),
        calls,
        failed,
        records,
        script_calls: script.calls,
        redis_us_per_call: (usec as f64 / n * 100.0).round() / 100.0,
        script_us_per_call: (script.usec as f64 / n * 100.0).round() / 100.0,
        redis_cpu_us_per_call: (cpu * 1e6 / n * 100.0).round() / 100.0,
        commands_per_call: (others as f64 / n * 100.0).round() / 100.0,
    })
}

/// The phase (see the module's comment).
pub async fn listing(ctx: &Ctx<'_>, direct: &mut Direct) -> anyhow::Result<(DeadLetters, Check)> {
    let args = ctx.args;
    direct.reset().await?;
    let defaults = ApiSettings::defaults();
    let shard_cap = defaults.dlq_cap.max(1);
    let tenant_cap = defaults.dlq_tenant_cap.clamp(1, shard_cap);
    let probe = tenant("dlq-probe")?;
    let shard = direct.shard_of(&probe);
    let neighbours = args.dlq_records.div_ceil(tenant_cap).max(1) as usize;
    let mates = shard_mates(direct, &probe, "dlq", neighbours + 1)?;
    let (paged, neighbours) = (&mates[0], &mates[1..]);

    // Every admission a `demo.fail` of one attempt: each ends in one dead-letter record.
    let body = |n: u64| {
        json!({"flow_id": "demo.fail", "max_attempts": 1,
               "params": {"message": format!("benchmark failure {n}")}})
        .to_string()
    };
    let mut jobs: Vec<(String, String)> = (0..args.dlq_page)
        .map(|n| (paged.to_string(), body(n)))
        .collect();
    jobs.extend((0..args.dlq_records).map(|n| {
        (
            neighbours[n as usize % neighbours.len()].to_string(),
            body(n),
        )
    }));
    let answers = admit_all(ctx.addr, ctx.admin_token, jobs, ADMIT_CONNECTIONS, "dlq").await?;
    let admitted = answers.iter().filter(|a| a.status == 201).count() as u64;
    let concurrency = vec!["--concurrency".to_owned(), "256".to_owned()];
    let workers = push::start_workers(ctx, "dlq-worker", 2, &concurrency, Duration::ZERO).await?;
    let deadline = Instant::now() + Duration::from_secs(if args.smoke { 30 } else { 120 });
    let mut last_print = Instant::now();
    let dead_lettered = loop {
        let n = direct.dead_lettered().await?;
        if n >= admitted || Instant::now() > deadline {
            break n;
        }
        if last_print.elapsed() >= Duration::from_secs(1) {
            eprintln!("[dlq] dead-lettered {n}/{admitted}");
            last_print = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    push::stop_workers(workers).await?;
    let full = direct.dlq_shard(shard).await?;

    let calls = args.dlq_calls.max(1);
    let page_size = args.dlq_page.clamp(1, 200);
    let page_path = format!("/api/dlq?limit={page_size}");
    let one = "/api/dlq?limit=1";
    let page_label = format!("page of {page_size}");
    let empty = listing_cost(ctx, direct, "empty", Some(&probe), "/api/dlq", calls).await?;
    let first_page = listing_cost(ctx, direct, "page of 1", Some(paged), one, calls).await?;
    let page = listing_cost(ctx, direct, &page_label, Some(paged), &page_path, calls).await?;
    let every = listing_cost(ctx, direct, "every tenant", None, &page_path, calls).await?;
    // An older build's marker, set once and trimmed past: below the shard's first record.
    let first = direct.first_dead_letter(shard).await?;
    direct.set_dlq_marker(shard, "1-0").await?;
    let marked = listing_cost(
        ctx,
        direct,
        "empty, old marker",
        Some(&probe),
        "/api/dlq",
        calls,
    )
    .await?;
    let rebuild = direct.connect_again().await?;
    let rebuilt = direct.dlq_shard(shard).await?;
    let after = listing_cost(
        ctx,
        direct,
        "empty, rebuilt",
        Some(&probe),
        "/api/dlq",
        calls,
    )
    .await?;
    let one_after =
        listing_cost(ctx, direct, "page of 1, rebuilt", Some(paged), one, calls).await?;

    let total = args.dlq_page + args.dlq_records;
    let want_records = total.min(shard_cap);
    let listings = [
        &empty,
        &first_page,
        &page,
        &every,
        &marked,
        &after,
        &one_after,
    ];
    let ok = admitted == total
        && dead_lettered == admitted
        && full.records == want_records
        && full.counted == full.records
        && !full.marker
        && rebuilt.records == full.records
        && rebuilt.counted == rebuilt.records
        && !rebuilt.marker
        && listings.iter().all(|l| l.failed == 0)
        && empty.records == 0
        && marked.records == 0
        && after.records == 0
        && page.records == page_size.min(args.dlq_page)
        && first_page.records == 1
        && one_after.records == 1;
    let check = Check {
        phase: "dead-letter listing".into(),
        ok,
        detail: format!(
            "admitted {admitted} of {total}, dead-lettered {dead_lettered}; shard holds {} \
             (expected {want_records}), counted {} ({} holders); after the rebuild {} counted \
             {}, marker {}; probe listed {}/{}/{}, page tenant {} (expected {}) and {}/{} \
             (expected 1); failed calls {}",
            full.records,
            full.counted,
            full.holders,
            rebuilt.records,
            rebuilt.counted,
            if rebuilt.marker { "left" } else { "gone" },
            empty.records,
            marked.records,
            after.records,
            page.records,
            page_size.min(args.dlq_page),
            first_page.records,
            one_after.records,
            listings.iter().map(|l| l.failed).sum::<u64>()
        ),
    };
    Ok((
        DeadLetters {
            tenant: probe.to_string(),
            shard: shard.number(),
            shard_cap,
            tenant_cap,
            neighbours: neighbours.len(),
            admitted,
            dead_lettered,
            records: full.records,
            holders: full.holders,
            first_record: first,
            rebuild_ms: (rebuild.as_secs_f64() * 1000.0 * 10.0).round() / 10.0,
            listings: vec![empty, first_page, page, every, marked, after, one_after],
        },
        check,
    ))
}
