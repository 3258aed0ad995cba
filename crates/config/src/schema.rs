//! The schema of `ring0.toml`: every section and key, with its default and its documentation.
//!
//! Without a file, the embedded defaults ([`DEFAULT_CONFIG`]) apply: the current directory is the
//! workspace; reads and sandboxed writes in it are granted, and so is `shell`, whose commands run
//! in the OS sandbox (`[sandbox]`); `job_send_input` and anything A3 are held for a person's
//! approval. Every key is documented on its field below and
//! in `docs/config.md`. Each section rejects unknown keys.

use ring0_core::Authority;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// File looked for in the current directory when `--config` is not given.
pub const CONFIG_FILE_DEFAULT: &str = "ring0.toml";
/// Largest configuration file read.
pub const CONFIG_BYTES_MAX: u64 = 1024 * 1024;

/// The embedded defaults, used when no configuration file exists.
pub const DEFAULT_CONFIG: &str = r#"
[workspace]
root = "."

[paths]
read = ["."]
write = ["."]

# Reads and sandboxed writes in the workspace, and commands in the OS sandbox (explicit argv
# only).
[[grants]]
name = "workspace"
tools = ["read_file", "list_dir", "glob", "search", "write_file", "apply_patch", "shell",
         "job_inspect", "job_wait", "job_cancel", "read_spill"]
ceiling = "A1"

# Input to a running job: each one held for a person's approval.
[[grants]]
name = "shell"
tools = ["job_send_input"]
ceiling = "A2"
approval = true

# Anything else, up to irreversible actions: held for a person's approval.
[[grants]]
name = "held"
tools = ["*"]
ceiling = "A3"
approval = true
"#;

/// An invalid configuration: the key and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {key}: {why}")]
pub struct ConfigError {
    /// The file, or `embedded defaults`.
    pub file: String,
    /// The offending key, as a path (`grants[1].rules[0]`).
    pub key: String,
    /// Why the value is refused.
    pub why: String,
}

/// The whole file. Sections other front ends add (such as `[[upstreams]]`) go here as fields.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Whether the embedded default grants are added after the file's own `[[grants]]`
    /// (a default grant whose name the file already uses is left out). Default `true`; a
    /// top-level key, so it must come before the first table.
    #[serde(default = "yes")]
    pub defaults: bool,
    /// `[workspace]`: where the workspace and ring0's state are.
    #[serde(default)]
    pub workspace: WorkspaceSection,
    /// `[paths]`: roots the tools may read and write.
    #[serde(default)]
    pub paths: PathsSection,
    /// `[[grants]]`: what the session may call. Deny by default: a tool no grant names is
    /// neither listed nor callable. The first grant naming a tool decides for it. After loading,
    /// the file's grants followed by the embedded defaults it did not turn off.
    #[serde(default)]
    pub grants: Vec<GrantSection>,
    /// How many of `grants` (at its end) are embedded defaults added by loading.
    #[serde(skip)]
    pub default_grants: usize,
    /// `[limits]`: rate and size limits.
    #[serde(default)]
    pub limits: LimitsSection,
    /// `[approval]`: how held calls wait for a person.
    #[serde(default)]
    pub approval: ApprovalSection,
    /// `[console]`: who may use the web console of `ring0 serve --http`.
    #[serde(default)]
    pub console: ConsoleSection,
    /// `[audit]`: where decisions are recorded.
    #[serde(default)]
    pub audit: AuditSection,
    /// `[journal]`: where intents are recorded (SQLite in the state directory, or a PostgreSQL
    /// database several replicas share).
    #[serde(default)]
    pub journal: JournalSection,
    /// `[shell]`: how the `shell` tool runs commands.
    #[serde(default)]
    pub shell: ShellSection,
    /// `[[upstreams]]`: MCP servers `ring0 serve` connects to (see `ring0_mcp::UpstreamConfig`).
    /// Checked here so every subcommand refuses the same invalid file.
    #[serde(default)]
    pub upstreams: Vec<ring0_mcp::UpstreamConfig>,
    /// `[auth]`: who may call `ring0 serve --http` (see `ring0_mcp::auth::AuthConfig`).
    #[serde(default)]
    pub auth: ring0_mcp::auth::AuthConfig,
    /// `[http]`: what one client of `ring0 serve --http` may hold: header and body read
    /// timeouts, the connection cap, the per-principal session cap and idle expiry (see
    /// `ring0_mcp::door::DoorConfig`).
    #[serde(default)]
    pub http: ring0_mcp::door::DoorConfig,
    /// `[sandbox]`: the OS sandbox of the processes ring0 starts (see [`crate::sandbox`]).
    #[serde(default)]
    pub sandbox: crate::sandbox::SandboxSection,
    /// `[catalog]`: how `ring0 serve` lists the tools (see `ring0_kernel::catalog`).
    #[serde(default)]
    pub catalog: CatalogSection,
    /// `[telemetry]`: where `ring0 serve` exports traces (OTLP/HTTP); off unless configured
    /// here or by the standard `OTEL_EXPORTER_OTLP_*` variables.
    #[serde(default)]
    pub telemetry: TelemetrySection,
}

