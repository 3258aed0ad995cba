//! The catalog: the kernel's tools as an index a session searches, and what a session lists.
//!
//! A catalog of thousands of tools cannot be sent to a model whole on every turn: the schemas
//! cost more tokens than the conversation. So the catalog is built as an index when the kernel
//! is built (every registered tool: built-in, library, upstream, host), and a session in
//! **search** mode lists only a small pinned core, the two meta-tools and what it loaded:
//!
//! - [`SEARCH_TOOL`] `(query, limit)` → names, one-line descriptions and scores of the tools the
//!   session's grants make visible, best first;
//! - [`LOAD_TOOL`] `(names)` → their full definitions; the session lists them from then on
//!   ([`LoadedTools`], whose changes a host announces, e.g. MCP's `list_changed`).
//!
//! Discovery is not authorization: a granted tool that is not loaded is still callable, an
//! ungranted one is never found, loaded or called. The meta-tools are A0 reads, granted to every
//! session of a kernel in search mode (they show only what the session may see). Grants are
//! applied at query time ([`crate::Authorizer::visible`]), so one index serves every principal.
//!
//! The mode is [`CatalogMode::Full`] (list everything, the default), [`CatalogMode::Search`], or
//! [`CatalogMode::Auto`]: search once the catalog holds more than
//! [`CatalogConfig::auto_tools_max`] tools or its schemas more than
//! [`CatalogConfig::auto_tokens_max`] o200k tokens ([`schema_tokens`]). Listing order is stable
//! across turns, so provider prompt caches keep hitting: the pinned core in configured order,
//! then the meta-tools, then loaded tools in the order they were loaded (a listing only grows at
//! its end); full mode lists by name.
//!
//! Ranking is lexical by default: BM25F with per-field weights ([`bm25`]). **The seam for a
//! semantic ranker** is [`Ranker`]: a [`RankerFactory`] given to
//! [`crate::KernelBuilder::catalog_ranker`] receives every tool's [`ToolDocument`] when the
//! kernel is built (embed them there, once per generation) and is asked per query for
//! candidates with scores; the catalog filters them by the session's grants, sorts and cuts to
//! the limit. A hybrid ranker can hold the [`Bm25Index`] and fuse both scores.

pub mod bm25;
pub mod lint;
mod meta;
mod turn;

pub use bm25::{Bm25Index, ToolDocument};
pub(crate) use meta::{CatalogCall, MetaGrant};
pub use meta::{LOAD_TOOL, SEARCH_TOOL};
pub use turn::{ANTHROPIC_TOOL_SEARCH_TYPE, OPENAI_TOOL_SEARCH_TYPE, TurnCatalog, TurnSearch};

use crate::registry::{RegisteredTool, Registry};
use ring0_core::ToolSpec;
use ring0_journal::SharedState;
use ring0_journal::shared::{LoadedAdd, LoadedAdded, LoadedFits, loaded_decide};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

/// What a session may see, as the catalog asks it (owned: a shared set's budget is decided
/// where the journal runs it).
pub type VisibleFn = Arc<dyn Fn(&ToolSpec) -> bool + Send + Sync>;

/// The built-ins a coding agent uses most: listed in search mode unless configured otherwise.
pub const PINNED_DEFAULT: &[&str] = &[
    "read_file",
    "list_dir",
    "glob",
    "search",
    "write_file",
    "apply_patch",
    "shell",
];
/// Most pinned tools a configuration may name: the core is meant to be small.
pub const PINNED_TOOLS_MAX: usize = 64;
/// Tools above which `auto` switches to search mode.
pub const AUTO_TOOLS_MAX_DEFAULT: usize = 64;
/// Schema tokens (o200k) of the whole catalog above which `auto` switches to search mode.
pub const AUTO_TOKENS_MAX_DEFAULT: u64 = 16_000;
/// Results of one search when the model names no limit.
pub const SEARCH_LIMIT_DEFAULT: usize = 8;
/// Most results of one search.
pub const SEARCH_LIMIT_MAX: usize = 50;
/// Longest query accepted (bytes).
pub const QUERY_BYTES_MAX: usize = 1024;
/// Most names one `load_tools` call takes.
pub const LOAD_NAMES_MAX: usize = 16;
/// Most tools one session keeps loaded (beyond the pinned core).
pub const LOADED_TOOLS_MAX: usize = 128;
/// Longest one-line description in a search result (bytes).
pub const SUMMARY_BYTES_MAX: usize = 200;
/// Default [`SchemaBudgets::tool_tokens_max`]: a tool whose definition costs more than this
/// is rare (the built-ins cost 100–400) and usually carries a manual in its description.
pub const TOOL_TOKENS_MAX_DEFAULT: u64 = 2_000;
/// Default [`SchemaBudgets::listing_tokens_max`]: about a sixth of a 200k-token context.
pub const LISTING_TOKENS_MAX_DEFAULT: u64 = 32_000;

