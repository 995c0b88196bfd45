//! The pull API (`/api/worker/*`): workers in any language lease executions over HTTP, keep
//! them alive, hear cancels and report how they ended, through the same scripts and fences as
//! `sluice worker` (`store::lease`).
//!
//! - **Who.** A `worker` key of a tenant (it reaches nothing else) serves that tenant. The
//!   platform admin acts for the tenant its `X-Tenant-Id` names, as everywhere: its lease
//!   then serves that tenant only, and its heartbeats and completions reach that tenant's
//!   runs only. Without `X-Tenant-Id` its lease is a platform-wide worker's (the tenants in
//!   `tenants`, or all), and each heartbeat or completion names its run's tenant. Each worker
//!   process names itself with a `worker_id`; the lease holder Redis records is that id in
//!   the caller's names (`store::keys::pull_consumer`: a tenant's for its keys, the platform
//!   admin's own), so two tenants' workers never share a name.
//! - **Nothing lost between the server and the worker.** A lease call first asks Redis what
//!   its worker holds already (`adopt.lua`): runs a lost answer started come back (marked
//!   `recovered`), except those the worker says it is running (`holding`). So an answer lost
//!   on the way costs nothing but the time until the next call, never an attempt.
//! - **Long polls cost no connection each.** A lease with `?wait=` waits on the shards'
//!   doorbells through `crate::pull::Doorbells` (one reader per shard for the whole server),
//!   and counts among the tenant's waiters (`--max-waiters-per-tenant`).
//! - **Fenced.** A heartbeat or a completion names the run's `fence`; only the current holder
//!   of the current run is heard (409 `lease_lost` otherwise). A cancel is answered by the
//!   run's next heartbeat and delivered at once to a waiting `POST /api/worker/stops`.
//!
//! Long on purpose: the whole pull API (lease, heartbeat, complete, stops), each route with its
//! OpenAPI annotation and the checks its body needs, so a worker author reads one file.

use std::collections::HashSet;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::time::Instant;
use utoipa::openapi::schema::{Array, ArrayBuilder, ObjectBuilder, SchemaType, Type};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::auth::{Caller, Credential, Grant};
use super::error::{ApiError, Problem};
use super::executions::waiting::{parse_wait, refused, until_revoked};
use super::extract::{JsonBody, Path, Query, WholeU32, WholeU64};
use crate::domain::{ExecutionId, TenantId};
use crate::http::actions::Action;
use crate::store::{Completion, LeaseState, Outcome, Shard, Started, keys};

/// The pull API's routes with their OpenAPI documentation.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(lease))
        .routes(routes!(heartbeat))
        .routes(routes!(complete))
        .routes(routes!(stops))
}

/// The route of a lease, whose `?wait` makes it a long poll.
pub const LEASE_ROUTE: &str = "/api/worker/lease";
/// The route of a stop poll, whose `?wait` makes it a long poll.
pub const STOPS_ROUTE: &str = "/api/worker/stops";

/// Most executions one lease call starts.
pub const MAX_LEASE_BATCH: u32 = 100;
/// Most ids a lease call may name in `holding`.
pub const MAX_HOLDING: usize = 1000;
/// Most tenants a lease call may name.
pub const MAX_TENANTS: usize = 64;
/// The lease of a run when the call names none.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// The shortest and longest leases a call may ask for.
pub const MIN_LEASE: Duration = Duration::from_millis(500);
pub const MAX_LEASE: Duration = Duration::from_secs(600);
/// Longest error message kept from a failed run, in bytes.
pub const MAX_ERROR_MESSAGE: usize = 4096;

/// For whom a caller pulls work.
enum Scope {
    /// A `worker` key: its own tenant only, under its tenant's worker names.
    Key(TenantId),
    /// The platform admin acting for a tenant (`X-Tenant-Id`): that tenant only, as its
    /// `worker` key would, under the platform admin's worker names.
    ActingFor(TenantId),
    /// The platform admin without `X-Tenant-Id`: a worker of the whole platform (every
    /// tenant, or those a lease names). Its heartbeats and completions name the run's tenant
    /// with `X-Tenant-Id`, and so act for that tenant.
    Platform,
}

impl Scope {
    fn of(caller: &Caller) -> Result<Self, ApiError> {
        caller.require(Action::PullWork)?;
        match (caller.grant(), caller.acting_tenant().cloned()) {
            (Grant::PlatformAdmin, Some(t)) => Ok(Scope::ActingFor(t)),
            (Grant::PlatformAdmin, None) => Ok(Scope::Platform),
            (Grant::Key(_), Some(t)) => Ok(Scope::Key(t)),
            (Grant::Key(_), None) => Err(ApiError::Unauthorized),
        }
    }

    /// The one tenant this scope serves, if it is limited to one.
    fn tenant(&self) -> Option<&TenantId> {
        match self {
            Scope::Key(t) | Scope::ActingFor(t) => Some(t),
            Scope::Platform => None,
        }
    }

