//! `ring0.toml` says what it does: a file's grants merge with the defaults, every tool hidden
//! and every grant matching nothing is reported at start, a rule-limited `shell` runs without
//! approval only through an `unattended` grant, `[shell] authority` cannot undercut its effect,
//! `ring0 init` writes a file that loads, and every example in `docs/config.md` passes
//! `ring0 config check`.

mod common;

use common::*;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn ring0_in(dir: &Path, args: &[&str]) -> Output {
    ring0_command_in(dir)
        .args(args)
        .env("RING0_STATE_DIR", dir.join(".ring0"))
        .output()
        .expect("ring0")
}

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../mcp/tests/fixtures/stdio_server.py")
}

/// The names `ring0 serve` (stdio, in `dir`) lists to a client, and what it said on stderr.
fn listed_tools(dir: &Path) -> (Vec<String>, String) {
    let stderr_path = dir.join("serve.stderr");
    let mut cmd = Command::new(ring0());
    cmd.arg("serve")
        .current_dir(dir)
        .env("HOME", test_home())
        .env("RING0_STATE_DIR", dir.join(".ring0"))
        .stderr(std::fs::File::create(&stderr_path).unwrap());
    let mut client = StdioClient::initialized(cmd, "2025-06-18");
    let list = client.request("tools/list", json!({}));
    let _ = client.child.kill();
    let _ = client.child.wait();
    let names = list["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{list}"))
        .iter()
        .filter_map(|t| t["name"].as_str().map(str::to_string))
        .collect();
    (names, std::fs::read_to_string(stderr_path).unwrap())
}

fn upstream_table() -> String {
    format!(
        "[[upstreams]]\nalias = \"fx\"\ncommand = \"python3\"\nargs = [{:?}]\nenv = [\"PATH\"]\n",
        fixture().display().to_string()
    )
}

// ---- grants merge with the defaults ----

#[test]
fn a_file_with_only_upstreams_keeps_the_default_grants() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ring0.toml"), upstream_table()).unwrap();
    let (names, stderr) = listed_tools(dir.path());
    for tool in ["read_file", "write_file", "shell", "job_wait"] {
        assert!(
            names.contains(&tool.to_string()),
            "{tool}: {names:?}\n{stderr}"
        );
    }
    assert!(
        names.iter().any(|n| n.starts_with("fx__")),
        "the upstream's tools, held by the default grant: {names:?}\n{stderr}"
    );
    assert!(stderr.contains("(default)"), "{stderr}");
}

#[test]
fn defaults_false_keeps_only_the_files_grants() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("ring0.toml"),
        "defaults = false\n[[grants]]\nname = \"read\"\ntools = [\"read_file\"]\nceiling = \"A0\"\n",
    )
    .unwrap();
    let (names, stderr) = listed_tools(dir.path());
    assert_eq!(names, ["read_file"], "{stderr}");
}

#[test]
fn a_file_grant_decides_before_the_default_of_the_same_tool_and_replaces_one_of_its_name() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("ring0.toml"),
        "[[grants]]\nname = \"shell\"\ntools = [\"read_file\"]\nceiling = \"A0\"\n",
    )
    .unwrap();
    let out = ring0_in(dir.path(), &["config", "check"]);
    let report = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // The file's grant decides for read_file before the default workspace grant does; it
    // replaces the default grant of its name, so job_send_input falls to "held".
    assert!(
        report.contains("read_file A0: listed, grant shell"),
        "{report}"
    );
    assert!(
        report.contains("shell A1: listed, grant workspace"),
        "{report}"
    );
    assert!(
        report.contains("job_send_input A2: listed, grant held"),
        "{report}"
    );
    assert!(
        report.contains("defaults: on (2 default grant(s) added)"),
        "{report}"
    );
}

// ---- the start report ----

#[test]
fn a_tool_a_grant_hides_and_a_grant_matching_nothing_are_reported_at_start() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("ring0.toml"),
        // Outside the sandbox shell is A2: rules alone do not let it run unattended.
        "[sandbox]\ntools = { shell = \"off\" }\n\n\
         [[grants]]\nname = \"limited\"\ntools = [\"shell\"]\nceiling = \"A2\"\n\
         rules = [\"args.argv[0] == 'ls'\"]\n\n\
         [[grants]]\nname = \"typo\"\ntools = [\"raed_file\"]\nceiling = \"A0\"\n",
    )
    .unwrap();
    let (names, stderr) = listed_tools(dir.path());
    assert!(!names.contains(&"shell".to_string()), "{names:?}");
    assert!(
        stderr.contains("not listed: shell:") && stderr.contains("set unattended"),
        "{stderr}"
    );
    assert!(
        stderr.contains("grant \"typo\" matches no tool"),
        "{stderr}"
    );
}

