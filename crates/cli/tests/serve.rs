//! `ring0 serve` as an MCP client sees it: over stdio (JSON lines) and over HTTP, with the
//! standard-library Python fixture as the upstream.

mod common;

use common::*;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(30);

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../mcp/tests/fixtures/stdio_server.py")
}

fn write_config(dir: &Path, extra: &str) -> PathBuf {
    let path = dir.join("ring0.toml");
    let text = one_upstream_config(
        "fixture",
        r#"["fx__*"]"#,
        "A3",
        "fx",
        &format!(
            "command = \"python3\"\nargs = [{:?}]\nenv = [\"PATH\"]\n{extra}",
            fixture().display().to_string()
        ),
        "",
    );
    std::fs::write(&path, text).unwrap();
    path
}

struct Client {
    child: Child,
    stdin: ChildStdin,
    messages: Receiver<Value>,
    stderr: PathBuf,
    next_id: u64,
    /// Notifications and requests seen while waiting for responses.
    seen: Vec<Value>,
    /// Answers to server-initiated requests, by method.
    answers: Vec<(String, Value)>,
}

impl Client {
    fn start(dir: &Path, config: Option<&Path>) -> Self {
        let stderr = dir.join("serve.stderr");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ring0"));
        cmd.arg("serve")
            .current_dir(dir)
            .env("RING0_STATE_DIR", std::path::Path::new(dir).join(".ring0"));
        if let Some(c) = config {
            cmd.arg("--config").arg(c);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .expect("ring0 serve");
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if let Ok(v) = serde_json::from_str::<Value>(&line)
                    && tx.send(v).is_err()
                {
                    return;
                }
            }
        });
        Self {
            child,
            stdin,
            messages: rx,
            stderr,
            next_id: 1,
            seen: Vec::new(),
            answers: Vec::new(),
        }
    }

    fn send(&mut self, message: Value) {
        let mut line = serde_json::to_vec(&message).unwrap();
        line.push(b'\n');
        self.stdin.write_all(&line).unwrap();
        self.stdin.flush().unwrap();
    }

    fn handle_server_message(&mut self, m: Value) {
        if let (Some(method), Some(id)) = (m.get("method").and_then(Value::as_str), m.get("id")) {
            let answer = self
                .answers
                .iter()
                .find(|(meth, _)| meth == method)
                .map(|(_, a)| a.clone());
            let reply = match answer {
                Some(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
                None => {
                    json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "no"}})
                }
            };
            self.send(reply);
        }
        self.seen.push(m);
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.messages.recv_timeout(left) {
                Ok(m) if m.get("id") == Some(&json!(id)) && m.get("method").is_none() => return m,
                Ok(m) => self.handle_server_message(m),
                Err(RecvTimeoutError::Timeout) => panic!("no response to {method} in {WAIT:?}"),
                Err(RecvTimeoutError::Disconnected) => panic!(
                    "ring0 serve exited; stderr:\n{}",
                    std::fs::read_to_string(&self.stderr).unwrap_or_default()
                ),
            }
        }
    }

    fn initialize(&mut self, capabilities: Value) -> Value {
        let r = self.request(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": capabilities,
                   "clientInfo": {"name": "test", "version": "1"}}),
        );
        self.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        r
    }

    fn call(&mut self, name: &str, args: Value) -> Value {
        self.request("tools/call", json!({"name": name, "arguments": args}))["result"].clone()
    }

    fn call_with_meta(&mut self, name: &str, args: Value, meta: Value) -> Value {
        let params = json!({"name": name, "arguments": args, "_meta": meta});
        self.request("tools/call", params)["result"].clone()
    }

    fn wait_for(&mut self, what: impl Fn(&Value) -> bool) -> Value {
        if let Some(m) = self.seen.iter().find(|m| what(m)) {
            return m.clone();
        }
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.messages.recv_timeout(left) {
                Ok(m) => {
                    let hit = what(&m);
                    self.handle_server_message(m.clone());
                    if hit {
                        return m;
                    }
                }
                Err(_) => panic!("the expected message did not come"),
            }
        }
    }

    fn stderr_text(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn first_text(result: &Value) -> String {
    result["content"][0]["text"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

fn names(list: &Value) -> Vec<String> {
    list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn serve_on_embedded_defaults_answers_initialize_and_reports_where_it_serves() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Client::start(dir.path(), None);
    let init = c.initialize(json!({}));
    assert_eq!(init["result"]["serverInfo"]["name"], "ring0");
    assert_eq!(init["result"]["capabilities"]["tools"]["listChanged"], true);
    let list = c.request("tools/list", json!({}));
    assert!(list["result"]["tools"].is_array());
    let err = c.stderr_text();
    assert!(err.contains("serving MCP on stdio"), "{err}");
    assert!(err.contains("journal: "), "{err}");
    assert!(err.contains("grants: "), "{err}");
    assert!(dir.path().join(".ring0/journal.db").exists());
}

#[test]
fn upstream_tools_are_listed_and_called_through_ring0() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "");
    let mut c = Client::start(dir.path(), Some(&config));
    c.initialize(json!({}));
    let list = c.request("tools/list", json!({}));
    assert!(names(&list).contains(&"fx__echo".to_string()));
    let r = c.call("fx__echo", json!({"text": "through ring0"}));
    assert_eq!(first_text(&r), "through ring0");
    assert_eq!(r["isError"], false);
    assert_eq!(r["_meta"]["io.ring0/receipt"]["state"], "ACKED");
}

#[test]
fn a_refused_call_says_why_as_an_error_result() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "");
    let mut c = Client::start(dir.path(), Some(&config));
    c.initialize(json!({}));
    // An unknown tool is a protocol error, with the closest names.
    let r = c.request(
        "tools/call",
        json!({"name": "fx__echoo", "arguments": {"text": "x"}}),
    );
    assert_eq!(r["error"]["code"], -32602);
    assert_eq!(r["error"]["data"]["status"], "unknown_tool");
    assert!(r["error"]["message"].as_str().unwrap().contains("fx__echo"));
    let r = c.call("fx__echo", json!({"text": 5}));
    let body: Value = serde_json::from_str(&first_text(&r)).unwrap();
    assert_eq!(body["status"], "validation_error");
}

