//! State that decides calls, kept by a journal backend that several replicas share, so that any
//! replica decides a call as any other would: remembered approvals ("allow for this session"),
//! rate buckets, the approved pins of upstream definitions, and the tools each conversation
//! loaded in the catalog's search mode (its loaded set, listed by whichever replica it reaches).
//!
//! A backend offers it through [`crate::Journal::shared_state`]; one that no other process
//! shares offers none, and its host keeps that state in memory. The authorizer
//! (`ring0-policy`) asks through this trait and never sees the database; a failed request is an
//! error its caller turns into the safe answer (no remembered approval: the person is asked
//! again; no rate cell: the call is refused).
//!
//! Keys are the caller's: opaque texts naming principal, session, tool and so on, at most
//! [`SHARED_KEY_BYTES_MAX`] bytes.
//!
//! A loaded set grows only by [`SharedState::loaded_add`], which decides every name under the
//! set's lock with [`loaded_decide`] (the rule an in-memory set follows too): a name already
//! there stays, a full set refuses, and the caller's `fits` (its listing budget, which needs
//! the tools' schemas the journal never sees) is asked with the names the set holds at that
//! moment, so two loads through two replicas cannot both squeeze past the budget.

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

/// Most names one shared loaded set holds (128, the kernel's `LOADED_TOOLS_MAX`); a caller
/// asking for more is refused as invalid.
pub const LOADED_NAMES_MAX: usize = 128;

/// Longest name in a loaded set (128 bytes, a tool name's bound).
pub const LOADED_NAME_BYTES_MAX: usize = ring0_core::limits::TOOL_NAME_BYTES_MAX;

/// Most loaded sets a shared journal keeps (4,096, as a host keeps in memory); beyond it the
/// least recently used are forgotten, and a forgotten set's tools are loaded again.
pub const LOADED_SETS_MAX: i64 = 4096;

/// A loaded set neither read nor added to for this long is forgotten (1 h, the kernel's scope
/// idle expiry).
pub const LOADED_SET_IDLE_MS: u64 = 60 * 60 * 1000;

/// What adding one name to a loaded set did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadedAdded {
    /// The name is new to the set, and is now at its end.
    Added,
    /// The set already held it.
    Present,
    /// The set holds its most names already.
    OverLimit,
    /// The caller's `fits` refused it.
    OverBudget,
}

/// Whether one more name fits a loaded set: asked with the names the set holds (before it) and
/// the name, under the set's lock.
pub type LoadedFits = Box<dyn FnMut(&[String], &str) -> bool + Send>;

/// What [`SharedState::loaded_add`] did: one answer per name asked, in order, and the set's
/// names after it, in load order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadedAdd {
    pub added: Vec<LoadedAdded>,
    pub names: Vec<String>,
}

/// Adds `adding` to the loaded set `names` in order, at most `names_max` names in all, each
/// only when `fits` allows it: the one rule of a loaded set, shared or in memory.
pub fn loaded_decide(
    names: &mut Vec<String>,
    adding: &[String],
    names_max: usize,
    fits: &mut dyn FnMut(&[String], &str) -> bool,
) -> Vec<LoadedAdded> {
    adding
        .iter()
        .map(|name| {
            if names.iter().any(|n| n == name) {
                LoadedAdded::Present
            } else if names.len() >= names_max {
                LoadedAdded::OverLimit
            } else if !fits(names, name) {
                LoadedAdded::OverBudget
            } else {
                names.push(name.clone());
                LoadedAdded::Added
            }
        })
        .collect()
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

    /// Adds `names` to the loaded set of (`principal`, `scope`), made empty on first use or
    /// after [`LOADED_SET_IDLE_MS`] unused, by [`loaded_decide`] under the set's lock, with at
    /// most `names_max` names (at most [`LOADED_NAMES_MAX`]); see the module docs.
    async fn loaded_add(
        &self,
        principal: &str,
        scope: &str,
        names: &[String],
        names_max: usize,
        fits: LoadedFits,
    ) -> Result<LoadedAdd, JournalError>;

    /// The names of the loaded set of (`principal`, `scope`), in load order (none for a set
    /// never used or idle for [`LOADED_SET_IDLE_MS`]); a set read is a set used.
    async fn loaded_names(&self, principal: &str, scope: &str)
    -> Result<Vec<String>, JournalError>;
}

/// Refuses a loaded set's request beyond the bounds: `names_max` over [`LOADED_NAMES_MAX`],
/// more names than that at once, or a name over [`LOADED_NAME_BYTES_MAX`].
pub(crate) fn check_loaded(names: &[String], names_max: usize) -> Result<(), JournalError> {
    if names_max > LOADED_NAMES_MAX || names.len() > LOADED_NAMES_MAX {
        return Err(JournalError::Invalid(format!(
            "a loaded set of {} names, {} asked at once; at most {LOADED_NAMES_MAX}",
            names_max,
            names.len()
        )));
    }
    if let Some(long) = names.iter().find(|n| n.len() > LOADED_NAME_BYTES_MAX) {
        return Err(JournalError::Invalid(format!(
            "a loaded tool name of {} bytes; at most {LOADED_NAME_BYTES_MAX}",
            long.len()
        )));
    }
    Ok(())
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
