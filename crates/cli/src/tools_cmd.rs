//! `ring0 tools [--json] [--lint]`: the catalog a configuration resolves to, as `ring0 serve`
//! would serve it.
//!
//! The built-in tools and every configured upstream's are gathered the way `serve` does it:
//! each upstream is started and listed (in its sandbox, all at once, each within its
//! `start_timeout_ms`), its definitions checked against `ring0.lock` (a new upstream's are
//! trusted on first use and recorded there, as at `serve`; a changed one is quarantined) and
//! the kernel's catalog built from them. Nothing else is touched: no journal (an in-memory one
//! stands in), no audit log, no call is made. Per tool it prints what the kernel holds of it —
//! source, effect, authority, settlement, strategy traits, observation budget, whether it is in
//! the pinned core, its pin state, whether principal `local` sees it (and why not), and its
//! o200k schema tokens — then the totals of each listing and what is over budget.
//!
//! `--lint` adds the catalog's lint (`ring0_kernel::catalog::lint`, the rules in
//! `docs/catalog.md`). Exit codes: 0; 1 when the catalog could not be resolved, or an upstream
//! did not start within its bound (the report is printed, but it is incomplete); 3 with
//! `--lint` when a finding is at error level ([`EXIT_LINT_ERRORS`]).

use clap::Args;
use ring0_config::Config;
use ring0_kernel::catalog::lint::{LintReport, lint};
use ring0_kernel::catalog::{LOAD_TOOL, SEARCH_TOOL, SchemaBudgets};
use ring0_mcp::gateway::Generation;
use ring0_mcp::{Gateway, GatewayOptions, Log};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The exit code of `ring0 tools --lint` when a finding is at error level.
pub const EXIT_LINT_ERRORS: u8 = 3;
/// The exit code when the catalog is incomplete (an upstream did not start).
const EXIT_INCOMPLETE: u8 = 1;

#[derive(Args)]
pub struct ToolsArgs {
    /// The TOML config (default: ./ring0.toml if present, else the embedded defaults).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// Lint the definitions too; exit 3 when a finding is at error level.
    #[arg(long)]
    lint: bool,
}

/// What the command prints, and its exit code.
pub struct ToolsOutcome {
    pub output: String,
    pub code: u8,
}

/// One tool as the kernel holds it.
#[derive(Serialize)]
struct ToolRow {
    name: String,
    /// `built-in`, `upstream:ALIAS` or `catalog` (the meta-tools).
    source: String,
    effect: serde_json::Value,
    authority: String,
    settlement: serde_json::Value,
    strategy: serde_json::Value,
    concurrency: serde_json::Value,
    timeout_ms: u64,
    observation_budget_bytes: usize,
    /// In the pinned core (listed first in search mode).
    core: bool,
    /// `-` for ring0's own tools; `trusted` or `quarantined: WHY` for an upstream's.
    pin: String,
    /// Principal `local` sees it (it is listed, or found by search).
    listed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    hidden_because: Option<String>,
    tokens: u64,
}

/// How many tools a listing holds and what their schemas cost.
#[derive(Serialize, Default)]
struct ListingCost {
    tools: usize,
    tokens: u64,
}

#[derive(Serialize)]
struct Budgets {
    tool_tokens_max: u64,
    listing_tokens_max: u64,
}

#[derive(Serialize)]
struct Report {
    mode: ring0_kernel::catalog::CatalogMode,
    reason: String,
    budgets: Budgets,
    tools: Vec<ToolRow>,
    /// `full`: every tool `local` sees; `sent`: what a session of `local` is sent up front in
    /// the mode in force; then one entry per source.
    listings: BTreeMap<String, ListingCost>,
    over_budget: Vec<String>,
    upstreams_down: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lint: Option<LintReport>,
}

pub fn run(args: ToolsArgs, state_dir: Option<&Path>) -> Result<ToolsOutcome, String> {
    let cwd = std::env::current_dir().map_err(|e| format!("current directory: {e}"))?;
    let loaded =
        Config::load(args.config.as_deref(), &cwd, state_dir).map_err(|e| e.to_string())?;
    let checked = ring0_config::check(&loaded).map_err(|e| e.to_string())?;
    let policy = Arc::new(checked.policy);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("starting the runtime: {e}"))?;
    let (generation, down) = runtime.block_on(resolve(&loaded, checked.tools, policy.clone()))?;
    let budgets = loaded.config.catalog.kernel_config().budgets;
    let mut report = report(&generation, &policy, budgets, down);
    if args.lint {
        let specs: Vec<&ring0_core::ToolSpec> = generation
            .kernel
            .registry()
            .iter()
            .map(|t| &t.spec)
            .collect();
        report.lint = Some(lint(&specs, report.listings["sent"].tokens, &budgets));
    }
    // The upstreams' processes end with the runtime, before anything is printed.
    drop(generation);
    drop(runtime);
    let code = if !report.upstreams_down.is_empty() {
        EXIT_INCOMPLETE
    } else if report.lint.as_ref().is_some_and(|l| l.errors() > 0) {
        EXIT_LINT_ERRORS
    } else {
        0
    };
    let output = if args.json {
        let mut text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        text.push('\n');
        text
    } else {
        render(&report)
    };
    Ok(ToolsOutcome { output, code })
}

