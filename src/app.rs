//! Assembling the server: `Application::build` connects to Redis and binds the listener (port
//! 0 in tests, so the real address is exposed), `run_until_stopped` serves until told to stop.
//!
//! Connections are served by `crate::server` (hyper-util's builder under a watchdog, with a
//! connection cap) rather than `axum::serve`, which bounds neither idle connections nor their
//! number. `/metrics` is served on its own listener when `--metrics-listen` names one.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::http::HeaderValue;
use tokio::net::TcpListener;

use crate::access::TOKEN_PREFIX;
use crate::config::AppConfig;
use crate::http::auth::AuthConfig;
use crate::http::dev_guard::DevAuthGuard;
use crate::http::executions::waiting::EventLimits;
use crate::http::metrics::Metrics;
use crate::http::{self, AppState, HttpLimits};
use crate::revocation::Revocations;
use crate::server::{self, ConnectionLimits};
use crate::store::Store;
use crate::waiters::{Hub, HubConfig};

/// A built, bound, not yet serving sluice API.
pub struct Application {
    listener: TcpListener,
    router: http::App,
    /// `/metrics` on its own address (`--metrics-listen`), when configured.
    metrics_listener: Option<(TcpListener, http::App)>,
    metrics: Arc<Metrics>,
    store: Arc<Store>,
    sweep_interval: Option<Duration>,
    limits: ConnectionLimits,
    /// The waiters of executions; its listener starts with the server.
    waiters: Arc<Hub>,
    /// The pull API's wake-ups and orphan scans; they start with the server.
    pull: Arc<crate::pull::Pull>,
    /// Webhook delivery; it starts with the server.
    deliverer: Arc<crate::delivery::Deliverer>,
    /// Cancelled to stop serving (also ends every wait at once).
    stop: tokio_util::sync::CancellationToken,
}

/// File descriptors kept free of connections: Redis connections, the metrics listener's own,
/// log files, a `sluice dev` worker.
const FD_RESERVE: u64 = 64;

