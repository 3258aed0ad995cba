//! `ring0 init` and `ring0 config check`.
//!
//! `init` writes a commented `ring0.toml` for the workspace (refusing to replace one unless
//! `--force`), with the MCP servers found in client configuration files as commented upstreams.
//! `config check` loads a configuration the way every subcommand does and prints what it
//! resolves to: the sections, the grants in effect (the file's and the defaults it keeps), the
//! built-in catalog with each tool's authority and whether it is listed (and if not, why), and
//! the warnings `ring0 serve` prints at start. An invalid file is an error (exit 1) naming the
//! key and the reason. Nothing under the state directory is created or changed.

use clap::{Args, Subcommand};
use ring0_config::report::{deciding_grant, describe_grants};
use ring0_config::{CONFIG_FILE_DEFAULT, Config, Loaded};
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

#[derive(Args)]
pub struct InitArgs {
    /// Replace an existing `ring0.toml`.
    #[arg(long)]
    force: bool,
    /// Print the file on stdout instead of writing it.
    #[arg(long)]
    stdout: bool,
}

#[derive(Subcommand)]
pub enum ConfigCommand {
    /// Load the configuration, refuse it if invalid, and print what it resolves to.
    Check {
        /// Configuration file. Default: `ring0.toml` in the current directory if it exists,
        /// else the embedded defaults.
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

pub fn init(args: InitArgs) -> Result<String, String> {
    let cwd = std::env::current_dir().map_err(|e| format!("current directory: {e}"))?;
    let workspace = std::fs::canonicalize(&cwd).unwrap_or(cwd);
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let (found, skipped) = ring0_config::init::find_servers(&workspace, home.as_deref());
    for why in &skipped {
        tracing::warn!(target: "ring0", "skipped {why}");
    }
    let text = ring0_config::init::render(&workspace, &found);
    // What init writes must load; a failure here is ring0's own fault, never written out.
    Config::parse(&text, "ring0 init output").map_err(|e| e.to_string())?;
    if args.stdout {
        return Ok(text);
    }
    let path = workspace.join(CONFIG_FILE_DEFAULT);
    write_config(&path, &text, args.force)?;
    let mut out = format!("wrote {}\n", path.display());
    if !found.is_empty() {
        let aliases: Vec<&str> = found.iter().map(|f| f.alias.as_str()).collect();
        let _ = writeln!(
            out,
            "found {} MCP server(s) in client configuration files, written commented out: {}",
            found.len(),
            aliases.join(", ")
        );
    }
    out.push_str("check it with: ring0 config check\n");
    Ok(out)
}

/// Writes `text` to `path`: a new file, or with `force` a replacement (written beside it and
/// renamed over it, so a reader never sees half a file).
fn write_config(path: &Path, text: &str, force: bool) -> Result<(), String> {
    let shown = path.display();
    if !force {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::AlreadyExists => {
                    format!("{shown} exists; pass --force to replace it")
                }
                _ => format!("{shown}: {e}"),
            })?;
        return file
            .write_all(text.as_bytes())
            .map_err(|e| format!("{shown}: {e}"));
    }
    let tmp = path.with_extension("toml.new");
    std::fs::write(&tmp, text).map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("{shown}: {e}"))
}

