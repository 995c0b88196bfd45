//! A tenant's webhook on Redis: its settings (`migrations-lua/webhook.lua`, in the tenant's
//! cfg), its outbox (the stream the scripts that end executions append to, see "Webhooks" in
//! `migrations-lua/common.lua`), its delivery log and the lock that lets one `serve` at a time
//! deliver it. What is sent, and when, is `crate::delivery`'s.

use std::collections::HashMap;
use std::time::Duration;

use redis::Value;

use super::call::script_call;
use super::row::split_tag;
use super::{Shard, Store, StoreError};
use crate::domain::TenantId;

/// Most records a tenant's delivery log keeps (the newest).
pub const DELIVERY_LOG_CAP: usize = 200;

/// A tenant's webhook as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Webhook {
    pub url: String,
    /// `whsec_` and the base64 of the signing key (the Standard Webhooks form).
    pub secret: String,
    /// When it was first set (ms).
    pub created_ms: u64,
}

/// A tenant's webhook and how its deliveries go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookState {
    pub url: String,
    pub created_ms: u64,
    /// Events in the outbox, not delivered yet.
    pub pending: u64,
    /// Events dropped undelivered: evicted from a full outbox, or older than the age bound.
    pub dropped: u64,
    /// Events delivered (a 2xx answer).
    pub delivered: u64,
    /// Delivery attempts that failed (an error, a time-out, an answer other than 2xx).
    pub failed_attempts: u64,
    /// The last delivery (ms), if any.
    pub last_delivered_ms: Option<u64>,
}

/// What setting a webhook did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WebhookSet {
    /// Set; `fresh`: its secret is the one given (else the one it had is kept).
    Set { fresh: bool },
    /// No secret was given and the tenant has none: nothing written.
    NoSecret,
    /// The tenant is being deleted: nothing written.
    Deleting,
}

/// One event of an outbox, as the script wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxEntry {
    /// The stream id (`<ms>-<n>`): the entry's place in its outbox.
    pub entry_id: String,
    /// `completed`, `failed`, `cancelled` or `deleted`.
    pub kind: String,
    pub execution_id: String,
    /// Counted per execution, from 1.
    pub seq: u64,
    /// When the change happened (ms, Redis's clock).
    pub at_ms: u64,
    pub fields: HashMap<String, String>,
}

/// One delivery attempt, as the log keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryRecord {
    /// When the attempt ended (ms).
    pub at_ms: u64,
    /// The `webhook-id` it carried.
    pub webhook_id: String,
    pub event_type: String,
    pub execution_id: String,
    /// The receiver's status code, if it answered.
    pub status: Option<u16>,
    /// Why it failed, if it did.
    pub error: Option<String>,
    pub duration_ms: u64,
    /// The how-manieth attempt of this event by this server.
    pub attempt: u32,
}

impl DeliveryRecord {
    /// Whether the receiver took it (a 2xx answer).
    pub fn delivered(&self) -> bool {
        self.status.is_some_and(|s| (200..300).contains(&s))
    }
}

impl Store {
    /// Runs `webhook.lua` for `tenant` (sent on, once, to the shard a fresh pin names).
    async fn webhook_op(
        &self,
        tenant: &TenantId,
        op: &str,
        operands: &[String],
    ) -> Result<Vec<Value>, StoreError> {
        for _ in 0..2 {
            let shard = self.shard_of(tenant);
            let inv = self.shard_call(
                shard,
                &WebhookCall {
                    cfg: shard.tenant_config(tenant),
                    outbox: shard.outbox(tenant),
                    webhooks: shard.webhooks(),
                    tenant: tenant.as_str(),
                    op,
                    operands,
                },
            );
            let mut c = self.conn();
            let reply: Vec<Value> = self.bounded(inv.invoke_async(&mut c)).await?;
            let (tag, _) = split_tag(reply.clone())?;
            if tag == "moved" {
                self.refresh_pins().await?;
                continue;
            }
            return Ok(reply);
        }
        Err(StoreError::Corrupt(format!(
            "tenant {tenant} was sent on twice"
        )))
    }

