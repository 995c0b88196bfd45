//! `sluice-bench`: the benchmark of sluice's speed targets, measured in one run on loopback.
//!
//! It starts its own `redis-server` (no persistence) — or, with `--cluster`, a local Redis
//! Cluster of `--cluster-masters` masters — and `sluice serve` (and, for the end-to-end phase,
//! `sluice worker` processes) from the `sluice` binary next to its own, then runs these phases,
//! each from an empty Redis and each bounded in time:
//!
//! 1. **ceiling**: `admit.lua` called directly (sluice's `Store::admit`), 64 in flight;
//! 2. **admission**: `POST /api/executions` over 64 keep-alive connections, unique keys;
//! 3. **replay mix**: the same with 10 % replays of earlier keys;
//! 4. **fixed rate**: open loop at 50 % of the admission maximum, latency from the schedule;
//! 5. **end-to-end**: `demo.echo` admitted over HTTP and completed by workers; then again
//!    completed by pull workers over HTTP (`--pull-workers` in this process, `/api/worker/*`);
//!    right after the first, the same load shape against the **BullMQ peer** (`bullmq.rs`: its
//!    HTTP front adding jobs with the dedup key as `jobId`, a `Worker` per queue with a no-op
//!    processor in as many processes as sluice has workers, the same concurrency in all), on a
//!    Redis of its own; both with each process's CPU per execution and Redis calls per execution;
//! 6. **memory**: Redis `used_memory` per queued execution at 100k executions;
//!
//! and the wake-up phases (`push.rs`), each with sluice's DEFAULT worker
//! settings so they measure whatever pickup and cancel the worker in the tree has:
//!
//! 7. **pickup**: one default worker, `demo.echo` admitted at an idle rate, a fixed rate and
//!    50 % of the admission maximum; row `started` − `created`; and the **BullMQ peer**
//!    (`bullmq.rs`, `bench/bullmq/`) at the same rates on a Redis of its own, side by side;
//! 8. **cancel**: running `demo.sleep` executions cancelled, until their rows are `cancelled`;
//! 9. **idle**: the calls an idle default worker sends to Redis (`serve` stopped).
//!
//! `--push-only` runs only 7–9; `--skip-pickup`, `--skip-bullmq`, `--skip-cancel`,
//! `--skip-idle` leave one out. Then the fairness group (`fairness.rs`, issue 20):
//!
//! 10. **noisy neighbour**: a flood tenant keeps one worker of concurrency 8 busy for 30 s
//!     while a calm tenant of the same shard admits 4/s; both tenants' pickup, and the BullMQ
//!     peer's single queue in the same run beside it;
//! 11. **weighted share**: two backlogged tenants of weights 1 and 3, their shares of the first
//!     2,000 starts (the shard's start log);
//! 12. **scheduled-start lateness**: executions admitted with `delay`, started − due.
//!
//! `--fairness-only` runs only 10–12, `--skip-fairness` leaves them out. Then the limits group
//! (`limits.rs`: concurrency keys and rate limits):
//!
//! 13. **throttle accuracy**: a tenant with `rate_limit` 200/s, burst 20, drains a backlog of
//!     2 000 with one worker; from the start log, the most starts in any second (at most rate +
//!     burst, a correctness check) and the steady rate after the burst (target ≥ 95 %);
//! 14. **key isolation**: key A of a tenant with `max_concurrent_per_key` 1 has 10 000 queued
//!     `demo.sleep` executions, key B admits 10/s beside it: B's pickup, and A never more than
//!     one at a time.
//!
//! `--limits-only` runs only 13–14, `--skip-limits` leaves them out. Then the dead-letter
//! group (`dead_letters.rs`, issue 38):
//!
//! 15. **dead-letter listing**: a shard filled to its dead-letter cap by neighbour tenants;
//!     what `GET /api/dlq` of an empty tenant, of a tenant's page and of every tenant costs
//!     Redis per call, also with an older build's marker and after the rebuild a new `serve`
//!     makes at start.
//!
//! Then the batch-memory phase (`batch_memory.rs`, issue 38):
//!
//! 16. **batch memory**: on a `serve` of its own, four tenants send a batch body at
//!     `--batch-body-limit` each at once (eight million tiny elements; 1,000 items of string
//!     params; 1,000 of number arrays; one item of it all), round after round, while another
//!     tenant's `GET /api/me` and single admissions are timed: serve's peak RSS rise against
//!     4 × the limit, and the other tenant's p99s against 5 ms.
//!
//! `--dlq-only` runs only 15, `--skip-dlq` leaves it out; `--batch-memory-only` runs only 16,
//! `--skip-batch-memory` leaves it out; `--admission-keys N` gives
//! the admission phase (2) a `concurrency_key` on every request. `--compare-builds BEFORE
//! AFTER` runs none of the above: it measures two builds of `sluice` against each other
//! (`compare.rs`: HTTP admission and end-to-end, alternating runs, medians); `--compare-keyed`
//! neither: it measures HTTP admission on this build without and with concurrency keys
//! (`limits.rs`: alternating runs, medians, keyed / plain).
//!
//! `--cost` runs none of the phases either: it measures what one execution costs Redis, sluice
//! beside its BullMQ peer (`cost/`: bytes by structure, Redis CPU, calls and callgrind
//! instructions per execution, the per-call overhead of a script), against issue 39's targets;
//! a `--smoke` run also runs it at tiny counts, without callgrind.
//!
//! After every phase it checks what Redis holds against what the clients were told; the
//! report says so and the exit status is non-zero when a check fails. On a cluster the report
//! adds each master's admissions/s and script CPU; `--compare-standalone` runs the standalone
//! and the cluster benchmark one after the other and prints both with a comparison table. It
//! is a program with a report, never part of `cargo test`; `--smoke` runs it for a few seconds
//! in CI so it cannot rot.

