//! The Streamable HTTP transport of an upstream, in both protocol eras.
//!
//! Each outgoing message is one POST. The answer is `202 Accepted` (notifications and responses),
//! one JSON message, or an SSE stream carrying notifications and server requests related to the
//! POSTed request before its response.
//!
//! - **Sessionful era** (2025-06-18 / 2025-11-25): the session id the server hands out at
//!   `initialize` is sent on every later request; a `404` on a request that carried one means the
//!   server forgot the session: the request is failed as not applied and the connection is closed,
//!   so the supervisor re-initializes, re-lists and re-pins. A background GET stream receives
//!   messages the server sends outside any request (such as `notifications/tools/list_changed`)
//!   when the server offers one (`405` means it does not). A response stream that breaks before
//!   the response is resumed with `Last-Event-ID` when the server numbered its events, at most
//!   [`STREAM_RESUMES_MAX`] times in a row.
//! - **Stateless era** (2026-07-28), chosen by [`HttpConnection::use_stateless`] after
//!   `server/discover`: no session; every request carries the client context in its `_meta`
//!   (`io.modelcontextprotocol/protocolVersion`, `clientInfo`, `clientCapabilities`) and the
//!   routing headers (`MCP-Protocol-Version`, `Mcp-Method`, `Mcp-Name`, and `Mcp-Param-*` for
//!   arguments the tool's schema marks with `x-mcp-header`). The era has no client-to-server
//!   notifications: cancelling a request closes its response stream.
//!
//! A server that refuses a request with a JSON-RPC error in a `4xx` body (header mismatch,
//! unsupported protocol version) has that error delivered as the request's error, so its code
//! and message reach the caller.

use crate::limits::{STREAM_RESUME_DELAY_MAX, STREAM_RESUMES_MAX, UPSTREAM_MESSAGE_BYTES_MAX};
use crate::log::Log;
use crate::rpc::{InboundHandler, Outbound, RpcError, RpcPeer};
use base64::Engine;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use serde_json::{Map, Value, json};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Delay before the background GET stream is opened again after it ended.
const GET_STREAM_RETRY: Duration = Duration::from_secs(2);
/// How long one POST may take to start answering.
const POST_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// The stateless protocol version ring0 speaks to upstreams that offer it.
pub const STATELESS_PROTOCOL_VERSION: &str = "2026-07-28";
/// `_meta` keys of the stateless era's per-request client context.
pub const META_PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
pub const META_CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";
pub const META_CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";

/// How to reach one HTTP upstream.
#[derive(Clone)]
pub struct HttpSpec {
    pub url: String,
    /// Extra request headers (for example an `Authorization` header from config).
    pub headers: BTreeMap<String, String>,
}

/// Header names only: their values may be secrets.
impl std::fmt::Debug for HttpSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpSpec")
            .field("url", &self.url)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// The per-request context of the stateless era.
#[derive(Clone)]
struct Stateless {
    version: String,
    meta: Map<String, Value>,
}

struct State {
    client: reqwest::Client,
    spec: HttpSpec,
    session: Mutex<Option<String>>,
    protocol: Mutex<Option<String>>,
    stateless: Mutex<Option<Stateless>>,
    /// Input schemas by tool name, for the stateless era's `Mcp-Param-*` headers.
    schemas: Mutex<HashMap<String, Value>>,
    /// The POST serving each request in flight of the stateless era (closed to cancel it).
    posts: Mutex<HashMap<u64, tokio::task::AbortHandle>>,
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

    /// Speaks the stateless era from now on: every request carries `_meta` with the protocol
    /// version and ring0's client context, and the era's routing headers. `None` goes back to
    /// the sessionful era (after a failed `server/discover`).
    pub fn use_stateless(&self, version: Option<&str>, capabilities: &Value) {
        let context = version.map(|v| {
            let mut meta = Map::new();
            meta.insert(META_PROTOCOL_VERSION.into(), json!(v));
            meta.insert(
                META_CLIENT_INFO.into(),
                json!({"name": "ring0", "version": env!("CARGO_PKG_VERSION")}),
            );
            meta.insert(META_CLIENT_CAPABILITIES.into(), capabilities.clone());
            Stateless {
                version: v.to_string(),
                meta,
            }
        });
        *self.state.protocol.lock().expect("protocol") =
            context.as_ref().map(|c| c.version.clone());
        *self.state.stateless.lock().expect("stateless") = context;
    }

