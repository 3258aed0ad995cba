//! The intent journal: ring0's commit protocol.
//!
//! The model proposes; the log decides. Every mutating call is proposed under its semantic key
//! before dispatch, and the journal answers: record it (new), refuse it as a duplicate (already in
//! flight), replay the stored receipt (already acknowledged), or refuse it as a conflict. Every
//! transition afterwards is a compare-and-set on the record's fence, so a stale worker cannot
//! overwrite a newer decision, and the state machine in [`machine`] refuses illegal moves. The
//! invariant: for one user-intent scope, a canonical tool intent produces at most one external
//! effect, whatever the model retries, whatever ids it invents, whatever crashes or times out.
//!
//! What lives here:
//! - [`Journal`], the trait the kernel holds as `Arc<dyn Journal>`, and three backends that share
//!   every decision ([`decide_existing`] and the private `decide` module): [`MemoryJournal`],
//!   the durable [`SqliteJournal`] (WAL, `synchronous=FULL`, group commit, one writer process)
//!   and [`PostgresJournal`], one database for several replicas (claims, leases, fencing);
//! - [`mod@settle`]: outcome classification and settlement of ambiguous outcomes
//!   ([`begin_dispatch`], [`record_outcome`], [`settle()`], [`compensate`]) and a person's
//!   settlement of a dead letter ([`resolve_by_person`]);
//! - [`recovery`]: [`drive`] one owned record to a settled state, and [`recover`] everything a
//!   crash left open, from the log alone;
//! - [`memo`]: memoized observations of deterministic reads;
//! - [`hold`]: calls held for a person's approval, decided once ([`Journal::hold_decide`]) and
//!   waited for ([`Journal::hold_wait`]; on PostgreSQL, told by `NOTIFY` when any replica
//!   decided);
//! - [`shared`]: the decision state replicas share through a backend ([`SharedState`]:
//!   remembered approvals, rate buckets), offered by [`Journal::shared_state`];
//! - [`inspect`] and [`JournalReader`]: `ring0 journal ls | show`;
//! - [`sim`]: the deterministic simulation behind `ring0 journal sim` ([`run_simulation`]).
//!
//! The kernel's sequence for one mutating call: [`Journal::propose`]; on
//! [`ProposeDecision::Recorded`], [`begin_dispatch`] (RECORDED → DISPATCHED with the
//! pre-dispatch snapshot) before the executor is touched, then [`record_outcome`]
//! (→ ACKED | FAILED | UNKNOWN), and for UNKNOWN [`settle()`] by the tool's
//! [`ring0_core::Settlement`]. [`drive`] (or [`drive_bounded`]) is that sequence behind an [`Executor`]; the kernel runs
//! every committed call through it, so the protocol has one implementation. On start,
//! [`recover`]. Each open of a journal is a new incarnation ([`Journal::incarnation`], stamped on
//! every record it moves): recovery leaves calls in flight in the current incarnation to their
//! live owners, so it may run while new calls are being dispatched.
//!
//! Invariants: this crate never runs a tool of its own accord — dispatches and probes happen
//! only through an [`Executor`] its caller provides, and only as the state machine allows; it
//! never decides authorization; nothing in it reads a model's call id as identity.

pub mod clock;
mod decide;
pub mod deployment;
pub mod hold;
pub mod inspect;
pub mod limits;
pub mod machine;
pub mod memo;
pub mod memory;
pub mod postgres;
pub mod record;
pub mod recovery;
pub mod settle;
pub mod shared;
pub mod sim;
pub mod sqlite;

