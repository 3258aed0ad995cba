//! The BFCL function-calling corpus as a specification of compatibility preparation and
//! validation.
//!
//! The corpus (`shared/data/bfcl` next to the repository) holds real-world tool definitions with
//! loose schemas (`dict`, `float`, `tuple`, `any`, Java type names, dotted names, no
//! `additionalProperties`) and, for each case, the calls a model should be allowed to make. Every
//! definition must register, every ground-truth call must come back from a round without a
//! rejection, and every mutation of a ground-truth call (a required parameter dropped, a value of
//! the wrong JSON type, an unknown key, a value outside an enum) must come back as a
//! `validation_error` naming the right `error_type` and `loc`.
//!
//! Some cases contradict themselves (a value given as Java source text for a boolean parameter, a
//! default that violates its own type). They are listed with their reason in
//! `tests/bfcl_inconsistent.txt`; the test asserts that exactly the listed failures happen, so a
//! case is never skipped silently and a fixed or newly broken case shows up.
//!
//! Run with `cargo test -p ring0-kernel --test bfcl -- --nocapture` to see the counts.

use ring0_core::receipt::CallOutcome;
use ring0_core::{
    Authority, FieldError, Observation, ProposedArguments, ProposedCall, Rejection, Round, ToolSpec,
};
use ring0_kernel::{GrantTable, Kernel, RoundOptions, SessionConfig, tool_fn};
use serde_json::{Map, Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// The categories shipped with the corpus; each has a definitions file and an answers file.
const CATEGORIES: &[&str] = &[
    "simple_python",
    "simple_java",
    "simple_javascript",
    "multiple",
    "parallel",
    "parallel_multiple",
];

/// Lets a checkout keep the corpus elsewhere.
const DATA_DIR_ENV: &str = "RING0_BFCL_DIR";

/// A key no BFCL tool declares, for the extra-property mutation.
const UNKNOWN_KEY: &str = "ring0_unknown_property";

/// A string no BFCL enum contains, for the enum mutation.
const NOT_IN_ENUM: &str = "ring0-not-a-listed-value";

/// Lower bounds that make "the corpus really ran" a checked fact rather than a hope: the shipped
/// subset has 1,150 cases with more than 1,500 ground-truth calls.
const MIN_TOOLS: usize = 1_500;
const MIN_CALLS: usize = 1_500;
const MIN_MUTATIONS_PER_KIND: usize = 100;

fn data_dir() -> PathBuf {
    let dir = match std::env::var_os(DATA_DIR_ENV) {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/bfcl"),
    };
    assert!(
        dir.join("possible_answer").is_dir(),
        "the BFCL corpus is missing: expected {} (with possible_answer/ inside); \
         place the corpus there or point {DATA_DIR_ENV} at it",
        dir.display()
    );
    dir
}

/// Reads a JSON-lines file into a map from case id to record.
fn read_jsonl(path: &Path) -> BTreeMap<String, Value> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let mut out = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let record: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("{}:{}: not JSON: {e}", path.display(), n + 1));
        let id = record["id"]
            .as_str()
            .unwrap_or_else(|| panic!("{}:{}: record without an id", path.display(), n + 1))
            .to_string();
        out.insert(id, record);
    }
    out
}

/// One BFCL case: its tool definitions and its ground-truth calls.
struct Case {
    id: String,
    functions: Vec<Value>,
    /// `(tool name, resolved arguments)` in source order.
    calls: Vec<(String, Map<String, Value>)>,
}

/// Resolves a BFCL answer value: a nested map is itself `{param: [accepted values]}` and resolves
/// the same way as the top level; lists resolve element by element; anything else is literal.
fn resolve_value(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            // A map whose values are not all lists of alternatives is a literal map value.
            if map.values().all(Value::is_array) {
                Value::Object(resolve_params(map))
            } else {
                value.clone()
            }
        }
        Value::Array(items) => Value::Array(items.iter().map(resolve_value).collect()),
        other => other.clone(),
    }
}

/// Takes the first accepted value of each parameter; `""` first means the parameter is omitted.
fn resolve_params(params: &Map<String, Value>) -> Map<String, Value> {
    let mut out = Map::new();
    for (name, accepted) in params {
        let first = match accepted {
            Value::Array(alternatives) => alternatives.first(),
            other => Some(other),
        };
        match first {
            None => {}
            Some(Value::String(s)) if s.is_empty() => {}
            Some(v) => {
                out.insert(name.clone(), resolve_value(v));
            }
        }
    }
    out
}

