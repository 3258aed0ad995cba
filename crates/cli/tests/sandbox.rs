//! The OS sandbox, as a user meets it: `ring0 call shell` under a grant that allows a shell, and a
//! stdio upstream server (started by `ring0 serve`) that runs whatever its tool is given. Each
//! escape is a named test: it must be blocked or reaped, leave everything outside the workspace
//! as it was, and leave no process behind (checked in /proc, polled up to a deadline).

mod common;

use common::{StdioClient, hiding_tree, hiding_tree_then, live_processes, marked_by_argument};

use serde_json::{Value, json};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// How long a test waits for processes of a run to disappear from /proc.
const SURVIVOR_WAIT: Duration = Duration::from_secs(20);
/// The variable each run carries so the test can find its processes in /proc.
const MARK_ENV: &str = "RING0_SANDBOX_TEST_MARK";

const SSH_SECRET: &str = "SSH-PRIVATE-KEY-MARKER";
const SIBLING_SECRET: &str = "SIBLING-SECRET-MARKER";
const CONFIG_MARKER: &str = "CONFIG-MARKER-7f3a";

/// A workspace with ring0's config and state inside it, a sibling directory, and a home with
/// an SSH key, all in one temporary directory.
struct Scene {
    _root: tempfile::TempDir,
    root: PathBuf,
    ws: PathBuf,
    sibling: PathBuf,
    home: PathBuf,
    mark: String,
}

impl Scene {
    fn new() -> Self {
        Self::with_config("")
    }

    fn with_config(extra: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let ws = root.join("ws");
        let sibling = root.join("sibling");
        let home = root.join("home");
        std::fs::create_dir_all(ws.join(".git/hooks")).unwrap();
        std::fs::create_dir_all(&sibling).unwrap();
        std::fs::create_dir_all(home.join(".ssh")).unwrap();
        std::fs::write(home.join(".ssh/id_ed25519"), SSH_SECRET).unwrap();
        std::fs::write(sibling.join("secret.txt"), SIBLING_SECRET).unwrap();
        std::fs::write(ws.join(".git/hooks/pre-commit"), "#!/bin/sh\nexit 0\n").unwrap();
        std::fs::write(
            ws.join("ring0.toml"),
            format!(
                "# {CONFIG_MARKER}\n[workspace]\nstate_dir = \".ring0\"\n\n\
                 [[grants]]\nname = \"contained\"\ntools = [\"shell\", \"job_*\"]\n\
                 ceiling = \"A1\"\nshell = true\n{extra}"
            ),
        )
        .unwrap();
        Self {
            _root: dir,
            root,
            ws,
            sibling,
            home,
            mark: uuid(),
        }
    }

    fn ring0(&self) -> Command {
        let mut cmd = Command::new(common::ring0());
        cmd.current_dir(&self.ws).env("HOME", &self.home);
        cmd
    }

    /// Runs `script` through the `shell` tool; returns the receipt.
    fn shell(&self, script: &str) -> Value {
        self.shell_with(json!({"command": script, "timeout_ms": 30_000}))
    }

    fn shell_with(&self, mut args: Value) -> Value {
        args["env"] = json!({ MARK_ENV: self.mark });
        let out = self
            .ring0()
            .args(["call", "shell", &args.to_string()])
            .output()
            .unwrap();
        receipt(&out)
    }

    /// Everything outside the workspace, as (path, contents).
    fn outside(&self) -> Vec<(PathBuf, Vec<u8>)> {
        let mut seen = Vec::new();
        let mut stack = vec![self.root.clone()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap().flatten() {
                let path = entry.path();
                if path.starts_with(&self.ws) {
                    continue;
                }
                let meta = std::fs::symlink_metadata(&path).unwrap();
                if meta.is_dir() {
                    stack.push(path.clone());
                    seen.push((path, Vec::new()));
                } else {
                    seen.push((path.clone(), std::fs::read(&path).unwrap_or_default()));
                }
            }
        }
        seen.sort();
        seen
    }

