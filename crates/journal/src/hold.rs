//! Held calls: a call waiting for a person's approval, recorded in the journal so that it
//! survives a restart of the process that held it.
//!
//! The approver that offers a held call records a [`HeldCall`] (`PENDING`) before it asks
//! anyone ([`crate::Journal::hold_put`]). A decision moves it out of `PENDING` exactly once
//! ([`crate::Journal::hold_decide`], a compare-and-set on the state): a second decision of the
//! same call — a replayed approval link, a second channel answering late — finds it decided and
//! is refused. A held call stays bound to its intent's identity (tool, scope, the call id that
//! proposed it, the fingerprint of its prepared arguments: [`HeldCall::holds`]), so recovery
//! leaves that intent RECORDED while the hold is pending instead of refusing it, and releasing it
//! after a restart runs that intent and nothing else.

use crate::record::IntentRecord;
use serde::{Deserialize, Serialize};

/// Most pending held calls [`crate::Journal::holds_pending`] returns (oldest first).
pub const HOLDS_LISTED_MAX: usize = 1024;
/// Longest summary of a held call stored with it (what a person is shown).
pub const HOLD_SUMMARY_BYTES_MAX: usize = 8 * 1024;
/// Largest prepared arguments (as JSON) stored with a held call.
pub const HOLD_ARGS_BYTES_MAX: usize = 64 * 1024;

/// Where a held call is in its life.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum HoldState {
    /// Waiting for a person.
    Pending,
    /// A person approved it, through `by` (a channel's name); with `for_session`, identical
    /// calls of the same session too, where the held call offered it ([`HeldCall::remember`]).
    Approved {
        by: String,
        #[serde(default, skip_serializing_if = "is_false")]
        for_session: bool,
    },
    /// A person refused it, through `by`, saying `reason`.
    Denied { by: String, reason: String },
    /// Its deadline passed, or the call ended without a decision.
    Expired { why: String },
}

impl HoldState {
    /// The state's name as stored and listed.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Pending => "PENDING",
            Self::Approved { .. } => "APPROVED",
            Self::Denied { .. } => "DENIED",
            Self::Expired { .. } => "EXPIRED",
        }
    }
}

/// A call held for a person's approval, as the journal keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldCall {
    /// The approval's id (`ap_…`), what every channel names it by.
    pub approval_id: String,
    pub tool: String,
    pub scope: String,
    /// The call id that proposed the intent (one of its record's `call_ids`).
    pub call_id: String,
    /// Who the call acts for.
    pub principal: String,
    /// The fingerprint of the exact prepared arguments: an approval binds to it.
    pub args_hash: String,
    /// What a person is shown (bounded by [`HOLD_SUMMARY_BYTES_MAX`]).
    pub summary: String,
    /// Offered "allow for this session": how long identical calls would then run without
    /// asking (the policy's wording). `None`: only this call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remember: Option<String>,
    /// The prepared arguments, when their JSON fits [`HOLD_ARGS_BYTES_MAX`] (a view can then
    /// render them, e.g. a patch as a diff); `None` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<serde_json::Value>,
    /// The channels it was offered on (`client`, `terminal`, `webhook`, `console`).
    pub channels: Vec<String>,
    pub created_ms: u64,
    /// It lapses at this time (Unix milliseconds).
    pub deadline_ms: u64,
    /// The journal incarnation that held it: while that process lives, its waiting round
    /// dispatches the call once approved; after it, whoever decides releases it.
    pub incarnation: u64,
    #[serde(flatten)]
    pub state: HoldState,
    /// When it left `PENDING`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_ms: Option<u64>,
}

impl HeldCall {
    /// Whether `record` is the intent this call holds: same tool and scope, proposed by its call
    /// id, with prepared arguments of its fingerprint.
    pub fn holds(&self, record: &IntentRecord) -> bool {
        record.tool == self.tool
            && record.scope == self.scope
            && record.call_ids.contains(&self.call_id)
            && ring0_core::Fingerprint::from_canonical_args(&record.tool, &record.canonical_args)
                .is_ok_and(|f| f.encode() == self.args_hash)
    }

    /// Whether it is still waiting at `now_ms`.
    pub fn is_pending_at(&self, now_ms: u64) -> bool {
        self.state == HoldState::Pending && now_ms < self.deadline_ms
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// What [`crate::Journal::hold_decide`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HoldDecided {
    /// It was pending: it is decided now, as returned.
    Decided(HeldCall),
    /// It was decided before (a decision is made once): as it stands.
    AlreadyDecided(HeldCall),
    /// Its deadline had passed: it is EXPIRED now, undecided.
    Lapsed(HeldCall),
    /// No held call has that id.
    NotFound,
}

/// Applies a decision to a stored held call at `now_ms`; the changed call, if any, is the one
/// to store.
pub(crate) fn decide(held: HeldCall, state: HoldState, now_ms: u64) -> HoldDecided {
    if held.state != HoldState::Pending || state == HoldState::Pending {
        return HoldDecided::AlreadyDecided(held);
    }
    let mut next = held;
    next.decided_ms = Some(now_ms);
    if now_ms >= next.deadline_ms {
        next.state = HoldState::Expired {
            why: "its deadline passed before a decision".into(),
        };
        return HoldDecided::Lapsed(next);
    }
    next.state = state;
    HoldDecided::Decided(next)
}

impl HoldDecided {
    /// The call to store, when the decision changed it.
    pub(crate) fn changed(&self) -> Option<&HeldCall> {
        match self {
            Self::Decided(h) | Self::Lapsed(h) => Some(h),
            Self::AlreadyDecided(_) | Self::NotFound => None,
        }
    }
}
