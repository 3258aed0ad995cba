//! The policy engine: grants in, one [`AuthDecision`] per call out.

use crate::approval::{
    APPROVAL_TIMEOUT_DEFAULT, APPROVAL_TIMEOUT_MAX, ApprovalOutcome, ApprovalRequest, Approver,
    SUMMARY_BYTES_MAX, bounded, new_approval_id, now_ms,
};
use crate::audit::{AuditDecision, AuditEntry, AuditSink};
use crate::rate::{Limiter, RateLimit};
use crate::rules::{ArgRule, RULES_PER_GRANT_MAX, RuleError};
use async_trait::async_trait;
use ring0_core::canonical::canonical_string;
use ring0_core::{Authority, Settlement, ToolSpec};
use ring0_kernel::policy::ToolPattern;
use ring0_kernel::{AuthDecision, AuthRequest, Authorizer, SessionInfo};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Most grants one policy holds.
pub const GRANTS_MAX: usize = 256;
/// Most approvals a session remembers (oldest forgotten first); a forgotten one is asked again.
pub const APPROVALS_REMEMBERED_MAX: usize = 1024;
/// Longest tool-name pattern.
const PATTERN_BYTES_MAX: usize = 256;

/// What one grant allows.
#[derive(Debug, Clone)]
pub struct Grant {
    /// Names the grant in rules that fire (`grant:NAME`) and in the audit trail.
    pub name: String,
    /// Tool names: exact, a prefix ending in `*`, or `*`.
    pub tools: Vec<ToolPattern>,
    /// The highest authority a tool of this grant may have.
    pub ceiling: Authority,
    /// Every call of this grant is held for a person's approval (A3 calls always are).
    pub approval: bool,
    /// A shell command string (rather than argv) is allowed.
    pub shell: bool,
    /// CEL rules; all must be true.
    pub rules: Vec<ArgRule>,
    /// Limit per tool under this grant.
    pub rate: Option<RateLimit>,
}

impl Grant {
    /// A grant of `tools` up to `ceiling`, with no rules, no limit, no approval, no shell.
    pub fn new(name: impl Into<String>, tools: &[&str], ceiling: Authority) -> Self {
        Self {
            name: name.into(),
            tools: tools.iter().map(|t| ToolPattern(t.to_string())).collect(),
            ceiling,
            approval: false,
            shell: false,
            rules: Vec::new(),
            rate: None,
        }
    }

    pub fn approval(mut self, required: bool) -> Self {
        self.approval = required;
        self
    }

    pub fn shell(mut self, allowed: bool) -> Self {
        self.shell = allowed;
        self
    }

    /// Adds a CEL rule, compiled now.
    pub fn rule(mut self, source: &str) -> Result<Self, RuleError> {
        self.rules.push(ArgRule::compile(source)?);
        Ok(self)
    }

    pub fn rate(mut self, limit: RateLimit) -> Self {
        self.rate = Some(limit);
        self
    }

    /// Checks the grant's shape; the error says what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if self.name.is_empty() || self.name.len() > 64 {
            return Err("name must be 1 to 64 characters".into());
        }
        if self.tools.is_empty() {
            return Err("names no tools".into());
        }
        for p in &self.tools {
            let body = p.0.strip_suffix('*').unwrap_or(&p.0);
            if p.0.is_empty() || p.0.len() > PATTERN_BYTES_MAX || body.contains('*') {
                return Err(format!(
                    "tool pattern {:?} is invalid: use a name, a prefix ending in '*', or '*'",
                    p.0
                ));
            }
        }
        if self.rules.len() > RULES_PER_GRANT_MAX {
            return Err(format!(
                "{} rules; at most {RULES_PER_GRANT_MAX} are allowed",
                self.rules.len()
            ));
        }
        Ok(())
    }

    fn names(&self, tool: &str) -> bool {
        self.tools.iter().any(|p| p.matches(tool))
    }
}

/// Where a tool takes a shell command string (refused unless the grant allows a shell).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShellArg {
    pub tool: String,
    /// The top-level argument that carries the command string.
    pub field: String,
}

