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
use crate::events::EventStream;
use crate::limits::PENDING_COALESCE_YIELDS;
use crate::model::{TurnResponse, TurnStatus};
use ring0_core::format::render_results;
use ring0_core::{ProviderFormat, Round};
use ring0_kernel::{CallExtensions, RoundIdentity, RoundOptions, RoundOutcome};
use serde_json::{Value, json};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::{mpsc, watch};

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
    /// Why a streamed turn's stream broke, once it did.
    stream_error: OnceLock<String>,
}

/// What the request carrying a streamed turn hands its round.
pub(crate) enum Feed {
    /// One provider stream event.
    Event(Value),
    /// The stream ended as the provider ends it.
    End,
    /// The stream could not be read on: why.
    Broken(String),
}

impl Turn {
    pub(crate) fn is_finished(&self) -> bool {
        self.done.borrow().is_some()
    }

    fn new(id: &str, events: &crate::events::EventStream) -> (Arc<Self>, RoundOptions) {
        let board = Board::new(id.to_string(), events.clone());
        let turn = Arc::new(Self {
            id: id.to_string(),
            board: board.clone(),
            done: watch::channel(None).0,
            stream_error: OnceLock::new(),
        });
        let options = RoundOptions {
            extensions: CallExtensions::new().with(TurnLink(board)),
            ..RoundOptions::default()
        };
        (turn, options)
    }

    fn finish(&self, format: ProviderFormat, outcome: RoundOutcome, events: &EventStream) {
        let results = render_results(format, &outcome.results);
        self.done
            .send_replace(Some(Arc::new(Finished { results, outcome })));
        events.send(json!({"event": "turn_finished", "turn": self.id}));
    }

    /// Starts `round` on `session` in a task of its own.
    pub(crate) fn start(
        id: String,
        session: Arc<ring0_kernel::Session>,
        format: ProviderFormat,
        round: Round,
        events: EventStream,
    ) -> Arc<Self> {
        let (turn, options) = Self::new(&id, &events);
        let running = turn.clone();
        tokio::spawn(async move {
            let outcome = session.run_round(round, &options).await;
            running.finish(format, outcome, &events);
        });
        turn
    }

    /// Starts a streamed round on `session` in a task of its own, fed the provider's events by
    /// `feed` as they arrive: each call is decided the moment its block is complete, and one
    /// that may start early runs while the stream goes on. A feed that breaks (or whose
    /// sender goes away before [`Feed::End`]) aborts the stream: complete calls are decided as
    /// usual, open ones answered `stream_aborted`.
    pub(crate) fn start_streaming(
        id: String,
        session: Arc<ring0_kernel::Session>,
        format: ProviderFormat,
        identity: RoundIdentity,
        mut feed: mpsc::Receiver<Feed>,
        events: EventStream,
    ) -> Arc<Self> {
        let (turn, options) = Self::new(&id, &events);
        let running = turn.clone();
        tokio::spawn(async move {
            let mut round = session.streaming_round(format, identity, options);
            let broke = loop {
                match feed.recv().await {
                    Some(Feed::Event(event)) => {
                        if let Err(e) = round.push(&event).await {
                            break Some(e.to_string());
                        }
                    }
                    Some(Feed::End) => break None,
                    Some(Feed::Broken(why)) => break Some(why),
                    None => break Some("the request carrying the stream ended before it".into()),
                }
            };
            drop(feed);
            let outcome = match &broke {
                Some(why) => round.abort(why).await,
                None => round.finish().await,
            };
            if let Some(why) = broke {
                let _ = running.stream_error.set(why);
            }
            running.finish(format, outcome, &events);
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
            stream_error: self.stream_error.get().cloned(),
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
            stream_error: self.stream_error.get().cloned(),
        }
    }
}