    /// The lease holder's name Redis records for `worker` (`keys::pull_consumer`): a worker
    /// key's in its tenant's names; the platform admin's in its own, with or without
    /// `X-Tenant-Id` (so a run its platform-wide lease started is heard from the heartbeat that
    /// names the run's tenant).
    fn consumer(&self, worker: &str) -> String {
        match self {
            Scope::Key(t) => keys::pull_consumer(Some(t), worker),
            Scope::ActingFor(_) | Scope::Platform => keys::pull_consumer(None, worker),
        }
    }

    /// The tenant whose run a heartbeat or completion names: a worker key's own, else the
    /// platform admin's `X-Tenant-Id`. Only that tenant's runs are heard.
    fn run_tenant(&self) -> Result<TenantId, ApiError> {
        self.tenant().cloned().ok_or_else(|| ApiError::BadRequest {
            code: "tenant_required",
            detail: "the platform admin names the run's tenant: send X-Tenant-Id".into(),
        })
    }
}

/// Checks a `worker_id`: 1 to 64 of `A-Z a-z 0-9 . _ -`.
fn worker_id(text: &str) -> Result<&str, ApiError> {
    let ok = !text.is_empty()
        && text.len() <= 64
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(text)
    } else {
        Err(ApiError::BadRequest {
            code: "invalid_worker_id",
            detail: "worker_id must be 1 to 64 of A-Z, a-z, 0-9, '.', '_' and '-'".into(),
        })
    }
}

/// Parses a `lease` duration (`500ms`, `30s`, `5m`), within [`MIN_LEASE`] and [`MAX_LEASE`].
fn lease_of(text: Option<&str>) -> Result<Duration, ApiError> {
    let Some(text) = text else {
        return Ok(DEFAULT_LEASE);
    };
    let invalid = || ApiError::BadRequest {
        code: "invalid_lease",
        detail: format!(
            "lease must be a duration such as 500ms, 30s or 5m, from {}ms to {}s",
            MIN_LEASE.as_millis(),
            MAX_LEASE.as_secs()
        ),
    };
    let (digits, unit_ms) = if let Some(d) = text.strip_suffix("ms") {
        (d, 1)
    } else if let Some(d) = text.strip_suffix('s') {
        (d, 1_000)
    } else if let Some(d) = text.strip_suffix('m') {
        (d, 60_000)
    } else {
        return Err(invalid());
    };
    if digits.is_empty() || digits.len() > 9 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid());
    }
    let lease = Duration::from_millis(digits.parse::<u64>().map_err(|_| invalid())? * unit_ms);
    if !(MIN_LEASE..=MAX_LEASE).contains(&lease) {
        return Err(invalid());
    }
    Ok(lease)
}

/// `?wait=` of the long polls.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PollParams {
    /// Wait up to this long for something to answer with (`250ms`, `30s`, `1m`; at most
    /// 60 s). Without it the call answers at once.
    #[param(
        pattern = "^(([1-9][0-9]{0,3}|[1-5][0-9]{4}|60000)ms|([1-9]|[1-5][0-9]|60)s?|1m)$",
        example = "2s"
    )]
    pub wait: Option<String>,
}

/// The body of `POST /api/worker/lease`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"worker_id": "billing-7", "max": 4, "lease": "30s", "holding": []}))]
pub struct LeaseRequest {
    /// Names this worker process, and must stay the same across its calls: the runs it leases
    /// are held under it (in the caller's scope).
    #[schema(pattern = "^[A-Za-z0-9._-]{1,64}$")]
    pub worker_id: String,
    /// Most executions to hand out (1 to 100, its free slots); 1 when absent.
    #[serde(default)]
    #[schema(value_type = Option<u32>, minimum = 1, maximum = 100)]
    pub max: Option<WholeU32>,
    /// How long each run's lease lasts without a heartbeat (`500ms` to `10m`); `30s` when
    /// absent. Heartbeat well within it (a third is usual).
    #[serde(default)]
    #[schema(
        pattern = "^(([5-9][0-9]{2}|[1-9][0-9]{3,4}|[1-5][0-9]{5}|600000)ms|([1-9]|[1-9][0-9]|[1-5][0-9]{2}|600)s|([1-9]|10)m)$"
    )]
    pub lease: Option<String>,
    /// Only for the platform admin without `X-Tenant-Id`: the tenants to serve (at most 64;
    /// all when absent). A worker key, and the platform admin acting for a tenant, serve that
    /// tenant; naming another is a 403.
    #[serde(default)]
    #[schema(schema_with = tenant_list)]
    pub tenants: Option<Vec<String>>,
    /// The executions this worker runs now (at most 1000): what it already holds and knows of
    /// is not handed out again. Anything else it holds (a lost answer started it) comes back
    /// with `recovered: true`.
    #[serde(default)]
    #[schema(schema_with = held_list)]
    pub holding: Option<Vec<String>>,
}