mod args;
mod batch_memory;
mod bullmq;
mod compare;
mod cost;
mod dead_letters;
mod direct;
mod e2e;
mod fairness;
mod harness;
mod limits;
mod load;
mod pickup;
mod procs;
mod push;
mod report;
mod run;
mod serve_cpu;

use std::process::ExitCode;

use clap::Parser;

use args::Args;
use report::{Comparison, Report};

/// Quotas high enough that admission never rejects: every execution is dispatched at once.
const UNLIMITED: u32 = 1_000_000_000;
/// The storage bounds (`max_bytes`, `max_retained`) no run reaches: 2^50.
const UNLIMITED_BYTES: u64 = 1 << 50;
/// The platform admin token of the benchmark's own server (loopback only, never exposed).
const ADMIN_TOKEN: &str = "sluice-bench-admin-token";

fn main() -> ExitCode {
    let args = Args::parse().smoke_sized();
    let runtime = if args.threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(args.threads)
            .enable_all()
            .build()
    };
    match runtime {
        Ok(rt) => rt.block_on(bench_main(args)),
        Err(e) => {
            eprintln!("sluice-bench: cannot start the runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn bench_main(args: Args) -> ExitCode {
    // Returning from `run` (or dropping it here on a signal) kills every child process.
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("sluice-bench: cannot watch SIGTERM: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = tokio::select! {
        r = run_all(args.clone()) => r,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
        _ = term.recv() => Err(anyhow::anyhow!("terminated")),
    };
    let passed = |r: &Report| r.correct && (!args.strict || r.targets_met);
    match result {
        Ok(reports) => {
            let (text, ok) = match &reports {
                Outcome::One(report) => (
                    if args.json {
                        serde_json::to_string_pretty(report).map(|t| t + "\n")
                    } else {
                        Ok(report.human())
                    },
                    passed(report),
                ),
                Outcome::Compared(c) => (
                    if args.json {
                        serde_json::to_string_pretty(c).map(|t| t + "\n")
                    } else {
                        Ok(c.human())
                    },
                    passed(&c.standalone) && passed(&c.cluster),
                ),
                Outcome::Builds(c) => (
                    if args.json {
                        serde_json::to_string_pretty(c).map(|t| t + "\n")
                    } else {
                        Ok(c.human())
                    },
                    c.correct,
                ),
                Outcome::Cost(c) => (
                    if args.json {
                        serde_json::to_string_pretty(c).map(|t| t + "\n")
                    } else {
                        Ok(c.human())
                    },
                    c.correct && (!args.strict || c.targets_met),
                ),
                Outcome::WithCost(r, c) => (
                    if args.json {
                        serde_json::to_string_pretty(&serde_json::json!({
                            "report": r,
                            "cost": c,
                        }))
                        .map(|t| t + "\n")
                    } else {
                        Ok(r.human() + &c.human())
                    },
                    passed(r) && c.correct && (!args.strict || c.targets_met),
                ),
                Outcome::ServeCpu(c) => (
                    if args.json {
                        serde_json::to_string_pretty(c).map(|t| t + "\n")
                    } else {
                        Ok(c.human())
                    },
                    c.correct,
                ),
                Outcome::Keyed(c) => (
                    if args.json {
                        serde_json::to_string_pretty(c).map(|t| t + "\n")
                    } else {
                        Ok(c.human())
                    },
                    c.correct && (!args.strict || c.target.pass),
                ),
            };
            match text {
                Ok(text) => print!("{text}"),
                Err(e) => {
                    eprintln!("sluice-bench: {e}");
                    return ExitCode::FAILURE;
                }
            }
            if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("sluice-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// One report, or a standalone and a cluster one (`--compare-standalone`), or two builds
/// (`--compare-builds`), or admission without and with keys (`--compare-keyed`), or the cost
/// per execution (`--cost`, and after a smoke run's report).
enum Outcome {
    One(Box<Report>),
    Compared(Box<Comparison>),
    Builds(Box<compare::BuildComparison>),
    Keyed(Box<limits::KeyedComparison>),
    /// `--cost`: what an execution costs Redis, beside BullMQ.
    Cost(Box<cost::CostReport>),
    /// A smoke run: the phases, then the cost measurement at tiny counts.
    WithCost(Box<Report>, Box<cost::CostReport>),
    /// `--serve-cpu`: serve's own CPU per HTTP admission.
    ServeCpu(Box<serve_cpu::ServeCpuReport>),
}

/// The run the flags ask for: one, or standalone then cluster, or two builds, or plain and
/// keyed admission.
async fn run_all(args: Args) -> anyhow::Result<Outcome> {
    if let Some(builds) = &args.compare_builds {
        return Ok(Outcome::Builds(Box::new(
            compare::compare(&args, builds).await?,
        )));
    }
    if args.compare_keyed {
        return Ok(Outcome::Keyed(Box::new(
            limits::compare_keyed(&args).await?,
        )));
    }
    if args.cost {
        return Ok(Outcome::Cost(Box::new(cost::run(&args).await?)));
    }
    if let Some(builds) = &args.serve_cpu {
        return Ok(Outcome::ServeCpu(Box::new(
            serve_cpu::run(&args, builds).await?,
        )));
    }
    if !args.compare_standalone {
        // The smoke run also covers the cost measurement (tiny counts, no callgrind), so it
        // cannot rot; not beside a group run alone or on a cluster (it starts its own).
        let with_cost = args.smoke
            && !args.cluster
            && !args.push_only
            && !args.fairness_only
            && !args.limits_only;
        let report = run::run(args.clone()).await?;
        if with_cost {
            let cost = cost::run(&args).await?;
            return Ok(Outcome::WithCost(Box::new(report), Box::new(cost)));
        }
        return Ok(Outcome::One(Box::new(report)));
    }
    eprintln!(
        "sluice-bench: standalone first, then a cluster of {} masters",
        args.cluster_masters
    );
    let standalone = run::run(Args {
        cluster: false,
        ..args.clone()
    })
    .await?;
    let cluster = run::run(Args {
        cluster: true,
        ..args
    })
    .await?;
    Ok(Outcome::Compared(Box::new(Comparison {
        standalone,
        cluster,
    })))
}
