//! Host tools: tools a host defines and runs itself, with the runtime metadata the model never
//! decides, and the [`ToolSpec`] the kernel registers for each.
//!
//! A host declares a tool as a [`HostTool`] — its name, description and argument schema (or a
//! custom tool's grammar), and its effect, authority, strategy, concurrency, conflict key,
//! settlement, timeout and observation budget. [`tool_spec`] turns the declaration into the
//! kernel's [`ToolSpec`], or says which field is wrong; [`host_outcome`] turns what the host
//! reports about a run (a JSON result, or a [`HostFailure`] that may or may not have applied)
//! into what the kernel settles.
//!
//! The HTTP agent API (`PUT /v1/sessions/{id}/tools`, `ring0-api`) and the Python package
//! (`ring0-py`, whose `@ring0.tool` decorator produces the same declaration) share these
//! definitions, so a tool means the same in both. With the `openapi` feature the types also
//! describe themselves to the API's OpenAPI document.

#![deny(missing_docs)]

use ring0_core::call::FREE_FORM_INPUT;
use ring0_core::{
    ConcurrencyMark, ConflictKeyTemplate, Effect, ExecutionProfile, Observation, Settlement,
    Strategy, StrategySet, ToolSpec,
};
use ring0_kernel::ToolError;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

#[cfg(feature = "openapi")]
use utoipa::ToSchema;

/// How long a host tool's call waits for the host's outcome when the tool declares no
/// `timeout_ms`; after it the call's outcome is unknown (settled by the tool's settlement).
pub const HOST_TOOL_TIMEOUT_MS_DEFAULT: u64 = 120_000;
/// The longest `timeout_ms` a host tool may declare.
pub const HOST_TOOL_TIMEOUT_MS_MAX: u64 = 600_000;

const _: () = assert!(HOST_TOOL_TIMEOUT_MS_DEFAULT <= HOST_TOOL_TIMEOUT_MS_MAX);

/// A provider format of model turns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum TurnFormat {
    /// OpenAI Chat Completions: an assistant message (or a whole completion).
    Openai,
    /// OpenAI Responses: a response (or its `output` array).
    Responses,
    /// Anthropic Messages: an assistant message.
    Anthropic,
}

impl TurnFormat {
    /// The kernel's name of the format.
    pub fn provider(self) -> ring0_core::ProviderFormat {
        match self {
            Self::Openai => ring0_core::ProviderFormat::OpenAiChat,
            Self::Responses => ring0_core::ProviderFormat::OpenAiResponses,
            Self::Anthropic => ring0_core::ProviderFormat::Anthropic,
        }
    }

    /// The format named `openai`, `responses` or `anthropic`.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "openai" => Some(Self::Openai),
            "responses" => Some(Self::Responses),
            "anthropic" => Some(Self::Anthropic),
            _ => None,
        }
    }
}

/// How a turn's calls are ordered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ExecutionMode {
    /// One call at a time, in source order.
    Sequential,
    /// Reads overlap; every write waits for what came before it. The default.
    #[default]
    SafeParallel,
    /// Calls overlap unless a tool is marked sequential.
    Parallel,
}

impl ExecutionMode {
    /// The kernel's scheduling mode.
    pub fn scheduling(self) -> ring0_kernel::SchedulingMode {
        match self {
            Self::Sequential => ring0_kernel::SchedulingMode::Sequential,
            Self::SafeParallel => ring0_kernel::SchedulingMode::SafeParallel,
            Self::Parallel => ring0_kernel::SchedulingMode::Parallel,
        }
    }
}

/// How much a call may do without a person, `A0` (read) to `A3` (irreversible).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub enum AuthorityLevel {
    /// Read.
    A0,
    /// A change inside the workspace sandbox (ring0's own tools only).
    A1,
    /// An external effect that can be compensated or settled.
    A2,
    /// Irreversible: always held for a person.
    A3,
}

impl AuthorityLevel {
    /// The kernel's authority level.
    pub fn core(self) -> ring0_core::Authority {
        use ring0_core::Authority;
        match self {
            Self::A0 => Authority::A0,
            Self::A1 => Authority::A1,
            Self::A2 => Authority::A2,
            Self::A3 => Authority::A3,
        }
    }
}

