//! The two kinds of Redis sluice runs on — one server, or a Redis Cluster named by seed nodes —
//! behind one connection type, so the rest of the store neither knows nor cares which.
//!
//! Both are multiplexed (many calls in flight on one socket) and both leave the question "did
//! a call whose answer was lost run?" to the caller: neither resends a call after an I/O error
//! or a time-out. The redis crate's cluster client would (it retries a request after a broken
//! connection), which could run a script twice; so its own retries are off, and on a cluster
//! this module resends a call only while the answers prove it did not run and the cluster is
//! settling: `MOVED` (a failover or slot move the client learns from), `CLUSTERDOWN`,
//! `MASTERDOWN`, `LOADING`, `READONLY` (a demoted master), or a node that refused the
//! connection. It gives up after half the operation's time bound and hands back the last such
//! answer, so the caller still knows nothing ran. `TRYAGAIN` (a frozen shard, or a multi-key
//! call during a slot move) and `ASK` are handed back at once: they last as long as the move,
//! and a script must never run on the partial copy an `ASK` points to.
//!
//! Redis replicates asynchronously: a master that crashes right after answering a script may
//! not have passed the write on, and the replica promoted in its place never saw it. With
//! `replica_acks` set (`--redis-replica-acks`), every script call that succeeded is followed by
//! `WAIT <n> <ms>` on the same master (Redis counts the replicas that hold everything that
//! connection wrote), so a write is answered only once that many replicas have it — see
//! `ReplicaAcks` (in `replica_acks.rs`) for what happens when they do not answer in time.

use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
};
use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, ServerErrorKind, Value};

use super::replica_acks::{ReplicaAcks, ScriptCall, Short, acknowledging_replicas};

/// Where sluice's Redis is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// One server (or a primary behind a stable address), e.g. `redis://127.0.0.1:6379`.
    Standalone(String),
    /// A Redis Cluster, found through any of these seed nodes (the rest is discovered).
    Cluster(Vec<String>),
}

impl RedisTarget {
    /// Whether the addresses are well formed (nothing is contacted).
    pub fn check(&self) -> Result<(), String> {
        match self {
            RedisTarget::Standalone(url) => redis::Client::open(url.as_str())
                .map(drop)
                .map_err(|e| format!("bad redis url {url}: {e}")),
            RedisTarget::Cluster(seeds) => ClusterClient::new(seeds.iter().map(String::as_str))
                .map(drop)
                .map_err(|e| format!("bad redis cluster seed nodes {}: {e}", seeds.join(","))),
        }
    }
}

impl std::fmt::Display for RedisTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RedisTarget::Standalone(url) => f.write_str(url),
            RedisTarget::Cluster(seeds) => write!(f, "cluster {}", seeds.join(",")),
        }
    }
}

/// One multiplexed connection to standalone Redis or to a cluster. Cheap to clone (clones share
/// the socket(s)).
#[derive(Clone)]
pub enum Conn {
    Standalone {
        conn: ConnectionManager,
        acks: Option<ReplicaAcks>,
    },
    Cluster {
        conn: ClusterConnection,
        /// How long to keep resending a call that did not run.
        settle: Duration,
        acks: Option<ReplicaAcks>,
    },
}

