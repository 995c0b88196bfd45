//! The fairness group (issue 20): whether dispatch keeps a calm tenant fast behind another
//! tenant's flood, shares starts by weight, and starts scheduled executions on time. Each phase
//! starts from an empty Redis, is bounded in time and count, and has its correctness check:
//!
//! - **noisy neighbour**: one `sluice worker --concurrency 8` (other settings default). Tenant
//!   `flood` (`max_concurrent` 1000) admits `demo.sleep` executions of `--noisy-exec-ms` (20)
//!   enough to keep the worker busy for `--noisy-flood-secs` (30 s: 8 × 30 000 / 20 = 12 000),
//!   as fast as the API takes them; then a calm tenant IN THE SAME SHARD (a name picked with
//!   sluice's own tenant → shard mapping) admits the same executions at `--noisy-calm-rate` (4/s)
//!   until `--noisy-calm-samples` (100). Pickup = the row's `started` − `created` (Redis
//!   clock), p50/p90/p99/max for each tenant. The BullMQ peer runs the same in one queue with a
//!   worker of concurrency 8 (`bench/bullmq/peer.mjs --noisy`), reported beside it.
//! - **weighted share**: two tenants of one shard, weights 1 and 3 (`PUT /api/tenants/{t}`
//!   `{"weight": n}`; a build without weights answers 400 and the report says "weights
//!   unsupported"), each with a backlog of `--weighted-backlog` (2000) `demo.echo` executions
//!   admitted before one default worker starts; the share of each among the first
//!   `--weighted-window` (2000) starts, read from the shard's start log (`<prefix>starts`), or
//!   from the rows ordered by `started` on a build that has no start log.
//! - **scheduled-start lateness**: one default worker on an idle system; `--lateness-samples`
//!   (200) `demo.echo` executions admitted with `delay` spread over `--lateness-spread-ms`
//!   after `--lateness-lead-ms`; lateness = the row's `started` − its due time (`run_at`,
//!   both Redis clock). A start before its due time fails the correctness check. A build
//!   without `delay` answers 400: "unsupported".
//!
//! What the phases need of sluice is its HTTP API and the rows' fields, so the same benchmark
//! measures a build before fair dispatch (the "before" numbers) and after.
//!
//! Long on purpose: the group's three phases are each one story read top to bottom (set up,
//! load, measure, check), and they share the admission, tenant and drain helpers at the top,
//! which the limits group reuses; the unit tests close the file.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{Value, json};
use sluice::domain::TenantId;
use tokio::task::JoinSet;

use crate::bullmq::{self, NoPeer, NoisyPlan};
use crate::direct::{Direct, RowTimes};
use crate::load::{Conn, Latencies, Outcomes, Percentiles};
use crate::push::{self, Ctx, ms_to_us};
use crate::report::{Check, Lateness, NoisyNeighbour, NoisySide, WeightedShare};

/// Connections the flood and backlog admissions are sent over.
pub(crate) const ADMIT_CONNECTIONS: usize = 16;

/// A tenant id the benchmark names itself (always valid).
pub(crate) fn tenant(name: &str) -> anyhow::Result<TenantId> {
    TenantId::parse(name).map_err(|e| anyhow::anyhow!("tenant {name}: {}", e.detail))
}

/// The first of `stem`, `stem-1`, `stem-2`, ... that sluice maps to the same shard as
/// `anchor` (by `Store::shard_of`, the function the server uses): with 16 shards about the
/// 16th name fits. Bounded: 100 000 names.
fn same_shard(direct: &Direct, anchor: &TenantId, stem: &str) -> anyhow::Result<TenantId> {
    let shard = direct.shard_of(anchor);
    for i in 0..100_000u32 {
        let name = if i == 0 {
            stem.to_owned()
        } else {
            format!("{stem}-{i}")
        };
        let t = tenant(&name)?;
        if t != *anchor && direct.shard_of(&t) == shard {
            return Ok(t);
        }
    }
    anyhow::bail!("no tenant named {stem}-<n> shares a shard with {anchor}")
}

/// One admission's answer: its status and JSON body (`Null` when it was not JSON).
pub(crate) struct Answer {
    pub status: u16,
    pub body: Value,
}

