//! Configuration of upstream connections: the `[[upstreams]]` entries of ring0's TOML config.
//!
//! ```toml
//! [[upstreams]]
//! alias = "fs"                       # tools appear as fs__read_file, …
//! command = "npx"                    # a stdio child …
//! args = ["-y", "@modelcontextprotocol/server-filesystem", "."]
//! env = ["PATH", "HOME"]             # variables passed through from ring0's environment
//! env_set = { NODE_ENV = "production" }
//! env_from_env = { API_KEY = "FS_API_KEY" }          # child's API_KEY ← ring0's $FS_API_KEY
//! env_from_file = { DB_PASSWORD = "/run/secrets/db" } # … ← the file's contents
//! cwd = "."
//! roots = ["data"]                   # what its roots/list is answered with (default: none)
//! # url = "http://127.0.0.1:9000/mcp"   # … or a Streamable HTTP server
//! # token_env = "SEARCH_TOKEN"          # Authorization: Bearer $SEARCH_TOKEN (or token_file)
//! # headers_env = { "X-Api-Key" = "SEARCH_KEY" }    # (or headers_file; headers for plain ones)
//! trusted = false                    # MCP annotations decide nothing unless trusted
//! namespace = true                   # false: expose the server's own tool names
//! call_idle_timeout_ms = 120000      # reset by progress
//! call_max_timeout_ms = 600000       # hard limit
//! report_new_optional_params = false # true: a new optional parameter alone does not quarantine
//! protocol = "auto"                  # or pin "2026-07-28" (HTTP only), "2025-11-25", "2025-06-18"
//! start_timeout_ms = 5000            # how long `ring0 serve` waits for it before serving without it
//!
//! [upstreams.tools."*"]              # runtime metadata for every tool of this server …
//! authority = "A2"
//! [upstreams.tools.read_file]        # … and per tool (unqualified name)
//! effect = "nullipotent"
//! authority = "A0"
//! strategy = ["exploration"]
//! [upstreams.tools.refund]
//! effect = "non_idempotent"
//! settlement = "probe"               # an ambiguous outcome is settled by …
//! probe = "refund_status"            # … this nullipotent tool of the same server
//! ```

