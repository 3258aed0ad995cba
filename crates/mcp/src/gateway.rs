//! The gateway: built-in tools and upstream tools over one kernel, one catalog.
//!
//! The kernel's registry is fixed when it is built, and upstream listings change (a restart, a
//! `list_changed`, an approval), so the gateway keeps a [`Generation`]: a kernel built from the
//! built-in tools and the current listing of every upstream, sharing the one journal. Each change
//! builds the next generation and tells every downstream session, which then lists anew and opens
//! its next kernel session on it.
//!
//! Quarantined tools are registered too, so that a call to one is recognized and refused during
//! authorization with the reason (its definition changed, it appeared after approval) instead of
//! being reported as unknown; they are never listed.

use crate::config::UpstreamConfig;
use crate::forward::ForwardConfig;
use crate::input::Parked;
use crate::log::Log;
use crate::pin::{PinBook, PinVerdict};
use crate::project::McpProjector;
use crate::upstream::Upstream;
use async_trait::async_trait;
use jsonschema::Validator;
use ring0_core::observation::Provenance;
use ring0_core::{Authority, Effect, Observation, Strategy, StrategySet, ToolSpec};
use ring0_journal::Journal;
use ring0_kernel::catalog::{CatalogConfig, CatalogMode, LOAD_TOOL, SEARCH_TOOL};
use ring0_kernel::{
    AuthAdmission, AuthDecision, AuthRequest, Authorizer, CallContext, Kernel, ProbeFinding,
    SessionInfo, Tool, ToolError,
};
use ring0_shape::SpillStore;
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::sync::broadcast;

/// How often the lock file is checked for approvals made by `ring0 approve-tool`.
pub const LOCK_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Extra time the kernel's hard timeout gives an upstream call beyond the upstream's own hard
/// limit, so that the upstream side expires first and says why.
const KERNEL_TIMEOUT_GRACE: Duration = Duration::from_secs(2);

/// What a gateway is built from.
pub struct GatewayOptions {
    /// The audit log, where what mediation did to each upstream's definitions and texts is
    /// recorded beside the policy's decisions (`None`: ring0's log only).
    pub audit: Option<Arc<dyn ring0_policy::AuditSink>>,
    /// Built-in tools with their specs.
    pub builtins: Vec<(ToolSpec, Arc<dyn Tool>)>,
    pub upstreams: Vec<UpstreamConfig>,
    pub journal: Arc<dyn Journal>,
    /// The grants: who may see and call what.
    pub authorizer: Arc<dyn Authorizer>,
    /// The workspace root (where `ring0.lock` lives).
    pub workspace: PathBuf,
    /// ring0's state directory (outside the workspace by default).
    pub state_dir: PathBuf,
    /// Where shaped-away output is kept.
    pub spill: Option<Arc<SpillStore>>,
    pub log: Log,
    /// Calls running at once in one round (per session).
    pub max_concurrent_tools: usize,
    /// The directories the workspace grants the tools (relative to `workspace` or absolute): no
    /// upstream's `roots` may reach beyond them.
    pub granted_roots: Vec<PathBuf>,
    /// ring0's own files (the config, the lock file, the state directory): no upstream's `roots`
    /// may contain one or lie inside one.
    pub protected_paths: Vec<PathBuf>,
    /// Told the scope of a sessionful client session when it ends (deleted by its client, or
    /// its transport gone): what the session started in the background ends with it.
    pub session_end: Option<SessionEnd>,
    /// The OS sandbox of each stdio upstream, by alias. An alias not named runs in the default
    /// profile over `workspace`, with `protected_paths` masked.
    pub upstream_sandboxes: BTreeMap<String, ring0_exec::Sandbox>,
    /// How sessions list the catalog (`[catalog]`): full, search or auto (see
    /// [`ring0_kernel::catalog`]). Each generation decides `auto` on its own catalog.
    pub catalog: CatalogConfig,
    /// Sees every event of every kernel generation's sessions (an operations host's metrics).
    pub observer: Option<Arc<dyn ring0_kernel::EventObserver>>,
}

/// What a front end does when a client session ends, given the session's scope.
pub type SessionEnd = Arc<dyn Fn(String) + Send + Sync>;

