//! `ring0 approve [ID]` / `ring0 deny ID`: a person's decision on a held call, from another
//! terminal. Without an id, `approve` lists the pending requests.

use crate::config::{Config, approvals_dir};
use clap::Args;
use ring0_policy::{decide_pending, list_pending};
use std::path::PathBuf;

#[derive(Args)]
pub struct DecideArgs {
    /// Configuration file (to find the state directory). Default as for `ring0 call`.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The approval id printed with the request (`ap_…`).
    pub id: Option<String>,
    /// Why (recorded with a denial, and shown to the model).
    #[arg(long, default_value = "")]
    pub reason: String,
}

pub fn run(
    args: DecideArgs,
    approve: bool,
    state_dir: Option<&std::path::Path>,
) -> Result<String, String> {
    let cwd = std::env::current_dir().map_err(|e| format!("current directory: {e}"))?;
    let loaded =
        Config::load(args.config.as_deref(), &cwd, state_dir).map_err(|e| e.to_string())?;
    let dir = approvals_dir(&loaded.state_dir);
    let Some(id) = args.id else {
        if !approve {
            return Err("name the approval id to deny (`ring0 approve` lists them)".into());
        }
        let pending = list_pending(&dir);
        if pending.is_empty() {
            return Ok("no pending approvals\n".into());
        }
        let mut out = String::new();
        for r in pending {
            out.push_str(&format!(
                "{}  {}\n  {}\n",
                r.id,
                r.tool,
                r.summary.replace('\n', "\n  ")
            ));
        }
        return Ok(out);
    };
    let reason = if args.reason.is_empty() && !approve {
        "denied by a person".to_string()
    } else {
        args.reason
    };
    let request = decide_pending(&dir, &id, approve, &reason).map_err(|e| e.to_string())?;
    Ok(format!(
        "{} {} ({}, arguments {})\n",
        if approve { "approved" } else { "denied" },
        request.id,
        request.tool,
        request.args_hash
    ))
}
