//! The two kinds of Redis sluice runs on — one server, or a Redis Cluster named by seed nodes —
//! behind one connection type, so the rest of the store neither knows nor cares which.
//!
//! Both are multiplexed (many calls in flight on one socket) and both leave the question "did
//! a call whose answer was lost run?" to the caller: neither resends a call after an I/O error
//! or a time-out. The redis crate's cluster client would (it retries a request after a broken
//! connection), which could run a script twice; so its own retries are off, and this module
//! resends only on answers that prove the call did not run on the node that answered: a
//! redirect (`MOVED`, `ASK`), `TRYAGAIN` (also a frozen shard, see `keys::frozen`),
//! `CLUSTERDOWN`, `MASTERDOWN`, `LOADING`, `READONLY` (a demoted master), or a connection that
//! was refused or not found. The caller's time bound (`Store::bounded`) limits the resending.

use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, ServerErrorKind, Value};

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
    Standalone(ConnectionManager),
    Cluster {
        conn: ClusterConnection,
        /// How long to keep resending a call that did not run.
        settle: Duration,
    },
}

impl Conn {
    /// `count` connections to `target`, each connecting lazily (a server may start before
    /// Redis is up) and bounding connection set-up and answers by `timeout`.
    pub async fn open(
        target: &RedisTarget,
        count: usize,
        timeout: Duration,
    ) -> Result<Vec<Conn>, RedisError> {
        let count = count.max(1);
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
                        ConnectionManager::new_lazy_with_config(client.clone(), config.clone())
                            .map(Conn::Standalone)
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
                    });
                }
                Ok(conns)
            }
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
        match self {
            Conn::Standalone(c) => c.req_packed_command(cmd),
            Conn::Cluster { conn, settle } => Box::pin(async move {
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
            }),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Standalone(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster { conn, settle } => Box::pin(async move {
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
            Conn::Standalone(c) => c.get_db(),
            Conn::Cluster { conn, .. } => conn.get_db(),
        }
    }
}