/// What tool definitions may cost, in o200k schema tokens ([`schema_tokens`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchemaBudgets {
    /// One tool's definition. A tool over it is still served (its definition comes from its
    /// author, and dropping it would change what a model can do behind the operator's back);
    /// it is reported when the kernel is built ([`Catalog::over_budget`]) and is a lint error.
    pub tool_tokens_max: u64,
    /// What a session is sent up front (its listing). In search mode a load that would take
    /// the listing over it is refused ([`LoadOutcome::over_budget`]); in full mode the listing
    /// is what the grants show, and a catalog over it is reported when the kernel is built and
    /// is a lint error.
    pub listing_tokens_max: u64,
}

impl Default for SchemaBudgets {
    fn default() -> Self {
        Self {
            tool_tokens_max: TOOL_TOKENS_MAX_DEFAULT,
            listing_tokens_max: LISTING_TOKENS_MAX_DEFAULT,
        }
    }
}

/// How a session's listing is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CatalogMode {
    /// Every visible tool is listed.
    #[default]
    Full,
    /// The pinned core, the meta-tools and the loaded tools are listed.
    Search,
    /// Search above a size or token budget, full below it (decided when the kernel is built).
    Auto,
}

/// The catalog's configuration (`[catalog]` in `ring0.toml`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogConfig {
    pub mode: CatalogMode,
    /// Tools always listed in search mode (when they exist and the session may see them), in
    /// this order. Default [`PINNED_DEFAULT`]; at most [`PINNED_TOOLS_MAX`].
    pub pinned: Vec<String>,
    /// `auto`: search mode above this many tools.
    pub auto_tools_max: usize,
    /// `auto`: search mode above this many schema tokens for the whole catalog.
    pub auto_tokens_max: u64,
    /// What one definition and one listing may cost.
    pub budgets: SchemaBudgets,
}

impl Default for CatalogConfig {
    fn default() -> Self {
        Self {
            mode: CatalogMode::Full,
            pinned: PINNED_DEFAULT.iter().map(|s| s.to_string()).collect(),
            auto_tools_max: AUTO_TOOLS_MAX_DEFAULT,
            auto_tokens_max: AUTO_TOKENS_MAX_DEFAULT,
            budgets: SchemaBudgets::default(),
        }
    }
}

/// Ranks the catalog's documents for a query (see the module docs for the seam).
pub trait Ranker: Send + Sync {
    /// Candidates for `query`: (position of the document given to the factory, score), in any
    /// order; higher is better. Documents that do not match are left out.
    fn rank(&self, query: &str) -> Vec<(usize, f64)>;
}

/// Builds a [`Ranker`] over the catalog's documents, once per kernel.
pub type RankerFactory = Arc<dyn Fn(&[ToolDocument]) -> Box<dyn Ranker> + Send + Sync>;

impl Ranker for Bm25Index {
    fn rank(&self, query: &str) -> Vec<(usize, f64)> {
        let mut scratch = Vec::new();
        Bm25Index::rank(self, query, &mut scratch)
            .into_iter()
            .map(|(doc, score)| (doc as usize, f64::from(score)))
            .collect()
    }
}

/// Schema tokens of one tool as a provider receives it: its name, description and parameter
/// schema as compact JSON, counted with o200k. A count the tokenizer cannot make is estimated
/// at four bytes a token, so a budget is never skipped.
pub fn schema_tokens(spec: &ToolSpec) -> u64 {
    let text = json!({
        "name": spec.name,
        "description": spec.description,
        "parameters": spec.input_schema,
    })
    .to_string();
    ring0_shape::tokens::count(&text).unwrap_or(text.len() as u64 / 4)
}

