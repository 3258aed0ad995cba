//! The configuration file (`ring0.toml`) and the kernel it builds.
//!
//! Without a file, the embedded defaults ([`DEFAULT_CONFIG`]) apply: the current directory is the
//! workspace; reads and sandboxed writes in it are granted; `shell` (and `job_send_input`) and
//! anything A3 are held for a person's approval. Every key is documented on its field below and
//! in `docs/config.md`. Each section rejects unknown keys, and every value is checked when the
//! file is loaded: an invalid file is refused with the offending key and the reason, never
//! half-applied.
//!
//! [`build_kernel`] turns a loaded configuration into a kernel with the built-in tools, the
//! SQLite journal and the session's authorizer; `ring0 call`, `ring0 turn` (and any other front
//! end, such as an MCP server) share it.

use ring0_core::Authority;
use ring0_journal::SqliteJournal;
use ring0_kernel::{Authorizer, Kernel, SessionConfig};
use ring0_policy::{
    APPROVAL_TIMEOUT_MAX, ApprovalScope, Approver, Grant, JsonlAudit, Policy, RateLimit,
};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

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

# Reads and sandboxed writes in the workspace.
[[grants]]
name = "workspace"
tools = ["read_file", "list_dir", "glob", "search", "write_file", "apply_patch",
         "job_inspect", "job_wait", "job_cancel", "read_spill"]
ceiling = "A1"

# Commands: each one held for a person's approval; explicit argv only.
[[grants]]
name = "shell"
tools = ["shell", "job_send_input"]
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
    pub why: String,
}

/// The whole file. Sections other front ends add (such as `[[upstreams]]`) go here as fields.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// `[workspace]`: where the workspace and ring0's state are.
    #[serde(default)]
    pub workspace: WorkspaceSection,
    /// `[paths]`: roots the tools may read and write.
    #[serde(default)]
    pub paths: PathsSection,
    /// `[[grants]]`: what the session may call. Deny by default: a tool no grant names is
    /// neither listed nor callable. The first grant naming a tool decides for it.
    #[serde(default)]
    pub grants: Vec<GrantSection>,
    /// `[limits]`: rate and size limits.
    #[serde(default)]
    pub limits: LimitsSection,
    /// `[approval]`: how held calls wait for a person.
    #[serde(default)]
    pub approval: ApprovalSection,
    /// `[audit]`: where decisions are recorded.
    #[serde(default)]
    pub audit: AuditSection,
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
}

impl Default for ApprovalSection {
    fn default() -> Self {
        Self {
            timeout_secs: approval_timeout_default(),
        }
    }
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

/// `[shell]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShellSection {
    /// Authority `shell` and `job_send_input` declare. Default `"A2"`.
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
fn shell_authority_default() -> Authority {
    Authority::A2
}

/// Largest `read_text_bytes` (the model-visible projection of a call is at most 64 KiB).
const READ_TEXT_BYTES_MAX: usize = 48 * 1024;

/// A configuration as loaded, with where it came from.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub config: Config,
    /// The file, or `embedded defaults`.
    pub source: String,
    /// The workspace, absolute.
    pub workspace: PathBuf,
    /// The state directory, absolute.
    pub state_dir: PathBuf,
    /// The configuration file in use, absolute (`None`: the embedded defaults).
    pub config_file: Option<PathBuf>,
    /// Where a configuration file would be looked for next time (`ring0.toml` in the current
    /// directory): protected even while absent, so no tool can create one.
    pub config_default: PathBuf,
    /// The state directory is the legacy `.ring0` inside the workspace.
    pub legacy_state: bool,
    /// The directory of the configuration file (the current directory for the embedded
    /// defaults): relative paths of the file are resolved against it.
    pub config_dir: PathBuf,
}

impl Loaded {
    /// ring0's own paths, which no tool may touch: the configuration file (in use, and where one
    /// is looked for), the lock file and the state directory.
    pub fn protected(&self) -> ring0_tools::sandbox::ProtectedPaths {
        let mut files = vec![
            self.config_default.clone(),
            self.workspace.join(ring0_mcp::pin::LOCK_FILE),
        ];
        files.extend(self.config_file.iter().cloned());
        // An audit log configured outside the state directory is protected where it is.
        files.push(self.state_dir.join(&self.config.audit.path));
        ring0_tools::sandbox::ProtectedPaths {
            files,
            dirs: vec![self.state_dir.clone()],
        }
    }
}

