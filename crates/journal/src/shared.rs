//! State that decides calls, kept by a journal backend that several replicas share, so that any
//! replica decides a call as any other would: remembered approvals ("allow for this session"),
//! rate buckets, and the approved pins of upstream definitions.
//!
//! A backend offers it through [`crate::Journal::shared_state`]; one that no other process
//! shares offers none, and its host keeps that state in memory. The authorizer
//! (`ring0-policy`) asks through this trait and never sees the database; a failed request is an
//! error its caller turns into the safe answer (no remembered approval: the person is asked
//! again; no rate cell: the call is refused).
//!
//! Keys are the caller's: opaque texts naming principal, session, tool and so on, at most
//! [`SHARED_KEY_BYTES_MAX`] bytes.

use crate::JournalError;
use async_trait::async_trait;
use std::time::Duration;

/// Longest key of a remembered approval or a rate bucket (4 KiB).
pub const SHARED_KEY_BYTES_MAX: usize = 4096;

/// Most remembered approvals a shared journal keeps (4,096, as an authorizer keeps in memory);
/// beyond it the oldest are forgotten, and a forgotten one is asked again.
pub const REMEMBERED_APPROVALS_MAX: i64 = 4096;

/// What taking a cell of a rate bucket answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateTaken {
    /// A cell was free and is taken.
    Allowed,
    /// No cell is free; one is after this wait.
    Refused { retry_after: Duration },
}

/// Most approved pins [`SharedState::pins_since`] returns at once (1,024); the caller asks again
/// from the last one's sequence number.
pub const PINS_LISTED_MAX: i64 = 1024;

/// An approved pin of an upstream definition, as replicas share it: the lock entry
/// `upstream` / `kind` / `name` = `pin` (see `ring0_mcp::pin`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinApproval {
    /// The upstream's alias.
    pub upstream: String,
    /// `tool` or `prompt`.
    pub kind: String,
    /// The server's own name of the tool or prompt.
    pub name: String,
    /// `sha256:…`.
    pub pin: String,
}

/// Decision state shared by the replicas of a deployment (see the module docs).
#[async_trait]
pub trait SharedState: Send + Sync {
    /// Takes one cell of the GCRA bucket `bucket`, which allows a burst of `burst` cells and
    /// frees one every `interval`, atomically for every replica, on the database's clock.
    async fn rate_take(
        &self,
        bucket: &str,
        burst: u32,
        interval: Duration,
    ) -> Result<RateTaken, JournalError>;

    /// Remembers that a person approved what `key` names, as approval `approval_id`, for `ttl`
    /// (`None`: until forgotten for room, [`REMEMBERED_APPROVALS_MAX`]).
    async fn approval_remember(
        &self,
        key: &str,
        approval_id: &str,
        ttl: Option<Duration>,
    ) -> Result<(), JournalError>;

    /// The approval remembered under `key`, if it has not lapsed.
    async fn approval_remembered(&self, key: &str) -> Result<Option<String>, JournalError>;

    /// Publishes approved pins (a replica's lock entries): each one not yet shared gets the next
    /// sequence number; one already shared keeps its own.
    async fn pins_publish(&self, pins: &[PinApproval]) -> Result<(), JournalError>;

    /// Approved pins published after sequence number `after`, in order, at most
    /// [`PINS_LISTED_MAX`], each with its sequence number. For one definition the pin with the
    /// highest number is the one approved now.
    async fn pins_since(&self, after: i64) -> Result<Vec<(i64, PinApproval)>, JournalError>;
}

/// Refuses a key longer than [`SHARED_KEY_BYTES_MAX`].
pub(crate) fn check_key(key: &str) -> Result<(), JournalError> {
    if key.len() > SHARED_KEY_BYTES_MAX {
        return Err(JournalError::Invalid(format!(
            "a shared-state key of {} bytes; at most {SHARED_KEY_BYTES_MAX}",
            key.len()
        )));
    }
    Ok(())
}
