//! Commit: a prepared call becomes an intent in the journal.
//!
//! The journal decides from its log alone: a new intent is RECORDED and goes on to dispatch; the
//! same intent already in flight is a duplicate, an acknowledged one is replayed from its stored
//! receipt, and an intent that differs from the one recorded under its key is a conflict. None of
//! those reach the executor; each comes back as the receipt the call gets instead.

use crate::dispatch::{DispatchEnv, receipt_from, rejected};
use crate::prepare::Prepared;
use ring0_core::call::RejectionKind;
use ring0_core::receipt::{CallOutcome, Disposition, Timing};
use ring0_core::{Observation, Receipt, SemanticKey};
use ring0_journal::{IntentRecord, Proposal, ProposeDecision};

/// Proposes the call's intent: the RECORDED intent to dispatch, or the receipt the call gets
/// instead (journal unavailable, duplicate, replay, conflict).
pub(crate) async fn commit(
    env: &DispatchEnv,
    job: &Prepared,
    mutating: bool,
) -> Result<IntentRecord, Receipt> {
    let spec = &job.tool.spec;
    let semantic_key = match SemanticKey::from_canonical_args(
        &spec.name,
        &job.call.canonical_args,
        &env.scope,
        env.attempt_epoch,
    ) {
        Ok(k) => k,
        Err(e) => return Err(rejected(job, RejectionKind::InvalidJson, e.to_string())),
    };
    let proposal = Proposal {
        intent_id: env.intent_ids.get(&job.call.index).copied(),
        semantic_key,
        scope: env.scope.to_string(),
        attempt_epoch: env.attempt_epoch,
        tool: spec.name.clone(),
        canonical_args: job.call.canonical_args.clone(),
        call_id: job.call.call_id.clone(),
        mutating,
    };
    match env.journal.propose(proposal).await {
        Err(e) => Err(rejected(
            job,
            RejectionKind::JournalUnavailable,
            format!("the intent could not be recorded, so nothing was run: {e}"),
        )),
        Ok(ProposeDecision::Recorded(record)) => Ok(record),
        Ok(ProposeDecision::Duplicate(record)) => Err(rejected(
            job,
            RejectionKind::DuplicateInFlight,
            format!(
                "the same intent ({}) is already {}; it will not run twice",
                record.id, record.state
            ),
        )),
        Ok(ProposeDecision::Replay(record)) => Err(replayed(job, &record)),
        Ok(ProposeDecision::Conflict { reason, .. }) => {
            Err(rejected(job, RejectionKind::IntentConflict, reason))
        }
    }
}

/// The stored receipt of an acknowledged intent, answering this call; nothing runs.
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
    receipt.timeline = record.timeline.clone();
    receipt.disposition = Disposition::Replayed;
    receipt.timing = Timing::default();
    receipt
}
