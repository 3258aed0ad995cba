//! Commit: a prepared call becomes an intent in the journal, or is answered by one.
//!
//! The identity of a logical call is (principal, scope, tool, prepared arguments, attempt); a
//! caller's explicit idempotency key replaces the scope (keys are scoped to the principal, so a
//! retry from a new connection or scope finds its call). The journal decides from its log
//! alone:
//! - a new intent is RECORDED and goes on to dispatch (for a call without a key whose identical
//!   predecessor's result was delivered, as the next attempt, with its own provider key);
//! - the same intent in flight is waited for (at most the kernel's in-flight wait), then its
//!   result answers this call, or `in_progress` names it;
//! - an acknowledged intent whose result was never delivered (or any under an explicit key) is
//!   replayed from its stored receipt;
//! - a key bound to another call is an `idempotency_conflict`, an intent that differs from the
//!   one recorded under its id or key version an `intent_conflict`.
//!
//! None of those but the first reach the executor.

// A receipt or a record is the ordinary answer here, made once per call and moved once; boxing
// it would only add an allocation to every commit.
#![allow(clippy::result_large_err, clippy::large_enum_variant)]

use crate::dispatch::{DispatchEnv, receipt_from, rejected};
use crate::prepare::Prepared;
use ring0_core::call::RejectionKind;
use ring0_core::receipt::{CallOutcome, Disposition, Timing};
use ring0_core::{CallIdentity, IntentState, Observation, Receipt, Rejection, SemanticKey};
use ring0_journal::{ClientKey, IntentId, IntentRecord, Proposal, ProposeDecision};
use std::time::{Duration, Instant};

/// While waiting for an identical call in flight, the journal is looked at again at least this
/// often (50 ms), for a record settled where no wake-up reaches (recovery, another kernel).
pub const IN_FLIGHT_POLL_MS: u64 = 50;

/// Most proposals one call makes (3): a call that waited for an identical one which then ended
/// without running (its approval refused, cancelled) proposes again, and that is bounded.
const PROPOSALS_PER_CALL_MAX: usize = 3;

/// What the journal made of a call.
pub(crate) enum Committed {
    /// RECORDED: dispatch it.
    Run(IntentRecord),
    /// Answered without running: `by` is the intent whose result it is (a replay), if any.
    Answered {
        receipt: Receipt,
        by: Option<IntentId>,
    },
}

impl Committed {
    fn refused(receipt: Receipt) -> Self {
        Self::Answered { receipt, by: None }
    }
}

/// Proposes the call's intent and decides what answers it.
pub(crate) async fn commit(env: &DispatchEnv, job: &Prepared, mutating: bool) -> Committed {
    let proposal = match proposal(env, job, mutating) {
        Ok(p) => p,
        Err(receipt) => return Committed::refused(receipt),
    };
    for _ in 0..PROPOSALS_PER_CALL_MAX {
        let decision = match env.journal.propose(proposal.clone()).await {
            Ok(d) => d,
            Err(e) => {
                return Committed::refused(rejected(
                    job,
                    RejectionKind::JournalUnavailable,
                    format!("the intent could not be recorded, so nothing was run: {e}"),
                ));
            }
        };
        match decision {
            ProposeDecision::Recorded(record) => return Committed::Run(record),
            ProposeDecision::Replay(record) => return answered(job, &record),
            ProposeDecision::Duplicate(record) => match await_settled(env, record.id).await {
                // Ended without running (its approval refused, cancelled): propose again.
                Some(done)
                    if matches!(
                        done.state,
                        IntentState::RejectedConflict | IntentState::RejectedDuplicate
                    ) =>
                {
                    continue;
                }
                Some(done) if done.state.is_terminal() && done.receipt.is_some() => {
                    return answered(job, &done);
                }
                Some(done) => return Committed::refused(in_progress(job, &done)),
                None => return Committed::refused(in_progress(job, &record)),
            },
            ProposeDecision::KeyConflict(record) => {
                return Committed::refused(Receipt::rejected(
                    job.call.index,
                    Rejection::new(
                        RejectionKind::IdempotencyConflict,
                        &job.call.tool,
                        &job.call.call_id,
                        format!(
                            "the idempotency key was used for another call (intent {}, tool \
                             {:?}) with other arguments; nothing was run",
                            record.id, record.tool
                        ),
                    )
                    .with_intent_id(record.id.to_string()),
                ));
            }
            ProposeDecision::Conflict { reason, .. } => {
                return Committed::refused(rejected(job, RejectionKind::IntentConflict, reason));
            }
        }
    }
    Committed::refused(rejected(
        job,
        RejectionKind::InProgress,
        "the identical call before this one ended without running several times; call again".into(),
    ))
}

