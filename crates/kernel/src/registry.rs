//! The tool registry: specs normalized and compiled once at registration.

use crate::compat::{SchemaError, normalize_schema};
use crate::tool::Tool;
use jsonschema::{Draft, Retrieve, Uri, Validator};
use ring0_core::ToolSpec;
use ring0_core::canonical::canonicalize;
use ring0_core::limits::{
    CATALOG_TOOLS_MAX, OBSERVATION_BYTES_MAX, PROJECTION_BYTES_MAX, RECEIPT_ENVELOPE_BYTES_MAX,
    SCHEMA_BYTES_MAX, TOOL_NAME_BYTES_MAX,
};
use ring0_shape::observation::TEXT_BUDGET_BYTES_MIN;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Why a tool could not be registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistrationError {
    #[error(
        "tool name {0:?} is empty, longer than {TOOL_NAME_BYTES_MAX} bytes or has characters outside [A-Za-z0-9_.:/-]"
    )]
    InvalidName(String),
    #[error("tool {0:?} is already registered")]
    Duplicate(String),
    #[error("the catalog already holds {CATALOG_TOOLS_MAX} tools")]
    CatalogFull,
    #[error("tool {tool:?}: schema of {bytes} bytes exceeds {SCHEMA_BYTES_MAX}")]
    SchemaTooLarge { tool: String, bytes: usize },
    #[error("tool {tool:?}: {source}")]
    Schema { tool: String, source: SchemaError },
    #[error("tool {tool:?}: schema does not compile: {why}")]
    Compile { tool: String, why: String },
    #[error("tool {tool:?}: {why}")]
    Metadata { tool: String, why: String },
    #[error(
        "tool {tool:?}: an observation budget of {budget_bytes} bytes cannot be shown: a result \
         is projected in at most {PROJECTION_BYTES_MAX} bytes, {RECEIPT_ENVELOPE_BYTES_MAX} of \
         them for the receipt around the observation, so the budget must be between \
         {TEXT_BUDGET_BYTES_MIN} and {OBSERVATION_BYTES_MAX} bytes"
    )]
    ObservationBudget { tool: String, budget_bytes: usize },
}

/// Refuses every external `$ref`: schemas are self-contained, and a validator that fetches URLs
/// is a network side channel. Passed explicitly so a changed library default cannot change this.
struct NoRetrieval;

impl Retrieve for NoRetrieval {
    fn retrieve(
        &self,
        uri: &Uri<String>,
    ) -> Result<Value, Box<dyn std::error::Error + Send + Sync>> {
        Err(format!("external $ref {uri} is not allowed").into())
    }
}

/// A tool ready to be called: its spec with the normalized schema, the compiled validator and
/// the executor.
pub struct RegisteredTool {
    pub spec: ToolSpec,
    /// The connection the tool came from ([`crate::traits::LOCAL_CONNECTION`] for in-process
    /// tools) and its unqualified callable name there: what trait configuration is keyed by.
    pub connection: String,
    pub callable: String,
    /// What compatibility preparation had to ignore (e.g. a default its schema rejects).
    pub warnings: Vec<String>,
    pub validator: Validator,
    pub tool: Arc<dyn Tool>,
}

impl std::fmt::Debug for RegisteredTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegisteredTool")
            .field("spec", &self.spec)
            .finish()
    }
}

pub fn valid_tool_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= TOOL_NAME_BYTES_MAX
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'/' | b'-'))
}

/// Compiles a normalized schema with explicit options: draft 2020-12, no remote retrieval.
pub fn compile_schema(schema: &Value) -> Result<Validator, String> {
    jsonschema::options()
        .with_draft(Draft::Draft202012)
        .with_retriever(NoRetrieval)
        .should_validate_formats(false)
        .build(schema)
        .map_err(|e| e.to_string())
}

/// Every tool the kernel knows, by name.
#[derive(Default, Debug)]
pub struct Registry {
    tools: BTreeMap<String, Arc<RegisteredTool>>,
}

impl Registry {
    pub fn new() -> Self {
        Self::default()
    }

    /// Normalizes and compiles a spec, then registers it with its executor.
    pub fn register(
        &mut self,
        spec: ToolSpec,
        tool: Arc<dyn Tool>,
    ) -> Result<(), RegistrationError> {
        let callable = spec.name.clone();
        self.register_in(crate::traits::LOCAL_CONNECTION, &callable, spec, tool)
    }

