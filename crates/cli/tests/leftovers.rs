//! What an earlier `ring0 serve` left is settled when the next one starts, before it serves
//! anything: a background job recorded running by a process that was SIGKILLed is recorded
//! KILLED at start, with no job call needed.

mod common;

use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A grant that lets `shell` and the job tools run contained (A1) without approval.
const JOBS_GRANT: &str = "[workspace]\nstate_dir = \".ring0\"\n\n[[grants]]\nname = \"contained\"\ntools = [\"shell\", \"job_*\"]\nceiling = \"A1\"\nshell = true\n";

fn serve(ws: &Path) -> common::Serve {
    let mut cmd = Command::new(common::ring0());
    cmd.current_dir(ws).arg("serve");
    common::Serve::start(cmd)
}

/// The record file of `job` under the state directory.
fn record_of(dir: &Path, job: &str) -> Option<PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if let Some(found) = record_of(&path, job) {
                return Some(found);
            }
        } else if path
            .file_name()
            .is_some_and(|n| n == format!("{job}.json").as_str())
        {
            return Some(path);
        }
    }
    None
}

fn state_of(ws: &Path, job: &str) -> String {
    let path = record_of(&ws.join(".ring0"), job).expect("the job's record");
    let record: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    record["state"].as_str().unwrap_or_default().to_owned()
}

#[test]
fn a_job_left_running_by_a_killed_serve_is_settled_when_the_next_one_starts() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().canonicalize().unwrap();
    std::fs::write(ws.join("ring0.toml"), JOBS_GRANT).unwrap();

    let mut first = serve(&ws);
    let started = first.call(
        "shell",
        json!({"argv": ["sleep", "300"], "background": true, "detached": true}),
    );
    let job = started["result"]["structuredContent"]["job"]
        .as_str()
        .unwrap_or_else(|| panic!("no job handle: {started:#}"))
        .to_owned();
    assert_eq!(state_of(&ws, &job), "RUNNING");
    // Dropping kills it with SIGKILL: it never finishes the job's record.
    drop(first);
    assert_eq!(state_of(&ws, &job), "RUNNING");

    // The next process answers its first request only after settling; no job call is made.
    let mut second = serve(&ws);
    second.request("tools/list", json!({}));
    assert_eq!(state_of(&ws, &job), "KILLED");
}
