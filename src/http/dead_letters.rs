//! Dead letters: the executions that ran out of attempts or could not be recovered, listed
//! per tenant or for every tenant (`/api/dlq`), and dismissing one record once it is dealt
//! with. What bounds them (a cap per tenant, and one per shard that evicts from the tenant
//! holding the most) is the scripts' (`dead_letter` in `migrations-lua/common.lua`).

use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::auth::Caller;
use super::error::{ApiError, Problem};
use super::extract::{Path, Query};
use crate::http::actions::Action;
use crate::store;

/// The dead-letter routes with their OpenAPI documentation.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_dead_letters))
        .routes(routes!(dismiss_dead_letter))
}

/// Paging of `GET /api/dlq`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeadLetterParams {
    /// Page size (default 50).
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<u32>,
    /// `next_before` of the previous page: only older records. A record id, `<ms>-<seq>`;
    /// numbers beyond the largest id mean "no bound".
    #[param(pattern = "^[0-9]{1,20}-[0-9]{1,20}$")]
    pub before: Option<String>,
}

/// One dead-letter record.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeadLetter {
    /// The shard whose dead-letter stream holds the record (names it, with `entry_id`, in
    /// `DELETE /api/dlq/{shard}/{entry_id}`).
    #[schema(maximum = 65535)]
    pub shard: u16,
    /// The record's id in its shard's dead-letter stream (`<ms>-<seq>`).
    #[schema(pattern = "^[0-9]{1,20}-[0-9]{1,20}$")]
    pub entry_id: String,
    pub execution_id: String,
    pub tenant_id: Option<String>,
    pub flow_id: Option<String>,
    /// `lease_lost`, `handler_error` or `poison`.
    pub reason: String,
    /// Starts of the run that was dead-lettered (at most its `max_attempts`).
    #[schema(maximum = 100)]
    pub attempts: u32,
    /// The ready-stream entry that carried the execution.
    pub source_entry: String,
    /// RFC 3339 (or the raw milliseconds of a record sluice did not write).
    pub dead_lettered_at: String,
    pub message: String,
}

impl From<store::DeadLetter> for DeadLetter {
    fn from(d: store::DeadLetter) -> Self {
        Self {
            shard: d.shard,
            entry_id: d.entry_id,
            execution_id: d.execution_id,
            tenant_id: d.tenant_id,
            flow_id: d.flow_id,
            reason: d.reason,
            attempts: d.attempts,
            source_entry: d.source_entry,
            dead_lettered_at: d.dead_lettered_at,
            message: d.message,
        }
    }
}

/// A page of dead letters, newest first, with what the listing covers.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeadLetterPage {
    pub dead_letters: Vec<DeadLetter>,
    /// Pass as `before` for older records; null when there are none (a page cut short by a
    /// record dismissed meanwhile may still have one).
    #[schema(pattern = "^[0-9]{1,20}-[0-9]{1,20}$")]
    pub next_before: Option<String>,
    /// Records kept now: the tenant's, or every tenant's (and poison records) in the platform
    /// admin's listing of every tenant.
    pub total: u64,
    /// How many of the tenant's records the caps evicted so far (by its own cap, or as the
    /// shard's largest holder when the shard was full); every shard's evictions in the
    /// listing of every tenant.
    pub evicted: u64,
    /// The most records the tenant keeps (`--dlq-tenant-cap`); beyond it its oldest are
    /// evicted. Null in the listing of every tenant.
    pub cap: Option<u64>,
}

