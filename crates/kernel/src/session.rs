//! The public agent-loop API: a [`Kernel`] holds the tools, the journal and the default policy;
//! a [`Session`] runs model turns through the whole pipeline.

use crate::admit::{RepeatLimits, ToolChoice};
use crate::dispatch::DispatchEnv;
use crate::events::Event;
use crate::plan::SchedulingMode;
use crate::policy::{Authorizer, GrantTable, PolicyRewrite, SessionInfo};
use crate::prepare::Prepared;
use crate::project::Projector;
use crate::registry::{RegistrationError, Registry};
use crate::shape::{KernelSpill, ShapeStage};
use crate::tool::Tool;
use ring0_core::format::{FormatError, parse_turn, render_results};
use ring0_core::{Principal, ProviderFormat, Receipt, Rejection, Round, ToolResult, ToolSpec};
use ring0_journal::{Journal, MemoryJournal};
use ring0_shape::{RedactError, Redactor, SpillStore};
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;
use tokio::sync::{Mutex, broadcast};
use tokio_util::sync::CancellationToken;

/// The tool a spill notice names when it is registered: pages a handle back to the model.
pub const SPILL_READER_TOOL: &str = "read_spill";
/// Default bound on calls running at once in one epoch.
pub const MAX_CONCURRENT_TOOLS_DEFAULT: usize = 8;
/// How long a caller's explicit idempotency key is kept by default (24 h): a retry under it
/// within this time is answered with the recorded result.
pub const IDEMPOTENCY_KEY_RETENTION_MS_DEFAULT: u64 =
    ring0_journal::limits::CLIENT_KEY_RETENTION_MS_DEFAULT;
/// How long a call waits by default (30 s) for the identical call in flight before it to settle,
/// to answer with its result; then it is refused as `in_progress`, naming the intent.
pub const IN_FLIGHT_WAIT_MS_DEFAULT: u64 = 30_000;
/// Most secret values the kernel and a session may each mark: together they stay within the
/// redactor's own bound.
pub const SECRET_VALUES_MAX: usize = ring0_shape::redact::SECRET_VALUES_MAX / 2;

pub(crate) struct KernelInner {
    pub(crate) registry: Registry,
    pub(crate) journal: Arc<dyn Journal>,
    pub(crate) authorizer: Arc<dyn Authorizer>,
    pub(crate) rewrites: Vec<Arc<dyn PolicyRewrite>>,
    pub(crate) sessions: AtomicU64,
    /// Secret values every session redacts, and the shape stage recovery uses.
    pub(crate) secret_values: Arc<[String]>,
    pub(crate) shape: ShapeStage,
    pub(crate) spill: Option<KernelSpill>,
    /// The state every session of one (principal, scope) shares.
    pub(crate) scopes: crate::scope::ScopeRegistry,
    /// Woken whenever a committed call of this kernel settles: calls waiting for an identical
    /// one in flight look again.
    pub(crate) settled: Arc<tokio::sync::Notify>,
    pub(crate) key_retention_ms: u64,
    pub(crate) in_flight_wait_ms: u64,
    /// The catalog index, its mode and pinned core (see [`crate::catalog`]).
    pub(crate) catalog: Arc<crate::catalog::Catalog>,
    pub(crate) observer: Option<Arc<dyn crate::events::EventObserver>>,
}

/// The mediation kernel: tools, journal and default policy, shared by its sessions.
#[derive(Clone)]
pub struct Kernel {
    inner: Arc<KernelInner>,
}

/// Builds a [`Kernel`].
pub struct KernelBuilder {
    registry: Registry,
    traits: BTreeMap<String, crate::traits::ConnectionTraits>,
    journal: Option<Arc<dyn Journal>>,
    authorizer: Option<Arc<dyn Authorizer>>,
    rewrites: Vec<Arc<dyn PolicyRewrite>>,
    secret_values: Vec<String>,
    spill: Option<Arc<SpillStore>>,
    key_retention_ms: u64,
    in_flight_wait_ms: u64,
    catalog: crate::catalog::CatalogConfig,
    unlisted: std::collections::BTreeSet<String>,
    titles: BTreeMap<String, String>,
    ranker: Option<crate::catalog::RankerFactory>,
    observer: Option<Arc<dyn crate::events::EventObserver>>,
}

