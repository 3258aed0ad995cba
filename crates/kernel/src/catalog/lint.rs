//! The catalog's lint: what in a set of tool definitions will make a model choose or call a
//! tool badly, or cost more tokens than it should (`ring0 tools --lint`).
//!
//! A model sees a tool only through its definition: a tool without a description is picked by
//! its name alone, a parameter without one is filled by guessing, a bound or a choice that the
//! prose states but the schema does not is neither shown to the model in a form it reliably
//! follows nor checked when the call is prepared, and two tools that say the same thing split
//! the model's choices between them. Each [`LintRule`] finds one of these; the findings of a
//! whole catalog (built-ins, upstreams, host tools alike) come from [`lint`]. The schema
//! budgets ([`SchemaBudgets`]) are checked here too, so one report says everything.
//!
//! Levels: a finding is an [`LintLevel::Error`] when the catalog should not be served as it is
//! (a tool without a description, a definition or a listing over its budget), else a
//! [`LintLevel::Warning`]. Each rule's level is fixed ([`LintRule::level`]), so a report reads
//! the same everywhere.
//!
//! The heuristics read English prose with a few fixed phrases (`at most 100 characters`,
//! `between 1 and 10`, `one of 'a', 'b'`); they never look at a parameter's value, only at its
//! declaration, and everything they read is bounded ([`DESCRIPTION_BYTES_READ_MAX`],
//! [`PARAMETERS_PER_TOOL_MAX`], [`FINDINGS_MAX`]).

use super::{SchemaBudgets, bm25, schema_tokens};
use ring0_core::ToolSpec;
use serde::Serialize;
use serde_json::Value;
use std::collections::{BTreeSet, HashMap};

/// Findings kept in one report; the rest are counted in [`LintReport::omitted`].
pub const FINDINGS_MAX: usize = 10_000;
/// Parameters read per tool (nested ones included); the rest are not linted.
pub const PARAMETERS_PER_TOOL_MAX: usize = 256;
/// Bytes of one description the prose rules read.
pub const DESCRIPTION_BYTES_READ_MAX: usize = 4096;
/// How deep nested parameters are read.
const PARAMETER_DEPTH_MAX: usize = 4;
/// Two tools are near-duplicates when their descriptions share at least this share of their
/// terms (Jaccard) ...
pub const DUPLICATE_DESCRIPTION_SIMILARITY_MIN: f64 = 0.6;
/// ... and their names at least this share (Jaccard, alias prefixes `alias__` left out).
pub const DUPLICATE_NAME_SIMILARITY_MIN: f64 = 0.5;
/// Tools sharing a term more common than this are not compared through it: a term half the
/// catalog has says nothing about two tools being the same, and skipping it bounds the work.
const DUPLICATE_TERM_TOOLS_MAX: usize = 256;

/// How serious a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LintLevel {
    /// Worth fixing; the catalog can be served.
    Warning,
    /// The catalog should not be served as it is (`ring0 tools --lint` exits non-zero).
    Error,
}

/// What a finding is about. Each rule's name (`snake_case`) is what reports print.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LintRule {
    /// The tool has no description: a model picks it by its name alone.
    MissingDescription,
    /// A parameter has no description: a model fills it by guessing from its name.
    ParameterWithoutDescription,
    /// A string parameter whose description states a length (or whose name is a kind of text
    /// that always has one) declares no `maxLength`, `enum`, `pattern` or `format`.
    UnboundedString,
    /// A number parameter whose description states a range or limit (or whose name is a count
    /// or limit) declares no `minimum` / `maximum` for it.
    UnboundedNumber,
    /// A string parameter whose description lists the values it takes, with no `enum`.
    EnumAsProse,
    /// Two tools whose names and descriptions mostly overlap: the model's choice between them
    /// is a coin toss.
    NearDuplicate,
    /// A definition costs more schema tokens than [`SchemaBudgets::tool_tokens_max`].
    ToolOverBudget,
    /// What a session is sent up front costs more than [`SchemaBudgets::listing_tokens_max`].
    ListingOverBudget,
}

impl LintRule {
    /// Every rule, in report order.
    pub const ALL: [LintRule; 8] = [
        LintRule::MissingDescription,
        LintRule::ParameterWithoutDescription,
        LintRule::UnboundedString,
        LintRule::UnboundedNumber,
        LintRule::EnumAsProse,
        LintRule::NearDuplicate,
        LintRule::ToolOverBudget,
        LintRule::ListingOverBudget,
    ];

