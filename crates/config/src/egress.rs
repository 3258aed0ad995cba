//! The egress proxy behind `network = "proxy"` profiles: each confined process's listener is
//! served by a `ring0-egress` proxy over its profile's `allow` rules, every decision recorded in
//! ring0's audit log, until the process ends.

use ring0_exec::SandboxError;
use ring0_exec::sandbox::{EgressListener, EgressServing, NetworkPolicy, SandboxProfile};
use ring0_policy::AuditSink;
use ring0_tools::EgressOrigin;
use std::sync::Arc;

/// Serves the egress listeners of one call's processes (or of one upstream server), auditing
/// to `audit` under the origin's principal, session and scope.
pub struct AuditedEgress {
    audit: Arc<dyn AuditSink>,
    origin: EgressOrigin,
}

impl std::fmt::Debug for AuditedEgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditedEgress")
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

impl AuditedEgress {
    /// The proxy of processes started for `origin`.
    pub fn new(audit: Arc<dyn AuditSink>, origin: EgressOrigin) -> Self {
        Self { audit, origin }
    }
}

/// The egress proxies of the shell tool: one per call, all auditing to `audit`.
pub fn shell_egress(audit: Arc<dyn AuditSink>) -> ring0_tools::EgressProxyFor {
    ring0_tools::EgressProxyFor(Arc::new(move |origin: &EgressOrigin| {
        Arc::new(AuditedEgress::new(audit.clone(), origin.clone()))
    }))
}

/// The origin under which a stdio upstream server's egress is recorded: no call started the
/// server, so its principal is ring0 itself (`upstream:ALIAS`), with no session or scope.
pub fn upstream_origin(alias: &str) -> EgressOrigin {
    EgressOrigin {
        principal: format!("{UPSTREAM_PRINCIPAL_PREFIX}{alias}"),
        session: String::new(),
        scope: String::new(),
    }
}

/// How the egress records of a stdio upstream name it in `principal`.
pub const UPSTREAM_PRINCIPAL_PREFIX: &str = "upstream:";

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
        let audit = ring0_policy::egress_audit(
            self.audit.clone(),
            self.origin.principal.clone(),
            self.origin.scope.clone(),
            self.origin.session.clone(),
        );
        let serving = ring0_egress::EgressProxy::new(policy, audit)
            .spawn(&runtime, listener.into_std())
            .map_err(|e| SandboxError::Setup(format!("serving the egress listener: {e}")))?;
        Ok(Box::new(serving))
    }
}
