//! Dispatch: running the planned epochs of one round.
//!
//! For each call, in its epoch: commit the intent to the journal (`commit`: a duplicate, replay or
//! conflict never reaches the executor), then hand the recorded intent to the journal's settlement
//! protocol ([`ring0_journal::drive_bounded`]) with the tool as its executor
//! (the `settle` module): snapshot for a probe, DISPATCHED, run under the timeout, ACKED on
//! success, FAILED only for "definitely not applied" errors, otherwise UNKNOWN followed by
//! reconciliation (idempotency-key re-dispatch, probe, or DEAD_LETTER for a person), with at
//! most [`SETTLE_REDISPATCH_MAX`] re-dispatches while the model waits.
//!
//! Inside an epoch, calls run as separate tasks (a panicking tool fails alone), bounded by
//! `max_concurrent_tools`; calls with equal conflict keys run one after another in source order,
//! and, through the scope's state, one after another with the calls of every other round of the
//! scope. A write whose outcome stays uncertain blocks later writes of the scope with its key, or
//! every later write when it has none, until it settles (`blocked_by_unsettled`). After
//! cancellation nothing new starts: running calls settle (a dispatched write is not told, unless
//! its tool stops on cancellation: see `settle::run_job`), the rest are reported cancelled.
//!
//! The order for one committed call: conflict-key turn, commit (the journal decides: run,
//! replay, wait for the identical call in flight, or refuse), the unsettled-write check, then the
//! approval hold if the authorizer asked for one, then dispatch. So a call that will be replayed
//! is answered even while another write is unsettled (a replay has no effect), a call that will
//! be replayed or refused is never shown to a person, and the claim made before the hold keeps
//! an identical call from running meanwhile; a blocked claim, or a hold that ends without
//! approval, is closed as not executed.

use crate::events::Event;
use crate::plan::Epoch;
use crate::prepare::Prepared;
use crate::settle::{CallExecutor, ms, run_job};
use crate::tool::ToolError;
use crate::trace;
use ring0_core::call::RejectionKind;
use ring0_core::receipt::{CallOutcome, Disposition, Timing};
use ring0_core::{IntentState, Observation, Receipt, Rejection};
use ring0_journal::{IntentRecord, Journal};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// Re-dispatches allowed while settling one ambiguous call (with the same idempotency key, or
/// after a probe found the world unchanged).
pub const SETTLE_REDISPATCH_MAX: u32 = 1;

/// What every call of a round shares.
#[derive(Clone)]
pub(crate) struct DispatchEnv {
    pub journal: Arc<dyn Journal>,
    pub scope: Arc<str>,
    /// The principal's id: part of the identity of every call.
    pub principal: Arc<str>,
    /// What the session shares with every other session of its principal and scope.
    pub scope_state: Arc<crate::scope::ScopeState>,
    /// Woken whenever a committed call settles.
    pub settled: Arc<tokio::sync::Notify>,
    pub key_retention_ms: u64,
    pub in_flight_wait_ms: u64,
    /// Who is asking, and who decides, for an approval hold right before dispatch.
    pub session: Arc<crate::policy::SessionInfo>,
    pub authorizer: Arc<dyn crate::policy::Authorizer>,
    pub attempt_epoch: u64,
    pub events: crate::events::EventHub,
    pub cancel: CancellationToken,
    pub max_concurrent_tools: usize,
    pub round_start: Instant,
    pub intent_ids: Arc<BTreeMap<usize, uuid::Uuid>>,
    /// Held while deciding to start a call and while cancelling, so that no call starts after
    /// a cancellation was announced.
    pub start_gate: Arc<Mutex<()>>,
    /// Record reads in the journal too (for the audit trail). Off by default: a read has no
    /// effect to deduplicate, so it bypasses the commit path.
    pub journal_reads: bool,
    /// How long a memoized observation of a deterministic read may be served; 0 disables.
    pub memo_ttl_ms: u64,
    /// Cancelling the round stops dispatched mutating calls too (see [`crate::RoundOptions`]).
    pub stop_dispatched_on_cancel: bool,
    /// The host's per-call context, handed to each call's [`crate::CallContext`].
    pub extensions: crate::tool::CallExtensions,
    /// The session's shape stage, applied to every result before its receipt.
    pub shape: crate::shape::ShapeStage,
}

