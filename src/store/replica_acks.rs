//! `--redis-replica-acks`: the bookkeeping that lets a connection wait for replicas to hold
//! a script's writes without letting a missing replica block every call on it. Apart from
//! `conn.rs` because it is a policy with its own state and rules (who is short of replicas,
//! when to ask again), which the connection only consults around each script call.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::cluster_routing::Route;
use redis::{Arg, Cmd};

/// `--redis-replica-acks`: how many replicas must hold a script's writes before its answer is
/// returned, and what happens when they do not say so in time.
///
/// WAIT blocks the whole (multiplexed) connection on Redis until it returns, so a master with
/// too few replicas (a replica down, or a promoted replica that has none yet) would hold every
/// call on that connection for the WAIT time-out. Instead, when WAIT comes back short, the
/// answer is returned anyway (replication falls back to asynchronous, as without the setting)
/// and a warning is logged; that slot's calls then skip WAIT, and at most once per probe
/// interval one of them asks the master how many replicas acknowledge its stream (`INFO
/// replication`, which does not block): once enough are back, WAIT resumes.
///
/// A replica counts only if it is `online` *and* acknowledged the master within the last
/// second (`lag` ≤ 1; replicas acknowledge every second): a frozen replica (SIGSTOP, a stuck
/// VM) stays `online` until the master's `repl-timeout` (60 s by default) while it
/// acknowledges nothing, and counting it re-enabled a WAIT that blocked the connection every
/// probe. A master whose replicas fall short again within `RELAPSE_WINDOW` of coming back has
/// its probe interval doubled (from `PROBE_EVERY` up to `PROBE_MAX`), so a flapping replica
/// costs one blocked WAIT per interval at most.
///
/// To refuse writes while replicas are missing instead, use Redis's own
/// `min-replicas-to-write` (a script then fails before it writes, and the caller gets a 503).
///
/// Shared by the clones of a connection and by the connections opened together.
#[derive(Clone)]
pub struct ReplicaAcks {
    pub(super) replicas: u32,
    /// WAIT's own time-out (a quarter of the operation's bound).
    wait: Duration,
    /// Slots (their masters; `None` standalone) whose WAIT came back short, when their master
    /// is next asked for its replicas, and how often it is asked.
    short: Arc<Mutex<HashMap<Option<Route>, Probing>>>,
    /// Masters whose replicas came back: when, and the probe interval they had then (a relapse
    /// soon after doubles it).
    back: Arc<Mutex<HashMap<Option<Route>, Back>>>,
    /// Script answers returned without the wanted acknowledgements (WAIT came back short, or
    /// was skipped while their master was short of replicas): writes a failover may lose.
    unconfirmed: Arc<AtomicU64>,
}

/// When a master's replicas came back, and the probe interval it had until then.
type Back = (Instant, Duration);

/// A master that fell short of replicas: when it is next asked, and how often.
#[derive(Clone, Copy)]
struct Probing {
    next: Instant,
    every: Duration,
}

/// How often a master whose replicas fell short is asked whether they are back, at first.
const PROBE_EVERY: Duration = Duration::from_millis(500);
/// The longest probe interval a relapsing master gets.
const PROBE_MAX: Duration = Duration::from_secs(8);
/// Replicas that fall short again this soon after coming back count as a relapse.
const RELAPSE_WINDOW: Duration = Duration::from_secs(30);
/// Most seconds since a replica's last acknowledgement for it to count as acknowledging.
const MAX_LAG_SECS: u64 = 1;

/// Whether a slot's master fell short of replicas.
pub(super) enum Short {
    /// No (as far as is known): WAIT.
    No,
    /// Yes: skip WAIT.
    Yes,
    /// Yes, and it is time to ask again.
    Probe,
}

impl ReplicaAcks {
    pub(super) fn new(replicas: u32, op_timeout: Duration) -> Self {
        Self {
            replicas,
            wait: (op_timeout / 4).max(Duration::from_millis(1)),
            short: Arc::default(),
            back: Arc::default(),
            unconfirmed: Arc::default(),
        }
    }

    /// WAIT's time-out argument (never 0, which would wait forever).
    pub(super) fn wait_ms(&self) -> u64 {
        (self.wait.as_millis() as u64).max(1)
    }

    /// Counts one script answer returned without the acknowledgements it wanted.
    pub(super) fn unconfirmed(&self) {
        self.unconfirmed.fetch_add(1, Ordering::Relaxed);
    }

    /// Script answers returned so far without the acknowledgements they wanted (`/metrics`).
    pub(super) fn unconfirmed_count(&self) -> u64 {
        self.unconfirmed.load(Ordering::Relaxed)
    }