/// `[telemetry]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetrySection {
    /// The collector's OTLP/HTTP traces URL, used as is (`http://127.0.0.1:4318/v1/traces`).
    /// Default: none; `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, else `OTEL_EXPORTER_OTLP_ENDPOINT`
    /// with `/v1/traces` appended, and without either, no traces. This key wins over them.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// Request headers, each from an environment variable, so the file holds no secret:
    /// `headers_env = { "x-api-key" = "COLLECTOR_KEY" }`. A variable that is not set stops
    /// `ring0 serve` at start. `OTEL_EXPORTER_OTLP_TRACES_HEADERS` /
    /// `OTEL_EXPORTER_OTLP_HEADERS` add to them.
    #[serde(default)]
    pub headers_env: BTreeMap<String, String>,
    /// `service.name` of the spans. Default: `OTEL_SERVICE_NAME`, else `ring0`.
    #[serde(default)]
    pub service_name: Option<String>,
    /// The fraction of traces ring0 starts that are sampled, 0.0 to 1.0. Default 1.0. A call
    /// whose client sent a `traceparent` follows that trace's sampled flag.
    #[serde(default = "sample_ratio_default")]
    pub sample_ratio: f64,
}

impl Default for TelemetrySection {
    fn default() -> Self {
        Self {
            endpoint: None,
            headers_env: BTreeMap::new(),
            service_name: None,
            sample_ratio: sample_ratio_default(),
        }
    }
}

fn sample_ratio_default() -> f64 {
    1.0
}

/// Most headers `[telemetry] headers_env` may name.
pub const TELEMETRY_HEADERS_MAX: usize = 32;

impl TelemetrySection {
    /// Checks the section's values (the collector itself is reached when spans are exported).
    pub fn check(&self) -> Result<(), (String, String)> {
        let err = |key: &str, why: String| Err((format!("telemetry.{key}"), why));
        if let Some(url) = &self.endpoint {
            let scheme_ok = url.starts_with("http://") || url.starts_with("https://");
            if !scheme_ok || url.parse::<http::Uri>().is_err() {
                return err(
                    "endpoint",
                    format!(
                        "{url:?} is not an http:// or https:// URL (the OTLP/HTTP traces URL, such as http://127.0.0.1:4318/v1/traces)"
                    ),
                );
            }
        }
        if !(0.0..=1.0).contains(&self.sample_ratio) {
            return err("sample_ratio", "must be between 0.0 and 1.0".into());
        }
        if self.headers_env.len() > TELEMETRY_HEADERS_MAX {
            return err(
                "headers_env",
                format!("names at most {TELEMETRY_HEADERS_MAX} headers"),
            );
        }
        for (name, var) in &self.headers_env {
            if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return err("headers_env", format!("{name:?} is not a header name"));
            }
            if var.is_empty() || var.contains('=') || var.contains('\0') {
                return err(
                    &format!("headers_env.{name}"),
                    format!("{var:?} is not an environment variable name"),
                );
            }
        }
        if self.service_name.as_deref().is_some_and(str::is_empty) {
            return err("service_name", "must not be empty".into());
        }
        Ok(())
    }

    /// The headers' values, read from their variables now: a variable that is not set is an
    /// error naming it (never its value).
    pub fn headers(&self) -> Result<Vec<(String, String)>, String> {
        self.headers_env
            .iter()
            .map(|(name, var)| match std::env::var(var) {
                Ok(value) => Ok((name.clone(), value)),
                Err(_) => Err(format!(
                    "[telemetry] headers_env.{name}: the variable {var} is not set"
                )),
            })
            .collect()
    }
}

