//! Settle: the kernel's tools as the journal's [`Executor`].
//!
//! The settlement protocol itself — RECORDED → DISPATCHED → ACKED | FAILED | UNKNOWN →
//! RECONCILING → re-dispatch with the same idempotency key, probe, or DEAD_LETTER — has one
//! implementation, [`ring0_journal::drive`]. This module only supplies what the protocol needs
//! from the world: running a registered [`Tool`] under its timeout in its own task (a panic is
//! that call's failure), classifying the result into a [`DispatchOutcome`] with its shaped
//! observation (the `shape` stage, before the receipt), taking the tool's pre-dispatch snapshot and
//! shaping the observation its probe found.
//!
//! Two executors share that code: `CallExecutor` here, for a call of a live round (receipts
//! carry the model's call id, position and timing), and the registry executor of
//! [`Kernel::recover`](crate::Kernel::recover), for records recovery finds in the log.

use crate::dispatch::DispatchEnv;
use crate::prepare::Prepared;
use crate::shape::ShapeStage;
use crate::tool::{CallContext, EventSink, FailureClass, OnCancel, ProbeFinding, Tool, ToolError};
use crate::trace;
use async_trait::async_trait;
use ring0_core::receipt::{CallOutcome, Disposition, Timing};
use ring0_core::{IntentState, Observation, Receipt, Settlement};
use ring0_journal::IntentRecord;
use ring0_journal::recovery::Executor;
use ring0_journal::settle::DispatchOutcome;
use serde_json::Value;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// Runs one attempt of a round's call (see [`run_tool`]) in the round's scope and event stream;
/// `intent_id` and `idempotency_key` are the journal's, for a journaled call. A read, or a tool
/// that stops on cancellation, is told of the round's cancellation; a dispatched mutating call of
/// any other tool is not (see [`call_cancel`]).
pub(crate) async fn run_job(
    env: &DispatchEnv,
    job: &Prepared,
    intent_id: Option<String>,
    idempotency_key: Option<String>,
) -> Result<Observation, ToolError> {
    let spec = &job.tool.spec;
    let ctx = CallContext {
        call_id: job.call.call_id.clone(),
        intent_id,
        idempotency_key,
        scope: env.scope.clone(),
        session: env.session.clone(),
        cancel: call_cancel(env, job),
        timeout_ms: spec.timeout_ms,
        events: EventSink(env.events.clone()),
        extensions: env.extensions.clone(),
    };
    run_tool(
        job.tool.tool.clone(),
        ctx,
        job.call.args.clone(),
        spec.timeout_ms,
    )
    .await
}

/// The cancellation token of one attempt. Once a mutating call was sent, cancelling it would
/// only turn its outcome unknown (an upstream request's cancellation says nothing about what the
/// upstream did): it runs on under its own deadline and is settled by its protocol, its result
/// recorded for the identical retry that waits for it. A read has no effect to lose, and a tool
/// that observes its own cancellation (a process ring0 kills) reports that as its outcome: both
/// follow the round.
fn call_cancel(env: &DispatchEnv, job: &Prepared) -> CancellationToken {
    let follows_round = env.stop_dispatched_on_cancel
        || job.tool.spec.effect.is_read_only()
        || job.tool.tool.on_cancel() == OnCancel::Stop;
    if follows_round {
        env.cancel.child_token()
    } else {
        CancellationToken::new()
    }
}

/// Runs one attempt of a tool call in its own task, under `timeout_ms`. On timeout the call's
/// cancellation token is cancelled and the task aborted.
pub(crate) async fn run_tool(
    tool: Arc<dyn Tool>,
    ctx: CallContext,
    args: Value,
    timeout_ms: u64,
) -> Result<Observation, ToolError> {
    let cancel = ctx.cancel.clone();
    // Its own task: a panic is this call's failure, not the round's.
    // The task carries the current span (the attempt's `dispatch`): what the tool does is
    // traced under it, and an upstream is told that span as its parent.
    let task = tokio::spawn(async move { tool.call(ctx, args).await }.in_current_span());
    let abort = task.abort_handle();
    match tokio::time::timeout(Duration::from_millis(timeout_ms), task).await {
        Ok(Ok(Ok(obs))) => Ok(obs),
        Ok(Ok(Err(e))) => Err(e),
        Ok(Err(join)) => Err(ToolError::unknown(format!("the tool crashed: {join}"))),
        Err(_) => {
            cancel.cancel();
            abort.abort();
            Err(ToolError::new(
                FailureClass::Timeout,
                format!("timed out after {timeout_ms} ms"),
            ))
        }
    }
}

/// Where a receipt made for the journal comes from: the call it answers and how it ran.
pub(crate) struct ReceiptOrigin<'a> {
    pub call_id: &'a str,
    pub index: usize,
    pub tool: &'a str,
    pub disposition: Disposition,
    pub timing: Timing,
    pub budget_bytes: usize,
    pub shape: &'a ShapeStage,
}

/// Classifies one attempt for the journal, with the receipt to store. The journal stamps the
/// receipt's identity and state ([`ring0_journal::record_outcome`]); the `uncertain` flag
/// says what that state will be, mirroring its rule: only an allow-listed error on a first
/// attempt (or any error of a read) is definite.
pub(crate) fn dispatch_outcome(
    record: &IntentRecord,
    origin: ReceiptOrigin<'_>,
    result: Result<Observation, ToolError>,
) -> DispatchOutcome {
    let receipt = |outcome| Receipt {
        timing: origin.timing,
        ..Receipt::new(
            origin.call_id.to_string(),
            origin.index,
            origin.tool.to_string(),
            origin.disposition,
            outcome,
        )
    };
    match result {
        Ok(obs) => DispatchOutcome::Applied(receipt(CallOutcome::Completed {
            observation: origin.shape.observation(obs, origin.budget_bytes),
        })),
        Err(e) => {
            let after_ambiguity = record.previous_state() == Some(IntentState::Reconciling);
            let definite =
                !record.mutating || (e.class.definitely_not_applied() && !after_ambiguity);
            DispatchOutcome::Failed {
                class: e.class,
                receipt: receipt(CallOutcome::Failed {
                    message: origin.shape.message(&e.message),
                    uncertain: !definite,
                    observation: e
                        .observation
                        .map(|o| origin.shape.observation(o, origin.budget_bytes)),
                }),
            }
        }
    }
}

