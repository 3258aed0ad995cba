//! One round, stage by stage: ingest, prepare, admit, plan, then commit, dispatch, settle and
//! shape (per call, in `dispatch`, `settle` and `shape`), and project.
//!
//! [`Session::run_round_with`] reads like the pipeline diagram: each stage is a function named
//! for it, and each fills in the receipts of the calls it decides, so a call refused early never
//! reaches a later stage. The session's state is held for the whole round: rounds of one session
//! run one after another.

use crate::admit::{RepeatDecision, ToolChoiceCheck, check_tool_choice, guard_repeat, oversee};
use crate::dispatch::{DispatchEnv, run_epochs};
use crate::events::Event;
use crate::plan::{Epoch, plan};
use crate::prepare::{PrepareContext, Prepared, prepare};
use crate::project::{project_with_notice, projection_failed_result};
use crate::session::{
    Pre, RoundOptions, RoundOutcome, Session, SessionState, SharedReceipt, Termination,
};
use crate::trace;
use ring0_core::call::RejectionKind;
use ring0_core::limits::CALLS_PER_ROUND_MAX;
use ring0_core::receipt::CallOutcome;
use ring0_core::{ProposedCall, Receipt, Rejection, ToolResult};
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Instant;
use tracing::Instrument;

/// The receipts of one round as its stages decide them, by position.
struct RoundBook<'a> {
    session: &'a Session,
    calls: &'a [ProposedCall],
    receipts: Vec<Option<Receipt>>,
    /// The intent whose result answers each call, by position (for its delivery ticket).
    answered_by: Vec<Option<uuid::Uuid>>,
    /// Prepared arguments by position, for the projector.
    args: BTreeMap<usize, Value>,
    /// The repeat guard's advisory, by the position of the call that reached it: shown to the
    /// model with that call's result.
    notices: BTreeMap<usize, String>,
}

impl<'a> RoundBook<'a> {
    fn new(session: &'a Session, calls: &'a [ProposedCall]) -> Self {
        Self {
            session,
            calls,
            receipts: vec![None; calls.len()],
            answered_by: vec![None; calls.len()],
            args: BTreeMap::new(),
            notices: BTreeMap::new(),
        }
    }

    /// A call refused before dispatch.
    fn reject(&mut self, pos: usize, r: Rejection) {
        self.session.emit(Event::CallRejected {
            index: self.calls[pos].index,
            call_id: r.call_id.clone(),
            tool: r.tool_name.clone(),
            kind: r.status,
        });
        self.receipts[pos] = Some(Receipt::rejected(self.calls[pos].index, r));
    }
}

/// What ingest leaves for the later stages.
struct Ingested {
    /// Calls to prepare, by position; `Some` when a streaming round already prepared them.
    candidates: Vec<(usize, Option<Prepared>)>,
    /// Calls a streaming round started early: they ran through the dispatcher once and are not
    /// validated, written or executed again.
    early: Vec<(usize, Prepared, SharedReceipt)>,
}

/// What admit accepted, and whether the run ends.
struct Admitted {
    accepted: Vec<(usize, Prepared)>,
    terminated: Option<Termination>,
    policy_message: Option<String>,
}

impl Session {
    /// [`Session::run_round`] for calls some of which a streaming round already prepared,
    /// rejected or started early (`pre`, by position).
    pub(crate) async fn run_round_with(
        &self,
        calls: Vec<ProposedCall>,
        options: &RoundOptions,
        round_start: Instant,
        pre: BTreeMap<usize, Pre>,
    ) -> RoundOutcome {
        let cancel = self.current_cancel();
        let mut st = self.state.lock().await;
        st.rounds += 1;
        let round_no = st.rounds;
        self.emit(Event::RoundStarted {
            round: round_no,
            calls: calls.len(),
        });
        let mut book = RoundBook::new(self, &calls);
        let ingested = ingest(&mut book, pre, st.terminated.as_ref());
        let prepared = self
            .prepare_round(&mut book, ingested.candidates, options)
            .await;
        let choice = check_tool_choice(&options.tool_choice, &calls);
        let admitted = {
            let span = trace::admit_stage(calls.len());
            let _in_admit = span.enter();
            let admitted = admit_round(&mut book, &mut st, prepared, &ingested.early, &choice);
            span.record("ring0.round.accepted", admitted.accepted.len());
            if admitted.terminated.is_some() {
                span.record("ring0.repeat_guard", "terminated");
            }
            admitted
        };
        drop(st);
        let epochs = plan_round(self, &admitted.accepted);
        let env = self.dispatch_env(round_start, cancel, options);
        dispatch_round(&mut book, admitted.accepted, epochs, ingested.early, env).await;
        let mut terminated = admitted.terminated;
        let deliveries = book
            .answered_by
            .iter()
            .map(|id| id.map(|id| crate::DeliveryTicket::new(self.kernel.journal.clone(), id)))
            .collect();
        let (receipts, results) = project_round(book, &mut terminated);
        if let Some(failed @ Termination::ProjectionFailed { .. }) = &terminated {
            // A repeat termination refuses its own fingerprint only (the scope's guard); a
            // failed projection ends the session.
            self.state.lock().await.terminated = Some(failed.clone());
        }
        self.emit(Event::RoundFinished {
            round: round_no,
            terminated: terminated.is_some(),
        });
        RoundOutcome {
            receipts,
            deliveries,
            results,
            terminated,
            policy_message: admitted.policy_message,
            missing_required_call: choice.missing_call,
        }
    }

