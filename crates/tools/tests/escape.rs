//! The path-escape corpus: every attempt to reach outside the workspace through a tool must fail,
//! and no byte or name from outside may come back. Includes the published escape patterns of
//! MCP filesystem servers: a string-prefix bypass (`/tmp/ws-evil` when the root is `/tmp/ws`)
//! and symlinks pointing out — plus a symlink swapped between check and use, in a loop.

mod common;

use common::{Env, direct, workspace};
use serde_json::{Value, json};
use std::os::unix::fs::symlink;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

const SECRET: &str = "TOP-SECRET-OUTSIDE";
const EVIL_SECRET: &str = "TOP-SECRET-EVIL";
const OUTSIDE_ONLY_NAME: &str = "outside-only-name.txt";

/// A workspace with escape hatches planted in it, and the outside world next to it.
fn planted() -> Env {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let outside = root.join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("secret.txt"), SECRET).unwrap();
    std::fs::write(outside.join(OUTSIDE_ONLY_NAME), SECRET).unwrap();
    // The string-prefix neighbour: /…/ws-evil starts with /…/ws.
    let evil = root.join("ws-evil");
    std::fs::create_dir(&evil).unwrap();
    std::fs::write(evil.join("secret.txt"), EVIL_SECRET).unwrap();
    let ws = root.join("ws");
    std::fs::create_dir_all(ws.join("inside_dir")).unwrap();
    std::fs::write(ws.join("inside.txt"), "inside\n").unwrap();
    symlink("../outside", ws.join("link_out")).unwrap();
    symlink(&outside, ws.join("abs_link")).unwrap();
    symlink("../outside/secret.txt", ws.join("file_link")).unwrap();
    symlink("/proc/self/root", ws.join("proc_link")).unwrap();
    symlink("loop", ws.join("loop")).unwrap();
    symlink("chain2", ws.join("chain1")).unwrap();
    symlink("../outside", ws.join("chain2")).unwrap();
    symlink("inside_dir/../..", ws.join("dotdot_link")).unwrap();
    symlink("../../outside", ws.join("inside_dir/deep_link")).unwrap();
    Env::with_workspace(dir, ws)
}

fn outside_state(env: &Env) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for sub in ["outside", "ws-evil"] {
        let dir = env.dir.path().join(sub);
        let mut names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        for n in names {
            let content = std::fs::read_to_string(dir.join(&n)).unwrap_or_default();
            out.push((format!("{sub}/{n}"), content));
        }
    }
    out
}