fn load_cases() -> Vec<Case> {
    let dir = data_dir();
    let mut cases = Vec::new();
    for category in CATEGORIES {
        let defs = read_jsonl(&dir.join(format!("BFCL_v4_{category}.json")));
        let answers = read_jsonl(&dir.join(format!("possible_answer/BFCL_v4_{category}.json")));
        assert_eq!(
            defs.keys().collect::<Vec<_>>(),
            answers.keys().collect::<Vec<_>>(),
            "category {category}: definitions and answers name different cases"
        );
        for (id, def) in defs {
            let functions = def["function"]
                .as_array()
                .unwrap_or_else(|| panic!("{id}: no function array"))
                .clone();
            let calls = answers[&id]["ground_truth"]
                .as_array()
                .unwrap_or_else(|| panic!("{id}: no ground_truth array"))
                .iter()
                .flat_map(|call| {
                    call.as_object()
                        .unwrap_or_else(|| panic!("{id}: a ground-truth call is not an object"))
                        .iter()
                        .map(|(tool, params)| {
                            let params = params.as_object().unwrap_or_else(|| {
                                panic!("{id}: parameters of {tool} are not an object")
                            });
                            (tool.clone(), resolve_params(params))
                        })
                })
                .collect();
            cases.push(Case {
                id,
                functions,
                calls,
            });
        }
    }
    cases
}

/// The JSON type a BFCL type name denotes, decided here independently of the kernel's table so
/// that a wrong normalization shows up as a failed mutation. `None`: no type constraint.
fn json_type(loose: &str) -> Option<&'static str> {
    match loose {
        "string" | "String" | "char" => Some("string"),
        "integer" | "long" => Some("integer"),
        "float" | "double" | "number" => Some("number"),
        "boolean" | "Boolean" => Some("boolean"),
        "dict" | "HashMap" | "object" => Some("object"),
        "array" | "Array" | "ArrayList" | "tuple" => Some("array"),
        "any" | "" => None,
        other => panic!("the corpus uses a type name this test does not know: {other:?}"),
    }
}

/// A value whose JSON type differs from `ty`: non-string values become their JSON text (what a
/// model does when it stringifies), strings become a number.
fn wrong_type_value(ty: &str, original: &Value) -> Value {
    match ty {
        "string" => json!(42),
        _ => Value::String(original.to_string()),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Missing,
    Type,
    AdditionalProperty,
    Enum,
}

impl Kind {
    const ALL: [Kind; 4] = [
        Kind::Missing,
        Kind::Type,
        Kind::AdditionalProperty,
        Kind::Enum,
    ];

    fn error_type(self) -> &'static str {
        match self {
            Kind::Missing => "missing",
            Kind::Type => "type",
            Kind::AdditionalProperty => "additional_property",
            Kind::Enum => "enum",
        }
    }
}

/// One mutated call and the error it must produce.
struct Mutation {
    kind: Kind,
    tool: String,
    args: Map<String, Value>,
    loc: String,
}

fn pointer(name: &str) -> String {
    format!("/{}", name.replace('~', "~0").replace('/', "~1"))
}

