//! `ring0 status [--server ADDR]`: what a workspace's ring0 holds, for the person who runs it:
//! the journal's records by state (and how many wait for a person: UNKNOWN, RECONCILING,
//! DEAD_LETTER), the calls waiting for approval, the configured upstreams, and, with
//! `--server`, what a running `ring0 serve` says of itself (`/readyz`: journal, upstreams).
//! It reads the state directory without its write lock and changes nothing.

use clap::Args;
use ring0_core::IntentState;
use ring0_journal::JournalReader;
use serde_json::Value;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long `--server` waits to connect, and for the answer.
const SERVER_ASK_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest answer read from `--server`.
const SERVER_ANSWER_BYTES_MAX: u64 = 64 * 1024;

#[derive(Args)]
pub struct StatusArgs {
    /// Configuration file (to find the state directory). Default as for `ring0 call`.
    #[arg(long)]
    config: Option<PathBuf>,
    /// A running `ring0 serve` to ask (`--http` or `--metrics-addr` address, e.g.
    /// 127.0.0.1:8808): its readiness, journal and upstreams.
    #[arg(long, value_name = "ADDR")]
    server: Option<SocketAddr>,
}

pub fn run(args: StatusArgs, state_dir: Option<&Path>) -> Result<String, String> {
    let cwd = std::env::current_dir().map_err(|e| format!("current directory: {e}"))?;
    let loaded = ring0_config::Config::load(args.config.as_deref(), &cwd, state_dir)
        .map_err(|e| e.to_string())?;
    let mut out = format!("state: {}\n", loaded.state_dir.display());
    let journal = loaded.state_dir.join(ring0_config::state::JOURNAL_FILE);
    out.push_str(&journal_lines(&journal));
    out.push_str(&approval_lines(&ring0_config::approvals_dir(
        &loaded.state_dir,
    )));
    let aliases: Vec<&str> = loaded
        .config
        .upstreams
        .iter()
        .map(|u| u.alias.as_str())
        .collect();
    out.push_str(&format!(
        "upstreams configured: {}\n",
        if aliases.is_empty() {
            "none".to_string()
        } else {
            aliases.join(", ")
        }
    ));
    if let Some(addr) = args.server {
        out.push_str(&server_lines(addr)?);
    }
    Ok(out)
}

fn journal_lines(path: &Path) -> String {
    if !path.exists() {
        return format!("journal: {} (none yet)\n", path.display());
    }
    let counts = match JournalReader::open(path).and_then(|r| r.count_by_state()) {
        Ok(counts) => counts,
        Err(e) => return format!("journal: {}: {e}\n", path.display()),
    };
    let mut out = format!("journal: {}\n", path.display());
    let listed: Vec<String> = IntentState::ALL
        .iter()
        .filter_map(|state| {
            let n = counts.iter().find(|(s, _)| s == state)?.1;
            Some(format!("{} {n}", state.as_str()))
        })
        .collect();
    out.push_str(&format!(
        "intents: {}\n",
        if listed.is_empty() {
            "none".to_string()
        } else {
            listed.join(", ")
        }
    ));
    let waiting: u64 = counts
        .iter()
        .filter(|(s, _)| s.is_uncertain())
        .map(|(_, n)| n)
        .sum();
    if waiting > 0 {
        out.push_str(&format!(
            "  {waiting} with an outcome not known (UNKNOWN, RECONCILING, DEAD_LETTER): see \
             `ring0 journal ls`\n"
        ));
    }
    out
}

fn approval_lines(dir: &Path) -> String {
    let pending = ring0_policy::list_pending(dir);
    let mut out = format!("approvals pending: {}\n", pending.len());
    for request in &pending {
        out.push_str(&format!(
            "  {}  {} ({})\n",
            request.id, request.tool, request.principal
        ));
    }
    out
}

/// Asks a running server's `/readyz` and says what it answered.
fn server_lines(addr: SocketAddr) -> Result<String, String> {
    let ask = || -> std::io::Result<String> {
        let mut stream = TcpStream::connect_timeout(&addr, SERVER_ASK_TIMEOUT)?;
        stream.set_read_timeout(Some(SERVER_ASK_TIMEOUT))?;
        stream.set_write_timeout(Some(SERVER_ASK_TIMEOUT))?;
        write!(
            stream,
            "GET /readyz HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            if addr.ip().is_loopback() {
                "localhost".to_string()
            } else {
                addr.ip().to_string()
            }
        )?;
        let mut answer = String::new();
        stream
            .take(SERVER_ANSWER_BYTES_MAX)
            .read_to_string(&mut answer)?;
        Ok(answer)
    };
    let answer = ask().map_err(|e| format!("--server {addr}: {e}"))?;
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let report: Value = serde_json::from_str(body.trim()).map_err(|_| {
        format!("--server {addr}: not a ring0 readiness answer (is it `ring0 serve`?)")
    })?;
    let mut out = format!(
        "server {addr}: {}\n  journal: {}\n",
        if report["ready"] == true {
            "ready"
        } else {
            "not ready"
        },
        report["journal"].as_str().unwrap_or("?")
    );
    if let Some(upstreams) = report["upstreams"].as_object() {
        for (alias, state) in upstreams {
            out.push_str(&format!(
                "  upstream {alias}: {}\n",
                state.as_str().unwrap_or("?")
            ));
        }
    }
    Ok(out)
}