    /// The rule's fixed level.
    pub fn level(self) -> LintLevel {
        match self {
            LintRule::MissingDescription
            | LintRule::ToolOverBudget
            | LintRule::ListingOverBudget => LintLevel::Error,
            LintRule::ParameterWithoutDescription
            | LintRule::UnboundedString
            | LintRule::UnboundedNumber
            | LintRule::EnumAsProse
            | LintRule::NearDuplicate => LintLevel::Warning,
        }
    }

    /// The rule's name as reports print it.
    pub fn name(self) -> &'static str {
        match self {
            LintRule::MissingDescription => "missing_description",
            LintRule::ParameterWithoutDescription => "parameter_without_description",
            LintRule::UnboundedString => "unbounded_string",
            LintRule::UnboundedNumber => "unbounded_number",
            LintRule::EnumAsProse => "enum_as_prose",
            LintRule::NearDuplicate => "near_duplicate",
            LintRule::ToolOverBudget => "tool_over_budget",
            LintRule::ListingOverBudget => "listing_over_budget",
        }
    }
}

/// One thing the lint found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LintFinding {
    pub rule: LintRule,
    pub level: LintLevel,
    /// The tool (empty for a finding about the listing).
    pub tool: String,
    /// Where in the tool's input schema, as a JSON pointer (`/properties/path`); empty for the
    /// tool itself.
    pub location: String,
    /// What is wrong and what to do about it.
    pub message: String,
}

/// Everything the lint found in one catalog.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LintReport {
    /// In report order: by tool, then rule; listing findings last.
    pub findings: Vec<LintFinding>,
    /// Findings beyond [`FINDINGS_MAX`], counted and not kept.
    pub omitted: usize,
}

impl LintReport {
    /// Findings at [`LintLevel::Error`] (omitted ones are not counted: a report that omits
    /// any already holds [`FINDINGS_MAX`], and the caller says so).
    pub fn errors(&self) -> usize {
        self.count(LintLevel::Error)
    }

    /// Findings at [`LintLevel::Warning`].
    pub fn warnings(&self) -> usize {
        self.count(LintLevel::Warning)
    }

    fn count(&self, level: LintLevel) -> usize {
        self.findings.iter().filter(|f| f.level == level).count()
    }

    fn push(&mut self, rule: LintRule, tool: &str, location: String, message: String) {
        if self.findings.len() >= FINDINGS_MAX {
            self.omitted += 1;
            return;
        }
        self.findings.push(LintFinding {
            rule,
            level: rule.level(),
            tool: tool.to_string(),
            location,
            message,
        });
    }
}

/// Lints `tools` (every definition a catalog holds) against `budgets`; `listing_tokens` is what
/// a session is sent up front (the full listing, or search mode's core and meta-tools).
pub fn lint(tools: &[&ToolSpec], listing_tokens: u64, budgets: &SchemaBudgets) -> LintReport {
    let mut report = LintReport::default();
    for spec in tools {
        lint_tool(spec, budgets, &mut report);
    }
    near_duplicates(tools, &mut report);
    if listing_tokens > budgets.listing_tokens_max {
        report.push(
            LintRule::ListingOverBudget,
            "",
            String::new(),
            format!(
                "a session is sent {listing_tokens} schema tokens up front, over \
                 catalog.listing_tokens_max {}: use catalog.mode = \"search\" (or \"auto\"), \
                 pin fewer tools, or grant fewer",
                budgets.listing_tokens_max
            ),
        );
    }
    report.findings.sort_by(|a, b| {
        (a.tool.is_empty(), &a.tool, a.rule, &a.location).cmp(&(
            b.tool.is_empty(),
            &b.tool,
            b.rule,
            &b.location,
        ))
    });
    report
}

fn lint_tool(spec: &ToolSpec, budgets: &SchemaBudgets, report: &mut LintReport) {
    if spec.description.trim().is_empty() {
        report.push(
            LintRule::MissingDescription,
            &spec.name,
            String::new(),
            "the tool has no description: a model picks it by its name alone; say what it \
             does and when to use it"
                .into(),
        );
    }
    let tokens = schema_tokens(spec);
    if tokens > budgets.tool_tokens_max {
        report.push(
            LintRule::ToolOverBudget,
            &spec.name,
            String::new(),
            format!(
                "the definition costs {tokens} schema tokens, over catalog.tool_tokens_max {}: \
                 shorten its descriptions or split the tool",
                budgets.tool_tokens_max
            ),
        );
    }
    let mut parameters = Vec::new();
    collect(&spec.input_schema, String::new(), 0, &mut parameters);
    for (pointer, name, schema) in parameters.into_iter().take(PARAMETERS_PER_TOOL_MAX) {
        lint_parameter(&spec.name, &pointer, &name, schema, report);
    }
}