fn attempts(env: &Env) -> Vec<(&'static str, &'static str, Value)> {
    let root = env.dir.path().to_string_lossy().into_owned();
    let ws = env.ws.to_string_lossy().into_owned();
    let long_path = "a/".repeat(2100);
    let long_name = "n".repeat(300);
    vec![
        (
            "parent traversal",
            "read_file",
            json!({"path": "../outside/secret.txt"}),
        ),
        (
            "absolute outside",
            "read_file",
            json!({"path": format!("{root}/outside/secret.txt")}),
        ),
        (
            "string-prefix bypass (absolute)",
            "read_file",
            json!({"path": format!("{root}/ws-evil/secret.txt")}),
        ),
        (
            "string-prefix bypass (relative)",
            "read_file",
            json!({"path": "../ws-evil/secret.txt"}),
        ),
        (
            "relative symlink to outside dir",
            "read_file",
            json!({"path": "link_out/secret.txt"}),
        ),
        (
            "absolute symlink to outside dir",
            "read_file",
            json!({"path": "abs_link/secret.txt"}),
        ),
        (
            "symlink to outside file",
            "read_file",
            json!({"path": "file_link"}),
        ),
        (
            "symlink to /proc/self/root",
            "read_file",
            json!({"path": format!("proc_link{root}/outside/secret.txt")}),
        ),
        (
            "/proc/self/root absolute",
            "read_file",
            json!({"path": format!("/proc/self/root{root}/outside/secret.txt")}),
        ),
        (
            "/proc/self/cwd",
            "read_file",
            json!({"path": "/proc/self/cwd/Cargo.toml"}),
        ),
        ("/etc/passwd", "read_file", json!({"path": "/etc/passwd"})),
        (
            "dotdot through a real dir",
            "read_file",
            json!({"path": "inside_dir/../../outside/secret.txt"}),
        ),
        (
            "leading ./..",
            "read_file",
            json!({"path": "./../outside/secret.txt"}),
        ),
        (
            "many dotdots",
            "read_file",
            json!({"path": "inside_dir/../../../../../../../../etc/passwd"}),
        ),
        (
            "NUL byte",
            "read_file",
            json!({"path": "inside.txt\u{0}../../outside/secret.txt"}),
        ),
        ("overlong path", "read_file", json!({"path": long_path})),
        ("overlong name", "read_file", json!({"path": long_name})),
        (
            "symlink chain",
            "read_file",
            json!({"path": "chain1/secret.txt"}),
        ),
        (
            "symlink to dotdot",
            "read_file",
            json!({"path": "dotdot_link/outside/secret.txt"}),
        ),
        (
            "nested symlink climbing out",
            "read_file",
            json!({"path": "inside_dir/deep_link/secret.txt"}),
        ),
        ("symlink loop", "read_file", json!({"path": "loop/x"})),
        ("the parent itself", "read_file", json!({"path": ".."})),
        ("filesystem root", "read_file", json!({"path": "/"})),
        (
            "double slash absolute",
            "read_file",
            json!({"path": format!("/{root}/outside/secret.txt")}),
        ),
        (
            "absolute workspace then dotdot",
            "read_file",
            json!({"path": format!("{ws}/../outside/secret.txt")}),
        ),
        (
            "absolute workspace then symlink",
            "read_file",
            json!({"path": format!("{ws}/link_out/secret.txt")}),
        ),
        (
            "url-encoded dots",
            "read_file",
            json!({"path": "%2e%2e/outside/secret.txt"}),
        ),
        (
            "backslash separators",
            "read_file",
            json!({"path": "..\\outside\\secret.txt"}),
        ),
        (
            "unicode division slash",
            "read_file",
            json!({"path": "..\u{2215}outside\u{2215}secret.txt"}),
        ),
        (
            "write via dotdot",
            "write_file",
            json!({"path": "../outside/pwned.txt", "content": "x"}),
        ),
        (
            "write via symlinked dir",
            "write_file",
            json!({"path": "link_out/pwned.txt", "content": "x"}),
        ),
        (
            "write via absolute symlink",
            "write_file",
            json!({"path": "abs_link/pwned.txt", "content": "x"}),
        ),
        (
            "write to string-prefix neighbour",
            "write_file",
            json!({"path": format!("{root}/ws-evil/pwned.txt"), "content": "x"}),
        ),
        (
            "overwrite through a file symlink",
            "write_file",
            json!({"path": "file_link", "content": "x", "overwrite": true}),
        ),
        (
            "write via /proc/self/root link",
            "write_file",
            json!({"path": format!("proc_link{root}/outside/pwned.txt"), "content": "x"}),
        ),
        (
            "write creating dirs via dotdot",
            "write_file",
            json!({"path": "inside_dir/../../outside/new/pwned.txt", "content": "x", "create_dirs": true}),
        ),
        (
            "write creating dirs via symlink",
            "write_file",
            json!({"path": "link_out/newdir/pwned.txt", "content": "x", "create_dirs": true}),
        ),
        ("list parent", "list_dir", json!({"path": "../outside"})),
        (
            "list symlinked dir",
            "list_dir",
            json!({"path": "link_out"}),
        ),
        (
            "list /proc/self/root",
            "list_dir",
            json!({"path": "/proc/self/root"}),
        ),
        (
            "list string-prefix neighbour",
            "list_dir",
            json!({"path": format!("{root}/ws-evil")}),
        ),
        (
            "glob under symlinked dir",
            "glob",
            json!({"path": "link_out", "pattern": "**"}),
        ),
        (
            "glob whole workspace",
            "glob",
            json!({"pattern": "**", "hidden": true}),
        ),
        (
            "search under symlinked dir",
            "search",
            json!({"path": "link_out", "pattern": "TOP"}),
        ),
        (
            "search whole workspace",
            "search",
            json!({"pattern": "TOP-SECRET", "hidden": true}),
        ),
        (
            "patch adds outside",
            "apply_patch",
            json!({"patch": "*** Begin Patch\n*** Add File: ../outside/pwned.txt\n+x\n*** End Patch\n"}),
        ),
        (
            "patch updates through symlink",
            "apply_patch",
            json!({"patch": "*** Begin Patch\n*** Update File: link_out/secret.txt\n@@\n-TOP-SECRET-OUTSIDE\n+pwned\n*** End Patch\n"}),
        ),
        (
            "patch deletes outside",
            "apply_patch",
            json!({"patch": "*** Begin Patch\n*** Delete File: ../outside/secret.txt\n*** End Patch\n"}),
        ),
        (
            "patch moves a file out",
            "apply_patch",
            json!({"patch": "*** Begin Patch\n*** Update File: inside.txt\n*** Move to: ../outside/moved.txt\n@@\n-inside\n+moved\n*** End Patch\n"}),
        ),
        (
            "shell cwd through symlink",
            "shell",
            json!({"argv": ["cat", "secret.txt"], "cwd": "link_out"}),
        ),
        (
            "shell cwd dotdot",
            "shell",
            json!({"argv": ["cat", "secret.txt"], "cwd": "../outside"}),
        ),
    ]
}