impl Config {
    /// Parses and checks `text`; `source` names it in errors.
    pub fn parse(text: &str, source: &str) -> Result<Config, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|e| ConfigError {
            file: source.to_string(),
            key: e
                .span()
                .map(|s| key_near(text, s.start))
                .unwrap_or_else(|| "(file)".into()),
            why: e.message().to_string(),
        })?;
        config.check(source)?;
        Ok(config)
    }

    /// The embedded defaults.
    pub fn embedded() -> Config {
        Config::parse(DEFAULT_CONFIG, "embedded defaults").expect("the embedded defaults are valid")
    }

    fn check(&self, source: &str) -> Result<(), ConfigError> {
        let err = |key: String, why: String| ConfigError {
            file: source.to_string(),
            key,
            why,
        };
        for (i, g) in self.grants.iter().enumerate() {
            self.grant(i, g).map_err(|(key, why)| err(key, why))?;
        }
        if let Some(rate) = &self.limits.principal_rate {
            RateLimit::parse(rate)
                .map_err(|e| err("limits.principal_rate".into(), e.to_string()))?;
        }
        if let Some(rate) = &self.limits.session_rate {
            RateLimit::parse(rate).map_err(|e| err("limits.session_rate".into(), e.to_string()))?;
        }
        if self.limits.max_concurrent_tools == 0 || self.limits.max_concurrent_tools > 256 {
            return Err(err(
                "limits.max_concurrent_tools".into(),
                "must be between 1 and 256".into(),
            ));
        }
        if !(1024..=READ_TEXT_BYTES_MAX).contains(&self.limits.read_text_bytes) {
            return Err(err(
                "limits.read_text_bytes".into(),
                format!("must be between 1024 and {READ_TEXT_BYTES_MAX}"),
            ));
        }
        if !(1..=16).contains(&self.limits.search_workers) {
            return Err(err(
                "limits.search_workers".into(),
                "must be between 1 and 16".into(),
            ));
        }
        if self.approval.timeout_secs == 0
            || self.approval.timeout_secs > APPROVAL_TIMEOUT_MAX.as_secs()
        {
            return Err(err(
                "approval.timeout_secs".into(),
                format!("must be between 1 and {}", APPROVAL_TIMEOUT_MAX.as_secs()),
            ));
        }
        ring0_mcp::config::validate(&self.upstreams)
            .map_err(|e| err("upstreams".into(), e.to_string()))?;
        // Paths are only joined here; the key set is read when `serve --http` starts.
        self.auth.validate(Path::new(".")).map_err(|why| {
            let (key, why) = why.split_once(": ").unwrap_or(("auth", why.as_str()));
            err(key.to_string(), why.to_string())
        })?;
        if self.paths.read.is_empty() && self.paths.write.is_empty() {
            return Err(err("paths".into(), "grants no root at all".into()));
        }
        Ok(())
    }

    fn grant(&self, i: usize, g: &GrantSection) -> Result<Grant, (String, String)> {
        let key = |k: &str| format!("grants[{i}].{k}");
        let patterns: Vec<&str> = g.tools.iter().map(String::as_str).collect();
        let mut grant = Grant::new(&g.name, &patterns, g.ceiling)
            .approval(g.approval)
            .shell(g.shell)
            .principals(g.principals.iter().cloned())
            .groups(g.groups.iter().cloned());
        if let Some(scope) = &g.approval_scope {
            grant = grant.approval_scope(
                ApprovalScope::parse(scope).map_err(|why| (key("approval_scope"), why))?,
            );
        }
        for (j, rule) in g.rules.iter().enumerate() {
            grant = grant
                .rule(rule)
                .map_err(|e| (key(&format!("rules[{j}]")), e.to_string()))?;
        }
        if let Some(rate) = &g.rate {
            grant = grant.rate(RateLimit::parse(rate).map_err(|e| (key("rate"), e.to_string()))?);
        }
        grant.validate().map_err(|why| {
            let k = if why.contains("pattern") || why.contains("tools") {
                "tools"
            } else if why.contains("principal") {
                "principals"
            } else if why.contains("name") {
                "name"
            } else {
                "rules"
            };
            (key(k), why)
        })?;
        Ok(grant)
    }

    /// Loads `path`, or `ring0.toml` in `cwd` if it exists, or the embedded defaults. The state
    /// directory is `state_dir` (the `--state-dir` flag, relative to `cwd`) when given, else
    /// `[workspace] state_dir`, else the legacy `.ring0` of the workspace if one exists, else
    /// the default outside the workspace.
    pub fn load(
        path: Option<&Path>,
        cwd: &Path,
        state_dir: Option<&Path>,
    ) -> Result<Loaded, ConfigError> {
        let default_file = cwd.join(CONFIG_FILE_DEFAULT);
        let file = match path {
            Some(p) => Some(if p.is_absolute() {
                p.to_path_buf()
            } else {
                cwd.join(p)
            }),
            None => default_file.exists().then_some(default_file),
        };
        let config_file = file
            .as_ref()
            .map(|f| std::fs::canonicalize(f).unwrap_or(f.clone()));
        let (config, source, base) = match file {
            None => (
                Config::embedded(),
                "embedded defaults".to_string(),
                cwd.to_path_buf(),
            ),
            Some(file) => {
                let source = file.display().to_string();
                let text = read_bounded(&file).map_err(|why| ConfigError {
                    file: source.clone(),
                    key: "(file)".into(),
                    why,
                })?;
                let config = Config::parse(&text, &source)?;
                let base = file
                    .parent()
                    .map(Path::to_path_buf)
                    .unwrap_or_else(|| cwd.to_path_buf());
                (config, source, base)
            }
        };
        let root = base.join(&config.workspace.root);
        let workspace = std::fs::canonicalize(&root).map_err(|e| ConfigError {
            file: source.clone(),
            key: "workspace.root".into(),
            why: format!("{}: {e}", root.display()),
        })?;
        let choice = crate::state::choose(
            state_dir.map(|d| cwd.join(d)),
            config.workspace.state_dir.as_ref().map(|d| base.join(d)),
            &workspace,
        )
        .map_err(|why| ConfigError {
            file: source.clone(),
            key: "workspace.state_dir".into(),
            why,
        })?;
        let config_default = std::fs::canonicalize(cwd)
            .unwrap_or_else(|_| cwd.to_path_buf())
            .join(CONFIG_FILE_DEFAULT);
        Ok(Loaded {
            config,
            source,
            workspace,
            state_dir: choice.dir,
            config_file,
            config_default,
            legacy_state: choice.legacy,
            config_dir: base,
        })
    }
}

