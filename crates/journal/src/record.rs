//! Journal records and the messages that change them.

use ring0_core::receipt::TimelineEntry;
use ring0_core::{IntentState, Receipt, SemanticKey};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

/// An intent's id: a UUIDv7 (time-ordered), chosen by the journal unless the host supplies one.
pub type IntentId = Uuid;

/// A proposal to record one intent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Proposal {
    /// A host-supplied id. Re-proposing it with a different semantic key is a conflict.
    pub intent_id: Option<IntentId>,
    pub semantic_key: SemanticKey,
    pub scope: String,
    pub attempt_epoch: u64,
    pub tool: String,
    /// RFC 8785 text of the prepared arguments.
    pub canonical_args: String,
    /// The provider's call id: evidence, stored for inspection, never used for identity.
    pub call_id: String,
    /// Mutating intents are deduplicated by semantic key. Reads are recorded for the audit trail
    /// only: running the same read twice is not a second effect, and must not replay stale data.
    pub mutating: bool,
    /// The caller's explicit idempotency key, when it sent one: then that key, not the scope,
    /// finds the intent again (see [`ClientKey`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_key: Option<ClientKey>,
    /// Who the call acts for (the request's principal), recorded with the intent for
    /// inspection and recovery. `None` only from a host that names none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
}

/// A caller's explicit idempotency key, scoped to its principal. A proposal under a key that
/// names a live record of the same tool and arguments is decided by that record (replay, wait);
/// under a key that names another call it is an [`ProposeDecision::KeyConflict`]. A key is
/// forgotten `retention_ms` after its record was created, and a principal keeps at most
/// [`crate::limits::CLIENT_KEYS_PER_PRINCIPAL_MAX`] keys, the oldest forgotten first.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ClientKey {
    pub principal: String,
    pub key: String,
    /// How long the key is kept (not stored with the record: the proposal's retention decides).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub retention_ms: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// A compare-and-set state change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Transition {
    pub id: IntentId,
    pub expected_fence: u64,
    pub to: IntentState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Stored with the record (the final receipt on ACKED, FAILED, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receipt: Option<Receipt>,
    /// The pre-dispatch snapshot a reconciliation probe compares against (on DISPATCHED).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<Value>,
}

impl Transition {
    pub fn to(record: &IntentRecord, to: IntentState) -> Self {
        Self {
            id: record.id,
            expected_fence: record.fence,
            to,
            note: None,
            receipt: None,
            snapshot: None,
        }
    }

    pub fn note(mut self, note: impl Into<String>) -> Self {
        self.note = Some(note.into());
        self
    }

    pub fn receipt(mut self, receipt: Receipt) -> Self {
        self.receipt = Some(receipt);
        self
    }

    pub fn snapshot(mut self, snapshot: Option<Value>) -> Self {
        self.snapshot = snapshot;
        self
    }
}

/// One intent as the journal holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IntentRecord {
    pub id: IntentId,
    pub semantic_key: SemanticKey,
    pub scope: String,
    pub attempt_epoch: u64,
    pub tool: String,
    pub canonical_args: String,
    /// Every call id that proposed this intent, in order (bounded).
    pub call_ids: Vec<String>,
    /// Derived from the semantic key and epoch; stored before dispatch.
    pub idempotency_key: String,
    pub mutating: bool,
    /// Incremented by every transition; transitions must name the current value.
    pub fence: u64,
    /// Number of times it was dispatched.
    pub attempts: u32,
    pub state: IntentState,
    pub timeline: Vec<TimelineEntry>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receipt: Option<Receipt>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<Value>,
    /// The journal incarnation (one per open of the journal) that made the latest change.
    /// Recovery leaves records in flight in the current incarnation to their live owners: only
    /// a record moved by an earlier incarnation can have been left behind by a crash.
    #[serde(default)]
    pub owner: u64,
    /// Which attempt of its logical call this record is (0 for the first). A call without an
    /// explicit key whose predecessor's result was delivered starts the next attempt under the
    /// same semantic key, with its own provider idempotency key.
    #[serde(default)]
    pub attempt: u32,
    /// The result reached the caller ([`crate::Journal::mark_delivered`]).
    #[serde(default, skip_serializing_if = "is_false")]
    pub delivered: bool,
    /// The caller's explicit key (principal and key; the retention is the proposal's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_key: Option<ClientKey>,
    /// Who the call acts for, as its proposal named it (`None` in records written before
    /// principals were recorded, and from hosts that name none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
}

