//! The policy seam: argument rewriting and authorization.
//!
//! Both run during preparation, over validated arguments, before anything is dispatched. The
//! kernel ships a simple [`GrantTable`] (allowed tools + an authority ceiling, deny by default);
//! a full engine plugs in through the same traits.

use async_trait::async_trait;
use ring0_core::{Authority, Principal, ToolSpec};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Who is asking, as policy sees it.
#[derive(Debug, Clone)]
pub struct SessionInfo {
    pub scope: String,
    pub session_id: String,
    /// Who the session acts for; policy, approvals, rate limits and the audit trail key on it.
    pub principal: Principal,
}

impl SessionInfo {
    /// The local principal in `scope`, with no session id: for running a tool outside any
    /// session (a probe, a benchmark, a direct call in a test).
    pub fn detached(scope: impl Into<String>) -> Self {
        Self {
            scope: scope.into(),
            session_id: String::new(),
            principal: Principal::local(),
        }
    }
}

/// One authorization question: may this session run this tool with these (validated) arguments?
#[derive(Debug, Clone)]
pub struct AuthRequest<'a> {
    pub session: &'a SessionInfo,
    pub spec: &'a ToolSpec,
    pub call_id: &'a str,
    pub args: &'a Value,
    /// Fingerprint text of the prepared arguments: approvals bind to it.
    pub args_hash: &'a str,
    /// The session's event stream, for announcing a hold (`approval_required`).
    pub events: Option<&'a crate::tool::EventSink>,
    /// What the host attached to the call's round (e.g. how to ask the person who made it).
    pub extensions: &'a crate::tool::CallExtensions,
}

/// The decision, with the rule that made it (for the audit trail and the model's rejection).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum AuthDecision {
    Allow {
        rule: String,
    },
    Deny {
        rule: String,
        reason: String,
    },
    /// A person was asked and did not answer in time.
    ApprovalTimeout {
        rule: String,
    },
    /// A person was asked and said no.
    ApprovalDenied {
        rule: String,
        reason: String,
    },
    /// Waiting for a person: nothing ran and nobody refused. `next` says what to do (e.g. call
    /// again with the confirmation code the person holds).
    ApprovalRequired {
        rule: String,
        reason: String,
        next: String,
    },
    /// Over a rate limit: the same call is accepted again after `retry_after_ms`.
    RateLimited {
        rule: String,
        reason: String,
        retry_after_ms: u64,
    },
}

impl AuthDecision {
    /// The rule that made the decision.
    pub fn rule(&self) -> &str {
        match self {
            Self::Allow { rule }
            | Self::Deny { rule, .. }
            | Self::ApprovalTimeout { rule }
            | Self::ApprovalDenied { rule, .. }
            | Self::ApprovalRequired { rule, .. }
            | Self::RateLimited { rule, .. } => rule,
        }
    }

    /// The decision's kind, as its serialized tag says it (`allow`, `deny`, …).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Allow { .. } => "allow",
            Self::Deny { .. } => "deny",
            Self::ApprovalTimeout { .. } => "approval_timeout",
            Self::ApprovalDenied { .. } => "approval_denied",
            Self::ApprovalRequired { .. } => "approval_required",
            Self::RateLimited { .. } => "rate_limited",
        }
    }
}

/// Authorization up to the point where a person would be asked ([`Authorizer::admit`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthAdmission {
    /// Decided without asking anybody.
    Decided(AuthDecision),
    /// Allowed only if a person approves it: the kernel asks [`Authorizer::hold`] as the last
    /// step before dispatch, once the journal has decided the call will run (a call that will be
    /// replayed or refused is never shown to a person).
    Hold,
}