/// A list of secret values the kernel or a session cannot redact.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretValuesError {
    #[error("{got} secret values given; at most {SECRET_VALUES_MAX} are accepted")]
    TooMany { got: usize },
    #[error(transparent)]
    Redactor(#[from] RedactError),
}

/// Checks a list of secret values and builds its redactor.
fn secret_list<I, S>(values: I) -> Result<Vec<String>, SecretValuesError>
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    let values: Vec<String> = values.into_iter().map(Into::into).collect();
    if values.len() > SECRET_VALUES_MAX {
        return Err(SecretValuesError::TooMany { got: values.len() });
    }
    Redactor::new(&values)?;
    Ok(values)
}

/// The redactor of the union of two checked lists.
fn redactor_of(a: &[String], b: &[String]) -> Redactor {
    Redactor::new(a.iter().chain(b)).expect("two checked lists within half the bound each")
}

/// A tool the builder refused, with the builder and every tool registered before it.
pub struct ToolRefused {
    pub error: RegistrationError,
    /// Boxed: the error path should not make every `Ok` as large as a builder twice.
    pub builder: Box<KernelBuilder>,
}

impl ToolRefused {
    /// The builder, to go on without the refused tool.
    pub fn into_builder(self) -> KernelBuilder {
        *self.builder
    }
}

impl std::fmt::Debug for ToolRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ToolRefused").field(&self.error).finish()
    }
}

impl std::fmt::Display for ToolRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for ToolRefused {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl From<ToolRefused> for RegistrationError {
    fn from(refused: ToolRefused) -> Self {
        refused.error
    }
}

impl KernelBuilder {
    /// Registers a tool: its schema is normalized and compiled now, once. A refused tool leaves
    /// the builder as it was: [`ToolRefused::into_builder`] goes on without it.
    pub fn tool(self, spec: ToolSpec, tool: Arc<dyn Tool>) -> Result<Self, ToolRefused> {
        let callable = spec.name.clone();
        self.tool_in(crate::traits::LOCAL_CONNECTION, &callable, spec, tool)
    }

    /// Registers a tool of a connection under its model-facing name, keeping its unqualified
    /// callable name for trait configuration.
    pub fn tool_in(
        mut self,
        connection: &str,
        callable: &str,
        spec: ToolSpec,
        tool: Arc<dyn Tool>,
    ) -> Result<Self, ToolRefused> {
        match self.registry.register_in(connection, callable, spec, tool) {
            Ok(()) => Ok(self),
            Err(error) => Err(ToolRefused {
                error,
                builder: Box::new(self),
            }),
        }
    }

    /// Trait configuration of one connection (`tool_traits`), keyed by unqualified callable
    /// name or `"*"`; it adds to and overrides the traits declared in code when the kernel is
    /// built. In-process tools belong to [`crate::traits::LOCAL_CONNECTION`].
    pub fn connection_traits(
        mut self,
        connection: &str,
        traits: crate::traits::ConnectionTraits,
    ) -> Self {
        self.traits.insert(connection.to_string(), traits);
        self
    }

    /// The journal. Without one, an in-memory journal is used.
    pub fn journal(mut self, journal: Arc<dyn Journal>) -> Self {
        self.journal = Some(journal);
        self
    }

    /// The default authorizer of sessions that bring none. Without one, everything is denied.
    pub fn authorizer(mut self, authorizer: Arc<dyn Authorizer>) -> Self {
        self.authorizer = Some(authorizer);
        self
    }

    pub fn rewrite(mut self, rewrite: Arc<dyn PolicyRewrite>) -> Self {
        self.rewrites.push(rewrite);
        self
    }

    /// Values every session redacts from tool output as `[redacted:secret]` (the values of
    /// environment variables the host keeps secret), in addition to the well-known credential
    /// formats. Values shorter than [`ring0_shape::redact::SECRET_VALUE_BYTES_MIN`] are ignored.
    pub fn secret_values<I, S>(mut self, values: I) -> Result<Self, SecretValuesError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.secret_values = secret_list(values)?;
        Ok(self)
    }