/// `tenants`: up to [`MAX_TENANTS`] tenant ids.
fn tenant_list() -> Array {
    list_of(
        "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
        MAX_TENANTS,
        "Only for the platform admin without `X-Tenant-Id`: the tenants to serve (at most 64; \
         all when absent). A worker key, and the platform admin acting for a tenant \
         (`X-Tenant-Id`), serve that tenant; naming another is a 403 `tenant_mismatch`.",
    )
}

/// `holding`: up to [`MAX_HOLDING`] execution ids.
fn held_list() -> Array {
    list_of(
        "^[0-9a-f]{32}$",
        MAX_HOLDING,
        "The executions this worker runs now (at most 1000): what it already holds and knows \
         of is not handed out again. Anything else it holds (a lost answer started it) comes \
         back with `recovered: true`.",
    )
}

fn list_of(pattern: &str, most: usize, description: &str) -> Array {
    // Null, as absence: the field is optional.
    ArrayBuilder::new()
        .schema_type(SchemaType::from_iter([Type::Array, Type::Null]))
        .items(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some(pattern)),
        )
        .max_items(Some(most))
        .description(Some(description))
        .build()
}

/// One run handed to a pull worker.
#[derive(Debug, Serialize, ToSchema)]
pub struct LeasedRun {
    #[schema(pattern = "^[0-9a-f]{32}$")]
    pub execution_id: String,
    pub tenant_id: String,
    pub flow_id: String,
    pub version: Option<String>,
    #[schema(schema_with = super::executions::wire::free_form_object)]
    pub params: Value,
    /// The run's fencing token: its heartbeats and its completion name it.
    pub fence: u64,
    /// Starts of the current run, 1 on the first.
    #[schema(minimum = 1, maximum = 100)]
    pub attempt: u32,
    #[schema(minimum = 1, maximum = 100)]
    pub max_attempts: u32,
    /// How long the lease lasts from this answer without a heartbeat, in milliseconds.
    pub lease_ms: u64,
    /// The W3C trace context the admission carried, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tracestate: Option<String>,
    /// Started for this worker by an earlier call whose answer it did not get: run it.
    pub recovered: bool,
}

impl LeasedRun {
    fn of(s: Started, lease: Duration, recovered: bool) -> Self {
        let (traceparent, tracestate) = match s.trace {
            Some(t) => (Some(t.traceparent), t.tracestate),
            None => (None, None),
        };
        Self {
            execution_id: s.id.as_str().to_owned(),
            tenant_id: s.tenant.as_str().to_owned(),
            flow_id: s.flow.as_str().to_owned(),
            version: s.version,
            params: s.params,
            fence: s.fence,
            attempt: s.attempt,
            max_attempts: s.max_attempts,
            lease_ms: lease.as_millis() as u64,
            traceparent,
            tracestate,
            recovered,
        }
    }
}

/// What a lease call hands out.
#[derive(Debug, Serialize, ToSchema)]
pub struct LeaseAnswer {
    /// The runs, now held by this worker; empty when the wait ended with nothing to start.
    pub runs: Vec<LeasedRun>,
}

