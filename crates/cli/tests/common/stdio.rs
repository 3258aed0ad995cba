//! A JSON-RPC client of `ring0 serve` over stdio: one message a line on its stdin, every line of
//! its stdout read by a thread of its own, responses picked out by id.

use super::spawn_stdio_json;
use serde_json::{Value, json};
use std::io::Write;
use std::process::{Child, ChildStdin, Command};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

/// Longest a client waits for a response.
pub const STDIO_WAIT: Duration = Duration::from_secs(60);

/// A running `ring0 serve` over stdio and the messages it writes.
pub struct StdioClient {
    pub child: Child,
    pub stdin: ChildStdin,
    pub messages: Receiver<Value>,
    next_id: u64,
}

impl StdioClient {
    /// Starts `cmd` (a `ring0 serve` over stdio) and completes the handshake in
    /// `protocol_version`, declaring no capabilities.
    pub fn initialized(cmd: Command, protocol_version: &str) -> Self {
        let (child, stdin, messages) = spawn_stdio_json(cmd);
        let mut client = Self {
            child,
            stdin,
            messages,
            next_id: 0,
        };
        client.request(
            "initialize",
            json!({"protocolVersion": protocol_version, "capabilities": {},
                   "clientInfo": {"name": "test", "version": "1"}}),
        );
        client.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        client
    }

    /// Writes one message.
    pub fn send(&mut self, message: &Value) {
        writeln!(self.stdin, "{message}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// Sends the request `method` with the next id and waits for its response.
    pub fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        self.response(id)
    }

    /// The response to request `id`, passing over notifications and requests from ring0.
    pub fn response(&self, id: u64) -> Value {
        let deadline = Instant::now() + STDIO_WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let m = self
                .messages
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no response to request {id} within {STDIO_WAIT:?}"));
            if m.get("id") == Some(&json!(id)) && m.get("method").is_none() {
                return m;
            }
        }
    }
}