    /// Keeps every text the shape stage cuts whole in `store`, its handle sealed for the calling
    /// session; register a reader (the built-in `read_spill`) so the model can page it back.
    pub fn spill_store(mut self, store: Arc<SpillStore>) -> Self {
        self.spill = Some(store);
        self
    }

    /// How long a caller's explicit idempotency key is kept
    /// ([`IDEMPOTENCY_KEY_RETENTION_MS_DEFAULT`] by default); at least 1 ms.
    pub fn idempotency_key_retention_ms(mut self, retention_ms: u64) -> Self {
        self.key_retention_ms = retention_ms.max(1);
        self
    }

    /// How long a call waits for the identical call in flight before it
    /// ([`IN_FLIGHT_WAIT_MS_DEFAULT`] by default).
    pub fn in_flight_wait_ms(mut self, wait_ms: u64) -> Self {
        self.in_flight_wait_ms = wait_ms;
        self
    }

    /// How sessions list the catalog: full, search (pinned core, meta-tools, loaded tools) or
    /// auto (see [`crate::catalog`]). Full by default.
    pub fn catalog(mut self, config: crate::catalog::CatalogConfig) -> Self {
        self.catalog = config;
        self
    }

    /// Keeps a registered tool out of the catalog: never found by search, listed or loaded,
    /// though a call to it is still recognized (and refused by an authorizer that knows why,
    /// such as a quarantine).
    pub fn unlisted(mut self, name: impl Into<String>) -> Self {
        self.unlisted.insert(name.into());
        self
    }

    /// A tool's human-readable title (an MCP definition's `title`), weighed by catalog search.
    pub fn tool_title(mut self, name: impl Into<String>, title: impl Into<String>) -> Self {
        self.titles.insert(name.into(), title.into());
        self
    }

    /// Ranks catalog searches with `factory`'s ranker instead of the built-in BM25F index: the
    /// seam for a semantic ranker (see [`crate::catalog::Ranker`]).
    pub fn catalog_ranker(mut self, factory: crate::catalog::RankerFactory) -> Self {
        self.ranker = Some(factory);
        self
    }