struct Config {
    grants: Vec<Grant>,
    session_rate: Option<RateLimit>,
    approver: Option<Arc<dyn Approver>>,
    approval_timeout: Duration,
    audit: Option<Arc<dyn AuditSink>>,
    audit_args: bool,
    sandboxed: BTreeSet<String>,
    shell_args: Vec<ShellArg>,
}

#[derive(Default)]
struct State {
    tool_limiters: HashMap<(usize, String), Arc<Limiter>>,
    session_limiter: Option<Arc<Limiter>>,
    /// Approved (tool, args fingerprint) → approval id, oldest first for eviction.
    approvals: BTreeMap<(String, String), String>,
    approval_order: VecDeque<(String, String)>,
}

/// A session's authorizer: compiled grants shared by every clone, and the session's own rate
/// and approval state.
#[derive(Clone)]
pub struct Policy {
    config: Arc<Config>,
    state: Arc<Mutex<State>>,
}

/// Builds a [`Policy`].
pub struct PolicyBuilder {
    config: Config,
}

impl Default for PolicyBuilder {
    fn default() -> Self {
        Self {
            config: Config {
                grants: Vec::new(),
                session_rate: None,
                approver: None,
                approval_timeout: APPROVAL_TIMEOUT_DEFAULT,
                audit: None,
                audit_args: false,
                sandboxed: BTreeSet::new(),
                shell_args: Vec::new(),
            },
        }
    }
}

impl PolicyBuilder {
    /// Adds a grant. Grants are consulted in the order they were added; the first that names a
    /// tool decides for it.
    pub fn grant(mut self, grant: Grant) -> Result<Self, String> {
        grant
            .validate()
            .map_err(|why| format!("grant {:?}: {why}", grant.name))?;
        if self.config.grants.len() >= GRANTS_MAX {
            return Err(format!("at most {GRANTS_MAX} grants are allowed"));
        }
        self.config.grants.push(grant);
        Ok(self)
    }

    /// A limit over every call of the session.
    pub fn session_rate(mut self, limit: RateLimit) -> Self {
        self.config.session_rate = Some(limit);
        self
    }

    /// Who decides held calls. Without one, a held call is denied.
    pub fn approver(mut self, approver: Arc<dyn Approver>) -> Self {
        self.config.approver = Some(approver);
        self
    }

    /// How long a held call waits (clamped to 1 ms ..= [`APPROVAL_TIMEOUT_MAX`]).
    pub fn approval_timeout(mut self, timeout: Duration) -> Self {
        self.config.approval_timeout =
            timeout.clamp(Duration::from_millis(1), APPROVAL_TIMEOUT_MAX);
        self
    }

    pub fn audit(mut self, sink: Arc<dyn AuditSink>) -> Self {
        self.config.audit = Some(sink);
        self
    }

    /// Records the prepared arguments themselves in the audit trail (off by default).
    pub fn audit_args(mut self, on: bool) -> Self {
        self.config.audit_args = on;
        self
    }

    /// Tools whose executor confines every effect to the workspace sandbox: only these may run as
    /// A1; any other tool that declares A1 is judged as A2.
    pub fn sandboxed_tools<I, S>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.config
            .sandboxed
            .extend(names.into_iter().map(Into::into));
        self
    }

    /// Declares that `tool` takes a shell command string in `field`.
    pub fn shell_arg(mut self, tool: impl Into<String>, field: impl Into<String>) -> Self {
        self.config.shell_args.push(ShellArg {
            tool: tool.into(),
            field: field.into(),
        });
        self
    }

    pub fn build(self) -> Policy {
        Policy {
            config: Arc::new(self.config),
            state: Arc::new(Mutex::new(State::default())),
        }
    }
}

/// A refusal or a hold before any person is asked.
struct Refusal {
    rule: String,
    reason: String,
}

fn refuse(rule: impl Into<String>, reason: impl Into<String>) -> Refusal {
    Refusal {
        rule: rule.into(),
        reason: reason.into(),
    }
}