/// Every mutation of one ground-truth call, from the tool's original (loose) schema.
fn mutations(tool: &str, schema: &Value, args: &Map<String, Value>) -> (Vec<Mutation>, usize) {
    let empty = Map::new();
    let props = schema["properties"].as_object().unwrap_or(&empty);
    let required: BTreeSet<&str> = schema["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut out = Vec::new();
    let mut defaulted_required = 0;
    let with = |name: &str, value: Option<Value>| {
        let mut a = args.clone();
        match value {
            Some(v) => a.insert(name.to_string(), v),
            None => a.remove(name),
        };
        a
    };
    for (name, prop) in props {
        let present = args.get(name);
        if required.contains(name.as_str()) && present.is_some() {
            // A required parameter with a default is filled in by the kernel, so dropping it
            // is not an error; counted, not mutated.
            if prop.get("default").is_some() {
                defaulted_required += 1;
            } else {
                out.push(Mutation {
                    kind: Kind::Missing,
                    tool: tool.into(),
                    args: with(name, None),
                    loc: pointer(name),
                });
            }
        }
        if let (Some(value), Some(ty)) = (present, prop["type"].as_str().and_then(json_type)) {
            out.push(Mutation {
                kind: Kind::Type,
                tool: tool.into(),
                args: with(name, Some(wrong_type_value(ty, value))),
                loc: pointer(name),
            });
        }
        if let Some(options) = prop["enum"].as_array() {
            assert!(
                !options.contains(&json!(NOT_IN_ENUM)),
                "{tool}: enum of {name} holds the probe value"
            );
            out.push(Mutation {
                kind: Kind::Enum,
                tool: tool.into(),
                args: with(name, Some(json!(NOT_IN_ENUM))),
                loc: pointer(name),
            });
        }
        // An enum on the items of a present, non-empty array: the first item goes out of range.
        if let (Some(Value::Array(items)), Some(_)) = (present, prop["items"]["enum"].as_array())
            && !items.is_empty()
        {
            let mut bad = items.clone();
            bad[0] = json!(NOT_IN_ENUM);
            out.push(Mutation {
                kind: Kind::Enum,
                tool: tool.into(),
                args: with(name, Some(Value::Array(bad))),
                loc: format!("{}/0", pointer(name)),
            });
        }
    }
    assert!(
        !props.contains_key(UNKNOWN_KEY),
        "{tool} declares the probe key"
    );
    out.push(Mutation {
        kind: Kind::AdditionalProperty,
        tool: tool.into(),
        args: with(UNKNOWN_KEY, Some(json!("surplus"))),
        loc: pointer(UNKNOWN_KEY),
    });
    (out, defaulted_required)
}

/// A field error in the form the inconsistency list uses.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Failure {
    case: String,
    tool: String,
    loc: String,
    error_type: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} | {} | {} | {}",
            self.case, self.tool, self.loc, self.error_type
        )
    }
}

/// What running the corpus produced.
#[derive(Default)]
struct Report {
    cases: usize,
    tools_registered: usize,
    registration_failures: Vec<String>,
    calls_validated: usize,
    /// Ground-truth calls that came back rejected, one entry per field error.
    call_failures: BTreeSet<Failure>,
    /// Rejections of ground-truth calls that carry no field error (should never happen).
    other_call_failures: Vec<String>,
    mutations_rejected: BTreeMap<Kind, usize>,
    mutation_failures: Vec<String>,
    calls_not_mutated: usize,
    defaulted_required: usize,
}

fn noop_kernel(case: &Case) -> Result<Kernel, String> {
    let mut builder = Kernel::builder();
    for f in &case.functions {
        let name = f["name"].as_str().unwrap_or_default();
        let spec = ToolSpec::read(
            name,
            f["description"].as_str().unwrap_or_default(),
            f["parameters"].clone(),
        )
        .authority(Authority::A0);
        let tool = tool_fn(|_ctx, _args| async { Ok(Observation::json(json!({"ok": true}))) });
        builder = builder
            .tool(spec, tool)
            .map_err(|e| format!("{}: {e}", case.id))?;
    }
    Ok(builder
        .authorizer(Arc::new(GrantTable::allow(&["*"], Authority::A0)))
        .build())
}

/// Runs calls as one round in a fresh session and returns each call's rejection, if any.
async fn run(kernel: &Kernel, calls: &[(String, Map<String, Value>)]) -> Vec<Option<Rejection>> {
    let session = kernel.open_session(SessionConfig::new("bfcl"));
    let round = Round {
        calls: calls
            .iter()
            .enumerate()
            .map(|(index, (tool, args))| ProposedCall {
                index,
                call_id: format!("call_{index}"),
                tool: tool.clone(),
                arguments: ProposedArguments::Value(Value::Object(args.clone())),
                idempotency_key: None,
            })
            .collect(),
        text: None,
    };
    let outcome = session.run_round(round, &RoundOptions::default()).await;
    assert_eq!(outcome.receipts.len(), calls.len());
    outcome
        .receipts
        .into_iter()
        .map(|r| match r.outcome {
            CallOutcome::Rejected { rejection } => Some(rejection),
            _ => None,
        })
        .collect()
}

fn describe(errors: &[FieldError]) -> String {
    errors
        .iter()
        .map(|e| format!("{} {} ({})", e.loc, e.error_type, e.message))
        .collect::<Vec<_>>()
        .join("; ")
}