/// A tool as the downstream catalog shows it.
#[derive(Debug, Clone)]
pub struct ExposedTool {
    /// The MCP tool object sent in `tools/list`.
    pub definition: Value,
    /// The upstream alias, for upstream tools.
    pub upstream: Option<String>,
}

/// One build of the catalog.
pub struct Generation {
    pub number: u64,
    pub kernel: Kernel,
    pub tools: BTreeMap<String, ExposedTool>,
    pub quarantined: BTreeMap<String, String>,
    /// The generation's authorizer: quarantine, then the grants.
    pub gate: Arc<dyn Authorizer>,
    /// What a client receives of a call: every session of the generation projects with it.
    pub projector: Arc<McpProjector>,
}

struct Inner {
    builtins: Vec<(ToolSpec, Arc<dyn Tool>)>,
    catalog: CatalogConfig,
    upstreams: RwLock<Vec<Arc<Upstream>>>,
    journal: Arc<dyn Journal>,
    authorizer: Arc<dyn Authorizer>,
    pins: Arc<PinBook>,
    /// Calls of the 2026-07-28 era waiting for their clients' answers, shared by every
    /// downstream session (each stateless request is a session of its own).
    parked: Parked,
    spill: Option<Arc<SpillStore>>,
    observer: Option<Arc<dyn ring0_kernel::EventObserver>>,
    log: Log,
    generation: RwLock<Arc<Generation>>,
    counter: AtomicU64,
    changes: broadcast::Sender<u64>,
    max_concurrent_tools: usize,
    session_end: Option<SessionEnd>,
    /// What stateless 2026-07-28 requests loaded in search mode, by principal and scope: such
    /// a request is a session of its own, so the next one finds its scope's set here.
    loaded_sets: ring0_kernel::catalog::LoadedSets,
}

/// The catalog of built-in and upstream tools over one kernel.
#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

/// Refuses quarantined tools with their reason, then asks the grants.
struct QuarantineGate {
    inner: Arc<dyn Authorizer>,
    quarantined: Arc<BTreeMap<String, String>>,
}

impl QuarantineGate {
    fn refusal(&self, request: &AuthRequest<'_>) -> Option<AuthDecision> {
        let reason = self.quarantined.get(&request.spec.name)?;
        Some(AuthDecision::Deny {
            rule: "pin:quarantined".into(),
            reason: format!(
                "tool {:?} is quarantined: {reason}. A person must approve it with `ring0 approve-tool {}`",
                request.spec.name, request.spec.name
            ),
        })
    }
}

#[async_trait]
impl Authorizer for QuarantineGate {
    async fn authorize(&self, request: &AuthRequest<'_>) -> AuthDecision {
        match self.refusal(request) {
            Some(refused) => refused,
            None => self.inner.authorize(request).await,
        }
    }

    // Admission and the approval hold go to the grants' own, so that a person is asked only
    // after the journal decided the call will run.
    async fn admit(&self, request: &AuthRequest<'_>) -> AuthAdmission {
        match self.refusal(request) {
            Some(refused) => AuthAdmission::Decided(refused),
            None => self.inner.admit(request).await,
        }
    }

    async fn hold(&self, request: &AuthRequest<'_>) -> AuthDecision {
        match self.refusal(request) {
            Some(refused) => refused,
            None => self.inner.hold(request).await,
        }
    }

    // Recovery's re-check goes to the grants' own re-check, which asks nobody.
    async fn recheck(&self, request: &AuthRequest<'_>) -> AuthDecision {
        match self.refusal(request) {
            Some(refused) => refused,
            None => self.inner.recheck(request).await,
        }
    }

    // Visible to the kernel so that a call is refused with its reason rather than reported as
    // an unknown tool; the downstream listing leaves quarantined tools out itself.
    fn visible(&self, session: &SessionInfo, spec: &ToolSpec) -> bool {
        self.inner.visible(session, spec)
    }

    fn record_decided(&self, request: &AuthRequest<'_>, decision: AuthDecision) -> AuthDecision {
        self.inner.record_decided(request, decision)
    }
}

/// Runs a tool of an upstream.
struct UpstreamExecutor {
    upstream: Arc<Upstream>,
    tool: String,
    output_schema: Option<Arc<Validator>>,
    forward: ForwardConfig,
    /// The reconciliation probe: a nullipotent tool of the same upstream (config `probe`).
    probe: Option<String>,
    /// Bound on one probe or snapshot call, the tool's own timeout.
    timeout_ms: u64,
    log: Log,
}

