//! `ring0 approve [ID] [--session] [--show]` / `ring0 deny ID`: a person's decision on a held
//! call, from another terminal. Without an id, `approve` lists the pending requests. `--show`
//! prints one request's whole arguments (escaped, see `ring0_policy::render_args`) and decides
//! nothing.

use clap::Args;
use ring0_config::{Config, approvals_dir};
use ring0_policy::{Decision, decide_pending, list_pending, read_pending, render_args};
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
    /// Also allow identical calls (same arguments) for the rest of the session, where the
    /// grant's `approval_scope` offers it.
    #[arg(long)]
    pub session: bool,
    /// Print the request's whole arguments and decide nothing.
    #[arg(long)]
    pub show: bool,
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
        if !approve || args.show {
            return Err(format!(
                "name the approval id to {} (`ring0 approve` lists them)",
                if args.show { "show" } else { "deny" }
            ));
        }
        return Ok(list(&dir));
    };
    if args.show {
        let r = read_pending(&dir, &id).map_err(|e| e.to_string())?;
        return Ok(format!(
            "{}  {} ({})\n  digest: {}\n  arguments: {}\n",
            r.id,
            r.tool,
            r.authority,
            r.args_hash,
            render_args(&r.args)
        ));
    }
    if args.session && !approve {
        return Err("--session applies to `ring0 approve`".into());
    }
    let reason = if args.reason.is_empty() && !approve {
        "denied by a person".to_string()
    } else {
        args.reason
    };
    let decision = Decision {
        approve,
        remember: args.session,
        reason,
    };
    let request = decide_pending(&dir, &id, &decision).map_err(|e| e.to_string())?;
    Ok(format!(
        "{} {} ({}, arguments {}){}\n",
        if approve { "approved" } else { "denied" },
        request.id,
        request.tool,
        request.args_hash,
        match (&request.remember, decision.remember) {
            (Some(what), true) => format!("; identical calls allowed for {what}"),
            _ => String::new(),
        }
    ))
}

fn list(dir: &std::path::Path) -> String {
    let pending = list_pending(dir);
    if pending.is_empty() {
        return "no pending approvals\n".into();
    }
    let mut out = String::new();
    for r in pending {
        out.push_str(&format!(
            "{}  {}\n  {}\n",
            r.id,
            r.tool,
            r.summary.replace('\n', "\n  ")
        ));
        if let Some(what) = &r.remember {
            out.push_str(&format!(
                "  (`ring0 approve {} --session` also allows identical calls for {what})\n",
                r.id
            ));
        }
    }
    out
}
