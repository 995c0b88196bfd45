//! The fault injector: two lanes, one for the workers and one for `serve` and Redis, each
//! inflicting one fault at a time (SIGSTOP then SIGCONT, or SIGKILL and a restart), and the
//! record of what they did (`Fault`), which the checker and the report read. Separate from the
//! processes (`deployment.rs`): this decides what happens to them and when, from the seed and
//! from what the journal shows running.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex as AsyncMutex;
use tokio_util::sync::CancellationToken;

use super::deployment::{Deployment, signal, wait_redis, wait_serve};
use super::journal::read_journal;
use super::load::{Api, Clients};
use super::{LEASE_TTL_MS, MAX_PAUSE_MS, Rng, now_ms};

/// What a fault lane did to a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum FaultKind {
    PauseWorker,
    KillWorker,
    PauseServe,
    KillServe,
    PauseRedis,
    KillRedis,
}

/// One injected fault, for the report and the checker.
#[derive(Debug, Clone)]
pub(super) struct Fault {
    pub(super) kind: FaultKind,
    pub(super) target: String,
    pub(super) pid: u32,
    pub(super) from: u64,
    pub(super) to: u64,
}

/// Sleeps `ms` unless `stop` fires first; whether the whole sleep happened.
async fn nap(stop: &CancellationToken, ms: u64) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(Duration::from_millis(ms)) => true,
        _ = stop.cancelled() => false,
    }
}

/// Workers in the middle of a run with at least `LEASE_TTL_MS + 1100` ms of its sleep left
/// (the journal says what runs where, the clients what each execution sleeps): paused past
/// its lease but not past the run, such a worker wakes up as a zombie whose run another worker
/// has taken over meanwhile — the case fences exist for. Pids and the time left.
fn mid_run_workers(journal: &Path, cs: &Clients) -> Vec<(u32, u64)> {
    let journal = read_journal(journal);
    let now = now_ms();
    let plans = cs.plans.lock().expect("plans");
    journal
        .runs
        .iter()
        .filter(|r| r.end.is_none())
        .filter_map(|r| {
            let left = (r.start + plans.get(&r.id)?.ms).checked_sub(now)?;
            (left >= LEASE_TTL_MS + 1_100).then_some((r.pid, left))
        })
        .collect()
}

/// The workers' fault lane: one worker at a time paused (half the time past its lease; often
/// one caught in the middle of a long run) or killed and replaced. Every turn draws the same
/// random numbers, so the schedule of a seed does not depend on what the journal shows.
pub(super) async fn worker_faults(
    deployment: Arc<AsyncMutex<Deployment>>,
    cs: Arc<Clients>,
    mut rng: Rng,
    stop: CancellationToken,
) {
    for _ in 0..100_000 {
        let gap = rng.between(300, 2_500);
        let (aim, aim_at, aim_len) = (rng.percent(40), rng.next(), rng.next());
        let (any, pause_it) = (rng.next(), rng.percent(50));
        let short_ms = rng.between(200, LEASE_TTL_MS);
        let long_ms = rng.between(LEASE_TTL_MS + 200, MAX_PAUSE_MS);
        let long = rng.percent(50);
        if !nap(&stop, gap).await {
            return;
        }
        let mut c = deployment.lock().await;
        c.ensure_running();
        let mut i = (any % c.workers.len() as u64) as usize;
        let mut pause = None;
        let mid_run = if aim {
            mid_run_workers(&c.at.journal, &cs)
        } else {
            Vec::new()
        };
        if !mid_run.is_empty() {
            let (pid, left) = mid_run[(aim_at % mid_run.len() as u64) as usize];
            if let Some(n) = c.workers.iter().position(|w| w.pid() == pid) {
                i = n;
                // Past the lease, and at least 400 ms short of the run's end.
                let lo = LEASE_TTL_MS + 200;
                pause = Some(lo + aim_len % (left - 400 - lo + 1));
            }
        }
        let (pid, target) = (c.workers[i].pid(), c.workers[i].name.clone());
        if pause.is_some() || pause_it {
            let ms = pause.unwrap_or(if long { long_ms } else { short_ms });
            let from = now_ms();
            signal(pid, "STOP");
            drop(c);
            nap(&stop, ms).await;
            signal(pid, "CONT");
            let to = now_ms();
            deployment.lock().await.faults.push(Fault {
                kind: FaultKind::PauseWorker,
                target,
                pid,
                from,
                to,
            });
        } else {
            let from = now_ms();
            c.workers[i].kill9();
            let dead = now_ms();
            c.gone.insert(pid, dead);
            c.workers[i] = c.spawn_worker();
            c.faults.push(Fault {
                kind: FaultKind::KillWorker,
                target,
                pid,
                from,
                to: dead,
            });
        }
    }
}

/// The infrastructure's fault lane: `serve` or Redis paused (Redis sometimes past the
/// workers' lease), or killed and restarted on the same port (Redis from its AOF).
pub(super) async fn infra_faults(
    deployment: Arc<AsyncMutex<Deployment>>,
    api: Api,
    mut rng: Rng,
    stop: CancellationToken,
) {
    for _ in 0..100_000 {
        if !nap(&stop, rng.between(500, 3_000)).await {
            return;
        }
        let roll = rng.below(100);
        let mut c = deployment.lock().await;
        c.ensure_running();
        let redis_url = c.at.redis_url();
        let (kind, pid) = match roll {
            0..30 => (FaultKind::PauseServe, c.serve.pid()),
            30..45 => (FaultKind::KillServe, c.serve.pid()),
            45..80 => (FaultKind::PauseRedis, c.redis.pid()),
            _ => (FaultKind::KillRedis, c.redis.pid()),
        };
        let from = now_ms();
        match kind {
            FaultKind::PauseServe | FaultKind::PauseRedis => {
                let ms = if kind == FaultKind::PauseRedis && rng.percent(35) {
                    rng.between(LEASE_TTL_MS + 200, MAX_PAUSE_MS - 500)
                } else {
                    rng.between(300, 3_000)
                };
                signal(pid, "STOP");
                drop(c);
                nap(&stop, ms).await;
                signal(pid, "CONT");
                c = deployment.lock().await;
            }
            FaultKind::KillServe => {
                c.serve.kill9();
                c.serve = c.at.spawn_serve();
                drop(c);
                wait_serve(&api, Duration::from_secs(15)).await;
                c = deployment.lock().await;
            }
            FaultKind::KillRedis => {
                c.redis.kill9();
                c.redis = c.at.spawn_redis();
                drop(c);
                wait_redis(&redis_url, Duration::from_secs(15)).await;
                c = deployment.lock().await;
            }
            FaultKind::PauseWorker | FaultKind::KillWorker => unreachable!("worker lane"),
        }
        let target = match kind {
            FaultKind::PauseServe | FaultKind::KillServe => "serve",
            _ => "redis",
        };
        c.faults.push(Fault {
            kind,
            target: target.into(),
            pid,
            from,
            to: now_ms(),
        });
    }
}
