//! `ring0 serve [--http ADDR] [--config FILE]`: the MCP server and gateway.
//!
//! With no config it serves the built-in tools on the current directory, the journal at
//! `.ring0/journal.db` and shaped-away output under `.ring0/spill`. A config file adds upstream
//! MCP servers (`[[upstreams]]`). Where it serves, the workspace, the journal and the grants in
//! effect are printed to stderr at start; stdout carries the stdio transport and nothing else.
//!
//! `ring0 approve-tool NAME` approves a quarantined upstream tool (its new definition's pin is
//! written to `ring0.lock`; a running server picks it up within a second).

use clap::Args;
use ring0_core::Authority;
use ring0_journal::SqliteJournal;
use ring0_kernel::GrantTable;
use ring0_mcp::http::{HttpOptions, MCP_PATH};
use ring0_mcp::server::Approvals;
use ring0_mcp::{Gateway, GatewayOptions, GatewayServer, Log, UpstreamConfig};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How long `serve` waits for upstreams at start before serving without the slow ones.
const UPSTREAM_START_WAIT: Duration = Duration::from_secs(20);

#[derive(Args)]
pub struct ServeArgs {
    /// Serve Streamable HTTP at ADDR (e.g. 127.0.0.1:8808) instead of stdio.
    #[arg(long, value_name = "ADDR")]
    http: Option<SocketAddr>,
    /// The TOML config (grants, upstreams, limits).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Name of an environment variable holding the bearer token HTTP clients must send.
    #[arg(long, value_name = "VAR")]
    token_env: Option<String>,
    /// Accept this Host (and origin) besides loopback, for a non-loopback --http bind.
    #[arg(long, value_name = "HOST")]
    allow_host: Vec<String>,
}

#[derive(Args)]
pub struct ApproveArgs {
    /// The qualified tool name (`alias__tool`), or a prefix ending in `*`.
    name: Option<String>,
    /// List the tools waiting for approval.
    #[arg(long)]
    list: bool,
}

/// The parts of the config file this command reads.
#[derive(Debug, Default, Deserialize)]
struct ServeFile {
    #[serde(default)]
    upstreams: Vec<UpstreamConfig>,
}

fn read_config(path: &Path) -> Result<ServeFile, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("config {}: {e}", path.display()))?;
    let file: ServeFile =
        toml::from_str(&text).map_err(|e| format!("config {}: {e}", path.display()))?;
    ring0_mcp::config::validate(&file.upstreams)
        .map_err(|e| format!("config {}: {e}", path.display()))?;
    Ok(file)
}

fn describe_grants() -> &'static str {
    "every listed tool up to authority A3; A3 calls are held for a person's approval \
     (elicitation, or a confirmation code printed here)"
}

pub fn run(args: ServeArgs) -> Result<String, String> {
    let workspace = std::env::current_dir().map_err(|e| format!("current directory: {e}"))?;
    let state_dir = workspace.join(crate::STATE_DIR);
    std::fs::create_dir_all(&state_dir).map_err(|e| format!("{}: {e}", state_dir.display()))?;
    let file = match &args.config {
        Some(p) => read_config(p)?,
        None => ServeFile::default(),
    };
    let token = match &args.token_env {
        Some(var) => Some(
            std::env::var(var)
                .map_err(|_| format!("--token-env {var}: the variable is not set"))?,
        ),
        None => None,
    };
    if let Some(addr) = args.http
        && !addr.ip().is_loopback()
        && args.allow_host.is_empty()
    {
        return Err(format!(
            "--http {addr} is not a loopback address: name the hosts clients will use with --allow-host"
        ));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("starting the runtime: {e}"))?;
    runtime.block_on(async move {
        let journal_path = state_dir.join("journal.db");
        let journal = SqliteJournal::open(&journal_path)
            .map_err(|e| format!("journal {}: {e}", journal_path.display()))?;
        let spill = ring0_shape::SpillStore::open(state_dir.join("spill"))
            .map_err(|e| format!("spill store: {e}"))?;
        let log = Log::stderr();
        let upstream_names: Vec<String> = file.upstreams.iter().map(|u| u.alias.clone()).collect();
        let gw = Gateway::start(GatewayOptions {
            builtins: Vec::new(),
            upstreams: file.upstreams,
            journal: Arc::new(journal),
            authorizer: Arc::new(GrantTable::allow(&["*"], Authority::A3)),
            workspace: workspace.clone(),
            state_dir: state_dir.clone(),
            spill: Some(Arc::new(spill)),
            log: log.clone(),
        })?;
        let down = gw.wait_for_upstreams(UPSTREAM_START_WAIT).await;
        for alias in &down {
            log.line(&format!(
                "upstream {alias} is not up yet; serving without it for now"
            ));
        }
        let generation = gw.generation();
        let where_ = match args.http {
            Some(addr) => format!("http://{addr}{MCP_PATH}"),
            None => "stdio".to_string(),
        };
        log.line(&format!("serving MCP on {where_}"));
        log.line(&format!("workspace: {}", workspace.display()));
        log.line(&format!("journal: {}", journal_path.display()));
        log.line(&format!("grants: {}", describe_grants()));
        log.line(&format!(
            "tools: {} listed ({} quarantined){}",
            generation.tools.len() - generation.quarantined.len(),
            generation.quarantined.len(),
            if upstream_names.is_empty() {
                String::new()
            } else {
                format!("; upstreams: {}", upstream_names.join(", "))
            }
        ));
        let approvals = Approvals::new(log.clone());
        match args.http {
            None => ring0_mcp::serve_stdio(GatewayServer::new_session(gw, approvals)).await,
            Some(addr) => {
                let shutdown = CancellationToken::new();
                let stop = shutdown.clone();
                tokio::spawn(async move {
                    let _ = tokio::signal::ctrl_c().await;
                    stop.cancel();
                });
                let options = HttpOptions {
                    addr,
                    bearer_token: token,
                    extra_hosts: args.allow_host.clone(),
                    extra_origins: args
                        .allow_host
                        .iter()
                        .map(|h| format!("http://{h}:*"))
                        .collect(),
                };
                let log2 = log.clone();
                ring0_mcp::http::serve_http(gw, approvals, options, shutdown, move |bound| {
                    if bound != addr {
                        log2.line(&format!("listening on http://{bound}{MCP_PATH}"));
                    }
                })
                .await
            }
        }
    })?;
    Ok(String::new())
}

pub fn approve(args: ApproveArgs) -> Result<String, String> {
    let workspace = std::env::current_dir().map_err(|e| format!("current directory: {e}"))?;
    let state_dir = workspace.join(crate::STATE_DIR);
    if args.list || args.name.is_none() {
        let pending = ring0_mcp::pin::pending(&state_dir);
        if pending.is_empty() {
            return Ok("no tool is waiting for approval\n".into());
        }
        let mut out = String::new();
        for p in pending {
            let name = ring0_mcp::names::qualify(&p.alias, &p.tool).unwrap_or(p.tool.clone());
            out.push_str(&format!("{name}\t{}\t{}\n", p.pin, p.reason));
        }
        return Ok(out);
    }
    let name = args.name.unwrap_or_default();
    let approved = ring0_mcp::pin::approve(&workspace, &state_dir, &name)?;
    Ok(format!(
        "approved: {}\n(written to {})\n",
        approved.join(", "),
        workspace.join(ring0_mcp::pin::LOCK_FILE).display()
    ))
}
