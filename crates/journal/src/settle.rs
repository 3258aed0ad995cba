//! Settlement: what an outcome means, and how an ambiguous one is resolved.
//!
//! The kernel calls these functions around every dispatch; recovery calls them for records a
//! crash left open. Each is a short sequence of compare-and-set transitions through the
//! [`Journal`] trait, so they work the same on every backend.
//!
//! - [`begin_dispatch`]: RECORDED → DISPATCHED, storing the pre-dispatch snapshot.
//! - [`record_outcome`]: DISPATCHED → ACKED on success; FAILED only for the errors on the
//!   "definitely not applied" allow-list ([`FailureClass::definitely_not_applied`]); UNKNOWN for
//!   everything else (timeouts, connection loss after send, stream aborts, unknown errors).
//! - [`settle`]: UNKNOWN → RECONCILING → by the tool's [`Settlement`]:
//!   `IdempotencyKey` → DISPATCHED again with the *same* stored key (the provider deduplicates);
//!   `Probe` → the nullipotent probe's [`ProbeFinding`] decides: postcondition holds → ACKED with a
//!   synthetic receipt; unchanged since the snapshot → RECORDED (safe to dispatch); anything
//!   else → DEAD_LETTER; `None` → DEAD_LETTER for a person.
//! - [`compensate`]: a declared compensating action undid an effect → COMPENSATED.
//! - [`resolve_by_person`]: a person says what became of a DEAD_LETTER (or UNKNOWN) record's
//!   effect: applied → ACKED with a receipt saying so (an identical retry is replayed), not
//!   applied → FAILED (an identical retry runs).
//!
//! There is no path from UNKNOWN to a fresh dispatch: the state machine refuses it, and nothing
//! here takes a model's proposal as input.
//!
//! A probe's "unchanged" finding is only sound once the original request can no longer land (the
//! executor's timeout cancelled it, or the connection closed before the provider acted). Tools
//! whose providers may apply a request late must not declare `Probe`.

use crate::limits::ATTEMPTS_MAX;
use crate::record::{IntentRecord, Transition};
use crate::{Journal, JournalError};
use ring0_core::receipt::{CallOutcome, Disposition};
pub use ring0_core::{FailureClass, ProbeFinding};
use ring0_core::{IntentState, Observation, Receipt, Settlement};
use serde_json::{Value, json};

/// What an executor reports for one dispatch.
#[derive(Debug, Clone, PartialEq)]
pub enum DispatchOutcome {
    /// The tool answered: the effect (if any) is applied.
    Applied(Receipt),
    /// The tool failed; `class` decides between FAILED and UNKNOWN.
    Failed {
        class: FailureClass,
        receipt: Receipt,
    },
}

impl DispatchOutcome {
    /// The state this outcome settles a DISPATCHED record in.
    pub fn state(&self) -> IntentState {
        match self {
            Self::Applied(_) => IntentState::Acked,
            Self::Failed { class, .. } if class.definitely_not_applied() => IntentState::Failed,
            Self::Failed { .. } => IntentState::Unknown,
        }
    }
}

/// Where settlement left an UNKNOWN record.
#[derive(Debug, Clone, PartialEq)]
pub enum Settled {
    /// DISPATCHED again with the same idempotency key: dispatch it now, then [`record_outcome`].
    Redispatch(IntentRecord),
    /// ACKED with a synthetic receipt: the probe saw the effect.
    Acked(IntentRecord),
    /// RECORDED: the probe saw no effect; dispatching is safe ([`begin_dispatch`]).
    Resumable(IntentRecord),
    /// DEAD_LETTER: a person settles it.
    DeadLetter(IntentRecord),
}

impl Settled {
    pub fn record(&self) -> &IntentRecord {
        match self {
            Self::Redispatch(r) | Self::Acked(r) | Self::Resumable(r) | Self::DeadLetter(r) => r,
        }
    }

    pub fn into_record(self) -> IntentRecord {
        match self {
            Self::Redispatch(r) | Self::Acked(r) | Self::Resumable(r) | Self::DeadLetter(r) => r,
        }
    }
}

/// RECORDED → DISPATCHED, storing the pre-dispatch snapshot a probe will compare against.
/// Call it, and let it succeed, before the executor is touched.
pub async fn begin_dispatch(
    journal: &dyn Journal,
    recorded: &IntentRecord,
    snapshot: Option<Value>,
) -> Result<IntentRecord, JournalError> {
    journal
        .transition(Transition::to(recorded, IntentState::Dispatched).snapshot(snapshot))
        .await
}

