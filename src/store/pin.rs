//! Pinning a hot tenant to a shard of its own.
//!
//! A tenant's quota, FIFO and dedup live in one hash slot, so one tenant can use at most one
//! master's core; and tenants hashed to the same shard share its master. A tenant expected to
//! be hot can be given one of the dedicated shards (numbered after the hashed ones, see
//! `ShardMap`), which `sluice cluster move-shard` can then put on a master of its own.
//!
//! The pins live in one `{meta}` hash: `t:<tenant>` → shard number, and `s:<number>` → tenant
//! (claimed with HSETNX, so two pins never share a shard). Every process reads them at start
//! and whenever Redis says it routed a tenant to the wrong shard: `pin.lua` marks the tenant
//! in its hashed shard, and `admit.lua` and `set_limits.lua` answer `moved` there. Only a
//! tenant with nothing in its hashed shard can be pinned (its executions cannot follow it to
//! another slot atomically): pin a tenant before it starts, or after it has drained and its
//! rows have expired or been deleted. Unpinning (`unpin_tenant`) is the same move backwards,
//! under the same rule: only a tenant with nothing on its dedicated shard moves back.
//!
//! Between refreshes a process's copy of the pins may be stale: a tenant pinned through
//! another server a moment ago still looks hashed here. Writes are safe (the scripts answer
//! `moved`), and lookups by id (read, wait, cancel, retry, force delete) that find nothing in
//! the cached shard ask Redis for that one tenant's pin before answering "not found"
//! (`repinned`): one `HGET` per miss, and a second lookup only when the pin changed.

use std::collections::HashMap;

use redis::Value;

use super::call::script_call;
use super::row::split_tag;
use super::{Shard, Store, StoreError, keys};
use crate::domain::TenantId;

/// What pinning a tenant did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pin {
    /// The tenant is pinned to this dedicated shard (now, or since before).
    Pinned(Shard),
    /// The tenant has this many executions in its hashed shard: nothing changed.
    Busy(u64),
    /// Every dedicated shard is taken (see `--dedicated-shards`): nothing changed.
    NoneFree,
}

/// What unpinning a tenant did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unpin {
    /// The tenant is back on its hashed shard; this dedicated shard is free again.
    Unpinned(Shard),
    /// The tenant was not pinned: nothing changed.
    NotPinned,
    /// The tenant has this many executions on its dedicated shard: nothing changed.
    Busy(u64),
}

/// What `pin.lua` did with a tenant asked to move from one shard to another.
enum Moved {
    /// It has this many executions (and webhook events not delivered yet) on the shard it
    /// was to leave: it stays.
    Busy(u64),
    /// It moved to this shard number, with its limits (`max_concurrent`, `max_queued`,
    /// `enabled`, `weight`, `max_concurrent_per_key`, `rate`, `key_rate`, '' for none of its
    /// own), its webhook (address, secret, when set; '' for none), its storage bounds
    /// (`max_bytes`, `max_retained`, '' for the server's), then its concurrency keys'
    /// overrides as field, value pairs, to be set there.
    To(u16, Vec<String>),
}

impl Store {
    /// The shard holding `tenant`'s keys: its dedicated one when pinned, else its hashed one.
    pub fn shard_of(&self, tenant: &TenantId) -> Shard {
        let pinned = self
            .pins
            .read()
            .expect("pins")
            .get(tenant.as_str())
            .copied();
        match pinned {
            Some(n) => self.shards.shard(n),
            None => self.shards.shard_of(tenant),
        }
    }

    /// Reads the pins again (at start, and when a script says a tenant moved).
    pub async fn refresh_pins(&self) -> Result<(), StoreError> {
        let mut c = self.conn();
        let all: HashMap<String, String> = self
            .bounded(redis::cmd("HGETALL").arg(keys::pins()).query_async(&mut c))
            .await?;
        let total = self.shards.count() + self.shards.dedicated();
        let pins = all
            .iter()
            .filter_map(|(k, v)| Some((k.strip_prefix("t:")?.to_owned(), v.parse().ok()?)))
            .filter(|(_, n): &(String, u16)| *n >= self.shards.count() && *n < total)
            .collect();
        *self.pins.write().expect("pins") = pins;
        Ok(())
    }

    /// After a lookup by id in `tenant`'s shard as this process knows it: when it `missed`
    /// and Redis pins the tenant elsewhere than the cached pins say (another server pinned it
    /// since the last refresh), the pins are read again and the shard to look in once more is
    /// returned. So an execution admitted through a server that knew the pin is never answered
    /// 404 by one that did not yet. Nothing is asked of Redis after a hit.
    pub(super) async fn repinned(
        &self,
        tenant: &TenantId,
        missed: bool,
    ) -> Result<Option<Shard>, StoreError> {
        if missed && self.pin_changed(tenant).await? {
            Ok(Some(self.shard_of(tenant)))
        } else {
            Ok(None)
        }
    }

