//! The state that decides calls is shared by the replicas of one PostgreSQL journal: a call
//! held for approval on one replica is listed and decided through another's console and runs
//! (or is refused) where it waits, once; a held call outlives its replica's SIGKILL and runs
//! once after it is approved.
//!
//! Effects are counted in the lines of `effects.log`, which the upstream tool `fx__append`
//! (tests/fixtures/effect_upstream.py) appends to; the replicas serve one workspace, each with a
//! state directory of its own. The database is the one `RING0_TEST_POSTGRES_URL` names
//! (`scripts/test.sh` starts one), each test in a schema of its own; without it the test is
//! skipped, and under CI it fails.

mod common;
mod replica_support;

use common::*;
use replica_support::{LEASE_MS, fixtures, schema_in, test_database};
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A new schema in the test database, and a URL whose connections use it.
fn database() -> Option<String> {
    test_database().map(|url| schema_in(&url))
}

/// A workspace where `fx__append` is held for a person's approval (alice is an operator of the
/// console), with the replicas' lease.
fn workspace(peers: &Path) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[approval]\ntimeout_secs = 600\n\n\
         [console]\noperators = [\"alice\"]\n\n\
         [journal]\nlease_ms = {LEASE_MS}\n\n\
         [[grants]]\nname = \"held\"\ntools = [\"fx__append\"]\nceiling = \"A2\"\napproval = true\n\n\
         [[upstreams]]\nalias = \"fx\"\ncommand = {:?}\nargs = [{:?}, \"--dir\", {:?}]\n\n\
         [upstreams.tools.append]\neffect = \"non_idempotent\"\nauthority = \"A2\"\n\
         strategy = [\"exploitation\"]\nsettlement = \"idempotency_key\"\n\n{}",
        python(peers).display().to_string(),
        fixtures().join("effect_upstream.py").display().to_string(),
        dir.path().display().to_string(),
        alice_and_bob_tokens(),
    );
    std::fs::write(dir.path().join("ring0.toml"), config).unwrap();
    dir
}

/// `ring0 serve --http` on the shared journal with the state directory `.ring0-NAME`.
fn replica(dir: &Path, name: &str, journal: &str) -> HttpServer {
    let mut cmd = Command::new(ring0());
    cmd.arg("--state-dir")
        .arg(dir.join(format!(".ring0-{name}")))
        .args(["serve", "--http", "127.0.0.1:0", "--journal", journal])
        .current_dir(dir)
        .env("HOME", test_home());
    start_http(cmd)
}

/// `fx__append {"text": TEXT}` under the key KEY, through `server`, by a client that never
/// answers ring0's question itself (a person decides elsewhere); it prints its result at the
/// end.
fn held_call(peers: &Path, server: &HttpServer, text: &str, key: &str) -> Child {
    Command::new(python(peers))
        .arg(fixtures().join("py_client_settle.py"))
        .args([
            &server.url(),
            "fx__append",
            &json!({ "text": text }).to_string(),
            key,
            "--never-answer",
        ])
        .env("CLIENT_TOKEN", "alice-token")
        .env("HOME", test_home())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// What the client of [`held_call`] reported, once it ended (within the HTTP wait).
fn report(child: Child) -> Value {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = rx
        .recv_timeout(HTTP_WAIT)
        .expect("the held call was answered")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.lines().last().unwrap_or("")).expect("one JSON line")
}

/// One request to a replica's console as alice: the status and the body.
fn console(addr: &str, method: &str, path: &str, form: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(HTTP_WAIT)).unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer alice-token\r\n\
         Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{form}",
        form.len()
    );
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    (status(head), body)
}