    /// Whether the connection speaks the stateless era.
    pub fn is_stateless(&self) -> bool {
        self.state.stateless.lock().expect("stateless").is_some()
    }

    /// Records the listed tools' input schemas (for `Mcp-Param-*` headers).
    pub fn set_tool_schemas(&self, schemas: HashMap<String, Value>) {
        *self.state.schemas.lock().expect("schemas") = schemas;
    }

    /// Opens the background GET stream for messages sent outside any request (sessionful era).
    pub fn open_listen_stream(&self) {
        let state = self.state.clone();
        tokio::spawn(async move { listen(state).await });
    }
}

impl Drop for HttpConnection {
    fn drop(&mut self) {
        self.state.stop.cancel();
        self.peer.close("the connection was closed by ring0");
        for (_, post) in self.state.posts.lock().expect("posts").drain() {
            post.abort();
        }
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
        let stateless = self.0.stateless.lock().expect("stateless").is_some();
        if stateless && message.get("id").is_none() {
            // The era has no client notifications: cancellation closes the request's stream;
            // anything else has no receiver.
            if message.get("method").and_then(Value::as_str) == Some("notifications/cancelled")
                && let Some(id) = message.pointer("/params/requestId").and_then(Value::as_u64)
                && let Some(post) = self.0.posts.lock().expect("posts").remove(&id)
            {
                post.abort();
            }
            return Ok(());
        }
        let state = self.0.clone();
        // The registry is held while the task is spawned, so its own removal at the end cannot
        // run before the insertion.
        let mut posts = self.0.posts.lock().expect("posts");
        let task = tokio::spawn(async move {
            post(state.clone(), message, related).await;
            if let Some(id) = related {
                state.posts.lock().expect("posts").remove(&id);
            }
        });
        if stateless && let Some(id) = related {
            posts.insert(id, task.abort_handle());
        }
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
        stateless: Mutex::new(None),
        schemas: Mutex::new(HashMap::new()),
        posts: Mutex::new(HashMap::new()),
        peer: OnceLock::new(),
        stop: CancellationToken::new(),
        log,
        alias: alias.to_string(),
    });
    let peer = RpcPeer::new(Arc::new(Post(state.clone())), handler);
    let _ = state.peer.set(Arc::downgrade(&peer));
    HttpConnection { peer, state }
}

