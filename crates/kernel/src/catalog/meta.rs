//! The meta-tools of search mode, `search_tools` and `load_tools`, and the grant that gives
//! them to every session.
//!
//! They are ordinary registered tools, called through the whole pipeline (validated against
//! their schemas, authorized, shaped, projected). What they need of the calling session — the
//! kernel's catalog, what the session may see, what it loaded — reaches them with the call, in
//! a [`CatalogCall`] the session adds to the call's extensions: a type private to this crate,
//! so no host can forge or read it.

use super::{
    Catalog, LOAD_NAMES_MAX, LoadedTools, LoadedUnavailable, QUERY_BYTES_MAX, SEARCH_LIMIT_DEFAULT,
    SEARCH_LIMIT_MAX, VisibleFn,
};
use crate::policy::{AuthAdmission, AuthDecision, AuthRequest, Authorizer, SessionInfo};
use crate::registry::{RegistrationError, Registry};
use crate::tool::{CallContext, Tool, ToolError};
use async_trait::async_trait;
use ring0_core::{Observation, ToolSpec};
use serde_json::{Value, json};
use std::sync::Arc;

/// Finds tools by what they do.
pub const SEARCH_TOOL: &str = "search_tools";
/// Lists tools found with [`SEARCH_TOOL`] from now on and returns their definitions.
pub const LOAD_TOOL: &str = "load_tools";
pub(crate) const NAMES: [&str; 2] = [SEARCH_TOOL, LOAD_TOOL];
/// The rule that allows a meta-tool call, in decisions and receipts.
const META_RULE: &str = "catalog:meta";

pub(crate) fn is_meta(name: &str) -> bool {
    NAMES.contains(&name)
}

/// What a meta-tool call needs of its session.
pub(crate) struct CatalogCall {
    pub catalog: Arc<Catalog>,
    pub loaded: Arc<LoadedTools>,
    pub visible: VisibleFn,
}

fn search_spec() -> ToolSpec {
    ToolSpec::read(
        SEARCH_TOOL,
        "Search the tool catalog by what you want to do. Returns matching tool names with a \
         one-line description and a score, best first. Load the ones you need with load_tools \
         to see their parameters; a tool you know the name and arguments of can be called \
         without loading it.",
        json!({
            "type": "object",
            "properties": {
                "query": {"type": "string", "minLength": 1, "maxLength": QUERY_BYTES_MAX,
                          "description": "Words describing the task, e.g. \"read a file\"."},
                "limit": {"type": "integer", "minimum": 1, "maximum": SEARCH_LIMIT_MAX,
                          "description": format!("Most results (default {SEARCH_LIMIT_DEFAULT}).")}
            },
            "required": ["query"]
        }),
    )
}

fn load_spec() -> ToolSpec {
    ToolSpec::read(
        LOAD_TOOL,
        "Load tools by name (from search_tools): returns their full definitions, and they are \
         listed for the rest of the session.",
        json!({
            "type": "object",
            "properties": {
                "names": {"type": "array", "minItems": 1, "maxItems": LOAD_NAMES_MAX,
                          "items": {"type": "string", "minLength": 1, "maxLength": ring0_core::limits::TOOL_NAME_BYTES_MAX},
                          "description": "Tool names to load."}
            },
            "required": ["names"]
        }),
    )
}

/// Registers both meta-tools.
pub(crate) fn register(registry: &mut Registry) -> Result<(), RegistrationError> {
    if let Some(taken) = NAMES.iter().find(|n| registry.get(n).is_some()) {
        return Err(RegistrationError::Duplicate(taken.to_string()));
    }
    registry.register(search_spec(), Arc::new(MetaTool::Search))?;
    registry.register(load_spec(), Arc::new(MetaTool::Load))
}

enum MetaTool {
    Search,
    Load,
}