/// Waits until `server`'s console lists a call waiting for approval, and returns its approval
/// id and the console's form token.
fn pending_on_console(server: &HttpServer) -> (String, String) {
    let deadline = Instant::now() + HTTP_WAIT;
    loop {
        let (code, page) = console(&server.addr, "GET", "/console", "");
        assert_eq!(code, 200, "{page}");
        let id = page
            .split("/console/approvals/")
            .nth(1)
            .and_then(|rest| rest.split('/').next());
        let csrf = page
            .split("name=csrf value=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next());
        if let (Some(id), Some(csrf)) = (id, csrf) {
            return (id.to_string(), csrf.to_string());
        }
        assert!(
            Instant::now() < deadline,
            "nothing waits for approval:\n{page}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Decides the held call `id` through `server`'s console (`approve` or `deny`).
fn decide_on_console(server: &HttpServer, id: &str, csrf: &str, action: &str) {
    let (code, body) = console(
        &server.addr,
        "POST",
        &format!("/console/approvals/{id}/{action}"),
        &format!("csrf={csrf}"),
    );
    assert_eq!(code, 303, "{action} {id}: {body}");
}

fn effects(dir: &Path, text: &str) -> usize {
    std::fs::read_to_string(dir.join("effects.log"))
        .unwrap_or_default()
        .lines()
        .filter(|l| *l == text)
        .count()
}

/// The state of the (one) `fx__append` intent the journal lists, read from outside.
fn intent_state(dir: &Path, journal: &str) -> String {
    let out = Command::new(ring0())
        .args(["journal", "ls", "--journal", journal])
        .current_dir(dir)
        .env("HOME", test_home())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = listing
        .lines()
        .filter(|l| l.contains("fx__append"))
        .collect();
    assert!(lines.len() <= 1, "one intent: {listing}");
    [
        "ACKED",
        "REJECTED_CONFLICT",
        "RECORDED",
        "DISPATCHED",
        "FAILED",
    ]
    .into_iter()
    .find(|s| lines.first().is_some_and(|l| l.contains(s)))
    .unwrap_or("none")
    .to_string()
}

/// `ring0 journal show` of the (one) `fx__append` intent, read from outside.
fn journal_show(dir: &Path, journal: &str) -> String {
    let run = |args: &[&str]| {
        let out = Command::new(ring0())
            .args(args)
            .current_dir(dir)
            .env("HOME", test_home())
            .stdin(Stdio::null())
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let listing = run(&["journal", "ls", "--journal", journal]);
    let id = listing
        .lines()
        .find(|l| l.contains("fx__append"))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("no intent listed:\n{listing}"))
        .to_string();
    run(&["journal", "show", &id, "--journal", journal])
}

fn wait_for_intent(dir: &Path, journal: &str, state: &str) {
    let deadline = Instant::now() + HTTP_WAIT;
    loop {
        let now = intent_state(dir, journal);
        if now == state {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the intent is {now}, not {state}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_call_held_on_one_replica_and_approved_through_another_runs_once_where_it_waits() {
    let Some(journal) = database() else { return };
    let Some(peers) = peers() else { return };
    let dir = workspace(&peers);
    let a = replica(dir.path(), "a", &journal);
    let b = replica(dir.path(), "b", &journal);
    let call = held_call(&peers, &b, "approved on a", "key-approved");
    // Replica A's console lists the call B holds; approving it there releases it on B.
    let (id, csrf) = pending_on_console(&a);
    decide_on_console(&a, &id, &csrf, "approve");
    let answer = report(call);
    assert_eq!(answer["is_error"], json!(false), "{answer}");
    assert!(
        answer["text"]
            .as_str()
            .is_some_and(|t| t.contains("approved on a")),
        "{answer}"
    );
    assert_eq!(effects(dir.path(), "approved on a"), 1);
    assert_eq!(intent_state(dir.path(), &journal), "ACKED");
    // The intent names who the call acted for.
    let shown = journal_show(dir.path(), &journal);
    assert!(shown.contains("principal:       alice"), "{shown}");
    // Decided once: a second decision finds it decided.
    let (code, body) = console(
        &a.addr,
        "POST",
        &format!("/console/approvals/{id}/deny"),
        &format!("csrf={csrf}"),
    );
    assert_eq!(code, 409, "{body}");
    assert_eq!(effects(dir.path(), "approved on a"), 1);
}

#[test]
fn a_call_held_on_one_replica_and_denied_through_another_never_runs() {
    let Some(journal) = database() else { return };
    let Some(peers) = peers() else { return };
    let dir = workspace(&peers);
    let a = replica(dir.path(), "a", &journal);
    let b = replica(dir.path(), "b", &journal);
    let call = held_call(&peers, &b, "denied on a", "key-denied");
    let (id, csrf) = pending_on_console(&a);
    decide_on_console(&a, &id, &csrf, "deny");
    let answer = report(call);
    assert_eq!(answer["is_error"], json!(true), "{answer}");
    assert!(
        answer["text"]
            .as_str()
            .is_some_and(|t| t.contains("denied in the console")),
        "{answer}"
    );
    assert_eq!(effects(dir.path(), "denied on a"), 0);
    assert_ne!(intent_state(dir.path(), &journal), "ACKED");
}

#[test]
fn a_held_call_outlives_its_replicas_sigkill_and_runs_once_when_approved_after_the_restart() {
    let Some(journal) = database() else { return };
    let Some(peers) = peers() else { return };
    let dir = workspace(&peers);
    let a = replica(dir.path(), "a", &journal);
    let mut b = replica(dir.path(), "b", &journal);
    let call = held_call(&peers, &b, "after the kill", "key-kill");
    let (id, _) = pending_on_console(&a);
    assert_eq!(intent_state(dir.path(), &journal), "RECORDED");
    b.child.kill().unwrap(); // SIGKILL
    let _ = b.child.wait();
    drop(report(call)); // its connection died with the replica
    let _b = replica(dir.path(), "b", &journal);
    // Still waiting for a person after the restart; approved, it runs once.
    let (still, csrf) = pending_on_console(&a);
    assert_eq!(still, id);
    decide_on_console(&a, &id, &csrf, "approve");
    wait_for_intent(dir.path(), &journal, "ACKED");
    assert_eq!(effects(dir.path(), "after the kill"), 1);
}

/// A workspace where `fx__append` runs unattended (settled by its idempotency key) and every
/// principal may make two calls an hour.
fn limited_workspace(peers: &Path) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[limits]\nprincipal_rate = \"2/h\"\n\n\
         [journal]\nlease_ms = {LEASE_MS}\n\n\
         [[grants]]\nname = \"effects\"\ntools = [\"fx__append\"]\nceiling = \"A2\"\n\n\
         [[upstreams]]\nalias = \"fx\"\ncommand = {:?}\nargs = [{:?}, \"--dir\", {:?}]\n\n\
         [upstreams.tools.append]\neffect = \"non_idempotent\"\nauthority = \"A2\"\n\
         strategy = [\"exploitation\"]\nsettlement = \"idempotency_key\"\n",
        python(peers).display().to_string(),
        fixtures().join("effect_upstream.py").display().to_string(),
        dir.path().display().to_string(),
    );
    std::fs::write(dir.path().join("ring0.toml"), config).unwrap();
    dir
}

/// A sessionful MCP session with `server` (no credentials: the local principal).
fn mcp_session(server: &HttpServer) -> String {
    let (head, init) = post(
        &server.addr,
        &[],
        &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                           "clientInfo": {"name": "shared-state-test", "version": "1"}}}),
    );
    assert!(init.get("result").is_some(), "{init}");
    let session = session_id(&head);
    let headers = [
        ("Mcp-Session-Id", session.as_str()),
        ("MCP-Protocol-Version", "2025-06-18"),
    ];
    post(
        &server.addr,
        &headers,
        &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    );
    session
}

/// `fx__append {"text": TEXT}` under the key KEY through `server`'s `session`: its result.
fn append(server: &HttpServer, session: &str, text: &str, key: &str) -> Value {
    let headers = [
        ("Mcp-Session-Id", session),
        ("MCP-Protocol-Version", "2025-06-18"),
    ];
    let (_, answer) = post(
        &server.addr,
        &headers,
        &json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                "params": {"name": "fx__append", "arguments": {"text": text},
                           "idempotencyKey": key}}),
    );
    answer["result"].clone()
}

