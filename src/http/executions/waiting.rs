//! Waiting for an execution without polling: `GET /api/executions/{id}?wait=<duration>` (a
//! long poll that answers once the execution is terminal, or when the wait ends) and
//! `GET /api/executions/{id}/events` (its changes as Server-Sent Events). Both go through the
//! server's one Pub/Sub listener (`crate::waiters`): a waiter costs one Redis call when it
//! starts and none while it waits, however many wait on the same execution.
//!
//! Their time bounds are their own: a wait lasts at most [`MAX_WAIT`] (the request bound of
//! `--request-timeout-ms` is added to it, see [`allowance`]), a stream at most
//! `--events-lifetime-secs` (the client reconnects), and both end at once when the server
//! shuts down.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderValue, Method, StatusCode, Uri};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, Stream};
use tokio::time::Instant;

use super::wire::{Execution, ExecutionEvent};
use crate::domain::ExecutionId;
use crate::http::AppState;
use crate::http::actions::Action;
use crate::http::auth::Caller;
use crate::http::error::{ApiError, Problem};
use crate::http::extract::Path;
use crate::revocation::KeyWatch;
use crate::waiters::{Observed, Refusal, Waiter};

/// The longest `wait` a GET may ask for.
pub const MAX_WAIT: Duration = Duration::from_secs(60);

/// The route of a single execution, whose `?wait` makes it a long poll.
const EXECUTION_ROUTE: &str = "/api/executions/{id}";

/// Answer header of a `?wait` GET: `terminal` (it is terminal) or `timeout` (the wait ended
/// first, or the server is shutting down: ask again).
pub const WAIT_HEADER: &str = "sluice-wait";

/// Seconds a client should wait after `too_many_waiters`.
const WAITERS_RETRY_AFTER: u64 = 1;

/// How long streams last and how often they beat (`--events-*`).
#[derive(Debug, Clone, Copy)]
pub struct EventLimits {
    /// A stream ends after this (the client reconnects and gets the current state first).
    pub lifetime: Duration,
    /// A comment line is sent after this much silence.
    pub heartbeat: Duration,
}

/// Parses a `wait` value: whole milliseconds (`250ms`), seconds (`30s`, or a plain `30`) or
/// minutes (`1m`), more than 0 and at most [`MAX_WAIT`].
pub fn parse_wait(text: &str) -> Result<Duration, ApiError> {
    let invalid = || ApiError::BadRequest {
        code: "invalid_wait",
        detail: format!(
            "wait must be a duration such as 250ms, 30s or 1m (a plain number is seconds), \
             more than 0 and at most {}s",
            MAX_WAIT.as_secs()
        ),
    };
    let (digits, unit_ms) = if let Some(d) = text.strip_suffix("ms") {
        (d, 1)
    } else if let Some(d) = text.strip_suffix('s') {
        (d, 1_000)
    } else if let Some(d) = text.strip_suffix('m') {
        (d, 60_000)
    } else {
        (text, 1_000)
    };
    if digits.is_empty() || digits.len() > 9 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid());
    }
    let n: u64 = digits.parse().map_err(|_| invalid())?;
    let wait = Duration::from_millis(n * unit_ms);
    if wait.is_zero() || wait > MAX_WAIT {
        return Err(invalid());
    }
    Ok(wait)
}

/// The `wait` of a request's query string, if it has a valid one: decoded exactly as the
/// handler decodes it (percent-escapes and all), so the bound given here is the wait the
/// handler then waits (`12%73` is `12s` to both).
fn wait_of(uri: &Uri) -> Option<Duration> {
    let axum::extract::Query(params) =
        axum::extract::Query::<super::GetParams>::try_from_uri(uri).ok()?;
    parse_wait(&params.wait?).ok()
}

/// How much longer than `--request-timeout-ms` a request may take, and stay silent on its
/// connection: its `wait` for a long poll, nothing for any other request. The per-request
/// bound (`edge` in `http/mod.rs`) and the connection's stalled-peer rule (`crate::server`)
/// both add it, so a wait is bounded by itself plus the usual bound, never cut short.
pub fn allowance(
    method: &Method,
    route: Option<&str>,
    uri: &Uri,
) -> Option<(Duration, &'static str)> {
    let label = match (method, route) {
        (&Method::GET, Some(EXECUTION_ROUTE)) => WAIT_ROUTE_LABEL,
        (&Method::POST, Some(crate::http::worker::LEASE_ROUTE)) => LEASE_WAIT_LABEL,
        (&Method::POST, Some(crate::http::worker::STOPS_ROUTE)) => STOPS_WAIT_LABEL,
        _ => return None,
    };
    Some((wait_of(uri)?, label))
}

/// The label a long poll's latency is recorded under: apart from plain reads, whose latency
/// its seconds of waiting would drown.
pub const WAIT_ROUTE_LABEL: &str = "/api/executions/{id}?wait";
/// The label of a pull worker's lease long poll.
pub const LEASE_WAIT_LABEL: &str = "/api/worker/lease?wait";
/// The label of a pull worker's stop long poll.
pub const STOPS_WAIT_LABEL: &str = "/api/worker/stops?wait";