    /// Runs `script` and checks the two things every escape must leave true: nothing outside
    /// changed, and no process of the run is left.
    fn contained(&self, script: &str) -> Value {
        let before = self.outside();
        let receipt = self.shell(script);
        assert_eq!(
            before,
            self.outside(),
            "something outside the workspace changed"
        );
        assert_no_survivors(&self.mark);
        receipt
    }
}

fn uuid() -> String {
    format!("{:032x}", rand_u128())
}

fn rand_u128() -> u128 {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .unwrap();
    u128::from_le_bytes(bytes)
}

fn receipt(out: &Output) -> Value {
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {text}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// What the command printed, stdout and stderr.
fn text(receipt: &Value) -> String {
    receipt["outcome"]["observation"]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn assert_sandbox_denied(receipt: &Value) {
    let message = receipt["outcome"]["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("sandbox_denied"),
        "expected sandbox_denied, got {receipt:#}"
    );
    assert_eq!(
        receipt["outcome"]["observation"]["structured"]["error"],
        "sandbox_denied"
    );
}

fn assert_never_shows(receipt: &Value, secret: &str) {
    assert!(
        !receipt.to_string().contains(secret),
        "{secret} leaked: {receipt:#}"
    );
}

/// Pids of live processes whose environment carries `mark`.
fn marked(mark: &str) -> Vec<i32> {
    let needle = format!("{MARK_ENV}={mark}");
    live_processes(|proc| {
        std::fs::read(proc.join("environ"))
            .is_ok_and(|environ| environ.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()))
    })
}

fn assert_no_survivors(mark: &str) {
    let deadline = Instant::now() + SURVIVOR_WAIT;
    loop {
        let left = marked(mark);
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "processes of the run survive: {left:?}"
        );
        std::thread::yield_now();
    }
}

// ---------------------------------------------------------------------------------------------
// Reads

#[test]
fn reading_an_ssh_key_in_the_home_directory_is_denied() {
    let s = Scene::new();
    let r = s.contained(&format!(
        "cat {}/.ssh/id_ed25519; cat ~/.ssh/id_ed25519",
        s.home.display()
    ));
    assert_sandbox_denied(&r);
    assert_never_shows(&r, SSH_SECRET);
}

#[test]
fn reading_etc_shadow_is_denied() {
    let s = Scene::new();
    let r = s.contained("cat /etc/shadow");
    assert_sandbox_denied(&r);
    assert!(!text(&r).contains("root:"), "{r:#}");
}

#[test]
fn reading_a_sibling_directory_of_the_workspace_is_denied() {
    let s = Scene::new();
    let r = s.contained("ls ../sibling; cat ../sibling/secret.txt");
    assert_sandbox_denied(&r);
    assert_never_shows(&r, SIBLING_SECRET);
}

#[test]
fn reading_ring0_config_is_denied() {
    let s = Scene::new();
    let r = s.contained("cat ring0.toml");
    assert_sandbox_denied(&r);
    assert_never_shows(&r, CONFIG_MARKER);
}

#[test]
fn reading_ring0_state_is_denied() {
    let s = Scene::new();
    let r = s.contained("ls -a .ring0; cat .ring0/*");
    assert_sandbox_denied(&r);
    assert!(!text(&r).contains("journal"), "{r:#}");
}

// ---------------------------------------------------------------------------------------------
// Writes outside the workspace

fn assert_write_blocked(s: &Scene, script: &str) {
    let r = s.contained(script);
    assert_sandbox_denied(&r);
}

#[test]
fn writing_outside_by_absolute_path_is_denied() {
    let s = Scene::new();
    assert_write_blocked(&s, &format!("echo x > {}/new", s.sibling.display()));
}

#[test]
fn writing_outside_through_dot_dot_is_denied() {
    let s = Scene::new();
    assert_write_blocked(&s, "echo x > ../sibling/new; echo x > ../new");
}

#[test]
fn writing_outside_through_a_symlink_is_denied() {
    let s = Scene::new();
    assert_write_blocked(
        &s,
        &format!(
            "ln -s {}/secret.txt link && echo x > link",
            s.sibling.display()
        ),
    );
}

