//! A turn's board: what the turn waits for the host to do.
//!
//! A host tool's call, and a call a person must approve, are posted here as a
//! [`PendingAction`] by the code that waits for it inside the kernel round (the host tool's
//! executor, the approval channel). The board travels with the round as a
//! [`ring0_kernel::CallExtensions`] value — per-call context, never a table keyed by call id —
//! and the host's outcomes are handed to the waiting code through it. Answering is all or
//! nothing: every outcome of a request is checked against the board before any is delivered.

use crate::error::ApiError;
use crate::limits::OUTCOME_TEXT_BYTES_MAX;
use crate::model::{ActionKind, HostFailure, Outcome, PendingAction};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use tokio::sync::{oneshot, watch};

/// The board of the turn a call belongs to, as the round carries it
/// ([`ring0_kernel::CallExtensions`]).
pub(crate) struct TurnLink(pub(crate) Arc<Board>);

/// The host's answer to one action.
#[derive(Debug)]
pub(crate) enum Answer {
    /// A run's result, or its failure.
    Ran(Result<Value, HostFailure>),
    /// An approval's decision.
    Decided {
        approve: bool,
        remember: bool,
        reason: String,
    },
}

struct Open {
    action: PendingAction,
    answer: oneshot::Sender<Answer>,
}

#[derive(Default)]
struct Slots {
    /// By posting order.
    open: BTreeMap<u64, Open>,
    posted: u64,
    /// Set when the session ends: nothing more is posted, waiting code is told.
    closed: bool,
}

/// What one turn waits for the host to do.
pub(crate) struct Board {
    slots: Mutex<Slots>,
    /// Bumped on every change, for whoever waits for the turn to need the host.
    version: watch::Sender<u64>,
    /// The session's event stream, told of each action posted.
    events: crate::events::EventStream,
    turn: String,
}

/// Keeps an action on the board while its poster waits; taking it off when dropped (answered,
/// timed out, or cancelled).
pub(crate) struct Posted {
    board: Arc<Board>,
    slot: u64,
}

impl Drop for Posted {
    fn drop(&mut self) {
        let removed = self
            .board
            .slots
            .lock()
            .expect("board")
            .open
            .remove(&self.slot)
            .is_some();
        if removed {
            self.board.bump();
        }
    }
}

impl Board {
    pub(crate) fn new(turn: String, events: crate::events::EventStream) -> Arc<Self> {
        Arc::new(Self {
            slots: Mutex::default(),
            version: watch::channel(0).0,
            events,
            turn,
        })
    }

    fn bump(&self) {
        self.version.send_modify(|v| *v += 1);
    }