/// Whether a call of a tool changes anything, and whether repeating it is harmless.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum EffectKind {
    /// No effect at all: a read.
    Nullipotent,
    /// Repeating it leaves the world as one run did.
    Idempotent,
    /// Each run has its own effect.
    NonIdempotent,
}

/// A strategy trait: how a call relates to the others of its turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum StrategyKind {
    /// Gathers information.
    Exploration,
    /// Acts on what is known.
    Exploitation,
    /// Neither: it may run beside anything.
    Neutral,
}

/// How an ambiguous outcome of a host tool's call is settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum SettlementKind {
    /// The host honours the action's `idempotency_key`: ring0 may ask it to run the call again
    /// under the same key.
    IdempotencyKey,
    /// Never run again: an unknown outcome waits for a person (dead letter).
    None,
}

/// Scheduling mark of a tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ConcurrencyKind {
    /// Decided by the mode and the effect.
    Default,
    /// May overlap its neighbours even when it writes.
    Parallel,
    /// Runs alone.
    Sequential,
}

/// A tool the host defines and runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum HostToolType {
    /// Arguments are a JSON object checked against `input_schema`.
    #[default]
    Function,
    /// An OpenAI custom tool: free-form text input, checked against `grammar` when it is a
    /// regular expression.
    Custom,
}

/// A custom tool's grammar (OpenAI's `format: {type: "grammar", …}`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Grammar {
    /// `regex` (the whole input must match) or `lark` (not checked by ring0).
    pub syntax: GrammarSyntax,
    /// The grammar's text.
    pub definition: String,
}

/// How a custom tool's grammar is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum GrammarSyntax {
    /// A regular expression the whole input must match.
    Regex,
    /// A Lark grammar (accepted, not checked).
    Lark,
}

/// One host tool: what the model sees, and the runtime metadata the model never decides.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct HostTool {
    /// The name the model calls it by: not a tool ring0 serves, without `__`.
    pub name: String,
    /// What the model reads about it.
    #[serde(default)]
    pub description: String,
    /// `function` (default) or `custom`.
    #[serde(default, rename = "type")]
    pub kind: HostToolType,
    /// JSON Schema of a function tool's arguments (an object schema; closed unless it says
    /// `additionalProperties`). Required for `function`, absent for `custom`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub input_schema: Option<Value>,
    /// A custom tool's grammar.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grammar: Option<Grammar>,
    /// Default `non_idempotent`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<EffectKind>,
    /// Default `A2`. The principal's grants decide whether it may run, and whether a person
    /// must approve it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authority: Option<AuthorityLevel>,
    /// Default unknown (the call runs alone in its turn).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<Vec<StrategyKind>>,
    /// Default `default`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<ConcurrencyKind>,
    /// A template over the arguments, e.g. `account:{to.account}`: calls with equal keys never
    /// overlap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conflict_key: Option<String>,
    /// Default `none`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settlement: Option<SettlementKind>,
    /// How long ring0 waits for the host's outcome of one call, in milliseconds (at most
    /// 600000). Default 120000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// The model-visible budget of one result, in bytes (256..=49152). Default 16384.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observation_budget_bytes: Option<usize>,
    /// In a streamed turn, the call may start the moment its block is complete, while the model
    /// is still generating (needs `strategy: ["neutral"]`). Default `false`: it waits for the
    /// end of the stream.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub early: bool,
}

/// A host tool's failure.
#[derive(Debug, Clone, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct HostFailure {
    /// What went wrong, shown to the model (cut at 2 KiB).
    pub message: String,
    /// Whether the tool may have had its effect anyway. `false` only when the host knows
    /// nothing was applied; then the call settles FAILED. Default `true`: the outcome is
    /// unknown and is settled by the tool's settlement.
    #[serde(default = "yes")]
    pub maybe_applied: bool,
}

fn yes() -> bool {
    true
}