    /// Whether Redis pins `tenant` to another shard than this process's copy of the pins says;
    /// when it does, the copy is read again. One `HGET` when nothing changed.
    pub async fn pin_changed(&self, tenant: &TenantId) -> Result<bool, StoreError> {
        let mut c = self.conn();
        let on_redis: Option<String> = self
            .bounded(
                redis::cmd("HGET")
                    .arg(keys::pins())
                    .arg(format!("t:{tenant}"))
                    .query_async(&mut c),
            )
            .await?;
        let total = self.shards.count() + self.shards.dedicated();
        let on_redis = on_redis
            .and_then(|v| v.parse::<u16>().ok())
            .filter(|n| *n >= self.shards.count() && *n < total);
        let cached = self
            .pins
            .read()
            .expect("pins")
            .get(tenant.as_str())
            .copied();
        if on_redis == cached {
            return Ok(false);
        }
        self.refresh_pins().await?;
        Ok(true)
    }

    /// Gives `tenant` a dedicated shard of its own (see the module comment).
    pub async fn pin_tenant(&self, tenant: &TenantId) -> Result<Pin, StoreError> {
        self.refresh_pins().await?;
        let hashed = self.shards.shard_of(tenant);
        let current = self.shard_of(tenant);
        if current != hashed {
            return Ok(Pin::Pinned(current));
        }
        let Some(target) = self.claim_dedicated(tenant).await? else {
            return Ok(Pin::NoneFree);
        };
        let moved = self.move_away(tenant, hashed, target).await?;
        let mut c = self.conn();
        match moved {
            Moved::Busy(held) => {
                let _: Value = self
                    .bounded(
                        redis::cmd("HDEL")
                            .arg(keys::pins())
                            .arg(format!("s:{}", target.number()))
                            .query_async(&mut c),
                    )
                    .await?;
                Ok(Pin::Busy(held))
            }
            Moved::To(number, limits) => {
                let shard = self.shards.shard(number);
                // The tenant's own limits go with it; absent ones stay the server defaults.
                self.make_home(shard, tenant, limits).await?;
                let () = self
                    .bounded(
                        redis::cmd("HSET")
                            .arg(keys::pins())
                            .arg(format!("t:{tenant}"))
                            .arg(number)
                            .query_async(&mut c),
                    )
                    .await?;
                self.refresh_pins().await?;
                Ok(Pin::Pinned(shard))
            }
        }
    }

    /// Moves a pinned tenant back to its hashed shard and frees its dedicated one, if it has
    /// no executions there (the same rule as pinning, for the same reason). Safe to repeat:
    /// an interrupted unpin is finished by the next one, and a tenant not pinned is left as it
    /// is (`Unpin::NotPinned`).
    ///
    /// The steps, each safe to stop after: `pin.lua` on the dedicated shard marks the tenant
    /// there as moved to its hashed shard (so a server that has not reread the pins is sent
    /// on, as after a pin) and returns its limits; `pin_home.lua` on the hashed shard drops the
    /// marker the pin left there and sets those limits; then the pins hash forgets both.
    pub async fn unpin_tenant(&self, tenant: &TenantId) -> Result<Unpin, StoreError> {
        self.refresh_pins().await?;
        let hashed = self.shards.shard_of(tenant);
        let pinned = self.shard_of(tenant);
        if pinned == hashed {
            return Ok(Unpin::NotPinned);
        }
        let moved = self.move_away(tenant, pinned, hashed).await?;
        let mut c = self.conn();
        match moved {
            Moved::Busy(held) => Ok(Unpin::Busy(held)),
            Moved::To(_, limits) => {
                self.make_home(hashed, tenant, limits).await?;
                let slot = format!("s:{}", pinned.number());
                let holder: Option<String> = self
                    .bounded(
                        redis::cmd("HGET")
                            .arg(keys::pins())
                            .arg(&slot)
                            .query_async(&mut c),
                    )
                    .await?;
                let mut forget = redis::pipe();
                forget.hdel(keys::pins(), format!("t:{tenant}"));
                if holder.as_deref() == Some(tenant.as_str()) {
                    forget.hdel(keys::pins(), slot);
                }
                let _: Value = self.bounded(forget.query_async(&mut c)).await?;
                self.refresh_pins().await?;
                Ok(Unpin::Unpinned(pinned))
            }
        }
    }