    /// Prepare: every candidate, concurrently; everything finishes before anything is
    /// dispatched.
    async fn prepare_round(
        &self,
        book: &mut RoundBook<'_>,
        candidates: Vec<(usize, Option<Prepared>)>,
        options: &RoundOptions,
    ) -> Vec<(usize, Prepared)> {
        let cx = PrepareContext {
            registry: &self.kernel.registry,
            session: &self.info,
            authorizer: self.authorizer.as_ref(),
            rewrites: &self.kernel.rewrites,
            events: Some(crate::tool::EventSink(self.events.clone())),
            extensions: &options.extensions,
        };
        let calls = book.calls;
        let results = futures::future::join_all(candidates.into_iter().map(|(pos, ready)| {
            let cx = &cx;
            async move {
                let result = match ready {
                    Some(p) => Ok(p),
                    None => {
                        let call = &calls[pos];
                        let span = trace::call_stage(trace::PREPARE, &call.tool, &call.call_id);
                        let prepared = prepare(cx, call).instrument(span.clone()).await;
                        if let Err(r) = &prepared {
                            trace::record_error(&span, r.status.as_str());
                        }
                        prepared
                    }
                };
                (pos, result)
            }
        }))
        .await;
        let mut prepared = Vec::with_capacity(results.len());
        for (pos, result) in results {
            match result {
                Ok(p) => prepared.push((pos, p)),
                Err(r) => book.reject(pos, r),
            }
        }
        prepared
    }
}

/// Ingest: sorts the round's calls into those a streaming round already decided and those to
/// prepare; refuses every call of a terminated run and every call of an oversized round.
fn ingest(
    book: &mut RoundBook<'_>,
    mut pre: BTreeMap<usize, Pre>,
    terminated: Option<&Termination>,
) -> Ingested {
    let n = book.calls.len();
    let mut out = Ingested {
        candidates: Vec::new(),
        early: Vec::new(),
    };
    for pos in 0..n {
        let call = &book.calls[pos];
        let ready = match pre.remove(&pos) {
            Some(Pre::Consumed { prepared, receipt }) => {
                out.early.push((pos, prepared, receipt));
                continue;
            }
            Some(Pre::Rejected(r)) => {
                book.reject(pos, r);
                continue;
            }
            Some(Pre::Prepared(p)) => Some(p),
            None => None,
        };
        if let Some(t) = terminated {
            let r = Rejection::new(
                RejectionKind::RepeatTerminated,
                &call.tool,
                &call.call_id,
                format!("this run was terminated ({t:?}); no further calls run"),
            );
            book.reject(pos, r);
        } else if n > CALLS_PER_ROUND_MAX {
            let r = Rejection::new(
                RejectionKind::RoundLimit,
                &call.tool,
                &call.call_id,
                format!("{n} calls in one round; at most {CALLS_PER_ROUND_MAX} are accepted"),
            );
            book.reject(pos, r);
        } else {
            out.candidates.push((pos, ready));
        }
    }
    out
}

/// Admit: the tool choice, then the round overseer, then the exact-repeat guard, in source
/// order. Calls started early count as accepted before the calls after them.
fn admit_round(
    book: &mut RoundBook<'_>,
    st: &mut SessionState,
    prepared: Vec<(usize, Prepared)>,
    early: &[(usize, Prepared, SharedReceipt)],
    choice: &ToolChoiceCheck,
) -> Admitted {
    let mut candidates: Vec<(usize, Prepared, bool)> = Vec::new();
    for (pos, p) in prepared {
        match choice.rejections[pos].clone() {
            Some(r) => book.reject(pos, r),
            None => candidates.push((pos, p, false)),
        }
    }
    candidates.extend(early.iter().map(|(pos, p, _)| (*pos, p.clone(), true)));
    candidates.sort_by_key(|(pos, _, _)| *pos);
    let verdicts = oversee(
        &candidates
            .iter()
            .map(|(_, p, _)| {
                let strategy = p.tool.spec.strategy;
                (p.call.tool.as_str(), p.call.call_id.as_str(), strategy)
            })
            .collect::<Vec<_>>(),
    );
    let mut admitted = Admitted {
        accepted: Vec::new(),
        terminated: None,
        policy_message: st.pending_policy_message.take(),
    };
    for ((pos, p, started_early), verdict) in candidates.into_iter().zip(verdicts) {
        if started_early {
            book.args.insert(pos, p.call.args.clone());
        } else if let Some(r) = verdict {
            book.reject(pos, r);
        } else {
            let tracked = p.tool.spec.track_exact_repeats;
            let decision = guard_repeat(
                &mut book.session.scope.repeat(),
                &p.call,
                p.idempotency_key.as_deref(),
                tracked,
                &book.session.events,
            );
            match decision {
                RepeatDecision::Run { advisory } => {
                    if let Some(advisory) = advisory {
                        book.notices.insert(pos, advisory.clone());
                        admitted.policy_message = Some(advisory);
                    }
                    admitted.accepted.push((pos, p));
                }
                RepeatDecision::Refuse {
                    rejection,
                    termination,
                } => {
                    book.reject(pos, rejection);
                    admitted.terminated = Some(termination);
                }
            }
        }
    }
    admitted
}

