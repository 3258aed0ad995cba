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

/// Sees every event of every session of a kernel, as it is sent (`KernelBuilder::observer`).
///
/// Called synchronously on the path that sends the event, so it must be quick and must not
/// block: count, record, hand off. It sees exactly what a subscriber would (no argument
/// values), whether or not anyone subscribed. An operations host counts its metrics from it.
pub trait EventObserver: Send + Sync {
    fn observe(&self, event: &Event);
}

/// A session's event channel, allocated when the first subscriber arrives.
///
/// A broadcast channel of [`EVENTS_BUFFER_MAX`] slots is hundreds of KiB, allocated and
/// initialised up front; a host that opens a session per request (the MCP gateway does, for
/// overlapping calls) and never subscribes would pay that on every call. Until someone
/// subscribes, sending is a no-op — exactly what a channel without receivers does — except for
/// the kernel's observer, which sees every event.
#[derive(Clone, Default)]
pub(crate) struct EventHub {
    channel: std::sync::Arc<std::sync::OnceLock<tokio::sync::broadcast::Sender<Event>>>,
    observer: Option<std::sync::Arc<dyn EventObserver>>,
}

impl std::fmt::Debug for EventHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventHub")
            .field("receivers", &self.receiver_count())
            .field("observed", &self.observer.is_some())
            .finish()
    }
}

impl EventHub {
    /// A hub whose events the kernel's observer (if any) also sees.
    pub(crate) fn observed(observer: Option<std::sync::Arc<dyn EventObserver>>) -> Self {
        Self {
            channel: Default::default(),
            observer,
        }
    }

    pub(crate) fn send(&self, event: Event) {
        if let Some(observer) = &self.observer {
            observer.observe(&event);
        }
        if let Some(tx) = self.channel.get() {
            // No receiver left is not an error: events are for hosts that want them.
            let _ = tx.send(event);
        }
    }

    pub(crate) fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Event> {
        self.channel
            .get_or_init(|| tokio::sync::broadcast::channel(EVENTS_BUFFER_MAX).0)
            .subscribe()
    }

    /// Whether an event sent now reaches anyone (a subscriber or the observer): an event that
    /// costs a copy to build is built only then.
    pub(crate) fn is_watched(&self) -> bool {
        self.observer.is_some() || self.receiver_count() > 0
    }

    pub(crate) fn receiver_count(&self) -> usize {
        self.channel.get().map_or(0, |tx| tx.receiver_count())
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
