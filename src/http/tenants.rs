//! `/api/tenants`: the tenant registry, each tenant's limits and live usage. Creating,
//! changing, listing and deleting tenants is the platform admin's; a tenant admin key may read
//! its own tenant. API keys are in `api_keys.rs`.
//!
//! Long on purpose: one handler per route of the resource (tenants, their limits, their
//! concurrency keys), each with its OpenAPI annotation beside its code.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::auth::Caller;
use super::error::{ApiError, Problem, TENANT_DELETING_RETRY_AFTER};
use super::extract::{JsonBody, Path, QueryLater, WholeU32, WholeU64};
use crate::domain::{ConcurrencyKey, TenantId};
use crate::http::actions::Action;
use crate::store::{
    Change, Deletion, KeyLimitChange, KeyState, MAX_KEY_OVERRIDES, MAX_WEIGHT, Pin,
    REAP_INLINE_CALLS, RateLimit, Reaped, TenantLimits, TenantState, Unpin,
};

/// The tenant routes with their OpenAPI documentation.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(put_tenant, get_tenant, delete_tenant))
        .routes(routes!(list_tenants))
        .routes(routes!(pin_tenant, unpin_tenant))
        .routes(routes!(list_concurrency_keys))
        .routes(routes!(
            put_concurrency_key,
            get_concurrency_key,
            delete_concurrency_key
        ))
}

/// Answer of `POST /api/tenants/{tenant}/dedicated-shard`.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"tenant_id": "acme", "shard": 16, "hash_tag": "s16.57"}))]
pub struct DedicatedShard {
    pub tenant_id: String,
    /// The shard's number (dedicated shards come after the hashed ones).
    #[schema(maximum = 65535)]
    pub shard: u16,
    /// The hash tag all the tenant's keys now carry: `CLUSTER KEYSLOT <hash_tag>` names the
    /// slot to move (`sluice cluster move-shard --shard <shard>` does it).
    pub hash_tag: String,
}

