//! A person settles what the journal could not: `ring0 journal resolve ID --applied |
//! --not-applied` and `ring0 journal compensate ID`, against a running `ring0 serve` (through
//! its control channel) and against a stopped one (on the journal itself), with the Python SDK
//! client making the calls.
//!
//! The upstream is tests/fixtures/effect_upstream.py: `fx__append` appends a line to
//! `effects.log` (with `lose_answer` it acts and then fails, so ring0 cannot know it acted and
//! the call ends DEAD_LETTER), and its declared compensation `fx__retract` appends the line to
//! `retractions.log`. Effects are counted in those files.

mod common;

use common::*;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// A workspace granting `fx__append`, `fx__append_lane` and `fx__retract` (A2, settled by
/// idempotency key), with `fx__retract` declared as `fx__append`'s compensation.
fn workspace(peers: &Path) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[workspace]\nstate_dir = \".ring0\"\n\n\
         [[grants]]\nname = \"effects\"\n\
         tools = [\"fx__append\", \"fx__append_lane\", \"fx__retract\"]\nceiling = \"A2\"\n\n\
         [[upstreams]]\nalias = \"fx\"\ncommand = {:?}\nargs = [{:?}, \"--dir\", {:?}]\n\n\
         [upstreams.tools.append]\neffect = \"non_idempotent\"\nauthority = \"A2\"\n\
         strategy = [\"exploitation\"]\nsettlement = \"idempotency_key\"\n\
         compensation = \"retract\"\n\n\
         [upstreams.tools.append_lane]\neffect = \"non_idempotent\"\nauthority = \"A2\"\n\
         strategy = [\"exploitation\"]\nsettlement = \"idempotency_key\"\n\n\
         [upstreams.tools.retract]\neffect = \"non_idempotent\"\nauthority = \"A2\"\n\
         strategy = [\"exploitation\"]\nsettlement = \"idempotency_key\"\n",
        python(peers).display().to_string(),
        fixtures().join("effect_upstream.py").display().to_string(),
        dir.path().display().to_string(),
    );
    std::fs::write(dir.path().join("ring0.toml"), config).unwrap();
    dir
}

fn serve(dir: &Path) -> HttpServer {
    let mut cmd = serve_http_command(dir);
    cmd.stdin(Stdio::null()).stdout(Stdio::null());
    start_http(cmd)
}

/// One keyed call through the Python SDK client.
fn call(peers: &Path, server: &HttpServer, tool: &str, arguments: Value, key: &str) -> Value {
    let out = python_report(
        Command::new(python(peers))
            .arg(fixtures().join("py_client_settle.py"))
            .args([&server.url(), tool, &arguments.to_string(), key]),
    );
    assert!(out.get("error").is_none(), "{tool}: {out}");
    out
}

/// Runs `ring0 journal ARGS…` in the workspace.
fn journal(dir: &Path, args: &[&str]) -> Output {
    Command::new(ring0())
        .arg("journal")
        .args(args)
        .current_dir(dir)
        .env("RING0_STATE_DIR", dir.join(".ring0"))
        .output()
        .unwrap()
}

/// The state `ring0 journal show` prints for an intent.
fn state_of(dir: &Path, intent: &str) -> String {
    let out = journal(dir, &["show", intent]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    shown
        .lines()
        .find_map(|l| l.strip_prefix("state:"))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| panic!("no state in:\n{shown}"))
}

/// Lines of `file` in the workspace equal to `line`.
fn count(dir: &Path, file: &str, line: &str) -> usize {
    std::fs::read_to_string(dir.join(file))
        .unwrap_or_default()
        .lines()
        .filter(|l| *l == line)
        .count()
}

fn intent_of(seen: &Value) -> String {
    seen["receipt"]["intent_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no intent in {seen}"))
        .to_string()
}

/// A call whose answer is lost after its effect: one line in effects.log, and a dead letter.
fn dead_letter(peers: &Path, server: &HttpServer, dir: &Path, text: &str, key: &str) -> String {
    let args = json!({"text": text, "lose_answer": true});
    let seen = call(peers, server, "fx__append", args, key);
    assert_eq!(seen["is_error"], true, "{seen}");
    let intent = intent_of(&seen);
    assert_eq!(state_of(dir, &intent), "DEAD_LETTER", "{seen}");
    assert_eq!(count(dir, "effects.log", text), 1, "it acted once");
    intent
}