impl ClientKey {
    /// The principal and caller's key of a record from its two stored columns: the principal
    /// column holds the call's principal whether or not a key was sent; a key without a
    /// principal is malformed (`None`).
    pub(crate) fn from_columns(
        principal: Option<String>,
        key: Option<String>,
    ) -> Option<(Option<String>, Option<ClientKey>)> {
        match (principal, key) {
            (Some(principal), Some(key)) => Some((
                Some(principal.clone()),
                Some(ClientKey {
                    principal,
                    key,
                    retention_ms: 0,
                }),
            )),
            (principal, None) => Some((principal, None)),
            (None, Some(_)) => None,
        }
    }
}

/// The principal column of a record: its principal, or its caller's key's.
pub(crate) fn principal_column(r: &IntentRecord) -> Option<&str> {
    r.principal
        .as_deref()
        .or(r.client_key.as_ref().map(|k| k.principal.as_str()))
}

/// Most call ids remembered per record.
pub const CALL_IDS_PER_RECORD_MAX: usize = 32;

/// The journal's answer to a proposal.
#[derive(Debug, Clone, PartialEq)]
pub enum ProposeDecision {
    /// New intent, now RECORDED: the caller may dispatch it.
    Recorded(IntentRecord),
    /// The same intent is RECORDED, DISPATCHED, UNKNOWN or RECONCILING: wait, never dispatch.
    Duplicate(IntentRecord),
    /// The same intent was ACKED: here is its stored receipt, nothing runs.
    Replay(IntentRecord),
    /// The intent cannot be recorded: a host id bound to another key, another canonicalizer
    /// version, or a settled state that a re-proposal may not reopen.
    Conflict {
        reason: String,
        existing: Option<IntentRecord>,
    },
    /// The caller's idempotency key names a record of another tool or other arguments.
    KeyConflict(IntentRecord),
}

impl IntentRecord {
    /// SHA-256 (hex) of the canonical arguments: how the durable backend names spilled arguments.
    pub fn args_sha256(&self) -> String {
        crate::decide::sha256_hex(self.canonical_args.as_bytes())
    }

    /// The call id of the latest proposal of this intent.
    pub fn last_call_id(&self) -> &str {
        self.call_ids.last().map_or("", String::as_str)
    }

    /// When the record was created (its first timeline entry).
    pub fn created_ms(&self) -> u64 {
        self.timeline.first().map_or(0, |e| e.at_ms)
    }

    /// The state this record entered before the current one, if any.
    pub fn previous_state(&self) -> Option<ring0_core::IntentState> {
        let n = self.timeline.len();
        (n >= 2).then(|| self.timeline[n - 2].state)
    }
}

impl ProposeDecision {
    /// The record the decision is about, if any.
    pub fn record(&self) -> Option<&IntentRecord> {
        match self {
            Self::Recorded(r) | Self::Duplicate(r) | Self::Replay(r) | Self::KeyConflict(r) => {
                Some(r)
            }
            Self::Conflict { existing, .. } => existing.as_ref(),
        }
    }

    /// The decision's name as it appears in receipts and listings.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Recorded(_) => "recorded",
            Self::Duplicate(_) => "duplicate",
            Self::Replay(_) => "replay",
            Self::Conflict { .. } => "conflict",
            Self::KeyConflict(_) => "key_conflict",
        }
    }
}
