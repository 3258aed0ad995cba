//! What crosses the API boundary: every request and response body, with the JSON Schema the
//! OpenAPI document publishes. Stable and serializable; the kernel's own types stay inside.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

/// The host-tool vocabulary (and the formats, modes and authority levels) shared with the
/// Python package: defined once in `ring0-host`.
pub use ring0_host::{
    AuthorityLevel, ConcurrencyKind, EffectKind, ExecutionMode, Grammar, GrammarSyntax,
    HostFailure, HostTool, HostToolType, SettlementKind, StrategyKind, TurnFormat,
};

/// `POST /v1/sessions`.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSession {
    /// The format turns are in when they do not say. Default `openai`.
    #[serde(default)]
    pub format: Option<TurnFormat>,
    /// How the turn's calls are ordered. Default `safe_parallel`.
    #[serde(default)]
    pub mode: Option<ExecutionMode>,
    /// Narrows the principal's grants for this session; never widens them.
    #[serde(default)]
    pub grants: Option<SessionGrants>,
    /// Limits of the session, within ring0's own.
    #[serde(default)]
    pub limits: Option<SessionLimits>,
    /// The user-intent scope of the session's calls (part of every call's identity): a host
    /// that re-sends a turn from a new session with the same scope gets recorded results, not
    /// second effects. Bound to the principal. Default: the session's own id.
    #[serde(default)]
    pub scope: Option<String>,
}

/// The session's grants: only tools matching one of `tools`, up to `ceiling`, and only what
/// the principal's own grants allow.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionGrants {
    /// Tool names: exact, a prefix ending in `*`, or `*`. Default: every tool.
    #[serde(default)]
    pub tools: Option<Vec<String>>,
    /// The highest authority a call of the session may have. Default: no narrowing.
    #[serde(default)]
    pub ceiling: Option<AuthorityLevel>,
}

/// Per-session limits; each is bounded by ring0's own.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionLimits {
    /// Calls running at once in one turn (1..=64). Default: the server's.
    #[serde(default)]
    pub max_concurrent_tools: Option<usize>,
    /// The identical call's repetition that gets an advisory with its result (2..=100).
    #[serde(default)]
    pub repeat_advisory: Option<u32>,
    /// The identical call's repetition that is refused (`repeat_limit`); above the advisory.
    #[serde(default)]
    pub repeat_terminate: Option<u32>,
}

/// A created session.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SessionCreated {
    /// The session's id, in every route of it.
    pub id: String,
    /// The principal the session acts for.
    pub principal: String,
    /// The scope of its calls.
    pub scope: String,
    /// The format of turns that do not say.
    pub format: TurnFormat,
    /// How its calls are ordered.
    pub mode: ExecutionMode,
}

/// `PUT /v1/sessions/{id}/tools`: the session's host tools, replacing any before.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutTools {
    /// At most 128 tools.
    pub tools: Vec<HostTool>,
}

/// A tool a session may call.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ToolListing {
    /// The name the model calls it by.
    pub name: String,
    /// What the model reads about it.
    pub description: String,
    /// The prepared-arguments schema ring0 validates against.
    #[schema(value_type = Object)]
    pub input_schema: Value,
    /// Run by the host (`true`) or inside ring0.
    pub host: bool,
}

/// The session's catalog.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Tools {
    /// Every tool the session may call.
    pub tools: Vec<ToolListing>,
}

/// `POST /v1/sessions/{id}/turns`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TurnRequest {
    /// Default: the session's format.
    #[serde(default)]
    pub format: Option<TurnFormat>,
    /// The model's message (or output items) exactly as the provider returned it.
    pub message: Value,
    /// How long to wait for the turn to finish or to need the host, in milliseconds (at most
    /// 300000). Default 60000.
    #[serde(default)]
    pub wait_ms: Option<u64>,
}

/// Where a turn stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TurnStatus {
    /// Every call is answered: `results` is the tool-result message(s) to send the model.
    Complete,
    /// The turn waits for the host: run (or decide) each `pending` action and report it.
    Pending,
    /// Still running inside ring0 past the wait; ask again with `GET …/turns/{turn}`.
    Running,
}

/// What a pending action asks of the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ActionKind {
    /// Run the host tool with `arguments` and report its outcome.
    Run,
    /// A person must approve the call first: report `approve: true` or `false`.
    ApprovalRequired,
}

/// One thing the turn waits for the host to do.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PendingAction {
    /// Names the action in the outcome the host reports.
    pub id: String,
    /// Run it, or decide it.
    pub kind: ActionKind,
    /// The provider's call id.
    pub call_id: String,
    /// The tool's name.
    pub tool: String,
    /// The prepared arguments: validated, defaulted, rewritten by policy. Run with these.
    #[schema(value_type = Object)]
    pub arguments: Value,
    /// A custom tool's free-form input, as the model wrote it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input: Option<String>,
    /// The journal's intent, for a recorded call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub intent_id: Option<String>,
    /// Pass it to any API that honours one: a re-run after an unknown outcome carries the same.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// The fingerprint of the prepared arguments an approval binds to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub args_hash: Option<String>,
    /// Why a person must approve the call, and what they are shown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What a person approving it is shown: tool, authority, reason, digest, arguments.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// After this time (Unix milliseconds) an unreported run's outcome is unknown and an
    /// unanswered approval has timed out.
    pub deadline_ms: u64,
}

/// A turn's state as the host sees it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TurnResponse {
    /// The turn's id, in the routes of it.
    pub turn: String,
    /// Where the turn stands.
    pub status: TurnStatus,
    /// When complete: the tool-result message(s) in the turn's format (an array of messages or
    /// items for OpenAI, one user message for Anthropic).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub results: Option<Value>,
    /// What the turn waits for the host to do.
    pub pending: Vec<PendingAction>,
    /// When complete: the run must end (a repeat limit, a failed projection), and why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub terminated: Option<Value>,
    /// When complete: one bounded message to append to the next model request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy_message: Option<String>,
    /// A streamed turn whose stream broke: why. Its complete calls were decided as usual; a
    /// call still open when it broke is answered `stream_aborted`, having run nothing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream_error: Option<String>,
}

/// The host's report on one pending action.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Outcome {
    /// The pending action's id.
    pub id: String,
    /// A run's result (any JSON; text is shown as text).
    #[serde(default)]
    pub output: Option<Value>,
    /// A run that failed.
    #[serde(default)]
    pub error: Option<HostFailure>,
    /// An approval's answer.
    #[serde(default)]
    pub approve: Option<bool>,
    /// With `approve: true`: identical calls of the session run without asking again, where
    /// the grant offers it.
    #[serde(default)]
    pub remember: bool,
    /// With `approve: false`: why, shown to the model.
    #[serde(default)]
    pub reason: Option<String>,
    /// The approved arguments' fingerprint; when given it must be the action's.
    #[serde(default)]
    pub args_hash: Option<String>,
}

/// `POST /v1/sessions/{id}/turns/{turn}/outcomes`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Outcomes {
    /// One report per pending action answered.
    pub outcomes: Vec<Outcome>,
    /// As for a turn.
    #[serde(default)]
    pub wait_ms: Option<u64>,
}

/// `DELETE /v1/sessions/{id}`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SessionDeleted {
    /// The id of the deleted session.
    pub id: String,
    /// Turns still open that were cancelled.
    pub turns_cancelled: usize,
}
