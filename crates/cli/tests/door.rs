//! Limits at the door, against the real `ring0 serve`: every line a stdio client sends is
//! answered (malformed JSON of every kind, bad params, repeated argument keys); over HTTP,
//! thousands of half-open connections and a flood of `initialize`s leave a legitimate client
//! served, ring0's descriptors and memory bounded, and idle sessions closed.

mod common;

use common::*;
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::sync::mpsc::Receiver;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(60);

/// A workspace whose `ring0.toml` adds `extra` to a private state directory (the embedded
/// grants stay in effect).
fn workspace(extra: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("ring0.toml"),
        format!(
            "[workspace]\nstate_dir = \".ring0\"\n\n[[grants]]\nname = \"files\"\n\
             tools = [\"read_file\", \"list_dir\", \"write_file\"]\nceiling = \"A1\"\n\n{extra}"
        ),
    )
    .unwrap();
    dir
}

// ---- stdio ----

fn stdio(
    dir: &Path,
) -> (
    std::process::Child,
    std::process::ChildStdin,
    Receiver<Value>,
) {
    let mut cmd = Command::new(ring0());
    cmd.arg("serve")
        .current_dir(dir)
        .env("RING0_STATE_DIR", dir.join(".ring0"))
        .stderr(std::process::Stdio::null());
    spawn_stdio_json(cmd)
}

fn send_line(stdin: &mut std::process::ChildStdin, line: &[u8]) {
    stdin.write_all(line).unwrap();
    stdin.write_all(b"\n").unwrap();
    stdin.flush().unwrap();
}

fn next(messages: &Receiver<Value>) -> Value {
    messages.recv_timeout(WAIT).expect("ring0 answers")
}

fn initialized(stdin: &mut std::process::ChildStdin, messages: &Receiver<Value>) {
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "t", "version": "1"}}});
    send_line(stdin, init.to_string().as_bytes());
    assert_eq!(next(messages)["id"], 0);
    send_line(
        stdin,
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
            .to_string()
            .as_bytes(),
    );
}

