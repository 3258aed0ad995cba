//! The egress proxy behind `network = "proxy"` profiles: each confined process's listener is
//! served by a `ring0-egress` proxy over its profile's `allow` rules, every decision recorded in
//! ring0's audit log, until the process ends.

use ring0_exec::SandboxError;
use ring0_exec::sandbox::{EgressListener, EgressServing, NetworkPolicy, SandboxProfile};
use ring0_policy::AuditSink;
use std::sync::Arc;

/// Serves egress listeners for the calls of one scope, auditing to `audit`.
pub struct AuditedEgress {
    audit: Arc<dyn AuditSink>,
    scope: String,
}

impl std::fmt::Debug for AuditedEgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditedEgress")
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

/// The egress proxies of the shell tool: one per call's scope, all auditing to `audit`.
pub fn shell_egress(audit: Arc<dyn AuditSink>) -> ring0_tools::EgressProxyFor {
    ring0_tools::EgressProxyFor(Arc::new(move |scope: &str| {
        Arc::new(AuditedEgress {
            audit: audit.clone(),
            scope: scope.to_owned(),
        })
    }))
}

impl ring0_exec::sandbox::EgressProxy for AuditedEgress {
    fn serve(
        &self,
        listener: EgressListener,
        profile: &SandboxProfile,
    ) -> Result<EgressServing, SandboxError> {
        let NetworkPolicy::Proxy { allow } = &profile.network else {
            return Err(SandboxError::Setup(format!(
                "sandbox profile {:?} allows no egress, yet its process has an egress listener",
                profile.name
            )));
        };
        // Checked at load already; a rule that no longer reads refuses the process.
        let policy = ring0_egress::EgressPolicy::parse(allow).map_err(|e| {
            SandboxError::Setup(format!("sandbox profile {:?}: allow: {e}", profile.name))
        })?;
        let runtime = tokio::runtime::Handle::try_current().map_err(|e| {
            SandboxError::Setup(format!("the egress proxy needs an async runtime: {e}"))
        })?;
        // The principal and session are not known where the process starts; the scope is.
        let audit = ring0_policy::egress_audit(
            self.audit.clone(),
            String::new(),
            self.scope.clone(),
            String::new(),
        );
        let serving = ring0_egress::EgressProxy::new(policy, audit)
            .spawn(&runtime, listener.into_std())
            .map_err(|e| SandboxError::Setup(format!("serving the egress listener: {e}")))?;
        Ok(Box::new(serving))
    }
}
