//! `ring0 run [--timeout S] [--budget BYTES] [--json] -- CMD ARGS…`: one supervised command.
//!
//! Exits as `timeout(1)` does: with the command's own code; 124 when the time limit passed;
//! 128+N when signal N ended it; 125 when ring0 could not supervise it; 126 when the program
//! could not be started, 127 when it was not found.

use clap::Args;
use ring0_exec::{CommandSpec, Ending, ExecError, ExecPolicy, RunSummary, run_command};
use std::time::Duration;

/// Exit code when the time limit passed (as `timeout(1)`).
pub const EXIT_TIMED_OUT: u8 = 124;
/// Exit code when ring0 itself failed to run or supervise the command (as `timeout(1)`).
pub const EXIT_SUPERVISION_FAILED: u8 = 125;
/// Exit code when the program exists but could not be started.
pub const EXIT_CANNOT_START: u8 = 126;
/// Exit code when the program was not found.
pub const EXIT_NOT_FOUND: u8 = 127;
/// Added to a signal's number when a signal ended the command.
pub const EXIT_SIGNAL_BASE: u8 = 128;
/// The signal Ctrl-C sends; `ring0 run` interrupted exits 128 + this.
const SIGINT: u8 = 2;

#[derive(Args)]
pub struct RunArgs {
    /// Wall-clock limit in seconds; the whole process tree is torn down when it passes.
    #[arg(long, default_value_t = 60)]
    timeout: u64,
    /// Model-visible observation budget in bytes.
    #[arg(long)]
    budget: Option<usize>,
    /// Print the observation envelope and the run summary as JSON.
    #[arg(long)]
    json: bool,
    /// The program and its arguments (explicit argv; no shell).
    #[arg(required = true, last = true)]
    argv: Vec<String>,
}

/// What `ring0 run` prints on stdout, and the code it exits with.
pub struct RunOutcome {
    pub output: String,
    pub code: u8,
}

pub fn run(args: RunArgs) -> Result<RunOutcome, (String, u8)> {
    let workspace = std::env::current_dir()
        .map_err(|e| (format!("current directory: {e}"), EXIT_SUPERVISION_FAILED))?;
    let mut policy = ExecPolicy::new(workspace);
    if let Some(budget) = args.budget {
        policy = policy.observation_budget_bytes(budget);
    }
    let spec = CommandSpec::argv(args.argv).timeout(Duration::from_secs(args.timeout));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            (
                format!("starting the runtime: {e}"),
                EXIT_SUPERVISION_FAILED,
            )
        })?;
    let report = runtime.block_on(async {
        // Ctrl-C tears the tree down and still returns what was collected.
        let cancel = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        run_command(&policy, &spec, cancel).await
    });
    let report = report.map_err(|e| {
        let code = start_failure_code(&e);
        (e.to_string(), code)
    })?;
    let code = exit_code(&report.summary);
    let output = if args.json {
        let value =
            serde_json::json!({"observation": report.observation, "summary": report.summary});
        let text = serde_json::to_string_pretty(&value)
            .map_err(|e| (e.to_string(), EXIT_SUPERVISION_FAILED))?;
        format!("{text}\n")
    } else {
        let mut out = report.observation.text.clone();
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
        out
    };
    Ok(RunOutcome { output, code })
}

/// The code `ring0 run` exits with for a command that ran.
fn exit_code(summary: &RunSummary) -> u8 {
    let own = summary
        .exit
        .and_then(|exit| match (exit.code, exit.signal) {
            (Some(code), _) => Some(u8::try_from(code & 0xff).unwrap_or(EXIT_SUPERVISION_FAILED)),
            (None, Some(signal)) => Some(signal_code(signal)),
            (None, None) => None,
        });
    match summary.ending {
        Ending::TimedOut => EXIT_TIMED_OUT,
        Ending::Cancelled => EXIT_SIGNAL_BASE + SIGINT,
        Ending::SupervisionFailed => EXIT_SUPERVISION_FAILED,
        Ending::Exited | Ending::OutputCeiling => own.unwrap_or(EXIT_SUPERVISION_FAILED),
    }
}

fn signal_code(signal: i32) -> u8 {
    u8::try_from(signal)
        .ok()
        .and_then(|n| EXIT_SIGNAL_BASE.checked_add(n))
        .unwrap_or(EXIT_SUPERVISION_FAILED)
}

/// The code for a command that never started.
fn start_failure_code(error: &ExecError) -> u8 {
    match error {
        ExecError::Spawn { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            EXIT_NOT_FOUND
        }
        ExecError::Spawn { .. } => EXIT_CANNOT_START,
        _ => EXIT_SUPERVISION_FAILED,
    }
}