#[test]
fn a_principals_rate_limit_holds_across_replicas_as_one() {
    let Some(journal) = database() else { return };
    let Some(peers) = peers() else { return };
    let dir = limited_workspace(&peers);
    let a = replica(dir.path(), "a", &journal);
    let b = replica(dir.path(), "b", &journal);
    let sessions = [(&a, mcp_session(&a)), (&b, mcp_session(&b))];
    let mut refused = 0;
    for i in 0..6 {
        let (server, session) = &sessions[i % 2];
        let result = append(server, session, &format!("call {i}"), &format!("key-{i}"));
        if result["isError"] == json!(true) {
            let text = result.to_string();
            assert!(text.contains("rate_limited"), "{result}");
            assert!(text.contains("rate:principal"), "{result}");
            refused += 1;
        }
    }
    let ran: usize = (0..6)
        .map(|i| effects(dir.path(), &format!("call {i}")))
        .sum();
    assert_eq!(ran, 2, "two calls an hour, whichever replica they reach");
    assert_eq!(refused, 4);
}

/// A workspace of its own (its own `ring0.lock`) serving the mediated fixture, whose
/// `FIXTURE_STAGE=v2` changes the tool `send_mail` after `v1` was pinned.
fn pinned_workspace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let transport = format!(
        "command = \"python3\"\nargs = [{:?}]\nenv = [\"PATH\", \"FIXTURE_STAGE\"]\n",
        fixtures()
            .join("mediated_upstream.py")
            .display()
            .to_string()
    );
    let config = one_upstream_config("fixture", r#"["fx__*"]"#, "A3", "fx", &transport, "");
    let config = format!("{config}\n[journal]\nlease_ms = {LEASE_MS}\n");
    std::fs::write(dir.path().join("ring0.toml"), config).unwrap();
    dir
}