#[test]
fn every_unparseable_stdio_line_is_answered_with_a_parse_error_and_the_session_goes_on() {
    let dir = workspace("");
    let (mut child, mut stdin, messages) = stdio(dir.path());
    initialized(&mut stdin, &messages);
    let deep = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":15,\"method\":\"ping\",\"params\":{}",
        "[".repeat(100_000)
    );
    let mut huge =
        b"{\"jsonrpc\":\"2.0\",\"id\":16,\"method\":\"ping\",\"params\":{\"x\":\"".to_vec();
    huge.resize(17 * 1024 * 1024, b'a');
    huge.extend_from_slice(b"\"}}");
    let lines: Vec<(Vec<u8>, Value)> = vec![
        (
            b"{\"jsonrpc\":\"2.0\",\"id\":11,\"method\":\"ping\"".to_vec(),
            json!(11),
        ),
        (
            b"{\"jsonrpc\":\"2.0\",\"id\":12,\"method\":\"ping\",\"params\":{\"x\":\"\xff\"}}"
                .to_vec(),
            json!(12),
        ),
        (
            br#"{"jsonrpc":"2.0","id":13,"method":"ping","params":{"x":"\udc00"}}"#.to_vec(),
            json!(13),
        ),
        (
            br#"{"jsonrpc":"2.0","id":14,"method":"ping","params":{"x":1e400}}"#.to_vec(),
            json!(14),
        ),
        (deep.into_bytes(), json!(15)),
        (huge, Value::Null),
        (b"this is not json".to_vec(), Value::Null),
    ];
    for (line, id) in lines {
        send_line(&mut stdin, &line);
        let answer = next(&messages);
        assert_eq!(answer["error"]["code"], -32700, "{answer}");
        assert_eq!(answer["id"], id, "{answer}");
    }
    send_line(&mut stdin, br#"{"jsonrpc":"2.0","id":20,"method":"ping"}"#);
    let pong = next(&messages);
    assert_eq!(pong["id"], 20);
    assert!(pong.get("result").is_some(), "{pong}");
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn bad_tools_call_params_over_stdio_are_invalid_params() {
    let dir = workspace("");
    let (mut child, mut stdin, messages) = stdio(dir.path());
    initialized(&mut stdin, &messages);
    send_line(
        &mut stdin,
        br#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":7}}"#,
    );
    let answer = next(&messages);
    assert_eq!(answer["id"], 3);
    assert_eq!(answer["error"]["code"], -32602, "{answer}");
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn a_call_whose_arguments_repeat_a_key_is_refused_before_anything_runs() {
    let dir = workspace("");
    let (mut child, mut stdin, messages) = stdio(dir.path());
    initialized(&mut stdin, &messages);
    send_line(
        &mut stdin,
        br#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"write_file","arguments":{"path":"a.txt","content":"one","path":"b.txt"}}}"#,
    );
    let answer = next(&messages);
    assert_eq!(answer["id"], 4);
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    let text = answer["result"]["content"][0]["text"].as_str().unwrap();
    let rejection: Value = serde_json::from_str(text).unwrap();
    assert_eq!(rejection["status"], "invalid_json", "{rejection}");
    assert!(
        rejection["message"].as_str().unwrap().contains("\"path\""),
        "{rejection}"
    );
    assert!(!dir.path().join("a.txt").exists() && !dir.path().join("b.txt").exists());
    let _ = child.kill();
    let _ = child.wait();
}

// ---- HTTP ----

fn proc_status(pid: u32, key: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{key} in /proc/{pid}/status"))
}

fn rss_kib(pid: u32) -> u64 {
    proc_status(pid, "VmRSS:")
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// A legitimate sessionful client: opens a session and lists tools through it.
struct Legit {
    addr: String,
    session: String,
    next_id: u64,
}

impl Legit {
    fn open(addr: &str) -> Self {
        let (head, init) = post(addr, &[], &init_body(1));
        assert!(init.get("result").is_some(), "{head}\n{init}");
        let session = header(&head, "mcp-session-id")
            .expect("a session")
            .to_string();
        let this = Self {
            addr: addr.to_string(),
            session,
            next_id: 2,
        };
        post_raw(
            addr,
            &this.headers(),
            &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        );
        this
    }

    fn headers(&self) -> [(&str, &str); 2] {
        [
            ("Mcp-Session-Id", self.session.as_str()),
            ("MCP-Protocol-Version", "2025-11-25"),
        ]
    }

    /// Lists the tools; the names it got.
    fn list(&mut self) -> Vec<String> {
        self.next_id += 1;
        let body = json!({"jsonrpc": "2.0", "id": self.next_id, "method": "tools/list"});
        let (head, answer) = post(&self.addr, &self.headers(), &body);
        assert_eq!(status(&head), 200, "{head}\n{answer}");
        answer["result"]["tools"]
            .as_array()
            .unwrap_or_else(|| panic!("a listing: {answer}"))
            .iter()
            .filter_map(|t| t["name"].as_str().map(String::from))
            .collect()
    }
}

fn init_body(id: u64) -> Value {
    initialize_request(id, "2025-11-25")
}

fn serve(dir: &Path) -> HttpServer {
    start_http(serve_http_command(dir))
}

/// Half-open connections: each sends the start of a request and never finishes its headers.
fn half_open(addr: &str, n: usize) -> Vec<TcpStream> {
    (0..n)
        .filter_map(|_| {
            let mut s = TcpStream::connect(addr).ok()?;
            let _ = s.write_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: app");
            Some(s)
        })
        .collect()
}

const SLOWLORIS_CONNECTIONS: usize = 3000;
const SLOWLORIS_WAVES: usize = 6;

#[test]
fn thousands_of_half_open_connections_leave_a_legitimate_client_served() {
    let dir = workspace("[http]\nconnections_max = 256\n");
    let server = serve(dir.path());
    let pid = server.child.id();
    let mut legit = Legit::open(&server.addr);
    assert!(legit.list().contains(&"read_file".to_string()));
    let mut held = Vec::new();
    for _ in 0..SLOWLORIS_WAVES {
        held.extend(half_open(
            &server.addr,
            SLOWLORIS_CONNECTIONS / SLOWLORIS_WAVES,
        ));
        assert!(legit.list().contains(&"read_file".to_string()));
        // A client that arrives now, with a new connection and a new session, is served too.
        assert!(
            Legit::open(&server.addr)
                .list()
                .contains(&"read_file".to_string())
        );
    }
    assert!(
        held.len() >= SLOWLORIS_CONNECTIONS * 9 / 10,
        "{} opened",
        held.len()
    );
    let fds = open_fds(pid);
    assert!(
        fds < 256 + 64,
        "ring0 holds {fds} descriptors with {} half-open connections against a cap of 256",
        held.len()
    );
}

#[test]
fn a_connection_that_never_finishes_its_headers_is_closed_at_the_header_timeout() {
    let dir = workspace("[http]\nheader_read_timeout_ms = 300\n");
    let server = serve(dir.path());
    let mut s = TcpStream::connect(&server.addr).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s.write_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .unwrap();
    let mut buf = Vec::new();
    // ring0 closes the connection (perhaps after a 408); the read ends instead of waiting.
    let read = s.read_to_end(&mut buf);
    assert!(
        read.is_ok(),
        "the connection was closed, not left to time out: {read:?}"
    );
    let text = String::from_utf8_lossy(&buf);
    assert!(!text.contains("200 OK"), "{text}");
}

#[test]
fn a_body_that_stops_arriving_is_answered_408_at_the_body_timeout() {
    let dir = workspace("[http]\nbody_read_timeout_ms = 300\n");
    let server = serve(dir.path());
    let mut s = TcpStream::connect(&server.addr).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    write!(
        s,
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: 500\r\n\r\n{{\"jsonrpc\"",
        server.addr
    )
    .unwrap();
    let mut head = [0u8; 64];
    let n = s.read(&mut head).unwrap();
    let text = String::from_utf8_lossy(&head[..n]);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
}

const FLOOD_SESSIONS: usize = 4000;
const FLOOD_RSS_GROWTH_KIB_MAX: u64 = 64 * 1024;

#[test]
fn a_flood_of_initializes_keeps_memory_bounded_and_the_legitimate_session_served() {
    let dir = workspace("[http]\nsessions_per_principal_max = 32\n");
    let server = serve(dir.path());
    let pid = server.child.id();
    let mut legit = Legit::open(&server.addr);
    assert!(!legit.list().is_empty());
    let before = rss_kib(pid);
    for i in 0..FLOOD_SESSIONS {
        let (head, _) = post_raw(&server.addr, &[], &init_body(1));
        assert_eq!(status(&head), 200, "initialize {i}: {head}");
        if i % 16 == 0 {
            assert!(!legit.list().is_empty(), "served during the flood ({i})");
        }
    }
    assert!(!legit.list().is_empty());
    let after = rss_kib(pid);
    assert!(
        after < before + FLOOD_RSS_GROWTH_KIB_MAX,
        "{FLOOD_SESSIONS} initializes grew ring0 from {before} KiB to {after} KiB"
    );
    eprintln!("RSS: {before} KiB before, {after} KiB after {FLOOD_SESSIONS} initializes");
}

#[test]
fn an_idle_session_is_closed_and_its_client_told_to_initialize_again() {
    let dir = workspace("[http]\nsession_idle_timeout_s = 1\n");
    let log = dir.path().join("serve.stderr");
    let server = start_http_logged(serve_http_command(dir.path()), &log);
    let mut legit = Legit::open(&server.addr);
    assert!(!legit.list().is_empty());
    wait_for_file_text(&log, "closed: idle", "the idle session is closed");
    let body = json!({"jsonrpc": "2.0", "id": 99, "method": "tools/list"});
    let (head, _) = post_raw(&server.addr, &legit.headers(), &body);
    assert_eq!(status(&head), 404, "{head}");
}

#[test]
fn over_http_a_malformed_message_is_answered_with_a_parse_error_and_its_id() {
    let dir = workspace("");
    let server = serve(dir.path());
    let mut s = TcpStream::connect(&server.addr).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    let body = br#"{"jsonrpc":"2.0","id":41,"method":"initialize","params":{"x":1e400}}"#;
    write!(
        s,
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        server.addr,
        body.len()
    )
    .unwrap();
    s.write_all(body).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    assert_eq!(status(head), 400, "{head}");
    let answer: Value = serde_json::from_str(body.trim()).unwrap();
    assert_eq!(answer["error"]["code"], -32700, "{answer}");
    assert_eq!(answer["id"], 41, "{answer}");
}