    /// Every event of every session goes to `observer` as well, as it is sent (see
    /// [`crate::events::EventObserver`]): what an operations host counts its metrics from.
    pub fn observer(mut self, observer: Arc<dyn crate::events::EventObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    pub fn build(mut self) -> Kernel {
        self.registry.apply_traits(&self.traits);
        let catalog = Arc::new(crate::catalog::Catalog::build(
            &mut self.registry,
            crate::catalog::CatalogInputs {
                config: self.catalog,
                unlisted: self.unlisted,
                titles: self.titles,
                ranker: self.ranker,
            },
        ));
        let spill = self.spill.map(|store| KernelSpill {
            store,
            reader: self
                .registry
                .get(SPILL_READER_TOOL)
                .map(|_| Arc::from(SPILL_READER_TOOL)),
        });
        let shape = ShapeStage {
            redactor: redactor_of(&self.secret_values, &[]),
            ..ShapeStage::default()
        };
        Kernel {
            inner: Arc::new(KernelInner {
                registry: self.registry,
                journal: self
                    .journal
                    .unwrap_or_else(|| Arc::new(MemoryJournal::new())),
                authorizer: self
                    .authorizer
                    .unwrap_or_else(|| Arc::new(GrantTable::deny_all())),
                rewrites: self.rewrites,
                sessions: AtomicU64::new(0),
                secret_values: self.secret_values.into(),
                shape,
                spill,
                scopes: Default::default(),
                settled: Default::default(),
                key_retention_ms: self.key_retention_ms,
                in_flight_wait_ms: self.in_flight_wait_ms,
                catalog,
                observer: self.observer,
            }),
        }
    }
}

/// How a session runs.
#[derive(Clone)]
pub struct SessionConfig {
    /// The user-intent scope: part of every semantic key.
    pub scope: String,
    pub mode: SchedulingMode,
    pub max_concurrent_tools: usize,
    pub repeat: RepeatLimits,
    /// Bumped by the host to say "a new attempt" of every call, whatever was delivered. Without
    /// it, an identical mutating call runs again once its predecessor's result was delivered
    /// ([`crate::DeliveryTicket`]) and is answered with that result until then.
    pub attempt_epoch: u64,
    pub projector: Option<Arc<dyn Projector>>,
    /// The session's grants; the kernel's default authorizer when absent.
    pub authorizer: Option<Arc<dyn Authorizer>>,
    /// Record nullipotent calls in the journal as well (audit trail). Off by default.
    pub journal_reads: bool,
    /// Serve a byte-identical observation of a deterministic read from the journal for this
    /// long; 0 (the default) always runs the tool.
    pub memo_ttl_ms: u64,
    /// Who the session acts for. Default [`Principal::local`].
    pub principal: Principal,
    /// The session's id as policy sees it (approvals and per-session limits are bound to it);
    /// a fresh one per session when absent. A host whose one conversation spans several kernel
    /// sessions (an MCP connection across catalog generations) names it once for all of them.
    pub session_id: Option<String>,
    /// Values this session redacts from tool output, besides the kernel's.
    pub secret_values: Arc<[String]>,
    /// The tools this conversation loaded in search mode ([`crate::catalog`]); a fresh set per
    /// session unless the host shares one across the kernel sessions of one conversation.
    pub loaded_tools: Arc<crate::catalog::LoadedTools>,
}

impl SessionConfig {
    pub fn new(scope: impl Into<String>) -> Self {
        Self {
            scope: scope.into(),
            mode: SchedulingMode::SafeParallel,
            max_concurrent_tools: MAX_CONCURRENT_TOOLS_DEFAULT,
            repeat: RepeatLimits::default(),
            attempt_epoch: 0,
            projector: None,
            authorizer: None,
            journal_reads: false,
            memo_ttl_ms: 0,
            principal: Principal::local(),
            session_id: None,
            secret_values: Arc::from([]),
            loaded_tools: crate::catalog::LoadedTools::new(),
        }
    }

    /// Shares a conversation's loaded tools with this session (see [`crate::catalog`]).
    pub fn loaded_tools(mut self, loaded: Arc<crate::catalog::LoadedTools>) -> Self {
        self.loaded_tools = loaded;
        self
    }

    /// Values this session redacts from tool output as `[redacted:secret]`, in addition to the
    /// kernel's ([`KernelBuilder::secret_values`]).
    pub fn secret_values<I, S>(mut self, values: I) -> Result<Self, SecretValuesError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.secret_values = secret_list(values)?.into();
        Ok(self)
    }

    pub fn session_id(mut self, id: impl Into<String>) -> Self {
        self.session_id = Some(id.into());
        self
    }

    pub fn principal(mut self, principal: Principal) -> Self {
        self.principal = principal;
        self
    }

    pub fn mode(mut self, mode: SchedulingMode) -> Self {
        self.mode = mode;
        self
    }
    pub fn max_concurrent_tools(mut self, n: usize) -> Self {
        self.max_concurrent_tools = n.max(1);
        self
    }
    pub fn repeat_limits(mut self, limits: RepeatLimits) -> Self {
        self.repeat = limits;
        self
    }
    pub fn attempt_epoch(mut self, epoch: u64) -> Self {
        self.attempt_epoch = epoch;
        self
    }
    pub fn projector(mut self, projector: Arc<dyn Projector>) -> Self {
        self.projector = Some(projector);
        self
    }
    pub fn authorizer(mut self, authorizer: Arc<dyn Authorizer>) -> Self {
        self.authorizer = Some(authorizer);
        self
    }
    pub fn journal_reads(mut self, on: bool) -> Self {
        self.journal_reads = on;
        self
    }
    pub fn memo_ttl_ms(mut self, ttl_ms: u64) -> Self {
        self.memo_ttl_ms = ttl_ms;
        self
    }
}

/// Why a run must end: the host makes no further model request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum Termination {
    RepeatLimit { tool: String, count: u32 },
    ProjectionFailed { call_id: String },
}

