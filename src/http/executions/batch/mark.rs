//! The tenant's one batch admission at a time: its mark on Redis, taken before the body is
//! read and given back on every way out of the handler.

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;

use crate::domain::{ExecutionId, TenantId};
use crate::http::error::ApiError;
use crate::store::Store;

/// The tenant's right to run its one batch admission (the `batch` mark on Redis, with the
/// request's bound as its TTL). Give it back with [`BatchMark::release`]; dropped without
/// that (the request bound cut the handler, the client went away, a panic), it is given back
/// by a task of its own.
pub struct BatchMark {
    store: Arc<Store>,
    tenant: TenantId,
    holder: String,
    held: bool,
}

impl BatchMark {
    /// Takes the mark for at most `ttl`: 409 `batch_in_flight` when another batch of the
    /// tenant holds it. A failed call answers 503, and gives back the mark in case Redis took
    /// it all the same.
    pub async fn take(
        store: &Arc<Store>,
        tenant: &TenantId,
        ttl: Duration,
    ) -> Result<Self, ApiError> {
        let mark = Self {
            store: store.clone(),
            tenant: tenant.clone(),
            holder: ExecutionId::new().to_string(),
            held: true,
        };
        match store.hold_batch(tenant, &mark.holder, ttl).await {
            Ok(true) => Ok(mark),
            Ok(false) => {
                let mut mark = mark;
                mark.held = false;
                Err(ApiError::Status {
                    status: StatusCode::CONFLICT,
                    code: "batch_in_flight",
                    detail:
                        "another batch of this tenant is being admitted; send this one after it"
                            .into(),
                })
            }
            // `mark` is dropped here, which gives it back if the SET ran.
            Err(e) => Err(e.into()),
        }
    }

    /// Gives the mark back, before the answer (so the tenant's next batch is not refused).
    pub async fn release(mut self) {
        self.held = false;
        if let Err(e) = self.store.release_batch(&self.tenant, &self.holder).await {
            // It lapses on its own at the end of the request's bound.
            tracing::warn!(tenant = %self.tenant, error = %e, "batch mark not given back");
        }
    }
}

impl Drop for BatchMark {
    fn drop(&mut self) {
        if !self.held {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (store, tenant, holder) = (
            self.store.clone(),
            self.tenant.clone(),
            std::mem::take(&mut self.holder),
        );
        runtime.spawn(async move {
            if let Err(e) = store.release_batch(&tenant, &holder).await {
                tracing::warn!(%tenant, error = %e, "batch mark not given back");
            }
        });
    }
}