impl Answer {
    pub fn id(&self) -> Option<&str> {
        self.body["execution_id"].as_str()
    }
}

/// `POST /api/executions` of every `(tenant, body)` in `jobs`, in that order handed out to
/// `conns` keep-alive connections (as fast as the server answers); the answers in `jobs`
/// order. A request that got no answer counts as status 0.
pub(crate) async fn admit_all(
    addr: SocketAddr,
    token: &str,
    jobs: Vec<(String, String)>,
    conns: usize,
    label: &str,
) -> anyhow::Result<Vec<Answer>> {
    let jobs = Arc::new(jobs);
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut set = JoinSet::new();
    for _ in 0..conns.clamp(1, jobs.len().max(1)) {
        let (jobs, next, token) = (jobs.clone(), next.clone(), token.to_owned());
        let mut conn = Conn::connect(addr).await?;
        set.spawn(async move {
            let mut out = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some((t, body)) = jobs.get(i) else { break };
                let answer = conn
                    .call(hyper::Method::POST, "/api/executions", &token, t, body)
                    .await;
                let a = match answer {
                    Ok((status, bytes)) => Answer {
                        status,
                        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
                    },
                    Err(_) => Answer {
                        status: 0,
                        body: Value::Null,
                    },
                };
                out.push((i, a));
            }
            out
        });
    }
    let mut all: Vec<(usize, Answer)> = Vec::with_capacity(jobs.len());
    while let Some(r) = set.join_next().await {
        all.extend(r.context("an admission client failed")?);
    }
    all.sort_by_key(|(i, _)| *i);
    let ok = all.iter().filter(|(_, a)| a.status == 201).count();
    eprintln!(
        "[{label}] admitted {ok} of {} in {:.1} s",
        jobs.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(all.into_iter().map(|(_, a)| a).collect())
}

/// `PUT /api/tenants/{tenant}` with `body` as the platform admin; status and JSON answer.
pub(crate) async fn put_tenant(
    addr: SocketAddr,
    token: &str,
    tenant: &TenantId,
    body: &Value,
) -> anyhow::Result<(u16, Value)> {
    let mut conn = Conn::connect(addr).await?;
    let (status, bytes) = conn
        .call(
            hyper::Method::PUT,
            &format!("/api/tenants/{tenant}"),
            token,
            tenant.as_str(),
            &body.to_string(),
        )
        .await?;
    Ok((
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    ))
}