/// Per-round options.
#[derive(Debug, Clone, Default)]
pub struct RoundOptions {
    pub tool_choice: ToolChoice,
    /// Host-supplied intent ids by call index (source order).
    pub intent_ids: BTreeMap<usize, uuid::Uuid>,
    /// Handed to every call of the round, in its [`crate::CallContext`] and its
    /// [`crate::AuthRequest`]: the host's per-call context.
    pub extensions: crate::tool::CallExtensions,
    /// Cancelling this round stops its dispatched mutating calls too (an explicit stop, such as
    /// a cancelled task), instead of letting them finish to be settled for a retry.
    pub stop_dispatched_on_cancel: bool,
}

impl RoundOptions {
    pub fn tool_choice(choice: ToolChoice) -> Self {
        Self {
            tool_choice: choice,
            ..Self::default()
        }
    }
}

/// Everything one round produced.
#[derive(Debug, Clone)]
pub struct RoundOutcome {
    /// Canonical receipts, in source order.
    pub receipts: Vec<Receipt>,
    /// Per call, in source order: the ticket to mark once its result reached the caller, for a
    /// call answered by a journal record (run or replayed). See [`crate::delivery`].
    pub deliveries: Vec<Option<crate::DeliveryTicket>>,
    /// Model-visible results, in source order.
    pub results: Vec<ToolResult>,
    /// Set when the run must end.
    pub terminated: Option<Termination>,
    /// One bounded policy message to append to the next model request, if any.
    pub policy_message: Option<String>,
    /// The tool choice required a call and none came back.
    pub missing_required_call: bool,
}

impl RoundOutcome {
    /// The delivery ticket of the call at `position` (source order), if it has one.
    pub fn delivery(&self, position: usize) -> Option<&crate::DeliveryTicket> {
        self.deliveries.get(position).and_then(Option::as_ref)
    }

    /// Marks every call's result delivered: the whole outcome reached the caller.
    pub fn delivered(&self) {
        for ticket in self.deliveries.iter().flatten() {
            ticket.delivered();
        }
    }
}

/// A model turn's outcome, with the results rendered in the turn's format.
#[derive(Debug, Clone)]
pub struct TurnOutcome {
    pub message: Value,
    pub round: RoundOutcome,
}

pub(crate) struct SessionState {
    /// Set when a host projector failed: every later call of the session is refused. (A repeat
    /// termination refuses only its own fingerprint, in the scope's repeat guard.)
    pub(crate) terminated: Option<Termination>,
    pub(crate) rounds: u64,
    /// An advisory raised by a call started early, for the round's outcome.
    pub(crate) pending_policy_message: Option<String>,
    /// Calls started early, per `(turn_id, iteration)`: survives decision retries of the turn.
    pub(crate) ledger: crate::streaming::Ledger,
}

/// A receipt some task will deliver, with the intent that answers it, awaitable from several
/// places.
pub(crate) type SharedReceipt =
    futures::future::Shared<futures::future::BoxFuture<'static, crate::dispatch::Dispatched>>;

/// What a streaming round already decided about a call before the round's end.
pub(crate) enum Pre {
    Prepared(Prepared),
    Rejected(Rejection),
    Consumed {
        prepared: Prepared,
        receipt: SharedReceipt,
    },
}

/// One agent run: its scope, grants, mode, limits, repeat counts and event stream.
pub struct Session {
    pub(crate) kernel: Arc<KernelInner>,
    pub(crate) info: SessionInfo,
    pub(crate) config: SessionConfig,
    pub(crate) authorizer: Arc<dyn Authorizer>,
    pub(crate) state: Mutex<SessionState>,
    pub(crate) events: crate::events::EventHub,
    pub(crate) cancel: std::sync::Mutex<CancellationToken>,
    pub(crate) start_gate: Arc<std::sync::Mutex<()>>,
    pub(crate) shape: ShapeStage,
    /// What this session shares with every other of its principal and scope.
    pub(crate) scope: Arc<crate::scope::ScopeState>,
}

