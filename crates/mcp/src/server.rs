//! The downstream MCP server: one [`GatewayServer`] per client session.
//!
//! `tools/list` shows the session's catalog: every tool of the current generation its grants
//! make visible, quarantined ones never, paginated by [`TOOLS_PAGE_SIZE`]. `tools/call` becomes
//! one kernel round (validation, authorization, journal, dispatch, settlement, shaping); the
//! client's cancellation cancels the round, its progress token receives the upstream's progress,
//! and requests the upstream makes while serving the call (elicitation, sampling, roots) are
//! relayed to this client. Calls to A3 tools the grants allow are held for a person's approval
//! (see [`crate::server::Approvals`]). When the catalog changes, sessions that keep a connection
//! get `notifications/tools/list_changed`.
//!
//! Per-call context — the client's relay, the confirmation code its request carried, whether it
//! can be asked, its era — travels with the call as a [`CallRoute`] in the round's extensions,
//! which the kernel hands to the tool and to authorization.
//!
//! Results: what the client receives is the kernel's projection of the call's receipt (see
//! [`crate::project`]): an upstream tool's shaped, otherwise unchanged result object; a built-in
//! tool's observation text (and structured content); a failure's outcome as text with
//! `isError: true`; a refusal's rejection envelope as text with `isError: true`. Every result
//! carries `_meta["io.ring0/receipt"]` with the intent id, journal state and disposition.

use crate::approval::{Approvals, CONFIRM_ARGUMENT, CONFIRM_META_KEY};
use crate::delivery::{Answer, Delivery};
use crate::gateway::{Gateway, Generation};
use crate::limits::{APPROVAL_WAIT_DEFAULT, CATALOG_TTL_MS, RELAY_FLUSH_WAIT, TOOLS_PAGE_SIZE};
use crate::lossless::{RawKind, RawStash, adapt_to_era};
use crate::route::{CallRoute, Downstream};
use crate::rpc::{code, error_object};
use crate::tasks::TaskTable;
use async_trait::async_trait;
use ring0_core::limits::CALL_ID_BYTES_MAX;
use ring0_core::receipt::CallOutcome;
use ring0_core::{Authority, ProposedArguments, ProposedCall, Round, ToolSpec};
use ring0_kernel::catalog::{CatalogMode, LoadedTools};
use ring0_kernel::{
    AuthAdmission, AuthDecision, AuthRequest, Authorizer, CallExtensions, RoundOptions, Session,
    SessionConfig, SessionInfo,
};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CompleteRequestParams, CompleteResult,
    CustomRequest, DiscoverResult, ErrorData, GetPromptRequestParams, GetPromptResponse,
    ListPromptsResult, ListResourceTemplatesResult, ListResourcesResult, ListToolsResult,
    PaginatedRequestParams, ReadResourceRequestParams, ReadResourceResponse, ServerConfig,
    ServerRequest, SubscribeRequestParams, UnsubscribeRequestParams,
};
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::{Peer, RoleServer, ServerHandler};
use serde_json::{Map, Value, json};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;
use tracing::Instrument;

/// `_meta` key of the receipt summary on every result.
pub const RECEIPT_META_KEY: &str = "io.ring0/receipt";

static SESSION_COUNTER: AtomicU64 = AtomicU64::new(1);

/// Per-session authorizer when the grants have no approval step of their own (a plain
/// `GrantTable`): the generation's gate, then approval over MCP for A3 calls.
struct SessionGate {
    inner: Arc<dyn Authorizer>,
    approvals: Arc<Approvals>,
}

#[async_trait]
impl Authorizer for SessionGate {
    async fn authorize(&self, request: &AuthRequest<'_>) -> AuthDecision {
        let decision = self.inner.authorize(request).await;
        let AuthDecision::Allow { rule } = decision else {
            return decision;
        };
        if request.spec.authority < Authority::A3 {
            return AuthDecision::Allow { rule };
        }
        let approval_id = format!("ap_{}", &uuid::Uuid::new_v4().simple().to_string()[..16]);
        let question = crate::approval::Question {
            call_id: request.call_id,
            tool: &request.spec.name,
            args: request.args,
            args_hash: request.args_hash,
            principal: &request.session.principal.id,
            session_id: &request.session.session_id,
            approval_id: &approval_id,
            remember: None,
            wait: APPROVAL_WAIT_DEFAULT,
        };
        let route = CallRoute::of(request.extensions);
        match self.approvals.ask(route.as_deref(), &question).await {
            crate::approval::Answer::Approved(how)
            | crate::approval::Answer::ApprovedForSession(how) => AuthDecision::Allow {
                rule: format!("{rule}+approval:{how}"),
            },
            crate::approval::Answer::Declined(reason) => AuthDecision::ApprovalDenied {
                rule: "approval:elicitation".into(),
                reason,
            },
            crate::approval::Answer::TimedOut => AuthDecision::ApprovalTimeout {
                rule: "approval:elicitation".into(),
            },
            crate::approval::Answer::NeedsCode(next) => AuthDecision::ApprovalRequired {
                rule: "approval:required".into(),
                reason: format!(
                    "tool {:?} is A3: a person must approve it",
                    request.spec.name
                ),
                next,
            },
            crate::approval::Answer::Failed(reason) => AuthDecision::Deny {
                rule: "approval:required".into(),
                reason,
            },
        }
    }

    /// An A3 call the grants allow is held: the person is asked in [`Authorizer::hold`], after
    /// the journal decided the call will run.
    async fn admit(&self, request: &AuthRequest<'_>) -> AuthAdmission {
        match self.inner.admit(request).await {
            AuthAdmission::Decided(AuthDecision::Allow { .. })
                if request.spec.authority >= Authority::A3 =>
            {
                AuthAdmission::Hold
            }
            other => other,
        }
    }

    async fn hold(&self, request: &AuthRequest<'_>) -> AuthDecision {
        self.authorize(request).await
    }