/// List dead letters, newest first.
///
/// With a tenant (`X-Tenant-Id` or a tenant credential) only that tenant's records, read
/// through the tenant's own index (its shard neighbours' records are not read); the platform
/// admin without `X-Tenant-Id` sees every tenant's (and poison records, which belong to no
/// tenant). The Redis work of a call is bounded by the page, however many records the shards
/// hold. The page also says how many records the listing covers (`total`), how many of its
/// records the caps evicted (`evicted`) and, for a tenant, its cap (`cap`).
#[utoipa::path(
    get,
    path = "/api/dlq",
    tag = "operations",
    params(DeadLetterParams),
    responses(
        (status = 200, description = "One page", body = DeadLetterPage),
        (status = 400, description = "Invalid paging, or the platform admin named an invalid X-Tenant-Id", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "X-Tenant-Id names another tenant than the API key's", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn list_dead_letters(
    State(state): State<AppState>,
    caller: Caller,
    Query(p): Query<DeadLetterParams>,
) -> Result<axum::Json<DeadLetterPage>, ApiError> {
    let tenant = match caller.acting_tenant() {
        Some(_) => Some(caller.tenant_for(Action::Read)?),
        None => {
            caller.require(Action::ManagePlatform)?;
            None
        }
    };
    let limit = p.limit.unwrap_or(50);
    if !(1..=200).contains(&limit) {
        return Err(ApiError::BadRequest {
            code: "invalid_limit",
            detail: "limit must be between 1 and 200".into(),
        });
    }
    let before = p
        .before
        .as_deref()
        .map(|b| {
            record_bound(b).ok_or_else(|| ApiError::BadRequest {
                code: "invalid_cursor",
                detail: "before must be a record id <ms>-<seq>, as next_before returns".into(),
            })
        })
        .transpose()?
        .flatten();
    let page = state
        .store
        .dead_letters(tenant, before, limit as usize)
        .await?;
    Ok(axum::Json(DeadLetterPage {
        dead_letters: page.records.into_iter().map(Into::into).collect(),
        next_before: page.next,
        total: page.held,
        evicted: page.evicted,
        cap: tenant.map(|_| state.store.dlq_tenant_cap()),
    }))
}

/// Dismiss (acknowledge) one dead-letter record.
///
/// Removes the record from its shard's dead-letter stream once an operator has dealt with it;
/// the execution itself is unchanged (still readable, and retryable if `failed`). Counted as
/// `dlq_dismissed` in `/api/queues`. A tenant credential (editor or admin) removes only its
/// tenant's records; the platform admin without `X-Tenant-Id` any record, poison records
/// included. A record that is not there (already dismissed, evicted by the cap, another
/// tenant's) is a 404.
#[utoipa::path(
    delete,
    path = "/api/dlq/{shard}/{entry_id}",
    tag = "operations",
    params(
        ("shard" = u16, Path, maximum = 65535, description = "The record's `shard`"),
        ("entry_id" = String, Path, pattern = "^[0-9]{1,20}-[0-9]{1,20}$", description = "The record's `entry_id`"),
    ),
    responses(
        (status = 204, description = "Dismissed"),
        (status = 400, description = "Malformed shard or record id, or the platform admin named an invalid X-Tenant-Id", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Role too weak (a viewer), or X-Tenant-Id names another tenant than the API key's", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such record (for this tenant)", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn dismiss_dead_letter(
    State(state): State<AppState>,
    caller: Caller,
    Path((shard, entry_id)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let tenant = match caller.acting_tenant() {
        Some(_) => Some(caller.tenant_for(Action::DismissDeadLetters)?),
        None => {
            caller.require(Action::ManagePlatform)?;
            None
        }
    };
    let shard: u16 = shard.parse().map_err(|_| ApiError::BadRequest {
        code: "invalid_shard",
        detail: "shard must be a shard number, as a dead-letter record's `shard` gives".into(),
    })?;
    let not_found = || ApiError::NotFound {
        code: "dead_letter_not_found",
        detail: "no such dead-letter record".into(),
    };
    let record = match record_bound(&entry_id) {
        None => {
            return Err(ApiError::BadRequest {
                code: "invalid_record_id",
                detail: "entry_id must be a record id <ms>-<seq>, as the listing gives".into(),
            });
        }
        // Digits beyond 64 bits: no record has that id.
        Some(_) if !exact_record_id(&entry_id) => return Err(not_found()),
        Some(bound) => bound.ok_or_else(not_found)?,
    };
    if state
        .store
        .dismiss_dead_letter(shard, record, tenant)
        .await?
    {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(not_found())
    }
}

/// Whether a record id's two numbers both fit in 64 bits (so it can name a record at all).
fn exact_record_id(s: &str) -> bool {
    s.split_once('-')
        .is_some_and(|(ms, seq)| ms.parse::<u64>().is_ok() && seq.parse::<u64>().is_ok())
}

/// The exclusive upper bound a `before` cursor names, as numbers Redis accepts: `None` for
/// not a record id at all, `Some(None)` for no bound (a number beyond the largest id: every
/// record is older), `Some(Some((ms, seq)))` otherwise. Built from the numbers, never from the
/// caller's text, so Redis never sees input it would refuse.
fn record_bound(s: &str) -> Option<Option<(u64, u64)>> {
    let (ms, seq) = s.split_once('-')?;
    let digits = |t: &str| !t.is_empty() && t.len() <= 20 && t.bytes().all(|b| b.is_ascii_digit());
    if !digits(ms) || !digits(seq) {
        return None;
    }
    let Ok(ms) = ms.parse::<u64>() else {
        return Some(None);
    };
    Some(match seq.parse::<u64>() {
        Ok(seq) => Some((ms, seq)),
        // Beyond the largest sequence of `ms`: everything up to the next millisecond.
        Err(_) => ms.checked_add(1).map(|next| (next, 0)),
    })
}

#[cfg(test)]
mod tests {
    use super::record_bound;

    #[test]
    fn dead_letter_cursors_become_numbers_redis_accepts() {
        assert_eq!(
            record_bound("1700000000000-3"),
            Some(Some((1_700_000_000_000, 3)))
        );
        assert_eq!(record_bound("0-0"), Some(Some((0, 0))));
        assert_eq!(record_bound("007-01"), Some(Some((7, 1))));
        // Past the largest id: no bound at all, or the next millisecond.
        assert_eq!(record_bound("99999999999999999999-0"), Some(None));
        assert_eq!(record_bound("5-99999999999999999999"), Some(Some((6, 0))));
        assert_eq!(
            record_bound("18446744073709551615-99999999999999999999"),
            Some(None)
        );
        for bad in [
            "",
            "5",
            "5-",
            "-5",
            "a-1",
            "1-b",
            "1-2-3",
            "+1-2",
            " 1-2",
            "123456789012345678901-0",
        ] {
            assert_eq!(record_bound(bad), None, "{bad:?}");
        }
    }
}