/// `[catalog]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CatalogSection {
    /// `"full"` lists every tool a session may see; `"search"` lists only `pinned`, the
    /// meta-tools `search_tools` and `load_tools`, and the tools the session loaded; `"auto"`
    /// is search above `auto_tools_max` tools or `auto_tokens_max` schema tokens, full below.
    /// Default `"full"`.
    #[serde(default)]
    pub mode: ring0_kernel::catalog::CatalogMode,
    /// Tools always listed in search mode, in this order (when they exist and the session's
    /// grants show them). Default the built-ins a coding agent uses most: `read_file`,
    /// `list_dir`, `glob`, `search`, `write_file`, `apply_patch`, `shell`. At most 64.
    #[serde(default = "pinned_default")]
    pub pinned: Vec<String>,
    /// `"auto"`: search mode above this many tools. Default 64.
    #[serde(default = "auto_tools_default")]
    pub auto_tools_max: usize,
    /// `"auto"`: search mode above this many schema tokens (o200k) for the whole catalog.
    /// Default 16000.
    #[serde(default = "auto_tokens_default")]
    pub auto_tokens_max: u64,
    /// Schema tokens (o200k) one tool's definition may cost. A tool over it is still served
    /// and reported (a warning when `ring0 serve` starts, an error of `ring0 tools --lint`).
    /// Default 2000.
    #[serde(default = "tool_tokens_default")]
    pub tool_tokens_max: u64,
    /// Schema tokens (o200k) of what a session is sent up front (its listing). Search mode
    /// refuses a `load_tools` that would go over it; in full mode a catalog over it is a warning
    /// when `ring0 serve` starts and an error of `ring0 tools --lint`. Default 32000.
    #[serde(default = "listing_tokens_default")]
    pub listing_tokens_max: u64,
}

impl Default for CatalogSection {
    fn default() -> Self {
        Self {
            mode: Default::default(),
            pinned: pinned_default(),
            auto_tools_max: auto_tools_default(),
            auto_tokens_max: auto_tokens_default(),
            tool_tokens_max: tool_tokens_default(),
            listing_tokens_max: listing_tokens_default(),
        }
    }
}

impl CatalogSection {
    /// The kernel's catalog configuration.
    pub fn kernel_config(&self) -> ring0_kernel::catalog::CatalogConfig {
        ring0_kernel::catalog::CatalogConfig {
            mode: self.mode,
            pinned: self.pinned.clone(),
            auto_tools_max: self.auto_tools_max,
            auto_tokens_max: self.auto_tokens_max,
            budgets: ring0_kernel::catalog::SchemaBudgets {
                tool_tokens_max: self.tool_tokens_max,
                listing_tokens_max: self.listing_tokens_max,
            },
        }
    }
}

/// `[workspace]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceSection {
    /// The workspace directory; relative to the configuration file's directory. Default `"."`.
    #[serde(default = "dot")]
    pub root: PathBuf,
    /// ring0's state (journal, approvals, audit log, pins, job logs, spill, cursor key);
    /// relative to the configuration file's directory. Default: outside the workspace, see
    /// [`crate::state::default_state_dir`]. The `--state-dir` flag overrides it.
    #[serde(default)]
    pub state_dir: Option<PathBuf>,
}

