//! `/api/executions`: admit, read, list, cancel and delete executions. Each handler checks the
//! caller's role, parses its input into domain types at the edge and makes one storage call;
//! the JSON shapes are in `wire`. Waiting for an execution (`?wait`, `/events`) is `waiting`.
//!
//! Long on purpose: one handler per route of the resource, each with its OpenAPI annotation
//! and docs (over a quarter of the lines), so the contract of a route sits beside its code.

mod answer;
pub mod batch;
pub mod waiting;
pub mod wire;

use std::sync::Arc;

use axum::Extension;
use axum::extract::FromRequestParts;
use axum::extract::State;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::auth::Caller;
use super::error::{ApiError, Problem};
use super::extract::{JsonBody, Path, Query, QueryLater};
use super::metrics::AdmissionOutcome;
use crate::domain::{
    AdmitRequest, DedupKey, ExecutionId, FlowId, QueueState, Status, TenantId, TraceContext,
};
use crate::http::actions::Action;
use crate::store::{
    Admission, Decision, ListQuery, ROW_BYTES, Reschedule, Retry, StorageBound, StorageFull,
    StoreError, Ticket,
};
use wire::{
    BatchAnswer, BatchResult, DryRunAnswer, Execution, ExecutionPage, NewBatch, NewExecution,
};

/// Seconds a client should wait after `tenant_queue_full` when the tenant's drain was not
/// measured (no start in the last minutes).
const QUEUE_FULL_RETRY_AFTER: u64 = 5;

/// The most `Retry-After` a full queue answers: a client should look again within the hour.
const MAX_QUEUE_FULL_RETRY_AFTER: u64 = 3_600;
/// The most items one batch admission takes.
const MAX_BATCH: usize = 1_000;

/// Page size when `limit` is not given, and the most a page may hold.
const DEFAULT_PAGE: u32 = 50;
const MAX_PAGE: u32 = 200;

/// The execution routes with their OpenAPI documentation.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_execution, list_executions))
        .routes(routes!(create_batch))
        .routes(routes!(dry_run_execution))
        .routes(routes!(get_execution, delete_execution))
        .routes(routes!(cancel_execution))
        .routes(routes!(retry_execution))
        .routes(routes!(reschedule_execution))
        .routes(routes!(waiting::stream_execution_events))
}

/// The route of single admission (`create_execution`); the edge gives its requests a ticket.
pub const CREATE_ROUTE: &str = "/api/executions";
/// The route of batch admission (`create_batch`); the edge gives its requests a ticket.
pub const BATCH_ROUTE: &str = "/api/executions/batch";