/// Every declared property under `schema` (nested objects and array items too), as (JSON
/// pointer, name, schema).
fn collect<'a>(
    schema: &'a Value,
    pointer: String,
    depth: usize,
    out: &mut Vec<(String, String, &'a Value)>,
) {
    if depth > PARAMETER_DEPTH_MAX || out.len() >= PARAMETERS_PER_TOOL_MAX {
        return;
    }
    if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
        for (name, property) in properties {
            let at = format!("{pointer}/properties/{}", escape_pointer(name));
            out.push((at.clone(), name.clone(), property));
            collect(property, at, depth + 1, out);
        }
    }
    if let Some(items) = schema.get("items").filter(|i| i.is_object()) {
        collect(items, format!("{pointer}/items"), depth + 1, out);
    }
}

fn escape_pointer(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
}

fn lint_parameter(tool: &str, pointer: &str, name: &str, schema: &Value, report: &mut LintReport) {
    let description = schema
        .get("description")
        .and_then(Value::as_str)
        .unwrap_or("");
    let description =
        ring0_core::text::truncate_utf8(description, DESCRIPTION_BYTES_READ_MAX).to_lowercase();
    if description.trim().is_empty() && !has_any(schema, &["const"]) {
        report.push(
            LintRule::ParameterWithoutDescription,
            tool,
            pointer.to_string(),
            format!("parameter {name:?} has no description: a model fills it by guessing"),
        );
    }
    if declares_type(schema, "string") {
        lint_string(tool, pointer, name, schema, &description, report);
    }
    if declares_type(schema, "integer") || declares_type(schema, "number") {
        lint_number(tool, pointer, name, schema, &description, report);
    }
}

fn declares_type(schema: &Value, wanted: &str) -> bool {
    match schema.get("type") {
        Some(Value::String(t)) => t == wanted,
        Some(Value::Array(types)) => types.iter().any(|t| t == wanted),
        _ => false,
    }
}

fn has_any(schema: &Value, keys: &[&str]) -> bool {
    keys.iter().any(|k| schema.get(k).is_some())
}

fn lint_string(
    tool: &str,
    pointer: &str,
    name: &str,
    schema: &Value,
    description: &str,
    report: &mut LintReport,
) {
    let constrained = has_any(schema, &["enum", "const"]);
    if !constrained && let Some(values) = prose_choices(description) {
        report.push(
            LintRule::EnumAsProse,
            tool,
            pointer.to_string(),
            format!(
                "parameter {name:?} lists its values in prose ({}): declare them as \"enum\"",
                values.join(", ")
            ),
        );
    }
    if constrained || has_any(schema, &["maxLength", "pattern", "format"]) {
        return;
    }
    if let Some(phrase) = stated_length(description) {
        report.push(
            LintRule::UnboundedString,
            tool,
            pointer.to_string(),
            format!(
                "parameter {name:?} says {phrase:?} but declares no \"maxLength\": the model is \
                 not held to it and the call is not checked"
            ),
        );
    }
}

fn lint_number(
    tool: &str,
    pointer: &str,
    name: &str,
    schema: &Value,
    description: &str,
    report: &mut LintReport,
) {
    if has_any(schema, &["enum", "const"]) {
        return;
    }
    let bounded_below = has_any(schema, &["minimum", "exclusiveMinimum"]);
    let bounded_above = has_any(schema, &["maximum", "exclusiveMaximum"]);
    let evidence = stated_range(description)
        .filter(|r| (r.below && !bounded_below) || (r.above && !bounded_above))
        .map(|r| format!("says {:?}", r.phrase))
        .or_else(|| {
            (is_count_name(name) && !bounded_above).then(|| "is a count or limit".to_string())
        });
    if let Some(evidence) = evidence {
        report.push(
            LintRule::UnboundedNumber,
            tool,
            pointer.to_string(),
            format!(
                "parameter {name:?} {evidence} but declares no \"minimum\"/\"maximum\" for it: \
                 any number passes"
            ),
        );
    }
}

