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

fn catalog_fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/catalog_upstream.py")
}

/// The catalog fixture as upstream `cu` (every tool a read), every tool of it granted but
/// `undocumented`, with `read_file` and `list_dir`; search mode with `read_file` pinned, and
/// `catalog` more keys of `[catalog]`. `all`: the fixture lists every tool from the start.
fn write_catalog_config(dir: &Path, all: bool, catalog: &str) {
    let env = if all {
        "env_set = { CATALOG_ALL = \"1\" }\n"
    } else {
        ""
    };
    let mut text = one_upstream_config(
        "granted",
        r#"["read_file", "list_dir", "cu__geocode", "cu__convert_currency", "cu__read_file",
            "cu__swap_tools", "cu__tide_table"]"#,
        "A1",
        "cu",
        &format!(
            "command = \"python3\"\nargs = [{:?}]\nenv = [\"PATH\"]\n{env}",
            catalog_fixture().display().to_string()
        ),
        "",
    );
    text.push_str(&format!(
        "\n[catalog]\nmode = \"search\"\npinned = [\"read_file\"]\n{catalog}"
    ));
    std::fs::write(dir.join("ring0.toml"), text).unwrap();
}

/// Longest `ring0 tools` may take (it starts the upstreams, each within its start bound).
const TOOLS_WAIT: Duration = Duration::from_secs(120);

/// Runs `ring0 tools ARGS` in `dir` to its end, within [`TOOLS_WAIT`]: (exit code, stdout,
/// stderr).
fn ring0_tools(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let mut child = common::ring0_command_in(dir)
        .arg("tools")
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + TOOLS_WAIT;
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            panic!("ring0 tools did not end within {TOOLS_WAIT:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        common::text(&out.stdout),
        common::text(&out.stderr),
    )
}

fn row<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == name)
        .unwrap_or_else(|| panic!("{name} is in the report: {report}"))
}

#[test]
fn ring0_tools_prints_every_tool_with_its_metadata_tokens_and_listing_totals() {
    if peers().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    write_catalog_config(dir.path(), false, "");
    let (code, out, err) = ring0_tools(dir.path(), &["--json"]);
    assert_eq!(code, 0, "{out}\n{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["mode"], "search", "{report}");

    let read_file = row(&report, "read_file");
    assert_eq!(read_file["source"], "built-in");
    assert_eq!(
        (read_file["core"].clone(), read_file["listed"].clone()),
        (json!(true), json!(true))
    );
    let geocode = row(&report, "cu__geocode");
    assert_eq!(geocode["source"], "upstream:cu");
    assert_eq!(geocode["effect"], "nullipotent");
    assert_eq!(geocode["authority"], "A0");
    assert_eq!(geocode["pin"], "trusted");
    assert_eq!(geocode["core"], false);
    assert!(geocode["tokens"].as_u64().unwrap() > 10, "{geocode}");
    let undocumented = row(&report, "cu__undocumented");
    assert_eq!(undocumented["listed"], false);
    assert!(
        undocumented["hidden_because"]
            .as_str()
            .is_some_and(|w| !w.is_empty()),
        "{undocumented}"
    );
    assert_eq!(row(&report, "search_tools")["source"], "catalog");

    // The totals are the rows' sums: every tool local sees, and what search mode sends.
    let rows = report["tools"].as_array().unwrap();
    let sum = |pick: &dyn Fn(&Value) -> bool| -> u64 {
        rows.iter()
            .filter(|r| pick(r))
            .map(|r| r["tokens"].as_u64().unwrap())
            .sum()
    };
    let full = sum(&|r| r["listed"] == true && r["source"] != "catalog");
    assert_eq!(report["listings"]["full"]["tokens"], full, "{report}");
    let sent_names = ["read_file", "search_tools", "load_tools"];
    let sent = sum(&|r| sent_names.contains(&r["name"].as_str().unwrap()));
    assert_eq!(report["listings"]["sent"]["tools"], 3, "{report}");
    assert_eq!(report["listings"]["sent"]["tokens"], sent, "{report}");
    assert!(sent < full, "search mode sends less: {sent} < {full}");
    assert!(
        dir.path().join("ring0.lock").exists(),
        "the upstream's tools are trusted on first use, as at serve"
    );

    let (code, table, _) = ring0_tools(dir.path(), &[]);
    assert_eq!(code, 0);
    assert!(
        table.lines().next().unwrap().starts_with("catalog: "),
        "{table}"
    );
    assert!(
        table.contains("TOOL") && table.contains("TOKENS"),
        "{table}"
    );
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("cu__geocode ") && l.contains("upstream:cu")),
        "{table}"
    );
    assert!(
        table.contains(&format!("sent: 3 tools, {sent} tokens")),
        "{table}"
    );
}