// ---- a rule-limited shell without approval ----

#[test]
fn an_unattended_grant_runs_the_commands_its_rules_allow_and_refuses_others() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("ring0.toml"),
        "[[grants]]\nname = \"build\"\ntools = [\"shell\"]\nceiling = \"A2\"\n\
         rules = [\"args.argv[0] == 'echo'\"]\nunattended = true\n",
    )
    .unwrap();
    let ok = ring0_in(
        dir.path(),
        &["call", "shell", r#"{"argv":["echo","ran unattended"]}"#],
    );
    assert!(ok.status.success(), "{}", text(&ok.stderr));
    assert!(text(&ok.stdout).contains("ran unattended"));
    assert!(!text(&ok.stderr).contains("approval required"));
    let refused = ring0_in(
        dir.path(),
        &["call", "shell", r#"{"argv":["touch","made"]}"#],
    );
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        text(&refused.stdout).contains("policy_denied"),
        "{}",
        text(&refused.stdout)
    );
    assert!(!dir.path().join("made").exists());
}

/// `ring0 config check` of a `ring0.toml` holding `toml`, which must exit 1; its output.
fn config_check_refusing(toml: &str) -> Output {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ring0.toml"), toml).unwrap();
    let out = ring0_in(dir.path(), &["config", "check"]);
    assert_eq!(out.status.code(), Some(1));
    out
}

#[test]
fn unattended_without_rules_is_refused_at_load() {
    let out = config_check_refusing(
        "[[grants]]\nname = \"sh\"\ntools = [\"shell\"]\nceiling = \"A2\"\nunattended = true\n",
    );
    assert!(
        text(&out.stderr).contains("grants[0].unattended"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn shell_authority_below_its_effect_is_refused_at_load() {
    let dir = tempfile::tempdir().unwrap();
    for level in ["A0", "A1"] {
        std::fs::write(
            dir.path().join("ring0.toml"),
            format!("[shell]\nauthority = \"{level}\"\n"),
        )
        .unwrap();
        for args in [&["config", "check"][..], &["serve"][..]] {
            let out = ring0_in(dir.path(), args);
            assert_eq!(out.status.code(), Some(1), "{args:?}");
            let stderr = text(&out.stderr);
            assert!(
                stderr.contains("shell.authority") && stderr.contains("unattended"),
                "{stderr}"
            );
        }
    }
}

// ---- ring0 config check ----

#[test]
fn config_check_prints_the_resolved_config_grants_and_catalog() {
    let dir = tempfile::tempdir().unwrap();
    let out = ring0_in(dir.path(), &["config", "check"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report = text(&out.stdout);
    for line in [
        "config: embedded defaults",
        "workspace: ",
        "shell: authority A2",
        "workspace [read_file",
        "read_file A0: listed, grant workspace",
        "shell A1: listed, grant workspace",
        "job_send_input A2: listed, grant shell, held for approval",
        "ok: no warnings",
    ] {
        assert!(report.contains(line), "{line}:\n{report}");
    }
    assert!(
        !dir.path().join(".ring0").exists(),
        "a check creates no state"
    );
}

#[test]
fn config_check_of_an_invalid_file_fails_with_the_key() {
    let out = config_check_refusing("[limits]\nsesion_rate = \"1/s\"\n");
    assert!(
        text(&out.stderr).contains("limits.sesion_rate"),
        "{}",
        text(&out.stderr)
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn every_example_in_the_config_docs_passes_config_check() {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/config.md"))
            .unwrap();
    let blocks = fenced(&doc, "toml");
    assert!(blocks.len() >= 6, "{} examples", blocks.len());
    for (i, block) in blocks.iter().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("example.toml");
        // The docs' examples name a home of `/home/me`; here it is a directory that exists.
        let home = dir.path().join("home-me");
        for sub in [".cargo", ".rustup"] {
            std::fs::create_dir_all(home.join(sub)).unwrap();
        }
        let block = block.replace("/home/me", &home.display().to_string());
        std::fs::write(&file, &block).unwrap();
        let out = ring0_in(dir.path(), &["config", "check", "--config", "example.toml"]);
        assert!(
            out.status.success(),
            "example {i} of docs/config.md:\n{block}\n{}",
            text(&out.stderr)
        );
    }
}

// ---- ring0 init ----

fn client_files(ws: &Path, home: &Path) {
    std::fs::write(
        ws.join(".mcp.json"),
        r#"{"mcpServers": {"github": {"type": "http", "url": "https://api.example.com/mcp",
            "headers": {"Authorization": "Bearer SECRET-VALUE-1"}}}}"#,
    )
    .unwrap();
    std::fs::create_dir_all(ws.join(".vscode")).unwrap();
    std::fs::write(
        ws.join(".vscode/mcp.json"),
        "{\n  // VS Code allows comments\n  \"servers\": {\"fs\": {\"type\": \"stdio\", \"command\": \"npx\",\n    \"args\": [\"-y\", \"@modelcontextprotocol/server-filesystem\", \".\"]}},\n  \"inputs\": []\n}\n",
    )
    .unwrap();
    let desktop = home.join(".config/Claude");
    std::fs::create_dir_all(&desktop).unwrap();
    std::fs::write(
        desktop.join("claude_desktop_config.json"),
        r#"{"mcpServers": {"my db": {"command": "db-mcp", "args": ["--ro"],
            "env": {"DB_PASSWORD": "SECRET-VALUE-2"}},
            "self": {"command": "/usr/local/bin/ring0", "args": ["serve"]}}}"#,
    )
    .unwrap();
}

