//! The Streamable HTTP transport of an upstream (the sessionful protocol era).
//!
//! Each outgoing message is one POST. The answer is `202 Accepted` (notifications and responses),
//! one JSON message, or an SSE stream carrying notifications and server requests related to the
//! POSTed request before its response. The session id the server hands out at `initialize` is sent
//! on every later request; a `404` on a request that carried one means the server forgot the
//! session: the request is failed as not applied and the connection is closed, so the supervisor
//! re-initializes, re-lists and re-pins. A background GET stream receives messages the server
//! sends outside any request (such as `notifications/tools/list_changed`) when the server offers
//! one (`405` means it does not).

use crate::limits::UPSTREAM_MESSAGE_BYTES_MAX;
use crate::log::Log;
use crate::rpc::{InboundHandler, Outbound, RpcError, RpcPeer};
use bytes::Bytes;
use futures::{Stream, StreamExt};
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Delay before the background GET stream is opened again after it ended.
const GET_STREAM_RETRY: Duration = Duration::from_secs(2);
/// How long one POST may take to start answering.
const POST_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// How to reach one HTTP upstream.
#[derive(Debug, Clone)]
pub struct HttpSpec {
    pub url: String,
    /// Extra request headers (for example an `Authorization` header from config).
    pub headers: BTreeMap<String, String>,
}

struct State {
    client: reqwest::Client,
    spec: HttpSpec,
    session: Mutex<Option<String>>,
    protocol: Mutex<Option<String>>,
    peer: OnceLock<Weak<RpcPeer>>,
    stop: CancellationToken,
    log: Log,
    alias: String,
}

/// A connected HTTP upstream. Dropping it ends the session (best effort `DELETE`).
pub struct HttpConnection {
    pub peer: Arc<RpcPeer>,
    state: Arc<State>,
}

impl HttpConnection {
    /// Records the negotiated protocol version, sent as `MCP-Protocol-Version` from now on.
    pub fn set_protocol_version(&self, version: &str) {
        *self.state.protocol.lock().expect("protocol") = Some(version.to_string());
    }

    /// Opens the background GET stream for messages sent outside any request.
    pub fn open_listen_stream(&self) {
        let state = self.state.clone();
        tokio::spawn(async move { listen(state).await });
    }
}

impl Drop for HttpConnection {
    fn drop(&mut self) {
        self.state.stop.cancel();
        self.peer.close("the connection was closed by ring0");
        let session = self.state.session.lock().expect("session").take();
        if let Some(session) = session {
            let client = self.state.client.clone();
            let url = self.state.spec.url.clone();
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(async move {
                    let _ = client
                        .delete(&url)
                        .header("mcp-session-id", session)
                        .timeout(Duration::from_secs(5))
                        .send()
                        .await;
                });
            }
        }
    }
}

struct Post(Arc<State>);

impl Outbound for Post {
    fn send(&self, message: Value, related: Option<u64>) -> Result<(), String> {
        if self.0.stop.is_cancelled() {
            return Err("the connection is closed".into());
        }
        let state = self.0.clone();
        tokio::spawn(async move { post(state, message, related).await });
        Ok(())
    }
}

/// The HTTP client every upstream shares: rustls with the ring provider, no proxy lookup from the
/// environment (an upstream address is configured explicitly).
pub fn client() -> Result<reqwest::Client, String> {
    // Installing twice is harmless: the first provider stays.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .no_proxy()
        .tcp_nodelay(true)
        .connect_timeout(POST_CONNECT_TIMEOUT)
        .build()
        .map_err(|e| format!("building the HTTP client: {e}"))
}

/// Creates the connection (nothing is sent until the first request).
pub fn connect(
    alias: &str,
    spec: &HttpSpec,
    client: reqwest::Client,
    handler: Arc<dyn InboundHandler>,
    log: Log,
) -> HttpConnection {
    let state = Arc::new(State {
        client,
        spec: spec.clone(),
        session: Mutex::new(None),
        protocol: Mutex::new(None),
        peer: OnceLock::new(),
        stop: CancellationToken::new(),
        log,
        alias: alias.to_string(),
    });
    let peer = RpcPeer::new(Arc::new(Post(state.clone())), handler);
    let _ = state.peer.set(Arc::downgrade(&peer));
    HttpConnection { peer, state }
}

fn request(state: &State, method: reqwest::Method) -> reqwest::RequestBuilder {
    let mut req = state
        .client
        .request(method, &state.spec.url)
        .header("accept", "application/json, text/event-stream");
    for (k, v) in &state.spec.headers {
        req = req.header(k, v);
    }
    if let Some(s) = state.session.lock().expect("session").as_deref() {
        req = req.header("mcp-session-id", s);
    }
    if let Some(p) = state.protocol.lock().expect("protocol").as_deref() {
        req = req.header("mcp-protocol-version", p);
    }
    req
}

