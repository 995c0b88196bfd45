//! Wake-ups from Redis, so that workers never poll for work or for cancels:
//!
//! - **Doorbells.** Each shard has a wake-up marker (`Shard::bell`, a sorted set of one member)
//!   that every entry put on its ready stream sets (`ring` in `migrations-lua/common.lua`). A
//!   worker with a free slot blocks on it with `BZPOPMIN` over a [`BellConn`]: a connection of
//!   its own, since a
//!   blocked command holds its connection (on the shared multiplexed ones it would stall every
//!   call behind it). A worker opens one per shard (on a cluster a blocking command may only
//!   name keys of one slot, and one per shard keeps the shards apart on one server too), to
//!   the master that holds it (found again after a failover or a slot move, which Redis signals
//!   to a blocked client with a `MOVED` error or a closed connection).
//! - **Stop messages.** A cancel or force delete of a running execution publishes its id on
//!   the channel of the worker holding its lease (`keys::stop_channel`); [`StopListener`]
//!   hears them. On a cluster any node forwards every publish, so one connection suffices.
//!
//! Both are shortcuts, never the only path: a marker taken by a worker that died before it
//! started anything is put back by the orphan scan (`reclaim`), and a stop message missed
//! while the listener was reconnecting is caught by the next heartbeat. So neither a wake-up
//! nor a message lost on the way can lose or double-run work.
//!
//! The blocking connections wait without a client-side time bound (a `BZPOPMIN` with timeout 0),
//! so an idle worker sends nothing while it waits; TCP keepalive notices a peer that vanished.

use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::MultiplexedConnection;
use redis::io::tcp::{TcpSettings, socket2};
use redis::{AsyncConnectionConfig, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, Value};

use super::call::script_call;
use super::keys::{self, Shard};
use super::layout::slot_of_tag;
use super::{RedisTarget, Store, StoreError};

/// Keepalive of the blocking connections: a peer gone without a word (a host that vanished) is
/// noticed in about a minute instead of never.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);

/// A connection dedicated to waiting on one shard's doorbell.
pub struct BellConn {
    conn: MultiplexedConnection,
    shard: Shard,
}

impl BellConn {
    /// Blocks until the shard's bell is set and takes the marker. No time bound: the caller
    /// drops the future (and the connection) to stop waiting. A marker taken by a call whose
    /// future was dropped is lost, which the orphan scan repairs.
    pub async fn wait(&mut self) -> Result<(), StoreError> {
        let reply: Value = redis::cmd("BZPOPMIN")
            .arg(self.shard.bell())
            .arg(0)
            .query_async(&mut self.conn)
            .await?;
        let (key, _member, _score): (String, Value, Value) = redis::from_redis_value(reply)?;
        if key != self.shard.bell() {
            return Err(StoreError::Corrupt(format!("BZPOPMIN answered for {key}")));
        }
        Ok(())
    }
}

/// Hears the stop messages for one worker (see the module comment).
pub struct StopListener {
    messages: redis::aio::PubSubStream,
}

impl StopListener {
    /// The next execution id published for this worker; `None` when the connection ended (the
    /// caller reconnects, and checks its runs with a heartbeat for what it may have missed).
    pub async fn next(&mut self) -> Option<String> {
        loop {
            let msg = self.messages.next().await?;
            if let Ok(id) = msg.get_payload::<String>() {
                return Some(id);
            }
        }
    }
}

impl Store {
    /// Opens a blocking connection for `shard`'s doorbell: on a cluster to the master that
    /// holds its slot now.
    pub async fn open_bell(&self, shard: Shard) -> Result<BellConn, StoreError> {
        let conn = self
            .blocking_connection(self.bell_address(shard).await?)
            .await?;
        Ok(BellConn { conn, shard })
    }

