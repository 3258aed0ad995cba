//! Per-call routing between the downstream request that made a call and the upstream serving it.
//!
//! The kernel hands a tool only its [`ring0_kernel::CallContext`]; the downstream server
//! registers each `tools/call` here under the call id it gives the kernel, so the upstream side
//! can find where to send progress, which client to relay the server's own requests (elicitation,
//! sampling, roots) to, and where to leave the forwarded result for the response.

use serde_json::Value;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The downstream end of one call.
#[async_trait::async_trait]
pub trait Downstream: Send + Sync {
    /// Progress of the call, already remapped to the client's progress token (if it gave one).
    fn progress(&self, progress: f64, total: Option<f64>, message: Option<String>);
    /// A log message (`notifications/message` params) the upstream sent while serving the call.
    fn log(&self, params: Value);
    /// A request the upstream server made while serving the call, relayed to the client.
    async fn request(&self, method: &str, params: Option<Value>) -> Result<Value, Value>;
}

/// One call in flight.
pub struct CallEntry {
    pub downstream: Option<Arc<dyn Downstream>>,
    /// A confirmation code the request carried (`_meta["io.ring0/confirm"]`).
    pub confirm: Option<String>,
    /// Whether the client declared the elicitation capability.
    pub elicitation: bool,
    /// The request is of the 2026-07-28 era: the server may not send it requests; its
    /// downstream asks through `input_required` results instead (see [`crate::input`]).
    pub modern: bool,
    /// The shaped upstream result, for the response (the journal keeps the observation).
    pub forwarded: Mutex<Option<Value>>,
}

impl CallEntry {
    pub fn new(downstream: Option<Arc<dyn Downstream>>) -> Arc<Self> {
        Self::with_facts(downstream, None, false)
    }

    /// A request of the 2026-07-28 era: questions reach the client through its downstream as
    /// `input_required` results, so it can be asked whatever it declared.
    pub fn modern(downstream: Option<Arc<dyn Downstream>>, confirm: Option<String>) -> Arc<Self> {
        Arc::new(Self {
            downstream,
            confirm,
            elicitation: true,
            modern: true,
            forwarded: Mutex::new(None),
        })
    }

    pub fn with_facts(
        downstream: Option<Arc<dyn Downstream>>,
        confirm: Option<String>,
        elicitation: bool,
    ) -> Arc<Self> {
        Arc::new(Self {
            downstream,
            confirm,
            elicitation,
            modern: false,
            forwarded: Mutex::new(None),
        })
    }
}

/// Calls in flight by call id, and calls of the 2026-07-28 era parked until their clients
/// answer a question.
#[derive(Default)]
pub struct Calls {
    map: Mutex<HashMap<String, Arc<CallEntry>>>,
    parked: crate::input::Parked,
}

impl Calls {
    /// Calls waiting for their clients' answers, by `requestState`.
    pub fn parked(&self) -> &crate::input::Parked {
        &self.parked
    }

    pub fn insert(&self, call_id: &str, entry: Arc<CallEntry>) {
        self.map
            .lock()
            .expect("calls")
            .insert(call_id.to_string(), entry);
    }

    pub fn get(&self, call_id: &str) -> Option<Arc<CallEntry>> {
        self.map.lock().expect("calls").get(call_id).cloned()
    }

    pub fn remove(&self, call_id: &str) -> Option<Arc<CallEntry>> {
        self.map.lock().expect("calls").remove(call_id)
    }
}
