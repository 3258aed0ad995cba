//! `ring0 call TOOL 'JSON'`: one mediated call with the configured grants.

use clap::Args;
use ring0_config::{Built, Config, approvals_dir, build_kernel};
use ring0_core::ProviderFormat;
use ring0_kernel::RoundOptions;
use ring0_policy::DirectoryApprover;
use serde_json::{Value, json};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};
use tracing::Instrument;

/// Options shared by the subcommands that open a session.
#[derive(Args, Clone)]
pub struct SessionArgs {
    /// Configuration file. Default: `ring0.toml` in the current directory if it exists, else the
    /// embedded defaults.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The user-intent scope of the session (part of every call's identity).
    #[arg(long, default_value = "cli")]
    pub scope: String,
}

#[derive(Args)]
pub struct CallArgs {
    #[command(flatten)]
    pub session: SessionArgs,
    /// Attempt epoch. By default each `ring0 call` is a new request (a fresh epoch), so the same
    /// write run twice from the command line runs twice; pass a fixed epoch to make a repeated
    /// call replay its recorded result instead.
    #[arg(long)]
    pub epoch: Option<u64>,
    /// The tool to call.
    pub tool: String,
    /// Its arguments, a JSON object.
    #[arg(default_value = "{}")]
    pub args: String,
}

/// A command's kernel and telemetry (kept until the command ends, so that its
/// spans are exported).
pub(crate) struct Opened {
    pub built: Built,
    pub telemetry: ring0_ops::telemetry::Telemetry,
}

/// Loads the configuration, installs the log and (when `[telemetry]` or the environment names
/// a collector) traces, and builds the kernel, with held calls announced on stderr and decided
/// through the approvals directory.
pub(crate) fn open(
    session: &SessionArgs,
    state_dir: Option<&Path>,
    log: crate::LogOptions,
) -> Result<Opened, String> {
    let cwd = std::env::current_dir().map_err(|e| format!("current directory: {e}"))?;
    let loaded = ring0_ops::telemetry::Telemetry::scoped(log.format(), log.level(), || {
        Config::load(session.config.as_deref(), &cwd, state_dir)
    })
    .map_err(|e| e.to_string())?;
    let traces = crate::traces_config(&loaded)?;
    let telemetry =
        ring0_ops::telemetry::Telemetry::install(log.format(), log.level(), Some(&traces))?;
    let built = build(&loaded)?;
    Ok(Opened { built, telemetry })
}

/// Loads the configuration and builds its kernel, for a command whose log is installed
/// already (no traces of its own).
pub(crate) fn open_built(session: &SessionArgs, state_dir: Option<&Path>) -> Result<Built, String> {
    let cwd = std::env::current_dir().map_err(|e| format!("current directory: {e}"))?;
    let loaded =
        Config::load(session.config.as_deref(), &cwd, state_dir).map_err(|e| e.to_string())?;
    build(&loaded)
}

/// The kernel of `loaded`, with held calls announced on stderr and decided through the
/// approvals directory.
fn build(loaded: &ring0_config::Loaded) -> Result<Built, String> {
    let approver = DirectoryApprover::new(approvals_dir(&loaded.state_dir)).on_request(|r| {
        tracing::warn!(
            target: "ring0",
            "approval required [{}]\n  {}\n  approve: ring0 approve {}    deny: ring0 deny {}",
            r.id,
            r.summary.replace('\n', "\n  "),
            r.id,
            r.id
        );
    });
    build_kernel(loaded, Arc::new(approver)).map_err(|e| e.to_string())
}

/// Settles what an earlier process left open in the journal before anything new runs: calls in
/// flight at a crash are reconciled, never re-sent blindly. Says on stderr what it did.
pub(crate) async fn recover(kernel: &ring0_kernel::Kernel) -> Result<(), String> {
    let report = kernel
        .recover()
        .await
        .map_err(|e| format!("recovering the journal: {e}"))?;
    if report.examined > report.deferred.len() {
        tracing::warn!(
            target: "ring0",
            "recovered {} open intent(s) from the journal: {} in flight reconciled, {} resumed",
            report.examined - report.deferred.len(),
            report.in_flight,
            report.resumed
        );
    }
    if !report.deferred.is_empty() {
        let mut tools: Vec<&str> = report.deferred.iter().map(|r| r.tool.as_str()).collect();
        tools.sort_unstable();
        tools.dedup();
        tracing::warn!(
            target: "ring0",
            "left {} open intent(s) of tools this command does not have ({}) for the process that has them (ring0 serve with its upstreams)",
            report.deferred.len(),
            tools.join(", ")
        );
    }
    Ok(())
}

pub(crate) fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("starting the runtime: {e}"))
}

pub fn run(
    args: CallArgs,
    state_dir: Option<&Path>,
    log: crate::LogOptions,
) -> Result<String, String> {
    let input: Value =
        serde_json::from_str(&args.args).map_err(|e| format!("arguments are not JSON: {e}"))?;
    if !input.is_object() {
        return Err("arguments must be a JSON object".into());
    }
    let Opened { built, telemetry } = open(&args.session, state_dir, log)?;
    let epoch = args.epoch.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    });
    let session = built.kernel.open_session(
        built
            .session_config(&args.session.scope)
            .attempt_epoch(epoch),
    );
    // One call as an MCP tools/call, the format whose arguments are a JSON value as given.
    let turn = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                      "params": {"name": args.tool, "arguments": input}});
    let rt = runtime()?;
    rt.block_on(recover(&built.kernel))?;
    let span = tracing::info_span!(
        "ring0 call",
        otel.name = %format_args!("execute_tool {}", args.tool),
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = args.tool.as_str(),
        ring0.principal = "local",
    );
    let handled = rt.block_on(
        session
            .handle_turn(ProviderFormat::Mcp, &turn, &RoundOptions::default())
            .instrument(span),
    );
    drop(rt);
    telemetry.shutdown();
    let out = handled.map_err(|e| e.to_string())?;
    let result = out
        .round
        .results
        .first()
        .ok_or("the kernel returned no result")?;
    let text = serde_json::to_string_pretty(&result.content).map_err(|e| e.to_string())?;
    if result.is_error {
        let _ = writeln!(std::io::stdout().lock(), "{text}");
        return Err(format!("the call of {} failed (result above)", args.tool));
    }
    Ok(format!("{text}\n"))
}