/// Decides whether a call runs. Must fail closed: an error is a denial.
#[async_trait]
pub trait Authorizer: Send + Sync {
    async fn authorize(&self, request: &AuthRequest<'_>) -> AuthDecision;

    /// The decision during preparation, without holding the call for a person: an
    /// implementation that would hold it answers [`AuthAdmission::Hold`], and the kernel calls
    /// [`Authorizer::hold`] after admission and the journal's decision, right before dispatch.
    /// The default decides everything here ([`Authorizer::authorize`]), holding included.
    async fn admit(&self, request: &AuthRequest<'_>) -> AuthAdmission {
        AuthAdmission::Decided(self.authorize(request).await)
    }

    /// Holds a call [`Authorizer::admit`] said needs a person, and returns the decision. The
    /// default asks [`Authorizer::authorize`].
    async fn hold(&self, request: &AuthRequest<'_>) -> AuthDecision {
        self.authorize(request).await
    }

    /// The same question asked again at recovery, for a call committed before a crash and never
    /// sent. Nobody is waiting for that call, so an implementation that would hold it for a
    /// person should refuse it instead; anything but `Allow` settles the record without
    /// dispatching it. The default asks [`Authorizer::authorize`].
    async fn recheck(&self, request: &AuthRequest<'_>) -> AuthDecision {
        self.authorize(request).await
    }

    /// Whether the session may see the tool at all. A tool it may not call is never listed.
    fn visible(&self, session: &SessionInfo, spec: &ToolSpec) -> bool;

    /// Records `decision`, taken for `request` by a layer above this authorizer (the
    /// catalog's grant of its meta-tools, `catalog:meta`), the way this authorizer records its
    /// own decisions, and returns it — or a denial when it cannot be recorded, as for any of
    /// its own. So every call, the meta-tools' too, is in the same record. The default records
    /// nothing; an authorizer that wraps another forwards it.
    fn record_decided(&self, request: &AuthRequest<'_>, decision: AuthDecision) -> AuthDecision {
        let _ = request;
        decision
    }
}

/// Rewrites validated arguments (e.g. pins a path root, caps a limit). The result is validated
/// again; an error rejects the call.
pub trait PolicyRewrite: Send + Sync {
    fn rewrite(&self, session: &SessionInfo, spec: &ToolSpec, args: Value)
    -> Result<Value, String>;
}

/// A tool-name pattern: exact, or a prefix ending in `*`, or `*` for everything.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ToolPattern(pub String);

impl ToolPattern {
    pub fn matches(&self, name: &str) -> bool {
        match self.0.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => self.0 == name,
        }
    }
}

/// Allowed tools and the highest authority they may run at. Deny by default.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GrantTable {
    pub allow: Vec<ToolPattern>,
    pub ceiling: Authority,
}

impl GrantTable {
    /// Grants nothing.
    pub fn deny_all() -> Self {
        Self {
            allow: Vec::new(),
            ceiling: Authority::A0,
        }
    }

    pub fn allow(patterns: &[&str], ceiling: Authority) -> Self {
        Self {
            allow: patterns
                .iter()
                .map(|p| ToolPattern(p.to_string()))
                .collect(),
            ceiling,
        }
    }

    fn decide(&self, spec: &ToolSpec) -> AuthDecision {
        let Some(pattern) = self.allow.iter().find(|p| p.matches(&spec.name)) else {
            return AuthDecision::Deny {
                rule: "default_deny".into(),
                reason: format!("no grant names tool {:?}", spec.name),
            };
        };
        if spec.authority > self.ceiling {
            return AuthDecision::Deny {
                rule: format!("ceiling:{}", self.ceiling),
                reason: format!(
                    "tool {:?} needs authority {} and the session's ceiling is {}",
                    spec.name, spec.authority, self.ceiling
                ),
            };
        }
        AuthDecision::Allow {
            rule: format!("grant:{}", pattern.0),
        }
    }
}

#[async_trait]
impl Authorizer for GrantTable {
    async fn authorize(&self, request: &AuthRequest<'_>) -> AuthDecision {
        self.decide(request.spec)
    }

    fn visible(&self, _session: &SessionInfo, spec: &ToolSpec) -> bool {
        matches!(self.decide(spec), AuthDecision::Allow { .. })
    }
}