    /// Sets `tenant`'s webhook address; `secret` replaces its signing secret (`None` keeps
    /// the one it has).
    pub async fn set_webhook(
        &self,
        tenant: &TenantId,
        url: &str,
        secret: Option<&str>,
        now_ms: u64,
    ) -> Result<WebhookSet, StoreError> {
        let operands = [
            url.to_owned(),
            secret.unwrap_or_default().to_owned(),
            now_ms.to_string(),
        ];
        let (tag, rest) = split_tag(self.webhook_op(tenant, "set", &operands).await?)?;
        match tag.as_str() {
            "ok" => Ok(WebhookSet::Set {
                fresh: number(&rest, 0)? == 1,
            }),
            "no_secret" => Ok(WebhookSet::NoSecret),
            "deleting" => Ok(WebhookSet::Deleting),
            other => Err(StoreError::Corrupt(format!("webhook.lua replied {other}"))),
        }
    }

    /// Removes `tenant`'s webhook and drops what its outbox still held: `None` when it had
    /// none, else how many events were dropped.
    pub async fn clear_webhook(&self, tenant: &TenantId) -> Result<Option<u64>, StoreError> {
        let (_, rest) = split_tag(self.webhook_op(tenant, "clear", &[]).await?)?;
        let n = number(&rest, 0)?;
        Ok((n >= 0).then_some(n as u64))
    }

    /// Drops the events of `tenant`'s outbox older than `max_age` (by Redis's stream ids,
    /// which are Redis's clock), counting them as dropped; how many.
    pub async fn trim_outbox(
        &self,
        tenant: &TenantId,
        now_ms: u64,
        max_age: Duration,
    ) -> Result<u64, StoreError> {
        let oldest = now_ms.saturating_sub(max_age.as_millis() as u64);
        let operands = [format!("{oldest}-0")];
        let (_, rest) = split_tag(self.webhook_op(tenant, "trim", &operands).await?)?;
        Ok(number(&rest, 0)?.max(0) as u64)
    }

    /// `tenant`'s webhook (with its secret), if it has one: for delivering.
    pub async fn webhook(&self, tenant: &TenantId) -> Result<Option<Webhook>, StoreError> {
        let shard = self.shard_of(tenant);
        let mut c = self.conn();
        let (url, secret, at): (Option<String>, Option<String>, Option<u64>) = self
            .bounded(
                redis::cmd("HMGET")
                    .arg(shard.tenant_config(tenant))
                    .arg("wh_url")
                    .arg("wh_secret")
                    .arg("wh_at")
                    .query_async(&mut c),
            )
            .await?;
        Ok(match (url, secret) {
            (Some(url), Some(secret)) => Some(Webhook {
                url,
                secret,
                created_ms: at.unwrap_or(0),
            }),
            _ => None,
        })
    }

    /// `tenant`'s webhook (not its secret) and its delivery counts; `None` when it has none.
    pub async fn webhook_state(
        &self,
        tenant: &TenantId,
    ) -> Result<Option<WebhookState>, StoreError> {
        let shard = self.shard_of(tenant);
        let mut c = self.conn();
        type Fields = (
            Option<String>,
            Option<u64>,
            Option<u64>,
            Option<u64>,
            Option<u64>,
            Option<u64>,
        );
        let (fields, pending): (Fields, u64) = self
            .bounded(
                redis::pipe()
                    .cmd("HMGET")
                    .arg(shard.tenant_config(tenant))
                    .arg(&[
                        "wh_url",
                        "wh_at",
                        "wh_dropped",
                        "wh_delivered",
                        "wh_failed",
                        "wh_last",
                    ])
                    .xlen(shard.outbox(tenant))
                    .query_async(&mut c),
            )
            .await?;
        let (url, at, dropped, delivered, failed, last) = fields;
        Ok(url.map(|url| WebhookState {
            url,
            created_ms: at.unwrap_or(0),
            pending,
            dropped: dropped.unwrap_or(0),
            delivered: delivered.unwrap_or(0),
            failed_attempts: failed.unwrap_or(0),
            last_delivered_ms: last,
        }))
    }

