//! `ring0 journal ls | show <id> | migrate | sim --seeds N`.
//!
//! The journal is the one `--journal URL` names (PostgreSQL), else the file `--path` names,
//! else the configuration's: `[journal] url` (with its `password_env`) or `journal.db` in the
//! state directory. Reading a PostgreSQL journal joins no deployment: it registers no replica
//! and changes nothing, so it is safe beside running replicas.

use clap::Subcommand;
use ring0_journal::inspect::{LIST_LIMIT_DEFAULT, render_list, render_show};
use ring0_journal::{
    IntentRecord, JournalError, JournalReader, PostgresReader, SqliteJournal, is_postgres_url,
    run_simulation,
};
use std::path::{Path, PathBuf};

#[derive(Subcommand)]
pub enum JournalCommand {
    /// List the most recent intents, newest first.
    Ls {
        #[arg(long, default_value_t = LIST_LIMIT_DEFAULT)]
        limit: usize,
    },
    /// Show one intent with its timeline and receipt.
    Show { id: String },
    /// Create the journal, or bring its schema to this build's version, and exit. Replicas
    /// migrate at start too; this lets a deployment do it once, ahead of them.
    Migrate,
    /// Run the deterministic failure-injection simulation over N seeds.
    Sim {
        #[arg(long, default_value_t = 2_000)]
        seeds: u64,
    },
}

/// Which journal a command reads.
enum Target {
    Sqlite(PathBuf),
    Postgres {
        url: String,
        password: Option<String>,
    },
}

impl Target {
    fn name(&self) -> String {
        match self {
            Self::Sqlite(path) => path.display().to_string(),
            Self::Postgres { url, .. } => ring0_journal::postgres::redact_password(url),
        }
    }
}

pub fn run(
    command: JournalCommand,
    url: Option<&str>,
    path: Option<&Path>,
    state_dir: Option<&Path>,
) -> Result<String, String> {
    if let JournalCommand::Sim { seeds } = command {
        let report = run_simulation(seeds);
        let text = format!("{report}\n");
        if report.violations > 0 {
            return Err(format!("{text}the simulation found violations"));
        }
        return Ok(text);
    }
    let target = target(url, path, state_dir)?;
    let name = target.name();
    match command {
        JournalCommand::Ls { limit } => Ok(render_list(&recent(&target, limit)?)),
        JournalCommand::Show { id } => match find(&target, &id)? {
            Some(record) => Ok(render_show(&record)),
            None => Err(format!("no intent {id:?} in {name}")),
        },
        JournalCommand::Migrate => migrate(&target),
        JournalCommand::Sim { .. } => unreachable!("answered above"),
    }
}

fn target(
    url: Option<&str>,
    path: Option<&Path>,
    state_dir: Option<&Path>,
) -> Result<Target, String> {
    if let Some(url) = url {
        if !is_postgres_url(url) {
            return Err("--journal takes a postgres:// URL (a file is --path)".into());
        }
        return Ok(Target::Postgres {
            url: url.to_string(),
            password: None,
        });
    }
    if let Some(path) = path {
        return Ok(Target::Sqlite(path.to_path_buf()));
    }
    let cwd = std::env::current_dir().map_err(|e| format!("current directory: {e}"))?;
    let loaded = ring0_config::Config::load(None, &cwd, state_dir).map_err(|e| e.to_string())?;
    let journal = &loaded.config.journal;
    match &journal.url {
        Some(url) => {
            let password =
                match &journal.password_env {
                    Some(var) => Some(std::env::var(var).map_err(|_| {
                        format!("journal.password_env names {var}, which is not set")
                    })?),
                    None => None,
                };
            Ok(Target::Postgres {
                url: url.clone(),
                password,
            })
        }
        None => Ok(Target::Sqlite(
            loaded.state_dir.join(ring0_config::state::JOURNAL_FILE),
        )),
    }
}

fn recent(target: &Target, limit: usize) -> Result<Vec<IntentRecord>, String> {
    match target {
        Target::Sqlite(path) => open_file(path)?.recent(limit),
        Target::Postgres { url, password } => open_postgres(url, password)?.recent(limit),
    }
    .map_err(|e| e.to_string())
}

fn find(target: &Target, id: &str) -> Result<Option<IntentRecord>, String> {
    match target {
        Target::Sqlite(path) => open_file(path)?.find(id),
        Target::Postgres { url, password } => open_postgres(url, password)?.find(id),
    }
    .map_err(|e| e.to_string())
}

fn migrate(target: &Target) -> Result<String, String> {
    match target {
        Target::Sqlite(path) => {
            // Opening the file journal creates it or runs the migrations it lacks.
            drop(SqliteJournal::open(path).map_err(|e| format!("{}: {e}", path.display()))?);
            Ok(format!("journal {}: schema up to date\n", path.display()))
        }
        Target::Postgres { url, password } => {
            let migrated = ring0_journal::postgres::migrate(url, password.as_deref())
                .map_err(|e| e.to_string())?;
            let name = target.name();
            Ok(if migrated.from == migrated.to {
                format!(
                    "journal {name}: schema already at version {}\n",
                    migrated.to
                )
            } else {
                format!(
                    "journal {name}: schema migrated from version {} to {}\n",
                    migrated.from, migrated.to
                )
            })
        }
    }
}

fn open_file(path: &Path) -> Result<JournalReader, String> {
    if !path.exists() {
        return Err(format!("no journal at {}", path.display()));
    }
    JournalReader::open(path).map_err(|e| format!("{}: {e}", path.display()))
}

fn open_postgres(url: &str, password: &Option<String>) -> Result<PostgresReader, String> {
    PostgresReader::open(url, password.as_deref()).map_err(|e: JournalError| e.to_string())
}
