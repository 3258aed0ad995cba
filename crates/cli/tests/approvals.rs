//! Approvals a person can give, through the official Python SDK client and the real `ring0`:
//! a client is asked only through a channel it declared (elicitation, in either era); a client
//! without one is never sent a question and the person completes the approval by reading the
//! confirmation code ring0 showed them to the model, which sends it back as an ordinary
//! argument; `ring0 approve` never offers a request whose process is gone.

mod common;

use common::*;
use serde_json::Value;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(60);

const CONFIG: &str = r#"
[workspace]
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

fn workspace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ring0.toml"), CONFIG).unwrap();
    dir
}

/// `ring0 serve --http` in `dir`, its stderr copied to `dir/serve.log` (what the person at the
/// terminal reads).
fn serve(dir: &Path) -> (HttpServer, PathBuf) {
    let log = dir.join("serve.log");
    let mut child = Command::new(ring0())
        .args(["serve", "--http", "127.0.0.1:0"])
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let path = log.clone();
    std::thread::spawn(move || {
        let mut file = std::fs::File::create(&path).unwrap();
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = writeln!(file, "{line}");
            let _ = file.flush();
            if let Some(rest) = line.split("listening on http://").nth(1) {
                let _ = tx.send(rest.trim_end_matches("/mcp").to_string());
            }
        }
    });
    let addr = rx.recv_timeout(WAIT).expect("the bound address is printed");
    (HttpServer { child, addr }, log)
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
    let stderr = call.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if let Some(rest) = line.split("approval required [").nth(1) {
                let _ = tx.send(rest.trim_end_matches(']').to_string());
            }
        }
    });
    let id = rx
        .recv_timeout(WAIT)
        .expect("the call is held for approval");
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