#[test]
fn progress_reaches_the_client_under_its_own_token() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "");
    let mut c = Client::start(dir.path(), Some(&config));
    c.initialize(json!({}));
    let r = c.request(
        "tools/call",
        json!({"name": "fx__slow", "arguments": {"steps": 3, "delay_ms": 50},
               "_meta": {"progressToken": "client-token-7"}}),
    );
    assert_eq!(first_text(&r["result"]), "done after 3 steps");
    let p = c.wait_for(|m| m["method"] == "notifications/progress");
    assert_eq!(p["params"]["progressToken"], "client-token-7");
    assert_eq!(p["params"]["total"], 3.0);
}

#[test]
fn an_upstream_elicitation_is_relayed_to_the_client_that_made_the_call() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "");
    let mut c = Client::start(dir.path(), Some(&config));
    c.initialize(json!({"elicitation": {}}));
    c.answers.push((
        "elicitation/create".into(),
        json!({"action": "accept", "content": {"ok": true}}),
    ));
    let r = c.call("fx__ask", json!({}));
    let answer: Value = serde_json::from_str(&first_text(&r)).unwrap();
    assert_eq!(answer["action"], "accept");
    assert_eq!(answer["content"]["ok"], true);
}

#[test]
fn a_tool_list_change_upstream_is_announced_to_the_client() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "");
    let mut c = Client::start(dir.path(), Some(&config));
    c.initialize(json!({}));
    c.call("fx__add_tool", json!({}));
    c.wait_for(|m| m["method"] == "notifications/tools/list_changed");
}

#[test]
fn a_tool_list_change_upstream_reaches_a_2026_07_28_client_on_its_listen_stream() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "");
    let mut c = Client::start(dir.path(), Some(&config));
    // No initialize: every request of the stateless era carries its own context.
    let meta = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                      "io.modelcontextprotocol/clientCapabilities": {},
                      "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "1"}});
    c.send(
        json!({"jsonrpc": "2.0", "id": "listen-1", "method": "subscriptions/listen",
                  "params": {"_meta": meta, "notifications": {"toolsListChanged": true}}}),
    );
    let r = c.request(
        "tools/call",
        json!({"name": "fx__add_tool", "arguments": {}, "_meta": meta}),
    );
    assert_ne!(r["result"]["isError"], true, "{r}");
    let note = c.wait_for(|m| m["method"] == "notifications/tools/list_changed");
    assert!(note.get("id").is_none(), "a notification: {note}");
}