/// DISPATCHED → ACKED | FAILED | UNKNOWN from the executor's outcome. The stored receipt carries
/// the intent's identity and the state it settled in. A record that is not mutating (a read kept
/// for the audit trail) never goes to UNKNOWN: its failure is FAILED.
pub async fn record_outcome(
    journal: &dyn Journal,
    dispatched: &IntentRecord,
    outcome: DispatchOutcome,
) -> Result<IntentRecord, JournalError> {
    let mut to = outcome.state();
    // A read has no effect to be unsure about: its failure is never ambiguous.
    if to == IntentState::Unknown && !dispatched.mutating {
        to = IntentState::Failed;
    }
    // A re-dispatch after an ambiguous outcome that now fails "definitely not applied" says
    // nothing about the earlier attempt: the intent as a whole is still unknown.
    let after_ambiguity = dispatched.previous_state() == Some(IntentState::Reconciling);
    if to == IntentState::Failed && after_ambiguity {
        to = IntentState::Unknown;
    }
    let (mut receipt, note) = match outcome {
        DispatchOutcome::Applied(receipt) => (receipt, None),
        DispatchOutcome::Failed { class, receipt } => (
            receipt,
            Some(match to {
                IntentState::Failed => format!("{class:?}: definitely not applied"),
                _ if class.definitely_not_applied() => format!(
                    "{class:?}: this attempt was not applied, an earlier one is still unknown"
                ),
                _ => format!("{class:?}: outcome unknown"),
            }),
        ),
    };
    stamp(&mut receipt, dispatched, to);
    let mut t = Transition::to(dispatched, to).receipt(receipt);
    t.note = note;
    journal.transition(t).await
}

/// UNKNOWN → RECONCILING; a record already RECONCILING (recovery after a crash mid-probe) is
/// returned as it is.
pub async fn begin_reconcile(
    journal: &dyn Journal,
    record: &IntentRecord,
) -> Result<IntentRecord, JournalError> {
    if record.state == IntentState::Reconciling {
        return Ok(record.clone());
    }
    journal
        .transition(Transition::to(record, IntentState::Reconciling))
        .await
}

/// Settles an UNKNOWN (or RECONCILING) record by the tool's settlement kind and, for `Probe`,
/// the probe's finding (run the probe after [`begin_reconcile`], never before dispatch is over).
/// The observation of a probe that found the effect is the evidence of the synthetic receipt.
pub async fn settle(
    journal: &dyn Journal,
    record: &IntentRecord,
    kind: Settlement,
    finding: Option<ProbeFinding>,
) -> Result<Settled, JournalError> {
    let r = begin_reconcile(journal, record).await?;
    let to = |state| Transition::to(&r, state);
    let dead = |note: String| {
        let t = Transition::to(&r, IntentState::DeadLetter).note(note);
        async move { journal.transition(t).await.map(Settled::DeadLetter) }
    };
    let exhausted = r.attempts >= ATTEMPTS_MAX;
    match kind {
        Settlement::IdempotencyKey if exhausted => {
            dead(format!("dispatched {} times, the most allowed", r.attempts)).await
        }
        Settlement::IdempotencyKey => {
            let note = format!(
                "re-dispatch with the same idempotency key {}",
                r.idempotency_key
            );
            let d = journal
                .transition(to(IntentState::Dispatched).note(note))
                .await?;
            Ok(Settled::Redispatch(d))
        }
        Settlement::Probe => match finding {
            Some(ProbeFinding::Applied(observation)) => {
                let evidence = serde_json::to_value(&*observation).ok();
                let mut receipt = synthetic_receipt(&r, evidence);
                stamp(&mut receipt, &r, IntentState::Acked);
                let t = to(IntentState::Acked)
                    .note("probe: postcondition holds")
                    .receipt(receipt);
                journal.transition(t).await.map(Settled::Acked)
            }
            Some(ProbeFinding::Unchanged) if r.snapshot.is_none() => {
                dead("probe said unchanged, but no pre-dispatch snapshot was recorded".into()).await
            }
            Some(ProbeFinding::Unchanged) if exhausted => {
                dead(format!("dispatched {} times, the most allowed", r.attempts)).await
            }
            Some(ProbeFinding::Unchanged) => {
                let t = to(IntentState::Recorded).note("probe: unchanged since the snapshot");
                journal.transition(t).await.map(Settled::Resumable)
            }
            Some(ProbeFinding::Indeterminate(detail)) => dead(format!("probe: {detail}")).await,
            None => dead("settlement = probe, but no probe finding was given".into()).await,
        },
        Settlement::None => dead("settlement = none: a person decides".into()).await,
    }
}

