//! Driving one intent through the protocol, and recovery after a crash.
//!
//! [`drive`] takes a record the caller owns (RECORDED from a proposal, or an open record found
//! at recovery) and runs it to a settled state through an [`Executor`]: dispatch, record the
//! outcome, reconcile an ambiguous one. [`recover`] is what a host runs when it opens a journal:
//! it reads the open records from the log alone — no planner memory, no model — marks the ones
//! that were in flight (DISPATCHED) UNKNOWN, and drives every open record to a settled state.
//!
//! The kernel's online path is the same sequence: `propose` → `Recorded` → [`drive`].

use crate::limits::ATTEMPTS_MAX;
use crate::record::{IntentId, IntentRecord, Transition};
use crate::settle::{
    DispatchOutcome, Settled, begin_dispatch, begin_reconcile, record_outcome, settle,
};
use crate::{Journal, JournalError};
use async_trait::async_trait;
use futures::future::BoxFuture;
use ring0_core::{IntentState, ProbeFinding, Settlement};
use serde_json::Value;

/// What the protocol needs from the world: the tool registry's settlement kind, the executor
/// and the tool's probe.
#[async_trait]
pub trait Executor: Send + Sync {
    /// How this record's tool settles an ambiguous outcome (from the tool's spec). A tool the
    /// registry no longer knows should answer `Settlement::None`.
    fn settlement(&self, record: &IntentRecord) -> Settlement;

    /// Whether this process has the record's tool at all. Recovery leaves the records of tools
    /// it does not have exactly as they are (see [`RecoveryReport::deferred`]), for a process
    /// that has the tool — a `ring0` command without the upstream servers `ring0 serve` connects
    /// to must not settle their calls by default.
    fn knows(&self, _record: &IntentRecord) -> bool {
        true
    }

    /// A nullipotent snapshot of what the intent will change, taken before dispatch, for the
    /// probe to compare against. `None` when the tool has no probe.
    async fn snapshot(&self, record: &IntentRecord) -> Option<Value>;

    /// Runs the intent (with `record.idempotency_key` when the provider takes one).
    async fn dispatch(&self, record: &IntentRecord) -> DispatchOutcome;

    /// The tool's nullipotent reconciliation probe. Called only for `Settlement::Probe`.
    async fn probe(&self, record: &IntentRecord) -> ProbeFinding;

    /// Runs `settle`, [`recover`]'s settlement of one record it found open (`record`, as found),
    /// and returns its result: a host wraps it to observe what recovery did with each record
    /// (the kernel opens a span). The default runs it as is.
    fn recovering<'a>(
        &'a self,
        record: &'a IntentRecord,
        settle: BoxFuture<'a, Result<IntentRecord, JournalError>>,
    ) -> BoxFuture<'a, Result<IntentRecord, JournalError>> {
        let _ = record;
        settle
    }
}

/// Most protocol steps [`drive`] takes for one record. Each dispatch costs at most four steps
/// and dispatches are bounded by [`ATTEMPTS_MAX`], so this is never reached by a correct
/// backend; it turns a backend bug into an error instead of a hang.
const DRIVE_STEPS_MAX: u32 = 4 * ATTEMPTS_MAX + 8;

/// Runs an owned record to a settled state: ACKED, FAILED, DEAD_LETTER (or whatever terminal
/// state it is already in). A DISPATCHED record given here is one a crash left in flight: it
/// goes to UNKNOWN and is reconciled, never dispatched again blindly. Dispatches are bounded by
/// the record's [`ATTEMPTS_MAX`] alone; [`drive_bounded`] takes a tighter budget.
pub async fn drive(
    journal: &dyn Journal,
    exec: &dyn Executor,
    record: IntentRecord,
) -> Result<IntentRecord, JournalError> {
    drive_bounded(journal, exec, record, u32::MAX).await
}