/// The phase argument a probe tool receives before dispatch.
pub const PROBE_PHASE_SNAPSHOT: &str = "snapshot";
/// The phase argument a probe tool receives to settle an ambiguous outcome.
pub const PROBE_PHASE_PROBE: &str = "probe";

impl UpstreamExecutor {
    /// Calls the probe tool and returns the JSON object it answered (its `structuredContent`,
    /// or its text parsed as JSON), or why there is none.
    async fn ask_probe(&self, probe: &str, arguments: Value) -> Result<Value, String> {
        // The probe is held to the same pins as any tool: one the upstream no longer lists, or
        // whose definition changed since it was approved, is not asked.
        let listing = self.upstream.listing();
        match listing
            .as_ref()
            .and_then(|l| l.tools.iter().find(|t| t.name == probe))
        {
            None => return Err(format!("probe {probe:?} is not listed by the upstream")),
            Some(t) => {
                if let PinVerdict::Quarantined(why) = &t.verdict {
                    return Err(format!("probe {probe:?} is quarantined: {why}"));
                }
            }
        }
        let ctx = CallContext {
            call_id: format!("ring0-probe-{}", uuid::Uuid::new_v4().simple()),
            intent_id: None,
            idempotency_key: None,
            scope: Arc::from("ring0-probe"),
            session: Arc::new(ring0_kernel::SessionInfo::detached("ring0-probe")),
            cancel: tokio_util::sync::CancellationToken::new(),
            timeout_ms: self.timeout_ms,
            events: ring0_kernel::EventSink::detached(),
            // No client is behind a probe: its upstream's questions have no one to go to.
            extensions: Default::default(),
        };
        let run = self
            .upstream
            .call(probe, arguments, &ctx, None, &self.forward);
        let obs = match tokio::time::timeout(Duration::from_millis(self.timeout_ms), run).await {
            Err(_) => {
                return Err(format!(
                    "probe {probe:?} timed out after {} ms",
                    self.timeout_ms
                ));
            }
            Ok(Err(e)) => return Err(format!("probe {probe:?} failed: {}", e.message)),
            Ok(Ok(obs)) => obs,
        };
        if obs.is_error {
            return Err(format!("probe {probe:?} answered an error: {}", obs.text));
        }
        // The observation's payload is the probe's MCP result.
        let answer = match obs
            .structured
            .and_then(|r| r.get("structuredContent").cloned())
        {
            Some(v) => v,
            None => serde_json::from_str(obs.text.trim())
                .map_err(|_| format!("probe {probe:?} answered no JSON object"))?,
        };
        if !answer.is_object() {
            return Err(format!("probe {probe:?} answered no JSON object"));
        }
        Ok(answer)
    }
}

impl UpstreamExecutor {
    /// Asks the probe, waiting out a restart of its upstream: the call whose outcome it settles
    /// often failed because the upstream went away, and the supervisor is bringing it back just
    /// when the probe is due. While the upstream is not connected, the probe is asked again
    /// after a doubling pause (from `PROBE_RETRY_BACKOFF_START` up to
    /// `PROBE_RETRY_BACKOFF_MAX`) until it answers or `PROBE_RECONNECT_WAIT` has passed. An
    /// answer, or a failure of a connected upstream, is final at once.
    async fn ask_probe_until_reachable(
        &self,
        probe: &str,
        arguments: Value,
    ) -> Result<Value, String> {
        use crate::limits::{
            PROBE_RECONNECT_WAIT, PROBE_RETRY_BACKOFF_MAX, PROBE_RETRY_BACKOFF_START,
        };
        let deadline = tokio::time::Instant::now() + PROBE_RECONNECT_WAIT;
        let mut pause = PROBE_RETRY_BACKOFF_START;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if !self.upstream.is_connected() && !self.upstream.wait_connected(left).await {
                return Err(format!(
                    "upstream {} did not come back within {} ms to answer probe {probe:?}",
                    self.upstream.alias(),
                    PROBE_RECONNECT_WAIT.as_millis()
                ));
            }
            let why = match self.ask_probe(probe, arguments.clone()).await {
                Ok(answer) => return Ok(answer),
                Err(why) => why,
            };
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if self.upstream.is_connected() || left <= pause {
                return Err(why);
            }
            self.log.line(&format!(
                "[{}] probe {probe:?} for {} could not be asked ({why}); the upstream is \
                 restarting, asking again",
                self.upstream.alias(),
                self.tool
            ));
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(PROBE_RETRY_BACKOFF_MAX);
        }
    }
}

