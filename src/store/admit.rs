//! Admission (`migrations-lua/admit.lua`) and the settling of an admission whose answer was
//! lost (`migrations-lua/abandon.lua`): the one operation after which "I do not know" is a
//! possible answer, so it lives apart with the rule that decides when it is.

use std::time::Duration;

use redis::Value;

use super::row::{execution_from, first, from_fields, split_tag, string_at};
use super::{Store, StoreError, is_lost};
use crate::admission::{
    AdmitRequest, DedupKey, Execution, ExecutionId, QueueState, Schedule, Status, TenantId,
};

/// How long the marker of an abandoned admission lives: far longer than a call can stay in
/// flight (a Redis stalled for a day has bigger problems).
const VOID_TTL: Duration = Duration::from_secs(86_400);

/// Outcome of an admission.
#[derive(Debug)]
pub enum Admission {
    /// A new execution was written and enqueued.
    Created(Execution),
    /// The dedup key already maps to this execution, admitted with the same request.
    Replayed(Execution),
    /// The dedup key maps to `existing`, admitted with a different flow/version/params.
    Conflict { existing: ExecutionId },
    /// The tenant is disabled; nothing was written.
    Disabled,
    /// The tenant has no free slot and its waiting set is full; nothing was written.
    QueueFull { waiting: u64 },
}

impl Store {
    /// Admits one execution in one atomic script (see `migrations-lua/admit.lua`).
    ///
    /// The id is minted here, before the call. If the call's answer is lost (time-out, broken
    /// connection: the script may have run, or may still run when a stalled Redis resumes),
    /// `abandon.lua` settles it: the admission either happened (answered as created) or can no
    /// longer happen (`Unavailable`, nothing admitted). Only when that answer is lost too is
    /// the result `OutcomeUnknown`, naming the id. An error *reply* (a frozen shard's TRYAGAIN,
    /// a redirect, LOADING, OOM, ...) is not a lost answer: Redis said the script did not run.
    pub async fn admit(
        &self,
        tenant: &TenantId,
        req: &AdmitRequest,
    ) -> Result<Admission, StoreError> {
        let id = ExecutionId::new();
        // Twice at most: a tenant pinned since this process last read the pins is sent on.
        for _ in 0..2 {
            let shard = self.shard_of(tenant);
            let digest = req.dedup.as_ref().map(DedupKey::digest).unwrap_or_default();
            let mut keys = vec![
                shard.row(&id),
                shard.void(&id),
                shard.tenant_config(tenant),
                shard.slots(tenant),
                shard.waiting(tenant),
                shard.status_index(tenant, Status::Queued),
                shard.flow_index(tenant, &req.flow, Status::Queued),
                shard.flows(tenant),
                shard.tenants(),
                shard.runnable(),
                shard.delayed(),
            ];
            if req.dedup.is_some() {
                keys.push(shard.dedup(tenant, &digest));
            }
            let mut inv = self.shard_script(&self.scripts.admit, shard, &keys);
            inv.arg(tenant.as_str())
                .arg(id.as_str())
                .arg(req.flow.as_str())
                .arg(req.version.as_ref().map(|v| v.as_str()).unwrap_or(""))
                .arg(&req.params)
                .arg(req.max_attempts)
                .arg(req.dedup.as_ref().map(|d| d.as_str()).unwrap_or(""))
                .arg(&digest)
                .arg(req.fingerprint.as_str())
                .arg(req.priority);
            match req.schedule {
                Some(Schedule::At(ms)) => inv.arg(ms).arg(""),
                Some(Schedule::After(ms)) => inv.arg("").arg(ms),
                None => inv.arg("").arg(""),
            };
            match &req.concurrency_key {
                Some(k) => inv.arg(k.as_str()).arg(k.digest()),
                None => inv.arg("").arg(""),
            };
            let mut c = self.conn();
            let reply: Vec<Value> = match self.bounded_raw(inv.invoke_async(&mut c)).await {
                Ok(Ok(reply)) => reply,
                // Refused at connect: the call never left this process.
                Ok(Err(e)) if e.is_connection_refusal() => return Err(e.into()),
                // Sent, answer lost: it may have run, or may still run.
                Ok(Err(e)) if is_lost(&e) => {
                    return self.abandon(tenant, &id, &e.to_string()).await;
                }
                Err(timeout) => return self.abandon(tenant, &id, &timeout.to_string()).await,
                // Anything else is an answer (an error reply: Redis itself says the script did not
                // run, or failed before writing) or never left this process.
                Ok(Err(e)) => return Err(e.into()),
            };
            let (tag, rest) = split_tag(reply)?;
            return match tag.as_str() {
                "new" => {
                    let (qstate, now) = (string_at(&rest, 0)?, string_at(&rest, 1)?);
                    let due = string_at(&rest, 2)?;
                    let qstate = QueueState::parse(&qstate).ok_or_else(|| {
                        StoreError::Corrupt(format!("admit: queue state {qstate}"))
                    })?;
                    let due = (!due.is_empty()).then_some(due);
                    Execution::admitted(id.as_str(), tenant.as_str(), req, qstate, &now, due)
                        .map(Admission::Created)
                        .map_err(StoreError::Corrupt)
                }
                "dup" => Ok(Admission::Replayed(execution_from(rest, true)?)),
                "conflict" => Ok(Admission::Conflict {
                    existing: ExecutionId::parse(&string_at(&rest, 0)?).map_err(|e| {
                        StoreError::Corrupt(format!("admit: conflict reply: {}", e.detail))
                    })?,
                }),
                "disabled" => Ok(Admission::Disabled),
                "full" => Ok(Admission::QueueFull {
                    waiting: redis::from_redis_value(first(&rest)?.clone())?,
                }),
                "moved" => {
                    self.refresh_pins().await?;
                    continue;
                }
                other => Err(StoreError::Corrupt(format!("admit replied {other}"))),
            };
        }
        Err(StoreError::Corrupt(format!(
            "tenant {tenant} was sent on twice"
        )))
    }

    /// Settles an admission whose answer was lost (see `migrations-lua/abandon.lua`).
    async fn abandon(
        &self,
        tenant: &TenantId,
        id: &ExecutionId,
        lost: &str,
    ) -> Result<Admission, StoreError> {
        tracing::warn!(%id, error = %lost, "admission answer lost; settling it");
        let shard = self.shard_of(tenant);
        let keys = [shard.row(id), shard.void(id)];
        let mut inv = self.shard_script(&self.scripts.abandon, shard, &keys);
        inv.arg(tenant.as_str())
            .arg(id.as_str())
            .arg(VOID_TTL.as_secs());
        let mut c = self.conn();
        let reply: Vec<Value> = match self.bounded(inv.invoke_async(&mut c)).await {
            Ok(reply) => reply,
            Err(e) => {
                return Err(StoreError::OutcomeUnknown {
                    execution_id: id.clone(),
                    detail: format!("{lost}; then, settling it: {e}"),
                });
            }
        };
        let (tag, rest) = split_tag(reply)?;
        match tag.as_str() {
            "admitted" => {
                let fields = redis::from_redis_value(first(&rest)?.clone())?;
                from_fields(id.as_str(), fields, false).map(Admission::Created)
            }
            "void" => Err(StoreError::Unavailable(format!(
                "{lost} (nothing was admitted)"
            ))),
            other => Err(StoreError::Corrupt(format!("abandon replied {other}"))),
        }
    }
}
