//! `ring0 call`, `ring0 turn`, `ring0 approve` and `ring0 deny`, run as a person would: the built
//! binary in a temporary workspace.

use serde_json::{Value, json};
use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn ring0(dir: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ring0"));
    cmd.current_dir(dir)
        .env("RING0_STATE_DIR", std::path::Path::new(dir).join(".ring0"));
    cmd
}

fn run(dir: &Path, args: &[&str]) -> Output {
    ring0(dir).args(args).output().unwrap()
}

fn stdout_json(out: &Output) -> Value {
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn workspace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), "alpha\nbeta\n").unwrap();
    dir
}

#[test]
fn call_reads_a_file_under_the_embedded_defaults() {
    let dir = workspace();
    let out = run(
        dir.path(),
        &["call", "read_file", r#"{"path":"notes.txt"}"#],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let result = stdout_json(&out);
    assert_eq!(result["outcome"]["observation"]["text"], "alpha\nbeta\n");
    let audit = std::fs::read_to_string(dir.path().join(".ring0/audit.jsonl")).unwrap();
    assert!(audit.contains("\"rule\":\"grant:workspace\""), "{audit}");
    assert!(dir.path().join(".ring0/journal.db").exists());
}

#[test]
fn call_that_fails_prints_the_result_and_exits_1() {
    let dir = workspace();
    let out = run(
        dir.path(),
        &["call", "read_file", r#"{"path":"../../etc/passwd"}"#],
    );
    assert_eq!(out.status.code(), Some(1));
    let result = stdout_json(&out);
    assert!(
        result["outcome"]["message"]
            .as_str()
            .unwrap()
            .contains("escapes"),
        "{result}"
    );
}

#[test]
fn write_then_read_back_through_two_calls() {
    let dir = workspace();
    let out = run(
        dir.path(),
        &[
            "call",
            "write_file",
            r#"{"path":"out/new.txt","content":"hi","create_dirs":true}"#,
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("out/new.txt")).unwrap(),
        "hi"
    );
}

#[test]
fn tools_no_grant_names_are_unknown() {
    let dir = workspace();
    std::fs::write(
        dir.path().join("ring0.toml"),
        "defaults = false\n[[grants]]\nname = \"read\"\ntools = [\"read_file\"]\nceiling = \"A0\"\n",
    )
    .unwrap();
    let out = run(
        dir.path(),
        &["call", "write_file", r#"{"path":"x","content":"y"}"#],
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stdout_json(&out)["status"], "unknown_tool");
    assert!(!dir.path().join("x").exists());
}

#[test]
fn cel_rule_from_the_config_file_denies() {
    let dir = workspace();
    std::fs::write(
        dir.path().join("ring0.toml"),
        "defaults = false\n[[grants]]\nname = \"read\"\ntools = [\"read_file\"]\nceiling = \"A0\"\nrules = [\"args.path.endsWith('.md')\"]\n",
    )
    .unwrap();
    let out = run(
        dir.path(),
        &["call", "read_file", r#"{"path":"notes.txt"}"#],
    );
    let result = stdout_json(&out);
    assert_eq!(result["status"], "policy_denied", "{result}");
    assert!(result["message"].as_str().unwrap().contains("rule:read[0]"));
}

#[test]
fn invalid_config_is_refused_with_the_key_and_why() {
    let dir = workspace();
    std::fs::write(
        dir.path().join("ring0.toml"),
        "defaults = false\n[[grants]]\nname = \"g\"\ntools = [\"*\"]\nceiling = \"A1\"\nrate = \"ten per second\"\n",
    )
    .unwrap();
    let out = run(
        dir.path(),
        &["call", "read_file", r#"{"path":"notes.txt"}"#],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("grants[0].rate") && err.contains("N/s"),
        "{err}"
    );

    std::fs::write(
        dir.path().join("ring0.toml"),
        "[limits]\nmax_concurent_tools = 4\n",
    )
    .unwrap();
    let err = stderr(&run(
        dir.path(),
        &["call", "read_file", r#"{"path":"notes.txt"}"#],
    ));
    assert!(
        err.contains("limits.max_concurent_tools") && err.contains("unknown field"),
        "{err}"
    );
}

/// Starts `ring0 call` of a held tool, waits (bounded) for its request to be listed by
/// `ring0 approve`, and returns the child and the approval id.
// The child is returned to the caller, which waits on it (or it is killed and reaped here).
#[allow(clippy::zombie_processes)]
fn start_held_call(dir: &Path, args: &[&str]) -> (std::process::Child, String) {
    let mut child = ring0(dir)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let listed = run(dir, &["approve"]);
        let text = String::from_utf8_lossy(&listed.stdout).into_owned();
        if let Some(id) = text.split_whitespace().find(|w| w.starts_with("ap_")) {
            return (child, id.to_string());
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("no pending approval appeared");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Commands outside the OS sandbox, each held for a person (the sandbox runs `shell` without
/// approval on the embedded defaults).
fn held_shell_workspace() -> tempfile::TempDir {
    let dir = workspace();
    std::fs::write(
        dir.path().join("ring0.toml"),
        "[sandbox]\ndefault = \"off\"\n[[grants]]\nname = \"shell\"\ntools = [\"shell\"]\n\
         ceiling = \"A2\"\napproval = true\n",
    )
    .unwrap();
    dir
}

#[test]
fn shell_is_held_until_approved_from_another_terminal() {
    let dir = held_shell_workspace();
    let (child, id) = start_held_call(
        dir.path(),
        &["call", "shell", r#"{"argv":["echo","approved-run"]}"#],
    );
    let approved = run(dir.path(), &["approve", &id]);
    assert!(approved.status.success(), "{}", stderr(&approved));
    assert!(String::from_utf8_lossy(&approved.stdout).contains("approved"));
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("approval required"),
        "the person was told"
    );
    let result = stdout_json(&out);
    assert!(
        result["outcome"]["observation"]["text"]
            .as_str()
            .unwrap()
            .contains("approved-run"),
        "{result}"
    );
    let audit = std::fs::read_to_string(dir.path().join(".ring0/audit.jsonl")).unwrap();
    assert!(
        audit.contains("\"decision\":\"held\"") && audit.contains("\"decision\":\"approved\""),
        "{audit}"
    );
}

#[test]
fn denied_call_is_a_structured_rejection() {
    let dir = held_shell_workspace();
    let (child, id) = start_held_call(
        dir.path(),
        &["call", "shell", r#"{"argv":["touch","ran"]}"#],
    );
    let denied = run(dir.path(), &["deny", &id, "--reason", "not now"]);
    assert!(denied.status.success(), "{}", stderr(&denied));
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let result = stdout_json(&out);
    assert_eq!(result["status"], "approval_denied", "{result}");
    assert!(result["message"].as_str().unwrap().contains("not now"));
    assert!(!dir.path().join("ran").exists());
}

#[test]
fn unanswered_call_times_out() {
    let dir = workspace();
    std::fs::write(
        dir.path().join("ring0.toml"),
        "defaults = false\n[[grants]]\nname = \"sh\"\ntools = [\"shell\"]\nceiling = \"A2\"\napproval = true\n[approval]\ntimeout_secs = 1\n",
    )
    .unwrap();
    let out = run(
        dir.path(),
        &["call", "shell", r#"{"argv":["touch","ran"]}"#],
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stdout_json(&out)["status"], "approval_timeout");
    assert!(!dir.path().join("ran").exists());
    let listed = run(dir.path(), &["approve"]);
    assert!(String::from_utf8_lossy(&listed.stdout).contains("no pending approvals"));
}

#[test]
fn approve_refuses_ids_that_are_not_pending_or_malformed() {
    let dir = workspace();
    let out = run(dir.path(), &["approve", "ap_0123456789abcdef"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("no pending approval"));
    let out = run(dir.path(), &["approve", "../../etc/passwd"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("not valid"));
}

fn turn(dir: &Path, format: &str, message: Value) -> Output {
    let mut child = ring0(dir)
        .args(["turn", "--format", format])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let written = child
        .stdin
        .take()
        .unwrap()
        .write_all(message.to_string().as_bytes());
    // A ring0 that refuses its arguments exits before reading its input: a closed pipe then.
    if let Err(e) = written {
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "{e}");
    }
    child.wait_with_output().unwrap()
}

#[test]
fn turn_answers_an_openai_message_with_tool_messages_in_order() {
    let dir = workspace();
    let message = json!({"role": "assistant", "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"notes.txt\"}"}},
        {"id": "call_b", "type": "function", "function": {"name": "list_dir", "arguments": "{}"}}
    ]});
    let out = turn(dir.path(), "openai", message);
    assert!(out.status.success(), "{}", stderr(&out));
    let messages = stdout_json(&out);
    let messages = messages.as_array().unwrap();
    assert_eq!(messages.len(), 2);
    assert_eq!(messages[0]["role"], "tool");
    assert_eq!(messages[0]["tool_call_id"], "call_a");
    assert!(messages[0]["content"].as_str().unwrap().contains("alpha"));
    assert_eq!(messages[1]["tool_call_id"], "call_b");
    assert!(
        messages[1]["content"]
            .as_str()
            .unwrap()
            .contains("notes.txt")
    );
}

#[test]
fn turn_answers_anthropic_and_responses_in_their_formats() {
    let dir = workspace();
    let anthropic = json!({"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_1", "name": "search", "input": {"pattern": "beta"}}
    ]});
    let out = turn(dir.path(), "anthropic", anthropic);
    assert!(out.status.success(), "{}", stderr(&out));
    let message = stdout_json(&out);
    assert_eq!(message["role"], "user");
    assert_eq!(message["content"][0]["type"], "tool_result");
    assert_eq!(message["content"][0]["tool_use_id"], "toolu_1");
    assert!(message.to_string().contains("beta"));

    let responses = json!({"output": [
        {"type": "function_call", "call_id": "fc_1", "name": "glob", "arguments": "{\"pattern\":\"*.txt\"}"}
    ]});
    let out = turn(dir.path(), "responses", responses);
    assert!(out.status.success(), "{}", stderr(&out));
    let items = stdout_json(&out);
    assert_eq!(items[0]["type"], "function_call_output");
    assert_eq!(items[0]["call_id"], "fc_1");
    assert!(items[0]["output"].as_str().unwrap().contains("notes.txt"));
}

#[test]
fn turn_refuses_an_unknown_format() {
    let dir = workspace();
    let out = turn(dir.path(), "gemini", json!({}));
    assert!(!out.status.success());
    assert!(stderr(&out).contains("openai, responses or anthropic"));
}

#[test]
fn the_same_turn_fed_again_after_its_results_were_printed_runs_again() {
    let dir = workspace();
    let message = json!({"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_w", "name": "write_file", "input": {"path": "once.txt", "content": "1", "overwrite": true}}
    ]});
    let first = turn(dir.path(), "anthropic", message.clone());
    assert!(first.status.success(), "{}", stderr(&first));
    assert_eq!(stdout_json(&first)["content"][0]["is_error"], false);
    std::fs::write(dir.path().join("once.txt"), "changed by a person").unwrap();
    // The first run's results were printed, so they were delivered: this is a genuine repeat.
    let second = turn(dir.path(), "anthropic", message);
    let result = stdout_json(&second);
    assert_eq!(result["content"][0]["is_error"], false, "{result}");
    assert!(!result.to_string().contains("replayed"), "{result}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("once.txt")).unwrap(),
        "1",
        "the write ran again"
    );
}