use crate::limits::{
    CALL_IDLE_TIMEOUT_DEFAULT, CALL_MAX_TIMEOUT_DEFAULT, UPSTREAM_HANDSHAKE_TIMEOUT,
    UPSTREAM_START_TIMEOUT_DEFAULT,
};
use crate::names::check_alias;
use ring0_core::{Authority, ConcurrencyMark, ConflictKeyTemplate, Effect, Settlement, Strategy};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// One upstream MCP server.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamConfig {
    pub alias: String,
    /// Program of a stdio server (exclusive with `url`).
    #[serde(default)]
    pub command: Option<String>,
    #[serde(default)]
    pub args: Vec<String>,
    /// Names of environment variables passed through; nothing else is inherited.
    #[serde(default)]
    pub env: Vec<String>,
    /// Variables set explicitly (plain values, written in the config).
    #[serde(default)]
    pub env_set: BTreeMap<String, String>,
    /// Variables set from ring0's environment: child variable → the name of ring0's variable
    /// holding the value. The value is never written to the config, the log or the audit.
    #[serde(default)]
    pub env_from_env: BTreeMap<String, String>,
    /// Variables set from files: child variable → a file (outside the workspace) holding the
    /// value; one trailing newline is dropped. Read at each start of the server.
    #[serde(default)]
    pub env_from_file: BTreeMap<String, PathBuf>,
    #[serde(default)]
    pub cwd: Option<PathBuf>,
    /// Directories (relative to the workspace, or absolute) this server's `roots/list` is
    /// answered with. Default: none — the server keeps the directories it was started with.
    /// Each must lie within what the workspace grants the tools and must neither contain nor
    /// lie inside a protected path (the config, the lock file, the state directory).
    #[serde(default)]
    pub roots: Vec<PathBuf>,
    /// Endpoint of a Streamable HTTP server (exclusive with `command`).
    #[serde(default)]
    pub url: Option<String>,
    /// Request headers with plain values.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Request headers from ring0's environment: header → the variable holding its value.
    #[serde(default)]
    pub headers_env: BTreeMap<String, String>,
    /// Request headers from files: header → a file (outside the workspace) holding its value.
    #[serde(default)]
    pub headers_file: BTreeMap<String, PathBuf>,
    /// `Authorization: Bearer <token>`, the token from this variable of ring0's environment.
    #[serde(default)]
    pub token_env: Option<String>,
    /// `Authorization: Bearer <token>`, the token from this file (outside the workspace).
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// Whether the server's MCP annotations may inform effect and strategy.
    #[serde(default)]
    pub trusted: bool,
    /// List this server's tools and prompts as `alias__name` (the default). `false` keeps the
    /// server's own names, for a gateway in front of one server; a name that collides with
    /// another tool is then refused.
    #[serde(default = "default_true")]
    pub namespace: bool,
    #[serde(default)]
    pub call_idle_timeout_ms: Option<u64>,
    #[serde(default)]
    pub call_max_timeout_ms: Option<u64>,
    /// A changed definition whose only change is a new optional parameter is reported and
    /// accepted instead of quarantined. Off by default: a new parameter brings a description
    /// the model reads and a person never saw.
    #[serde(default)]
    pub report_new_optional_params: bool,
    /// The protocol era spoken to this server: `auto` (the default) tries the stateless
    /// 2026-07-28 era when an HTTP server offers it and falls back to the sessionful handshake
    /// when any step of it fails; a version pins that era, and a server that cannot speak it is
    /// reported as failing to start, never switched silently.
    #[serde(default)]
    pub protocol: UpstreamProtocol,
    /// How long `ring0 serve` waits for this server to connect and list its tools before it
    /// serves without it (the server joins later with `notifications/tools/list_changed`).
    /// Default [`UPSTREAM_START_TIMEOUT_DEFAULT`].
    #[serde(default)]
    pub start_timeout_ms: Option<u64>,
    /// ring0 is ready without this server: `/readyz` reports it down but does not answer 503
    /// for it (its tools are unavailable meanwhile). Default `false`: every upstream is
    /// needed.
    #[serde(default)]
    pub optional: bool,
    /// Runtime metadata by unqualified tool name; `"*"` applies to every tool and is overridden
    /// field by field by a tool's own entry.
    #[serde(default)]
    pub tools: BTreeMap<String, ToolOverride>,
}

fn default_true() -> bool {
    true
}

/// The `protocol` of an upstream: negotiated, or pinned to one era.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum UpstreamProtocol {
    /// The stateless era when an HTTP server offers it and it works, else the sessionful one.
    #[default]
    #[serde(rename = "auto")]
    Auto,
    /// The stateless era only (HTTP servers).
    #[serde(rename = "2026-07-28")]
    V2026_07_28,
    /// The sessionful handshake, asking for and accepting only 2025-11-25.
    #[serde(rename = "2025-11-25")]
    V2025_11_25,
    /// The sessionful handshake, asking for and accepting only 2025-06-18.
    #[serde(rename = "2025-06-18")]
    V2025_06_18,
}

impl UpstreamProtocol {
    /// The pinned version, or `None` for `auto`.
    pub fn pinned(self) -> Option<&'static str> {
        match self {
            Self::Auto => None,
            Self::V2026_07_28 => Some("2026-07-28"),
            Self::V2025_11_25 => Some("2025-11-25"),
            Self::V2025_06_18 => Some("2025-06-18"),
        }
    }
}

/// Runtime metadata a config gives an upstream tool. Absent fields keep what annotations (for a
/// trusted server) or the conservative default decided.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolOverride {
    pub effect: Option<Effect>,
    pub authority: Option<Authority>,
    pub strategy: Option<Vec<Strategy>>,
    pub concurrency: Option<ConcurrencyMark>,
    pub conflict_key: Option<ConflictKeyTemplate>,
    pub settlement: Option<Settlement>,
    pub observation_budget_bytes: Option<usize>,
    pub track_exact_repeats: Option<bool>,
    pub deterministic: Option<bool>,
    /// Accept arguments the schema does not name (ring0 closes schemas by default).
    pub open_schema: Option<bool>,
    /// A nullipotent tool of the same upstream (its unqualified name) that settles an ambiguous
    /// outcome of this tool: called for a snapshot before each dispatch and for a verdict after
    /// an UNKNOWN outcome (see `docs/config.md`, "Reconciliation probes"). Needs
    /// `settlement = "probe"`.
    pub probe: Option<String>,
    /// A tool of the same upstream (its unqualified name) that undoes this tool's effect:
    /// `ring0 journal compensate ID` calls it with the compensated call's arguments (see
    /// `docs/operations.md`, "Settling calls by hand").
    pub compensation: Option<String>,
}

