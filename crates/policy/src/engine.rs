//! The policy engine: grants in, one [`AuthDecision`] per call out.

use crate::approval::{
    APPROVAL_TIMEOUT_DEFAULT, APPROVAL_TIMEOUT_MAX, ApprovalOutcome, ApprovalRequest, Approver,
    SUMMARY_BYTES_MAX, bounded, new_approval_id, now_ms,
};
use crate::audit::{AuditDecision, AuditEntry, AuditSink};
use crate::inline::inline_script;
use crate::rate::{Limiter, RateLimit};
use crate::rules::{ArgRule, RULES_PER_GRANT_MAX, RuleError};
use crate::show::shown_args;
use async_trait::async_trait;
use ring0_core::{Authority, Principal, Settlement, ToolSpec};
use ring0_journal::{RateTaken, SharedState};
use ring0_kernel::policy::ToolPattern;
use ring0_kernel::{AuthAdmission, AuthDecision, AuthRequest, Authorizer, SessionInfo};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Most grants one policy holds.
pub const GRANTS_MAX: usize = 256;
/// Most "allow for this session" approvals one policy remembers across all principals and
/// sessions (oldest forgotten first); a forgotten one is asked again.
pub const APPROVALS_REMEMBERED_MAX: usize = 4096;
/// Most rate buckets one policy keeps (per principal, per session); the least recently created
/// is dropped first. Principals come from configured credentials, so this bounds sessions.
pub const RATE_BUCKETS_MAX: usize = 65_536;
/// Most principals or groups one grant names.
pub const GRANT_PRINCIPALS_MAX: usize = 256;
/// Longest `approval_scope` duration.
pub const APPROVAL_SCOPE_MAX: Duration = Duration::from_secs(24 * 60 * 60);
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
    /// Limit per tool under this grant, per principal.
    pub rate: Option<RateLimit>,
    /// Principal ids the grant applies to; empty (with `groups` empty): everyone.
    pub principals: Vec<String>,
    /// Groups the grant applies to (a principal in any of them matches).
    pub groups: Vec<String>,
    /// What a person's approval may cover.
    pub approval_scope: ApprovalScope,
    /// An A2 tool that declares no settlement may run without approval under this grant: the
    /// operator vouches for what its `rules` let through. Needs at least one rule.
    pub unattended: bool,
    /// The sandbox profile the processes of this grant's calls run in (a tool declared with
    /// [`PolicyBuilder::profile_arg`]); `None`: the tool's own.
    pub sandbox: Option<String>,
    /// A wider sandbox profile a call of this grant may ask for (in the tool's profile
    /// argument), after the sandbox stopped it: such a call is held for a person's approval.
    pub sandbox_wider: Option<String>,
}

/// What one approval may cover: this call only, or — when the person chooses "allow for this
/// session" — identical calls (same principal, session, tool and arguments) for the rest of the
/// session, or for a while within it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ApprovalScope {
    /// Only the call that was approved (the default).
    #[default]
    Once,
    /// The person may allow identical calls for the rest of the session.
    Session,
    /// The person may allow identical calls in the session for this long.
    For(Duration),
}

impl ApprovalScope {
    /// `once`, `session`, or a duration (`90s`, `30m`, `2h`; at most [`APPROVAL_SCOPE_MAX`]).
    pub fn parse(text: &str) -> Result<Self, String> {
        match text.trim() {
            "once" => Ok(Self::Once),
            "session" => Ok(Self::Session),
            other => {
                let bad = || {
                    format!(
                        "approval_scope {other:?}: write \"once\", \"session\" or a duration such as \"30m\" (s, m, h; at most 24h)"
                    )
                };
                let split = other.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
                let (n, unit) = other.split_at(split);
                let n: u64 = n.parse().map_err(|_| bad())?;
                let secs = match unit {
                    "s" => n,
                    "m" => n.saturating_mul(60),
                    "h" => n.saturating_mul(3600),
                    _ => return Err(bad()),
                };
                let d = Duration::from_secs(secs);
                if d.is_zero() || d > APPROVAL_SCOPE_MAX {
                    return Err(bad());
                }
                Ok(Self::For(d))
            }
        }
    }

