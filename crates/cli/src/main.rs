//! The `ring0` binary: thin glue over the library crates.
//!
//! Every subcommand parses its arguments, calls one library entry point and prints the result;
//! no mediation logic lives here. Exit codes: 0 success, 1 the operation failed (reported on
//! stderr), 2 bad usage; `ring0 run` exits with its command's code (see `run_cmd`), `ring0
//! tools --lint` with 3 when a finding is at error level (see `tools_cmd`).

use clap::{Args, CommandFactory, Parser, Subcommand, ValueEnum};
use ring0_ops::telemetry::LogFormat;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

mod approve_cmd;
mod audit_cmd;
mod call_cmd;
mod checkpoint_cmd;
mod config_cmd;
mod journal_cmd;
mod run_cmd;
mod serve_cmd;
mod shape_cmd;
mod status_cmd;
mod token_cmd;
mod tools_cmd;
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
    /// Act as if started in DIR: the workspace of the embedded defaults, where `ring0.toml` is
    /// looked for, and the directory other relative paths on the command line start from.
    /// For clients that start servers in `/` or the home directory.
    #[arg(long, global = true, value_name = "DIR", env = "RING0_WORKSPACE")]
    workspace: Option<PathBuf>,
    /// How much `ring0 serve` says on stderr at start (`-v` is `--log-level debug`). Messages a
    /// person acts on (approval codes, upstream failures) are printed at every level.
    #[arg(
        long,
        global = true,
        value_enum,
        value_name = "LEVEL",
        env = "RING0_LOG_LEVEL",
        default_value_t = LogLevel::Info
    )]
    log_level: LogLevel,
    /// More detail on stderr: the same as `--log-level debug`.
    #[arg(short, long, global = true)]
    verbose: bool,
    /// How ring0 writes to stderr: `text` (`ring0: message` lines, the default) or `json`
    /// (one JSON object per line with `timestamp`, `level`, `target` and `message`, for a log
    /// pipeline).
    #[arg(
        long,
        global = true,
        value_name = "FORMAT",
        env = "RING0_LOG_FORMAT",
        default_value = "text",
        value_parser = log_format_parser()
    )]
    log_format: LogFormat,
}

/// `--log-format`: `text` or `json`, parsed into the telemetry's own type.
fn log_format_parser() -> impl clap::builder::TypedValueParser<Value = LogFormat> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(["text", "json"]).map(|s| match s.as_str() {
        "json" => LogFormat::Json,
        _ => LogFormat::Text,
    })
}

/// What `--log-level` and `--log-format` ask of the log.
#[derive(Clone, Copy, Debug)]
pub struct LogOptions {
    pub level: LogLevel,
    pub format: LogFormat,
}

impl LogOptions {
    /// How lines are written.
    pub fn format(self) -> LogFormat {
        self.format
    }

    /// The most detailed level written.
    pub fn level(self) -> tracing::Level {
        match self.level {
            LogLevel::Warn => tracing::Level::WARN,
            LogLevel::Info => tracing::Level::INFO,
            LogLevel::Debug => tracing::Level::DEBUG,
        }
    }

    /// Installs the process's subscriber without traces (every command but `serve`, which
    /// installs its own once its configuration says where traces go).
    fn install(self) -> Option<ring0_ops::telemetry::Telemetry> {
        ring0_ops::telemetry::Telemetry::install(self.format(), self.level(), None).ok()
    }
}