#[test]
fn writing_outside_through_a_hard_link_is_denied() {
    let s = Scene::new();
    assert_write_blocked(
        &s,
        &format!(
            "ln {}/secret.txt hard && echo x >> hard",
            s.sibling.display()
        ),
    );
}

#[test]
fn writing_outside_through_proc_self_root_is_denied() {
    let s = Scene::new();
    assert_write_blocked(
        &s,
        &format!("echo x > /proc/self/root{}/new", s.sibling.display()),
    );
}

#[test]
fn writing_outside_through_proc_self_cwd_is_denied() {
    let s = Scene::new();
    assert_write_blocked(&s, "echo x > /proc/self/cwd/../sibling/new");
}

#[test]
fn writing_ring0_config_and_git_hooks_is_denied() {
    let s = Scene::new();
    let config = std::fs::read(s.ws.join("ring0.toml")).unwrap();
    let hook = std::fs::read(s.ws.join(".git/hooks/pre-commit")).unwrap();
    let r = s.contained(
        "echo x >> ring0.toml; rm -f ring0.toml; echo x > .git/hooks/pre-commit; \
         echo x > .git/hooks/post-checkout; mkdir -p .ring0/x",
    );
    assert_sandbox_denied(&r);
    assert_eq!(std::fs::read(s.ws.join("ring0.toml")).unwrap(), config);
    assert_eq!(
        std::fs::read(s.ws.join(".git/hooks/pre-commit")).unwrap(),
        hook
    );
    assert!(!s.ws.join(".git/hooks/post-checkout").exists());
    assert!(!s.ws.join(".ring0/x").exists());
}

// ---------------------------------------------------------------------------------------------
// Network

#[test]
fn connecting_to_a_loopback_port_outside_is_refused() {
    let s = Scene::new();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let r = s.contained(&format!(
        "python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 5)\""
    ));
    assert!(text(&r).contains("ConnectionRefusedError"), "{r:#}");
    assert!(
        listener.accept().is_err(),
        "the listener outside was reached"
    );
}

#[test]
fn resolving_a_name_fails() {
    let s = Scene::new();
    let r = s.contained("getent hosts example.com; echo status=$?");
    assert!(text(&r).contains("status=2"), "{r:#}");
}

#[test]
fn opening_a_raw_socket_is_denied() {
    let s = Scene::new();
    let r = s.contained(
        "python3 -c \"import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)\"",
    );
    assert_sandbox_denied(&r);
}

// ---------------------------------------------------------------------------------------------
// System calls

#[test]
fn ptrace_of_a_sibling_process_is_denied() {
    let s = Scene::new();
    let r = s.contained(
        "sleep 30 & python3 -c \"import ctypes,os,sys; l=ctypes.CDLL(None, use_errno=True); \
         r=l.ptrace(16, $!, 0, 0); print('ptrace', r, os.strerror(ctypes.get_errno())); sys.exit(r != 0)\"",
    );
    assert!(
        text(&r).contains("ptrace -1 Operation not permitted"),
        "{r:#}"
    );
    assert_sandbox_denied(&r);
}

#[test]
fn mount_is_denied() {
    let s = Scene::new();
    let r = s.contained("mkdir -p m && mount -t tmpfs none m");
    assert!(text(&r).contains("ermission denied") || text(&r).contains("not permitted"));
}

#[test]
fn unshare_is_denied() {
    let s = Scene::new();
    let r = s.contained("unshare -r -n true");
    assert_sandbox_denied(&r);
}

// ---------------------------------------------------------------------------------------------
// Processes

#[test]
fn a_double_forking_setsid_daemon_is_reaped_with_its_call() {
    let s = Scene::new();
    let r = s.contained(
        "(setsid sh -c 'trap \"\" TERM HUP; (sleep 1000 &) ; sleep 1000' &) ; echo started",
    );
    assert!(text(&r).contains("started"), "{r:#}");
}

/// A profile that bounds each process tree to this many tasks.
const BOUNDED_PROFILE: &str = "\n[sandbox.profiles.workspace]\nprocesses = 64\n";

