//! Tool specifications: what the model sees (name, description, schemas) and the runtime
//! metadata the model never decides (effect, authority, strategy, execution profile,
//! concurrency, conflict key, settlement, limits).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fmt;

/// Whether running a call twice is the same as running it once. Decides whether a retry is safe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    /// No effect at all (a read).
    Nullipotent,
    /// Repeating it leaves the world as one run did.
    Idempotent,
    /// Each run has its own effect.
    NonIdempotent,
}

impl Effect {
    pub fn is_read_only(self) -> bool {
        self == Effect::Nullipotent
    }
}

/// How much a call may do without a person: ordered, `A0 < A3`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Authority {
    /// Read.
    A0,
    /// Mutation inside the workspace sandbox.
    A1,
    /// Compensable external effect.
    A2,
    /// Irreversible; needs a person's approval.
    A3,
}

impl fmt::Display for Authority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// One strategy trait. A set of them describes a tool; the empty set is `unknown`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    Exploration,
    Exploitation,
    Neutral,
}

/// The strategy traits a tool declares. Empty means `unknown`: the tool runs alone in its round.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct StrategySet {
    pub exploration: bool,
    pub exploitation: bool,
    pub neutral: bool,
}

impl StrategySet {
    pub const UNKNOWN: Self = Self {
        exploration: false,
        exploitation: false,
        neutral: false,
    };
    pub const EXPLORATION: Self = Self {
        exploration: true,
        exploitation: false,
        neutral: false,
    };
    pub const EXPLOITATION: Self = Self {
        exploration: false,
        exploitation: true,
        neutral: false,
    };
    pub const NEUTRAL: Self = Self {
        exploration: false,
        exploitation: false,
        neutral: true,
    };

    pub fn of(items: &[Strategy]) -> Self {
        let mut s = Self::UNKNOWN;
        for item in items {
            s.insert(*item);
        }
        s
    }

    pub fn insert(&mut self, s: Strategy) {
        match s {
            Strategy::Exploration => self.exploration = true,
            Strategy::Exploitation => self.exploitation = true,
            Strategy::Neutral => self.neutral = true,
        }
    }

    pub fn is_unknown(&self) -> bool {
        *self == Self::UNKNOWN
    }

    pub fn is_exactly_neutral(&self) -> bool {
        *self == Self::NEUTRAL
    }

    pub fn items(&self) -> Vec<Strategy> {
        let mut v = Vec::new();
        if self.exploration {
            v.push(Strategy::Exploration);
        }
        if self.exploitation {
            v.push(Strategy::Exploitation);
        }
        if self.neutral {
            v.push(Strategy::Neutral);
        }
        v
    }

    /// The ordered compatibility matrix: may `later` share a round after `self` was accepted?
    /// Exploration followed by exploitation is refused (the write would consume a result that
    /// does not exist yet); unknown on either side is refused (it runs alone). Mixed sets are
    /// compatible only if every pair of their members is.
    pub fn admits_after(&self, later: &StrategySet) -> bool {
        if self.is_unknown() || later.is_unknown() {
            return false;
        }
        !(self.exploration && later.exploitation)
    }

    /// Stable lowercase rendering: `exploration, exploitation` or `unknown`.
    pub fn render(&self) -> String {
        if self.is_unknown() {
            return "unknown".into();
        }
        let names: Vec<&str> = self
            .items()
            .iter()
            .map(|s| match s {
                Strategy::Exploration => "exploration",
                Strategy::Exploitation => "exploitation",
                Strategy::Neutral => "neutral",
            })
            .collect();
        names.join(", ")
    }
}

impl Serialize for StrategySet {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.items().serialize(s)
    }
}

impl<'de> Deserialize<'de> for StrategySet {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let items = Vec::<Strategy>::deserialize(d)?;
        Ok(Self::of(&items))
    }
}

/// When a completed call may start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    ToolCallComplete,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GenerationConcurrency {
    ParallelWithGeneration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResultDependency {
    Detached,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Replay {
    AtMostOncePerRound,
}

/// The early-start profile. Early execution needs all four fields (and an exactly neutral
/// strategy); a partial profile keeps the ordinary post-generation path.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecutionProfile {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<Trigger>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<GenerationConcurrency>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_dependency: Option<ResultDependency>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay: Option<Replay>,
}