/// The document the ranker reads for a tool: its name, title, description, and the names and
/// descriptions of its parameters (nested ones too, to a bounded depth).
pub fn document_of(spec: &ToolSpec, title: Option<&str>) -> ToolDocument {
    let mut names = Vec::new();
    let mut descriptions = Vec::new();
    collect_parameters(&spec.input_schema, 0, &mut names, &mut descriptions);
    ToolDocument {
        name: spec.name.clone(),
        title: title.unwrap_or_default().to_string(),
        description: spec.description.clone(),
        parameter_names: names.join(" "),
        parameter_descriptions: descriptions.join(" "),
    }
}

/// How deep parameter descriptions are read into a tool's document.
const PARAMETER_DEPTH_MAX: usize = 4;

fn collect_parameters(
    schema: &Value,
    depth: usize,
    names: &mut Vec<String>,
    descriptions: &mut Vec<String>,
) {
    if depth > PARAMETER_DEPTH_MAX {
        return;
    }
    if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
        for (name, property) in properties {
            names.push(name.clone());
            if let Some(d) = property.get("description").and_then(Value::as_str) {
                descriptions.push(d.to_string());
            }
            collect_parameters(property, depth + 1, names, descriptions);
        }
    }
    if let Some(items) = schema.get("items") {
        collect_parameters(items, depth + 1, names, descriptions);
    }
}

/// A tool's first line, bounded: what a search result says of it.
pub fn summary(description: &str) -> String {
    let line = description
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    let line = line.trim();
    if line.len() <= SUMMARY_BYTES_MAX {
        return line.to_string();
    }
    let cut = ring0_core::text::truncate_utf8(line, SUMMARY_BYTES_MAX - '…'.len_utf8());
    format!("{cut}…")
}

/// One search result.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SearchHit {
    pub name: String,
    /// The first line of its description, at most [`SUMMARY_BYTES_MAX`] bytes.
    pub description: String,
    pub score: f64,
}

/// What one `load_tools` did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoadOutcome {
    /// The tools now listed (or already listed), by name, with their full specs' definitions.
    pub loaded: Vec<ToolSpec>,
    /// Names the session has no tool by (absent, or not visible to it: the same answer).
    pub not_found: Vec<String>,
    /// Names refused because the session already holds [`LOADED_TOOLS_MAX`] loaded tools.
    pub over_limit: Vec<String>,
    /// Names refused because listing them would take the session's listing over
    /// [`SchemaBudgets::listing_tokens_max`].
    pub over_budget: Vec<String>,
}

/// The tools a conversation loaded, in load order: shared by every kernel session a host opens
/// for one conversation (an MCP client session opens one per call), so a load in one call is
/// listed by the next. Hosts watch [`LoadedTools::subscribe`] to announce the new listing.
///
/// A set is kept in memory ([`LoadedTools::new`]) or, for replicas of one deployment, in the
/// journal's shared state ([`LoadedTools::shared`], [`LoadedTools::share`]): then any replica
/// lists what a load through another added, once it called [`LoadedTools::refresh`]. A shared
/// set that cannot be reached refuses loads ([`LoadedUnavailable`]) rather than keep them here
/// alone, and reads as empty, so the listing falls back to the pinned core and the meta-tools.
pub struct LoadedTools {
    /// A memory set's names; a shared set's as last read or written here.
    names: Mutex<Vec<String>>,
    changed: tokio::sync::watch::Sender<u64>,
    /// Where the set is kept when replicas share it (bound once).
    shared: OnceLock<SharedSet>,
}

/// A loaded set kept in a deployment's shared state, under (principal id, scope).
struct SharedSet {
    state: Arc<dyn SharedState>,
    principal: String,
    scope: String,
}

impl std::fmt::Debug for LoadedTools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedTools")
            .field("names", &self.names())
            .field(
                "shared",
                &self.shared.get().map(|s| (&s.principal, &s.scope)),
            )
            .finish()
    }
}

impl Default for LoadedTools {
    fn default() -> Self {
        Self {
            names: Mutex::new(Vec::new()),
            changed: tokio::sync::watch::channel(0).0,
            shared: OnceLock::new(),
        }
    }
}

/// A loaded set kept in the deployment's shared state could not be read or added to: a load
/// is refused (never kept by one replica alone), a listing shows no loaded tools.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the tools this conversation loaded are kept in the deployment's database, which could not \
     be reached ({0}); try again shortly"
)]
pub struct LoadedUnavailable(pub String);

