//! `ring0 approve [ID] [--session] [--show]` / `ring0 deny ID`: a person's decision on a held
//! call, from another terminal. Without an id, `approve` lists the pending requests. `--show`
//! prints one request's whole arguments (escaped, see `ring0_policy::render_args`) and decides
//! nothing. A request whose process is gone is expired, never listed or decided.
//!
//! `ring0 approve-tool [NAME] [--pin PIN] [--list] [--config FILE]`: a person's approval of a
//! quarantined upstream definition. `--list` (or no name) shows each waiting definition with a
//! diff against the approved one. Approving first asks the upstream (from the configuration)
//! what it serves now: a definition it no longer serves is refused, and with `--pin` only that
//! exact definition is approved.

use clap::Args;
use ring0_config::{Config, approvals_dir};
use ring0_mcp::pin::PendingPin;
use ring0_policy::{Decision, decide_pending, list_pending, read_pending, render_args};
use std::path::{Path, PathBuf};
use std::sync::Arc;

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

#[derive(Args)]
pub struct ToolArgs {
    /// The qualified name (`alias__tool`), or a prefix ending in `*`.
    pub name: Option<String>,
    /// List the definitions waiting for approval, each with its diff.
    #[arg(long)]
    pub list: bool,
    /// Approve only this definition (`sha256:…`, as `--list` shows it): refused when the one
    /// waiting under NAME is another.
    #[arg(long, value_name = "PIN")]
    pub pin: Option<String>,
    /// Configuration file (its workspace, state directory and upstreams). Default as for
    /// `ring0 serve`.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

fn qualified(p: &PendingPin) -> String {
    ring0_mcp::names::qualify(&p.alias, &p.tool).unwrap_or_else(|_| p.tool.clone())
}

fn matches(pattern: &str, p: &PendingPin) -> bool {
    let name = qualified(p);
    match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => name == pattern,
    }
}

fn list_waiting(workspace: &Path, state_dir: &Path) -> String {
    let pending = ring0_mcp::pin::pending(state_dir);
    if pending.is_empty() {
        return "no tool is waiting for approval\n".into();
    }
    let mut out = String::new();
    for p in pending {
        out.push_str(&format!("{}\t{}\t{}\n", qualified(&p), p.pin, p.reason));
        // What changed, cleaned of escape codes and invisible characters by the pin book.
        for change in &p.changes {
            out.push_str(&format!("    {change}\n"));
        }
        let approved = ring0_mcp::pin_review::approved_pin(workspace, &p);
        let diff = ring0_mcp::pin_review::diff(state_dir, approved.as_deref(), &p);
        for line in diff.lines() {
            out.push_str(&format!("    {line}\n"));
        }
        out.push_str(&format!(
            "    approve exactly this definition: ring0 approve-tool {} --pin {}\n\n",
            qualified(&p),
            p.pin
        ));
    }
    out
}

pub fn approve_tool(args: ToolArgs, state_dir: Option<&Path>) -> Result<String, String> {
    let cwd = std::env::current_dir().map_err(|e| format!("current directory: {e}"))?;
    let loaded =
        Config::load(args.config.as_deref(), &cwd, state_dir).map_err(|e| e.to_string())?;
    let (workspace, state_dir) = (&loaded.workspace, &loaded.state_dir);
    let Some(name) = args.name.filter(|_| !args.list) else {
        return Ok(list_waiting(workspace, state_dir));
    };
    let before: Vec<PendingPin> = ring0_mcp::pin::pending(state_dir)
        .into_iter()
        .filter(|p| matches(&name, p))
        .collect();
    if before.is_empty() {
        return Err(format!(
            "nothing waiting for approval matches {name:?} (`ring0 approve-tool --list` shows what waits)"
        ));
    }
    // What the servers serve now decides: a definition they no longer serve is not approved.
    let mut aliases: Vec<&str> = before.iter().map(|p| p.alias.as_str()).collect();
    aliases.dedup();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("starting the runtime: {e}"))?;
    // A server that reaches the network while it is asked for its listing is audited in the
    // same log as ring0 serve's (processes sharing the log extend one chain).
    let audit_path = loaded.state_dir.join(&loaded.config.audit.path);
    let audit: Arc<dyn ring0_policy::AuditSink> = Arc::new(
        ring0_policy::JsonlAudit::open(&audit_path)
            .map_err(|e| format!("audit log {}: {e}", audit_path.display()))?,
    );
    let mut sandboxes =
        ring0_config::sandbox::upstream_sandboxes(&loaded, audit).map_err(|e| e.to_string())?;
    for alias in aliases {
        let Some(config) = loaded.config.upstreams.iter().find(|u| u.alias == alias) else {
            return Err(format!(
                "upstream {alias:?} is not in {}: pass the --config that serves it, so that \
                 ring0 can check what it serves now",
                loaded.source
            ));
        };
        let sandbox = sandboxes
            .remove(alias)
            .unwrap_or_else(ring0_exec::Sandbox::off);
        runtime.block_on(ring0_mcp::pin_review::refresh(
            config,
            workspace,
            state_dir,
            sandbox,
            ring0_mcp::Log::stderr(),
        ))?;
    }
    drop(runtime);
    let now: Vec<PendingPin> = ring0_mcp::pin::pending(state_dir)
        .into_iter()
        .filter(|p| matches(&name, p))
        .collect();
    for p in &before {
        match now
            .iter()
            .find(|n| n.alias == p.alias && n.tool == p.tool && n.kind == p.kind)
        {
            None => {
                return Err(format!(
                    "{}: the server no longer serves the definition that was waiting ({}); \
                     nothing was approved",
                    qualified(p),
                    p.pin
                ));
            }
            Some(n) if n.pin != p.pin => {
                return Err(format!(
                    "{}: the server now serves another definition ({}) than the one that was \
                     waiting ({}); review it with `ring0 approve-tool --list`; nothing was approved",
                    qualified(p),
                    n.pin,
                    p.pin
                ));
            }
            Some(_) => {}
        }
    }
    if let Some(pin) = &args.pin
        && let Some(other) = now.iter().find(|p| &p.pin != pin)
    {
        return Err(format!(
            "{} waits with definition {}, not {pin}; nothing was approved",
            qualified(other),
            other.pin
        ));
    }
    let approved = ring0_mcp::pin::approve(workspace, state_dir, &name)?;
    Ok(format!(
        "approved: {}\n(written to {})\n",
        approved.join(", "),
        workspace.join(ring0_mcp::pin::LOCK_FILE).display()
    ))
}
