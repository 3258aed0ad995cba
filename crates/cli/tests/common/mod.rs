//! Helpers shared by the `ring0` CLI tests: where the binaries and the installed MCP peers are
//! (skipping a test that needs a missing peer, except in CI, where that is a failure), starting
//! an HTTP server on an ephemeral port, and raw HTTP/1.1 requests, so a test sees exactly the
//! bytes ring0 sent. The submodules hold a stdio client of `ring0 serve` ([`StdioClient`]), a
//! server whose stderr is collected ([`Served`]) and, shared with `ring0-exec`'s tests, the
//! processes of a run found in /proc.
// Each test file uses the part it needs.
#![allow(dead_code)]

#[path = "../../../exec/tests/common/procs.rs"]
mod procs;
mod served;
mod stdio;

#[allow(unused_imports)]
pub use procs::*;
#[allow(unused_imports)]
pub use served::*;
#[allow(unused_imports)]
pub use stdio::*;

use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::channel;
use std::time::Duration;

/// Whether this run is CI's: there a missing peer fails the test instead of skipping it.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}

/// Skips the calling test, saying `why` — or fails it in CI.
pub fn skip_or_fail<T>(why: &str) -> Option<T> {
    assert!(!in_ci(), "{why} (CI is set, so this is a failure)");
    eprintln!("skipped: {why}");
    None
}

/// The directory of the MCP peers `scripts/install-mcp-peers.sh` installs.
pub fn peers() -> Option<PathBuf> {
    let dir = std::env::var_os("MCP_PEERS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/mcp-peers"));
    if dir.join(".installed-5").exists() {
        Some(dir)
    } else {
        skip_or_fail(&format!(
            "the MCP peers are not installed in {} (run scripts/install-mcp-peers.sh)",
            dir.display()
        ))
    }
}

/// The Python of the installed peers (with the `mcp` SDK).
pub fn python(peers: &Path) -> PathBuf {
    peers.join("py/bin/python")
}