    /// The shard's tenants that have a webhook.
    pub async fn webhook_tenants(&self, shard: Shard) -> Result<Vec<TenantId>, StoreError> {
        let mut c = self.conn();
        let names: Vec<String> = self
            .bounded(
                redis::cmd("SMEMBERS")
                    .arg(shard.webhooks())
                    .query_async(&mut c),
            )
            .await?;
        Ok(names
            .iter()
            .filter_map(|t| TenantId::parse(t).ok())
            .collect())
    }

    /// The oldest `count` events of `tenant`'s outbox.
    pub async fn outbox_head(
        &self,
        tenant: &TenantId,
        count: usize,
    ) -> Result<Vec<OutboxEntry>, StoreError> {
        let shard = self.shard_of(tenant);
        let mut c = self.conn();
        let raw: Vec<(String, HashMap<String, String>)> = self
            .bounded(
                redis::cmd("XRANGE")
                    .arg(shard.outbox(tenant))
                    .arg("-")
                    .arg("+")
                    .arg("COUNT")
                    .arg(count)
                    .query_async(&mut c),
            )
            .await?;
        Ok(raw
            .into_iter()
            .map(|(entry_id, mut fields)| {
                let mut take = |name: &str| fields.remove(name).unwrap_or_default();
                let (kind, execution_id) = (take("type"), take("id"));
                let (seq, at_ms) = (
                    take("seq").parse().unwrap_or(0),
                    take("at").parse().unwrap_or(0),
                );
                OutboxEntry {
                    entry_id,
                    kind,
                    execution_id,
                    seq,
                    at_ms,
                    fields,
                }
            })
            .collect())
    }

    /// Records delivery attempts of `tenant`'s events in one round trip: the delivered ones
    /// leave the outbox (only now: until a 2xx they stay, and are sent again), every attempt
    /// goes to the delivery log, and the counts move.
    pub async fn record_deliveries(
        &self,
        tenant: &TenantId,
        attempts: &[(String, DeliveryRecord)],
    ) -> Result<(), StoreError> {
        if attempts.is_empty() {
            return Ok(());
        }
        let shard = self.shard_of(tenant);
        let cfg = shard.tenant_config(tenant);
        let mut p = redis::pipe();
        let (mut ok, mut failed, mut last) = (0u64, 0u64, 0u64);
        for (entry_id, r) in attempts {
            if r.delivered() {
                p.cmd("XDEL")
                    .arg(shard.outbox(tenant))
                    .arg(entry_id)
                    .ignore();
                ok += 1;
                last = last.max(r.at_ms);
            } else {
                failed += 1;
            }
            p.cmd("XADD")
                .arg(shard.delivery_log(tenant))
                .arg("MAXLEN")
                .arg("~")
                .arg(DELIVERY_LOG_CAP)
                .arg("*")
                .arg("at")
                .arg(r.at_ms)
                .arg("wid")
                .arg(&r.webhook_id)
                .arg("type")
                .arg(&r.event_type)
                .arg("id")
                .arg(&r.execution_id)
                .arg("status")
                .arg(r.status.map(|s| s.to_string()).unwrap_or_default())
                .arg("error")
                .arg(r.error.as_deref().unwrap_or_default())
                .arg("ms")
                .arg(r.duration_ms)
                .arg("attempt")
                .arg(r.attempt)
                .ignore();
        }
        if ok > 0 {
            p.cmd("HINCRBY")
                .arg(&cfg)
                .arg("wh_delivered")
                .arg(ok)
                .ignore();
            p.cmd("HSET").arg(&cfg).arg("wh_last").arg(last).ignore();
        }
        if failed > 0 {
            p.cmd("HINCRBY")
                .arg(&cfg)
                .arg("wh_failed")
                .arg(failed)
                .ignore();
        }
        let mut c = self.conn();
        let () = self.bounded(p.query_async(&mut c)).await?;
        Ok(())
    }