impl LoadedTools {
    /// A set kept in memory.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// A set kept in `state` under (`principal` id, `scope`), shared by every replica of it.
    pub fn shared(state: Arc<dyn SharedState>, principal: &str, scope: &str) -> Arc<Self> {
        let set = Self::default();
        set.share(state, principal, scope);
        Arc::new(set)
    }

    /// Keeps this set in `state` under (`principal` id, `scope`) from now on, for a host that
    /// learns a conversation's shared name after making its set (an MCP session, from its first
    /// request's session id). Only the first binding counts: a conversation keeps its name.
    pub fn share(&self, state: Arc<dyn SharedState>, principal: &str, scope: &str) {
        let _ = self.shared.set(SharedSet {
            state,
            principal: principal.to_string(),
            scope: scope.to_string(),
        });
    }

    /// Whether the set is kept in a deployment's shared state.
    pub fn is_shared(&self) -> bool {
        self.shared.get().is_some()
    }

    /// Loaded names, in load order: a shared set's as last read or written here (see
    /// [`LoadedTools::refresh`]).
    pub fn names(&self) -> Vec<String> {
        self.names.lock().expect("loaded tools").clone()
    }

    /// Reads a shared set's names as the deployment holds them now (a memory set's are always
    /// current). When they cannot be read, the set reads as empty until the next refresh.
    pub async fn refresh(&self) -> Result<(), LoadedUnavailable> {
        let Some(shared) = self.shared.get() else {
            return Ok(());
        };
        let read = shared
            .state
            .loaded_names(&shared.principal, &shared.scope)
            .await;
        let mut names = self.names.lock().expect("loaded tools");
        match read {
            Ok(read) => {
                *names = read;
                Ok(())
            }
            Err(e) => {
                names.clear();
                Err(LoadedUnavailable(e.to_string()))
            }
        }
    }

    /// Bumped each time a tool is added through this set (not when a refresh finds another
    /// replica's load).
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Adds `adding` in order by [`loaded_decide`]: each unless present, within
    /// [`LOADED_TOOLS_MAX`], when `fits` (asked with the names held so far, under the set's
    /// lock: in memory, or the shared row's) allows. One answer per name.
    async fn add(
        &self,
        adding: &[String],
        mut fits: LoadedFits,
    ) -> Result<Vec<LoadedAdded>, LoadedUnavailable> {
        let added = match self.shared.get() {
            None => {
                let mut names = self.names.lock().expect("loaded tools");
                loaded_decide(&mut names, adding, LOADED_TOOLS_MAX, &mut *fits)
            }
            Some(shared) => {
                let LoadedAdd { added, names } = shared
                    .state
                    .loaded_add(
                        &shared.principal,
                        &shared.scope,
                        adding,
                        LOADED_TOOLS_MAX,
                        fits,
                    )
                    .await
                    .map_err(|e| LoadedUnavailable(e.to_string()))?;
                *self.names.lock().expect("loaded tools") = names;
                added
            }
        };
        if added.contains(&LoadedAdded::Added) {
            self.changed.send_modify(|v| *v += 1);
        }
        Ok(added)
    }
}

/// Most loaded sets [`LoadedSets`] keeps at once.
pub const LOADED_SETS_MAX: usize = 4096;
/// A loaded set in [`LoadedSets`] no session holds is forgotten after this long unused (1 h,
/// the kernel's scope idle expiry).
pub const LOADED_SET_IDLE_MS: u64 = crate::scope::SCOPE_IDLE_MS;

/// The loaded sets of conversations a host keeps no session object for, by (principal id,
/// scope): MCP's stateless 2026-07-28 requests are each a session of their own, so what one
/// request loads is kept here for the next request of the same scope. Bounded: at most
/// [`LOADED_SETS_MAX`]; when full, sets idle for [`LOADED_SET_IDLE_MS`] are forgotten, then the
/// least recently used one (a forgotten set only means its tools must be loaded again). Made
/// with [`LoadedSets::shared`], every set is a shared one ([`LoadedTools::shared`]), and what
/// is kept here is only the handle that announces this replica's loads.
#[derive(Default)]
pub struct LoadedSets {
    sets: Mutex<HashMap<ScopeKey, (Arc<LoadedTools>, std::time::Instant)>>,
    shared: Option<Arc<dyn SharedState>>,
}