    /// Whether calls on `route` skip WAIT for now; a `Probe` answer is given to one caller per
    /// `PROBE_EVERY`.
    pub(super) fn state(&self, route: Option<Route>) -> Short {
        let mut short = self.short.lock().unwrap_or_else(|e| e.into_inner());
        let Some(probing) = short.get_mut(&route) else {
            return Short::No;
        };
        let now = Instant::now();
        if now < probing.next {
            return Short::Yes;
        }
        probing.next = now + probing.every;
        Short::Probe
    }

    /// The master `route` leads to has enough replicas acknowledging again.
    pub(super) fn recovered(&self, route: Option<Route>) {
        let mut short = self.short.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(probing) = short.remove(&route) {
            drop(short);
            self.back
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(route, (Instant::now(), probing.every));
            tracing::info!(
                ?route,
                "replicas are back: waiting for their acknowledgements again"
            );
        }
    }

    /// Records that the master `route` leads to had only `got` replicas acknowledge
    /// `script`'s writes in time.
    pub(super) fn fell_short(&self, route: Option<Route>, script: &ScriptCall<'_>, got: i64) {
        let every = match self
            .back
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&route)
        {
            Some((at, every)) if at.elapsed() < RELAPSE_WINDOW => (*every * 2).min(PROBE_MAX),
            _ => PROBE_EVERY,
        };
        let mut short = self.short.lock().unwrap_or_else(|e| e.into_inner());
        let probing = Probing {
            next: Instant::now() + every,
            every,
        };
        let first = short.insert(route, probing).is_none();
        drop(short);
        if first {
            let key = script.first_key.map(String::from_utf8_lossy);
            tracing::warn!(
                key = key.as_deref().unwrap_or(""),
                acknowledged = got,
                wanted = self.replicas,
                wait_ms = self.wait_ms(),
                "fewer replicas than --redis-replica-acks acknowledged a write in time; \
                 answering without them on this key's slot until they are back (a crash of \
                 its master meanwhile may lose acknowledged writes)"
            );
        }
    }
}

/// The replicas an `INFO replication` text lists as `online` with a `lag` (seconds since their
/// last acknowledgement) of at most `MAX_LAG_SECS`, e.g.
/// `slave0:ip=127.0.0.1,port=6380,state=online,offset=1234,lag=0`.
pub(super) fn acknowledging_replicas(info: &str) -> usize {
    info.lines()
        .filter(|l| l.starts_with("slave"))
        .filter(|l| {
            let field = |name: &str| {
                l.split([':', ','])
                    .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            };
            field("state") == Some("online")
                && field("lag")
                    .and_then(|lag| lag.trim().parse::<u64>().ok())
                    .is_some_and(|lag| lag <= MAX_LAG_SECS)
        })
        .count()
}

/// An `FCALL`, `EVALSHA` or `EVAL` call (read-only variants excluded) and its first key, if
/// any.
pub(super) struct ScriptCall<'a> {
    pub(super) first_key: Option<&'a [u8]>,
}

impl<'a> ScriptCall<'a> {
    pub(super) fn of(cmd: &'a Cmd) -> Option<Self> {
        let mut args = cmd.args_iter();
        let Some(Arg::Simple(name)) = args.next() else {
            return None;
        };
        if !(name.eq_ignore_ascii_case(b"FCALL")
            || name.eq_ignore_ascii_case(b"EVALSHA")
            || name.eq_ignore_ascii_case(b"EVAL"))
        {
            return None;
        }
        let _script = args.next();
        let keys: usize = match args.next() {
            Some(Arg::Simple(n)) => std::str::from_utf8(n).ok()?.parse().ok()?,
            _ => return None,
        };
        let first_key = match args.next() {
            Some(Arg::Simple(k)) if keys > 0 => Some(k),
            _ => None,
        };
        Some(Self { first_key })
    }
}

#[cfg(test)]
mod tests {
    use super::acknowledging_replicas;

    #[test]
    fn a_replica_counts_only_while_it_acknowledges() {
        let info = "# Replication\r\nrole:master\r\nconnected_slaves:3\r\n\
            slave0:ip=127.0.0.1,port=6380,state=online,offset=100,lag=0\r\n\
            slave1:ip=127.0.0.1,port=6381,state=online,offset=90,lag=7\r\n\
            slave2:ip=127.0.0.1,port=6382,state=wait_bgsave,offset=0,lag=0\r\n\
            slave3:ip=127.0.0.1,port=6383,state=online,offset=100,lag=1\r\n\
            master_repl_offset:100\r\n";
        // slave1 is frozen (online, but silent for 7 s); slave2 has not synced yet.
        assert_eq!(acknowledging_replicas(info), 2);
        assert_eq!(
            acknowledging_replicas("role:master\r\nconnected_slaves:0\r\n"),
            0
        );
    }
}
