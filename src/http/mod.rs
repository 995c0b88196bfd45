//! The HTTP API: one module per resource, each routing and documenting its handlers for
//! OpenAPI in the same place, plus the cross-cutting pieces (errors, extractors, auth) and the
//! middleware stack. The OpenAPI document is built from these routes without touching Redis;
//! Swagger UI at `/docs` is compiled into the binary (vendored) and reads `/openapi.json`; the
//! web console at `/console/` is compiled in too (`console`).

pub mod actions;
pub mod api_keys;
pub mod auth;
pub mod console;
pub mod dead_letters;
pub mod dev_guard;
pub mod error;
pub mod executions;
pub mod extract;
pub mod health;
pub mod me;
pub mod metrics;
pub mod queue_stats;
pub mod request_id;
mod spec;
pub mod tenants;
pub mod trends;
pub mod webhooks;
pub mod worker;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderName, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tower::ServiceBuilder;
use tower::util::BoxCloneSyncService;
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_http::trace::{DefaultOnResponse, TraceLayer};
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_swagger_ui::{self as swagger_ui, SwaggerUi};

use crate::access::KeyId;
use crate::domain::TenantId;
use crate::revocation::Revocations;
use crate::store::{CloseOnDrop, Store, Ticket, Withdrawal};
use crate::waiters::Hub;
use auth::AuthConfig;
use error::{ApiError, PROBLEM_JSON};
use executions::waiting::{self, EventLimits};

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    pub store: Arc<Store>,
    pub auth: Arc<AuthConfig>,
    /// `max_attempts` of executions that do not say.
    pub default_max_attempts: u32,
    /// Largest `params` accepted, in bytes of canonical JSON.
    pub max_params_bytes: usize,
    /// Largest batch admission body, in bytes (`--batch-body-limit`).
    pub batch_body_limit: usize,
    /// How long a tenant's batch admission may hold its right to be the only one (the
    /// request's own bound).
    pub batch_hold: Duration,
    /// The memory batch admissions being processed may hold at once (`--batch-memory-limit`).
    pub batch_budget: Arc<executions::batch::BatchBudget>,
    /// Byte budget of one listing page.
    pub max_page_bytes: usize,
    /// Live API keys a tenant may have.
    pub max_api_keys: usize,
    /// The Prometheus registry `/metrics` renders.
    pub metrics: Arc<metrics::Metrics>,
    /// The local waiters of executions (`?wait`, `/events`) and their one Pub/Sub listener.
    pub waiters: Arc<Hub>,
    /// Unknown tokens remembered, and the news that ends open waits of withdrawn keys.
    pub revocations: Arc<Revocations>,
    /// How long event streams last and how often they beat.
    pub events: EventLimits,
    /// What the pull API (`/api/worker/*`) waits on, and its retry policy.
    pub pull: Arc<crate::pull::Pull>,
    /// The webhook deliverer (its counts, for `/metrics`).
    pub deliverer: Arc<crate::delivery::Deliverer>,
}

/// What a handler may ask of the connection it is served on. `crate::server` puts one in
/// every request's extensions; it is absent when the router is driven otherwise.
#[derive(Clone)]
pub struct ConnectionHandle(Arc<dyn ConnectionControl>);

/// The connection side of a [`ConnectionHandle`].
pub trait ConnectionControl: Send + Sync {
    /// The request in flight may move no byte until `until` without the connection counting
    /// as stalled (a long poll has nothing to say until then).
    fn allow_silence_until(&self, until: Instant);

    /// A request on this connection passed authentication as `holder`: the connection no
    /// longer counts against its client address's cap on unauthenticated connections, and
    /// from its first such request on it is counted against `holder`'s share of connections
    /// (a later request with another credential is served on it and counted nowhere else).
    /// Refused when that share is full, and from then on for every request of the connection:
    /// the caller answers [`ConnectionRefusal`]'s 429 and the connection is closed.
    fn authenticated(&self, holder: &ConnectionHolder) -> Result<(), ConnectionRefusal>;
}