// The shared sets keep the bounds of the memory ones: one name, one limit.
const _: () = assert!(LOADED_TOOLS_MAX <= ring0_journal::shared::LOADED_NAMES_MAX);
const _: () = assert!(LOAD_NAMES_MAX <= ring0_journal::shared::LOADED_NAMES_MAX);
const _: () = assert!(LOADED_SETS_MAX as i64 == ring0_journal::shared::LOADED_SETS_MAX);
const _: () = assert!(LOADED_SET_IDLE_MS == ring0_journal::shared::LOADED_SET_IDLE_MS);

/// (principal id, scope).
type ScopeKey = (String, String);

impl LoadedSets {
    /// Sets kept in memory.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets kept in `state`, shared by every replica of a deployment.
    pub fn shared(state: Arc<dyn SharedState>) -> Self {
        Self {
            shared: Some(state),
            ..Self::default()
        }
    }

    /// The set of (principal, scope), made empty on first use.
    pub fn get(&self, principal: &str, scope: &str) -> Arc<LoadedTools> {
        let mut sets = self.sets.lock().unwrap_or_else(|e| e.into_inner());
        let now = std::time::Instant::now();
        let key = (principal.to_string(), scope.to_string());
        if let Some((set, used)) = sets.get_mut(&key) {
            *used = now;
            return set.clone();
        }
        if sets.len() >= LOADED_SETS_MAX {
            let idle = std::time::Duration::from_millis(LOADED_SET_IDLE_MS);
            sets.retain(|_, (_, used)| now - *used < idle);
        }
        if sets.len() >= LOADED_SETS_MAX
            && let Some(oldest) = sets
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone())
        {
            sets.remove(&oldest);
        }
        let set = match &self.shared {
            Some(state) => LoadedTools::shared(state.clone(), principal, scope),
            None => LoadedTools::new(),
        };
        sets.insert(key, (set.clone(), now));
        set
    }

    /// Sets kept.
    pub fn len(&self) -> usize {
        self.sets.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The catalog of one kernel: its mode, pinned core and index.
pub struct Catalog {
    search: bool,
    /// Why the mode is what it is (for `auto`, the numbers).
    reason: String,
    pinned: Vec<String>,
    /// The indexed tools, by document position.
    tools: Vec<Arc<RegisteredTool>>,
    positions: HashMap<String, usize>,
    /// Schema tokens of each indexed tool, by document position.
    tokens: Vec<u64>,
    /// Schema tokens of the meta-tools (0 outside search mode).
    meta_tokens: u64,
    budgets: SchemaBudgets,
    ranker: Box<dyn Ranker>,
}

impl std::fmt::Debug for Catalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Catalog")
            .field("search", &self.search)
            .field("tools", &self.tools.len())
            .finish()
    }
}

/// What the builder hands the catalog.
pub(crate) struct CatalogInputs {
    pub config: CatalogConfig,
    /// Registered but never found, listed or loaded (e.g. quarantined tools).
    pub unlisted: BTreeSet<String>,
    pub titles: BTreeMap<String, String>,
    pub ranker: Option<RankerFactory>,
}

impl Catalog {
    /// Decides the mode, registers the meta-tools in search mode, and indexes the registry.
    pub(crate) fn build(registry: &mut Registry, inputs: CatalogInputs) -> Self {
        let indexed = |t: &Arc<RegisteredTool>| !inputs.unlisted.contains(&t.spec.name);
        let (mut search, mut reason) = match inputs.config.mode {
            CatalogMode::Full => (false, "catalog.mode = \"full\"".to_string()),
            CatalogMode::Search => (true, "catalog.mode = \"search\"".to_string()),
            CatalogMode::Auto => auto_mode(registry, &indexed, &inputs.config),
        };
        if search && let Err(e) = meta::register(registry) {
            search = false;
            reason = format!("full listing: the meta-tools could not be registered: {e}");
        }
        let tools: Vec<Arc<RegisteredTool>> = registry
            .iter()
            .filter(|t| indexed(t) && !meta::is_meta(&t.spec.name))
            .cloned()
            .collect();
        let docs: Vec<ToolDocument> = tools
            .iter()
            .map(|t| document_of(&t.spec, inputs.titles.get(&t.spec.name).map(String::as_str)))
            .collect();
        let ranker = match &inputs.ranker {
            Some(factory) => factory(&docs),
            None => Box::new(Bm25Index::build(&docs)),
        };
        let positions = tools
            .iter()
            .enumerate()
            .map(|(i, t)| (t.spec.name.clone(), i))
            .collect();
        let mut pinned = inputs.config.pinned;
        pinned.truncate(PINNED_TOOLS_MAX);
        let tokens = tools.iter().map(|t| schema_tokens(&t.spec)).collect();
        let meta_tokens = meta::NAMES
            .iter()
            .filter_map(|n| registry.get(n))
            .map(|t| schema_tokens(&t.spec))
            .sum();
        Self {
            search,
            reason,
            pinned,
            tools,
            positions,
            tokens,
            meta_tokens,
            budgets: inputs.config.budgets,
            ranker,
        }
    }