#[tokio::test]
async fn path_escape_corpus_has_zero_escapes() {
    let env = planted();
    let before = outside_state(&env);
    let cases = attempts(&env);
    assert!(cases.len() >= 40, "the corpus has {} attempts", cases.len());
    let mut escapes = Vec::new();
    let mut report = Vec::new();
    for (name, tool, args) in &cases {
        let (result, is_error) = env.call(tool, args.clone()).await;
        let shown = result.to_string();
        let leaked = shown.contains(SECRET)
            || shown.contains(EVIL_SECRET)
            || shown.contains(OUTSIDE_ONLY_NAME)
            || shown.contains("root:x:0:0");
        // Listings and searches may succeed, but only with what is inside the workspace.
        // Overwriting a symlink inside the workspace replaces the link itself, never its target.
        let may_succeed = (matches!(*tool, "glob" | "search") && !name.contains("symlinked"))
            || *name == "overwrite through a file symlink";
        if leaked || (!is_error && !may_succeed) {
            escapes.push(format!("{name}: {shown}"));
        }
        report.push(format!(
            "{:<40} {:<12} {}",
            name,
            tool,
            if is_error {
                common::failure(&result)
            } else {
                "ok (nothing from outside)".into()
            }
        ));
    }
    println!("{}", report.join("\n"));
    assert_eq!(
        outside_state(&env),
        before,
        "nothing outside the workspace changed"
    );
    assert!(
        escapes.is_empty(),
        "{} escapes:\n{}",
        escapes.len(),
        escapes.join("\n")
    );
    // The file-symlink overwrite replaced the link inside the workspace; its target is untouched.
    let link = std::fs::symlink_metadata(env.path("file_link")).unwrap();
    assert!(
        link.is_file(),
        "the link itself was replaced by a regular file"
    );
    assert_eq!(env.read("file_link").as_deref(), Some("x"));
}