/// `ring0 serve` over stdio in `dir` at `stage`, once, listing its tools: its definitions are
/// pinned on first sight.
fn list_at_stage(dir: &Path, stage: &str) {
    let mut cmd = Command::new(ring0());
    cmd.arg("serve")
        .current_dir(dir)
        .env("HOME", test_home())
        .env("FIXTURE_STAGE", stage)
        .stderr(Stdio::null());
    let (mut child, mut stdin, messages) = spawn_stdio_json(cmd);
    for line in [
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
    ] {
        writeln!(stdin, "{line}").unwrap();
    }
    while messages.recv_timeout(HTTP_WAIT).expect("ring0 answers")["id"] != 2 {}
    let _ = child.kill();
    let _ = child.wait();
}

/// The tool names `server` lists to a new session.
fn listed(server: &HttpServer) -> Vec<String> {
    let session = mcp_session(server);
    let headers = [
        ("Mcp-Session-Id", session.as_str()),
        ("MCP-Protocol-Version", "2025-06-18"),
    ];
    let (_, answer) = post(
        &server.addr,
        &headers,
        &json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}),
    );
    answer["result"]["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["name"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn a_tool_approved_on_one_replica_is_approved_on_every_replica() {
    let Some(journal) = database() else { return };
    if peers().is_none() {
        return;
    }
    let (wa, wb) = (pinned_workspace(), pinned_workspace());
    // Each replica pinned the first definitions in its own lock; the upstream then changed.
    list_at_stage(wa.path(), "v1");
    list_at_stage(wb.path(), "v1");
    let start = |dir: &Path, name: &str| {
        let mut cmd = Command::new(ring0());
        cmd.arg("--state-dir")
            .arg(dir.join(format!(".ring0-{name}")))
            .args(["serve", "--http", "127.0.0.1:0", "--journal", &journal])
            .current_dir(dir)
            .env("HOME", test_home())
            .env("FIXTURE_STAGE", "v2");
        start_http(cmd)
    };
    let _a = start(wa.path(), "a");
    let b = start(wb.path(), "b");
    assert!(
        !listed(&b).contains(&"fx__send_mail".to_string()),
        "the changed tool is quarantined"
    );
    // A person approves the change on replica A (its lock, its state directory).
    let out = Command::new(ring0())
        .arg("--state-dir")
        .arg(wa.path().join(".ring0-a"))
        .args(["approve-tool", "fx__send_mail"])
        .current_dir(wa.path())
        .env("HOME", test_home())
        .env("FIXTURE_STAGE", "v2")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Replica B follows: the tool is listed there, and B's own lock holds the approval.
    let deadline = Instant::now() + HTTP_WAIT;
    while !listed(&b).contains(&"fx__send_mail".to_string()) {
        assert!(Instant::now() < deadline, "replica B never followed");
        std::thread::sleep(Duration::from_millis(200));
    }
    let lock_a = std::fs::read_to_string(wa.path().join("ring0.lock")).unwrap();
    let lock_b = std::fs::read_to_string(wb.path().join("ring0.lock")).unwrap();
    let pin_of = |lock: &str| {
        lock.lines()
            .find(|l| l.trim_start().starts_with("send_mail"))
            .map(str::to_string)
    };
    assert_eq!(pin_of(&lock_a), pin_of(&lock_b), "{lock_a}\n{lock_b}");
}