    /// Where `shard`'s doorbell lives now (on a cluster, the master that holds its slot), with
    /// the keepalive every blocking connection uses: for a worker's own connection
    /// (`open_bell`) and for `serve`'s pooled ones (`bell_node`).
    pub(super) async fn bell_address(&self, shard: Shard) -> Result<ConnectionInfo, StoreError> {
        let info = match &self.config.redis {
            RedisTarget::Standalone(url) => url.as_str().into_connection_info()?,
            RedisTarget::Cluster(seeds) => {
                let (host, port) = self.master_of_slot(slot_of_tag(shard.tag())).await?;
                let seed = seeds
                    .first()
                    .ok_or_else(|| StoreError::Corrupt("no cluster seed".into()))?;
                seed.as_str()
                    .into_connection_info()?
                    .set_addr(ConnectionAddr::Tcp(host, port))
            }
        };
        let keepalive = socket2::TcpKeepalive::new()
            .with_time(KEEPALIVE_IDLE)
            .with_interval(KEEPALIVE_INTERVAL);
        Ok(info.set_tcp_settings(
            TcpSettings::default()
                .set_nodelay(true)
                .set_keepalive(keepalive),
        ))
    }

    /// Sets a shard's doorbell again: a worker woke for work it cannot take now (no free
    /// slot), so another worker with a free slot may be woken instead.
    /// Through a script, so a frozen shard refuses (`TRYAGAIN`) instead of being written.
    pub async fn ring(&self, shard: Shard) -> Result<(), StoreError> {
        let inv = self.shard_call(shard, &RingCall { bell: shard.bell() });
        let mut c = self.conn();
        let _: u8 = self.bounded(inv.invoke_async(&mut c)).await?;
        Ok(())
    }

    /// Subscribes to the stop messages of worker `consumer` (see the module comment); on a
    /// cluster through the first seed node that answers.
    pub async fn listen_for_stops(&self, consumer: &str) -> Result<StopListener, StoreError> {
        let urls: Vec<&str> = match &self.config.redis {
            RedisTarget::Standalone(url) => vec![url.as_str()],
            RedisTarget::Cluster(seeds) => seeds.iter().map(String::as_str).collect(),
        };
        let mut last = StoreError::Unavailable("no redis address".into());
        for url in urls {
            let attempt = async {
                let client = redis::Client::open(url)?;
                let mut pubsub = client.get_async_pubsub().await?;
                pubsub.subscribe(keys::stop_channel(consumer)).await?;
                Ok::<_, redis::RedisError>(pubsub)
            };
            match self.bounded(attempt).await {
                Ok(pubsub) => {
                    return Ok(StopListener {
                        messages: pubsub.into_on_message(),
                    });
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// A connection without a reply time bound (for blocking reads), with TCP keepalive; its
    /// set-up is bounded like any call.
    async fn blocking_connection(
        &self,
        info: ConnectionInfo,
    ) -> Result<MultiplexedConnection, StoreError> {
        let client = redis::Client::open(info)?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.config.op_timeout))
            .set_response_timeout(None);
        self.bounded(client.get_multiplexed_async_connection_with_config(&config))
            .await
    }

    /// The address of the master serving `slot`, from `CLUSTER SLOTS` (asked of any node).
    pub(super) async fn master_of_slot(&self, slot: u16) -> Result<(String, u16), StoreError> {
        let mut c = self.conn();
        let ranges: Vec<Value> = self
            .bounded(redis::cmd("CLUSTER").arg("SLOTS").query_async(&mut c))
            .await?;
        for range in ranges {
            let Value::Array(parts) = range else { continue };
            let (Some(start), Some(end), Some(master)) =
                (parts.first(), parts.get(1), parts.get(2))
            else {
                continue;
            };
            let (start, end): (i64, i64) = (
                redis::from_redis_value(start.clone())?,
                redis::from_redis_value(end.clone())?,
            );
            if (start..=end).contains(&i64::from(slot)) {
                let Value::Array(node) = master else { break };
                let (Some(host), Some(port)) = (node.first(), node.get(1)) else {
                    break;
                };
                return Ok((
                    redis::from_redis_value(host.clone())?,
                    redis::from_redis_value(port.clone())?,
                ));
            }
        }
        Err(StoreError::Unavailable(format!(
            "no master serves slot {slot} now"
        )))
    }
}

script_call! {
    /// `migrations-lua/ring.lua`: sets a shard's doorbell again.
    pub(super) struct RingCall {
        keys { bell }
        args {}
    }
}
