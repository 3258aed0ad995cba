//! Upstream MCP servers: connection, supervision, listing, pinning and calls.
//!
//! Each configured upstream has a supervisor task: connect (spawn the child or reach the URL),
//! `initialize`, `notifications/initialized`, list every page of `tools/list`, check every
//! definition against the pin book, publish the listing, then wait. A `list_changed`
//! notification lists and pins again; a lost connection (the child died, the session expired) is
//! retried with exponential backoff, and the new connection is initialized, listed and pinned
//! before it serves a call. While an upstream is down its last listing stays published and calls
//! fail at once as "not applied" (nothing was sent); after [`RESTARTS_MAX`] failed starts in a row
//! it is given up and its tools are withdrawn.

pub mod http;
pub mod roots;
pub mod secrets;
pub mod stdio;

use crate::config::{Endpoint, UpstreamConfig, UpstreamProtocol};
use crate::forward::{ForwardConfig, forward};
use crate::limits::{
    LIST_PAGES_MAX, RESTART_BACKOFF_INITIAL, RESTART_BACKOFF_MAX, RESTART_BACKOFF_RESET_AFTER,
    RESTARTS_MAX, UPSTREAM_HANDSHAKE_TIMEOUT, UPSTREAM_INPUT_ROUNDS_MAX, UPSTREAM_PROMPTS_MAX,
    UPSTREAM_TOOLS_MAX,
};
use crate::log::Log;
use crate::names::expose;
use crate::pin::{PinBook, PinVerdict, ServerIdentity};
use crate::route::CallRoute;
use crate::rpc::{InboundHandler, RpcError, RpcPeer, code, error_object};
use jsonschema::Validator;
use ring0_core::Observation;
use ring0_kernel::{CallContext, ToolError};
use ring0_policy::AuditDecision;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// The protocol version ring0 asks upstreams for in the sessionful handshake (they may answer an
/// older one). Streamable HTTP upstreams are first offered the stateless era (`server/discover`).
pub const UPSTREAM_PROTOCOL_VERSION: &str = "2025-11-25";
/// Delay before a stateless upstream's `subscriptions/listen` stream is opened again.
const SUBSCRIPTION_RETRY: Duration = Duration::from_secs(2);

/// One tool of an upstream's listing.
#[derive(Debug, Clone)]
pub struct ListedTool {
    /// The server's own name.
    pub name: String,
    /// `alias__name`.
    pub qualified: String,
    /// The definition exactly as listed (what the pin covers).
    pub raw: Value,
    /// The definition as clients see it: cleaned and bounded ([`crate::mediate::definition`]).
    pub clean: Value,
    pub verdict: PinVerdict,
}

/// One prompt of an upstream's listing.
#[derive(Debug, Clone)]
pub struct ListedPrompt {
    /// The server's own name.
    pub name: String,
    /// The name clients see (`alias__name`, or the server's own without a namespace).
    pub exposed: String,
    /// The definition as clients see it: cleaned and bounded, `name` exposed.
    pub clean: Value,
    pub verdict: PinVerdict,
}

/// An upstream's last listing.
#[derive(Debug, Clone)]
pub struct Listing {
    pub server: ServerIdentity,
    /// The server's `capabilities` from `initialize`.
    pub capabilities: Value,
    pub protocol_version: String,
    pub tools: Vec<ListedTool>,
    /// Its prompts, pinned like tools (empty when it offers none).
    pub prompts: Vec<ListedPrompt>,
}