/// One call's receipt, and the intent whose result answers it (run or replayed): the host's
/// delivery ticket is for that intent.
#[derive(Debug, Clone)]
pub(crate) struct Dispatched {
    pub receipt: Receipt,
    pub answered_by: Option<uuid::Uuid>,
}

impl Dispatched {
    fn unrecorded(receipt: Receipt) -> Self {
        Self {
            receipt,
            answered_by: None,
        }
    }
}

fn emit(env: &DispatchEnv, event: Event) {
    // No subscriber is not an error: events are for hosts that want them.
    env.events.send(event);
}

/// Runs the epochs in order. Returns one receipt per job, keyed by the job's position.
pub(crate) async fn run_epochs(
    env: DispatchEnv,
    jobs: Vec<Prepared>,
    epochs: Vec<Epoch>,
) -> Vec<Dispatched> {
    let jobs: Vec<Arc<Prepared>> = jobs.into_iter().map(Arc::new).collect();
    let mut receipts: Vec<Option<Dispatched>> = vec![None; jobs.len()];
    let semaphore = Arc::new(Semaphore::new(env.max_concurrent_tools.max(1)));
    for (epoch_no, epoch) in epochs.iter().enumerate() {
        let done = if env.cancel.is_cancelled() {
            epoch
                .calls
                .iter()
                .map(|&pos| (pos, Dispatched::unrecorded(cancelled(&jobs[pos]))))
                .collect()
        } else {
            run_epoch(&env, &jobs, &semaphore, epoch_no, epoch).await
        };
        for (pos, receipt) in done {
            receipts[pos] = Some(receipt);
        }
    }
    receipts
        .into_iter()
        .zip(&jobs)
        .map(|(r, job)| r.unwrap_or_else(|| Dispatched::unrecorded(cancelled(job))))
        .collect()
}

/// Runs one epoch: its conflict chains at once, each chain's calls in source order. Returns
/// each call's receipt with its position.
async fn run_epoch(
    env: &DispatchEnv,
    jobs: &[Arc<Prepared>],
    semaphore: &Arc<Semaphore>,
    epoch_no: usize,
    epoch: &Epoch,
) -> Vec<(usize, Dispatched)> {
    emit(
        env,
        Event::EpochStarted {
            epoch: epoch_no,
            calls: epoch.calls.iter().map(|&p| jobs[p].call.index).collect(),
            barrier: epoch.barrier,
        },
    );
    let mut set = tokio::task::JoinSet::new();
    for chain in conflict_chains(jobs, epoch) {
        let chain: Vec<(usize, Arc<Prepared>)> = chain
            .into_iter()
            .map(|pos| (pos, jobs[pos].clone()))
            .collect();
        // Each chain's stage spans are children of the round's span.
        let run = run_chain(env.clone(), semaphore.clone(), chain, epoch_no);
        set.spawn(run.in_current_span());
    }
    let mut done = Vec::with_capacity(epoch.calls.len());
    while let Some(chain) = set.join_next().await {
        match chain {
            Ok(results) => done.extend(results),
            // A chain task only awaits call tasks; its own panic would be a kernel bug.
            Err(e) => panic!("dispatch chain failed: {e}"),
        }
    }
    done
}

/// The epoch's calls as chains of positions: equal conflict keys form one chain, in source
/// order; every other call is a chain of its own.
fn conflict_chains(jobs: &[Arc<Prepared>], epoch: &Epoch) -> Vec<Vec<usize>> {
    let mut chains: Vec<Vec<usize>> = Vec::new();
    let mut by_key: BTreeMap<&str, usize> = BTreeMap::new();
    for &pos in &epoch.calls {
        match jobs[pos].call.conflict_key.as_deref() {
            Some(key) => match by_key.get(key) {
                Some(&chain) => chains[chain].push(pos),
                None => {
                    by_key.insert(key, chains.len());
                    chains.push(vec![pos]);
                }
            },
            None => chains.push(vec![pos]),
        }
    }
    chains
}