    /// Watches the board's changes.
    pub(crate) fn watch(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    /// Posts `action`; `None` when the session ended (nothing can answer it).
    pub(crate) fn post(
        self: &Arc<Self>,
        action: PendingAction,
    ) -> Option<(Posted, oneshot::Receiver<Answer>)> {
        let (tx, rx) = oneshot::channel();
        let slot = {
            let mut slots = self.slots.lock().expect("board");
            if slots.closed {
                return None;
            }
            slots.posted += 1;
            let slot = slots.posted;
            self.events.send(serde_json::json!({
                "event": "pending", "turn": self.turn, "action": action.id,
                "kind": action.kind, "tool": action.tool, "call_id": action.call_id,
            }));
            slots.open.insert(slot, Open { action, answer: tx });
            slot
        };
        self.bump();
        Some((
            Posted {
                board: self.clone(),
                slot,
            },
            rx,
        ))
    }

    /// The actions waiting for the host, in the order they were posted.
    pub(crate) fn open_actions(&self) -> Vec<PendingAction> {
        let slots = self.slots.lock().expect("board");
        slots.open.values().map(|o| o.action.clone()).collect()
    }

    /// Hands each outcome to the code waiting for it — all of them, or none when any does not
    /// fit (unknown or repeated id, a run answered like an approval, a changed digest).
    pub(crate) fn answer(&self, outcomes: Vec<Outcome>) -> Result<usize, ApiError> {
        let mut slots = self.slots.lock().expect("board");
        let mut seen = BTreeSet::new();
        let mut plan = Vec::with_capacity(outcomes.len());
        for (i, outcome) in outcomes.into_iter().enumerate() {
            let loc = format!("/outcomes/{i}");
            if !seen.insert(outcome.id.clone()) {
                return Err(ApiError::invalid(
                    format!("{loc}/id"),
                    format!("action {:?} is answered twice in this request", outcome.id),
                ));
            }
            let Some((&slot, open)) = slots.open.iter().find(|(_, o)| o.action.id == outcome.id)
            else {
                return Err(ApiError::not_found(format!(
                    "no action {:?} waits in this turn (answered already, timed out, or never posted)",
                    outcome.id
                ))
                .at(format!("{loc}/id"), "unknown action"));
            };
            let answer = answer_for(&open.action, outcome, &loc)?;
            plan.push((slot, answer));
        }
        let answered = plan.len();
        for (slot, answer) in plan {
            if let Some(open) = slots.open.remove(&slot) {
                // The waiting code may have given up a moment ago: its outcome is then
                // settled as unknown, which the journal already recorded.
                let _ = open.answer.send(answer);
            }
        }
        drop(slots);
        if answered > 0 {
            self.bump();
        }
        Ok(answered)
    }

    /// The session ended: waiting code is told (its senders dropped), nothing more is posted.
    pub(crate) fn close(&self) {
        let mut slots = self.slots.lock().expect("board");
        slots.closed = true;
        slots.open.clear();
        drop(slots);
        self.bump();
    }
}

fn bounded(text: &str) -> String {
    ring0_core::limits::clip_with_length(text, OUTCOME_TEXT_BYTES_MAX).into_owned()
}

/// The answer an outcome gives an action, or why it does not fit it.
fn answer_for(action: &PendingAction, outcome: Outcome, loc: &str) -> Result<Answer, ApiError> {
    match action.kind {
        ActionKind::Run => {
            if outcome.approve.is_some() {
                return Err(ApiError::invalid(
                    format!("{loc}/approve"),
                    "this action is a run: report its output or error, not an approval",
                ));
            }
            match (outcome.output, outcome.error) {
                (Some(output), None) => Ok(Answer::Ran(Ok(output))),
                (None, Some(mut failure)) => {
                    failure.message = bounded(&failure.message);
                    Ok(Answer::Ran(Err(failure)))
                }
                _ => Err(ApiError::invalid(
                    loc.to_string(),
                    "a run's outcome has exactly one of output and error",
                )),
            }
        }
        ActionKind::ApprovalRequired => {
            if outcome.output.is_some() || outcome.error.is_some() {
                return Err(ApiError::invalid(
                    loc.to_string(),
                    "this action asks for approval: report approve, not an output",
                ));
            }
            let Some(approve) = outcome.approve else {
                return Err(ApiError::invalid(
                    format!("{loc}/approve"),
                    "an approval's outcome says approve: true or false",
                ));
            };
            if let (Some(given), Some(expected)) = (&outcome.args_hash, &action.args_hash)
                && given != expected
            {
                return Err(ApiError::conflict(format!(
                    "args_hash {given:?} is not the held call's ({expected:?}): an approval binds to the arguments shown"
                ))
                .at(format!("{loc}/args_hash"), "not the held call's digest"));
            }
            Ok(Answer::Decided {
                approve,
                remember: outcome.remember,
                reason: bounded(
                    outcome
                        .reason
                        .as_deref()
                        .unwrap_or("the host declined the call"),
                ),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn action(id: &str, kind: ActionKind) -> PendingAction {
        PendingAction {
            id: id.into(),
            kind,
            call_id: format!("call_{id}"),
            tool: "t".into(),
            arguments: json!({}),
            input: None,
            intent_id: None,
            idempotency_key: None,
            args_hash: Some("v1:aa".into()),
            reason: None,
            summary: None,
            deadline_ms: 0,
        }
    }

    fn outcome(id: &str, output: Option<Value>, approve: Option<bool>) -> Outcome {
        Outcome {
            id: id.into(),
            output,
            error: None,
            approve,
            remember: false,
            reason: None,
            args_hash: None,
        }
    }

    #[test]
    fn outcomes_are_delivered_all_or_none() {
        let board = Board::new("turn_1".into(), Default::default());
        let (_run, mut run_rx) = board.post(action("a", ActionKind::Run)).unwrap();
        let (_held, mut held_rx) = board
            .post(action("b", ActionKind::ApprovalRequired))
            .unwrap();
        let refused = board.answer(vec![
            outcome("a", Some(json!(1)), None),
            outcome("b", Some(json!(2)), None),
        ]);
        assert_eq!(refused.unwrap_err().errors[0].loc, "/outcomes/1");
        assert!(run_rx.try_recv().is_err(), "nothing is delivered");
        assert_eq!(board.open_actions().len(), 2);
        let repeated = board.answer(vec![
            outcome("a", Some(json!(1)), None),
            outcome("a", Some(json!(1)), None),
        ]);
        assert!(repeated.is_err());
        assert_eq!(
            board
                .answer(vec![
                    outcome("a", Some(json!(1)), None),
                    outcome("b", None, Some(true)),
                ])
                .unwrap(),
            2
        );
        assert!(matches!(run_rx.try_recv(), Ok(Answer::Ran(Ok(_)))));
        assert!(matches!(
            held_rx.try_recv(),
            Ok(Answer::Decided { approve: true, .. })
        ));
        assert!(board.open_actions().is_empty());
    }

    #[test]
    fn a_closed_board_takes_nothing_and_tells_whoever_waits() {
        let board = Board::new("turn_1".into(), Default::default());
        let (_posted, mut rx) = board.post(action("a", ActionKind::Run)).unwrap();
        board.close();
        assert!(matches!(
            rx.try_recv(),
            Err(oneshot::error::TryRecvError::Closed)
        ));
        assert!(board.post(action("b", ActionKind::Run)).is_none());
    }

    #[test]
    fn an_action_leaves_the_board_when_its_poster_stops_waiting() {
        let board = Board::new("turn_1".into(), Default::default());
        let (posted, _rx) = board.post(action("a", ActionKind::Run)).unwrap();
        assert_eq!(board.open_actions().len(), 1);
        drop(posted);
        assert!(board.open_actions().is_empty());
    }
}