    /// The mode in force: [`CatalogMode::Full`] or [`CatalogMode::Search`].
    pub fn mode(&self) -> CatalogMode {
        if self.search {
            CatalogMode::Search
        } else {
            CatalogMode::Full
        }
    }

    /// Why the mode is what it is (for `auto`, the size and token figures it was decided on).
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// Tools in the index (the meta-tools and unlisted tools are not).
    pub fn len(&self) -> usize {
        self.tools.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// The indexed tool called `name`.
    pub fn spec(&self, name: &str) -> Option<&ToolSpec> {
        self.positions.get(name).map(|&i| &self.tools[i].spec)
    }

    /// Every indexed tool `visible` allows, by name.
    pub fn visible_tools<'a>(
        &'a self,
        visible: impl Fn(&ToolSpec) -> bool + 'a,
    ) -> impl Iterator<Item = &'a ToolSpec> + 'a {
        self.tools
            .iter()
            .map(|t| &t.spec)
            .filter(move |s| visible(s))
    }

    /// Up to `limit` tools for `query` that `visible` allows, best first (ties by name).
    pub fn search(
        &self,
        query: &str,
        limit: usize,
        visible: impl Fn(&ToolSpec) -> bool,
    ) -> Vec<SearchHit> {
        let mut ranked: Vec<(usize, f64)> = self
            .ranker
            .rank(query)
            .into_iter()
            .filter(|(i, score)| *i < self.tools.len() && score.is_finite() && *score > 0.0)
            .collect();
        ranked.sort_by(|a, b| {
            b.1.total_cmp(&a.1)
                .then_with(|| self.tools[a.0].spec.name.cmp(&self.tools[b.0].spec.name))
        });
        ranked
            .into_iter()
            .filter(|(i, _)| visible(&self.tools[*i].spec))
            .take(limit)
            .map(|(i, score)| {
                let spec = &self.tools[i].spec;
                SearchHit {
                    name: spec.name.clone(),
                    description: summary(&spec.description),
                    score: (score * 1000.0).round() / 1000.0,
                }
            })
            .collect()
    }