/// Start an execution of a flow for the caller's tenant.
///
/// Atomic on Redis: the dedup claim, the row, the indexes, the quota decision and the enqueue
/// happen in one step. A repeat with the same dedup key (header `Idempotency-Key` or body
/// `dedup_key`) and the same request returns the first execution with 200 and
/// `Idempotent-Replayed: true`.
///
/// Every 503 says what was admitted. `redis_unavailable` and `request_timeout`: nothing, also
/// if Redis was only slow (an admission whose answer was lost is settled before the server
/// answers; one still waiting for Redis when the request's time ran out is never sent). Only
/// `admission_outcome_unknown` leaves it open, naming the `execution_id` it may have.
/// What admission would do, without admitting, is `POST /api/executions/dry-run`.
#[utoipa::path(
    post,
    path = "/api/executions",
    tag = "executions",
    request_body = NewExecution,
    params(
        ("Idempotency-Key" = Option<String>, Header, min_length = 1, max_length = 256,
            pattern = "^[!-~]([ -~]*[!-~])?$",
            description = "Dedup key: 1–256 visible ASCII characters (other UTF-8 goes in the body's `dedup_key`); must equal the body's `dedup_key` when both are given"),
        ("traceparent" = Option<String>, Header,
            description = "W3C Trace Context: kept with the execution (the first admission's, on a replay) and handed to its handlers. One that does not parse is ignored, as the W3C recommendation says (the execution then has none); never a 400"),
        ("tracestate" = Option<String>, Header,
            description = "W3C Trace Context: kept beside a valid `traceparent` when it is printable ASCII of at most 512 bytes (else dropped whole), and handed on with it"),
        CreateParams,
    ),
    responses(
        (status = 201, description = "Admitted", body = Execution,
            headers(("Location" = String, description = "URL of the new execution"))),
        (status = 200, description = "Replay of an earlier admission with the same dedup key", body = Execution,
            headers(("Idempotent-Replayed" = String, description = "`true` on a replay"))),
        (status = 400, description = "Invalid request; `dry_run_moved`: `?dry_run=true` (the dry run is `POST /api/executions/dry-run`)", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Tenant disabled or role too weak", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "`payload_too_large`: the body exceeds `--body-limit`. `params_too_large`: `params` exceed `--max-params-bytes`. `execution_too_large`: the execution's logical size (512 + its params) exceeds the tenant's `max_bytes`, so it can never be admitted", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Body is not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`tenant_deleting`: the tenant is being deleted; nothing was admitted", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
        (status = 422, description = "Dedup key already used with a different flow, version or params", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "`tenant_queue_full`: the tenant has `max_queued` executions queued. `tenant_storage_full`: it keeps `max_bytes` logical bytes or `max_retained` terminal executions; `Retry-After` says when its oldest retained ones have expired (at most an hour). Nothing was admitted", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
        (status = 503, description = "`redis_unavailable`, `request_timeout`: nothing was admitted. `admission_outcome_unknown`: Redis stopped answering after the admission was sent; the problem's `execution_id` may exist now or later (look it up, or repeat with the same Idempotency-Key)", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
    ),
    security(("bearer" = []))
)]
pub async fn create_execution(
    State(state): State<AppState>,
    caller: Caller,
    headers: AdmissionHeaders,
    ticket: Option<Extension<Arc<Ticket>>>,
    query: QueryLater<CreateParams>,
    body: JsonBody<NewExecution>,
) -> Result<Response, ApiError> {
    let tenant = caller.tenant_for(Action::Admit)?;
    #[allow(deprecated)]
    if query.given() && query.parse()?.dry_run == Some(true) {
        return Err(ApiError::BadRequest {
            code: "dry_run_moved",
            detail: "the dry run is its own operation now: POST /api/executions/dry-run with \
                     the same body and headers"
                .into(),
        });
    }
    let req = admission_request(&state, tenant, &headers, body).await?;
    let ticket = ticket_of(&state, ticket);
    // With span export on, the execution keeps the `admit` span as its parent (crate::otel).
    let span =
        crate::otel::AdmitSpan::start(tenant.as_str(), req.flow.as_str(), req.trace.as_ref());
    let req = match &span {
        Some(span) => AdmitRequest {
            trace: Some(span.trace()),
            ..req
        },
        None => req,
    };
    let deadline = ticket.deadline();
    let admission = match state.store.admit(tenant.clone(), req, ticket).await {
        // Withdrawn while it waited for Redis: the request's time ran out, nothing was sent.
        Err(StoreError::NotSent(_)) => Err(ApiError::TimeoutNothingAdmitted),
        other => other.map_err(ApiError::from),
    };
    if let Some(span) = span {
        match &admission {
            Ok(Admission::Created(e)) => span.end("admitted", Some(&e.execution_id)),
            Ok(Admission::Replayed(e)) => span.end("replayed", Some(&e.execution_id)),
            Ok(Admission::Conflict { .. }) => span.end("conflict", None),
            Ok(Admission::Disabled) => span.end("tenant_disabled", None),
            Ok(Admission::Deleting) => span.end("tenant_deleting", None),
            Ok(Admission::QueueFull { .. }) => span.end("tenant_queue_full", None),
            Ok(Admission::StorageFull(_)) => span.end("tenant_storage_full", None),
            Ok(Admission::TooLarge { .. }) => span.end("execution_too_large", None),
            Err(_) => span.end("error", None),
        }
    }
    let admission = admission?;
    state.metrics.admission(
        tenant,
        match &admission {
            Admission::Created(_) => AdmissionOutcome::Admitted,
            Admission::Replayed(_) => AdmissionOutcome::Deduplicated,
            Admission::Conflict { .. } => AdmissionOutcome::Conflict,
            Admission::Disabled => AdmissionOutcome::Disabled,
            Admission::Deleting => AdmissionOutcome::Deleting,
            Admission::QueueFull { .. } => AdmissionOutcome::QueueFull,
            Admission::StorageFull(_) => AdmissionOutcome::StorageFull,
            Admission::TooLarge { .. } => AdmissionOutcome::TooLarge,
        },
    );
    match admission {
        Admission::Created(e) => {
            let location = answer::location(&e.execution_id);
            let mut res = answer::execution_json(StatusCode::CREATED, &Execution::from(e));
            if let Ok(v) = HeaderValue::from_str(&location) {
                res.headers_mut().insert(header::LOCATION, v);
            }
            Ok(res)
        }
        Admission::Replayed(e) => {
            let mut res = answer::execution_json(StatusCode::OK, &Execution::from(e));
            res.headers_mut()
                .insert("idempotent-replayed", HeaderValue::from_static("true"));
            Ok(res)
        }
        refused => Err(refusal(&state, tenant, refused, deadline).await),
    }
}

/// Ask what admission would do now with this request, without admitting it.
///
/// Takes exactly what `POST /api/executions` takes (body and headers) and answers, from a
/// script that cannot write, the decision admission would make at this moment: `admit` (it
/// would be `ready`), `wait`, `schedule`, `duplicate` or `conflict` (naming the execution the
/// dedup key holds), or `refuse` (with `retry_after` for a full queue). Nothing is admitted and
/// nothing changes on Redis; a snapshot, since the real admission decides again.
#[utoipa::path(
    post,
    path = "/api/executions/dry-run",
    tag = "executions",
    request_body = NewExecution,
    params(
        ("Idempotency-Key" = Option<String>, Header, min_length = 1, max_length = 256,
            pattern = "^[!-~]([ -~]*[!-~])?$",
            description = "Dedup key, as on `POST /api/executions`: a duplicate or conflict is answered as such"),
        ("traceparent" = Option<String>, Header,
            description = "W3C Trace Context, accepted as on `POST /api/executions`: it changes no decision, and one that does not parse is ignored (never a 400)"),
        ("tracestate" = Option<String>, Header,
            description = "W3C Trace Context, accepted as on `POST /api/executions`: kept beside a valid `traceparent` when printable ASCII of at most 512 bytes (else dropped whole); it changes no decision"),
    ),
    responses(
        (status = 200, description = "What admission would do now; nothing was written", body = DryRunAnswer),
        (status = 400, description = "Invalid request, as for an admission", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Role too weak", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "`payload_too_large`: the body exceeds `--body-limit`. `params_too_large`: `params` exceed `--max-params-bytes`", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Body is not JSON", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn dry_run_execution(
    State(state): State<AppState>,
    caller: Caller,
    headers: AdmissionHeaders,
    body: JsonBody<NewExecution>,
) -> Result<Response, ApiError> {
    let tenant = caller.tenant_for(Action::Admit)?;
    let req = admission_request(&state, tenant, &headers, body).await?;
    let run = state.store.dry_admit(tenant, &req).await?;
    let retry_after = match run.decision {
        Decision::Refuse if run.reason == "tenant_queue_full" => {
            Some(queue_full_retry_after(&state, tenant).await)
        }
        Decision::Refuse => run
            .storage_full
            .as_ref()
            .and_then(|f| storage_full(f).retry_after()),
        _ => None,
    };
    Ok(axum::Json(DryRunAnswer::new(run, retry_after)).into_response())
}

/// The admission request of a body and its headers (`Idempotency-Key`, trace context),
/// checked as `POST /api/executions` and its dry run check it; an invalid one is counted.
async fn admission_request(
    state: &AppState,
    tenant: &TenantId,
    headers: &AdmissionHeaders,
    body: JsonBody<NewExecution>,
) -> Result<AdmitRequest, ApiError> {
    let body = body.parse().await.inspect_err(|_| {
        state.metrics.admission(tenant, AdmissionOutcome::Invalid);
    })?;
    let header_key = match &headers.idempotency_key {
        None => None,
        Some(v) => Some(v.to_str().map_err(|_| ApiError::BadRequest {
            code: "invalid_dedup_key",
            detail:
                "Idempotency-Key must be visible ASCII (send other UTF-8 as body dedup_key)".into(),
        })?),
    };
    let trace = TraceContext::from_headers(
        headers.traceparent.as_ref().and_then(|v| v.to_str().ok()),
        headers.tracestate.as_ref().and_then(|v| v.to_str().ok()),
    );
    AdmitRequest::parse(body.into(), header_key, state.default_max_attempts)
        .map(|req| AdmitRequest { trace, ..req })
        .map_err(ApiError::from)
        .and_then(|req| params_within(req, state.max_params_bytes))
        .inspect_err(|_| {
            state.metrics.admission(tenant, AdmissionOutcome::Invalid);
        })
}

/// The request headers admission reads: taken one by one (a reference count each) where
/// axum's `HeaderMap` extractor clones the whole map, every name and value, per request.
pub struct AdmissionHeaders {
    /// `Idempotency-Key`: the dedup key, when the body does not carry it.
    idempotency_key: Option<HeaderValue>,
    /// `traceparent` and `tracestate`: the W3C trace context kept with the execution.
    traceparent: Option<HeaderValue>,
    tracestate: Option<HeaderValue>,
}

impl<S: Send + Sync> FromRequestParts<S> for AdmissionHeaders {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let headers = &parts.headers;
        Ok(Self {
            idempotency_key: headers.get(IDEMPOTENCY_KEY).cloned(),
            traceparent: headers.get(TRACEPARENT).cloned(),
            tracestate: headers.get(TRACESTATE).cloned(),
        })
    }
}

/// Header names looked up per admission, as names (a `&str` is parsed into one per lookup).
const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// The ticket the edge gave this admission request (see `crate::store::Ticket`); a router
/// driven without the edge gets one bounded by the request time-out.
fn ticket_of(state: &AppState, ticket: Option<Extension<Arc<Ticket>>>) -> Arc<Ticket> {
    match ticket {
        Some(Extension(t)) => t,
        None => Arc::new(Ticket::new(tokio::time::Instant::now() + state.batch_hold)),
    }
}

/// Admit up to 1,000 executions for the caller's tenant in one request.
///
/// Each item is what `POST /api/executions` takes, and gets the status and body it would have
/// had alone (201 with the execution, 200 for a replay of its `dedup_key` — an earlier item of
/// the same batch included — or the problem single admission answers), in the items' order.
/// The items are admitted in order, in Redis calls of at most `--redis-admission-group` items;
/// each item is atomic, **the batch is not**: a failure part-way (503 on some items) leaves
/// the items before it admitted, and repeating the batch with the same dedup keys admits the
/// rest without doubling any. One batch per tenant at a time (409 `batch_in_flight`
/// meanwhile, answered before the body is read). The body may be up to `--batch-body-limit`
/// bytes; it is read and parsed item by item as it arrives, within the server's memory for
/// batches (`--batch-memory-limit`; 429 `batch_memory_full` with `Retry-After` when other
/// batches hold it, before anything is read). The trace context headers, when given, apply
/// to every item; an `Idempotency-Key` header is refused (each item has its own `dedup_key`).
#[utoipa::path(
    post,
    path = "/api/executions/batch",
    tag = "executions",
    request_body = NewBatch,
    params(
        ("traceparent" = Option<String>, Header,
            description = "W3C Trace Context, kept with every item admitted, as on single admission: one that does not parse is ignored (never a 400)"),
        ("tracestate" = Option<String>, Header,
            description = "W3C Trace Context, kept beside a valid `traceparent` when printable ASCII of at most 512 bytes (else dropped whole)"),
    ),
    responses(
        (status = 200, description = "One result per item, in order", body = BatchAnswer),
        (status = 400, description = "`invalid_batch`: no items, more than 1,000 (refused as the 1,001st begins, the rest unread), or an `Idempotency-Key` header; `malformed_json`, `invalid_body`: the body itself", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Role too weak", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`batch_in_flight`: another batch of this tenant is being admitted (the body is not read)", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "`payload_too_large`: the body exceeds `--batch-body-limit` (by its `Content-Length`: not read)", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Body is not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "`batch_memory_full`: the server's memory for batches (`--batch-memory-limit`) is held by other batches now; nothing was read or admitted, send it again after `Retry-After`", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
        (status = 503, description = "Redis is unavailable before any item was sent: nothing was admitted", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
    ),
    security(("bearer" = []))
)]
pub async fn create_batch(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    ticket: Option<Extension<Arc<Ticket>>>,
    body: batch::BatchBody,
) -> Result<Response, ApiError> {
    let tenant = caller.tenant_for(Action::Admit)?;
    if headers.contains_key("idempotency-key") {
        return Err(ApiError::BadRequest {
            code: "invalid_batch",
            detail: "a batch has no Idempotency-Key of its own: give each item its dedup_key"
                .into(),
        });
    }
    // What the headers tell and the server's memory for batches first, then the tenant's
    // mark; only then is the body read, item by item, within the memory reserved for it.
    let limits = batch::BatchLimits {
        body_limit: state.batch_body_limit,
        max_params_bytes: state.max_params_bytes,
        default_max_attempts: state.default_max_attempts,
    };
    let pending = body.start(&state.batch_budget, &limits)?;
    let mark = batch::BatchMark::take(&state.store, tenant, state.batch_hold).await?;
    let batch = match pending.read(limits).await {
        Ok(batch) => batch,
        Err(e) => {
            mark.release().await;
            return Err(e);
        }
    };
    let caller_trace = TraceContext::from_headers(
        headers.get("traceparent").and_then(|v| v.to_str().ok()),
        headers.get("tracestate").and_then(|v| v.to_str().ok()),
    );
    // With span export on, every item's execution keeps the batch's span as its parent.
    let span = crate::otel::AdmitSpan::start_batch(
        tenant.as_str(),
        batch.items.len(),
        caller_trace.as_ref(),
    );
    let trace = span.as_ref().map(|s| s.trace()).or(caller_trace);
    let mut results: Vec<Option<BatchResult>> = Vec::with_capacity(batch.items.len());
    let (mut reqs, mut at) = (Vec::new(), Vec::new());
    for (i, item) in batch.items.into_iter().enumerate() {
        match item.map(|req| AdmitRequest {
            trace: trace.clone(),
            ..req
        }) {
            Ok(req) => {
                at.push(i);
                reqs.push(req);
                results.push(None);
            }
            Err(e) => {
                state.metrics.admission(tenant, AdmissionOutcome::Invalid);
                results.push(Some(problem_result(e)));
            }
        }
    }
    if !reqs.is_empty() {
        let ticket = ticket_of(&state, ticket);
        let deadline = ticket.deadline();
        let admissions = state.store.admit_batch(tenant.clone(), reqs, ticket).await;
        for (i, admission) in at.into_iter().zip(admissions) {
            let result = match admission {
                Ok(Admission::Created(e)) => {
                    state.metrics.admission(tenant, AdmissionOutcome::Admitted);
                    BatchResult {
                        status: StatusCode::CREATED.as_u16(),
                        execution: Some(Execution::from(e)),
                        problem: None,
                    }
                }
                Ok(Admission::Replayed(e)) => {
                    state
                        .metrics
                        .admission(tenant, AdmissionOutcome::Deduplicated);
                    BatchResult {
                        status: StatusCode::OK.as_u16(),
                        execution: Some(Execution::from(e)),
                        problem: None,
                    }
                }
                Ok(refused) => {
                    state.metrics.admission(
                        tenant,
                        match refused {
                            Admission::Conflict { .. } => AdmissionOutcome::Conflict,
                            Admission::Disabled => AdmissionOutcome::Disabled,
                            Admission::Deleting => AdmissionOutcome::Deleting,
                            Admission::StorageFull(_) => AdmissionOutcome::StorageFull,
                            Admission::TooLarge { .. } => AdmissionOutcome::TooLarge,
                            _ => AdmissionOutcome::QueueFull,
                        },
                    );
                    problem_result(refusal(&state, tenant, refused, deadline).await)
                }
                Err(e) => problem_result(ApiError::from(e)),
            };
            results[i] = Some(result);
        }
    }
    mark.release().await;
    let results: Vec<BatchResult> = results
        .into_iter()
        .map(|r| {
            r.unwrap_or_else(|| {
                problem_result(ApiError::Internal("an item went unanswered".into()))
            })
        })
        .collect();
    if let Some(span) = span {
        let count = |status: StatusCode| {
            results
                .iter()
                .filter(|r| r.status == status.as_u16())
                .count()
        };
        let (admitted, replayed) = (count(StatusCode::CREATED), count(StatusCode::OK));
        span.end_batch(admitted, replayed, results.len() - admitted - replayed);
    }
    Ok(batch::answer(results, batch.held))
}

/// An item's result for an error: its status and problem.
fn problem_result(e: ApiError) -> BatchResult {
    match &e {
        ApiError::Internal(m) => tracing::error!(error = %m, "internal error in a batch item"),
        ApiError::Unavailable(m) => tracing::warn!(error = %m, "redis unavailable in a batch item"),
        _ => {}
    }
    BatchResult {
        status: e.status().as_u16(),
        execution: None,
        problem: Some(e.problem()),
    }
}

/// Refuses params larger than the server allows (measured as the canonical JSON the store
/// keeps, so the limit means the same whatever the client's formatting).
pub(crate) fn params_within(req: AdmitRequest, max: usize) -> Result<AdmitRequest, ApiError> {
    if req.params.len() > max {
        return Err(ApiError::Status {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            code: "params_too_large",
            detail: format!(
                "params take {} bytes as canonical JSON; the limit is {max}",
                req.params.len()
            ),
        });
    }
    Ok(req)
}

/// The error for an admission (or retry) that did not queue anything. A full queue's
/// `Retry-After` is the time its tenant has lately taken to start one execution (so one place
/// frees), from its per-minute counters; a constant when nothing was measured.
///
/// The rate is read by `deadline` at the latest (a request's answer never waits past its time
/// for it); without it, the constant.
async fn refusal(
    state: &AppState,
    tenant: &TenantId,
    a: Admission,
    deadline: tokio::time::Instant,
) -> ApiError {
    let retry_after = match &a {
        Admission::QueueFull { .. } => {
            tokio::time::timeout_at(deadline, queue_full_retry_after(state, tenant))
                .await
                .unwrap_or(QUEUE_FULL_RETRY_AFTER)
        }
        _ => QUEUE_FULL_RETRY_AFTER,
    };
    match a {
        Admission::Conflict { existing } => ApiError::IdempotencyConflict { existing },
        Admission::Disabled => ApiError::Forbidden {
            code: "tenant_disabled",
            detail: "this tenant is disabled and admits no new executions".into(),
        },
        Admission::Deleting => ApiError::TenantDeleting {
            tenant: tenant.clone(),
        },
        Admission::QueueFull { waiting } => ApiError::QueueFull {
            waiting,
            retry_after,
        },
        Admission::StorageFull(full) => storage_full(&full),
        Admission::TooLarge { size, max_bytes } => ApiError::Status {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            code: "execution_too_large",
            detail: format!(
                "the execution takes {size} logical bytes ({ROW_BYTES} + its params), more than \
                 the tenant's max_bytes of {max_bytes}: it can never be admitted"
            ),
        },
        Admission::Created(e) | Admission::Replayed(e) => ApiError::Internal(format!(
            "execution {} was admitted but reported as refused",
            e.execution_id
        )),
    }
}

/// The 429 of a storage bound: `Retry-After` is when the tenant's oldest retained executions
/// have expired and its next decision takes them off (at most an hour: look again then, a
/// bound may have been raised meanwhile); an hour when it retains nothing that could.
pub(crate) fn storage_full(full: &StorageFull) -> ApiError {
    let retry_after = full.drains_in.map_or(MAX_QUEUE_FULL_RETRY_AFTER, |d| {
        d.as_millis()
            .div_ceil(1000)
            .clamp(1, u128::from(MAX_QUEUE_FULL_RETRY_AFTER)) as u64
    });
    let what = match full.bound {
        StorageBound::Bytes => format!(
            "the tenant keeps {} logical bytes of executions (queued, running and retained) of \
             its max_bytes of {}: no room for this one",
            full.count, full.limit
        ),
        StorageBound::Retained => format!(
            "the tenant keeps {} terminal executions, its max_retained of {}",
            full.count, full.limit
        ),
    };
    let when = match full.drains_in {
        Some(d) => format!(
            "its oldest retained executions expire within {} s",
            d.as_millis().div_ceil(1000)
        ),
        None => "none of its executions expires before its queued and running ones end and \
                 their retention passes"
            .to_owned(),
    };
    ApiError::StorageFull {
        detail: format!("{what}; {when}"),
        retry_after,
    }
}

/// Seconds until a full queue of `tenant` has a free place, as its recent start rate says
/// (one start frees one place); `QUEUE_FULL_RETRY_AFTER` when nothing was measured.
async fn queue_full_retry_after(state: &AppState, tenant: &TenantId) -> u64 {
    match state.store.pace(tenant).await {
        Ok(p) if p.per_ms > 0.0 => {
            ((1.0 / p.per_ms / 1_000.0).ceil() as u64).clamp(1, MAX_QUEUE_FULL_RETRY_AFTER)
        }
        _ => QUEUE_FULL_RETRY_AFTER,
    }
}

/// Query of `POST /api/executions`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct CreateParams {
    /// Deprecated: the dry run is `POST /api/executions/dry-run`. `true` is refused with 400
    /// `dry_run_moved`; `false` changes nothing. The schema says so: only `false` is valid.
    #[deprecated = "use POST /api/executions/dry-run"]
    #[param(schema_with = dry_run_false)]
    pub dry_run: Option<bool>,
}

/// The schema of the old `dry_run` query: `false` alone, so a generated client never sends the
/// `true` the server refuses.
fn dry_run_false() -> utoipa::openapi::schema::Object {
    use utoipa::openapi::schema::{ObjectBuilder, Type};
    ObjectBuilder::new()
        .schema_type(Type::Boolean)
        .enum_values(Some([false]))
        .description(Some(
            "Deprecated: the dry run is `POST /api/executions/dry-run`; `true` answers 400 \
             `dry_run_moved`.",
        ))
        .build()
}

/// `?wait=` on GET of one execution.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct GetParams {
    /// Wait until the execution is terminal, at most this long: `250ms`, `30s`, `1m`, or a
    /// plain number of seconds; more than 0 and at most 60 s (else 400 `invalid_wait`).
    #[param(
        pattern = "^(([1-9][0-9]{0,3}|[1-5][0-9]{4}|60000)ms|([1-9]|[1-5][0-9]|60)s?|1m)$",
        example = "2s"
    )]
    pub wait: Option<String>,
}

