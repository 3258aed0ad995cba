//! The catalog of one model turn in a provider's own tool format, for hosts that call the
//! provider themselves (the library, an HTTP API).
//!
//! With [`TurnSearch::Ring0`] the tools are the session's listing (in search mode the pinned
//! core, ring0's meta-tools and what was loaded). With [`TurnSearch::Provider`] the provider
//! searches: every tool the session may see is sent, those outside the pinned core and the
//! loaded set marked `defer_loading` (their schemas are not put in the model's context until the
//! provider's search finds them), with the provider's search tool — OpenAI Responses'
//! `tool_search`, Anthropic's BM25 tool-search tool — instead of ring0's meta-tools. Chat
//! Completions and MCP have no deferred form: they get the listing.

use super::{CatalogMode, meta};
use ring0_core::{ProviderFormat, ToolSpec};
use serde_json::{Value, json};
use std::collections::BTreeSet;

/// Who searches the catalog during a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TurnSearch {
    /// ring0's meta-tools, `search_tools` and `load_tools`.
    #[default]
    Ring0,
    /// The provider's own tool search, over deferred definitions.
    Provider,
}

/// Anthropic's BM25 tool-search tool.
pub const ANTHROPIC_TOOL_SEARCH_TYPE: &str = "tool_search_tool_bm25_20251119";
const ANTHROPIC_TOOL_SEARCH_NAME: &str = "tool_search_tool_bm25";
/// OpenAI Responses' hosted tool search.
pub const OPENAI_TOOL_SEARCH_TYPE: &str = "tool_search";

/// The tools to send with one turn, and what their schemas cost.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnCatalog {
    /// Tool definitions in the provider's format.
    pub tools: Vec<Value>,
    /// Schema tokens of the definitions a model sees up front (deferred ones excluded).
    pub schema_tokens: u64,
}

/// One definition in `format`, `defer_loading` when `deferred`.
fn definition(format: ProviderFormat, spec: &ToolSpec, deferred: bool) -> Value {
    let mut tool = match format {
        ProviderFormat::OpenAiChat => {
            return json!({"type": "function", "function": {
                "name": spec.name, "description": spec.description,
                "parameters": spec.input_schema}});
        }
        ProviderFormat::OpenAiResponses => json!({"type": "function", "name": spec.name,
            "description": spec.description, "parameters": spec.input_schema}),
        ProviderFormat::Anthropic => json!({"name": spec.name,
            "description": spec.description, "input_schema": spec.input_schema}),
        ProviderFormat::Mcp => json!({"name": spec.name,
            "description": spec.description, "inputSchema": spec.input_schema}),
    };
    if deferred {
        tool["defer_loading"] = Value::Bool(true);
    }
    tool
}

fn search_tool(format: ProviderFormat) -> Option<Value> {
    match format {
        ProviderFormat::OpenAiResponses => Some(json!({"type": OPENAI_TOOL_SEARCH_TYPE})),
        ProviderFormat::Anthropic => Some(json!({"type": ANTHROPIC_TOOL_SEARCH_TYPE,
            "name": ANTHROPIC_TOOL_SEARCH_NAME})),
        ProviderFormat::OpenAiChat | ProviderFormat::Mcp => None,
    }
}

impl crate::Session {
    /// The tools of this session's next turn in `format` (see the module docs).
    pub fn catalog_for_turn(&self, format: ProviderFormat, search: TurnSearch) -> TurnCatalog {
        let listing = self.listing();
        let native = search_tool(format).filter(|_| {
            search == TurnSearch::Provider && self.kernel.catalog.mode() == CatalogMode::Search
        });
        let Some(native) = native else {
            return TurnCatalog {
                tools: listing
                    .iter()
                    .map(|s| definition(format, s, false))
                    .collect(),
                schema_tokens: super::Catalog::listing_tokens(&listing),
            };
        };
        // The provider searches: its tool replaces ring0's meta-tools, and every other tool the
        // session may see is sent deferred.
        let upfront: Vec<&ToolSpec> = listing
            .into_iter()
            .filter(|s| !meta::is_meta(&s.name))
            .collect();
        let named: BTreeSet<&str> = upfront.iter().map(|s| s.name.as_str()).collect();
        let mut tools: Vec<Value> = upfront
            .iter()
            .map(|s| definition(format, s, false))
            .collect();
        tools.extend(
            self.kernel
                .catalog
                .visible_tools(self.visible_here())
                .filter(|s| !named.contains(s.name.as_str()))
                .map(|s| definition(format, s, true)),
        );
        tools.push(native);
        TurnCatalog {
            tools,
            schema_tokens: super::Catalog::listing_tokens(&upfront),
        }
    }
}