/// Names of numbers that count or limit something: they always have a ceiling.
fn is_count_name(name: &str) -> bool {
    const COUNT_WORDS: &[&str] = &[
        "limit",
        "count",
        "page_size",
        "pagesize",
        "per_page",
        "perpage",
        "max_results",
        "maxresults",
        "top_k",
        "topk",
        "num_results",
        "numresults",
    ];
    let lower = name.to_lowercase();
    COUNT_WORDS
        .iter()
        .any(|w| lower == *w || lower.ends_with(&format!("_{w}")))
}

/// The words of `text`: runs of letters, digits and `.`/`-` inside numbers.
fn words(text: &str) -> Vec<&str> {
    text.split(|c: char| !(c.is_alphanumeric() || c == '.' || c == '-'))
        .map(|w| w.trim_matches(|c: char| c == '.' || c == '-'))
        .filter(|w| !w.is_empty())
        .collect()
}

fn is_number(word: &str) -> bool {
    word.parse::<f64>().is_ok_and(f64::is_finite)
}

/// A phrase stating a length (`at most 280 characters`), if the description has one.
fn stated_length(description: &str) -> Option<String> {
    const UNITS: &[&str] = &[
        "character",
        "characters",
        "chars",
        "char",
        "bytes",
        "letters",
        "words",
        "digits",
    ];
    let w = words(description);
    w.windows(2).enumerate().find_map(|(i, pair)| {
        let number_then_unit = is_number(pair[0]) && UNITS.contains(&pair[1]);
        number_then_unit.then(|| {
            let from = i.saturating_sub(2);
            w[from..=i + 1].join(" ")
        })
    })
}

/// A range or limit stated in prose, and which side it bounds.
struct StatedRange {
    phrase: String,
    below: bool,
    above: bool,
}

/// `between A and B`, `from A to B`, `A-B` (a range: both sides), `at most`/`up to`/`maximum`
/// `N` (above), `at least`/`minimum` `N`, `positive`, `non-negative` (below).
fn stated_range(description: &str) -> Option<StatedRange> {
    let w = words(description);
    let number = |i: usize| w.get(i).is_some_and(|x| is_number(x));
    let phrase = |from: usize, to: usize| w[from..to.min(w.len())].join(" ");
    for i in 0..w.len() {
        let both = match w[i] {
            "between" => number(i + 1) && w.get(i + 2) == Some(&"and") && number(i + 3),
            "from" => number(i + 1) && w.get(i + 2) == Some(&"to") && number(i + 3),
            _ => false,
        };
        if both {
            return Some(StatedRange {
                phrase: phrase(i, i + 4),
                below: true,
                above: true,
            });
        }
        let above = matches!(
            (w[i], w.get(i + 1).copied()),
            ("at", Some("most")) | ("up", Some("to")) | ("no", Some("more"))
        ) && (number(i + 2) || (w.get(i + 2) == Some(&"than") && number(i + 3)));
        let above = above || (matches!(w[i], "maximum" | "max") && number(i + 1));
        if above {
            return Some(StatedRange {
                phrase: phrase(i, i + 4),
                below: false,
                above: true,
            });
        }
        let below = (w[i] == "at" && w.get(i + 1) == Some(&"least") && number(i + 2))
            || (w[i] == "minimum" && number(i + 1))
            || matches!(w[i], "positive" | "non-negative" | "nonnegative");
        if below {
            return Some(StatedRange {
                phrase: phrase(i, i + 3),
                below: true,
                above: false,
            });
        }
    }
    None
}

/// The values a description lists for a string (`one of 'a', 'b'`, `either "x" or "y"`,
/// `options: a | b | c`): two or more quoted words after a phrase that introduces choices, or
/// three or more alternatives separated by `|`.
fn prose_choices(description: &str) -> Option<Vec<String>> {
    const INTRODUCERS: &[&str] = &[
        "one of",
        "either",
        "possible values",
        "allowed values",
        "valid values",
        "options are",
        "options:",
        "can be",
        "must be",
        "accepted values",
        "supported values",
    ];
    let start = INTRODUCERS.iter().filter_map(|p| description.find(p)).min();
    if let Some(start) = start {
        let quoted = quoted_words(&description[start..]);
        if quoted.len() >= 2 {
            return Some(quoted);
        }
    }
    piped_choices(description)
}

