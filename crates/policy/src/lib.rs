//! Authorization for ring0: who may run which tool, with which arguments, how often, and when a
//! person must say yes first.
//!
//! A [`Policy`] is an [`Authorizer`](ring0_kernel::Authorizer) for every session of a host. It
//! holds [`Grant`]s (tool-name patterns, the principals and groups they apply to, an authority
//! ceiling, CEL argument rules, a per-tool rate limit, whether a person must approve and what
//! one approval may cover, whether a shell command string is allowed), principal and session
//! rate limits, an [`Approver`] and an [`AuditSink`]. Its state — rate buckets and remembered
//! approvals — is keyed by principal (and session), so one `Policy` shared by all sessions never
//! lets one principal's quota or approval reach another, nor one session's approval another
//! session. Every call's decision is made in this order, and the first refusal wins:
//!
//! 1. **grant** — the first grant whose pattern names the tool and that applies to the call's
//!    principal (its `principals` / `groups`, or everyone) decides; none → `default_deny`;
//! 2. **authority** — the tool's authority must be within the grant's ceiling. A1 means "inside
//!    the workspace sandbox", so an A1 tool whose executor is not one of the sandboxed built-ins
//!    is judged as A2. A2 requires the tool to declare how an ambiguous outcome is settled
//!    (idempotency key or probe) — or a grant that puts a person in front of every call;
//! 3. **shell** — a command string for a shell, or an argv that starts a shell or interpreter
//!    with an inline script (`sh -c`, `python -c`, `node -e`, …), is refused unless the grant
//!    allows a shell;
//! 4. **rules** — every CEL rule of the grant must evaluate to `true` over the *validated*
//!    arguments (`args`), the session (`session`), the principal (`principal`) and the tool's
//!    metadata (`tool`). A rule that errors denies; a rule naming an absent argument errors (and
//!    so denies) — it is never skipped;
//! 5. **rate** — the grant's per-tool limit and the principal's limit (both per principal, across
//!    its sessions), then the session's limit (GCRA, `governor`); a refusal is `rate_limited` with
//!    `retry_after_ms`;
//! 6. **approval** — A3 tools, and every tool of a grant that says so, are held: the
//!    [`Approver`] receives the whole arguments, their rendering for a person ([`render_args`]:
//!    escaped, bounded, with the digest), and the fingerprint of the prepared arguments; an
//!    approval binds to that fingerprint, so changed arguments need a new one. "Allow for this
//!    session" (where the grant's [`ApprovalScope`] offers it) remembers the approval for
//!    identical calls of the same principal and session. No answer within the approval timeout
//!    is `approval_timeout`; a refusal is `approval_denied`; an approver that hands the decision
//!    to the person out of band (a confirmation code) makes the call `approval_required`.
//!
//! The same grants filter discovery: [`Authorizer::visible`](ring0_kernel::Authorizer::visible)
//! lists a tool only if steps 1–2 would let some call of it through. At recovery,
//! [`Authorizer::recheck`](ring0_kernel::Authorizer::recheck) runs steps 1–5 and refuses a call
//! that step 6 would hold: nobody is waiting to be asked.
//!
//! Every decision — allowed, denied, held, approved, approval denied, approval timed out,
//! approval required, rate limited — is written to the [`AuditSink`] with the rule that fired,
//! the principal, the session and the arguments' fingerprint (the arguments themselves only when
//! configured). [`JsonlAudit`] chains its lines by hash ([`verify_chain`]). An audit record that
//! cannot be written denies the call: authorization fails closed.
//!
//! # Example
//!
//! ```
//! use ring0_core::{Authority, Observation, ProviderFormat, ToolSpec};
//! use ring0_kernel::{Kernel, RoundOptions, SessionConfig, tool_fn};
//! use ring0_policy::{Grant, MemoryAudit, Policy, RateLimit};
//! use serde_json::json;
//! use std::sync::Arc;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! let read = ToolSpec::read("read_file", "Read a file",
//!     json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}));
//! let kernel = Kernel::builder()
//!     .tool(read, tool_fn(|_ctx, args| async move { Ok(Observation::text(format!("{}", args["path"]))) }))
//!     .unwrap()
//!     .build();
//! let audit = Arc::new(MemoryAudit::new());
//! let policy = Policy::builder()
//!     .grant(Grant::new("src", &["read_file"], Authority::A0)
//!         .rule("args.path.startsWith('src/')").unwrap()
//!         .rate(RateLimit::parse("60/min").unwrap()))
//!     .unwrap()
//!     .audit(audit.clone())
//!     .build();
//! let session = kernel.open_session(SessionConfig::new("user:1").authorizer(Arc::new(policy)));
//! let turn = json!({"role": "assistant", "content": [
//!     {"type": "tool_use", "id": "t1", "name": "read_file", "input": {"path": "src/lib.rs"}},
//!     {"type": "tool_use", "id": "t2", "name": "read_file", "input": {"path": ".env"}}
//! ]});
//! let out = session.handle_turn(ProviderFormat::Anthropic, &turn, &RoundOptions::default()).await.unwrap();
//! assert_eq!(out.message["content"][0]["is_error"], false);
//! assert_eq!(out.message["content"][1]["is_error"], true); // the rule does not hold for `.env`
//! let rules: Vec<String> = audit.entries().into_iter().map(|e| e.rule).collect();
//! assert_eq!(rules, ["grant:src", "rule:src[0]"]);
//! # });
//! ```
//!
//! This crate never runs a tool, never reads a tool's arguments before they are validated, and
//! never lets a tool, a tool server or a model grant authority: everything it allows comes from
//! the grants the host configured.

mod approval;
mod audit;
mod engine;
mod inline;
mod rate;
mod rules;
mod show;

pub use approval::{
    APPROVAL_ID_BYTES_MAX, APPROVAL_POLL_INTERVAL, APPROVAL_TIMEOUT_DEFAULT, APPROVAL_TIMEOUT_MAX,
    ApprovalDecisionFile, ApprovalError, ApprovalOutcome, ApprovalRequest, Approver, Decision,
    DirectoryApprover, SUMMARY_BYTES_MAX, decide_pending, list_pending, read_pending,
    valid_approval_id,
};
pub use audit::{
    AUDIT_GENESIS, AUDIT_LINE_BYTES_MAX, AuditDecision, AuditEntry, AuditSink, ChainBreak,
    ChainReport, Head, JsonlAudit, MEMORY_AUDIT_ENTRIES_MAX, MemoryAudit, egress_audit,
    egress_entry, head_path, mediation_entry, verify_chain,
};
pub use engine::{
    APPROVAL_SCOPE_MAX, APPROVALS_REMEMBERED_MAX, ApprovalScope, GRANT_PRINCIPALS_MAX, GRANTS_MAX,
    Grant, Policy, PolicyBuilder, RATE_BUCKETS_MAX, ShellArg,
};
pub use rate::{RATE_PERIOD_MAX, RateLimit, RateLimitError};
pub use rules::{ArgRule, RULE_SOURCE_BYTES_MAX, RULES_PER_GRANT_MAX, RuleError};
pub use show::{ARGS_SHOWN_BYTES_MAX, SPACE_RUN_MARKED_MIN, render_args, shown_args};