/// A request to the server with the session's headers. `accept` is what the answer may be: a
/// POST takes JSON or an event stream, a GET only a stream (one `accept` header, never two).
fn request(state: &State, method: reqwest::Method, accept: &str) -> reqwest::RequestBuilder {
    let mut req = state
        .client
        .request(method, &state.spec.url)
        .header("accept", accept);
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

/// A header value as the stateless era encodes it: plain when it is safe visible ASCII,
/// otherwise `=?base64?…?=`.
fn header_value(value: &str) -> String {
    let sentinel = value.starts_with("=?base64?") && value.ends_with("?=");
    let plain = value.is_empty()
        || (!value.starts_with([' ', '\t'])
            && !value.ends_with([' ', '\t'])
            && value.chars().all(|c| (' '..='~').contains(&c))
            && !sentinel);
    if plain {
        value.to_string()
    } else {
        format!(
            "=?base64?{}?=",
            base64::engine::general_purpose::STANDARD.encode(value)
        )
    }
}

/// The stateless era's routing headers for one request: `Mcp-Method`, `Mcp-Name` and, for a
/// tool call, `Mcp-Param-*` for every argument the tool's schema marks with `x-mcp-header`.
fn routing_headers(message: &Value, schemas: &HashMap<String, Value>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let Some(method) = message.get("method").and_then(Value::as_str) else {
        return out;
    };
    out.push(("mcp-method".into(), method.to_string()));
    let params = message.get("params");
    let name_key = match method {
        "tools/call" | "prompts/get" => Some("name"),
        "resources/read" | "resources/subscribe" | "resources/unsubscribe" => Some("uri"),
        "tasks/get" | "tasks/update" | "tasks/cancel" => Some("taskId"),
        _ => None,
    };
    let name = name_key.and_then(|k| params?.get(k)?.as_str());
    if let Some(name) = name {
        out.push(("mcp-name".into(), header_value(name)));
    }
    if method == "tools/call"
        && let (Some(tool), Some(arguments)) = (name, params.and_then(|p| p.get("arguments")))
        && let Some(schema) = schemas.get(tool)
    {
        let mut path = Vec::new();
        param_headers(schema, arguments, &mut path, &mut out);
    }
    out
}

fn param_headers(
    schema: &Value,
    arguments: &Value,
    path: &mut Vec<String>,
    out: &mut Vec<(String, String)>,
) {
    let Some(Value::Object(properties)) = schema.get("properties") else {
        return;
    };
    for (name, sub) in properties {
        path.push(name.clone());
        if let Some(Value::String(header)) = sub.get("x-mcp-header")
            && !header.is_empty()
        {
            let value = path.iter().try_fold(arguments, |v, k| v.get(k));
            let text = match value {
                Some(Value::String(s)) => Some(s.clone()),
                Some(Value::Bool(b)) => Some(b.to_string()),
                Some(Value::Number(n)) => Some(n.to_string()),
                _ => None,
            };
            if let Some(text) = text {
                out.push((format!("mcp-param-{header}"), header_value(&text)));
            }
        }
        param_headers(sub, arguments, path, out);
        path.pop();
    }
}

/// Adds the stateless era's client context to a request's `_meta`, keeping what is there
/// (the progress token, ring0's own keys).
fn with_context(mut message: Value, context: &Stateless) -> Value {
    if message.get("method").is_none() {
        return message;
    }
    let Some(obj) = message.as_object_mut() else {
        return message;
    };
    let params = obj
        .entry("params")
        .or_insert_with(|| Value::Object(Map::new()));
    if let Some(p) = params.as_object_mut() {
        let meta = p
            .entry("_meta")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Some(m) = meta.as_object_mut() {
            for (k, v) in &context.meta {
                m.insert(k.clone(), v.clone());
            }
        }
    }
    message
}

async fn post(state: Arc<State>, message: Value, related: Option<u64>) {
    let Some(peer) = state.peer.get().and_then(Weak::upgrade) else {
        return;
    };
    let is_initialize = message.get("method").and_then(Value::as_str) == Some("initialize");
    let had_session = state.session.lock().expect("session").is_some();
    let stateless = state.stateless.lock().expect("stateless").clone();
    let mut extra = Vec::new();
    let message = match &stateless {
        Some(context) => {
            extra = routing_headers(&message, &state.schemas.lock().expect("schemas"));
            with_context(message, context)
        }
        None => message,
    };
    let body = serde_json::to_vec(&message).unwrap_or_default();
    let mut builder = request(
        &state,
        reqwest::Method::POST,
        "application/json, text/event-stream",
    )
    .header("content-type", "application/json")
    .body(body);
    for (k, v) in extra {
        builder = builder.header(k, v);
    }
    // The call's trace context travels in the headers as well as in `_meta`.
    for (k, v) in crate::trace::upstream_headers(&message) {
        builder = builder.header(k, v);
    }
    let sent = builder.send().await;
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
        // A JSON-RPC error in the body (the stateless era's header and version errors) is the
        // request's error: its code tells the caller what was wrong.
        if let Some(id) = related
            && let Ok(v) = serde_json::from_str::<Value>(&text)
            && v.get("error").is_some()
        {
            let mut v = v;
            v["id"] = json!(id);
            peer.deliver(v, related);
            return;
        }
        let why = format!("HTTP {status}: {}", clip(&text));
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
        let mut end = read_events(&state, &peer, response.bytes_stream(), related).await;
        if stateless.is_none() {
            if let Some(id) = related
                && end.last_id.is_some()
                && peer.is_pending(id)
                && !state.stop.is_cancelled()
            {
                peer.stream_closed(id);
            }
            end = resume(&state, &peer, related, end).await;
        }
        if let Some(id) = related
            && peer.is_pending(id)
            && !state.stop.is_cancelled()
        {
            let why = match end.last_id {
                Some(_) => format!(
                    "the response stream broke before the response arrived and could not be resumed ({} attempts)",
                    STREAM_RESUMES_MAX
                ),
                None => "the response stream ended before the response arrived (the server numbers no events, so it cannot be resumed)".into(),
            };
            peer.fail(id, RpcError::Lost(why));
        }
        return;
    }
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
    if let Some(id) = related
        && peer.is_pending(id)
        && !state.stop.is_cancelled()
    {
        peer.fail(
            id,
            RpcError::Lost("the response body ended without the response".into()),
        );
    }
}

