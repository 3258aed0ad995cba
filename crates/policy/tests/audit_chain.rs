//! The audit log's hash chain: every tampering a person with write access could try shows up as
//! the first broken or missing link, with its line number.

use ring0_policy::{AUDIT_GENESIS, AuditDecision, AuditEntry, AuditSink, JsonlAudit, verify_chain};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn entry(n: u64) -> AuditEntry {
    AuditEntry {
        at_ms: n,
        decision: AuditDecision::Allowed,
        rule: "grant:files".into(),
        reason: String::new(),
        tool: "read_file".into(),
        call_id: format!("c{n}"),
        principal: "local".into(),
        scope: "scope".into(),
        session_id: "s1".into(),
        args_hash: "v1:abc".into(),
        approval_id: None,
        args: None,
    }
}

/// A log of `n` records written through the sink.
fn log_of(n: u64) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let audit = JsonlAudit::open(&path).unwrap();
    for i in 1..=n {
        audit.record(&entry(i)).unwrap();
    }
    (dir, path)
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

fn write_lines(path: &Path, lines: &[String]) {
    let mut text = lines.join("\n");
    text.push('\n');
    std::fs::write(path, text).unwrap();
}

#[test]
fn an_untouched_log_verifies_and_starts_at_genesis() {
    let (_dir, path) = log_of(3);
    let report = verify_chain(&path).unwrap();
    assert_eq!(report.lines, 3);
    assert!(report.anchored);
    let first: Value = serde_json::from_str(&lines(&path)[0]).unwrap();
    assert_eq!(first["prev"], AUDIT_GENESIS);
    assert_eq!(first["principal"], "local");
    assert_eq!(first["session_id"], "s1");
}

#[test]
fn the_chain_continues_across_a_restart() {
    let (_dir, path) = log_of(2);
    let reopened = JsonlAudit::open(&path).unwrap();
    reopened.record(&entry(3)).unwrap();
    assert_eq!(verify_chain(&path).unwrap().lines, 3);
}

#[test]
fn an_edited_line_breaks_the_next_link() {
    let (_dir, path) = log_of(4);
    let mut l = lines(&path);
    l[1] = l[1].replace("grant:files", "grant:other");
    write_lines(&path, &l);
    let broken = verify_chain(&path).unwrap_err();
    assert_eq!(broken.line, 3, "{broken}");
}

#[test]
fn an_edited_last_line_is_caught_by_the_head() {
    let (_dir, path) = log_of(3);
    let mut l = lines(&path);
    l[2] = l[2].replace("\"allowed\"", "\"denied\"");
    write_lines(&path, &l);
    let broken = verify_chain(&path).unwrap_err();
    assert_eq!(broken.line, 3, "{broken}");
    assert!(
        JsonlAudit::open(&path).is_err(),
        "the writer refuses it too"
    );
}

#[test]
fn a_deleted_line_is_a_missing_link() {
    let (_dir, path) = log_of(4);
    let mut l = lines(&path);
    l.remove(1);
    write_lines(&path, &l);
    assert_eq!(verify_chain(&path).unwrap_err().line, 2);
}

#[test]
fn deleting_the_first_line_is_caught() {
    let (_dir, path) = log_of(3);
    let l = lines(&path);
    write_lines(&path, &l[1..]);
    let broken = verify_chain(&path).unwrap_err();
    assert_eq!(broken.line, 1, "{broken}");
}

#[test]
fn reordered_lines_break_the_chain() {
    let (_dir, path) = log_of(4);
    let mut l = lines(&path);
    l.swap(1, 2);
    write_lines(&path, &l);
    assert_eq!(verify_chain(&path).unwrap_err().line, 2);
}

#[test]
fn a_log_cut_short_is_reported_and_refused() {
    let (_dir, path) = log_of(4);
    let l = lines(&path);
    write_lines(&path, &l[..2]);
    let broken = verify_chain(&path).unwrap_err();
    assert_eq!(broken.line, 3, "{broken}");
    assert!(broken.why.contains("missing"), "{broken}");
    let refused = JsonlAudit::open(&path)
        .err()
        .expect("open refuses a log cut short");
    assert!(refused.to_string().contains("cut short"), "{refused}");
}

#[test]
fn a_log_cut_inside_a_line_is_reported() {
    let (_dir, path) = log_of(2);
    let text = std::fs::read(&path).unwrap();
    std::fs::write(&path, &text[..text.len() - 10]).unwrap();
    assert_eq!(verify_chain(&path).unwrap_err().line, 2);
}

#[test]
fn an_emptied_log_is_refused() {
    let (_dir, path) = log_of(2);
    std::fs::write(&path, b"").unwrap();
    assert_eq!(verify_chain(&path).unwrap_err().line, 1);
    assert!(JsonlAudit::open(&path).is_err());
}

#[test]
fn two_writers_sharing_a_log_extend_one_chain() {
    let (_dir, path) = log_of(1);
    // Two open files, as two processes would have: each catches up with the other's lines.
    let first = JsonlAudit::open(&path).unwrap();
    let second = JsonlAudit::open(&path).unwrap();
    for i in 0..3 {
        first.record(&entry(10 + i)).unwrap();
        second.record(&entry(20 + i)).unwrap();
    }
    assert_eq!(verify_chain(&path).unwrap().lines, 7);
}
