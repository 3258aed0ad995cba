//! `ring0 journal ls | show <id> | migrate | sim --seeds N`, and a person's settlement of
//! what the journal could not settle: `ring0 journal resolve ID --applied|--not-applied` and
//! `ring0 journal compensate ID` (see `ring0_ops::operator`).
//!
//! The journal is the one `--journal URL` names (PostgreSQL), else the file `--path` names,
//! else the configuration's: `[journal] url` (with its `password_env`) or `journal.db` in the
//! state directory. Reading a PostgreSQL journal joins no deployment: it registers no replica
//! and changes nothing, so it is safe beside running replicas.
//!
//! A settlement acts on the journal itself. While a `ring0 serve` holds the SQLite journal (one
//! writing process at a time), the command asks that server through its control channel
//! (`ring0_ops::control`) and prints its answer; otherwise it opens the journal itself, and a
//! compensation runs through a kernel built from the configuration (its built-in tools: an
//! upstream's compensating tool is reached only through the running server).

use crate::call_cmd::SessionArgs;
use clap::{ArgGroup, Args, Subcommand};
use ring0_journal::inspect::{LIST_LIMIT_DEFAULT, render_list, render_show};
use ring0_journal::{
    IntentRecord, JournalError, JournalReader, PersonFinding, PostgresReader, SqliteJournal,
    is_postgres_url, run_simulation,
};
use ring0_ops::control::{self, ControlRequest};
use ring0_ops::operator;
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
    /// Settle a DEAD_LETTER (or UNKNOWN) intent by a person's word: --applied (ACKED; an
    /// identical retry is answered with the record) or --not-applied (FAILED; a retry runs).
    Resolve(ResolveArgs),
    /// Undo an intent's effect with its tool's declared compensating tool (a journaled call of
    /// its own); the intent ends COMPENSATED.
    Compensate(CompensateArgs),
}

/// `ring0 journal resolve`.
#[derive(Args)]
#[command(group(ArgGroup::new("finding").required(true).args(["applied", "not_applied"])))]
pub struct ResolveArgs {
    /// The intent id (`ring0 journal ls` lists them).
    pub id: String,
    /// The effect happened.
    #[arg(long)]
    pub applied: bool,
    /// The effect did not happen.
    #[arg(long)]
    pub not_applied: bool,
    /// Why, recorded in the intent's timeline.
    #[arg(long, default_value = "")]
    pub note: String,
    /// Configuration file (its state directory and journal). Default as for `ring0 serve`.
    #[arg(long)]
    pub config: Option<PathBuf>,
}

/// `ring0 journal compensate`.
#[derive(Args)]
pub struct CompensateArgs {
    /// The intent id (`ring0 journal ls` lists them).
    pub id: String,
    /// Why, recorded in the intent's timeline.
    #[arg(long, default_value = "")]
    pub note: String,
    /// Configuration file (its tools, grants and journal). Default as for `ring0 serve`.
    #[arg(long)]
    pub config: Option<PathBuf>,
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
    match command {
        JournalCommand::Resolve(args) => {
            return settle_by_hand(Settle::Resolve(args), path, state_dir);
        }
        JournalCommand::Compensate(args) => {
            return settle_by_hand(Settle::Compensate(args), path, state_dir);
        }
        _ => {}
    }
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
        JournalCommand::Sim { .. } | JournalCommand::Resolve(_) | JournalCommand::Compensate(_) => {
            unreachable!("answered above")
        }
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

/// A person's settlement, as asked on the command line.
enum Settle {
    Resolve(ResolveArgs),
    Compensate(CompensateArgs),
}

impl Settle {
    fn config(&self) -> Option<&Path> {
        match self {
            Self::Resolve(a) => a.config.as_deref(),
            Self::Compensate(a) => a.config.as_deref(),
        }
    }

    fn id(&self) -> &str {
        match self {
            Self::Resolve(a) => &a.id,
            Self::Compensate(a) => &a.id,
        }
    }

    fn request(&self) -> ControlRequest {
        match self {
            Self::Resolve(a) => ControlRequest::Resolve {
                intent: a.id.clone(),
                applied: a.applied,
                note: a.note.clone(),
            },
            Self::Compensate(a) => ControlRequest::Compensate {
                intent: a.id.clone(),
                note: a.note.clone(),
            },
        }
    }
}

/// Carries out `ring0 journal resolve | compensate`: through the running server that holds
/// the journal, or on the journal itself when none does.
fn settle_by_hand(
    settle: Settle,
    path: Option<&Path>,
    state_dir: Option<&Path>,
) -> Result<String, String> {
    if path.is_some() {
        return Err(
            "--path does not apply to resolve or compensate: they act on the configured \
             journal (--config), through the running ring0 serve when one holds it"
                .into(),
        );
    }
    operator::parse_intent_id(settle.id())?;
    let cwd = std::env::current_dir().map_err(|e| format!("current directory: {e}"))?;
    let loaded =
        ring0_config::Config::load(settle.config(), &cwd, state_dir).map_err(|e| e.to_string())?;
    let rt = crate::call_cmd::runtime()?;
    if loaded.config.journal.url.is_none() {
        let file = loaded.state_dir.join(ring0_config::state::JOURNAL_FILE);
        if !file.exists() {
            return Err(format!(
                "no journal at {}: nothing to settle",
                file.display()
            ));
        }
        match SqliteJournal::open(&file) {
            Err(JournalError::Locked { .. }) => {
                let request = settle.request();
                return rt
                    .block_on(control::ask(&loaded.state_dir, &request))
                    .map(|message| format!("{message}\n"));
            }
            // Not held by a server: this command opens it below.
            Ok(journal) => drop(journal),
            Err(e) => return Err(format!("{}: {e}", file.display())),
        }
    }
    let session = SessionArgs {
        config: settle.config().map(Path::to_path_buf),
        scope: "cli".into(),
    };
    // The log is installed already (by `main`).
    let built = &crate::call_cmd::open_built(&session, state_dir)?;
    let message = rt.block_on(async {
        match &settle {
            Settle::Resolve(a) => {
                let id = operator::parse_intent_id(&a.id)?;
                let finding = if a.applied {
                    PersonFinding::Applied
                } else {
                    PersonFinding::NotApplied
                };
                let journal = built.kernel.journal().clone();
                let record = operator::resolve(journal.as_ref(), id, finding, &a.note).await?;
                Ok::<_, String>(control::describe_resolution(&record))
            }
            Settle::Compensate(a) => {
                let id = operator::parse_intent_id(&a.id)?;
                crate::call_cmd::recover(&built.kernel).await?;
                let done = operator::compensate(
                    &built.kernel,
                    Some(built.authorizer.clone()),
                    id,
                    &a.note,
                )
                .await?;
                Ok(control::describe_compensation(&done))
            }
        }
    })?;
    Ok(format!("{message}\n"))
}
