//! CEL argument rules: compiled once, evaluated over the validated arguments of each call.
//!
//! A rule is a CEL expression that must evaluate to `true` for the call to proceed. It sees four
//! variables:
//! - `args`: the call's validated (prepared) arguments, as a map;
//! - `session`: `{scope, id}`;
//! - `principal`: `{id, groups, claims}` — who the call acts for (`claims` holds a JWT's verified
//!   claims, empty otherwise);
//! - `tool`: `{name, effect, authority, strategy, settlement, conflict_key}` — the runtime
//!   metadata the host declared, never anything the model said.
//!
//! Failing closed is the point: `false`, a non-boolean result and an evaluation error all deny.
//! Reading an argument that is absent (`args.path` when the call has no `path`) is an evaluation
//! error in CEL, so a rule over an absent argument denies instead of being skipped; a rule that
//! means to allow absence says so with `!has(args.path) || …`.

use cel::{Context, Env, Program, Value as Cel};
use ring0_core::{Principal, ToolSpec};
use ring0_kernel::SessionInfo;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;

/// Longest accepted rule source.
pub const RULE_SOURCE_BYTES_MAX: usize = 4096;
/// Most rules one grant may hold.
pub const RULES_PER_GRANT_MAX: usize = 64;

/// A rule that could not be compiled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    #[error("rule is empty")]
    Empty,
    #[error("rule of {bytes} bytes exceeds {RULE_SOURCE_BYTES_MAX}")]
    TooLong { bytes: usize },
    #[error("rule {rule:?} does not parse: {why}")]
    Parse { rule: String, why: String },
    #[error(
        "rule {rule:?} refers to {name:?}; only `args`, `session`, `principal` and `tool` are defined"
    )]
    UnknownVariable { rule: String, name: String },
}

/// One compiled CEL rule.
#[derive(Clone)]
pub struct ArgRule {
    source: String,
    program: Arc<Program>,
    env: Arc<Env>,
}

impl std::fmt::Debug for ArgRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ArgRule").field(&self.source).finish()
    }
}

/// Variables a rule may name.
const VARIABLES: [&str; 4] = ["args", "session", "principal", "tool"];