/// Reads a probe tool's verdict. Anything but the two recognized verdicts is inconclusive.
fn probe_verdict(answer: &Value) -> ProbeFinding {
    match answer.get("verdict").and_then(Value::as_str) {
        Some("applied") => {
            let mut text = "the reconciliation probe found the effect".to_string();
            if let Some(evidence) = answer.get("evidence") {
                text.push_str(&format!(": {evidence}"));
            }
            let mut obs = Observation::text(text);
            obs.structured = answer.get("evidence").cloned();
            ProbeFinding::Applied(Box::new(obs))
        }
        Some("unchanged") => ProbeFinding::Unchanged,
        _ => ProbeFinding::Indeterminate(format!(
            "the probe's answer is not a recognized verdict: {}",
            bounded_text(&answer.to_string(), 512)
        )),
    }
}

fn bounded_text(s: &str, max_bytes: usize) -> String {
    ring0_core::limits::clip_with_length(s, max_bytes).into_owned()
}

#[async_trait]
impl Tool for UpstreamExecutor {
    async fn call(&self, ctx: CallContext, args: Value) -> Result<Observation, ToolError> {
        self.upstream
            .call(
                &self.tool,
                args,
                &ctx,
                self.output_schema.as_deref(),
                &self.forward,
            )
            .await
    }

    /// The probe tool's `state` for these arguments. No snapshot (no probe, an error, no
    /// `state`) means a later "unchanged" verdict cannot be trusted: the journal dead-letters it.
    async fn snapshot(&self, args: &Value) -> Option<Value> {
        let probe = self.probe.as_deref()?;
        let arguments = json!({"phase": PROBE_PHASE_SNAPSHOT, "arguments": args});
        match self.ask_probe(probe, arguments).await {
            Ok(answer) => answer.get("state").cloned(),
            Err(why) => {
                // Not fatal to the call: without a snapshot an "unchanged" verdict is refused.
                self.log.line(&format!(
                    "[{}] no snapshot for {}: {why}",
                    self.upstream.alias(),
                    self.tool
                ));
                None
            }
        }
    }

    async fn probe(&self, args: &Value, snapshot: Option<&Value>) -> ProbeFinding {
        let Some(probe) = self.probe.as_deref() else {
            return ProbeFinding::Indeterminate(format!(
                "upstream tool {:?} declares no probe",
                self.tool
            ));
        };
        let arguments = json!({
            "phase": PROBE_PHASE_PROBE,
            "arguments": args,
            "snapshot": snapshot.cloned().unwrap_or(Value::Null),
        });
        match self.ask_probe_until_reachable(probe, arguments).await {
            Ok(answer) => probe_verdict(&answer),
            Err(why) => ProbeFinding::Indeterminate(why),
        }
    }
}

