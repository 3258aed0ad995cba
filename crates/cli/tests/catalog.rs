//! Catalog search mode through the real `ring0 serve`, driven by the official Python MCP SDK
//! client: the listing is the pinned core and the meta-tools; search finds what the grants show
//! and never a quarantined or ungranted tool; a loaded tool is announced and listed; a granted
//! tool that was never loaded is callable, an ungranted one is not.

mod common;

use common::{one_upstream_config, peers, python, python_report, ring0, spawn_stdio_json};
use serde_json::{Value, json};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// How long the first `ring0 serve` may take to answer its listing.
const LISTING_WAIT: Duration = Duration::from_secs(60);

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../mcp/tests/fixtures/stdio_server.py")
}

/// The Python fixture as upstream `fx`, some of its tools granted with two built-ins, in search
/// mode with `read_file` pinned. `extra` goes into the upstream's table.
fn write_config(dir: &Path, extra: &str) {
    let mut text = one_upstream_config(
        "granted",
        r#"["read_file", "list_dir", "fx__echo", "fx__slow", "fx__structured"]"#,
        "A1",
        "fx",
        &format!(
            "command = \"python3\"\nargs = [{:?}]\nenv = [\"PATH\"]\n{extra}",
            fixture().display().to_string()
        ),
        "",
    );
    // `[catalog]` after the upstream's tables: a new table, not a key of theirs.
    text.push_str("\n[catalog]\nmode = \"search\"\npinned = [\"read_file\"]\n");
    std::fs::write(dir.join("ring0.toml"), text).unwrap();
}

/// Runs `ring0 serve` until it answered one listing: the upstream's tools are trusted on first
/// use and recorded in `ring0.lock`.
fn pin_first_listing(dir: &Path) {
    let mut cmd = Command::new(ring0());
    cmd.arg("serve").current_dir(dir);
    let (mut child, mut stdin, messages) = spawn_stdio_json(cmd);
    for message in [
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "pin", "version": "1"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}),
    ] {
        writeln!(stdin, "{message}").unwrap();
    }
    loop {
        let m: Value = messages
            .recv_timeout(LISTING_WAIT)
            .expect("ring0 answers the listing");
        if m["id"] == 2 {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(dir.join("ring0.lock").exists(), "trusted on first use");
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect()
}

#[test]
fn search_mode_finds_loads_and_lists_only_what_the_grants_show() {
    let Some(peers) = peers() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), "");
    pin_first_listing(dir.path());
    // `echo`'s definition changes: it is quarantined until a person approves it again.
    write_config(
        dir.path(),
        "env_set = { FIXTURE_DESCRIPTION = \"Echoes its text, and more.\" }",
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/py_client_catalog.py");
    let seen = python_report(
        Command::new(python(&peers))
            .arg(&script)
            .arg(ring0())
            .arg(dir.path()),
    );

    assert_eq!(
        strings(&seen["listed"]),
        ["read_file", "search_tools", "load_tools"],
        "the pinned core, then the meta-tools: {seen}"
    );
    assert_eq!(seen["search_upstream"]["is_error"], false, "{seen}");
    assert_eq!(
        strings(&seen["search_upstream"]["names"]).first(),
        Some(&"fx__slow"),
        "{seen}"
    );
    assert_eq!(
        strings(&seen["search_builtin"]["names"]).first(),
        Some(&"list_dir"),
        "{seen}"
    );
    assert!(
        !strings(&seen["search_quarantined"]["names"]).contains(&"fx__echo"),
        "a quarantined tool is never found: {seen}"
    );
    assert!(
        !strings(&seen["search_ungranted"]["names"]).contains(&"fx__big"),
        "an ungranted tool is never found: {seen}"
    );
    assert_eq!(
        seen["call_unloaded"]["is_error"], false,
        "a granted tool is callable without loading it: {seen}"
    );
    assert_eq!(seen["call_ungranted"]["is_error"], true, "{seen}");
    assert_eq!(strings(&seen["load"]["loaded"]), ["fx__slow"], "{seen}");
    assert_eq!(strings(&seen["load"]["not_found"]), ["fx__big"], "{seen}");
    assert_eq!(seen["list_changed"], true, "the load is announced: {seen}");
    assert_eq!(
        strings(&seen["listed_after_load"]),
        ["read_file", "search_tools", "load_tools", "fx__slow"],
        "a loaded tool is listed after the core: {seen}"
    );
}
