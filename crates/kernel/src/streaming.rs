//! Streaming rounds and early execution.
//!
//! A host pushes provider stream events into a [`StreamingRound`]; each call is assembled the
//! moment its block completes ([`crate::assemble`]). A completed call starts *while the model is
//! still generating* only when all of these hold:
//! - it passed preparation (validation, policy, authorization, conflict key);
//! - the round overseer accepts it given the calls before it;
//! - its strategy is exactly `neutral` and its execution profile is complete
//!   (`tool_call_complete`, `parallel_with_generation`, `detached`, `at_most_once_per_round`).
//!
//! It then runs through the ordinary dispatcher — the same journal, accounting, events and error
//! handling — never a second executor. Everything else waits for the end of the round.
//!
//! The round ledger records every early start under `(turn_id, iteration,
//! original_action_index)` with the call's fingerprint, and lives in the session, so it survives
//! decision retries inside the turn: a provider retry that re-emits the same call — even with its
//! siblings reordered or dropped — finds it consumed, and the end of the round uses its receipt
//! without a second validation, write or execution.

use crate::admit::{RepeatDecision, check_tool_choice, guard_repeat};
use crate::assemble::{Assembled, StreamAssembler, StreamError};
use crate::dispatch::run_epochs;
use crate::events::Event;
use crate::plan::Epoch;
use crate::prepare::{PrepareContext, Prepared, prepare};
use crate::session::{Pre, RoundOptions, RoundOutcome, Session, SharedReceipt};
use crate::traits::starts_early;
use futures::FutureExt;
use ring0_core::call::RejectionKind;
use ring0_core::canonical::parse_strict;
use ring0_core::receipt::{CallOutcome, Disposition};
use ring0_core::{
    Fingerprint, ProposedArguments, ProposedCall, ProviderFormat, Receipt, Rejection, StrategySet,
};
use serde_json::Value;
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::time::Instant;
use tokio_util::sync::CancellationToken;

/// Turns whose early starts the ledger remembers; older turns are forgotten first.
pub const LEDGER_TURNS_MAX: usize = 64;

/// Which model decision a streamed round belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RoundIdentity {
    pub turn_id: String,
    /// The decision iteration inside the turn (the agent loop's step).
    pub iteration: u64,
}

impl RoundIdentity {
    pub fn new(turn_id: impl Into<String>, iteration: u64) -> Self {
        Self {
            turn_id: turn_id.into(),
            iteration,
        }
    }
}

#[derive(Clone)]
pub(crate) struct LedgerEntry {
    original_index: usize,
    fingerprint: Fingerprint,
    prepared: Prepared,
    receipt: SharedReceipt,
}

/// Early starts per round identity.
#[derive(Default)]
pub(crate) struct Ledger {
    turns: VecDeque<(RoundIdentity, Vec<LedgerEntry>)>,
}

impl Ledger {
    fn find(
        &self,
        id: &RoundIdentity,
        fp: &Fingerprint,
        used: &HashSet<usize>,
    ) -> Option<LedgerEntry> {
        let (_, entries) = self.turns.iter().find(|(k, _)| k == id)?;
        entries
            .iter()
            .find(|e| e.fingerprint == *fp && !used.contains(&e.original_index))
            .cloned()
    }

    fn record(&mut self, id: &RoundIdentity, entry: LedgerEntry) {
        if let Some((_, entries)) = self.turns.iter_mut().find(|(k, _)| k == id) {
            entries.push(entry);
            return;
        }
        if self.turns.len() >= LEDGER_TURNS_MAX {
            self.turns.pop_front();
        }
        self.turns.push_back((id.clone(), vec![entry]));
    }
}

/// What happened to a call as the stream went on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamNotice {
    /// The call's block is complete; it waits for the end of the round.
    Completed {
        index: usize,
        call_id: String,
        tool: String,
    },
    /// The call started while the model is still generating.
    EarlyStarted {
        index: usize,
        call_id: String,
        tool: String,
    },
    /// A retry re-emitted a call that already started early in this turn: it will not run again.
    AlreadyConsumed {
        index: usize,
        call_id: String,
        tool: String,
    },
    /// The call will never be complete; it gets a `stream_aborted` rejection.
    Aborted {
        index: usize,
        call_id: String,
        tool: String,
    },
}

/// One streamed model round on a session.
pub struct StreamingRound<'s> {
    session: &'s Session,
    identity: RoundIdentity,
    options: RoundOptions,
    assembler: StreamAssembler,
    started: Instant,
    calls: BTreeMap<usize, ProposedCall>,
    pre: BTreeMap<usize, Pre>,
    /// Strategies accepted so far, in stream order (the incremental round overseer).
    accepted: Vec<StrategySet>,
    /// Ledger entries already matched in this round.
    used: HashSet<usize>,
}