#[test]
fn an_irreversible_call_runs_when_the_person_approves_and_not_when_they_decline() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "[upstreams.tools.echo]\nauthority = \"A3\"\n");
    let mut c = Client::start(dir.path(), Some(&config));
    c.initialize(json!({"elicitation": {}}));
    c.answers.push((
        "elicitation/create".into(),
        json!({"action": "accept", "content": {"approve": true}}),
    ));
    let r = c.call("fx__echo", json!({"text": "approved"}));
    assert_eq!(first_text(&r), "approved");
    let asked = c.wait_for(|m| m["method"] == "elicitation/create");
    assert!(
        asked["params"]["message"]
            .as_str()
            .unwrap()
            .contains("fx__echo")
    );

    c.answers.clear();
    c.answers
        .push(("elicitation/create".into(), json!({"action": "decline"})));
    let r = c.call("fx__echo", json!({"text": "declined"}));
    assert_eq!(r["isError"], true);
    let body: Value = serde_json::from_str(&first_text(&r)).unwrap();
    assert_eq!(body["status"], "approval_denied");
}

#[test]
fn without_elicitation_a_confirmation_code_shown_to_the_person_approves_one_call() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "[upstreams.tools.echo]\nauthority = \"A3\"\n");
    let mut c = Client::start(dir.path(), Some(&config));
    c.initialize(json!({}));
    let r = c.call("fx__echo", json!({"text": "hold"}));
    assert_eq!(r["isError"], true);
    assert!(first_text(&r).contains("confirmation code"));
    let err = c.stderr_text();
    let code = err
        .lines()
        .filter(|l| l.contains("approval needed"))
        .find_map(|l| l.split("confirmation code ").nth(1))
        .expect("the code is printed for the person")
        .trim()
        .to_string();
    assert!(
        !first_text(&r).contains(&code),
        "the model never sees the code"
    );
    // A different argument does not match the code.
    let other = c.request(
        "tools/call",
        json!({"name": "fx__echo", "arguments": {"text": "other"}, "_meta": {"io.ring0/confirm": code}}),
    );
    assert_eq!(other["result"]["isError"], true);
    let ok = c.request(
        "tools/call",
        json!({"name": "fx__echo", "arguments": {"text": "hold"}, "_meta": {"io.ring0/confirm": code}}),
    );
    assert_eq!(first_text(&ok["result"]), "hold");
}

#[test]
fn a_cancelled_call_is_cancelled_upstream() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("fixture.log");
    let config = write_config(
        dir.path(),
        &format!(
            "env_set = {{ FIXTURE_LOG = {:?} }}",
            log.display().to_string()
        ),
    );
    let mut c = Client::start(dir.path(), Some(&config));
    c.initialize(json!({}));
    c.send(json!({"jsonrpc": "2.0", "id": 99, "method": "tools/call",
                  "params": {"name": "fx__silent", "arguments": {}}}));
    wait_for_file_text(&log, "tools/call", "the call never reached the upstream");
    c.send(
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                  "params": {"requestId": 99, "reason": "user pressed stop"}}),
    );
    wait_for_file_text(&log, "notifications/cancelled", "the upstream was not told");
}

#[test]
fn the_journal_records_every_call_ring0_serves() {
    let dir = tempfile::tempdir().unwrap();
    // A write with an external effect: committed to the journal before it runs.
    let config = write_config(
        dir.path(),
        "[upstreams.tools.echo]\neffect = \"idempotent\"\nauthority = \"A2\"\nsettlement = \"idempotency_key\"\n",
    );
    {
        let mut c = Client::start(dir.path(), Some(&config));
        c.initialize(json!({}));
        c.call("fx__echo", json!({"text": "one"}));
    }
    let out = Command::new(env!("CARGO_BIN_EXE_ring0"))
        .args(["journal", "ls"])
        .current_dir(dir.path())
        .env(
            "RING0_STATE_DIR",
            std::path::Path::new(dir.path()).join(".ring0"),
        )
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("fx__echo"), "{text}");
}