async fn evaluate() -> Report {
    let mut report = Report::default();
    for case in load_cases() {
        report.cases += 1;
        let kernel = match noop_kernel(&case) {
            Ok(k) => k,
            Err(e) => {
                report.registration_failures.push(e);
                continue;
            }
        };
        report.tools_registered += kernel.registry().len();
        let schemas: BTreeMap<&str, &Value> = case
            .functions
            .iter()
            .map(|f| (f["name"].as_str().unwrap_or_default(), &f["parameters"]))
            .collect();

        let verdicts = run(&kernel, &case.calls).await;
        for ((tool, args), verdict) in case.calls.iter().zip(verdicts) {
            if let Some(rejection) = verdict {
                if rejection.errors.is_empty() {
                    report.other_call_failures.push(format!(
                        "{} | {tool} | {:?}: {}",
                        case.id, rejection.status, rejection.message
                    ));
                }
                for e in &rejection.errors {
                    report.call_failures.insert(Failure {
                        case: case.id.clone(),
                        tool: tool.clone(),
                        loc: e.loc.clone(),
                        error_type: e.error_type.clone(),
                    });
                }
                // A call that does not validate as given is no base for mutations.
                report.calls_not_mutated += 1;
                continue;
            }
            report.calls_validated += 1;

            let Some(schema) = schemas.get(tool.as_str()) else {
                report.other_call_failures.push(format!(
                    "{} | {tool} | the answer names a tool the case does not define, yet it ran",
                    case.id
                ));
                continue;
            };
            let (muts, defaulted) = mutations(tool, schema, args);
            report.defaulted_required += defaulted;
            for m in muts {
                let verdict = run(&kernel, &[(m.tool.clone(), m.args.clone())])
                    .await
                    .pop()
                    .flatten();
                let wanted = m.kind.error_type();
                let ok = match &verdict {
                    Some(r) => {
                        r.status.as_str() == "validation_error"
                            && r.errors.iter().any(|e| e.error_type == wanted && e.loc == m.loc)
                            // Nothing else about the call is wrong.
                            && r.errors.iter().all(|e| e.loc == m.loc)
                    }
                    None => false,
                };
                if ok {
                    *report.mutations_rejected.entry(m.kind).or_default() += 1;
                } else {
                    report.mutation_failures.push(format!(
                        "{} | {} | {wanted} at {} | got {}",
                        case.id,
                        m.tool,
                        m.loc,
                        match &verdict {
                            None => "no rejection".to_string(),
                            Some(r) => format!("{}: {}", r.status.as_str(), describe(&r.errors)),
                        }
                    ));
                }
            }
        }
    }
    report
}

/// The corpus is evaluated once per test process and shared by the tests below.
fn report() -> &'static Report {
    static REPORT: OnceLock<Report> = OnceLock::new();
    REPORT.get_or_init(|| {
        let report = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a runtime")
            .block_on(evaluate());
        println!("BFCL cases: {}", report.cases);
        println!("BFCL tools registered: {}", report.tools_registered);
        println!("BFCL ground-truth calls validated: {}", report.calls_validated);
        let cases: BTreeSet<&str> = report.call_failures.iter().map(|f| f.case.as_str()).collect();
        println!(
            "BFCL ground-truth calls rejected (must be listed in bfcl_inconsistent.txt): {} in {} cases",
            report.calls_not_mutated,
            cases.len()
        );
        for kind in Kind::ALL {
            println!(
                "BFCL mutations rejected ({}): {}",
                kind.error_type(),
                report.mutations_rejected.get(&kind).copied().unwrap_or(0)
            );
        }
        println!(
            "BFCL required parameters with a default (filled in, not mutated): {}",
            report.defaulted_required
        );
        report
    })
}

/// Parses `tests/bfcl_inconsistent.txt`: `case | tool | loc | error_type | reason`, `#` comments.
fn listed_inconsistencies() -> BTreeMap<Failure, String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/bfcl_inconsistent.txt");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let mut out = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.splitn(5, '|').map(str::trim).collect();
        let [case, tool, loc, error_type, reason] = fields[..] else {
            panic!(
                "{}:{}: expected `case | tool | loc | error_type | reason`",
                path.display(),
                n + 1
            );
        };
        assert!(
            !reason.is_empty(),
            "{}:{}: every listed case needs a reason",
            path.display(),
            n + 1
        );
        let failure = Failure {
            case: case.into(),
            tool: tool.into(),
            loc: loc.into(),
            error_type: error_type.into(),
        };
        assert!(
            out.insert(failure, reason.to_string()).is_none(),
            "{}:{}: listed twice",
            path.display(),
            n + 1
        );
    }
    out
}

