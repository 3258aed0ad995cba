//! The `ring0` command line as a person uses it: `ring0 run` exits with its command's code (as
//! `timeout(1)` does), `--workspace` works on every subcommand when the client starts ring0
//! elsewhere, shell completions generate, and the client snippets of `docs/clients.md` parse.

mod common;

use common::*;
use serde_json::{Value, json};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);

fn ring0_in(dir: &Path, args: &[&str]) -> Output {
    ring0_command_in(dir).args(args).output().expect("ring0")
}

/// A workspace holding `hello.txt`, with its state directory inside `.ring0`.
fn workspace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("hello.txt"), "hello from the workspace\n").unwrap();
    dir
}

// ---- ring0 run: exit codes ----

#[test]
fn run_exits_with_the_commands_own_code() {
    let dir = workspace();
    let out = ring0_in(
        dir.path(),
        &["run", "--", "sh", "-c", "echo before; exit 7"],
    );
    assert_eq!(out.status.code(), Some(7), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("before"));
    let ok = ring0_in(dir.path(), &["run", "--", "true"]);
    assert_eq!(ok.status.code(), Some(0));
}

#[test]
fn run_past_its_timeout_exits_124() {
    let dir = workspace();
    let out = ring0_in(dir.path(), &["run", "--timeout", "1", "--", "sleep", "30"]);
    assert_eq!(out.status.code(), Some(124), "{}", text(&out.stderr));
}

#[test]
fn run_ended_by_a_signal_exits_128_plus_its_number() {
    let dir = workspace();
    let out = ring0_in(dir.path(), &["run", "--", "sh", "-c", "kill -TERM $$"]);
    assert_eq!(out.status.code(), Some(128 + 15), "{}", text(&out.stderr));
    let out = ring0_in(dir.path(), &["run", "--", "sh", "-c", "kill -KILL $$"]);
    assert_eq!(out.status.code(), Some(128 + 9), "{}", text(&out.stderr));
}