/// How the server is reached.
#[derive(Debug, Clone)]
pub enum Endpoint {
    Stdio,
    Http,
}

/// A config that cannot be used, with the offending key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("upstreams[{index}].{key}: {why}")]
pub struct ConfigError {
    pub index: usize,
    pub key: String,
    pub why: String,
}

impl UpstreamConfig {
    pub fn endpoint(&self) -> Endpoint {
        if self.url.is_some() {
            Endpoint::Http
        } else {
            Endpoint::Stdio
        }
    }

    pub fn idle_timeout(&self) -> Duration {
        self.call_idle_timeout_ms
            .map(Duration::from_millis)
            .unwrap_or(CALL_IDLE_TIMEOUT_DEFAULT)
    }

    pub fn max_timeout(&self) -> Duration {
        self.call_max_timeout_ms
            .map(Duration::from_millis)
            .unwrap_or(CALL_MAX_TIMEOUT_DEFAULT)
    }

    /// How long the gateway's start waits for this server.
    pub fn start_timeout(&self) -> Duration {
        self.start_timeout_ms
            .map(Duration::from_millis)
            .unwrap_or(UPSTREAM_START_TIMEOUT_DEFAULT)
    }

    /// The override for one tool: `"*"` then the tool's own entry, field by field.
    pub fn override_for(&self, tool: &str) -> ToolOverride {
        let mut out = self.tools.get("*").cloned().unwrap_or_default();
        if let Some(own) = self.tools.get(tool) {
            macro_rules! take {
                ($($f:ident),*) => { $( if own.$f.is_some() { out.$f = own.$f.clone(); } )* };
            }
            take!(
                effect,
                authority,
                strategy,
                concurrency,
                conflict_key,
                settlement,
                observation_budget_bytes,
                track_exact_repeats,
                deterministic,
                open_schema,
                probe,
                compensation
            );
        }
        out
    }
}