/// Who a connection is counted against: the credential of the first request that
/// authenticated on it (see `--max-connections-per-key` and `--max-connections-per-tenant`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ConnectionHolder {
    /// A tenant API key: counted against the key's share and its tenant's.
    Key { tenant: TenantId, key: KeyId },
    /// Under `--dev-auth`, which has no credential, the tenant named by `X-Tenant-Id`:
    /// counted against the tenant's share.
    DevTenant(TenantId),
    /// The platform admin token, or dev auth naming no tenant: the operator's own, counted
    /// against no share (only the server's cap).
    Operator,
}

/// A share of connections that is full: why [`ConnectionControl::authenticated`] refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionRefusal {
    /// The API key holds `--max-connections-per-key` connections already.
    Key { share: usize },
    /// The key's tenant (all its keys together) holds `--max-connections-per-tenant`.
    Tenant { share: usize },
}

/// Seconds a client refused for its share of connections should wait before it opens
/// another: its own connections free as their requests end and idle ones close.
const SHARE_RETRY_AFTER: u64 = 1;

impl From<ConnectionRefusal> for ApiError {
    fn from(r: ConnectionRefusal) -> Self {
        let (code, detail) = match r {
            ConnectionRefusal::Key { share } => (
                "key_too_many_connections",
                format!(
                    "this API key holds as many connections as the server allows one key \
                     ({share}, --max-connections-per-key); send requests on the connections \
                     it has, or open this one once one of them closed"
                ),
            ),
            ConnectionRefusal::Tenant { share } => (
                "tenant_too_many_connections",
                format!(
                    "this tenant's credentials hold as many connections as the server allows \
                     one tenant ({share}, --max-connections-per-tenant); send requests on the \
                     connections they have, or open this one once one of them closed"
                ),
            ),
        };
        // Busy: the answer closes its connection.
        ApiError::Busy {
            status: StatusCode::TOO_MANY_REQUESTS,
            code,
            detail,
            retry_after: SHARE_RETRY_AFTER,
        }
    }
}

/// Put in an answer's extensions to end its connection after it (`Connection: close` over
/// HTTP/1, a GOAWAY over HTTP/2): a client refused for holding too much of the server (its
/// waiters) gives the connection back instead of keeping it idle.
#[derive(Debug, Clone, Copy)]
pub struct CloseConnection;

impl ConnectionHandle {
    /// The handle of a connection that `control` steers.
    pub fn new(control: Arc<dyn ConnectionControl>) -> Self {
        Self(control)
    }

    /// See [`ConnectionControl::allow_silence_until`].
    pub fn allow_silence_until(&self, until: Instant) {
        self.0.allow_silence_until(until);
    }

    /// See [`ConnectionControl::authenticated`].
    pub fn authenticated(&self, holder: &ConnectionHolder) -> Result<(), ConnectionRefusal> {
        self.0.authenticated(holder)
    }
}

/// Limits and cross-origin rules applied to every request.
#[derive(Debug, Clone)]
pub struct HttpLimits {
    pub request_timeout: Duration,
    /// `--redis-timeout-ms`: how long one Redis call may take. An admission that sent a call
    /// before the request's bound passed is given up to two of these more to settle it (see
    /// `edge`).
    pub redis_timeout: Duration,
    pub body_limit: usize,
    /// Browser origins allowed to call the API (CORS); empty = no CORS headers at all.
    pub cors_origins: Vec<HeaderValue>,
    /// Whether `/metrics` is served with the API (false: on its own listener).
    pub metrics_on_main: bool,
    /// Under `--dev-auth`: the host and origin checks every request passes first.
    pub dev_auth_guard: Option<dev_guard::DevAuthGuard>,
}