#[test]
fn a_fork_bomb_is_bounded_and_reaped() {
    let s = Scene::with_config(BOUNDED_PROFILE);
    let r = s.shell_with(json!({
        "command": "b() { b | b & }; b; sleep 2",
        "timeout_ms": 3_000,
    }));
    assert_no_survivors(&s.mark);
    assert!(r["outcome"].is_object(), "{r:#}");
}

#[test]
fn a_process_tree_stops_at_the_profiles_process_limit() {
    let s = Scene::with_config(BOUNDED_PROFILE);
    std::fs::write(
        s.ws.join("fork.py"),
        "import os, sys, time\nmade = 0\nwhile made < 1000:\n    try:\n        pid = os.fork()\n\
         \x20   except OSError as e:\n        print(f'forked {made} then errno {e.errno}')\n\
         \x20       sys.exit(0)\n    if pid == 0:\n        time.sleep(120)\n        os._exit(0)\n\
         \x20   made += 1\nprint(f'forked {made} then errno none')\n",
    )
    .unwrap();
    let r = s.shell("python3 fork.py");
    let out = text(&r);
    let line = out
        .lines()
        .find(|l| l.starts_with("forked "))
        .unwrap_or_else(|| panic!("no report: {r:#}"));
    let words: Vec<&str> = line.split(' ').collect();
    let made: u64 = words[1].parse().unwrap();
    // EAGAIN: the tree's pids cgroup refused the fork, though ring0 may run as root.
    assert_eq!(words[4], "11", "{line}");
    assert!(made < 64, "{made} children under a limit of 64");
    assert_no_survivors(&s.mark);
}

// ---------------------------------------------------------------------------------------------
// Real programs inside

#[test]
fn git_status_and_commit_work_in_the_workspace() {
    let s = Scene::new();
    let init = Command::new("git")
        .args(["init", "-q"])
        .current_dir(&s.ws)
        .status()
        .unwrap();
    assert!(init.success());
    let r = s.shell(
        "echo hi > a.txt && git add a.txt && \
         git -c user.name=t -c user.email=t@example.com commit -qm first && git status --short && git log --oneline | wc -l",
    );
    assert_eq!(r["outcome"]["kind"], "completed", "{r:#}");
    assert!(text(&r).contains("1\n"), "{r:#}");
}

#[test]
fn python_runs_inside() {
    let s = Scene::new();
    let r = s.shell("python3 -c 'print(6*7)'");
    assert_eq!(r["outcome"]["kind"], "completed", "{r:#}");
    assert!(text(&r).contains("42"), "{r:#}");
}

#[test]
fn npm_runs_inside() {
    let s = Scene::new();
    let r = s.shell("npm --version");
    assert_eq!(r["outcome"]["kind"], "completed", "{r:#}");
}

#[test]
fn a_test_runner_runs_inside() {
    let s = Scene::new();
    std::fs::write(
        s.ws.join("test_math.py"),
        "import unittest\nclass T(unittest.TestCase):\n    def test_add(self):\n        self.assertEqual(1 + 1, 2)\n",
    )
    .unwrap();
    let r = s.shell("python3 -m unittest -v test_math 2>&1");
    assert_eq!(r["outcome"]["kind"], "completed", "{r:#}");
    assert!(text(&r).contains("OK"), "{r:#}");
}