/// Read one execution of the caller's tenant; with `wait`, once it is terminal.
///
/// With `wait` this is a long poll: the answer comes as soon as the execution is terminal
/// (`Sluice-Wait: terminal`), or force-deleted (404), or at the end of the wait with its state
/// then (`Sluice-Wait: timeout`; also when the server shuts down meanwhile: ask again). It
/// costs Redis one call to start and nothing while it waits, however many clients wait on the
/// same execution; at most `--max-waiters` (10 000) long polls and event streams are open per
/// server, `--max-waiters-per-tenant` (256) of one tenant. A wait whose API key is revoked
/// (or whose tenant is deleted) meanwhile answers 401 within a second. Without `wait` it
/// answers at once.
#[utoipa::path(
    get,
    path = "/api/executions/{id}",
    tag = "executions",
    params(("id" = String, Path, pattern = "^[0-9a-f]{32}$", description = "Execution id (32 lowercase hex)"), GetParams),
    responses(
        (status = 200, description = "The execution", body = Execution,
            headers(("Sluice-Wait" = String, description = "With `wait` only: `terminal` (it is terminal) or `timeout` (the wait ended first)"))),
        (status = 400, description = "Malformed id, or `invalid_wait`", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials (with `wait`: also when the API key is revoked or its tenant deleted during the wait)", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Role too weak, or X-Tenant-Id names another tenant than the API key's", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such execution for this tenant (with `wait`: also when it is force-deleted during the wait)", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "`tenant_too_many_waiters` (with `wait`): the tenant has `--max-waiters-per-tenant` open waits and streams on this server; the connection is closed after this answer", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
        (status = 503, description = "Redis unavailable; or `too_many_waiters` (with `wait`): the server has `--max-waiters` open waits and streams (the connection is closed after this answer)", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
    ),
    security(("bearer" = []))
)]
pub async fn get_execution(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    query: QueryLater<GetParams>,
) -> Result<Response, ApiError> {
    let tenant = caller.tenant_for(Action::Read)?;
    let id = ExecutionId::parse(&id)?;
    if let Some(wait) = query.parse()?.wait {
        let wait = waiting::parse_wait(&wait)?;
        return waiting::wait_for_execution(&state, &caller, &id, wait).await;
    }
    state
        .store
        .get(tenant, &id)
        .await?
        .map(|e| axum::Json(Execution::from(e)).into_response())
        .ok_or_else(ApiError::execution_not_found)
}

