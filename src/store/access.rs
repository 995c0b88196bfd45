//! Access data on Redis: the tenant registry and tenant API keys. Everything here lives under
//! the `{acl}` hash tag (see `keys::acl_prefix` for why not in the tenants' shards); a tenant's
//! limits and executions stay in its shard and are handled in `store/tenants.rs`.
//!
//! Key lookups are not cached here: `crate::revocation` remembers verified keys for half a
//! second and unknown tokens for ten, forgets a key when the news of its revocation or its
//! tenant's deletion arrives, and ends open waits.

use std::collections::HashMap;

use super::call::script_call;
use super::{Store, StoreError, keys};
use crate::access::{AccessChange, GeneratedKey, KeyId, KeyOrigin, KeyRole, PresentedKey};
use crate::domain::TenantId;

/// What an API key grants (never its secret or hash).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKeyRecord {
    pub id: KeyId,
    pub tenant: TenantId,
    pub role: KeyRole,
    /// A label chosen at creation, e.g. "ci" or "console".
    pub name: Option<String>,
    /// Creation time, ms since the epoch.
    pub created_ms: i64,
}

/// Outcome of creating a key.
#[derive(Debug)]
pub enum KeyCreation {
    /// Stored; the token inside is shown once.
    Created(ApiKeyRecord, GeneratedKey),
    /// The tenant is not registered (create it with `PUT /api/tenants/{tenant}` first).
    NoTenant,
}

impl Store {
    /// Adds a tenant to the registry (idempotent).
    pub async fn register_tenant(&self, tenant: &TenantId) -> Result<(), StoreError> {
        let mut c = self.conn();
        let _: i64 = self
            .bounded(
                redis::cmd("ZADD")
                    .arg(keys::tenants())
                    .arg(0)
                    .arg(tenant.as_str())
                    .query_async(&mut c),
            )
            .await?;
        Ok(())
    }

    /// Whether `tenant` is in the registry (`PUT /api/tenants/{tenant}` put it there).
    pub async fn tenant_registered(&self, tenant: &TenantId) -> Result<bool, StoreError> {
        let mut c = self.conn();
        let score: Option<f64> = self
            .bounded(
                redis::cmd("ZSCORE")
                    .arg(keys::tenants())
                    .arg(tenant.as_str())
                    .query_async(&mut c),
            )
            .await?;
        Ok(score.is_some())
    }

    /// Up to `limit` registered tenants after `after` (exclusive), in id order, and whether
    /// more follow. One round trip whatever the registry's size.
    pub async fn list_tenants(
        &self,
        after: Option<&TenantId>,
        limit: usize,
    ) -> Result<(Vec<TenantId>, bool), StoreError> {
        let mut c = self.conn();
        let min = after.map_or_else(|| "-".to_owned(), |t| format!("({t}"));
        let ids: Vec<String> = self
            .bounded(
                redis::cmd("ZRANGE")
                    .arg(keys::tenants())
                    .arg(min)
                    .arg("+")
                    .arg("BYLEX")
                    .arg("LIMIT")
                    .arg(0)
                    .arg(limit + 1)
                    .query_async(&mut c),
            )
            .await?;
        let more = ids.len() > limit;
        let ids = ids
            .iter()
            .take(limit)
            .map(|t| TenantId::parse(t).map_err(|e| StoreError::Corrupt(e.detail)))
            .collect::<Result<_, _>>()?;
        Ok((ids, more))
    }

    /// Unregisters a tenant, revokes all its keys and drops its own limits (the server defaults
    /// apply again). Its executions are left to run their course: the waiting ones that fit the
    /// default limits are dispatched now, the rest as slots free up, so none is stranded.
    /// Returns whether it was registered.
    pub async fn delete_tenant(&self, tenant: &TenantId) -> Result<bool, StoreError> {
        let inv = self.tag_call(&TenantDeleteCall {
            tenants: keys::tenants(),
            keyset: keys::tenant_keys(tenant),
            tenant: tenant.as_str(),
        });
        let mut c = self.conn();
        let revoked: i64 = self.bounded(inv.invoke_async(&mut c)).await?;
        if revoked >= 0 {
            self.announce(AccessChange::TenantDeleted(tenant.clone()))
                .await;
        }
        // Its own limits and weight go back to the defaults through the script (which keeps
        // the shard's eligible weight in step), then its configuration goes.
        let shard = self.shard_of(tenant);
        let defaults = super::TenantLimits {
            max_concurrent: super::Change::Reset,
            max_queued: super::Change::Reset,
            enabled: super::Change::Reset,
            weight: super::Change::Reset,
            max_concurrent_per_key: super::Change::Reset,
            rate_limit: super::Change::Reset,
            rate_limit_per_key: super::Change::Reset,
            max_bytes: super::Change::Reset,
            max_retained: super::Change::Reset,
        };
        self.set_limits_in(shard, tenant, &defaults).await?;
        // Its webhook goes, with the events it had not delivered yet.
        self.clear_webhook(tenant).await?;
        let cfg = shard.tenant_config(tenant);
        let _: i64 = self
            .bounded(
                redis::cmd("DEL")
                    .arg(cfg)
                    .arg(shard.key_limits(tenant))
                    .query_async(&mut c),
            )
            .await?;
        self.promote_all(tenant).await?;
        Ok(revoked >= 0)
    }