#[test]
fn cargo_builds_offline_with_its_toolchain_named_by_a_profile() {
    let home = std::env::var("HOME").unwrap_or_default();
    let cargo_home = std::env::var("CARGO_HOME").unwrap_or(format!("{home}/.cargo"));
    let rustup_home = std::env::var("RUSTUP_HOME").unwrap_or(format!("{home}/.rustup"));
    let s = Scene::with_config(&format!(
        "[sandbox]\ndefault = \"rust\"\n[sandbox.profiles.rust]\nread = [{cargo_home:?}, {rustup_home:?}]\n"
    ));
    std::fs::create_dir_all(s.ws.join("hello/src")).unwrap();
    std::fs::write(
        s.ws.join("hello/Cargo.toml"),
        "[package]\nname = \"hello\"\nversion = \"0.1.0\"\nedition = \"2021\"\n",
    )
    .unwrap();
    std::fs::write(
        s.ws.join("hello/src/main.rs"),
        "fn main() { println!(\"built\"); }\n",
    )
    .unwrap();
    let r = s.shell_with(json!({
        "command": format!(
            "cd hello && RUSTUP_HOME={rustup_home} CARGO_HOME={cargo_home} PATH={cargo_home}/bin:$PATH \
             CARGO_TARGET_DIR=$TMPDIR/target cargo run --offline -q 2>&1"
        ),
        "timeout_ms": 300_000,
    }));
    assert_eq!(r["outcome"]["kind"], "completed", "{r:#}");
    assert!(text(&r).contains("built"), "{r:#}");
}

#[test]
fn shell_is_not_held_for_approval_inside_the_sandbox_on_the_embedded_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(common::ring0())
        .current_dir(dir.path())
        .env("RING0_STATE_DIR", dir.path().join(".ring0"))
        .args(["call", "shell", r#"{"argv":["touch","made"]}"#])
        .output()
        .unwrap();
    let r = receipt(&out);
    assert_eq!(r["outcome"]["kind"], "completed", "{r:#}");
    assert!(dir.path().join("made").exists());
}

#[test]
fn sandbox_off_is_printed_and_keeps_shell_held() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("ring0.toml"),
        "[sandbox]\ndefault = \"off\"\n[[grants]]\nname = \"sh\"\ntools = [\"shell\"]\n\
         ceiling = \"A1\"\n",
    )
    .unwrap();
    let out = Command::new(common::ring0())
        .current_dir(dir.path())
        .env("RING0_STATE_DIR", dir.path().join(".ring0"))
        .args(["call", "shell", r#"{"argv":["touch","made"]}"#])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("sandbox = \"off\""), "{stderr}");
    assert!(
        !dir.path().join("made").exists(),
        "shell ran unconfined without approval"
    );
}

// ---------------------------------------------------------------------------------------------
// Through a stdio upstream

const ESCAPE_SERVER: &str = r#"
import subprocess
from mcp.server.mcpserver import MCPServer
app = MCPServer("escape")
@app.tool()
def run(script: str) -> str:
    p = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, timeout=60)
    return f"exit={p.returncode}\n{p.stdout}\n{p.stderr}"
app.run()
"#;

/// `ring0 serve` with one stdio upstream that runs scripts; returns the text of each result.
fn through_upstream(s: &Scene, scripts: &[&str]) -> Option<Vec<String>> {
    through_upstream_then(s, scripts, "", |child, stdin| {
        drop(stdin);
        let _ = child.kill();
    })
}

/// As [`through_upstream`], with `extra` appended to the configuration and `end` ending
/// `ring0 serve` once the scripts ran.
fn through_upstream_then(
    s: &Scene,
    scripts: &[&str],
    extra: &str,
    end: impl FnOnce(&mut std::process::Child, std::process::ChildStdin),
) -> Option<Vec<String>> {
    let peers = common::peers()?;
    let server_dir = s.root.join("server");
    std::fs::create_dir_all(&server_dir).unwrap();
    std::fs::write(server_dir.join("escape.py"), ESCAPE_SERVER).unwrap();
    let config = format!(
        "# {CONFIG_MARKER}\n{}",
        common::one_upstream_config(
            "up",
            "[\"esc__*\"]",
            "A0",
            "esc",
            &format!(
                "command = {:?}\nargs = [{:?}]\nenv_set = {{ {MARK_ENV} = {:?} }}",
                common::python(&peers).display().to_string(),
                server_dir.join("escape.py").display().to_string(),
                s.mark
            ),
            extra,
        )
    );
    std::fs::write(s.ws.join("ring0.toml"), config).unwrap();
    let mut cmd = s.ring0();
    cmd.arg("serve");
    let (mut child, mut stdin, rx) = common::spawn_stdio_json(cmd);
    let mut send = |v: Value| {
        writeln!(stdin, "{v}").unwrap();
    };
    let wait = |id: i64| -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let m = rx.recv_timeout(left).expect("a response from ring0 serve");
            if m["id"] == id {
                return m;
            }
        }
    };
    send(
        json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
        "protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}),
    );
    wait(0);
    send(json!({"jsonrpc":"2.0","method":"notifications/initialized"}));
    // The upstream's tools appear once it is up.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        send(json!({"jsonrpc":"2.0","id":1,"method":"tools/list"}));
        let listed = wait(1);
        if listed.to_string().contains("esc__run") {
            break;
        }
        assert!(Instant::now() < deadline, "esc__run never listed: {listed}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let mut out = Vec::new();
    for (i, script) in scripts.iter().enumerate() {
        let id = 10 + i as i64;
        send(
            json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{
            "name":"esc__run","arguments":{"script":script}}}),
        );
        out.push(wait(id).to_string());
    }
    end(&mut child, stdin);
    let _ = child.wait();
    Some(out)
}