enum Connection {
    Stdio(#[allow(dead_code)] stdio::StdioConnection),
    Http(#[allow(dead_code)] http::HttpConnection),
}

struct Live {
    peer: Arc<RpcPeer>,
    _connection: Connection,
}

struct ProgressRoute {
    idle: Arc<Notify>,
    entry: Option<Arc<CallRoute>>,
}

/// One upstream server and its supervisor's shared state.
pub struct Upstream {
    pub config: UpstreamConfig,
    log: Log,
    pins: Arc<PinBook>,
    http_client: Option<reqwest::Client>,
    live: RwLock<Option<Arc<Live>>>,
    listing: RwLock<Option<Arc<Listing>>>,
    progress: Mutex<HashMap<String, ProgressRoute>>,
    /// Upstream request id → the call it serves, in start order (for relaying server requests).
    in_flight: Mutex<Vec<(u64, Arc<CallRoute>)>>,
    relist: Notify,
    on_change: Arc<dyn Fn() + Send + Sync>,
    next_token: AtomicU64,
    /// Connections made so far (1 after the first start).
    starts: AtomicU64,
    /// Set when the stateless era failed with this server after it offered it: later
    /// connections go straight to the sessionful handshake (the fallback is logged once).
    sessionful_only: AtomicBool,
    connected: Notify,
    capabilities: Mutex<Value>,
    /// What `roots/list` is answered with (see [`roots`]).
    roots: Vec<Value>,
    /// Where relative secret files start (and which they may not be inside).
    workspace: std::path::PathBuf,
    /// Where a resource cut for size is kept whole.
    spill: Option<Arc<ring0_shape::SpillStore>>,
    /// The OS sandbox a stdio server runs in.
    sandbox: ring0_exec::Sandbox,
    /// Where mediation records go ([`Upstream::audit_mediation`]).
    audit: Option<Arc<dyn ring0_policy::AuditSink>>,
}

/// What an upstream is given of the workspace.
pub struct WorkspaceView {
    /// Its `roots/list` answer (see [`roots::resolve`]).
    pub roots: Vec<Value>,
    /// Where relative secret files start (and which they may not be inside).
    pub workspace: std::path::PathBuf,
    /// Where a resource cut for size is kept whole.
    pub spill: Option<Arc<ring0_shape::SpillStore>>,
    /// The OS sandbox a stdio server runs in.
    pub sandbox: ring0_exec::Sandbox,
    /// The audit log, where what mediation did to this server's definitions and texts is
    /// recorded (`None`: ring0's log only).
    pub audit: Option<Arc<dyn ring0_policy::AuditSink>>,
}

struct Handler(Weak<Upstream>);

#[async_trait::async_trait]
impl InboundHandler for Handler {
    fn notification(&self, method: &str, params: Option<Value>, related: Option<u64>) {
        let Some(up) = self.0.upgrade() else { return };
        match method {
            "notifications/tools/list_changed" | "notifications/prompts/list_changed" => {
                up.relist.notify_one()
            }
            "notifications/progress" => up.on_progress(params.unwrap_or(Value::Null)),
            "notifications/message" => {
                let p = params.unwrap_or(Value::Null);
                let entry = route_of(&up.in_flight.lock().expect("in flight"), related);
                if let Some(down) = entry.and_then(|e| e.downstream.clone()) {
                    down.log(crate::mediate::relayed(&p));
                    return;
                }
                let level = p.get("level").and_then(Value::as_str).unwrap_or("info");
                let data = p.get("data").map(|d| match d {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                });
                up.log.line(&format!(
                    "[{}] {level}: {}",
                    up.config.alias,
                    data.unwrap_or_default()
                ));
            }
            _ => {}
        }
    }

    fn stream_closed(&self, related: u64) {
        let Some(up) = self.0.upgrade() else { return };
        let entry = route_of(&up.in_flight.lock().expect("in flight"), Some(related));
        if let Some(down) = entry.and_then(|e| e.downstream.clone()) {
            down.poll_later();
        }
    }

    async fn request(
        &self,
        method: &str,
        params: Option<Value>,
        related: Option<u64>,
    ) -> Result<Value, Value> {
        let Some(up) = self.0.upgrade() else {
            return Err(error_object(code::INTERNAL_ERROR, "ring0 is shutting down"));
        };
        if method == "ping" {
            return Ok(json!({}));
        }
        // Roots are the upstream's own, from config: never the client's (which are wider).
        if method == "roots/list" {
            return Ok(json!({"roots": up.roots}));
        }
        let (entry, ambiguous) = {
            let flights = up.in_flight.lock().expect("in flight");
            (
                route_of(&flights, related),
                related.is_none() && flights.len() > 1,
            )
        };
        if ambiguous {
            return Err(error_object(
                code::INVALID_REQUEST,
                format!(
                    "{method}: several calls of this server are in flight and the request names none of them, so ring0 cannot tell whose client to ask"
                ),
            ));
        }
        match entry.and_then(|e| e.downstream.clone()) {
            Some(down) => {
                let params = params.as_ref().map(crate::mediate::relayed);
                down.request(method, params).await
            }
            None => Err(error_object(
                code::METHOD_NOT_FOUND,
                format!(
                    "{method}: no client is waiting on a call of this server, so ring0 cannot relay the request"
                ),
            )),
        }
    }
}

/// The route of the call a server's message belongs to: the one it names, or — stdio carries no
/// association — the only call in flight. With several in flight and none named, no client's
/// route is guessed: a question relayed to the wrong client would leak one client's call to
/// another.
fn route_of(flights: &[(u64, Arc<CallRoute>)], related: Option<u64>) -> Option<Arc<CallRoute>> {
    match related {
        Some(id) => flights
            .iter()
            .find(|(i, _)| *i == id)
            .map(|(_, e)| e.clone()),
        None if flights.len() == 1 => Some(flights[0].1.clone()),
        None => None,
    }
}

/// Removes a request's route and tells the server when it is abandoned before its response.
struct CallGuard<'a> {
    up: &'a Upstream,
    peer: Arc<RpcPeer>,
    id: u64,
    done: bool,
}

impl Drop for CallGuard<'_> {
    fn drop(&mut self) {
        self.up
            .in_flight
            .lock()
            .expect("in flight")
            .retain(|(i, _)| *i != self.id);
        if !self.done {
            self.peer.cancel(
                self.id,
                "the call was abandoned by ring0 (timeout or cancellation)",
            );
        }
    }
}

impl Upstream {
    pub fn new(
        config: UpstreamConfig,
        pins: Arc<PinBook>,
        log: Log,
        http_client: Option<reqwest::Client>,
        on_change: Arc<dyn Fn() + Send + Sync>,
        view: WorkspaceView,
    ) -> Arc<Self> {
        Arc::new(Self {
            config,
            log,
            pins,
            http_client,
            live: RwLock::new(None),
            listing: RwLock::new(None),
            progress: Mutex::new(HashMap::new()),
            in_flight: Mutex::new(Vec::new()),
            relist: Notify::new(),
            on_change,
            next_token: AtomicU64::new(1),
            starts: AtomicU64::new(0),
            sessionful_only: AtomicBool::new(false),
            connected: Notify::new(),
            capabilities: Mutex::new(Value::Null),
            roots: view.roots,
            workspace: view.workspace,
            sandbox: view.sandbox,
            spill: view.spill,
            audit: view.audit,
        })
    }

    pub fn alias(&self) -> &str {
        &self.config.alias
    }

    /// Where a resource cut for size is kept whole.
    pub fn spill(&self) -> Option<&Arc<ring0_shape::SpillStore>> {
        self.spill.as_ref()
    }

    /// A line in the gateway's log, prefixed with the alias.
    pub fn note(&self, line: &str) {
        self.log.line(&format!("[{}] {line}", self.config.alias));
    }

    /// Records a pin's verdict on a definition (nothing for one already approved).
    fn audit_pin(&self, subject: &str, verdict: &PinVerdict) {
        let (rule, decision, what) = match verdict {
            PinVerdict::Approved => return,
            PinVerdict::Quarantined(why) => {
                ("pin:quarantined", AuditDecision::Denied, why.as_str())
            }
            PinVerdict::Reported(what) => ("pin:reported", AuditDecision::Allowed, what.as_str()),
            PinVerdict::TrustedOnFirstUse => (
                "pin:trusted_on_first_use",
                AuditDecision::Allowed,
                "recorded in the lock file",
            ),
        };
        self.audit_mediation(subject, rule, decision, what);
    }