impl Default for WorkspaceSection {
    fn default() -> Self {
        Self {
            root: dot(),
            state_dir: None,
        }
    }
}

/// `[paths]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathsSection {
    /// Directories the tools may read, relative to the workspace or absolute. Default `["."]`.
    #[serde(default = "dots")]
    pub read: Vec<PathBuf>,
    /// Directories the tools may write (and read). Default `["."]`.
    #[serde(default = "dots")]
    pub write: Vec<PathBuf>,
}

impl Default for PathsSection {
    fn default() -> Self {
        Self {
            read: dots(),
            write: dots(),
        }
    }
}

/// One `[[grants]]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrantSection {
    /// Names the grant in decisions and the audit log (`grant:NAME`). Required.
    pub name: String,
    /// Tool names: exact, a prefix ending in `*`, or `*`. Required.
    pub tools: Vec<String>,
    /// Highest authority a tool of this grant may have: `"A0"` read, `"A1"` sandboxed write,
    /// `"A2"` external effect with a declared settlement, `"A3"` irreversible (always held for
    /// approval). Required.
    pub ceiling: Authority,
    /// Hold every call of this grant for a person's approval. Default `false`.
    #[serde(default)]
    pub approval: bool,
    /// Allow `shell`'s `command` string (run by `/bin/sh -c`) and an `argv` that starts a shell
    /// or interpreter with an inline script (`sh -c`, `python -c`, `node -e`, …); otherwise only
    /// plain `argv`. Default `false`.
    #[serde(default)]
    pub shell: bool,
    /// CEL expressions over `args`, `session`, `principal` and `tool`; all must be true. A rule
    /// that errors (including one naming an absent argument) denies. Default none.
    #[serde(default)]
    pub rules: Vec<String>,
    /// Calls per tool under this grant, per principal: `"N/s"`, `"N/min"`, `"N/h"` or
    /// `"N/day"`. Default none.
    #[serde(default)]
    pub rate: Option<String>,
    /// The grant applies only to these principal ids (and to `groups`). Default: everyone.
    #[serde(default)]
    pub principals: Vec<String>,
    /// The grant applies only to principals in these groups (and to `principals`). Default:
    /// everyone.
    #[serde(default)]
    pub groups: Vec<String>,
    /// What one approval may cover: `"once"` (the approved call only), `"session"` (the person
    /// may also allow identical calls for the rest of the session) or a duration such as
    /// `"30m"` (the same, lapsing after that long; s, m, h; at most 24h). Default `"once"`.
    #[serde(default)]
    pub approval_scope: Option<String>,
    /// Let an A2 tool that declares no way to settle an ambiguous outcome (`shell`,
    /// `job_send_input`) run without approval whenever every rule holds. Needs `rules`.
    /// Default `false`: such a tool is listed under this grant only with `approval = true`.
    #[serde(default)]
    pub unattended: bool,
    /// The sandbox profile (`[sandbox.profiles.NAME]`, or `"workspace"`) the `shell` commands
    /// and jobs of this grant's calls run in, instead of `[sandbox]`'s choice for `shell`.
    /// Default none.
    #[serde(default)]
    pub sandbox: Option<String>,
    /// A wider sandbox profile a `shell` call of this grant that the sandbox stopped
    /// (`sandbox_denied`) may be run again in: the call names it in `sandbox_profile` and is held
    /// for a person's approval. Default none.
    #[serde(default)]
    pub sandbox_wider: Option<String>,
}

/// `[limits]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsSection {
    /// Calls per session of one principal, all tools together (`"N/min"` …). Default none.
    #[serde(default)]
    pub session_rate: Option<String>,
    /// Calls per principal across all its sessions, all tools together. Default none.
    #[serde(default)]
    pub principal_rate: Option<String>,
    /// Calls running at once in one round. Default 8.
    #[serde(default = "concurrency_default")]
    pub max_concurrent_tools: usize,
    /// Bytes of file text one `read_file` result carries (JSON-escaped). Default 32768.
    #[serde(default = "read_text_default")]
    pub read_text_bytes: usize,
    /// Threads of one `search`. Default 2.
    #[serde(default = "search_workers_default")]
    pub search_workers: usize,
}