    /// What a session lists, in a stable order. Full mode: every visible indexed tool by name.
    /// Search mode: the pinned core in configured order, the meta-tools, then `loaded` in load
    /// order — each only when it exists and `visible` allows it.
    pub fn listing<'a>(
        &'a self,
        registry: &'a Registry,
        loaded: &[String],
        visible: impl Fn(&ToolSpec) -> bool,
    ) -> Vec<&'a ToolSpec> {
        if !self.search {
            return self
                .tools
                .iter()
                .map(|t| &t.spec)
                .filter(|s| visible(s))
                .collect();
        }
        let mut seen = BTreeSet::new();
        let indexed = self.pinned.iter().filter_map(|n| self.spec(n));
        let meta = meta::NAMES
            .iter()
            .filter_map(|n| registry.get(n).map(|t| &t.spec));
        let loaded = loaded.iter().filter_map(|n| self.spec(n));
        indexed
            .chain(meta)
            .chain(loaded)
            .filter(|s| seen.insert(s.name.as_str()) && visible(s))
            .collect()
    }

    /// Adds the visible indexed tools among `names` to `loaded` and returns their specs. A tool
    /// that would take the listing over [`SchemaBudgets::listing_tokens_max`] is refused. A
    /// shared set that cannot be reached refuses the whole load.
    pub async fn load(
        self: &Arc<Self>,
        names: &[String],
        loaded: &LoadedTools,
        visible: VisibleFn,
    ) -> Result<LoadOutcome, LoadedUnavailable> {
        /// What one asked name is, before the set is asked.
        enum Asked {
            NotFound,
            Pinned(usize),
            Adding(usize),
        }
        let mut seen = BTreeSet::new();
        let mut asked = Vec::new();
        let mut adding = Vec::new();
        for name in names.iter().take(LOAD_NAMES_MAX) {
            if !seen.insert(name.as_str()) {
                continue;
            }
            let found = self
                .positions
                .get(name)
                .copied()
                .filter(|&i| visible(&self.tools[i].spec));
            let what = match found {
                None => Asked::NotFound,
                Some(i) if self.pinned.iter().any(|p| p == name) => Asked::Pinned(i),
                Some(i) => {
                    adding.push(name.clone());
                    Asked::Adding(i)
                }
            };
            asked.push((name, what));
        }
        let mut answers = if adding.is_empty() {
            Vec::new()
        } else {
            loaded.add(&adding, self.fits(visible)).await?
        }
        .into_iter();
        let mut out = LoadOutcome::default();
        for (name, what) in asked {
            let position = match what {
                Asked::NotFound => {
                    out.not_found.push(name.clone());
                    continue;
                }
                Asked::Pinned(i) => i,
                Asked::Adding(i) => match answers.next() {
                    Some(LoadedAdded::Added | LoadedAdded::Present) => i,
                    Some(LoadedAdded::OverLimit) => {
                        out.over_limit.push(name.clone());
                        continue;
                    }
                    Some(LoadedAdded::OverBudget) | None => {
                        out.over_budget.push(name.clone());
                        continue;
                    }
                },
            };
            out.loaded.push(self.tools[position].spec.clone());
        }
        Ok(out)
    }

    /// Whether one more tool fits a listing that holds `held` loaded tools: the budget a load
    /// is decided on, under the set's lock.
    fn fits(self: &Arc<Self>, visible: VisibleFn) -> LoadedFits {
        let catalog = self.clone();
        Box::new(move |held, name| {
            let Some(&position) = catalog.positions.get(name) else {
                return false;
            };
            catalog.search_listing_tokens(held, |s| visible(s)) + catalog.tokens[position]
                <= catalog.budgets.listing_tokens_max
        })
    }

    /// Schema tokens of search mode's listing with `loaded`: the visible pinned core, the
    /// meta-tools and the visible loaded tools (each once).
    pub fn search_listing_tokens(
        &self,
        loaded: &[String],
        visible: impl Fn(&ToolSpec) -> bool,
    ) -> u64 {
        let mut seen = BTreeSet::new();
        let indexed: u64 = self
            .pinned
            .iter()
            .chain(loaded)
            .filter(|n| seen.insert(n.as_str()))
            .filter_map(|n| self.positions.get(n))
            .filter(|&&i| visible(&self.tools[i].spec))
            .map(|&i| self.tokens[i])
            .sum();
        indexed + self.meta_tokens
    }

    /// The schema tokens of the indexed tool called `name`.
    pub fn tool_tokens(&self, name: &str) -> Option<u64> {
        self.positions.get(name).map(|&i| self.tokens[i])
    }

    /// The budgets the catalog was built with.
    pub fn budgets(&self) -> SchemaBudgets {
        self.budgets
    }

    /// What is over budget, one line each: every tool over
    /// [`SchemaBudgets::tool_tokens_max`], and in full mode the whole catalog over
    /// [`SchemaBudgets::listing_tokens_max`] (a session sees at most that, fewer under its
    /// grants). Hosts print these when the kernel is built; `ring0 tools --lint` reports them
    /// as errors.
    pub fn over_budget(&self) -> Vec<String> {
        let budgets = &self.budgets;
        let mut out: Vec<String> = self
            .tools
            .iter()
            .zip(&self.tokens)
            .filter(|(_, tokens)| **tokens > budgets.tool_tokens_max)
            .map(|(t, tokens)| {
                format!(
                    "tool {} costs {tokens} schema tokens, over catalog.tool_tokens_max {}",
                    t.spec.name, budgets.tool_tokens_max
                )
            })
            .collect();
        let total: u64 = self.tokens.iter().sum();
        if !self.search && total > budgets.listing_tokens_max {
            out.push(format!(
                "the full listing costs up to {total} schema tokens, over \
                 catalog.listing_tokens_max {}: consider catalog.mode = \"search\" or \"auto\"",
                budgets.listing_tokens_max
            ));
        }
        out
    }

    /// Schema tokens of a listing (see [`schema_tokens`]).
    pub fn listing_tokens(listing: &[&ToolSpec]) -> u64 {
        listing.iter().map(|s| schema_tokens(s)).sum()
    }
}

