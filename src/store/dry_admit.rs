//! A dry run of an admission (`migrations-lua/dry_admit.lua`, which cannot write): what
//! admitting a request would do now, and where the execution would stand with its forecast.
//! Apart from `admit.rs` because it shares the request's encoding and nothing of the rules
//! for a lost answer: a dry run that fails is simply asked again.

use std::sync::atomic::Ordering;

use redis::Value;

use super::admit::admission_item;
use super::commit::DryAdmitCall;
use super::row::{execution_from, id_at, split_tag, string_at};
use super::storage::{self, Refused};
use super::{StorageFull, Store, StoreError};
use crate::domain::{AdmitRequest, Execution, ExecutionId, QueuePosition, QueueState, TenantId};

/// What an admission would do (`Store::dry_admit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Admitted and `ready`: it would start as soon as a worker has room.
    Admit,
    /// Admitted, and waiting behind its tenant's `max_concurrent` or its key's limit.
    Wait,
    /// Admitted and scheduled for later.
    Schedule,
    /// The dedup key names a live execution admitted with the same request.
    Duplicate,
    /// The dedup key names a live execution admitted with another request.
    Conflict,
    /// Refused (the tenant is disabled or being deleted, its queue is full, a storage bound is
    /// reached, or the execution is larger than its `max_bytes`).
    Refuse,
}

impl Decision {
    /// The API's name for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Admit => "admit",
            Decision::Wait => "wait",
            Decision::Schedule => "schedule",
            Decision::Duplicate => "duplicate",
            Decision::Conflict => "conflict",
            Decision::Refuse => "refuse",
        }
    }
}

/// The answer of a dry run.
#[derive(Debug, Clone)]
pub struct DryRun {
    pub decision: Decision,
    /// Why, in a word: `ready`, `tenant_at_max_concurrent`, `key_at_limit`, `scheduled`,
    /// `same_request`, `idempotency_key_conflict`, `tenant_disabled`, `tenant_deleting`,
    /// `tenant_queue_full`, `tenant_storage_full`, `execution_too_large`.
    pub reason: String,
    pub queue_position: Option<QueuePosition>,
    pub estimated_start: Option<crate::domain::EstimatedStart>,
    /// The execution the dedup key names (duplicate, conflict).
    pub execution_id: Option<String>,
    /// When it would be due (schedule), Unix ms on Redis's clock.
    pub run_at_ms: Option<u64>,
    /// The tenant's queued executions (refused as full).
    pub queued: Option<u64>,
    /// The storage bound reached (refused as `tenant_storage_full`).
    pub storage_full: Option<StorageFull>,
}

impl Store {
    /// What admitting `req` would do now, from `dry_admit.lua` (which cannot write): the
    /// decision, and where the execution would stand with its forecast. A snapshot; the real
    /// admission decides again.
    pub async fn dry_admit(
        &self,
        tenant: &TenantId,
        req: &AdmitRequest,
    ) -> Result<DryRun, StoreError> {
        let id = ExecutionId::new();
        for _ in 0..2 {
            let shard = self.shard_of(tenant);
            let item = admission_item(shard, tenant, &id, req);
            let inv = self.shard_call(
                shard,
                &DryAdmitCall {
                    count: 1,
                    max_bytes: self.policy.max_bytes.load(Ordering::Relaxed),
                    max_retained: self.policy.max_retained.load(Ordering::Relaxed),
                    admissions: &[&item],
                },
            );
            let mut c = self.conn();
            let reply: Vec<Value> = self.bounded(inv.invoke_async(&mut c)).await?;
            let (tag, rest) = split_tag(reply)?;
            let field = |i: usize| string_at(&rest, i).ok().filter(|v| !v.is_empty());
            let mut run = DryRun {
                decision: Decision::Admit,
                reason: String::new(),
                queue_position: None,
                estimated_start: None,
                execution_id: None,
                run_at_ms: None,
                queued: None,
                storage_full: None,
            };
            match tag.as_str() {
                "duplicate" | "conflict" => {
                    run.execution_id = Some(id_at(&rest, 0)?.as_str().to_owned());
                    if tag == "duplicate" {
                        run.decision = Decision::Duplicate;
                        run.reason = "same_request".into();
                        let mut e = execution_from(rest, true)?;
                        self.forecast(&mut e).await;
                        run.queue_position = e.queue_position;
                        run.estimated_start = e.estimated_start;
                    } else {
                        run.decision = Decision::Conflict;
                        run.reason = "idempotency_key_conflict".into();
                    }
                }
                "disabled" => {
                    run.decision = Decision::Refuse;
                    run.reason = "tenant_disabled".into();
                }
                "deleting" => {
                    run.decision = Decision::Refuse;
                    run.reason = "tenant_deleting".into();
                }
                "full" => {
                    run.decision = Decision::Refuse;
                    run.reason = "tenant_queue_full".into();
                    run.queued = field(0).and_then(|v| v.parse().ok());
                }
                "moved" => {
                    self.refresh_pins().await?;
                    continue;
                }
                "schedule" => {
                    run.decision = Decision::Schedule;
                    run.reason = "scheduled".into();
                    run.run_at_ms = field(0).and_then(|v| v.parse().ok());
                }
                "admit" | "wait" => {
                    run.decision = if tag == "admit" {
                        Decision::Admit
                    } else {
                        Decision::Wait
                    };
                    run.reason = field(0).unwrap_or_default();
                    run.queue_position = QueuePosition::from_fields(
                        field(1).as_deref(),
                        field(2).as_deref(),
                        field(3).as_deref(),
                    );
                    let mut e = Execution::admitted(
                        id.as_str(),
                        tenant.as_str(),
                        req,
                        QueueState::Waiting,
                        run.queue_position,
                        "0",
                        None,
                    )
                    .map_err(StoreError::Corrupt)?;
                    self.forecast(&mut e).await;
                    run.estimated_start = e.estimated_start;
                }
                other => match storage::refused(other, &rest)? {
                    Some(Refused::TooLarge { .. }) => {
                        run.decision = Decision::Refuse;
                        run.reason = "execution_too_large".into();
                    }
                    Some(Refused::Full(full)) => {
                        run.decision = Decision::Refuse;
                        run.reason = "tenant_storage_full".into();
                        run.storage_full = Some(full);
                    }
                    None => {
                        return Err(StoreError::Corrupt(format!("dry_admit replied {other}")));
                    }
                },
            }
            return Ok(run);
        }
        Err(StoreError::Corrupt(format!(
            "tenant {tenant} was sent on twice"
        )))
    }
}