/// Checks a list of upstreams: aliases valid and unique, exactly one endpoint each, timeouts
/// sensible.
pub fn validate(upstreams: &[UpstreamConfig]) -> Result<(), ConfigError> {
    let mut seen = std::collections::BTreeSet::new();
    for (index, u) in upstreams.iter().enumerate() {
        let err = |key: &str, why: String| ConfigError {
            index,
            key: key.into(),
            why,
        };
        check_alias(&u.alias).map_err(|e| err("alias", e.to_string()))?;
        if !seen.insert(u.alias.clone()) {
            return Err(err("alias", format!("{:?} is used twice", u.alias)));
        }
        match (&u.command, &u.url) {
            (Some(_), Some(_)) => {
                return Err(err(
                    "url",
                    "give either `command` or `url`, not both".into(),
                ));
            }
            (None, None) => return Err(err("command", "give `command` or `url`".into())),
            (Some(c), None) if c.trim().is_empty() => {
                return Err(err("command", "is empty".into()));
            }
            (None, Some(url)) if !(url.starts_with("http://") || url.starts_with("https://")) => {
                return Err(err("url", format!("{url:?} is not an http(s) URL")));
            }
            _ => {}
        }
        if u.url.is_some()
            && (!u.args.is_empty()
                || !u.env.is_empty()
                || !u.env_set.is_empty()
                || !u.env_from_env.is_empty()
                || !u.env_from_file.is_empty()
                || u.cwd.is_some())
        {
            return Err(err(
                "args",
                "args, env, env_set, env_from_env, env_from_file and cwd apply to stdio servers only"
                    .into(),
            ));
        }
        if u.url.is_none()
            && (!u.headers.is_empty()
                || !u.headers_env.is_empty()
                || !u.headers_file.is_empty()
                || u.token_env.is_some()
                || u.token_file.is_some())
        {
            return Err(err(
                "headers",
                "headers, headers_env, headers_file, token_env and token_file apply to HTTP servers only"
                    .into(),
            ));
        }
        check_secret_sources(u).map_err(|(key, why)| err(&key, why))?;
        if u.idle_timeout().is_zero() || u.max_timeout().is_zero() {
            return Err(err(
                "call_idle_timeout_ms",
                "timeouts must be positive".into(),
            ));
        }
        if u.idle_timeout() > u.max_timeout() {
            return Err(err(
                "call_idle_timeout_ms",
                "the idle timeout exceeds the hard maximum".into(),
            ));
        }
        if u.start_timeout_ms == Some(0) || u.start_timeout() > UPSTREAM_HANDSHAKE_TIMEOUT {
            return Err(err(
                "start_timeout_ms",
                format!(
                    "must be between 1 and {} ms",
                    UPSTREAM_HANDSHAKE_TIMEOUT.as_millis()
                ),
            ));
        }
        if u.protocol == UpstreamProtocol::V2026_07_28 && u.url.is_none() {
            return Err(err(
                "protocol",
                "\"2026-07-28\" is spoken to Streamable HTTP servers only; a stdio server speaks the sessionful handshake (\"auto\", \"2025-11-25\" or \"2025-06-18\")".into(),
            ));
        }
        for (name, o) in &u.tools {
            if let Some(compensation) = &o.compensation {
                let key = format!("tools.{name}.compensation");
                if name == "*" {
                    return Err(err(
                        &key,
                        "a compensation belongs to one tool, not to \"*\"".into(),
                    ));
                }
                if compensation.trim().is_empty() || compensation == name {
                    return Err(err(
                        &key,
                        format!("{compensation:?} must name another tool of this upstream"),
                    ));
                }
            }
            if let Some(probe) = &o.probe {
                let key = format!("tools.{name}.probe");
                if name == "*" {
                    return Err(err(
                        &key,
                        "a probe belongs to one tool, not to \"*\"".into(),
                    ));
                }
                if probe.trim().is_empty() || probe == name {
                    return Err(err(
                        &key,
                        format!("{probe:?} must name another tool of this upstream"),
                    ));
                }
                if u.override_for(name).settlement != Some(Settlement::Probe) {
                    return Err(err(
                        &key,
                        "a probe is only used with settlement = \"probe\"".into(),
                    ));
                }
            }
            if let Some(b) = o.observation_budget_bytes
                && !(ring0_shape::config::BUDGET_BYTES_MIN..=ring0_shape::config::BUDGET_BYTES_MAX)
                    .contains(&b)
            {
                return Err(err(
                    &format!("tools.{name}.observation_budget_bytes"),
                    format!(
                        "{b} is outside {}..={}",
                        ring0_shape::config::BUDGET_BYTES_MIN,
                        ring0_shape::config::BUDGET_BYTES_MAX
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Each variable and header has one source, and every source names something.
fn check_secret_sources(u: &UpstreamConfig) -> Result<(), (String, String)> {
    let mut env_names = std::collections::BTreeMap::new();
    let sources = [
        ("env_set", u.env_set.keys().collect::<Vec<_>>()),
        ("env_from_env", u.env_from_env.keys().collect()),
        ("env_from_file", u.env_from_file.keys().collect()),
    ];
    for (key, names) in sources {
        for name in names {
            if name.is_empty() || name.contains('=') || name.contains('\0') {
                return Err((key.into(), format!("{name:?} is not a variable name")));
            }
            if let Some(other) = env_names.insert(name.clone(), key) {
                return Err((
                    key.into(),
                    format!("variable {name:?} is also set by {other}; give it one source"),
                ));
            }
        }
    }
    for (child, var) in &u.env_from_env {
        if var.is_empty() {
            return Err((format!("env_from_env.{child}"), "names no variable".into()));
        }
    }
    let mut header_names = std::collections::BTreeMap::new();
    let token =
        (u.token_env.is_some() || u.token_file.is_some()).then(|| "authorization".to_string());
    if u.token_env.is_some() && u.token_file.is_some() {
        return Err((
            "token_file".into(),
            "give either token_env or token_file, not both".into(),
        ));
    }
    if let Some(t) = &u.token_env
        && t.is_empty()
    {
        return Err(("token_env".into(), "names no variable".into()));
    }
    let sources = [
        (
            "headers",
            u.headers
                .keys()
                .map(|h| h.to_ascii_lowercase())
                .collect::<Vec<_>>(),
        ),
        (
            "headers_env",
            u.headers_env
                .keys()
                .map(|h| h.to_ascii_lowercase())
                .collect(),
        ),
        (
            "headers_file",
            u.headers_file
                .keys()
                .map(|h| h.to_ascii_lowercase())
                .collect(),
        ),
        ("token_env", token.into_iter().collect()),
    ];
    for (key, names) in sources {
        for name in names {
            if reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return Err((key.into(), format!("{name:?} is not a header name")));
            }
            if let Some(other) = header_names.insert(name.clone(), key) {
                return Err((
                    key.into(),
                    format!("header {name:?} is also set by {other}; give it one source"),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(tools: &str) -> UpstreamConfig {
        let text = format!("alias = \"pay\"\ncommand = \"pay-server\"\n{tools}");
        toml::from_str(&text).expect("upstream config")
    }

    #[test]
    fn a_probe_with_probe_settlement_is_accepted_and_inherited_by_nothing_else() {
        let u = upstream(
            "[tools.refund]\nsettlement = \"probe\"\nprobe = \"refund_status\"\n[tools.\"*\"]\nauthority = \"A2\"\n",
        );
        assert_eq!(validate(std::slice::from_ref(&u)), Ok(()));
        assert_eq!(
            u.override_for("refund").probe.as_deref(),
            Some("refund_status")
        );
        assert_eq!(u.override_for("charge").probe, None);
    }

    #[test]
    fn a_probe_without_probe_settlement_is_refused_naming_the_key() {
        let u = upstream("[tools.refund]\nsettlement = \"idempotency_key\"\nprobe = \"status\"\n");
        let e = validate(&[u]).unwrap_err();
        assert_eq!(e.key, "tools.refund.probe");
        assert!(e.why.contains("settlement = \"probe\""), "{e}");
    }

    #[test]
    fn a_probe_for_every_tool_or_for_itself_is_refused() {
        let star = upstream("[tools.\"*\"]\nsettlement = \"probe\"\nprobe = \"status\"\n");
        assert_eq!(validate(&[star]).unwrap_err().key, "tools.*.probe");
        let own = upstream("[tools.refund]\nsettlement = \"probe\"\nprobe = \"refund\"\n");
        assert_eq!(validate(&[own]).unwrap_err().key, "tools.refund.probe");
    }

    #[test]
    fn protocol_defaults_to_auto_and_takes_each_pinned_era() {
        assert_eq!(upstream("").protocol, UpstreamProtocol::Auto);
        for v in ["2025-11-25", "2025-06-18"] {
            let u = upstream(&format!("protocol = {v:?}\n"));
            assert_eq!(u.protocol.pinned(), Some(v));
            assert_eq!(validate(&[u]), Ok(()));
        }
        let text = "alias = \"w\"\nurl = \"http://127.0.0.1:1/mcp\"\nprotocol = \"2026-07-28\"\n";
        let http: UpstreamConfig = toml::from_str(text).unwrap();
        assert_eq!(validate(&[http]), Ok(()));
    }

    #[test]
    fn an_unknown_protocol_is_refused_and_the_stateless_era_is_refused_for_stdio() {
        let text = "alias = \"pay\"\ncommand = \"pay-server\"\nprotocol = \"2024-01-01\"\n";
        let e = toml::from_str::<UpstreamConfig>(text).unwrap_err();
        assert!(e.to_string().contains("2024-01-01"), "{e}");
        let e = validate(&[upstream("protocol = \"2026-07-28\"\n")]).unwrap_err();
        assert_eq!(e.key, "protocol");
        assert!(e.why.contains("Streamable HTTP"), "{e}");
    }

    #[test]
    fn the_start_timeout_has_a_default_and_a_bounded_range() {
        assert_eq!(upstream("").start_timeout(), UPSTREAM_START_TIMEOUT_DEFAULT);
        assert_eq!(
            upstream("start_timeout_ms = 1500\n").start_timeout(),
            Duration::from_millis(1500)
        );
        for bad in ["0", "3600000"] {
            let e = validate(&[upstream(&format!("start_timeout_ms = {bad}\n"))]).unwrap_err();
            assert_eq!(e.key, "start_timeout_ms", "{bad}");
        }
    }
}