/// How much ring0 says about itself on stderr.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
pub enum LogLevel {
    /// Only what needs attention: tools not listed, grants matching nothing, upstreams down.
    Warn,
    /// Also where it serves, the workspace, config, state, grants and tool counts (default).
    Info,
    /// Also every tool of the catalog with its authority and the grant that decides it.
    Debug,
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
    /// Approve a quarantined upstream tool (`alias__tool`, `--pin` for one exact definition), or list those waiting with their diffs (--list).
    ApproveTool(approve_cmd::ToolArgs),
    /// Make one mediated call with the configured grants and print its result (`ring0 call read_file '{"path":"README.md"}'`).
    Call(call_cmd::CallArgs),
    /// Mediate every call of one model turn read from standard input and print the tool-result message(s) in its format.
    Turn(turn_cmd::TurnArgs),
    /// Approve a call held for approval (`ring0 approve ap_…`); without an id, list the pending ones.
    Approve(approve_cmd::DecideArgs),
    /// Deny a call held for approval (`ring0 deny ap_… --reason TEXT`).
    Deny(approve_cmd::DecideArgs),
    /// What this workspace's ring0 holds: intents by state, pending approvals, upstreams, and
    /// with --server ADDR what a running `ring0 serve` says of itself.
    Status(status_cmd::StatusArgs),
    /// Manage the static bearer tokens of `serve --http` (`ring0 token add NAME`).
    Token(token_cmd::TokenArgs),
    /// Print the resolved tool catalog — built-ins and every upstream's, as `ring0 serve` would
    /// serve it — with each tool's effect, authority, settlement, traits, budget, pin state and
    /// schema tokens, and the totals of each listing (--json for one JSON object); --lint adds
    /// the catalog's lint and exits 3 when a finding is at error level.
    Tools(tools_cmd::ToolsArgs),
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
    /// Write a commented `ring0.toml` for the workspace (MCP servers found in client configs
    /// are included, commented out).
    Init(config_cmd::InitArgs),
    /// Check a configuration and print what it resolves to (`ring0 config check`).
    Config {
        #[command(subcommand)]
        command: config_cmd::ConfigCommand,
    },
    /// Print a completion script for SHELL (`ring0 completions bash > ~/.local/share/bash-completion/completions/ring0`).
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

#[derive(Args)]
struct JournalArgs {
    #[command(subcommand)]
    command: journal_cmd::JournalCommand,
    /// The journal file. Default: `journal.db` in the state directory.
    #[arg(long, global = true)]
    path: Option<PathBuf>,
    /// A PostgreSQL journal (`postgres://user@host:port/db`), read without joining the
    /// deployment. Default: the configuration's `[journal] url`, else the file.
    #[arg(long, global = true, conflicts_with = "path")]
    journal: Option<String>,
}

/// Moves into `--workspace DIR`, so every subcommand starts from there.
fn enter_workspace(dir: &Path) -> Result<(), String> {
    std::env::set_current_dir(dir).map_err(|e| format!("--workspace {}: {e}", dir.display()))
}

/// Where `[telemetry]` says traces go, its headers read from their variables.
pub(crate) fn traces_config(
    loaded: &ring0_config::Loaded,
) -> Result<ring0_ops::telemetry::TracesConfig, String> {
    let section = &loaded.config.telemetry;
    Ok(ring0_ops::telemetry::TracesConfig {
        endpoint: section.endpoint.clone(),
        headers: section.headers()?,
        service_name: section.service_name.clone(),
        sample_ratio: section.sample_ratio,
    })
}

/// Reports a failure on stderr in the log's format (`serve` may have failed before it
/// installed its subscriber: one without traces is installed then).
fn report(log: LogOptions, message: &str) {
    // Refused when a subscriber is installed already, which is then the one that writes; a
    // new one has nothing to export, so its guard is not kept.
    std::mem::forget(log.install());
    tracing::error!(target: "ring0", "{message}");
}

/// In the JSON format a panic is one more JSON line, not free text a log pipeline cannot
/// parse.
fn panic_as_json_line() {
    std::panic::set_hook(Box::new(|info| {
        tracing::error!(target: "ring0", "panic: {info}");
    }));
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let log = LogOptions {
        level: if cli.verbose {
            LogLevel::Debug
        } else {
            cli.log_level
        },
        format: cli.log_format,
    };
    if log.format == LogFormat::Json {
        panic_as_json_line();
    }
    // `serve`, `call` and `turn` install their own subscriber, with traces when their
    // configuration asks for them, and export what is queued before they return.
    let _telemetry = match cli.command {
        Command::Serve(_) | Command::Call(_) | Command::Turn(_) => None,
        _ => log.install(),
    };
    if let Some(dir) = &cli.workspace
        && let Err(message) = enter_workspace(dir)
    {
        report(log, &message);
        return ExitCode::from(2);
    }
    let state = cli.state_dir.as_deref();
    let result = match cli.command {
        Command::Journal(args) => journal_cmd::run(
            args.command,
            args.journal.as_deref(),
            args.path.as_deref(),
            state,
        ),
        Command::Shape(args) => shape_cmd::run(args),
        Command::Run(args) => return run(args, log),
        Command::Tools(args) => return tools(args, state),
        Command::Serve(args) => serve_cmd::run(args, state, log),
        Command::ApproveTool(args) => approve_cmd::approve_tool(args, state),
        Command::Call(args) => call_cmd::run(args, state, log),
        Command::Turn(args) => turn_cmd::run(args, state, log),
        Command::Approve(args) => approve_cmd::run(args, true, state),
        Command::Deny(args) => approve_cmd::run(args, false, state),
        Command::Status(args) => status_cmd::run(args, state),
        Command::Token(args) => token_cmd::run(args),
        Command::Audit { command } => audit_cmd::run(command, state),
        Command::Checkpoint { command } => checkpoint_cmd::run(command, state),
        Command::Init(args) => config_cmd::init(args),
        Command::Config { command } => config_cmd::run(command, state),
        Command::Completions { shell } => {
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "ring0", &mut out);
            String::from_utf8(out).map_err(|e| e.to_string())
        }
    };
    match result {
        Ok(output) => {
            let mut stdout = io::stdout().lock();
            // A closed pipe (`ring0 journal ls | head`) is not an error worth reporting.
            let _ = stdout.write_all(output.as_bytes());
            ExitCode::SUCCESS
        }
        Err(message) => {
            report(log, &message);
            ExitCode::FAILURE
        }
    }
}

/// `ring0 tools`: prints the catalog (and its lint) and exits with the code the lint decides.
fn tools(args: tools_cmd::ToolsArgs, state: Option<&Path>) -> ExitCode {
    match tools_cmd::run(args, state) {
        Ok(outcome) => {
            let _ = io::stdout().lock().write_all(outcome.output.as_bytes());
            ExitCode::from(outcome.code)
        }
        Err(message) => {
            eprintln!("ring0: {message}");
            ExitCode::FAILURE
        }
    }
}

/// `ring0 run`: prints what the command printed (shaped) and exits with its code.
fn run(args: run_cmd::RunArgs, log: LogOptions) -> ExitCode {
    match run_cmd::run(args) {
        Ok(outcome) => {
            let _ = io::stdout().lock().write_all(outcome.output.as_bytes());
            ExitCode::from(outcome.code)
        }
        Err((message, code)) => {
            report(log, &message);
            ExitCode::from(code)
        }
    }
}