/// Starts the upstreams as `serve` does and returns the catalog with every one that came up,
/// and the aliases of those that did not within their bound.
async fn resolve(
    loaded: &ring0_config::Loaded,
    builtins: Vec<(ring0_core::ToolSpec, Arc<dyn ring0_kernel::Tool>)>,
    policy: Arc<ring0_policy::Policy>,
) -> Result<(Arc<Generation>, Vec<String>), String> {
    // Egress decisions of an upstream's start are enforced as at `serve`; they are kept in
    // memory, not in the audit log, which belongs to the running server alone.
    let audit: Arc<dyn ring0_policy::AuditSink> = Arc::new(ring0_policy::MemoryAudit::new());
    let paths = &loaded.config.paths;
    let protected = loaded.protected();
    let gw = Gateway::start(GatewayOptions {
        audit: None,
        builtins,
        upstreams: loaded.config.upstreams.clone(),
        journal: Arc::new(ring0_journal::MemoryJournal::new()),
        authorizer: policy,
        workspace: loaded.workspace.clone(),
        state_dir: loaded.state_dir.clone(),
        spill: None,
        log: Log::stderr(),
        max_concurrent_tools: 1,
        granted_roots: paths.read.iter().chain(&paths.write).cloned().collect(),
        protected_paths: protected.files.into_iter().chain(protected.dirs).collect(),
        session_end: None,
        catalog: loaded.config.catalog.kernel_config(),
        upstream_sandboxes: ring0_config::sandbox::upstream_sandboxes(loaded, audit)
            .map_err(|e| e.to_string())?,
        observer: None,
    })?;
    let down = gw.wait_for_start().await;
    let generation = crate::serve_cmd::settled_generation(&gw).await;
    Ok((generation, down))
}

fn source_of(generation: &Generation, name: &str) -> String {
    if name == SEARCH_TOOL || name == LOAD_TOOL {
        return "catalog".into();
    }
    match generation
        .tools
        .get(name)
        .and_then(|t| t.upstream.as_deref())
    {
        Some(alias) => format!("upstream:{alias}"),
        None => "built-in".into(),
    }
}

fn json_of(value: impl Serialize) -> serde_json::Value {
    serde_json::to_value(value).unwrap_or(serde_json::Value::Null)
}

fn report(
    generation: &Generation,
    policy: &ring0_policy::Policy,
    budgets: SchemaBudgets,
    upstreams_down: Vec<String>,
) -> Report {
    let kernel = &generation.kernel;
    let catalog = kernel.catalog();
    let local = ring0_core::Principal::local();
    let session = kernel.open_session(
        ring0_kernel::SessionConfig::new("tools").authorizer(generation.gate.clone()),
    );
    let quarantined = |name: &str| generation.quarantined.contains_key(name);
    let sent: Vec<&ring0_core::ToolSpec> = session
        .listing()
        .into_iter()
        .filter(|s| !quarantined(&s.name))
        .collect();
    let search = catalog.mode() == ring0_kernel::catalog::CatalogMode::Search;
    let mut tools: Vec<ToolRow> = kernel
        .registry()
        .iter()
        .map(|registered| {
            let spec = &registered.spec;
            let mut row = tool_row(generation, policy, spec, &local);
            // The pinned core: what search mode sends up front besides its meta-tools.
            row.core =
                search && row.source != "catalog" && sent.iter().any(|s| s.name == spec.name);
            row
        })
        .collect();
    tools.sort_by(|a, b| a.name.cmp(&b.name));
    let listings = listing_costs(&tools, &sent);
    Report {
        mode: catalog.mode(),
        reason: catalog.reason().to_string(),
        budgets: Budgets {
            tool_tokens_max: budgets.tool_tokens_max,
            listing_tokens_max: budgets.listing_tokens_max,
        },
        tools,
        listings,
        over_budget: catalog.over_budget(),
        upstreams_down,
        lint: None,
    }
}

fn tool_row(
    generation: &Generation,
    policy: &ring0_policy::Policy,
    spec: &ring0_core::ToolSpec,
    local: &ring0_core::Principal,
) -> ToolRow {
    let source = source_of(generation, &spec.name);
    let quarantined = generation.quarantined.get(&spec.name);
    let hidden_because = match quarantined {
        Some(_) => Some("quarantined until a person approves it".to_string()),
        None if source == "catalog" => None,
        None => policy.hidden_because(spec, local),
    };
    let pin = match quarantined {
        Some(why) => format!("quarantined: {why}"),
        None if source.starts_with("upstream:") => "trusted".into(),
        None => "-".into(),
    };
    ToolRow {
        name: spec.name.clone(),
        effect: json_of(spec.effect),
        authority: spec.authority.to_string(),
        settlement: json_of(spec.settlement),
        strategy: json_of(spec.strategy),
        concurrency: json_of(spec.concurrency),
        timeout_ms: spec.timeout_ms,
        observation_budget_bytes: spec.observation_budget_bytes,
        core: false,
        pin,
        listed: hidden_because.is_none(),
        hidden_because,
        tokens: ring0_kernel::catalog::schema_tokens(spec),
        source,
    }
}

