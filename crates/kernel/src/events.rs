//! Host events, in completion order.
//!
//! Events go to a bounded broadcast channel: a host that falls behind by more than
//! [`EVENTS_BUFFER_MAX`] events is told how many it missed (`RecvError::Lagged`) instead of the
//! kernel blocking or growing without bound. Events never carry argument values: only tool
//! names, call ids, fingerprints and states.

use ring0_core::call::RejectionKind;
use ring0_core::receipt::Receipt;
use ring0_core::{Fingerprint, IntentState};
use serde::Serialize;

/// Events buffered per session for slow subscribers.
pub const EVENTS_BUFFER_MAX: usize = 4096;

/// A session's event channel, allocated when the first subscriber arrives.
///
/// A broadcast channel of [`EVENTS_BUFFER_MAX`] slots is hundreds of KiB, allocated and
/// initialised up front; a host that opens a session per request (the MCP gateway does, for
/// overlapping calls) and never subscribes would pay that on every call. Until someone
/// subscribes, sending is a no-op — exactly what a channel without receivers does.
#[derive(Debug, Clone, Default)]
pub(crate) struct EventHub(
    std::sync::Arc<std::sync::OnceLock<tokio::sync::broadcast::Sender<Event>>>,
);

impl EventHub {
    pub(crate) fn send(&self, event: Event) {
        if let Some(tx) = self.0.get() {
            // No receiver left is not an error: events are for hosts that want them.
            let _ = tx.send(event);
        }
    }

    pub(crate) fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Event> {
        self.0
            .get_or_init(|| tokio::sync::broadcast::channel(EVENTS_BUFFER_MAX).0)
            .subscribe()
    }

    pub(crate) fn receiver_count(&self) -> usize {
        self.0.get().map_or(0, |tx| tx.receiver_count())
    }
}

/// What the repeat guard did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RepeatAction {
    Advisory,
    Terminated,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    RoundStarted {
        round: u64,
        calls: usize,
    },
    CallRejected {
        index: usize,
        call_id: String,
        tool: String,
        kind: RejectionKind,
    },
    RepeatDetected {
        tool: String,
        fingerprint: Fingerprint,
        count: u32,
        action: RepeatAction,
    },
    EpochStarted {
        epoch: usize,
        calls: Vec<usize>,
        barrier: bool,
    },
    /// A call started while the model was still generating the round.
    EarlyStarted {
        index: usize,
        call_id: String,
        tool: String,
    },
    CallStarted {
        index: usize,
        call_id: String,
        tool: String,
        epoch: usize,
    },
    CallFinished {
        index: usize,
        call_id: String,
        tool: String,
        state: Option<IntentState>,
        is_error: bool,
        run_ms: u64,
    },
    /// The canonical receipt of a call, once final.
    Receipt(Box<Receipt>),
    ProjectionFailed {
        index: usize,
        call_id: String,
        why: String,
    },
    /// A call is held for a person's approval. `summary` is bounded and human-readable; the
    /// approval binds to `args_hash`, the prepared arguments' fingerprint.
    ApprovalRequired {
        approval_id: String,
        call_id: String,
        tool: String,
        args_hash: String,
        summary: String,
        deadline_ms: u64,
    },
    /// A background job started by a call changed state (finished, waits for input). Pushed by
    /// the executor the moment it happens; `detail` is the executor's status object.
    JobUpdate {
        job: String,
        state: String,
        detail: serde_json::Value,
    },
    /// The session was cancelled: no call starts after this event.
    Cancelled,
    RoundFinished {
        round: u64,
        terminated: bool,
    },
}