    /// What a person who allows the call for the session allows, or `None` for `once`.
    fn offer(self) -> Option<String> {
        match self {
            Self::Once => None,
            Self::Session => Some("this session".into()),
            Self::For(d) => Some(format!("this session, for {} s", d.as_secs())),
        }
    }
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
            principals: Vec::new(),
            groups: Vec::new(),
            approval_scope: ApprovalScope::Once,
            unattended: false,
            sandbox: None,
            sandbox_wider: None,
        }
    }

    /// Runs the processes of this grant's calls in sandbox profile `profile`.
    pub fn sandbox(mut self, profile: impl Into<String>) -> Self {
        self.sandbox = Some(profile.into());
        self
    }

    /// Lets a call ask for the wider sandbox profile `profile`, held for a person's approval.
    pub fn sandbox_wider(mut self, profile: impl Into<String>) -> Self {
        self.sandbox_wider = Some(profile.into());
        self
    }

    /// Limits the grant to these principal ids (in addition to any `groups`).
    pub fn principals<I, S>(mut self, ids: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.principals.extend(ids.into_iter().map(Into::into));
        self
    }

    /// Limits the grant to principals in these groups (in addition to any `principals`).
    pub fn groups<I, S>(mut self, groups: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.groups.extend(groups.into_iter().map(Into::into));
        self
    }

    pub fn approval_scope(mut self, scope: ApprovalScope) -> Self {
        self.approval_scope = scope;
        self
    }

    /// Whether the grant applies to `principal`: it names none, or names its id or a group.
    pub fn applies_to(&self, principal: &Principal) -> bool {
        (self.principals.is_empty() && self.groups.is_empty())
            || self.principals.contains(&principal.id)
            || self.groups.iter().any(|g| principal.groups.contains(g))
    }

    pub fn approval(mut self, required: bool) -> Self {
        self.approval = required;
        self
    }

    pub fn shell(mut self, allowed: bool) -> Self {
        self.shell = allowed;
        self
    }

    /// Lets an A2 tool that declares no settlement run without approval when every rule holds
    /// (see [`Grant::unattended`]).
    pub fn unattended(mut self, on: bool) -> Self {
        self.unattended = on;
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
        if self.principals.len() > GRANT_PRINCIPALS_MAX || self.groups.len() > GRANT_PRINCIPALS_MAX
        {
            return Err(format!(
                "names more than {GRANT_PRINCIPALS_MAX} principals or groups"
            ));
        }
        if self
            .principals
            .iter()
            .chain(&self.groups)
            .any(String::is_empty)
        {
            return Err("an empty principal or group name matches nobody".into());
        }
        if self.unattended && self.rules.is_empty() {
            return Err("unattended needs rules that limit what runs without approval".into());
        }
        if self.sandbox_wider.is_some() && self.sandbox_wider == self.sandbox {
            return Err("sandbox_wider names the grant's own sandbox profile".into());
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
    principal_rate: Option<RateLimit>,
    approver: Option<Arc<dyn Approver>>,
    approval_timeout: Duration,
    audit: Option<Arc<dyn AuditSink>>,
    audit_args: bool,
    sandboxed: BTreeSet<String>,
    shell_args: Vec<ShellArg>,
    argv_args: Vec<ShellArg>,
    profile_args: Vec<ShellArg>,
    /// Where rate buckets and remembered approvals live when replicas share them; `None`: in
    /// this policy's memory.
    shared: Option<Arc<dyn SharedState>>,
}

/// Whose rate bucket: every key names the principal, so no principal spends another's quota,
/// and none names a session object, so re-initializing a session resets only `Session` buckets.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum BucketKey {
    /// A grant's per-tool limit, per principal.
    Tool {
        principal: String,
        grant: usize,
        tool: String,
    },
    /// `principal_rate`: every call of the principal.
    Principal(String),
    /// `session_rate`: every call of one session of the principal.
    Session { principal: String, session: String },
}

