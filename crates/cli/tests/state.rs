//! ring0's own state is out of the model's reach: the state directory lies outside the workspace
//! by default, and the configuration, the lock file and everything in the state directory are
//! protected paths no tool reads, lists, writes or runs in; state files are private; a journal or
//! audit log replaced or truncated behind ring0's back is refused at start.

mod common;

use common::{peers, python, python_report, serve_http_command, start_http};
use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A workspace `ws/` and a private XDG state home `xdg/` beside it.
struct Env {
    _dir: tempfile::TempDir,
    ws: PathBuf,
    xdg: PathBuf,
}

impl Env {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ws = std::fs::canonicalize(dir.path()).unwrap().join("ws");
        let xdg = ws.with_file_name("xdg");
        std::fs::create_dir_all(&ws).unwrap();
        std::fs::create_dir_all(&xdg).unwrap();
        std::fs::write(ws.join("notes.txt"), "plain text\n").unwrap();
        Self { _dir: dir, ws, xdg }
    }

    /// `ring0 ARGS` in the workspace, state under the XDG state home (unless `ARGS` say).
    fn ring0(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_ring0"))
            .args(args)
            .current_dir(&self.ws)
            .env("XDG_STATE_HOME", &self.xdg)
            .env("HOME", self.xdg.join("home"))
            .env_remove("RING0_STATE_DIR")
            .output()
            .unwrap()
    }

    fn call(&self, state: &[&str], tool: &str, args: Value) -> Output {
        let args = args.to_string();
        let mut argv: Vec<&str> = state.to_vec();
        argv.extend(["call", tool, &args]);
        self.ring0(&argv)
    }

    /// The default state directory: the one directory under `xdg/ring0/`.
    fn default_state(&self) -> PathBuf {
        let base = self.xdg.join("ring0");
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(&base)
            .unwrap_or_else(|e| panic!("{}: {e}", base.display()))
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(dirs.len(), 1, "{dirs:?}");
        dirs.pop().unwrap()
    }
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The call failed with a `protected_path` refusal.
fn assert_protected(out: &Output, what: &str) {
    assert!(!out.status.success(), "{what}: {}", stdout(out));
    let text = stdout(out);
    let result: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("{what}: {text}"));
    assert_eq!(
        result["outcome"]["observation"]["structured"]["error"]["kind"], "protected_path",
        "{what}: {text}"
    );
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// A configuration granting reads and writes everywhere it can, and `shell` with approval.
const WIDE_CONFIG: &str = "defaults = false\n[paths]\nread = [\".\", \"/\"]\nwrite = [\".\", \"/\"]\n\n\
    [[grants]]\nname = \"shell\"\ntools = [\"shell\"]\nceiling = \"A2\"\napproval = true\n\n\
    [[grants]]\nname = \"all\"\ntools = [\"*\"]\nceiling = \"A2\"\n";

