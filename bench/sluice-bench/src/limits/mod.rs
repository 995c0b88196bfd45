//! The limits group (concurrency keys and rate limits): whether a rate-limited tenant starts at
//! its rate and never faster, whether a concurrency key at its limit delays another key of the
//! same tenant, and what carrying a key costs admission. Each phase starts from an empty Redis,
//! is bounded in time and count, and has its correctness check:
//!
//! - **throttle accuracy**: tenant `throttled` with `rate_limit {"starts": R, "per": "1s",
//!   "burst": B}` (`--throttle-rate` 200, `--throttle-burst` 20); a backlog of R ×
//!   `--throttle-secs` (10: 2 000) `demo.echo` executions admitted first, then one `sluice
//!   worker --concurrency 64` (`--throttle-concurrency`) drains it. From the shard's start log
//!   (`<prefix>starts`: entry ids are Redis ms times; the rows' `started` instead when the log
//!   was trimmed below the backlog): the most starts in any window of one second — more than
//!   R + B fails the correctness check — and the steady rate after the burst, (n − B − 1)
//!   intervals over the time from the (B + 1)-th start to the last, as a share of R (target
//!   ≥ 95 %).
//! - **key isolation**: tenant `keyed` with `max_concurrent_per_key` 1 (and `max_concurrent`
//!   1 000, `max_queued` 1 000 000); one `sluice worker --concurrency 8`
//!   (`--key-isolation-concurrency`) runs while key A gets `--key-isolation-backlog` (10 000)
//!   `demo.sleep` executions of `--key-isolation-exec-ms` (50) as fast as the API takes them;
//!   then key B admits `--key-isolation-samples` (100) `demo.echo` executions at
//!   `--key-isolation-rate` (10/s). B's pickup (the row's `started` − `created`, Redis clock)
//!   p50/p90/p99/max, and A's progress meanwhile. The check: every admission answered 201 and
//!   is a row, every B sample started, and A never ran more than one at a time (its rows'
//!   `started`/`finished` intervals; a hand-over in the same millisecond is no overlap). The
//!   phase ends once B's samples have started: A's queue (minutes of work) goes with the next
//!   phase's reset.
//! - **keyed admission** (`--compare-keyed`, a mode of its own like `--compare-builds`): the
//!   HTTP admission phase's closed loop on this build, plain (no keys, no limits) against keyed
//!   (every request with a `concurrency_key`, one of `--admission-keys` (1 000) per tenant,
//!   every tenant with `max_concurrent_per_key` `--admission-key-limit` (10)), `--compare-runs`
//!   (5) runs per side of `--compare-secs` (5) each, alternating (plain keyed keyed plain ...),
//!   each on a fresh `redis-server` and `serve`, with the admission phase's correctness check
//!   after each run; medians of admissions/s and of Redis's script time per call, and keyed /
//!   plain (target ≥ 0.85). `--admission-keys N` gives the normal admission phase the keyed
//!   workload too.
//!
//! A build without rate limits or concurrency keys answers 400 to the tenant setting: the
//! phase then reports "unsupported" (its check passes only on that 400), as the fairness group
//! does for weights and `delay`.

mod keyed;

pub use keyed::{KeyedComparison, compare_keyed};

use std::collections::HashSet;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::compare::round2;
use crate::direct::Direct;
use crate::fairness::{ADMIT_CONNECTIONS, admit_all, drain, pickup_of, put_tenant, tenant};
use crate::load::{Conn, Outcomes};
use crate::push::{self, Ctx};
use crate::report::{Check, KeyIsolation, Throttle};

/// Concurrency keys per tenant of `--compare-keyed`'s keyed side when `--admission-keys` is not
/// given.
pub const DEFAULT_COMPARE_KEYS: u64 = 1000;

/// The key-isolation phase's `max_concurrent_per_key`: key A runs one at a time.
const ISOLATION_KEY_LIMIT: u32 = 1;

