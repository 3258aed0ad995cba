//! Loading a configuration: parsing with key-named errors, checking every value, and resolving
//! the workspace, the state directory and ring0's protected paths.
//!
//! An invalid file is refused with the offending key and the reason, never half-applied.

use crate::schema::{
    CONFIG_BYTES_MAX, CONFIG_FILE_DEFAULT, Config, ConfigError, DEFAULT_CONFIG, GrantSection,
};
use ring0_core::Authority;
use ring0_policy::{APPROVAL_TIMEOUT_MAX, ApprovalScope, Grant, RateLimit};
use std::path::{Path, PathBuf};

/// Largest `read_text_bytes` (the model-visible projection of a call is at most 64 KiB).
const READ_TEXT_BYTES_MAX: usize = 48 * 1024;
/// The least authority `shell` and `job_send_input` may declare: a command's effect is
/// non-idempotent and reaches beyond the workspace sandbox, with no way to settle an ambiguous
/// outcome, so anything lower would let the policy run it as a read or a sandboxed write.
pub const SHELL_AUTHORITY_MIN: Authority = Authority::A2;

/// A configuration as loaded, with where it came from.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The configuration, parsed and checked.
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
    /// Parses and checks `text`; `source` names it in errors. The embedded default grants are
    /// added after the file's own unless it says `defaults = false`.
    pub fn parse(text: &str, source: &str) -> Result<Config, ConfigError> {
        let mut config = Self::parse_alone(text, source)?;
        if config.defaults {
            let defaults = Self::parse_alone(DEFAULT_CONFIG, "embedded defaults")
                .expect("the embedded defaults are valid");
            let before = config.grants.len();
            for grant in defaults.grants {
                if !config.grants.iter().any(|g| g.name == grant.name) {
                    config.grants.push(grant);
                }
            }
            config.default_grants = config.grants.len() - before;
        }
        if config.grants.len() > ring0_policy::GRANTS_MAX {
            return Err(ConfigError {
                file: source.to_string(),
                key: "grants".into(),
                why: format!(
                    "{} grants (with the defaults); at most {} are allowed",
                    config.grants.len(),
                    ring0_policy::GRANTS_MAX
                ),
            });
        }
        Ok(config)
    }

    /// Parses and checks `text` as written, without the default grants.
    fn parse_alone(text: &str, source: &str) -> Result<Config, ConfigError> {
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
        let mut config = Self::parse_alone(DEFAULT_CONFIG, "embedded defaults")
            .expect("the embedded defaults are valid");
        config.default_grants = config.grants.len();
        config
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
        for (key, url) in [
            ("approval.webhook_url", &self.approval.webhook_url),
            (
                "approval.webhook_link_base",
                &self.approval.webhook_link_base,
            ),
        ] {
            if let Some(url) = url
                && !(url.starts_with("http://") || url.starts_with("https://"))
            {
                return Err(err(
                    key.into(),
                    format!("{url:?} must be an http:// or https:// URL"),
                ));
            }
        }
        ring0_mcp::config::validate(&self.upstreams)
            .map_err(|e| err("upstreams".into(), e.to_string()))?;
        // Paths are only joined here; the key set is read when `serve --http` starts.
        self.auth.validate(Path::new(".")).map_err(|why| {
            let (key, why) = why.split_once(": ").unwrap_or(("auth", why.as_str()));
            err(key.to_string(), why.to_string())
        })?;
        self.http.check().map_err(|why| {
            let (key, why) = why.split_once(" must").unwrap_or(("http", why.as_str()));
            err(key.to_string(), format!("must{why}"))
        })?;
        if self.shell.authority < SHELL_AUTHORITY_MIN {
            return Err(err(
                "shell.authority".into(),
                format!(
                    "{} is below what shell's effect requires ({SHELL_AUTHORITY_MIN}): a command \
                     acts outside the workspace sandbox and its outcome cannot be settled. To run \
                     some commands without approval, write a grant for shell with rules that \
                     limit them and unattended = true (docs/config.md, \"Commands without \
                     approval\")",
                    self.shell.authority
                ),
            ));
        }
        self.sandbox.check().map_err(|(key, why)| err(key, why))?;
        self.journal.check().map_err(|(key, why)| err(key, why))?;
        self.telemetry.check().map_err(|(key, why)| err(key, why))?;
        self.check_catalog().map_err(|(key, why)| err(key, why))?;
        if self.paths.read.is_empty() && self.paths.write.is_empty() {
            return Err(err("paths".into(), "grants no root at all".into()));
        }
        Ok(())
    }

    fn check_catalog(&self) -> Result<(), (String, String)> {
        use ring0_kernel::catalog::PINNED_TOOLS_MAX;
        let catalog = &self.catalog;
        if catalog.pinned.len() > PINNED_TOOLS_MAX {
            return Err((
                "catalog.pinned".into(),
                format!(
                    "names {} tools; at most {PINNED_TOOLS_MAX} are pinned",
                    catalog.pinned.len()
                ),
            ));
        }
        if let Some((i, name)) = catalog
            .pinned
            .iter()
            .enumerate()
            .find(|(_, n)| !ring0_kernel::registry::valid_tool_name(n))
        {
            return Err((
                format!("catalog.pinned[{i}]"),
                format!("{name:?} is not a tool name"),
            ));
        }
        if catalog.auto_tools_max == 0 {
            return Err(("catalog.auto_tools_max".into(), "must be at least 1".into()));
        }
        if catalog.auto_tokens_max == 0 {
            return Err((
                "catalog.auto_tokens_max".into(),
                "must be at least 1".into(),
            ));
        }
        if catalog.tool_tokens_max == 0 {
            return Err((
                "catalog.tool_tokens_max".into(),
                "must be at least 1".into(),
            ));
        }
        // A tool the listing budget cannot hold could never be loaded in search mode.
        if catalog.listing_tokens_max < catalog.tool_tokens_max {
            return Err((
                "catalog.listing_tokens_max".into(),
                format!(
                    "{} is below catalog.tool_tokens_max {}: a tool within its own budget \
                     could not be listed",
                    catalog.listing_tokens_max, catalog.tool_tokens_max
                ),
            ));
        }
        Ok(())
    }

    pub(crate) fn grant(&self, i: usize, g: &GrantSection) -> Result<Grant, (String, String)> {
        let key = |k: &str| format!("grants[{i}].{k}");
        let patterns: Vec<&str> = g.tools.iter().map(String::as_str).collect();
        let mut grant = Grant::new(&g.name, &patterns, g.ceiling)
            .approval(g.approval)
            .shell(g.shell)
            .unattended(g.unattended)
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
        if let Some(name) = &g.sandbox {
            self.sandbox.grant_profile(key("sandbox"), name)?;
            grant = grant.sandbox(name);
        }
        if let Some(name) = &g.sandbox_wider {
            self.sandbox.grant_profile(key("sandbox_wider"), name)?;
            grant = grant.sandbox_wider(name);
        }
        grant.validate().map_err(|why| {
            let k = if why.contains("pattern") || why.contains("tools") {
                "tools"
            } else if why.contains("principal") {
                "principals"
            } else if why.contains("unattended") {
                "unattended"
            } else if why.contains("sandbox") {
                "sandbox_wider"
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
    fn telemetry_mistakes_are_named_by_key() {
        for (text, key) in [
            (
                "[telemetry]\nendpoint = \"collector:4318\"\n",
                "telemetry.endpoint",
            ),
            (
                "[telemetry]\nsample_ratio = 1.5\n",
                "telemetry.sample_ratio",
            ),
            (
                "[telemetry]\nheaders_env = { \"bad header\" = \"V\" }\n",
                "telemetry.headers_env",
            ),
            (
                "[telemetry]\nheaders_env = { \"x-key\" = \"\" }\n",
                "telemetry.headers_env.x-key",
            ),
            (
                "[telemetry]\nservice_name = \"\"\n",
                "telemetry.service_name",
            ),
            ("[telemetry]\nendpont = \"http://c\"\n", "telemetry.endpont"),
        ] {
            let e = Config::parse(text, "t.toml").unwrap_err();
            assert!(e.key.contains(key), "{text}: {e}");
        }
        let ok = Config::parse(
            "[telemetry]\nendpoint = \"https://c.example:4318/v1/traces\"\nsample_ratio = 0.25\n",
            "t.toml",
        )
        .unwrap();
        assert_eq!(ok.telemetry.sample_ratio, 0.25);
    }

    #[test]
    fn a_telemetry_header_from_an_unset_variable_is_named_without_a_value() {
        let c = Config::parse(
            "[telemetry]\nheaders_env = { \"x-key\" = \"RING0_TEST_SURELY_UNSET_VAR\" }\n",
            "t.toml",
        )
        .unwrap();
        let why = c.telemetry.headers().unwrap_err();
        assert!(why.contains("RING0_TEST_SURELY_UNSET_VAR"), "{why}");
        assert!(why.contains("headers_env.x-key"), "{why}");
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
    fn catalog_mistakes_are_named_by_key() {
        let c = Config::parse("[catalog]\nmode = \"auto\"\n", "t.toml").unwrap();
        assert_eq!(
            c.catalog.kernel_config().mode,
            ring0_kernel::catalog::CatalogMode::Auto
        );
        let e = Config::parse("[catalog]\nmode = \"lazy\"\n", "t.toml").unwrap_err();
        assert!(e.key.contains("catalog"), "{e}");
        let e =
            Config::parse("[catalog]\npinned = [\"ok\", \"no spaces\"]\n", "t.toml").unwrap_err();
        assert_eq!(e.key, "catalog.pinned[1]");
        let e = Config::parse("[catalog]\nauto_tools_max = 0\n", "t.toml").unwrap_err();
        assert_eq!(e.key, "catalog.auto_tools_max");
        let e = Config::parse("[catalog]\ntool_tokens_max = 0\n", "t.toml").unwrap_err();
        assert_eq!(e.key, "catalog.tool_tokens_max");
        let e = Config::parse(
            "[catalog]\ntool_tokens_max = 500\nlisting_tokens_max = 400\n",
            "t.toml",
        )
        .unwrap_err();
        assert_eq!(e.key, "catalog.listing_tokens_max");
        assert!(e.to_string().contains("500"), "{e}");
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