fn api_routes() -> (Router<AppState>, Router<AppState>, utoipa::openapi::OpenApi) {
    let (router, mut spec) = OpenApiRouter::with_openapi(spec::ApiDoc::openapi())
        .merge(executions::routes())
        .merge(tenants::routes())
        .merge(trends::routes())
        .merge(api_keys::routes())
        .merge(dead_letters::routes())
        .merge(queue_stats::routes())
        .merge(me::routes())
        .merge(health::routes())
        .merge(worker::routes())
        .merge(webhooks::routes())
        .split_for_parts();
    let (metrics_router, metrics_spec) = metrics::routes().split_for_parts();
    spec.merge(metrics_spec);
    spec::document_common(&mut spec);
    (router, metrics_router, spec)
}

/// The OpenAPI document of this build (what `/openapi.json` serves and `sluice openapi`
/// prints).
pub fn openapi() -> utoipa::openapi::OpenApi {
    api_routes().2
}

/// What a listener serves: a router with its middleware, boxed once (`server::serve` clones
/// it per connection and calls it per request).
pub type App = BoxCloneSyncService<Request, Response, Infallible>;

/// The whole HTTP application with its middleware.
///
/// Only `edge` is layered per route (it reads the route the router matched); the request id,
/// the trace span and the body limit wrap the router from outside. Every layer given to
/// `Router::layer` wraps each route in a boxed service of its own, which a request then
/// clones and whose future it boxes, level by level: around the router they are called
/// directly, with the same effect on every request and answer (`bench/README.md`, "Round
/// nine: serve's admission").
pub fn router(state: AppState, limits: HttpLimits) -> App {
    let (mut routes, metrics_routes, spec) = api_routes();
    if limits.metrics_on_main {
        routes = routes.merge(metrics_routes);
    }
    let spec = Arc::new(spec);
    let app = routes
        .route(
            "/openapi.json",
            get(move || {
                let spec = spec.clone();
                async move { axum::Json(spec.as_ref().clone()) }
            }),
        )
        .merge(docs_routes())
        .merge(console::routes())
        .fallback(unknown_route)
        .layer(middleware::from_fn_with_state(
            Edge::new(&state, &limits),
            edge,
        ))
        .with_state(state);
    App::new(
        ServiceBuilder::new()
            // Outermost: a preflight is answered before anything else looks at it.
            .option_layer(cors_layer(&limits.cors_origins))
            .map_response(IntoResponse::into_response)
            .layer(request_id::RequestIdLayer)
            .layer(
                TraceLayer::new_for_http()
                    .make_span_with(request_span)
                    .on_response(DefaultOnResponse::new().level(tracing::Level::DEBUG)),
            )
            .layer(DefaultBodyLimit::max(limits.body_limit))
            .service(app),
    )
}

/// The policy of every `/docs` answer: Swagger UI's files come from this binary and read
/// `/openapi.json` and the API on this origin; nothing else is loaded, nothing frames it.
/// Inline styles stay allowed: Swagger UI sets style attributes (its script stays strict).
pub const DOCS_CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self' 'unsafe-inline'; img-src 'self' data:; font-src 'self'; \
     connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Swagger UI at `/docs` (vendored: served from the binary), with a strict
/// Content-Security-Policy, no framing (clickjacking a logged-in "Try it out") and no MIME
/// sniffing.
fn docs_routes() -> Router<AppState> {
    Router::from(SwaggerUi::new("/docs").config(swagger_ui::Config::from("/openapi.json"))).layer(
        middleware::map_response(|mut res: Response| async move {
            let headers = res.headers_mut();
            headers.insert(
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(DOCS_CONTENT_SECURITY_POLICY),
            );
            headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
            headers.insert(
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            );
            headers.insert(
                header::REFERRER_POLICY,
                HeaderValue::from_static("no-referrer"),
            );
            res
        }),
    )
}

