//! Catalog search on thousands of real tools: is the right tool found, what does search mode
//! save, and how long does a query take.
//!
//! `cargo bench -p ring0-kernel --bench catalog`
//!
//! The catalog is every distinct tool definition of the BFCL corpus (`shared/data/bfcl`, or
//! `RING0_BFCL_DIR`; the first definition of each name wins), registered with the kernel in
//! search mode. Each query is a BFCL question (its user messages), and its targets are the
//! functions its ground truth calls; a question with several is counted once per target.
//! The built-in tools and the MCP peers' tools are not in it (they live in crates above the
//! kernel): a few dozen more beside the corpus's 919 distinct definitions.
//! Printed:
//! - recall@1, @5, @10 and MRR (over the first [`RANKS_MAX`] results) of
//!   `Session::search_tools`, grants applied as in a real session;
//! - schema tokens (o200k) per turn: the full listing against search mode's listing (the
//!   meta-tools, plus the target once loaded), as a ratio;
//! - query latency p50 / p99 over [`LATENCY_ROUNDS`] passes of every query, after a warm-up pass;
//! - what `ring0 tools --lint` finds in the corpus (findings per rule) and how long it takes.
//!
//! `RING0_CATALOG_MISSES=N` prints the first N queries whose target is not in the first five.
//!
//! The targets: recall@5 ≥ 0.95, ≥ 95 % fewer schema tokens per turn, p99 ≤ 1 ms.

use ring0_core::{Authority, Observation, ToolSpec};
use ring0_kernel::catalog::lint::{LintRule, lint};
use ring0_kernel::catalog::{
    Catalog, CatalogConfig, CatalogMode, LOAD_TOOL, SEARCH_TOOL, SchemaBudgets,
};
use ring0_kernel::{GrantTable, Kernel, SessionConfig, tool_fn};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// Lets a checkout keep the corpus elsewhere.
const BFCL_DIR_ENV: &str = "RING0_BFCL_DIR";
const CATEGORIES: &[&str] = &[
    "simple_python",
    "simple_java",
    "simple_javascript",
    "multiple",
    "parallel",
    "parallel_multiple",
];
/// Results asked for per query; a target ranked below this counts 0 in the MRR.
const RANKS_MAX: usize = 50;
/// Prints this many queries whose target is not in the first five, to see why.
const MISSES_ENV: &str = "RING0_CATALOG_MISSES";
/// Prints this many lint findings, to see what the rules find.
const LINT_SHOWN_ENV: &str = "RING0_CATALOG_LINT_SHOWN";
/// Timed passes over every query.
const LATENCY_ROUNDS: usize = 5;

struct Query {
    text: String,
    targets: Vec<String>,
}

fn bfcl_dir() -> PathBuf {
    std::env::var_os(BFCL_DIR_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/bfcl")
        })
}

fn lines(path: PathBuf) -> Option<Vec<Value>> {
    let text = std::fs::read_to_string(path).ok()?;
    Some(
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect(),
    )
}

/// Every distinct definition and every (question, targets) of the corpus.
fn corpus() -> Option<(Vec<Value>, Vec<Query>)> {
    let dir = bfcl_dir();
    let mut seen = BTreeSet::new();
    let mut definitions = Vec::new();
    let mut queries = Vec::new();
    for category in CATEGORIES {
        let cases = lines(dir.join(format!("BFCL_v4_{category}.json")))?;
        let answers = lines(dir.join(format!("possible_answer/BFCL_v4_{category}.json")))?;
        for (case, answer) in cases.iter().zip(&answers) {
            for f in case["function"].as_array().into_iter().flatten() {
                if let Some(name) = f["name"].as_str()
                    && seen.insert(name.to_string())
                {
                    definitions.push(f.clone());
                }
            }
            let text: Vec<&str> = case["question"][0]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|m| m["role"] == "user")
                .filter_map(|m| m["content"].as_str())
                .collect();
            let targets: BTreeSet<String> = answer["ground_truth"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|call| call.as_object()?.keys().next().cloned())
                .collect();
            queries.push(Query {
                text: text.join(" "),
                targets: targets.into_iter().collect(),
            });
        }
    }
    Some((definitions, queries))
}