/// A write with an external effect, committed to the journal before it runs.
const JOURNALED: &str =
    "effect = \"idempotent\"\nauthority = \"A2\"\nsettlement = \"idempotency_key\"\n";

#[test]
fn a_retried_call_is_answered_from_its_receipt_with_the_result_the_first_call_had() {
    // The retry (same idempotency key) runs nothing: its result exists only as the journal's
    // receipt, so the client sees the first result again only if results are projected from
    // receipts.
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &format!("[upstreams.tools.image]\n{JOURNALED}"));
    let mut c = Client::start(dir.path(), Some(&config));
    c.initialize(json!({}));
    let key = json!({"io.ring0/idempotency-key": "image-1"});
    let first = c.call_with_meta("fx__image", json!({}), key.clone());
    let again = c.call_with_meta("fx__image", json!({}), key);
    let receipt = |r: &Value| r["_meta"]["io.ring0/receipt"]["disposition"].clone();
    assert_eq!(receipt(&first), "dispatched", "{first}");
    assert_eq!(receipt(&again), "replayed", "{again}");
    let image = json!({"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"});
    assert_eq!(first["content"], json!([image]), "{first}");
    assert_eq!(again["content"], first["content"], "{again}");
}

/// The call ids of the calls held for approval, in order (`.ring0/audit.jsonl`).
fn held_call_ids(dir: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(dir.join(".ring0/audit.jsonl")).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["decision"] == "held")
        .map(|e| e["call_id"].as_str().unwrap_or("").to_string())
        .collect()
}

#[test]
fn two_clients_calling_at_once_with_equal_call_ids_are_each_asked_and_answered_alone() {
    let Some(peers) = peers() else { return };
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), "[upstreams.tools.echo]\nauthority = \"A3\"\n");
    let server = start_http(serve_http_command(dir.path()));
    let script = fixture().with_file_name("py_client_two_clients.py");
    for era in ["legacy", "2026-07-28"] {
        let seen = python_report(Command::new(python(&peers)).arg(&script).args([
            &server.url(),
            era,
            "fx__echo",
        ]));
        // Each approval question reached the client whose call it holds, both at once.
        assert_eq!(seen["missing"], json!([]), "{era}: {seen}");
        assert_eq!(seen["accepting"]["asked"], 1, "{era}: {seen}");
        assert_eq!(seen["declining"]["asked"], 1, "{era}: {seen}");
        // Each answer decided its own call: the approved one ran, the declined one did not.
        assert_eq!(
            seen["accepting"]["text"],
            format!("accepting in {era}"),
            "{era}: {seen}"
        );
        assert_eq!(seen["accepting"]["is_error"], false, "{era}: {seen}");
        assert_eq!(seen["declining"]["is_error"], true, "{era}: {seen}");
        let refusal: Value =
            serde_json::from_str(seen["declining"]["text"].as_str().unwrap_or("")).unwrap();
        assert_eq!(refusal["status"], "approval_denied", "{era}: {seen}");
        // The two held calls had one call id (each client's request id): nothing keys on it.
        let held = held_call_ids(dir.path());
        let last = &held[held.len().saturating_sub(2)..];
        assert_eq!(last.len(), 2, "{era}: {held:?}");
        assert_eq!(
            last[0], last[1],
            "{era}: the calls' ids are equal: {held:?}"
        );
    }
}

#[test]
fn an_invalid_config_is_refused_at_start_with_the_offending_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, "[[upstreams]]\nalias = \"a.b\"\ncommand = \"x\"\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ring0"))
        .args(["serve", "--config"])
        .arg(&path)
        .current_dir(dir.path())
        .env(
            "RING0_STATE_DIR",
            std::path::Path::new(dir.path()).join(".ring0"),
        )
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("upstreams[0].alias"), "{err}");
}

#[test]
fn a_fixed_scope_is_refused_for_http_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ring0"))
        .args(["serve", "--http", "127.0.0.1:0", "--scope", "s"])
        .current_dir(dir.path())
        .env(
            "RING0_STATE_DIR",
            std::path::Path::new(dir.path()).join(".ring0"),
        )
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--scope applies to the stdio session"),
        "{err}"
    );
}

// ---- Streamable HTTP ----