#[test]
fn a_dead_letter_marked_applied_answers_its_retry_with_the_record() {
    let Some(peers) = peers() else { return };
    let dir = workspace(&peers);
    let server = serve(dir.path());
    let intent = dead_letter(&peers, &server, dir.path(), "paid-17", "key-applied");

    // Asked again before a person settled it, the call is refused, not sent again.
    let args = json!({"text": "paid-17", "lose_answer": true});
    let before = call(&peers, &server, "fx__append", args.clone(), "key-applied");
    assert_eq!(before["is_error"], true, "{before}");

    let out = journal(
        dir.path(),
        &[
            "resolve",
            &intent,
            "--applied",
            "--note",
            "the ledger shows it",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("is ACKED"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(state_of(dir.path(), &intent), "ACKED");

    let retry = call(&peers, &server, "fx__append", args, "key-applied");
    assert_eq!(retry["is_error"], false, "{retry}");
    assert_eq!(retry["receipt"]["disposition"], "replayed", "{retry}");
    assert!(
        retry["text"].as_str().unwrap_or("").contains("by a person"),
        "{retry}"
    );
    assert_eq!(
        count(dir.path(), "effects.log", "paid-17"),
        1,
        "never a second effect"
    );
}

#[test]
fn a_dead_letter_marked_not_applied_runs_again_on_retry_after_a_restart() {
    let Some(peers) = peers() else { return };
    let dir = workspace(&peers);
    let server = serve(dir.path());
    // The service fails before acting until the file `service-back` exists.
    let args = json!({"text": "order-9", "lane": "x", "fail_until": "service-back"});
    let first = call(
        &peers,
        &server,
        "fx__append_lane",
        args.clone(),
        "key-not-applied",
    );
    assert_eq!(first["is_error"], true, "{first}");
    let intent = intent_of(&first);
    assert_eq!(state_of(dir.path(), &intent), "DEAD_LETTER");
    assert_eq!(count(dir.path(), "effects.log", "order-9"), 0);
    let refused = journal(dir.path(), &["compensate", &intent]);
    assert!(!refused.status.success());
    assert!(
        text(&refused.stderr).contains("declares no compensating tool"),
        "{}",
        text(&refused.stderr)
    );

    // With ring0 serve stopped, the command settles the journal itself; an upstream's tool,
    // which only the server serves, is not compensated from here.
    drop(server);
    let refused = journal(dir.path(), &["compensate", &intent]);
    assert!(!refused.status.success());
    assert!(
        text(&refused.stderr).contains("through a running `ring0 serve`"),
        "{}",
        text(&refused.stderr)
    );
    let out = journal(dir.path(), &["resolve", &intent, "--not-applied"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(state_of(dir.path(), &intent), "FAILED");
    let again = journal(dir.path(), &["resolve", &intent, "--applied"]);
    assert!(
        !again.status.success(),
        "a settled intent is not settled twice"
    );
    assert!(
        text(&again.stderr).contains("FAILED"),
        "{}",
        text(&again.stderr)
    );

    std::fs::write(dir.path().join("service-back"), "").unwrap();
    let server = serve(dir.path());
    let retry = call(&peers, &server, "fx__append_lane", args, "key-not-applied");
    assert_eq!(retry["is_error"], false, "{retry}");
    assert_eq!(retry["receipt"]["disposition"], "dispatched", "{retry}");
    assert_eq!(count(dir.path(), "effects.log", "order-9"), 1, "it ran now");
}

#[test]
fn a_dead_letter_is_compensated_once_through_the_running_server() {
    let Some(peers) = peers() else { return };
    let dir = workspace(&peers);
    let server = serve(dir.path());
    let intent = dead_letter(&peers, &server, dir.path(), "seat-4", "key-compensate");

    let out = journal(
        dir.path(),
        &["compensate", &intent, "--note", "double booking"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("is COMPENSATED"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(count(dir.path(), "retractions.log", "seat-4"), 1);
    assert_eq!(state_of(dir.path(), &intent), "COMPENSATED");
    let shown = text(&journal(dir.path(), &["show", &intent]).stdout);
    assert!(shown.contains("compensated by fx__retract"), "{shown}");
    assert!(shown.contains("double booking"), "{shown}");

    // Asked again, nothing is undone a second time.
    let again = journal(dir.path(), &["compensate", &intent]);
    assert!(!again.status.success());
    assert!(
        text(&again.stderr).contains("COMPENSATED"),
        "{}",
        text(&again.stderr)
    );
    assert_eq!(count(dir.path(), "retractions.log", "seat-4"), 1);
    // The compensated call is not run again by a retry either.
    let args = json!({"text": "seat-4", "lose_answer": true});
    let retry = call(&peers, &server, "fx__append", args, "key-compensate");
    assert_eq!(retry["is_error"], true, "{retry}");
    assert_eq!(count(dir.path(), "effects.log", "seat-4"), 1);
}

#[test]
fn settling_by_hand_refuses_what_is_not_an_intent() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("ring0.toml"),
        "[workspace]\nstate_dir = \".ring0\"\n",
    )
    .unwrap();
    let out = journal(dir.path(), &["resolve", "not-an-id", "--applied"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("is not an intent id"),
        "{}",
        text(&out.stderr)
    );
    let unknown = "0190a0b0-0000-7000-8000-000000000000";
    let out = journal(dir.path(), &["resolve", unknown, "--not-applied"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("no journal"),
        "{}",
        text(&out.stderr)
    );
    // A journal without that intent.
    let created = Command::new(ring0())
        .args(["call", "write_file", r#"{"path": "a.txt", "content": "a"}"#])
        .current_dir(dir.path())
        .env("RING0_STATE_DIR", dir.path().join(".ring0"))
        .output()
        .unwrap();
    assert!(created.status.success(), "{}", text(&created.stderr));
    let out = journal(dir.path(), &["resolve", unknown, "--not-applied"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("no intent"),
        "{}",
        text(&out.stderr)
    );
    let out = journal(dir.path(), &["resolve", unknown]);
    assert!(
        !out.status.success(),
        "--applied or --not-applied is required"
    );
}
