//! Assembling the server: `Application::build` connects to Redis and binds the listener (port
//! 0 in tests, so the real address is exposed), `run_until_stopped` serves until told to stop.
//!
//! Connections are served with hyper-util's builder rather than `axum::serve`, because only it
//! exposes HTTP/1's header-read timeout (with a timer, without which hyper ignores it): a client
//! that trickles its headers is disconnected after `--header-read-timeout-ms`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::http::HeaderValue;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tower::ServiceExt;

use crate::access::TOKEN_PREFIX;
use crate::config::AppConfig;
use crate::http::auth::AuthConfig;
use crate::http::metrics::Metrics;
use crate::http::{self, AppState, HttpLimits};
use crate::store::Store;

/// A built, bound, not yet serving sluice API.
pub struct Application {
    listener: TcpListener,
    router: axum::Router,
    store: Arc<Store>,
    sweep_interval: Option<Duration>,
    header_read_timeout: Duration,
}

impl Application {
    /// Connects to Redis (recording the shard count on first start), loads the scripts and
    /// binds the listen address.
    pub async fn build(config: AppConfig) -> anyhow::Result<Self> {
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
        let store = Arc::new(
            Store::connect(config.store())
                .await
                .with_context(|| format!("cannot use redis at {}", config.redis.redis_url))?,
        );
        // Workers follow the data policy (limit defaults, retention) of the API servers.
        store.publish_defaults().await?;
        store.ensure_groups().await?;
        let state = AppState {
            store: store.clone(),
            auth: Arc::new(AuthConfig {
                admin_token: config.api.admin_token.clone(),
                dev_auth: config.api.dev_auth,
            }),
            default_max_attempts: config.api.default_max_attempts,
            metrics: Arc::new(Metrics::new()),
        };
        if let Some(token) = &config.api.admin_token
            && token.expose().starts_with(TOKEN_PREFIX)
        {
            anyhow::bail!(
                "the admin token must not start with {TOKEN_PREFIX} (that marks API keys)"
            );
        }
        let cors_origins = config
            .api
            .cors_origins
            .iter()
            .map(|o| {
                HeaderValue::from_str(o.trim())
                    .with_context(|| format!("--cors-origin {o:?} is not a valid origin"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let limits = HttpLimits {
            request_timeout: config.api.request_timeout(),
            body_limit: config.api.body_limit,
            cors_origins,
        };
        let listener = TcpListener::bind(config.api.listen)
            .await
            .with_context(|| format!("cannot listen on {}", config.api.listen))?;
        Ok(Self {
            listener,
            router: http::router(state, limits),
            store,
            sweep_interval: (config.api.sweep_interval_secs > 0)
                .then(|| Duration::from_secs(config.api.sweep_interval_secs)),
            header_read_timeout: config.api.header_read_timeout(),
        })
    }

    /// The address actually bound (useful with port 0).
    pub fn address(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// The storage handle the server uses.
    pub fn store(&self) -> Arc<Store> {
        self.store.clone()
    }

    /// Serves (and sweeps) until `shutdown` completes, then lets in-flight requests finish
    /// (up to `SHUTDOWN_GRACE`).
    pub async fn run_until_stopped(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let stop = tokio_util::sync::CancellationToken::new();
        if let Some(interval) = self.sweep_interval {
            tokio::spawn(crate::sweeper::run(
                self.store.clone(),
                interval,
                stop.clone(),
            ));
        }
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(self.header_read_timeout);
        let graceful = GracefulShutdown::new();
        tokio::pin!(shutdown);
        loop {
            let stream = tokio::select! {
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        // Out of file descriptors and the like: back off instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                () = &mut shutdown => break,
            };
            let _ = stream.set_nodelay(true);
            let router = self.router.clone();
            let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
                router.clone().oneshot(req)
            });
            let conn = builder
                .serve_connection_with_upgrades(TokioIo::new(stream), service)
                .into_owned();
            let conn = graceful.watch(conn);
            tokio::spawn(async move {
                // A client hanging up or timing out is routine, not an error of the server.
                if let Err(e) = conn.await {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
            });
        }
        stop.cancel();
        drop(self.listener);
        if tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown())
            .await
            .is_err()
        {
            tracing::warn!("connections still open after {SHUTDOWN_GRACE:?}; closing them");
        }
        Ok(())
    }
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
