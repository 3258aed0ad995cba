//! A JSON-RPC 2.0 peer over raw JSON values: the client side of every upstream connection.
//!
//! Written here rather than taken from rmcp's client because rmcp decodes every result into its
//! typed model before a caller sees it, and that model drops fields it does not know (a tool's
//! `execution`, new annotation hints, unknown content items). ring0 pins and forwards tool
//! definitions and results exactly as the server sent them, so this peer never interprets a
//! result: it correlates ids, routes notifications and server-initiated requests to the
//! connection, and hands results back as [`Value`]s.
//!
//! Transports (stdio lines, Streamable HTTP) feed received messages to [`RpcPeer::deliver`] and
//! take outgoing ones from the [`Outbound`] they were built with.

use serde_json::{Map, Value, json};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

/// JSON-RPC error codes ring0 reads or sends.
pub mod code {
    pub const PARSE_ERROR: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    pub const INTERNAL_ERROR: i64 = -32603;
    /// 2026-07-28: the `Mcp-*` / `MCP-Protocol-Version` headers do not match the body.
    pub const HEADER_MISMATCH: i64 = -32020;
    /// 2026-07-28: the request needs a client capability the client did not declare.
    pub const MISSING_REQUIRED_CLIENT_CAPABILITY: i64 = -32021;
    /// 2026-07-28: the server does not speak the request's protocol version.
    pub const UNSUPPORTED_PROTOCOL_VERSION: i64 = -32022;
}

/// Why a request got no result.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RpcError {
    /// The message never left ring0: the connection was down. Nothing was applied.
    #[error("not sent: {0}")]
    NotSent(String),
    /// The connection was lost after the request was sent: its effect is unknown.
    #[error("connection lost after the request was sent: {0}")]
    Lost(String),
    /// The server answered with a JSON-RPC error.
    #[error("server error {code}: {message}")]
    Remote {
        code: i64,
        message: String,
        data: Option<Value>,
    },
    /// The server refused the request before handling it (an HTTP 4xx other than a lost
    /// session): nothing was applied.
    #[error("refused: {0}")]
    Refused(String),
    /// The server answered with something that is not a JSON-RPC response.
    #[error("malformed response: {0}")]
    Malformed(String),
}

impl RpcError {
    /// True when the request is known to have had no effect: never sent, refused, or rejected
    /// by the server as an unknown method or invalid parameters before running.
    pub fn definitely_not_applied(&self) -> bool {
        match self {
            RpcError::NotSent(_) | RpcError::Refused(_) => true,
            RpcError::Remote { code: c, .. } => {
                matches!(
                    *c,
                    code::METHOD_NOT_FOUND
                        | code::INVALID_PARAMS
                        | code::INVALID_REQUEST
                        | code::PARSE_ERROR
                        | code::HEADER_MISMATCH
                        | code::MISSING_REQUIRED_CLIENT_CAPABILITY
                        | code::UNSUPPORTED_PROTOCOL_VERSION
                )
            }
            RpcError::Lost(_) | RpcError::Malformed(_) => false,
        }
    }
}

/// Where outgoing messages go. Returns an error when the message could not be handed to the
/// transport at all (the connection is down).
pub trait Outbound: Send + Sync {
    fn send(&self, message: Value, related: Option<u64>) -> Result<(), String>;
}

/// What a connection does with messages the server starts.
#[async_trait::async_trait]
pub trait InboundHandler: Send + Sync {
    /// A notification (`notifications/progress`, `notifications/tools/list_changed`, …).
    /// `related` is the id of the request whose response stream carried it, when known.
    fn notification(&self, method: &str, params: Option<Value>, related: Option<u64>);
    /// A server-initiated request (`elicitation/create`, `sampling/createMessage`,
    /// `roots/list`, `ping`). Returns the result or a JSON-RPC error object.
    async fn request(
        &self,
        method: &str,
        params: Option<Value>,
        related: Option<u64>,
    ) -> Result<Value, Value>;
    /// The response stream of request `related` ended before its response and is being
    /// resumed (the server asked its client to poll).
    fn stream_closed(&self, _related: u64) {}
}

type Pending = HashMap<u64, oneshot::Sender<Result<Value, RpcError>>>;

/// One JSON-RPC peer.
pub struct RpcPeer {
    outbound: Arc<dyn Outbound>,
    handler: Arc<dyn InboundHandler>,
    pending: Mutex<Pending>,
    next_id: AtomicU64,
    closed: CancellationToken,
    close_reason: Mutex<Option<String>>,
}

/// A request in flight: its id (for cancellation and progress) and its result.
pub struct InFlight {
    pub id: u64,
    pub result: oneshot::Receiver<Result<Value, RpcError>>,
}

impl RpcPeer {
    pub fn new(outbound: Arc<dyn Outbound>, handler: Arc<dyn InboundHandler>) -> Arc<Self> {
        Arc::new(Self {
            outbound,
            handler,
            pending: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            closed: CancellationToken::new(),
            close_reason: Mutex::new(None),
        })
    }

    /// Cancelled when the connection closes.
    pub fn closed(&self) -> &CancellationToken {
        &self.closed
    }

    pub fn is_closed(&self) -> bool {
        self.closed.is_cancelled()
    }

    /// Sends a request; the result arrives on the returned receiver.
    pub fn start(&self, method: &str, params: Option<Value>) -> Result<InFlight, RpcError> {
        self.start_with(method, params, |_| {})
    }