/// Lease executions to run.
///
/// Starts up to `max` queued executions for this worker (by fair share among the tenants it
/// serves, as `sluice worker` does) and hands them out, each under a lease of `lease`. With
/// `?wait=`, a call that finds nothing waits for work (pushed by Redis, not polled) and
/// answers as soon as some starts, or empty when the wait is over.
///
/// A `worker` key serves its tenant. The platform admin serves the tenant `X-Tenant-Id`
/// names, as that tenant's worker would; without it, the tenants in `tenants`, or all.
///
/// Runs the worker already holds (of the tenants this call serves) but did not name in
/// `holding` are handed out again first, with `recovered: true`: an answer lost on the way is
/// recovered by the next call.
#[utoipa::path(
    post,
    path = "/api/worker/lease",
    tag = "worker",
    params(PollParams),
    request_body = LeaseRequest,
    responses(
        (status = 200, description = "The runs handed out (possibly none)", body = LeaseAnswer),
        (status = 400, description = "Malformed body or `wait`", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not a worker key nor the platform admin, or `tenants` names a tenant other than the key's or `X-Tenant-Id`'s (`tenant_mismatch`)", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "`tenant_too_many_waiters`: the tenant has `--max-waiters-per-tenant` open waits on this server", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
        (status = 503, description = "`too_many_waiters`, or Redis unavailable (anything a failed call started comes back on the next call)", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn lease(
    State(state): State<AppState>,
    caller: Caller,
    Query(poll): Query<PollParams>,
    body: JsonBody<LeaseRequest>,
) -> Result<axum::Json<LeaseAnswer>, ApiError> {
    let scope = Scope::of(&caller)?;
    let body = body.parse().await?;
    let wait = poll.wait.as_deref().map(parse_wait).transpose()?;
    let consumer = scope.consumer(worker_id(&body.worker_id)?);
    let max = body.max.map_or(1, |m| m.0);
    if !(1..=MAX_LEASE_BATCH).contains(&max) {
        return Err(ApiError::BadRequest {
            code: "invalid_max",
            detail: format!("max must be 1 to {MAX_LEASE_BATCH}"),
        });
    }
    let max = max as usize;
    let lease = lease_of(body.lease.as_deref())?;
    let tenants = served_tenants(&scope, body.tenants.as_deref())?;
    let holding = holding_of(body.holding.as_deref())?;
    let store = &state.store;
    // The shards to look in, each with the tenants served there (none: all of its tenants).
    let plan: Vec<(Shard, Vec<TenantId>)> = if tenants.is_empty() {
        store.shards().all().map(|s| (s, Vec::new())).collect()
    } else {
        let mut plan: Vec<(Shard, Vec<TenantId>)> = Vec::new();
        for t in tenants.iter().cloned() {
            let shard = store.shard_of(&t);
            match plan.iter_mut().find(|(s, _)| *s == shard) {
                Some((_, ts)) => ts.push(t),
                None => plan.push((shard, vec![t])),
            }
        }
        plan
    };
    let deadline = Instant::now() + wait.unwrap_or_default();
    let _place = match wait {
        Some(_) => Some(state.waiters.reserve(&tenants).map_err(refused)?),
        None => None,
    };
    let mut revoked = caller.key_watch(&state.revocations);
    let stopping = state.waiters.stopping();
    // Listening first: work that comes while this call looks is not missed.
    let mut listening = wait.map(|_| {
        let shards: Vec<Shard> = plan.iter().map(|(s, _)| *s).collect();
        state.pull.doorbells.listen(&shards)
    });
    // What this worker holds without knowing it (a lost answer started it) comes first: of
    // the tenants this call serves only (another's is left to its lease, or its heartbeats).
    let held = futures_util::future::join_all(plan.iter().map(|(shard, only)| {
        store.adopt_for(*shard, &consumer, max + holding.len(), lease, 0, only)
    }))
    .await;
    // A shard that fails (its master down, a time-out) is left out for the rest of this call:
    // the others are served meanwhile, as a `sluice worker`'s are. What a failed call may have
    // started there comes back on a later call (`recovered`).
    let mut call = Looking {
        store,
        consumer: &consumer,
        lease,
        plan: &plan,
        runs: Vec::new(),
        down: HashSet::new(),
        failure: None,
    };
    for (i, found) in held.into_iter().enumerate() {
        match found {
            Ok(found) => {
                for s in found {
                    if call.runs.len() < max && !holding.contains(s.id.as_str()) {
                        call.runs.push(LeasedRun::of(s, lease, true));
                    }
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, shard = plan[i].0.number(), "pull: adopt failed");
                call.down.insert(i);
                call.failure = Some(e);
            }
        }
    }
    // Where to look: every shard served, until a doorbell names the ones with news.
    let mut look: Vec<usize> = (0..plan.len()).collect();
    let shares = &state.pull.shares;
    // A lease that serves one shard has nothing to share between shards.
    let sharing = plan.len() > 1;
    loop {
        let mut pass = Pass {
            listening: listening.as_ref(),
            ..Pass::default()
        };
        // Shares go by each shard's eligible weight as its last start call for this worker
        // answered (`pull::Shares`). A shard whose weight is not known (never asked, or it had
        // nothing a while ago) is asked for one start first, outside the round robin: one that
        // turns out empty costs a call, and moves nobody's share.
        if sharing {
            let open: Vec<Shard> = call.open(&look, &pass);
            for shard in shares.unknown(&consumer, &open) {
                if call.runs.len() == max {
                    break;
                }
                if let Some((_, weight)) = call.ask(shard, 1, &mut pass).await {
                    shares.heard(&consumer, shard, weight);
                }
            }
        }
        // Then the shards with runnable work, each in proportion to its eligible weight (the
        // round robin `sluice worker` uses). A shard that starts less than it was asked for
        // has nothing more this pass; what it did not serve is shared again among the others.
        for _ in 0..=plan.len() {
            let left = max - call.runs.len();
            let open: Vec<Shard> = call.open(&look, &pass);
            let round = match open.as_slice() {
                [only] if !sharing => crate::pull::Round::alone(*only, left),
                _ => shares.plan(&consumer, &open, left),
            };
            if round.asks.is_empty() {
                break;
            }
            let mut fell_short = false;
            for &(shard, count) in &round.asks {
                let answer = call.ask(shard, count, &mut pass).await;
                let got = answer.map_or(0, |(got, _)| got);
                shares.learn(&consumer, &round, shard, count, got, answer.map(|(_, w)| w));
                fell_short |= got < count;
            }
            if !fell_short {
                break;
            }
        }
        // Then, with slots left, the shards not asked in this pass (their last answer said
        // they had nothing runnable): new work there is not missed for the round robin's sake.
        for &i in &look {
            let left = max - call.runs.len();
            if left == 0 {
                break;
            }
            if call.down.contains(&i) || pass.asked.contains(&i) {
                continue;
            }
            let shard = plan[i].0;
            if let Some((_, weight)) = call.ask(shard, left, &mut pass).await
                && sharing
            {
                shares.heard(&consumer, shard, weight);
            }
        }
        if call.runs.is_empty()
            && call.down.len() == plan.len()
            && let Some(e) = call.failure.take()
        {
            // Every shard it serves failed: nothing to wait for here.
            return Err(e.into());
        }
        let due = pass.due;
        let Some(bells) = listening.as_mut() else {
            break;
        };
        if !call.runs.is_empty() || Instant::now() >= deadline {
            break;
        }
        let until = due.map_or(deadline, |d| d.min(deadline));
        tokio::select! {
            rang = bells.rung() => {
                look = (0..plan.len()).filter(|&i| rang.contains(&plan[i].0)).collect();
            }
            () = tokio::time::sleep_until(until) => {
                if until >= deadline {
                    break;
                }
                look = (0..plan.len()).collect();
            }
            () = until_revoked(&mut revoked) => return Err(ApiError::Unauthorized),
            () = stopping.cancelled() => break,
        }
    }
    let runs = call.runs;
    state.metrics.pull_handed_out(runs.len());
    Ok(axum::Json(LeaseAnswer { runs }))
}

/// The shortest pause before looking again for a scheduled execution that is due (one due
/// now that could not start must not make a lease call spin).
const MIN_DUE_PAUSE: Duration = Duration::from_millis(10);

/// One lease call's look over its shards: what it asks with, and what it has so far.
struct Looking<'a> {
    store: &'a crate::store::Store,
    consumer: &'a str,
    lease: Duration,
    /// The shards it serves, each with the tenants served there (none: all of its tenants).
    plan: &'a [(Shard, Vec<TenantId>)],
    /// The runs it hands out.
    runs: Vec<LeasedRun>,
    /// The shards (by place in `plan`) whose call failed: left out for the rest of the call.
    down: HashSet<usize>,
    /// The last failure, answered when every shard failed.
    failure: Option<crate::store::StoreError>,
}

impl Looking<'_> {
    /// The shards of `look` still worth asking in `pass`: not down, not found short.
    fn open(&self, look: &[usize], pass: &Pass<'_>) -> Vec<Shard> {
        look.iter()
            .filter(|i| !self.down.contains(*i) && !pass.short.contains(*i))
            .map(|&i| self.plan[i].0)
            .collect()
    }

    /// Asks `shard` for `count` starts: what it started is handed out, and the time its next
    /// scheduled execution is due noted; a shard that starts fewer is short for the pass.
    /// Returns how many it started and its eligible weight now, or `None` when the call
    /// failed (the shard is down for the rest of the call).
    async fn ask(
        &mut self,
        shard: Shard,
        count: usize,
        pass: &mut Pass<'_>,
    ) -> Option<(usize, u64)> {
        let i = self.plan.iter().position(|(s, _)| *s == shard)?;
        pass.asked.insert(i);
        let only = &self.plan[i].1;
        match self
            .store
            .start_for(shard, self.consumer, count, self.lease, 0, only)
            .await
        {
            Ok(batch) => {
                let got = batch.started.len();
                if got > 0
                    && let Some(l) = pass.listening
                {
                    l.started(shard);
                }
                if got < count {
                    pass.short.insert(i);
                }
                if let Some(d) = batch.next_due {
                    let at = Instant::now() + d.max(MIN_DUE_PAUSE);
                    pass.due = Some(pass.due.map_or(at, |u| u.min(at)));
                }
                let lease = self.lease;
                self.runs.extend(
                    batch
                        .started
                        .into_iter()
                        .map(|s| LeasedRun::of(s, lease, false)),
                );
                Some((got, batch.weight))
            }
            Err(e) => {
                tracing::debug!(error = %e, shard = shard.number(), "pull: start failed");
                self.down.insert(i);
                self.failure = Some(e);
                None
            }
        }
    }
}

/// What one pass of a lease call over its shards learned.
#[derive(Default)]
struct Pass<'a> {
    /// The call's doorbell listener, told of every shard that started something.
    listening: Option<&'a crate::pull::Listening>,
    /// The shards (by place in the call's plan) asked in this pass.
    asked: HashSet<usize>,
    /// Those that started less than they were asked for: nothing more of them this pass.
    short: HashSet<usize>,
    /// The earliest time a scheduled execution of a shard asked falls due.
    due: Option<Instant>,
}