/// Plan: the accepted calls in execution epochs under the session's scheduling mode.
fn plan_round(session: &Session, accepted: &[(usize, Prepared)]) -> Vec<Epoch> {
    plan(
        session.config.mode,
        &accepted
            .iter()
            .map(|(_, p)| (p.tool.spec.effect, p.tool.spec.concurrency))
            .collect::<Vec<_>>(),
    )
}

/// Commit, dispatch, settle and shape, per epoch (in `dispatch`); then the receipts of the
/// calls started early.
async fn dispatch_round(
    book: &mut RoundBook<'_>,
    accepted: Vec<(usize, Prepared)>,
    epochs: Vec<Epoch>,
    early: Vec<(usize, Prepared, SharedReceipt)>,
    env: DispatchEnv,
) {
    let mut positions = Vec::with_capacity(accepted.len());
    let mut jobs = Vec::with_capacity(accepted.len());
    for (pos, p) in accepted {
        book.args.insert(pos, p.call.args.clone());
        positions.push(pos);
        jobs.push(p);
    }
    let dispatched = run_epochs(env, jobs, epochs).await;
    for (pos, _, receipt) in early {
        let done = receipt.await;
        let mut r = done.receipt;
        r.call_id = book.calls[pos].call_id.clone();
        r.index = book.calls[pos].index;
        book.receipts[pos] = Some(r);
        book.answered_by[pos] = done.answered_by;
    }
    for (pos, done) in positions.into_iter().zip(dispatched) {
        book.answered_by[pos] = done.answered_by;
        let receipt = done.receipt;
        if let CallOutcome::Rejected { rejection } = &receipt.outcome {
            book.session.emit(Event::CallRejected {
                index: receipt.index,
                call_id: rejection.call_id.clone(),
                tool: rejection.tool_name.clone(),
                kind: rejection.status,
            });
        }
        book.receipts[pos] = Some(receipt);
    }
}

/// Project: every receipt, in source order, into what the model sees. A host projector's failure
/// ends the run.
fn project_round(
    book: RoundBook<'_>,
    terminated: &mut Option<Termination>,
) -> (Vec<Receipt>, Vec<ToolResult>) {
    let session = book.session;
    let receipts: Vec<Receipt> = book
        .receipts
        .into_iter()
        .map(|r| r.expect("every call has a receipt"))
        .collect();
    let projector = session.config.projector.as_deref();
    let mut results = Vec::with_capacity(receipts.len());
    for (pos, receipt) in receipts.iter().enumerate() {
        if session.events.is_watched() {
            session.emit(Event::Receipt(Box::new(receipt.clone())));
        }
        let span = trace::call_stage(trace::PROJECT, &receipt.tool, &receipt.call_id);
        let _in_project = span.enter();
        let notice = book.notices.get(&pos).map(String::as_str);
        let (content, failed) =
            match project_with_notice(receipt, book.args.get(&pos), projector, notice) {
                Ok(v) => (v, false),
                Err(failure) => {
                    trace::record_error(&span, "projection_failed");
                    session.emit(Event::ProjectionFailed {
                        index: receipt.index,
                        call_id: receipt.call_id.clone(),
                        why: failure.0,
                    });
                    if terminated.is_none() {
                        *terminated = Some(Termination::ProjectionFailed {
                            call_id: receipt.call_id.clone(),
                        });
                    }
                    (projection_failed_result(receipt), true)
                }
            };
        results.push(ToolResult {
            call_id: receipt.call_id.clone(),
            tool: receipt.tool.clone(),
            is_error: receipt.is_error()
                || failed
                || content.get("status") == Some(&Value::from("projection_failed")),
            content,
            free_form: book.calls[pos].arguments.is_free_form(),
        });
    }
    (receipts, results)
}
