//! Turns: one model message through the kernel, answered when every call is answered or when
//! the turn waits for the host.
//!
//! A turn's round runs in a task of its own, so that it outlives the request that started it:
//! the host's outcomes arrive in later requests, and a host whose response was lost reads the
//! turn again. Each request waits (bounded by `wait_ms`) for one of: the round finished
//! (`complete`, with the results rendered in the turn's format), actions on the turn's board
//! (`pending`), or the wait ran out (`running`). A complete turn's results are reported
//! delivered once its response body has left ring0, so a host that never received them and
//! sends the same message again is answered from the journal rather than running the calls a
//! second time.

use crate::board::{Board, TurnLink};
use crate::limits::PENDING_COALESCE_YIELDS;
use crate::model::{TurnResponse, TurnStatus};
use ring0_core::format::render_results;
use ring0_core::{ProviderFormat, Round};
use ring0_kernel::{CallExtensions, RoundOptions, RoundOutcome};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// What a finished turn answers.
pub(crate) struct Finished {
    pub results: Value,
    pub outcome: RoundOutcome,
}

/// One turn of a session.
pub(crate) struct Turn {
    pub id: String,
    pub board: Arc<Board>,
    done: watch::Sender<Option<Arc<Finished>>>,
}

impl Turn {
    pub(crate) fn is_finished(&self) -> bool {
        self.done.borrow().is_some()
    }

    /// Starts `round` on `session` in a task of its own.
    pub(crate) fn start(
        id: String,
        session: Arc<ring0_kernel::Session>,
        format: ProviderFormat,
        round: Round,
        events: crate::events::EventStream,
    ) -> Arc<Self> {
        let board = Board::new(id.clone(), events.clone());
        let turn = Arc::new(Self {
            id: id.clone(),
            board: board.clone(),
            done: watch::channel(None).0,
        });
        let options = RoundOptions {
            extensions: CallExtensions::new().with(TurnLink(board)),
            ..RoundOptions::default()
        };
        let running = turn.clone();
        tokio::spawn(async move {
            let outcome = session.run_round(round, &options).await;
            let results = render_results(format, &outcome.results);
            running
                .done
                .send_replace(Some(Arc::new(Finished { results, outcome })));
            events.send(json!({"event": "turn_finished", "turn": id}));
        });
        turn
    }

    /// Waits up to `wait` for the turn to finish or to need the host, and says where it stands.
    pub(crate) async fn progress(&self, wait: Duration) -> (TurnResponse, Option<Arc<Finished>>) {
        let deadline = tokio::time::Instant::now() + wait;
        let mut done = self.done.subscribe();
        let mut board = self.board.watch();
        loop {
            if let Some(finished) = done.borrow_and_update().clone() {
                return (self.complete(&finished), Some(finished));
            }
            board.borrow_and_update();
            if !self.board.open_actions().is_empty() {
                // Actions one epoch raises together are answered together.
                for _ in 0..PENDING_COALESCE_YIELDS {
                    tokio::task::yield_now().await;
                }
                if let Some(finished) = done.borrow().clone() {
                    return (self.complete(&finished), Some(finished));
                }
                return (self.view(TurnStatus::Pending), None);
            }
            tokio::select! {
                _ = done.changed() => {}
                _ = board.changed() => {}
                _ = tokio::time::sleep_until(deadline) => {
                    return (self.view(TurnStatus::Running), None);
                }
            }
        }
    }

    fn view(&self, status: TurnStatus) -> TurnResponse {
        TurnResponse {
            turn: self.id.clone(),
            status,
            results: None,
            pending: self.board.open_actions(),
            terminated: None,
            policy_message: None,
        }
    }

    fn complete(&self, finished: &Finished) -> TurnResponse {
        TurnResponse {
            turn: self.id.clone(),
            status: TurnStatus::Complete,
            results: Some(finished.results.clone()),
            pending: Vec::new(),
            terminated: finished
                .outcome
                .terminated
                .as_ref()
                .and_then(|t| serde_json::to_value(t).ok()),
            policy_message: finished.outcome.policy_message.clone(),
        }
    }
}