/// The tenants a lease serves: a worker key's own, or the one the platform admin acts for;
/// the platform-wide admin's list (none: all).
fn served_tenants(scope: &Scope, named: Option<&[String]>) -> Result<Vec<TenantId>, ApiError> {
    match scope {
        Scope::Key(own) | Scope::ActingFor(own) => {
            if let Some(named) = named
                && named.iter().any(|t| t != own.as_str())
            {
                return Err(ApiError::Forbidden {
                    code: "tenant_mismatch",
                    detail: match scope {
                        Scope::Key(_) => "a worker key serves its own tenant only".into(),
                        _ => format!(
                            "the platform admin acting for {own} (X-Tenant-Id) serves that \
                             tenant only; leave X-Tenant-Id out to serve the tenants named"
                        ),
                    },
                });
            }
            Ok(vec![own.clone()])
        }
        Scope::Platform => {
            let named = named.unwrap_or_default();
            if named.len() > MAX_TENANTS {
                return Err(ApiError::BadRequest {
                    code: "too_many_tenants",
                    detail: format!("a lease names at most {MAX_TENANTS} tenants"),
                });
            }
            let mut tenants: Vec<TenantId> = Vec::new();
            for t in named {
                let t = TenantId::parse(t)?;
                if !tenants.contains(&t) {
                    tenants.push(t);
                }
            }
            if named.is_empty() && tenants.is_empty() {
                return Ok(Vec::new());
            }
            Ok(tenants)
        }
    }
}