    /// Records in the audit log what mediation did to `subject` (a definition or text this
    /// server sent): `rule` names the mediation, `what` tells it. A record that cannot be
    /// written is said in ring0's log.
    pub fn audit_mediation(
        &self,
        subject: &str,
        rule: &str,
        decision: ring0_policy::AuditDecision,
        what: &str,
    ) {
        let Some(audit) = &self.audit else {
            return;
        };
        let source = format!("upstream:{}", self.config.alias);
        let entry = ring0_policy::mediation_entry(&source, subject, rule, decision, what);
        if let Err(e) = audit.record(&entry) {
            self.note(&format!("the audit log refused a mediation record: {e}"));
        }
    }

    /// The last published listing, if any.
    pub fn listing(&self) -> Option<Arc<Listing>> {
        self.listing.read().expect("listing").clone()
    }

    /// Whether a connection is up now.
    pub fn is_connected(&self) -> bool {
        self.live
            .read()
            .expect("live")
            .as_ref()
            .is_some_and(|l| !l.peer.is_closed())
    }

    /// How many connections were made so far.
    pub fn starts(&self) -> u64 {
        self.starts.load(Ordering::Relaxed)
    }

    /// Waits until a connection is up and listed (or the timeout passes).
    pub async fn wait_connected(&self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.connected.notified();
            if self.is_connected() && self.listing().is_some() {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.is_connected() && self.listing().is_some();
            }
        }
    }

    /// Starts the supervisor task.
    pub fn start(self: &Arc<Self>) {
        let this = Arc::downgrade(self);
        tokio::spawn(async move { supervise(this).await });
    }

    fn on_progress(&self, params: Value) {
        let Some(token) = params.get("progressToken").map(|t| match t {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        }) else {
            return;
        };
        let routes = self.progress.lock().expect("progress");
        let Some(route) = routes.get(&token) else {
            return;
        };
        route.idle.notify_one();
        if let Some(down) = route.entry.as_ref().and_then(|e| e.downstream.as_ref()) {
            down.progress(
                params
                    .get("progress")
                    .and_then(Value::as_f64)
                    .unwrap_or(0.0),
                params.get("total").and_then(Value::as_f64),
                params
                    .get("message")
                    .map(crate::mediate::relayed)
                    .and_then(|m| m.as_str().map(str::to_string)),
            );
        }
    }

    async fn connect_once(self: &Arc<Self>) -> Result<Arc<RpcPeer>, String> {
        let handler: Arc<dyn InboundHandler> = Arc::new(Handler(Arc::downgrade(self)));
        let alias = self.config.alias.clone();
        let secret = secrets::resolve(&self.config, &self.workspace)?;
        secrets::register(&secret, &self.log);
        let (peer, connection) = match self.config.endpoint() {
            Endpoint::Stdio => {
                let mut env = BTreeMap::new();
                for name in &self.config.env {
                    if let Ok(v) = std::env::var(name) {
                        env.insert(name.clone(), v);
                    }
                }
                env.extend(self.config.env_set.clone());
                for (name, value) in &secret.env {
                    env.insert(name.clone(), value.expose().to_string());
                }
                let spec = stdio::StdioSpec {
                    command: self.config.command.clone().unwrap_or_default(),
                    args: self.config.args.clone(),
                    env,
                    cwd: self.config.cwd.clone(),
                    sandbox: self.sandbox.clone(),
                };
                let conn = stdio::spawn(&alias, &spec, handler, self.log.clone())
                    .map_err(|e| format!("cannot start {:?}: {e}", spec.command))?;
                (conn.peer.clone(), Connection::Stdio(conn))
            }
            Endpoint::Http => {
                let mut headers = self.config.headers.clone();
                for (name, value) in &secret.headers {
                    headers.insert(name.clone(), value.expose().to_string());
                }
                let spec = http::HttpSpec {
                    url: self.config.url.clone().unwrap_or_default(),
                    headers,
                };
                let client = match &self.http_client {
                    Some(c) => c.clone(),
                    None => http::client()?,
                };
                let conn = http::connect(&alias, &spec, client, handler, self.log.clone());
                (conn.peer.clone(), Connection::Http(conn))
            }
        };
        let client_capabilities = json!({"roots": {}, "sampling": {}, "elicitation": {}});
        let pinned = self.config.protocol;
        let stateless_first = matches!(connection, Connection::Http(_))
            && match pinned {
                UpstreamProtocol::Auto => !self.sessionful_only.load(Ordering::Relaxed),
                UpstreamProtocol::V2026_07_28 => true,
                UpstreamProtocol::V2025_11_25 | UpstreamProtocol::V2025_06_18 => false,
            };
        let discovered = match &connection {
            Connection::Http(c) if stateless_first => {
                match self.discover(c, &peer, &client_capabilities).await {
                    Ok(init) => Some(init),
                    // Not reached at all: no era to choose yet; the start fails and is retried.
                    Err(why) if peer.is_closed() => {
                        return Err(format!("cannot reach the server: {why}"));
                    }
                    Err(why) if pinned == UpstreamProtocol::V2026_07_28 => {
                        return Err(format!(
                            "protocol is pinned to {STATELESS}, but {why}; ring0 does not switch eras on its own (protocol = \"auto\" allows the sessionful handshake)",
                            STATELESS = http::STATELESS_PROTOCOL_VERSION
                        ));
                    }
                    Err(why) => {
                        c.use_stateless(None, &client_capabilities);
                        self.log.line(&format!(
                            "[{alias}] no stateless protocol ({why}); using the sessionful handshake"
                        ));
                        None
                    }
                }
            }
            _ => None,
        };
        let init = match discovered {
            Some(init) => init,
            None => {
                self.initialize(&connection, &peer, &client_capabilities)
                    .await?
            }
        };
        let stateless = matches!(&connection, Connection::Http(c) if c.is_stateless());
        let live = Arc::new(Live {
            peer: peer.clone(),
            _connection: connection,
        });
        self.adopt(&init, &live);
        match self
            .list(
                &peer,
                ServerIdentity::from_initialize(&init),
                protocol_of(&init),
            )
            .await
        {
            Ok(()) => {}
            Err(why) if stateless && pinned == UpstreamProtocol::Auto => {
                // The server offered the stateless era but does not serve it: speak the
                // sessionful one on the same endpoint, and keep to it for this server.
                self.sessionful_only.store(true, Ordering::Relaxed);
                self.log.line(&format!(
                    "[{alias}] protocol {} failed at its first listing ({why}); falling back to the sessionful handshake, which this server keeps from now on",
                    http::STATELESS_PROTOCOL_VERSION
                ));
                if let Connection::Http(c) = &live._connection {
                    c.use_stateless(None, &client_capabilities);
                }
                let init = self
                    .initialize(&live._connection, &peer, &client_capabilities)
                    .await?;
                self.adopt(&init, &live);
                self.list(
                    &peer,
                    ServerIdentity::from_initialize(&init),
                    protocol_of(&init),
                )
                .await?;
            }
            Err(why) => {
                return Err(match pinned.pinned() {
                    Some(v) => format!("{why} (protocol pinned to {v})"),
                    None => why,
                });
            }
        }
        if let Connection::Http(c) = &live._connection
            && c.is_stateless()
            && self
                .capabilities()
                .pointer("/tools/listChanged")
                .and_then(Value::as_bool)
                == Some(true)
        {
            self.subscribe_list_changed(&peer);
        }
        self.starts.fetch_add(1, Ordering::Relaxed);
        self.connected.notify_waiters();
        Ok(peer)
    }

    /// Makes `live` the connection and records what its handshake said.
    fn adopt(&self, init: &Value, live: &Arc<Live>) {
        *self.capabilities.lock().expect("capabilities") =
            init.get("capabilities").cloned().unwrap_or(Value::Null);
        *self.live.write().expect("live") = Some(live.clone());
    }

    /// The sessionful handshake: `initialize` (asking for the pinned version, or
    /// [`UPSTREAM_PROTOCOL_VERSION`]), then `notifications/initialized`. A pinned version the
    /// server does not answer with is refused, not accepted in its place.
    async fn initialize(
        &self,
        connection: &Connection,
        peer: &Arc<RpcPeer>,
        client_capabilities: &Value,
    ) -> Result<Value, String> {
        let pin = self.config.protocol.pinned();
        let init = tokio::time::timeout(
            UPSTREAM_HANDSHAKE_TIMEOUT,
            peer.request(
                "initialize",
                Some(json!({
                    "protocolVersion": pin.unwrap_or(UPSTREAM_PROTOCOL_VERSION),
                    "capabilities": client_capabilities,
                    "clientInfo": {"name": "ring0", "version": env!("CARGO_PKG_VERSION")},
                })),
            ),
        )
        .await
        .map_err(|_| "initialize timed out".to_string())?
        .map_err(|e| format!("initialize failed: {}", explain(&e)))?;
        let protocol = protocol_of(&init);
        if let Some(pin) = pin
            && protocol != pin
        {
            return Err(format!(
                "protocol is pinned to {pin}, but the server answered initialize with {protocol:?}; ring0 does not switch eras on its own (protocol = \"auto\" accepts the server's choice)"
            ));
        }
        if let Connection::Http(c) = connection {
            c.set_protocol_version(&protocol);
        }
        peer.notify("notifications/initialized", None)
            .map_err(|e| format!("notifications/initialized: {e}"))?;
        if let Connection::Http(c) = connection {
            c.open_listen_stream();
        }
        Ok(init)
    }

    /// Asks an HTTP server for the stateless era with `server/discover`. Returns what
    /// `initialize` would have (protocol version, capabilities, server info, instructions) when
    /// the server offers [`http::STATELESS_PROTOCOL_VERSION`]; otherwise why not (the caller
    /// decides whether the sessionful era may take over).
    async fn discover(
        &self,
        connection: &http::HttpConnection,
        peer: &Arc<RpcPeer>,
        client_capabilities: &Value,
    ) -> Result<Value, String> {
        let alias = &self.config.alias;
        connection.use_stateless(Some(http::STATELESS_PROTOCOL_VERSION), client_capabilities);
        let answer = tokio::time::timeout(
            UPSTREAM_HANDSHAKE_TIMEOUT,
            peer.request("server/discover", Some(json!({}))),
        )
        .await;
        match answer {
            Ok(Ok(found)) => {
                let offered = found
                    .get("supportedVersions")
                    .and_then(Value::as_array)
                    .is_some_and(|v| {
                        v.iter()
                            .any(|v| v.as_str() == Some(http::STATELESS_PROTOCOL_VERSION))
                    });
                if offered {
                    self.log.line(&format!(
                        "[{alias}] speaking protocol {} (stateless)",
                        http::STATELESS_PROTOCOL_VERSION
                    ));
                    return Ok(json!({
                        "protocolVersion": http::STATELESS_PROTOCOL_VERSION,
                        "capabilities": found.get("capabilities").cloned().unwrap_or(Value::Null),
                        "serverInfo": found.pointer("/_meta/io.modelcontextprotocol~1serverInfo").cloned().unwrap_or(Value::Null),
                        "instructions": found.get("instructions").cloned().unwrap_or(Value::Null),
                    }));
                }
                Err(format!(
                    "it offers only {}",
                    found
                        .get("supportedVersions")
                        .map(Value::to_string)
                        .unwrap_or_else(|| "no versions".into())
                ))
            }
            Ok(Err(e)) => Err(explain(&e)),
            Err(_) => Err("server/discover timed out".into()),
        }
    }

    /// Keeps a `subscriptions/listen` request open (the stateless era's channel for
    /// `notifications/tools/list_changed`), opening it again when it ends, until the connection
    /// closes or the server refuses it.
    fn subscribe_list_changed(self: &Arc<Self>, peer: &Arc<RpcPeer>) {
        let this = Arc::downgrade(self);
        let peer = peer.clone();
        tokio::spawn(async move {
            while !peer.is_closed() {
                let flight = match peer.start(
                    "subscriptions/listen",
                    Some(json!({"notifications": {"toolsListChanged": true}})),
                ) {
                    Ok(f) => f,
                    Err(_) => return,
                };
                let id = flight.id;
                let outcome = tokio::select! {
                    r = flight.result => r.unwrap_or_else(|_| Err(RpcError::Lost("closed".into()))),
                    _ = peer.closed().cancelled() => return,
                };
                if let Err(e @ RpcError::Remote { .. }) = &outcome {
                    if let Some(up) = this.upgrade() {
                        up.log.line(&format!(
                            "[{}] no list-changed subscription: {}",
                            up.config.alias,
                            explain(e)
                        ));
                    }
                    return;
                }
                peer.forget(id);
                tokio::select! {
                    _ = tokio::time::sleep(SUBSCRIPTION_RETRY) => {}
                    _ = peer.closed().cancelled() => return,
                }
            }
        });
    }

    /// Lists every page, pins, and publishes the listing.
    async fn list(
        &self,
        peer: &Arc<RpcPeer>,
        server: ServerIdentity,
        protocol_version: String,
    ) -> Result<(), String> {
        let alias = &self.config.alias;
        let raw_tools = list_pages(peer, "tools/list", "tools", UPSTREAM_TOOLS_MAX).await?;
        // Names: qualified, duplicates refused on both sides.
        let mut named: Vec<(String, String, Value)> = Vec::new();
        let mut counts: HashMap<String, usize> = HashMap::new();
        for raw in raw_tools {
            let Some(name) = raw.get("name").and_then(Value::as_str).map(str::to_string) else {
                self.log
                    .line(&format!("[{alias}] a listed tool has no name; ignored"));
                continue;
            };
            match expose(alias, &name, self.config.namespace) {
                Ok(q) => {
                    *counts.entry(q.clone()).or_default() += 1;
                    named.push((name, q, raw));
                }
                Err(e) => self
                    .log
                    .line(&format!("[{alias}] tool {name:?} cannot be exposed: {e}")),
            }
        }
        named.retain(|(name, q, _)| {
            let unique = counts[q] == 1;
            if !unique {
                self.log.line(&format!(
                    "[{alias}] tool {name:?} is refused: another tool of this server maps to the same name {q:?}"
                ));
            }
            unique
        });
        let pairs: Vec<(String, Value)> = named
            .iter()
            .map(|(n, _, r)| (n.clone(), r.clone()))
            .collect();
        let verdicts = self.pins.check_listing(
            alias,
            &server,
            &pairs,
            self.config.report_new_optional_params,
        );
        let mut tools = Vec::with_capacity(named.len());
        for ((name, qualified, raw), verdict) in named.into_iter().zip(verdicts) {
            let (clean, mediated) = crate::mediate::definition(&raw);
            let subject = format!("tool {qualified}");
            if let Some(what) = mediated.summary() {
                self.log.line(&format!(
                    "[{alias}] tool {qualified}: its definition was cleaned before any client sees it ({what})"
                ));
                self.audit_mediation(&subject, "mediate:cleaned", AuditDecision::Allowed, &what);
            }
            match &verdict {
                PinVerdict::Quarantined(why) => self.log.line(&format!(
                    "[{alias}] tool {qualified} is quarantined: {why}; approve it with `ring0 approve-tool {qualified}`"
                )),
                PinVerdict::Reported(what) => {
                    self.log.line(&format!("[{alias}] tool {qualified}: {what}"))
                }
                PinVerdict::TrustedOnFirstUse => self.log.line(&format!(
                    "[{alias}] tool {qualified} trusted on first use and recorded in {}",
                    self.pins.lock_path().display()
                )),
                PinVerdict::Approved => {}
            }
            self.audit_pin(&subject, &verdict);
            tools.push(ListedTool {
                name,
                qualified,
                raw,
                clean,
                verdict,
            });
        }
        // Tools serve without prompts: a prompt listing that fails leaves none listed.
        let prompts = self.list_prompts(peer, &server).await.unwrap_or_else(|e| {
            self.log.line(&format!("[{alias}] no prompts listed: {e}"));
            Vec::new()
        });
        let live = self.live.read().expect("live").clone();
        if let Some(Connection::Http(c)) = live.as_ref().map(|l| &l._connection) {
            c.set_tool_schemas(
                tools
                    .iter()
                    .filter_map(|t| Some((t.name.clone(), t.raw.get("inputSchema")?.clone())))
                    .collect(),
            );
        }
        *self.listing.write().expect("listing") = Some(Arc::new(Listing {
            server,
            capabilities: self.capabilities.lock().expect("capabilities").clone(),
            protocol_version,
            tools,
            prompts,
        }));
        (self.on_change)();
        Ok(())
    }

    /// Lists every page of `prompts/list` (when the server offers prompts) and pins them.
    async fn list_prompts(
        &self,
        peer: &Arc<RpcPeer>,
        server: &ServerIdentity,
    ) -> Result<Vec<ListedPrompt>, String> {
        let alias = &self.config.alias;
        let offers = self
            .capabilities
            .lock()
            .expect("capabilities")
            .get("prompts")
            .is_some_and(|c| !c.is_null());
        if !offers {
            return Ok(Vec::new());
        }
        let raw_prompts = list_pages(peer, "prompts/list", "prompts", UPSTREAM_PROMPTS_MAX).await?;
        let mut named: Vec<(String, String, Value)> = Vec::new();
        for raw in raw_prompts {
            let Some(name) = raw.get("name").and_then(Value::as_str).map(str::to_string) else {
                continue;
            };
            match expose(alias, &name, self.config.namespace) {
                Ok(exposed) if !named.iter().any(|(_, e, _)| *e == exposed) => {
                    named.push((name, exposed, raw))
                }
                Ok(exposed) => self.log.line(&format!(
                    "[{alias}] prompt {name:?} is refused: another prompt maps to the same name {exposed:?}"
                )),
                Err(e) => self
                    .log
                    .line(&format!("[{alias}] prompt {name:?} cannot be exposed: {e}")),
            }
        }
        let pairs: Vec<(String, Value)> = named
            .iter()
            .map(|(n, _, r)| (n.clone(), r.clone()))
            .collect();
        let verdicts = self.pins.check_prompts(alias, server, &pairs);
        let mut out = Vec::with_capacity(named.len());
        for ((name, exposed, raw), verdict) in named.into_iter().zip(verdicts) {
            match &verdict {
                PinVerdict::Quarantined(why) => self.log.line(&format!(
                    "[{alias}] prompt {exposed} is quarantined: {why}; approve it with `ring0 approve-tool {exposed}`"
                )),
                PinVerdict::TrustedOnFirstUse => self.log.line(&format!(
                    "[{alias}] prompt {exposed} trusted on first use and recorded in {}",
                    self.pins.lock_path().display()
                )),
                _ => {}
            }
            let subject = format!("prompt {exposed}");
            self.audit_pin(&subject, &verdict);
            let (mut clean, mediated) = crate::mediate::definition(&raw);
            if let Some(what) = mediated.summary() {
                self.log.line(&format!(
                    "[{alias}] prompt {exposed}: its definition was cleaned before any client sees it ({what})"
                ));
                self.audit_mediation(&subject, "mediate:cleaned", AuditDecision::Allowed, &what);
            }
            clean["name"] = Value::String(exposed.clone());
            out.push(ListedPrompt {
                name,
                exposed,
                clean,
                verdict,
            });
        }
        Ok(out)
    }

    /// Sends a request that is not a tool call (prompts, resources, completion, logging level)
    /// and returns the server's raw result.
    pub async fn passthrough(
        &self,
        method: &str,
        params: Option<Value>,
    ) -> Result<Value, RpcError> {
        let live = self.live.read().expect("live").clone();
        let Some(live) = live.filter(|l| !l.peer.is_closed()) else {
            return Err(RpcError::NotSent(format!(
                "upstream {:?} is not connected",
                self.config.alias
            )));
        };
        match tokio::time::timeout(
            UPSTREAM_HANDSHAKE_TIMEOUT,
            live.peer.request(method, params),
        )
        .await
        {
            Ok(r) => r,
            Err(_) => Err(RpcError::Lost(format!("{method} timed out"))),
        }
    }

    /// The server's capabilities (from its last `initialize`).
    pub fn capabilities(&self) -> Value {
        self.capabilities.lock().expect("capabilities").clone()
    }

    /// Lists again (after an approval was written to the lock).
    pub fn request_relist(&self) {
        self.relist.notify_one();
    }

    /// Calls a tool of this upstream.
    ///
    /// A server of the 2026-07-28 era may answer with an `input_required` result: its questions
    /// are relayed to the client that made the call (as requests in the sessionful era, as the
    /// downstream call's own `input_required` result in the 2026-07-28 era) and the call is sent
    /// again with the answers and the server's `requestState`, at most
    /// [`UPSTREAM_INPUT_ROUNDS_MAX`] times. The hard limit covers every round; the idle timeout
    /// covers the server's work, not the time a person takes to answer.
    ///
    /// The client the call's progress and questions go to is the [`CallRoute`] the host
    /// attached to the call (none for ring0's own calls). The observation's payload
    /// (`structured`) is the shaped result object, which is what the client receives.
    pub async fn call(
        &self,
        tool: &str,
        args: Value,
        ctx: &CallContext,
        output_schema: Option<&Validator>,
        forward_config: &ForwardConfig,
    ) -> Result<Observation, ToolError> {
        let alias = &self.config.alias;
        let entry = CallRoute::of(&ctx.extensions);
        let live = self.live.read().expect("live").clone();
        let Some(live) = live.filter(|l| !l.peer.is_closed()) else {
            return Err(ToolError::not_applied(format!(
                "upstream {alias:?} is not connected (it is restarting); nothing was sent, call again shortly"
            )));
        };
        let peer = live.peer.clone();
        let token = format!("ring0-{}", self.next_token.fetch_add(1, Ordering::Relaxed));
        let idle = Arc::new(Notify::new());
        self.progress.lock().expect("progress").insert(
            token.clone(),
            ProgressRoute {
                idle: idle.clone(),
                entry: entry.clone(),
            },
        );
        let _route = ProgressGuard {
            up: self,
            token: token.clone(),
        };
        let mut meta = serde_json::Map::new();
        meta.insert("progressToken".into(), Value::String(token));
        if let Some(key) = &ctx.idempotency_key {
            meta.insert(
                "io.ring0/idempotency-key".into(),
                Value::String(key.clone()),
            );
        }
        // The upstream's spans join the call's trace, under the attempt that sent it.
        crate::trace::upstream_meta(&mut meta);
        let mut params = json!({"name": tool, "arguments": args, "_meta": meta});
        let hard = tokio::time::sleep(self.config.max_timeout());
        tokio::pin!(hard);
        let mut rounds = 0;
        let raw = loop {
            let raw = self
                .call_once(
                    &peer,
                    params.clone(),
                    &entry,
                    &idle,
                    hard.as_mut(),
                    ctx,
                    rounds > 0,
                )
                .await?;
            if raw.get("resultType").and_then(Value::as_str) != Some("input_required") {
                break raw;
            }
            rounds += 1;
            if rounds > UPSTREAM_INPUT_ROUNDS_MAX {
                return Err(ToolError::unknown(format!(
                    "upstream {alias:?} still asked for input after {UPSTREAM_INPUT_ROUNDS_MAX} rounds; ring0 stopped the call and its outcome is unknown"
                )));
            }
            let answers = tokio::select! {
                a = self.answer_input(&raw, entry.as_ref()) => a?,
                _ = &mut hard => {
                    return Err(ToolError::unknown(format!(
                        "upstream {alias:?} did not finish within {} ms (hard limit) while its question waited for the client; its outcome is unknown",
                        self.config.max_timeout().as_millis()
                    )));
                }
                _ = ctx.cancel.cancelled() => {
                    return Err(ToolError::unknown(format!(
                        "the call was cancelled while upstream {alias:?} waited for the client's answer; its outcome is unknown"
                    )));
                }
            };
            params["inputResponses"] = answers;
            match raw.get("requestState") {
                Some(state) if !state.is_null() => params["requestState"] = state.clone(),
                _ => {
                    if let Some(p) = params.as_object_mut() {
                        p.remove("requestState");
                    }
                }
            }
        };
        Ok(forward(
            &raw,
            output_schema,
            &forward_config.for_owner(&ctx.scope),
        ))
    }

    /// Sends one `tools/call` request and waits for its result within the call's timeouts.
    /// `retry`: the request repeats an earlier one with the client's answers (its refusal is
    /// then no proof that nothing ran).
    #[allow(clippy::too_many_arguments)]
    async fn call_once(
        &self,
        peer: &Arc<RpcPeer>,
        params: Value,
        entry: &Option<Arc<CallRoute>>,
        idle: &Notify,
        mut hard: std::pin::Pin<&mut tokio::time::Sleep>,
        ctx: &CallContext,
        retry: bool,
    ) -> Result<Value, ToolError> {
        let alias = &self.config.alias;
        let flight = match peer.start_with("tools/call", Some(params), |id| {
            if let Some(e) = entry {
                self.in_flight
                    .lock()
                    .expect("in flight")
                    .push((id, e.clone()));
            }
        }) {
            Ok(f) => f,
            Err(e) => {
                if let Some(ours) = entry {
                    self.in_flight
                        .lock()
                        .expect("in flight")
                        .retain(|(_, e)| !Arc::ptr_eq(e, ours));
                }
                let message = format!("upstream {alias:?}: {e}");
                return Err(if retry {
                    ToolError::unknown(message)
                } else {
                    ToolError::not_applied(message)
                });
            }
        };
        let mut guard = CallGuard {
            up: self,
            peer: peer.clone(),
            id: flight.id,
            done: false,
        };
        let idle_timeout = self.config.idle_timeout();
        let mut result = flight.result;
        let outcome = loop {
            tokio::select! {
                r = &mut result => {
                    guard.done = true;
                    break r.unwrap_or_else(|_| Err(RpcError::Lost("the connection closed".into())));
                }
                _ = idle.notified() => continue,
                _ = tokio::time::sleep(idle_timeout) => {
                    return Err(ToolError::unknown(format!(
                        "upstream {alias:?} reported no progress for {} ms (idle timeout); the call was cancelled upstream and its outcome is unknown",
                        idle_timeout.as_millis()
                    )));
                }
                _ = &mut hard => {
                    return Err(ToolError::unknown(format!(
                        "upstream {alias:?} did not finish within {} ms (hard limit); the call was cancelled upstream and its outcome is unknown",
                        self.config.max_timeout().as_millis()
                    )));
                }
                _ = ctx.cancel.cancelled() => {
                    return Err(ToolError::unknown(format!(
                        "the call was cancelled; notifications/cancelled was sent to upstream {alias:?} and its outcome is unknown"
                    )));
                }
            }
        };
        drop(guard);
        outcome.map_err(|e| {
            if let RpcError::Remote {
                code: code::UNSUPPORTED_PROTOCOL_VERSION,
                ..
            } = &e
            {
                // The server no longer speaks what was negotiated: connect and negotiate again.
                peer.close(&format!(
                    "the server refused the protocol version: {}",
                    explain(&e)
                ));
            }
            let message = format!("upstream {alias:?}: {}", explain(&e));
            if e.definitely_not_applied() && !retry {
                ToolError::not_applied(message)
            } else {
                ToolError::unknown(message)
            }
        })
    }

    /// Relays an `input_required` result's questions to the client that made the call and
    /// collects its answers (`inputResponses`), asked together.
    async fn answer_input(
        &self,
        raw: &Value,
        entry: Option<&Arc<CallRoute>>,
    ) -> Result<Value, ToolError> {
        let alias = &self.config.alias;
        let requests = raw
            .get("inputRequests")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        if requests.is_empty() {
            return Err(ToolError::unknown(format!(
                "upstream {alias:?} answered input_required without any input request; its outcome is unknown"
            )));
        }
        let Some(down) = entry.and_then(|e| e.downstream.clone()) else {
            return Err(ToolError::unknown(format!(
                "upstream {alias:?} asked for input ({}) but no client is connected to answer; its outcome is unknown",
                requests.keys().cloned().collect::<Vec<_>>().join(", ")
            )));
        };
        let asks = requests.iter().map(|(key, request)| {
            let down = down.clone();
            async move {
                let method = request
                    .get("method")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                let reply = if method == "roots/list" {
                    Ok(json!({"roots": self.roots}))
                } else {
                    let params = request.get("params").map(crate::mediate::relayed);
                    down.request(&method, params).await
                };
                (key.clone(), method, reply)
            }
        });
        let mut answers = serde_json::Map::new();
        for (key, method, reply) in futures::future::join_all(asks).await {
            match reply {
                Ok(result) => {
                    answers.insert(key, result);
                }
                // A question the client could not answer is a cancelled elicitation; the server
                // decides what that means for its call.
                Err(_) if method == "elicitation/create" => {
                    answers.insert(key, json!({"action": "cancel"}));
                }
                Err(e) => {
                    return Err(ToolError::unknown(format!(
                        "upstream {alias:?} asked for input ({method}) and the client could not answer: {}; its outcome is unknown",
                        e.get("message")
                            .and_then(Value::as_str)
                            .unwrap_or("no answer")
                    )));
                }
            }
        }
        Ok(Value::Object(answers))
    }
}