    fn visible(&self, session: &SessionInfo, spec: &ToolSpec) -> bool {
        self.inner.visible(session, spec)
    }

    fn record_decided(&self, request: &AuthRequest<'_>, decision: AuthDecision) -> AuthDecision {
        self.inner.record_decided(request, decision)
    }
}

/// Forwards progress and relays server requests to one downstream client: as requests in the
/// sessionful era, through the call's `input_required` results in the 2026-07-28 era (`asker`).
struct Relay {
    /// The downstream request the call reports to and its progress token: the request that
    /// made the call or, in the 2026-07-28 era, the latest retry that carried answers.
    target: Arc<Mutex<(Peer<RoleServer>, Option<Value>)>>,
    progress: mpsc::UnboundedSender<Relayed>,
    asker: Option<crate::input::Asker>,
    /// Whether the client declared elicitation: a client that did not is never sent an
    /// `elicitation/create`, whoever asks.
    elicitation: bool,
    /// Ends the request's response stream for a client that resumes it.
    cut: Option<crate::stream_cut::StreamCut>,
}

/// What the relay's sender is given, in order: a progress notification to send, or a request to
/// say when everything before it was sent.
enum Relayed {
    Progress(Value),
    Flush(tokio::sync::oneshot::Sender<()>),
}

impl Relay {
    fn new(
        peer: Peer<RoleServer>,
        token: Option<Value>,
        asker: Option<crate::input::Asker>,
        elicitation: bool,
        cut: Option<crate::stream_cut::StreamCut>,
    ) -> Arc<Self> {
        let target = Arc::new(Mutex::new((peer, token)));
        let (progress, mut rx) = mpsc::unbounded_channel::<Relayed>();
        let to = target.clone();
        tokio::spawn(async move {
            while let Some(relayed) = rx.recv().await {
                let mut p = match relayed {
                    Relayed::Progress(p) => p,
                    Relayed::Flush(done) => {
                        let _ = done.send(());
                        continue;
                    }
                };
                let (peer, token) = to.lock().expect("relay target").clone();
                let Some(token) = token else { continue };
                p["progressToken"] = token;
                if let Ok(param) = serde_json::from_value(p) {
                    let _ = peer.notify_progress(param).await;
                }
            }
        });
        Arc::new(Self {
            target,
            progress,
            asker,
            elicitation,
            cut,
        })
    }

    fn peer(&self) -> Peer<RoleServer> {
        self.target.lock().expect("relay target").0.clone()
    }

    /// Waits (at most [`RELAY_FLUSH_WAIT`]) until every progress notification relayed so far
    /// was sent: a call's response never overtakes its own progress.
    async fn flush(&self) {
        let (done, sent) = tokio::sync::oneshot::channel();
        if self.progress.send(Relayed::Flush(done)).is_ok() {
            let _ = tokio::time::timeout(RELAY_FLUSH_WAIT, sent).await;
        }
    }
}

impl crate::input::Retarget for Relay {
    fn retarget(&self, peer: Peer<RoleServer>, progress_token: Option<Value>) {
        *self.target.lock().expect("relay target") = (peer, progress_token);
    }
}

#[async_trait]
impl Downstream for Relay {
    fn progress(&self, progress: f64, total: Option<f64>, message: Option<String>) {
        let mut p = json!({"progress": progress});
        if let Some(t) = total {
            p["total"] = json!(t);
        }
        if let Some(m) = message {
            p["message"] = json!(m);
        }
        let _ = self.progress.send(Relayed::Progress(p));
    }

    fn poll_later(&self) {
        if let Some(cut) = &self.cut {
            cut.cut();
        }
    }

    fn log(&self, params: Value) {
        let peer = self.peer();
        if let Ok(param) = serde_json::from_value(params) {
            // The protocol's logging is deprecated for 2026-07-28; it is relayed for the
            // sessionful era, where clients show it.
            #[allow(deprecated)]
            tokio::spawn(async move {
                let _ = peer.notify_logging_message(param).await;
            });
        }
    }

    async fn request(&self, method: &str, params: Option<Value>) -> Result<Value, Value> {
        if method == "elicitation/create" && !self.elicitation {
            return Err(error_object(
                code::METHOD_NOT_FOUND,
                "the client did not declare elicitation: it cannot be asked",
            ));
        }
        if let Some(asker) = &self.asker {
            return asker.ask(method, params).await;
        }
        let request = ServerRequest::CustomRequest(CustomRequest::new(method, params));
        match self.peer().send_request(request).await {
            Ok(result) => serde_json::to_value(result)
                .map_err(|e| error_object(code::INTERNAL_ERROR, e.to_string())),
            Err(e) => Err(error_object(
                code::INTERNAL_ERROR,
                format!("the client did not answer {method}: {e}"),
            )),
        }
    }
}

/// One downstream MCP session over the gateway.
#[derive(Clone)]
pub struct GatewayServer {
    gw: Gateway,
    scope: String,
    approvals: Arc<Approvals>,
    listening: Arc<AtomicBool>,
    instructions: Option<String>,
    raw: Arc<RawStash>,
    tasks: Arc<TaskTable>,
    /// Who the session acts for: every kernel session it opens carries it to policy.
    principal: ring0_core::Principal,
    /// Tells the gateway's front end when the last handle of a sessionful session is gone.
    ending: Arc<SessionEnding>,
    /// The tools this session loaded in search mode: every kernel session it opens (one per
    /// call, across catalog generations) lists them. With a shared journal, a sessionful HTTP
    /// session's set is kept there under its session scope, so every replica serving the
    /// session lists the same tools.
    loaded: Arc<LoadedTools>,
}

/// The end of one downstream session: once its client completed the sessionful handshake
/// (`notifications/initialized`), dropping the session's last handle reports its scope to the
/// gateway's [`crate::gateway::SessionEnd`]. A stateless request, which is a session of its own,
/// never reports: what it started belongs to no session that could end.
struct SessionEnding {
    /// The scope whose background jobs end with the session: its own, or the one its
    /// `Mcp-Session-Id` names once a request carried it ([`http_session_scope`]).
    scope: Mutex<String>,
    sessionful: AtomicBool,
    hook: Option<crate::gateway::SessionEnd>,
}

