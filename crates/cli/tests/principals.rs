//! Two principals on one `ring0 serve --http`: what one is allowed, approved or charged never
//! reaches the other. Driven through the real binary with the Python MCP SDK client, each
//! principal with its own static bearer token.

mod common;

use common::*;
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Stdio};

/// `shell` held for approval on every call; `read_file` limited to 2 calls a minute per
/// principal; two tokens, two principals.
fn config(dir: &Path) {
    std::fs::write(
        dir.join("ring0.toml"),
        format!(
            "defaults = false\n[[grants]]\nname = \"read\"\ntools = [\"read_file\"]\nceiling = \"A0\"\nrate = \"2/min\"\n\n\
             [[grants]]\nname = \"shell\"\ntools = [\"shell\"]\nceiling = \"A2\"\napproval = true\n\n\
             {}",
            alice_and_bob_tokens()
        ),
    )
    .unwrap();
    std::fs::write(dir.join("hello.txt"), "hello\n").unwrap();
}

fn run_client(peers: &Path, url: &str, token: &str, approve: bool, reads: usize) -> Value {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/py_client_principals.py");
    python_report(Command::new(python(peers)).arg(&script).args([
        url,
        token,
        if approve { "yes" } else { "no" },
        &reads.to_string(),
    ]))
}

#[test]
fn approvals_quotas_and_audit_lines_stay_with_their_principal() {
    let Some(peers) = peers() else { return };
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    config(dir.path());
    let mut cmd = serve_http_command(dir.path());
    cmd.arg("--state-dir")
        .arg(&state)
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    let server = start_http(cmd);

    // Alice approves her `shell` call and spends her whole read quota, and one more.
    let alice = run_client(&peers, &server.url(), "alice-token", true, 3);
    assert!(alice.get("error").is_none(), "{alice}");
    assert_eq!(alice["asked"].as_array().unwrap().len(), 1, "{alice}");
    assert_eq!(alice["shell"]["is_error"], false, "{alice}");
    assert!(dir.path().join("ran.txt").exists());
    let reads = alice["reads"].as_array().unwrap();
    assert_eq!(reads[0]["is_error"], false, "{alice}");
    assert_eq!(reads[1]["is_error"], false, "{alice}");
    assert_eq!(reads[2]["is_error"], true, "{alice}");
    assert!(
        reads[2]["text"]
            .as_str()
            .unwrap()
            .contains("retry_after_ms"),
        "{alice}"
    );
    std::fs::remove_file(dir.path().join("ran.txt")).unwrap();

    // Bob's identical `shell` call is his own question: he is asked, says no, and nothing runs;
    // his read quota is untouched by Alice's.
    let bob = run_client(&peers, &server.url(), "bob-token", false, 2);
    assert!(bob.get("error").is_none(), "{bob}");
    assert_eq!(bob["asked"].as_array().unwrap().len(), 1, "{bob}");
    assert_eq!(bob["shell"]["is_error"], true, "{bob}");
    assert!(!dir.path().join("ran.txt").exists());
    for read in bob["reads"].as_array().unwrap() {
        assert_eq!(read["is_error"], false, "{bob}");
    }

    // Every audit line names the principal whose call it decided.
    let audit = std::fs::read_to_string(state.join("audit.jsonl")).unwrap();
    let lines: Vec<Value> = audit
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let by = |who: &str, tool: &str| {
        lines
            .iter()
            .filter(|l| l["principal"] == who && l["tool"] == tool)
            .count()
    };
    assert_eq!(by("alice", "read_file"), 3, "{audit}");
    assert_eq!(by("bob", "read_file"), 2, "{audit}");
    assert!(by("alice", "shell") >= 2, "held and approved: {audit}");
    assert!(by("bob", "shell") >= 2, "held and denied: {audit}");
    assert!(
        lines
            .iter()
            .all(|l| l["principal"] == "alice" || l["principal"] == "bob"),
        "{audit}"
    );
    let verify = Command::new(ring0())
        .args(["audit", "verify", "--path"])
        .arg(state.join("audit.jsonl"))
        .output()
        .unwrap();
    assert!(verify.status.success(), "{verify:?}");
}
