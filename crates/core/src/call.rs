//! Calls as they move through the pipeline: proposed by the model, prepared (or rejected) by the
//! kernel.

use crate::identity::Fingerprint;
use crate::limits::{
    REJECTION_BYTES_MAX, REJECTION_LIST_ITEMS_MAX, REJECTION_TEXT_BYTES_MAX, clip_with_length,
};
use crate::text::truncate_utf8;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::borrow::Cow;

/// The arguments exactly as the provider delivered them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ProposedArguments {
    /// A JSON value (Anthropic `input`, MCP `arguments`).
    Value(Value),
    /// JSON text (OpenAI `arguments` strings), parsed during preparation so that malformed text
    /// becomes a structured rejection instead of a parse failure of the whole turn.
    Text(String),
    /// The free-form input of an OpenAI custom tool call (`custom_tool_call` in Responses,
    /// `type: "custom"` in Chat Completions). Prepared as the argument object
    /// `{"input": TEXT}` ([`FREE_FORM_INPUT`]), so that a custom tool's schema (a string
    /// `input`, with the tool's grammar as its `pattern`) checks it like any other argument, and
    /// its result is rendered as a custom tool's output.
    FreeForm(String),
}

/// The one property a free-form input is prepared into: `{"input": TEXT}`.
pub const FREE_FORM_INPUT: &str = "input";

impl ProposedArguments {
    /// Whether these are the free-form input of a custom tool call.
    pub fn is_free_form(&self) -> bool {
        matches!(self, Self::FreeForm(_))
    }
}

/// One tool call as the model proposed it. Untrusted in every field.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProposedCall {
    /// Position in the model's output (source order).
    pub index: usize,
    /// The provider's call id: evidence for matching results, never identity.
    pub call_id: String,
    pub tool: String,
    pub arguments: ProposedArguments,
    /// The caller's explicit idempotency key, if it sent one (MCP `params.idempotencyKey` or
    /// `_meta["io.ring0/idempotency-key"]`, a library host's own key). It names one logical call
    /// for its principal: a retry under the same key with the same prepared arguments is
    /// answered with the recorded result, never run twice. Checked by the kernel against
    /// [`crate::limits::IDEMPOTENCY_KEY_BYTES_MAX`] (printable ASCII).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
}

/// Everything the model proposed in one turn.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Round {
    pub calls: Vec<ProposedCall>,
    /// Text the model produced besides its calls, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

/// A call that passed preparation: validated, defaulted, rewritten by policy, authorized, with its
/// conflict key resolved. Ordering, repeat detection and the journal all use these arguments —
/// the same the executor receives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PreparedCall {
    pub index: usize,
    pub call_id: String,
    pub tool: String,
    pub args: Value,
    /// RFC 8785 canonical text of `args`.
    pub canonical_args: String,
    pub fingerprint: Fingerprint,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conflict_key: Option<String>,
}

/// Why a call was not run. Serialized as the `status` of the rejection envelope the model sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RejectionKind {
    UnknownTool,
    InvalidJson,
    ValidationError,
    LimitExceeded,
    PolicyDenied,
    ApprovalRequired,
    ApprovalDenied,
    ApprovalTimeout,
    /// Over a rate limit; `retry_after_ms` says when a call would be accepted again.
    RateLimited,
    /// Refused by the round overseer; call again next round.
    StrategyConflict,
    RunsAlone,
    RepeatTerminated,
    /// This exact call (tool and prepared arguments) was repeated past the termination count;
    /// other calls still run.
    RepeatLimit,
    ToolChoiceViolation,
    /// Intent id bound to a different semantic key, or another canonicalizer version.
    IntentConflict,
    /// An earlier write of the scope has an unknown outcome (`intent_id` names it); writes it
    /// blocks are refused until it settles.
    BlockedByUnsettled,
    /// The idempotency key is malformed (too long, or not printable ASCII).
    InvalidIdempotencyKey,
    /// The idempotency key was used for a call with other arguments (`intent_id` names it).
    IdempotencyConflict,
    /// The same logical call is still running (`intent_id` names it); its result was not ready
    /// within the wait.
    InProgress,
    Cancelled,
    JournalUnavailable,
    RoundLimit,
    Unsettled,
    /// The model's stream ended in the middle of this call's arguments; nothing was run.
    StreamAborted,
}

