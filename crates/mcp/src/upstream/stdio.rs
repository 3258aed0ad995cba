//! The stdio transport of an upstream: a child process speaking newline-delimited JSON-RPC.
//!
//! The child is started through process-wrap in its own process group and killed (the whole
//! group) when the connection is dropped. Its stdout is read as bounded lines, each parsed as one
//! message; its stderr is copied line by line to the log with the alias as prefix. When the child
//! exits or closes stdout, the peer is closed and every request in flight fails as "lost".

use crate::limits::{STDERR_LINE_BYTES_MAX, UPSTREAM_MESSAGE_BYTES_MAX};
use crate::log::Log;
use crate::rpc::{InboundHandler, Outbound, RpcPeer};
use futures::StreamExt;
use process_wrap::tokio::{CommandWrap, KillOnDrop, ProcessGroup};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use tokio_util::codec::{FramedRead, LinesCodec, LinesCodecError};
use tokio_util::sync::CancellationToken;

/// Messages queued for an upstream's stdin before it counts as not reading.
const STDIN_QUEUE_MAX: usize = 1024;

/// How to start one stdio upstream.
#[derive(Clone)]
pub struct StdioSpec {
    pub command: String,
    pub args: Vec<String>,
    /// The child's whole environment: the variables named by the allow-list, with their values
    /// from ring0's environment, plus explicit values from config.
    pub env: BTreeMap<String, String>,
    pub cwd: Option<PathBuf>,
    /// The OS sandbox the server runs in.
    pub sandbox: ring0_exec::Sandbox,
}

/// Variable names only: their values may be secrets.
impl std::fmt::Debug for StdioSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StdioSpec")
            .field("command", &self.command)
            .field("args", &self.args)
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .field("cwd", &self.cwd)
            .field("sandbox", &self.sandbox.profile_name())
            .finish()
    }
}

struct StdinQueue(mpsc::Sender<Value>);

impl Outbound for StdinQueue {
    fn send(&self, message: Value, _related: Option<u64>) -> Result<(), String> {
        self.0.try_send(message).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => {
                format!("the server is not reading its input ({STDIN_QUEUE_MAX} messages queued)")
            }
            mpsc::error::TrySendError::Closed(_) => "the server's input is closed".into(),
        })
    }
}

/// A running stdio upstream. Dropping it kills the process group.
pub struct StdioConnection {
    pub peer: Arc<RpcPeer>,
    stop: CancellationToken,
    /// The sandbox (its scratch directory, egress proxy and cgroup), ended when the connection goes.
    _sandbox: ring0_exec::sandbox::Guard,
}

impl Drop for StdioConnection {
    fn drop(&mut self) {
        self.stop.cancel();
        self.peer.close("the connection was closed by ring0");
    }
}