/// Pin a tenant to a dedicated shard of its own (platform admin).
///
/// A tenant's quota, FIFO order and dedup live in one Redis hash slot, so on Redis Cluster a
/// tenant uses at most one master, shared with the other tenants hashed to its shard. A
/// tenant expected to be hot gets one of the dedicated shards here (`--dedicated-shards`, 2 by
/// default); `sluice cluster move-shard` can then put that shard on a master of its own. Only a
/// registered tenant (`PUT /api/tenants/{tenant}`) without executions can be pinned (they
/// cannot follow it atomically): pin before it starts. Pinning a pinned tenant answers its
/// shard again. Its own limits move with it. `DELETE` on the same path undoes it.
#[utoipa::path(
    post,
    path = "/api/tenants/{tenant}/dedicated-shard",
    tag = "tenants",
    params(("tenant" = String, Path, pattern = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", description = "Tenant id")),
    responses(
        (status = 200, description = "Pinned (now or before)", body = DedicatedShard),
        (status = 400, description = "Invalid tenant id", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not the platform admin", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "Not a registered tenant (`tenant_not_found`)", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The tenant has executions (`tenant_has_executions`), or every dedicated shard is taken (`no_dedicated_shard_free`)", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn pin_tenant(
    State(state): State<AppState>,
    caller: Caller,
    Path(tenant): Path<String>,
) -> Result<axum::Json<DedicatedShard>, ApiError> {
    caller.require(Action::ManagePlatform)?;
    let tenant = TenantId::parse(&tenant)?;
    // A dedicated shard is scarce and a pin is undone only by the platform admin: none is
    // spent on a name nobody registered (a typo, or a request the admin did not mean).
    if !state.store.tenant_registered(&tenant).await? {
        return Err(tenant_not_found());
    }
    match state.store.pin_tenant(&tenant).await? {
        Pin::Pinned(shard) => Ok(axum::Json(DedicatedShard {
            tenant_id: tenant.to_string(),
            shard: shard.number(),
            hash_tag: shard.tag().to_owned(),
        })),
        Pin::Busy(n) => Err(conflict(
            "tenant_has_executions",
            format!(
                "tenant {tenant} has {n} executions in its shard; only a tenant without executions can be pinned"
            ),
        )),
        Pin::NoneFree => Err(conflict(
            "no_dedicated_shard_free",
            "every dedicated shard is pinned to a tenant already (see --dedicated-shards)".into(),
        )),
    }
}

/// A 409 problem with this code.
fn conflict(code: &'static str, detail: String) -> ApiError {
    ApiError::Status {
        status: StatusCode::CONFLICT,
        code,
        detail,
    }
}

/// Move a pinned tenant back to its hashed shard (platform admin).
///
/// Frees the tenant's dedicated shard for another tenant. As with pinning, only a tenant
/// without executions on its dedicated shard moves (they cannot follow it atomically; their
/// rows expire after the retention period, or force-delete them). Its own limits move with
/// it. A tenant that is not pinned (never, or no longer) is left as it is: 204 as well, so the
/// call can be repeated. It works for a tenant deleted since it was pinned too.
#[utoipa::path(
    delete,
    path = "/api/tenants/{tenant}/dedicated-shard",
    tag = "tenants",
    params(("tenant" = String, Path, pattern = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", description = "Tenant id")),
    responses(
        (status = 204, description = "The tenant is on its hashed shard (moved back now, or it was not pinned)"),
        (status = 400, description = "Invalid tenant id", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not the platform admin", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The tenant has executions on its dedicated shard (`tenant_has_executions`)", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn unpin_tenant(
    State(state): State<AppState>,
    caller: Caller,
    Path(tenant): Path<String>,
) -> Result<StatusCode, ApiError> {
    caller.require(Action::ManagePlatform)?;
    let tenant = TenantId::parse(&tenant)?;
    match state.store.unpin_tenant(&tenant).await? {
        Unpin::Unpinned(_) | Unpin::NotPinned => Ok(StatusCode::NO_CONTENT),
        Unpin::Busy(n) => Err(conflict(
            "tenant_has_executions",
            format!(
                "tenant {tenant} has {n} executions on its dedicated shard; only a tenant without executions there can be unpinned"
            ),
        )),
    }
}

/// Body of `PUT /api/tenants/{tenant}`: only the fields it names change. A field absent keeps
/// its current value (the server default for a tenant never set); `null` drops the tenant's
/// own value so the server default applies again.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"max_concurrent": 10, "max_queued": 1000, "enabled": true, "weight": 3, "max_concurrent_per_key": 2}))]
pub struct TenantSettings {
    /// Executions running at once (a slot is taken when an execution starts). Raising it
    /// lets waiting executions start as workers pick them, in the tenant's order.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<u32>, nullable, format = Int64, maximum = 4294967295_u64)]
    pub max_concurrent: Option<Option<WholeU32>>,
    /// Queued executions (scheduled, waiting and ready) before admission answers 429.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<u32>, nullable, format = Int64, maximum = 4294967295_u64)]
    pub max_queued: Option<Option<WholeU32>>,
    /// A disabled tenant's admissions answer 403; nothing else changes.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<bool>, nullable)]
    pub enabled: Option<Option<bool>>,
    /// The tenant's share of starts (1..=1000, default 1): while workers are the bottleneck,
    /// tenants with runnable work in one shard get starts in proportion to their weights.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<u32>, nullable, minimum = 1, maximum = 1000)]
    pub weight: Option<Option<WholeU32>>,
    /// How many executions of one concurrency key (`concurrency_key` at admission) run at
    /// once, for every key without an override of its own; `null`: no such limit (the
    /// default). A key at its limit never delays another key. Raising it lets blocked keys
    /// start at once, in order; lowering it stops new starts of a key until enough of its
    /// running executions end.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<u32>, nullable, minimum = 1, format = Int64, maximum = 4294967295_u64)]
    pub max_concurrent_per_key: Option<Option<WholeU32>>,
    /// At most `starts` of the tenant's executions start per `per`, `burst` at once; counted
    /// when they start (retries and re-runs too), so over the rate executions wait in order
    /// instead of being refused. `null`: no rate limit (the default).
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<RateLimitSetting>, nullable)]
    pub rate_limit: Option<Option<RateLimitSetting>>,
    /// The same for each concurrency key of the tenant: a key over its rate never delays
    /// another key. `null`: none (the default).
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<RateLimitSetting>, nullable)]
    pub rate_limit_per_key: Option<Option<RateLimitSetting>>,
    /// Logical bytes the tenant may keep: its queued, running and retained terminal
    /// executions, each counted as 512 + its params + its output + its error message (as
    /// stored). An admission that would pass it answers 429 `tenant_storage_full`, one larger
    /// than it alone 413 `execution_too_large`. `null`: the server's `--default-max-bytes`.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<u64>, nullable, minimum = 1, maximum = 9007199254740991_u64)]
    pub max_bytes: Option<Option<WholeU64>>,
    /// Terminal executions the tenant may keep until they expire (`--retention-days`); at
    /// the bound its admissions answer 429 `tenant_storage_full`. `null`: the server's
    /// `--default-max-retained`.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<u64>, nullable, minimum = 1, maximum = 9007199254740991_u64)]
    pub max_retained: Option<Option<WholeU64>>,
}

/// A rate limit: at most `starts` starts per `per`, `burst` of them at once. Any window of
/// length `per` holds at most `starts + burst` starts, and with a backlog they go at `starts`
/// per `per`, evenly.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"starts": 100, "per": "1m", "burst": 10}))]
pub struct RateLimitSetting {
    #[schema(value_type = u32, minimum = 1, maximum = 1_000_000)]
    pub starts: WholeU32,
    /// The period: `250ms`, `30s`, `1m`, `1h`, `1d` (a plain number is seconds), from 1 ms to
    /// a day, without leading zeros (the pattern states exactly that range).
    #[schema(
        pattern = "^(([1-9][0-9]{0,6}|[1-7][0-9]{7}|8[0-5][0-9]{6}|86[0-3][0-9]{5}|86400000)ms|([1-9][0-9]{0,3}|[1-7][0-9]{4}|8[0-5][0-9]{3}|86[0-3][0-9]{2}|86400)s?|([1-9][0-9]{0,2}|1[0-3][0-9]{2}|14[0-3][0-9]|1440)m|([1-9]|1[0-9]|2[0-4])h|1d)$"
    )]
    pub per: String,
    /// How many may start at once after an idle spell (default 1: evenly spaced).
    #[serde(default)]
    #[schema(value_type = Option<u32>, minimum = 1, maximum = 100_000)]
    pub burst: Option<WholeU32>,
}

impl RateLimitSetting {
    /// The store's form, checked.
    fn parse(&self, field: &'static str) -> Result<RateLimit, ApiError> {
        let bad = |why: String| ApiError::BadRequest {
            code: "invalid_rate_limit",
            detail: format!("{field}: {why}"),
        };
        let per_ms = crate::domain::parse_delay(&self.per)
            .map_err(|_| bad("per must be a duration such as 250ms, 30s, 1m, 1h or 1d".into()))?;
        // What the schema's pattern allows, exactly: no leading zero, 1 ms to a day.
        if self.per.starts_with('0') || !(1..=RateLimit::MAX_PER_MS).contains(&per_ms) {
            return Err(bad("per must be from 1ms to 1d".into()));
        }
        let starts = self.starts.0;
        if !(1..=RateLimit::MAX_STARTS).contains(&starts) {
            return Err(bad(format!(
                "starts must be from 1 to {}",
                RateLimit::MAX_STARTS
            )));
        }
        let burst = self.burst.map_or(1, |b| b.0);
        if !(1..=RateLimit::MAX_BURST).contains(&burst) {
            return Err(bad(format!(
                "burst must be from 1 to {}",
                RateLimit::MAX_BURST
            )));
        }
        Ok(RateLimit {
            starts,
            per_ms,
            burst,
        })
    }
}

/// A rate limit as the API shows it (see `RateLimitSetting`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RateLimitView {
    #[schema(minimum = 1, maximum = 1_000_000)]
    pub starts: u32,
    /// The period, in the largest whole unit (`1m`, `90s`, `250ms`).
    pub per: String,
    #[schema(minimum = 1, maximum = 100_000)]
    pub burst: u32,
}

impl From<RateLimit> for RateLimitView {
    fn from(r: RateLimit) -> Self {
        let units = [
            ("d", 86_400_000),
            ("h", 3_600_000),
            ("m", 60_000),
            ("s", 1_000),
        ];
        let per = units
            .iter()
            .find(|(_, ms)| r.per_ms.is_multiple_of(*ms))
            .map(|(u, ms)| format!("{}{u}", r.per_ms / ms))
            .unwrap_or_else(|| format!("{}ms", r.per_ms));
        Self {
            starts: r.starts,
            per,
            burst: r.burst,
        }
    }
}

/// Tells a field given as `null` (`Some(None)`) from one left out (`None`, by `default`).
fn present<'de, T, D>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    T: Deserialize<'de>,
    D: serde::Deserializer<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

/// The store's change for a rate limit field of `TenantSettings`, checked.
fn rate_change(
    field: Option<Option<RateLimitSetting>>,
    name: &'static str,
) -> Result<Change<RateLimit>, ApiError> {
    Ok(match field {
        None => Change::Keep,
        Some(None) => Change::Reset,
        Some(Some(r)) => Change::Set(r.parse(name)?),
    })
}

/// The store's change for one field of `TenantSettings`.
fn change<T>(field: Option<Option<T>>) -> Change<T> {
    match field {
        None => Change::Keep,
        Some(None) => Change::Reset,
        Some(Some(v)) => Change::Set(v),
    }
}

/// Live usage of a tenant's quota.
#[derive(Debug, Serialize, ToSchema)]
pub struct TenantUsage {
    pub running: u64,
    /// Queued and due: runnable in the tenant's order (ready or waiting for a slot).
    pub waiting: u64,
    /// Queued and not due yet: scheduled for later, or waiting out a retry backoff.
    pub scheduled: u64,
}

/// What a tenant keeps on Redis, against its `max_bytes` and `max_retained`.
#[derive(Debug, Serialize, ToSchema)]
pub struct TenantStorageUsage {
    /// Logical bytes of its queued, running and retained terminal executions (512 each + its
    /// params + output + error message, as stored), counted against `max_bytes`. Executions
    /// admitted by a build before these counters are not counted.
    #[schema(format = Int64, maximum = 9007199254740991_u64)]
    pub bytes: u64,
    /// Terminal executions kept until they expire, counted against `max_retained`.
    #[schema(format = Int64, maximum = 9007199254740991_u64)]
    pub retained: u64,
    /// When the oldest retained executions have expired and leave `bytes` and `retained`
    /// (within an hour of their expiry at the default retention); null: none retained.
    #[schema(format = DateTime)]
    pub next_expiry: Option<String>,
}

/// A tenant's concurrency keys at a glance (`/api/tenants/{tenant}/concurrency-keys` lists
/// the overrides).
#[derive(Debug, Serialize, ToSchema)]
pub struct TenantKeys {
    /// Keys with a limit override of their own.
    pub overrides: u64,
    /// Keys at their limit with executions waiting behind it (they wait for a run of their
    /// own key to end, not for the tenant's slots).
    pub blocked: u64,
}

/// A tenant's effective limits and usage.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({
    "tenant_id": "acme",
    "max_concurrent": 10,
    "max_queued": 1000,
    "enabled": true,
    "weight": 1,
    "max_concurrent_per_key": 2,
    "max_bytes": 1073741824_u64,
    "max_retained": 1000000,
    "usage": {"running": 3, "waiting": 42, "scheduled": 7},
    "storage": {"bytes": 1843200, "retained": 3400, "next_expiry": "2026-12-29T10:00:00.000Z"},
    "concurrency_keys": {"overrides": 1, "blocked": 4},
    "deleting": false
}))]
pub struct Tenant {
    #[schema(pattern = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
    pub tenant_id: String,
    #[schema(format = Int64, maximum = 4294967295_u64)]
    pub max_concurrent: u32,
    #[schema(format = Int64, maximum = 4294967295_u64)]
    pub max_queued: u32,
    pub enabled: bool,
    /// Its share of starts against the other tenants with runnable work in its shard.
    #[schema(minimum = 1, maximum = 1000)]
    pub weight: u32,
    /// The limit of each concurrency key without an override; null: none.
    #[schema(minimum = 1, format = Int64, maximum = 4294967295_u64)]
    pub max_concurrent_per_key: Option<u32>,
    /// Its starts' rate limit; null: none.
    pub rate_limit: Option<RateLimitView>,
    /// Each of its concurrency keys' rate limit; null: none.
    pub rate_limit_per_key: Option<RateLimitView>,
    /// Logical bytes it may keep (see `TenantSettings.max_bytes`); `storage.bytes` is what it
    /// keeps.
    #[schema(format = Int64, minimum = 1, maximum = 9007199254740991_u64)]
    pub max_bytes: u64,
    /// Terminal executions it may keep; `storage.retained` is how many it keeps.
    #[schema(format = Int64, minimum = 1, maximum = 9007199254740991_u64)]
    pub max_retained: u64,
    pub usage: TenantUsage,
    pub storage: TenantStorageUsage,
    pub concurrency_keys: TenantKeys,
    /// True while the tenant is being deleted (`DELETE /api/tenants/{tenant}`): it admits
    /// nothing, its keys are revoked, what it still holds (counted in `usage`) is being
    /// removed, and registering it again answers 409 `tenant_deleting` until that is done.
    pub deleting: bool,
}

