//! `ring0 token add NAME [--principal ID] [--group G]…`: a new static bearer token for
//! `ring0 serve --http`.
//!
//! The token is generated from the system's random source and printed once, on stdout; only
//! its SHA-256 hash is written, as a `[[auth.tokens]]` entry appended to the configuration file.
//! Without a configuration file, `ring0.toml` is created holding the embedded defaults and the
//! entry, so the default grants stay in force. The file is replaced whole (written beside it,
//! then renamed), and only after the new content has been checked like any configuration.

use clap::{Args, Subcommand};
use ring0_config::{CONFIG_FILE_DEFAULT, Config, DEFAULT_CONFIG, read_bounded};
use ring0_mcp::auth::token::{self, TokenEntry};
use std::path::{Path, PathBuf};

#[derive(Args)]
pub struct TokenArgs {
    #[command(subcommand)]
    command: TokenCommand,
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Generate a token, print it once and add its hash to the config as `[[auth.tokens]]`.
    Add(AddArgs),
}

#[derive(Args)]
struct AddArgs {
    /// Names the token (unique in the config).
    name: String,
    /// The principal the token authenticates as (default: NAME).
    #[arg(long, value_name = "ID")]
    principal: Option<String>,
    /// A group of the principal (repeatable).
    #[arg(long = "group", value_name = "G")]
    groups: Vec<String>,
    /// The TOML config to add to (default: ./ring0.toml, created if absent).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
}

pub fn run(args: TokenArgs) -> Result<String, String> {
    match args.command {
        TokenCommand::Add(add) => run_add(add),
    }
}

fn run_add(args: AddArgs) -> Result<String, String> {
    let cwd = std::env::current_dir().map_err(|e| format!("current directory: {e}"))?;
    let path = match &args.config {
        Some(p) if p.is_absolute() => p.clone(),
        Some(p) => cwd.join(p),
        None => cwd.join(CONFIG_FILE_DEFAULT),
    };
    let existing = match path.try_exists() {
        Ok(true) => Some(read_bounded(&path).map_err(|why| format!("{}: {why}", path.display()))?),
        Ok(false) => None,
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let secret = token::generate()?;
    let entry = TokenEntry {
        name: args.name.clone(),
        sha256: token::hash_hex(&secret),
        principal: args.principal.clone(),
        groups: args.groups.clone(),
    };
    let text = with_entry(existing.as_deref(), &entry)?;
    // The new file is checked as a whole (unique names, valid entry) before it replaces the old.
    Config::parse(&text, &path.display().to_string()).map_err(|e| e.to_string())?;
    replace(&path, &text)?;
    tracing::warn!(
        target: "ring0",
        "token {:?} for principal {:?} added to {} (only its hash is stored; the token is shown once)",
        entry.name,
        entry.principal_id(),
        path.display()
    );
    Ok(format!("{secret}\n"))
}

/// The configuration text with `entry` appended (to the embedded defaults if there is none).
fn with_entry(existing: Option<&str>, entry: &TokenEntry) -> Result<String, String> {
    #[derive(serde::Serialize)]
    struct Tokens<'a> {
        tokens: [&'a TokenEntry; 1],
    }
    #[derive(serde::Serialize)]
    struct Wrapper<'a> {
        auth: Tokens<'a>,
    }
    let table = toml::to_string(&Wrapper {
        auth: Tokens { tokens: [entry] },
    })
    .map_err(|e| format!("writing the entry: {e}"))?;
    let mut text = existing.unwrap_or(DEFAULT_CONFIG).to_string();
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push('\n');
    text.push_str(&table);
    Ok(text)
}

/// Writes `text` beside `path` and renames it over `path`, keeping the old file's permissions
/// (a new file is private to its owner).
fn replace(path: &Path, text: &str) -> Result<(), String> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| CONFIG_FILE_DEFAULT.into());
    let temp = dir.join(format!(".{name}.{}.tmp", uuid::Uuid::new_v4().simple()));
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let result = options
        .open(&temp)
        .and_then(|mut f| {
            f.write_all(text.as_bytes())?;
            if let Ok(meta) = std::fs::metadata(path) {
                f.set_permissions(meta.permissions())?;
            }
            f.sync_all()
        })
        .and_then(|()| std::fs::rename(&temp, path));
    result.map_err(|e| {
        let _ = std::fs::remove_file(&temp);
        format!("{}: {e}", path.display())
    })
}
