//! Tool traits in one metadata plane.
//!
//! A tool's strategy and execution profile start in code (the [`ToolSpec`] builder:
//! `.strategy(&[Strategy::Neutral]).execution(ExecutionProfile::EARLY)`) and may be added to or
//! overridden per connection by configuration, keyed by the tool's *unqualified* callable name,
//! with `"*"` for every tool of the connection. Precedence: code < `"*"` < the named entry.
//! Both converge once, when the kernel is built; the catalog rendering and the runtime then read
//! the same resolved values independently — correctness never depends on the model reading the
//! catalog.

use ring0_core::{ExecutionProfile, StrategySet, ToolSpec};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The connection of tools registered without one (in-process Rust tools).
pub const LOCAL_CONNECTION: &str = "local";

/// Traits configuration adds or overrides for one tool (or `"*"`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraitOverride {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<StrategySet>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution: Option<ExecutionProfile>,
}

/// One connection's `tool_traits`: unqualified callable name (or `"*"`) → override.
pub type ConnectionTraits = BTreeMap<String, TraitOverride>;

/// Applies a connection's configuration to a tool declared in code.
pub fn resolve(spec: &mut ToolSpec, callable: &str, config: Option<&ConnectionTraits>) {
    let Some(config) = config else { return };
    for key in ["*", callable] {
        if let Some(o) = config.get(key) {
            if let Some(strategy) = o.strategy {
                spec.strategy = strategy;
            }
            if let Some(execution) = o.execution {
                spec.execution = execution;
            }
        }
    }
}

/// Whether a call of this tool may start while the model is still generating: an exactly
/// neutral strategy and the complete execution profile. Anything else takes the ordinary
/// post-generation path.
pub fn starts_early(spec: &ToolSpec) -> bool {
    spec.strategy.is_exactly_neutral() && spec.execution.is_complete()
}

/// The catalog text of one tool as the model reads it: name, description and the stable
/// `Scope:` block with the resolved traits.
pub fn render_catalog_entry(spec: &ToolSpec) -> String {
    let mut s = format!("{}: {}\n", spec.name, spec.description.trim());
    s.push_str(&spec.scope_block());
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring0_core::Strategy;
    use serde_json::json;

    #[test]
    fn named_entries_override_the_wildcard_which_overrides_code() {
        let mut spec = ToolSpec::new("browser.click", "", json!({"type": "object"}))
            .strategy(&[Strategy::Exploration]);
        let config: ConnectionTraits = serde_json::from_value(json!({
            "*": {"strategy": ["neutral"]},
            "click": {"strategy": ["exploration", "exploitation"]}
        }))
        .unwrap();
        resolve(&mut spec, "click", Some(&config));
        assert_eq!(
            spec.strategy,
            StrategySet::of(&[Strategy::Exploration, Strategy::Exploitation])
        );
        let mut other = ToolSpec::new("browser.close", "", json!({"type": "object"}));
        resolve(&mut other, "close", Some(&config));
        assert_eq!(other.strategy, StrategySet::NEUTRAL);
    }

    #[test]
    fn early_start_needs_exact_neutral_and_the_whole_profile() {
        let base = ToolSpec::new("d", "", json!({"type": "object"}));
        assert!(starts_early(
            &base
                .clone()
                .strategy(&[Strategy::Neutral])
                .execution(ExecutionProfile::EARLY)
        ));
        assert!(!starts_early(
            &base
                .clone()
                .strategy(&[Strategy::Neutral, Strategy::Exploration])
                .execution(ExecutionProfile::EARLY)
        ));
        let partial = ExecutionProfile {
            replay: None,
            ..ExecutionProfile::EARLY
        };
        assert!(!starts_early(
            &base
                .clone()
                .strategy(&[Strategy::Neutral])
                .execution(partial)
        ));
        assert!(!starts_early(&base.execution(ExecutionProfile::EARLY)));
    }
}
