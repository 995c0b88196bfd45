//! What this build expects of the data it finds on Redis, checked once at connect: the meta
//! record (shard count, key layout, dedicated shards: fixed at first start, read back after)
//! and the data schema, with the numbered migration that brings an older deployment's queued
//! work to this build's model. Apart from the operations, because it runs before any of them
//! and never again.

use redis::Value;

use super::call::script_call;
use super::{Layout, ShardMap, Store, StoreError, keys};

/// The data schema this build reads and writes (recorded as `schema` in the meta record; a
/// Redis without it holds schema 1). Schema 2 is fair dispatch: the slot is taken at start and
/// what is runnable lives in ordered sets (see `migrations-lua/common.lua`, "Dispatch").
pub const SCHEMA: u32 = 2;

/// How far a schema migration got.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// Every shard is migrated and the meta record says so.
    pub done: bool,
    /// Executions moved (re-queued or re-listed) on the way.
    pub moved: u64,
}

impl Store {
    /// Reads (or records, on first start: then `true`) the shard count and layout. An older
    /// layout is refused unless `migrating` (the store of `sluice migrate-layout`, which gets
    /// the recorded layout) or a move to this build's layout is under way (`layout_to` in
    /// the meta record: then this build's layout, whose unconverted shards hold).
    pub(super) async fn init_meta(&self, migrating: bool) -> Result<(ShardMap, bool), StoreError> {
        let mut c = self.conn();
        let initial = self.config.initial_layout.unwrap_or(Layout::CURRENT);
        type Meta = (
            i64,
            Value,
            Value,
            Option<u16>,
            Option<u32>,
            Option<u16>,
            Option<u32>,
        );
        let (created, _, _, shards, layout, dedicated, layout_to): Meta = self
            .bounded(
                redis::pipe()
                    .hset_nx(keys::meta(), "shards", self.config.shards)
                    .hset_nx(keys::meta(), "layout", initial.number())
                    .hset_nx(keys::meta(), "dedicated", self.config.dedicated_shards)
                    .hget(keys::meta(), "shards")
                    .hget(keys::meta(), "layout")
                    .hget(keys::meta(), "dedicated")
                    .hget(keys::meta(), "layout_to")
                    .query_async(&mut c),
            )
            .await?;
        let (Some(shards), Some(layout)) = (shards, layout) else {
            return Err(StoreError::Corrupt(
                "meta record lacks shards/layout".into(),
            ));
        };
        let Some(layout) = Layout::from_number(layout) else {
            return Err(StoreError::Corrupt(format!(
                "redis holds key layout {layout}, this build knows up to {}: upgrade sluice",
                Layout::CURRENT.number()
            )));
        };
        if !layout.servable() || (migrating && !layout.convertible()) {
            return Err(StoreError::Corrupt(format!(
                "redis holds key layout {}, which this build cannot write yet or convert \
                 (`sluice migrate-layout` targets layout {}): run a build that serves layout {}",
                layout.number(),
                Layout::CURRENT.number(),
                layout.number()
            )));
        }
        let moving = layout_to == Some(Layout::CURRENT.number());
        let layout = match layout {
            // A Redis at layout 5 was made so by its first start (`initial_layout`): served
            // as it is.
            l if l == Layout::CURRENT || l == Layout::Binary || migrating => l,
            l if moving => {
                tracing::warn!(
                    from = l.number(),
                    to = Layout::CURRENT.number(),
                    "`sluice migrate-layout` is under way: shards not converted yet answer 503 \
                     here until their turn (processes of the older build serve them meanwhile)"
                );
                Layout::CURRENT
            }
            l => {
                return Err(StoreError::Corrupt(format!(
                    "redis holds key layout {}, this build reads layout {}: run `sluice \
                     migrate-layout` (see the upgrade notes in docs/operations.md)",
                    l.number(),
                    Layout::CURRENT.number()
                )));
            }
        };
        if shards != self.config.shards {
            tracing::warn!(
                recorded = shards,
                configured = self.config.shards,
                "shard count is fixed at first start; using the recorded value"
            );
        }
        self.ready().await?;
        self.announce_library(true).await?;
        Ok((
            ShardMap::with_dedicated(shards, dedicated.unwrap_or(0), layout),
            created == 1,
        ))
    }