/// The runtime metadata of an upstream tool: conservative unless the upstream is trusted (then
/// its annotations inform effect and strategy), then the config's overrides.
pub fn upstream_spec(
    config: &UpstreamConfig,
    qualified: &str,
    name: &str,
    raw: &Value,
) -> ToolSpec {
    let description = raw
        .get("description")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let input_schema = raw
        .get("inputSchema")
        .cloned()
        .unwrap_or_else(|| json!({"type": "object"}));
    let mut spec = ToolSpec::new(qualified, description, input_schema);
    if let Some(out) = raw.get("outputSchema").filter(|v| v.is_object()) {
        spec.output_schema = Some(out.clone());
    }
    if config.trusted {
        let hint = |k: &str| {
            raw.pointer(&format!("/annotations/{k}"))
                .and_then(Value::as_bool)
        };
        if hint("readOnlyHint") == Some(true) {
            spec.effect = Effect::Nullipotent;
            spec.authority = Authority::A0;
            spec.strategy = StrategySet::of(&[Strategy::Exploration]);
        } else {
            spec.effect = if hint("idempotentHint") == Some(true) {
                Effect::Idempotent
            } else {
                Effect::NonIdempotent
            };
            // Destructive is the protocol's default; only an explicit `false` lowers it.
            let destructive = hint("destructiveHint") != Some(false);
            let open_world = hint("openWorldHint") != Some(false);
            spec.authority = match (destructive, open_world) {
                (true, _) => Authority::A3,
                (false, true) => Authority::A2,
                (false, false) => Authority::A1,
            };
            spec.strategy = StrategySet::of(&[Strategy::Exploitation]);
        }
    }
    let o = config.override_for(name);
    if let Some(v) = o.effect {
        spec.effect = v;
    }
    if let Some(v) = o.authority {
        spec.authority = v;
    }
    if let Some(v) = &o.strategy {
        spec.strategy = StrategySet::of(v);
    }
    if let Some(v) = o.concurrency {
        spec.concurrency = v;
    }
    if let Some(v) = &o.conflict_key {
        spec.conflict_key = Some(v.clone());
    }
    if let Some(v) = o.settlement {
        spec.settlement = v;
    }
    if let Some(v) = o.observation_budget_bytes {
        spec.observation_budget_bytes = v;
    }
    if let Some(v) = o.track_exact_repeats {
        spec.track_exact_repeats = v;
    }
    if let Some(v) = o.deterministic {
        spec.deterministic = v;
    }
    if let Some(v) = o.open_schema {
        spec.open_schema = v;
    }
    if let Some(v) = &o.compensation {
        // The compensating tool is the same upstream's, named as the catalog names it.
        spec.compensation =
            Some(crate::names::qualify(&config.alias, v).unwrap_or_else(|_| v.clone()));
    }
    spec.timeout_ms = (config.max_timeout() + KERNEL_TIMEOUT_GRACE).as_millis() as u64;
    // A schema `default` is the server's claim: forward exactly what the model sent.
    spec.apply_schema_defaults = false;
    spec
}

/// The MCP tool object of a built-in tool.
pub fn builtin_definition(spec: &ToolSpec) -> Value {
    let mut tool = Map::new();
    tool.insert("name".into(), Value::String(spec.name.clone()));
    tool.insert(
        "description".into(),
        Value::String(spec.description.clone()),
    );
    tool.insert("inputSchema".into(), spec.input_schema.clone());
    if let Some(out) = &spec.output_schema {
        tool.insert("outputSchema".into(), out.clone());
    }
    tool.insert(
        "annotations".into(),
        json!({
            "readOnlyHint": spec.effect == Effect::Nullipotent,
            "destructiveHint": spec.authority >= Authority::A3,
            "idempotentHint": spec.effect != Effect::NonIdempotent,
            "openWorldHint": spec.authority >= Authority::A2,
        }),
    );
    Value::Object(tool)
}

impl Gateway {
    /// What ends with a client session (see [`GatewayOptions::session_end`]).
    pub(crate) fn session_end(&self) -> Option<SessionEnd> {
        self.inner.session_end.clone()
    }