    /// Runs `pin.lua` on `from`: `tenant` moves to shard `to` if it has no executions on
    /// `from` (its limits come back, to be set on `to`), else nothing changes.
    async fn move_away(
        &self,
        tenant: &TenantId,
        from: Shard,
        to: Shard,
    ) -> Result<Moved, StoreError> {
        let inv = self.shard_call(
            from,
            &PinCall {
                cfg: from.tenant_config(tenant),
                slots: from.slots(tenant),
                waiting: from.waiting(tenant),
                deleting: from.deleting(tenant),
                listing: from.listing(tenant),
                tenant: tenant.as_str(),
                to: to.number(),
            },
        );
        let mut c = self.conn();
        let reply: Vec<Value> = self.bounded(inv.invoke_async(&mut c)).await?;
        let (tag, rest) = split_tag(reply)?;
        let text = |i: usize| -> Result<String, StoreError> {
            Ok(redis::from_redis_value(rest.get(i).cloned().ok_or_else(
                || StoreError::Corrupt("pin reply too short".into()),
            )?)?)
        };
        match tag.as_str() {
            "busy" => Ok(Moved::Busy(text(0)?.parse().unwrap_or(0))),
            "pinned" => {
                let number: u16 = text(0)?
                    .parse()
                    .map_err(|_| StoreError::Corrupt("pin reply: bad shard".into()))?;
                let limits = (1..rest.len()).map(text).collect::<Result<Vec<_>, _>>()?;
                // Twelve fixed values (limits, webhook, storage bounds), then field and value
                // pairs.
                if limits.len() < 12 || limits.len() % 2 == 1 {
                    return Err(StoreError::Corrupt("pin reply: bad limits".into()));
                }
                Ok(Moved::To(number, limits))
            }
            other => Err(StoreError::Corrupt(format!("pin replied {other}"))),
        }
    }

    /// Runs `pin_home.lua`: `shard` becomes `tenant`'s home with exactly these limits (as
    /// `pin.lua` replies them, see `Moved::To`).
    async fn make_home(
        &self,
        shard: Shard,
        tenant: &TenantId,
        limits: Vec<String>,
    ) -> Result<(), StoreError> {
        let [
            max_concurrent,
            max_queued,
            enabled,
            weight,
            max_concurrent_per_key,
            rate,
            key_rate,
            webhook,
            secret,
            webhook_set,
            max_bytes,
            max_retained,
            overrides @ ..,
        ] = limits.as_slice()
        else {
            return Err(StoreError::Corrupt("pin reply: bad limits".into()));
        };
        let inv = self.shard_call(
            shard,
            &PinHomeCall {
                cfg: shard.tenant_config(tenant),
                tenant: tenant.as_str(),
                max_concurrent,
                max_queued,
                // `enabled` is '0' (disabled) or the default.
                enabled: if enabled == "0" { "0" } else { "" },
                weight,
                max_concurrent_per_key,
                rate,
                key_rate,
                webhook,
                secret,
                webhook_set,
                max_bytes,
                max_retained,
                overrides,
            },
        );
        let mut c = self.conn();
        let _: i64 = self.bounded(inv.invoke_async(&mut c)).await?;
        Ok(())
    }

    /// Claims a free dedicated shard for `tenant` (or finds the one it claimed before).
    async fn claim_dedicated(&self, tenant: &TenantId) -> Result<Option<Shard>, StoreError> {
        let mut c = self.conn();
        let (count, dedicated) = (self.shards.count(), self.shards.dedicated());
        for n in count..count + dedicated {
            let (_, holder): (Value, Option<String>) = self
                .bounded(
                    redis::pipe()
                        .hset_nx(keys::pins(), format!("s:{n}"), tenant.as_str())
                        .hget(keys::pins(), format!("s:{n}"))
                        .query_async(&mut c),
                )
                .await?;
            if holder.as_deref() == Some(tenant.as_str()) {
                return Ok(Some(self.shards.shard(n)));
            }
        }
        Ok(None)
    }
}

script_call! {
    /// `migrations-lua/pin.lua`: moves a tenant without executions here to dedicated shard
    /// `to`.
    pub(super) struct PinCall<'a> {
        keys { cfg, slots, waiting, deleting, listing }
        args { tenant: &'a str, to: u16 }
    }
}

script_call! {
    /// `migrations-lua/pin_home.lua`: makes a shard a tenant's home with the limits `pin.lua`
    /// replied.
    pub(super) struct PinHomeCall<'a> {
        keys { cfg }
        args {
            tenant: &'a str,
            max_concurrent: &'a str,
            max_queued: &'a str,
            enabled: &'a str,
            weight: &'a str,
            max_concurrent_per_key: &'a str,
            rate: &'a str,
            key_rate: &'a str,
            webhook: &'a str,
            secret: &'a str,
            webhook_set: &'a str,
            max_bytes: &'a str,
            max_retained: &'a str,
        }
        arg_tail { overrides: &'a [String] }
    }
}
