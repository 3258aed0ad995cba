//! `ring0 run [--timeout S] [--budget BYTES] [--json] -- CMD ARGS…`: one supervised command.

use clap::Args;
use ring0_exec::{CommandSpec, ExecPolicy, run_command};
use std::time::Duration;

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

pub fn run(args: RunArgs) -> Result<String, String> {
    let workspace = std::env::current_dir().map_err(|e| format!("current directory: {e}"))?;
    let mut policy = ExecPolicy::new(workspace);
    if let Some(budget) = args.budget {
        policy = policy.observation_budget_bytes(budget);
    }
    let spec = CommandSpec::argv(args.argv).timeout(Duration::from_secs(args.timeout));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("starting the runtime: {e}"))?;
    let report = runtime.block_on(async {
        // Ctrl-C tears the tree down and still returns what was collected.
        let cancel = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        run_command(&policy, &spec, cancel).await
    });
    let report = report.map_err(|e| e.to_string())?;
    if args.json {
        let value =
            serde_json::json!({"observation": report.observation, "summary": report.summary});
        return Ok(format!(
            "{}\n",
            serde_json::to_string_pretty(&value).map_err(|e| e.to_string())?
        ));
    }
    let mut out = report.observation.text.clone();
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    Ok(out)
}