/// Runs one conflict chain, a call at a time, each under a permit of the round's concurrency
/// bound. After cancellation the rest of the chain is reported cancelled.
async fn run_chain(
    env: DispatchEnv,
    semaphore: Arc<Semaphore>,
    chain: Vec<(usize, Arc<Prepared>)>,
    epoch_no: usize,
) -> Vec<(usize, Dispatched)> {
    let mut out = Vec::with_capacity(chain.len());
    for (pos, job) in chain {
        if env.cancel.is_cancelled() {
            out.push((pos, Dispatched::unrecorded(cancelled(&job))));
            continue;
        }
        let permit = semaphore.clone().acquire_owned().await;
        if env.cancel.is_cancelled() || permit.is_err() {
            out.push((pos, Dispatched::unrecorded(cancelled(&job))));
            continue;
        }
        let receipt = run_call(&env, &job, epoch_no).await;
        drop(permit);
        out.push((pos, receipt));
    }
    out
}

fn cancelled(job: &Prepared) -> Receipt {
    Receipt::rejected(
        job.call.index,
        Rejection::new(
            RejectionKind::Cancelled,
            &job.call.tool,
            &job.call.call_id,
            "the round was cancelled before this call started; nothing was run",
        ),
    )
}

pub(crate) fn rejected(job: &Prepared, kind: RejectionKind, message: String) -> Receipt {
    Receipt::rejected(
        job.call.index,
        Rejection::new(kind, &job.call.tool, &job.call.call_id, message),
    )
}

pub(crate) fn receipt_from(
    job: &Prepared,
    record: &IntentRecord,
    disposition: Disposition,
    outcome: CallOutcome,
    timing: Timing,
) -> Receipt {
    Receipt {
        call_id: job.call.call_id.clone(),
        index: job.call.index,
        tool: job.call.tool.clone(),
        intent_id: Some(record.id.to_string()),
        semantic_key: Some(record.semantic_key),
        idempotency_key: record.mutating.then(|| record.idempotency_key.clone()),
        state: Some(record.state),
        revision: record.fence,
        timeline: record.timeline.clone(),
        disposition,
        outcome,
        timing,
    }
}

/// The receipt of a call as the journal settled it: the stored receipt with the record's
/// final state, revision and timeline, answering this call. A failure that did not end FAILED
/// may have had an effect, whatever the attempt that produced it said.
fn settled_receipt(job: &Prepared, record: &IntentRecord, timing: Timing) -> Receipt {
    let Some(stored) = record.receipt.clone() else {
        return unsettled(
            job,
            record,
            format!("the intent ended {} without a receipt", record.state),
            timing,
        );
    };
    let mut receipt = receipt_from(job, record, stored.disposition, stored.outcome, timing);
    if let CallOutcome::Failed { uncertain, .. } = &mut receipt.outcome {
        *uncertain = record.state != IntentState::Failed;
    }
    receipt
}

/// One call of an epoch, through the order in the module docs: conflict-key turn, commit, the
/// unsettled-write check, the approval hold, dispatch. A read the journal does not record runs
/// on its own path ([`run_read`]).
async fn run_call(env: &DispatchEnv, job: &Prepared, epoch_no: usize) -> Dispatched {
    let mutating = !job.tool.spec.effect.is_read_only();
    if !mutating && !env.journal_reads {
        return Dispatched::unrecorded(run_read(env, job, epoch_no).await);
    }
    let key = job.call.conflict_key.as_deref();
    let _turn = match (mutating, key) {
        (true, Some(k)) => Some(env.scope_state.serialize(k).await),
        _ => None,
    };
    let span = trace::call_stage(trace::COMMIT, &job.call.tool, &job.call.call_id);
    let committed = crate::commit::commit(env, job, mutating)
        .instrument(span.clone())
        .await;
    let record = match committed {
        crate::commit::Committed::Run(record) => {
            trace::record_intent(&span, &record.id, record.state);
            record
        }
        crate::commit::Committed::Answered { receipt, by } => {
            record_answer(&span, &receipt);
            return Dispatched {
                receipt,
                answered_by: by,
            };
        }
    };
    drop(span);
    if mutating && let Some(receipt) = refuse_if_blocked(env, job, key, &record).await {
        return Dispatched::unrecorded(receipt);
    }
    if let Err(receipt) = hold_for_approval(env, job, &record).await {
        return Dispatched::unrecorded(receipt);
    }
    let receipt = dispatch_committed(env, job, epoch_no, &record).await;
    conclude_committed(env, key, mutating, &record, receipt)
}

