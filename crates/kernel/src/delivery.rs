//! Delivery: whether a call's result reached the caller.
//!
//! ring0 tells a retry from a genuine repeat by delivery. A call without an explicit key whose
//! identical predecessor's result *was delivered* is a new request and runs again (a new
//! attempt); one whose predecessor is in flight or was *never delivered* (connection dropped,
//! stream broken, process killed before answering) is answered with that result. Each call of a
//! round that is answered by a journal record (run, or replayed) comes back with a
//! [`DeliveryTicket`] ([`crate::RoundOutcome::delivery`]); the host calls
//! [`DeliveryTicket::delivered`] once the result is out of its hands (written to stdout, an HTTP
//! body finished, an SSE event flushed). A ticket never marked means "not delivered".

use ring0_journal::{IntentId, Journal};
use std::sync::Arc;

/// The right to say that one call's result reached its caller. Cheap to clone; any clone may
/// mark it, more than once.
#[derive(Clone)]
pub struct DeliveryTicket {
    journal: Arc<dyn Journal>,
    intent_id: IntentId,
}

impl DeliveryTicket {
    pub(crate) fn new(journal: Arc<dyn Journal>, intent_id: IntentId) -> Self {
        Self { journal, intent_id }
    }

    /// Records that the result was delivered. Never waits for the disk
    /// ([`Journal::mark_delivered`]): a delivery lost in a crash makes the next identical call
    /// a replay, the side that never doubles an effect.
    pub fn delivered(&self) {
        self.journal.mark_delivered(self.intent_id);
    }

    /// The intent whose result this is.
    pub fn intent_id(&self) -> IntentId {
        self.intent_id
    }
}

impl std::fmt::Debug for DeliveryTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeliveryTicket")
            .field("intent_id", &self.intent_id)
            .finish()
    }
}