impl Default for LimitsSection {
    fn default() -> Self {
        Self {
            session_rate: None,
            principal_rate: None,
            max_concurrent_tools: concurrency_default(),
            read_text_bytes: read_text_default(),
            search_workers: search_workers_default(),
        }
    }
}

/// `[approval]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalSection {
    /// Seconds a held call waits for `ring0 approve` / `ring0 deny` before it is refused as
    /// `approval_timeout`. Default 300, at most 86400.
    #[serde(default = "approval_timeout_default")]
    pub timeout_secs: u64,
    /// `ring0 serve` POSTs each held call to this URL (`http://` or `https://`) with signed,
    /// one-time, expiring approve and deny links (see `docs/operations.md`, "The webhook").
    #[serde(default)]
    pub webhook_url: Option<String>,
    /// Where the webhook's receiver reaches ring0's HTTP listener, the links' base
    /// (`http://host:port`). Default: the `--http` address.
    #[serde(default)]
    pub webhook_link_base: Option<String>,
}

impl Default for ApprovalSection {
    fn default() -> Self {
        Self {
            timeout_secs: approval_timeout_default(),
            webhook_url: None,
            webhook_link_base: None,
        }
    }
}

/// `[console]`: the web console at `/console` serves operators only.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsoleSection {
    /// Principals (ids) with the operator role. Default `["local"]`: the person at this
    /// machine (a loopback listener without credentials, or `--token-env`).
    #[serde(default = "console_operators_default")]
    pub operators: Vec<String>,
    /// Groups (a token's `groups`, a JWT's mapped groups) with the operator role. Default
    /// `["operator"]`.
    #[serde(default = "console_operator_groups_default")]
    pub operator_groups: Vec<String>,
}

impl Default for ConsoleSection {
    fn default() -> Self {
        Self {
            operators: console_operators_default(),
            operator_groups: console_operator_groups_default(),
        }
    }
}

fn console_operators_default() -> Vec<String> {
    vec!["local".into()]
}

fn console_operator_groups_default() -> Vec<String> {
    vec!["operator".into()]
}

/// `[audit]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditSection {
    /// JSON-lines audit log, relative to the state directory. Default `"audit.jsonl"`.
    #[serde(default = "audit_path_default")]
    pub path: PathBuf,
    /// Record each call's arguments too (they may hold secrets). Default `false`: only their
    /// fingerprint.
    #[serde(default)]
    pub include_args: bool,
}

impl Default for AuditSection {
    fn default() -> Self {
        Self {
            path: audit_path_default(),
            include_args: false,
        }
    }
}

/// `[journal]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JournalSection {
    /// A PostgreSQL database (`postgres://user@host:port/db?sslmode=require`) shared by every
    /// replica of a deployment. Default: none, the embedded SQLite journal `journal.db` in the
    /// state directory. `ring0 serve --journal URL` overrides it.
    #[serde(default)]
    pub url: Option<String>,
    /// The environment variable holding the database password, so the file need not. Default:
    /// none (the URL's password, if any).
    #[serde(default)]
    pub password_env: Option<String>,
    /// How long a replica's records stay its own after its last heartbeat; a replica that stops
    /// (killed, partitioned) leaves its calls in flight to the others' recovery after this.
    /// Default 10,000 ms, at least 200.
    #[serde(default = "journal_lease_ms_default")]
    pub lease_ms: u64,
    /// Database connections each replica keeps. Default 16, between 1 and 256.
    #[serde(default = "journal_pool_connections_default")]
    pub pool_connections: usize,
}