#[tokio::test]
async fn escape_refusals_say_what_happened() {
    let env = planted();
    let (r, _) = env
        .call("read_file", json!({"path": "link_out/secret.txt"}))
        .await;
    assert!(common::failure(&r).contains("escapes its root"), "{r}");
    let (r, _) = env
        .call(
            "read_file",
            json!({"path": format!("{}/ws-evil/secret.txt", env.dir.path().display())}),
        )
        .await;
    assert!(common::failure(&r).contains("outside every root"), "{r}");
    let (r, _) = env.call("read_file", json!({"path": "a\u{0}b"})).await;
    assert!(common::failure(&r).contains("NUL"), "{r}");
}

/// Swaps `ws/racy` between a real directory and a symlink to outside as fast as it can, while
/// reads and writes go through `racy/…`: each one either sees the real directory or is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn symlink_swapped_between_check_and_use_never_escapes() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    std::fs::create_dir(root.join("outside")).unwrap();
    std::fs::write(root.join("outside/secret.txt"), SECRET).unwrap();
    let ws = root.join("ws");
    std::fs::create_dir_all(ws.join("racy")).unwrap();
    std::fs::write(ws.join("racy/secret.txt"), "BENIGN").unwrap();
    symlink("../outside", ws.join("racy_alt")).unwrap();
    let wsp = workspace(&ws, &root.join("state"));
    let read = ring0_tools::read_file_tool(wsp.clone());
    let cfg = common::config(&ws, &root.join("state"));
    let write = ring0_tools::builtin_tools(&cfg)
        .unwrap()
        .into_iter()
        .find(|(s, _)| s.name == "write_file")
        .unwrap()
        .1;

    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let stop = stop.clone();
        let ws = ws.clone();
        std::thread::spawn(move || {
            let mut swaps = 0u64;
            while !stop.load(Ordering::Relaxed) {
                rustix::fs::renameat_with(
                    rustix::fs::CWD,
                    ws.join("racy"),
                    rustix::fs::CWD,
                    ws.join("racy_alt"),
                    rustix::fs::RenameFlags::EXCHANGE,
                )
                .unwrap();
                swaps += 1;
            }
            swaps
        })
    };
    let (mut benign, mut refused) = (0u32, 0u32);
    for i in 0..3000 {
        match direct(&read, json!({"path": "racy/secret.txt"})).await {
            Ok(obs) => {
                assert!(!obs.text.contains(SECRET), "read escaped on iteration {i}");
                assert_eq!(obs.text, "BENIGN");
                benign += 1;
            }
            Err(_) => refused += 1,
        }
        let _ = direct(
            write.as_ref(),
            json!({"path": format!("racy/pwned-{i}.txt"), "content": "x", "overwrite": false, "create_dirs": false}),
        )
        .await;
        assert!(
            !root.join(format!("outside/pwned-{i}.txt")).exists(),
            "write escaped on iteration {i}"
        );
    }
    stop.store(true, Ordering::Relaxed);
    let swaps = swapper.join().unwrap();
    println!("swaps {swaps}, reads inside {benign}, refused {refused}");
    assert!(swaps > 100, "the race was exercised");
    let outside: Vec<_> = std::fs::read_dir(root.join("outside")).unwrap().collect();
    assert_eq!(outside.len(), 1, "nothing was written outside");
    assert!(Path::new(&root.join("outside/secret.txt")).exists());
}

#[tokio::test]
async fn symlinks_that_stay_inside_the_workspace_are_followed() {
    let env = Env::new();
    env.write("real/data.txt", "inside data");
    symlink("real", env.path("alias")).unwrap();
    let (r, is_error) = env
        .call("read_file", json!({"path": "alias/data.txt"}))
        .await;
    assert!(!is_error, "{r}");
    assert_eq!(common::text(&r), "inside data");
    let (r, is_error) = env.call("list_dir", json!({"path": "alias"})).await;
    assert!(!is_error, "{r}");
    assert_eq!(common::structured(&r)["entries"][0]["name"], "data.txt");
}
