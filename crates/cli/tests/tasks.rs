//! Background jobs and long upstream calls as MCP tasks, as a client that declares the tasks
//! extension sees them through `ring0 serve`: over stdio (JSON-RPC lines, on the embedded
//! defaults, where `shell` is approved through elicitation) and over Streamable HTTP (both eras,
//! with the standard-library Python fixture as a slow upstream).

mod common;

use common::*;
use serde_json::{Value, json};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(60);
const TASKS: &str = "io.modelcontextprotocol/tasks";

fn task_capabilities() -> Value {
    json!({"elicitation": {}, "extensions": {TASKS: {}}})
}

// ---- stdio ----

struct Stdio0 {
    child: Child,
    stdin: ChildStdin,
    messages: Receiver<Value>,
    next_id: u64,
}

impl Stdio0 {
    fn start(dir: &Path, capabilities: Value) -> Self {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ring0"));
        cmd.arg("serve")
            .current_dir(dir)
            .env("RING0_STATE_DIR", std::path::Path::new(dir).join(".ring0"))
            .stderr(Stdio::null());
        let (child, stdin, rx) = spawn_stdio_json(cmd);
        let mut c = Self {
            child,
            stdin,
            messages: rx,
            next_id: 1,
        };
        c.request(
            "initialize",
            json!({"protocolVersion": "2025-11-25", "capabilities": capabilities,
                   "clientInfo": {"name": "tasks-test", "version": "1"}}),
        );
        c.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        c
    }

    fn send(&mut self, message: Value) {
        self.stdin
            .write_all(format!("{message}\n").as_bytes())
            .unwrap();
        self.stdin.flush().unwrap();
    }

    /// Sends a request and returns its response, approving any elicitation on the way.
    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let m = self
                .messages
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no response to {method}"));
            if m.get("id") == Some(&json!(id)) && m.get("method").is_none() {
                return m;
            }
            if m["method"] == "elicitation/create" {
                let answer = json!({"jsonrpc": "2.0", "id": m["id"],
                    "result": {"action": "accept", "content": {"approve": true}}});
                self.send(answer);
            }
        }
    }
}

impl Drop for Stdio0 {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `tasks/get` through `get` until the task leaves `working`.
fn settle(mut get: impl FnMut() -> Value) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let r = get();
        let status = r["result"]["status"].as_str().unwrap_or("").to_string();
        if status != "working" {
            return r;
        }
        assert!(Instant::now() < deadline, "the task never finished: {r}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn shell(argv: &[&str]) -> Value {
    json!({"name": "shell", "arguments": {"argv": argv, "background": true}})
}

/// Writes `script` to `dir/name`: the default grants run `sh FILE`, never `sh -c TEXT` (an inline
/// script is a command string).
fn script(dir: &std::path::Path, name: &str, script: &str) {
    std::fs::write(dir.join(name), script).unwrap();
}

#[test]
fn a_background_shell_call_returns_a_task_that_completes_with_the_output() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Stdio0::start(dir.path(), task_capabilities());
    let init_caps = c.request("tools/list", json!({}));
    assert!(init_caps["result"]["tools"].is_array());
    script(
        dir.path(),
        "task.sh",
        "sleep 0.5; echo finished-in-a-task\n",
    );
    let created = c.request("tools/call", shell(&["sh", "task.sh"]));
    let r = &created["result"];
    assert_eq!(r["resultType"], "task", "{created}");
    assert_eq!(r["status"], "working", "{created}");
    let id = r["taskId"].as_str().unwrap().to_string();
    assert!(r["_meta"]["io.ring0/job"].is_string(), "{created}");
    let done = settle(|| c.request("tasks/get", json!({"taskId": id})));
    let t = &done["result"];
    assert_eq!(t["status"], "completed", "{done}");
    assert!(
        t["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("finished-in-a-task"),
        "{done}"
    );
    assert_eq!(t["result"]["isError"], false, "{done}");
    assert_eq!(t["result"]["structuredContent"]["exit_code"], 0, "{done}");
}

fn alive(pid: u32) -> bool {
    // A zombie has exited; only a live process counts as a survivor.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            let state = s.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z')
        })
        .unwrap_or(false)
}