    /// Registers a tool of a connection (an MCP upstream, a configured tool set) under its
    /// model-facing name `spec.name`, remembering its unqualified `callable` name.
    pub fn register_in(
        &mut self,
        connection: &str,
        callable: &str,
        mut spec: ToolSpec,
        tool: Arc<dyn Tool>,
    ) -> Result<(), RegistrationError> {
        let name = spec.name.clone();
        if !valid_tool_name(&name) {
            return Err(RegistrationError::InvalidName(name));
        }
        if self.tools.contains_key(&name) {
            return Err(RegistrationError::Duplicate(name));
        }
        if self.tools.len() >= CATALOG_TOOLS_MAX {
            return Err(RegistrationError::CatalogFull);
        }
        let bytes = canonicalize(&spec.input_schema)
            .map_err(|e| RegistrationError::Compile {
                tool: name.clone(),
                why: e.to_string(),
            })?
            .len();
        if bytes > SCHEMA_BYTES_MAX {
            return Err(RegistrationError::SchemaTooLarge { tool: name, bytes });
        }
        spec.input_schema =
            normalize_schema(&spec.input_schema, !spec.open_schema).map_err(|source| {
                RegistrationError::Schema {
                    tool: name.clone(),
                    source,
                }
            })?;
        if !(TEXT_BUDGET_BYTES_MIN..=OBSERVATION_BYTES_MAX).contains(&spec.observation_budget_bytes)
        {
            return Err(RegistrationError::ObservationBudget {
                tool: name,
                budget_bytes: spec.observation_budget_bytes,
            });
        }
        let mut warnings = crate::compat::strip_invalid_defaults(&mut spec.input_schema);
        warnings.extend(crate::compat::check_required(&mut spec.input_schema));
        if spec.authority >= ring0_core::Authority::A2
            && !spec.effect.is_read_only()
            && spec.timeout_ms == 0
        {
            return Err(RegistrationError::Metadata {
                tool: name,
                why: "a zero timeout is not allowed".into(),
            });
        }
        let validator =
            compile_schema(&spec.input_schema).map_err(|why| RegistrationError::Compile {
                tool: name.clone(),
                why,
            })?;
        self.tools.insert(
            name,
            Arc::new(RegisteredTool {
                spec,
                connection: connection.to_string(),
                callable: callable.to_string(),
                warnings,
                validator,
                tool,
            }),
        );
        Ok(())
    }

    /// Applies per-connection trait configuration to every registered tool (one metadata plane).
    pub fn apply_traits(
        &mut self,
        config: &std::collections::BTreeMap<String, crate::traits::ConnectionTraits>,
    ) {
        for entry in self.tools.values_mut() {
            let Some(conn) = config.get(&entry.connection) else {
                continue;
            };
            let mut spec = entry.spec.clone();
            crate::traits::resolve(&mut spec, &entry.callable, Some(conn));
            if spec != entry.spec {
                let validator = compile_schema(&spec.input_schema)
                    .expect("the same schema compiled at registration");
                *entry = Arc::new(RegisteredTool {
                    spec,
                    connection: entry.connection.clone(),
                    callable: entry.callable.clone(),
                    warnings: entry.warnings.clone(),
                    validator,
                    tool: entry.tool.clone(),
                });
            }
        }
    }

    pub fn get(&self, name: &str) -> Option<&Arc<RegisteredTool>> {
        self.tools.get(name)
    }

    pub fn len(&self) -> usize {
        self.tools.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<RegisteredTool>> {
        self.tools.values()
    }

    /// Up to three known names closest to `name`, best first, among those `visible` allows.
    pub fn closest(&self, name: &str, visible: impl Fn(&ToolSpec) -> bool) -> Vec<String> {
        let lower = name.to_ascii_lowercase();
        let mut scored: Vec<(f64, &String)> = self
            .tools
            .iter()
            .filter(|(_, t)| visible(&t.spec))
            .map(|(n, _)| (strsim::jaro_winkler(&lower, &n.to_ascii_lowercase()), n))
            .filter(|(score, _)| *score >= 0.7)
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(b.1)));
        scored.into_iter().take(3).map(|(_, n)| n.clone()).collect()
    }
}