    /// Builds the gateway and starts a supervisor for every upstream (call inside a runtime).
    pub fn start(options: GatewayOptions) -> Result<Self, String> {
        crate::config::validate(&options.upstreams).map_err(|e| e.to_string())?;
        let pins = Arc::new(PinBook::open(&options.workspace, &options.state_dir)?);
        let (changes, _) = broadcast::channel(64);
        let builtin_kernel = build_kernel(&options.builtins, &[], &options, &options.log);
        let inner = Arc::new(Inner {
            builtins: options.builtins,
            catalog: options.catalog,
            upstreams: RwLock::new(Vec::new()),
            journal: options.journal.clone(),
            authorizer: options.authorizer.clone(),
            pins,
            parked: Parked::default(),
            spill: options.spill,
            observer: options.observer,
            max_concurrent_tools: options.max_concurrent_tools.max(1),
            log: options.log.clone(),
            generation: RwLock::new(Arc::new(builtin_kernel)),
            counter: AtomicU64::new(0),
            changes,
            session_end: options.session_end,
            // Replicas of a shared journal share every conversation's loaded tools through it.
            loaded_sets: match options.journal.shared_state() {
                Some(state) => ring0_kernel::catalog::LoadedSets::shared(state),
                None => ring0_kernel::catalog::LoadedSets::new(),
            },
        });
        let http_client = if options.upstreams.iter().any(|u| u.url.is_some()) {
            Some(crate::upstream::http::client()?)
        } else {
            None
        };
        let mut ups = Vec::new();
        for config in options.upstreams {
            let weak = Arc::downgrade(&inner);
            let on_change: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
                if let Some(inner) = weak.upgrade() {
                    Gateway { inner }.rebuild();
                }
            });
            let alias = config.alias.clone();
            let sandbox = options
                .upstream_sandboxes
                .get(&alias)
                .cloned()
                .unwrap_or_else(|| {
                    ring0_exec::Sandbox::new(
                        ring0_exec::SandboxProfile::workspace(),
                        &options.workspace,
                        options.protected_paths.clone(),
                    )
                });
            let roots = crate::upstream::roots::resolve(
                &config.roots,
                &options.workspace,
                &options.granted_roots,
                &options.protected_paths,
            )
            .map_err(|e| format!("upstream {alias:?}: {e}"))?;
            // Fail at start, not at the first connection, when a secret cannot be read; and
            // hide the values from the log before anything can print them.
            let secrets = crate::upstream::secrets::resolve(&config, &options.workspace)
                .map_err(|e| format!("upstream {alias:?}: {e}"))?;
            crate::upstream::secrets::register(&secrets, &options.log);
            ups.push(Upstream::new(
                config,
                inner.pins.clone(),
                inner.log.clone(),
                http_client.clone(),
                on_change,
                crate::upstream::WorkspaceView {
                    roots,
                    workspace: options.workspace.clone(),
                    spill: inner.spill.clone(),
                    sandbox,
                    audit: options.audit.clone(),
                },
            ));
        }
        *inner.upstreams.write().expect("upstreams") = ups.clone();
        for up in &ups {
            up.start();
        }
        let gw = Gateway { inner };
        gw.watch_lock();
        Ok(gw)
    }

    /// The tools loaded in search mode by the stateless requests of `principal` in `scope`
    /// (kept across catalog generations, and by every replica of a shared journal; see
    /// [`ring0_kernel::catalog::LoadedSets`]).
    pub fn loaded_tools(
        &self,
        principal: &ring0_core::Principal,
        scope: &str,
    ) -> Arc<ring0_kernel::catalog::LoadedTools> {
        self.inner.loaded_sets.get(&principal.id, scope)
    }

    /// The current generation.
    pub fn generation(&self) -> Arc<Generation> {
        self.inner.generation.read().expect("generation").clone()
    }

    /// Catalog changes: the new generation number after each rebuild.
    pub fn subscribe(&self) -> broadcast::Receiver<u64> {
        self.inner.changes.subscribe()
    }

    pub fn max_concurrent_tools(&self) -> usize {
        self.inner.max_concurrent_tools
    }

    /// Calls waiting for their clients' answers, by `requestState` (see [`crate::input`]).
    pub fn parked(&self) -> &Parked {
        &self.inner.parked
    }

    pub fn journal(&self) -> &Arc<dyn Journal> {
        &self.inner.journal
    }

    /// Writes one line to the gateway's log.
    pub(crate) fn log_line(&self, line: &str) {
        self.inner.log.line(line);
    }

    pub fn upstreams(&self) -> Vec<Arc<Upstream>> {
        self.inner.upstreams.read().expect("upstreams").clone()
    }

    /// Waits until every upstream is connected and listed, or the timeout passes. Returns the
    /// aliases still not up. The upstreams are waited for at once: the wait is `timeout` at
    /// most, however many are slow.
    pub async fn wait_for_upstreams(&self, timeout: Duration) -> Vec<String> {
        self.wait_each(|_| timeout).await
    }

    /// Waits at start for every upstream at once, each at most its own `start_timeout_ms`
    /// (see [`crate::limits::UPSTREAM_START_TIMEOUT_DEFAULT`]). Returns the aliases still not
    /// up: they join later, when the catalog they complete is announced to the sessions with
    /// `notifications/tools/list_changed`.
    pub async fn wait_for_start(&self) -> Vec<String> {
        self.wait_each(|up| up.config.start_timeout()).await
    }

    async fn wait_each(&self, bound: impl Fn(&Upstream) -> Duration) -> Vec<String> {
        let ups = self.upstreams();
        let waits = ups.iter().map(|up| {
            let timeout = bound(up);
            async move { (up.alias().to_string(), up.wait_connected(timeout).await) }
        });
        futures::future::join_all(waits)
            .await
            .into_iter()
            .filter(|(_, up)| !up)
            .map(|(alias, _)| alias)
            .collect()
    }

    fn rebuild(&self) {
        let ups = self.upstreams();
        let listings: Vec<(Arc<Upstream>, Arc<crate::upstream::Listing>)> = ups
            .iter()
            .filter_map(|u| u.listing().map(|l| (u.clone(), l)))
            .collect();
        let options_like = BuildEnv {
            journal: self.inner.journal.clone(),
            authorizer: self.inner.authorizer.clone(),
            spill: self.inner.spill.clone(),
            catalog: self.inner.catalog.clone(),
            observer: self.inner.observer.clone(),
        };
        let mut generation = build(
            &self.inner.builtins,
            &listings,
            &options_like,
            &self.inner.log,
        );
        let number = self.inner.counter.fetch_add(1, Ordering::Relaxed) + 1;
        generation.number = number;
        *self.inner.generation.write().expect("generation") = Arc::new(generation);
        let _ = self.inner.changes.send(number);
    }

    fn watch_lock(&self) {
        let weak = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            // Replicas of a shared journal share their pin approvals through it.
            let mut shared_pins = crate::pin::SharedPins::default();
            loop {
                tokio::time::sleep(LOCK_POLL_INTERVAL).await;
                let Some(inner) = weak.upgrade() else { return };
                let changed = match inner.journal.shared_state() {
                    Some(shared) => match shared_pins.sync(&inner.pins, shared.as_ref()).await {
                        Ok(changed) => changed,
                        Err(e) => {
                            inner
                                .log
                                .line(&format!("pin approvals could not be shared: {e}"));
                            inner.pins.reload_if_changed()
                        }
                    },
                    None => inner.pins.reload_if_changed(),
                };
                if changed {
                    inner
                        .log
                        .line("ring0.lock changed; listing upstreams again");
                    for up in inner.upstreams.read().expect("upstreams").iter() {
                        up.request_relist();
                    }
                }
            }
        });
    }
}