impl ExecutionProfile {
    pub const EARLY: Self = Self {
        trigger: Some(Trigger::ToolCallComplete),
        concurrency: Some(GenerationConcurrency::ParallelWithGeneration),
        result_dependency: Some(ResultDependency::Detached),
        replay: Some(Replay::AtMostOncePerRound),
    };

    pub fn is_complete(&self) -> bool {
        *self == Self::EARLY
    }
}

/// Scheduler mark.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConcurrencyMark {
    /// Decided by the execution mode and the effect.
    #[default]
    Default,
    /// May overlap with neighbours even when it writes.
    Parallel,
    /// A barrier: runs alone.
    Sequential,
}

/// How an ambiguous (UNKNOWN) outcome is settled.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Settlement {
    /// The provider honours an idempotency key: re-dispatch with the same key is safe.
    IdempotencyKey,
    /// A nullipotent reconciliation probe decides.
    Probe,
    /// Never retried automatically: dead-lettered for a person.
    #[default]
    None,
}

/// A conflict-key template over arguments, e.g. `file:{path}` or `acct:{to.account}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConflictKeyTemplate {
    source: String,
    parts: Vec<TemplatePart>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum TemplatePart {
    Literal(String),
    /// A dotted path into the arguments.
    Field(Vec<String>),
}

/// Why a conflict-key template could not be parsed or resolved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConflictKeyError {
    #[error("conflict-key template {template:?}: {why}")]
    Template { template: String, why: &'static str },
    #[error("conflict-key template {template:?} names argument {field:?}, which is absent")]
    MissingField { template: String, field: String },
}

impl ConflictKeyTemplate {
    pub fn parse(source: &str) -> Result<Self, ConflictKeyError> {
        let err = |why| ConflictKeyError::Template {
            template: source.to_string(),
            why,
        };
        let mut parts = Vec::new();
        let mut rest = source;
        while let Some(open) = rest.find('{') {
            if open > 0 {
                parts.push(TemplatePart::Literal(rest[..open].to_string()));
            }
            let close = rest[open..].find('}').ok_or(err("unclosed '{'"))? + open;
            let field = &rest[open + 1..close];
            if field.is_empty() || field.contains('{') {
                return Err(err("empty or nested placeholder"));
            }
            parts.push(TemplatePart::Field(
                field.split('.').map(str::to_string).collect(),
            ));
            rest = &rest[close + 1..];
        }
        if rest.contains('}') {
            return Err(err("'}' without '{'"));
        }
        if !rest.is_empty() {
            parts.push(TemplatePart::Literal(rest.to_string()));
        }
        Ok(Self {
            source: source.to_string(),
            parts,
        })
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// Resolves the template against prepared arguments. Strings are inserted as they are;
    /// other values as canonical JSON. A missing field is an error, never an empty key.
    pub fn resolve(&self, args: &Value) -> Result<String, ConflictKeyError> {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                TemplatePart::Literal(text) => out.push_str(text),
                TemplatePart::Field(path) => {
                    let mut cur = args;
                    for seg in path {
                        cur = cur.get(seg).ok_or_else(|| ConflictKeyError::MissingField {
                            template: self.source.clone(),
                            field: path.join("."),
                        })?;
                    }
                    match cur {
                        Value::String(s) => out.push_str(s),
                        other => out.push_str(
                            &crate::canonical::canonical_string(other)
                                .unwrap_or_else(|_| other.to_string()),
                        ),
                    }
                }
            }
        }
        Ok(out)
    }
}

impl Serialize for ConflictKeyTemplate {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.source)
    }
}

