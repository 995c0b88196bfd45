//! Doorbell waits for `serve` (the pull API's long polls): a shard's doorbell is read by one
//! task of the server however many pull workers wait on it, each wait a `BZPOPMIN` with a
//! short block on a connection from a bounded deadpool-redis pool, one pool per Redis node.
//!
//! Unlike a `sluice worker`'s doorbell connection (`wake.rs`), which blocks without end and is
//! thrown away when the wait is dropped, these waits block at most `block` and are never
//! dropped mid-call: the connection goes back to the pool after each, so a server whose pull
//! workers stop waiting holds no connection blocked, and a connection is reused by whichever
//! shard waits next. A wait that failed (a time-out, `MOVED` after a failover or slot move, a
//! closed connection) takes its connection out of the pool, and the caller looks for the
//! shard's master again.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use deadpool_redis::{Manager, Pool, Runtime};
use redis::{AsyncConnectionConfig, ConnectionInfo, Value};

use super::keys::Shard;
use super::{Store, StoreError};

/// The pools of blocking connections, by Redis node (`host:port`), created when a shard on
/// that node is first waited on.
pub struct BellPools {
    pools: Mutex<HashMap<String, Pool>>,
    /// Connections per node at most: the number of shards (one waiting reader each).
    per_node: usize,
    /// How long one `BZPOPMIN` blocks on Redis.
    block: Duration,
}

/// Where a shard's doorbell is read: its node's address and connection details.
#[derive(Clone)]
pub struct BellNode {
    address: String,
    info: ConnectionInfo,
}

impl std::fmt::Debug for BellNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.address)
    }
}

impl BellPools {
    /// Pools of at most `per_node` connections each, for waits that block `block` at most.
    pub fn new(per_node: usize, block: Duration) -> Self {
        Self {
            pools: Mutex::default(),
            per_node: per_node.max(1),
            block,
        }
    }

    /// How long one wait blocks on Redis.
    pub fn block(&self) -> Duration {
        self.block
    }

    /// The connections the pools hold now, idle or in use (for tests and metrics).
    pub fn connections(&self) -> usize {
        self.lock().values().map(|p| p.status().size).sum()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Pool>> {
        self.pools.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn pool(&self, node: &BellNode, op_timeout: Duration) -> Result<Pool, StoreError> {
        let mut pools = self.lock();
        if let Some(p) = pools.get(&node.address) {
            return Ok(p.clone());
        }
        // A reply may take the whole block, then the time any call may take.
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(op_timeout))
            .set_response_timeout(Some(self.block + op_timeout));
        let manager = Manager::new_with_config(node.info.clone(), config)?;
        let pool = Pool::builder(manager)
            .max_size(self.per_node)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(op_timeout))
            .create_timeout(Some(op_timeout))
            .recycle_timeout(Some(op_timeout))
            .build()
            .map_err(|e| StoreError::Unavailable(format!("doorbell pool: {e}")))?;
        pools.insert(node.address.clone(), pool.clone());
        Ok(pool)
    }
}

impl Store {
    /// Where `shard`'s doorbell is read now: on a cluster, the master that holds its slot.
    pub async fn bell_node(&self, shard: Shard) -> Result<BellNode, StoreError> {
        let info = self.bell_address(shard).await?;
        Ok(BellNode {
            address: info.addr().to_string(),
            info,
        })
    }

    /// Waits up to the pools' block time for `shard`'s doorbell on `node`, on a pooled
    /// connection: `true` when it rang (the marker is taken: the caller sets it again if it
    /// cannot use it), `false` when it did not ring meanwhile.
    pub async fn wait_bell_pooled(
        &self,
        pools: &BellPools,
        node: &BellNode,
        shard: Shard,
    ) -> Result<bool, StoreError> {
        let pool = pools.pool(node, self.config.op_timeout)?;
        let mut conn = pool
            .get()
            .await
            .map_err(|e| StoreError::Unavailable(format!("doorbell connection: {e}")))?;
        let reply: Result<Value, redis::RedisError> = redis::cmd("BZPOPMIN")
            .arg(shard.bell())
            .arg(pools.block.as_secs_f64())
            .query_async(&mut *conn)
            .await;
        let reply = match reply {
            Ok(v) => v,
            Err(e) => {
                // Not reused: it may still be blocked, or point at a node that lost the shard.
                let _ = deadpool_redis::Connection::take(conn);
                return Err(e.into());
            }
        };
        if matches!(reply, Value::Nil) {
            return Ok(false);
        }
        let (key, _member, _score): (String, Value, Value) = redis::from_redis_value(reply)?;
        if key != shard.bell() {
            return Err(StoreError::Corrupt(format!("BZPOPMIN answered for {key}")));
        }
        Ok(true)
    }
}