impl RejectionKind {
    pub fn as_str(self) -> &'static str {
        // Must agree with the serde names above; a test checks every variant.
        match self {
            Self::UnknownTool => "unknown_tool",
            Self::InvalidJson => "invalid_json",
            Self::ValidationError => "validation_error",
            Self::LimitExceeded => "limit_exceeded",
            Self::PolicyDenied => "policy_denied",
            Self::ApprovalRequired => "approval_required",
            Self::ApprovalDenied => "approval_denied",
            Self::ApprovalTimeout => "approval_timeout",
            Self::RateLimited => "rate_limited",
            Self::StrategyConflict => "strategy_conflict",
            Self::RunsAlone => "runs_alone",
            Self::RepeatTerminated => "repeat_terminated",
            Self::RepeatLimit => "repeat_limit",
            Self::ToolChoiceViolation => "tool_choice_violation",
            Self::IntentConflict => "intent_conflict",
            Self::BlockedByUnsettled => "blocked_by_unsettled",
            Self::InvalidIdempotencyKey => "invalid_idempotency_key",
            Self::IdempotencyConflict => "idempotency_conflict",
            Self::InProgress => "in_progress",
            Self::Cancelled => "cancelled",
            Self::JournalUnavailable => "journal_unavailable",
            Self::RoundLimit => "round_limit",
            Self::Unsettled => "unsettled",
            Self::StreamAborted => "stream_aborted",
        }
    }

    /// What the model should do about it.
    pub fn advice(self) -> &'static str {
        match self {
            Self::UnknownTool => "call one of the listed tools instead",
            Self::InvalidJson | Self::ValidationError => "correct the arguments and call again",
            Self::LimitExceeded => "send smaller arguments",
            Self::PolicyDenied => "this call is not allowed as it is; do not retry it unchanged",
            Self::ApprovalDenied => {
                "the call was not approved; do not retry it unless the user asks"
            }
            Self::ApprovalRequired => {
                "nothing ran yet: a person must approve this call first; do what the message says, then call again with the same arguments"
            }
            Self::RateLimited => "wait retry_after_ms milliseconds, then call again",
            Self::ApprovalTimeout => "no decision was made in time; ask the user before retrying",
            Self::StrategyConflict | Self::RunsAlone => "call it again in the next round",
            Self::RepeatTerminated => "stop repeating this call",
            Self::RepeatLimit => {
                "stop repeating this exact call: its result will not change; other calls still run"
            }
            Self::ToolChoiceViolation => "follow the requested tool choice",
            Self::IntentConflict => "do not retry; the intent differs from the one recorded",
            Self::BlockedByUnsettled => {
                "an earlier write has an unknown outcome; wait until it is settled, then call again"
            }
            Self::InvalidIdempotencyKey => {
                "send an idempotency key of at most 256 printable ASCII characters, or none"
            }
            Self::IdempotencyConflict => {
                "this idempotency key belongs to another call; use a new key for new arguments"
            }
            Self::InProgress => "the same call is still running; call again later for its result",
            Self::Cancelled => "the round was cancelled",
            Self::JournalUnavailable => "the call was not run; try again later",
            Self::RoundLimit => "send fewer calls per round",
            Self::Unsettled => "the outcome is being settled; do not retry",
            Self::StreamAborted => "the call arrived incomplete; send it again whole",
        }
    }
}

/// One problem with one argument, located by a JSON pointer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FieldError {
    /// JSON pointer into the arguments (`""` is the whole object).
    pub loc: String,
    /// The offending value, truncated.
    pub input_value: Value,
    /// Machine-readable kind: `missing`, `type`, `additional_properties`, `enum`, …
    pub error_type: String,
    pub message: String,
    /// What would be accepted, when the schema says (type, enum values, bounds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_domain: Option<Value>,
}

