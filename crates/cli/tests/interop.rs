//! Interoperability with real MCP peers: the Python SDK client (stdio, and Streamable HTTP in both
//! protocol eras), the reference servers as upstreams, the Inspector CLI, and the official
//! conformance suite run against the reference fixture directly and through ring0.
//!
//! The peers are installed by `scripts/install-mcp-peers.sh` (into `target/mcp-peers`, or
//! `$MCP_PEERS_DIR`). Without them a test prints why it is skipped — unless `CI` is set, where a
//! missing peer is a failure.

mod common;

use common::{
    HttpServer, peers, python, python_report, ring0, rmcp_fixture, serve_http_command, start_http,
    test_home,
};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn node(peers: &Path) -> PathBuf {
    peers.join("node/node_modules/.bin/node")
}

fn py_fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../mcp/tests/fixtures/stdio_server.py")
}

/// The end-to-end workspace: built-in tools, the reference fixture as `up` (reads, one A3 tool),
/// the crashing Python fixture as `fx`.
fn e2e_workspace(dir: &Path, fixture: &Path) {
    let config = format!(
        r#"defaults = false
[workspace]
state_dir = ".ring0"

[[grants]]
name = "workspace"
tools = ["read_file", "list_dir", "write_file"]
ceiling = "A1"

[[grants]]
name = "upstreams"
tools = ["up__*", "fx__*"]
ceiling = "A3"

[[upstreams]]
alias = "up"
command = {fixture:?}
[upstreams.tools."*"]
effect = "nullipotent"
authority = "A0"
strategy = ["exploration"]
[upstreams.tools.json_schema_2020_12_tool]
effect = "non_idempotent"
authority = "A3"

[[upstreams]]
alias = "fx"
command = "python3"
args = [{py:?}]
env = ["PATH"]
[upstreams.tools."*"]
effect = "nullipotent"
authority = "A0"
strategy = ["exploration"]
"#,
        fixture = fixture.display().to_string(),
        py = py_fixture().display().to_string(),
    );
    std::fs::write(dir.join("ring0.toml"), config).unwrap();
}

fn run_py(peers: &Path, args: &[&str]) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/py_client_e2e.py");
    python_report(Command::new(python(peers)).arg(&script).args(args))
}

fn check_e2e(seen: &Value, dir: &Path) {
    let tools: Vec<&str> = seen["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for t in ["write_file", "up__echo", "up__json_schema_2020_12_tool"] {
        assert!(tools.contains(&t), "{t} listed: {tools:?}");
    }
    assert!(!tools.contains(&"shell"), "no grant names shell");
    assert_eq!(seen["write"]["is_error"], false, "{seen}");
    assert_eq!(
        std::fs::read_to_string(dir.join("note.txt")).unwrap(),
        "written through ring0\n"
    );
    assert_eq!(seen["read"]["text"], "read through ring0");
    assert_eq!(seen["approved"]["is_error"], false, "{seen}");
    assert_eq!(seen["approved"]["text"], "ok");
    assert_eq!(seen["denied"]["is_error"], true, "{seen}");
    assert!(
        seen["denied"]["text"]
            .as_str()
            .unwrap()
            .contains("approval"),
        "{seen}"
    );
    assert_eq!(
        seen["asked"].as_array().unwrap().len(),
        2,
        "asked twice: {seen}"
    );
}