/// `json | text | xml`: the word before the first `|`, the words between, the word after the
/// last; `None` unless three or more single words.
fn piped_choices(description: &str) -> Option<Vec<String>> {
    let segments: Vec<&str> = description.split('|').collect();
    if segments.len() < 3 {
        return None;
    }
    let last = segments.len() - 1;
    let mut out = Vec::new();
    for (i, segment) in segments.iter().enumerate() {
        let word = match i {
            0 => segment.split_whitespace().last(),
            i if i == last => segment.split_whitespace().next(),
            _ => Some(segment.trim()).filter(|s| !s.contains(char::is_whitespace)),
        };
        match word.map(trim_word).filter(|w| !w.is_empty()) {
            Some(word) => out.push(word.to_string()),
            None => return None,
        }
    }
    Some(out)
}

fn trim_word(word: &str) -> &str {
    word.trim_matches(|c: char| !c.is_alphanumeric() && c != '_' && c != '-')
}

/// Quoted single words (`'a'`, `"b"`, `` `c` ``), at most eight.
fn quoted_words(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while out.len() < 8 {
        let Some(open) = rest.find(['\'', '"', '`']) else {
            break;
        };
        let quote = rest[open..].chars().next().unwrap_or('"');
        let after = &rest[open + 1..];
        let Some(close) = after.find(quote) else {
            break;
        };
        let inner = &after[..close];
        if !inner.is_empty() && inner.len() <= 40 && !inner.contains(char::is_whitespace) {
            if !out.iter().any(|w| w == inner) {
                out.push(inner.to_string());
            }
            rest = &after[close + 1..];
        } else {
            // An apostrophe, or a quoted phrase: step past the opening quote only.
            rest = after;
        }
    }
    out
}

/// Terms of a tool's name without an upstream's `alias__` prefix, and of its description.
fn duplicate_terms(spec: &ToolSpec) -> (BTreeSet<String>, BTreeSet<String>) {
    let name = spec
        .name
        .split_once("__")
        .map_or(spec.name.as_str(), |(_, tool)| tool);
    let description =
        ring0_core::text::truncate_utf8(&spec.description, DESCRIPTION_BYTES_READ_MAX);
    (
        bm25::terms(name).into_iter().collect(),
        bm25::terms(description).into_iter().collect(),
    )
}

fn jaccard(a: &BTreeSet<String>, b: &BTreeSet<String>) -> f64 {
    let shared = a.intersection(b).count();
    let union = a.len() + b.len() - shared;
    if union == 0 {
        0.0
    } else {
        shared as f64 / union as f64
    }
}

/// Pairs of tools whose names and descriptions overlap (see the thresholds). Candidates are
/// the tools sharing a description term no more than [`DUPLICATE_TERM_TOOLS_MAX`] tools have,
/// found through an inverted index rather than by comparing every pair; the work is bounded by
/// the postings times that cap.
fn near_duplicates(tools: &[&ToolSpec], report: &mut LintReport) {
    let terms: Vec<_> = tools.iter().map(|s| duplicate_terms(s)).collect();
    let mut postings: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, (_, description)) in terms.iter().enumerate() {
        for term in description {
            postings.entry(term.as_str()).or_default().push(i);
        }
    }
    for (a, (name_a, desc_a)) in terms.iter().enumerate() {
        let mut candidates = BTreeSet::new();
        for term in desc_a {
            let list = &postings[term.as_str()];
            if list.len() <= DUPLICATE_TERM_TOOLS_MAX {
                candidates.extend(list.iter().copied().filter(|&b| b > a));
            }
        }
        for b in candidates {
            let (name_b, desc_b) = &terms[b];
            let names = jaccard(name_a, name_b);
            if names < DUPLICATE_NAME_SIMILARITY_MIN {
                continue;
            }
            let descriptions = jaccard(desc_a, desc_b);
            if descriptions >= DUPLICATE_DESCRIPTION_SIMILARITY_MIN {
                report.push(
                    LintRule::NearDuplicate,
                    &tools[a].name,
                    String::new(),
                    format!(
                        "near-duplicate of {:?} (names {:.0} % alike, descriptions {:.0} %): \
                         a model cannot tell them apart; say how they differ, or grant one",
                        tools[b].name,
                        names * 100.0,
                        descriptions * 100.0
                    ),
                );
            }
        }
    }
}