fn serve_http(dir: &Path, token: Option<&str>) -> HttpServer {
    let mut cmd = serve_http_command(dir);
    if let Some(t) = token {
        cmd.env("RING0_TEST_TOKEN", t)
            .args(["--token-env", "RING0_TEST_TOKEN"]);
    }
    start_http(cmd)
}

/// One HTTP/1.1 request; returns the status code, headers and body.
fn post(addr: &str, headers: &[(&str, &str)], body: &Value) -> (u16, String, String) {
    let (head, body) = post_raw(addr, headers, body);
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, head, body)
}

fn init_body() -> Value {
    initialize_request(1, "2025-06-18")
}

#[test]
fn http_serves_initialize_on_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve_http(dir.path(), None);
    let (status, head, body) = post(&server.addr, &[], &init_body());
    assert_eq!(status, 200, "{head}\n{body}");
    assert!(body.contains("\"ring0\""), "{body}");
    assert!(
        head.to_ascii_lowercase().contains("mcp-session-id"),
        "{head}"
    );
}

#[test]
fn http_refuses_a_foreign_host_and_a_foreign_origin() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve_http(dir.path(), None);
    let (status, _, _) = post(&server.addr, &[("Host", "attacker.example")], &init_body());
    assert_eq!(status, 403);
    let (status, _, _) = post(
        &server.addr,
        &[("Origin", "https://attacker.example")],
        &init_body(),
    );
    assert_eq!(status, 403);
}

#[test]
fn http_requires_the_bearer_token_when_configured() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve_http(dir.path(), Some("s3cret"));
    let (status, _, _) = post(&server.addr, &[], &init_body());
    assert_eq!(status, 401);
    let (status, _, _) = post(
        &server.addr,
        &[("Authorization", "Bearer wrong")],
        &init_body(),
    );
    assert_eq!(status, 401);
    let (status, _, _) = post(
        &server.addr,
        &[("Authorization", "Bearer s3cret")],
        &init_body(),
    );
    assert_eq!(status, 200);
}

#[test]
fn http_serves_the_stateless_protocol_with_per_request_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve_http(dir.path(), None);
    let meta = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                      "io.modelcontextprotocol/clientCapabilities": {},
                      "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"}});
    let list =
        json!({"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": {"_meta": meta}});
    let (status, head, body) = post(
        &server.addr,
        &[
            ("MCP-Protocol-Version", "2026-07-28"),
            ("Mcp-Method", "tools/list"),
        ],
        &list,
    );
    assert_eq!(status, 200, "{head}\n{body}");
    assert!(body.contains("\"tools\""), "{body}");
    // A header that contradicts the body is refused.
    let (status, _, body) = post(
        &server.addr,
        &[
            ("MCP-Protocol-Version", "2026-07-28"),
            ("Mcp-Method", "tools/call"),
        ],
        &list,
    );
    assert!(status == 400 || body.contains("-32020"), "{status} {body}");
}

#[test]
fn over_stdio_upstream_definitions_and_results_keep_fields_rmcp_does_not_model() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "");
    let mut c = Client::start(dir.path(), Some(&config));
    c.initialize(json!({}));
    let list = c.request("tools/list", json!({}));
    let echo = list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "fx__echo")
        .cloned()
        .unwrap();
    assert_eq!(echo["x-vendor"]["kept"], true, "{echo}");
}

#[test]
fn a_changed_upstream_tool_is_quarantined_until_ring0_approve_tool() {
    let dir = tempfile::tempdir().unwrap();
    {
        let config = write_config(dir.path(), "");
        let mut c = Client::start(dir.path(), Some(&config));
        c.initialize(json!({}));
        assert!(names(&c.request("tools/list", json!({}))).contains(&"fx__echo".to_string()));
    }
    assert!(
        dir.path().join("ring0.lock").exists(),
        "trusted on first use, recorded"
    );
    let config = write_config(
        dir.path(),
        "env_set = { FIXTURE_DESCRIPTION = \"Now also sends your files elsewhere.\" }",
    );
    let mut c = Client::start(dir.path(), Some(&config));
    c.initialize(json!({}));
    assert!(!names(&c.request("tools/list", json!({}))).contains(&"fx__echo".to_string()));
    let r = c.call("fx__echo", json!({"text": "x"}));
    assert_eq!(r["isError"], true);
    assert!(first_text(&r).contains("quarantined"), "{r}");

    let ring0 = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_ring0"))
            .args(args)
            .current_dir(dir.path())
            .env(
                "RING0_STATE_DIR",
                std::path::Path::new(dir.path()).join(".ring0"),
            )
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(ring0(&["approve-tool", "--list"]).contains("fx__echo"));
    assert!(ring0(&["approve-tool", "fx__echo"]).contains("approved: fx__echo"));
    // The running server sees the lock change, lists again and tells the client.
    c.wait_for(|m| m["method"] == "notifications/tools/list_changed");
    let deadline = Instant::now() + WAIT;
    while !names(&c.request("tools/list", json!({}))).contains(&"fx__echo".to_string()) {
        assert!(Instant::now() < deadline, "fx__echo never came back");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        first_text(&c.call("fx__echo", json!({"text": "approved"}))),
        "approved"
    );
}

