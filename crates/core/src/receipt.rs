//! Receipts: the one canonical record of what happened to a call.

use crate::call::Rejection;
use crate::identity::SemanticKey;
use crate::observation::Observation;
use serde::{Deserialize, Serialize};
use std::fmt;

/// States of an intent in the journal.
///
/// `PROPOSED → RECORDED → DISPATCHED → ACKED | FAILED`,
/// `DISPATCHED → UNKNOWN → RECONCILING → ACKED | COMPENSATED | DEAD_LETTER`, and
/// `REJECTED_DUPLICATE`, `REJECTED_CONFLICT`. The legal transitions are the journal's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum IntentState {
    Proposed,
    Recorded,
    Dispatched,
    Acked,
    Failed,
    Unknown,
    Reconciling,
    Compensated,
    DeadLetter,
    RejectedDuplicate,
    RejectedConflict,
}

impl IntentState {
    pub const ALL: [IntentState; 11] = [
        Self::Proposed,
        Self::Recorded,
        Self::Dispatched,
        Self::Acked,
        Self::Failed,
        Self::Unknown,
        Self::Reconciling,
        Self::Compensated,
        Self::DeadLetter,
        Self::RejectedDuplicate,
        Self::RejectedConflict,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Proposed => "PROPOSED",
            Self::Recorded => "RECORDED",
            Self::Dispatched => "DISPATCHED",
            Self::Acked => "ACKED",
            Self::Failed => "FAILED",
            Self::Unknown => "UNKNOWN",
            Self::Reconciling => "RECONCILING",
            Self::Compensated => "COMPENSATED",
            Self::DeadLetter => "DEAD_LETTER",
            Self::RejectedDuplicate => "REJECTED_DUPLICATE",
            Self::RejectedConflict => "REJECTED_CONFLICT",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == text)
    }

    /// No further transition can leave this state.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::Acked
                | Self::Failed
                | Self::Compensated
                | Self::DeadLetter
                | Self::RejectedDuplicate
                | Self::RejectedConflict
        )
    }

    /// The outcome is not known: later writes that could conflict must wait.
    pub fn is_uncertain(self) -> bool {
        matches!(self, Self::Unknown | Self::Reconciling | Self::DeadLetter)
    }
}

impl fmt::Display for IntentState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One state change with its time (milliseconds since the Unix epoch).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimelineEntry {
    pub state: IntentState,
    pub at_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// How this receipt came to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Disposition {
    /// The tool ran for this call.
    Dispatched,
    /// The same intent was already acknowledged; its stored receipt is returned, nothing ran.
    Replayed,
    /// A memoized observation of a deterministic read was served.
    Memoized,
    /// Settled after a crash or an ambiguous outcome by reconciliation.
    Recovered,
    /// Refused before dispatch.
    Rejected,
}

/// What the call produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CallOutcome {
    /// The tool returned an observation. `observation.is_error` may still be true (a tool-level
    /// error the tool reported cleanly).
    Completed { observation: Observation },
    /// The tool failed; `applied` says whether an effect may have happened.
    Failed {
        message: String,
        uncertain: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        observation: Option<Observation>,
    },
    /// The call was refused before anything ran.
    Rejected { rejection: Rejection },
}

impl CallOutcome {
    pub fn is_error(&self) -> bool {
        match self {
            Self::Completed { observation } => observation.is_error,
            _ => true,
        }
    }
}

/// Timing of one call, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    /// From the start of the round to dispatch.
    pub queued_ms: u64,
    /// Time in the executor.
    pub run_ms: u64,
}

/// The canonical receipt of one call. It goes to the journal and to host events; the model sees
/// a bounded projection of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Receipt {
    pub call_id: String,
    pub index: usize,
    pub tool: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intent_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub semantic_key: Option<SemanticKey>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<IntentState>,
    /// The journal record's fence at the time of this receipt (its state revision).
    #[serde(default)]
    pub revision: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timeline: Vec<TimelineEntry>,
    pub disposition: Disposition,
    pub outcome: CallOutcome,
    #[serde(default)]
    pub timing: Timing,
}

impl Receipt {
    /// A receipt with no journal record behind it (yet): no intent, keys, state or timeline,
    /// and no timing. Callers fill in what they know with struct update syntax.
    pub fn new(
        call_id: impl Into<String>,
        index: usize,
        tool: impl Into<String>,
        disposition: Disposition,
        outcome: CallOutcome,
    ) -> Self {
        Self {
            call_id: call_id.into(),
            index,
            tool: tool.into(),
            intent_id: None,
            semantic_key: None,
            idempotency_key: None,
            state: None,
            revision: 0,
            timeline: Vec::new(),
            disposition,
            outcome,
            timing: Timing::default(),
        }
    }

    /// A receipt for a call refused before commit.
    pub fn rejected(index: usize, rejection: Rejection) -> Self {
        Self::new(
            rejection.call_id.clone(),
            index,
            rejection.tool_name.clone(),
            Disposition::Rejected,
            CallOutcome::Rejected { rejection },
        )
    }

    pub fn is_error(&self) -> bool {
        self.outcome.is_error()
    }
}