impl ArgRule {
    /// Compiles `source`. Names other than `args`, `session`, `principal` and `tool` are refused now, not at
    /// the first call, so a typo in a configuration fails when it is loaded.
    pub fn compile(source: &str) -> Result<Self, RuleError> {
        let trimmed = source.trim();
        if trimmed.is_empty() {
            return Err(RuleError::Empty);
        }
        if source.len() > RULE_SOURCE_BYTES_MAX {
            return Err(RuleError::TooLong {
                bytes: source.len(),
            });
        }
        let env = Arc::new(Env::stdlib());
        let program = env.compile(source).map_err(|e| RuleError::Parse {
            rule: source.to_string(),
            why: e.to_string(),
        })?;
        let references = program.references();
        if let Some(name) = references
            .variables()
            .into_iter()
            .find(|v| !VARIABLES.contains(v) && !is_comprehension_variable(source, v))
        {
            return Err(RuleError::UnknownVariable {
                rule: source.to_string(),
                name: name.to_string(),
            });
        }
        Ok(Self {
            source: source.to_string(),
            program: Arc::new(program),
            env,
        })
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// Evaluates the rule. `Ok(true)` allows; `Ok(false)` and `Err(why)` deny.
    pub fn evaluate(
        &self,
        args: &Value,
        session: &SessionInfo,
        spec: &ToolSpec,
    ) -> Result<bool, String> {
        let mut context = Context::with_env(self.env.clone());
        context.add_variable_from_value("args", json_to_cel(args));
        context.add_variable_from_value(
            "session",
            HashMap::from([
                ("scope".to_string(), Cel::from(session.scope.as_str())),
                ("id".to_string(), Cel::from(session.session_id.as_str())),
            ]),
        );
        context.add_variable_from_value("principal", principal_value(&session.principal));
        context.add_variable_from_value("tool", tool_value(spec));
        match self.program.execute(&context) {
            Ok(Cel::Bool(b)) => Ok(b),
            Ok(other) => Err(format!(
                "the rule produced {} instead of a boolean",
                type_name(&other)
            )),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// Comprehension macros (`args.files.all(f, …)`) bind their own variable; it shows up among the
/// references, and is accepted when it appears as the first argument of such a macro.
fn is_comprehension_variable(source: &str, name: &str) -> bool {
    ["all", "exists", "exists_one", "map", "filter"]
        .iter()
        .any(|m| {
            let pattern = format!(".{m}(");
            source.match_indices(&pattern).any(|(i, _)| {
                source[i + pattern.len()..]
                    .trim_start()
                    .strip_prefix(name)
                    .is_some_and(|rest| rest.trim_start().starts_with(','))
            })
        })
}

fn type_name(v: &Cel) -> &'static str {
    match v {
        Cel::List(_) => "a list",
        Cel::Map(_) => "a map",
        Cel::Int(_) | Cel::UInt(_) => "an integer",
        Cel::Float(_) => "a number",
        Cel::String(_) => "a string",
        Cel::Bytes(_) => "bytes",
        Cel::Null => "null",
        _ => "a non-boolean value",
    }
}

/// JSON to CEL. Integers that fit `int` become `int` (so `args.n <= 100` compares like with
/// like); larger unsigned ones `uint`; the rest `double`.
pub(crate) fn json_to_cel(value: &Value) -> Cel {
    match value {
        Value::Null => Cel::Null,
        Value::Bool(b) => Cel::Bool(*b),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Cel::Int(i)
            } else if let Some(u) = n.as_u64() {
                Cel::UInt(u)
            } else {
                Cel::Float(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        Value::String(s) => Cel::from(s.as_str()),
        Value::Array(items) => Cel::List(Arc::new(items.iter().map(json_to_cel).collect())),
        Value::Object(map) => {
            let m: HashMap<String, Cel> = map
                .iter()
                .map(|(k, v)| (k.clone(), json_to_cel(v)))
                .collect();
            Cel::from(m)
        }
    }
}

fn principal_value(principal: &Principal) -> Cel {
    let groups: Vec<Cel> = principal
        .groups
        .iter()
        .map(|g| Cel::from(g.as_str()))
        .collect();
    HashMap::from([
        ("id".to_string(), Cel::from(principal.id.as_str())),
        ("groups".to_string(), Cel::List(Arc::new(groups))),
        (
            "claims".to_string(),
            json_to_cel(&Value::Object(principal.claims.clone())),
        ),
    ])
    .into()
}

fn tool_value(spec: &ToolSpec) -> Cel {
    let strategy: Vec<Cel> = spec
        .strategy
        .items()
        .iter()
        .map(|s| Cel::from(serde_name(s)))
        .collect();
    HashMap::from([
        ("name".to_string(), Cel::from(spec.name.as_str())),
        ("effect".to_string(), Cel::from(serde_name(&spec.effect))),
        (
            "authority".to_string(),
            Cel::from(spec.authority.to_string()),
        ),
        ("strategy".to_string(), Cel::List(Arc::new(strategy))),
        (
            "settlement".to_string(),
            Cel::from(serde_name(&spec.settlement)),
        ),
        (
            "conflict_key".to_string(),
            spec.conflict_key
                .as_ref()
                .map_or(Cel::Null, |k| Cel::from(k.source())),
        ),
    ])
    .into()
}

/// The serde name of a unit enum variant (`non_idempotent`, `probe`, …).
fn serde_name<T: serde::Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec() -> ToolSpec {
        ToolSpec::read("read_file", "", json!({"type": "object"}))
    }

    fn session() -> SessionInfo {
        SessionInfo {
            scope: "user:1".into(),
            session_id: "s1".into(),
            principal: Principal::new("alice").with_groups(["ops".to_string()]),
        }
    }

    fn eval(rule: &str, args: Value) -> Result<bool, String> {
        ArgRule::compile(rule)
            .unwrap()
            .evaluate(&args, &session(), &spec())
    }

    #[test]
    fn principal_is_visible_to_rules() {
        assert_eq!(
            eval(
                "principal.id == 'alice' && 'ops' in principal.groups",
                json!({})
            ),
            Ok(true)
        );
        let mut s = session();
        s.principal.claims.insert("tenant".into(), json!("acme"));
        let rule = ArgRule::compile("principal.claims.tenant == 'acme'").unwrap();
        assert_eq!(rule.evaluate(&json!({}), &s, &spec()), Ok(true));
    }

    #[test]
    fn integers_compare_with_integer_literals() {
        assert_eq!(eval("args.amount <= 100", json!({"amount": 50})), Ok(true));
        assert_eq!(
            eval("args.amount <= 100", json!({"amount": 150})),
            Ok(false)
        );
    }

    #[test]
    fn tool_metadata_is_visible_to_rules() {
        assert_eq!(
            eval(
                "tool.name == 'read_file' && tool.authority == 'A0' && tool.effect == 'nullipotent'",
                json!({})
            ),
            Ok(true)
        );
        assert_eq!(eval("session.scope == 'user:1'", json!({})), Ok(true));
    }

    #[test]
    fn comprehension_variables_are_accepted_and_other_names_refused() {
        assert_eq!(
            eval(
                "args.files.all(f, f.startsWith('src/'))",
                json!({"files": ["src/a"]})
            ),
            Ok(true)
        );
        assert!(matches!(
            ArgRule::compile("argz.path == 'x'"),
            Err(RuleError::UnknownVariable { .. })
        ));
    }

    #[test]
    fn non_boolean_result_is_an_error() {
        assert!(eval("args.path", json!({"path": "x"})).is_err());
    }
}