/// What is wrong with a declaration: where (a JSON pointer into the one tool's declaration,
/// such as `/conflict_key`) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// A JSON pointer into the tool's declaration.
    pub loc: String,
    /// What is wrong there.
    pub message: String,
}

impl Problem {
    fn at(loc: &str, message: impl Into<String>) -> Self {
        Self {
            loc: loc.to_string(),
            message: message.into(),
        }
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.loc, self.message)
    }
}

impl std::error::Error for Problem {}

/// The tool spec the kernel registers for a host tool, or the first problem of its declaration.
/// What the host leaves out is conservative: non-idempotent, `A2`, no settlement, unknown
/// strategy, [`HOST_TOOL_TIMEOUT_MS_DEFAULT`].
pub fn tool_spec(def: &HostTool) -> Result<ToolSpec, Problem> {
    let schema = input_schema(def)?;
    let mut spec = ToolSpec::new(&def.name, &def.description, schema);
    spec.effect = match def.effect.unwrap_or(EffectKind::NonIdempotent) {
        EffectKind::Nullipotent => Effect::Nullipotent,
        EffectKind::Idempotent => Effect::Idempotent,
        EffectKind::NonIdempotent => Effect::NonIdempotent,
    };
    if let Some(authority) = def.authority {
        spec.authority = authority.core();
    }
    if let Some(items) = &def.strategy {
        let items: Vec<Strategy> = items
            .iter()
            .map(|s| match s {
                StrategyKind::Exploration => Strategy::Exploration,
                StrategyKind::Exploitation => Strategy::Exploitation,
                StrategyKind::Neutral => Strategy::Neutral,
            })
            .collect();
        spec.strategy = StrategySet::of(&items);
    }
    spec.concurrency = match def.concurrency.unwrap_or(ConcurrencyKind::Default) {
        ConcurrencyKind::Default => ConcurrencyMark::Default,
        ConcurrencyKind::Parallel => ConcurrencyMark::Parallel,
        ConcurrencyKind::Sequential => ConcurrencyMark::Sequential,
    };
    if let Some(template) = &def.conflict_key {
        spec.conflict_key = Some(
            ConflictKeyTemplate::parse(template)
                .map_err(|e| Problem::at("/conflict_key", e.to_string()))?,
        );
    }
    spec.settlement = match def.settlement.unwrap_or(SettlementKind::None) {
        SettlementKind::IdempotencyKey => Settlement::IdempotencyKey,
        SettlementKind::None => Settlement::None,
    };
    spec.timeout_ms = match def.timeout_ms {
        None => HOST_TOOL_TIMEOUT_MS_DEFAULT,
        Some(ms) if (1..=HOST_TOOL_TIMEOUT_MS_MAX).contains(&ms) => ms,
        Some(ms) => {
            return Err(Problem::at(
                "/timeout_ms",
                format!("{ms} is outside 1..={HOST_TOOL_TIMEOUT_MS_MAX}"),
            ));
        }
    };
    if let Some(bytes) = def.observation_budget_bytes {
        spec.observation_budget_bytes = bytes;
    }
    if def.early {
        if !spec.strategy.is_exactly_neutral() {
            return Err(Problem::at(
                "/early",
                "an early start needs strategy [\"neutral\"]: a call that explores or exploits waits for the turn it belongs to",
            ));
        }
        spec.execution = ExecutionProfile::EARLY;
    }
    Ok(spec)
}

/// The schema the kernel validates a host tool's arguments against.
fn input_schema(def: &HostTool) -> Result<Value, Problem> {
    match def.kind {
        HostToolType::Function => {
            if def.grammar.is_some() {
                return Err(Problem::at(
                    "/grammar",
                    "a grammar belongs to a custom tool (type: custom)",
                ));
            }
            match &def.input_schema {
                Some(schema @ Value::Object(_)) => Ok(schema.clone()),
                Some(_) => Err(Problem::at(
                    "/input_schema",
                    "a JSON Schema object is expected",
                )),
                None => Err(Problem::at(
                    "/input_schema",
                    "a function tool needs its input_schema",
                )),
            }
        }
        HostToolType::Custom => {
            if def.input_schema.is_some() {
                return Err(Problem::at(
                    "/input_schema",
                    "a custom tool takes free-form text: give a grammar, not an input_schema",
                ));
            }
            let mut input = json!({"type": "string"});
            if let Some(grammar) = &def.grammar
                && grammar.syntax == GrammarSyntax::Regex
            {
                // The whole input must match, as constrained decoding produces it.
                input["pattern"] = Value::String(format!("^(?:{})$", grammar.definition));
            }
            Ok(json!({
                "type": "object",
                "properties": {FREE_FORM_INPUT: input},
                "required": [FREE_FORM_INPUT],
                "additionalProperties": false,
            }))
        }
    }
}