/// On a stage's span: the intent whose result answers the call and its state, or the kind of
/// refusal.
fn record_answer(span: &tracing::Span, receipt: &Receipt) {
    if let (Some(id), Some(state)) = (&receipt.intent_id, receipt.state) {
        trace::record_intent(span, id, state);
    }
    if let CallOutcome::Rejected { rejection } = &receipt.outcome {
        trace::record_error(span, rejection.status.as_str());
    }
}

/// The unsettled-write check, after commit: while an earlier write of the scope (with this
/// key, or any when the call has none) has an unknown outcome, the claim is closed as not
/// executed and the call refused `blocked_by_unsettled`.
async fn refuse_if_blocked(
    env: &DispatchEnv,
    job: &Prepared,
    key: Option<&str>,
    record: &IntentRecord,
) -> Option<Receipt> {
    let id = env.scope_state.blocker(env.journal.as_ref(), key).await?;
    let _ = ring0_journal::cancel_before_dispatch(
        env.journal.as_ref(),
        record,
        "blocked by an earlier write with an unknown outcome",
    )
    .await;
    env.settled.notify_waiters();
    Some(blocked_by_unsettled(job, key, id))
}

/// After a committed call was dispatched and settled: a write whose outcome stayed uncertain
/// blocks later writes of its scope, waiters are woken, the finish is announced, and the
/// intent answers the call unless the call was refused.
fn conclude_committed(
    env: &DispatchEnv,
    key: Option<&str>,
    mutating: bool,
    record: &IntentRecord,
    receipt: Receipt,
) -> Dispatched {
    let still_uncertain = receipt.state.is_some_and(IntentState::is_uncertain)
        || matches!(
            receipt.outcome,
            CallOutcome::Failed {
                uncertain: true,
                ..
            }
        );
    if mutating && still_uncertain {
        env.scope_state.note_unsettled(key, record.id);
    }
    env.settled.notify_waiters();
    announce_finish(env, &receipt);
    let answered_by =
        (!matches!(receipt.outcome, CallOutcome::Rejected { .. })).then_some(record.id);
    Dispatched {
        receipt,
        answered_by,
    }
}

/// Refused: an earlier write of the scope has an unknown outcome.
fn blocked_by_unsettled(job: &Prepared, key: Option<&str>, id: uuid::Uuid) -> Receipt {
    let message = match key {
        Some(k) => format!(
            "an earlier write with conflict key {k:?} (intent {id}) has an unknown outcome; \
             nothing was run"
        ),
        None => format!(
            "an earlier write of this scope (intent {id}) has an unknown outcome; nothing was run"
        ),
    };
    Receipt::rejected(
        job.call.index,
        Rejection::new(
            RejectionKind::BlockedByUnsettled,
            &job.call.tool,
            &job.call.call_id,
            message,
        )
        .with_intent_id(id.to_string()),
    )
}

/// The approval hold, last before dispatch, for a call the authorizer holds: the call is
/// already claimed in the journal, so nothing identical runs meanwhile. A hold that ends
/// without approval closes the claim as not executed (a later identical call may run) and is
/// the call's receipt.
async fn hold_for_approval(
    env: &DispatchEnv,
    job: &Prepared,
    record: &IntentRecord,
) -> Result<(), Receipt> {
    if !job.hold {
        return Ok(());
    }
    let refused = match ask_approval(env, job).await {
        Ok(()) => return Ok(()),
        Err(rejection) => rejection,
    };
    let _ = ring0_journal::cancel_before_dispatch(
        env.journal.as_ref(),
        record,
        &format!("not approved: {}", refused.status.as_str()),
    )
    .await;
    env.settled.notify_waiters();
    Err(Receipt::rejected(job.call.index, refused))
}