/// Resumes a response stream that ended before the response, with `Last-Event-ID`, while the
/// request is still wanted (the call's timeouts forget it) and at most [`STREAM_RESUMES_MAX`]
/// times in a row without progress.
async fn resume(
    state: &State,
    peer: &Arc<RpcPeer>,
    related: Option<u64>,
    mut end: StreamEnd,
) -> StreamEnd {
    let Some(id) = related else { return end };
    let mut attempts = 0;
    while peer.is_pending(id) && !state.stop.is_cancelled() && attempts < STREAM_RESUMES_MAX {
        let Some(last) = end.last_id.clone() else {
            return end;
        };
        attempts += 1;
        let delay = end
            .retry_ms
            .map(Duration::from_millis)
            .unwrap_or(Duration::ZERO)
            .min(STREAM_RESUME_DELAY_MAX);
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = state.stop.cancelled() => return end,
        }
        if !peer.is_pending(id) {
            return end;
        }
        state.log.line(&format!(
            "[{}] the response stream of request {id} broke; resuming after event {last:?} (attempt {attempts} of {STREAM_RESUMES_MAX})",
            state.alias
        ));
        let sent = request(state, reqwest::Method::GET, "text/event-stream")
            .header("last-event-id", &last)
            .send()
            .await;
        match sent {
            Ok(r) if r.status().is_success() => {
                let next = read_events(state, peer, r.bytes_stream(), related).await;
                if next.last_id.as_ref().is_some_and(|l| *l != last) {
                    // Progress: the budget of attempts applies to failures in a row.
                    attempts = 0;
                }
                end = StreamEnd {
                    last_id: next.last_id.or(end.last_id),
                    retry_ms: next.retry_ms.or(end.retry_ms),
                };
            }
            Ok(r) => {
                state.log.line(&format!(
                    "[{}] resuming the response stream of request {id} was refused (HTTP {})",
                    state.alias,
                    r.status()
                ));
                return end;
            }
            Err(e) => state.log.line(&format!(
                "[{}] resuming the response stream of request {id} failed: {e}",
                state.alias
            )),
        }
    }
    end
}