/// The host pid of a live `sleep MARK`.
fn sleeping(mark: &str) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        (args.first() == Some(&&b"sleep"[..]) && args.get(1) == Some(&mark.as_bytes()))
            .then_some(pid)
    })
}

#[test]
fn cancelling_a_job_task_stops_its_process_and_reports_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Stdio0::start(dir.path(), task_capabilities());
    // Inside the sandbox's PID namespace `$$` is not a host pid: the process is found in /proc
    // by a duration no other process uses.
    let mark = format!("3{}", std::process::id());
    script(dir.path(), "job.sh", &format!("exec sleep {mark}\n"));
    let created = c.request("tools/call", shell(&["sh", "job.sh"]));
    assert_eq!(created["result"]["resultType"], "task", "{created}");
    let id = created["result"]["taskId"].as_str().unwrap().to_string();
    let deadline = Instant::now() + WAIT;
    let pid: u32 = loop {
        if let Some(p) = sleeping(&mark) {
            break p;
        }
        assert!(Instant::now() < deadline, "the job never started");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(alive(pid));
    let working = c.request("tasks/get", json!({"taskId": id}));
    assert_eq!(working["result"]["status"], "working", "{working}");
    let ack = c.request("tasks/cancel", json!({"taskId": id}));
    assert!(ack.get("error").is_none(), "{ack}");
    let after = c.request("tasks/get", json!({"taskId": id}));
    assert_eq!(after["result"]["status"], "cancelled", "{after}");
    let deadline = Instant::now() + WAIT;
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!alive(pid), "the job's process survived its cancellation");
}

#[test]
fn an_unknown_task_id_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Stdio0::start(dir.path(), task_capabilities());
    let r = c.request(
        "tasks/get",
        json!({"taskId": "task_00000000000000000000000000000000"}),
    );
    assert_eq!(r["error"]["code"], -32602, "{r}");
    let r = c.request(
        "tasks/cancel",
        json!({"taskId": "task_00000000000000000000000000000000"}),
    );
    assert_eq!(r["error"]["code"], -32602, "{r}");
}

#[test]
fn a_client_without_task_support_gets_the_job_handle_as_before() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Stdio0::start(dir.path(), json!({"elicitation": {}}));
    let r = c.request("tools/call", shell(&["true"]));
    assert!(r["result"].get("resultType").is_none(), "{r}");
    let job = r["result"]["structuredContent"]["job"].as_str().unwrap();
    assert!(job.starts_with("job_"), "{r}");
}

#[test]
fn a_job_task_waiting_for_input_says_so_and_completes_once_it_is_sent() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Stdio0::start(dir.path(), task_capabilities());
    script(dir.path(), "read.sh", "read x; echo got $x\n");
    let created = c.request(
        "tools/call",
        json!({"name": "shell", "arguments": {"argv": ["sh", "read.sh"],
                                              "background": true, "stdin": "pipe"}}),
    );
    assert_eq!(created["result"]["resultType"], "task", "{created}");
    let id = created["result"]["taskId"].as_str().unwrap().to_string();
    let job = created["result"]["_meta"]["io.ring0/job"]
        .as_str()
        .unwrap()
        .to_string();
    let deadline = Instant::now() + WAIT;
    loop {
        let r = c.request("tasks/get", json!({"taskId": id}));
        let message = r["result"]["statusMessage"].as_str().unwrap_or("");
        if message.contains("waiting for input") {
            assert_eq!(r["result"]["status"], "working", "{r}");
            break;
        }
        assert!(Instant::now() < deadline, "never reported waiting: {r}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let sent = c.request(
        "tools/call",
        json!({"name": "job_send_input", "arguments": {"job": job, "input": "hello\n"}}),
    );
    assert_ne!(sent["result"]["isError"], true, "{sent}");
    let done = settle(|| c.request("tasks/get", json!({"taskId": id})));
    assert_eq!(done["result"]["status"], "completed", "{done}");
    assert!(
        done["result"]["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("got hello"),
        "{done}"
    );
}

#[test]
fn where_the_job_tools_are_not_granted_a_background_job_is_answered_with_its_handle() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("ring0.toml"),
        "defaults = false\n[[grants]]\nname = \"shell\"\ntools = [\"shell\"]\nceiling = \"A2\"\napproval = true\n",
    )
    .unwrap();
    let mut c = Stdio0::start(dir.path(), task_capabilities());
    let r = c.request("tools/call", shell(&["true"]));
    assert!(r["result"].get("resultType").is_none(), "{r}");
    assert!(r["result"]["structuredContent"]["job"].is_string(), "{r}");
}