impl Kernel {
    pub fn builder() -> KernelBuilder {
        KernelBuilder {
            registry: Registry::new(),
            traits: BTreeMap::new(),
            journal: None,
            authorizer: None,
            rewrites: Vec::new(),
            secret_values: Vec::new(),
            spill: None,
            key_retention_ms: IDEMPOTENCY_KEY_RETENTION_MS_DEFAULT,
            in_flight_wait_ms: IN_FLIGHT_WAIT_MS_DEFAULT,
            catalog: Default::default(),
            unlisted: Default::default(),
            titles: BTreeMap::new(),
            ranker: None,
            observer: None,
        }
    }

    pub fn registry(&self) -> &Registry {
        &self.inner.registry
    }

    pub fn journal(&self) -> &Arc<dyn Journal> {
        &self.inner.journal
    }

    /// The catalog index, its mode and pinned core.
    pub fn catalog(&self) -> &Arc<crate::catalog::Catalog> {
        &self.inner.catalog
    }

    /// Settles what a previous process left open in the journal, from the log alone, using the
    /// registered tools: in-flight calls are reconciled (never re-sent blindly), committed but
    /// unsent calls are authorized again against the kernel's authorizer and dispatched only if
    /// it allows them (a refusal settles them REJECTED_CONFLICT with the rule, counted in the
    /// report's `cancelled`). Call once at start, before serving.
    pub async fn recover(
        &self,
    ) -> Result<ring0_journal::RecoveryReport, ring0_journal::JournalError> {
        let refused = crate::recover::recheck_recorded(
            self.inner.journal.as_ref(),
            &self.inner.registry,
            self.inner.authorizer.as_ref(),
        )
        .await?;
        let exec = crate::recover::RegistryExecutor {
            registry: &self.inner.registry,
            shape: &self.inner.shape,
        };
        let mut report = ring0_journal::recover(
            self.inner.journal.as_ref(),
            &exec,
            ring0_journal::RecoveryPolicy::default(),
        )
        .await?;
        // Settled before dispatch by the policy's re-check: counted as cancelled.
        report.examined += refused.len();
        report.cancelled += refused.len();
        report.settled.extend(refused);
        Ok(report)
    }

    /// Dispatches a RECORDED intent whose call was held for a person's approval by a process
    /// that ended before the approval came, once the person approved it (the held call's
    /// decision, `ring0_journal::hold`, is the caller's to check). The journal's fence makes
    /// it run once: a second release finds it dispatched. Settled by the same protocol as a
    /// live call, with the registered tool.
    pub async fn release_held(
        &self,
        id: ring0_journal::IntentId,
    ) -> Result<ring0_journal::IntentRecord, ring0_journal::JournalError> {
        use ring0_journal::JournalError;
        let journal = self.inner.journal.as_ref();
        let record = journal.get(id).await?.ok_or(JournalError::NotFound(id))?;
        if record.state != ring0_core::IntentState::Recorded {
            return Err(JournalError::Invalid(format!(
                "intent {id} is {}; only a RECORDED intent is released",
                record.state
            )));
        }
        let exec = crate::recover::RegistryExecutor {
            registry: &self.inner.registry,
            shape: &self.inner.shape,
        };
        if self.inner.registry.get(&record.tool).is_none() {
            return Err(JournalError::Invalid(format!(
                "the tool {} of intent {id} is not registered",
                record.tool
            )));
        }
        ring0_journal::drive(journal, &exec, record).await
    }