/// [`drive`] making at most `dispatches_max` dispatches in this call. When settlement would
/// dispatch once more (a same-key re-dispatch, or a probe that found the world unchanged) and
/// the budget is spent, the record goes to DEAD_LETTER instead — a caller answering a model
/// in real time cannot retry forever, and a person settles what is left.
pub async fn drive_bounded(
    journal: &dyn Journal,
    exec: &dyn Executor,
    record: IntentRecord,
    dispatches_max: u32,
) -> Result<IntentRecord, JournalError> {
    let mut r = record;
    let mut dispatches: u32 = 0;
    for _ in 0..DRIVE_STEPS_MAX {
        r = match r.state {
            IntentState::Recorded if dispatches >= dispatches_max => return Ok(r),
            IntentState::Recorded => {
                let snapshot = exec.snapshot(&r).await;
                let dispatched = begin_dispatch(journal, &r, snapshot).await?;
                dispatches += 1;
                dispatch_once(journal, exec, dispatched).await?
            }
            IntentState::Dispatched => {
                let t = Transition::to(&r, IntentState::Unknown)
                    .note("in flight when the process stopped");
                journal.transition(t).await?
            }
            IntentState::Unknown | IntentState::Reconciling => {
                let kind = exec.settlement(&r);
                let reconciling = begin_reconcile(journal, &r).await?;
                let spent = dispatches >= dispatches_max;
                if spent && kind == Settlement::IdempotencyKey {
                    return budget_spent(journal, &reconciling).await;
                }
                let finding = match kind {
                    Settlement::Probe => Some(exec.probe(&reconciling).await),
                    _ => None,
                };
                if spent && finding == Some(ProbeFinding::Unchanged) {
                    return budget_spent(journal, &reconciling).await;
                }
                match settle(journal, &reconciling, kind, finding).await? {
                    Settled::Redispatch(d) => {
                        dispatches += 1;
                        dispatch_once(journal, exec, d).await?
                    }
                    Settled::Resumable(x) => x,
                    Settled::Acked(x) | Settled::DeadLetter(x) => return Ok(x),
                }
            }
            _ => return Ok(r),
        };
    }
    Err(JournalError::Storage(format!(
        "intent {} did not settle within {DRIVE_STEPS_MAX} protocol steps (state {})",
        r.id, r.state
    )))
}

async fn budget_spent(
    journal: &dyn Journal,
    reconciling: &IntentRecord,
) -> Result<IntentRecord, JournalError> {
    let t = Transition::to(reconciling, IntentState::DeadLetter)
        .note("re-dispatch budget spent: a person decides");
    journal.transition(t).await
}

async fn dispatch_once(
    journal: &dyn Journal,
    exec: &dyn Executor,
    dispatched: IntentRecord,
) -> Result<IntentRecord, JournalError> {
    let outcome = exec.dispatch(&dispatched).await;
    record_outcome(journal, &dispatched, outcome).await
}

/// What recovery does with records a crash left RECORDED (never dispatched).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecoveryPolicy {
    /// `true` (the default): dispatch them now, from the log. `false`: cancel them
    /// (RECORDED → REJECTED_CONFLICT), so a later proposal of the same intent records it anew;
    /// either way nothing is dispatched twice.
    pub resume_recorded: bool,
}

impl Default for RecoveryPolicy {
    fn default() -> Self {
        Self {
            resume_recorded: true,
        }
    }
}

/// What recovery found and did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RecoveryReport {
    /// Open records found in the log.
    pub examined: usize,
    /// DISPATCHED records (in flight at the crash) moved to UNKNOWN.
    pub in_flight: usize,
    /// RECORDED records dispatched from the log.
    pub resumed: usize,
    /// RECORDED records cancelled (policy `resume_recorded = false`).
    pub cancelled: usize,
    /// The records as recovery left them.
    pub settled: Vec<IntentRecord>,
    /// Records another writer moved while recovery looked at them (stale fence): left alone.
    pub skipped: Vec<(IntentId, JournalError)>,
    /// Open records this very incarnation moved last (a live task of this process owns them):
    /// left alone.
    pub live: usize,
    /// Records of tools this process does not have ([`Executor::knows`]): left exactly as they
    /// are, still open, for a process that has the tool to settle.
    pub deferred: Vec<IntentRecord>,
    /// RECORDED records whose call waits for a person's approval ([`crate::hold`]): left
    /// RECORDED for the decision to release.
    pub held: usize,
}

