//! `ring0 checkpoint ls | restore`, run as a person would after mutations made through
//! `ring0 call`: the built binary in a temporary workspace.

mod common;

use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::process::{Command, Output};

fn ring0(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ring0"))
        .current_dir(dir)
        .env("RING0_STATE_DIR", dir.join(".ring0"))
        .args(args)
        .output()
        .unwrap()
}

fn call(dir: &Path, tool: &str, args: Value) {
    let out = ring0(dir, &["call", tool, &args.to_string()]);
    assert!(
        out.status.success(),
        "{tool} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Every path of the workspace (ring0's state left out) with what it holds.
fn tree(dir: &Path) -> BTreeMap<String, String> {
    fn walk(base: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let rel = path
                .strip_prefix(base)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            if rel == ".ring0" {
                continue;
            }
            if path.is_dir() {
                out.insert(rel, "dir".into());
                walk(base, &path, out);
            } else {
                out.insert(rel, fs::read_to_string(&path).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

fn workspace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("notes.txt"), "alpha\nbeta\n").unwrap();
    fs::create_dir(dir.path().join("src")).unwrap();
    fs::write(dir.path().join("src/old.rs"), "fn old() {}\n").unwrap();
    dir
}

/// The ids `ring0 checkpoint ls` prints, oldest first.
fn listed(dir: &Path) -> Vec<String> {
    let out = ring0(dir, &["checkpoint", "ls"]);
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

#[test]
fn restore_puts_the_workspace_back_after_writes_and_patches() {
    let dir = workspace();
    let ws = dir.path();
    let original = tree(ws);
    call(
        ws,
        "write_file",
        json!({"path": "notes.txt", "content": "rewritten\n", "overwrite": true}),
    );
    call(
        ws,
        "apply_patch",
        json!({"patch": "*** Begin Patch\n*** Update File: notes.txt\n@@\n-rewritten\n+patched\n\
                        *** Add File: lib/new/mod.rs\n+pub mod x;\n*** Delete File: src/old.rs\n*** End Patch\n"}),
    );
    call(
        ws,
        "write_file",
        json!({"path": "docs/a/b.md", "content": "# b\n", "create_dirs": true}),
    );
    assert_eq!(
        fs::read_to_string(ws.join("notes.txt")).unwrap(),
        "patched\n"
    );
    let ids = listed(ws);
    assert_eq!(ids.len(), 3, "one checkpoint per session: {ids:?}");

    let out = ring0(ws, &["checkpoint", "restore", &ids[0]]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains(&format!("restored {}", ids[0])),
        "{}",
        text(&out)
    );
    assert_eq!(tree(ws), original, "{}", text(&out));
    assert_eq!(ring0(ws, &["checkpoint", "ls"]).stdout, b"no checkpoints\n");
}

#[test]
fn restoring_a_later_checkpoint_keeps_the_earlier_sessions_changes() {
    let dir = workspace();
    let ws = dir.path();
    call(
        ws,
        "write_file",
        json!({"path": "notes.txt", "content": "one\n", "overwrite": true}),
    );
    call(
        ws,
        "write_file",
        json!({"path": "notes.txt", "content": "two\n", "overwrite": true}),
    );
    let ids = listed(ws);
    let out = ring0(ws, &["checkpoint", "restore", &ids[1]]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(fs::read_to_string(ws.join("notes.txt")).unwrap(), "one\n");
    assert_eq!(listed(ws), ids[..1]);
}

#[test]
fn restore_refuses_over_a_change_made_outside_ring0_unless_forced() {
    let dir = workspace();
    let ws = dir.path();
    call(
        ws,
        "write_file",
        json!({"path": "notes.txt", "content": "by ring0\n", "overwrite": true}),
    );
    fs::write(ws.join("notes.txt"), "by a person\n").unwrap();
    let id = &listed(ws)[0];

    let out = ring0(ws, &["checkpoint", "restore", id]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let message = text(&out);
    assert!(
        message.contains("notes.txt") && message.contains("changed outside ring0"),
        "{message}"
    );
    assert!(message.contains("--force"), "{message}");
    assert_eq!(
        fs::read_to_string(ws.join("notes.txt")).unwrap(),
        "by a person\n"
    );

    let out = ring0(ws, &["checkpoint", "restore", id, "--force"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("overwritten (changed outside ring0): notes.txt"),
        "{}",
        text(&out)
    );
    assert_eq!(
        fs::read_to_string(ws.join("notes.txt")).unwrap(),
        "alpha\nbeta\n"
    );
}

#[test]
fn a_refused_write_opens_no_checkpoint_that_changes_anything() {
    let dir = workspace();
    let ws = dir.path();
    // Refused: the file exists and overwrite is not set.
    let out = ring0(
        ws,
        &[
            "call",
            "write_file",
            r#"{"path":"notes.txt","content":"x"}"#,
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let before = tree(ws);
    for id in listed(ws) {
        let out = ring0(ws, &["checkpoint", "restore", &id]);
        assert!(out.status.success(), "{}", text(&out));
    }
    assert_eq!(tree(ws), before);
}

#[test]
fn restoring_an_unknown_checkpoint_fails_with_a_clear_message() {
    let dir = workspace();
    let out = ring0(dir.path(), &["checkpoint", "restore", "cp-424242"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out).contains("no checkpoint \"cp-424242\""),
        "{}",
        text(&out)
    );
}

/// A grant that lets `shell` run contained (A1) without approval.
const SHELL_GRANT: &str =
    "[[grants]]\nname = \"contained\"\ntools = [\"shell\"]\nceiling = \"A1\"\nshell = true\n";

fn shell(dir: &Path, script: &str) -> Value {
    let out = ring0(
        dir,
        &["call", "shell", &json!({"command": script}).to_string()],
    );
    assert!(out.status.success(), "{}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)))
}

#[test]
fn restore_undoes_a_contained_shell_rm_rf_and_the_files_it_made() {
    let dir = workspace();
    let ws = dir.path();
    fs::create_dir_all(ws.join("sub/deep")).unwrap();
    fs::write(ws.join("sub/deep/keep.txt"), "kept\n").unwrap();
    fs::write(ws.join("ring0.toml"), SHELL_GRANT).unwrap();
    let original = tree(ws);

    let receipt = shell(ws, "rm -rf sub && echo made > made.txt");
    assert!(!ws.join("sub").exists(), "{receipt:#}");
    assert!(ws.join("made.txt").exists(), "{receipt:#}");
    let ids = listed(ws);
    assert_eq!(ids.len(), 1, "{ids:?}");
    assert_eq!(
        receipt["outcome"]["observation"]["structured"]["checkpoint"]["id"], ids[0],
        "{receipt:#}"
    );

    let out = ring0(ws, &["checkpoint", "restore", &ids[0]]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(tree(ws), original, "{}", text(&out));
}

#[test]
fn a_workspace_past_the_tree_bound_runs_the_command_and_says_no_checkpoint_was_taken() {
    let dir = workspace();
    let ws = dir.path();
    fs::write(ws.join("ring0.toml"), SHELL_GRANT).unwrap();
    let many = ws.join("many");
    fs::create_dir(&many).unwrap();
    for i in 0..=ring0_checkpoint::TREE_PATHS_MAX {
        fs::write(many.join(i.to_string()), "").unwrap();
    }

    let receipt = shell(ws, "echo ran > ran.txt");
    assert!(ws.join("ran.txt").exists(), "{receipt:#}");
    let observation = &receipt["outcome"]["observation"];
    let notice = observation["structured"]["checkpoint"]["skipped"]
        .as_str()
        .unwrap_or_else(|| panic!("no notice: {receipt:#}"));
    assert!(notice.starts_with("checkpoint_skipped"), "{notice}");
    assert!(
        observation["text"].as_str().unwrap().contains(notice),
        "{receipt:#}"
    );
    assert_eq!(ring0(ws, &["checkpoint", "ls"]).stdout, b"no checkpoints\n");
}

/// A grant that lets `shell` and the job tools run contained (A1) without approval.
const JOBS_GRANT: &str = "[[grants]]\nname = \"contained\"\ntools = [\"shell\", \"job_*\"]\nceiling = \"A1\"\nshell = true\n";

#[test]
fn restore_undoes_what_a_contained_background_job_removed_and_made() {
    let dir = workspace();
    let ws = dir.path();
    fs::create_dir_all(ws.join("sub/deep")).unwrap();
    fs::write(ws.join("sub/deep/keep.txt"), "kept\n").unwrap();
    fs::write(ws.join("ring0.toml"), JOBS_GRANT).unwrap();
    let original = tree(ws);

    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ring0"));
    cmd.current_dir(ws)
        .env("RING0_STATE_DIR", ws.join(".ring0"))
        .arg("serve");
    let mut serve = common::Serve::start(cmd);
    let started = serve.call(
        "shell",
        json!({"command": "rm -rf sub && echo made > made.txt", "background": true}),
    );
    let structured = &started["result"]["structuredContent"];
    let job = structured["job"]
        .as_str()
        .unwrap_or_else(|| panic!("no job handle: {started:#}"))
        .to_owned();
    let checkpoint = structured["checkpoint"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("the job names no checkpoint: {started:#}"))
        .to_owned();
    let finished = serve.call("job_wait", json!({"job": job, "timeout_ms": 60_000}));
    assert!(finished.to_string().contains("COMPLETED"), "{finished:#}");
    drop(serve);
    assert!(!ws.join("sub").exists());
    assert!(ws.join("made.txt").exists());
    assert_eq!(listed(ws), vec![checkpoint.clone()]);

    // What the job left was recorded when it finished: no --force is needed.
    let out = ring0(ws, &["checkpoint", "restore", &checkpoint]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(tree(ws), original, "{}", text(&out));
}