/// `/metrics` alone, for its own listener (`--metrics-listen`), with the same per-request
/// bounds and error shape as the API.
pub fn metrics_router(state: AppState, limits: &HttpLimits) -> App {
    let (_, metrics_routes, _) = api_routes();
    App::new(
        metrics_routes
            .fallback(unknown_route)
            .layer(middleware::from_fn_with_state(
                Edge::new(&state, limits),
                edge,
            ))
            .layer(DefaultBodyLimit::max(limits.body_limit))
            .with_state(state),
    )
}

/// The span every request's logs are in (an access line per request at `debug`: enable it
/// with `RUST_LOG=info,tower_http=debug`; off by default, as it costs a write per request), carrying
/// the id also returned in `X-Request-Id`. Headers are not logged: they hold credentials.
fn request_span<B>(req: &axum::http::Request<B>) -> tracing::Span {
    let id = req
        .extensions()
        .get::<request_id::RequestId>()
        .and_then(|id| id.0.to_str().ok())
        .unwrap_or("");
    tracing::info_span!(
        "request",
        request_id = %id,
        method = %req.method(),
        path = %req.uri().path(),
    )
}

/// CORS for a browser console on other origins; `None` (no CORS headers) when none is allowed.
fn cors_layer(origins: &[HeaderValue]) -> Option<CorsLayer> {
    if origins.is_empty() {
        return None;
    }
    Some(
        CorsLayer::new()
            .allow_origin(AllowOrigin::list(origins.iter().cloned()))
            .allow_methods([Method::GET, Method::POST, Method::PUT, Method::DELETE])
            .allow_headers([
                header::AUTHORIZATION,
                header::CONTENT_TYPE,
                HeaderName::from_static("idempotency-key"),
                HeaderName::from_static("x-tenant-id"),
                HeaderName::from_static("x-request-id"),
            ])
            .expose_headers([
                header::LOCATION,
                header::RETRY_AFTER,
                HeaderName::from_static("x-request-id"),
                HeaderName::from_static("idempotent-replayed"),
                HeaderName::from_static(waiting::WAIT_HEADER),
            ])
            .max_age(Duration::from_secs(600)),
    )
}

async fn unknown_route() -> ApiError {
    ApiError::NotFound {
        code: "route_not_found",
        detail: "no such route; see /openapi.json".into(),
    }
}

/// What the per-request middleware needs (cheap to clone: it is cloned for every request).
#[derive(Clone)]
struct Edge {
    metrics: Arc<metrics::Metrics>,
    request_timeout: Duration,
    /// How much longer than its bound an admission that sent a call before the bound passed
    /// may take to settle it: the call and the settling of a lost answer, each bounded by
    /// `--redis-timeout-ms`, and a margin.
    settle_grace: Duration,
    dev_auth_guard: Option<Arc<dev_guard::DevAuthGuard>>,
}

impl Edge {
    fn new(state: &AppState, limits: &HttpLimits) -> Self {
        Self {
            metrics: state.metrics.clone(),
            request_timeout: limits.request_timeout,
            settle_grace: limits.redis_timeout * 2 + SETTLE_GRACE_MARGIN,
            dev_auth_guard: limits.dev_auth_guard.clone().map(Arc::new),
        }
    }
}

/// What an admission's settling may take beyond its two Redis time-outs (decoding, writing the
/// answer, a busy process).
const SETTLE_GRACE_MARGIN: Duration = Duration::from_millis(500);

/// Whether a request admits executions (`POST /api/executions`, `POST /api/executions/batch`):
/// those get a `Ticket`, so that the time bound never hides what they wrote.
fn admits(method: &Method, route: Option<&str>) -> bool {
    method == Method::POST
        && matches!(
            route,
            Some(executions::CREATE_ROUTE) | Some(executions::BATCH_ROUTE)
        )
}