/// Whether a `PUT /api/tenants/{t}` answer shows `field` set to `want`: 200 and the field so in
/// the tenant it answers. `Err` says why not.
fn setting_taken(status: u16, answer: &Value, field: &str, want: &Value) -> Result<(), String> {
    if status != 200 {
        let detail = answer["detail"].as_str().unwrap_or("");
        return Err(format!(
            "PUT {{\"{field}\": {want}}} answered {status} {detail}"
        ));
    }
    if &answer[field] == want {
        Ok(())
    } else {
        Err(format!(
            "PUT {{\"{field}\": {want}}} answered 200 with {field} {}: ignored",
            answer[field]
        ))
    }
}

/// Gives every tenant `max_concurrent_per_key` `limit`; fails when the build does not take it.
pub(crate) async fn set_key_limits(
    addr: std::net::SocketAddr,
    token: &str,
    tenants: &[String],
    limit: u32,
) -> anyhow::Result<()> {
    for t in tenants {
        let t = tenant(t)?;
        let want = json!(limit);
        let (status, answer) =
            put_tenant(addr, token, &t, &json!({ "max_concurrent_per_key": want })).await?;
        setting_taken(status, &answer, "max_concurrent_per_key", &want)
            .map_err(|e| anyhow::anyhow!("tenant {t}: {e} (a build without concurrency keys?)"))?;
    }
    Ok(())
}

/// The most of the sorted `times` (ms) in any window `[t, t + window_ms)`.
fn busiest_window(times: &[u64], window_ms: u64) -> u64 {
    let (mut most, mut lo) = (0, 0);
    for (hi, &t) in times.iter().enumerate() {
        while times[lo] + window_ms <= t {
            lo += 1;
        }
        most = most.max(hi - lo + 1);
    }
    most as u64
}

/// The steady rate after the burst, per second: of the sorted start `times`, the (n − burst − 1)
/// intervals from the (burst + 1)-th start to the last over the time they span. `None` with too
/// few starts (or all in one millisecond).
fn steady_rate(times: &[u64], burst: usize) -> Option<f64> {
    let first = *times.get(burst)?;
    let last = *times.last()?;
    let intervals = times.len() - burst - 1;
    (last > first && intervals > 0).then(|| intervals as f64 * 1000.0 / (last - first) as f64)
}

/// The most of `runs` (`[started, finished)` in ms, `None`: still running) open at once; an
/// end and a start in the same millisecond are a hand-over, not an overlap.
fn most_at_once(runs: &[(u64, Option<u64>)]) -> u64 {
    let mut events: Vec<(u64, i64)> = Vec::with_capacity(runs.len() * 2);
    for &(started, finished) in runs {
        events.push((started, 1));
        if let Some(f) = finished {
            events.push((f, -1));
        }
    }
    // At the same time an end (−1) sorts before a start (+1).
    events.sort_unstable();
    let (mut open, mut most) = (0i64, 0i64);
    for (_, d) in events {
        open += d;
        most = most.max(open);
    }
    most as u64
}