/// The cost of the full listing, of what a session is sent, and of each source's listed tools.
fn listing_costs(
    tools: &[ToolRow],
    sent: &[&ring0_core::ToolSpec],
) -> BTreeMap<String, ListingCost> {
    let mut out: BTreeMap<String, ListingCost> = BTreeMap::new();
    for row in tools.iter().filter(|r| r.listed && r.source != "catalog") {
        for key in ["full".to_string(), row.source.clone()] {
            let cost = out.entry(key).or_default();
            cost.tools += 1;
            cost.tokens += row.tokens;
        }
    }
    out.entry("full".into()).or_default();
    out.insert(
        "sent".into(),
        ListingCost {
            tools: sent.len(),
            tokens: ring0_kernel::catalog::Catalog::listing_tokens(sent),
        },
    );
    out
}

fn render(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "catalog: {}", report.reason);
    let header = [
        "TOOL",
        "SOURCE",
        "EFFECT",
        "AUTH",
        "SETTLEMENT",
        "TRAITS",
        "BUDGET",
        "CORE",
        "LISTED",
        "TOKENS",
        "PIN",
    ];
    let rows: Vec<[String; 11]> = report.tools.iter().map(row_cells).collect();
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let padded: Vec<String> = cells
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        padded.join("  ").trim_end().to_string()
    };
    let _ = writeln!(out, "{}", line(&header.map(String::from)));
    for row in &rows {
        let _ = writeln!(out, "{}", line(row));
    }
    for row in report.tools.iter().filter(|r| !r.listed) {
        if let Some(why) = &row.hidden_because {
            let _ = writeln!(out, "not listed: {}: {why}", row.name);
        }
    }
    render_totals(&mut out, report);
    if let Some(lint) = &report.lint {
        render_lint(&mut out, lint);
    }
    out
}

fn row_cells(r: &ToolRow) -> [String; 11] {
    let word = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Array(items) if items.is_empty() => "unknown".into(),
        serde_json::Value::Array(items) => items
            .iter()
            .filter_map(|i| i.as_str())
            .collect::<Vec<_>>()
            .join(","),
        other => other.to_string(),
    };
    let yes = |b: bool| if b { "yes" } else { "no" }.to_string();
    [
        r.name.clone(),
        r.source.clone(),
        word(&r.effect),
        r.authority.clone(),
        word(&r.settlement),
        word(&r.strategy),
        format!("{} B", r.observation_budget_bytes),
        yes(r.core),
        yes(r.listed),
        r.tokens.to_string(),
        r.pin.clone(),
    ]
}

fn render_totals(out: &mut String, report: &Report) {
    let _ = writeln!(out, "\nlistings (o200k schema tokens):");
    for (name, cost) in &report.listings {
        let what = match name.as_str() {
            "full" => "every tool local sees".to_string(),
            "sent" => format!(
                "what a session is sent up front ({} mode)",
                json_of(report.mode).as_str().unwrap_or("?")
            ),
            source => format!("listed tools of {source}"),
        };
        let _ = writeln!(
            out,
            "  {name}: {} tools, {} tokens — {what}",
            cost.tools, cost.tokens
        );
    }
    let _ = writeln!(
        out,
        "budgets: catalog.tool_tokens_max {}, catalog.listing_tokens_max {}",
        report.budgets.tool_tokens_max, report.budgets.listing_tokens_max
    );
    for line in &report.over_budget {
        let _ = writeln!(out, "over budget: {line}");
    }
    for alias in &report.upstreams_down {
        let _ = writeln!(
            out,
            "incomplete: upstream {alias} did not start within its start_timeout_ms; its tools are missing"
        );
    }
}

fn render_lint(out: &mut String, lint: &LintReport) {
    let _ = writeln!(out, "\nlint:");
    for f in &lint.findings {
        let tool = if f.tool.is_empty() {
            "listing"
        } else {
            &f.tool
        };
        let _ = writeln!(
            out,
            "  {}: {} [{}] {}{}",
            match f.level {
                ring0_kernel::catalog::lint::LintLevel::Error => "error",
                ring0_kernel::catalog::lint::LintLevel::Warning => "warning",
            },
            tool,
            f.rule.name(),
            if f.location.is_empty() {
                String::new()
            } else {
                format!("{}: ", f.location)
            },
            f.message
        );
    }
    if lint.omitted > 0 {
        let _ = writeln!(out, "  … and {} more findings not shown", lint.omitted);
    }
    let _ = writeln!(
        out,
        "{} error(s), {} warning(s)",
        lint.errors(),
        lint.warnings()
    );
}