/// Everything done around every request, in one middleware (each layer costs a boxed future
/// and a clone per request): the time bound (503 `request_timeout`), problem+json for bare
/// error responses, the latency histogram, which sees the final status, and under
/// `--dev-auth` the host and origin checks (`dev_guard`), before anything else runs.
///
/// A long poll (`GET /api/executions/{id}?wait=...`) is bounded by its wait plus the request
/// bound, and its connection told that it may stay silent that long; its latency is recorded
/// under a route label of its own. An event stream needs nothing of the kind: its handler
/// answers at once, and the time bound covers only that (the stream then beats).
///
/// An admission (single or batch) gets a [`Ticket`](crate::store::Ticket) holding its
/// deadline, so the bound never hides what it wrote. When the bound passes and nothing of it
/// was sent, the ticket is withdrawn (what still waits for its shard's call is never sent) and
/// the answer is 503 `request_timeout`, nothing admitted. When a call was sent, the handler is
/// given `settle_grace` more to settle it and answer itself (it stops sending well before the
/// bound, see `Ticket::send_by`, so it normally has answered already); only past that is the
/// answer 503 `admission_outcome_unknown`, naming the execution of a single admission.
async fn edge(State(edge): State<Edge>, mut req: Request, next: Next) -> Response {
    let started = std::time::Instant::now();
    let method = req.method().clone();
    let mut route = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map(|p| p.as_str().to_owned());
    if let Some(guard) = &edge.dev_auth_guard
        && let Err(refused) = guard.check(req.uri(), req.headers())
    {
        let res = refused.into_response();
        edge.metrics
            .observe_latency(&method, route, res.status(), started.elapsed());
        return res;
    }
    let mut bound = edge.request_timeout;
    if let Some((wait, label)) = waiting::allowance(&method, route.as_deref(), req.uri()) {
        bound += wait;
        if let Some(conn) = req.extensions().get::<ConnectionHandle>() {
            conn.allow_silence_until(started + bound);
        }
        route = Some(label.to_owned());
    }
    let ticket = admits(&method, route.as_deref()).then(|| {
        let ticket = Arc::new(Ticket::new(tokio::time::Instant::from_std(started) + bound));
        if let Some(conn) = req.extensions().get::<ConnectionHandle>() {
            conn.allow_silence_until(started + bound + edge.settle_grace);
        }
        req.extensions_mut().insert(ticket.clone());
        ticket
    });
    // A request that goes away (its client disconnected) sends nothing more.
    let _withdraw_if_dropped = ticket.clone().map(CloseOnDrop);
    let run = next.run(req);
    tokio::pin!(run);
    let res = match tokio::time::timeout(bound, run.as_mut()).await {
        Ok(res) => problem_for_bare_errors(res),
        Err(_) => match ticket.as_deref().map(Ticket::withdraw) {
            None => ApiError::Timeout.into_response(),
            Some(Withdrawal::NothingSent) => ApiError::TimeoutNothingAdmitted.into_response(),
            Some(Withdrawal::Sent(id)) => {
                match tokio::time::timeout(edge.settle_grace, run.as_mut()).await {
                    Ok(res) => problem_for_bare_errors(res),
                    Err(_) => match id {
                        Some(execution_id) => ApiError::OutcomeUnknown {
                            execution_id,
                            log: "the admission's call did not settle within the request's \
                                  bound and its grace"
                                .into(),
                        }
                        .into_response(),
                        None => ApiError::BatchOutcomeUnknown.into_response(),
                    },
                }
            }
        },
    };
    edge.metrics
        .observe_latency(&method, route, res.status(), started.elapsed());
    res
}

/// Turns any error response that is not already problem+json (the router's 405, a body-limit
/// 413 from a layer) into one, so clients parse a single error shape.
fn problem_for_bare_errors(res: Response) -> Response {
    let status = res.status();
    let is_problem = res
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes() == PROBLEM_JSON.as_bytes());
    if !(status.is_client_error() || status.is_server_error()) || is_problem {
        return res;
    }
    let code = match status {
        StatusCode::NOT_FOUND => "route_not_found",
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        s if s.is_client_error() => "bad_request",
        _ => "internal_error",
    };
    ApiError::Status {
        status,
        code,
        detail: status.canonical_reason().unwrap_or("error").to_lowercase(),
    }
    .into_response()
}