    /// Sends a request after `registered` saw its id, so that whatever the server sends about it
    /// (progress, its own requests) can be routed from the first byte.
    pub fn start_with(
        &self,
        method: &str,
        params: Option<Value>,
        registered: impl FnOnce(u64),
    ) -> Result<InFlight, RpcError> {
        if self.closed.is_cancelled() {
            return Err(RpcError::NotSent(self.reason()));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending.lock().expect("pending").insert(id, tx);
        registered(id);
        let mut message = Map::new();
        message.insert("jsonrpc".into(), "2.0".into());
        message.insert("id".into(), id.into());
        message.insert("method".into(), method.into());
        if let Some(p) = params {
            message.insert("params".into(), p);
        }
        if let Err(why) = self.outbound.send(Value::Object(message), Some(id)) {
            self.pending.lock().expect("pending").remove(&id);
            return Err(RpcError::NotSent(why));
        }
        Ok(InFlight { id, result: rx })
    }

    /// Sends a request and waits for its result.
    pub async fn request(&self, method: &str, params: Option<Value>) -> Result<Value, RpcError> {
        let flight = self.start(method, params)?;
        flight
            .result
            .await
            .unwrap_or_else(|_| Err(RpcError::Lost(self.reason())))
    }

    /// Forgets a request (after cancellation or a timeout): a late response is dropped.
    pub fn forget(&self, id: u64) {
        self.pending.lock().expect("pending").remove(&id);
    }

    /// Sends a notification.
    pub fn notify(&self, method: &str, params: Option<Value>) -> Result<(), String> {
        let mut message = Map::new();
        message.insert("jsonrpc".into(), "2.0".into());
        message.insert("method".into(), method.into());
        if let Some(p) = params {
            message.insert("params".into(), p);
        }
        self.outbound.send(Value::Object(message), None)
    }

    /// Tells the server a request is abandoned, and forgets it.
    pub fn cancel(&self, id: u64, reason: &str) {
        self.forget(id);
        let _ = self.notify(
            "notifications/cancelled",
            Some(json!({"requestId": id, "reason": reason})),
        );
    }

    fn reason(&self) -> String {
        self.close_reason
            .lock()
            .expect("close reason")
            .clone()
            .unwrap_or_else(|| "the connection is closed".into())
    }

    /// Marks the connection closed: every request in flight fails with [`RpcError::Lost`].
    pub fn close(&self, reason: &str) {
        {
            let mut r = self.close_reason.lock().expect("close reason");
            if r.is_none() {
                *r = Some(reason.to_string());
            }
        }
        self.closed.cancel();
        let pending: Vec<_> = self.pending.lock().expect("pending").drain().collect();
        for (_, tx) in pending {
            let _ = tx.send(Err(RpcError::Lost(reason.to_string())));
        }
    }

    /// Fails one request with an error of the transport (an HTTP status, a broken stream).
    pub fn fail(&self, id: u64, error: RpcError) {
        if let Some(tx) = self.pending.lock().expect("pending").remove(&id) {
            let _ = tx.send(Err(error));
        }
    }

    /// Whether a request is still waiting for its response.
    /// Tells the handler that request `id`'s response stream ended before its response.
    pub fn stream_closed(&self, id: u64) {
        self.handler.stream_closed(id);
    }

    pub fn is_pending(&self, id: u64) -> bool {
        self.pending.lock().expect("pending").contains_key(&id)
    }

    /// Handles one message from the server. `related` is the request whose response stream
    /// carried it (Streamable HTTP), if any.
    pub fn deliver(self: &Arc<Self>, message: Value, related: Option<u64>) {
        let Value::Object(mut obj) = message else {
            return;
        };
        let method = obj
            .get("method")
            .and_then(Value::as_str)
            .map(str::to_string);
        let id = obj.remove("id");
        match (method, id) {
            (Some(method), Some(id)) => {
                let params = obj.remove("params");
                let this = self.clone();
                tokio::spawn(async move {
                    let reply = match this.handler.request(&method, params, related).await {
                        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
                        Err(error) => json!({"jsonrpc": "2.0", "id": id, "error": error}),
                    };
                    let _ = this.outbound.send(reply, None);
                });
            }
            (Some(method), None) => {
                self.handler
                    .notification(&method, obj.remove("params"), related);
            }
            (None, Some(id)) => {
                let Some(key) = id
                    .as_u64()
                    .or_else(|| id.as_str().and_then(|s| s.parse().ok()))
                else {
                    return;
                };
                let Some(tx) = self.pending.lock().expect("pending").remove(&key) else {
                    return;
                };
                let outcome = if let Some(result) = obj.remove("result") {
                    Ok(result)
                } else if let Some(error) = obj.remove("error") {
                    Err(RpcError::Remote {
                        code: error.get("code").and_then(Value::as_i64).unwrap_or(0),
                        message: error
                            .get("message")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_string(),
                        data: error.get("data").cloned(),
                    })
                } else {
                    Err(RpcError::Malformed(
                        "a response with neither result nor error".into(),
                    ))
                };
                let _ = tx.send(outcome);
            }
            (None, None) => {}
        }
    }
}

/// A JSON-RPC error object.
pub fn error_object(code: i64, message: impl Into<String>) -> Value {
    json!({"code": code, "message": message.into()})
}
