//! Cut output kept whole and read back, as a model and a person see it through the `ring0`
//! binary: a `shell` command's 200 KB with an error line in the middle, found through the
//! truncation notice and `read_spill`; the handle refused to another session; and structured
//! content over a tool's budget that the Python MCP SDK client (which validates it against the
//! tool's `outputSchema`) receives without raising.

use serde_json::Value;
use std::path::Path;
use std::process::Command;

#[path = "common/mod.rs"]
mod common;

const ERROR_LINE: &str = "gen.c:12:5: error: expected ';' before 'return'";

/// About 200 KB on stdout: 2,000 lines of 100 bytes, the compiler error after line 1,000.
const GEN_SH: &str = r#"i=0
pad=$(printf '%080d' 0)
while [ $i -lt 2000 ]; do
  printf 'line %05d %s\n' "$i" "$pad"
  if [ $i -eq 999 ]; then
    echo "gen.c:12:5: error: expected ';' before 'return'"
  fi
  i=$((i+1))
done
"#;

fn fixture(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

#[test]
fn a_cut_shell_output_is_found_again_with_read_spill_and_only_by_its_session() {
    let Some(peers) = common::peers() else {
        return;
    };
    // The embedded default grants: `shell` held for approval, `read_spill` in the workspace grant.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("gen.sh"), GEN_SH).unwrap();
    let server = common::start_http(common::serve_http_command(dir.path()));
    let seen = common::python_report(
        Command::new(common::python(&peers))
            .arg(fixture("py_client_spill.py"))
            .arg(server.url()),
    );
    assert_eq!(seen["listed"], true, "read_spill is listed: {seen}");
    let shell = &seen["shell"];
    assert_eq!(shell["is_error"], false, "{seen}");
    assert!(
        shell["bytes"].as_u64().unwrap() < 100_000,
        "the output was cut: {seen}"
    );
    assert_eq!(
        shell["names_read_spill"], true,
        "the notice names the real tool: {seen}"
    );
    assert_eq!(
        shell["error_line_in_text"], true,
        "the error line from the omitted middle is in the text the client shows: {seen}"
    );
    assert_eq!(seen["handles"].as_array().unwrap().len(), 1, "{seen}");
    assert!(
        seen["found"]["offset"].as_u64().is_some(),
        "read_spill pages reach the error line: {seen}"
    );
    assert_eq!(
        seen["line_1001"].as_str().unwrap(),
        format!("{ERROR_LINE}\n"),
        "a line range finds it directly: {seen}"
    );
    let b = &seen["b"];
    assert_eq!(
        b["is_error"], true,
        "another session cannot read it: {seen}"
    );
    let b_text = b["text"].as_str().unwrap();
    assert!(b_text.contains("not known to this session"), "{seen}");
    assert!(!b_text.contains("line 0"), "no byte of it leaks: {seen}");
}

#[test]
fn structured_content_over_budget_never_makes_the_python_client_raise() {
    let Some(peers) = common::peers() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let transport = format!(
        "command = \"python3\"\nargs = [{:?}]\nenv = [\"PATH\"]\n",
        fixture("spill_upstream.py").display().to_string()
    );
    let config = common::one_upstream_config(
        "reports",
        r#"["up__*", "read_spill"]"#,
        "A0",
        "up",
        &transport,
        "",
    );
    std::fs::write(dir.path().join("ring0.toml"), config).unwrap();
    let seen = common::python_report(
        Command::new(common::python(&peers))
            .arg(fixture("py_client_spill_structured.py"))
            .arg(common::ring0())
            .arg(dir.path()),
    );
    let strict = &seen["up__strict_report"];
    assert_eq!(strict["raised"], Value::Null, "{seen}");
    assert_eq!(
        strict["is_error"], true,
        "a stand-in the schema refuses is not sent: {seen}"
    );
    assert_eq!(strict["structured"], Value::Null, "{seen}");
    let strict_text = strict["text"].as_str().unwrap();
    assert!(strict_text.contains("outputSchema"), "it says why: {seen}");
    assert!(strict_text.contains("read_spill"), "{seen}");
    let loose = &seen["up__loose_report"];
    assert_eq!(loose["raised"], Value::Null, "{seen}");
    assert_eq!(loose["is_error"], false, "{seen}");
    assert!(
        loose["structured"]["spilled"]
            .as_str()
            .is_some_and(|h| h.starts_with("sha256:")),
        "a stand-in the schema accepts is sent: {seen}"
    );
    let page = &seen["page"];
    assert_eq!(page["is_error"], false, "{seen}");
    let body: Value = serde_json::from_str(page["text"].as_str().unwrap()).unwrap();
    assert!(
        body["text"].as_str().unwrap().starts_with("{\"rows\":[{"),
        "the server's value is kept whole: {seen}"
    );
}