#[async_trait]
impl Tool for MetaTool {
    async fn call(&self, ctx: CallContext, args: Value) -> Result<Observation, ToolError> {
        let Some(call) = ctx.extensions.get::<CatalogCall>() else {
            return Err(ToolError::not_applied(
                "the tool catalog is only searched from a session",
            ));
        };
        let visible = |spec: &ToolSpec| (call.visible)(spec);
        match self {
            MetaTool::Search => {
                let query = args["query"].as_str().unwrap_or_default();
                let limit = args["limit"]
                    .as_u64()
                    .map_or(SEARCH_LIMIT_DEFAULT, |l| l as usize)
                    .clamp(1, SEARCH_LIMIT_MAX);
                let hits = call.catalog.search(query, limit, visible);
                Ok(Observation::json(json!({ "tools": hits })))
            }
            MetaTool::Load => {
                let names: Vec<String> = args["names"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|n| n.as_str().map(str::to_string))
                    .collect();
                let outcome = call
                    .catalog
                    .load(&names, &call.loaded, call.visible.clone())
                    .await
                    .map_err(unavailable)?;
                let loaded: Vec<Value> = outcome
                    .loaded
                    .iter()
                    .map(|s| {
                        json!({"name": s.name, "description": s.description,
                               "parameters": s.input_schema})
                    })
                    .collect();
                let mut out = json!({ "loaded": loaded });
                if !outcome.not_found.is_empty() {
                    out["not_found"] = json!(outcome.not_found);
                }
                if !outcome.over_limit.is_empty() {
                    out["over_limit"] = json!(outcome.over_limit);
                    out["over_limit_reason"] = json!(format!(
                        "the session keeps at most {} loaded tools",
                        super::LOADED_TOOLS_MAX
                    ));
                }
                if !outcome.over_budget.is_empty() {
                    out["over_budget"] = json!(outcome.over_budget);
                    out["over_budget_reason"] = json!(format!(
                        "listing them would take this session's tool definitions over {} \
                         schema tokens; call them without loading, or start a new session",
                        call.catalog.budgets().listing_tokens_max
                    ));
                }
                Ok(Observation::json(out))
            }
        }
    }
}

/// A load refused because the conversation's shared set could not be reached: nothing was
/// loaded, and the model is told so in a form it can act on (try again).
fn unavailable(e: LoadedUnavailable) -> ToolError {
    let message = e.to_string();
    ToolError::not_applied(message.clone()).with_observation(Observation::json(json!({
        "error": {"kind": "loaded_tools_unavailable", "message": message, "retryable": true}
    })))
}

/// Grants the meta-tools (A0 reads that show only what the session may see) to every session
/// of a kernel in search mode, and has `inner` record each such decision like its own
/// ([`Authorizer::record_decided`]: the policy's audit line, rule `catalog:meta`); asks
/// `inner` about everything else.
pub(crate) struct MetaGrant {
    pub inner: Arc<dyn Authorizer>,
}

impl MetaGrant {
    fn decided(spec: &ToolSpec) -> Option<AuthDecision> {
        (is_meta(&spec.name) && spec.authority == ring0_core::Authority::A0).then(|| {
            AuthDecision::Allow {
                rule: META_RULE.into(),
            }
        })
    }
}

#[async_trait]
impl Authorizer for MetaGrant {
    async fn authorize(&self, request: &AuthRequest<'_>) -> AuthDecision {
        match Self::decided(request.spec) {
            Some(allowed) => self.inner.record_decided(request, allowed),
            None => self.inner.authorize(request).await,
        }
    }

    async fn admit(&self, request: &AuthRequest<'_>) -> AuthAdmission {
        match Self::decided(request.spec) {
            Some(allowed) => AuthAdmission::Decided(self.inner.record_decided(request, allowed)),
            None => self.inner.admit(request).await,
        }
    }

    async fn hold(&self, request: &AuthRequest<'_>) -> AuthDecision {
        match Self::decided(request.spec) {
            Some(allowed) => self.inner.record_decided(request, allowed),
            None => self.inner.hold(request).await,
        }
    }

    async fn recheck(&self, request: &AuthRequest<'_>) -> AuthDecision {
        match Self::decided(request.spec) {
            Some(allowed) => self.inner.record_decided(request, allowed),
            None => self.inner.recheck(request).await,
        }
    }

    fn visible(&self, session: &SessionInfo, spec: &ToolSpec) -> bool {
        Self::decided(spec).is_some() || self.inner.visible(session, spec)
    }

    fn record_decided(&self, request: &AuthRequest<'_>, decision: AuthDecision) -> AuthDecision {
        self.inner.record_decided(request, decision)
    }
}
