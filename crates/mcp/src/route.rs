//! Per-call routing between the downstream request that made a call and the upstream serving it.
//!
//! The downstream server attaches a [`CallRoute`] to each `tools/call`'s kernel round
//! ([`ring0_kernel::RoundOptions::extensions`]); the kernel hands it to the call's
//! [`ring0_kernel::CallContext`] and to its authorization, so the upstream side finds where to
//! send progress and which client to relay the server's own requests (elicitation, sampling,
//! roots) to, and the approval gate finds how to ask the person — from the call itself, never
//! from a table keyed by call id, where two clients' equal call ids would meet.

use ring0_kernel::CallExtensions;
use serde_json::Value;
use std::sync::Arc;

/// The downstream end of one call.
#[async_trait::async_trait]
pub trait Downstream: Send + Sync {
    /// Progress of the call, already remapped to the client's progress token (if it gave one).
    fn progress(&self, progress: f64, total: Option<f64>, message: Option<String>);
    /// A log message (`notifications/message` params) the upstream sent while serving the call.
    fn log(&self, params: Value);
    /// A request the upstream server made while serving the call, relayed to the client.
    async fn request(&self, method: &str, params: Option<Value>) -> Result<Value, Value>;
    /// The upstream closed its response stream before the response, asking its client to poll
    /// (SEP-1699). A downstream whose client resumes lets its own stream close too (see
    /// [`crate::stream_cut`]); the call goes on either way.
    fn poll_later(&self) {}
}

/// Where one call came from and how its client can be reached.
pub struct CallRoute {
    pub downstream: Option<Arc<dyn Downstream>>,
    /// A confirmation code the request carried: the person's code, read to the model and sent
    /// back as the argument [`crate::approval::CONFIRM_ARGUMENT`] (or in
    /// `_meta["io.ring0/confirm"]`), already taken out of the call's arguments.
    pub confirm: Option<String>,
    /// Whether the client can be asked questions: it declared elicitation (in the 2026-07-28
    /// era, in the request's own capabilities; the question then travels in an
    /// `input_required` result). A client that did not is never sent one.
    pub elicitation: bool,
    /// The request is of the 2026-07-28 era: the server may not send it requests; its
    /// downstream asks through `input_required` results instead (see [`crate::input`]).
    pub modern: bool,
}

impl CallRoute {
    /// A request of the sessionful era; `elicitation`: the client declared the capability.
    pub fn sessionful(
        downstream: Option<Arc<dyn Downstream>>,
        confirm: Option<String>,
        elicitation: bool,
    ) -> Self {
        Self {
            downstream,
            confirm,
            elicitation,
            modern: false,
        }
    }

    /// A request of the 2026-07-28 era: questions reach the client through its downstream as
    /// `input_required` results; `elicitation`: the request declared the capability.
    pub fn modern(
        downstream: Option<Arc<dyn Downstream>>,
        confirm: Option<String>,
        elicitation: bool,
    ) -> Self {
        Self {
            downstream,
            confirm,
            elicitation,
            modern: true,
        }
    }

    /// The route the host attached to a call, if any (none for ring0's own calls: probes,
    /// recovery).
    pub fn of(extensions: &CallExtensions) -> Option<Arc<Self>> {
        extensions.get::<Self>()
    }
}
