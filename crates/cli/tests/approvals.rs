//! Approvals a person can give, through the official Python SDK client and the real `ring0`:
//! a client is asked only through a channel it declared (elicitation, in either era); a client
//! without one is never sent a question and the person completes the approval by reading the
//! confirmation code ring0 showed them to the model, which sends it back as an ordinary
//! argument; `ring0 approve` never offers a request whose process is gone.

mod common;

use common::*;
use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(60);

fn workspace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ring0.toml"), HELD_SHELL_CONFIG).unwrap();
    dir
}

/// `ring0 serve --http` in `dir`, its stderr copied to `dir/serve.log` (what the person at the
/// terminal reads).
fn serve(dir: &Path) -> (HttpServer, PathBuf) {
    let log = dir.join("serve.log");
    let mut cmd = Command::new(ring0());
    cmd.args(["serve", "--http", "127.0.0.1:0"])
        .current_dir(dir);
    (start_http_logged(cmd, &log), log)
}

/// The person: reads the confirmation code on ring0's stderr and says it (writes it where the
/// client waits for it).
fn person_reads_the_code(log: PathBuf, code_file: PathBuf) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        wait_for_file_text(&log, "confirmation code ", "ring0 shows the person a code");
        let text = std::fs::read_to_string(&log).unwrap();
        let code = text
            .lines()
            .filter(|l| l.contains("approval needed"))
            .find_map(|l| l.split("confirmation code ").nth(1))
            .and_then(|rest| rest.split([';', ' ']).next())
            .expect("a code")
            .to_string();
        std::fs::write(&code_file, &code).unwrap();
        code
    })
}

fn run_client(server: &HttpServer, peers: &Path, mode: &str, elicit: &str, dir: &Path) -> Value {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/py_client_approvals.py");
    python_report(
        Command::new(python(peers))
            .arg(&script)
            .arg(server.url())
            .arg(mode)
            .arg(elicit)
            .arg(dir.join("code.txt"))
            .arg(dir),
    )
}

fn person_completes_the_approval_through_the_fallback(mode: &str) {
    let Some(peers) = peers() else {
        return;
    };
    let dir = workspace();
    let (server, log) = serve(dir.path());
    let person = person_reads_the_code(log.clone(), dir.path().join("code.txt"));
    let seen = run_client(&server, &peers, mode, "no-elicit", dir.path());
    let code = person.join().unwrap();
    assert_eq!(seen["asked"].as_array().unwrap().len(), 0, "{seen}");
    assert_eq!(seen["first"]["is_error"], true, "{seen}");
    assert_eq!(seen["first"]["ran"], false, "{seen}");
    let refusal: Value = serde_json::from_str(seen["first"]["text"].as_str().unwrap()).unwrap();
    assert_eq!(refusal["status"], "approval_required", "{refusal}");
    assert!(
        refusal.to_string().contains("ring0_confirmation_code"),
        "the model is told how to send the code back: {refusal}"
    );
    assert!(
        !seen["first"]["text"].as_str().unwrap().contains(&code),
        "the model never sees the code: {seen}"
    );
    assert_eq!(seen["second"]["is_error"], false, "{seen}");
    assert_eq!(seen["second"]["ran"], true, "the approved call ran: {seen}");
}

#[test]
fn a_2026_07_28_client_without_elicitation_is_approved_by_the_code_a_person_read_to_it() {
    person_completes_the_approval_through_the_fallback("2026-07-28");
}

#[test]
fn a_2025_client_without_elicitation_is_approved_by_the_code_a_person_read_to_it() {
    person_completes_the_approval_through_the_fallback("legacy");
}