/// The ids of `holding`, checked.
fn holding_of(named: Option<&[String]>) -> Result<HashSet<String>, ApiError> {
    let named = named.unwrap_or_default();
    if named.len() > MAX_HOLDING {
        return Err(ApiError::BadRequest {
            code: "too_many_held",
            detail: format!("holding names at most {MAX_HOLDING} executions"),
        });
    }
    named
        .iter()
        .map(|id| Ok(ExecutionId::parse(id)?.as_str().to_owned()))
        .collect()
}

/// The body of a heartbeat.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"worker_id": "billing-7", "fence": 1}))]
pub struct HeartbeatRequest {
    #[schema(pattern = "^[A-Za-z0-9._-]{1,64}$")]
    pub worker_id: String,
    /// The `fence` the run was handed out with.
    #[schema(value_type = u64, minimum = 0, maximum = 9_007_199_254_740_991_u64)]
    pub fence: WholeU64,
    /// The lease from now on (`500ms` to `10m`); `30s` when absent.
    #[serde(default)]
    #[schema(
        pattern = "^(([5-9][0-9]{2}|[1-9][0-9]{3,4}|[1-5][0-9]{5}|600000)ms|([1-9]|[1-9][0-9]|[1-5][0-9]{2}|600)s|([1-9]|10)m)$"
    )]
    pub lease: Option<String>,
}

/// What a held run's worker should do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// Keep going: the lease is extended.
    Held,
    /// The execution was cancelled (or force-deleted): stop, and complete it as `cancelled`.
    /// The lease is extended meanwhile.
    CancelRequested,
}

/// The answer to a heartbeat.
#[derive(Debug, Serialize, ToSchema)]
pub struct HeartbeatAnswer {
    pub state: RunState,
    /// How long the lease lasts from this answer, in milliseconds.
    pub lease_ms: u64,
}

/// Extend a run's lease.
///
/// Heard only from the worker holding the current run (`worker_id` and `fence` as handed
/// out), for a run of the caller's tenant (the platform admin names it with `X-Tenant-Id`);
/// anything else is a 409 `lease_lost`: stop the run, its result will be refused.
#[utoipa::path(
    post,
    path = "/api/worker/runs/{id}/heartbeat",
    tag = "worker",
    params(("id" = String, Path, pattern = "^[0-9a-f]{32}$", description = "Execution id")),
    request_body = HeartbeatRequest,
    responses(
        (status = 200, description = "The lease is extended", body = HeartbeatAnswer),
        (status = 400, description = "Malformed id or body, or the platform admin sent no X-Tenant-Id", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not a worker key nor the platform admin", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`lease_lost`: this worker does not hold this run (any more), or it is not a run of the caller's tenant", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unavailable: try again within the lease", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn heartbeat(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    body: JsonBody<HeartbeatRequest>,
) -> Result<axum::Json<HeartbeatAnswer>, ApiError> {
    let scope = Scope::of(&caller)?;
    let id = ExecutionId::parse(&id)?;
    let body = body.parse().await?;
    let consumer = scope.consumer(worker_id(&body.worker_id)?);
    let lease = lease_of(body.lease.as_deref())?;
    let tenant = scope.run_tenant()?;
    let shard = state.store.shard_of(&tenant);
    let answer = state
        .store
        .heartbeat_for(
            shard,
            &consumer,
            Some(&tenant),
            &[(id, body.fence.0)],
            lease,
        )
        .await?;
    let state_now = match answer.first() {
        Some(LeaseState::Held) => RunState::Held,
        Some(LeaseState::CancelRequested) => RunState::CancelRequested,
        _ => return Err(lease_lost()),
    };
    Ok(axum::Json(HeartbeatAnswer {
        state: state_now,
        lease_ms: lease.as_millis() as u64,
    }))
}

fn lease_lost() -> ApiError {
    ApiError::Status {
        status: StatusCode::CONFLICT,
        code: "lease_lost",
        detail: "this worker does not hold this run (it ended, was recovered after its lease \
                 expired, or the fence is not the current one): stop it"
            .into(),
    }
}

/// How a run ended, as its worker reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunOutcome {
    /// It succeeded; `output` is its result.
    Completed,
    /// It failed with `error`; with `retryable`, another attempt follows (if any are left)
    /// after the server's backoff.
    Failed,
    /// It stopped because its cancel was requested.
    Cancelled,
    /// The worker gives it back unrun (shutting down): it goes back in its tenant's order,
    /// and this run does not count as an attempt.
    Released,
}