#[test]
fn the_default_state_directory_is_outside_the_workspace_and_private() {
    let env = Env::new();
    let out = env.call(&[], "read_file", json!({"path": "notes.txt"}));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!env.ws.join(".ring0").exists(), "no state in the workspace");
    let state = env.default_state();
    assert!(
        state
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("ws-"),
        "{}",
        state.display()
    );
    assert_eq!(mode(&state), 0o700);
    for dir in ["approvals", "jobs", "spill", "pinned"] {
        assert_eq!(mode(&state.join(dir)), 0o700, "{dir}");
    }
    for file in ["journal.db", "audit.jsonl", "cursor.key", "state.json"] {
        assert_eq!(mode(&state.join(file)), 0o600, "{file}");
    }
    // The journal subcommand finds it too.
    let out = env.ring0(&["journal", "ls"]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn a_state_dir_flag_and_the_config_key_choose_the_state_directory() {
    let env = Env::new();
    let flagged = env.xdg.join("flagged");
    let out = env.call(
        &["--state-dir", flagged.to_str().unwrap()],
        "read_file",
        json!({"path": "notes.txt"}),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(flagged.join("journal.db").exists());
    std::fs::write(
        env.ws.join("ring0.toml"),
        "defaults = false\n[workspace]\nstate_dir = \"../configured\"\n\n[[grants]]\nname = \"r\"\ntools = [\"read_file\"]\nceiling = \"A0\"\n",
    )
    .unwrap();
    let out = env.call(&[], "read_file", json!({"path": "notes.txt"}));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        env.ws
            .with_file_name("configured")
            .join("journal.db")
            .exists()
    );
    assert!(!env.xdg.join("ring0").exists());
}

#[test]
fn writes_to_the_config_lock_audit_journal_and_cursor_key_are_refused_and_change_nothing() {
    let env = Env::new();
    std::fs::write(env.ws.join("ring0.toml"), WIDE_CONFIG).unwrap();
    // Once for the state to exist.
    let out = env.call(&[], "read_file", json!({"path": "notes.txt"}));
    assert!(out.status.success(), "{}", stderr(&out));
    let state = env.default_state();
    let targets = [
        env.ws.join("ring0.toml"),
        env.ws.join("ring0.lock"),
        state.join("audit.jsonl"),
        state.join("journal.db"),
        state.join("cursor.key"),
        state.join("state.json"),
        state.join("jobs/new.json"),
    ];
    for target in &targets {
        let before = std::fs::read(target).ok();
        let out = env.call(
            &[],
            "write_file",
            json!({"path": target, "content": "x", "overwrite": true, "create_dirs": true}),
        );
        assert_protected(&out, &target.display().to_string());
        let after = std::fs::read(target).ok();
        match (&before, &after) {
            // The audit log only grows (the refused call's decision is appended to it).
            (Some(b), Some(a)) if target.ends_with("audit.jsonl") => {
                assert!(a.starts_with(b), "{}", target.display())
            }
            (Some(_), Some(a)) if target.ends_with("journal.db") => {
                assert!(a.starts_with(b"SQLite format 3\0"), "journal intact")
            }
            // ring0 itself keeps the manifest current.
            (Some(_), Some(a)) if target.ends_with("state.json") => {
                assert!(
                    serde_json::from_slice::<Value>(a).is_ok(),
                    "manifest intact"
                )
            }
            _ => assert_eq!(before, after, "{} changed", target.display()),
        }
    }
    assert_eq!(
        std::fs::read_to_string(env.ws.join("ring0.toml")).unwrap(),
        WIDE_CONFIG
    );
    // Relative to the workspace, and with `..`, the config is refused all the same.
    std::fs::create_dir(env.ws.join("sub")).unwrap();
    for path in ["ring0.toml", "./sub/../ring0.toml"] {
        let out = env.call(
            &[],
            "write_file",
            json!({"path": path, "content": "x", "overwrite": true}),
        );
        assert_protected(&out, path);
    }
    let out = env.ring0(&["journal", "ls"]);
    assert!(
        out.status.success(),
        "the journal still opens: {}",
        stderr(&out)
    );
}

#[test]
fn reading_the_cursor_key_is_refused_by_any_path() {
    let env = Env::new();
    std::fs::write(env.ws.join("ring0.toml"), WIDE_CONFIG).unwrap();
    // A state directory inside the workspace: reachable by every relative path trick.
    let flag = ["--state-dir", ".ring0"];
    let out = env.call(&flag, "read_file", json!({"path": "notes.txt"}));
    assert!(out.status.success(), "{}", stderr(&out));
    let key = env.ws.join(".ring0/cursor.key");
    std::os::unix::fs::symlink(&key, env.ws.join("key-link")).unwrap();
    std::os::unix::fs::symlink(".ring0", env.ws.join("state-link")).unwrap();
    std::fs::hard_link(&key, env.ws.join("key-hard")).unwrap();
    std::fs::create_dir(env.ws.join("sub")).unwrap();
    let abs = key.to_string_lossy().into_owned();
    for path in [
        ".ring0/cursor.key",
        abs.as_str(),
        "key-link",
        "state-link/cursor.key",
        "sub/../.ring0/cursor.key",
        "key-hard",
    ] {
        let out = env.call(&flag, "read_file", json!({"path": path}));
        assert_protected(&out, path);
    }
}

#[test]
fn listings_globs_and_searches_never_show_ring0s_files() {
    let env = Env::new();
    std::fs::write(env.ws.join("ring0.toml"), WIDE_CONFIG).unwrap();
    let flag = ["--state-dir", ".ring0"];
    let out = env.call(&flag, "read_file", json!({"path": "notes.txt"}));
    assert!(out.status.success(), "{}", stderr(&out));
    let out = env.call(&flag, "list_dir", json!({"hidden": true}));
    let listing = stdout(&out);
    assert!(listing.contains("notes.txt"), "{listing}");
    assert!(
        !listing.contains("ring0.toml") && !listing.contains(".ring0"),
        "{listing}"
    );
    let out = env.call(&flag, "glob", json!({"pattern": "**/*", "hidden": true}));
    let globbed = stdout(&out);
    assert!(globbed.contains("notes.txt"), "{globbed}");
    for name in ["ring0.toml", "cursor.key", "journal.db", "audit.jsonl"] {
        assert!(!globbed.contains(name), "{name}: {globbed}");
    }
    let out = env.call(
        &flag,
        "search",
        json!({"pattern": "grants|decision|plain", "hidden": true}),
    );
    let found = stdout(&out);
    assert!(found.contains("notes.txt"), "{found}");
    assert!(
        !found.contains("ring0.toml") && !found.contains("audit"),
        "{found}"
    );
}

#[test]
fn a_shell_cwd_in_the_state_directory_is_refused() {
    use std::io::BufRead;
    let env = Env::new();
    std::fs::write(env.ws.join("ring0.toml"), WIDE_CONFIG).unwrap();
    let out = env.call(&[], "read_file", json!({"path": "notes.txt"}));
    assert!(out.status.success(), "{}", stderr(&out));
    let state = env.default_state();
    let args = json!({"argv": ["touch", "made-by-shell"], "cwd": state.join("jobs")}).to_string();
    // The call is held for a person; approving it lets it reach the tool, which refuses.
    let mut child = Command::new(env!("CARGO_BIN_EXE_ring0"))
        .args(["call", "shell", &args])
        .current_dir(&env.ws)
        .env("XDG_STATE_HOME", &env.xdg)
        .env_remove("RING0_STATE_DIR")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr_pipe = child.stderr.take().unwrap();
    let id = std::io::BufReader::new(stderr_pipe)
        .lines()
        .map_while(Result::ok)
        .find_map(|line| {
            let rest = line.split("approval required [").nth(1)?;
            Some(rest.split(']').next()?.to_string())
        })
        .expect("the call is held for approval");
    let approved = env.ring0(&["approve", &id]);
    assert!(approved.status.success(), "{}", stderr(&approved));
    let out = child.wait_with_output().unwrap();
    assert_protected(&out, "shell cwd");
    assert!(!state.join("jobs/made-by-shell").exists());
}

#[test]
fn a_replaced_or_emptied_journal_is_refused_at_start() {
    let env = Env::new();
    let out = env.call(&[], "read_file", json!({"path": "notes.txt"}));
    assert!(out.status.success(), "{}", stderr(&out));
    let journal = env.default_state().join("journal.db");
    // Replaced by a copy of itself: another file.
    let copy = journal.with_extension("copy");
    std::fs::copy(&journal, &copy).unwrap();
    std::fs::rename(&copy, &journal).unwrap();
    let out = env.call(&[], "read_file", json!({"path": "notes.txt"}));
    assert!(!out.status.success());
    assert!(stderr(&out).contains("was replaced"), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("move the state directory"),
        "{}",
        stderr(&out)
    );
    // Emptied in place.
    let env = Env::new();
    let out = env.call(&[], "read_file", json!({"path": "notes.txt"}));
    assert!(out.status.success(), "{}", stderr(&out));
    let journal = env.default_state().join("journal.db");
    std::fs::write(&journal, b"").unwrap();
    let out = env.call(&[], "read_file", json!({"path": "notes.txt"}));
    assert!(!out.status.success());
    assert!(stderr(&out).contains("emptied"), "{}", stderr(&out));
    assert_eq!(
        std::fs::metadata(&journal).unwrap().len(),
        0,
        "not recreated"
    );
}

#[test]
fn a_truncated_or_missing_audit_log_is_refused_at_start() {
    let env = Env::new();
    for _ in 0..2 {
        let out = env.call(&[], "read_file", json!({"path": "notes.txt"}));
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let audit = env.default_state().join("audit.jsonl");
    let text = std::fs::read(&audit).unwrap();
    assert!(!text.is_empty());
    std::fs::write(&audit, &text[..text.len() / 2]).unwrap();
    let out = env.call(&[], "read_file", json!({"path": "notes.txt"}));
    assert!(!out.status.success());
    assert!(stderr(&out).contains("truncated"), "{}", stderr(&out));
    std::fs::remove_file(&audit).unwrap();
    let out = env.call(&[], "read_file", json!({"path": "notes.txt"}));
    assert!(!out.status.success());
    assert!(stderr(&out).contains("is gone"), "{}", stderr(&out));
    assert!(!audit.exists(), "never silently recreated");
}

#[test]
fn a_legacy_state_directory_in_the_workspace_is_kept_with_a_warning() {
    let env = Env::new();
    std::fs::create_dir(env.ws.join(".ring0")).unwrap();
    let out = env.call(&[], "read_file", json!({"path": "notes.txt"}));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("legacy state directory"),
        "{}",
        stderr(&out)
    );
    assert!(env.ws.join(".ring0/journal.db").exists());
    let out = env.call(&[], "read_file", json!({"path": ".ring0/cursor.key"}));
    assert_protected(&out, "legacy cursor key");
}

#[test]
fn over_serve_a_python_client_cannot_rewrite_the_config_or_read_the_key() {
    let Some(peers) = peers() else { return };
    let env = Env::new();
    std::fs::write(env.ws.join("ring0.toml"), WIDE_CONFIG).unwrap();
    let mut cmd = serve_http_command(&env.ws);
    cmd.env_remove("RING0_STATE_DIR")
        .env("XDG_STATE_HOME", &env.xdg);
    let server = start_http(cmd);
    let state = env.default_state();
    let calls = json!([
        ["write_file", {"path": "ring0.toml", "content": "[paths]\n", "overwrite": true}],
        ["read_file", {"path": state.join("cursor.key")}],
        ["write_file", {"path": state.join("audit.jsonl"), "content": "", "overwrite": true}],
        ["read_file", {"path": "notes.txt"}],
    ]);
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../mcp/tests/fixtures/py_client_calls.py");
    let seen = python_report(Command::new(python(&peers)).arg(script).args([
        &server.url(),
        "legacy",
        &calls.to_string(),
    ]));
    for i in 0..3 {
        let call = &seen["calls"][i];
        assert_eq!(call["is_error"], true, "{seen}");
        assert!(
            call.to_string().contains("protected_path"),
            "call {i}: {seen}"
        );
    }
    assert_eq!(seen["calls"][3]["is_error"], false, "{seen}");
    assert_eq!(
        std::fs::read_to_string(env.ws.join("ring0.toml")).unwrap(),
        WIDE_CONFIG
    );
    assert!(!std::fs::read(state.join("audit.jsonl")).unwrap().is_empty());
}