    /// The newest `limit` delivery attempts of `tenant`, newest first.
    pub async fn delivery_log(
        &self,
        tenant: &TenantId,
        limit: usize,
    ) -> Result<Vec<DeliveryRecord>, StoreError> {
        let shard = self.shard_of(tenant);
        let mut c = self.conn();
        let raw: Vec<(String, HashMap<String, String>)> = self
            .bounded(
                redis::cmd("XREVRANGE")
                    .arg(shard.delivery_log(tenant))
                    .arg("+")
                    .arg("-")
                    .arg("COUNT")
                    .arg(limit)
                    .query_async(&mut c),
            )
            .await?;
        Ok(raw
            .into_iter()
            .map(|(_, mut f)| {
                let mut take = |name: &str| f.remove(name).unwrap_or_default();
                DeliveryRecord {
                    at_ms: take("at").parse().unwrap_or(0),
                    webhook_id: take("wid"),
                    event_type: take("type"),
                    execution_id: take("id"),
                    status: take("status").parse().ok(),
                    error: Some(take("error")).filter(|e| !e.is_empty()),
                    duration_ms: take("ms").parse().unwrap_or(0),
                    attempt: take("attempt").parse().unwrap_or(1),
                }
            })
            .collect())
    }

    /// Takes (or keeps, when `holder` has it already) the right to deliver `tenant`'s outbox
    /// for `ttl`: `None` when this holder has it now, else how long the other holder's
    /// right still lasts.
    pub async fn hold_delivery(
        &self,
        tenant: &TenantId,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<Duration>, StoreError> {
        let key = self.shard_of(tenant).delivery_lock(tenant);
        let ms = ttl.as_millis().max(1) as u64;
        let mut c = self.conn();
        let (taken, now, left): (Option<String>, Option<String>, i64) = self
            .bounded(
                redis::pipe()
                    .cmd("SET")
                    .arg(&key)
                    .arg(holder)
                    .arg("NX")
                    .arg("PX")
                    .arg(ms)
                    .get(&key)
                    .cmd("PTTL")
                    .arg(&key)
                    .query_async(&mut c),
            )
            .await?;
        if taken.is_some() {
            return Ok(None);
        }
        if now.as_deref() != Some(holder) {
            return Ok(Some(Duration::from_millis(left.max(1) as u64)));
        }
        let _: i64 = self
            .bounded(redis::cmd("PEXPIRE").arg(&key).arg(ms).query_async(&mut c))
            .await?;
        Ok(None)
    }

    /// Gives up the right to deliver `tenant`'s outbox, if `holder` has it.
    pub async fn release_delivery(
        &self,
        tenant: &TenantId,
        holder: &str,
    ) -> Result<(), StoreError> {
        self.release_mark(&self.shard_of(tenant).delivery_lock(tenant), holder)
            .await
    }

    /// Deletes the mark `key` (a `SET NX PX` holder name) if `holder` still has it. A GET
    /// then a DEL: only a mark that expired in between and was taken by another can be
    /// removed, and a holder never keeps a mark past its own expiry.
    pub(super) async fn release_mark(&self, key: &str, holder: &str) -> Result<(), StoreError> {
        let mut c = self.conn();
        let now: Option<String> = self
            .bounded(redis::cmd("GET").arg(key).query_async(&mut c))
            .await?;
        if now.as_deref() == Some(holder) {
            let _: i64 = self
                .bounded(redis::cmd("DEL").arg(key).query_async(&mut c))
                .await?;
        }
        Ok(())
    }
}

/// The integer at `i` of a script reply's rest.
fn number(rest: &[Value], i: usize) -> Result<i64, StoreError> {
    Ok(redis::from_redis_value(rest.get(i).cloned().ok_or_else(
        || StoreError::Corrupt("webhook.lua reply too short".into()),
    )?)?)
}

script_call! {
    /// `migrations-lua/webhook.lua`: one operation on a tenant's webhook.
    pub(super) struct WebhookCall<'a> {
        keys { cfg, outbox, webhooks }
        args { tenant: &'a str, op: &'a str }
        arg_tail { operands: &'a [String] }
    }
}