pub(crate) fn refused(r: Refusal) -> ApiError {
    match r {
        Refusal::ServerFull => ApiError::Busy {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: "too_many_waiters",
            detail: "the server has as many waiting clients as it allows (--max-waiters); retry \
                     later"
                .into(),
            retry_after: WAITERS_RETRY_AFTER,
        },
        Refusal::TenantFull => ApiError::Busy {
            status: StatusCode::TOO_MANY_REQUESTS,
            code: "tenant_too_many_waiters",
            detail: "this tenant has as many waiting clients on this server as it allows \
                     (--max-waiters-per-tenant); retry later"
                .into(),
            retry_after: WAITERS_RETRY_AFTER,
        },
    }
}

/// The `?wait` branch of `GET /api/executions/{id}`: answers as soon as the execution is
/// terminal, or with its state when the wait is over.
///
/// A caller whose API key is revoked (or its tenant deleted) meanwhile gets a 401 at once.
pub(super) async fn wait_for_execution(
    state: &AppState,
    caller: &Caller,
    id: &ExecutionId,
    wait: Duration,
) -> Result<Response, ApiError> {
    let tenant = caller.tenant_for(Action::Read)?;
    let deadline = Instant::now() + wait;
    let mut revoked = caller.key_watch(&state.revocations);
    let mut waiter = state.waiters.join(tenant, id).map_err(refused)?;
    let mut seen = waiter.start(deadline).await?;
    while !seen.is_final() {
        // Revocation first: a tenant's deletion revokes its keys before it removes their
        // executions, so a wait that hears both answers 401, not 404.
        let next = tokio::select! {
            biased;
            () = until_revoked(&mut revoked) => return Err(ApiError::Unauthorized),
            next = waiter.next(deadline) => next,
        };
        match next {
            Some(s) => seen = s,
            None => {
                seen = waiter.current().await?;
                break;
            }
        }
    }
    let Observed::Present(e) = seen else {
        return Err(ApiError::execution_not_found());
    };
    let outcome = if e.status.is_terminal() {
        "terminal"
    } else {
        "timeout"
    };
    let mut res = axum::Json(Execution::from((*e).clone())).into_response();
    res.headers_mut()
        .insert(WAIT_HEADER, HeaderValue::from_static(outcome));
    Ok(res)
}

/// Resolves when the watched key is withdrawn; never without a watch (the admin token, dev
/// auth).
pub(crate) async fn until_revoked(watch: &mut Option<KeyWatch>) {
    match watch {
        Some(w) => w.revoked().await,
        None => std::future::pending().await,
    }
}

/// Follow an execution's changes as Server-Sent Events.
///
/// A `text/event-stream` (read it with `fetch`, which can send the Authorization header; the
/// browser's `EventSource` cannot). The first event is the execution as it is now; then one
/// event per change (status, queue state, cancel request), each named `execution` with the
/// same JSON as `GET /api/executions/{id}` as its data — changes that follow each other
/// faster than they are read may arrive as one event with the latest state. The stream ends
/// after an event with a terminal status, or after an event named `deleted` (data
/// `{"execution_id": ...}`) when the execution is force-deleted. A comment line (`:`) is sent
/// after `--events-heartbeat-ms` (15 s) of silence. A stream also ends after
/// `--events-lifetime-secs` (300 s) or when the server shuts down: a stream that ended without
/// a terminal or `deleted` event should be opened again. A stream of an API key that is
/// revoked (or whose tenant is deleted) ends within a second with an event named `revoked`
/// (data `{"execution_id": ...}`): opening it again answers 401.
///
/// Waiting costs Redis nothing per client: the server subscribes once per execution and reads
/// it once per change for all its clients. At most `--max-waiters` (10 000) streams and long
/// polls are open per server, `--max-waiters-per-tenant` (256) of one tenant.
#[utoipa::path(
    get,
    path = "/api/executions/{id}/events",
    tag = "executions",
    params(("id" = String, Path, pattern = "^[0-9a-f]{32}$", description = "Execution id (32 lowercase hex)")),
    responses(
        (status = 200, description = "The stream: `event: execution` with the execution's JSON as `data` (first the current state, then each change), until a terminal one or `event: deleted`", content_type = "text/event-stream", body = ExecutionEvent),
        (status = 400, description = "Malformed id", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "Missing or invalid credentials", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Role too weak, or X-Tenant-Id names another tenant than the API key's", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such execution for this tenant", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "`tenant_too_many_waiters`: the tenant has `--max-waiters-per-tenant` open waits and streams on this server; the connection is closed after this answer", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
        (status = 503, description = "`too_many_waiters`: the server has `--max-waiters` open waits and streams (the connection is closed after this answer); or Redis unavailable", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
    ),
    security(("bearer" = []))
)]
pub async fn stream_execution_events(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let tenant = caller.tenant_for(Action::Read)?;
    let id = ExecutionId::parse(&id)?;
    let limits = state.events;
    let deadline = Instant::now() + limits.lifetime;
    let revoked = caller.key_watch(&state.revocations);
    let mut waiter = state.waiters.join(tenant, &id).map_err(refused)?;
    let first = waiter.start(deadline).await?;
    if matches!(first, Observed::Gone) {
        return Err(ApiError::execution_not_found());
    }
    let feed = Feed {
        waiter,
        revoked,
        id,
        pending: Some(first),
        last: None,
        deadline,
        done: false,
    };
    let mut res = Sse::new(events(feed))
        .keep_alive(KeepAlive::new().interval(limits.heartbeat))
        .into_response();
    // Proxies that buffer answers (nginx) would hold the events back.
    res.headers_mut()
        .insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(res)
}