#[test]
fn every_tool_definition_registers_after_compatibility_preparation() {
    let r = report();
    assert!(
        r.registration_failures.is_empty(),
        "{} cases failed to register:\n{}",
        r.registration_failures.len(),
        r.registration_failures.join("\n")
    );
    assert!(
        r.tools_registered >= MIN_TOOLS,
        "only {} tools registered",
        r.tools_registered
    );
}

#[test]
fn every_ground_truth_call_validates_except_the_listed_inconsistent_cases() {
    let r = report();
    assert!(
        r.other_call_failures.is_empty(),
        "ground-truth calls rejected without a field error:\n{}",
        r.other_call_failures.join("\n")
    );
    let listed = listed_inconsistencies();
    let listed_keys: BTreeSet<&Failure> = listed.keys().collect();
    let actual: BTreeSet<&Failure> = r.call_failures.iter().collect();
    let unlisted: Vec<String> = actual
        .difference(&listed_keys)
        .map(|f| f.to_string())
        .collect();
    let passing: Vec<String> = listed_keys
        .difference(&actual)
        .map(|f| f.to_string())
        .collect();
    assert!(
        unlisted.is_empty() && passing.is_empty(),
        "ground-truth failures differ from tests/bfcl_inconsistent.txt\n\
         failing but not listed ({}):\n{}\n\
         listed but not failing ({}):\n{}",
        unlisted.len(),
        unlisted.join("\n"),
        passing.len(),
        passing.join("\n"),
    );
    assert!(
        r.calls_validated >= MIN_CALLS,
        "only {} ground-truth calls validated",
        r.calls_validated
    );
}

#[test]
fn every_mutation_is_rejected_with_its_error_type_and_location() {
    let r = report();
    assert!(
        r.mutation_failures.is_empty(),
        "{} mutations were not rejected as expected:\n{}",
        r.mutation_failures.len(),
        r.mutation_failures.join("\n")
    );
    for kind in Kind::ALL {
        let n = r.mutations_rejected.get(&kind).copied().unwrap_or(0);
        assert!(
            n >= MIN_MUTATIONS_PER_KIND,
            "only {n} {} mutations were generated and rejected",
            kind.error_type()
        );
    }
}

// Cases found on BFCL live data; each test reproduces the definition that showed the fault.

/// A kernel over one tool whose executor hands back the arguments it received.
fn echo_kernel(name: &str, parameters: Value) -> Kernel {
    Kernel::builder()
        .tool(
            ToolSpec::read(name, "", parameters),
            tool_fn(|_ctx, args| async move { Ok(Observation::json(args)) }),
        )
        .unwrap()
        .authorizer(Arc::new(GrantTable::allow(&["*"], Authority::A0)))
        .build()
}

async fn run_one(kernel: &Kernel, tool: &str, args: Value) -> Result<Value, Rejection> {
    let Value::Object(args) = args else {
        panic!("arguments must be an object")
    };
    let session = kernel.open_session(SessionConfig::new("bfcl"));
    let round = Round {
        calls: vec![ProposedCall {
            index: 0,
            call_id: "c0".into(),
            tool: tool.into(),
            arguments: ProposedArguments::Value(Value::Object(args)),
            idempotency_key: None,
        }],
        text: None,
    };
    let out = session.run_round(round, &RoundOptions::default()).await;
    match out.receipts.into_iter().next().unwrap().outcome {
        CallOutcome::Rejected { rejection } => Err(rejection),
        CallOutcome::Completed { observation } => Ok(observation.structured.unwrap()),
        other => panic!("{other:?}"),
    }
}

/// BFCL live: `{"type": "array", "items": {"type": "string"}, "enum": [...]}` — the enum meant
/// for the items.
fn array_enum_tool() -> Kernel {
    echo_kernel(
        "get_news",
        json!({"type": "dict", "required": ["topics"], "properties": {
            "topics": {"type": "array", "items": {"type": "string"},
                       "enum": ["sports", "politics", "science"],
                       "description": "Topics to include."}
        }}),
    )
}

#[tokio::test]
async fn an_enum_on_an_array_property_constrains_its_items() {
    let kernel = array_enum_tool();
    let ok = run_one(
        &kernel,
        "get_news",
        json!({"topics": ["sports", "science"]}),
    )
    .await;
    assert_eq!(ok.unwrap(), json!({"topics": ["sports", "science"]}));
}