// ---- Streamable HTTP, with a slow upstream ----

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../mcp/tests/fixtures/stdio_server.py")
}

fn serve_http(dir: &Path) -> HttpServer {
    let config = format!(
        "defaults = false\n[[grants]]\nname = \"fixture\"\ntools = [\"fx__*\"]\nceiling = \"A3\"\n\n[[upstreams]]\nalias = \"fx\"\ncommand = \"python3\"\nargs = [{:?}]\nenv = [\"PATH\", \"FIXTURE_LOG\"]\n[upstreams.tools.\"*\"]\neffect = \"nullipotent\"\nauthority = \"A0\"\nstrategy = [\"exploration\"]\n[upstreams.tools.silent]\neffect = \"non_idempotent\"\nauthority = \"A0\"\n",
        fixture().display().to_string()
    );
    std::fs::write(dir.join("ring0.toml"), config).unwrap();
    let mut cmd = serve_http_command(dir);
    cmd.env("FIXTURE_LOG", dir.join("fixture.log"));
    start_http(cmd)
}

/// One sessionful HTTP client (2025-11-25) that declares the tasks extension.
struct HttpSession {
    addr: String,
    session: String,
    next_id: u64,
}

impl HttpSession {
    fn open(addr: &str) -> Self {
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {"extensions": {TASKS: {}}},
                       "clientInfo": {"name": "t", "version": "1"}}});
        let (head, _) = post(addr, &[], &init);
        let session = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("mcp-session-id")
                    .then(|| v.trim().to_string())
            })
            .expect("a session id");
        let mut s = Self {
            addr: addr.to_string(),
            session,
            next_id: 1,
        };
        s.notify();
        s
    }

    fn notify(&mut self) {
        let h = [
            ("Mcp-Session-Id", self.session.as_str()),
            ("MCP-Protocol-Version", "2025-11-25"),
        ];
        post(
            &self.addr,
            &h,
            &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        );
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let h = [
            ("Mcp-Session-Id", self.session.as_str()),
            ("MCP-Protocol-Version", "2025-11-25"),
        ];
        let body =
            json!({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params});
        post(&self.addr, &h, &body).1
    }
}

fn slow_call(steps: u32) -> Value {
    json!({"name": "fx__slow", "arguments": {"steps": steps, "delay_ms": 700}})
}

#[test]
fn over_http_a_long_upstream_call_becomes_a_task_only_its_session_can_see() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve_http(dir.path());
    let mut owner = HttpSession::open(&server.addr);
    let mut other = HttpSession::open(&server.addr);
    let created = owner.request("tools/call", slow_call(3));
    assert_eq!(created["result"]["resultType"], "task", "{created}");
    let id = created["result"]["taskId"].as_str().unwrap().to_string();
    // Another session asking for it gets the answer an unknown id gets.
    let foreign = other.request("tasks/get", json!({"taskId": id}));
    let unknown = other.request(
        "tasks/get",
        json!({"taskId": "task_00000000000000000000000000000000"}),
    );
    assert_eq!(foreign["error"]["code"], -32602, "{foreign}");
    assert_eq!(foreign["error"]["code"], unknown["error"]["code"]);
    let foreign_cancel = other.request("tasks/cancel", json!({"taskId": id}));
    assert_eq!(foreign_cancel["error"]["code"], -32602, "{foreign_cancel}");
    let done = settle(|| owner.request("tasks/get", json!({"taskId": id})));
    assert_eq!(done["result"]["status"], "completed", "{done}");
    assert_eq!(
        done["result"]["result"]["content"][0]["text"], "done after 3 steps",
        "{done}"
    );
    assert_eq!(
        done["result"]["result"]["_meta"]["io.ring0/receipt"]["state"],
        "ACKED"
    );
}

#[test]
fn over_http_a_short_upstream_call_is_answered_directly() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve_http(dir.path());
    let mut c = HttpSession::open(&server.addr);
    let r = c.request(
        "tools/call",
        json!({"name": "fx__echo", "arguments": {"text": "quick"}}),
    );
    assert_eq!(r["result"]["content"][0]["text"], "quick", "{r}");
}