/// Reads a configuration file, refusing one beyond [`CONFIG_BYTES_MAX`].
pub fn read_bounded(path: &Path) -> Result<String, String> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let mut text = String::new();
    file.take(CONFIG_BYTES_MAX + 1)
        .read_to_string(&mut text)
        .map_err(|e| e.to_string())?;
    if text.len() as u64 > CONFIG_BYTES_MAX {
        return Err(format!("larger than {CONFIG_BYTES_MAX} bytes"));
    }
    Ok(text)
}

/// The dotted key of the table and line around byte `at`, for parse errors.
fn key_near(text: &str, at: usize) -> String {
    let before = &text[..at.min(text.len())];
    let line_no = before.matches('\n').count() + 1;
    let line = text.lines().nth(line_no - 1).unwrap_or_default();
    let table = before
        .lines()
        .rev()
        .find_map(|l| {
            let l = l.trim();
            l.starts_with('[')
                .then(|| l.trim_matches(|c| c == '[' || c == ']').to_string())
        })
        .unwrap_or_default();
    let key = line.split('=').next().unwrap_or_default().trim();
    let key = if line.contains('=') { key } else { "" };
    match (table.is_empty(), key.is_empty()) {
        (true, true) => format!("line {line_no}"),
        (true, false) => format!("{key} (line {line_no})"),
        (false, true) => format!("{table} (line {line_no})"),
        (false, false) => format!("{table}.{key} (line {line_no})"),
    }
}

/// The session's authorizer and a kernel with the built-in tools and the SQLite journal.
pub struct Built {
    pub kernel: Kernel,
    pub authorizer: Arc<dyn Authorizer>,
    /// The policy behind `authorizer` (its state is keyed by principal and session, so every
    /// session of a front end shares it).
    #[allow(dead_code)] // read by front ends that serve several sessions
    pub policy: Policy,
    pub max_concurrent_tools: usize,
    /// The state directory's manifest, recorded again when the kernel is dropped.
    _state: crate::state::Manifest,
}

impl Built {
    /// A session configuration with this configuration's authorizer and limits.
    pub fn session_config(&self, scope: &str) -> SessionConfig {
        SessionConfig::new(scope)
            .authorizer(self.authorizer.clone())
            .max_concurrent_tools(self.max_concurrent_tools)
    }
}