fn findings<'a>(report: &'a Value, rule: &str) -> Vec<&'a Value> {
    report["lint"]["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["rule"] == rule)
        .collect()
}

#[test]
fn ring0_tools_lint_finds_the_upstreams_mistakes_and_exits_3_on_an_error() {
    if peers().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    write_catalog_config(dir.path(), false, "");
    let (code, out, err) = ring0_tools(dir.path(), &["--lint", "--json"]);
    assert_eq!(code, 3, "an error-level finding: {out}\n{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    let missing = findings(&report, "missing_description");
    assert_eq!(missing.len(), 1, "{report}");
    assert_eq!(missing[0]["tool"], "cu__undocumented");
    assert_eq!(missing[0]["level"], "error");
    let prose = findings(&report, "enum_as_prose");
    assert_eq!(prose.len(), 1, "{report}");
    assert_eq!(prose[0]["tool"], "cu__convert_currency");
    assert_eq!(prose[0]["location"], "/properties/currency");
    let duplicates = findings(&report, "near_duplicate");
    assert!(
        duplicates.iter().any(|f| {
            let pair = [f["tool"].as_str().unwrap(), f["message"].as_str().unwrap()];
            pair[0] == "cu__read_file" && pair[1].contains("\"read_file\"")
                || pair[0] == "read_file" && pair[1].contains("cu__read_file")
        }),
        "the upstream's read_file says what the built-in says: {report}"
    );

    let (code, table, _) = ring0_tools(dir.path(), &["--lint"]);
    assert_eq!(code, 3);
    assert!(
        table.contains("error: cu__undocumented [missing_description]"),
        "{table}"
    );
}

#[test]
fn the_built_ins_alone_lint_without_errors() {
    let dir = tempfile::tempdir().unwrap();
    let (code, out, err) = ring0_tools(dir.path(), &["--lint"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("\n0 error(s), "), "{out}");
}

#[test]
fn the_configured_schema_budgets_make_lint_errors() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("ring0.toml"),
        "[catalog]\ntool_tokens_max = 150\nlisting_tokens_max = 1000\n",
    )
    .unwrap();
    let (code, out, err) = ring0_tools(dir.path(), &["--lint", "--json"]);
    assert_eq!(code, 3, "{out}\n{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    let over: Vec<&str> = findings(&report, "tool_over_budget")
        .iter()
        .map(|f| f["tool"].as_str().unwrap())
        .collect();
    assert!(
        over.contains(&"shell"),
        "shell's definition is the largest: {report}"
    );
    for name in &over {
        assert!(row(&report, name)["tokens"].as_u64().unwrap() > 150);
    }
    assert_eq!(
        findings(&report, "listing_over_budget").len(),
        1,
        "{report}"
    );
    assert!(
        report["over_budget"].as_array().unwrap().len() > over.len(),
        "serve's start lines say the same: {report}"
    );
}

#[test]
fn ring0_tools_names_an_upstream_that_did_not_start_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("ring0.toml"),
        "[workspace]\nstate_dir = \".ring0\"\n\n[[upstreams]]\nalias = \"mute\"\n\
         command = \"sleep\"\nargs = [\"600\"]\nstart_timeout_ms = 1000\n",
    )
    .unwrap();
    let (code, out, err) = ring0_tools(dir.path(), &[]);
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(
        out.contains("incomplete: upstream mute did not start"),
        "{out}"
    );
    assert!(
        out.contains("read_file"),
        "the rest is still printed: {out}"
    );
}