#[test]
fn cancelling_an_upstream_call_task_cancels_it_upstream_and_the_journal_settles_it() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve_http(dir.path());
    let mut c = HttpSession::open(&server.addr);
    let created = c.request("tools/call", json!({"name": "fx__silent", "arguments": {}}));
    assert_eq!(created["result"]["resultType"], "task", "{created}");
    let id = created["result"]["taskId"].as_str().unwrap().to_string();
    let ack = c.request("tasks/cancel", json!({"taskId": id}));
    assert!(ack.get("error").is_none(), "{ack}");
    let after = c.request("tasks/get", json!({"taskId": id}));
    assert_eq!(after["result"]["status"], "cancelled", "{after}");
    let log = dir.path().join("fixture.log");
    wait_for_file_text(
        &log,
        "notifications/cancelled",
        "the upstream was never told the call was cancelled",
    );
    // The call may have had an effect: the journal settles it as uncertain, for a person
    // (no settlement is declared), never as done or as not applied.
    let deadline = Instant::now() + WAIT;
    loop {
        let out = Command::new(env!("CARGO_BIN_EXE_ring0"))
            .args(["journal", "ls"])
            .current_dir(dir.path())
            .env(
                "RING0_STATE_DIR",
                std::path::Path::new(dir.path()).join(".ring0"),
            )
            .output()
            .unwrap();
        let listing = String::from_utf8_lossy(&out.stdout).into_owned();
        let line = listing
            .lines()
            .find(|l| l.contains("fx__silent"))
            .unwrap_or("")
            .to_string();
        if line.contains("DEAD_LETTER") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the cancelled call was not settled: {listing}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn modern_meta() -> Value {
    json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
           "io.modelcontextprotocol/clientCapabilities": {"extensions": {TASKS: {}}},
           "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"}})
}

fn stateless(addr: &str, id: u64, method: &str, mut params: Value, name: Option<&str>) -> Value {
    params["_meta"] = modern_meta();
    let mut h = vec![
        ("MCP-Protocol-Version", "2026-07-28"),
        ("Mcp-Method", method),
    ];
    if let Some(n) = name {
        h.push(("Mcp-Name", n));
    }
    let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    post(addr, &h, &body).1
}

#[test]
fn over_stateless_http_a_long_upstream_call_is_a_task_followed_by_later_requests() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve_http(dir.path());
    let created = stateless(
        &server.addr,
        1,
        "tools/call",
        slow_call(2),
        Some("fx__slow"),
    );
    assert_eq!(created["result"]["resultType"], "task", "{created}");
    let id = created["result"]["taskId"].as_str().unwrap().to_string();
    let mut n = 1;
    let done = settle(|| {
        n += 1;
        stateless(
            &server.addr,
            n,
            "tasks/get",
            json!({"taskId": id}),
            Some(&id),
        )
    });
    let r = &done["result"];
    assert_eq!(r["status"], "completed", "{done}");
    assert_eq!(r["result"]["content"][0]["text"], "done after 2 steps");
    // The result is rendered for the era that asked: 2026-07-28 results carry resultType.
    assert_eq!(r["result"]["resultType"], "complete", "{done}");
}

// ---- the Python SDK client, with a tasks extension of its own ----

fn python() -> Option<PathBuf> {
    common::peers().map(|peers| common::python(&peers))
}

#[test]
fn python_client_with_a_tasks_extension_follows_and_cancels_tasks() {
    let Some(python) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let server = serve_http(dir.path());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/py_client_tasks.py");
    let seen = python_report(Command::new(python).arg(script).arg(server.url()));
    // The slow call came back as a task, was followed with tasks/get, and resolved to its result.
    assert_eq!(seen["statuses"][0], "working", "{seen}");
    assert_eq!(
        seen["statuses"].as_array().unwrap().last().unwrap(),
        "completed",
        "{seen}"
    );
    assert_eq!(seen["slow"], "done after 3 steps", "{seen}");
    assert_eq!(seen["silent_result_type"], "task", "{seen}");
    assert_eq!(seen["cancelled"], "cancelled", "{seen}");
    assert_eq!(seen["unknown"], -32602, "{seen}");
}