/// The cursor-signing key under the state directory, created (private) on first use so cursors
/// stay valid across processes.
fn cursor_key(state_dir: &Path) -> Result<Vec<u8>, String> {
    let path = state_dir.join("cursor.key");
    if let Ok(key) = std::fs::read(&path)
        && key.len() >= 32
    {
        return Ok(key);
    }
    let mut key = Vec::with_capacity(32);
    key.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
    key.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    use std::io::Write;
    options
        .open(&path)
        .and_then(|mut f| f.write_all(&key))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(key)
}

/// What a configuration provides before a kernel is built: the built-in tools, the session's
/// policy and the journal. A front end that builds its own kernel (an MCP gateway adding
/// upstream tools) takes these; [`build_kernel`] assembles them into a kernel.
pub struct Parts {
    pub tools: Vec<ring0_tools::ToolEntry>,
    pub policy: Policy,
    pub journal: Arc<SqliteJournal>,
    pub max_concurrent_tools: usize,
    /// The state directory's manifest (recorded again on drop: the audit log's length at exit).
    pub state: crate::state::Manifest,
}

/// The built-in tools (configured from `[paths]`, `[limits]`, `[shell]`), the policy (from
/// `[[grants]]`, `[limits]`, `[approval]`, `[audit]`) and the SQLite journal at
/// `state_dir/journal.db`. `approver` decides held calls (the terminal's approvals directory for
/// the CLI; an MCP client's elicitation for a server).
pub fn build_parts(loaded: &Loaded, approver: Arc<dyn Approver>) -> Result<Parts, ConfigError> {
    let config = &loaded.config;
    let err = |key: &str, why: String| ConfigError {
        file: loaded.source.clone(),
        key: key.to_string(),
        why,
    };
    crate::state::prepare(&loaded.state_dir).map_err(|why| err("workspace.state_dir", why))?;
    if loaded.legacy_state {
        eprintln!(
            "ring0: {}",
            crate::state::legacy_warning(&loaded.state_dir, &loaded.workspace)
        );
    }
    let audit_path = loaded.state_dir.join(&config.audit.path);
    let journal_path = loaded.state_dir.join(crate::state::JOURNAL_FILE);
    let mut manifest = crate::state::Manifest::check(&loaded.state_dir, &journal_path, &audit_path)
        .map_err(|why| err("workspace.state_dir", why))?;
    let mut tools_config = ring0_tools::ToolsConfig::new(
        &loaded.workspace,
        &loaded.state_dir,
        cursor_key(&loaded.state_dir).map_err(|why| err("workspace.state_dir", why))?,
    );
    tools_config.protected = loaded.protected();
    tools_config.read_roots = config.paths.read.clone();
    tools_config.write_roots = config.paths.write.clone();
    tools_config.read_text_bytes_max = config.limits.read_text_bytes;
    tools_config.search_workers = config.limits.search_workers;
    tools_config.shell.authority = config.shell.authority;
    tools_config.shell.allow_command_string = config.grants.iter().any(|g| g.shell);
    if let Some(env) = &config.shell.env_allow {
        tools_config.shell.env_allow = env.clone();
    }
    let tools =
        ring0_tools::builtin_tools(&tools_config).map_err(|e| err("paths", e.to_string()))?;
    crate::state::create_journal_files(&journal_path)
        .map_err(|why| err("workspace.state_dir", why))?;
    let journal = SqliteJournal::open(&journal_path).map_err(|e| {
        err(
            "workspace.state_dir",
            format!("journal {}: {e}", journal_path.display()),
        )
    })?;
    let audit = JsonlAudit::open(&audit_path)
        .map_err(|e| err("audit.path", format!("{}: {e}", audit_path.display())))?;
    manifest
        .record()
        .map_err(|why| err("workspace.state_dir", why))?;
    let mut policy = Policy::builder()
        .approver(approver)
        .approval_timeout(Duration::from_secs(config.approval.timeout_secs))
        .audit(Arc::new(audit))
        .audit_args(config.audit.include_args)
        .sandboxed_tools(ring0_tools::SANDBOXED_TOOLS.iter().copied())
        .shell_arg(
            ring0_tools::SHELL_STRING_ARG.0,
            ring0_tools::SHELL_STRING_ARG.1,
        )
        // The same tool's explicit argv: an inline script there is a command string too.
        .argv_arg(ring0_tools::SHELL_STRING_ARG.0, "argv");
    for (i, g) in config.grants.iter().enumerate() {
        let grant = config.grant(i, g).map_err(|(key, why)| err(&key, why))?;
        policy = policy
            .grant(grant)
            .map_err(|why| err(&format!("grants[{i}]"), why))?;
    }
    if let Some(rate) = &config.limits.session_rate {
        policy = policy.session_rate(
            RateLimit::parse(rate).map_err(|e| err("limits.session_rate", e.to_string()))?,
        );
    }
    if let Some(rate) = &config.limits.principal_rate {
        policy = policy.principal_rate(
            RateLimit::parse(rate).map_err(|e| err("limits.principal_rate", e.to_string()))?,
        );
    }
    Ok(Parts {
        tools,
        policy: policy.build(),
        journal: Arc::new(journal),
        max_concurrent_tools: config.limits.max_concurrent_tools,
        state: manifest,
    })
}