impl Application {
    /// Connects to Redis (recording the shard count on first start), loads the scripts and
    /// binds the listen address.
    pub async fn build(config: AppConfig) -> anyhow::Result<Self> {
        check_dev_auth_exposure(&config)?;
        check_admin_token(&config)?;
        // An admission makes up to three bounded Redis calls (key lookup, admit, and settling
        // a lost answer); the request's own bound must not cut in between, or a client would
        // get a time-out that names no execution although one may have been admitted.
        let redis_timeout = Duration::from_millis(config.redis.redis_timeout_ms);
        if config.api.request_timeout() <= redis_timeout * 3 {
            anyhow::bail!(
                "--request-timeout-ms ({} ms) must exceed three times --redis-timeout-ms ({} ms)",
                config.api.request_timeout_ms,
                config.redis.redis_timeout_ms
            );
        }
        config.api.check_connection_shares()?;
        let store = Arc::new(
            Store::connect(config.store())
                .await
                .with_context(|| format!("cannot use redis at {}", config.redis.target()))?,
        );
        // Workers follow the data policy (limit defaults, retention) of the API servers.
        store.publish_defaults().await?;
        // Dead letters an older build left unindexed or uncounted: the listing this server
        // answers reads only indexes (workers need none of it to write).
        store.ensure_dead_letter_counts().await;
        let metrics = Arc::new(Metrics::new(config.api.metrics_tenant_limit));
        let stop = tokio_util::sync::CancellationToken::new();
        let revocations =
            Revocations::new(store.clone(), config.api.unknown_key_lookups_per_second);
        let waiters = Hub::new(
            store.clone(),
            revocations.clone(),
            HubConfig {
                max_waiters: config.api.max_waiters,
                max_per_tenant: config.api.waiters_per_tenant(),
            },
            stop.clone(),
        );
        // A stream must beat before the connection would count as stalled (`crate::server`).
        let stalled_after = config.api.request_timeout() + config.api.header_read_timeout();
        let events = EventLimits {
            lifetime: Duration::from_secs(config.api.events_lifetime_secs.max(1)),
            heartbeat: Duration::from_millis(config.api.events_heartbeat_ms.max(1))
                .min(stalled_after / 2),
        };
        let pull = Arc::new(crate::pull::Pull {
            doorbells: crate::pull::Doorbells::new(store.clone()),
            stops: crate::pull::Stops::new(
                store.clone(),
                crate::pull::MailboxLimits {
                    per_credential: config.api.pull_mailboxes_per_credential.max(1),
                    total: config.api.pull_mailboxes.max(1),
                },
            ),
            shares: crate::pull::Shares::default(),
            retry_backoff: Duration::from_millis(config.api.retry_backoff_ms),
            retry_backoff_max: Duration::from_millis(config.api.retry_backoff_max_ms),
            orphan_scan: (config.api.orphan_scan_ms > 0)
                .then(|| Duration::from_millis(config.api.orphan_scan_ms)),
        });
        let deliverer = crate::delivery::Deliverer::new(
            store.clone(),
            crate::delivery::DeliveryConfig {
                enabled: config.api.webhook_delivery,
                allow_private: config.api.webhook_allow_private,
                timeout: Duration::from_millis(config.api.webhook_timeout_ms.max(1)),
                scan: (config.api.webhook_scan_ms > 0)
                    .then(|| Duration::from_millis(config.api.webhook_scan_ms)),
                max_age: Duration::from_secs(config.api.webhook_max_age_secs.max(1)),
                extra_roots: match &config.api.webhook_ca_file {
                    Some(path) => crate::tls::read_roots(path)?,
                    None => Vec::new(),
                },
            },
        )?;
        let state = AppState {
            store: store.clone(),
            auth: Arc::new(AuthConfig {
                admin_token: config.api.admin_token.clone(),
                dev_auth: config.api.dev_auth,
                metrics_token: config.api.metrics_token.clone(),
                metrics_open: config.api.metrics_open
                    || config.api.metrics_listen.is_some()
                    || config.api.dev_auth,
            }),
            default_max_attempts: config.api.default_max_attempts,
            max_params_bytes: config.api.max_params_bytes,
            batch_body_limit: config.api.batch_body_limit,
            batch_hold: config.api.request_timeout(),
            batch_budget: http::executions::batch::BatchBudget::new(
                config.api.batch_memory_limit,
                config.api.batch_body_limit,
            )
            .map_err(anyhow::Error::msg)?,
            max_page_bytes: config.api.max_page_bytes,
            max_api_keys: config.api.max_api_keys_per_tenant,
            metrics: metrics.clone(),
            waiters: waiters.clone(),
            revocations,
            events,
            pull: pull.clone(),
            deliverer: deliverer.clone(),
        };
        let cors_origins = config
            .api
            .cors_origins
            .iter()
            .map(|o| {
                // tower-http refuses a wildcard in a list (it panics); any origin is not
                // offered on purpose: a page on any site could then drive the API with a
                // token it holds, or as anyone under --dev-auth.
                if o.trim() == "*" {
                    anyhow::bail!(
                        "--cors-origin '*' is not supported: name each browser origin allowed \
                         to call the API (e.g. https://console.example.com)"
                    );
                }
                HeaderValue::from_str(o.trim())
                    .with_context(|| format!("--cors-origin {o:?} is not a valid origin"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let limits = HttpLimits {
            request_timeout: config.api.request_timeout(),
            redis_timeout,
            body_limit: config.api.body_limit,
            cors_origins: cors_origins.clone(),
            metrics_on_main: config.api.metrics_listen.is_none(),
            dev_auth_guard: config.api.dev_auth.then(|| DevAuthGuard {
                loopback_host_only: !config.api.dangerously_allow_dev_auth_on_network,
                allowed_origins: cors_origins.clone(),
            }),
        };
        let listener = TcpListener::bind(config.api.listen)
            .await
            .with_context(|| format!("cannot listen on {}", config.api.listen))?;
        let metrics_listener = match config.api.metrics_listen {
            Some(addr) => Some((
                TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("cannot listen on {addr} (--metrics-listen)"))?,
                http::metrics_router(state.clone(), &limits),
            )),
            None => None,
        };
        // On its own address the operator chose who reaches it; on the API's, everybody does:
        // there it needs its token unless it was opened on purpose.
        if config.api.metrics_listen.is_none() && !config.api.dev_auth {
            if config.api.metrics_open && !config.api.listen.ip().is_loopback() {
                tracing::warn!(
                    "/metrics answers anyone who reaches {} (tenant ids included, \
                     --metrics-open): set --metrics-listen to an internal address, or \
                     --metrics-token",
                    config.api.listen
                );
            } else if config.api.metrics_token.is_none() && !config.api.metrics_open {
                tracing::info!(
                    "/metrics answers 401 on {}: scrape it with --metrics-token, on \
                     --metrics-listen, or open it with --metrics-open",
                    config.api.listen
                );
            }
        }
        let listeners = if metrics_listener.is_some() { 2 } else { 1 };
        let max_connections = connection_cap(config.api.max_connections, listeners);
        let connection_limits = ConnectionLimits {
            max_connections,
            header_read_timeout: config.api.header_read_timeout(),
            request_timeout: config.api.request_timeout(),
            max_age: config.api.max_connection_age(),
            max_anonymous_per_address: config.api.max_anonymous_connections_per_address,
            max_per_key: config.api.connections_per_key(max_connections),
            max_per_tenant: config.api.connections_per_tenant(max_connections),
        };
        Ok(Self {
            listener,
            router: http::router(state, limits),
            metrics_listener,
            metrics,
            store,
            sweep_interval: (config.api.sweep_interval_secs > 0)
                .then(|| Duration::from_secs(config.api.sweep_interval_secs)),
            limits: connection_limits,
            waiters,
            pull,
            deliverer,
            stop,
        })
    }

    /// The address actually bound (useful with port 0).
    pub fn address(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// The address `/metrics` is served on, when it has its own (`--metrics-listen`).
    pub fn metrics_address(&self) -> Option<SocketAddr> {
        self.metrics_listener
            .as_ref()
            .and_then(|(l, _)| l.local_addr().ok())
    }

    /// The storage handle the server uses.
    pub fn store(&self) -> Arc<Store> {
        self.store.clone()
    }

    /// The pull API's state (for tests: its doorbell connections, its stop mailboxes).
    pub fn pull(&self) -> Arc<crate::pull::Pull> {
        self.pull.clone()
    }

    /// The webhook deliverer (for tests: whether it hears wake-ups yet).
    pub fn deliverer(&self) -> Arc<crate::delivery::Deliverer> {
        self.deliverer.clone()
    }

    /// The waiters of executions this server serves (for tests and tools).
    pub fn waiters(&self) -> Arc<Hub> {
        self.waiters.clone()
    }

    /// Serves (and sweeps) until `shutdown` completes, then ends every wait at once and lets
    /// in-flight requests finish (up to `SHUTDOWN_GRACE`).
    pub async fn run_until_stopped(self, shutdown: impl Future<Output = ()> + Send + 'static) {
        let stop = self.stop.clone();
        tokio::spawn(self.waiters.clone().listen());
        tokio::spawn(self.pull.clone().run(self.store.clone(), stop.clone()));
        tokio::spawn(self.deliverer.clone().run(stop.clone()));
        if let Some(interval) = self.sweep_interval {
            tokio::spawn(crate::sweeper::run(
                self.store.clone(),
                interval,
                stop.clone(),
            ));
        }
        tokio::spawn(follow_pins(self.store.clone(), stop.clone()));
        let metrics_server = self.metrics_listener.map(|(listener, router)| {
            tokio::spawn(server::serve(
                listener,
                router,
                self.limits,
                self.metrics.clone(),
                stop.clone(),
                SHUTDOWN_GRACE,
            ))
        });
        let stopper = stop.clone();
        tokio::spawn(async move {
            shutdown.await;
            stopper.cancel();
        });
        server::serve(
            self.listener,
            self.router,
            self.limits,
            self.metrics,
            stop,
            SHUTDOWN_GRACE,
        )
        .await;
        if let Some(task) = metrics_server {
            let _ = task.await;
        }
    }
}

/// Shortest admin token accepted, in bytes: 16 random bytes (or 32 hex digits, as
/// `openssl rand -hex 32` prints 64) are out of reach of guessing; a one-character token is
/// not. Checked at start, so a weak token never serves a request.
pub const MIN_ADMIN_TOKEN_BYTES: usize = 16;

/// The admin token grants everything: refuse one that is short enough to guess, and one that
/// looks like an API key (the `sk_` prefix routes a token to the key lookup).
fn check_admin_token(config: &AppConfig) -> anyhow::Result<()> {
    let Some(token) = &config.api.admin_token else {
        return Ok(());
    };
    let token = token.expose();
    if token.starts_with(TOKEN_PREFIX) {
        anyhow::bail!("the admin token must not start with {TOKEN_PREFIX} (that marks API keys)");
    }
    if token.len() < MIN_ADMIN_TOKEN_BYTES {
        anyhow::bail!(
            "--admin-token / SLUICE_ADMIN_TOKEN is {} bytes long; it must be at least \
             {MIN_ADMIN_TOKEN_BYTES} (generate one with `openssl rand -hex 32`)",
            token.len()
        );
    }
    Ok(())
}

/// `--dev-auth` checks no credentials: on anything but loopback that makes everyone who can
/// reach the port platform admin, so it needs the loudly named override.
fn check_dev_auth_exposure(config: &AppConfig) -> anyhow::Result<()> {
    let api = &config.api;
    if !api.dev_auth || api.dangerously_allow_dev_auth_on_network {
        return Ok(());
    }
    let exposed: Vec<SocketAddr> = std::iter::once(api.listen)
        .chain(api.metrics_listen)
        .filter(|a| !a.ip().is_loopback())
        .collect();
    if let Some(addr) = exposed.first() {
        anyhow::bail!(
            "--dev-auth checks no credentials and {addr} is not a loopback address: anyone who \
             reaches it would be platform admin. Listen on 127.0.0.1, or pass \
             --dangerously-allow-dev-auth-on-network if you really mean it"
        );
    }
    Ok(())
}

/// The connection cap per listener that fits the open-file limit (raised to its hard limit
/// first): a cap above it would let idle connections starve the process of descriptors, the
/// very thing the cap is for.
fn connection_cap(wanted: usize, listeners: u64) -> usize {
    let wanted = wanted.max(1);
    let Some(limit) = raise_open_file_limit() else {
        return wanted;
    };
    let fits = usize::try_from(limit.saturating_sub(FD_RESERVE) / listeners)
        .unwrap_or(usize::MAX)
        .max(1);
    if wanted > fits {
        tracing::warn!(
            wanted,
            open_file_limit = limit,
            cap = fits,
            "--max-connections exceeds what the open-file limit allows; lowering it (raise \
             `ulimit -n` to keep the configured cap)"
        );
        return fits;
    }
    wanted
}

/// Raises the soft open-file limit to the hard one (as Go and nginx do) and returns the limit
/// in force; `None` where it cannot be read. Two libc calls with no safe wrapper in the stack
/// (the workspace denies `unsafe_code` elsewhere; see Cargo.toml for the others).
#[cfg(unix)]
#[allow(unsafe_code)]
fn raise_open_file_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct it is given, which lives on this stack frame.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return None;
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit only reads the struct it is given.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            return Some(raised.rlim_cur);
        }
    }
    Some(lim.rlim_cur)
}

#[cfg(not(unix))]
fn raise_open_file_limit() -> Option<u64> {
    None
}

/// How long shutdown waits for in-flight requests.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// Completes on SIGINT (Ctrl-C) or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

/// How often a server rereads the tenants pinned to dedicated shards. A stale server is safe
/// meanwhile (admissions and limit changes are sent on by Redis), but its reads of a newly
/// pinned tenant look in the old shard until then.
const PIN_REFRESH: Duration = Duration::from_secs(2);

/// Rereads the pins every `PIN_REFRESH` until `stop`.
async fn follow_pins(store: Arc<Store>, stop: tokio_util::sync::CancellationToken) {
    let mut tick = tokio::time::interval(PIN_REFRESH);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.cancelled() => return,
        }
        if let Err(e) = store.refresh_pins().await {
            tracing::debug!(error = %e, "cannot reread the pinned tenants");
        }
    }
}