pub use clock::{Clock, ManualClock, SystemClock};
pub use decide::{attempt_idempotency_key, decide_existing};
pub use deployment::{Deployment, SharedJob, SharedSession, SharedTask};
pub use hold::{HeldCall, HoldDecided, HoldState};
pub use machine::{TransitionError, check, is_allowed};
pub use memory::MemoryJournal;
pub use postgres::{
    GroupStats, Migrated, PostgresJournal, PostgresOptions, PostgresReader, is_postgres_url,
};
pub use record::{ClientKey, IntentId, IntentRecord, Proposal, ProposeDecision, Transition};
pub use recovery::{Executor, RecoveryPolicy, RecoveryReport, drive, drive_bounded, recover};
pub use settle::{
    DispatchOutcome, FailureClass, PersonFinding, ProbeFinding, Settled, begin_dispatch,
    begin_reconcile, cancel_before_dispatch, compensate, record_outcome, resolve_by_person, settle,
};
pub use shared::{RateTaken, SharedState};
pub use sim::{SimReport, run_simulation};
pub use sqlite::{JournalReader, SqliteJournal, SqliteOptions, WriterStats};

use async_trait::async_trait;
use ring0_core::{Fingerprint, Observation, SemanticKey};
use std::path::PathBuf;

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
    #[error("intent {id} was dispatched {attempts} times, the most allowed")]
    AttemptsExhausted { id: IntentId, attempts: u32 },
    #[error("{what} is {bytes} bytes, more than the {max} allowed")]
    TooLarge {
        what: &'static str,
        bytes: usize,
        max: usize,
    },
    #[error("journal {path} is open for writing by another process{holder}")]
    Locked { path: PathBuf, holder: String },
    #[error("journal {path} is corrupt and was left untouched: {detail}")]
    Corrupt { path: PathBuf, detail: String },
    #[error("journal storage is full ({0}); nothing was recorded")]
    Full(String),
    #[error("journal {path} has schema version {found}; this build knows up to {supported}")]
    SchemaTooNew {
        path: PathBuf,
        found: i64,
        supported: i64,
    },
    #[error("invalid proposal: {0}")]
    Invalid(String),
    #[error("the journal is closed")]
    Closed,
    #[error("journal storage: {0}")]
    Storage(String),
}

/// The journal as the kernel sees it. Usable as `Arc<dyn Journal>`.
#[async_trait]
pub trait Journal: Send + Sync {
    /// Proposes an intent; see [`ProposeDecision`] for the answers. Durable before it returns.
    async fn propose(&self, proposal: Proposal) -> Result<ProposeDecision, JournalError>;

    /// Moves a record to a new state if its fence still equals `transition.expected_fence`.
    /// Durable before it returns.
    async fn transition(&self, transition: Transition) -> Result<IntentRecord, JournalError>;

    async fn get(&self, id: IntentId) -> Result<Option<IntentRecord>, JournalError>;

    /// The mutating record holding this semantic key, if any.
    async fn find_by_key(&self, key: &SemanticKey) -> Result<Option<IntentRecord>, JournalError>;

    /// Records in non-terminal states, oldest first: what recovery must re-examine. A backend
    /// several processes share returns those no live process holds, taking them for this one
    /// (and this process's own in flight, which recovery leaves to their tasks): see
    /// [`PostgresJournal`].
    async fn open_records(&self) -> Result<Vec<IntentRecord>, JournalError>;

    /// The most recent records, newest first, at most `limit` (and at most
    /// [`limits::RECENT_LIMIT_MAX`]).
    async fn recent(&self, limit: usize) -> Result<Vec<IntentRecord>, JournalError>;

    /// How many records are in each state (states without records left out), for operators'
    /// gauges. `None` from a backend that cannot count without reading every record.
    async fn count_by_state(
        &self,
    ) -> Result<Option<Vec<(ring0_core::IntentState, u64)>>, JournalError> {
        Ok(None)
    }

    /// Records that the intent's result reached its caller: an identical call without a key
    /// after this is a new attempt, where before it would be answered with this result. Never
    /// waits for the disk: the record is written with the next commit, and a delivery lost in a
    /// crash only makes the next identical call a replay (the safe side). Changes no state or
    /// fence. Backends without delivery records ignore it, so every identical call is a replay.
    fn mark_delivered(&self, id: IntentId) {
        let _ = id;
    }