/// Cancels an intent before dispatch: RECORDED → REJECTED_CONFLICT. The executor has not been
/// touched and will not be: a dispatcher that loses this race gets a stale fence at
/// [`begin_dispatch`]. A caller that prefers to leave the intent RECORDED (resumable) simply
/// does not dispatch it.
pub async fn cancel_before_dispatch(
    journal: &dyn Journal,
    recorded: &IntentRecord,
    note: &str,
) -> Result<IntentRecord, JournalError> {
    journal
        .transition(Transition::to(recorded, IntentState::RejectedConflict).note(note))
        .await
}

/// A declared compensating action undid the effect of an ACKED (or unsettled) intent.
pub async fn compensate(
    journal: &dyn Journal,
    record: &IntentRecord,
    receipt: Option<Receipt>,
    note: &str,
) -> Result<IntentRecord, JournalError> {
    let mut t = Transition::to(record, IntentState::Compensated).note(note);
    t.receipt = receipt;
    journal.transition(t).await
}

/// What a person found out about an unsettled call's effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PersonFinding {
    /// The effect happened: the intent is ACKED and its retries are replayed.
    Applied,
    /// The effect did not happen: the intent is FAILED and may be run again.
    NotApplied,
}

/// Settles a DEAD_LETTER or UNKNOWN record by a person's word (`ring0 journal resolve`). An
/// UNKNOWN record goes through DEAD_LETTER first, so the state machine's one door for a
/// person's settlement is kept. Any other state is refused with
/// [`JournalError::Invalid`], naming it: only an unsettled effect is a person's to decide.
pub async fn resolve_by_person(
    journal: &dyn Journal,
    record: &IntentRecord,
    finding: PersonFinding,
    note: &str,
) -> Result<IntentRecord, JournalError> {
    let dead = match record.state {
        IntentState::DeadLetter => record.clone(),
        IntentState::Unknown => {
            let t = Transition::to(record, IntentState::DeadLetter)
                .note("taken for a person's settlement");
            journal.transition(t).await?
        }
        other => {
            return Err(JournalError::Invalid(format!(
                "intent {} is {other}; only a DEAD_LETTER or UNKNOWN intent is settled by a \
                 person",
                record.id
            )));
        }
    };
    match finding {
        PersonFinding::Applied => {
            let mut receipt = person_receipt(&dead, note);
            stamp(&mut receipt, &dead, IntentState::Acked);
            let t = Transition::to(&dead, IntentState::Acked)
                .note(format!("a person marked it applied: {note}"))
                .receipt(receipt);
            journal.transition(t).await
        }
        PersonFinding::NotApplied => {
            let t = Transition::to(&dead, IntentState::Failed)
                .note(format!("a person marked it not applied: {note}"));
            journal.transition(t).await
        }
    }
}

/// The receipt of an intent a person marked applied: the original response was lost, so it
/// says who settled it and why.
fn person_receipt(record: &IntentRecord, note: &str) -> Receipt {
    Receipt::new(
        record.last_call_id().to_string(),
        0,
        record.tool.clone(),
        Disposition::Recovered,
        CallOutcome::Completed {
            observation: Observation {
                text: format!(
                    "The effect was confirmed by a person after an ambiguous outcome; the \
                     original response was lost. {note}"
                ),
                structured: Some(json!({"reconciled": true, "by": "person", "note": note})),
                is_error: false,
                ..Observation::default()
            },
        },
    )
}

/// The receipt of an intent whose effect a probe confirmed: no observation of the original call
/// survives, so it says what is known and how.
pub fn synthetic_receipt(record: &IntentRecord, evidence: Option<Value>) -> Receipt {
    let mut structured = json!({"reconciled": true, "by": "probe"});
    if let Some(evidence) = evidence {
        structured["evidence"] = evidence;
    }
    Receipt::new(
        record.last_call_id().to_string(),
        0,
        record.tool.clone(),
        Disposition::Recovered,
        CallOutcome::Completed {
            observation: Observation {
                text: "The effect was confirmed by a reconciliation probe after an ambiguous \
                       outcome; the original response was lost."
                    .into(),
                structured: Some(structured),
                is_error: false,
                ..Observation::default()
            },
        },
    )
}

/// Fills a receipt's identity from the record it settles.
fn stamp(receipt: &mut Receipt, record: &IntentRecord, state: IntentState) {
    receipt.intent_id = Some(record.id.to_string());
    receipt.semantic_key = Some(record.semantic_key);
    receipt.idempotency_key = Some(record.idempotency_key.clone());
    receipt.state = Some(state);
    receipt.revision = record.fence + 1;
}
