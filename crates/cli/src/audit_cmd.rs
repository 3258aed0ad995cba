//! `ring0 audit verify [--path FILE]`: checks the audit log's hash chain and reports the first
//! broken or missing link with its line number (exit status 1), or how many lines are intact.

use crate::config::Config;
use clap::{Args, Subcommand};
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum AuditCommand {
    /// Check every link of the audit log's hash chain and its head file.
    Verify(VerifyArgs),
}

#[derive(Args)]
pub struct VerifyArgs {
    /// The audit log. Default: the configured `[audit] path` in the state directory.
    #[arg(long)]
    pub path: Option<PathBuf>,
    /// Configuration file (to find the audit log). Default as for `ring0 call`.
    #[arg(long)]
    pub config: Option<PathBuf>,
}

pub fn run(command: AuditCommand, state_dir: Option<&std::path::Path>) -> Result<String, String> {
    let AuditCommand::Verify(args) = command;
    let path = match args.path {
        Some(path) => path,
        None => {
            let cwd = std::env::current_dir().map_err(|e| format!("current directory: {e}"))?;
            let loaded =
                Config::load(args.config.as_deref(), &cwd, state_dir).map_err(|e| e.to_string())?;
            loaded.state_dir.join(&loaded.config.audit.path)
        }
    };
    let report = ring0_policy::verify_chain(&path)
        .map_err(|broken| format!("audit log {}: {broken}", path.display()))?;
    Ok(format!(
        "audit log {}: {} lines, chain intact{}\n",
        path.display(),
        report.lines,
        if report.anchored {
            ""
        } else {
            " (no head file: lines cut off the end would go unnoticed)"
        }
    ))
}