/// A config with the built-in tools granted, and the rmcp fixture (which offers prompts and
/// resources) as upstream `up`, granted only when `grant_upstream`.
fn prompts_and_resources_config(dir: &Path, fixture: &Path, grant_upstream: bool) -> PathBuf {
    let tools = if grant_upstream {
        r#"["list_dir", "up__*"]"#
    } else {
        r#"["list_dir"]"#
    };
    let path = dir.join("ring0.toml");
    let transport = format!("command = {:?}", fixture.display().to_string());
    std::fs::write(
        &path,
        one_upstream_config("some", tools, "A0", "up", &transport, ""),
    )
    .unwrap();
    path
}

fn prompt_names(list: &Value) -> Vec<String> {
    list["result"]["prompts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["name"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn an_upstreams_prompts_and_resources_reach_only_sessions_granted_its_unquarantined_tools() {
    let Some(fixture) = rmcp_fixture() else {
        return;
    };
    let uri = json!({"uri": "test://static-text"});

    let granted = tempfile::tempdir().unwrap();
    let config = prompts_and_resources_config(granted.path(), &fixture, true);
    let mut c = Client::start(granted.path(), Some(&config));
    let init = c.initialize(json!({}));
    assert!(
        init["result"]["capabilities"]["resources"].is_object(),
        "{init}"
    );
    let prompts = c.request("prompts/list", json!({}));
    assert!(
        prompt_names(&prompts).iter().any(|n| n.starts_with("up__")),
        "{prompts}"
    );
    let read = c.request("resources/read", uri.clone());
    assert_eq!(
        read["result"]["contents"][0]["uri"], "test://static-text",
        "{read}"
    );
    drop(c);

    let closed = tempfile::tempdir().unwrap();
    let config = prompts_and_resources_config(closed.path(), &fixture, false);
    let mut c = Client::start(closed.path(), Some(&config));
    let init = c.initialize(json!({}));
    assert!(
        init["result"]["capabilities"].get("resources").is_none(),
        "{init}"
    );
    assert!(
        init["result"]["capabilities"].get("prompts").is_none(),
        "{init}"
    );
    let prompts = c.request("prompts/list", json!({}));
    assert!(
        !prompt_names(&prompts).iter().any(|n| n.starts_with("up__")),
        "{prompts}"
    );
    let resources = c.request("resources/list", json!({}));
    assert_eq!(resources["result"]["resources"], json!([]), "{resources}");
    let read = c.request("resources/read", uri.clone());
    assert!(read.get("result").is_none(), "{read}");
    assert!(
        read["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("test://static-text")),
        "{read}"
    );
    drop(c);

    // Granted, but every tool of the upstream is quarantined (the lock approved the upstream
    // with other tools): its resources are out of reach as well.
    let quarantined = tempfile::tempdir().unwrap();
    let config = prompts_and_resources_config(quarantined.path(), &fixture, true);
    std::fs::write(
        quarantined.path().join("ring0.lock"),
        "[upstreams.up.tools]\nretired = \"sha256:00\"\n",
    )
    .unwrap();
    let mut c = Client::start(quarantined.path(), Some(&config));
    c.initialize(json!({}));
    let read = c.request("resources/read", uri);
    assert!(read.get("result").is_none(), "{read}");
    let prompts = c.request("prompts/list", json!({}));
    assert!(
        !prompt_names(&prompts).iter().any(|n| n.starts_with("up__")),
        "{prompts}"
    );
}