impl Session {
    /// Starts a streamed round. Push the provider's events with [`StreamingRound::push`], then
    /// [`StreamingRound::finish`] (or [`StreamingRound::abort`]) for the round's outcome.
    pub fn streaming_round(
        &self,
        format: ProviderFormat,
        identity: RoundIdentity,
        options: RoundOptions,
    ) -> StreamingRound<'_> {
        StreamingRound {
            session: self,
            identity,
            options,
            assembler: StreamAssembler::new(format),
            started: Instant::now(),
            calls: BTreeMap::new(),
            pre: BTreeMap::new(),
            accepted: Vec::new(),
            used: HashSet::new(),
        }
    }
}

/// The fingerprint of a call as proposed (before preparation), for recognizing re-emitted calls
/// without validating them again.
fn raw_fingerprint(call: &ProposedCall) -> Option<Fingerprint> {
    let value = match &call.arguments {
        ProposedArguments::Text(t) => parse_strict(t).ok()?,
        ProposedArguments::Value(v) => v.clone(),
        ProposedArguments::FreeForm(t) => {
            serde_json::json!({ ring0_core::call::FREE_FORM_INPUT: t })
        }
    };
    Fingerprint::compute(&call.tool, &value).ok()
}

impl StreamingRound<'_> {
    /// Feeds one provider stream event.
    pub async fn push(&mut self, event: &Value) -> Result<Vec<StreamNotice>, StreamError> {
        let items = self.assembler.push(event)?;
        Ok(self.absorb(items).await)
    }

    /// The stream is over: runs the rest of the round and returns its outcome, early calls'
    /// receipts included, in source order.
    pub async fn finish(mut self) -> RoundOutcome {
        let items = self.assembler.finish();
        self.absorb(items).await;
        self.conclude().await
    }

    /// The stream broke: open calls are rejected as `stream_aborted`; complete calls are
    /// decided as usual.
    pub async fn abort(mut self, why: &str) -> RoundOutcome {
        let items = self.assembler.abort(why);
        self.absorb(items).await;
        self.conclude().await
    }

    async fn conclude(self) -> RoundOutcome {
        let mut pre = self.pre;
        let mut calls = Vec::with_capacity(self.calls.len());
        let mut rekeyed = BTreeMap::new();
        for (pos, (index, call)) in self.calls.into_iter().enumerate() {
            if let Some(p) = pre.remove(&index) {
                rekeyed.insert(pos, p);
            }
            calls.push(call);
        }
        self.session
            .run_round_with(calls, &self.options, self.started, rekeyed)
            .await
    }

    async fn absorb(&mut self, items: Vec<Assembled>) -> Vec<StreamNotice> {
        let mut notices = Vec::with_capacity(items.len());
        for item in items {
            match item {
                Assembled::Complete(call) => notices.push(self.on_complete(call).await),
                Assembled::Aborted {
                    index,
                    call_id,
                    tool,
                    why,
                } => {
                    let r = Rejection::new(
                        RejectionKind::StreamAborted,
                        &tool,
                        &call_id,
                        format!("nothing was run: {why}"),
                    );
                    self.calls.insert(
                        index,
                        ProposedCall {
                            index,
                            call_id: call_id.clone(),
                            tool: tool.clone(),
                            arguments: ProposedArguments::Text(String::new()),
                            idempotency_key: None,
                        },
                    );
                    self.pre.insert(index, Pre::Rejected(r));
                    notices.push(StreamNotice::Aborted {
                        index,
                        call_id,
                        tool,
                    });
                }
            }
        }
        notices
    }

    /// A call this turn already started early is consumed: no second validation or run.
    async fn consume_from_ledger(&mut self, call: &ProposedCall) -> Option<StreamNotice> {
        let fp = raw_fingerprint(call)?;
        let entry = {
            let st = self.session.state.lock().await;
            st.ledger.find(&self.identity, &fp, &self.used)?
        };
        self.used.insert(entry.original_index);
        self.accepted.push(entry.prepared.tool.spec.strategy);
        let mut prepared = entry.prepared.clone();
        prepared.call.call_id = call.call_id.clone();
        prepared.call.index = call.index;
        self.pre.insert(
            call.index,
            Pre::Consumed {
                prepared,
                receipt: entry.receipt,
            },
        );
        Some(StreamNotice::AlreadyConsumed {
            index: call.index,
            call_id: call.call_id.clone(),
            tool: call.tool.clone(),
        })
    }

    /// A call whose block completed: consumed from the ledger, prepared, and started early when
    /// everything allows it; otherwise kept (prepared or refused) for the end of the round.
    async fn on_complete(&mut self, call: ProposedCall) -> StreamNotice {
        let index = call.index;
        self.calls.insert(index, call.clone());
        if let Some(notice) = self.consume_from_ledger(&call).await {
            return notice;
        }
        let completed = StreamNotice::Completed {
            index,
            call_id: call.call_id.clone(),
            tool: call.tool.clone(),
        };
        let prepared = match self.prepare_streamed(&call).await {
            Ok(p) => p,
            Err(r) => {
                self.pre.insert(index, Pre::Rejected(r));
                return completed;
            }
        };
        let Some(cancel) = self.admit_early(&call, &prepared) else {
            self.pre.insert(index, Pre::Prepared(prepared));
            return completed;
        };
        match self.start_early(&call, prepared, cancel).await {
            Ok(started) => started,
            Err(waits) => {
                self.pre.insert(index, waits);
                completed
            }
        }
    }

    /// The prepare stage for one streamed call, in the round's context.
    async fn prepare_streamed(&self, call: &ProposedCall) -> Result<Prepared, Rejection> {
        let cx = PrepareContext {
            registry: &self.session.kernel.registry,
            session: &self.session.info,
            authorizer: self.session.authorizer.as_ref(),
            rewrites: &self.session.kernel.rewrites,
            events: Some(crate::tool::EventSink(self.session.events.clone())),
            extensions: &self.options.extensions,
        };
        prepare(&cx, call).await
    }

    /// The incremental admission of a prepared call: the round overseer (its strategy against
    /// the calls accepted before it), then whether it may start early (tool choice, an exactly
    /// neutral strategy with the complete execution profile, the round not cancelled). Returns
    /// the round's cancellation token when it may start. A call the overseer refuses waits for
    /// the end of the round, which refuses it with the usual structured rejection.
    fn admit_early(
        &mut self,
        call: &ProposedCall,
        prepared: &Prepared,
    ) -> Option<CancellationToken> {
        let strategy = prepared.tool.spec.strategy;
        if self
            .accepted
            .iter()
            .any(|earlier| !earlier.admits_after(&strategy))
        {
            return None;
        }
        self.accepted.push(strategy);
        let choice_ok = check_tool_choice(&self.options.tool_choice, std::slice::from_ref(call))
            .rejections[0]
            .is_none();
        let cancel = self.session.current_cancel();
        (starts_early(&prepared.tool.spec) && choice_ok && !cancel.is_cancelled()).then_some(cancel)
    }

    /// Starts an admitted call through the ordinary dispatcher and records it in the ledger,
    /// under the session's state lock: not after the session was terminated, and only if the
    /// exact-repeat guard lets it run. `Err` is what the call waits with for the end of the
    /// round instead.
    async fn start_early(
        &mut self,
        call: &ProposedCall,
        prepared: Prepared,
        cancel: CancellationToken,
    ) -> Result<StreamNotice, Pre> {
        let raw = raw_fingerprint(call).unwrap_or(prepared.call.fingerprint);
        let mut st = self.session.state.lock().await;
        if st.terminated.is_some() {
            return Err(Pre::Prepared(prepared));
        }
        let decision = guard_repeat(
            &mut self.session.scope.repeat(),
            &prepared.call,
            prepared.idempotency_key.as_deref(),
            prepared.tool.spec.track_exact_repeats,
            &self.session.events,
        );
        match decision {
            RepeatDecision::Run { advisory } => {
                if advisory.is_some() {
                    st.pending_policy_message = advisory;
                }
            }
            // Refuses this fingerprint only; the scope's guard refuses it again next time.
            RepeatDecision::Refuse { rejection, .. } => return Err(Pre::Rejected(rejection)),
        }
        let env = self
            .session
            .dispatch_env(self.started, cancel, &self.options);
        let receipt = spawn_early(env, &prepared);
        let entry = LedgerEntry {
            original_index: call.index,
            fingerprint: raw,
            prepared: prepared.clone(),
            receipt: receipt.clone(),
        };
        st.ledger.record(&self.identity, entry);
        drop(st);
        self.used.insert(call.index);
        self.session.emit(Event::EarlyStarted {
            index: call.index,
            call_id: call.call_id.clone(),
            tool: call.tool.clone(),
        });
        self.pre
            .insert(call.index, Pre::Consumed { prepared, receipt });
        Ok(StreamNotice::EarlyStarted {
            index: call.index,
            call_id: call.call_id.clone(),
            tool: call.tool.clone(),
        })
    }
}

/// Starts a call through the ordinary dispatcher, as a one-call epoch in its own task; its
/// receipt can be awaited from the stream and from the end of the round.
fn spawn_early(env: crate::dispatch::DispatchEnv, prepared: &Prepared) -> SharedReceipt {
    let fallback = prepared.clone();
    let task = tokio::spawn(tracing::Instrument::in_current_span(run_epochs(
        env,
        vec![prepared.clone()],
        vec![Epoch {
            calls: vec![0],
            barrier: false,
        }],
    )));
    async move {
        match task.await {
            Ok(mut receipts) if !receipts.is_empty() => receipts.remove(0),
            _ => crate::dispatch::Dispatched {
                receipt: crashed(&fallback),
                answered_by: None,
            },
        }
    }
    .boxed()
    .shared()
}

/// The receipt of an early call whose task died: the outcome is unknown.
fn crashed(p: &Prepared) -> Receipt {
    Receipt::new(
        p.call.call_id.clone(),
        p.call.index,
        p.call.tool.clone(),
        Disposition::Dispatched,
        CallOutcome::Failed {
            message: "the early execution task ended without a receipt".into(),
            uncertain: true,
            observation: None,
        },
    )
}