/// Runs a Python client script (`cmd`, arguments included) to its end and returns what it
/// reports: its last line of output, as JSON.
pub fn python_report(cmd: &mut Command) -> Value {
    // A ring0 the client starts sees only the SDK's default environment (HOME among it): its
    // default state directory then lies under the tests' own directory, never the user's.
    let out = cmd.env("HOME", test_home()).output().expect("python");
    assert!(
        out.status.success(),
        "the Python client failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("Session termination failed"),
        "the client's DELETE of its session was not taken as success:\n{stderr}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.lines().last().unwrap_or("")).expect("one JSON line")
}

/// A home directory for the processes the tests start, inside the build's temporary directory.
pub fn test_home() -> PathBuf {
    let home = Path::new(env!("CARGO_TARGET_TMPDIR")).join("home");
    std::fs::create_dir_all(&home).unwrap();
    home
}

/// Waits (up to [`HTTP_WAIT`]) until the file at `path` contains `needle`; fails saying `what`
/// did not happen otherwise.
pub fn wait_for_file_text(path: &Path, needle: &str, what: &str) {
    let deadline = std::time::Instant::now() + HTTP_WAIT;
    while !std::fs::read_to_string(path)
        .unwrap_or_default()
        .contains(needle)
    {
        assert!(std::time::Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A `ring0.toml` with one grant (`name`, the TOML array `tools`, up to `ceiling`) and one
/// upstream `alias`, reached through `transport` (its `command`/`args`/… or `url` keys, and any
/// other key of its table), every tool of it a read unless `tool_tables` (more
/// `[upstreams.tools.NAME]` tables) says otherwise.
pub fn one_upstream_config(
    grant: &str,
    tools: &str,
    ceiling: &str,
    alias: &str,
    transport: &str,
    tool_tables: &str,
) -> String {
    format!(
        "defaults = false\n[workspace]\nstate_dir = \".ring0\"\n\n\
         [[grants]]\nname = {grant:?}\ntools = {tools}\nceiling = {ceiling:?}\n\n\
         [[upstreams]]\nalias = {alias:?}\n{transport}\n\
         [upstreams.tools.\"*\"]\neffect = \"nullipotent\"\nauthority = \"A0\"\n\
         strategy = [\"exploration\"]\n{tool_tables}"
    )
}

/// Two `[[auth.tokens]]` tables: `alice-token` for the principal `alice`, `bob-token` for `bob`.
pub fn alice_and_bob_tokens() -> String {
    format!(
        "{}\n{}",
        token_table("alice", "alice-token", ""),
        token_table("bob", "bob-token", "")
    )
}

/// A `ring0.toml` whose `shell` is held for a person's approval: the file tools up to A1,
/// `shell` up to A2 with `approval = true`, the state in `state/`.
pub const HELD_SHELL_CONFIG: &str = r#"[workspace]
state_dir = "state"

[[grants]]
name = "workspace"
tools = ["read_file", "list_dir", "write_file"]
ceiling = "A1"

[[grants]]
name = "shell"
tools = ["shell"]
ceiling = "A2"
approval = true
"#;

/// The `ring0` binary under test.
pub fn ring0() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ring0"))
}

/// `ring0` in `dir` as a person runs it there: the tests' home, no workspace, log level or log
/// format from the environment, nothing on stdin.
pub fn ring0_command_in(dir: &Path) -> Command {
    let mut cmd = Command::new(ring0());
    cmd.current_dir(dir)
        .env("HOME", test_home())
        .env_remove("RING0_WORKSPACE")
        .env_remove("RING0_LOG_LEVEL")
        .env_remove("RING0_LOG_FORMAT")
        .stdin(Stdio::null());
    cmd
}

/// Output bytes as text.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The lowercase hex SHA-256 of `text`, as `[[auth.tokens]] sha256` holds a token.
pub fn sha256_hex(text: &str) -> String {
    ring::digest::digest(&ring::digest::SHA256, text.as_bytes())
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// An `[[auth.tokens]]` table: the token `token` named `name`, `extra` (more keys) after it.
pub fn token_table(name: &str, token: &str, extra: &str) -> String {
    format!(
        "[[auth.tokens]]\nname = {name:?}\nsha256 = {:?}\n{extra}",
        sha256_hex(token)
    )
}

/// The rmcp reference server `ring0-mcp-fixture`, built beside `ring0`.
pub fn rmcp_fixture() -> Option<PathBuf> {
    let p = ring0().with_file_name("ring0-mcp-fixture");
    if p.exists() {
        Some(p)
    } else {
        skip_or_fail(&format!(
            "{} is not built (cargo build -p ring0-mcp --bins)",
            p.display()
        ))
    }
}

/// Longest a helper waits for the server (start-up, a response).
pub const HTTP_WAIT: Duration = Duration::from_secs(60);

/// A running `ring0 serve --http`, killed when dropped.
pub struct HttpServer {
    pub child: Child,
    /// `host:port` it listens on.
    pub addr: String,
}

impl HttpServer {
    /// The MCP endpoint, `http://ADDR/mcp`.
    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `cmd` (a `ring0 serve --http 127.0.0.1:0 …` command, configured by the caller) and
/// waits for the address it prints on stderr.
pub fn start_http(cmd: Command) -> HttpServer {
    start_http_with(cmd, |_| {})
}

/// Starts `cmd` like [`start_http`], copying its stderr into `log` as well (what the person at
/// the terminal reads).
pub fn start_http_logged(cmd: Command, log: &Path) -> HttpServer {
    let mut file = std::fs::File::create(log).unwrap();
    start_http_with(cmd, move |line| {
        let _ = writeln!(file, "{line}");
        let _ = file.flush();
    })
}

/// Starts `cmd` like [`start_http`], handing every line of its stderr to `on_line`, the line
/// with the address included.
pub fn start_http_with(
    mut cmd: Command,
    mut on_line: impl FnMut(&str) + Send + 'static,
) -> HttpServer {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            on_line(&line);
            if let Some(rest) = line.split("listening on http://").nth(1) {
                let _ = tx.send(rest.trim_end_matches("/mcp").to_string());
            }
        }
    });
    let addr = rx
        .recv_timeout(HTTP_WAIT)
        .expect("the bound address is printed");
    HttpServer { child, addr }
}

/// The `ring0 serve --http 127.0.0.1:0` command in `dir`.
pub fn serve_http_command(dir: &std::path::Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ring0"));
    cmd.args(["serve", "--http", "127.0.0.1:0"])
        .current_dir(dir)
        .env("RING0_STATE_DIR", dir.join(".ring0"));
    cmd
}

/// The fenced blocks of `lang` in a Markdown text.
pub fn fenced(markdown: &str, lang: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        match &mut current {
            None if line.trim_start() == format!("```{lang}") => current = Some(String::new()),
            Some(_) if line.trim_start() == "```" => blocks.extend(current.take()),
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
            None => {}
        }
    }
    blocks
}

/// The status code of a response head (0 when it has none).
pub fn status(head: &str) -> u16 {
    head.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// The value of the header `name` (any case) in a response head.
pub fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// The `Mcp-Session-Id` a response head carries; fails the test without one.
pub fn session_id(head: &str) -> String {
    header(head, "mcp-session-id")
        .unwrap_or_else(|| panic!("no session id in:\n{head}"))
        .to_string()
}

/// The JSON-RPC `initialize` request `id` in `protocol_version`, declaring no capabilities.
pub fn initialize_request(id: u64, protocol_version: &str) -> Value {
    serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "initialize",
        "params": {"protocolVersion": protocol_version, "capabilities": {},
                   "clientInfo": {"name": "t", "version": "1"}}})
}

/// Decodes a `Transfer-Encoding: chunked` body.
pub fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// One POST to `/mcp` (`Connection: close`; `Host` is the address unless `headers` name one);
/// returns the response head and the decoded body.
pub fn post_raw(addr: &str, headers: &[(&str, &str)], body: &Value) -> (String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(HTTP_WAIT)).unwrap();
    let text = body.to_string();
    let mut req = format!(
        "POST /mcp HTTP/1.1\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n",
        text.len()
    );
    // A test of the Host check names its own.
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("Host: {addr}\r\n"));
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(&text);
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let (head, rest) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let body_text = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(rest)
    } else {
        rest.to_string()
    };
    (head.to_string(), body_text)
}