/// Why a run failed.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunError {
    /// A short machine-readable kind (`timeout`, `http_500`, ...); `error` when absent.
    #[serde(default)]
    #[schema(min_length = 1, max_length = 64)]
    pub kind: Option<String>,
    /// What happened, for people (at most 4096 bytes; longer is cut).
    #[serde(default)]
    pub message: Option<String>,
}

/// The body of a completion.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"worker_id": "billing-7", "fence": 1, "outcome": "completed", "output": {"ok": true}}))]
pub struct CompleteRequest {
    #[schema(pattern = "^[A-Za-z0-9._-]{1,64}$")]
    pub worker_id: String,
    /// The `fence` the run was handed out with.
    #[schema(value_type = u64, minimum = 0, maximum = 9_007_199_254_740_991_u64)]
    pub fence: WholeU64,
    pub outcome: RunOutcome,
    /// The result of a `completed` run (any JSON; at most `--max-params-bytes`).
    #[serde(default)]
    pub output: Option<Value>,
    /// Why a `failed` run failed.
    #[serde(default)]
    pub error: Option<RunError>,
    /// For `failed`: another attempt may follow (default false). A failure that may be
    /// retried gets another attempt after the backoff while attempts are left, and on the last
    /// one ends `failed` with a dead-letter record (`dead_lettered`); one that may not (false)
    /// ends `failed` at once, with no dead-letter record (`failed`).
    #[serde(default)]
    pub retryable: Option<bool>,
}

/// What the server made of a completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CompletionResult {
    /// Now `completed`.
    Completed,
    /// Now `cancelled`.
    Cancelled,
    /// Failed and not retryable: now `failed`, at once and with no dead-letter record.
    Failed,
    /// Failed (retryable) on its last attempt: now `failed`, with a dead-letter record.
    DeadLettered,
    /// Failed; another attempt starts after `retry_in_ms`.
    Retrying,
    /// Back in its tenant's order.
    Released,
    /// It was force-deleted while it ran; nothing more to do.
    Deleted,
    /// This run's report was applied already (an earlier answer was lost).
    AlreadyReported,
}

/// The answer to a completion.
#[derive(Debug, Serialize, ToSchema)]
pub struct CompleteAnswer {
    pub result: CompletionResult,
    /// With `retrying`: the backoff before the next attempt, in milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_in_ms: Option<u64>,
}