fn journal_ls(dir: &Path) -> String {
    let out = Command::new(ring0())
        .args(["journal", "ls"])
        .current_dir(dir)
        .env("RING0_STATE_DIR", std::path::Path::new(dir).join(".ring0"))
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn python_client_over_stdio_writes_reads_and_is_asked_for_an_a3_call() {
    let (Some(peers), Some(fixture)) = (peers(), rmcp_fixture()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    e2e_workspace(dir.path(), &fixture);
    let seen = run_py(
        &peers,
        &[
            "stdio",
            ring0().to_str().unwrap(),
            dir.path().to_str().unwrap(),
        ],
    );
    check_e2e(&seen, dir.path());
    // Killing and restarting an upstream mid-session recovers.
    assert_eq!(seen["crash"]["is_error"], true, "{seen}");
    assert_eq!(seen["recovered"], "back", "{seen}");
    // The journal shows the committed intents: the write and the approved A3 call.
    let journal = journal_ls(dir.path());
    assert!(journal.contains("write_file"), "{journal}");
    assert!(
        journal.contains("up__json_schema_2020_12_tool"),
        "{journal}"
    );
}

fn ring0_http(dir: &Path) -> HttpServer {
    start_http(serve_http_command(dir))
}

#[test]
fn python_client_over_http_in_both_protocol_eras() {
    let (Some(peers), Some(fixture)) = (peers(), rmcp_fixture()) else {
        return;
    };
    for era in ["legacy", "2026-07-28"] {
        let dir = tempfile::tempdir().unwrap();
        e2e_workspace(dir.path(), &fixture);
        let server = ring0_http(dir.path());
        let seen = run_py(&peers, &["http", &server.url(), era]);
        check_e2e(&seen, dir.path());
    }
}

#[test]
fn reference_servers_serve_through_ring0_to_the_inspector_cli() {
    let Some(peers) = peers() else { return };
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    std::fs::write(root.join("hello.txt"), "hello from the filesystem server\n").unwrap();
    let modules = peers.join("node/node_modules/@modelcontextprotocol");
    let config = format!(
        r#"defaults = false
[[grants]]
name = "reference"
tools = ["everything__*", "files__*"]
ceiling = "A3"

[[upstreams]]
alias = "everything"
command = {node:?}
args = [{everything:?}, "stdio"]
env = ["PATH", "HOME"]
[upstreams.tools."*"]
effect = "nullipotent"
authority = "A0"
strategy = ["exploration"]

[[upstreams]]
alias = "files"
command = {node:?}
args = [{files:?}, {root:?}]
env = ["PATH", "HOME"]
[upstreams.tools."*"]
effect = "nullipotent"
authority = "A0"
strategy = ["exploration"]
"#,
        node = node(&peers).display().to_string(),
        everything = modules
            .join("server-everything/dist/index.js")
            .display()
            .to_string(),
        files = modules
            .join("server-filesystem/dist/index.js")
            .display()
            .to_string(),
        root = root.display().to_string(),
    );
    std::fs::write(root.join("ring0.toml"), config).unwrap();
    let inspector = modules.join("inspector/clients/launcher/build/index.js");
    let inspect = |args: &[&str]| -> Value {
        let out = Command::new(node(&peers))
            .arg(&inspector)
            .arg("--cli")
            .arg("--cwd")
            .arg(&root)
            .arg(ring0())
            .arg("serve")
            .args(args)
            .env("HOME", test_home())
            .env(
                "PATH",
                format!(
                    "{}:/usr/bin:/bin",
                    peers.join("node/node_modules/.bin").display()
                ),
            )
            .output()
            .expect("inspector");
        assert!(
            out.status.success(),
            "inspector {args:?}:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("inspector prints JSON")
    };
    let list = inspect(&["--method", "tools/list"]);
    let names: BTreeSet<&str> = list["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(names.contains("everything__echo"), "{names:?}");
    assert!(names.contains("files__read_text_file"), "{names:?}");
    let echo = inspect(&[
        "--method",
        "tools/call",
        "--tool-name",
        "everything__echo",
        "--tool-arg",
        "message=through ring0",
    ]);
    assert!(
        echo["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("through ring0"),
        "{echo}"
    );
    let path = format!("path={}", root.join("hello.txt").display());
    let read = inspect(&[
        "--method",
        "tools/call",
        "--tool-name",
        "files__read_text_file",
        "--tool-arg",
        &path,
    ]);
    assert_eq!(
        read["content"][0]["text"], "hello from the filesystem server\n",
        "{read}"
    );
}

/// Runs the conformance suite's server scenarios against `url`; returns the failing scenarios.
fn conformance(peers: &Path, url: &str, cwd: &Path) -> BTreeSet<String> {
    let baseline =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../mcp/tests/conformance-baseline.yml");
    let out = Command::new(node(peers))
        .arg(peers.join("node/node_modules/.bin/conformance"))
        .args([
            "server",
            "--suite",
            "all",
            "--url",
            url,
            "--expected-failures",
        ])
        .arg(&baseline)
        .current_dir(cwd)
        .env("RING0_STATE_DIR", std::path::Path::new(cwd).join(".ring0"))
        .output()
        .expect("conformance");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let summary = text.split("=== SUMMARY ===").nth(1).unwrap_or("");
    assert!(
        summary.contains("Total:"),
        "no summary:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "a scenario outside the baseline failed against {url}:\n{summary}"
    );
    // The totals, for whoever runs the suite with --nocapture.
    for line in summary.lines().filter(|l| l.contains("Total:")) {
        eprintln!("conformance against {url}: {}", line.trim());
    }
    summary
        .lines()
        .filter_map(|l| l.trim().strip_prefix("✗ "))
        .map(|l| l.split(':').next().unwrap_or("").to_string())
        .collect()
}

#[test]
fn conformance_scenarios_that_pass_directly_pass_through_ring0() {
    let (Some(peers), Some(fixture)) = (peers(), rmcp_fixture()) else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(&fixture);
    cmd.args(["--http", "127.0.0.1:0"]);
    let direct_server = start_http(cmd);
    let direct = conformance(
        &peers,
        &direct_server.url().replace("127.0.0.1", "localhost"),
        work.path(),
    );
    drop(direct_server);

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("ring0.toml"),
        format!(
            "defaults = false\n[[grants]]\nname = \"conformance\"\ntools = [\"*\"]\nceiling = \"A3\"\n\n[[upstreams]]\nalias = \"conformance\"\ncommand = {:?}\nnamespace = false\n[upstreams.tools.\"*\"]\neffect = \"nullipotent\"\nauthority = \"A0\"\nstrategy = [\"exploration\"]\n",
            fixture.display().to_string()
        ),
    )
    .unwrap();
    let through = ring0_http(dir.path());
    let via_ring0 = conformance(
        &peers,
        &through.url().replace("127.0.0.1", "localhost"),
        work.path(),
    );
    let new_failures: Vec<&String> = via_ring0.difference(&direct).collect();
    assert!(
        new_failures.is_empty(),
        "scenarios passing directly fail through ring0: {new_failures:?}"
    );
}