/// What the kernel settles from a host's report of one run: a result (text is shown as text,
/// any other JSON as JSON), or a failure that applied nothing (FAILED) or may have (UNKNOWN,
/// settled by the tool's settlement).
// The kernel's `Tool::call` returns this very type: boxing here would only unbox there.
#[allow(clippy::result_large_err)]
pub fn host_outcome(reported: Result<Value, HostFailure>) -> Result<Observation, ToolError> {
    match reported {
        Ok(Value::String(text)) => Ok(Observation::text(text)),
        Ok(value) => Ok(Observation::json(value)),
        Err(failure) if !failure.maybe_applied => Err(ToolError::not_applied(failure.message)),
        Err(failure) => Err(ToolError::unknown(failure.message)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn def(value: Value) -> HostTool {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn a_custom_tools_grammar_must_match_its_whole_input() {
        let spec = tool_spec(&def(json!({"name": "sql", "type": "custom",
                        "grammar": {"syntax": "regex", "definition": "SELECT|UPDATE"}})))
        .unwrap();
        assert_eq!(
            spec.input_schema["properties"]["input"]["pattern"],
            "^(?:SELECT|UPDATE)$"
        );
        assert_eq!(spec.input_schema["required"], json!(["input"]));
    }

    #[test]
    fn a_host_tool_is_conservative_unless_it_says_otherwise() {
        let spec = tool_spec(&def(
            json!({"name": "t", "input_schema": {"type": "object"}}),
        ))
        .unwrap();
        assert_eq!(spec.effect, Effect::NonIdempotent);
        assert_eq!(spec.authority, ring0_core::Authority::A2);
        assert_eq!(spec.settlement, Settlement::None);
        assert_eq!(spec.timeout_ms, HOST_TOOL_TIMEOUT_MS_DEFAULT);
    }

    #[test]
    fn a_function_tool_needs_its_schema_and_a_timeout_within_bounds() {
        let e = tool_spec(&def(json!({"name": "t"}))).unwrap_err();
        assert_eq!(e.loc, "/input_schema");
        let e = tool_spec(&def(
            json!({"name": "t", "input_schema": {"type": "object"},
                        "timeout_ms": HOST_TOOL_TIMEOUT_MS_MAX + 1}),
        ))
        .unwrap_err();
        assert_eq!(e.loc, "/timeout_ms");
    }

    #[test]
    fn a_declaration_round_trips_through_its_wire_form() {
        let d = def(json!({"name": "send", "description": "Send it",
                           "input_schema": {"type": "object"}, "effect": "non_idempotent",
                           "authority": "A2", "settlement": "idempotency_key",
                           "strategy": ["exploitation"], "conflict_key": "to:{to}"}));
        let again: HostTool = serde_json::from_value(serde_json::to_value(&d).unwrap()).unwrap();
        assert_eq!(tool_spec(&again).unwrap(), tool_spec(&d).unwrap());
    }

    #[test]
    fn a_failure_applies_nothing_only_when_the_host_says_so() {
        let failed = |maybe_applied| {
            host_outcome(Err(HostFailure {
                message: "no".into(),
                maybe_applied,
            }))
            .unwrap_err()
            .class
        };
        assert_eq!(failed(false), ring0_core::FailureClass::NotApplied);
        assert_eq!(failed(true), ring0_core::FailureClass::Unknown);
        assert!(host_outcome(Ok(json!("text"))).is_ok());
    }
}
