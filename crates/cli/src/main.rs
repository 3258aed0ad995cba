//! The `ring0` binary: thin glue over the library crates.
//!
//! Every subcommand parses its arguments, calls one library entry point and prints the result;
//! no mediation logic lives here. Exit codes: 0 success, 1 the operation failed (reported on
//! stderr), 2 bad usage.

use clap::{Args, Parser, Subcommand};
use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

mod approve_cmd;
mod audit_cmd;
mod call_cmd;
mod checkpoint_cmd;
mod journal_cmd;
mod run_cmd;
mod serve_cmd;
mod shape_cmd;
mod token_cmd;
mod turn_cmd;

#[derive(Parser)]
#[command(
    name = "ring0",
    version,
    about = "The supervisor between a model's tool calls and the world."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// ring0's state directory (journal, audit log, approvals, pins, jobs, keys). Default:
    /// `[workspace] state_dir`, else `$XDG_STATE_HOME/ring0/<workspace id>/` (or
    /// `~/.local/state/ring0/<workspace id>/`). Relative to the current directory.
    #[arg(long, global = true, value_name = "DIR", env = "RING0_STATE_DIR")]
    state_dir: Option<PathBuf>,
}

#[derive(Subcommand)]
enum Command {
    /// Inspect the intent journal or run its deterministic simulation.
    Journal(JournalArgs),
    /// Shape standard input into a bounded, sanitized observation (`cargo build 2>&1 | ring0 shape`).
    Shape(shape_cmd::ShapeArgs),
    /// Run one command under supervision and print its shaped observation.
    Run(run_cmd::RunArgs),
    /// Serve MCP (stdio, or Streamable HTTP with --http): built-in and upstream tools, every call mediated.
    Serve(serve_cmd::ServeArgs),
    /// Approve a quarantined upstream tool (`alias__tool`), or list those waiting (--list).
    ApproveTool(serve_cmd::ApproveArgs),
    /// Make one mediated call with the configured grants and print its result (`ring0 call read_file '{"path":"README.md"}'`).
    Call(call_cmd::CallArgs),
    /// Mediate every call of one model turn read from standard input and print the tool-result message(s) in its format.
    Turn(turn_cmd::TurnArgs),
    /// Approve a call held for approval (`ring0 approve ap_…`); without an id, list the pending ones.
    Approve(approve_cmd::DecideArgs),
    /// Deny a call held for approval (`ring0 deny ap_… --reason TEXT`).
    Deny(approve_cmd::DecideArgs),
    /// Manage the static bearer tokens of `serve --http` (`ring0 token add NAME`).
    Token(token_cmd::TokenArgs),
    /// Check the audit log (`ring0 audit verify`).
    Audit {
        #[command(subcommand)]
        command: audit_cmd::AuditCommand,
    },
    /// List workspace checkpoints, or put the workspace back as it was before one (`ring0 checkpoint restore cp-000001`).
    Checkpoint {
        #[command(subcommand)]
        command: checkpoint_cmd::CheckpointCommand,
    },
}

#[derive(Args)]
struct JournalArgs {
    #[command(subcommand)]
    command: journal_cmd::JournalCommand,
    /// The journal file. Default: `journal.db` in the state directory.
    #[arg(long, global = true)]
    path: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let state = cli.state_dir.as_deref();
    let result = match cli.command {
        Command::Journal(args) => journal_cmd::run(args.command, args.path.as_deref(), state),
        Command::Shape(args) => shape_cmd::run(args),
        Command::Run(args) => run_cmd::run(args),
        Command::Serve(args) => serve_cmd::run(args, state),
        Command::ApproveTool(args) => serve_cmd::approve(args, state),
        Command::Call(args) => call_cmd::run(args, state),
        Command::Turn(args) => turn_cmd::run(args, state),
        Command::Approve(args) => approve_cmd::run(args, true, state),
        Command::Deny(args) => approve_cmd::run(args, false, state),
        Command::Token(args) => token_cmd::run(args),
        Command::Audit { command } => audit_cmd::run(command, state),
        Command::Checkpoint { command } => checkpoint_cmd::run(command, state),
    };
    match result {
        Ok(output) => {
            let mut stdout = io::stdout().lock();
            // A closed pipe (`ring0 journal ls | head`) is not an error worth reporting.
            let _ = stdout.write_all(output.as_bytes());
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("ring0: {message}");
            ExitCode::FAILURE
        }
    }
}