    /// Whether `sluice migrate-layout` has begun a move of the key layout and not finished it
    /// (`layout_to` in the meta record): shards not converted yet are held meanwhile.
    pub async fn layout_move_under_way(&self) -> Result<bool, StoreError> {
        let mut c = self.conn();
        let to: Option<u32> = self
            .bounded(
                redis::cmd("HGET")
                    .arg(keys::meta())
                    .arg("layout_to")
                    .query_async(&mut c),
            )
            .await?;
        Ok(to.is_some())
    }

    /// Brings the data to this build's schema (`SCHEMA`) before anything uses it: a Redis
    /// written by an older build is migrated (see `migrate_dispatch`), a new one is marked.
    pub(super) async fn ensure_schema(&self, fresh: bool) -> Result<(), StoreError> {
        let mut c = self.conn();
        if fresh {
            let () = self
                .bounded(
                    redis::cmd("HSETNX")
                        .arg(keys::meta())
                        .arg("schema")
                        .arg(SCHEMA)
                        .query_async(&mut c),
                )
                .await
                .map(|_: i64| ())?;
            return Ok(());
        }
        let schema: Option<u32> = self
            .bounded(
                redis::cmd("HGET")
                    .arg(keys::meta())
                    .arg("schema")
                    .query_async(&mut c),
            )
            .await?;
        match schema.unwrap_or(1) {
            s if s == SCHEMA => Ok(()),
            s if s > SCHEMA => Err(StoreError::Corrupt(format!(
                "redis holds data schema {s}, this build knows up to {SCHEMA}: upgrade sluice"
            ))),
            s => {
                tracing::warn!(
                    from = s,
                    to = SCHEMA,
                    "migrating queued work to fair dispatch (schema 2); stop processes of \
                     older builds first"
                );
                let done = self.migrate_dispatch(1_000, usize::MAX).await?;
                tracing::info!(moved = done.moved, "data schema is now {SCHEMA}");
                Ok(())
            }
        }
    }

    /// Dead letters an older build indexed only in part, and counted by holder not at all
    /// (see `reindex_dead_letters`; one call per shard when there is nothing to do): what
    /// `serve` does at start, before it lists any. Never fails: a shard it cannot reach is
    /// left for the next start (a worker meanwhile writes records as usual; until then a full
    /// shard with no holder counted evicts its oldest record).
    pub async fn ensure_dead_letter_counts(&self) {
        let done = self.reindex_dead_letters(1_000, usize::MAX).await;
        if done.indexed > 0 {
            tracing::info!(
                indexed = done.indexed,
                "dead-letter records indexed and counted by tenant (left by an older build)"
            );
        }
    }

    /// Schema migration 2 (`migrations-lua/migrate_dispatch.lua`): every shard in bounded
    /// atomic batches of `batch` members, at most `max_calls` calls in all (tests interrupt it
    /// with a small number). Once every shard is done the meta record says schema 2. Safe to
    /// run again, also concurrently from several processes, and after an interruption.
    pub async fn migrate_dispatch(
        &self,
        batch: usize,
        max_calls: usize,
    ) -> Result<Migration, StoreError> {
        let mut calls = 0usize;
        let mut moved = 0u64;
        for shard in self.shards.all() {
            let (mut phase, mut cursor) = ("stream".to_owned(), "0".to_owned());
            while phase != "done" {
                if calls >= max_calls {
                    return Ok(Migration { done: false, moved });
                }
                calls += 1;
                let inv = self.shard_call(
                    shard,
                    &MigrateDispatchCall {
                        ready: shard.ready(),
                        delayed: shard.delayed(),
                        tenants: shard.tenants(),
                        runnable: shard.runnable(),
                        phase: phase.clone(),
                        cursor: cursor.clone(),
                        batch: batch.max(1),
                    },
                );
                let mut c = self.conn();
                let (next, at, n): (String, String, u64) =
                    self.bounded(inv.invoke_async(&mut c)).await?;
                moved += n;
                (phase, cursor) = (next, at);
            }
        }
        let mut c = self.conn();
        let () = self
            .bounded(
                redis::cmd("HSET")
                    .arg(keys::meta())
                    .arg("schema")
                    .arg(SCHEMA)
                    .query_async(&mut c),
            )
            .await
            .map(|_: i64| ())?;
        Ok(Migration { done: true, moved })
    }
}

script_call! {
    /// `migrations-lua/migrate_dispatch.lua`: one batch of schema migration 2 in one shard.
    pub(super) struct MigrateDispatchCall {
        keys { ready, delayed, tenants, runnable }
        args { phase: String, cursor: String, batch: usize }
    }
}