impl SessionEnding {
    fn bind(&self, scope: &str) {
        let mut mine = self.scope.lock().unwrap_or_else(|p| p.into_inner());
        if *mine != scope {
            *mine = scope.to_string();
        }
    }
}

impl Drop for SessionEnding {
    fn drop(&mut self) {
        if self.sessionful.load(Ordering::Acquire)
            && let Some(hook) = &self.hook
        {
            let scope = self.scope.get_mut().unwrap_or_else(|p| p.into_inner());
            hook(std::mem::take(scope));
        }
    }
}

/// The scope of a sessionful HTTP session's calls, named by its `Mcp-Session-Id` (hashed: the
/// id is the session's handle), so that every replica serving the session, and the one that
/// restarted, gives them the same scope: the same repeat guard's keys, the same jobs.
pub(crate) fn http_session_scope(context: &RequestContext<RoleServer>) -> Option<String> {
    let parts = context.extensions.get::<http::request::Parts>()?;
    let id = parts.headers.get("mcp-session-id")?.as_bytes();
    Some(session_scope_of(id))
}

/// The scope of the sessionful HTTP session `id` (see [`http_session_scope`]).
pub(crate) fn session_scope_of(id: &[u8]) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(id);
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("mcp-session-{hex}")
}

impl GatewayServer {
    /// A session. `scope` is the user-intent scope of its semantic keys.
    pub fn new(gw: Gateway, approvals: Arc<Approvals>, scope: impl Into<String>) -> Self {
        let scope = scope.into();
        let ending = Arc::new(SessionEnding {
            scope: Mutex::new(scope.clone()),
            sessionful: AtomicBool::new(false),
            hook: gw.session_end(),
        });
        Self {
            ending,
            gw,
            scope,
            approvals,
            listening: Arc::new(AtomicBool::new(false)),
            raw: RawStash::new(),
            tasks: TaskTable::new(),
            principal: ring0_core::Principal::local(),
            loaded: LoadedTools::new(),
            instructions: Some(
                "Tools are mediated by ring0: arguments are validated against each tool's schema, \
                 calls are authorized by the session's grants and recorded in a journal, and output \
                 is bounded. A refused call says why and what to do next."
                    .into(),
            ),
        }
    }

    /// A session with a fresh scope per connection.
    pub fn new_session(gw: Gateway, approvals: Arc<Approvals>) -> Self {
        let n = SESSION_COUNTER.fetch_add(1, Ordering::Relaxed);
        Self::new(
            gw,
            approvals,
            format!("mcp-session-{n}-{}", uuid::Uuid::new_v4().simple()),
        )
    }

    /// A session whose end is not this handle's to report: with sessions shared by several
    /// replicas, one replica letting its copy go (idle, at its cap) does not end the session,
    /// which the front end ends when the client deletes it.
    pub fn ending_on_delete_only(mut self) -> Self {
        self.ending = Arc::new(SessionEnding {
            scope: Mutex::new(self.scope.clone()),
            sessionful: AtomicBool::new(false),
            hook: None,
        });
        self
    }

    /// The principal the session acts for (default `local`).
    pub fn with_principal(mut self, principal: ring0_core::Principal) -> Self {
        self.principal = principal;
        self
    }

    /// The principal the session acts for.
    pub fn principal(&self) -> &ring0_core::Principal {
        &self.principal
    }

    /// Shares `stash` for raw results (the HTTP endpoint's response layer reads the same one).
    pub fn with_raw_stash(mut self, stash: Arc<RawStash>) -> Self {
        self.raw = stash;
        self
    }

    /// Where this session's raw results wait for the response that carries them out.
    pub fn raw_stash(&self) -> &Arc<RawStash> {
        &self.raw
    }

    /// Shares `table` for tasks (the HTTP endpoint shares one among its sessions, since each
    /// stateless request gets a session of its own).
    pub fn with_task_table(mut self, table: Arc<TaskTable>) -> Self {
        self.tasks = table;
        self
    }

    pub(crate) fn task_table(&self) -> &Arc<TaskTable> {
        &self.tasks
    }

    pub(crate) fn scope(&self) -> &str {
        &self.scope
    }

    pub(crate) fn gateway(&self) -> &Gateway {
        &self.gw
    }

    /// A kernel session on `generation` for calls of `scope`. Every kernel session of one
    /// principal and scope shares the kernel's state of that scope (exact-repeat counts, rounds
    /// of conflicting and unsettled calls), so each call opens its own.
    fn open(
        &self,
        generation: &Generation,
        scope: &str,
        loaded: &Arc<LoadedTools>,
    ) -> Arc<Session> {
        let authorizer: Arc<dyn Authorizer> = if self.approvals.gates_a3() {
            Arc::new(SessionGate {
                inner: generation.gate.clone(),
                approvals: self.approvals.clone(),
            })
        } else {
            generation.gate.clone()
        };
        Arc::new(
            generation.kernel.open_session(
                SessionConfig::new(scope.to_string())
                    .principal(self.principal.clone())
                    // One id for every kernel session of this MCP session (overlapping calls,
                    // catalog generations): approvals and session limits are bound to it.
                    .session_id(self.scope.clone())
                    .authorizer(authorizer)
                    .loaded_tools(loaded.clone())
                    .projector(generation.projector.clone())
                    .max_concurrent_tools(self.gw.max_concurrent_tools()),
            ),
        )
    }