/// The protocol version a handshake settled on.
fn protocol_of(init: &Value) -> String {
    init.get("protocolVersion")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

/// Removes a call's progress route when the call ends.
struct ProgressGuard<'a> {
    up: &'a Upstream,
    token: String,
}

impl Drop for ProgressGuard<'_> {
    fn drop(&mut self) {
        self.up
            .progress
            .lock()
            .expect("progress")
            .remove(&self.token);
    }
}

/// An upstream's error as a person should read it: the stateless era's refusals say what was
/// refused and why.
fn explain(e: &RpcError) -> String {
    match e {
        RpcError::Remote {
            code: code::HEADER_MISMATCH,
            message,
            ..
        } => format!(
            "the server refused the request because its MCP headers do not match its body (error {}: {message}); nothing was run",
            code::HEADER_MISMATCH
        ),
        RpcError::Remote {
            code: code::UNSUPPORTED_PROTOCOL_VERSION,
            message,
            data,
        } => {
            let supported = data
                .as_ref()
                .and_then(|d| d.get("supported").or_else(|| d.get("supportedVersions")))
                .map(|s| format!("; it supports {s}"))
                .unwrap_or_default();
            format!(
                "the server does not support the protocol version ring0 sent (error {}: {message}{supported}); ring0 reconnects and negotiates again",
                code::UNSUPPORTED_PROTOCOL_VERSION
            )
        }
        RpcError::Remote {
            code: code::MISSING_REQUIRED_CLIENT_CAPABILITY,
            message,
            ..
        } => format!(
            "the server requires a client capability ring0 did not declare (error {}: {message})",
            code::MISSING_REQUIRED_CLIENT_CAPABILITY
        ),
        other => other.to_string(),
    }
}