fn init_in(ws: &Path, home: &Path, args: &[&str]) -> Output {
    Command::new(ring0())
        .arg("init")
        .args(args)
        .current_dir(ws)
        .env("HOME", home)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn init_writes_a_file_that_loads_with_found_servers_commented_out_and_no_secrets() {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    client_files(ws.path(), home.path());
    let out = init_in(ws.path(), home.path(), &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("found 3 MCP server(s)"),
        "{}",
        text(&out.stdout)
    );
    let written = std::fs::read_to_string(ws.path().join("ring0.toml")).unwrap();
    assert!(
        !written.contains("SECRET-VALUE"),
        "no value is copied:\n{written}"
    );
    assert!(
        !written.contains("\n[[upstreams]]"),
        "upstreams stay commented out"
    );
    for line in [
        "# alias = \"github\"",
        "# url = \"https://api.example.com/mcp\"",
        "# headers_env = { \"Authorization\" = \"AUTHORIZATION\" }",
        "# alias = \"fs\"",
        "# alias = \"my_db\"",
        "# env_from_env = { \"DB_PASSWORD\" = \"DB_PASSWORD\" }",
    ] {
        assert!(written.contains(line), "{line}:\n{written}");
    }
    assert!(
        !written.contains("alias = \"self\""),
        "ring0 itself is not an upstream"
    );
    let check = ring0_in(ws.path(), &["config", "check"]);
    assert!(check.status.success(), "{}", text(&check.stderr));
    assert!(
        text(&check.stdout).contains("ring0.toml"),
        "{}",
        text(&check.stdout)
    );

    // Uncommented, the found servers load too.
    let uncommented: String = written
        .lines()
        .map(|l| {
            let is_upstream_line = l.starts_with("# [[upstreams]]")
                || [
                    "alias",
                    "command",
                    "args",
                    "env",
                    "url",
                    "headers_env",
                    "env_from_env",
                ]
                .iter()
                .any(|k| l.starts_with(&format!("# {k} ")));
            if is_upstream_line { &l[2..] } else { l }
        })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(ws.path().join("ring0.toml"), &uncommented).unwrap();
    let check = ring0_in(ws.path(), &["config", "check"]);
    assert!(
        check.status.success(),
        "{uncommented}\n{}",
        text(&check.stderr)
    );
    for alias in [
        "github: http:",
        "fs: stdio: npx",
        "my_db: stdio: db-mcp --ro",
    ] {
        assert!(
            text(&check.stdout).contains(alias),
            "{alias}: {}",
            text(&check.stdout)
        );
    }
}

#[test]
fn init_refuses_to_replace_a_file_unless_forced() {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("ring0.toml"), "# mine\n").unwrap();
    let out = init_in(ws.path(), home.path(), &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("--force"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(ws.path().join("ring0.toml")).unwrap(),
        "# mine\n"
    );
    let out = init_in(ws.path(), home.path(), &["--force"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let written = std::fs::read_to_string(ws.path().join("ring0.toml")).unwrap();
    assert!(written.contains("[workspace]"));
    assert!(written.contains("None were found"), "{written}");
}