async fn post(state: Arc<State>, message: Value, related: Option<u64>) {
    let Some(peer) = state.peer.get().and_then(Weak::upgrade) else {
        return;
    };
    let is_initialize = message.get("method").and_then(Value::as_str) == Some("initialize");
    let had_session = state.session.lock().expect("session").is_some();
    let body = serde_json::to_vec(&message).unwrap_or_default();
    let sent = request(&state, reqwest::Method::POST)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await;
    let fail = |e: RpcError| {
        if let Some(id) = related {
            peer.fail(id, e);
        }
    };
    let response = match sent {
        Ok(r) => r,
        Err(e) if e.is_connect() => {
            fail(RpcError::NotSent(format!("cannot connect: {e}")));
            peer.close(&format!("cannot connect to {}: {e}", state.spec.url));
            return;
        }
        Err(e) => {
            fail(RpcError::Lost(e.to_string()));
            return;
        }
    };
    let status = response.status();
    if is_initialize
        && let Some(s) = response
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
    {
        *state.session.lock().expect("session") = Some(s.to_string());
    }
    if status == reqwest::StatusCode::ACCEPTED {
        return;
    }
    if status == reqwest::StatusCode::NOT_FOUND && had_session {
        fail(RpcError::Refused(
            "the server ended the session (HTTP 404); ring0 is re-initializing it".into(),
        ));
        peer.close("the server ended the session (HTTP 404)");
        return;
    }
    if !status.is_success() {
        let text = bounded_text(response).await;
        let why = format!("HTTP {status}: {text}");
        if status.is_client_error() {
            fail(RpcError::Refused(why));
        } else {
            fail(RpcError::Lost(why));
        }
        return;
    }
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    if content_type.starts_with("text/event-stream") {
        read_events(&state, &peer, response.bytes_stream(), related).await;
    } else {
        match bounded_body(response).await {
            Ok(bytes) => match serde_json::from_slice::<Value>(&bytes) {
                Ok(Value::Array(items)) => {
                    for item in items {
                        peer.deliver(item, related);
                    }
                }
                Ok(v) => peer.deliver(v, related),
                Err(e) => fail(RpcError::Malformed(format!("response is not JSON: {e}"))),
            },
            Err(e) => fail(RpcError::Lost(e)),
        }
    }
    if let Some(id) = related
        && peer.is_pending(id)
        && !state.stop.is_cancelled()
    {
        // The stream ended without the response. Resuming with Last-Event-ID is not attempted:
        // the outcome is reported as unknown instead.
        peer.fail(
            id,
            RpcError::Lost("the response stream ended before the response arrived".into()),
        );
    }
}

async fn bounded_body(mut response: reqwest::Response) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| e.to_string())? {
        if out.len() + chunk.len() > UPSTREAM_MESSAGE_BYTES_MAX {
            return Err(format!(
                "response larger than {UPSTREAM_MESSAGE_BYTES_MAX} bytes"
            ));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

async fn bounded_text(response: reqwest::Response) -> String {
    match bounded_body(response).await {
        Ok(b) => {
            let mut s = String::from_utf8_lossy(&b).into_owned();
            if s.len() > 512 {
                let mut cut = 512;
                while !s.is_char_boundary(cut) {
                    cut -= 1;
                }
                s.truncate(cut);
                s.push('…');
            }
            s
        }
        Err(e) => e,
    }
}

/// Bounds the bytes of any one SSE event: counts bytes since the last blank line.
fn bound_events<S>(stream: S) -> impl Stream<Item = Result<Bytes, std::io::Error>>
where
    S: Stream<Item = Result<Bytes, reqwest::Error>>,
{
    let mut since_blank = 0usize;
    let mut last = 0u8;
    stream.map(move |chunk| {
        let chunk = chunk.map_err(std::io::Error::other)?;
        for &b in chunk.iter() {
            if b == b'\n' && (last == b'\n' || last == b'\r') {
                since_blank = 0;
            } else if b != b'\r' || last != b'\n' {
                since_blank += 1;
            }
            last = b;
            if since_blank > UPSTREAM_MESSAGE_BYTES_MAX {
                return Err(std::io::Error::other(format!(
                    "an event larger than {UPSTREAM_MESSAGE_BYTES_MAX} bytes"
                )));
            }
        }
        Ok(chunk)
    })
}

async fn read_events<S>(state: &State, peer: &Arc<RpcPeer>, stream: S, related: Option<u64>)
where
    S: Stream<Item = Result<Bytes, reqwest::Error>> + Send,
{
    let events = sse_stream::SseStream::from_bytes_stream(bound_events(stream));
    futures::pin_mut!(events);
    loop {
        let next = tokio::select! {
            n = events.next() => n,
            _ = state.stop.cancelled() => return,
        };
        match next {
            None => return,
            Some(Err(e)) => {
                state
                    .log
                    .line(&format!("[{}] event stream failed: {e}", state.alias));
                return;
            }
            Some(Ok(event)) => {
                let Some(data) = event.data else { continue };
                if data.trim().is_empty() {
                    continue;
                }
                match serde_json::from_str::<Value>(&data) {
                    Ok(v) => peer.deliver(v, related),
                    Err(e) => state.log.line(&format!(
                        "[{}] ignored an event that is not JSON-RPC ({e})",
                        state.alias
                    )),
                }
            }
        }
    }
}

async fn listen(state: Arc<State>) {
    while !state.stop.is_cancelled() {
        let Some(peer) = state.peer.get().and_then(Weak::upgrade) else {
            return;
        };
        if peer.is_closed() {
            return;
        }
        let sent = request(&state, reqwest::Method::GET)
            .header("accept", "text/event-stream")
            .send()
            .await;
        match sent {
            Ok(r) if r.status().is_success() => {
                read_events(&state, &peer, r.bytes_stream(), None).await;
            }
            // 405: the server offers no such stream; anything else: try later.
            Ok(r) if r.status() == reqwest::StatusCode::METHOD_NOT_ALLOWED => return,
            Ok(_) | Err(_) => {}
        }
        drop(peer);
        tokio::select! {
            _ = tokio::time::sleep(GET_STREAM_RETRY) => {}
            _ = state.stop.cancelled() => return,
        }
    }
}