impl Tenant {
    fn new(id: &TenantId, s: TenantState) -> Self {
        Self {
            tenant_id: id.to_string(),
            max_concurrent: s.max_concurrent,
            max_queued: s.max_queued,
            enabled: s.enabled,
            weight: s.weight,
            max_concurrent_per_key: s.max_concurrent_per_key,
            rate_limit: s.rate_limit.map(Into::into),
            rate_limit_per_key: s.rate_limit_per_key.map(Into::into),
            max_bytes: s.storage.max_bytes,
            max_retained: s.storage.max_retained,
            usage: TenantUsage {
                running: s.running,
                waiting: s.waiting,
                scheduled: s.scheduled,
            },
            storage: TenantStorageUsage {
                bytes: s.storage.bytes,
                retained: s.storage.retained,
                next_expiry: s
                    .storage
                    .next_drain_ms
                    .and_then(|ms| crate::domain::rfc3339_from_ms(&ms.to_string())),
            },
            concurrency_keys: TenantKeys {
                overrides: s.key_overrides,
                blocked: s.blocked_keys,
            },
            deleting: s.deleting,
        }
    }
}

/// Create a tenant or set its limits (platform admin).
///
/// Registers the tenant (so it is listed and can have API keys) and changes only the fields
/// the body names: an absent field keeps its value, `null` restores the server default.
/// Raising `max_concurrent` lets waiting executions start as workers pick them, in the
/// tenant's order; `weight` sets its share of starts; `enabled: false` makes admissions answer 403 `tenant_disabled` without
/// touching work already admitted. `max_bytes` and `max_retained` bound what it keeps on Redis
/// (see the tenant's `usage`): lowered under its usage, they refuse its admissions until
/// enough of what it retains has expired; nothing is deleted. A tenant being deleted is
/// registered again only once nothing of it is left (409 `tenant_deleting` with `Retry-After`
/// until then): it then starts empty, from the server defaults.
#[utoipa::path(
    put,
    path = "/api/tenants/{tenant}",
    tag = "tenants",
    params(("tenant" = String, Path, pattern = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", description = "Tenant id")),
    request_body = TenantSettings,
    responses(
        (status = 200, description = "The tenant after the change", body = Tenant),
        (status = 400, description = "Invalid tenant id or body (`invalid_storage_bound`: a `max_bytes` or `max_retained` of 0)", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not the platform admin", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`tenant_deleting`: the tenant is being deleted; nothing was changed or registered", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
        (status = 503, description = "Redis unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn put_tenant(
    State(state): State<AppState>,
    caller: Caller,
    Path(tenant): Path<String>,
    body: JsonBody<TenantSettings>,
) -> Result<axum::Json<Tenant>, ApiError> {
    caller.require(Action::ManagePlatform)?;
    let tenant = TenantId::parse(&tenant)?;
    let body = body.parse().await?;
    let limits = TenantLimits {
        max_concurrent: change(body.max_concurrent).map(|w| w.0),
        max_queued: change(body.max_queued).map(|w| w.0),
        enabled: change(body.enabled),
        weight: change(body.weight).map(|w| w.0),
        max_concurrent_per_key: change(body.max_concurrent_per_key).map(|w| w.0),
        rate_limit: rate_change(body.rate_limit, "rate_limit")?,
        rate_limit_per_key: rate_change(body.rate_limit_per_key, "rate_limit_per_key")?,
        max_bytes: change(body.max_bytes).map(|w| w.0),
        max_retained: change(body.max_retained).map(|w| w.0),
    };
    for (field, value) in [
        ("max_bytes", limits.max_bytes),
        ("max_retained", limits.max_retained),
    ] {
        if value == Change::Set(0) {
            return Err(ApiError::BadRequest {
                code: "invalid_storage_bound",
                detail: format!(
                    "{field} must be at least 1 (null for the server's default; to stop admissions, set enabled to false)"
                ),
            });
        }
    }
    if limits.max_concurrent_per_key == Change::Set(0) {
        return Err(ApiError::BadRequest {
            code: "invalid_max_concurrent_per_key",
            detail: "max_concurrent_per_key must be at least 1 (null for no per-key limit)".into(),
        });
    }
    if let Change::Set(w) = limits.weight
        && !(1..=MAX_WEIGHT).contains(&w)
    {
        return Err(ApiError::BadRequest {
            code: "invalid_weight",
            detail: format!("weight must be an integer from 1 to {MAX_WEIGHT}"),
        });
    }
    // Checked before anything is written: a refused body registers nothing. The limits go
    // first: their script refuses a tenant being deleted, which must not be registered again
    // (its reaper removes it from the registry at its end anyway, should a deletion begin
    // between the two calls).
    let s = state.store.put_tenant(&tenant, &limits).await?;
    if s.deleting {
        return Err(ApiError::TenantDeleting { tenant });
    }
    state.store.register_tenant(&tenant).await?;
    Ok(axum::Json(Tenant::new(&tenant, s)))
}

/// Read a tenant's limits and live usage (platform admin, or the tenant's admin key).
#[utoipa::path(
    get,
    path = "/api/tenants/{tenant}",
    tag = "tenants",
    params(("tenant" = String, Path, pattern = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", description = "Tenant id")),
    responses(
        (status = 200, description = "The tenant", body = Tenant),
        (status = 400, description = "Invalid tenant id", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Neither the platform admin nor this tenant's admin key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "Never configured and no executions", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn get_tenant(
    State(state): State<AppState>,
    caller: Caller,
    Path(tenant): Path<String>,
) -> Result<axum::Json<Tenant>, ApiError> {
    let tenant = TenantId::parse(&tenant)?;
    caller.require_for(&tenant, Action::ManageTenant)?;
    match state.store.get_tenant(&tenant).await? {
        Some(s) => Ok(axum::Json(Tenant::new(&tenant, s))),
        None => Err(tenant_not_found()),
    }
}

/// The not-found error for tenants.
pub fn tenant_not_found() -> ApiError {
    ApiError::NotFound {
        code: "tenant_not_found",
        detail: "no such tenant".into(),
    }
}

/// Paging of `GET /api/tenants`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TenantListParams {
    /// Page size (default 50).
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<u32>,
    /// `next_cursor` of the previous page: tenants after this id.
    #[param(pattern = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
    pub cursor: Option<String>,
}

/// A page of the registered tenants, in tenant id order.
#[derive(Debug, Serialize, ToSchema)]
pub struct TenantList {
    pub tenants: Vec<Tenant>,
    /// Pass as `cursor` for the next page; null on the last page.
    #[schema(pattern = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
    pub next_cursor: Option<String>,
}

/// Page size of `GET /api/tenants` when `limit` is not given, and the most a page may hold.
const DEFAULT_TENANT_PAGE: u32 = 50;
const MAX_TENANT_PAGE: u32 = 200;

/// List the registered tenants with their limits and usage (platform admin).
///
/// Tenants are registered by `PUT /api/tenants/{tenant}`. Paged by tenant id; a page costs one
/// round trip to the registry, then one per shard its tenants live in (all at the same time),
/// whatever its size or the registry's. A page is complete or refused (503).
#[utoipa::path(
    get,
    path = "/api/tenants",
    tag = "tenants",
    params(TenantListParams),
    responses(
        (status = 200, description = "One page of registered tenants", body = TenantList),
        (status = 400, description = "Invalid paging, or an invalid X-Tenant-Id", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not the platform admin", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn list_tenants(
    State(state): State<AppState>,
    caller: Caller,
    query: QueryLater<TenantListParams>,
) -> Result<axum::Json<TenantList>, ApiError> {
    caller.require(Action::ManagePlatform)?;
    let p = query.parse()?;
    let limit = p.limit.unwrap_or(DEFAULT_TENANT_PAGE);
    if !(1..=MAX_TENANT_PAGE).contains(&limit) {
        return Err(ApiError::BadRequest {
            code: "invalid_limit",
            detail: format!("limit must be between 1 and {MAX_TENANT_PAGE}"),
        });
    }
    let after = p
        .cursor
        .as_deref()
        .map(|c| {
            TenantId::parse(c).map_err(|_| ApiError::BadRequest {
                code: "invalid_cursor",
                detail: "cursor must be a next_cursor returned by this call".into(),
            })
        })
        .transpose()?;
    let (ids, more) = state
        .store
        .list_tenants(after.as_ref(), limit as usize)
        .await?;
    // Read per shard, concurrently. A page is all or nothing: a tenant left out because its
    // shard did not answer would be skipped for good by the cursor, so any failure is a 503.
    let states = state
        .store
        .get_tenants(&ids)
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    let next_cursor = more.then(|| ids.last().map(ToString::to_string)).flatten();
    let tenants = ids
        .iter()
        .zip(states)
        .filter_map(|(id, s)| Some(Tenant::new(id, s?)))
        .collect();
    Ok(axum::Json(TenantList {
        tenants,
        next_cursor,
    }))
}

/// Delete a tenant and everything it holds (platform admin).
///
/// At once: it admits nothing more (409 `tenant_deleting`, also for the platform admin acting
/// for it), starts nothing more, its API keys are revoked (their next request is a 401; their
/// open waits and streams end) and its webhook is removed with the events not delivered yet.
/// Then everything it holds is removed, in bounded steps: its executions whatever their state
/// — queued ones never start; running ones are fenced (their worker is told to stop, its
/// heartbeat answers that the run is lost and its late report is refused, so nothing comes
/// back) —, their dedup keys, dead letters, concurrency-key overrides, trends and limits. No
/// webhook event is sent for them. A tenant of up to about 1,600 executions is gone when this
/// answers 204; a bigger one answers 202 with its state (`deleting: true`, what is left in
/// `usage`) and is removed in the background, at a pace that leaves its shard to the others.
/// Until it is gone, registering the id again answers 409 `tenant_deleting`; then the id
/// starts empty. Repeatable while it is being deleted (202 or 204); once gone, 404.
#[utoipa::path(
    delete,
    path = "/api/tenants/{tenant}",
    tag = "tenants",
    params(("tenant" = String, Path, pattern = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", description = "Tenant id")),
    responses(
        (status = 202, description = "Deleting: keys revoked, admissions refused; what it still holds is being removed (`GET` it to follow; 404 once done)", body = Tenant,
            headers(("Retry-After" = u64, description = "Seconds before asking again"))),
        (status = 204, description = "Deleted: nothing of it is left, the id is free"),
        (status = 400, description = "Invalid tenant id", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not the platform admin", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "Neither registered nor holding anything (never created, or deleted already)", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unavailable; if the deletion began, it goes on (repeat the call to follow it)", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn delete_tenant(
    State(state): State<AppState>,
    caller: Caller,
    Path(tenant): Path<String>,
) -> Result<Response, ApiError> {
    caller.require(Action::ManagePlatform)?;
    let tenant = TenantId::parse(&tenant)?;
    if state.store.delete_tenant(&tenant).await? == Deletion::Unknown {
        return Err(tenant_not_found());
    }
    state.metrics.forget_tenant(&tenant);
    // Its keys are refused by this server from the next request on (see revoke_api_key), and
    // their open waits end as revoked before the reap below tells them their execution went.
    state
        .revocations
        .notice(crate::access::AccessChange::TenantDeleted(tenant.clone()));
    let reaped = state.store.reap_tenant(&tenant, REAP_INLINE_CALLS).await;
    if reaped.as_ref().is_ok_and(|r| *r == Reaped::Done) {
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    // The rest in the background (and by the sweeper, should this process stop).
    state.store.reap_in_background(tenant.clone());
    reaped?;
    match state.store.get_tenant(&tenant).await? {
        Some(s) => {
            let mut res =
                (StatusCode::ACCEPTED, axum::Json(Tenant::new(&tenant, s))).into_response();
            res.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(TENANT_DELETING_RETRY_AFTER),
            );
            Ok(res)
        }
        // Finished meanwhile (by another server, or the task just started).
        None => Ok(StatusCode::NO_CONTENT.into_response()),
    }
}

/// One concurrency key of a tenant: its limit and what it holds now.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"key": "customer-7", "max_concurrent": 2, "override": true, "running": 2, "queued": 15}))]
pub struct ConcurrencyKeyView {
    #[schema(min_length = 1, max_length = 128)]
    pub key: String,
    /// How many of its executions run at once; null: no limit of its own (only the tenant's
    /// `max_concurrent`).
    #[schema(format = Int64, maximum = 4294967295_u64)]
    pub max_concurrent: Option<u32>,
    /// True when `max_concurrent` is this key's own override; false when it is the tenant's
    /// `max_concurrent_per_key` (or none).
    #[serde(rename = "override")]
    pub overridden: bool,
    pub running: u64,
    /// Runnable executions of the key not started yet (scheduled ones are not counted).
    pub queued: u64,
}

impl From<KeyState> for ConcurrencyKeyView {
    fn from(s: KeyState) -> Self {
        Self {
            key: s.key.to_string(),
            max_concurrent: s.max_concurrent,
            overridden: s.overridden,
            running: s.running,
            queued: s.queued,
        }
    }
}

/// Body of `PUT /api/tenants/{tenant}/concurrency-keys/{key}`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"max_concurrent": 2}))]
pub struct ConcurrencyKeySettings {
    /// How many executions with this key run at once (0 holds the key: nothing of it starts).
    #[schema(value_type = u32, format = Int64, maximum = 4294967295_u64)]
    pub max_concurrent: WholeU32,
}

/// The overrides of a tenant's concurrency keys.
#[derive(Debug, Serialize, ToSchema)]
pub struct ConcurrencyKeyList {
    /// Every override, ordered by key (at most 10,000).
    pub keys: Vec<ConcurrencyKeyView>,
    /// The limit of every other key; null: none.
    #[schema(format = Int64, maximum = 4294967295_u64)]
    pub max_concurrent_per_key: Option<u32>,
}

/// The tenant and key of a concurrency-key route, checked; the caller must be the platform
/// admin or the tenant's admin key.
fn key_route(
    caller: &Caller,
    tenant: &str,
    key: &str,
) -> Result<(TenantId, ConcurrencyKey), ApiError> {
    let tenant = TenantId::parse(tenant)?;
    caller.require_for(&tenant, Action::ManageTenant)?;
    Ok((tenant, ConcurrencyKey::parse(key)?))
}

/// List a tenant's per-key limit overrides (platform admin, or the tenant's admin key).
#[utoipa::path(
    get,
    path = "/api/tenants/{tenant}/concurrency-keys",
    tag = "tenants",
    params(("tenant" = String, Path, pattern = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", description = "Tenant id")),
    responses(
        (status = 200, description = "The overrides", body = ConcurrencyKeyList),
        (status = 400, description = "Invalid tenant id", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Neither the platform admin nor this tenant's admin key", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn list_concurrency_keys(
    State(state): State<AppState>,
    caller: Caller,
    Path(tenant): Path<String>,
) -> Result<axum::Json<ConcurrencyKeyList>, ApiError> {
    let tenant = TenantId::parse(&tenant)?;
    caller.require_for(&tenant, Action::ManageTenant)?;
    let keys = state.store.key_overrides(&tenant).await?;
    let per_key = state
        .store
        .get_tenant(&tenant)
        .await?
        .and_then(|t| t.max_concurrent_per_key);
    Ok(axum::Json(ConcurrencyKeyList {
        keys: keys.into_iter().map(Into::into).collect(),
        max_concurrent_per_key: per_key,
    }))
}

/// Set one concurrency key's limit (platform admin, or the tenant's admin key).
///
/// Executions admitted with `concurrency_key` equal to `{key}` run at most `max_concurrent`
/// at once, inside the tenant's `max_concurrent`; the override wins over the tenant's
/// `max_concurrent_per_key`. A raised limit lets the key's waiting executions start at once,
/// in order; a lowered one stops new starts until enough running ones end (none is
/// stopped). A key may be set before it is used. At most 10,000 overrides per tenant.
#[utoipa::path(
    put,
    path = "/api/tenants/{tenant}/concurrency-keys/{key}",
    tag = "tenants",
    params(
        ("tenant" = String, Path, pattern = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", description = "Tenant id"),
        ("key" = String, Path, min_length = 1, max_length = 128, pattern = "^[^\\x00-\\x1F\\x7F-\\x9F\\xAD\\u061C\\u180E\\u200B-\\u200F\\u2028-\\u202E\\u2060-\\u2064\\u2066-\\u2069\\uFEFF\\uFFF9-\\uFFFB]*$", description = "The concurrency key (percent-encoded): 1–128 bytes of UTF-8, the dedup key's characters"),
    ),
    request_body = ConcurrencyKeySettings,
    responses(
        (status = 200, description = "The key after the change", body = ConcurrencyKeyView),
        (status = 400, description = "Invalid tenant id, key or body", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Neither the platform admin nor this tenant's admin key", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The tenant has 10,000 overrides already (`too_many_key_overrides`), or is being deleted (`tenant_deleting`, with `Retry-After`)", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn put_concurrency_key(
    State(state): State<AppState>,
    caller: Caller,
    Path((tenant, key)): Path<(String, String)>,
    body: JsonBody<ConcurrencyKeySettings>,
) -> Result<axum::Json<ConcurrencyKeyView>, ApiError> {
    let (tenant, key) = key_route(&caller, &tenant, &key)?;
    let body = body.parse().await?;
    match state
        .store
        .set_key_limit(&tenant, &key, Some(body.max_concurrent.0))
        .await?
    {
        KeyLimitChange::Set(s) => Ok(axum::Json(s.into())),
        KeyLimitChange::Deleting => Err(ApiError::TenantDeleting { tenant }),
        KeyLimitChange::TooMany(n) => Err(conflict(
            "too_many_key_overrides",
            format!(
                "tenant {tenant} has {n} concurrency key overrides, the most allowed is {MAX_KEY_OVERRIDES}; delete one first"
            ),
        )),
    }
}

/// Read one concurrency key's limit and what it holds now (platform admin, or the tenant's
/// admin key). A key never used answers its limit with zero counts.
#[utoipa::path(
    get,
    path = "/api/tenants/{tenant}/concurrency-keys/{key}",
    tag = "tenants",
    params(
        ("tenant" = String, Path, pattern = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", description = "Tenant id"),
        ("key" = String, Path, min_length = 1, max_length = 128, pattern = "^[^\\x00-\\x1F\\x7F-\\x9F\\xAD\\u061C\\u180E\\u200B-\\u200F\\u2028-\\u202E\\u2060-\\u2064\\u2066-\\u2069\\uFEFF\\uFFF9-\\uFFFB]*$", description = "The concurrency key (percent-encoded): 1–128 bytes of UTF-8, the dedup key's characters"),
    ),
    responses(
        (status = 200, description = "The key", body = ConcurrencyKeyView),
        (status = 400, description = "Invalid tenant id or key", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Neither the platform admin nor this tenant's admin key", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn get_concurrency_key(
    State(state): State<AppState>,
    caller: Caller,
    Path((tenant, key)): Path<(String, String)>,
) -> Result<axum::Json<ConcurrencyKeyView>, ApiError> {
    let (tenant, key) = key_route(&caller, &tenant, &key)?;
    Ok(axum::Json(
        state.store.key_state(&tenant, &key).await?.into(),
    ))
}

/// Drop one concurrency key's override (platform admin, or the tenant's admin key): the
/// tenant's `max_concurrent_per_key` applies to it again (or no limit). Idempotent.
#[utoipa::path(
    delete,
    path = "/api/tenants/{tenant}/concurrency-keys/{key}",
    tag = "tenants",
    params(
        ("tenant" = String, Path, pattern = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", description = "Tenant id"),
        ("key" = String, Path, min_length = 1, max_length = 128, pattern = "^[^\\x00-\\x1F\\x7F-\\x9F\\xAD\\u061C\\u180E\\u200B-\\u200F\\u2028-\\u202E\\u2060-\\u2064\\u2066-\\u2069\\uFEFF\\uFFF9-\\uFFFB]*$", description = "The concurrency key (percent-encoded): 1–128 bytes of UTF-8, the dedup key's characters"),
    ),
    responses(
        (status = 204, description = "The key has no override (now, or it had none)"),
        (status = 400, description = "Invalid tenant id or key", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Neither the platform admin nor this tenant's admin key", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`tenant_deleting`: the tenant is being deleted (its overrides go with it)", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
        (status = 503, description = "Redis unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn delete_concurrency_key(
    State(state): State<AppState>,
    caller: Caller,
    Path((tenant, key)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let (tenant, key) = key_route(&caller, &tenant, &key)?;
    match state.store.set_key_limit(&tenant, &key, None).await? {
        KeyLimitChange::Deleting => Err(ApiError::TenantDeleting { tenant }),
        _ => Ok(StatusCode::NO_CONTENT),
    }
}