/// An unconfined upstream's tool leaves the five hidden processes behind, then `end` ends
/// `ring0 serve`; `then` runs after it exited.
fn unconfined_upstream_tree_then(
    end: impl FnOnce(&mut std::process::Child, std::process::ChildStdin),
    then: impl FnOnce(&Scene),
) {
    let s = Scene::new();
    let mark = format!("{}", 9_000_000 + rand_u128() % 1_000_000);
    let tree = format!(
        "{{ {}; }} >/dev/null 2>&1 </dev/null; echo spawned",
        hiding_tree_then(&mark, "true")
    );
    let extra = "\n[sandbox]\nupstreams = { esc = \"off\" }\n";
    let Some(results) = through_upstream_then(&s, &[tree.as_str()], extra, |child, stdin| {
        wait_for_argument_count(&mark, |n| n >= 5, "the tree never appeared");
        end(child, stdin);
    }) else {
        return;
    };
    assert!(results[0].contains("spawned"), "{results:?}");
    then(&s);
    wait_for_argument_count(&mark, |n| n == 0, "processes of the upstream survive ring0");
}

#[test]
fn an_unconfined_upstreams_processes_end_when_serve_exits_cleanly() {
    unconfined_upstream_tree_then(|_child, stdin| drop(stdin), |_| {});
}

#[test]
fn an_unconfined_upstreams_processes_left_by_a_killed_serve_end_when_the_next_one_starts() {
    unconfined_upstream_tree_then(
        |child, _stdin| child.kill().unwrap(),
        |s| {
            let mut cmd = s.ring0();
            cmd.arg("serve");
            // The next ring0 needs no upstream of its own to end what the killed one left.
            std::fs::write(
                s.ws.join("ring0.toml"),
                "[workspace]\nstate_dir = \".ring0\"\n",
            )
            .unwrap();
            let _next = StdioClient::initialized(cmd, "2025-06-18");
        },
    );
}

#[test]
fn an_upstream_server_cannot_read_or_write_outside_or_reach_the_network() {
    let s = Scene::new();
    let before = s.outside();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let ssh = format!("cat {}/.ssh/id_ed25519", s.home.display());
    let sibling = format!("cat {}/secret.txt", s.sibling.display());
    let write = format!("echo x > {}/new", s.sibling.display());
    let connect =
        format!("python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 5)\"");
    let scripts = [
        ssh.as_str(),
        "cat /etc/shadow",
        sibling.as_str(),
        "cat ring0.toml",
        write.as_str(),
        connect.as_str(),
        "unshare -r true",
        "(setsid sh -c 'sleep 1000 >/dev/null 2>&1 &' &); echo daemon",
    ];
    let Some(results) = through_upstream(&s, &scripts) else {
        return;
    };
    for secret in [SSH_SECRET, SIBLING_SECRET, CONFIG_MARKER] {
        assert!(
            results.iter().all(|r| !r.contains(secret)),
            "{secret} leaked: {results:#?}"
        );
    }
    assert!(results[1].contains("Permission denied"), "{}", results[1]);
    assert!(results[4].contains("Permission denied"), "{}", results[4]);
    assert!(results[5].contains("ConnectionRefused"), "{}", results[5]);
    assert!(results[6].contains("not permitted"), "{}", results[6]);
    assert!(
        listener.accept().is_err(),
        "the listener outside was reached"
    );
    // ring0's config was rewritten for the upstream; compare the rest.
    let after = s.outside();
    let strip = |v: Vec<(PathBuf, Vec<u8>)>| -> Vec<(PathBuf, Vec<u8>)> {
        v.into_iter()
            .filter(|(p, _)| !p.starts_with(s.root.join("server")))
            .collect()
    };
    assert_eq!(strip(before), strip(after), "something outside changed");
    // The server, its shells and the daemon die with ring0.
    assert_no_survivors(&s.mark);
}

