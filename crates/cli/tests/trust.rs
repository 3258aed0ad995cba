//! The trust boundary as a person sees it through the `ring0` binary: an audit log that shows
//! tampering, argvs that smuggle a shell script, prompts that show the whole arguments, and
//! recovery that re-checks an unsent call against today's grants.

use ring0_core::SemanticKey;
use ring0_journal::{Journal, Proposal, ProposeDecision, SqliteJournal};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const READS_ONLY: &str = r#"
defaults = false
[workspace]
state_dir = "state"

[[grants]]
name = "reads"
tools = ["read_file", "list_dir"]
ceiling = "A0"
"#;

/// The file tools and a `shell` held for approval, without the embedded defaults.
fn reads_and_writes() -> String {
    format!("defaults = false\n{}", common::HELD_SHELL_CONFIG)
}

fn workspace(config: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), "alpha\n").unwrap();
    std::fs::write(dir.path().join("ring0.toml"), config).unwrap();
    dir
}

fn ring0(dir: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ring0"));
    cmd.current_dir(dir);
    cmd
}

fn run(dir: &Path, args: &[&str]) -> Output {
    ring0(dir).args(args).output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn audit_log(dir: &Path) -> PathBuf {
    dir.join("state/audit.jsonl")
}

fn three_audited_calls(dir: &Path) {
    for _ in 0..3 {
        let out = run(dir, &["call", "read_file", r#"{"path":"notes.txt"}"#]);
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
}

fn rewrite_lines(path: &Path, edit: impl FnOnce(&mut Vec<String>)) {
    let mut lines: Vec<String> = std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    edit(&mut lines);
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

#[test]
fn audit_verify_accepts_the_log_ring0_wrote_and_every_line_names_principal_and_session() {
    let dir = workspace(READS_ONLY);
    three_audited_calls(dir.path());
    let out = run(dir.path(), &["audit", "verify"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("3 lines, chain intact"),
        "{}",
        text(&out.stdout)
    );
    let log = std::fs::read_to_string(audit_log(dir.path())).unwrap();
    for line in log.lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        for key in [
            "prev",
            "principal",
            "session_id",
            "scope",
            "tool",
            "decision",
            "rule",
            "args_hash",
        ] {
            assert!(v.get(key).is_some(), "{key} missing from {line}");
        }
        assert_eq!(v["principal"], "local");
        assert!(
            v.get("args").is_none(),
            "values are not recorded by default"
        );
    }
}

#[test]
fn audit_verify_reports_an_edited_line_with_its_number() {
    let dir = workspace(READS_ONLY);
    three_audited_calls(dir.path());
    let log = audit_log(dir.path());
    rewrite_lines(&log, |l| l[0] = l[0].replace("grant:reads", "grant:other"));
    let out = run(
        dir.path(),
        &["audit", "verify", "--path", log.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("line 2:"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn audit_verify_reports_reordered_lines() {
    let dir = workspace(READS_ONLY);
    three_audited_calls(dir.path());
    rewrite_lines(&audit_log(dir.path()), |l| l.swap(0, 1));
    let out = run(dir.path(), &["audit", "verify"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("line 1:"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_truncated_audit_log_is_reported_and_ring0_refuses_to_run_on_it() {
    let dir = workspace(READS_ONLY);
    three_audited_calls(dir.path());
    rewrite_lines(&audit_log(dir.path()), |l| l.truncate(1));
    let out = run(dir.path(), &["audit", "verify"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("line 2: missing"),
        "{}",
        text(&out.stderr)
    );
    let call = run(
        dir.path(),
        &["call", "read_file", r#"{"path":"notes.txt"}"#],
    );
    assert!(!call.status.success());
    // The state directory's manifest (which records the log's length) or the log's own head
    // record catches the cut first; either way ring0 names it and does not run.
    let why = text(&call.stderr);
    assert!(
        why.contains("cut short") || why.contains("was truncated"),
        "{why}"
    );
}

#[test]
fn an_argv_that_starts_a_shell_script_is_refused_without_asking_anyone() {
    let dir = workspace(&reads_and_writes());
    for argv in [
        r#"["sh","-c","touch ran"]"#,
        r#"["/bin/bash","-c","touch ran"]"#,
        r#"["env","sh","-c","touch ran"]"#,
        r#"["python3","-c","open('ran','w')"]"#,
    ] {
        let out = run(
            dir.path(),
            &["call", "shell", &format!(r#"{{"argv":{argv}}}"#)],
        );
        assert_eq!(out.status.code(), Some(1), "{argv}");
        let result: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(result["status"], "policy_denied", "{result}");
        assert!(
            result["message"]
                .as_str()
                .unwrap()
                .contains("inline script"),
            "{result}"
        );
        assert!(
            !text(&out.stderr).contains("approval required"),
            "nobody was asked"
        );
    }
    assert!(!dir.path().join("ran").exists());
}

/// Starts a held call and returns it with the approval id `ring0 approve` lists.
// The caller waits for the child it is handed.
#[allow(clippy::zombie_processes)]
fn held_call(dir: &Path, args: &[&str]) -> (std::process::Child, String, String) {
    let mut child = ring0(dir)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let listed = text(&run(dir, &["approve"]).stdout);
        if let Some(id) = listed.split_whitespace().find(|w| w.starts_with("ap_")) {
            return (child, id.to_string(), listed);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("no pending approval appeared");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_person_sees_padding_and_the_tail_it_hides() {
    let dir = workspace(&reads_and_writes());
    let padded = format!("{}; echo pwned > tail.txt", " ".repeat(1200));
    let call = json!({"argv": ["echo", padded]}).to_string();
    let (child, id, listed) = held_call(dir.path(), &["call", "shell", &call]);
    assert!(
        listed.contains("⟪1200 spaces⟫; echo pwned > tail.txt"),
        "the listing shows the tail: {listed}"
    );
    let shown = run(dir.path(), &["approve", "--show", &id]);
    assert!(shown.status.success(), "{}", text(&shown.stderr));
    assert!(text(&shown.stdout).contains("⟪1200 spaces⟫; echo pwned > tail.txt"));
    assert!(run(dir.path(), &["deny", &id]).status.success());
    let out = child.wait_with_output().unwrap();
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["status"], "approval_denied", "{result}");
}

#[test]
fn arguments_too_long_to_list_are_shown_whole_by_approve_show() {
    let dir = workspace(&reads_and_writes());
    let mut argv = vec!["echo".to_string()];
    argv.extend((0..2000).map(|i| format!("w{i}")));
    let call = json!({ "argv": argv }).to_string();
    let (child, id, listed) = held_call(dir.path(), &["call", "shell", &call]);
    assert!(!listed.contains("w1999"), "the listing is bounded");
    assert!(
        listed.contains(&format!("ring0 approve --show {id}")),
        "{listed}"
    );
    let shown = text(&run(dir.path(), &["approve", "--show", &id]).stdout);
    assert!(shown.contains("\"w1999\"]"), "{shown}");
    assert!(run(dir.path(), &["deny", &id]).status.success());
    child.wait_with_output().unwrap();
}

/// Leaves in `dir/state/journal.db` what a process that crashed between commit and dispatch
/// leaves: a RECORDED `write_file` intent.
fn commit_unsent_write(dir: &Path) {
    let state = dir.join("state");
    std::fs::create_dir_all(&state).unwrap();
    let args = json!({"path": "from-crash.txt", "content": "written at recovery"});
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let journal = SqliteJournal::open(state.join("journal.db")).unwrap();
        let proposal = Proposal {
            intent_id: None,
            semantic_key: SemanticKey::compute("write_file", &args, "crashed", 0).unwrap(),
            scope: "crashed".into(),
            attempt_epoch: 0,
            tool: "write_file".into(),
            canonical_args: ring0_core::canonical::canonical_string(&args).unwrap(),
            call_id: "toolu_crashed".into(),
            mutating: true,
            client_key: None,
            principal: None,
        };
        let decision = journal.propose(proposal).await.unwrap();
        assert!(
            matches!(decision, ProposeDecision::Recorded(_)),
            "{decision:?}"
        );
    });
}

fn the_write(dir: &Path) -> ring0_journal::IntentRecord {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let journal = SqliteJournal::open(dir.join("state/journal.db")).unwrap();
        let recent = journal.recent(16).await.unwrap();
        recent
            .into_iter()
            .find(|r| r.tool == "write_file")
            .expect("the write's record")
    })
}

#[test]
fn after_a_crash_an_unsent_call_whose_grant_was_removed_is_not_dispatched() {
    let dir = workspace(READS_ONLY);
    commit_unsent_write(dir.path());
    let out = run(
        dir.path(),
        &["call", "read_file", r#"{"path":"notes.txt"}"#],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        !dir.path().join("from-crash.txt").exists(),
        "the unsent write was not dispatched"
    );
    let record = the_write(dir.path());
    assert_eq!(record.state, ring0_core::IntentState::RejectedConflict);
    let notes: Vec<String> = record
        .timeline
        .iter()
        .filter_map(|t| t.note.clone())
        .collect();
    assert!(
        notes
            .iter()
            .any(|n| n.contains("refused at recovery") && n.contains("default_deny")),
        "{notes:?}"
    );
}

#[test]
fn after_a_crash_an_unsent_call_the_grants_still_allow_is_dispatched() {
    let dir = workspace(&reads_and_writes());
    commit_unsent_write(dir.path());
    let out = run(
        dir.path(),
        &["call", "read_file", r#"{"path":"notes.txt"}"#],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("from-crash.txt")).unwrap(),
        "written at recovery"
    );
}

#[path = "common/mod.rs"]
mod common;

#[test]
fn an_approval_for_one_http_session_never_releases_the_identical_call_in_another() {
    let Some(peers) = common::peers() else {
        return;
    };
    let dir = workspace(&reads_and_writes().replace(
        "approval = true",
        "approval = true\napproval_scope = \"session\"",
    ));
    let server = common::start_http(common::serve_http_command(dir.path()));
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/py_client_two_sessions.py");
    let seen = common::python_report(
        Command::new(common::python(&peers))
            .arg(&script)
            .arg(server.url())
            .arg(dir.path()),
    );
    assert_eq!(seen["a_first"]["ran"], true, "{seen}");
    assert_eq!(seen["a_again"]["is_error"], false, "{seen}");
    assert_eq!(
        seen["a_again"]["ran"], true,
        "a delivered call asked again runs: {seen}"
    );
    let asked = seen["asked"].as_array().unwrap();
    assert_eq!(
        asked.len(),
        1,
        "the session's second identical call was not asked: {seen}"
    );
    assert!(
        asked[0]["schema"]["properties"]["scope"].is_object(),
        "the prompt offers \"allow for this session\": {seen}"
    );
    assert!(
        asked[0]["message"]
            .as_str()
            .unwrap()
            .contains("[\"touch\",\"marker\"]"),
        "{seen}"
    );
    assert_eq!(
        seen["b"]["ran"], false,
        "the other session's call did not run: {seen}"
    );
    assert_eq!(seen["b"]["is_error"], true, "{seen}");
    let b: Value = serde_json::from_str(seen["b"]["text"].as_str().unwrap()).unwrap();
    assert_eq!(b["status"], "approval_required", "{b}");
    assert!(
        !b["advice"].as_str().unwrap().contains("do not retry"),
        "{b}"
    );
    assert!(
        b["message"]
            .as_str()
            .unwrap()
            .contains("ring0_confirmation_code"),
        "{b}"
    );
}
