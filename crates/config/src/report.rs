//! What a configuration does to a catalog, said at start: the grants in effect (the file's own
//! and the embedded defaults it keeps), every tool it hides from every principal with the reason,
//! and every grant that names no tool at all.
//!
//! A tool is either listed or this report says why not; a grant that matches nothing (a typo, an
//! upstream that is not up) is named. `ring0 serve` prints it on stderr when it starts and
//! `ring0 config check` prints it with the resolved configuration.

use crate::schema::{Config, GrantSection};
use ring0_core::{Principal, ToolSpec};
use ring0_kernel::policy::ToolPattern;
use ring0_policy::Policy;

/// A tool no principal the configuration knows may see, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HiddenTool {
    /// The tool's name.
    pub tool: String,
    /// Why it is not listed (for the local principal, or the first one named).
    pub why: String,
}

/// What a configuration does to one catalog.
#[derive(Debug, Clone, Default)]
pub struct CatalogReport {
    /// Tools hidden from every principal, in catalog order.
    pub hidden: Vec<HiddenTool>,
    /// Grants none of whose patterns names a tool of the catalog.
    pub unmatched_grants: Vec<String>,
}

impl CatalogReport {
    /// The report of `policy` (built from `config`) over `catalog`.
    pub fn new(config: &Config, policy: &Policy, catalog: &[ToolSpec]) -> Self {
        let principals = known_principals(config);
        let hidden = catalog
            .iter()
            .filter_map(|spec| {
                let mut reasons = principals.iter().map(|p| policy.hidden_because(spec, p));
                let first = reasons.next().flatten()?;
                reasons.all(|r| r.is_some()).then(|| HiddenTool {
                    tool: spec.name.clone(),
                    why: first,
                })
            })
            .collect();
        let unmatched_grants = config
            .grants
            .iter()
            .filter(|g| !catalog.iter().any(|spec| names(g, &spec.name)))
            .map(|g| g.name.clone())
            .collect();
        Self {
            hidden,
            unmatched_grants,
        }
    }

    /// The report's lines (no prefix), warnings a person should read: one per hidden tool and
    /// one per unmatched grant.
    pub fn lines(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .hidden
            .iter()
            .map(|h| format!("not listed: {}: {}", h.tool, h.why))
            .collect();
        out.extend(
            self.unmatched_grants
                .iter()
                .map(|g| format!("grant {g:?} matches no tool")),
        );
        out
    }
}

/// Whether one of the grant's patterns names `tool`.
pub fn names(grant: &GrantSection, tool: &str) -> bool {
    grant
        .tools
        .iter()
        .any(|p| ToolPattern(p.clone()).matches(tool))
}

/// The grant that decides for `tool` when the local principal calls it, if any.
pub fn deciding_grant<'a>(config: &'a Config, tool: &str) -> Option<&'a GrantSection> {
    config
        .grants
        .iter()
        .find(|g| names(g, tool) && g.principals.is_empty() && g.groups.is_empty())
}

/// One line per grant: its name, tools, ceiling and what it adds, and whether it is one of the
/// embedded defaults.
pub fn describe_grants(config: &Config) -> Vec<String> {
    let own = config.grants.len() - config.default_grants;
    config
        .grants
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let mut extras = Vec::new();
            if g.approval {
                extras.push("held for approval".to_string());
            }
            if g.unattended {
                extras.push("unattended within its rules".to_string());
            }
            if !g.rules.is_empty() {
                extras.push(format!("{} rule(s)", g.rules.len()));
            }
            if g.shell {
                extras.push("command strings allowed".to_string());
            }
            if let Some(rate) = &g.rate {
                extras.push(format!("rate {rate}"));
            }
            if !g.principals.is_empty() || !g.groups.is_empty() {
                let who: Vec<String> = g
                    .principals
                    .iter()
                    .cloned()
                    .chain(g.groups.iter().map(|x| format!("group {x}")))
                    .collect();
                extras.push(format!("only for {}", who.join(", ")));
            }
            format!(
                "{} [{}] up to {}{}{}",
                g.name,
                g.tools.join(", "),
                g.ceiling,
                if extras.is_empty() {
                    String::new()
                } else {
                    format!(", {}", extras.join(", "))
                },
                if i >= own { " (default)" } else { "" }
            )
        })
        .collect()
}

/// The principals a configuration knows: `local`, each static token's, and one for every
/// principal id and group a grant names. A JWT's principals are not known in advance; a grant
/// limited to them shows up here through the ids and groups it names.
fn known_principals(config: &Config) -> Vec<Principal> {
    let mut out = vec![Principal::local()];
    for t in &config.auth.tokens {
        out.push(Principal::new(t.principal_id()).with_groups(t.groups.iter().cloned()));
    }
    for g in &config.grants {
        out.extend(g.principals.iter().map(Principal::new));
        out.extend(
            g.groups
                .iter()
                .map(|group| Principal::new("(member)").with_groups([group.clone()])),
        );
    }
    out
}