impl BucketKey {
    /// The bucket's name in a shared state: every part, as a JSON array (unambiguous whatever
    /// the parts hold), the grant by name (its place may differ between replicas' files).
    fn shared(&self, grant: &Grant) -> String {
        let parts = match self {
            Self::Tool {
                principal, tool, ..
            } => serde_json::json!(["tool", principal, grant.name, tool]),
            Self::Principal(principal) => serde_json::json!(["principal", principal]),
            Self::Session { principal, session } => {
                serde_json::json!(["session", principal, session])
            }
        };
        parts.to_string()
    }
}

/// An "allow for this session" approval: bound to principal, session, tool and fingerprint.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct ApprovalKey {
    principal: String,
    session: String,
    tool: String,
    args_hash: String,
}

impl ApprovalKey {
    /// The approval's name in a shared state: every part, as a JSON array.
    fn shared(&self) -> String {
        serde_json::json!([self.principal, self.session, self.tool, self.args_hash]).to_string()
    }
}

struct Remembered {
    id: String,
    /// Lapses at this instant (`approval_scope` duration); `None`: the session's lifetime.
    until: Option<Instant>,
}

#[derive(Default)]
struct State {
    buckets: HashMap<BucketKey, Arc<Limiter>>,
    bucket_order: VecDeque<BucketKey>,
    approvals: BTreeMap<ApprovalKey, Remembered>,
    approval_order: VecDeque<ApprovalKey>,
}

impl State {
    fn limiter(&mut self, key: BucketKey, limit: RateLimit) -> Arc<Limiter> {
        if let Some(l) = self.buckets.get(&key) {
            return l.clone();
        }
        while self.buckets.len() >= RATE_BUCKETS_MAX {
            let Some(old) = self.bucket_order.pop_front() else {
                break;
            };
            self.buckets.remove(&old);
        }
        let l = Arc::new(limit.limiter());
        self.buckets.insert(key.clone(), l.clone());
        self.bucket_order.push_back(key);
        l
    }
}

/// The authorizer: compiled grants, and the rate and approval state of every principal and
/// session it serves (keyed by them, so one `Policy` is shared by all sessions safely).
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
                principal_rate: None,
                approver: None,
                approval_timeout: APPROVAL_TIMEOUT_DEFAULT,
                audit: None,
                audit_args: false,
                sandboxed: BTreeSet::new(),
                shell_args: Vec::new(),
                argv_args: Vec::new(),
                profile_args: Vec::new(),
                shared: None,
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

    /// A limit over every call of one session (of one principal).
    pub fn session_rate(mut self, limit: RateLimit) -> Self {
        self.config.session_rate = Some(limit);
        self
    }

    /// A limit over every call of one principal, across all its sessions.
    pub fn principal_rate(mut self, limit: RateLimit) -> Self {
        self.config.principal_rate = Some(limit);
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

    /// Declares that `tool` takes an argv (a list of strings) in `field`: without a shell grant,
    /// an argv that starts a shell or interpreter with an inline script is refused like a
    /// command string (see the crate docs for the list).
    pub fn argv_arg(mut self, tool: impl Into<String>, field: impl Into<String>) -> Self {
        self.config.argv_args.push(ShellArg {
            tool: tool.into(),
            field: field.into(),
        });
        self
    }

    /// Declares that `tool` takes, in `field`, the name of a sandbox profile to run in: a call
    /// that names one is refused unless it is its grant's `sandbox_wider`, and held for a
    /// person's approval when it is.
    pub fn profile_arg(mut self, tool: impl Into<String>, field: impl Into<String>) -> Self {
        self.config.profile_args.push(ShellArg {
            tool: tool.into(),
            field: field.into(),
        });
        self
    }

    /// Keeps rate buckets and remembered approvals in `state`, which other replicas share
    /// (a PostgreSQL journal's, [`ring0_journal::Journal::shared_state`]), instead of in this
    /// policy's memory: a limit then holds across the replicas, and an approval remembered on
    /// one is honoured on all. When `state` fails, a call is refused rather than let past its
    /// limit, and a person is asked again rather than an approval assumed.
    pub fn shared_state(mut self, state: Arc<dyn SharedState>) -> Self {
        self.config.shared = Some(state);
        self
    }

    pub fn build(self) -> Policy {
        Policy {
            config: Arc::new(self.config),
            state: Arc::new(Mutex::new(State::default())),
        }
    }
}