impl<'de> Deserialize<'de> for ConflictKeyTemplate {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Self::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// Default per-call timeout.
pub const TIMEOUT_MS_DEFAULT: u64 = 30_000;
/// Default model-visible observation budget of one call.
pub const OBSERVATION_BUDGET_BYTES_DEFAULT: usize = 16 * 1024;

/// A tool as the kernel knows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub input_schema: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
    /// Keeps the schema open (no `additionalProperties: false` added). Off by default.
    #[serde(default)]
    pub open_schema: bool,
    pub effect: Effect,
    pub authority: Authority,
    #[serde(default)]
    pub strategy: StrategySet,
    #[serde(default)]
    pub execution: ExecutionProfile,
    #[serde(default)]
    pub concurrency: ConcurrencyMark,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conflict_key: Option<ConflictKeyTemplate>,
    #[serde(default)]
    pub settlement: Settlement,
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    #[serde(default = "default_budget")]
    pub observation_budget_bytes: usize,
    #[serde(default = "default_true")]
    pub track_exact_repeats: bool,
    /// Same prepared arguments always give the same observation (memoizable when nullipotent).
    #[serde(default)]
    pub deterministic: bool,
    /// Fill the schema's `default`s of absent properties into the prepared arguments (on by
    /// default). Off for a tool whose schema comes from someone else (an MCP upstream): a
    /// `default` there is the server's claim, and the tool gets exactly what the model sent.
    #[serde(default = "default_true")]
    pub apply_schema_defaults: bool,
    /// The tool that undoes this one's effect (seed 003's A2 "compensable"): a person's
    /// `ring0 journal compensate ID` calls it, through the kernel like any call, with the
    /// compensated call's prepared arguments, and the compensated intent ends COMPENSATED.
    /// `None`: the effect cannot be undone by ring0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compensation: Option<String>,
}

fn default_timeout_ms() -> u64 {
    TIMEOUT_MS_DEFAULT
}
fn default_budget() -> usize {
    OBSERVATION_BUDGET_BYTES_DEFAULT
}
fn default_true() -> bool {
    true
}