/// Filters and position of `GET /api/executions`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListParams {
    /// Only executions in this status.
    #[param(value_type = Option<wire::Status>)]
    pub status: Option<String>,
    /// Only executions of this flow.
    #[param(pattern = "^[A-Za-z0-9][A-Za-z0-9_./-]{0,127}$")]
    pub flow_id: Option<String>,
    /// Only the execution that holds this dedup key now (a key is held while its execution is
    /// queued or running and `--dedup-ttl-hours` after it ended): at most one. 1–256 bytes of
    /// UTF-8 without control characters or invisible formatting ones (zero-width,
    /// bidirectional).
    #[param(
        min_length = 1,
        max_length = 256,
        pattern = "^[^\\x00-\\x1F\\x7F-\\x9F\\xAD\\u061C\\u180E\\u200B-\\u200F\\u2028-\\u202E\\u2060-\\u2064\\u2066-\\u2069\\uFEFF\\uFFF9-\\uFFFB]*$"
    )]
    pub dedup_key: Option<String>,
    /// Only executions admitted at or after this time (RFC 3339, millisecond precision). The
    /// time compared is the one in the execution id, minted by the server at admission
    /// (`created_at` is Redis's clock at that moment).
    #[param(value_type = Option<String>, format = DateTime, pattern = "^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])[Tt]([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,9})?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$")]
    pub created_from: Option<String>,
    /// Only executions admitted before this time (RFC 3339; exclusive). For both times the
    /// pattern allows dates that do not exist, such as February 30: those are a 400
    /// `invalid_time`.
    #[param(value_type = Option<String>, format = DateTime, pattern = "^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])[Tt]([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,9})?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$")]
    pub created_before: Option<String>,
    /// Page size (default 50); a page also ends early at the server's byte budget.
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<u32>,
    /// `next_cursor` of the previous page.
    #[param(pattern = "^[0-9a-f]{32}$")]
    pub cursor: Option<String>,
    /// Only queued executions in this queue state. `scheduled` (not due yet: a `run_at` or
    /// `delay`, or a retry's backoff) is the one that can be filtered on; with a `status`
    /// other than `queued` nothing matches.
    #[param(value_type = Option<ScheduledFilter>, inline)]
    pub queue_state: Option<String>,
}