impl Conn {
    /// `count` connections to `target`, each connecting lazily (a server may start before
    /// Redis is up) and bounding connection set-up and answers by `timeout`. With
    /// `replica_acks` > 0, each script call that succeeded waits for that many replicas of its
    /// master to hold its writes (see `ReplicaAcks`).
    pub async fn open(
        target: &RedisTarget,
        count: usize,
        timeout: Duration,
        replica_acks: u32,
    ) -> Result<Vec<Conn>, RedisError> {
        let count = count.max(1);
        let acks = (replica_acks > 0).then(|| ReplicaAcks::new(replica_acks, timeout));
        match target {
            RedisTarget::Standalone(url) => {
                let client = redis::Client::open(url.as_str())?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(timeout))
                    .set_response_timeout(Some(timeout))
                    .set_number_of_retries(1)
                    .set_max_delay(Duration::from_millis(200));
                (0..count)
                    .map(|_| {
                        ConnectionManager::new_lazy_with_config(client.clone(), config.clone()).map(
                            |conn| Conn::Standalone {
                                conn,
                                acks: acks.clone(),
                            },
                        )
                    })
                    .collect()
            }
            RedisTarget::Cluster(seeds) => {
                let client = ClusterClient::builder(seeds.iter().map(String::as_str))
                    .connection_timeout(timeout)
                    .response_timeout(timeout)
                    // Never resent by the client itself: see the module comment.
                    .retries(0)
                    .build()?;
                let mut conns = Vec::with_capacity(count);
                for _ in 0..count {
                    let config = redis::cluster::ClusterConfig::new()
                        .set_connection_timeout(timeout)
                        .set_response_timeout(timeout);
                    conns.push(Conn::Cluster {
                        conn: client.get_pending_async_connection_with_config(config),
                        settle: timeout / 2,
                        acks: acks.clone(),
                    });
                }
                Ok(conns)
            }
        }
    }

    /// Sends one command; a cluster connection resends it while the answer proves it did not
    /// run and the cluster is settling.
    async fn send(&mut self, cmd: &Cmd) -> Result<Value, RedisError> {
        match self {
            Conn::Standalone { conn, .. } => conn.req_packed_command(cmd).await,
            Conn::Cluster { conn, settle, .. } => {
                let until = Instant::now() + *settle;
                let mut n = 0;
                loop {
                    match conn.req_packed_command(cmd).await {
                        Err(e) if settling(&e) && Instant::now() < until => {
                            n += 1;
                            tokio::time::sleep(pause(n)).await;
                        }
                        other => return other,
                    }
                }
            }
        }
    }

    /// `WAIT` for the replicas `acks` asks for, on the master that ran `script`. `Ok` when
    /// enough replicas acknowledged, or when they did not in time (logged; see `ReplicaAcks`);
    /// an I/O error when WAIT got no answer, so the caller treats the script's answer as lost
    /// (the script may have run; its write may be gone with its master).
    async fn wait_for_replicas(
        &mut self,
        acks: &ReplicaAcks,
        script: &ScriptCall<'_>,
    ) -> Result<(), RedisError> {
        // The master of the script's first key's slot ran it (standalone: the one server).
        let route = match self {
            Conn::Standalone { .. } => None,
            Conn::Cluster { .. } => match script.first_key {
                Some(key) => Some(Route::with_key(key, SlotAddr::Master)),
                // A script without keys went to any node: nothing to wait on (sluice's
                // scripts all name keys).
                None => return Ok(()),
            },
        };
        match acks.state(route) {
            Short::No => {}
            Short::Yes => {
                acks.unconfirmed();
                return Ok(());
            }
            // Whether the master has its replicas back, without blocking the connection.
            Short::Probe => match self.replicas_online(route).await {
                Some(n) if n >= acks.replicas => acks.recovered(route),
                Some(_) => {
                    acks.unconfirmed();
                    return Ok(());
                }
                // WAIT tells.
                None => {}
            },
        }
        let mut wait = redis::cmd("WAIT");
        wait.arg(acks.replicas).arg(acks.wait_ms());
        let reply = self.route(wait, route).await;
        match reply {
            Ok(Value::Int(n)) if n >= i64::from(acks.replicas) => Ok(()),
            Ok(Value::Int(n)) => {
                acks.fell_short(route, script, n);
                acks.unconfirmed();
                Ok(())
            }
            other => {
                let why = match other {
                    Ok(v) => format!("unexpected reply {v:?}"),
                    Err(e) => e.to_string(),
                };
                Err(RedisError::from(std::io::Error::other(format!(
                    "the script ran, but whether its replicas have its writes is unknown \
                     (WAIT failed: {why})"
                ))))
            }
        }
    }

    /// How many replicas of the master `route` leads to (standalone: the server) are online
    /// and acknowledged it within the last second, by `INFO replication` (answered at once,
    /// unlike WAIT); `None` if it does not say.
    async fn replicas_online(&mut self, route: Option<Route>) -> Option<u32> {
        let mut info = redis::cmd("INFO");
        info.arg("replication");
        let text: String = redis::from_redis_value(self.route(info, route).await.ok()?).ok()?;
        u32::try_from(acknowledging_replicas(&text)).ok()
    }

    /// Sends `cmd` once to the master `route` leads to (standalone: the server).
    async fn route(&mut self, cmd: Cmd, route: Option<Route>) -> Result<Value, RedisError> {
        match (self, route) {
            (Conn::Standalone { conn, .. }, _) => conn.req_packed_command(&cmd).await,
            (Conn::Cluster { conn, .. }, Some(route)) => {
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                conn.route_command(cmd, routing).await
            }
            (Conn::Cluster { .. }, None) => Err(RedisError::from((
                ErrorKind::Client,
                "a cluster command needs a route",
            ))),
        }
    }

    /// Sends `cmd` to every master and gives each one's answer (an error answer as a
    /// `Value::ServerError`); on one server, its one answer.
    pub async fn on_every_master(&mut self, cmd: &Cmd) -> Result<Vec<Value>, RedisError> {
        match self {
            Conn::Standalone { conn, .. } => Ok(vec![conn.req_packed_command(cmd).await?]),
            Conn::Cluster { conn, .. } => {
                let routing = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
                match conn.route_command(cmd.clone(), routing).await? {
                    Value::Map(answers) => Ok(answers.into_iter().map(|(_, v)| v).collect()),
                    other => Ok(vec![other]),
                }
            }
        }
    }

    /// Script answers this connection and those opened with it returned without the
    /// `--redis-replica-acks` acknowledgements they wanted (0 without the setting).
    pub fn unconfirmed_answers(&self) -> u64 {
        self.acks().map_or(0, ReplicaAcks::unconfirmed_count)
    }

    fn acks(&self) -> Option<&ReplicaAcks> {
        match self {
            Conn::Standalone { acks, .. } | Conn::Cluster { acks, .. } => acks.as_ref(),
        }
    }
}

