//! One benchmark run: Redis (one server or a local cluster) and `sluice serve` started from
//! empty, then each phase the flags select in order, its numbers and checks added to the
//! report.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::direct::{Direct, Until};
use crate::harness::{
    Pids, check_queued, group_counts, phase, phase_report, redis_and, sluice_program, store_config,
    tenant_keys,
};
use crate::load::{self, LoadResult, Progress, Workload};
use crate::procs::{self, Scratch};
use crate::report::{Check, FixedRate, Master, Memory, MemoryPoint, Report};
use crate::{ADMIN_TOKEN, Args, UNLIMITED};
use crate::{bullmq, fairness, limits, push, report};

/// One run: starts Redis and `serve` from empty, runs the phases the flags select and returns
/// the finished report (every child process is killed when this returns or is dropped).
pub(crate) async fn run(args: Args) -> anyhow::Result<Report> {
    if cfg!(debug_assertions) && !args.smoke {
        eprintln!("sluice-bench: WARNING: a debug build; measure with --release");
    }
    let program = sluice_program(&args)?;
    let scratch = Scratch::create()?;
    let mut redis = if args.cluster {
        procs::start_cluster(&args.redis_server, &scratch, args.cluster_masters).await?
    } else {
        procs::start_redis(&args.redis_server, &scratch).await?
    };
    let target = redis.target();
    let cmd = crate::harness::sluice_cmd(&args, program, target.clone());
    let (mut serve, addr) =
        procs::start_serve(&cmd, &scratch, ADMIN_TOKEN, UNLIMITED, UNLIMITED).await?;
    let redis_pids: Vec<String> = redis
        .nodes
        .iter()
        .map(|n| n.pid().unwrap_or(0).to_string())
        .collect();
    eprintln!(
        "sluice-bench: redis at {target} (pid {}), sluice serve at http://{addr} (pid {})",
        redis_pids.join(", "),
        serve.pid().unwrap_or(0)
    );

    let tenants: Vec<String> = (0..args.tenants.max(1))
        .map(|i| format!("bench-t{i}"))
        .collect();
    let mut direct =
        Direct::connect(store_config(&args, target.clone()), &tenants, &redis.urls).await?;
    // Each master's address, for the per-master shares (none when standalone).
    let masters: Option<Vec<String>> = args.cluster.then(|| {
        redis
            .urls
            .iter()
            .map(|u| u.trim_start_matches("redis://").to_owned())
            .collect()
    });
    let masters = masters.as_deref();
    let workload = |tag: &str| Workload::echo(addr, &tenants, tag);
    let mut report = Report::new(&args);
    let pids = Pids::of(&redis_and(&redis, &serve));
    let clients = args.clients.max(1);

    let others = !args.batch_memory_only;
    if others && !args.push_only && !args.fairness_only && !args.limits_only && !args.dlq_only {
        // 1. Ceiling.
        direct.reset().await?;
        let (r, cpu) = phase("ceiling", &pids, |p| {
            direct.admit_loop(
                clients,
                Until::Elapsed(Duration::from_secs(args.ceiling_secs)),
                "ceiling",
                true,
                p,
            )
        })
        .await?;
        let script_us = direct.script_usec().await?;
        if masters.is_some() {
            report.masters = Some(
                direct
                    .layout()
                    .await?
                    .into_iter()
                    .map(|n| Master {
                        node: n.addr,
                        shards: n.shards,
                        tenants: n.tenants,
                    })
                    .collect(),
            );
        }
        let (check, census) = check_queued("ceiling", &r, &mut direct).await?;
        report.checks.push(check);
        report.ceiling = Some(phase_report(&r, cpu, &script_us, &census, masters));

        // 2. Admission, unique keys (with `--admission-keys`, each with a concurrency key).
        direct.reset().await?;
        let mut w = workload("adm");
        if let Some(keys) = args.admission_keys() {
            limits::set_key_limits(addr, ADMIN_TOKEN, &tenants, args.admission_key_limit).await?;
            w.keys = keys;
        }
        let grouped_before = group_counts(addr).await?;
        let (r, cpu) = phase("admission", &pids, |p| {
            load::closed_loop(&w, clients, Duration::from_secs(args.admission_secs), 0, p)
        })
        .await?;
        let grouped_after = group_counts(addr).await?;
        report.admission_calls = Some(report::AdmissionCalls {
            calls: grouped_after.0.saturating_sub(grouped_before.0),
            admissions: grouped_after.1.saturating_sub(grouped_before.1),
        });
        let script_us = direct.script_usec().await?;
        let (check, census) = check_queued("admission", &r, &mut direct).await?;
        report.checks.push(check);
        report.admission = Some(phase_report(&r, cpu, &script_us, &census, masters));

        // 2a. The same load against the BullMQ HTTP peer (its own Redis), in this run.
        if args.skip_bullmq {
            report.admission_peer_note = Some("skipped (--skip-bullmq)".into());
        } else {
            let w = workload("peer");
            match bullmq::http_admission(&args, &scratch, &w, clients, args.admission_secs).await {
                Ok(p) => {
                    report.checks.push(p.check);
                    report.admission_peer = Some(report::PeerAdmission {
                        versions: p.versions,
                        phase: report::Phase::from(&p.load, Vec::new(), 0),
                    });
                }
                Err(bullmq::NoPeer::Skipped(note)) => {
                    eprintln!("sluice-bench: WARNING: BullMQ HTTP peer skipped: {note}");
                    report.admission_peer_note = Some(note);
                }
                Err(bullmq::NoPeer::Failed(e)) => {
                    eprintln!("sluice-bench: the BullMQ HTTP peer failed: {e:#}");
                    report.checks.push(Check {
                        phase: "admission, BullMQ peer".into(),
                        ok: false,
                        detail: format!("failed: {e:#}"),
                    });
                    report.admission_peer_note = Some(format!("failed: {e:#}"));
                }
            }
        }

        // 2b. Admission with tenant API keys: what authentication costs the `{acl}` slot.
        if args.api_key_secs > 0 {
            direct.reset().await?;
            let mut w = workload("key");
            w.tokens = tenant_keys(addr, &tenants).await?;
            let before = direct.command_calls().await?;
            let (r, cpu) = phase("api-key admission", &pids, |p| {
                load::closed_loop(&w, clients, Duration::from_secs(args.api_key_secs), 0, p)
            })
            .await?;
            let after = direct.command_calls().await?;
            let script_us = direct.script_usec().await?;
            let (check, census) = check_queued("api-key admission", &r, &mut direct).await?;
            report.checks.push(check);
            // api_key_auth.lua's SISMEMBER: no other script sends one.
            let calls = |m: &std::collections::BTreeMap<String, u64>| {
                m.get("sismember").copied().unwrap_or(0)
            };
            let lookups = calls(&after).saturating_sub(calls(&before));
            report.api_key_admission = Some(report::ApiKeyAdmission {
                acl_lookups: lookups,
                acl_lookups_per_admission: lookups as f64 / r.outcomes.created.max(1) as f64,
                phase: phase_report(&r, cpu, &script_us, &census, masters),
            });
        }

        // 3. Admission with replays.
        direct.reset().await?;
        let w = workload("mix");
        let (r, cpu) = phase("replay-mix", &pids, |p| {
            load::closed_loop(
                &w,
                clients,
                Duration::from_secs(args.replay_secs),
                args.replay_percent,
                p,
            )
        })
        .await?;
        let script_us = direct.script_usec().await?;
        let (check, census) = check_queued("replay mix", &r, &mut direct).await?;
        report.checks.push(check);
        report.replay_mix = Some(phase_report(&r, cpu, &script_us, &census, masters));
        serve.ensure_running()?;

        // 4. Fixed rate: open loop at a share of the measured admission maximum.
        direct.reset().await?;
        let max = report.admission.as_ref().map(|a| a.per_sec).unwrap_or(0.0);
        let rate = (max * args.fixed_rate_share).max(10.0);
        let w = workload("fixed");
        let (r, cpu) = phase("fixed-rate", &pids, |p| {
            load::open_loop(
                &w,
                clients,
                rate,
                Duration::from_secs(args.fixed_rate_secs),
                p,
            )
        })
        .await?;
        let script_us = direct.script_usec().await?;
        let (check, census) = check_queued("fixed rate", &r, &mut direct).await?;
        report.checks.push(check);
        report.fixed_rate = Some(FixedRate {
            target_per_sec: rate,
            phase: phase_report(&r, cpu, &script_us, &census, masters),
        });

        // 4b. Batch admission: its rate, and the fixed-rate tenants' latency beside it.
        if args.batch_secs > 0 {
            direct.reset().await?;
            let mut w = workload("batch");
            w.tenants.truncate(4);
            let (r, cpu) = phase("batch admission", &pids, |p| {
                load::batch_loop(
                    &w,
                    args.batch_size as usize,
                    Duration::from_secs(args.batch_secs),
                    p,
                )
            })
            .await?;
            let script_us = direct.script_usec().await?;
            let (check, census) = check_queued("batch admission", &r, &mut direct).await?;
            report.checks.push(check);
            let alone = phase_report(&r, cpu, &script_us, &census, masters);

            // One tenant sends batches; the others admit one by one at the fixed rate.
            direct.reset().await?;
            let mut batcher = workload("beside-batch");
            batcher.tenants.truncate(1);
            let mut singles = workload("beside");
            singles.tenants.remove(0);
            let secs = Duration::from_secs(args.batch_secs);
            let batch_items_beside = std::sync::atomic::AtomicU64::new(0);
            let (r, cpu) = phase("singles beside a batch", &pids, |p| async {
                let (b, o) = tokio::join!(
                    load::batch_loop(
                        &batcher,
                        args.batch_size as usize,
                        secs,
                        Arc::new(Progress::default())
                    ),
                    load::open_loop(&singles, clients, rate, secs, p)
                );
                let (b, o) = (b?, o?);
                batch_items_beside.store(b.outcomes.created, Ordering::Relaxed);
                let mut outcomes = o.outcomes.clone();
                outcomes.created += b.outcomes.created;
                outcomes.errors += b.outcomes.errors;
                Ok(LoadResult {
                    outcomes,
                    latencies: o.latencies,
                    elapsed: o.elapsed,
                })
            })
            .await?;
            let script_us = direct.script_usec().await?;
            let (check, census) = check_queued("singles beside a batch", &r, &mut direct).await?;
            report.checks.push(check);
            let batched = batch_items_beside.load(Ordering::Relaxed);
            let mut beside = phase_report(&r, cpu, &script_us, &census, masters);
            beside.per_sec =
                (r.outcomes.created - batched) as f64 / r.elapsed.as_secs_f64().max(1e-3);
            report.batch = Some(report::BatchPhase {
                size: args.batch_size,
                tenants: w.tenants.len(),
                phase: alone,
                singles_rate: rate,
                singles_beside: beside,
                batch_items_beside: batched,
            });
        }

        // 5. End-to-end with workers, and 5a. the same load shape against the BullMQ peer
        // (HTTP add + Workers): `--e2e-rounds` rounds alternating A B, B A, ...; the report
        // keeps each side's median round.
        let mut sluice_rounds = Vec::new();
        let mut peer_rounds = Vec::new();
        let mut peer_on = !args.skip_bullmq;
        if args.skip_bullmq {
            report.e2e_peer_note = Some("skipped (--skip-bullmq)".into());
        }
        for round in 0..args.e2e_rounds.max(1) {
            let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
            for side in order {
                if side == 0 {
                    direct.reset().await?;
                    let (e2e, check) = crate::e2e::end_to_end(
                        &args,
                        &cmd,
                        &scratch,
                        &mut direct,
                        &workload(&format!("e2e-{round}")),
                        &redis_and(&redis, &serve),
                        masters,
                        None,
                    )
                    .await?;
                    report.checks.push(check);
                    sluice_rounds.push(e2e);
                    continue;
                }
                if !peer_on {
                    continue;
                }
                let w = workload(&format!("e2e-peer-{round}"));
                match bullmq::http_e2e(&args, &scratch, &w, clients).await {
                    Ok((p, check)) => {
                        report.checks.push(check);
                        peer_rounds.push(p);
                    }
                    Err(bullmq::NoPeer::Skipped(note)) => {
                        eprintln!("sluice-bench: WARNING: BullMQ end-to-end peer skipped: {note}");
                        report.e2e_peer_note = Some(note);
                        peer_on = false;
                    }
                    Err(bullmq::NoPeer::Failed(e)) => {
                        eprintln!("sluice-bench: the BullMQ end-to-end peer failed: {e:#}");
                        report.checks.push(Check {
                            phase: "end-to-end, BullMQ peer".into(),
                            ok: false,
                            detail: format!("failed: {e:#}"),
                        });
                        report.e2e_peer_note = Some(format!("failed: {e:#}"));
                        peer_on = false;
                    }
                }
            }
        }
        report.e2e_rounds = report::E2eRounds {
            sluice_per_sec: sluice_rounds.iter().map(|e| e.per_sec).collect(),
            peer_per_sec: peer_rounds.iter().map(|p| p.per_sec).collect(),
        };
        report.e2e = report::median_of(sluice_rounds, |e| e.per_sec);
        report.e2e_peer = report::median_of(peer_rounds, |p| p.per_sec);
        // 5b. The same through the pull API: HTTP workers beside the same server.
        if args.pull_workers > 0 {
            direct.reset().await?;
            let (e2e, check) = crate::e2e::end_to_end(
                &args,
                &cmd,
                &scratch,
                &mut direct,
                &workload("e2e-pull"),
                &redis_and(&redis, &serve),
                masters,
                Some(addr),
            )
            .await?;
            report.checks.push(check);
            report.e2e_pull = Some(e2e);
        }

        // 6. Memory per queued execution, with a dedup key each (as above) and without.
        let mut points = Vec::new();
        for dedup in [true, false] {
            direct.reset().await?;
            let before = direct.used_memory().await?;
            let name = if dedup { "memory" } else { "memory-no-key" };
            let (r, _) = phase(name, &pids, |p| {
                let until =
                    Until::Count(args.memory_count, Duration::from_secs(args.memory_max_secs));
                direct.admit_loop(clients, until, "mem", dedup, p)
            })
            .await?;
            let after = direct.used_memory().await?;
            report
                .checks
                .push(check_queued(name, &r, &mut direct).await?.0);
            let n = r.outcomes.created.max(1);
            let by_kind = direct
                .memory_by_kind()
                .await?
                .into_iter()
                .map(|(kind, bytes)| (kind, (bytes as f64 / n as f64).round()))
                .collect();
            points.push(MemoryPoint {
                by_kind,
                executions: r.outcomes.created,
                used_memory_before: before,
                used_memory_after: after,
                bytes_per_execution: after.saturating_sub(before) as f64
                    / r.outcomes.created.max(1) as f64,
            });
        }
        let without = points.pop();
        report.memory = points.pop().map(|with_key| Memory {
            state: "dispatched",
            with_dedup_key: with_key,
            without_dedup_key: without,
        });
    }

    // Issue 12's phases: default workers against the same server and Redis; the idle cost last,
    // with `serve` stopped so that only the worker's calls are counted.
    serve.ensure_running()?;
    redis.ensure_running()?;
    let ctx = push::Ctx {
        args: &args,
        cmd: &cmd,
        scratch: &scratch,
        addr,
        admin_token: ADMIN_TOKEN,
        tenants: &tenants,
        others: redis_and(&redis, &serve),
    };
    let push_phases = others && !args.fairness_only && !args.limits_only && !args.dlq_only;
    if push_phases && !args.skip_pickup {
        crate::pickup::pickup_phase(&ctx, &mut direct, &mut report).await?;
    }
    if push_phases && !args.skip_cancel {
        let (c, check) = push::cancel(&ctx, &mut direct).await?;
        report.checks.push(check);
        report.cancel = Some(c);
    }
    // Issue 20's fairness group, against the same server and Redis.
    if others && !args.push_only && !args.limits_only && !args.dlq_only && !args.skip_fairness {
        let mut f = report::Fairness::default();
        let (noisy, checks) = fairness::noisy(&ctx, &mut direct).await?;
        report.checks.extend(checks);
        f.noisy = Some(noisy);
        let (weighted, check) = fairness::weighted(&ctx, &mut direct).await?;
        report.checks.push(check);
        f.weighted = Some(weighted);
        let (lateness, check) = fairness::lateness(&ctx, &mut direct).await?;
        report.checks.push(check);
        f.lateness = Some(lateness);
        report.fairness = Some(f);
    }
    // The limits group (concurrency keys, rate limits), against the same server and Redis.
    if others && !args.push_only && !args.fairness_only && !args.dlq_only && !args.skip_limits {
        let mut l = report::Limits::default();
        let (throttle, check) = limits::throttle(&ctx, &mut direct).await?;
        report.checks.push(check);
        l.throttle = Some(throttle);
        let (isolation, check) = limits::key_isolation(&ctx, &mut direct).await?;
        report.checks.push(check);
        l.key_isolation = Some(isolation);
        report.limits = Some(l);
    }
    // The dead-letter group, against the same server and Redis.
    if others && !args.push_only && !args.fairness_only && !args.limits_only && !args.skip_dlq {
        let (d, check) = crate::dead_letters::listing(&ctx, &mut direct).await?;
        report.checks.push(check);
        report.dead_letters = Some(d);
    }
    // Issue 38's batch-memory phase, on a `serve` of its own beside the same Redis.
    let batch_memory_phase = args.batch_memory_only
        || (!args.push_only
            && !args.fairness_only
            && !args.limits_only
            && !args.dlq_only
            && !args.skip_batch_memory);
    if batch_memory_phase {
        let (m, check) = crate::batch_memory::batch_memory(&ctx, &mut direct).await?;
        report.checks.push(check);
        report.batch_memory = Some(m);
    }
    serve.ensure_running()?;
    serve.kill().await;
    if push_phases && !args.skip_idle {
        let ctx = push::Ctx {
            args: &args,
            cmd: &cmd,
            scratch: &scratch,
            addr,
            admin_token: ADMIN_TOKEN,
            tenants: &tenants,
            others: redis.nodes.iter().collect(),
        };
        let (i, check) = push::idle(&ctx, &mut direct).await?;
        report.checks.push(check);
        report.idle = Some(i);
    }
    redis.ensure_running()?;
    redis.kill().await;
    report.finish();
    Ok(report)
}