impl Default for JournalSection {
    fn default() -> Self {
        Self {
            url: None,
            password_env: None,
            lease_ms: journal_lease_ms_default(),
            pool_connections: journal_pool_connections_default(),
        }
    }
}

fn journal_lease_ms_default() -> u64 {
    ring0_journal::limits::POSTGRES_LEASE_MS_DEFAULT
}

fn journal_pool_connections_default() -> usize {
    ring0_journal::limits::POSTGRES_POOL_CONNECTIONS_DEFAULT
}

/// Most pooled connections `[journal] pool_connections` may ask for.
pub const JOURNAL_POOL_CONNECTIONS_MAX: usize = 256;

/// `[shell]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShellSection {
    /// Authority `shell` and `job_send_input` declare: `"A2"` (the default, the least their
    /// effect allows: commands act outside the workspace sandbox) or `"A3"` (every command
    /// held for approval whatever the grant says).
    #[serde(default = "shell_authority_default")]
    pub authority: Authority,
    /// Environment variables commands inherit. Default PATH, HOME, LANG, LC_ALL, LC_CTYPE, TZ,
    /// TMPDIR.
    #[serde(default)]
    pub env_allow: Option<Vec<String>>,
}

impl Default for ShellSection {
    fn default() -> Self {
        Self {
            authority: shell_authority_default(),
            env_allow: None,
        }
    }
}

fn yes() -> bool {
    true
}
fn dot() -> PathBuf {
    PathBuf::from(".")
}
fn dots() -> Vec<PathBuf> {
    vec![dot()]
}
fn concurrency_default() -> usize {
    ring0_kernel::MAX_CONCURRENT_TOOLS_DEFAULT
}
fn read_text_default() -> usize {
    ring0_tools::files::READ_TEXT_BYTES_DEFAULT
}
fn search_workers_default() -> usize {
    ring0_tools::SEARCH_WORKERS_DEFAULT
}
fn approval_timeout_default() -> u64 {
    ring0_policy::APPROVAL_TIMEOUT_DEFAULT.as_secs()
}
fn audit_path_default() -> PathBuf {
    PathBuf::from("audit.jsonl")
}
fn pinned_default() -> Vec<String> {
    ring0_kernel::catalog::PINNED_DEFAULT
        .iter()
        .map(|s| s.to_string())
        .collect()
}
fn auto_tools_default() -> usize {
    ring0_kernel::catalog::AUTO_TOOLS_MAX_DEFAULT
}
fn auto_tokens_default() -> u64 {
    ring0_kernel::catalog::AUTO_TOKENS_MAX_DEFAULT
}
fn tool_tokens_default() -> u64 {
    ring0_kernel::catalog::TOOL_TOKENS_MAX_DEFAULT
}
fn listing_tokens_default() -> u64 {
    ring0_kernel::catalog::LISTING_TOKENS_MAX_DEFAULT
}
fn shell_authority_default() -> Authority {
    Authority::A2
}

impl JournalSection {
    /// Checks the section's values (the database itself is reached when the journal opens).
    pub fn check(&self) -> Result<(), (String, String)> {
        let err = |key: &str, why: String| Err((format!("journal.{key}"), why));
        if let Some(url) = &self.url
            && !ring0_journal::is_postgres_url(url)
        {
            return err(
                "url",
                "must be a PostgreSQL URL (postgres://…); without it the journal is SQLite in \
                 the state directory"
                    .into(),
            );
        }
        let lease_min = ring0_journal::limits::POSTGRES_LEASE_MS_MIN;
        if self.lease_ms < lease_min {
            return err("lease_ms", format!("must be at least {lease_min}"));
        }
        if !(1..=JOURNAL_POOL_CONNECTIONS_MAX).contains(&self.pool_connections) {
            return err(
                "pool_connections",
                format!("must be between 1 and {JOURNAL_POOL_CONNECTIONS_MAX}"),
            );
        }
        if self.password_env.is_some() && self.url.is_none() {
            return err("password_env", "applies to a PostgreSQL url only".into());
        }
        Ok(())
    }
}