#[tokio::test]
async fn an_item_outside_an_array_enum_is_named_and_not_listed_as_allowed() {
    let kernel = array_enum_tool();
    let err = run_one(&kernel, "get_news", json!({"topics": ["sports", "gossip"]}))
        .await
        .unwrap_err();
    assert_eq!(err.errors.len(), 1, "{:?}", err.errors);
    let e = &err.errors[0];
    assert_eq!(
        (e.loc.as_str(), e.error_type.as_str()),
        ("/topics/1", "enum")
    );
    assert_eq!(
        e.expected_domain,
        Some(json!({"enum": ["sports", "politics", "science"]}))
    );
}

#[tokio::test]
async fn an_integral_float_for_an_integer_reaches_the_tool_as_an_integer() {
    // BFCL live: a port given as 7890.0 for `"type": "integer"`.
    let kernel = echo_kernel(
        "connect",
        json!({"type": "dict", "required": ["host", "port"], "properties": {
            "host": {"type": "string"}, "port": {"type": "integer"},
            "ratios": {"type": "array", "items": {"type": "integer"}},
            "scale": {"type": "float"}
        }}),
    );
    let args = run_one(
        &kernel,
        "connect",
        json!({"host": "db", "port": 7890.0, "ratios": [1.0, 2.0], "scale": 2.0}),
    )
    .await
    .unwrap();
    assert!(args["port"].is_i64(), "{}", args["port"]);
    assert_eq!(
        args.to_string(),
        r#"{"host":"db","port":7890,"ratios":[1,2],"scale":2.0}"#
    );
}

#[tokio::test]
async fn a_fractional_float_for_an_integer_is_still_a_type_error() {
    let kernel = echo_kernel(
        "connect",
        json!({"type": "dict", "properties": {"port": {"type": "integer"}}}),
    );
    let err = run_one(&kernel, "connect", json!({"port": 7890.5}))
        .await
        .unwrap_err();
    assert_eq!(err.errors[0].error_type, "type");
}

#[test]
fn a_required_name_the_schema_does_not_declare_registers_with_a_warning() {
    // Corpus case parallel_29: `population` is a `dict` whose `required` names properties it
    // does not declare. The object is open, so they stay required; the warning says so.
    let case = load_cases()
        .into_iter()
        .find(|c| c.id == "parallel_29")
        .expect("corpus case parallel_29");
    let kernel = noop_kernel(&case).unwrap();
    let tool = kernel
        .registry()
        .get("waste_calculation.calculate")
        .unwrap();
    let warnings = tool.warnings.join("\n");
    for name in ["adults", "children", "singles"] {
        assert!(
            warnings.contains(&format!("required property {name:?} is not declared")),
            "{warnings}"
        );
    }
}

#[tokio::test]
async fn an_undeclared_required_name_of_a_closed_object_no_longer_blocks_every_call() {
    let kernel = echo_kernel(
        "book",
        json!({"type": "dict", "required": ["city", "date"], "properties": {
            "city": {"type": "string"}
        }}),
    );
    let tool = kernel.registry().get("book").unwrap();
    assert_eq!(tool.warnings.len(), 1, "{:?}", tool.warnings);
    assert!(tool.warnings[0].contains("\"date\" is not declared and no other property is allowed"));
    let ok = run_one(&kernel, "book", json!({"city": "Oslo"})).await;
    assert_eq!(ok.unwrap(), json!({"city": "Oslo"}));
}

#[tokio::test]
async fn a_refused_registration_keeps_the_builder_and_every_earlier_tool() {
    let ok = ToolSpec::read("first", "", json!({"type": "object"}));
    let bad = ToolSpec::read("second", "", json!({"type": "Widget"}));
    let builder = Kernel::builder()
        .tool(
            ok,
            tool_fn(|_c, _a| async { Ok(Observation::json(json!({"ran": 1}))) }),
        )
        .unwrap();
    let refused = match builder.tool(bad, tool_fn(|_c, _a| async { Ok(Observation::text("")) })) {
        Ok(_) => panic!("an unknown type name was accepted"),
        Err(refused) => refused,
    };
    assert!(refused.to_string().contains("unknown type name \"Widget\""));
    let kernel = refused
        .into_builder()
        .authorizer(Arc::new(GrantTable::allow(&["*"], Authority::A0)))
        .build();
    assert_eq!(kernel.registry().len(), 1);
    assert_eq!(
        run_one(&kernel, "first", json!({})).await.unwrap(),
        json!({"ran": 1})
    );
}
