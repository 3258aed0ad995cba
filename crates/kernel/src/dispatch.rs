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
//! `max_concurrent_tools`; calls with equal conflict keys run one after another in source order.
//! A write whose outcome stays uncertain blocks later writes with its key, or every later write
//! when it has none. After cancellation nothing new starts: running calls settle, the rest are
//! reported cancelled.

use crate::events::Event;
use crate::plan::Epoch;
use crate::prepare::Prepared;
use crate::settle::{CallExecutor, ms, run_job};
use ring0_core::call::RejectionKind;
use ring0_core::receipt::{CallOutcome, Disposition, Timing};
use ring0_core::{IntentState, Receipt, Rejection};
use ring0_journal::{IntentRecord, Journal};
use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// Re-dispatches allowed while settling one ambiguous call (with the same idempotency key, or
/// after a probe found the world unchanged).
pub const SETTLE_REDISPATCH_MAX: u32 = 1;

/// What every call of a round shares.
#[derive(Clone)]
pub(crate) struct DispatchEnv {
    pub journal: Arc<dyn Journal>,
    pub scope: Arc<str>,
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
    /// The host's per-call context, handed to each call's [`crate::CallContext`].
    pub extensions: crate::tool::CallExtensions,
    /// The session's shape stage, applied to every result before its receipt.
    pub shape: crate::shape::ShapeStage,
}

/// Writes whose outcome is uncertain in this batch.
#[derive(Default)]
struct Uncertain {
    keys: HashSet<String>,
    unkeyed: bool,
}

impl Uncertain {
    fn blocks(&self, conflict_key: Option<&str>) -> bool {
        self.unkeyed || conflict_key.is_some_and(|k| self.keys.contains(k))
    }
    fn add(&mut self, conflict_key: Option<&str>) {
        match conflict_key {
            Some(k) => {
                self.keys.insert(k.to_string());
            }
            None => self.unkeyed = true,
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
) -> Vec<Receipt> {
    let jobs: Vec<Arc<Prepared>> = jobs.into_iter().map(Arc::new).collect();
    let mut receipts: Vec<Option<Receipt>> = vec![None; jobs.len()];
    let uncertain = Arc::new(Mutex::new(Uncertain::default()));
    let semaphore = Arc::new(Semaphore::new(env.max_concurrent_tools.max(1)));
    for (epoch_no, epoch) in epochs.iter().enumerate() {
        if env.cancel.is_cancelled() {
            for &pos in &epoch.calls {
                receipts[pos] = Some(cancelled(&jobs[pos]));
            }
            continue;
        }
        emit(
            &env,
            Event::EpochStarted {
                epoch: epoch_no,
                calls: epoch.calls.iter().map(|&p| jobs[p].call.index).collect(),
                barrier: epoch.barrier,
            },
        );
        // Equal conflict keys form one chain, run in source order; every other call is its own.
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
        let mut set = tokio::task::JoinSet::new();
        for chain in chains {
            let env = env.clone();
            let jobs = jobs.clone();
            let uncertain = uncertain.clone();
            let semaphore = semaphore.clone();
            set.spawn(async move {
                let mut out = Vec::with_capacity(chain.len());
                for pos in chain {
                    let job = jobs[pos].clone();
                    if env.cancel.is_cancelled() {
                        out.push((pos, cancelled(&job)));
                        continue;
                    }
                    let permit = semaphore.clone().acquire_owned().await;
                    if env.cancel.is_cancelled() || permit.is_err() {
                        out.push((pos, cancelled(&job)));
                        continue;
                    }
                    let receipt = run_call(&env, &job, epoch_no, &uncertain).await;
                    drop(permit);
                    out.push((pos, receipt));
                }
                out
            });
        }
        while let Some(done) = set.join_next().await {
            match done {
                Ok(results) => {
                    for (pos, receipt) in results {
                        receipts[pos] = Some(receipt);
                    }
                }
                // A chain task only awaits call tasks; its own panic would be a kernel bug.
                Err(e) => panic!("dispatch chain failed: {e}"),
            }
        }
    }
    receipts
        .into_iter()
        .zip(&jobs)
        .map(|(r, job)| r.unwrap_or_else(|| cancelled(job)))
        .collect()
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

async fn run_call(
    env: &DispatchEnv,
    job: &Prepared,
    epoch_no: usize,
    uncertain: &Mutex<Uncertain>,
) -> Receipt {
    let spec = &job.tool.spec;
    let mutating = !spec.effect.is_read_only();
    let key = job.call.conflict_key.as_deref();
    if mutating && uncertain.lock().expect("uncertain mutex").blocks(key) {
        return rejected(
            job,
            RejectionKind::BlockedByUncertainWrite,
            match key {
                Some(k) => {
                    format!("an earlier write with conflict key {k:?} has an unknown outcome")
                }
                None => "an earlier write in this batch has an unknown outcome".into(),
            },
        );
    }
    if !mutating && !env.journal_reads {
        return run_read(env, job, epoch_no).await;
    }
    let record = match crate::commit::commit(env, job, mutating).await {
        Ok(record) => record,
        Err(receipt) => return receipt,
    };
    if !announce_start(env, job, epoch_no) {
        // Cancelled between commit and dispatch: nothing external was touched.
        let _ = ring0_journal::cancel_before_dispatch(
            env.journal.as_ref(),
            &record,
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
    let receipt = match settled {
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
                now.as_ref().unwrap_or(&record),
                format!("the journal could not settle the call: {e}"),
                exec.timing(),
            )
        }
    };
    let still_uncertain = receipt.state.is_some_and(IntentState::is_uncertain)
        || matches!(
            receipt.outcome,
            CallOutcome::Failed {
                uncertain: true,
                ..
            }
        );
    if mutating && still_uncertain {
        uncertain.lock().expect("uncertain mutex").add(key);
    }
    announce_finish(env, &receipt);
    receipt
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
    let spec = &job.tool.spec;
    let memoizable = env.memo_ttl_ms > 0 && spec.deterministic;
    if memoizable
        && let Ok(Some(observation)) = env
            .journal
            .memo_get(&job.call.fingerprint, env.memo_ttl_ms)
            .await
    {
        // Byte-identical to the stored observation: keeps the model's prompt prefix stable.
        return Receipt {
            state: Some(IntentState::Acked),
            ..Receipt::new(
                job.call.call_id.clone(),
                job.call.index,
                job.call.tool.clone(),
                Disposition::Memoized,
                CallOutcome::Completed { observation },
            )
        };
    }
    if !announce_start(env, job, epoch_no) {
        return cancelled(job);
    }
    let queued_ms = ms(env.round_start.elapsed());
    let started = Instant::now();
    let result = run_job(env, job, None, None).await;
    let timing = Timing {
        queued_ms,
        run_ms: ms(started.elapsed()),
    };
    let (state, outcome) = match result {
        Ok(obs) => {
            let observation = env.shape.observation(obs, spec.observation_budget_bytes);
            if memoizable && !observation.is_error {
                // A failed store only costs a future cache miss.
                let _ = env
                    .journal
                    .memo_put(&job.call.fingerprint, &observation)
                    .await;
            }
            (IntentState::Acked, CallOutcome::Completed { observation })
        }
        Err((_, e)) => (
            IntentState::Failed,
            CallOutcome::Failed {
                message: env.shape.message(&e.message),
                uncertain: false,
                observation: e
                    .observation
                    .map(|o| env.shape.observation(o, spec.observation_budget_bytes)),
            },
        ),
    };
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
