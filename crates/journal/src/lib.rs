//! The intent journal: ring0's commit protocol.
//!
//! The model proposes; the log decides. Every mutating call is proposed under its semantic key
//! before dispatch, and the journal answers: record it (new), refuse it as a duplicate (already in
//! flight), replay the stored receipt (already acknowledged), or refuse it as a conflict. Every
//! transition afterwards is a compare-and-set on the record's fence, so a stale worker cannot
//! overwrite a newer decision, and the state machine in [`machine`] refuses illegal moves.
//!
//! This crate owns the [`Journal`] trait, the state machine and the backends. It must never run a
//! tool or decide authorization: it records and decides identity, nothing else.

pub mod machine;
pub mod memory;
pub mod record;

pub use machine::{TransitionError, is_allowed};
pub use memory::MemoryJournal;
pub use record::{IntentId, IntentRecord, Proposal, ProposeDecision, Transition};

use async_trait::async_trait;
use ring0_core::SemanticKey;

/// Errors of a journal backend. A proposal that fails with any of these was not recorded, and the
/// caller must not dispatch (fail closed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JournalError {
    #[error("intent {0} not found")]
    NotFound(IntentId),
    #[error(transparent)]
    Transition(#[from] TransitionError),
    #[error("stale fence for intent {id}: expected {expected}, record is at {actual}")]
    StaleFence {
        id: IntentId,
        expected: u64,
        actual: u64,
    },
    #[error("journal storage: {0}")]
    Storage(String),
}

/// The journal as the kernel sees it.
#[async_trait]
pub trait Journal: Send + Sync {
    /// Proposes an intent; see [`ProposeDecision`] for the answers.
    async fn propose(&self, proposal: Proposal) -> Result<ProposeDecision, JournalError>;

    /// Moves a record to a new state if its fence still equals `transition.expected_fence`.
    async fn transition(&self, transition: Transition) -> Result<IntentRecord, JournalError>;

    async fn get(&self, id: IntentId) -> Result<Option<IntentRecord>, JournalError>;

    /// The mutating record holding this semantic key, if any.
    async fn find_by_key(&self, key: &SemanticKey) -> Result<Option<IntentRecord>, JournalError>;

    /// Records in non-terminal states, oldest first: what recovery must re-examine.
    async fn open_records(&self) -> Result<Vec<IntentRecord>, JournalError>;

    /// The most recent records, newest first, at most `limit`.
    async fn recent(&self, limit: usize) -> Result<Vec<IntentRecord>, JournalError>;
}