/// The throttle-accuracy phase.
pub async fn throttle(ctx: &Ctx<'_>, direct: &mut Direct) -> anyhow::Result<(Throttle, Check)> {
    let args = ctx.args;
    let (rate, burst) = (args.throttle_rate.max(1), args.throttle_burst.max(1));
    let backlog = ((f64::from(rate) * args.throttle_secs).ceil() as u64).max(1);
    let concurrency = args.throttle_concurrency.max(1);
    direct.reset_with_start_log().await?;
    let t = tenant("throttled")?;
    let shard = direct.shard_of(&t);
    let mut out = Throttle {
        supported: true,
        note: None,
        tenant: t.to_string(),
        shard: shard.number(),
        rate,
        burst,
        backlog,
        worker: format!("one `sluice worker --demo-flows --concurrency {concurrency}`"),
        source: "start log",
        starts: 0,
        completed: 0,
        busiest_window: 0,
        window_limit: u64::from(rate) + u64::from(burst),
        span_secs: 0.0,
        steady_per_sec: 0.0,
        steady_pct: 0.0,
    };
    let limit = json!({"starts": rate, "per": "1s", "burst": burst});
    let (status, answer) = put_tenant(
        ctx.addr,
        ctx.admin_token,
        &t,
        &json!({ "rate_limit": limit }),
    )
    .await?;
    if let Err(note) = setting_taken(status, &answer, "rate_limit", &limit) {
        let note = format!("unsupported: {note}");
        eprintln!("[throttle] {note}");
        let check = Check {
            phase: "throttle".into(),
            ok: status == 400,
            detail: format!(
                "`rate_limit` refused with {status} (expected 400 on a build without it)"
            ),
        };
        return Ok((
            Throttle {
                supported: false,
                note: Some(note),
                ..out
            },
            check,
        ));
    }

    // The backlog first, then the worker: every start is counted against the rate.
    let jobs = (0..backlog)
        .map(|i| {
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
        "throttle backlog",
    )
    .await?;
    let created = answers.iter().filter(|a| a.status == 201).count() as u64;
    let extra = vec!["--concurrency".to_owned(), concurrency.to_string()];
    let workers = push::start_workers(ctx, "throttle-worker", 1, &extra, Duration::ZERO).await?;
    // Bounded: the backlog's time at the rate, and half a minute.
    let bound = Duration::from_secs_f64(backlog as f64 / f64::from(rate) + 30.0);
    out.completed = drain(direct, "throttle drain", created, bound).await?;
    push::stop_workers(workers).await?;

    let logged: Option<Vec<u64>> = direct
        .start_log_times(shard, created as usize + 1000)
        .await?
        .map(|log| {
            log.into_iter()
                .filter(|(_, who)| who == t.as_str())
                .map(|(ms, _)| ms)
                .collect()
        });
    let mut times = match logged {
        Some(v) if v.len() as u64 >= created => v,
        _ => {
            out.source = "rows by started";
            direct
                .row_times()
                .await?
                .into_iter()
                .filter_map(|r| r.started)
                .collect()
        }
    };
    times.sort_unstable();
    out.starts = times.len() as u64;
    out.busiest_window = busiest_window(&times, 1000);
    if let (Some(first), Some(last)) = (times.first(), times.last()) {
        out.span_secs = (last - first) as f64 / 1000.0;
    }
    let steady = steady_rate(&times, burst as usize).unwrap_or(0.0);
    out.steady_per_sec = round2(steady);
    out.steady_pct = round2(steady / f64::from(rate) * 100.0);

    let census = direct.census(false).await?;
    let outcomes = Outcomes {
        created,
        errors: backlog - created,
        ..Outcomes::default()
    };
    let mut check = crate::harness::check_completed("throttle", &outcomes, &census);
    check.ok &= out.busiest_window <= out.window_limit && out.starts >= created;
    check.detail = format!(
        "{}; busiest 1 s window={} (at most {}); starts found={} ({})",
        check.detail, out.busiest_window, out.window_limit, out.starts, out.source
    );
    Ok((out, check))
}

/// The key-isolation phase.
pub async fn key_isolation(
    ctx: &Ctx<'_>,
    direct: &mut Direct,
) -> anyhow::Result<(KeyIsolation, Check)> {
    let args = ctx.args;
    let concurrency = args.key_isolation_concurrency.max(1);
    let exec_ms = args.key_isolation_exec_ms.max(1);
    let a_count = args.key_isolation_backlog.max(1);
    let b_count = args.key_isolation_samples.max(1);
    let b_rate = args.key_isolation_rate.max(0.1);
    direct.reset().await?;
    let t = tenant("keyed")?;
    let mut out = KeyIsolation {
        supported: true,
        note: None,
        tenant: t.to_string(),
        worker: format!("one `sluice worker --demo-flows --concurrency {concurrency}`"),
        key_limit: ISOLATION_KEY_LIMIT,
        a_admitted: 0,
        a_exec_ms: exec_ms,
        b_rate,
        b_admitted: 0,
        errors: 0,
        b_pickup: pickup_of(std::iter::empty(), 0),
        b_not_started: 0,
        a_started: 0,
        a_completed: 0,
        a_per_sec: 0.0,
        a_most_at_once: 0,
    };
    let want = json!(ISOLATION_KEY_LIMIT);
    let (status, answer) = put_tenant(
        ctx.addr,
        ctx.admin_token,
        &t,
        &json!({"max_concurrent_per_key": want, "max_concurrent": 1000, "max_queued": 1_000_000}),
    )
    .await?;
    if let Err(note) = setting_taken(status, &answer, "max_concurrent_per_key", &want) {
        let note = format!("unsupported: {note}");
        eprintln!("[key isolation] {note}");
        let check = Check {
            phase: "key isolation".into(),
            ok: status == 400,
            detail: format!(
                "`max_concurrent_per_key` refused with {status} (expected 400 on a build \
                 without concurrency keys)"
            ),
        };
        return Ok((
            KeyIsolation {
                supported: false,
                note: Some(note),
                ..out
            },
            check,
        ));
    }
    let extra = vec!["--concurrency".to_owned(), concurrency.to_string()];
    let settle = Duration::from_millis(args.pickup_settle_ms);
    let workers = push::start_workers(ctx, "keys-worker", 1, &extra, settle).await?;

    // Key A, as fast as the API takes it: it runs one at a time from the first admission on.
    let jobs = (0..a_count)
        .map(|n| {
            (
                t.to_string(),
                format!(
                    r#"{{"flow_id":"demo.sleep","params":{{"ms":{exec_ms},"n":{n}}},"concurrency_key":"A"}}"#
                ),
            )
        })
        .collect();
    let answers = admit_all(ctx.addr, ctx.admin_token, jobs, ADMIT_CONNECTIONS, "key A").await?;
    let a_ids: HashSet<String> = answers
        .iter()
        .filter(|a| a.status == 201)
        .filter_map(|a| a.id().map(str::to_owned))
        .collect();

    // Key B, open loop at its rate (each request sent at its scheduled time, or at once when
    // the previous answer came late).
    eprintln!("[key B] {b_count} executions at {b_rate}/s beside key A's queue (tenant {t})");
    let mut conn = Conn::connect(ctx.addr).await?;
    let start = tokio::time::Instant::now();
    let mut b_ids = HashSet::new();
    let mut b_errors = 0u64;
    for k in 0..b_count {
        tokio::time::sleep_until(start + Duration::from_secs_f64(k as f64 / b_rate)).await;
        let body =
            format!(r#"{{"flow_id":"demo.echo","params":{{"n":{k}}},"concurrency_key":"B"}}"#);
        let answer = conn
            .call(
                hyper::Method::POST,
                "/api/executions",
                ctx.admin_token,
                t.as_str(),
                &body,
            )
            .await;
        let id = match answer {
            Ok((201, bytes)) => serde_json::from_slice::<Value>(&bytes)
                .ok()
                .and_then(|v| v["execution_id"].as_str().map(str::to_owned)),
            _ => None,
        };
        match id {
            Some(id) => {
                b_ids.insert(id);
            }
            None => b_errors += 1,
        }
    }

    // Until every B sample has started (at most 30 s); A's queue is not waited for.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let rows = direct.row_times().await?;
        let started = rows
            .iter()
            .filter(|r| r.started.is_some() && b_ids.contains(&r.id))
            .count();
        if started >= b_ids.len() || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Stopped first, so that the rows read next are A's progress at one moment.
    push::stop_workers(workers).await?;
    let now = direct.redis_now_ms().await?;
    let rows = direct.row_times().await?;

    let b_rows: Vec<_> = rows.iter().filter(|r| b_ids.contains(&r.id)).collect();
    out.b_pickup = pickup_of(b_rows.iter().copied(), now);
    let b_started = b_rows.iter().filter(|r| r.started.is_some()).count() as u64;
    out.b_admitted = b_ids.len() as u64;
    out.b_not_started = out.b_admitted - b_started;
    let a_rows: Vec<_> = rows.iter().filter(|r| a_ids.contains(&r.id)).collect();
    let a_runs: Vec<(u64, Option<u64>)> = a_rows
        .iter()
        .filter_map(|r| r.started.map(|s| (s, r.finished)))
        .collect();
    out.a_admitted = a_ids.len() as u64;
    out.a_started = a_runs.len() as u64;
    out.a_completed = a_rows.iter().filter(|r| r.status == "completed").count() as u64;
    let first = a_runs.iter().map(|r| r.0).min().unwrap_or(0);
    let last = a_runs.iter().filter_map(|r| r.1).max().unwrap_or(first);
    out.a_per_sec =
        round2(out.a_completed as f64 * 1000.0 / last.saturating_sub(first).max(1) as f64);
    out.a_most_at_once = most_at_once(&a_runs);
    out.errors = (a_count - out.a_admitted) + b_errors;

    let census = direct.census(false).await?;
    let admitted = out.a_admitted + out.b_admitted;
    let found = (a_rows.len() + b_rows.len()) as u64;
    let ok = out.errors == 0
        && census.rows == admitted
        && found == admitted
        && out.b_not_started == 0
        && out.a_most_at_once <= u64::from(ISOLATION_KEY_LIMIT)
        && census.dead_letters == 0;
    let check = Check {
        phase: "key isolation".into(),
        ok,
        detail: format!(
            "2xx A={} B={} non-2xx={}; rows={} (of them A's and B's {found}); B started={}/{}; \
             A started={} completed={} most running at once={} (limit {}); dead letters={}",
            out.a_admitted,
            out.b_admitted,
            out.errors,
            census.rows,
            b_started,
            out.b_admitted,
            out.a_started,
            out.a_completed,
            out.a_most_at_once,
            ISOLATION_KEY_LIMIT,
            census.dead_letters
        ),
    };
    Ok((out, check))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busiest_window_is_half_open() {
        // 0, 999 and 1000: [0, 1000) holds two, [999, 1999) two, never three.
        assert_eq!(busiest_window(&[0, 999, 1000], 1000), 2);
        assert_eq!(busiest_window(&[0, 0, 0, 500, 2000], 1000), 4);
        assert_eq!(busiest_window(&[], 1000), 0);
    }

    #[test]
    fn the_steady_rate_counts_intervals_after_the_burst() {
        // A burst of 3 at 0, then one every 5 ms: 200/s.
        let mut times = vec![0, 0, 0];
        times.extend((1..=100).map(|i| i * 5));
        assert_eq!(steady_rate(&times, 3), Some(200.0));
        assert_eq!(steady_rate(&[0, 0, 0], 3), None);
    }

    #[test]
    fn a_hand_over_in_the_same_millisecond_is_no_overlap() {
        assert_eq!(
            most_at_once(&[(0, Some(50)), (50, Some(100)), (100, None)]),
            1
        );
        assert_eq!(most_at_once(&[(0, Some(50)), (49, Some(100))]), 2);
        // One still running (killed with the worker) and another started after it: overlap.
        assert_eq!(most_at_once(&[(0, None), (60, Some(70))]), 2);
    }

    #[test]
    fn a_setting_is_taken_only_when_the_answer_shows_it() {
        let limit = json!({"starts": 200, "per": "1s", "burst": 20});
        assert!(setting_taken(200, &json!({ "rate_limit": limit }), "rate_limit", &limit).is_ok());
        assert!(setting_taken(200, &json!({"weight": 1}), "rate_limit", &limit).is_err());
        assert!(
            setting_taken(
                400,
                &json!({"detail": "unknown field `rate_limit`"}),
                "rate_limit",
                &limit
            )
            .is_err()
        );
    }
}
