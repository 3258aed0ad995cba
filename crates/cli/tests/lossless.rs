//! An upstream's tool definitions and results reach the client through `ring0 serve` with the
//! fields typed MCP models do not know — a tool's `execution`, an unknown annotation hint, an
//! unknown top-level field, an unknown result field, a content item of an unknown type — over
//! Streamable HTTP in both protocol eras and over stdio in the 2026-07-28 era.
//!
//! The upstream is `fixtures/unmodelled_server.py` (standard library only). The Python SDK client
//! checks come from the peers `scripts/install-mcp-peers.sh` installs; without them those tests
//! print why they are skipped, unless `CI` is set.

mod common;

use common::*;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::channel;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(60);

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn workspace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "defaults = false\n[workspace]\nstate_dir = \".ring0\"\n\n[[grants]]\nname = \"unmodelled\"\ntools = [\"un__*\"]\nceiling = \"A3\"\n\n[[upstreams]]\nalias = \"un\"\ncommand = \"python3\"\nargs = [{:?}]\nenv = [\"PATH\"]\n[upstreams.tools.\"*\"]\neffect = \"nullipotent\"\nauthority = \"A0\"\nstrategy = [\"exploration\"]\n",
        fixtures()
            .join("unmodelled_server.py")
            .display()
            .to_string()
    );
    std::fs::write(dir.path().join("ring0.toml"), config).unwrap();
    dir
}

fn check_tool(tool: &Value) {
    assert_eq!(
        tool["execution"],
        json!({"taskSupport": "optional"}),
        "{tool}"
    );
    assert_eq!(tool["annotations"]["futureHint"], "kept", "{tool}");
    assert_eq!(tool["annotations"]["readOnlyHint"], true, "{tool}");
    assert_eq!(tool["x-vendor"], json!({"kept": true}), "{tool}");
}

fn probe_of(list: &Value) -> Value {
    list["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("no tools in {list}"))
        .iter()
        .find(|t| t["name"] == "un__probe")
        .cloned()
        .unwrap_or_else(|| panic!("un__probe not listed: {list}"))
}

fn check_widget(result: &Value) {
    assert_eq!(result["content"][0]["text"], "a widget follows", "{result}");
    assert_eq!(
        result["content"][1],
        json!({"type": "widget", "widget": {"dial": 7}}),
        "{result}"
    );
}

// ---- ring0 serve over HTTP, spoken to with raw HTTP/1.1 ----

fn serve_http(dir: &Path) -> HttpServer {
    start_http(serve_http_command(dir))
}

fn modern_meta() -> Value {
    json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
           "io.modelcontextprotocol/clientCapabilities": {},
           "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"}})
}

#[test]
fn over_http_sessionful_unmodelled_definition_and_result_fields_reach_the_client() {
    let dir = workspace();
    let server = serve_http(dir.path());
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "t", "version": "1"}}});
    let (head, _) = post(&server.addr, &[], &init);
    let session = session_id(&head);
    let h = [
        ("Mcp-Session-Id", session.as_str()),
        ("MCP-Protocol-Version", "2025-11-25"),
    ];
    post(
        &server.addr,
        &h,
        &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    );
    let (_, list) = post(
        &server.addr,
        &h,
        &json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}),
    );
    check_tool(&probe_of(&list["result"]));
    assert!(list["result"].get("resultType").is_none(), "{list}");
    let (_, probe) = post(
        &server.addr,
        &h,
        &json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                "params": {"name": "un__probe", "arguments": {}}}),
    );
    assert_eq!(
        probe["result"]["x-result"],
        json!({"kept": true}),
        "{probe}"
    );
    assert!(probe["result"].get("resultType").is_none(), "{probe}");
    assert_eq!(
        probe["result"]["_meta"]["io.ring0/receipt"]["state"],
        "ACKED"
    );
    let (_, widget) = post(
        &server.addr,
        &h,
        &json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call",
                "params": {"name": "un__widget", "arguments": {}}}),
    );
    check_widget(&widget["result"]);
}