/// A structured, model-correctable refusal of one call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rejection {
    pub status: RejectionKind,
    pub tool_name: String,
    pub call_id: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<FieldError>,
    /// Errors beyond the envelope's bound, counted rather than dropped silently.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub errors_omitted: usize,
    /// Closest known tool names, for `unknown_tool`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub suggestions: Vec<String>,
    /// For `rate_limited`: how long until the same call would be accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// The intent the refusal is about (`blocked_by_unsettled`, `idempotency_conflict`,
    /// `in_progress`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intent_id: Option<String>,
    pub advice: String,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl Rejection {
    pub fn new(
        status: RejectionKind,
        tool_name: impl Into<String>,
        call_id: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        let bounded = |s: String| match clip_with_length(&s, REJECTION_TEXT_BYTES_MAX) {
            Cow::Borrowed(_) => s,
            Cow::Owned(cut) => cut,
        };
        Self {
            status,
            tool_name: bounded(tool_name.into()),
            call_id: bounded(call_id.into()),
            message: bounded(message.into()),
            errors: Vec::new(),
            errors_omitted: 0,
            suggestions: Vec::new(),
            retry_after_ms: None,
            intent_id: None,
            advice: status.advice().to_string(),
        }
    }

    /// Adds field errors (`omitted` more were counted, not listed). The rejection stays within
    /// [`REJECTION_BYTES_MAX`]: errors that would not fit are moved to the count, last first.
    pub fn with_errors(mut self, errors: Vec<FieldError>, omitted: usize) -> Self {
        self.errors = errors;
        self.errors_omitted = omitted;
        self.fit();
        self
    }

    /// Adds suggested names, at most [`REJECTION_LIST_ITEMS_MAX`], each cut to
    /// [`REJECTION_TEXT_BYTES_MAX`].
    pub fn with_suggestions(mut self, suggestions: Vec<String>) -> Self {
        self.suggestions = suggestions
            .into_iter()
            .take(REJECTION_LIST_ITEMS_MAX)
            .map(|s| truncate_utf8(&s, REJECTION_TEXT_BYTES_MAX).to_string())
            .collect();
        self
    }

    pub fn with_retry_after_ms(mut self, retry_after_ms: u64) -> Self {
        self.retry_after_ms = Some(retry_after_ms);
        self
    }

    /// Names the intent the refusal is about.
    pub fn with_intent_id(mut self, intent_id: impl Into<String>) -> Self {
        self.intent_id =
            Some(truncate_utf8(&intent_id.into(), REJECTION_TEXT_BYTES_MAX).to_string());
        self
    }

    /// Serialized size in bytes.
    pub fn size_bytes(&self) -> usize {
        serde_json::to_vec(self).map_or(usize::MAX, |v| v.len())
    }

    /// Moves field errors to `errors_omitted`, last first, until the rejection fits
    /// [`REJECTION_BYTES_MAX`]. The other fields are bounded at construction, so an empty error
    /// list always fits.
    fn fit(&mut self) {
        while self.size_bytes() > REJECTION_BYTES_MAX && self.errors.pop().is_some() {
            self.errors_omitted += 1;
        }
    }

    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).expect("rejection serializes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejection_kind_names_match_their_serialized_form() {
        use RejectionKind::*;
        for k in [
            UnknownTool,
            InvalidJson,
            ValidationError,
            LimitExceeded,
            PolicyDenied,
            ApprovalRequired,
            ApprovalDenied,
            ApprovalTimeout,
            RateLimited,
            StrategyConflict,
            RunsAlone,
            RepeatTerminated,
            RepeatLimit,
            ToolChoiceViolation,
            IntentConflict,
            BlockedByUnsettled,
            InvalidIdempotencyKey,
            IdempotencyConflict,
            InProgress,
            Cancelled,
            JournalUnavailable,
            RoundLimit,
            Unsettled,
            StreamAborted,
        ] {
            assert_eq!(
                serde_json::to_value(k).unwrap(),
                Value::String(k.as_str().into())
            );
        }
    }
}