    pub fn open_session(&self, config: SessionConfig) -> Session {
        let n = self.inner.sessions.fetch_add(1, Ordering::Relaxed);
        let events = crate::events::EventHub::observed(self.inner.observer.clone());
        let mut authorizer = config
            .authorizer
            .clone()
            .unwrap_or_else(|| self.inner.authorizer.clone());
        if self.inner.catalog.mode() == crate::catalog::CatalogMode::Search {
            authorizer = Arc::new(crate::catalog::MetaGrant { inner: authorizer });
        }
        let mut shape = self
            .inner
            .shape
            .clone()
            .for_owner(self.inner.spill.as_ref(), &config.scope);
        if !config.secret_values.is_empty() {
            shape.redactor = redactor_of(&self.inner.secret_values, &config.secret_values);
        }
        if let Some(projector) = &config.projector {
            shape = shape.for_projection(projector.projection_bytes_max());
        }
        let scope = self
            .inner
            .scopes
            .open(&config.principal.id, &config.scope, config.repeat);
        Session {
            scope,
            kernel: self.inner.clone(),
            info: SessionInfo {
                scope: config.scope.clone(),
                session_id: config
                    .session_id
                    .clone()
                    .unwrap_or_else(|| format!("s{n}-{}", uuid::Uuid::new_v4().simple())),
                principal: config.principal.clone(),
            },
            state: Mutex::new(SessionState {
                terminated: None,
                rounds: 0,
                pending_policy_message: None,
                ledger: Default::default(),
            }),
            config,
            authorizer,
            events,
            cancel: std::sync::Mutex::new(CancellationToken::new()),
            start_gate: Arc::new(std::sync::Mutex::new(())),
            shape,
        }
    }
}

impl Session {
    pub fn info(&self) -> &SessionInfo {
        &self.info
    }

    /// Events of this session, in completion order.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    /// The tools this session may see, by name. A tool it may not call is never listed.
    pub fn catalog(&self) -> Vec<&ToolSpec> {
        self.kernel
            .registry
            .iter()
            .map(|t| &t.spec)
            .filter(|spec| self.authorizer.visible(&self.info, spec))
            .collect()
    }

    /// A genuine new user or steering message: resets the scope's exact-repeat sequence, which
    /// lifts a repeat termination.
    pub async fn user_message(&self) {
        self.scope.repeat().reset();
    }

    /// Cancels the round in progress: running calls settle, nothing new starts.
    pub fn cancel(&self) {
        let _gate = self.start_gate.lock().expect("start gate");
        let mut token = self.cancel.lock().expect("cancel mutex");
        token.cancel();
        *token = CancellationToken::new();
        self.emit(Event::Cancelled);
    }

    /// Mediates one model turn in a provider format and renders the results in the same format.
    pub async fn handle_turn(
        &self,
        format: ProviderFormat,
        turn: &Value,
        options: &RoundOptions,
    ) -> Result<TurnOutcome, FormatError> {
        let round = parse_turn(format, turn)?;
        let outcome = self.run_round(round, options).await;
        Ok(TurnOutcome {
            message: render_results(format, &outcome.results),
            round: outcome,
        })
    }

    pub(crate) fn dispatch_env(
        &self,
        round_start: Instant,
        cancel: CancellationToken,
        options: &RoundOptions,
    ) -> DispatchEnv {
        DispatchEnv {
            journal: self.kernel.journal.clone(),
            scope: Arc::from(self.config.scope.as_str()),
            principal: Arc::from(self.config.principal.id.as_str()),
            scope_state: self.scope.clone(),
            settled: self.kernel.settled.clone(),
            key_retention_ms: self.kernel.key_retention_ms,
            in_flight_wait_ms: self.kernel.in_flight_wait_ms,
            session: Arc::new(self.info.clone()),
            authorizer: self.authorizer.clone(),
            attempt_epoch: self.config.attempt_epoch,
            events: self.events.clone(),
            cancel,
            max_concurrent_tools: self.config.max_concurrent_tools,
            round_start,
            intent_ids: Arc::new(options.intent_ids.clone()),
            start_gate: self.start_gate.clone(),
            journal_reads: self.config.journal_reads,
            memo_ttl_ms: self.config.memo_ttl_ms,
            stop_dispatched_on_cancel: options.stop_dispatched_on_cancel,
            extensions: self.call_extensions(options),
            shape: self.shape.clone(),
        }
    }

    pub(crate) fn current_cancel(&self) -> CancellationToken {
        self.cancel.lock().expect("cancel mutex").clone()
    }

    pub(crate) fn emit(&self, event: Event) {
        self.events.send(event);
    }

    /// Runs one round of proposed calls through prepare, admit, plan, commit, dispatch, settle
    /// and project.
    pub async fn run_round(&self, round: Round, options: &RoundOptions) -> RoundOutcome {
        self.run_round_with(round.calls, options, Instant::now(), BTreeMap::new())
            .await
    }
}