#[test]
fn an_upstreams_changed_listing_rebuilds_the_index() {
    let Some(peers) = peers() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // Every tool, the later one too, is trusted on first use; then the upstream starts without it.
    write_catalog_config(dir.path(), true, "");
    let (code, out, err) = ring0_tools(dir.path(), &[]);
    assert_eq!(code, 0, "{out}\n{err}");
    write_catalog_config(dir.path(), false, "");
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/py_client_catalog_changes.py");
    let seen = python_report(
        Command::new(python(&peers))
            .arg(&script)
            .arg(ring0())
            .arg(dir.path()),
    );
    assert!(
        !strings(&seen["tides_before"]).contains(&"cu__tide_table"),
        "not listed by the upstream yet: {seen}"
    );
    assert_eq!(
        strings(&seen["currency_before"]).first(),
        Some(&"cu__convert_currency"),
        "{seen}"
    );
    assert_eq!(seen["swap"]["is_error"], false, "{seen}");
    assert_eq!(
        seen["list_changed"], true,
        "the change is announced: {seen}"
    );
    assert_eq!(
        strings(&seen["tides_after"]).first(),
        Some(&"cu__tide_table"),
        "the new tool is found: {seen}"
    );
    assert!(
        !strings(&seen["currency_after"]).contains(&"cu__convert_currency"),
        "the retired tool is no longer found: {seen}"
    );
    assert_eq!(seen["call_retired"]["is_error"], true, "{seen}");
}

#[test]
fn meta_tool_calls_are_in_the_policys_audit_log() {
    if peers().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    write_catalog_config(dir.path(), false, "");
    let mut client = common::StdioClient::initialized(
        {
            let mut cmd = common::ring0_command_in(dir.path());
            cmd.arg("serve");
            cmd
        },
        "2025-11-25",
    );
    let searched = client.request(
        "tools/call",
        json!({"name": "search_tools", "arguments": {"query": "street address coordinates"}}),
    );
    assert_eq!(searched["result"]["isError"], false, "{searched}");
    let loaded = client.request(
        "tools/call",
        json!({"name": "load_tools", "arguments": {"names": ["cu__geocode"]}}),
    );
    assert_eq!(loaded["result"]["isError"], false, "{loaded}");
    let _ = client.child.kill();
    let _ = client.child.wait();

    let audit = std::fs::read_to_string(dir.path().join(".ring0/audit.jsonl")).unwrap();
    let entries: Vec<Value> = audit
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for tool in ["search_tools", "load_tools"] {
        let entry = entries
            .iter()
            .map(|e| e.get("entry").unwrap_or(e))
            .find(|e| e["tool"] == tool)
            .unwrap_or_else(|| panic!("{tool} is in the audit log:\n{audit}"));
        assert_eq!(entry["decision"], "allowed", "{entry}");
        assert_eq!(entry["rule"], "catalog:meta", "{entry}");
        assert_eq!(entry["principal"], "local", "{entry}");
    }
    let verified = common::ring0_command_in(dir.path())
        .args(["audit", "verify"])
        .output()
        .unwrap();
    assert!(
        verified.status.success(),
        "the chain holds: {}{}",
        common::text(&verified.stdout),
        common::text(&verified.stderr)
    );
}

#[test]
fn a_stateless_requests_load_is_listed_by_the_next_request_of_its_scope() {
    let Some(peers) = peers() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    write_catalog_config(dir.path(), false, "");
    let server = common::start_http(common::serve_http_command(dir.path()));
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/py_client_catalog_stateless.py");
    let seen = python_report(Command::new(python(&peers)).arg(&script).arg(server.url()));
    assert_eq!(
        strings(&seen["before"]),
        ["read_file", "search_tools", "load_tools"],
        "{seen}"
    );
    assert_eq!(strings(&seen["load"]["loaded"]), ["cu__geocode"], "{seen}");
    assert_eq!(
        strings(&seen["after"]),
        ["read_file", "search_tools", "load_tools", "cu__geocode"],
        "the next request lists the load: {seen}"
    );
    assert_eq!(
        strings(&seen["other_connection"]),
        ["read_file", "search_tools", "load_tools", "cu__geocode"],
        "the principal's scope keeps it across connections: {seen}"
    );
}