/// The tool's pre-dispatch snapshot, taken only for tools settled by probe.
pub(crate) async fn snapshot(
    tool: &dyn Tool,
    settlement: Settlement,
    args: &Value,
) -> Option<Value> {
    if settlement != Settlement::Probe {
        return None;
    }
    tool.snapshot(args).await
}

/// The tool's probe finding. The observation of a probe that found the effect becomes the
/// evidence of the synthetic receipt, so it is shaped like any observation.
pub(crate) async fn probe(
    tool: &dyn Tool,
    args: &Value,
    record: &IntentRecord,
    budget_bytes: usize,
    shape: &ShapeStage,
) -> ProbeFinding {
    match tool.probe(args, record.snapshot.as_ref()).await {
        ProbeFinding::Applied(obs) => {
            ProbeFinding::Applied(Box::new(shape.observation(*obs, budget_bytes)))
        }
        other => other,
    }
}

/// The executor of one committed call of a live round.
pub(crate) struct CallExecutor<'a> {
    pub env: &'a DispatchEnv,
    pub job: &'a Prepared,
    pub queued_ms: u64,
    pub started: Instant,
    /// Dispatches made so far: the first is `Dispatched`, a later one `Recovered`, and none
    /// means the executor was never touched (a journal failure before dispatch fails closed).
    pub dispatches: AtomicU32,
    /// The call's `settle` span, opened once the first attempt's outcome is shaped and closed
    /// with the executor, after the journal settled the intent.
    settle: OnceLock<tracing::Span>,
}

impl<'a> CallExecutor<'a> {
    pub fn new(env: &'a DispatchEnv, job: &'a Prepared, queued_ms: u64) -> Self {
        Self {
            env,
            job,
            queued_ms,
            started: Instant::now(),
            dispatches: AtomicU32::new(0),
            settle: OnceLock::new(),
        }
    }

    /// The call's `settle` span, opened now if no attempt opened it yet.
    pub fn settle_span(&self) -> &tracing::Span {
        self.settle.get_or_init(|| {
            let call = &self.job.call;
            trace::call_stage(trace::SETTLE, &call.tool, &call.call_id)
        })
    }

    pub fn timing(&self) -> Timing {
        Timing {
            queued_ms: self.queued_ms,
            run_ms: ms(self.started.elapsed()),
        }
    }
}

#[async_trait]
impl Executor for CallExecutor<'_> {
    fn settlement(&self, _record: &IntentRecord) -> Settlement {
        self.job.tool.spec.settlement
    }

    async fn snapshot(&self, _record: &IntentRecord) -> Option<Value> {
        let spec = &self.job.tool.spec;
        snapshot(
            self.job.tool.tool.as_ref(),
            spec.settlement,
            &self.job.call.args,
        )
        .await
    }

    async fn dispatch(&self, record: &IntentRecord) -> DispatchOutcome {
        let (env, job) = (self.env, self.job);
        let spec = &job.tool.spec;
        let n = self.dispatches.fetch_add(1, Ordering::Relaxed);
        let span = trace::call_stage(trace::DISPATCH, &job.call.tool, &job.call.call_id);
        span.record("ring0.dispatch.attempt", n + 1);
        trace::record_intent(&span, &record.id, record.state);
        let result = run_job(
            env,
            job,
            Some(record.id.to_string()),
            record.mutating.then(|| record.idempotency_key.clone()),
        )
        .instrument(span.clone())
        .await;
        if let Err(e) = &result {
            trace::record_error(&span, trace::failure_kind(e.class));
        }
        drop(span);
        let origin = ReceiptOrigin {
            call_id: &job.call.call_id,
            index: job.call.index,
            tool: &job.call.tool,
            disposition: if n == 0 {
                Disposition::Dispatched
            } else {
                Disposition::Recovered
            },
            timing: self.timing(),
            budget_bytes: spec.observation_budget_bytes,
            shape: &env.shape,
        };
        let shape = trace::call_stage(trace::SHAPE, &job.call.tool, &job.call.call_id);
        let outcome = shape.in_scope(|| dispatch_outcome(record, origin, result));
        drop(shape);
        // Settling starts with this outcome: the journal records it, and reconciles it when
        // it is ambiguous.
        self.settle_span();
        outcome
    }

    async fn probe(&self, record: &IntentRecord) -> ProbeFinding {
        let tool = &self.job.tool;
        let call = &self.job.call;
        let span = self
            .settle_span()
            .in_scope(|| trace::call_stage(trace::PROBE, &call.tool, &call.call_id));
        trace::record_intent(&span, &record.id, record.state);
        let finding = probe(
            tool.tool.as_ref(),
            &call.args,
            record,
            tool.spec.observation_budget_bytes,
            &self.env.shape,
        )
        .instrument(span.clone())
        .await;
        span.record("ring0.probe.finding", trace::finding_kind(&finding));
        finding
    }
}

pub(crate) fn ms(d: Duration) -> u64 {
    d.as_millis().min(u64::MAX as u128) as u64
}