/// Asks the authorizer to hold the call for a person: nothing for an approval, else the
/// rejection.
async fn ask_approval(env: &DispatchEnv, job: &Prepared) -> Result<(), Rejection> {
    let span = trace::call_stage(trace::APPROVE, &job.call.tool, &job.call.call_id);
    let decided = ask_authorizer(env, job).instrument(span.clone()).await;
    trace::record_decision(&span, decided.kind(), Some(decided.rule()));
    let result = crate::prepare::decision_result(decided, &job.call.tool, &job.call.call_id);
    if let Err(r) = &result {
        trace::record_error(&span, r.status.as_str());
    }
    result
}

/// The authorizer's decision on a held call: it asks a person.
async fn ask_authorizer(env: &DispatchEnv, job: &Prepared) -> crate::policy::AuthDecision {
    let events = crate::tool::EventSink(env.events.clone());
    let args_hash = job.call.fingerprint.encode();
    let request = crate::policy::AuthRequest {
        session: &env.session,
        spec: &job.tool.spec,
        call_id: &job.call.call_id,
        args: &job.call.args,
        args_hash: &args_hash,
        events: Some(&events),
        extensions: &env.extensions,
    };
    env.authorizer.hold(&request).await
}

/// Dispatch, settle and shape one committed call: the journal's protocol with the tool lent to
/// it, its receipt as the journal settled it.
async fn dispatch_committed(
    env: &DispatchEnv,
    job: &Prepared,
    epoch_no: usize,
    record: &IntentRecord,
) -> Receipt {
    if !announce_start(env, job, epoch_no) {
        // Cancelled between commit and dispatch: nothing external was touched.
        let _ = ring0_journal::cancel_before_dispatch(
            env.journal.as_ref(),
            record,
            "cancelled before dispatch",
        )
        .await;
        return cancelled(job);
    }
    // The protocol (dispatch, record the outcome, reconcile an ambiguous one) is the journal's;
    // this call only lends it the tool.
    let exec = CallExecutor::new(env, job, ms(env.round_start.elapsed()));
    let dispatches_max = 1 + SETTLE_REDISPATCH_MAX;
    // Boxed: the protocol's state machine is large, and run_call's future (which reads share)
    // should not carry it inline.
    let settled = Box::pin(ring0_journal::drive_bounded(
        env.journal.as_ref(),
        &exec,
        record.clone(),
        dispatches_max,
    ))
    .await;
    let settle = exec.settle_span();
    match &settled {
        Ok(done) => {
            trace::record_intent(settle, &done.id, done.state);
            trace::record_timeline(settle, done);
            if done.state != IntentState::Acked {
                trace::record_error(settle, done.state.as_str());
            }
        }
        Err(_) => trace::record_error(settle, "journal_unavailable"),
    }
    match settled {
        Ok(done) => settled_receipt(job, &done, exec.timing()),
        Err(e) if exec.dispatches.load(Ordering::Relaxed) == 0 => rejected(
            job,
            RejectionKind::JournalUnavailable,
            format!("the journal refused to dispatch the intent, so nothing was run: {e}"),
        ),
        Err(e) => {
            // The effect happened (or not) but the log could not say so: report it as unsettled.
            let now = env.journal.get(record.id).await.ok().flatten();
            unsettled(
                job,
                now.as_ref().unwrap_or(record),
                format!("the journal could not settle the call: {e}"),
                exec.timing(),
            )
        }
    }
}

fn unsettled(job: &Prepared, record: &IntentRecord, why: String, timing: Timing) -> Receipt {
    receipt_from(
        job,
        record,
        Disposition::Dispatched,
        CallOutcome::Failed {
            message: why,
            uncertain: true,
            observation: None,
        },
        timing,
    )
}