pub fn run(command: ConfigCommand, state_dir: Option<&Path>) -> Result<String, String> {
    let ConfigCommand::Check { config } = command;
    let cwd = std::env::current_dir().map_err(|e| format!("current directory: {e}"))?;
    let loaded = Config::load(config.as_deref(), &cwd, state_dir).map_err(|e| e.to_string())?;
    let checked = ring0_config::check(&loaded).map_err(|e| e.to_string())?;
    let mut out = String::new();
    sections(&mut out, &loaded);
    let _ = writeln!(out, "\ngrants (the first that names a tool decides):");
    for line in describe_grants(&loaded.config) {
        let _ = writeln!(out, "  {line}");
    }
    let _ = writeln!(out, "\nbuilt-in tools (for principal local):");
    let local = ring0_core::Principal::local();
    for spec in &checked.catalog {
        let verdict = match checked.policy.hidden_because(spec, &local) {
            None => match deciding_grant(&loaded.config, &spec.name) {
                Some(g) if g.approval || spec.authority == ring0_core::Authority::A3 => {
                    format!("listed, grant {}, held for approval", g.name)
                }
                Some(g) => format!("listed, grant {}", g.name),
                None => "listed".to_string(),
            },
            Some(why) => format!("not listed: {why}"),
        };
        let _ = writeln!(out, "  {} {}: {verdict}", spec.name, spec.authority);
    }
    if !checked.catalog.iter().any(|s| s.name == "read_spill") {
        let _ = writeln!(
            out,
            "  read_spill A0: registered once the state directory exists (its spill store is there)"
        );
    }
    upstreams(&mut out, &loaded);
    let warnings = checked.report.lines();
    if warnings.is_empty() {
        let _ = writeln!(out, "\nok: no warnings");
    } else {
        let _ = writeln!(out, "\nwarnings:");
        for w in warnings {
            let _ = writeln!(out, "  {w}");
        }
    }
    Ok(out)
}

fn sections(out: &mut String, loaded: &Loaded) {
    let c = &loaded.config;
    let paths = |p: &[PathBuf]| {
        p.iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(out, "config: {}", loaded.source);
    let _ = writeln!(out, "workspace: {}", loaded.workspace.display());
    let _ = writeln!(out, "state: {}", loaded.state_dir.display());
    let _ = writeln!(
        out,
        "defaults: {}",
        if c.defaults {
            format!("on ({} default grant(s) added)", c.default_grants)
        } else {
            "off (only the file's grants)".to_string()
        }
    );
    let _ = writeln!(
        out,
        "paths: read [{}], write [{}]",
        paths(&c.paths.read),
        paths(&c.paths.write)
    );
    let _ = writeln!(
        out,
        "limits: session_rate {}, principal_rate {}, max_concurrent_tools {}, read_text_bytes {}, search_workers {}",
        c.limits.session_rate.as_deref().unwrap_or("none"),
        c.limits.principal_rate.as_deref().unwrap_or("none"),
        c.limits.max_concurrent_tools,
        c.limits.read_text_bytes,
        c.limits.search_workers
    );
    let _ = writeln!(out, "approval: timeout_secs {}", c.approval.timeout_secs);
    let _ = writeln!(
        out,
        "audit: {} (include_args {})",
        loaded.state_dir.join(&c.audit.path).display(),
        c.audit.include_args
    );
    let _ = writeln!(
        out,
        "shell: authority {}, env_allow [{}]",
        c.shell.authority,
        c.shell
            .env_allow
            .clone()
            .unwrap_or_else(|| ring0_exec::ENV_ALLOW_DEFAULT
                .iter()
                .map(|s| s.to_string())
                .collect())
            .join(", ")
    );
    let auth = &c.auth;
    let _ = writeln!(
        out,
        "auth: {} token(s){}",
        auth.tokens.len(),
        auth.jwt
            .as_ref()
            .map(|j| format!(", JWTs of {}", j.issuer))
            .unwrap_or_default()
    );
}

fn upstreams(out: &mut String, loaded: &Loaded) {
    let list = &loaded.config.upstreams;
    if list.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\nupstreams (not contacted here; their tools join the catalog when ring0 serve starts):"
    );
    for u in list {
        let how = match (&u.command, &u.url) {
            (Some(command), _) => format!("stdio: {command} {}", u.args.join(" ")),
            (None, Some(url)) => format!("http: {url}"),
            (None, None) => "no endpoint".to_string(),
        };
        let _ = writeln!(
            out,
            "  {}: {}{}",
            u.alias,
            how.trim_end(),
            if u.trusted { ", trusted" } else { "" }
        );
    }
}
