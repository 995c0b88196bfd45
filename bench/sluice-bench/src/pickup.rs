//! The pickup phase's driver: sluice's default worker at each rate (`push::pickup_rate`), then
//! the BullMQ peer at the same rates (`bullmq::run`), side by side in the report.

use std::time::Duration;

use crate::direct::Direct;
use crate::harness::{Pids, phase};
use crate::load::{self, Workload};
use crate::report::{Check, Pickup, PickupRate, Report};
use crate::{bullmq, push};

/// The pickup phase: sluice at each rate (`push::pickup_rate`), then the BullMQ
/// peer at the same rates (`bullmq::run`), side by side in the report. The third rate is a
/// share of the HTTP admission maximum: the admission phase's, or a short probe's when that
/// phase was skipped.
pub(crate) async fn pickup_phase(
    ctx: &push::Ctx<'_>,
    direct: &mut Direct,
    report: &mut Report,
) -> anyhow::Result<()> {
    let args = ctx.args;
    let mut plan: Vec<(String, f64, f64)> = vec![(
        "idle".into(),
        args.pickup_idle_rate.max(0.1),
        args.pickup_idle_secs,
    )];
    if args.pickup_rate > 0.0 {
        plan.push(("fixed".into(), args.pickup_rate, args.pickup_secs));
    }
    let mut max_source = "no rate as a share of the maximum (--pickup-max-share 0)".to_owned();
    if args.pickup_max_share > 0.0 {
        let (max, source) = match &report.admission {
            Some(a) => (a.per_sec, "measured by the admission phase of this run"),
            None => {
                direct.reset().await?;
                let w = Workload {
                    addr: ctx.addr,
                    admin_token: ctx.admin_token.into(),
                    tenants: ctx.tenants.to_vec(),
                    tag: "probe".into(),
                    flow: "demo.echo".into(),
                    keys: 0,
                    tokens: Vec::new(),
                };
                let pids = Pids::of(&ctx.others);
                let (r, _) = phase("admission probe", &pids, |p| {
                    load::closed_loop(
                        &w,
                        args.clients.max(1),
                        Duration::from_secs(args.pickup_probe_secs),
                        0,
                        p,
                    )
                })
                .await?;
                (
                    r.outcomes.created as f64 / r.elapsed.as_secs_f64().max(1e-3),
                    "probed: the admission phase was skipped",
                )
            }
        };
        let mut rate = (max * args.pickup_max_share).round().max(1.0);
        if args.smoke {
            rate = rate.min(100.0);
        }
        let share = args.pickup_max_share * 100.0;
        plan.push((format!("{share:.0} % of max"), rate, args.pickup_secs));
        max_source = format!("{share:.0} % of the HTTP admission maximum {max:.0}/s, {source}");
    }
    let mut rates = Vec::new();
    for (label, rate, secs) in &plan {
        let (side, check) = push::pickup_rate(ctx, direct, label, *rate, *secs).await?;
        report.checks.push(check);
        rates.push(PickupRate {
            label: label.clone(),
            rate: *rate,
            secs: *secs,
            sluice: side,
            bullmq: None,
        });
    }
    let (mut peer, mut peer_note) = (None, None);
    if args.skip_bullmq {
        peer_note = Some("skipped (--skip-bullmq)".to_owned());
    } else {
        let asked: Vec<(f64, f64)> = plan.iter().map(|(_, r, s)| (*r, *s)).collect();
        match bullmq::run(args, ctx.scratch, &asked).await {
            Ok(run) => {
                for (r, side) in rates.iter_mut().zip(run.rates) {
                    r.bullmq = Some(side);
                }
                report.checks.push(run.check);
                peer = Some(run.versions);
            }
            Err(bullmq::NoPeer::Skipped(note)) => {
                eprintln!("sluice-bench: WARNING: BullMQ peer skipped: {note}");
                peer_note = Some(note);
            }
            Err(bullmq::NoPeer::Failed(e)) => {
                eprintln!("sluice-bench: the BullMQ peer failed: {e:#}");
                report.checks.push(Check {
                    phase: "bullmq peer".into(),
                    ok: false,
                    detail: format!("failed: {e:#}"),
                });
                peer_note = Some(format!("failed: {e:#}"));
            }
        }
    }
    let d = push::worker_defaults();
    report.pickup = Some(Pickup {
        worker: format!(
            "one `sluice worker --demo-flows` with default settings (concurrency {}, safety \
             poll every {} ms){}",
            d.concurrency,
            d.scan_ms,
            if args.smoke {
                ", --heartbeat-ms 200 (smoke)"
            } else {
                ""
            }
        ),
        max_source,
        rates,
        peer,
        peer_note,
    });
    Ok(())
}