/// The values the `queue_state` filter accepts.
#[derive(Debug, ToSchema)]
#[schema(rename_all = "lowercase")]
#[allow(dead_code)]
pub enum ScheduledFilter {
    Scheduled,
}

/// List the caller's tenant's executions, newest first.
///
/// Filters combine (all must match): `status`, `queue_state`, `flow_id`, `dedup_key`, and the time range
/// `created_from` ≤ admission < `created_before`; `total` counts every execution that matches.
/// The cost of a call is proportional to the page size, not to the tenant's history. A page
/// holds at most `limit` executions and ends early once their stored size reaches the server's
/// byte budget (`--max-page-bytes`, 4 MiB by default; at least one execution per page);
/// `next_cursor` is set whenever more may follow.
#[utoipa::path(
    get,
    path = "/api/executions",
    tag = "executions",
    params(ListParams),
    responses(
        (status = 200, description = "One page", body = ExecutionPage),
        (status = 400, description = "Invalid filter or cursor", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Role too weak, or X-Tenant-Id names another tenant than the API key's", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn list_executions(
    State(state): State<AppState>,
    caller: Caller,
    Query(p): Query<ListParams>,
) -> Result<axum::Json<ExecutionPage>, ApiError> {
    let tenant = caller.tenant_for(Action::Read)?;
    let status = p
        .status
        .as_deref()
        .map(|s| {
            Status::parse(s).ok_or_else(|| ApiError::BadRequest {
                code: "invalid_status",
                detail: "status must be one of queued, running, completed, failed, cancelled"
                    .into(),
            })
        })
        .transpose()?;
    let scheduled = match p.queue_state.as_deref() {
        None => false,
        Some("scheduled") => true,
        Some(_) => {
            return Err(ApiError::BadRequest {
                code: "invalid_queue_state",
                detail: "queue_state can only be scheduled".into(),
            });
        }
    };
    // Scheduled executions are queued: with another status nothing matches both filters.
    let contradictory = scheduled && status.is_some_and(|s| s != Status::Queued);
    let limit = p.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::BadRequest {
            code: "invalid_limit",
            detail: format!("limit must be between 1 and {MAX_PAGE}"),
        });
    }
    let query = ListQuery {
        status,
        flow: p.flow_id.as_deref().map(FlowId::parse).transpose()?,
        dedup: p.dedup_key.as_deref().map(DedupKey::parse).transpose()?,
        created_from_ms: p.created_from.as_deref().map(unix_ms).transpose()?,
        created_before_ms: p.created_before.as_deref().map(unix_ms).transpose()?,
        cursor: p
            .cursor
            .as_deref()
            .map(|c| {
                ExecutionId::parse(c).map_err(|_| ApiError::BadRequest {
                    code: "invalid_cursor",
                    detail: "cursor must be a next_cursor returned by this call".into(),
                })
            })
            .transpose()?,
        scheduled,
        limit,
        byte_budget: state.max_page_bytes,
    };
    if contradictory {
        return Ok(axum::Json(ExecutionPage {
            executions: Vec::new(),
            next_cursor: None,
            total: 0,
        }));
    }
    let page = state.store.list(tenant, &query).await?;
    Ok(axum::Json(ExecutionPage {
        executions: page.executions.into_iter().map(Into::into).collect(),
        next_cursor: page.next_cursor,
        total: page.total,
    }))
}