/// Builds the kernel (built-in tools, SQLite journal) and the session's authorizer from a loaded
/// configuration; see [`build_parts`].
pub fn build_kernel(loaded: &Loaded, approver: Arc<dyn Approver>) -> Result<Built, ConfigError> {
    let parts = build_parts(loaded, approver)?;
    let mut builder = Kernel::builder().journal(parts.journal);
    for (spec, tool) in parts.tools {
        builder = builder.tool(spec, tool).map_err(|e| ConfigError {
            file: loaded.source.clone(),
            key: "(tools)".into(),
            why: e.to_string(),
        })?;
    }
    let authorizer: Arc<dyn Authorizer> = Arc::new(parts.policy.clone());
    Ok(Built {
        kernel: builder.authorizer(authorizer.clone()).build(),
        authorizer,
        policy: parts.policy,
        max_concurrent_tools: parts.max_concurrent_tools,
        _state: parts.state,
    })
}

/// The approvals directory of a state directory.
pub fn approvals_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("approvals")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_defaults_are_valid() {
        let c = Config::embedded();
        assert_eq!(c.grants.len(), 3);
        assert!(c.grants[1].approval);
    }

    #[test]
    fn unknown_key_is_named() {
        let e = Config::parse("[limits]\nsesion_rate = \"1/s\"\n", "t.toml").unwrap_err();
        assert!(e.key.contains("limits.sesion_rate"), "{e}");
        assert!(e.why.contains("unknown field"), "{e}");
    }

    #[test]
    fn bad_rule_is_named_with_its_index() {
        let e = Config::parse(
            "[[grants]]\nname = \"g\"\ntools = [\"*\"]\nceiling = \"A0\"\nrules = [\"true\", \"args.x ==\"]\n",
            "t.toml",
        )
        .unwrap_err();
        assert_eq!(e.key, "grants[0].rules[1]");
    }

    #[test]
    fn auth_mistakes_are_named_by_key() {
        let e = Config::parse(
            "[[auth.tokens]]\nname = \"ci\"\nsha256 = \"not-hex\"\n",
            "t.toml",
        )
        .unwrap_err();
        assert_eq!(e.key, "auth.tokens[0].sha256");
        let e = Config::parse(
            "[auth.jwt]\nissuer = \"https://id.test\"\njwks_url = \"http://id.test/jwks\"\n",
            "t.toml",
        )
        .unwrap_err();
        assert_eq!(e.key, "auth.jwt.jwks_url");
        assert!(e.why.contains("loopback"), "{e}");
        let e = Config::parse("[auth]\nresorce = \"x\"\n", "t.toml").unwrap_err();
        assert!(e.why.contains("unknown field"), "{e}");
    }

    #[test]
    fn bad_ceiling_and_rate_are_refused() {
        let e = Config::parse(
            "[[grants]]\nname = \"g\"\ntools = [\"*\"]\nceiling = \"A9\"\n",
            "t.toml",
        )
        .unwrap_err();
        assert!(e.key.contains("grants"), "{e}");
        let e = Config::parse(
            "[[grants]]\nname = \"g\"\ntools = [\"*\"]\nceiling = \"A0\"\nrate = \"5/fortnight\"\n",
            "t.toml",
        )
        .unwrap_err();
        assert_eq!(e.key, "grants[0].rate");
        let e = Config::parse("[approval]\ntimeout_secs = 0\n", "t.toml").unwrap_err();
        assert_eq!(e.key, "approval.timeout_secs");
    }
}