// ---------------------------------------------------------------------------------------------
// No survivors when ring0 itself ends

fn wait_for_argument_count(mark: &str, want: impl Fn(usize) -> bool, what: &str) {
    let deadline = Instant::now() + SURVIVOR_WAIT;
    loop {
        let n = marked_by_argument(mark);
        if want(n) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {n} processes");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `ring0 serve` running the hiding tree through `shell` (in the foreground or as a job),
/// ended by `end` once the whole tree is up.
fn serve_tree_then(
    background: bool,
    end: impl FnOnce(&mut std::process::Child, std::process::ChildStdin),
) {
    let s = Scene::new();
    let mark = format!("{}", 8_000_000 + rand_u128() % 1_000_000);
    let mut cmd = s.ring0();
    cmd.arg("serve");
    let mut client = StdioClient::initialized(cmd, "2025-06-18");
    client.send(
        &json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"shell",
            "arguments":{"command": hiding_tree(&mark), "background": background}}}),
    );
    wait_for_argument_count(&mark, |n| n > 5, "the tree never appeared");
    let StdioClient {
        mut child, stdin, ..
    } = client;
    end(&mut child, stdin);
    let _ = child.wait();
    wait_for_argument_count(&mark, |n| n == 0, "processes survive ring0");
}

#[test]
fn an_unconfined_call_left_by_a_killed_serve_is_ended_when_the_next_one_starts() {
    let s = Scene::new();
    // Unconfined: no PID namespace to die with; only the run's cgroup remembers its processes.
    std::fs::write(
        s.ws.join("ring0.toml"),
        "[workspace]\nstate_dir = \".ring0\"\n\n[sandbox]\ndefault = \"off\"\n\n\
         [[grants]]\nname = \"tree\"\ntools = [\"shell\"]\nceiling = \"A2\"\n\
         rules = [\"args.argv[0] == 'sh'\"]\nunattended = true\n",
    )
    .unwrap();
    let mark = format!("{}", 8_000_000 + rand_u128() % 1_000_000);
    let serve = || {
        let mut cmd = s.ring0();
        cmd.arg("serve");
        StdioClient::initialized(cmd, "2025-06-18")
    };
    std::fs::write(s.ws.join("tree.sh"), hiding_tree(&mark)).unwrap();
    let mut client = serve();
    client.send(
        &json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"shell",
            "arguments":{"argv": ["sh", "tree.sh"]}}}),
    );
    wait_for_argument_count(&mark, |n| n > 5, "the tree never appeared");
    client.child.kill().unwrap();
    let _ = client.child.wait();
    let _next = serve();
    wait_for_argument_count(&mark, |n| n == 0, "processes survive the killed ring0");
}

#[test]
fn serve_killed_during_a_foreground_call_leaves_no_survivors() {
    serve_tree_then(false, |child, _stdin| {
        child.kill().unwrap();
    });
}

#[test]
fn serve_exiting_cleanly_with_a_running_job_leaves_no_survivors() {
    serve_tree_then(true, |_child, stdin| {
        // End of input: ring0 serve exits cleanly.
        drop(stdin);
    });
}

#[test]
fn serve_killed_with_a_running_job_leaves_no_survivors() {
    serve_tree_then(true, |child, _stdin| {
        child.kill().unwrap();
    });
}
