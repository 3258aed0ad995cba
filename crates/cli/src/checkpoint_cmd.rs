//! `ring0 checkpoint ls | restore ID [--force]`: the workspace checkpoints ring0 recorded before
//! its sessions' mutations, and putting the workspace back as it was before one of them.

use clap::Subcommand;
use ring0_checkpoint::{CHECKPOINTS_DIR, Checkpoint, Checkpoints, PathState, RestoreReport};
use ring0_config::Config;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

#[derive(Subcommand)]
pub enum CheckpointCommand {
    /// List the checkpoints, oldest first.
    Ls {
        /// Configuration file (to find the workspace and state). Default as for `ring0 call`.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Put the workspace back as it was before checkpoint ID, undoing it and every later one.
    Restore {
        /// The checkpoint (`cp-NNNNNN`, from `ring0 checkpoint ls`).
        id: String,
        /// Restore even over paths changed outside ring0 since it last wrote them.
        #[arg(long)]
        force: bool,
        /// Configuration file (to find the workspace and state). Default as for `ring0 call`.
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

pub fn run(command: CheckpointCommand, state_dir: Option<&Path>) -> Result<String, String> {
    match command {
        CheckpointCommand::Ls { config } => {
            let store = open(config.as_deref(), state_dir)?;
            Ok(render_list(&store.list().map_err(|e| e.to_string())?))
        }
        CheckpointCommand::Restore { id, force, config } => {
            let store = open(config.as_deref(), state_dir)?;
            let report = store.restore(&id, force).map_err(|e| e.to_string())?;
            Ok(render_report(&report))
        }
    }
}

fn open(config: Option<&Path>, state_dir: Option<&Path>) -> Result<Checkpoints, String> {
    let cwd = std::env::current_dir().map_err(|e| format!("current directory: {e}"))?;
    let loaded = Config::load(config, &cwd, state_dir).map_err(|e| e.to_string())?;
    let protected = loaded.protected();
    let mut skipped = protected.dirs;
    skipped.extend(protected.files);
    Checkpoints::open(loaded.state_dir.join(CHECKPOINTS_DIR), &loaded.workspace)
        .map(|store| store.skip(&skipped))
        .map_err(|e| e.to_string())
}

fn render_list(checkpoints: &[Checkpoint]) -> String {
    if checkpoints.is_empty() {
        return "no checkpoints\n".into();
    }
    let mut out = format!(
        "{:<10} {:<20} {:>6}  {:<5} {}\n",
        "ID", "CREATED (UTC)", "PATHS", "TREE", "SCOPE"
    );
    for c in checkpoints {
        let files = c
            .paths
            .values()
            .filter(|s| !matches!(s, PathState::Dir { .. }))
            .count();
        let _ = writeln!(
            out,
            "{:<10} {:<20} {:>6}  {:<5} {}",
            c.id,
            utc(c.created_ms),
            files,
            if c.tree { "yes" } else { "no" },
            c.scope
        );
    }
    out
}

fn render_report(report: &RestoreReport) -> String {
    let mut out = format!(
        "restored {} (undid {}): {} written, {} directories created, {} removed\n",
        report.id,
        report.undone.join(", "),
        report.written.len(),
        report.dirs_created.len(),
        report.removed.len()
    );
    for (label, paths) in [
        ("written", &report.written),
        ("created", &report.dirs_created),
        ("removed", &report.removed),
        (
            "overwritten (changed outside ring0)",
            &report.overwritten_outside_changes,
        ),
        ("kept (holds ignored files)", &report.dirs_kept),
    ] {
        for path in paths {
            let _ = writeln!(out, "  {label}: {path}");
        }
    }
    out
}

/// `YYYY-MM-DD HH:MM:SS` of milliseconds since the Unix epoch, in UTC.
fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rest) = ((secs / 86_400) as i64, secs % 86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_renders_civil_time() {
        assert_eq!(super::utc(0), "1970-01-01 00:00:00");
        assert_eq!(super::utc(1_796_083_200_000), "2026-12-01 00:00:00");
        assert_eq!(
            super::utc(951_782_400_000 + 3_661_000),
            "2000-02-29 01:01:01"
        );
    }
}