impl Policy {
    pub fn builder() -> PolicyBuilder {
        PolicyBuilder::default()
    }

    /// A policy with the same grants and fresh per-session state (rate limits, approvals).
    pub fn for_new_session(&self) -> Policy {
        Policy {
            config: self.config.clone(),
            state: Arc::new(Mutex::new(State::default())),
        }
    }

    pub fn grants(&self) -> &[Grant] {
        &self.config.grants
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The authority a call is judged at: A1 only for sandboxed built-ins.
    fn effective_authority(&self, spec: &ToolSpec) -> Authority {
        if spec.authority == Authority::A1 && !self.config.sandboxed.contains(&spec.name) {
            Authority::A2
        } else {
            spec.authority
        }
    }

    /// Steps 1–2: the grant that names the tool, and the authority checks. Argument-independent,
    /// so discovery uses it too.
    fn static_check(&self, spec: &ToolSpec) -> Result<(usize, &Grant), Refusal> {
        let Some((index, grant)) = self
            .config
            .grants
            .iter()
            .enumerate()
            .find(|(_, g)| g.names(&spec.name))
        else {
            return Err(refuse(
                "default_deny",
                format!("no grant names tool {:?}", spec.name),
            ));
        };
        let authority = self.effective_authority(spec);
        if authority > grant.ceiling {
            let why = if authority != spec.authority {
                format!(
                    "tool {:?} declares A1 but does not run inside the workspace sandbox, so it is judged as A2; grant {:?} allows up to {}",
                    spec.name, grant.name, grant.ceiling
                )
            } else {
                format!(
                    "tool {:?} needs authority {authority}; grant {:?} allows up to {}",
                    spec.name, grant.name, grant.ceiling
                )
            };
            return Err(refuse(format!("ceiling:{}", grant.name), why));
        }
        if authority == Authority::A2 && spec.settlement == Settlement::None && !grant.approval {
            return Err(refuse(
                format!("a2_settlement:{}", grant.name),
                format!(
                    "tool {:?} acts outside the sandbox (A2) and declares no way to settle an ambiguous outcome (idempotency key or probe); grant {:?} would have to hold it for approval",
                    spec.name, grant.name
                ),
            ));
        }
        Ok((index, grant))
    }

    fn audit(
        &self,
        request: &AuthRequest<'_>,
        decision: AuditDecision,
        rule: &str,
        reason: &str,
        approval_id: Option<&str>,
    ) -> Result<(), String> {
        let Some(sink) = &self.config.audit else {
            return Ok(());
        };
        sink.record(&AuditEntry {
            at_ms: now_ms(),
            decision,
            rule: rule.to_string(),
            reason: reason.to_string(),
            tool: request.spec.name.clone(),
            call_id: request.call_id.to_string(),
            scope: request.session.scope.clone(),
            session_id: request.session.session_id.clone(),
            args_hash: request.args_hash.to_string(),
            approval_id: approval_id.map(str::to_string),
            args: self.config.audit_args.then(|| request.args.clone()),
        })
    }

    /// Records `decision` and returns `outcome`, or a denial when the record cannot be written.
    fn finish(
        &self,
        request: &AuthRequest<'_>,
        decision: AuditDecision,
        approval_id: Option<&str>,
        outcome: AuthDecision,
    ) -> AuthDecision {
        let (rule, reason) = match &outcome {
            AuthDecision::Allow { rule } | AuthDecision::ApprovalTimeout { rule } => {
                (rule.as_str(), "")
            }
            AuthDecision::Deny { rule, reason } | AuthDecision::ApprovalDenied { rule, reason } => {
                (rule.as_str(), reason.as_str())
            }
        };
        match self.audit(request, decision, rule, reason, approval_id) {
            Ok(()) => outcome,
            Err(why) => AuthDecision::Deny {
                rule: "audit_unavailable".into(),
                reason: format!(
                    "the decision could not be recorded, so the call is refused: {why}"
                ),
            },
        }
    }

    fn deny(&self, request: &AuthRequest<'_>, refusal: Refusal) -> AuthDecision {
        self.finish(
            request,
            AuditDecision::Denied,
            None,
            AuthDecision::Deny {
                rule: refusal.rule,
                reason: refusal.reason,
            },
        )
    }

    /// Steps 3–5 for the grant at `index`.
    fn check_arguments(
        &self,
        index: usize,
        grant: &Grant,
        request: &AuthRequest<'_>,
    ) -> Result<(), Refusal> {
        let spec = request.spec;
        if !grant.shell
            && let Some(arg) = self
                .config
                .shell_args
                .iter()
                .find(|a| a.tool == spec.name && request.args.get(&a.field).is_some())
        {
            return Err(refuse(
                format!("shell:{}", grant.name),
                format!(
                    "a shell command string (`{}`) is not allowed by grant {:?}; pass an explicit argv instead",
                    arg.field, grant.name
                ),
            ));
        }
        for (i, rule) in grant.rules.iter().enumerate() {
            let rule_name = format!("rule:{}[{i}]", grant.name);
            match rule.evaluate(
                request.args,
                &request.session.scope,
                &request.session.session_id,
                spec,
            ) {
                Ok(true) => {}
                Ok(false) => {
                    return Err(refuse(
                        rule_name,
                        format!("argument rule `{}` does not hold", rule.source()),
                    ));
                }
                Err(why) => {
                    return Err(refuse(
                        rule_name,
                        format!(
                            "argument rule `{}` could not be evaluated ({why}); a rule that fails denies",
                            rule.source()
                        ),
                    ));
                }
            }
        }
        if let Some(limit) = grant.rate {
            let limiter = self
                .state()
                .tool_limiters
                .entry((index, spec.name.clone()))
                .or_insert_with(|| Arc::new(limit.limiter()))
                .clone();
            if let Err(wait) = limiter.check() {
                return Err(refuse(
                    format!("rate:{}", grant.name),
                    format!(
                        "tool {:?} is limited to {} under grant {:?}; try again in {} ms",
                        spec.name,
                        limiter.limit(),
                        grant.name,
                        wait.as_millis().max(1)
                    ),
                ));
            }
        }
        if let Some(limit) = self.config.session_rate {
            let limiter = self
                .state()
                .session_limiter
                .get_or_insert_with(|| Arc::new(limit.limiter()))
                .clone();
            if let Err(wait) = limiter.check() {
                return Err(refuse(
                    "rate:session",
                    format!(
                        "this session is limited to {} calls; try again in {} ms",
                        limiter.limit(),
                        wait.as_millis().max(1)
                    ),
                ));
            }
        }
        Ok(())
    }

    fn summary(&self, request: &AuthRequest<'_>, authority: Authority, reason: &str) -> String {
        let args = canonical_string(request.args).unwrap_or_else(|_| request.args.to_string());
        let args = bounded(&args, SUMMARY_BYTES_MAX / 2);
        bounded(
            &format!(
                "{} ({authority}) with arguments {args}\nheld because: {reason}",
                request.spec.name
            ),
            SUMMARY_BYTES_MAX,
        )
    }

    fn remember_approval(&self, tool: &str, args_hash: &str, id: &str) {
        let mut st = self.state();
        let key = (tool.to_string(), args_hash.to_string());
        if st.approvals.insert(key.clone(), id.to_string()).is_none() {
            st.approval_order.push_back(key);
        }
        while st.approval_order.len() > APPROVALS_REMEMBERED_MAX {
            if let Some(old) = st.approval_order.pop_front() {
                st.approvals.remove(&old);
            }
        }
    }

    async fn hold(
        &self,
        request: &AuthRequest<'_>,
        grant: &Grant,
        authority: Authority,
    ) -> AuthDecision {
        let approved = self
            .state()
            .approvals
            .get(&(request.spec.name.clone(), request.args_hash.to_string()))
            .cloned();
        if let Some(id) = approved {
            return self.finish(
                request,
                AuditDecision::Allowed,
                Some(&id),
                AuthDecision::Allow {
                    rule: format!("approved:{id}"),
                },
            );
        }
        let (rule, reason) = if authority == Authority::A3 {
            (
                "a3_approval".to_string(),
                format!(
                    "tool {:?} is A3: its effect cannot be undone, so a person must approve it",
                    request.spec.name
                ),
            )
        } else {
            (
                format!("approval:{}", grant.name),
                format!(
                    "grant {:?} requires a person's approval for every call",
                    grant.name
                ),
            )
        };
        let Some(approver) = self.config.approver.clone() else {
            return self.deny(
                request,
                refuse(
                    rule,
                    format!("{reason}, and no approval channel is configured"),
                ),
            );
        };
        let id = new_approval_id();
        let created = now_ms();
        let timeout = self.config.approval_timeout;
        let approval = ApprovalRequest {
            id: id.clone(),
            tool: request.spec.name.clone(),
            authority,
            call_id: request.call_id.to_string(),
            scope: request.session.scope.clone(),
            session_id: request.session.session_id.clone(),
            args_hash: request.args_hash.to_string(),
            summary: self.summary(request, authority, &reason),
            reason: reason.clone(),
            created_at_ms: created,
            deadline_ms: created
                .saturating_add(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX)),
        };
        if let Err(why) = self.audit(request, AuditDecision::Held, &rule, &reason, Some(&id)) {
            return AuthDecision::Deny {
                rule: "audit_unavailable".into(),
                reason: format!("the hold could not be recorded, so the call is refused: {why}"),
            };
        }
        if let Some(events) = request.events {
            events.approval_required(
                &approval.id,
                &approval.call_id,
                &approval.tool,
                &approval.args_hash,
                &approval.summary,
                approval.deadline_ms,
            );
        }
        let outcome =
            tokio::time::timeout(timeout, approver.decide_for(&approval, request.extensions))
                .await
                .unwrap_or(ApprovalOutcome::TimedOut);
        match outcome {
            ApprovalOutcome::Approved { args_hash } if args_hash == request.args_hash => {
                self.remember_approval(&request.spec.name, request.args_hash, &id);
                self.finish(
                    request,
                    AuditDecision::Approved,
                    Some(&id),
                    AuthDecision::Allow {
                        rule: format!("approved:{id}"),
                    },
                )
            }
            ApprovalOutcome::Approved { args_hash } => self.finish(
                request,
                AuditDecision::ApprovalDenied,
                Some(&id),
                AuthDecision::ApprovalDenied {
                    rule,
                    reason: format!(
                        "the approval was given for other arguments ({args_hash}); these arguments need their own approval"
                    ),
                },
            ),
            ApprovalOutcome::Denied { reason } => self.finish(
                request,
                AuditDecision::ApprovalDenied,
                Some(&id),
                AuthDecision::ApprovalDenied { rule, reason },
            ),
            ApprovalOutcome::TimedOut => self.finish(
                request,
                AuditDecision::ApprovalTimeout,
                Some(&id),
                AuthDecision::ApprovalTimeout { rule },
            ),
        }
    }
}

#[async_trait]
impl Authorizer for Policy {
    async fn authorize(&self, request: &AuthRequest<'_>) -> AuthDecision {
        let (index, grant) = match self.static_check(request.spec) {
            Ok(found) => found,
            Err(refusal) => return self.deny(request, refusal),
        };
        if let Err(refusal) = self.check_arguments(index, grant, request) {
            return self.deny(request, refusal);
        }
        let authority = self.effective_authority(request.spec);
        if authority == Authority::A3 || grant.approval {
            return self.hold(request, grant, authority).await;
        }
        self.finish(
            request,
            AuditDecision::Allowed,
            None,
            AuthDecision::Allow {
                rule: format!("grant:{}", grant.name),
            },
        )
    }

    fn visible(&self, _session: &SessionInfo, spec: &ToolSpec) -> bool {
        self.static_check(spec).is_ok()
    }
}
