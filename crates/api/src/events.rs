//! A session's event stream (`GET /v1/sessions/{id}/events`, server-sent events).
//!
//! Every event of the session's kernel (rounds, calls, epochs, approvals, receipts — never
//! argument values), taken as it is sent ([`SessionObserver`], so in the order it happened),
//! and the API's own (`pending`, `turn_finished`) go to one bounded broadcast; each stream
//! reads it as JSON `data:` lines. A stream that falls more than
//! [`EVENTS_BUFFER_MAX`] events behind is told how many it missed (`{"event":"lagged"}`) and goes
//! on; at most [`EVENT_STREAMS_PER_SESSION_MAX`] streams are open on a session at once.

use crate::limits::{EVENT_KEEPALIVE, EVENT_STREAMS_PER_SESSION_MAX, EVENTS_BUFFER_MAX};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures::Stream;
use serde_json::{Value, json};
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::broadcast;

/// One session's events.
#[derive(Clone)]
pub(crate) struct EventStream {
    tx: broadcast::Sender<Value>,
    streams: Arc<AtomicUsize>,
}

impl Default for EventStream {
    fn default() -> Self {
        Self {
            tx: broadcast::channel(EVENTS_BUFFER_MAX).0,
            streams: Arc::default(),
        }
    }
}

/// Counts an open stream while it lives.
struct StreamSlot(Arc<AtomicUsize>);

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl EventStream {
    /// Sends `event` to every open stream (none open is not an error).
    pub(crate) fn send(&self, event: Value) {
        let _ = self.tx.send(event);
    }

    /// Whether any stream is open (an event is built only then).
    fn watched(&self) -> bool {
        self.tx.receiver_count() > 0
    }

    /// A new stream, or `None` at the bound.
    pub(crate) fn open(
        &self,
    ) -> Option<Sse<impl Stream<Item = Result<SseEvent, Infallible>> + use<>>> {
        let open = self.streams.fetch_add(1, Ordering::Relaxed);
        if open >= EVENT_STREAMS_PER_SESSION_MAX {
            self.streams.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        let slot = StreamSlot(self.streams.clone());
        let rx = self.tx.subscribe();
        let stream = futures::stream::unfold((rx, slot), |(mut rx, slot)| async move {
            let data = match rx.recv().await {
                Ok(event) => event,
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    json!({"event": "lagged", "missed": n})
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            };
            let event = SseEvent::default().data(data.to_string());
            Some((Ok(event), (rx, slot)))
        });
        Some(Sse::new(stream).keep_alive(KeepAlive::new().interval(EVENT_KEEPALIVE)))
    }
}

/// The kernel's observer for one session's kernel: its events go to the session's streams as
/// they are sent, and to the server's own observer (metrics) as well.
pub(crate) struct SessionObserver {
    pub stream: EventStream,
    pub also: Option<Arc<dyn ring0_kernel::EventObserver>>,
}

impl ring0_kernel::EventObserver for SessionObserver {
    fn observe(&self, event: &ring0_kernel::Event) {
        if let Some(also) = &self.also {
            also.observe(event);
        }
        if self.stream.watched() {
            self.stream
                .send(serde_json::to_value(event).unwrap_or(Value::Null));
        }
    }
}