impl RecoveryReport {
    /// Records recovery left unsettled (UNKNOWN, RECONCILING or DISPATCHED): none unless a
    /// record was skipped.
    pub fn unsettled(&self) -> impl Iterator<Item = &IntentRecord> {
        self.settled.iter().filter(|r| {
            matches!(
                r.state,
                IntentState::Unknown | IntentState::Reconciling | IntentState::Dispatched
            )
        })
    }
}

/// Re-examines every open record from the log alone and settles it.
///
/// First every DISPATCHED record is marked UNKNOWN (so a crash during recovery still leaves the
/// log saying so), then every open record is driven: UNKNOWN and RECONCILING through
/// settlement, RECORDED by the policy. Storage errors stop recovery; a stale fence (another
/// writer got there first) skips that record.
///
/// A record the journal's current incarnation ([`Journal::incarnation`]) moved last belongs to
/// a live task of this process and is left alone, whatever its state: probing a DISPATCHED one
/// before its request lands would let a second dispatch through, and dispatching a RECORDED one
/// its proposer is about to dispatch would race it. Only records an earlier incarnation (a
/// process that stopped, or a replica whose lease lapsed) left open are settled here — as a
/// shared journal's take returns them. Without incarnations (a backend that returns `None`)
/// run recovery before any new call is dispatched.
pub async fn recover(
    journal: &dyn Journal,
    exec: &dyn Executor,
    policy: RecoveryPolicy,
) -> Result<RecoveryReport, JournalError> {
    let mut report = RecoveryReport::default();
    let me = journal.incarnation();
    let open = journal.open_records().await?;
    report.examined = open.len();
    let holds = journal.holds_pending().await?;
    let mut queue = Vec::with_capacity(open.len());
    for r in open {
        if r.state == IntentState::Recorded && holds.iter().any(|h| h.holds(&r)) {
            report.held += 1;
            continue;
        }
        if Some(r.owner) == me {
            report.live += 1;
            continue;
        }
        if !exec.knows(&r) {
            report.deferred.push(r);
            continue;
        }
        if r.state == IntentState::Dispatched {
            let t =
                Transition::to(&r, IntentState::Unknown).note("in flight when the process stopped");
            match skip_stale(journal.transition(t).await, r.id, &mut report)? {
                Some(u) => {
                    report.in_flight += 1;
                    queue.push(u);
                }
                None => continue,
            }
        } else {
            queue.push(r);
        }
    }
    for r in queue {
        let settle: BoxFuture<'_, Result<IntentRecord, JournalError>> = match r.state {
            IntentState::Recorded if !policy.resume_recorded => {
                report.cancelled += 1;
                let t = Transition::to(&r, IntentState::RejectedConflict)
                    .note("cancelled at recovery before dispatch; nothing was sent");
                journal.transition(t)
            }
            IntentState::Recorded => {
                report.resumed += 1;
                Box::pin(drive(journal, exec, r.clone()))
            }
            _ => Box::pin(drive(journal, exec, r.clone())),
        };
        let result = exec.recovering(&r, settle).await;
        if let Some(done) = skip_stale(result, r.id, &mut report)? {
            report.settled.push(done);
        }
    }
    Ok(report)
}

fn skip_stale(
    result: Result<IntentRecord, JournalError>,
    id: IntentId,
    report: &mut RecoveryReport,
) -> Result<Option<IntentRecord>, JournalError> {
    match result {
        Ok(r) => Ok(Some(r)),
        Err(e @ (JournalError::StaleFence { .. } | JournalError::Transition(_))) => {
            report.skipped.push((id, e));
            Ok(None)
        }
        Err(e) => Err(e),
    }
}