async fn supervise(this: Weak<Upstream>) {
    let mut backoff = RESTART_BACKOFF_INITIAL;
    let mut failures: u32 = 0;
    loop {
        let Some(up) = this.upgrade() else { return };
        let started = Instant::now();
        match up.connect_once().await {
            Ok(peer) => {
                loop {
                    tokio::select! {
                        _ = peer.closed().cancelled() => break,
                        _ = up.relist.notified() => {
                            let server = up.listing().map(|l| l.server.clone()).unwrap_or_default();
                            let protocol = up.listing().map(|l| l.protocol_version.clone()).unwrap_or_default();
                            if let Err(e) = up.list(&peer, server, protocol).await {
                                up.log.line(&format!("[{}] listing again failed: {e}", up.config.alias));
                            }
                        }
                    }
                }
                up.log.line(&format!(
                    "[{}] connection lost; restarting",
                    up.config.alias
                ));
            }
            Err(e) => up
                .log
                .line(&format!("[{}] start failed: {e}", up.config.alias)),
        }
        *up.live.write().expect("live") = None;
        if started.elapsed() >= RESTART_BACKOFF_RESET_AFTER {
            backoff = RESTART_BACKOFF_INITIAL;
            failures = 0;
        }
        failures += 1;
        if failures > RESTARTS_MAX {
            up.log.line(&format!(
                "[{}] gave up after {RESTARTS_MAX} failed starts in a row; its tools are withdrawn",
                up.config.alias
            ));
            *up.listing.write().expect("listing") = None;
            (up.on_change)();
            return;
        }
        drop(up);
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(RESTART_BACKOFF_MAX);
    }
}