    /// This open of the journal: records stamped with it (`IntentRecord::owner`) were moved by
    /// this process. `None` for a backend that does not track incarnations; recovery then
    /// treats every open record as left behind by a crash, so it must finish before new calls
    /// are dispatched.
    fn incarnation(&self) -> Option<u64> {
        None
    }

    /// The decision state this backend shares with the other processes that use it (remembered
    /// approvals, rate buckets: [`shared`]), or `None` for a backend no other process shares,
    /// whose host keeps that state in memory.
    fn shared_state(&self) -> Option<std::sync::Arc<dyn SharedState>> {
        None
    }

    /// A memoized observation of a deterministic read with this fingerprint, stored at most
    /// `max_age_ms` ago (see [`memo`]). Backends without memoization never have one.
    async fn memo_get(
        &self,
        fingerprint: &Fingerprint,
        max_age_ms: u64,
    ) -> Result<Option<Observation>, JournalError> {
        let _ = (fingerprint, max_age_ms);
        Ok(None)
    }

    /// Records a call held for a person's approval (see [`hold`]). Returns whether it was
    /// stored: a backend without held-call records keeps none, and a held call then lives
    /// only as long as the process that holds it.
    async fn hold_put(&self, held: &HeldCall) -> Result<bool, JournalError> {
        let _ = held;
        Ok(false)
    }

    /// The held call with this approval id, in whatever state.
    async fn hold_get(&self, approval_id: &str) -> Result<Option<HeldCall>, JournalError> {
        let _ = approval_id;
        Ok(None)
    }

    /// Held calls still PENDING, oldest first, at most [`hold::HOLDS_LISTED_MAX`] (their
    /// deadlines may have passed: [`HeldCall::is_pending_at`]).
    async fn holds_pending(&self) -> Result<Vec<HeldCall>, JournalError> {
        Ok(Vec::new())
    }

    /// Held calls whose intents may still wait for them, oldest first, at most
    /// [`hold::HOLDS_LISTED_MAX`]: the PENDING ones and, on a backend replicas share, the
    /// APPROVED ones before their deadline — a replica that died may have left one approved
    /// but not yet released, and whichever replica takes its intent releases it. Recovery
    /// leaves their intents alone.
    async fn holds_unreleased(&self) -> Result<Vec<HeldCall>, JournalError> {
        self.holds_pending().await
    }

    /// Decides a held call once: a compare-and-set from PENDING (see [`HoldDecided`]).
    async fn hold_decide(
        &self,
        approval_id: &str,
        state: HoldState,
    ) -> Result<HoldDecided, JournalError> {
        let _ = (approval_id, state);
        Ok(HoldDecided::NotFound)
    }

    /// Waits at most `wait` for the held call to be decided, and returns it decided; `None`
    /// when it is still PENDING after `wait` (or there is no such call). A decision made by
    /// another process or replica counts: this backend reads the record every
    /// [`limits::HOLD_POLL_MS`]; one shared by replicas is told, and reads it less often.
    /// A read that fails is tried again at the next poll, so a broken journal only makes the
    /// wait end undecided (the call is not run). Call it inside a tokio runtime.
    async fn hold_wait(&self, approval_id: &str, wait: std::time::Duration) -> Option<HeldCall> {
        let until = tokio::time::Instant::now() + wait;
        let poll = std::time::Duration::from_millis(limits::HOLD_POLL_MS);
        loop {
            if let Ok(Some(held)) = self.hold_get(approval_id).await
                && held.state != HoldState::Pending
            {
                return Some(held);
            }
            let now = tokio::time::Instant::now();
            if now >= until {
                return None;
            }
            tokio::time::sleep(poll.min(until - now)).await;
        }
    }

    /// Stores an observation of a deterministic read. Returns whether it was stored (an
    /// oversized observation, or a backend without memoization, stores nothing).
    async fn memo_put(
        &self,
        fingerprint: &Fingerprint,
        observation: &Observation,
    ) -> Result<bool, JournalError> {
        let _ = (fingerprint, observation);
        Ok(false)
    }
}