/// A read outside the journal: no effect to deduplicate or settle. Same start gate, timeout,
/// isolation, shaping and events as every other call.
async fn run_read(env: &DispatchEnv, job: &Prepared, epoch_no: usize) -> Receipt {
    let memoizable = env.memo_ttl_ms > 0 && job.tool.spec.deterministic;
    if memoizable && let Some(receipt) = memoized(env, job).await {
        return receipt;
    }
    if job.hold
        && let Err(rejection) = ask_approval(env, job).await
    {
        return Receipt::rejected(job.call.index, rejection);
    }
    if !announce_start(env, job, epoch_no) {
        return cancelled(job);
    }
    let queued_ms = ms(env.round_start.elapsed());
    let started = Instant::now();
    let span = trace::call_stage(trace::DISPATCH, &job.call.tool, &job.call.call_id);
    span.record("ring0.dispatch.attempt", 1);
    let result = run_job(env, job, None, None).instrument(span.clone()).await;
    if let Err(e) = &result {
        trace::record_error(&span, trace::failure_kind(e.class));
    }
    drop(span);
    let timing = Timing {
        queued_ms,
        run_ms: ms(started.elapsed()),
    };
    let shape = trace::call_stage(trace::SHAPE, &job.call.tool, &job.call.call_id);
    let (state, outcome) = read_outcome(env, job, result, memoizable)
        .instrument(shape)
        .await;
    let receipt = Receipt {
        state: Some(state),
        timing,
        ..Receipt::new(
            job.call.call_id.clone(),
            job.call.index,
            job.call.tool.clone(),
            Disposition::Dispatched,
            outcome,
        )
    };
    announce_finish(env, &receipt);
    receipt
}

/// The memoized answer of a deterministic read, byte-identical to the stored observation (which
/// keeps the model's prompt prefix stable), if the memo has a fresh one.
async fn memoized(env: &DispatchEnv, job: &Prepared) -> Option<Receipt> {
    let observation = env
        .journal
        .memo_get(&job.call.fingerprint, env.memo_ttl_ms)
        .await
        .ok()
        .flatten()?;
    Some(Receipt {
        state: Some(IntentState::Acked),
        ..Receipt::new(
            job.call.call_id.clone(),
            job.call.index,
            job.call.tool.clone(),
            Disposition::Memoized,
            CallOutcome::Completed { observation },
        )
    })
}

/// A read's result, shaped: ACKED (and memoized when it may be) or FAILED, never uncertain.
async fn read_outcome(
    env: &DispatchEnv,
    job: &Prepared,
    result: Result<Observation, ToolError>,
    memoizable: bool,
) -> (IntentState, CallOutcome) {
    let budget_bytes = job.tool.spec.observation_budget_bytes;
    match result {
        Ok(obs) => {
            let observation = env.shape.observation(obs, budget_bytes);
            if memoizable && !observation.is_error {
                // A failed store only costs a future cache miss.
                let _ = env
                    .journal
                    .memo_put(&job.call.fingerprint, &observation)
                    .await;
            }
            (IntentState::Acked, CallOutcome::Completed { observation })
        }
        Err(e) => (
            IntentState::Failed,
            CallOutcome::Failed {
                message: env.shape.message(&e.message),
                uncertain: false,
                observation: e
                    .observation
                    .map(|o| env.shape.observation(o, budget_bytes)),
            },
        ),
    }
}

/// Decides to start a call, under the start gate: `false` if the round was cancelled first.
/// Cancellation takes the same gate, so no call starts after it was announced.
fn announce_start(env: &DispatchEnv, job: &Prepared, epoch_no: usize) -> bool {
    let _gate = env.start_gate.lock().expect("start gate");
    if env.cancel.is_cancelled() {
        return false;
    }
    emit(
        env,
        Event::CallStarted {
            index: job.call.index,
            call_id: job.call.call_id.clone(),
            tool: job.call.tool.clone(),
            epoch: epoch_no,
        },
    );
    true
}

fn announce_finish(env: &DispatchEnv, receipt: &Receipt) {
    emit(
        env,
        Event::CallFinished {
            index: receipt.index,
            call_id: receipt.call_id.clone(),
            tool: receipt.tool.clone(),
            state: receipt.state,
            is_error: receipt.is_error(),
            run_ms: receipt.timing.run_ms,
        },
    );
}
