//! What a caller may do: one table of actions and the credential each needs, read both by
//! the handlers' checks and by `GET /api/me` (which lists the caller's actions). A client —
//! the web console first — offers exactly what the server will allow, and a role can change
//! here without any client keeping its own copy of the rules.

use serde::Serialize;
use utoipa::ToSchema;

use super::auth::{Caller, Grant};
use super::error::ApiError;
use crate::access::KeyRole;

/// Something a caller may do, named as `GET /api/me` lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Read the tenant's executions, their events and its dead letters.
    Read,
    /// Admit executions, one at a time or in batches.
    Admit,
    /// Cancel executions.
    Cancel,
    /// Retry failed or cancelled executions, and dead letters.
    Retry,
    /// Move a queued execution's start.
    Reschedule,
    /// Dismiss the tenant's dead letters.
    DismissDeadLetters,
    /// Delete executions outright (`DELETE /api/executions/{id}?force=true`).
    ForceDelete,
    /// Read the tenant's settings and set its per-key concurrency limits.
    ManageTenant,
    /// Create, list and revoke the tenant's API keys.
    ManageApiKeys,
    /// Set and read the tenant's webhook and its deliveries.
    ManageWebhook,
    /// Read the tenant's trends.
    ReadTrends,
    /// Lease and run executions through the pull API (`/api/worker/*`).
    PullWork,
    /// Every tenant at once: create, pin and delete tenants, the overview, every tenant's
    /// dead letters, trends and queue statistics.
    ManagePlatform,
}

/// Who may take an action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Needs {
    /// The platform admin, or a tenant key with at least this role.
    AtLeast(KeyRole),
    /// The platform admin, or a tenant key with exactly this role.
    Exactly(KeyRole),
    /// The platform admin only.
    PlatformAdmin,
}

impl Action {
    /// Every action, in the order `GET /api/me` lists them.
    pub const ALL: [Action; 13] = [
        Action::Read,
        Action::Admit,
        Action::Cancel,
        Action::Retry,
        Action::Reschedule,
        Action::DismissDeadLetters,
        Action::ForceDelete,
        Action::ManageTenant,
        Action::ManageApiKeys,
        Action::ManageWebhook,
        Action::ReadTrends,
        Action::PullWork,
        Action::ManagePlatform,
    ];

    /// The table itself.
    fn needs(self) -> Needs {
        match self {
            Action::Read => Needs::AtLeast(KeyRole::Viewer),
            Action::Admit
            | Action::Cancel
            | Action::Retry
            | Action::Reschedule
            | Action::DismissDeadLetters => Needs::AtLeast(KeyRole::Editor),
            Action::ForceDelete
            | Action::ManageTenant
            | Action::ManageApiKeys
            | Action::ManageWebhook
            | Action::ReadTrends => Needs::AtLeast(KeyRole::Admin),
            Action::PullWork => Needs::Exactly(KeyRole::Worker),
            Action::ManagePlatform => Needs::PlatformAdmin,
        }
    }

    /// Whether a credential that grants `grant` may take this action.
    pub fn allowed(self, grant: Grant) -> bool {
        match (grant, self.needs()) {
            (Grant::PlatformAdmin, _) => true,
            (Grant::Key(held), Needs::AtLeast(role)) => held >= role,
            (Grant::Key(held), Needs::Exactly(role)) => held == role,
            (Grant::Key(_), Needs::PlatformAdmin) => false,
        }
    }

    /// The 403 detail when a caller may not.
    fn refusal(self) -> String {
        match self.needs() {
            Needs::AtLeast(role) => format!("this call needs the {role} role"),
            Needs::Exactly(role) => {
                format!("this call needs a {role} key (or the platform admin token)")
            }
            Needs::PlatformAdmin => "this call needs the platform admin token".into(),
        }
    }
}

impl Caller {
    /// Whether this caller may take `action` (for its own tenant; the platform admin for any).
    pub fn may(&self, action: Action) -> bool {
        action.allowed(self.grant())
    }

    /// Every action this caller may take, in [`Action::ALL`]'s order.
    pub fn actions(&self) -> Vec<Action> {
        Action::ALL.into_iter().filter(|a| self.may(*a)).collect()
    }

    /// Fails with 403 `insufficient_role` unless this caller may take `action`.
    pub fn require(&self, action: Action) -> Result<(), ApiError> {
        if self.may(action) {
            Ok(())
        } else {
            Err(ApiError::Forbidden {
                code: "insufficient_role",
                detail: action.refusal(),
            })
        }
    }

    /// The tenant this call acts for (the key's own, or the admin's `X-Tenant-Id`), once the
    /// caller may take `action`; 400 `tenant_required` when the platform admin named none.
    pub fn tenant_for(&self, action: Action) -> Result<&crate::domain::TenantId, ApiError> {
        self.require(action)?;
        self.acting_tenant().ok_or_else(|| ApiError::BadRequest {
            code: "tenant_required",
            detail: "this call acts for a tenant: send X-Tenant-Id".into(),
        })
    }

    /// For a route that names its tenant in the path: allows the platform admin, and a key of
    /// that tenant that may take `action`. A key of another tenant is a 403
    /// `tenant_mismatch` (the caller named the tenant, so this reveals nothing about it).
    pub fn require_for(
        &self,
        tenant: &crate::domain::TenantId,
        action: Action,
    ) -> Result<(), ApiError> {
        self.require(action)?;
        if self.grant() != Grant::PlatformAdmin && self.acting_tenant() != Some(tenant) {
            return Err(super::auth::tenant_mismatch());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_role_takes_the_actions_of_the_roles_below_it_and_a_worker_only_pulls() {
        let of = |grant| -> Vec<Action> {
            Action::ALL
                .into_iter()
                .filter(|a| a.allowed(grant))
                .collect()
        };
        assert_eq!(of(Grant::Key(KeyRole::Worker)), [Action::PullWork]);
        let viewer = of(Grant::Key(KeyRole::Viewer));
        let editor = of(Grant::Key(KeyRole::Editor));
        let admin = of(Grant::Key(KeyRole::Admin));
        assert_eq!(viewer, [Action::Read]);
        assert!(viewer.iter().all(|a| editor.contains(a)));
        assert!(editor.iter().all(|a| admin.contains(a)));
        assert!(editor.contains(&Action::Admit) && !editor.contains(&Action::ForceDelete));
        assert!(!admin.contains(&Action::PullWork) && !admin.contains(&Action::ManagePlatform));
        assert_eq!(of(Grant::PlatformAdmin), Action::ALL);
    }
}