/// What a stream has said and what it waits through.
struct Feed {
    waiter: Waiter,
    /// The caller's API key, watched: the stream ends when it is withdrawn.
    revoked: Option<KeyWatch>,
    id: ExecutionId,
    /// A state to send before waiting for the next (the first one).
    pending: Option<Observed>,
    /// The data of the last event sent: a read that finds the same state sends nothing.
    last: Option<String>,
    deadline: Instant,
    /// A final event was sent.
    done: bool,
}

/// The events of one stream, ending after a final state, at its deadline, on shutdown, or
/// with a `revoked` event when the caller's key is withdrawn.
fn events(feed: Feed) -> impl Stream<Item = Result<Event, Infallible>> {
    stream::unfold(feed, |mut f| async move {
        if f.done {
            return None;
        }
        loop {
            let state = match f.pending.take() {
                Some(s) => s,
                // Revocation first, as for a long poll.
                None => tokio::select! {
                    biased;
                    () = until_revoked(&mut f.revoked) => {
                        f.done = true;
                        let data = serde_json::json!({ "execution_id": f.id.as_str() });
                        let event = Event::default().event("revoked").data(data.to_string());
                        return Some((Ok(event), f));
                    }
                    next = f.waiter.next(f.deadline) => next?,
                },
            };
            let (name, data) = match &state {
                Observed::Present(e) => (
                    "execution",
                    serde_json::to_string(&Execution::from((**e).clone())).ok()?,
                ),
                Observed::Gone => (
                    "deleted",
                    serde_json::json!({ "execution_id": f.id.as_str() }).to_string(),
                ),
            };
            if f.last.as_deref() == Some(data.as_str()) {
                continue;
            }
            f.done = state.is_final();
            let event = Event::default().event(name).data(&data);
            f.last = Some(data);
            return Some((Ok(event), f));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_are_whole_durations_within_the_bound() {
        for (text, ms) in [
            ("250ms", 250),
            ("30s", 30_000),
            ("30", 30_000),
            ("1m", 60_000),
            ("60", 60_000),
            ("60000ms", 60_000),
            ("1ms", 1),
        ] {
            assert_eq!(
                parse_wait(text).unwrap(),
                Duration::from_millis(ms),
                "{text}"
            );
        }
        for text in [
            "",
            "0",
            "0s",
            "0ms",
            "61",
            "2m",
            "60001ms",
            "-1",
            "1.5s",
            "1h",
            "s",
            "ms",
            "1 s",
            "+5",
            "99999999999999999999",
        ] {
            assert!(parse_wait(text).is_err(), "{text:?}");
        }
    }

    #[test]
    fn only_a_valid_wait_on_the_execution_route_extends_the_bound() {
        let uri = |s: &str| s.parse::<Uri>().unwrap();
        let route = Some(EXECUTION_ROUTE);
        let get = Method::GET;
        let id = "/api/executions/0123456789abcdef0123456789abcdef";
        assert_eq!(
            allowance(&get, route, &uri(&format!("{id}?wait=5s"))),
            Some((Duration::from_secs(5), WAIT_ROUTE_LABEL))
        );
        assert_eq!(
            allowance(&get, route, &uri(&format!("{id}?x=1&wait=250ms"))),
            Some((Duration::from_millis(250), WAIT_ROUTE_LABEL))
        );
        assert_eq!(allowance(&get, route, &uri(id)), None);
        assert_eq!(
            allowance(&get, route, &uri(&format!("{id}?wait=90s"))),
            None
        );
        assert_eq!(
            allowance(&Method::DELETE, route, &uri(&format!("{id}?wait=5s"))),
            None
        );
        assert_eq!(
            allowance(
                &get,
                Some("/api/executions"),
                &uri("/api/executions?wait=5s")
            ),
            None
        );
        // The pull API's long polls (POST, `wait` in the query string).
        let lease = crate::http::worker::LEASE_ROUTE;
        assert_eq!(
            allowance(
                &Method::POST,
                Some(lease),
                &uri(&format!("{lease}?wait=30s"))
            ),
            Some((Duration::from_secs(30), LEASE_WAIT_LABEL))
        );
        assert_eq!(
            allowance(&get, Some(lease), &uri(&format!("{lease}?wait=30s"))),
            None
        );
        let stops = crate::http::worker::STOPS_ROUTE;
        assert_eq!(
            allowance(
                &Method::POST,
                Some(stops),
                &uri(&format!("{stops}?wait=1m"))
            ),
            Some((Duration::from_secs(60), STOPS_WAIT_LABEL))
        );
    }
}