#[test]
fn over_http_stateless_2026_unmodelled_fields_reach_the_client_with_result_type() {
    let dir = workspace();
    let server = serve_http(dir.path());
    let list = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/list",
                      "params": {"_meta": modern_meta()}});
    let (_, list) = post(
        &server.addr,
        &[
            ("MCP-Protocol-Version", "2026-07-28"),
            ("Mcp-Method", "tools/list"),
        ],
        &list,
    );
    check_tool(&probe_of(&list["result"]));
    assert_eq!(list["result"]["resultType"], "complete", "{list}");
    assert!(list["result"].get("ttlMs").is_some(), "{list}");
    for (id, tool) in [(8, "un__probe"), (9, "un__widget")] {
        let call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": tool, "arguments": {}, "_meta": modern_meta()}});
        let (_, r) = post(
            &server.addr,
            &[
                ("MCP-Protocol-Version", "2026-07-28"),
                ("Mcp-Method", "tools/call"),
                ("Mcp-Name", tool),
            ],
            &call,
        );
        assert_eq!(r["result"]["resultType"], "complete", "{r}");
        if tool == "un__probe" {
            assert_eq!(r["result"]["x-result"], json!({"kept": true}), "{r}");
        } else {
            check_widget(&r["result"]);
        }
    }
}

// ---- ring0 serve over stdio in the 2026-07-28 era ----

#[test]
fn over_stdio_in_the_2026_era_unmodelled_fields_reach_the_client() {
    let dir = workspace();
    let mut child = Command::new(env!("CARGO_BIN_EXE_ring0"))
        .arg("serve")
        .current_dir(dir.path())
        .env(
            "RING0_STATE_DIR",
            std::path::Path::new(dir.path()).join(".ring0"),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let (tx, rx) = channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Ok(v) = serde_json::from_str::<Value>(&line)
                && tx.send(v).is_err()
            {
                return;
            }
        }
    });
    let mut ask = |id: u64, method: &str, mut params: Value| -> Value {
        params["_meta"] = modern_meta();
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        stdin.write_all(format!("{msg}\n").as_bytes()).unwrap();
        stdin.flush().unwrap();
        loop {
            let m = rx.recv_timeout(WAIT).expect("an answer");
            if m.get("id") == Some(&json!(id)) && m.get("method").is_none() {
                return m;
            }
        }
    };
    let list = ask(1, "tools/list", json!({}));
    check_tool(&probe_of(&list["result"]));
    assert_eq!(list["result"]["resultType"], "complete", "{list}");
    let probe = ask(
        2,
        "tools/call",
        json!({"name": "un__probe", "arguments": {}}),
    );
    assert_eq!(
        probe["result"]["x-result"],
        json!({"kept": true}),
        "{probe}"
    );
    assert_eq!(probe["result"]["resultType"], "complete", "{probe}");
    let widget = ask(
        3,
        "tools/call",
        json!({"name": "un__widget", "arguments": {}}),
    );
    check_widget(&widget["result"]);
    let _ = child.kill();
    let _ = child.wait();
}

// ---- the Python SDK client ----

fn python() -> Option<PathBuf> {
    common::peers().map(|peers| common::python(&peers))
}

fn run_py(python: &Path, args: &[&str]) -> Value {
    python_report(
        Command::new(python)
            .arg(fixtures().join("py_client_lossless.py"))
            .args(args),
    )
}

#[test]
fn python_client_over_http_receives_unmodelled_fields_in_both_eras() {
    let Some(python) = python() else { return };
    for era in ["legacy", "2026-07-28"] {
        let dir = workspace();
        let server = serve_http(dir.path());
        let url = format!("http://{}/mcp", server.addr);
        let seen = run_py(&python, &["http", &url, era]);
        check_tool(&seen["tool"]);
        // The SDK's own typed model knows `execution`; rmcp's does not, yet it arrives.
        assert_eq!(
            seen["typed_execution"],
            json!({"taskSupport": "optional"}),
            "{era}: {seen}"
        );
        assert_eq!(
            seen["result"]["x-result"],
            json!({"kept": true}),
            "{era}: {seen}"
        );
        assert_eq!(seen["result"]["content"][0]["text"], "probed", "{seen}");
    }
}

#[test]
fn python_client_over_stdio_in_the_2026_era_receives_unmodelled_fields() {
    let Some(python) = python() else { return };
    let dir = workspace();
    let seen = run_py(
        &python,
        &[
            "stdio",
            env!("CARGO_BIN_EXE_ring0"),
            dir.path().to_str().unwrap(),
            "2026-07-28",
        ],
    );
    check_tool(&seen["tool"]);
    assert_eq!(seen["result"]["x-result"], json!({"kept": true}), "{seen}");
}