    /// The tools a request's kernel session lists as loaded: a sessionful session's (or stdio's)
    /// own set; for a stateless 2026-07-28 request, which has no session to keep one, the set
    /// of its kernel scope (the one its `_meta` names, else its principal's), kept by the
    /// gateway, so a `load_tools` in one request is listed by the next of the same scope.
    /// With a shared journal both are kept there: a sessionful session's under the scope its
    /// `Mcp-Session-Id` names ([`http_session_scope`]), the same on every replica.
    fn loaded_for(&self, scope: &str, context: &RequestContext<RoleServer>) -> Arc<LoadedTools> {
        if is_stateless_http(context) {
            return self.gw.loaded_tools(&self.principal, scope);
        }
        if !self.loaded.is_shared()
            && let Some(state) = self.gw.journal().shared_state()
            && let Some(session) = http_session_scope(context)
        {
            self.loaded.share(state, &self.principal.id, &session);
        }
        self.loaded.clone()
    }

    /// The upstreams this session's grants open: those with a tool in its catalog that is not
    /// quarantined. Only these are asked for prompts, resources, completions and log levels on
    /// its behalf.
    fn reachable(&self) -> Vec<Arc<crate::upstream::Upstream>> {
        let generation = self.gw.generation();
        let session = self.open(&generation, &self.scope, &self.loaded);
        let aliases: std::collections::BTreeSet<&str> = session
            .catalog()
            .iter()
            .filter(|spec| !generation.quarantined.contains_key(&spec.name))
            .filter_map(|spec| generation.tools.get(&spec.name)?.upstream.as_deref())
            .collect();
        self.gw
            .upstreams()
            .into_iter()
            .filter(|up| aliases.contains(up.alias()))
            .collect()
    }

    async fn list(
        &self,
        cursor: Option<&str>,
        context: &RequestContext<RoleServer>,
    ) -> Result<Value, ErrorData> {
        let generation = self.gw.generation();
        let metas: Vec<Map<String, Value>> = serde_json::to_value(&context.meta)
            .ok()
            .and_then(|m| match m {
                Value::Object(m) => Some(m),
                _ => None,
            })
            .into_iter()
            .collect();
        let scope = self.scope_of(&read_identity(&metas)?, context);
        let loaded = self.loaded_for(&scope, context);
        if generation.kernel.catalog().mode() == CatalogMode::Search
            && let Err(e) = loaded.refresh().await
        {
            self.gw.log_line(&format!(
                "listing only the pinned core and the meta-tools for principal {}: {e}",
                self.principal.id
            ));
        }
        let session = self.open(&generation, &scope, &loaded);
        // The session's listing: in search mode its pinned core, the meta-tools and what it
        // loaded, in a stable order; otherwise every tool it may see.
        let names: Vec<String> = session
            .listing()
            .iter()
            .map(|s| s.name.clone())
            .filter(|n| !generation.quarantined.contains_key(n))
            .collect();
        let offset = match cursor {
            None => 0,
            Some(c) => {
                let parsed = c
                    .split_once(':')
                    .and_then(|(g, o)| Some((g.parse::<u64>().ok()?, o.parse::<usize>().ok()?)));
                match parsed {
                    Some((g, o)) if g == generation.number && o <= names.len() => o,
                    Some(_) => {
                        return Err(ErrorData::invalid_params(
                            "the tool catalog changed since this cursor was issued; list again from the start",
                            None,
                        ));
                    }
                    None => return Err(ErrorData::invalid_params("invalid cursor", None)),
                }
            }
        };
        let end = (offset + TOOLS_PAGE_SIZE).min(names.len());
        let tools: Vec<Value> = names[offset..end]
            .iter()
            .filter_map(|n| generation.tools.get(n).map(|t| t.definition.clone()))
            .collect();
        let mut out = json!({"tools": tools});
        if end < names.len() {
            out["nextCursor"] = json!(format!("{}:{end}", generation.number));
        }
        Ok(out)
    }

    /// A `tools/call` answered the ordinary way: the result (a typed stand-in for the raw
    /// JSON, see [`crate::lossless`]) or the question an approval needs.
    pub(crate) async fn answer_call(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let modern = is_modern(&context);
        let answer = self.call(request, context).await?;
        self.respond(answer, modern)
    }

    /// The response that carries a call's result (or its question) to a client of the era
    /// `modern` says.
    pub(crate) fn respond(
        &self,
        answer: Answer,
        modern: bool,
    ) -> Result<CallToolResponse, ErrorData> {
        let Answer { value, delivery } = answer;
        if value.get("resultType").and_then(Value::as_str) == Some("input_required") {
            let input: rmcp::model::InputRequiredResult = serde_json::from_value(value)
                .map_err(|e| ErrorData::internal_error(format!("input required: {e}"), None))?;
            return Ok(CallToolResponse::InputRequired(input));
        }
        // The typed stand-in: replaced by the raw result on the way out (see crate::lossless);
        // where rmcp's model cannot hold the result, it says so in text.
        let raw = adapt_to_era(value.clone(), RawKind::CallTool, modern);
        let fallback = match typed::<CallToolResult>(value.clone()) {
            Ok(_) => value,
            Err(e) => {
                let text = format!("ring0: the result could not be represented ({e}): {value}");
                json!({"content": [{"type": "text", "text": text}], "isError": true})
            }
        };
        let result: CallToolResult = typed(self.raw.stand_in_delivering(raw, fallback, delivery))?;
        Ok(CallToolResponse::Complete(result))
    }