/// A refusal before any person is asked.
struct Refusal {
    rule: String,
    reason: String,
    /// Set for a rate refusal: when the call would be accepted again.
    retry_after_ms: Option<u64>,
}

fn refuse(rule: impl Into<String>, reason: impl Into<String>) -> Refusal {
    Refusal {
        rule: rule.into(),
        reason: reason.into(),
        retry_after_ms: None,
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

impl Policy {
    pub fn builder() -> PolicyBuilder {
        PolicyBuilder::default()
    }

    pub fn grants(&self) -> &[Grant] {
        &self.config.grants
    }

    /// Why `spec` is not listed to `principal` (no grant names it, or the grant that does cannot
    /// admit it), or `None` when it is: the same argument-independent check discovery uses.
    pub fn hidden_because(&self, spec: &ToolSpec, principal: &Principal) -> Option<String> {
        self.static_check(spec, principal).err().map(|r| r.reason)
    }

    /// The grant that decides the calls of `tool` for `principal` (the first that names the
    /// tool and applies to the principal), whatever the call's arguments: a tool that runs a
    /// call in its grant's sandbox profile asks this.
    pub fn grant_for(&self, tool: &str, principal: &Principal) -> Option<&Grant> {
        self.config
            .grants
            .iter()
            .find(|g| g.names(tool) && g.applies_to(principal))
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

    /// Steps 1–2: the grant that names the tool for this principal, and the authority checks.
    /// Argument-independent, so discovery uses it too.
    fn static_check(
        &self,
        spec: &ToolSpec,
        principal: &Principal,
    ) -> Result<(usize, &Grant), Refusal> {
        let Some((index, grant)) = self
            .config
            .grants
            .iter()
            .enumerate()
            .find(|(_, g)| g.names(&spec.name) && g.applies_to(principal))
        else {
            return Err(refuse(
                "default_deny",
                format!(
                    "no grant names tool {:?} for principal {:?}",
                    spec.name, principal.id
                ),
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
        if authority == Authority::A2
            && spec.settlement == Settlement::None
            && !grant.approval
            && !grant.unattended
        {
            return Err(refuse(
                format!("a2_settlement:{}", grant.name),
                format!(
                    "tool {:?} acts outside the sandbox (A2) and declares no way to settle an ambiguous outcome (idempotency key or probe); grant {:?} would have to hold it for approval (or limit it with rules and set unattended)",
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
            principal: request.session.principal.id.clone(),
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
            AuthDecision::Deny { rule, reason }
            | AuthDecision::ApprovalDenied { rule, reason }
            | AuthDecision::ApprovalRequired { rule, reason, .. }
            | AuthDecision::RateLimited { rule, reason, .. } => (rule.as_str(), reason.as_str()),
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
        let (decision, outcome) = match refusal.retry_after_ms {
            Some(retry_after_ms) => (
                AuditDecision::RateLimited,
                AuthDecision::RateLimited {
                    rule: refusal.rule,
                    reason: refusal.reason,
                    retry_after_ms,
                },
            ),
            None => (
                AuditDecision::Denied,
                AuthDecision::Deny {
                    rule: refusal.rule,
                    reason: refusal.reason,
                },
            ),
        };
        self.finish(request, decision, None, outcome)
    }

    /// Steps 3–4 for the grant.
    fn check_arguments(&self, grant: &Grant, request: &AuthRequest<'_>) -> Result<(), Refusal> {
        if !grant.shell {
            self.check_no_command_string(grant, request)?;
        }
        self.check_profile(grant, request)?;
        self.check_rules(grant, request)
    }

    /// Step 3: no command string, and no argv that starts an inline script.
    fn check_no_command_string(
        &self,
        grant: &Grant,
        request: &AuthRequest<'_>,
    ) -> Result<(), Refusal> {
        let tool = &request.spec.name;
        if let Some(arg) = self
            .config
            .shell_args
            .iter()
            .find(|a| a.tool == *tool && request.args.get(&a.field).is_some())
        {
            return Err(refuse(
                format!("shell:{}", grant.name),
                format!(
                    "a shell command string (`{}`) is not allowed by grant {:?}; pass an explicit argv instead",
                    arg.field, grant.name
                ),
            ));
        }
        for arg in self.config.argv_args.iter().filter(|a| a.tool == *tool) {
            let Some(items) = request.args.get(&arg.field).and_then(|v| v.as_array()) else {
                continue;
            };
            let argv: Vec<&str> = items.iter().filter_map(|v| v.as_str()).collect();
            if let Some(found) = inline_script(&argv) {
                return Err(refuse(
                    format!("shell:{}", grant.name),
                    format!(
                        "`{}` starts an inline script (`{found}`), which is a command string by another name; grant {:?} allows only explicit argv: run the program itself, or a script file",
                        arg.field, grant.name
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The sandbox profile a call asks for, if its tool takes one and it names one.
    fn asked_profile<'r>(&self, request: &'r AuthRequest<'_>) -> Option<&'r Value> {
        self.config
            .profile_args
            .iter()
            .filter(|a| a.tool == request.spec.name)
            .find_map(|a| request.args.get(&a.field))
    }

    /// Step 3b: a sandbox profile a call asks for must be its grant's `sandbox_wider`.
    fn check_profile(&self, grant: &Grant, request: &AuthRequest<'_>) -> Result<(), Refusal> {
        let Some(asked) = self.asked_profile(request) else {
            return Ok(());
        };
        if asked.as_str().is_some() && asked.as_str() == grant.sandbox_wider.as_deref() {
            return Ok(());
        }
        let offered = match &grant.sandbox_wider {
            Some(wider) => format!("only {wider:?}, with a person's approval"),
            None => "none".to_string(),
        };
        Err(refuse(
            format!("sandbox:{}", grant.name),
            format!(
                "the call asks for sandbox profile {asked}, which grant {:?} does not offer (it offers {offered})",
                grant.name
            ),
        ))
    }

    /// Step 4: every CEL rule of the grant holds.
    fn check_rules(&self, grant: &Grant, request: &AuthRequest<'_>) -> Result<(), Refusal> {
        for (i, rule) in grant.rules.iter().enumerate() {
            let rule_name = format!("rule:{}[{i}]", grant.name);
            match rule.evaluate(request.args, request.session, request.spec) {
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
        Ok(())
    }

    /// Step 5: the grant's per-tool limit, the principal's, then the session's.
    async fn check_rates(
        &self,
        index: usize,
        grant: &Grant,
        request: &AuthRequest<'_>,
    ) -> Result<(), Refusal> {
        let principal = &request.session.principal.id;
        let tool = &request.spec.name;
        let checks = [
            grant.rate.map(|limit| {
                let key = BucketKey::Tool {
                    principal: principal.clone(),
                    grant: index,
                    tool: tool.clone(),
                };
                let what = format!("tool {tool:?} under grant {:?}", grant.name);
                (key, limit, format!("rate:{}", grant.name), what)
            }),
            self.config.principal_rate.map(|limit| {
                let key = BucketKey::Principal(principal.clone());
                let what = format!("principal {principal:?}");
                (key, limit, "rate:principal".to_string(), what)
            }),
            self.config.session_rate.map(|limit| {
                let key = BucketKey::Session {
                    principal: principal.clone(),
                    session: request.session.session_id.clone(),
                };
                (
                    key,
                    limit,
                    "rate:session".to_string(),
                    "this session".to_string(),
                )
            }),
        ];
        for (key, limit, rule, what) in checks.into_iter().flatten() {
            let taken = match &self.config.shared {
                Some(shared) => {
                    Self::take_shared(shared.as_ref(), &key, grant, limit, &rule).await?
                }
                None => self.state().limiter(key, limit).check(),
            };
            if let Err(wait) = taken {
                let retry_after_ms = millis(wait);
                return Err(Refusal {
                    rule,
                    reason: format!(
                        "{what} is limited to {limit} calls; the same call is accepted again in {retry_after_ms} ms"
                    ),
                    retry_after_ms: Some(retry_after_ms),
                });
            }
        }
        Ok(())
    }

    /// Takes a cell of the shared bucket `key`: `Ok(Err(wait))` when none is free; a bucket
    /// that cannot be read refuses the call (fail closed), naming why.
    async fn take_shared(
        shared: &dyn SharedState,
        key: &BucketKey,
        grant: &Grant,
        limit: RateLimit,
        rule: &str,
    ) -> Result<Result<(), Duration>, Refusal> {
        let interval = (limit.period / limit.count.get()).max(Duration::from_micros(1));
        match shared
            .rate_take(&key.shared(grant), limit.count.get(), interval)
            .await
        {
            Ok(RateTaken::Allowed) => Ok(Ok(())),
            Ok(RateTaken::Refused { retry_after }) => Ok(Err(retry_after)),
            Err(e) => Err(refuse(
                rule,
                format!("the shared rate limit could not be checked, so the call is refused: {e}"),
            )),
        }
    }

    fn summary(request: &ApprovalRequest) -> String {
        bounded(
            &format!(
                "{} ({}) held because: {}\narguments (digest {}): {}",
                request.tool,
                request.authority,
                request.reason,
                request.args_hash,
                request.args_shown
            ),
            SUMMARY_BYTES_MAX,
        )
    }

    fn approval_key(request: &AuthRequest<'_>) -> ApprovalKey {
        ApprovalKey {
            principal: request.session.principal.id.clone(),
            session: request.session.session_id.clone(),
            tool: request.spec.name.clone(),
            args_hash: request.args_hash.to_string(),
        }
    }

    /// The id of a remembered, unexpired "allow for this session" approval of this call. A
    /// shared state that cannot be read remembers none: the person is asked again.
    async fn remembered(&self, request: &AuthRequest<'_>) -> Option<String> {
        let key = Self::approval_key(request);
        if let Some(shared) = &self.config.shared {
            return shared
                .approval_remembered(&key.shared())
                .await
                .ok()
                .flatten();
        }
        let mut st = self.state();
        match st.approvals.get(&key) {
            Some(r) if r.until.is_none_or(|t| Instant::now() < t) => Some(r.id.clone()),
            Some(_) => {
                st.approvals.remove(&key);
                None
            }
            None => None,
        }
    }

    /// Remembers a session approval. One the shared state cannot keep is not remembered: the
    /// next identical call asks again.
    async fn remember_approval(&self, request: &AuthRequest<'_>, scope: ApprovalScope, id: &str) {
        let ttl = match scope {
            ApprovalScope::Once => return,
            ApprovalScope::Session => None,
            ApprovalScope::For(d) => Some(d),
        };
        let key = Self::approval_key(request);
        if let Some(shared) = &self.config.shared {
            let _ = shared.approval_remember(&key.shared(), id, ttl).await;
            return;
        }
        let until = ttl.map(|d| Instant::now() + d);
        let mut st = self.state();
        let remembered = Remembered {
            id: id.to_string(),
            until,
        };
        if st.approvals.insert(key.clone(), remembered).is_none() {
            st.approval_order.push_back(key);
        }
        while st.approval_order.len() > APPROVALS_REMEMBERED_MAX {
            if let Some(old) = st.approval_order.pop_front() {
                st.approvals.remove(&old);
            }
        }
    }

    /// Why the call is held, and the rule that holds it.
    fn hold_reason(
        &self,
        request: &AuthRequest<'_>,
        grant: &Grant,
        authority: Authority,
    ) -> (String, String) {
        if let (Some(wider), Some(_)) = (&grant.sandbox_wider, self.asked_profile(request))
            && authority != Authority::A3
            && !grant.approval
        {
            return (
                format!("sandbox_wider:{}", grant.name),
                format!(
                    "the call asks to run in the wider sandbox profile {wider:?}, which grant {:?} allows only with a person's approval",
                    grant.name
                ),
            );
        }
        if authority == Authority::A3 {
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
        }
    }

    fn approval_request(
        &self,
        request: &AuthRequest<'_>,
        grant: &Grant,
        authority: Authority,
        reason: String,
    ) -> ApprovalRequest {
        let id = new_approval_id();
        let created = now_ms();
        let timeout = self.config.approval_timeout;
        let (args_shown, args_whole) = shown_args(request.args, &id, request.args_hash);
        let mut approval = ApprovalRequest {
            id,
            tool: request.spec.name.clone(),
            authority,
            call_id: request.call_id.to_string(),
            principal: request.session.principal.id.clone(),
            scope: request.session.scope.clone(),
            session_id: request.session.session_id.clone(),
            args_hash: request.args_hash.to_string(),
            args: request.args.clone(),
            args_shown,
            args_whole,
            summary: String::new(),
            reason,
            remember: grant.approval_scope.offer(),
            created_at_ms: created,
            deadline_ms: created
                .saturating_add(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX)),
        };
        approval.summary = Self::summary(&approval);
        approval
    }

    async fn hold(
        &self,
        request: &AuthRequest<'_>,
        grant: &Grant,
        authority: Authority,
    ) -> AuthDecision {
        if let Some(id) = self.remembered(request).await {
            return self.finish(
                request,
                AuditDecision::Allowed,
                Some(&id),
                AuthDecision::Allow {
                    rule: format!("approved:{id}"),
                },
            );
        }
        let (rule, reason) = self.hold_reason(request, grant, authority);
        let Some(approver) = self.config.approver.clone() else {
            return self.deny(
                request,
                refuse(
                    rule,
                    format!("{reason}, and no approval channel is configured"),
                ),
            );
        };
        let approval = self.approval_request(request, grant, authority, reason.clone());
        let id = approval.id.clone();
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
        let outcome = tokio::time::timeout(
            self.config.approval_timeout,
            approver.decide_for(&approval, request.extensions),
        )
        .await
        .unwrap_or(ApprovalOutcome::TimedOut);
        self.settle_hold(request, grant, rule, reason, &id, outcome)
            .await
    }

    /// Turns the person's answer into the decision (and remembers a session approval).
    async fn settle_hold(
        &self,
        request: &AuthRequest<'_>,
        grant: &Grant,
        rule: String,
        reason: String,
        id: &str,
        outcome: ApprovalOutcome,
    ) -> AuthDecision {
        let (args_hash, scope) = match outcome {
            ApprovalOutcome::Approved { args_hash } => (args_hash, ApprovalScope::Once),
            ApprovalOutcome::ApprovedForSession { args_hash } => (args_hash, grant.approval_scope),
            ApprovalOutcome::Denied { reason } => {
                let outcome = AuthDecision::ApprovalDenied { rule, reason };
                return self.finish(request, AuditDecision::ApprovalDenied, Some(id), outcome);
            }
            ApprovalOutcome::Pending { next } => {
                let outcome = AuthDecision::ApprovalRequired { rule, reason, next };
                return self.finish(request, AuditDecision::ApprovalRequired, Some(id), outcome);
            }
            ApprovalOutcome::TimedOut => {
                let outcome = AuthDecision::ApprovalTimeout { rule };
                return self.finish(request, AuditDecision::ApprovalTimeout, Some(id), outcome);
            }
        };
        if args_hash != request.args_hash {
            let outcome = AuthDecision::ApprovalDenied {
                rule,
                reason: format!(
                    "the approval was given for other arguments ({args_hash}); these arguments need their own approval"
                ),
            };
            return self.finish(request, AuditDecision::ApprovalDenied, Some(id), outcome);
        }
        self.remember_approval(request, scope, id).await;
        let outcome = AuthDecision::Allow {
            rule: format!("approved:{id}"),
        };
        self.finish(request, AuditDecision::Approved, Some(id), outcome)
    }

    /// Steps 1–5, and whether step 6 holds the call.
    async fn precheck<'g>(
        &'g self,
        request: &AuthRequest<'_>,
    ) -> Result<(&'g Grant, Authority, bool), Refusal> {
        let (index, grant) = self.static_check(request.spec, &request.session.principal)?;
        self.check_arguments(grant, request)?;
        self.check_rates(index, grant, request).await?;
        let authority = self.effective_authority(request.spec);
        // A call that asks for a wider sandbox profile passed `check_profile`: it is held.
        let wider = self.asked_profile(request).is_some();
        Ok((
            grant,
            authority,
            authority == Authority::A3 || grant.approval || wider,
        ))
    }
}

#[async_trait]
impl Authorizer for Policy {
    async fn authorize(&self, request: &AuthRequest<'_>) -> AuthDecision {
        let (grant, authority, held) = match self.precheck(request).await {
            Ok(found) => found,
            Err(refusal) => return self.deny(request, refusal),
        };
        if held {
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

    /// Everything but the hold: a call that would be held for a person (and holds no remembered
    /// approval) is left to [`Authorizer::hold`], which the kernel asks right before dispatch.
    async fn admit(&self, request: &AuthRequest<'_>) -> AuthAdmission {
        let (grant, held) = match self.precheck(request).await {
            Ok((grant, _, held)) => (grant, held),
            Err(refusal) => return AuthAdmission::Decided(self.deny(request, refusal)),
        };
        if held && self.remembered(request).await.is_none() {
            return AuthAdmission::Hold;
        }
        if held {
            return AuthAdmission::Decided(self.authorize(request).await);
        }
        AuthAdmission::Decided(self.finish(
            request,
            AuditDecision::Allowed,
            None,
            AuthDecision::Allow {
                rule: format!("grant:{}", grant.name),
            },
        ))
    }

    /// Steps 1–5 passed in [`Authorizer::admit`] (their rate token spent there): only the
    /// grant is looked up again, then the person is asked.
    async fn hold(&self, request: &AuthRequest<'_>) -> AuthDecision {
        let grant = match self.static_check(request.spec, &request.session.principal) {
            Ok((_, grant)) => grant,
            Err(refusal) => return self.deny(request, refusal),
        };
        let authority = self.effective_authority(request.spec);
        Policy::hold(self, request, grant, authority).await
    }

    /// At recovery nobody waits for the call: one that would be held for a person is refused
    /// (it was approved before the crash, but that approval is not carried over).
    async fn recheck(&self, request: &AuthRequest<'_>) -> AuthDecision {
        let (grant, authority, held) = match self.precheck(request).await {
            Ok(found) => found,
            Err(refusal) => return self.deny(request, refusal),
        };
        if held {
            let (rule, reason) = self.hold_reason(request, grant, authority);
            return self.deny(
                request,
                refuse(
                    rule,
                    format!("{reason}; at recovery nobody is asked, so the unsent call is not run"),
                ),
            );
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

    fn visible(&self, session: &SessionInfo, spec: &ToolSpec) -> bool {
        self.static_check(spec, &session.principal).is_ok()
    }

    /// A decision taken above the policy (the catalog's `catalog:meta`) is audited like the
    /// policy's own: an allowance that cannot be recorded is a denial.
    fn record_decided(&self, request: &AuthRequest<'_>, decision: AuthDecision) -> AuthDecision {
        let audited = match &decision {
            AuthDecision::Allow { .. } => AuditDecision::Allowed,
            AuthDecision::RateLimited { .. } => AuditDecision::RateLimited,
            _ => AuditDecision::Denied,
        };
        self.finish(request, audited, None, decision)
    }
}