/// Report how a run ended.
///
/// Heard only from the worker holding the current run, for a run of the caller's tenant (the
/// platform admin names it with `X-Tenant-Id`); 409 `lease_lost` otherwise: the run was
/// recovered after its lease expired, and another attempt owns the execution now. Safe to
/// repeat after a lost answer (`already_reported`).
#[utoipa::path(
    post,
    path = "/api/worker/runs/{id}/complete",
    tag = "worker",
    params(("id" = String, Path, pattern = "^[0-9a-f]{32}$", description = "Execution id")),
    request_body = CompleteRequest,
    responses(
        (status = 200, description = "Applied", body = CompleteAnswer),
        (status = 400, description = "Malformed id or body, or the platform admin sent no X-Tenant-Id", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not a worker key nor the platform admin", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`lease_lost`: this worker does not hold this run (any more), or it is not a run of the caller's tenant; the report is refused", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "`output_too_large`", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unavailable: report again (it is applied once)", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn complete(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    body: JsonBody<CompleteRequest>,
) -> Result<axum::Json<CompleteAnswer>, ApiError> {
    let scope = Scope::of(&caller)?;
    let id = ExecutionId::parse(&id)?;
    let body = body.parse().await?;
    let consumer = scope.consumer(worker_id(&body.worker_id)?);
    let tenant = scope.run_tenant()?;
    let store = &state.store;
    let mut retry_in = None;
    let outcome = match body.outcome {
        RunOutcome::Completed => {
            let output = body.output.unwrap_or(Value::Null);
            if output.to_string().len() > state.max_params_bytes {
                return Err(ApiError::Status {
                    status: StatusCode::PAYLOAD_TOO_LARGE,
                    code: "output_too_large",
                    detail: format!(
                        "output is larger than {} bytes as JSON",
                        state.max_params_bytes
                    ),
                });
            }
            Outcome::Completed(output)
        }
        RunOutcome::Failed => {
            let error = body.error.unwrap_or(RunError {
                kind: None,
                message: None,
            });
            let kind = error.kind.unwrap_or_else(|| "error".into());
            if kind.is_empty() || kind.len() > 64 {
                return Err(ApiError::BadRequest {
                    code: "invalid_error_kind",
                    detail: "error.kind must be 1 to 64 bytes".into(),
                });
            }
            let mut message = error.message.unwrap_or_default();
            if message.len() > MAX_ERROR_MESSAGE {
                let mut cut = MAX_ERROR_MESSAGE;
                while !message.is_char_boundary(cut) {
                    cut -= 1;
                }
                message.truncate(cut);
            }
            if body.retryable == Some(true) {
                // The backoff grows with the run's attempt, read from the execution.
                let attempt = store
                    .get(&tenant, &id)
                    .await?
                    .map(|e| e.attempt)
                    .unwrap_or(1);
                retry_in = Some(state.pull.backoff(attempt));
            }
            Outcome::Failed {
                kind,
                message,
                retry_after: retry_in,
            }
        }
        RunOutcome::Cancelled => Outcome::Cancelled,
        RunOutcome::Released => Outcome::Released,
    };
    let shard = store.shard_of(&tenant);
    let done = store
        .complete_for(shard, &id, body.fence.0, &consumer, &tenant, &outcome)
        .await?;
    let result = match done {
        Completion::Stale => return Err(lease_lost()),
        Completion::Repeat => CompletionResult::AlreadyReported,
        Completion::Deleted => CompletionResult::Deleted,
        Completion::Released => CompletionResult::Released,
        Completion::Retrying => CompletionResult::Retrying,
        Completion::DeadLettered => CompletionResult::DeadLettered,
        Completion::Done(crate::domain::Status::Cancelled) => CompletionResult::Cancelled,
        Completion::Done(crate::domain::Status::Failed) => CompletionResult::Failed,
        Completion::Done(_) => CompletionResult::Completed,
        // Only an `abandoned` report recovers; the pull API sends none.
        Completion::Recovered => CompletionResult::Released,
    };
    Ok(axum::Json(CompleteAnswer {
        result,
        retry_in_ms: (result == CompletionResult::Retrying)
            .then(|| retry_in.map(|d| d.as_millis() as u64))
            .flatten(),
    }))
}

/// The credential whose bound a stop poll's mailbox counts in (`crate::pull::MailboxLimits`):
/// a key by its id, the platform admin token and dev auth as one.
fn mailbox_owner(caller: &Caller) -> String {
    match caller.credential() {
        Credential::ApiKey(id) => format!("key:{id}"),
        Credential::AdminToken | Credential::DevAuth => "platform".to_owned(),
    }
}

/// The body of a stop poll.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"worker_id": "billing-7"}))]
pub struct StopsRequest {
    #[schema(pattern = "^[A-Za-z0-9._-]{1,64}$")]
    pub worker_id: String,
}

/// Runs to stop.
#[derive(Debug, Serialize, ToSchema)]
pub struct StopsAnswer {
    /// Executions this worker holds whose cancel was requested (or that were force-deleted)
    /// since its last stop poll: stop them and complete them as `cancelled`.
    pub stop: Vec<String>,
}

/// Hear cancels at once.
///
/// A long poll (`?wait=`) that answers as soon as a run this worker holds is cancelled or
/// force-deleted. A cancel published while no poll of this worker was open (for up to a
/// minute after its last one) is kept for its next poll, within a bound per credential
/// (`--pull-mailboxes-per-credential`: past it the credential's worker idle the longest is
/// forgotten). It is a shortcut: the run's next heartbeat answers `cancel_requested` in any
/// case.
#[utoipa::path(
    post,
    path = "/api/worker/stops",
    tag = "worker",
    params(PollParams),
    request_body = StopsRequest,
    responses(
        (status = 200, description = "The runs to stop (possibly none)", body = StopsAnswer),
        (status = 400, description = "Malformed body or `wait`", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not a worker key nor the platform admin", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "`tenant_too_many_waiters`", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
        (status = 503, description = "`too_many_waiters`", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn stops(
    State(state): State<AppState>,
    caller: Caller,
    Query(poll): Query<PollParams>,
    body: JsonBody<StopsRequest>,
) -> Result<axum::Json<StopsAnswer>, ApiError> {
    let scope = Scope::of(&caller)?;
    let body = body.parse().await?;
    let wait = poll.wait.as_deref().map(parse_wait).transpose()?;
    let consumer = scope.consumer(worker_id(&body.worker_id)?);
    let tenants: Vec<TenantId> = scope.tenant().cloned().into_iter().collect();
    let _place = match wait {
        Some(_) => Some(state.waiters.reserve(&tenants).map_err(refused)?),
        None => None,
    };
    let deadline = Instant::now() + wait.unwrap_or_default();
    let mut revoked = caller.key_watch(&state.revocations);
    let stopping = state.waiters.stopping();
    let owner = mailbox_owner(&caller);
    let stop = tokio::select! {
        ids = state.pull.stops.next(&consumer, &owner, deadline) => ids,
        () = until_revoked(&mut revoked) => return Err(ApiError::Unauthorized),
        () = stopping.cancelled() => Vec::new(),
    };
    Ok(axum::Json(StopsAnswer { stop }))
}
