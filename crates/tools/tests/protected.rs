//! ring0's own files — its state directory, configuration file and lock file — are out of every
//! tool's reach, whatever the roots grant, by whatever path: refused as `protected_path` when
//! named, left out of listings, globs and searches.

mod common;

use common::{Env, failure};
use ring0_tools::sandbox::ProtectedPaths;
use serde_json::{Value, json};

/// A workspace whose state directory (`.ring0`) lies inside it, with `ring0.toml` and
/// `ring0.lock` beside it: every protected path reachable by the roots.
fn env() -> Env {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let state = ws.join(".ring0");
    std::fs::create_dir_all(state.join("jobs")).unwrap();
    std::fs::write(state.join("cursor.key"), "secret-key-bytes").unwrap();
    std::fs::write(state.join("audit.jsonl"), "{\"decision\":\"allow\"}\n").unwrap();
    std::fs::write(ws.join("ring0.toml"), "# grants\n").unwrap();
    std::fs::write(ws.join("notes.txt"), "plain text\n").unwrap();
    let mut cfg = common::config(&ws, &state);
    cfg.protected = ProtectedPaths {
        files: vec![ws.join("ring0.toml"), ws.join("ring0.lock")],
        dirs: vec![state],
    };
    Env::with_config(dir, ws, &cfg)
}

/// The refusal's kind, from the failed call's structured observation.
fn kind(result: &Value) -> &str {
    result["outcome"]["observation"]["structured"]["error"]["kind"]
        .as_str()
        .unwrap_or_default()
}

fn assert_protected(result: &Value, is_error: bool) {
    assert!(is_error, "{result}");
    assert_eq!(kind(result), "protected_path", "{result}");
    assert!(failure(result).contains("ring0's own"), "{result}");
}

#[tokio::test]
async fn reading_the_cursor_key_is_refused() {
    let env = env();
    let (r, is_error) = env
        .call("read_file", json!({"path": ".ring0/cursor.key"}))
        .await;
    assert_protected(&r, is_error);
    assert!(!r.to_string().contains("secret-key-bytes"), "{r}");
}

#[tokio::test]
async fn reading_through_a_symlink_dotdot_or_hard_link_is_refused() {
    let env = env();
    std::os::unix::fs::symlink(".ring0/cursor.key", env.path("key-link")).unwrap();
    std::os::unix::fs::symlink(".ring0", env.path("state-link")).unwrap();
    std::fs::create_dir(env.path("sub")).unwrap();
    std::fs::hard_link(env.path(".ring0/cursor.key"), env.path("key-hard")).unwrap();
    std::fs::hard_link(env.path("ring0.toml"), env.path("config-hard")).unwrap();
    for path in [
        "key-link",
        "state-link/cursor.key",
        "sub/../.ring0/cursor.key",
        "./.ring0/../.ring0/audit.jsonl",
        "key-hard",
        "config-hard",
    ] {
        let (r, is_error) = env.call("read_file", json!({"path": path})).await;
        assert_protected(&r, is_error);
        assert!(!r.to_string().contains("secret-key-bytes"), "{path}: {r}");
    }
    // An absolute path names the same file.
    let abs = env.path(".ring0/cursor.key").to_string_lossy().into_owned();
    let (r, is_error) = env.call("read_file", json!({"path": abs})).await;
    assert_protected(&r, is_error);
}

#[tokio::test]
async fn writes_to_protected_paths_are_refused_and_change_nothing() {
    let env = env();
    let before_audit = env.read(".ring0/audit.jsonl");
    let cases = [
        json!({"path": "ring0.toml", "content": "[paths]\nread = [\"/\"]\n", "overwrite": true}),
        // Not there yet: the lock file's name is protected before it exists.
        json!({"path": "ring0.lock", "content": "pins"}),
        json!({"path": ".ring0/audit.jsonl", "content": "", "overwrite": true}),
        json!({"path": ".ring0/new.txt", "content": "x"}),
        json!({"path": ".ring0/made/deeper.txt", "content": "x", "create_dirs": true}),
        json!({"path": "state-link/x.txt", "content": "x"}),
    ];
    std::os::unix::fs::symlink(".ring0", env.path("state-link")).unwrap();
    for args in cases {
        let (r, is_error) = env.call("write_file", args.clone()).await;
        assert_protected(&r, is_error);
    }
    assert_eq!(env.read("ring0.toml").as_deref(), Some("# grants\n"));
    assert!(!env.path("ring0.lock").exists());
    assert_eq!(env.read(".ring0/audit.jsonl"), before_audit);
    assert!(!env.path(".ring0/new.txt").exists());
    assert!(
        !env.path(".ring0/made").exists(),
        "no directory was created"
    );
    assert!(!env.path(".ring0/x.txt").exists());
}