    /// Generates and stores a key for a registered tenant (`origin`: see `KeyOrigin`).
    pub async fn create_api_key(
        &self,
        tenant: &TenantId,
        role: KeyRole,
        name: Option<&str>,
        now_ms: i64,
        origin: KeyOrigin,
    ) -> Result<KeyCreation, StoreError> {
        // A collision of 64 random bits is not expected; the script refuses one anyway, and
        // a second draw settles it.
        for _ in 0..3 {
            let key = GeneratedKey::generate(origin)
                .map_err(|e| StoreError::Unavailable(format!("no randomness: {e}")))?;
            let inv = self.tag_call(&ApiKeyCreateCall {
                record: keys::api_key(key.id.as_str()),
                keyset: keys::tenant_keys(tenant),
                tenants: keys::tenants(),
                id: key.id.as_str(),
                tenant: tenant.as_str(),
                role: role.as_str(),
                hash: &key.secret_hash,
                name: name.unwrap_or(""),
                created_ms: now_ms,
            });
            let mut c = self.conn();
            let reply: String = self.bounded(inv.invoke_async(&mut c)).await?;
            match reply.as_str() {
                "ok" => {
                    self.announce(AccessChange::KeyCreated(key.id.clone()))
                        .await;
                    let record = ApiKeyRecord {
                        id: key.id.clone(),
                        tenant: tenant.clone(),
                        role,
                        name: name.map(str::to_owned),
                        created_ms: now_ms,
                    };
                    return Ok(KeyCreation::Created(record, key));
                }
                "no_tenant" => return Ok(KeyCreation::NoTenant),
                "exists" => continue,
                other => {
                    return Err(StoreError::Corrupt(format!(
                        "api_key_create replied {other}"
                    )));
                }
            }
        }
        Err(StoreError::Corrupt("could not draw a free key id".into()))
    }

    /// How many live keys a tenant has.
    pub async fn count_api_keys(&self, tenant: &TenantId) -> Result<usize, StoreError> {
        let mut c = self.conn();
        self.bounded(
            redis::cmd("SCARD")
                .arg(keys::tenant_keys(tenant))
                .query_async(&mut c),
        )
        .await
    }

    /// A tenant's live keys, in key-id order.
    pub async fn list_api_keys(&self, tenant: &TenantId) -> Result<Vec<ApiKeyRecord>, StoreError> {
        let mut c = self.conn();
        let mut ids: Vec<String> = self
            .bounded(
                redis::cmd("SMEMBERS")
                    .arg(keys::tenant_keys(tenant))
                    .query_async(&mut c),
            )
            .await?;
        ids.sort();
        let ids: Vec<KeyId> = ids.iter().filter_map(|i| KeyId::parse(i)).collect();
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut p = redis::pipe();
        for id in &ids {
            p.hgetall(keys::api_key(id.as_str()));
        }
        let rows: Vec<HashMap<String, String>> = self.bounded(p.query_async(&mut c)).await?;
        let mut out = Vec::with_capacity(ids.len());
        for (id, row) in ids.into_iter().zip(rows) {
            // Revoked between the two reads: simply not listed.
            if row.get("tenant").map(String::as_str) != Some(tenant.as_str()) {
                continue;
            }
            out.push(record_from(id, tenant.clone(), &row)?);
        }
        Ok(out)
    }

    /// Revokes one of a tenant's keys; `false` when it has no such key.
    pub async fn revoke_api_key(&self, tenant: &TenantId, id: &KeyId) -> Result<bool, StoreError> {
        let inv = self.tag_call(&ApiKeyRevokeCall {
            record: keys::api_key(id.as_str()),
            keyset: keys::tenant_keys(tenant),
            id: id.as_str(),
            tenant: tenant.as_str(),
        });
        let mut c = self.conn();
        let revoked: i64 = self.bounded(inv.invoke_async(&mut c)).await?;
        if revoked == 1 {
            self.announce(AccessChange::KeyRevoked(id.clone())).await;
        }
        Ok(revoked == 1)
    }