    /// One `tools/call`: its result as the kernel projected it, or the question it waits on.
    pub(crate) async fn call(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<Answer, ErrorData> {
        let modern = context
            .protocol_version()
            .is_some_and(|v| v.as_str() >= "2026-07-28");
        if !modern {
            let cancel = context.ct.clone();
            return self.run_call(request, context, None, cancel).await;
        }
        // 2026-07-28: the call runs in the background so that a question can go back to the
        // client as an `input_required` result while the call waits for the answer.
        // A parked call is resumed only by a retry of the same principal (the HTTP gate
        // authenticated it) or, over stdio, of the same session.
        let principal = match context.extensions.get::<http::request::Parts>() {
            Some(_) => format!("http:{}", self.principal.id),
            None => self.scope.clone(),
        };
        let binding = crate::input::binding(&request.name, request.arguments.as_ref(), &principal);
        let parked = self.gw.parked().clone();
        let token = context
            .meta
            .get_progress_token()
            .and_then(|t| serde_json::to_value(t).ok());
        if let Some(state) = request.request_state.as_deref() {
            let responses = request.input_responses.clone().unwrap_or_default();
            let pending = parked.resume(state, &binding, &responses)?;
            // Progress from now on goes to this retry's stream.
            pending.retarget(context.peer.clone(), token);
            return pending.step(&parked, &context.ct).await.into_result();
        }
        let (asker, questions) = crate::input::channel();
        let elicitation = declares_elicitation(&context);
        let relay = Relay::new(context.peer.clone(), token, Some(asker), elicitation, None);
        let first_ct = context.ct.clone();
        let cancel = tokio_util::sync::CancellationToken::new();
        let this = self.clone();
        let round_cancel = cancel.clone();
        let round_relay = relay.clone();
        let done = tokio::spawn(async move {
            this.run_call(request, context, Some(round_relay), round_cancel)
                .await
        });
        let pending = crate::input::Pending::start(binding, done, questions, cancel, relay);
        // The client closing this request's stream cancels the call (`first_ct`); once the call
        // is parked, a retry's own stream takes that role.
        pending.step(&parked, &first_ct).await.into_result()
    }

    /// One `tools/call` as one kernel round. `relay`: the call is of the 2026-07-28 era and
    /// asks its client through `input_required` results. `cancel` cancels the round.
    async fn run_call(
        &self,
        mut request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
        relay: Option<Arc<Relay>>,
        cancel: tokio_util::sync::CancellationToken,
    ) -> Result<Answer, ErrorData> {
        let generation = self.gw.generation();
        let call_id = call_id_of(&context.id);
        let metas = request_metas(&request, &context);
        let span = self.call_span(&request, &context, &metas);
        let confirm = take_confirmation(&mut request, &metas);
        let identity = read_identity(&metas)?;
        let scope = self.scope_of(&identity, &context);
        let modern = relay.is_some();
        let (route, relay, cut) = call_route(&context, relay, confirm);
        let session = self.open(&generation, &scope, &self.loaded_for(&scope, &context));
        let round = proposed_round(call_id, request, &identity);
        let options = round_options(route, &context);
        let outcome = run_round_cancellable(&session, round, &options, &cancel, &context, modern)
            .instrument(span.clone())
            .await;
        if let Some(receipt) = outcome.receipts.first() {
            crate::trace::record_receipt(&span, receipt);
        }
        relay.flush().await;
        // A stream that was let close mid-call gets the response once its client resumed it.
        if let Some(cut) = &cut {
            cut.wait_for_resume().await;
        }
        answer_of(&outcome)
    }

    /// The span of one `tools/call`, continuing the trace the request names (its `_meta`,
    /// else its HTTP headers), if any.
    fn call_span(
        &self,
        request: &CallToolRequestParams,
        context: &RequestContext<RoleServer>,
        metas: &[Map<String, Value>],
    ) -> tracing::Span {
        let parts = context.extensions.get::<http::request::Parts>();
        let request_id = context.id.to_string();
        let session_id = parts
            .and_then(|p| p.headers.get("mcp-session-id"))
            .and_then(|v| v.to_str().ok());
        let protocol_version = context.protocol_version();
        let span = crate::trace::call_span(&crate::trace::CallSpanInput {
            tool: &request.name,
            request_id: &request_id,
            session_id,
            protocol_version: protocol_version.as_ref().map(|v| v.as_str()),
            principal: &self.principal.id,
            transport: if parts.is_some() { "tcp" } else { "pipe" },
        });
        if span.is_disabled() {
            return span;
        }
        if let Some(parent) =
            crate::trace::TraceParent::of_request(metas, parts.map(|p| &p.headers))
        {
            crate::trace::adopt(&span, &parent);
        }
        span
    }

    /// The kernel scope a `tools/call` runs in (see [`GatewayServer::scope_of`]).
    pub(crate) fn call_scope(
        &self,
        request: &CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<String, ErrorData> {
        let identity = read_identity(&request_metas(request, context))?;
        Ok(self.scope_of(&identity, context))
    }

    /// The kernel scope of a call: the scope the client named, bound to its principal; else the
    /// principal's for a stateless 2026-07-28 request over HTTP (which has no session); else
    /// this session's (the MCP session, or stdio's `--scope`).
    fn scope_of(
        &self,
        identity: &crate::retry::CallIdentity,
        context: &RequestContext<RoleServer>,
    ) -> String {
        if let Some(named) = &identity.scope {
            return crate::retry::client_scope(&self.principal, named);
        }
        if is_stateless_http(context) {
            return crate::retry::principal_scope(&self.principal);
        }
        if let Some(scope) = http_session_scope(context) {
            self.ending.bind(&scope);
            return scope;
        }
        self.scope.clone()
    }
}

/// The confirmation code a call carries. A code the person read to the model comes back as an
/// ordinary argument; it is taken out before the call is prepared: never validated, hashed or
/// forwarded. Otherwise the code in `_meta`, if any.
fn take_confirmation(
    request: &mut CallToolRequestParams,
    metas: &[Map<String, Value>],
) -> Option<String> {
    let spoken = request
        .arguments
        .as_mut()
        .and_then(|a| a.remove(CONFIRM_ARGUMENT))
        .map(|v| match v {
            Value::String(s) => s,
            other => other.to_string(),
        });
    let meta_code = metas.iter().find_map(|m| {
        m.get(CONFIRM_META_KEY)
            .and_then(Value::as_str)
            .map(str::to_string)
    });
    spoken.or(meta_code)
}

/// The call's per-call context for the kernel: its relay to the client (the era's own, or one
/// made for this request with its progress token), the confirmation code, whether the client
/// can be asked, its era. With it, the stream cut of a sessionful request whose stream may
/// close mid-call.
fn call_route(
    context: &RequestContext<RoleServer>,
    relay: Option<Arc<Relay>>,
    confirm: Option<String>,
) -> (CallRoute, Arc<Relay>, Option<crate::stream_cut::StreamCut>) {
    let token = context
        .meta
        .get_progress_token()
        .and_then(|t| serde_json::to_value(t).ok());
    let elicitation = declares_elicitation(context);
    let modern = relay.is_some();
    let cut = context
        .extensions
        .get::<http::request::Parts>()
        .and_then(crate::stream_cut::StreamCut::of)
        .filter(|_| relay.is_none());
    let relay = relay
        .unwrap_or_else(|| Relay::new(context.peer.clone(), token, None, elicitation, cut.clone()));
    let route = if modern {
        CallRoute::modern(Some(relay.clone()), confirm, elicitation)
    } else {
        CallRoute::sessionful(Some(relay.clone()), confirm, elicitation)
    };
    (route, relay, cut)
}

/// The one-call round a `tools/call` proposes.
fn proposed_round(
    call_id: String,
    request: CallToolRequestParams,
    identity: &crate::retry::CallIdentity,
) -> Round {
    Round {
        calls: vec![ProposedCall {
            index: 0,
            call_id,
            tool: request.name.to_string(),
            arguments: ProposedArguments::Value(
                request
                    .arguments
                    .map(Value::Object)
                    .unwrap_or_else(|| Value::Object(Map::new())),
            ),
            idempotency_key: identity.idempotency_key.clone(),
        }],
        text: None,
    }
}

/// The round's options: the call's route in its extensions, and whether cancelling it stops a
/// dispatched upstream call.
fn round_options(route: CallRoute, context: &RequestContext<RoleServer>) -> RoundOptions {
    RoundOptions {
        extensions: CallExtensions::new().with(route),
        // A cancelled task is an explicit stop: its upstream call is cancelled upstream.
        stop_dispatched_on_cancel: context
            .extensions
            .get::<crate::tasks::StopOnCancel>()
            .is_some(),
        ..RoundOptions::default()
    }
}

/// Runs the round; `cancel`, or in the sessionful era the client's cancellation of the
/// request, cancels the session and the round is awaited to its end.
async fn run_round_cancellable(
    session: &Session,
    round: Round,
    options: &RoundOptions,
    cancel: &tokio_util::sync::CancellationToken,
    context: &RequestContext<RoleServer>,
    modern: bool,
) -> ring0_kernel::RoundOutcome {
    let run = session.run_round(round, options);
    tokio::pin!(run);
    tokio::select! {
        o = &mut run => o,
        _ = cancel.cancelled() => {
            session.cancel();
            run.await
        }
        // In the 2026-07-28 era the round outlives the request that started it; `cancel`
        // carries the client's cancellation instead.
        _ = context.ct.cancelled(), if !modern => {
            session.cancel();
            run.await
        }
    }
}

/// What the client receives for a round. An unknown tool is a protocol error (-32602), as the
/// protocol specifies; every other refusal is a result the model can correct itself from.
fn answer_of(outcome: &ring0_kernel::RoundOutcome) -> Result<Answer, ErrorData> {
    if let Some(CallOutcome::Rejected { rejection }) = outcome.receipts.first().map(|r| &r.outcome)
        && rejection.status == ring0_core::RejectionKind::UnknownTool
    {
        return Err(ErrorData::invalid_params(
            rejection.message.clone(),
            Some(rejection.to_json()),
        ));
    }
    Ok(Answer {
        value: render(outcome),
        delivery: delivery_of(outcome),
    })
}

/// A request's `_meta` objects: rmcp moves a request's `_meta` into the context, so both places
/// are read.
fn request_metas(
    request: &CallToolRequestParams,
    context: &RequestContext<RoleServer>,
) -> Vec<Map<String, Value>> {
    [
        serde_json::to_value(&context.meta).ok(),
        request
            .meta
            .as_ref()
            .and_then(|m| serde_json::to_value(m).ok()),
    ]
    .into_iter()
    .flatten()
    .filter_map(|m| match m {
        Value::Object(m) => Some(m),
        _ => None,
    })
    .collect()
}

/// The identity fields of a call, or the invalid-params error that names the bad one.
fn read_identity(metas: &[Map<String, Value>]) -> Result<crate::retry::CallIdentity, ErrorData> {
    crate::retry::read(&metas.iter().collect::<Vec<_>>())
        .map_err(|e| ErrorData::invalid_params(e.message, Some(e.data)))
}

/// Whether a request came over HTTP without a session (the stateless 2026-07-28 era).
pub(crate) fn is_stateless_http(context: &RequestContext<RoleServer>) -> bool {
    context
        .extensions
        .get::<http::request::Parts>()
        .is_some_and(|parts| !parts.headers.contains_key("mcp-session-id"))
}

/// The delivery of a one-call round's result: reported once the response carrying it has left
/// ring0, so that an identical call after it runs again instead of being answered with it.
fn delivery_of(outcome: &ring0_kernel::RoundOutcome) -> Option<Delivery> {
    let ticket = outcome.delivery(0)?.clone();
    Some(Delivery::new(move || ticket.delivered()))
}

/// The call id of a `tools/call`: the client's request id (evidence that links the journal's
/// record to the client's request; two clients' ids may be equal, and nothing keys on it),
/// cut to the journal's bound.
fn call_id_of(request: &rmcp::model::RequestId) -> String {
    let id = format!("mcp-{request}");
    let end = id.floor_char_boundary(CALL_ID_BYTES_MAX);
    id[..end].to_string()
}

/// Decodes a result into rmcp's model, marking it complete: the 2026-07-28 era requires
/// `resultType`, and rmcp removes it again for peers of an older era.
fn typed<T: serde::de::DeserializeOwned>(mut v: Value) -> Result<T, ErrorData> {
    if let Some(obj) = v.as_object_mut() {
        obj.entry("resultType")
            .or_insert_with(|| Value::String("complete".into()));
    }
    serde_json::from_value(v).map_err(|e| {
        ErrorData::internal_error(
            format!("an upstream result ring0 cannot represent: {e}"),
            None,
        )
    })
}

/// The MCP result of a one-call round: the kernel's projection of its receipt (see
/// [`crate::project`]), with the receipt summary in `_meta`. A refusal and a failed projection
/// are the kernel's own envelopes, which the client is shown as text.
fn render(outcome: &ring0_kernel::RoundOutcome) -> Value {
    let (Some(receipt), Some(result)) = (outcome.receipts.first(), outcome.results.first()) else {
        return json!({"content": [{"type": "text", "text": "ring0: the call produced no receipt"}], "isError": true});
    };
    let summary = json!({
        "intent_id": receipt.intent_id,
        "state": receipt.state,
        "disposition": receipt.disposition,
    });
    let projected = !matches!(receipt.outcome, CallOutcome::Rejected { .. })
        && result.content.get("content").is_some_and(Value::is_array);
    let mut out = if projected {
        result.content.clone()
    } else {
        let text = serde_json::to_string(&result.content).unwrap_or_default();
        json!({"content": [{"type": "text", "text": text}], "isError": true})
    };
    if let Some(obj) = out.as_object_mut() {
        let meta = obj
            .entry("_meta")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Some(m) = meta.as_object_mut() {
            m.insert(RECEIPT_META_KEY.into(), summary);
        }
    }
    out
}

impl ServerHandler for GatewayServer {
    fn get_info(&self) -> ServerConfig {
        let mut info = json!({
            "protocolVersion": "2025-11-25",
            "capabilities": crate::passthrough::capabilities(&self.reachable()),
            "serverInfo": {"name": "ring0", "version": env!("CARGO_PKG_VERSION")},
        });
        if let Some(own) = &self.instructions {
            // The upstreams' instructions are pinned with their tools: an upstream is reachable
            // only with tools a person approved, and so are the instructions relayed.
            let upstreams: Vec<(String, String)> = self
                .reachable()
                .iter()
                .filter_map(|up| {
                    let text = up.listing()?.server.instructions.clone()?;
                    Some((up.alias().to_string(), text))
                })
                .collect();
            info["instructions"] = json!(crate::mediate::instructions(own, &upstreams));
        }
        // Background jobs and long upstream calls are offered as tasks (see crate::tasks).
        info["capabilities"]["extensions"][rmcp::model::TASKS_EXTENSION_ID] = json!({});
        serde_json::from_value(info).expect("a valid server config")
    }

    /// `server/discover` (2026-07-28): what `initialize` says, with the catalog's cache hint.
    async fn discover(
        &self,
        _context: RequestContext<RoleServer>,
    ) -> Result<DiscoverResult, ErrorData> {
        Ok(DiscoverResult::from_server_info(
            self.supported_protocol_versions().into_owned(),
            self.get_info(),
        )
        .with_ttl_ms(CATALOG_TTL_MS))
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let cursor = request.as_ref().and_then(|r| r.cursor.clone());
        let value = self.list(cursor.as_deref(), &context).await?;
        let raw = adapt_to_era(value.clone(), RawKind::ListTools, is_modern(&context));
        typed(self.raw.stand_in(raw, value))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if let Some(response) = crate::tasks::offer(self, &request, &context).await? {
            return Ok(response);
        }
        self.answer_call(request, context).await
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        typed(crate::passthrough::list_prompts(&self.reachable()).await?)
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        let args = request.arguments.map(Value::Object);
        let v = crate::passthrough::get_prompt(&self.reachable(), &request.name, args).await?;
        Ok(GetPromptResponse::Complete(typed(v)?))
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        typed(
            crate::passthrough::list_resources(&self.reachable(), "resources/list", "resources")
                .await?,
        )
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        typed(
            crate::passthrough::list_resources(
                &self.reachable(),
                "resources/templates/list",
                "resourceTemplates",
            )
            .await?,
        )
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        // The scope this client's next `tools/call` (a `read_spill`) runs in owns the spill.
        let owner = self.scope_of(&crate::retry::CallIdentity::default(), &context);
        let can_page = {
            let generation = self.gw.generation();
            let session = self.open(&generation, &owner, &self.loaded);
            session
                .catalog()
                .iter()
                .any(|spec| spec.name == ring0_kernel::SPILL_READER_TOOL)
        };
        let reader = crate::passthrough::SpillReader {
            owner: &owner,
            can_page,
        };
        let v = crate::passthrough::resource_request(
            &self.reachable(),
            "resources/read",
            &request.uri,
            reader,
        )
        .await?;
        Ok(ReadResourceResponse::Complete(typed(v)?))
    }

    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let reader = crate::passthrough::SpillReader {
            owner: self.scope(),
            can_page: false,
        };
        crate::passthrough::resource_request(
            &self.reachable(),
            "resources/subscribe",
            &request.uri,
            reader,
        )
        .await
        .map(|_| ())
    }

    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let reader = crate::passthrough::SpillReader {
            owner: self.scope(),
            can_page: false,
        };
        crate::passthrough::resource_request(
            &self.reachable(),
            "resources/unsubscribe",
            &request.uri,
            reader,
        )
        .await
        .map(|_| ())
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, ErrorData> {
        let params = serde_json::to_value(&request)
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        typed(crate::passthrough::complete(&self.reachable(), params).await?)
    }

    #[allow(deprecated)]
    async fn set_level(
        &self,
        request: rmcp::model::SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let level = serde_json::to_value(request.level)
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        crate::passthrough::set_level(&self.reachable(), level).await
    }

    async fn get_task(
        &self,
        request: rmcp::model::GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::GetTaskResult, ErrorData> {
        crate::tasks::get(self, request, &context).await
    }

    async fn cancel_task(
        &self,
        request: rmcp::model::CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        crate::tasks::cancel(self, request, &context).await
    }

    async fn update_task(
        &self,
        _request: rmcp::model::UpdateTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        Err(ErrorData::invalid_params(
            "ring0's tasks never ask for input: answer approvals when the call is made",
            None,
        ))
    }

    /// A 2026-07-28 client's `subscriptions/listen` stream: the tool catalog's changes only.
    /// Prompts and resources are relayed from the upstreams without change tracking of their own.
    fn accepted_subscription_filter(
        &self,
        _requested: &rmcp::model::SubscriptionFilter,
    ) -> Option<rmcp::model::SubscriptionFilter> {
        Some(
            rmcp::model::SubscriptionFilter::builder()
                .tools_list_changed()
                .build(),
        )
    }

    async fn listen(&self, context: rmcp::service::SubscriptionContext) -> Result<(), ErrorData> {
        if context.accepted().tools_list_changed != Some(true) {
            context.cancelled().await;
            return Ok(());
        }
        let mut changes = self.gw.subscribe();
        let mut loads = self.loaded.subscribe();
        loop {
            tokio::select! {
                _ = context.cancelled() => return Ok(()),
                // A `load_tools` call of this session changed its listing.
                Ok(()) = loads.changed() => {
                    if context.sink().notify_tool_list_changed().await.is_err() {
                        return Ok(());
                    }
                }
                change = changes.recv() => match change {
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        if context.sink().notify_tool_list_changed().await.is_err() {
                            return Ok(());
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return Ok(()),
                },
            }
        }
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        self.ending.sessionful.store(true, Ordering::Release);
        if self.listening.swap(true, Ordering::AcqRel) {
            return;
        }
        let mut changes = self.gw.subscribe();
        let mut loads = self.loaded.subscribe();
        let peer = context.peer.clone();
        tokio::spawn(async move {
            // A closed session ends this task even when the catalog never changes again: it
            // holds the session's peer, which must be released with the session.
            let mut check = tokio::time::interval(crate::limits::SESSION_SWEEP_INTERVAL);
            loop {
                let change = tokio::select! {
                    change = changes.recv() => change,
                    // A `load_tools` call of this session changed its listing.
                    Ok(()) = loads.changed() => Ok(0),
                    _ = check.tick() => {
                        if peer.is_transport_closed() {
                            return;
                        }
                        continue;
                    }
                };
                match change {
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        if peer.notify_tool_list_changed().await.is_err() {
                            return;
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
            }
        });
    }
}

/// Whether the client declared elicitation: in its capabilities (per request in the 2026-07-28
/// era, where a question travels in an `input_required` result). Only a declared channel is used.
fn declares_elicitation(context: &RequestContext<RoleServer>) -> bool {
    context
        .client_capabilities()
        .is_some_and(|c| c.elicitation.is_some())
}

/// Whether a request is answered in the 2026-07-28 era (or later).
fn is_modern(context: &RequestContext<RoleServer>) -> bool {
    context
        .protocol_version()
        .is_some_and(|v| v.as_str() >= "2026-07-28")
}

/// Serves one session over stdin/stdout until the client disconnects.
pub async fn serve_stdio(server: GatewayServer) -> Result<(), String> {
    use rmcp::ServiceExt;
    // Non-blocking pipes on the IO reactor when the client launched ring0 with pipes (as MCP
    // clients do): tokio's own stdin/stdout hand every read and write to the blocking pool, a
    // thread hop per message each way.
    // Every line passes the door first: a line rmcp's codec would skip is answered; each
    // result's delivery is reported once its line is written and flushed.
    let (stdin, stdout) = rmcp::transport::stdio_pipes();
    let stash = server.raw_stash().clone();
    let running = server
        .serve(crate::door::stdio::DoorStdio::new(stdin, stdout, stash))
        .await
        .map_err(|e| format!("MCP session over stdio: {e}"))?;
    running
        .waiting()
        .await
        .map_err(|e| format!("MCP session over stdio: {e}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring0_core::Observation;
    use ring0_core::format::ToolResult;
    use ring0_core::receipt::{Disposition, Receipt};

    fn outcome(receipt_text: &str, projection: Value) -> ring0_kernel::RoundOutcome {
        let observation = Observation {
            structured: Some(json!({"content": [{"type": "text", "text": receipt_text}]})),
            ..Observation::text(receipt_text)
        };
        ring0_kernel::RoundOutcome {
            receipts: vec![Receipt::new(
                "mcp-1",
                0,
                "up__tool",
                Disposition::Dispatched,
                CallOutcome::Completed { observation },
            )],
            deliveries: vec![None],
            results: vec![ToolResult {
                call_id: "mcp-1".into(),
                tool: "up__tool".into(),
                content: projection,
                is_error: false,
                free_form: false,
            }],
            terminated: None,
            policy_message: None,
            missing_required_call: false,
        }
    }

    #[test]
    fn the_client_receives_the_projection_not_the_receipt() {
        let projected =
            json!({"content": [{"type": "text", "text": "projected"}], "isError": false});
        let out = render(&outcome("from the receipt", projected));
        assert_eq!(out["content"][0]["text"], "projected");
        assert_eq!(out["_meta"][RECEIPT_META_KEY]["disposition"], "dispatched");
    }

    #[test]
    fn a_failed_projection_is_shown_as_an_error_and_never_replaced_by_the_receipt() {
        let receipted = outcome("from the receipt", Value::Null);
        let failed = ring0_kernel::project::projection_failed_result(&receipted.receipts[0]);
        let out = render(&outcome("from the receipt", failed));
        assert_eq!(out["isError"], true);
        let text = out["content"][0]["text"].as_str().unwrap();
        assert!(text.contains("projection_failed"), "{text}");
        assert!(!text.contains("from the receipt"), "{text}");
    }
}
