//! Assembling the server: `Application::build` connects to Redis and binds the listener (port
//! 0 in tests, so the real address is exposed), `run_until_stopped` serves until told to stop.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;

use crate::config::AppConfig;
use crate::http::auth::AuthConfig;
use crate::http::{self, AppState, HttpLimits};
use crate::store::Store;

/// A built, bound, not yet serving sluice API.
pub struct Application {
    listener: TcpListener,
    router: axum::Router,
    store: Arc<Store>,
    sweep_interval: Option<Duration>,
}

impl Application {
    /// Connects to Redis (recording the shard count on first start), loads the scripts and
    /// binds the listen address.
    pub async fn build(config: AppConfig) -> anyhow::Result<Self> {
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
        };
        let limits = HttpLimits {
            request_timeout: config.api.request_timeout(),
            body_limit: config.api.body_limit,
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

    /// Serves (and sweeps) until `shutdown` completes, then finishes in-flight requests.
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
        let result = axum::serve(self.listener, self.router)
            .with_graceful_shutdown(shutdown)
            .await;
        stop.cancel();
        result
    }
}

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