/// Whether `e` proves that the call it answers did not run (so nothing was written, and
/// sending it again cannot make it run twice).
pub fn did_not_run(e: &RedisError) -> bool {
    matches!(
        e.kind(),
        ErrorKind::Server(
            ServerErrorKind::Moved
                | ServerErrorKind::Ask
                | ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::MasterDown
                | ServerErrorKind::BusyLoading
                | ServerErrorKind::ReadOnly
        ) | ErrorKind::ClusterConnectionNotFound
    ) || e.is_connection_refusal()
}

/// Whether a call that did not run is worth resending at once: the cluster is settling
/// (failover, slot map change) rather than deliberately refusing for a while.
fn settling(e: &RedisError) -> bool {
    did_not_run(e)
        && !matches!(
            e.kind(),
            ErrorKind::Server(ServerErrorKind::TryAgain | ServerErrorKind::Ask)
        )
}

/// Pause before resending call number `n` (1-based) that did not run: 10 ms doubling to 200 ms
/// (a failover or slot move takes seconds; the caller's time bound ends the wait).
fn pause(n: u32) -> Duration {
    Duration::from_millis((10u64 << n.min(5)).min(200))
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        // One server without replica acks: the connection's own call, nothing in between.
        if let Conn::Standalone { conn, acks: None } = self {
            return conn.req_packed_command(cmd);
        }
        Box::pin(async move {
            let value = self.send(cmd).await?;
            // A script that answered an error wrote nothing (scripts validate before they
            // write), so there is nothing to wait for.
            if !matches!(value, Value::ServerError(_))
                && let Some(acks) = self.acks().cloned()
                && let Some(script) = ScriptCall::of(cmd)
            {
                self.wait_for_replicas(&acks, &script).await?;
            }
            Ok(value)
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Standalone { conn, .. } => conn.req_packed_commands(pipeline, offset, count),
            Conn::Cluster { conn, settle, .. } => Box::pin(async move {
                let until = Instant::now() + *settle;
                let mut n = 0;
                loop {
                    match conn.req_packed_commands(pipeline, offset, count).await {
                        Err(e) if settling(&e) && Instant::now() < until => {
                            n += 1;
                            tokio::time::sleep(pause(n)).await;
                        }
                        other => return other,
                    }
                }
            }),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Standalone { conn, .. } => conn.get_db(),
            Conn::Cluster { conn, .. } => conn.get_db(),
        }
    }
}