struct BuildEnv {
    journal: Arc<dyn Journal>,
    authorizer: Arc<dyn Authorizer>,
    spill: Option<Arc<SpillStore>>,
    catalog: CatalogConfig,
    observer: Option<Arc<dyn ring0_kernel::EventObserver>>,
}

fn build_kernel(
    builtins: &[(ToolSpec, Arc<dyn Tool>)],
    listings: &[(Arc<Upstream>, Arc<crate::upstream::Listing>)],
    options: &GatewayOptions,
    log: &Log,
) -> Generation {
    build(
        builtins,
        listings,
        &BuildEnv {
            journal: options.journal.clone(),
            authorizer: options.authorizer.clone(),
            spill: options.spill.clone(),
            catalog: options.catalog.clone(),
            observer: options.observer.clone(),
        },
        log,
    )
}

fn build(
    builtins: &[(ToolSpec, Arc<dyn Tool>)],
    listings: &[(Arc<Upstream>, Arc<crate::upstream::Listing>)],
    env: &BuildEnv,
    log: &Log,
) -> Generation {
    let mut builder = Kernel::builder()
        .journal(env.journal.clone())
        .catalog(env.catalog.clone());
    if let Some(observer) = &env.observer {
        builder = builder.observer(observer.clone());
    }
    let mut tools = BTreeMap::new();
    let mut quarantined = BTreeMap::new();
    for (spec, tool) in builtins {
        if let Err(e) = Kernel::builder().tool(spec.clone(), tool.clone()) {
            log.line(&format!(
                "built-in tool {:?} not registered: {e}",
                spec.name
            ));
            continue;
        }
        builder = builder
            .tool(spec.clone(), tool.clone())
            .expect("checked above");
        tools.insert(
            spec.name.clone(),
            ExposedTool {
                definition: builtin_definition(spec),
                upstream: None,
            },
        );
    }
    for (up, listing) in listings {
        for t in &listing.tools {
            if tools.len() >= ring0_core::limits::CATALOG_TOOLS_MAX {
                log.line(&format!(
                    "[{}] tool {} not listed: the catalog holds its maximum of {} tools",
                    up.alias(),
                    t.qualified,
                    ring0_core::limits::CATALOG_TOOLS_MAX
                ));
                continue;
            }
            if tools.contains_key(&t.qualified) {
                log.line(&format!(
                    "[{}] tool {} collides with another tool's name; not listed",
                    up.alias(),
                    t.qualified
                ));
                continue;
            }
            // The cleaned definition: what the model reads is what the kernel validates against.
            let spec = upstream_spec(&up.config, &t.qualified, &t.name, &t.clean);
            let output_schema = spec
                .output_schema
                .as_ref()
                .and_then(|s| ring0_kernel::registry::compile_schema(s).ok())
                .map(Arc::new);
            let executor = Arc::new(UpstreamExecutor {
                upstream: up.clone(),
                tool: t.name.clone(),
                output_schema,
                forward: ForwardConfig {
                    budget_bytes: spec.observation_budget_bytes,
                    spill: env.spill.clone(),
                    owner: None,
                    provenance: Provenance {
                        tool: Some(t.name.clone()),
                        server: Some(up.alias().to_string()),
                        trusted: up.config.trusted,
                    },
                },
                probe: up.config.override_for(&t.name).probe,
                timeout_ms: spec.timeout_ms,
                log: log.clone(),
            });
            let candidate = Kernel::builder().tool(spec.clone(), executor.clone());
            if let Err(e) = candidate {
                log.line(&format!(
                    "[{}] tool {} not registered: {e}",
                    up.alias(),
                    t.qualified
                ));
                continue;
            }
            builder = builder.tool(spec, executor).expect("checked above");
            let mut definition = t.clean.clone();
            definition["name"] = Value::String(t.qualified.clone());
            if let Some(title) = definition["title"].as_str() {
                builder = builder.tool_title(&t.qualified, title);
            }
            if let PinVerdict::Quarantined(why) = &t.verdict {
                quarantined.insert(t.qualified.clone(), why.clone());
                // Registered so that a call is refused with the reason; never found by search.
                builder = builder.unlisted(&t.qualified);
            }
            tools.insert(
                t.qualified.clone(),
                ExposedTool {
                    definition,
                    upstream: Some(up.alias().to_string()),
                },
            );
        }
    }
    let gate = Arc::new(QuarantineGate {
        inner: env.authorizer.clone(),
        quarantined: Arc::new(quarantined.clone()),
    });
    let upstream_tools = tools
        .iter()
        .filter(|(_, t)| t.upstream.is_some())
        .map(|(name, _)| name.clone())
        .collect();
    let kernel = match &env.spill {
        Some(store) => builder.spill_store(store.clone()),
        None => builder,
    }
    .authorizer(gate.clone())
    .build();
    if kernel.catalog().mode() == CatalogMode::Search {
        for name in [SEARCH_TOOL, LOAD_TOOL] {
            if let Some(meta) = kernel.registry().get(name) {
                tools.insert(
                    name.to_string(),
                    ExposedTool {
                        definition: builtin_definition(&meta.spec),
                        upstream: None,
                    },
                );
            }
        }
    }
    Generation {
        number: 0,
        kernel,
        tools,
        quarantined,
        gate,
        projector: Arc::new(McpProjector::new(upstream_tools)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_applied_verdict_carries_its_evidence() {
        let v = probe_verdict(&json!({"verdict": "applied", "evidence": {"applied": 1}}));
        let ProbeFinding::Applied(obs) = v else {
            panic!("expected Applied, got {v:?}")
        };
        assert_eq!(obs.structured, Some(json!({"applied": 1})));
    }

    #[test]
    fn unchanged_is_recognized() {
        assert_eq!(
            probe_verdict(&json!({"verdict": "unchanged"})),
            ProbeFinding::Unchanged
        );
    }

    #[test]
    fn any_other_answer_is_inconclusive() {
        for answer in [
            json!({"verdict": "diverged"}),
            json!({"verdict": "Applied"}),
            json!({"verdict": true}),
            json!({"state": 1}),
        ] {
            assert!(
                matches!(probe_verdict(&answer), ProbeFinding::Indeterminate(_)),
                "{answer}"
            );
        }
    }
}