/// `auto`: search above the size or token budget. Tokens are counted only when the size alone
/// does not decide.
fn auto_mode(
    registry: &Registry,
    indexed: &impl Fn(&Arc<RegisteredTool>) -> bool,
    config: &CatalogConfig,
) -> (bool, String) {
    let tools: Vec<&Arc<RegisteredTool>> = registry.iter().filter(|t| indexed(t)).collect();
    if tools.len() > config.auto_tools_max {
        return (
            true,
            format!(
                "catalog.mode = \"auto\": {} tools > auto_tools_max {}",
                tools.len(),
                config.auto_tools_max
            ),
        );
    }
    let tokens: u64 = tools.iter().map(|t| schema_tokens(&t.spec)).sum();
    let search = tokens > config.auto_tokens_max;
    let relation = if search { ">" } else { "<=" };
    (
        search,
        format!(
            "catalog.mode = \"auto\": {} tools, {tokens} schema tokens {relation} auto_tokens_max {}",
            tools.len(),
            config.auto_tokens_max
        ),
    )
}

impl crate::Session {
    fn visible_here(&self) -> impl Fn(&ToolSpec) -> bool + '_ {
        move |spec| self.authorizer.visible(&self.info, spec)
    }

    /// [`Self::visible_here`], owned.
    fn visible_owned(&self) -> VisibleFn {
        let authorizer = self.authorizer.clone();
        let info = self.info.clone();
        Arc::new(move |spec| authorizer.visible(&info, spec))
    }

    /// What this session lists, in a stable order (see [`Catalog::listing`]): in search mode
    /// the pinned core, the meta-tools and the tools it loaded (a shared set's as last
    /// refreshed, [`LoadedTools::refresh`]); otherwise every tool it may see.
    pub fn listing(&self) -> Vec<&ToolSpec> {
        let loaded = self.config.loaded_tools.names();
        self.kernel
            .catalog
            .listing(&self.kernel.registry, &loaded, self.visible_here())
    }

    /// The tools this session may see that best match `query` (what [`SEARCH_TOOL`] answers).
    pub fn search_tools(&self, query: &str, limit: usize) -> Vec<SearchHit> {
        self.kernel
            .catalog
            .search(query, limit.clamp(1, SEARCH_LIMIT_MAX), self.visible_here())
    }

    /// Loads tools by name into this session's listing (what [`LOAD_TOOL`] does).
    pub async fn load_tools(&self, names: &[String]) -> Result<LoadOutcome, LoadedUnavailable> {
        self.kernel
            .catalog
            .load(names, &self.config.loaded_tools, self.visible_owned())
            .await
    }

    /// The tools this session (and every session sharing its set) loaded.
    pub fn loaded_tools(&self) -> &Arc<LoadedTools> {
        &self.config.loaded_tools
    }

    /// The round's extensions, with what the meta-tools need of this session in search mode.
    pub(crate) fn call_extensions(
        &self,
        options: &crate::RoundOptions,
    ) -> crate::tool::CallExtensions {
        let mut extensions = options.extensions.clone();
        if self.kernel.catalog.mode() == CatalogMode::Search {
            extensions.insert(CatalogCall {
                catalog: self.kernel.catalog.clone(),
                loaded: self.config.loaded_tools.clone(),
                visible: self.visible_owned(),
            });
        }
        extensions
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn loaded_sets_share_a_scope_keep_scopes_apart_and_stay_bounded() {
        let sets = LoadedSets::new();
        let first = sets.get("alice", "conv-1");
        first
            .add(&["wx__forecast".into()], Box::new(|_, _| true))
            .await
            .unwrap();
        assert_eq!(sets.get("alice", "conv-1").names(), ["wx__forecast"]);
        assert!(sets.get("alice", "conv-2").names().is_empty());
        assert!(
            sets.get("bob", "conv-1").names().is_empty(),
            "never across principals"
        );
        for n in 0..LOADED_SETS_MAX + 10 {
            sets.get("carol", &format!("scope-{n}"));
        }
        assert_eq!(sets.len(), LOADED_SETS_MAX);
        assert!(
            sets.get("carol", &format!("scope-{}", LOADED_SETS_MAX + 9))
                .names()
                .is_empty()
        );
    }
}