/// POSTs one JSON-RPC message; returns the response head and the JSON-RPC response with the
/// message's `id` (from a JSON body or from the SSE stream), or null for a notification.
pub fn post(addr: &str, headers: &[(&str, &str)], body: &Value) -> (String, Value) {
    let (head, body_text) = post_raw(addr, headers, body);
    let Some(id) = body.get("id") else {
        return (head, Value::Null);
    };
    let message = body_text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .chain(std::iter::once(body_text.as_str()))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .find(|m| m.get("id") == Some(id) && m.get("method").is_none())
        .unwrap_or_else(|| panic!("no response in:\n{head}\n{body_text}"));
    (head, message)
}

/// Starts `cmd` (a `ring0 serve` over stdio) with piped stdin and stdout; returns the child,
/// its stdin and a channel of every JSON-RPC message it writes, read by a thread of its own.
#[allow(dead_code)] // used by the stdio-client tests only
pub fn spawn_stdio_json(
    mut cmd: Command,
) -> (
    Child,
    std::process::ChildStdin,
    std::sync::mpsc::Receiver<Value>,
) {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("ring0 serve");
    let stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Ok(v) = serde_json::from_str::<Value>(&line)
                && tx.send(v).is_err()
            {
                return;
            }
        }
    });
    (child, stdin, rx)
}

/// A `ring0 serve` over stdio, initialized, answering one request at a time (killed on drop).
pub struct Serve {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    rx: std::sync::mpsc::Receiver<Value>,
    next_id: i64,
}

/// How long one request to `ring0 serve` may take.
pub const SERVE_WAIT: Duration = Duration::from_secs(90);

impl Serve {
    /// Starts `cmd` (a `ring0 serve` over stdio) and initializes a session.
    pub fn start(cmd: Command) -> Self {
        let (child, stdin, rx) = spawn_stdio_json(cmd);
        let mut serve = Self {
            child,
            stdin: Some(stdin),
            rx,
            next_id: 1,
        };
        serve.request(
            "initialize",
            serde_json::json!({"protocolVersion":"2025-06-18","capabilities":{},
                   "clientInfo":{"name":"t","version":"1"}}),
        );
        serve.send(serde_json::json!({"jsonrpc":"2.0","method":"notifications/initialized"}));
        serve
    }

    pub fn send(&mut self, v: Value) {
        writeln!(self.stdin.as_mut().unwrap(), "{v}").unwrap();
    }

    pub fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(serde_json::json!({"jsonrpc":"2.0","id":id,"method":method,"params":params}));
        let deadline = std::time::Instant::now() + SERVE_WAIT;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let m = self
                .rx
                .recv_timeout(left)
                .expect("a response from ring0 serve");
            if m["id"] == id {
                return m;
            }
        }
    }

    pub fn call(&mut self, tool: &str, arguments: Value) -> Value {
        self.request(
            "tools/call",
            serde_json::json!({"name": tool, "arguments": arguments}),
        )
    }

    /// Polls `tools/list` until `tool` is listed (an upstream's tools appear once it is up).
    pub fn wait_for_tool(&mut self, tool: &str) {
        let deadline = std::time::Instant::now() + SERVE_WAIT;
        loop {
            let listed = self.request("tools/list", serde_json::json!({}));
            if listed.to_string().contains(tool) {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{tool} never listed: {listed}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The request id a held `ring0 call` prints for the person ("approval required [ID]") on its
/// piped stderr, waited for at most `wait`.
#[allow(dead_code)]
pub fn held_request_id(call: &mut Child, wait: Duration) -> String {
    let stderr = call.stderr.take().expect("the call's stderr is piped");
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(rest) = line.split("approval required [").nth(1) {
                let _ = tx.send(rest.trim_end_matches(']').to_string());
            }
        }
    });
    rx.recv_timeout(wait)
        .expect("the call is held for approval")
}

/// A configuration with one upstream, `restarting_upstream.py` over `dir`, whose `charge` is
/// settled by probe; `extra` (tables) goes after `[workspace]`.
pub fn restarting_upstream_config(dir: &Path, extra: &str) -> String {
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/restarting_upstream.py");
    format!(
        r#"defaults = false
[workspace]
state_dir = ".ring0"
{extra}
[[grants]]
name = "pay"
tools = ["pay__*"]
ceiling = "A2"

[[upstreams]]
alias = "pay"
command = "python3"
args = [{fixture:?}, "--dir", {dir:?}]
env = ["PATH"]

[upstreams.tools.charge]
effect = "non_idempotent"
authority = "A2"
strategy = ["exploitation"]
settlement = "probe"
probe = "charge_status"

[upstreams.tools.charge_status]
effect = "nullipotent"
authority = "A0"
strategy = ["exploration"]
"#,
        fixture = fixture.display().to_string(),
        dir = dir.display().to_string(),
    )
}