#[test]
fn run_of_a_missing_program_exits_127_and_says_so() {
    let dir = workspace();
    let out = ring0_in(dir.path(), &["run", "--", "no-such-program-ring0-test"]);
    assert_eq!(out.status.code(), Some(127));
    assert!(
        text(&out.stderr).contains("no-such-program-ring0-test"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn run_json_reports_the_same_exit_code() {
    let dir = workspace();
    let out = ring0_in(dir.path(), &["run", "--json", "--", "sh", "-c", "exit 3"]);
    assert_eq!(out.status.code(), Some(3));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["summary"]["exit"]["code"], 3, "{v}");
}

// ---- --workspace ----

#[test]
fn run_with_workspace_runs_in_that_directory() {
    let dir = workspace();
    let out = ring0_in(
        Path::new("/"),
        &[
            "--workspace",
            dir.path().to_str().unwrap(),
            "run",
            "--",
            "cat",
            "hello.txt",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("hello from the workspace"));
}

#[test]
fn call_with_workspace_reads_that_workspace_when_started_elsewhere() {
    let dir = workspace();
    let state = tempfile::tempdir().unwrap();
    let out = ring0_in(
        Path::new("/"),
        &[
            "call",
            "--workspace",
            dir.path().to_str().unwrap(),
            "--state-dir",
            state.path().to_str().unwrap(),
            "read_file",
            r#"{"path":"hello.txt"}"#,
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("hello from the workspace"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn a_missing_workspace_is_a_usage_error() {
    let out = ring0_in(
        Path::new("/"),
        &["--workspace", "/no/such/dir/ring0", "config", "check"],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--workspace /no/such/dir/ring0"));
}

/// `ring0 serve` over stdio started in `/`, as desktop clients do, with `--workspace`: it serves
/// that workspace's files.
#[test]
fn serve_with_workspace_serves_that_workspace_when_started_in_root() {
    let dir = workspace();
    let state = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(ring0());
    cmd.args(["serve", "--workspace"])
        .arg(dir.path())
        .arg("--state-dir")
        .arg(state.path())
        .current_dir("/")
        .env("HOME", test_home())
        .stderr(Stdio::piped());
    let mut client = StdioClient::initialized(cmd, "2025-06-18");
    let r = client.request(
        "tools/call",
        json!({"name": "read_file", "arguments": {"path": "hello.txt"}}),
    );
    assert!(
        r.to_string().contains("hello from the workspace"),
        "read through the workspace given: {r}"
    );
    let _ = client.child.kill();
    let out = client.child.wait_with_output().unwrap();
    let stderr = text(&out.stderr);
    let shown = std::fs::canonicalize(dir.path()).unwrap();
    assert!(
        stderr.contains(&format!("workspace: {}", shown.display())),
        "{stderr}"
    );
}

// ---- log level ----

#[test]
fn log_level_warn_keeps_only_what_needs_attention() {
    let dir = workspace();
    std::fs::write(
        dir.path().join("ring0.toml"),
        "[[grants]]\nname = \"typo\"\ntools = [\"raed_file\"]\nceiling = \"A0\"\n",
    )
    .unwrap();
    let state = tempfile::tempdir().unwrap();
    let serve = |level: &[&str]| {
        let mut args = vec!["serve", "--state-dir", state.path().to_str().unwrap()];
        args.extend_from_slice(level);
        text(&ring0_in(dir.path(), &args).stderr)
    };
    let quiet = serve(&["--log-level", "warn"]);
    assert!(!quiet.contains("serving MCP on"), "{quiet}");
    assert!(quiet.contains("grant \"typo\" matches no tool"), "{quiet}");
    let normal = serve(&[]);
    assert!(normal.contains("serving MCP on stdio"), "{normal}");
    assert!(!normal.contains("tool read_file A0"), "{normal}");
    let verbose = serve(&["-v"]);
    assert!(
        verbose.contains("tool read_file A0 Nullipotent, grant workspace"),
        "{verbose}"
    );
}

// ---- completions ----

#[test]
fn completions_generate_for_bash_zsh_and_fish() {
    let dir = workspace();
    for shell in ["bash", "zsh", "fish"] {
        let out = ring0_in(dir.path(), &["completions", shell]);
        assert!(out.status.success(), "{shell}: {}", text(&out.stderr));
        let script = text(&out.stdout);
        // Fish names long flags without their dashes (`-l workspace`).
        for word in [
            "serve",
            "approve-tool",
            "workspace",
            "log-level",
            "completions",
        ] {
            assert!(script.contains(word), "{shell} completes {word}");
        }
    }
    let bash = text(&ring0_in(dir.path(), &["completions", "bash"]).stdout);
    // The script bash sources defines the completion function and binds it to ring0.
    assert!(bash.contains("complete -F _ring0"), "{bash}");
}

#[test]
fn completions_for_an_unknown_shell_are_a_usage_error() {
    let out = ring0_in(Path::new("/"), &["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2));
}

// ---- docs/clients.md ----

fn clients_doc() -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/clients.md");
    std::fs::read_to_string(path).unwrap()
}

#[test]
fn every_client_snippet_parses_and_starts_ring0_with_a_workspace() {
    let doc = clients_doc();
    let json_blocks = fenced(&doc, "json");
    let toml_blocks = fenced(&doc, "toml");
    assert!(
        json_blocks.len() >= 4,
        "Claude Desktop, Claude Code, Cursor, VS Code"
    );
    assert!(!toml_blocks.is_empty(), "Codex CLI");
    for block in &json_blocks {
        let v: Value = serde_json::from_str(block).unwrap_or_else(|e| panic!("{e}:\n{block}"));
        let servers = v
            .get("mcpServers")
            .or_else(|| v.get("servers"))
            .and_then(Value::as_object)
            .unwrap_or_else(|| panic!("a server table:\n{block}"));
        for (name, server) in servers {
            let command = server["command"].as_str().unwrap_or_default();
            assert!(
                command == "ring0" || command.ends_with("/ring0"),
                "{name}: {command}"
            );
            let args: Vec<&str> = server["args"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(Value::as_str)
                .collect();
            assert!(
                args.contains(&"serve") && args.contains(&"--workspace"),
                "{name}: {args:?}"
            );
        }
    }
    for block in &toml_blocks {
        let v: toml::Table = toml::from_str(block).unwrap_or_else(|e| panic!("{e}:\n{block}"));
        let server = &v["mcp_servers"]["ring0"];
        let command = server["command"].as_str().unwrap_or_default();
        assert!(command == "ring0" || command.ends_with("/ring0"), "{block}");
    }
}

// ---- background jobs end with their HTTP session ----

/// Whether a `sleep SECS` process is running, found by its command line in /proc.
fn alive(secs: &str) -> bool {
    let wanted = format!("sleep\0{secs}\0");
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| std::fs::read(e.path().join("cmdline")).is_ok_and(|c| c == wanted.as_bytes()))
}

/// The pid a job wrote to `file` in `dir`, once it has.
fn pid_in(dir: &Path, file: &str) -> String {
    let path = dir.join(file);
    wait_for_file_text(&path, "\n", &format!("the job writes {file}"));
    std::fs::read_to_string(path).unwrap().trim().to_string()
}

#[test]
fn a_background_job_ends_with_its_http_session_unless_detached() {
    let dir = workspace();
    std::fs::write(
        dir.path().join("ring0.toml"),
        "[[grants]]\nname = \"jobs\"\ntools = [\"shell\"]\nceiling = \"A2\"\n\
         rules = [\"args.argv[0] == 'sh'\"]\nunattended = true\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("run.sh"),
        "echo started > \"$1.tmp\"; mv \"$1.tmp\" \"$1\"; exec sleep \"$2\"\n",
    )
    .unwrap();
    let server = start_http(serve_http_command(dir.path()));
    let (head, init) = post(&server.addr, &[], &initialize_request(1, "2025-06-18"));
    assert!(init.get("result").is_some(), "{init}");
    let session = session_id(&head);
    let headers = [
        ("Mcp-Session-Id", session.as_str()),
        ("MCP-Protocol-Version", "2025-06-18"),
    ];
    post(
        &server.addr,
        &headers,
        &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    );
    // Each job's `sleep` is told apart by its duration: inside the sandbox's PID namespace the
    // pids a job sees are not the host's, so the test finds its processes in /proc by command.
    for (id, file, detached) in [(2, "bound.pid", false), (3, "detached.pid", true)] {
        let secs = if detached { "3002" } else { "3001" };
        let (_, r) = post(
            &server.addr,
            &headers,
            &json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                    "params": {"name": "shell", "arguments": {
                        "argv": ["sh", "run.sh", file, secs], "background": true, "detached": detached}}}),
        );
        assert!(r.to_string().contains("\"job\""), "a job started: {r}");
    }
    pid_in(dir.path(), "bound.pid");
    pid_in(dir.path(), "detached.pid");
    let (bound, detached) = ("3001", "3002");
    // The file is written just before the script `exec`s its `sleep`: wait for both to run.
    let deadline = std::time::Instant::now() + WAIT;
    while !(alive(bound) && alive(detached)) {
        assert!(
            std::time::Instant::now() < deadline,
            "both jobs run their sleep"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    let mut s = std::net::TcpStream::connect(&server.addr).unwrap();
    write!(
        s,
        "DELETE /mcp HTTP/1.1\r\nHost: {}\r\nMcp-Session-Id: {session}\r\nMCP-Protocol-Version: 2025-06-18\r\nConnection: close\r\n\r\n",
        server.addr
    )
    .unwrap();
    let mut answer = String::new();
    let _ = std::io::Read::read_to_string(&mut s, &mut answer);
    assert!(answer.starts_with("HTTP/1.1 2"), "{answer}");

    let deadline = std::time::Instant::now() + WAIT;
    while alive(bound) {
        assert!(
            std::time::Instant::now() < deadline,
            "the session's job ended with it"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let detached_lives = alive(detached);
    let _ = Command::new("pkill")
        .args(["-9", "-x", "-f", "sleep 3002"])
        .status();
    assert!(detached_lives, "a detached job outlives its session");
}
