//! `ring0 journal ls | show <id> | sim --seeds N`, and a person's settlement of what the
//! journal could not settle: `ring0 journal resolve ID --applied|--not-applied` and
//! `ring0 journal compensate ID` (see `ring0_ops::operator`).
//!
//! A settlement acts on the journal itself. While a `ring0 serve` holds the SQLite journal (one
//! writing process at a time), the command asks that server through its control channel
//! (`ring0_ops::control`) and prints its answer; otherwise it opens the journal itself, and a
//! compensation runs through a kernel built from the configuration (its built-in tools: an
//! upstream's compensating tool is reached only through the running server).

use crate::call_cmd::SessionArgs;
use clap::{ArgGroup, Args, Subcommand};
use ring0_journal::inspect::{LIST_LIMIT_DEFAULT, render_list, render_show};
use ring0_journal::{JournalError, JournalReader, PersonFinding, SqliteJournal, run_simulation};
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

pub fn run(
    command: JournalCommand,
    path: Option<&Path>,
    state_dir: Option<&Path>,
) -> Result<String, String> {
    match command {
        JournalCommand::Resolve(args) => settle_by_hand(Settle::Resolve(args), path, state_dir),
        JournalCommand::Compensate(args) => {
            settle_by_hand(Settle::Compensate(args), path, state_dir)
        }
        JournalCommand::Ls { .. } | JournalCommand::Show { .. } | JournalCommand::Sim { .. } => {
            inspect(command, path, state_dir)
        }
    }
}

/// `ls`, `show` and `sim`: reading the journal file without its lock, or simulating.
fn inspect(
    command: JournalCommand,
    path: Option<&Path>,
    state_dir: Option<&Path>,
) -> Result<String, String> {
    let path = &match path {
        Some(path) => path.to_path_buf(),
        None if matches!(command, JournalCommand::Sim { .. }) => PathBuf::new(),
        None => {
            let cwd = std::env::current_dir().map_err(|e| format!("current directory: {e}"))?;
            ring0_config::Config::load(None, &cwd, state_dir)
                .map_err(|e| e.to_string())?
                .state_dir
                .join(ring0_config::state::JOURNAL_FILE)
        }
    };
    match command {
        JournalCommand::Sim { seeds } => {
            let report = run_simulation(seeds);
            let text = format!("{report}\n");
            if report.violations > 0 {
                return Err(format!("{text}the simulation found violations"));
            }
            Ok(text)
        }
        JournalCommand::Ls { limit } => {
            let reader = open(path)?;
            let records = reader.recent(limit).map_err(|e| e.to_string())?;
            Ok(render_list(&records))
        }
        JournalCommand::Resolve(_) | JournalCommand::Compensate(_) => {
            Err("resolve and compensate do not inspect the journal".into())
        }
        JournalCommand::Show { id } => {
            let reader = open(path)?;
            match reader.find(&id).map_err(|e| e.to_string())? {
                Some(record) => Ok(render_show(&record)),
                None => Err(format!("no intent {id:?} in {}", path.display())),
            }
        }
    }
}

fn open(path: &Path) -> Result<JournalReader, String> {
    if !path.exists() {
        return Err(format!("no journal at {}", path.display()));
    }
    JournalReader::open(path).map_err(|e| format!("{}: {e}", path.display()))
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
    let (_loaded, built) = crate::call_cmd::open(&session, state_dir)?;
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