/// The call's proposal: its identity (principal and scope, or principal and key), epoch and
/// prepared arguments.
fn proposal(env: &DispatchEnv, job: &Prepared, mutating: bool) -> Result<Proposal, Receipt> {
    let spec = &job.tool.spec;
    let identity = match &job.idempotency_key {
        Some(key) if mutating => CallIdentity::Key {
            principal: &env.principal,
            key,
        },
        _ => CallIdentity::Scope {
            principal: &env.principal,
            scope: &env.scope,
        },
    };
    let semantic_key = SemanticKey::for_call(
        &spec.name,
        &job.call.canonical_args,
        &identity,
        env.attempt_epoch,
    )
    .map_err(|e| rejected(job, RejectionKind::InvalidJson, e.to_string()))?;
    Ok(Proposal {
        intent_id: env.intent_ids.get(&job.call.index).copied(),
        semantic_key,
        scope: env.scope.to_string(),
        attempt_epoch: env.attempt_epoch,
        tool: spec.name.clone(),
        canonical_args: job.call.canonical_args.clone(),
        call_id: job.call.call_id.clone(),
        mutating,
        client_key: job
            .idempotency_key
            .as_ref()
            .filter(|_| mutating)
            .map(|key| ClientKey {
                principal: env.principal.to_string(),
                key: key.clone(),
                retention_ms: env.key_retention_ms,
            }),
        principal: Some(env.principal.to_string()),
    })
}

/// Waits, at most the kernel's in-flight wait, for the record to leave the states of a call in
/// flight; `None` if it did not (or the journal could not be read).
async fn await_settled(env: &DispatchEnv, id: IntentId) -> Option<IntentRecord> {
    let deadline = Instant::now() + Duration::from_millis(env.in_flight_wait_ms);
    loop {
        // Armed before the look, so a settlement between the look and the wait wakes it.
        let woken = env.settled.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        let record = env.journal.get(id).await.ok().flatten()?;
        if !in_flight(record.state) {
            return Some(record);
        }
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        let tick = Duration::from_millis(IN_FLIGHT_POLL_MS).min(deadline - now);
        tokio::select! {
            () = &mut woken => {}
            () = tokio::time::sleep(tick) => {}
        }
    }
}

/// The states of a call that may still produce its result here and now.
fn in_flight(state: IntentState) -> bool {
    matches!(
        state,
        IntentState::Proposed
            | IntentState::Recorded
            | IntentState::Dispatched
            | IntentState::Unknown
            | IntentState::Reconciling
    )
}

/// Refused for now: the identical call is still running (or unsettled).
fn in_progress(job: &Prepared, record: &IntentRecord) -> Receipt {
    Receipt::rejected(
        job.call.index,
        Rejection::new(
            RejectionKind::InProgress,
            &job.call.tool,
            &job.call.call_id,
            format!(
                "the same call (intent {}) is {}; it will not run twice, and its result was not \
                 ready in time",
                record.id, record.state
            ),
        )
        .with_intent_id(record.id.to_string()),
    )
}

/// This call answered with a settled record's stored result; nothing runs.
fn answered(job: &Prepared, record: &IntentRecord) -> Committed {
    Committed::Answered {
        receipt: replayed(job, record),
        by: Some(record.id),
    }
}

/// The stored receipt of a settled intent, answering this call; nothing runs.
fn replayed(job: &Prepared, record: &IntentRecord) -> Receipt {
    let mut receipt = record.receipt.clone().unwrap_or_else(|| {
        receipt_from(
            job,
            record,
            Disposition::Replayed,
            CallOutcome::Completed {
                observation: Observation::text("already applied"),
            },
            Timing::default(),
        )
    });
    receipt.call_id = job.call.call_id.clone();
    receipt.index = job.call.index;
    receipt.tool = job.call.tool.clone();
    receipt.intent_id = Some(record.id.to_string());
    receipt.semantic_key = Some(record.semantic_key);
    receipt.idempotency_key = record.mutating.then(|| record.idempotency_key.clone());
    receipt.state = Some(record.state);
    receipt.revision = record.fence;
    receipt.timeline = record.timeline.clone();
    receipt.disposition = Disposition::Replayed;
    receipt.timing = Timing::default();
    receipt
}