    /// The tenant and role of a presented key, or `None` when it is unknown, revoked, of a
    /// deleted tenant, or its secret does not match (a dev-auth key matches only when
    /// `accept_dev_auth`).
    pub async fn authenticate_key(
        &self,
        key: &PresentedKey,
        accept_dev_auth: bool,
    ) -> Result<Option<(TenantId, KeyRole)>, StoreError> {
        let Some((tenant, role, hash)) = self.look_up_key(&key.id).await? else {
            return Ok(None);
        };
        if !key.matches(&hash, accept_dev_auth) {
            return Ok(None);
        }
        Ok(Some((tenant, role)))
    }

    /// The tenant of a live key (its record there, its tenant registered): what an open wait
    /// re-checks of a key whose secret was checked when the wait began.
    pub async fn key_tenant(&self, id: &KeyId) -> Result<Option<TenantId>, StoreError> {
        Ok(self.look_up_key(id).await?.map(|(tenant, _, _)| tenant))
    }

    /// A live key's tenant, role and secret hash (`migrations-lua/api_key_auth.lua`).
    async fn look_up_key(
        &self,
        id: &KeyId,
    ) -> Result<Option<(TenantId, KeyRole, String)>, StoreError> {
        let inv = self.tag_call(&ApiKeyAuthCall {
            record: keys::api_key(id.as_str()),
            tenants: keys::tenants(),
            id: id.as_str(),
        });
        let mut c = self.conn();
        let reply: Vec<String> = self.bounded(inv.invoke_async(&mut c)).await?;
        let [tenant, role, hash] = reply.as_slice() else {
            return Ok(None);
        };
        let tenant = TenantId::parse(tenant).map_err(|e| StoreError::Corrupt(e.detail))?;
        let role = KeyRole::parse(role)
            .ok_or_else(|| StoreError::Corrupt(format!("key {id} has role {role}")))?;
        Ok(Some((tenant, role, hash.clone())))
    }

    /// Announces a change of who may call to every server (`crate::revocation`), after the
    /// change is on Redis. A failure is logged, not returned: the change itself happened, and
    /// the re-checks of open waits catch an announcement that was lost.
    async fn announce(&self, change: AccessChange) {
        let mut c = self.conn();
        let sent: Result<i64, StoreError> = self
            .bounded(
                redis::cmd("PUBLISH")
                    .arg(keys::access_channel())
                    .arg(change.to_message())
                    .query_async(&mut c),
            )
            .await;
        if let Err(e) = sent {
            tracing::warn!(error = %e, ?change, "could not announce an access change; open waits find out by their re-check");
        }
    }
}

fn record_from(
    id: KeyId,
    tenant: TenantId,
    row: &HashMap<String, String>,
) -> Result<ApiKeyRecord, StoreError> {
    let corrupt = |what: &str| StoreError::Corrupt(format!("api key {id}: {what}"));
    let role = row
        .get("role")
        .and_then(|r| KeyRole::parse(r))
        .ok_or_else(|| corrupt("bad role"))?;
    let created_ms = row
        .get("created")
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| corrupt("bad created"))?;
    Ok(ApiKeyRecord {
        role,
        name: row.get("name").cloned(),
        created_ms,
        tenant,
        id,
    })
}

script_call! {
    /// `migrations-lua/api_key_create.lua`: stores a new key of a registered tenant.
    pub(super) struct ApiKeyCreateCall<'a> {
        keys { record, keyset, tenants }
        args {
            id: &'a str,
            tenant: &'a str,
            role: &'a str,
            hash: &'a str,
            name: &'a str,
            created_ms: i64,
        }
    }
}

script_call! {
    /// `migrations-lua/api_key_revoke.lua`: revokes one of a tenant's keys.
    pub(super) struct ApiKeyRevokeCall<'a> {
        keys { record, keyset }
        args { id: &'a str, tenant: &'a str }
    }
}

script_call! {
    /// `migrations-lua/api_key_auth.lua`: a live key's tenant, role and secret hash.
    pub(super) struct ApiKeyAuthCall<'a> {
        keys { record, tenants }
        args { id: &'a str }
    }
}

script_call! {
    /// `migrations-lua/tenant_delete.lua`: unregisters a tenant and revokes its keys.
    pub(super) struct TenantDeleteCall<'a> {
        keys { tenants, keyset }
        args { tenant: &'a str }
    }
}