fn main() {
    let Some((definitions, queries)) = corpus() else {
        println!(
            "skipped: the BFCL corpus is not in {} (set {BFCL_DIR_ENV})",
            bfcl_dir().display()
        );
        return;
    };
    let mut builder = Kernel::builder();
    let mut refused = 0;
    for f in &definitions {
        let spec = ToolSpec::read(
            f["name"].as_str().unwrap_or_default(),
            f["description"].as_str().unwrap_or_default(),
            f["parameters"].clone(),
        );
        let tool = tool_fn(|_ctx, args: Value| async move { Ok(Observation::json(args)) });
        builder = match builder.tool(spec, tool) {
            Ok(b) => b,
            Err(e) => {
                refused += 1;
                e.into_builder()
            }
        };
    }
    let started = Instant::now();
    let kernel = builder
        .catalog(CatalogConfig {
            mode: CatalogMode::Search,
            ..CatalogConfig::default()
        })
        .authorizer(Arc::new(GrantTable::allow(&["*"], Authority::A0)))
        .build();
    let build_ms = started.elapsed().as_secs_f64() * 1e3;
    let session = kernel.open_session(SessionConfig::new("bench"));
    let catalog = kernel.catalog();
    println!(
        "catalog: {} tools indexed ({} definitions, {refused} refused at registration), built in {build_ms:.1} ms",
        catalog.len(),
        definitions.len()
    );

    // Recall and MRR.
    let misses_shown: usize = std::env::var(MISSES_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut misses = 0;
    let (mut pairs, mut at1, mut at5, mut at10, mut rr) = (0usize, 0usize, 0, 0, 0.0);
    for q in &queries {
        let hits = session.search_tools(&q.text, RANKS_MAX);
        for target in &q.targets {
            if catalog.spec(target).is_none() {
                continue;
            }
            pairs += 1;
            let rank = hits.iter().position(|h| &h.name == target);
            if let Some(rank) = rank {
                at1 += usize::from(rank < 1);
                at5 += usize::from(rank < 5);
                at10 += usize::from(rank < 10);
                rr += 1.0 / (rank + 1) as f64;
            }
            if rank.is_none_or(|r| r >= 5) && misses < misses_shown {
                misses += 1;
                let top: Vec<&str> = hits.iter().take(5).map(|h| h.name.as_str()).collect();
                println!("miss: {target} at {rank:?} for {:?}; top {top:?}", q.text);
            }
        }
    }
    let share = |n: usize| n as f64 / pairs.max(1) as f64;
    println!(
        "search over {pairs} (question, target) pairs: recall@1 {:.3}  recall@5 {:.3}  recall@10 {:.3}  MRR {:.3}",
        share(at1),
        share(at5),
        share(at10),
        rr / pairs.max(1) as f64
    );

    // Schema tokens per turn.
    let full: Vec<&ToolSpec> = (0..1)
        .flat_map(|_| {
            kernel
                .registry()
                .iter()
                .map(|t| &t.spec)
                .filter(|s| s.name != SEARCH_TOOL && s.name != LOAD_TOOL)
        })
        .collect();
    let full_tokens = Catalog::listing_tokens(&full);
    let core_tokens = Catalog::listing_tokens(&session.listing());
    let (mut loaded_tokens, mut turns) = (0u64, 0u64);
    for q in &queries {
        let targets: Vec<&ToolSpec> = q.targets.iter().filter_map(|t| catalog.spec(t)).collect();
        loaded_tokens += Catalog::listing_tokens(&targets);
        turns += 1;
    }
    let search_tokens = core_tokens as f64 + loaded_tokens as f64 / turns.max(1) as f64;
    println!(
        "schema tokens per turn: full listing {full_tokens}; search mode {search_tokens:.0} \
         (meta-tools {core_tokens} + the loaded targets); {:.2} % fewer",
        100.0 * (1.0 - search_tokens / full_tokens.max(1) as f64)
    );

    lint_summary(&full, full_tokens);

    // Latency.
    for q in &queries {
        std::hint::black_box(session.search_tools(&q.text, 10));
    }
    let mut samples = Vec::with_capacity(queries.len() * LATENCY_ROUNDS);
    for _ in 0..LATENCY_ROUNDS {
        for q in &queries {
            let start = Instant::now();
            std::hint::black_box(session.search_tools(&q.text, 10));
            samples.push(start.elapsed());
        }
    }
    samples.sort();
    let pick = |p: f64| samples[((samples.len() - 1) as f64 * p) as usize].as_secs_f64() * 1e6;
    println!(
        "query latency over {} searches (limit 10): p50 {:.1} µs  p99 {:.1} µs  max {:.1} µs",
        samples.len(),
        pick(0.50),
        pick(0.99),
        pick(1.0)
    );
}

/// The lint of the whole corpus, as `ring0 tools --lint` would report it: findings per rule.
fn lint_summary(tools: &[&ToolSpec], listing_tokens: u64) {
    let started = Instant::now();
    let report = lint(tools, listing_tokens, &SchemaBudgets::default());
    let lint_ms = started.elapsed().as_secs_f64() * 1e3;
    let counts: Vec<String> = LintRule::ALL
        .iter()
        .map(|rule| {
            let n = report.findings.iter().filter(|f| f.rule == *rule).count();
            format!("{} {n}", rule.name())
        })
        .collect();
    println!(
        "lint of {} tools in {lint_ms:.0} ms: {} errors, {} warnings ({}; {} omitted)",
        tools.len(),
        report.errors(),
        report.warnings(),
        counts.join(", "),
        report.omitted
    );
    let shown: usize = std::env::var(LINT_SHOWN_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    for f in report.findings.iter().take(shown) {
        println!(
            "lint: {} [{}] {} {}",
            f.tool,
            f.rule.name(),
            f.location,
            f.message
        );
    }
}