/// Waits until the shards' `completed` counters reach `total`, at most `bound`; prints
/// progress once a second. Returns how many completed.
pub(crate) async fn drain(
    direct: &mut Direct,
    label: &str,
    total: u64,
    bound: Duration,
) -> anyhow::Result<u64> {
    let deadline = Instant::now() + bound;
    let mut last_print = Instant::now();
    loop {
        let done = direct.completed().await?;
        if done >= total || Instant::now() > deadline {
            return Ok(done);
        }
        if last_print.elapsed() >= Duration::from_secs(1) {
            eprintln!("[{label}] completed={done}/{total}");
            last_print = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Pickup (`started` − `created`) of `rows`, one not started by `now_ms` counted at its age.
pub(crate) fn pickup_of<'a>(rows: impl Iterator<Item = &'a RowTimes>, now_ms: u64) -> Percentiles {
    let v = rows
        .filter_map(|r| {
            let created = r.created?;
            Some(ms_to_us(
                r.started.unwrap_or(now_ms).saturating_sub(created),
            ))
        })
        .collect();
    Latencies::new(v).percentiles()
}

/// The sluice side of the noisy-neighbour phase from the rows read back: pickups per tenant,
/// how many calm executions were admitted while the flood still had executions to start, and
/// how long the flood kept the worker busy.
fn noisy_side(
    rows: &[RowTimes],
    flood: &str,
    calm: &str,
    now_ms: u64,
    admitted: (u64, u64),
    errors: u64,
) -> NoisySide {
    fn of<'a>(rows: &'a [RowTimes], t: &'a str) -> impl Iterator<Item = &'a RowTimes> {
        rows.iter().filter(move |r| r.tenant.as_deref() == Some(t))
    }
    let flood_starts: Vec<u64> = of(rows, flood).filter_map(|r| r.started).collect();
    let first = flood_starts.iter().copied().min().unwrap_or(0);
    let last = flood_starts.iter().copied().max().unwrap_or(0);
    NoisySide {
        flood_admitted: admitted.0,
        calm_admitted: admitted.1,
        errors,
        completed: rows.iter().filter(|r| r.status == "completed").count() as u64,
        not_started: rows.iter().filter(|r| r.started.is_none()).count() as u64,
        calm_during_flood: of(rows, calm)
            .filter(|r| r.created.is_some_and(|c| c <= last))
            .count() as u64,
        flood_span_secs: last.saturating_sub(first) as f64 / 1000.0,
        calm: pickup_of(of(rows, calm), now_ms),
        flood: pickup_of(of(rows, flood), now_ms),
    }
}

/// The noisy-neighbour phase on sluice, then on the BullMQ peer (unless `--skip-bullmq`).
pub async fn noisy(
    ctx: &Ctx<'_>,
    direct: &mut Direct,
) -> anyhow::Result<(NoisyNeighbour, Vec<Check>)> {
    let args = ctx.args;
    let concurrency = args.noisy_concurrency.max(1);
    let exec_ms = args.noisy_exec_ms.max(1);
    let flood_count =
        ((concurrency as f64 * args.noisy_flood_secs * 1000.0) / exec_ms as f64).ceil() as u64;
    let calm_rate = args.noisy_calm_rate.max(0.1);
    let calm_count = args.noisy_calm_samples.max(1);
    direct.reset().await?;
    let flood = tenant("flood")?;
    let calm = same_shard(direct, &flood, "calm")?;
    let shard = direct.shard_of(&flood).number();
    let (status, answer) = put_tenant(
        ctx.addr,
        ctx.admin_token,
        &flood,
        &json!({"max_concurrent": 1000}),
    )
    .await?;
    anyhow::ensure!(
        status == 200,
        "noisy neighbour: PUT /api/tenants/{flood} answered {status}: {answer}"
    );
    let extra = vec!["--concurrency".to_owned(), concurrency.to_string()];
    let settle = Duration::from_millis(args.pickup_settle_ms);
    let workers = push::start_workers(ctx, "noisy-worker", 1, &extra, settle).await?;

    // The flood, as fast as the API takes it.
    let body =
        |n: u64| format!(r#"{{"flow_id":"demo.sleep","params":{{"ms":{exec_ms},"n":{n}}}}}"#);
    let jobs = (0..flood_count)
        .map(|n| (flood.to_string(), body(n)))
        .collect();
    let flood_answers = admit_all(
        ctx.addr,
        ctx.admin_token,
        jobs,
        ADMIT_CONNECTIONS,
        "noisy flood",
    )
    .await?;

    // The calm tenant, open loop at its rate (each request sent at its scheduled time, or at
    // once when the previous answer came late).
    eprintln!(
        "[noisy calm] {calm_count} executions at {calm_rate}/s (tenant {calm}, shard {shard})"
    );
    let mut conn = Conn::connect(ctx.addr).await?;
    let start = tokio::time::Instant::now();
    let mut calm_ok = 0u64;
    let mut calm_errors = 0u64;
    for k in 0..calm_count {
        let at = start + Duration::from_secs_f64(k as f64 / calm_rate);
        tokio::time::sleep_until(at).await;
        let r = conn
            .call(
                hyper::Method::POST,
                "/api/executions",
                ctx.admin_token,
                calm.as_str(),
                &body(k),
            )
            .await;
        match r {
            Ok((201, _)) => calm_ok += 1,
            _ => calm_errors += 1,
        }
    }
    let flood_ok = flood_answers.iter().filter(|a| a.status == 201).count() as u64;
    let flood_errors = flood_count - flood_ok;
    let total = flood_ok + calm_ok;
    // Bounded: three times the flood's planned length, and half a minute.
    let bound = Duration::from_secs_f64(args.noisy_flood_secs * 3.0 + 30.0);
    drain(direct, "noisy drain", total, bound).await?;
    let now = direct.redis_now_ms().await?;
    let rows = direct.row_times().await?;
    push::stop_workers(workers).await?;
    let side = noisy_side(
        &rows,
        flood.as_str(),
        calm.as_str(),
        now,
        (flood_ok, calm_ok),
        flood_errors + calm_errors,
    );
    let census = direct.census(false).await?;
    let outcomes = Outcomes {
        created: total,
        errors: flood_errors + calm_errors,
        ..Outcomes::default()
    };
    let mut checks = vec![crate::harness::check_completed(
        "noisy neighbour",
        &outcomes,
        &census,
    )];

    let plan = NoisyPlan {
        flood: flood_count,
        ms: exec_ms,
        concurrency,
        calm_rate,
        calm_count,
    };
    let (mut peer_side, mut peer, mut peer_note) = (None, None, None);
    if args.skip_bullmq {
        peer_note = Some("skipped (--skip-bullmq)".to_owned());
    } else {
        match bullmq::noisy(args, ctx.scratch, &plan, bound.as_secs()).await {
            Ok((s, check, versions)) => {
                peer_side = Some(s);
                checks.push(check);
                peer = Some(versions);
            }
            Err(NoPeer::Skipped(note)) => {
                eprintln!("sluice-bench: WARNING: BullMQ peer skipped: {note}");
                peer_note = Some(note);
            }
            Err(NoPeer::Failed(e)) => {
                eprintln!("sluice-bench: the BullMQ peer failed: {e:#}");
                checks.push(Check {
                    phase: "bullmq noisy".into(),
                    ok: false,
                    detail: format!("failed: {e:#}"),
                });
                peer_note = Some(format!("failed: {e:#}"));
            }
        }
    }
    Ok((
        NoisyNeighbour {
            worker: format!(
                "one `sluice worker --demo-flows --concurrency {concurrency}`, other settings \
                 default"
            ),
            flood_tenant: flood.to_string(),
            calm_tenant: calm.to_string(),
            shard,
            flood_count,
            execution_ms: exec_ms,
            calm_rate,
            sluice: side,
            bullmq: peer_side,
            peer_note,
            peer,
        },
        checks,
    ))
}

/// Whether a `PUT /api/tenants/{t}` answer shows the weight was taken: 200 and `weight` in the
/// tenant it answers. `Err` says why not.
fn weight_taken(status: u16, answer: &Value, weight: u32) -> Result<(), String> {
    if status != 200 {
        let detail = answer["detail"].as_str().unwrap_or("");
        return Err(format!(
            "PUT {{\"weight\": {weight}}} answered {status} {detail}"
        ));
    }
    match answer["weight"].as_u64() {
        Some(w) if w == u64::from(weight) => Ok(()),
        other => Err(format!(
            "PUT {{\"weight\": {weight}}} answered 200 with weight {other:?}: ignored"
        )),
    }
}

/// The weighted-share phase.
pub async fn weighted(
    ctx: &Ctx<'_>,
    direct: &mut Direct,
) -> anyhow::Result<(WeightedShare, Check)> {
    let args = ctx.args;
    let backlog = args.weighted_backlog.max(1);
    let window = args.weighted_window.max(1);
    direct.reset_with_start_log().await?;
    let light = tenant("weight-1")?;
    let heavy = same_shard(direct, &light, "weight-3")?;
    let shard = direct.shard_of(&light);
    let mut notes = Vec::new();
    for (t, w) in [(&light, 1), (&heavy, 3)] {
        let (status, answer) =
            put_tenant(ctx.addr, ctx.admin_token, t, &json!({ "weight": w })).await?;
        if let Err(note) = weight_taken(status, &answer, w) {
            notes.push(format!("{t}: {note}"));
        }
    }
    let supported = notes.is_empty();
    if !supported {
        eprintln!("[weighted] weights unsupported: {}", notes.join("; "));
    }
    // The other tenant's refusal says the same.
    notes.truncate(1);
    // The backlogs, interleaved so that without weights (FIFO) each gets half.
    let jobs = (0..backlog * 2)
        .map(|i| {
            let t = if i % 2 == 0 { &light } else { &heavy };
            (
                t.to_string(),
                format!(r#"{{"flow_id":"demo.echo","params":{{"n":{i}}}}}"#),
            )
        })
        .collect();
    let answers = admit_all(
        ctx.addr,
        ctx.admin_token,
        jobs,
        ADMIT_CONNECTIONS,
        "weighted backlog",
    )
    .await?;
    let created = answers.iter().filter(|a| a.status == 201).count() as u64;
    let errors = backlog * 2 - created;
    let workers = push::start_workers(
        ctx,
        "weighted-worker",
        1,
        &push::worker_extra(args),
        Duration::ZERO,
    )
    .await?;
    drain(direct, "weighted drain", created, Duration::from_secs(120)).await?;
    push::stop_workers(workers).await?;

    let (order, source) = match direct.start_log(shard, window as usize).await? {
        Some(log) => (log, "start log"),
        None => {
            let mut rows: Vec<RowTimes> = direct
                .row_times()
                .await?
                .into_iter()
                .filter(|r| r.started.is_some())
                .collect();
            // Ties (the same millisecond) by id: UUIDv7, so in admission order.
            rows.sort_by(|a, b| (a.started, &a.id).cmp(&(b.started, &b.id)));
            (
                rows.into_iter()
                    .take(window as usize)
                    .filter_map(|r| r.tenant)
                    .collect(),
                "rows by started",
            )
        }
    };
    let counted = order.len() as u64;
    let share = |t: &TenantId| {
        let n = order.iter().filter(|x| x.as_str() == t.as_str()).count();
        (n as f64 * 1000.0 / counted.max(1) as f64).round() / 10.0
    };
    let census = direct.census(false).await?;
    let outcomes = Outcomes {
        created,
        errors,
        ..Outcomes::default()
    };
    let check = crate::harness::check_completed("weighted share", &outcomes, &census);
    Ok((
        WeightedShare {
            light: light.to_string(),
            heavy: heavy.to_string(),
            shard: shard.number(),
            weights_supported: supported,
            weights_note: (!supported).then(|| notes.join("; ")),
            backlog,
            window,
            source,
            counted,
            light_share_pct: share(&light),
            heavy_share_pct: share(&heavy),
        },
        check,
    ))
}

/// Lateness of each row against its due time: the row's `run_at` (or `ready_at`, the time it
/// became runnable, which for a scheduled execution is its due time) when it has one, else
/// `created` + the delay asked (by id). Returns (lateness µs with early ones at 0, early count,
/// most early ms, where the due time came from).
fn lateness_of(rows: &[RowTimes], asked: &HashMap<String, u64>) -> (Vec<u32>, u64, u64, String) {
    let (mut late, mut early, mut most_early) = (Vec::new(), 0u64, 0u64);
    let (mut from_row, mut from_delay) = (0u64, 0u64);
    for r in rows {
        let Some(delay) = asked.get(&r.id) else {
            continue;
        };
        let Some(started) = r.started else { continue };
        let due = match (r.run_at.or(r.ready_at), r.created) {
            (Some(d), _) => {
                from_row += 1;
                d
            }
            (None, Some(c)) => {
                from_delay += 1;
                c + delay
            }
            (None, None) => continue,
        };
        if started < due {
            early += 1;
            most_early = most_early.max(due - started);
            late.push(0);
        } else {
            late.push(ms_to_us(started - due));
        }
    }
    let from = match (from_row, from_delay) {
        (_, 0) => "the row's run_at".to_owned(),
        (0, _) => "the row's created + the delay asked".to_owned(),
        (a, b) => format!("run_at for {a} rows, created + delay for {b}"),
    };
    (late, early, most_early, from)
}

/// The scheduled-start lateness phase.
pub async fn lateness(ctx: &Ctx<'_>, direct: &mut Direct) -> anyhow::Result<(Lateness, Check)> {
    let args = ctx.args;
    let n = args.lateness_samples.max(1);
    let (lead, spread) = (args.lateness_lead_ms, args.lateness_spread_ms);
    direct.reset().await?;
    let settle = Duration::from_millis(args.pickup_settle_ms);
    let workers =
        push::start_workers(ctx, "lateness-worker", 1, &push::worker_extra(args), settle).await?;
    let t = tenant("scheduled")?;
    let delay_of = |i: u64| lead + spread * i / n;
    let body = |i: u64| {
        format!(
            r#"{{"flow_id":"demo.echo","params":{{"n":{i}}},"delay":"{}ms"}}"#,
            delay_of(i)
        )
    };
    let first = admit_all(
        ctx.addr,
        ctx.admin_token,
        vec![(t.to_string(), body(0))],
        1,
        "lateness",
    )
    .await?;
    let unsupported = |note: String| Lateness {
        supported: false,
        note: Some(note),
        samples: 0,
        spread_ms: spread,
        lead_ms: lead,
        due_from: String::new(),
        lateness: None,
        early: 0,
        most_early_ms: 0,
        completed: 0,
    };
    if first[0].status != 201 {
        push::stop_workers(workers).await?;
        let detail = first[0].body["detail"].as_str().unwrap_or("").to_owned();
        let note = format!(
            "unsupported: admission with `delay` answered {} {detail}",
            first[0].status
        );
        eprintln!("[lateness] {note}");
        let check = Check {
            phase: "lateness".into(),
            ok: first[0].status == 400,
            detail: format!(
                "`delay` refused with {} (expected 400 on a build without it)",
                first[0].status
            ),
        };
        return Ok((unsupported(note), check));
    }
    let jobs = (1..n).map(|i| (t.to_string(), body(i))).collect();
    let mut answers = first;
    answers.extend(admit_all(ctx.addr, ctx.admin_token, jobs, 8, "lateness").await?);
    let mut asked = HashMap::new();
    for (i, a) in answers.iter().enumerate() {
        if a.status == 201
            && let Some(id) = a.id()
        {
            asked.insert(id.to_owned(), delay_of(i as u64));
        }
    }
    let created = asked.len() as u64;
    let bound = Duration::from_millis(lead + spread) + Duration::from_secs(30);
    let completed = drain(direct, "lateness drain", created, bound).await?;
    let rows = direct.row_times().await?;
    push::stop_workers(workers).await?;
    let (late, early, most_early, due_from) = lateness_of(&rows, &asked);
    let measured = late.len() as u64;
    let census = direct.census(false).await?;
    let outcomes = Outcomes {
        created,
        errors: n - created,
        ..Outcomes::default()
    };
    let mut check = crate::harness::check_completed("lateness", &outcomes, &census);
    check.ok &= early == 0 && measured == created;
    check.detail = format!(
        "{}; started before due={early} (most {most_early} ms early); measured={measured}",
        check.detail
    );
    Ok((
        Lateness {
            supported: true,
            note: None,
            samples: created,
            spread_ms: spread,
            lead_ms: lead,
            due_from,
            lateness: Some(Latencies::new(late).percentiles()),
            early,
            most_early_ms: most_early,
            completed,
        },
        check,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, created: u64, started: Option<u64>, due: Option<u64>) -> RowTimes {
        RowTimes {
            id: id.into(),
            status: "completed".into(),
            tenant: None,
            created: Some(created),
            started,
            finished: started,
            ready_at: None,
            run_at: due,
        }
    }

    #[test]
    fn lateness_counts_an_early_start_and_prefers_the_rows_due_time() {
        let asked: HashMap<String, u64> = [("a".into(), 100), ("b".into(), 100)].into();
        // a: due 1100 by the row, started 1103 → 3 ms late; b: due 1100, started 1090 → early.
        let rows = [
            row("a", 1000, Some(1103), Some(1100)),
            row("b", 1000, Some(1090), Some(1100)),
        ];
        let (late, early, most, from) = lateness_of(&rows, &asked);
        assert_eq!(early, 1);
        assert_eq!(most, 10);
        assert_eq!(Latencies::new(late).percentiles().max_ms, 3.0);
        assert_eq!(from, "the row's run_at");
        // Without ready_at: created + the delay asked.
        let rows = [row("a", 1000, Some(1105), None)];
        let (late, early, _, from) = lateness_of(&rows, &asked);
        assert_eq!((early, late), (0, vec![5000]));
        assert_eq!(from, "the row's created + the delay asked");
    }

    #[test]
    fn a_weight_is_taken_only_when_the_answer_shows_it() {
        assert!(weight_taken(200, &json!({"weight": 3}), 3).is_ok());
        assert!(weight_taken(200, &json!({"max_concurrent": 3}), 3).is_err());
        assert!(weight_taken(400, &json!({"detail": "unknown field `weight`"}), 3).is_err());
    }
}