fn clip(text: &str) -> String {
    let mut s = text.to_string();
    if s.len() > 512 {
        s.truncate(s.floor_char_boundary(512));
        s.push('…');
    }
    s
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
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
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

/// Where an event stream stopped: the last event id and the server's reconnection delay.
#[derive(Default)]
struct StreamEnd {
    last_id: Option<String>,
    retry_ms: Option<u64>,
}

async fn read_events<S>(
    state: &State,
    peer: &Arc<RpcPeer>,
    stream: S,
    related: Option<u64>,
) -> StreamEnd
where
    S: Stream<Item = Result<Bytes, reqwest::Error>> + Send,
{
    let mut end = StreamEnd::default();
    let events = sse_stream::SseStream::from_bytes_stream(bound_events(stream));
    futures::pin_mut!(events);
    loop {
        let next = tokio::select! {
            n = events.next() => n,
            _ = state.stop.cancelled() => return end,
        };
        match next {
            None => return end,
            Some(Err(e)) => {
                state
                    .log
                    .line(&format!("[{}] event stream failed: {e}", state.alias));
                return end;
            }
            Some(Ok(event)) => {
                if let Some(id) = event.id.filter(|i| !i.is_empty()) {
                    end.last_id = Some(id);
                }
                if let Some(retry) = event.retry {
                    end.retry_ms = Some(retry);
                }
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
        let sent = request(&state, reqwest::Method::GET, "text/event-stream")
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

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> State {
        State {
            client: client().expect("client"),
            spec: HttpSpec {
                url: "http://127.0.0.1:9/mcp".into(),
                headers: BTreeMap::new(),
            },
            session: Mutex::new(Some("s-1".into())),
            protocol: Mutex::new(Some("2025-11-25".into())),
            stateless: Mutex::new(None),
            schemas: Mutex::new(HashMap::new()),
            posts: Mutex::new(HashMap::new()),
            peer: OnceLock::new(),
            stop: CancellationToken::new(),
            log: Log::discard(),
            alias: "u".into(),
        }
    }

    #[test]
    fn a_stream_request_accepts_only_an_event_stream_and_says_so_once() {
        let state = state();
        let get = request(&state, reqwest::Method::GET, "text/event-stream")
            .build()
            .expect("request");
        let accept: Vec<_> = get.headers().get_all("accept").iter().collect();
        assert_eq!(accept, ["text/event-stream"]);
        let post = request(
            &state,
            reqwest::Method::POST,
            "application/json, text/event-stream",
        )
        .build()
        .expect("request");
        let accept: Vec<_> = post.headers().get_all("accept").iter().collect();
        assert_eq!(accept, ["application/json, text/event-stream"]);
        assert_eq!(post.headers()["mcp-session-id"], "s-1");
        assert_eq!(post.headers()["mcp-protocol-version"], "2025-11-25");
    }

    #[test]
    fn header_values_that_cannot_travel_plain_are_base64_wrapped() {
        assert_eq!(header_value("echo"), "echo");
        assert_eq!(header_value("a b"), "a b");
        assert_eq!(header_value(" lead"), "=?base64?IGxlYWQ=?=");
        assert_eq!(header_value("naïve"), "=?base64?bmHDr3Zl?=");
    }

    #[test]
    fn a_tool_call_carries_method_name_and_marked_parameter_headers() {
        let schemas = HashMap::from([(
            "get".to_string(),
            json!({"type": "object", "properties": {
                "region": {"type": "string", "x-mcp-header": "Region"},
                "opts": {"type": "object", "properties": {"dry": {"type": "boolean", "x-mcp-header": "Dry"}}},
                "other": {"type": "string"}
            }}),
        )]);
        let message = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "get", "arguments": {"region": "eu", "opts": {"dry": true}, "other": "x"}}});
        let mut headers = routing_headers(&message, &schemas);
        headers.sort();
        assert_eq!(
            headers,
            vec![
                ("mcp-method".to_string(), "tools/call".to_string()),
                ("mcp-name".to_string(), "get".to_string()),
                ("mcp-param-Dry".to_string(), "true".to_string()),
                ("mcp-param-Region".to_string(), "eu".to_string()),
            ]
        );
    }

    #[test]
    fn the_client_context_joins_the_request_meta_without_replacing_it() {
        let context = Stateless {
            version: STATELESS_PROTOCOL_VERSION.into(),
            meta: Map::from_iter([(META_PROTOCOL_VERSION.to_string(), json!("2026-07-28"))]),
        };
        let m = with_context(
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": {"progressToken": "t"}}}),
            &context,
        );
        assert_eq!(m["params"]["_meta"]["progressToken"], "t");
        assert_eq!(m["params"]["_meta"][META_PROTOCOL_VERSION], "2026-07-28");
        let bare = with_context(
            json!({"jsonrpc": "2.0", "id": 2, "method": "server/discover"}),
            &context,
        );
        assert_eq!(bare["params"]["_meta"][META_PROTOCOL_VERSION], "2026-07-28");
    }
}