impl ToolSpec {
    /// A spec with conservative defaults: non-idempotent, A2, unknown strategy, no settlement.
    /// Builders below say what the tool really is.
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        input_schema: Value,
    ) -> Self {
        Self {
            name: name.into(),
            description: description.into(),
            input_schema,
            output_schema: None,
            open_schema: false,
            effect: Effect::NonIdempotent,
            authority: Authority::A2,
            strategy: StrategySet::UNKNOWN,
            execution: ExecutionProfile::default(),
            concurrency: ConcurrencyMark::Default,
            conflict_key: None,
            settlement: Settlement::None,
            timeout_ms: TIMEOUT_MS_DEFAULT,
            observation_budget_bytes: OBSERVATION_BUDGET_BYTES_DEFAULT,
            track_exact_repeats: true,
            deterministic: false,
            apply_schema_defaults: true,
            compensation: None,
        }
    }

    /// A read: nullipotent, A0, exploration.
    pub fn read(name: impl Into<String>, description: impl Into<String>, schema: Value) -> Self {
        Self::new(name, description, schema)
            .effect(Effect::Nullipotent)
            .authority(Authority::A0)
            .strategy(&[Strategy::Exploration])
    }

    pub fn effect(mut self, effect: Effect) -> Self {
        self.effect = effect;
        self
    }
    pub fn authority(mut self, authority: Authority) -> Self {
        self.authority = authority;
        self
    }
    pub fn strategy(mut self, items: &[Strategy]) -> Self {
        self.strategy = StrategySet::of(items);
        self
    }
    pub fn execution(mut self, profile: ExecutionProfile) -> Self {
        self.execution = profile;
        self
    }
    pub fn concurrency(mut self, mark: ConcurrencyMark) -> Self {
        self.concurrency = mark;
        self
    }
    /// Panics on a malformed template: templates are written by tool authors, not models.
    pub fn conflict_key(mut self, template: &str) -> Self {
        self.conflict_key = Some(ConflictKeyTemplate::parse(template).expect("valid template"));
        self
    }
    pub fn settlement(mut self, settlement: Settlement) -> Self {
        self.settlement = settlement;
        self
    }
    pub fn timeout_ms(mut self, ms: u64) -> Self {
        self.timeout_ms = ms;
        self
    }
    pub fn observation_budget_bytes(mut self, bytes: usize) -> Self {
        self.observation_budget_bytes = bytes;
        self
    }
    pub fn track_exact_repeats(mut self, on: bool) -> Self {
        self.track_exact_repeats = on;
        self
    }
    pub fn deterministic(mut self, on: bool) -> Self {
        self.deterministic = on;
        self
    }
    pub fn open_schema(mut self, open: bool) -> Self {
        self.open_schema = open;
        self
    }
    pub fn output_schema(mut self, schema: Value) -> Self {
        self.output_schema = Some(schema);
        self
    }
    /// Names the tool that undoes this one's effect (see [`ToolSpec::compensation`]).
    pub fn compensation(mut self, tool: impl Into<String>) -> Self {
        self.compensation = Some(tool.into());
        self
    }

    /// The stable `Scope:` block a catalog shows the model for this tool's traits.
    pub fn scope_block(&self) -> String {
        let mut s = format!("Scope:\n    - strategy: {}\n", self.strategy.render());
        if self.execution != ExecutionProfile::default() {
            let e = &self.execution;
            let field = |name: &str, v: Option<String>| v.map(|v| format!("{name}={v}"));
            let fields: Vec<String> = [
                field("trigger", e.trigger.map(|_| "tool_call_complete".into())),
                field(
                    "concurrency",
                    e.concurrency.map(|_| "parallel_with_generation".into()),
                ),
                field(
                    "result_dependency",
                    e.result_dependency.map(|_| "detached".into()),
                ),
                field("replay", e.replay.map(|_| "at_most_once_per_round".into())),
            ]
            .into_iter()
            .flatten()
            .collect();
            s.push_str(&format!("    - execution: {}\n", fields.join(", ")));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn exploration_then_exploitation_is_refused_but_not_the_reverse() {
        let explore = StrategySet::EXPLORATION;
        let exploit = StrategySet::EXPLOITATION;
        assert!(!explore.admits_after(&exploit));
        assert!(exploit.admits_after(&explore));
        assert!(explore.admits_after(&StrategySet::NEUTRAL));
        assert!(StrategySet::NEUTRAL.admits_after(&exploit));
    }

    #[test]
    fn unknown_strategy_is_compatible_with_nothing() {
        for s in [
            StrategySet::EXPLORATION,
            StrategySet::EXPLOITATION,
            StrategySet::NEUTRAL,
            StrategySet::UNKNOWN,
        ] {
            assert!(!StrategySet::UNKNOWN.admits_after(&s));
            assert!(!s.admits_after(&StrategySet::UNKNOWN));
        }
    }

    #[test]
    fn mixed_strategy_inherits_every_refusal() {
        let mixed = StrategySet::of(&[Strategy::Exploration, Strategy::Exploitation]);
        assert!(!mixed.admits_after(&StrategySet::EXPLOITATION));
        assert!(!StrategySet::EXPLORATION.admits_after(&mixed));
    }

    #[test]
    fn conflict_key_template_resolves_strings_and_nested_fields() {
        let t = ConflictKeyTemplate::parse("acct:{to.account}/{n}").unwrap();
        assert_eq!(
            t.resolve(&json!({"to": {"account": "A1"}, "n": 3}))
                .unwrap(),
            "acct:A1/3"
        );
        assert!(matches!(
            t.resolve(&json!({"n": 3})),
            Err(ConflictKeyError::MissingField { .. })
        ));
        assert!(ConflictKeyTemplate::parse("file:{path").is_err());
        assert!(ConflictKeyTemplate::parse("file:{}").is_err());
    }

    #[test]
    fn scope_block_is_stable() {
        let spec = ToolSpec::new("delegate", "", json!({"type": "object"}))
            .strategy(&[Strategy::Neutral])
            .execution(ExecutionProfile::EARLY);
        assert_eq!(
            spec.scope_block(),
            "Scope:\n    - strategy: neutral\n    - execution: trigger=tool_call_complete, \
             concurrency=parallel_with_generation, result_dependency=detached, \
             replay=at_most_once_per_round\n"
        );
    }
}