/// Starts the child and its reader, writer and stderr tasks.
pub fn spawn(
    alias: &str,
    spec: &StdioSpec,
    handler: Arc<dyn InboundHandler>,
    log: Log,
) -> std::io::Result<StdioConnection> {
    let mut command = tokio::process::Command::new(&spec.command);
    command
        .args(&spec.args)
        .env_clear()
        .envs(&spec.env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(cwd) = &spec.cwd {
        command.current_dir(cwd);
    }
    let sandbox_error = |e: ring0_exec::SandboxError| std::io::Error::other(e.to_string());
    // The server is its PID namespace's init: when it exits, or ring0 does, all it started dies.
    let pending = spec
        .sandbox
        .with_program_homes(
            std::path::Path::new(&spec.command),
            spec.args.iter().map(String::as_str),
            spec.cwd.as_deref(),
        )
        .confine_command(&mut command)
        .map_err(sandbox_error)?;
    let mut wrap = CommandWrap::from(command);
    wrap.wrap(ProcessGroup::leader()).wrap(KillOnDrop);
    let mut child =
        wrap.spawn()
            .map_err(|e| match ring0_exec::sandbox::explain_spawn_error(&e) {
                Some(why) => sandbox_error(why),
                None => e,
            })?;
    let guard = pending.started().map_err(sandbox_error)?;
    let stdin = child.stdin().take().expect("piped stdin");
    let stdout = child.stdout().take().expect("piped stdout");
    let stderr = child.stderr().take().expect("piped stderr");

    let (tx, mut rx) = mpsc::channel::<Value>(STDIN_QUEUE_MAX);
    let peer = RpcPeer::new(Arc::new(StdinQueue(tx)), handler);
    let stop = CancellationToken::new();

    // Writer: one JSON text per line.
    {
        let peer = peer.clone();
        let mut stdin = stdin;
        tokio::spawn(async move {
            while let Some(message) = rx.recv().await {
                let mut line = serde_json::to_vec(&message).unwrap_or_default();
                line.push(b'\n');
                if let Err(e) = async {
                    stdin.write_all(&line).await?;
                    stdin.flush().await
                }
                .await
                {
                    peer.close(&format!("writing to the server failed: {e}"));
                    break;
                }
            }
        });
    }

    // Reader: bounded lines, each one message.
    {
        let peer = peer.clone();
        let log = log.clone();
        let alias = alias.to_string();
        tokio::spawn(async move {
            let mut lines = FramedRead::new(
                stdout,
                LinesCodec::new_with_max_length(UPSTREAM_MESSAGE_BYTES_MAX),
            );
            let reason = loop {
                match lines.next().await {
                    None => break "the server closed its output".to_string(),
                    Some(Ok(line)) => {
                        if line.trim().is_empty() {
                            continue;
                        }
                        match serde_json::from_str::<Value>(&line) {
                            Ok(message) => peer.deliver(message, None),
                            Err(e) => log.line(&format!(
                                "[{alias}] ignored a line that is not JSON-RPC ({e})"
                            )),
                        }
                    }
                    Some(Err(LinesCodecError::MaxLineLengthExceeded)) => {
                        break format!(
                            "the server sent a message over {UPSTREAM_MESSAGE_BYTES_MAX} bytes"
                        );
                    }
                    Some(Err(LinesCodecError::Io(e))) => break format!("reading failed: {e}"),
                }
            };
            peer.close(&reason);
        });
    }

    // Stderr: to the log, line by line, each bounded.
    {
        let log = log.clone();
        let alias = alias.to_string();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stderr);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match (&mut reader)
                    .take((STDERR_LINE_BYTES_MAX + 1) as u64)
                    .read_until(b'\n', &mut buf)
                    .await
                {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        let mut dropped = 0usize;
                        if buf.len() > STDERR_LINE_BYTES_MAX && !buf.ends_with(b"\n") {
                            // Skip the rest of an over-long line, counting it.
                            let mut rest = Vec::new();
                            if let Ok(n) = reader.read_until(b'\n', &mut rest).await {
                                dropped = n;
                            }
                            buf.truncate(STDERR_LINE_BYTES_MAX);
                        }
                        let text = String::from_utf8_lossy(&buf);
                        let text = text.trim_end();
                        if dropped > 0 {
                            log.line(&format!("[{alias}] {text} [… {dropped} more bytes]"));
                        } else {
                            log.line(&format!("[{alias}] {text}"));
                        }
                    }
                }
            }
        });
    }

    // Lifetime: wait for the child, or kill its group when the connection is dropped.
    {
        let peer = peer.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let status = {
                let wait = child.wait();
                tokio::select! {
                    status = wait => Some(status),
                    _ = stop.cancelled() => None,
                }
            };
            match status {
                Some(Ok(status)) => peer.close(&format!("the server exited ({status})")),
                Some(Err(e)) => peer.close(&format!("waiting for the server failed: {e}")),
                None => {
                    let _ = Box::into_pin(child.kill()).await;
                }
            }
        });
    }

    Ok(StdioConnection {
        peer,
        stop,
        _sandbox: guard,
    })
}
