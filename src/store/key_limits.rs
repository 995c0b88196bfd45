//! Concurrency keys' limits: the per-key overrides of a tenant (`migrations-lua/key_limit.lua`
//! writes one and lets the key take what room it made) and what a key holds now (plain
//! pipelines). The dispatch that enforces them is "Concurrency keys" in
//! `migrations-lua/common.lua`.

use redis::Value;

use super::call::script_call;
use super::row::split_tag;
use super::tenants::MAX_KEY_OVERRIDES;
use super::{Store, StoreError};
use crate::domain::{ConcurrencyKey, TenantId};

/// One concurrency key of a tenant: its limit and what it holds now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyState {
    pub key: ConcurrencyKey,
    /// How many of its executions may run at once; `None`: no limit of its own (only the
    /// tenant's `max_concurrent`).
    pub max_concurrent: Option<u32>,
    /// Whether `max_concurrent` is the key's own override (else the tenant's
    /// `max_concurrent_per_key`, or none).
    pub overridden: bool,
    pub running: u64,
    /// Runnable executions of the key not started yet (scheduled ones are not counted).
    pub queued: u64,
}

/// What setting a key's override did.
#[derive(Debug)]
pub enum KeyLimitChange {
    /// Written; the key as it is now.
    Set(KeyState),
    /// The tenant has `MAX_KEY_OVERRIDES` overrides already: nothing written.
    TooMany(u64),
    /// The tenant is being deleted: nothing written.
    Deleting,
}

/// An override as `K.key_limits` stores it: `<limit>:<key as given>`.
fn parse_override(value: &str) -> Option<(u32, &str)> {
    let (limit, key) = value.split_once(':')?;
    Some((limit.parse().ok()?, key))
}

impl Store {
    /// Sets (`Some`) or drops (`None`) the override of `key`'s limit. A raised limit lets the
    /// key's waiting executions start as workers pick them, in order; a lowered one stops new
    /// starts of the key until enough running ones end.
    pub async fn set_key_limit(
        &self,
        tenant: &TenantId,
        key: &ConcurrencyKey,
        limit: Option<u32>,
    ) -> Result<KeyLimitChange, StoreError> {
        let h = key.digest();
        // Twice at most: a tenant pinned since this process last read the pins is sent on.
        for _ in 0..2 {
            let shard = self.shard_of(tenant);
            let inv = self.shard_call(
                shard,
                &KeyLimitCall {
                    cfg: shard.tenant_config(tenant),
                    key_limits: shard.key_limits(tenant),
                    key_blocked: shard.key_blocked(tenant),
                    key_queue: shard.key_queue(tenant, &h),
                    key_running: shard.key_running(tenant, &h),
                    waiting: shard.waiting(tenant),
                    runnable: shard.runnable(),
                    tenant: tenant.as_str(),
                    digest: &h,
                    key: key.as_str(),
                    limit: limit.map(|l| l.to_string()).unwrap_or_default(),
                    most: MAX_KEY_OVERRIDES,
                },
            );
            let mut c = self.conn();
            let reply: Vec<Value> = self.bounded(inv.invoke_async(&mut c)).await?;
            let (tag, rest) = split_tag(reply)?;
            let number = |i: usize| -> Result<u64, StoreError> {
                Ok(redis::from_redis_value(rest.get(i).cloned().ok_or_else(
                    || StoreError::Corrupt("key_limit reply too short".into()),
                )?)?)
            };
            return match tag.as_str() {
                "ok" => {
                    let (running, queued) = (number(0)?, number(1)?);
                    let mut state = self.key_state(tenant, key).await?;
                    // The script's counts are the ones of the change itself.
                    (state.running, state.queued) = (running, queued);
                    Ok(KeyLimitChange::Set(state))
                }
                "too_many" => Ok(KeyLimitChange::TooMany(number(0)?)),
                "deleting" => Ok(KeyLimitChange::Deleting),
                "moved" => {
                    self.refresh_pins().await?;
                    continue;
                }
                other => Err(StoreError::Corrupt(format!("key_limit replied {other}"))),
            };
        }
        Err(StoreError::Corrupt(format!(
            "tenant {tenant} was sent on twice"
        )))
    }

    /// `key`'s limit and what it holds now (a key never used reads as empty).
    pub async fn key_state(
        &self,
        tenant: &TenantId,
        key: &ConcurrencyKey,
    ) -> Result<KeyState, StoreError> {
        let shard = self.shard_of(tenant);
        let h = key.digest();
        let mut c = self.conn();
        let (own, per_key, running, queued): (Option<String>, Option<u32>, u64, u64) = self
            .bounded(
                redis::pipe()
                    .hget(shard.key_limits(tenant), &h)
                    .hget(shard.tenant_config(tenant), "max_concurrent_per_key")
                    .scard(shard.key_running(tenant, &h))
                    .zcard(shard.key_queue(tenant, &h))
                    .query_async(&mut c),
            )
            .await?;
        let own = own.as_deref().and_then(parse_override).map(|(l, _)| l);
        Ok(KeyState {
            key: key.clone(),
            max_concurrent: own.or(per_key),
            overridden: own.is_some(),
            running,
            queued,
        })
    }

    /// Every override of `tenant` (at most `MAX_KEY_OVERRIDES`), with what each key holds
    /// now, ordered by key: two round trips.
    pub async fn key_overrides(&self, tenant: &TenantId) -> Result<Vec<KeyState>, StoreError> {
        let shard = self.shard_of(tenant);
        let mut c = self.conn();
        let all: Vec<(String, String)> = self
            .bounded(
                redis::cmd("HGETALL")
                    .arg(shard.key_limits(tenant))
                    .query_async(&mut c),
            )
            .await?;
        let mut found: Vec<(String, u32, ConcurrencyKey)> = all
            .iter()
            .filter_map(|(h, v)| {
                let (limit, key) = parse_override(v)?;
                Some((h.clone(), limit, ConcurrencyKey::parse(key).ok()?))
            })
            .collect();
        found.sort_by(|a, b| a.2.as_str().cmp(b.2.as_str()));
        if found.is_empty() {
            return Ok(Vec::new());
        }
        let mut p = redis::pipe();
        for (h, _, _) in &found {
            p.scard(shard.key_running(tenant, h))
                .zcard(shard.key_queue(tenant, h));
        }
        let counts: Vec<u64> = self.bounded(p.query_async(&mut c)).await?;
        Ok(found
            .into_iter()
            .zip(counts.chunks(2))
            .map(|((_, limit, key), n)| KeyState {
                key,
                max_concurrent: Some(limit),
                overridden: true,
                running: n[0],
                queued: n.get(1).copied().unwrap_or(0),
            })
            .collect())
    }
}

script_call! {
    /// `migrations-lua/key_limit.lua`: sets or drops one concurrency key's own limit.
    pub(super) struct KeyLimitCall<'a> {
        keys { cfg, key_limits, key_blocked, key_queue, key_running, waiting, runnable }
        args {
            tenant: &'a str,
            digest: &'a str,
            key: &'a str,
            limit: String,
            most: u32,
        }
    }
}