/// An RFC 3339 time of a listing filter as Unix milliseconds (times before 1970 are 0: no
/// execution is older). Exactly what the documented pattern allows, and a date that exists:
/// the `time` crate alone would also take other separators, leap seconds and any number of
/// fraction digits.
fn unix_ms(s: &str) -> Result<u64, ApiError> {
    let invalid = || ApiError::BadRequest {
        code: "invalid_time",
        detail: "created_from and created_before must be RFC 3339 times, e.g. 2026-11-29T09:00:00Z"
            .into(),
    };
    if !is_rfc3339_shaped(s) {
        return Err(invalid());
    }
    let t = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
        .map_err(|_| invalid())?;
    Ok(u64::try_from(t.unix_timestamp_nanos() / 1_000_000).unwrap_or(0))
}

/// Whether `s` has the shape of the time filters' pattern:
/// `YYYY-MM-DDTHH:MM:SS[.f{1,9}](Z|±HH:MM)`, `T` and `Z` in either case, each field in range
/// (the day only up to 31: whether the date exists is the parser's to say).
fn is_rfc3339_shaped(s: &str) -> bool {
    let b = s.as_bytes();
    let num = |at: usize, len: usize| -> Option<u32> {
        let digits = b.get(at..at + len)?;
        digits
            .iter()
            .all(u8::is_ascii_digit)
            .then(|| digits.iter().fold(0, |n, d| n * 10 + u32::from(d - b'0')))
    };
    let at = |i: usize, c: u8| b.get(i) == Some(&c);
    let date_time = num(0, 4).is_some()
        && at(4, b'-')
        && num(5, 2).is_some_and(|m| (1..=12).contains(&m))
        && at(7, b'-')
        && num(8, 2).is_some_and(|d| (1..=31).contains(&d))
        && matches!(b.get(10), Some(b'T' | b't'))
        && num(11, 2).is_some_and(|h| h < 24)
        && at(13, b':')
        && num(14, 2).is_some_and(|m| m < 60)
        && at(16, b':')
        && num(17, 2).is_some_and(|s| s < 60);
    if !date_time {
        return false;
    }
    let mut rest = &b[19..];
    if let Some(fraction) = rest.strip_prefix(b".") {
        let digits = fraction.iter().take_while(|c| c.is_ascii_digit()).count();
        if !(1..=9).contains(&digits) {
            return false;
        }
        rest = &fraction[digits..];
    }
    let two = |a: u8, b: u8| {
        (a.is_ascii_digit() && b.is_ascii_digit())
            .then(|| u32::from(a - b'0') * 10 + u32::from(b - b'0'))
    };
    match *rest {
        [b'Z' | b'z'] => true,
        [b'+' | b'-', h1, h2, b':', m1, m2] => {
            two(h1, h2).is_some_and(|h| h < 24) && two(m1, m2).is_some_and(|m| m < 60)
        }
        _ => false,
    }
}

