//! `ring0 journal ls | show <id> | sim --seeds N`.

use clap::Subcommand;
use ring0_journal::inspect::{LIST_LIMIT_DEFAULT, render_list, render_show};
use ring0_journal::{JournalReader, run_simulation};
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
}

pub fn run(
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
