//! Waiting on executions without polling: the start of a wait (`migrations-lua/watch.lua`,
//! which makes the scripts announce the execution's changes for a while) and the Pub/Sub
//! connection those announcements arrive on (`Events`). What to do with them — who waits,
//! fanning a change out to every local waiter — is `crate::waiters`; this file only knows
//! how Redis is spoken to, and the channel names (through `keys`).

use std::time::Duration;

use futures_util::StreamExt;
use redis::Value;
use redis::aio::{PubSubSink, PubSubStream};

use super::call::script_call;
use super::row::{execution_from, split_tag};
use super::{RedisTarget, Shard, Store, StoreError, keys};
use crate::access::AccessChange;
use crate::domain::{Execution, ExecutionId, TenantId};

/// Channels one SUBSCRIBE or UNSUBSCRIBE names at most (a reconnect resubscribes every watched
/// execution: in several commands of bounded size rather than one huge one).
const CHANNELS_PER_COMMAND: usize = 500;

impl Store {
    /// Reads one execution of a tenant and asks the scripts to announce its changes on its
    /// channel for the next `horizon` (see `migrations-lua/watch.lua`). `None` when missing
    /// or another tenant's. Subscribe to the channel first: then no change can fall between
    /// this read and the first announcement.
    pub async fn watch(
        &self,
        tenant: &TenantId,
        id: &ExecutionId,
        horizon: Duration,
    ) -> Result<Option<Execution>, StoreError> {
        let found = self
            .watch_in(self.shard_of(tenant), tenant, id, horizon)
            .await?;
        match self.repinned(tenant, found.is_none()).await? {
            Some(shard) => self.watch_in(shard, tenant, id, horizon).await,
            None => Ok(found),
        }
    }

    async fn watch_in(
        &self,
        shard: Shard,
        tenant: &TenantId,
        id: &ExecutionId,
        horizon: Duration,
    ) -> Result<Option<Execution>, StoreError> {
        let inv = self.shard_call(
            shard,
            &WatchCall {
                row: shard.row(id),
                tenant: tenant.as_str(),
                id: shard.stored_id(id),
                horizon: u64::try_from(horizon.as_millis()).unwrap_or(u64::MAX),
            },
        );
        let mut c = self.conn();
        let reply: Vec<Value> = self.bounded(inv.invoke_async(&mut c)).await?;
        let (tag, rest) = split_tag(reply)?;
        match tag.as_str() {
            "ok" => Ok(Some(execution_from(rest, false)?)),
            "not_found" => Ok(None),
            other => Err(StoreError::Corrupt(format!("watch replied {other}"))),
        }
    }

    /// The address a Pub/Sub connection goes to: the server, or on a cluster one seed node,
    /// picked round robin by `attempt` so that a reconnect passes over a node that is down.
    /// Any node will do: a cluster forwards every PUBLISH to all.
    pub fn pubsub_node(&self, attempt: usize) -> Result<String, StoreError> {
        match &self.config.redis {
            RedisTarget::Standalone(url) => Ok(url.clone()),
            RedisTarget::Cluster(seeds) => seeds
                .get(attempt % seeds.len().max(1))
                .cloned()
                .ok_or_else(|| StoreError::Unavailable("no cluster seed node".into())),
        }
    }

    /// Opens a Pub/Sub connection for execution announcements: to the server, or on a cluster
    /// to one node — `attempt` picks the seed (round robin), so a node that is down is passed
    /// over by the next attempt. Any node will do: a cluster forwards every PUBLISH to all.
    pub async fn open_events(&self, attempt: usize) -> Result<Events, StoreError> {
        let url = self.pubsub_node(attempt)?;
        let client = redis::Client::open(url.as_str())?;
        let (sink, stream) = self.bounded(client.get_async_pubsub()).await?.split();
        let mut events = Events {
            sink,
            stream,
            timeout: self.config.op_timeout,
            node: url,
        };
        // The same connection hears who may no longer call (`crate::revocation`).
        bounded(
            events.timeout,
            events.sink.subscribe(keys::access_channel()),
        )
        .await?;
        Ok(events)
    }
}

/// A Pub/Sub connection carrying the announcements of the executions it is subscribed to.
/// Its own connection (a subscribed connection can do nothing else), with its own time bound
/// on every command: the redis crate bounds none of them.
pub struct Events {
    sink: PubSubSink,
    stream: PubSubStream,
    timeout: Duration,
    node: String,
}

impl Events {
    /// The node this connection is on (for logs).
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Subscribes to the channels of `ids`; returns once Redis has confirmed every one.
    pub async fn subscribe(&mut self, ids: &[ExecutionId]) -> Result<(), StoreError> {
        for chunk in ids.chunks(CHANNELS_PER_COMMAND) {
            let channels: Vec<String> = chunk.iter().map(keys::events_channel).collect();
            bounded(self.timeout, self.sink.subscribe(channels)).await?;
        }
        Ok(())
    }

    /// Unsubscribes from the channels of `ids`.
    pub async fn unsubscribe(&mut self, ids: &[ExecutionId]) -> Result<(), StoreError> {
        for chunk in ids.chunks(CHANNELS_PER_COMMAND) {
            let channels: Vec<String> = chunk.iter().map(keys::events_channel).collect();
            bounded(self.timeout, self.sink.unsubscribe(channels)).await?;
        }
        Ok(())
    }

    /// A round trip, to find out that a connection went silent (a paused or unreachable
    /// Redis does not close it).
    pub async fn ping(&mut self) -> Result<(), StoreError> {
        let _: Value = bounded(self.timeout, self.sink.ping()).await?;
        Ok(())
    }

    /// The next announcement, `None` once the connection is gone.
    pub async fn next(&mut self) -> Option<Announcement> {
        let msg = self.stream.next().await?;
        let channel = msg.get_channel_name();
        if let Some(id) = keys::events_channel_execution(channel) {
            return Some(Announcement::Changed(id));
        }
        if channel == keys::access_channel() {
            let text: String = msg.get_payload().unwrap_or_default();
            if let Some(change) = AccessChange::parse(&text) {
                return Some(Announcement::Access(change));
            }
        }
        Some(Announcement::Other)
    }
}

/// What arrived on an `Events` connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Announcement {
    /// An execution a server waits on changed.
    Changed(ExecutionId),
    /// Who may call changed (`crate::revocation`).
    Access(AccessChange),
    /// Anything else (ignored).
    Other,
}

/// Runs one Pub/Sub command under the time bound.
async fn bounded<T>(
    timeout: Duration,
    op: impl Future<Output = redis::RedisResult<T>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(timeout, op).await {
        Ok(r) => r.map_err(StoreError::from),
        Err(_) => Err(StoreError::Unavailable(format!(
            "no answer from the pub/sub connection within {timeout:?}"
        ))),
    }
}

script_call! {
    /// `migrations-lua/watch.lua`: an execution's state at the start of a wait on it.
    pub(super) struct WatchCall<'a> {
        keys { row: Vec<u8> }
        args { tenant: &'a str, id: super::keys::StoredId, horizon: u64 }
    }
}