/// Cancel an execution.
///
/// A queued execution becomes `cancelled` at once and frees its slot (the tenant's oldest
/// waiting execution is dispatched in the same step); a running one gets `cancel_requested`
/// and its worker stops it. Terminal executions are returned unchanged.
#[utoipa::path(
    post,
    path = "/api/executions/{id}/cancel",
    tag = "executions",
    params(("id" = String, Path, pattern = "^[0-9a-f]{32}$", description = "Execution id")),
    responses(
        (status = 200, description = "The execution after the request", body = Execution),
        (status = 400, description = "Malformed id", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Role too weak, or X-Tenant-Id names another tenant than the API key's", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such execution for this tenant", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn cancel_execution(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<axum::Json<Execution>, ApiError> {
    cancel(&state, &caller, &id)
        .await
        .map(|e| axum::Json(e.into()))
}

async fn cancel(
    state: &AppState,
    caller: &Caller,
    id: &str,
) -> Result<crate::domain::Execution, ApiError> {
    let tenant = caller.tenant_for(Action::Cancel)?;
    let id = ExecutionId::parse(id)?;
    state
        .store
        .cancel(tenant, &id)
        .await?
        .ok_or_else(ApiError::execution_not_found)
}

/// Move a scheduled execution to another time.
///
/// Only while it is still `scheduled` (admitted with `run_at`/`delay` and not due yet, or
/// waiting out a retry's backoff): it keeps its id, dedup key and place in `max_queued`. A
/// time that has come makes it runnable now, in its tenant's order. 409 `not_scheduled` once
/// it is runnable, running or over.
#[utoipa::path(
    post,
    path = "/api/executions/{id}/reschedule",
    tag = "executions",
    params(("id" = String, Path, pattern = "^[0-9a-f]{32}$", description = "Execution id")),
    request_body = wire::RescheduleBody,
    responses(
        (status = 200, description = "The execution after the move", body = Execution),
        (status = 400, description = "Malformed id, or not exactly one of run_at and delay (`invalid_schedule`, `invalid_body`), or out of range", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Role too weak, or X-Tenant-Id names another tenant than the API key's", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such execution for this tenant", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Not scheduled any more (`not_scheduled`)", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn reschedule_execution(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    body: JsonBody<wire::RescheduleBody>,
) -> Result<axum::Json<Execution>, ApiError> {
    let tenant = caller.tenant_for(Action::Reschedule)?;
    let id = ExecutionId::parse(&id)?;
    let body = body.parse().await?;
    let Some(when) = crate::domain::schedule_of(body.run_at.as_deref(), body.delay.as_deref())?
    else {
        return Err(ApiError::BadRequest {
            code: "invalid_schedule",
            detail: "give run_at or delay".into(),
        });
    };
    match state.store.reschedule(tenant, &id, when).await? {
        Reschedule::Done(e) => Ok(axum::Json((*e).into())),
        Reschedule::NotFound => Err(ApiError::execution_not_found()),
        Reschedule::NotScheduled(status, qs) => Err(ApiError::Status {
            status: StatusCode::CONFLICT,
            code: "not_scheduled",
            detail: format!(
                "only a scheduled execution can be rescheduled; this one is {}{}",
                status.as_str(),
                match qs {
                    Some(QueueState::Ready) => " (ready)",
                    Some(QueueState::Waiting) => " (waiting)",
                    _ => "",
                }
            ),
        }),
    }
}

/// `?force=true` on DELETE.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeleteParams {
    /// Terminalize and delete now (an admin API key of the tenant, or the platform admin).
    pub force: Option<bool>,
}

/// Cancel an execution, or with `force=true` delete it.
///
/// Without `force` this is the same as `POST /cancel`. With `force=true` the execution is
/// terminalized now whatever its state, its slot and dedup key are released, and its row is
/// deleted: the same dedup key then admits a new execution.
#[utoipa::path(
    delete,
    path = "/api/executions/{id}",
    tag = "executions",
    params(("id" = String, Path, pattern = "^[0-9a-f]{32}$", description = "Execution id"), DeleteParams),
    responses(
        (status = 200, description = "Cancelled (without force)", body = Execution),
        (status = 204, description = "Deleted (force)"),
        (status = 400, description = "Malformed id", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "force needs the admin role (an admin API key or the platform admin)", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such execution for this tenant", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn delete_execution(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    Query(p): Query<DeleteParams>,
) -> Result<Response, ApiError> {
    if p.force != Some(true) {
        let e = cancel(&state, &caller, &id).await?;
        return Ok(axum::Json(Execution::from(e)).into_response());
    }
    let tenant = caller.tenant_for(Action::ForceDelete)?;
    let id = ExecutionId::parse(&id)?;
    if state.store.force_delete(tenant, &id).await? {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(ApiError::execution_not_found())
    }
}

/// Re-queue a failed or cancelled execution.
///
/// Same id, fresh attempts (`attempt` back to 0), through the same quota decision as an
/// admission (behind the tenant's waiting executions); its dedup key still maps to it and
/// stops expiring until it is terminal again. A worker still holding a run from before the
/// retry can neither renew its lease nor report a result: every run has its own fence. A retry
/// adds nothing to what the tenant stores (its row stops being a retained one, its output and
/// error message go), so the storage bounds refuse it only while the tenant is over one even
/// so.
///
/// The body is optional and, when sent, an empty object: a retry changes nothing else, and a
/// member is refused (400 `invalid_body`) rather than ignored.
#[utoipa::path(
    post,
    path = "/api/executions/{id}/retry",
    tag = "executions",
    params(("id" = String, Path, pattern = "^[0-9a-f]{32}$", description = "Execution id")),
    request_body = Option<wire::RetryBody>,
    responses(
        (status = 200, description = "Queued again", body = Execution),
        (status = 400, description = "Malformed id, or a body that is not an empty object (`invalid_body`, `malformed_json`)", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Tenant disabled or role too weak", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such execution for this tenant", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`not_retryable`: not failed or cancelled; `tenant_deleting`: the tenant is being deleted (with `Retry-After`)", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "`tenant_queue_full`; or `tenant_storage_full` when the tenant is over `max_bytes` or `max_retained` even without what the retry frees (its output, error message and retained row)", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
        (status = 503, description = "Redis unavailable", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn retry_execution(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    body: JsonBody<wire::RetryBody>,
) -> Result<axum::Json<Execution>, ApiError> {
    let tenant = caller.tenant_for(Action::Retry)?;
    let id = ExecutionId::parse(&id)?;
    body.parse_optional().await?;
    let deadline = tokio::time::Instant::now() + state.batch_hold;
    match state.store.retry(tenant, &id).await? {
        Retry::Queued(e) => Ok(axum::Json((*e).into())),
        Retry::NotFound => Err(ApiError::execution_not_found()),
        Retry::NotRetryable(status) => Err(ApiError::Status {
            status: StatusCode::CONFLICT,
            code: "not_retryable",
            detail: format!(
                "only failed or cancelled executions can be retried; this one is {}",
                status.as_str()
            ),
        }),
        Retry::Disabled => Err(refusal(&state, tenant, Admission::Disabled, deadline).await),
        Retry::Deleting => Err(refusal(&state, tenant, Admission::Deleting, deadline).await),
        Retry::QueueFull { waiting } => {
            Err(refusal(&state, tenant, Admission::QueueFull { waiting }, deadline).await)
        }
        Retry::StorageFull(full) => Err(storage_full(&full)),
    }
}

#[cfg(test)]
mod tests {
    use super::{is_rfc3339_shaped, unix_ms};

    #[test]
    fn time_filters_take_exactly_what_their_pattern_documents() {
        for ok in [
            "2026-11-29T09:00:00Z",
            "2026-11-29t09:00:00z",
            "2026-11-29T09:00:00.123456789+02:00",
            "1969-12-31T23:59:59-23:59",
        ] {
            assert!(is_rfc3339_shaped(ok), "{ok}");
            assert!(unix_ms(ok).is_ok(), "{ok}");
        }
        assert_eq!(unix_ms("1970-01-01T00:00:01.5Z").ok(), Some(1500));
        assert_eq!(unix_ms("1969-01-01T00:00:00Z").ok(), Some(0));
        for bad in [
            "6045-11-09 11:23:38.0051385z",
            "2026-11-29T09:00:00",
            "2026-11-29T09:00:60Z",
            "2026-11-29T24:00:00Z",
            "2026-13-29T09:00:00Z",
            "2026-11-29T09:00:00.1234567890Z",
            "2026-11-29T09:00:00.Z",
            "2026-11-29T09:00:00+24:00",
            "2026-11-29T09:00:00+0200",
            "2026-11-29T09:00:00Zjunk",
            "2026-11-29",
            "",
        ] {
            assert!(!is_rfc3339_shaped(bad), "{bad}");
        }
        // The right shape, a date that does not exist.
        assert!(is_rfc3339_shaped("2026-02-30T00:00:00Z"));
        assert!(unix_ms("2026-02-30T00:00:00Z").is_err());
    }
}