fn client_with_elicitation_gets_the_dialog(mode: &str) {
    let Some(peers) = peers() else {
        return;
    };
    let dir = workspace();
    let (server, _log) = serve(dir.path());
    let seen = run_client(&server, &peers, mode, "elicit", dir.path());
    let asked = seen["asked"].as_array().unwrap();
    assert_eq!(asked.len(), 1, "{seen}");
    assert_eq!(seen["first"]["is_error"], false, "{seen}");
    assert_eq!(seen["first"]["ran"], true, "{seen}");
    let message = asked[0]["message"].as_str().unwrap();
    // Rendered once: the arguments read as JSON, not as JSON escaped into a string again.
    assert!(
        message.contains(r#"{"argv":["touch","marker"]"#),
        "{message}"
    );
    assert!(!message.contains(r#"\""#), "{message}");
    assert!(message.lines().count() >= 3, "one fact per line: {message}");
}

#[test]
fn a_2025_client_with_elicitation_is_asked_in_a_dialog() {
    client_with_elicitation_gets_the_dialog("legacy");
}

#[test]
fn a_2026_07_28_client_with_elicitation_is_asked_in_a_dialog() {
    client_with_elicitation_gets_the_dialog("2026-07-28");
}

#[test]
fn the_request_of_a_killed_call_expires_and_cannot_be_approved() {
    let dir = workspace();
    let mut call = Command::new(ring0())
        .args(["call", "shell", r#"{"argv":["touch","marker"]}"#])
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let id = common::held_request_id(&mut call, WAIT);
    let listed = Command::new(ring0())
        .arg("approve")
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&listed.stdout).contains(&id));
    call.kill().unwrap();
    call.wait().unwrap();
    let listed = Command::new(ring0())
        .arg("approve")
        .current_dir(dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&listed.stdout);
    assert!(
        !text.contains(&id),
        "a dead call's request is not offered: {text}"
    );
    let approve = Command::new(ring0())
        .args(["approve", &id])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(!approve.status.success());
    let err = String::from_utf8_lossy(&approve.stderr);
    assert!(
        err.contains("no pending approval") || err.contains("expired"),
        "{err}"
    );
    assert!(!dir.path().join("marker").exists());
}

// ---- ring0 approve-tool ----

fn mediated_fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mediated_upstream.py")
}

/// A workspace whose configuration (at `conf/ring0.toml`, found only with `--config`) has the
/// fixture as upstream `fx`; its tools seen once (trusted on first use) and then changed
/// (`FIXTURE_STAGE=v2` adds a parameter to `send_mail`), so the change waits for approval.
fn quarantined_change() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let transport = format!(
        "command = \"python3\"\nargs = [{:?}]\nenv = [\"PATH\", \"FIXTURE_STAGE\"]\n",
        mediated_fixture().display().to_string()
    );
    let text = one_upstream_config("fixture", r#"["fx__*"]"#, "A3", "fx", &transport, "").replace(
        "state_dir = \".ring0\"",
        "root = \"..\"\nstate_dir = \"../.ring0\"",
    );
    std::fs::create_dir(dir.path().join("conf")).unwrap();
    let config = dir.path().join("conf/ring0.toml");
    std::fs::write(&config, text).unwrap();
    for stage in ["v1", "v2"] {
        let mut cmd = Command::new(ring0());
        cmd.arg("serve")
            .arg("--config")
            .arg(&config)
            .current_dir(dir.path())
            .env("FIXTURE_STAGE", stage)
            .stderr(Stdio::null());
        let (mut child, mut stdin, messages) = spawn_stdio_json(cmd);
        for line in [
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
        ] {
            writeln!(stdin, "{line}").unwrap();
        }
        loop {
            let m = messages.recv_timeout(WAIT).expect("ring0 answers");
            if m["id"] == 2 {
                break;
            }
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    (dir, config)
}

fn approve_tool(dir: &Path, config: &Path, stage: &str, args: &[&str]) -> std::process::Output {
    Command::new(ring0())
        .arg("approve-tool")
        .args(args)
        .arg("--config")
        .arg(config)
        .current_dir(dir)
        .env("FIXTURE_STAGE", stage)
        .output()
        .unwrap()
}

fn waiting_pin(listing: &str) -> String {
    listing
        .lines()
        .find(|l| l.starts_with("fx__send_mail\t"))
        .and_then(|l| l.split('\t').nth(1))
        .unwrap_or_else(|| panic!("fx__send_mail waits:\n{listing}"))
        .to_string()
}

#[test]
fn approve_tool_lists_a_readable_diff_of_the_changed_definition() {
    let (dir, config) = quarantined_change();
    let out = approve_tool(dir.path(), &config, "v2", &["--list"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listing = String::from_utf8_lossy(&out.stdout);
    let pin = waiting_pin(&listing);
    assert!(listing.contains(&format!("+++ waiting {pin}")), "{listing}");
    assert!(listing.contains("--- approved sha256:"), "{listing}");
    // The added parameter appears as added lines of the schema, its description readable.
    assert!(
        listing
            .lines()
            .any(|l| l.trim_start().starts_with("+") && l.contains("\"bcc\"")),
        "{listing}"
    );
    assert!(listing.contains("~/.ssh/id_rsa"), "{listing}");
    assert!(listing.contains(&format!("--pin {pin}")), "{listing}");
}

#[test]
fn approve_tool_approves_only_the_pin_it_is_given() {
    let (dir, config) = quarantined_change();
    let listing = approve_tool(dir.path(), &config, "v2", &["--list"]);
    let pin = waiting_pin(&String::from_utf8_lossy(&listing.stdout));
    let wrong = format!("sha256:{}", "0".repeat(64));
    let refused = approve_tool(
        dir.path(),
        &config,
        "v2",
        &["fx__send_mail", "--pin", &wrong],
    );
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains(&pin),
        "names the definition that waits: {}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let lock = std::fs::read_to_string(dir.path().join("ring0.lock")).unwrap();
    assert!(!lock.contains(&pin), "nothing was approved");
    let approved = approve_tool(dir.path(), &config, "v2", &["fx__send_mail", "--pin", &pin]);
    assert!(
        approved.status.success(),
        "{}",
        String::from_utf8_lossy(&approved.stderr)
    );
    let lock = std::fs::read_to_string(dir.path().join("ring0.lock")).unwrap();
    assert!(lock.contains(&pin), "{lock}");
}

#[test]
fn approve_tool_refuses_a_definition_the_server_no_longer_serves() {
    let (dir, config) = quarantined_change();
    let listing = approve_tool(dir.path(), &config, "v2", &["--list"]);
    let pin = waiting_pin(&String::from_utf8_lossy(&listing.stdout));
    // The server went back to the approved definition.
    let refused = approve_tool(dir.path(), &config, "v1", &["fx__send_mail"]);
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("no longer serves"), "{err}");
    let lock = std::fs::read_to_string(dir.path().join("ring0.lock")).unwrap();
    assert!(!lock.contains(&pin), "{lock}");
}

#[test]
fn a_client_without_elicitation_is_never_sent_an_upstreams_elicitation() {
    let dir = tempfile::tempdir().unwrap();
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../mcp/tests/fixtures/stdio_server.py");
    let transport = format!(
        "command = \"python3\"\nargs = [{:?}]\nenv = [\"PATH\"]\n",
        fixture.display().to_string()
    );
    let text = one_upstream_config("fixture", r#"["fx__*"]"#, "A3", "fx", &transport, "");
    std::fs::write(dir.path().join("ring0.toml"), text).unwrap();
    let mut cmd = Command::new(ring0());
    cmd.arg("serve")
        .current_dir(dir.path())
        .stderr(Stdio::null());
    let (mut child, mut stdin, messages) = spawn_stdio_json(cmd);
    for line in [
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"fx__ask","arguments":{}}}"#,
    ] {
        writeln!(stdin, "{line}").unwrap();
    }
    let answer = loop {
        let m = messages.recv_timeout(WAIT).expect("ring0 answers");
        assert_ne!(m["method"], "elicitation/create", "never asked: {m}");
        if m["id"] == 2 {
            break m;
        }
    };
    // The upstream was told the client cannot be asked, and said what it got.
    let text = answer["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or("");
    assert!(text.contains("did not declare elicitation"), "{answer}");
    let _ = child.kill();
    let _ = child.wait();
}