/// Every page of a paginated listing (`tools/list`, `prompts/list`): the `key` arrays of at
/// most [`LIST_PAGES_MAX`] pages, refused whole past `items_max` items.
async fn list_pages(
    peer: &RpcPeer,
    method: &str,
    key: &str,
    items_max: usize,
) -> Result<Vec<Value>, String> {
    let mut items: Vec<Value> = Vec::new();
    let mut cursor: Option<Value> = None;
    for page_number in 1.. {
        if page_number > LIST_PAGES_MAX {
            return Err(format!(
                "{method} returned more than {LIST_PAGES_MAX} pages; the listing is refused"
            ));
        }
        let params = cursor.as_ref().map(|c| json!({"cursor": c}));
        let page = tokio::time::timeout(UPSTREAM_HANDSHAKE_TIMEOUT, peer.request(method, params))
            .await
            .map_err(|_| format!("{method} timed out"))?
            .map_err(|e| format!("{method} failed: {e}"))?;
        if let Some(listed) = page.get(key).and_then(Value::as_array) {
            items.extend(listed.iter().cloned());
        }
        if items.len() > items_max {
            return Err(format!(
                "the server lists more than {items_max} {key}; the listing is refused"
            ));
        }
        match page.get("nextCursor") {
            Some(c) if !c.is_null() => cursor = Some(c.clone()),
            _ => break,
        }
    }
    Ok(items)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routes(n: u64) -> Vec<(u64, Arc<CallRoute>)> {
        (1..=n)
            .map(|i| {
                let route = CallRoute::sessionful(None, Some(format!("code-{i}")), true);
                (i, Arc::new(route))
            })
            .collect()
    }

    #[test]
    fn a_server_message_naming_its_call_reaches_that_calls_client() {
        let flights = routes(3);
        let route = route_of(&flights, Some(2)).unwrap();
        assert_eq!(route.confirm.as_deref(), Some("code-2"));
        assert!(route_of(&flights, Some(9)).is_none());
    }

    #[test]
    fn an_unnamed_server_message_goes_to_the_only_call_and_never_guesses_among_several() {
        let one = routes(1);
        assert_eq!(
            route_of(&one, None).unwrap().confirm.as_deref(),
            Some("code-1")
        );
        // With two clients' calls in flight, neither is handed the other's question.
        assert!(route_of(&routes(2), None).is_none());
        assert!(route_of(&[], None).is_none());
    }

    fn remote(code: i64, message: &str, data: Option<Value>) -> RpcError {
        RpcError::Remote {
            code,
            message: message.into(),
            data,
        }
    }

    #[test]
    fn a_header_mismatch_says_the_headers_disagree_with_the_body_and_nothing_ran() {
        let e = remote(
            code::HEADER_MISMATCH,
            "Mcp-Name header `a` does not match",
            None,
        );
        let text = explain(&e);
        assert!(text.contains("headers do not match its body"), "{text}");
        assert!(text.contains("Mcp-Name header `a`"), "{text}");
        assert!(e.definitely_not_applied());
    }

    #[test]
    fn an_unsupported_version_names_what_the_server_supports() {
        let e = remote(
            code::UNSUPPORTED_PROTOCOL_VERSION,
            "Unsupported protocol version",
            Some(json!({"supported": ["2025-11-25"], "requested": "2026-07-28"})),
        );
        let text = explain(&e);
        assert!(
            text.contains("does not support the protocol version"),
            "{text}"
        );
        assert!(text.contains("2025-11-25"), "{text}");
        assert!(e.definitely_not_applied());
    }

    #[test]
    fn other_errors_read_as_before() {
        let e = remote(-32000, "boom", None);
        assert_eq!(explain(&e), e.to_string());
        assert!(!e.definitely_not_applied());
    }
}