#[tokio::test]
async fn apply_patch_cannot_delete_move_or_edit_protected_files() {
    let env = env();
    let patches = [
        "*** Begin Patch\n*** Delete File: ring0.toml\n*** End Patch",
        "*** Begin Patch\n*** Update File: ring0.toml\n@@\n-# grants\n+# none\n*** End Patch",
        "*** Begin Patch\n*** Update File: notes.txt\n*** Move to: .ring0/notes.txt\n@@\n-plain text\n+moved\n*** End Patch",
        "*** Begin Patch\n*** Add File: ring0.lock\n+pins\n*** End Patch",
    ];
    for patch in patches {
        for dry_run in [true, false] {
            let (r, is_error) = env
                .call("apply_patch", json!({"patch": patch, "dry_run": dry_run}))
                .await;
            assert_protected(&r, is_error);
        }
    }
    assert_eq!(env.read("ring0.toml").as_deref(), Some("# grants\n"));
    assert_eq!(env.read("notes.txt").as_deref(), Some("plain text\n"));
    assert!(!env.path("ring0.lock").exists());
}

#[tokio::test]
async fn listings_globs_and_searches_leave_protected_paths_out() {
    let env = env();
    std::os::unix::fs::symlink(".ring0", env.path("state-link")).unwrap();
    std::fs::hard_link(env.path(".ring0/cursor.key"), env.path("key-hard")).unwrap();
    let (r, is_error) = env.call("list_dir", json!({"hidden": true})).await;
    assert!(!is_error, "{r}");
    let listing = r.to_string();
    assert!(listing.contains("notes.txt"), "{listing}");
    for hidden in ["ring0.toml", ".ring0", "state-link", "key-hard"] {
        assert!(!listing.contains(hidden), "{hidden} listed: {listing}");
    }
    let (r, _) = env
        .call("glob", json!({"pattern": "**/*", "hidden": true}))
        .await;
    let globbed = r.to_string();
    assert!(globbed.contains("notes.txt"), "{globbed}");
    for hidden in ["ring0.toml", "cursor.key", "audit.jsonl", "key-hard"] {
        assert!(!globbed.contains(hidden), "{hidden} globbed: {globbed}");
    }
    let (r, _) = env
        .call(
            "search",
            json!({"pattern": "secret|grants|decision|plain", "hidden": true}),
        )
        .await;
    let found = r.to_string();
    assert!(found.contains("notes.txt"), "{found}");
    for hidden in ["secret-key-bytes", "# grants", "decision"] {
        assert!(!found.contains(hidden), "{hidden} found: {found}");
    }
    // Listing the state directory itself is refused.
    let (r, is_error) = env.call("list_dir", json!({"path": ".ring0"})).await;
    assert_protected(&r, is_error);
}

#[tokio::test]
async fn a_shell_cwd_in_the_state_directory_is_refused() {
    let env = env();
    let (r, is_error) = env
        .call("shell", json!({"argv": ["true"], "cwd": ".ring0/jobs"}))
        .await;
    assert_protected(&r, is_error);
}

#[tokio::test]
async fn ordinary_files_stay_readable_and_writable() {
    let env = env();
    let (r, is_error) = env.call("read_file", json!({"path": "notes.txt"})).await;
    assert!(!is_error, "{r}");
    std::fs::hard_link(env.path("notes.txt"), env.path("notes-hard")).unwrap();
    let (r, is_error) = env.call("read_file", json!({"path": "notes-hard"})).await;
    assert!(!is_error, "a hard link to an ordinary file is fine: {r}");
    let (r, is_error) = env
        .call(
            "write_file",
            json!({"path": "new/dir/file.txt", "content": "ok", "create_dirs": true}),
        )
        .await;
    assert!(!is_error, "{r}");
    assert_eq!(env.read("new/dir/file.txt").as_deref(), Some("ok"));
}
