//! What a client carries from one replica to another behind a load balancer: a 2026-07-28
//! `requestState` (sealed with the deployment's shared key, bound to the call and principal,
//! answered on any replica), a sessionful session (recorded in the shared journal, served by
//! any replica, deleted for all), and the tools a conversation loaded in the catalog's search
//! mode (listed by every replica). Two `ring0 serve --http` replicas on one PostgreSQL journal;
//! effects are counted by the upstream `cx__record` (tests/fixtures/counting_upstream.py).

mod common;
mod replica_support;

use common::*;
use replica_support::*;
use serde_json::{Value, json};

const ALICE: &str = "Bearer alice-token";
const BOB: &str = "Bearer bob-token";

fn modern_meta(elicitation: bool) -> Value {
    let capabilities = if elicitation {
        json!({"elicitation": {}})
    } else {
        json!({})
    };
    json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
           "io.modelcontextprotocol/clientCapabilities": capabilities,
           "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"}})
}

/// A stateless `tools/call` of `cx__record` with `text`, as `who`, with `extra` params.
fn stateless_call(addr: &str, who: &str, text: &str, extra: Value) -> Value {
    let mut params = json!({"name": "cx__record", "arguments": {"text": text},
                            "_meta": modern_meta(true)});
    for (k, v) in extra.as_object().unwrap() {
        params[k] = v.clone();
    }
    let headers = [
        ("Authorization", who),
        ("MCP-Protocol-Version", "2026-07-28"),
        ("Mcp-Method", "tools/call"),
        ("Mcp-Name", "cx__record"),
    ];
    post(
        addr,
        &headers,
        &json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": params}),
    )
    .1
}

fn approve() -> Value {
    json!({"q1": {"action": "accept", "content": {"approve": true}}})
}

fn error_message(answer: &Value) -> String {
    answer["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("an error: {answer}"))
        .to_string()
}

#[test]
fn a_question_asked_on_one_replica_is_answered_on_another_and_the_call_runs_once() {
    let Some(url) = test_database() else { return };
    let Some(peers) = peers() else { return };
    let journal = schema_in(&url);
    let dir = workspace(&peers, "A3", &alice_and_bob_tokens());
    let a = replica(dir.path(), "a", &journal);
    let b = replica(dir.path(), "b", &journal);
    // A3: the call is held for approval, asked through an input_required result of replica A.
    let asked = stateless_call(&a.addr, ALICE, "approved", json!({}));
    assert_eq!(asked["result"]["resultType"], "input_required", "{asked}");
    assert_eq!(
        asked["result"]["inputRequests"]["q1"]["method"], "elicitation/create",
        "{asked}"
    );
    let state = asked["result"]["requestState"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(state.starts_with("r0s1."), "{state}");
    // Altered on the way: refused by B before anything is looked up.
    let mut altered = state.clone().into_bytes();
    let i = altered.len() - 3;
    altered[i] = if altered[i] == b'A' { b'B' } else { b'A' };
    let altered = String::from_utf8(altered).unwrap();
    let refused = stateless_call(
        &b.addr,
        ALICE,
        "approved",
        json!({"requestState": altered, "inputResponses": approve()}),
    );
    assert!(
        error_message(&refused).contains("not one ring0 issued"),
        "{refused}"
    );
    // Another principal's retry with the genuine state: refused, and the call stays parked.
    let refused = stateless_call(
        &b.addr,
        BOB,
        "approved",
        json!({"requestState": state, "inputResponses": approve()}),
    );
    assert!(
        error_message(&refused).contains("different call or principal"),
        "{refused}"
    );
    // The same principal's retry with other arguments: refused too.
    let refused = stateless_call(
        &b.addr,
        ALICE,
        "other",
        json!({"requestState": state, "inputResponses": approve()}),
    );
    assert!(
        error_message(&refused).contains("different call or principal"),
        "{refused}"
    );
    assert!(effects_by_text(dir.path()).is_empty(), "nothing ran yet");
    // The genuine retry reaches B: the call A parked resumes and runs once.
    let done = stateless_call(
        &b.addr,
        ALICE,
        "approved",
        json!({"requestState": state, "inputResponses": approve()}),
    );
    assert_eq!(done["result"]["isError"], json!(false), "{done}");
    let inner: Value =
        serde_json::from_str(done["result"]["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(inner["text"], "approved", "{done}");
    assert_eq!(effects_by_text(dir.path()).get("approved"), Some(&1));
    // Used once: the same state again is refused wherever it lands.
    for replica in [&a, &b] {
        let again = stateless_call(
            &replica.addr,
            ALICE,
            "approved",
            json!({"requestState": state, "inputResponses": approve()}),
        );
        assert!(error_message(&again).contains("unknown"), "{again}");
    }
    assert_eq!(effects_by_text(dir.path()).get("approved"), Some(&1));
}

/// A sessionful request in session `session` as `who`.
fn in_session(addr: &str, session: &str, who: &str, message: &Value) -> (String, Value) {
    let headers = [
        ("Authorization", who),
        ("Mcp-Session-Id", session),
        ("MCP-Protocol-Version", "2025-06-18"),
    ];
    if message.get("id").is_some() {
        post(addr, &headers, message)
    } else {
        let (head, _) = post_raw(addr, &headers, message);
        (head, Value::Null)
    }
}

/// DELETE of `session` as `who`: the response's status.
fn delete_session(addr: &str, session: &str, who: &str) -> u16 {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(HTTP_WAIT)).unwrap();
    let request = format!(
        "DELETE /mcp HTTP/1.1\r\nHost: {addr}\r\nAuthorization: {who}\r\n\
         Mcp-Session-Id: {session}\r\nMCP-Protocol-Version: 2025-06-18\r\n\
         Connection: close\r\n\r\n"
    );
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    status(&out)
}

#[test]
fn a_session_opened_on_one_replica_is_served_by_another_until_deleted_for_all() {
    let Some(url) = test_database() else { return };
    let Some(peers) = peers() else { return };
    let journal = schema_in(&url);
    let dir = workspace(&peers, "A2", &alice_and_bob_tokens());
    let a = replica(dir.path(), "a", &journal);
    let b = replica(dir.path(), "b", &journal);
    let (head, init) = post(
        &a.addr,
        &[("Authorization", ALICE)],
        &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                           "clientInfo": {"name": "shared-session", "version": "1"}}}),
    );
    assert!(init.get("result").is_some(), "{init}");
    let session = session_id(&head);
    in_session(
        &a.addr,
        &session,
        ALICE,
        &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    );
    // Replica B never saw the handshake, and serves the session.
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "cx__record", "arguments": {"text": "via-b"},
                   "_meta": {"io.ring0/idempotency-key": "k-via-b"}}});
    let (head, answer) = in_session(&b.addr, &session, ALICE, &call);
    assert_eq!(status(&head), 200, "{head}");
    assert_eq!(answer["result"]["isError"], json!(false), "{answer}");
    assert_eq!(effects_by_text(dir.path()).get("via-b"), Some(&1));
    // Another principal naming it is refused as if it did not exist, on either replica.
    for replica in [&a, &b] {
        let (head, _) = post_raw(
            &replica.addr,
            &[
                ("Authorization", BOB),
                ("Mcp-Session-Id", session.as_str()),
                ("MCP-Protocol-Version", "2025-06-18"),
            ],
            &json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": {}}),
        );
        assert_eq!(status(&head), 404, "{head}");
    }
    // Deleted through B: A, which opened it, refuses it from now on.
    assert!(matches!(
        delete_session(&b.addr, &session, ALICE),
        200..=299
    ));
    let (head, _) = post_raw(
        &a.addr,
        &[
            ("Authorization", ALICE),
            ("Mcp-Session-Id", session.as_str()),
            ("MCP-Protocol-Version", "2025-06-18"),
        ],
        &json!({"jsonrpc": "2.0", "id": 4, "method": "tools/list", "params": {}}),
    );
    assert_eq!(status(&head), 404, "{head}");
    assert_eq!(
        sql_count(&journal, "SELECT count(*) FROM mcp_sessions"),
        0,
        "the shared record is gone"
    );
}

#[test]
fn a_session_survives_the_restart_of_the_replica_that_opened_it() {
    let Some(url) = test_database() else { return };
    let Some(peers) = peers() else { return };
    let journal = schema_in(&url);
    let dir = workspace(&peers, "A2", &alice_and_bob_tokens());
    let mut a = replica(dir.path(), "a", &journal);
    let (head, _) = post(
        &a.addr,
        &[("Authorization", ALICE)],
        &initialize_request(1, "2025-11-25"),
    );
    let session = session_id(&head);
    in_session(
        &a.addr,
        &session,
        ALICE,
        &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    );
    a.child.kill().unwrap();
    let _ = a.child.wait();
    let a = replica(dir.path(), "a", &journal);
    let (head, listed) = in_session(
        &a.addr,
        &session,
        ALICE,
        &json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}),
    );
    assert_eq!(status(&head), 200, "{head}");
    let names: Vec<&str> = listed["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(names.contains(&"cx__record"), "{listed}");
}

/// Whether a `sleep SECS` process is running, found by its command line in /proc.
fn sleeping(secs: &str) -> bool {
    let wanted = format!("sleep\0{secs}\0");
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| std::fs::read(e.path().join("cmdline")).is_ok_and(|c| c == wanted.as_bytes()))
}

/// The `job_…` handle in a `shell` result.
fn job_handle(answer: &Value) -> String {
    let text = answer.to_string();
    let at = text
        .find("job_")
        .unwrap_or_else(|| panic!("no job: {answer}"));
    text[at..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

#[test]
fn another_replica_answers_about_a_background_job_and_reports_it_killed_with_its_replica() {
    let Some(url) = test_database() else { return };
    let Some(peers) = peers() else { return };
    let journal = schema_in(&url);
    let grants = "[[grants]]\nname = \"jobs\"\ntools = [\"shell\"]\nceiling = \"A2\"\n\
                  rules = [\"args.argv[0] == 'sh'\"]\nunattended = true\n\n\
                  [[grants]]\nname = \"job-tools\"\ntools = [\"job_inspect\", \"job_wait\"]\n\
                  ceiling = \"A1\"\n";
    let dir = workspace(&peers, "A2", grants);
    std::fs::write(
        dir.path().join("run.sh"),
        "echo started > \"$1.tmp\"; mv \"$1.tmp\" \"$1\"; exec sleep \"$2\"\n",
    )
    .unwrap();
    let mut a = replica(dir.path(), "a", &journal);
    let b = replica(dir.path(), "b", &journal);
    let (head, _) = post(&a.addr, &[], &initialize_request(1, "2025-06-18"));
    let session = session_id(&head);
    let headers = [
        ("Mcp-Session-Id", session.as_str()),
        ("MCP-Protocol-Version", "2025-06-18"),
    ];
    post_raw(
        &a.addr,
        &headers,
        &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    );
    let (_, started) = post(
        &a.addr,
        &headers,
        &json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                "params": {"name": "shell", "arguments": {
                    "argv": ["sh", "run.sh", "job.pid", "3101"], "background": true}}}),
    );
    let job = job_handle(&started);
    wait_for_file_text(&dir.path().join("job.pid"), "started", "the job runs");
    let inspect = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                         "params": {"name": "job_inspect", "arguments": {"job": job}}});
    // Replica B runs no such job, and answers from A's record.
    let (_, seen) = post(&b.addr, &headers, &inspect);
    let text = seen.to_string();
    assert_eq!(seen["result"]["isError"], json!(false), "{seen}");
    assert!(text.contains("runs on replica"), "{seen}");
    assert!(!text.contains("KILLED"), "{seen}");
    a.child.kill().unwrap(); // SIGKILL
    let _ = a.child.wait();
    // Once A's lease lapsed, B reports the job killed: its process tree ended with A. (Each
    // look asks for another tail length: the same call repeated would be stopped as a loop.)
    let deadline = std::time::Instant::now() + HTTP_WAIT;
    for look in 1.. {
        let (_, seen) = post(
            &b.addr,
            &headers,
            &json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                    "params": {"name": "job_inspect",
                               "arguments": {"job": job, "tail_lines": look}}}),
        );
        if seen.to_string().contains("KILLED") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never KILLED: {seen}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let (_, waited) = post(
        &b.addr,
        &headers,
        &json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call",
                "params": {"name": "job_wait", "arguments": {"job": job, "timeout_ms": 1000}}}),
    );
    assert!(waited.to_string().contains("KILLED"), "{waited}");
    let deadline = std::time::Instant::now() + HTTP_WAIT;
    while sleeping("3101") {
        assert!(
            std::time::Instant::now() < deadline,
            "the job outlived its replica"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn a_job_cancelled_through_another_replica_is_cancelled_by_the_replica_that_runs_it() {
    let Some(url) = test_database() else { return };
    let Some(peers) = peers() else { return };
    let journal = schema_in(&url);
    let grants = "[[grants]]\nname = \"jobs\"\ntools = [\"shell\"]\nceiling = \"A2\"\n\
                  rules = [\"args.argv[0] == 'sh'\"]\nunattended = true\n\n\
                  [[grants]]\nname = \"job-tools\"\ntools = [\"job_cancel\"]\nceiling = \"A1\"\n";
    let dir = workspace(&peers, "A2", grants);
    std::fs::write(
        dir.path().join("run.sh"),
        "echo started > \"$1.tmp\"; mv \"$1.tmp\" \"$1\"; exec sleep \"$2\"\n",
    )
    .unwrap();
    let a = replica(dir.path(), "a", &journal);
    let b = replica(dir.path(), "b", &journal);
    let (head, _) = post(&a.addr, &[], &initialize_request(1, "2025-06-18"));
    let session = session_id(&head);
    let headers = [
        ("Mcp-Session-Id", session.as_str()),
        ("MCP-Protocol-Version", "2025-06-18"),
    ];
    post_raw(
        &a.addr,
        &headers,
        &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    );
    let (_, started) = post(
        &a.addr,
        &headers,
        &json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                "params": {"name": "shell", "arguments": {
                    "argv": ["sh", "run.sh", "cancel.pid", "3102"], "background": true}}}),
    );
    let job = job_handle(&started);
    wait_for_file_text(&dir.path().join("cancel.pid"), "started", "the job runs");
    let deadline = std::time::Instant::now() + HTTP_WAIT;
    while !sleeping("3102") {
        assert!(std::time::Instant::now() < deadline, "the job sleeps");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // Asked of B, which runs no such job: A, which does, cancels it, and B answers its end.
    let (_, cancelled) = post(
        &b.addr,
        &headers,
        &json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                "params": {"name": "job_cancel", "arguments": {"job": job}}}),
    );
    assert_eq!(cancelled["result"]["isError"], json!(false), "{cancelled}");
    assert!(cancelled.to_string().contains("KILLED"), "{cancelled}");
    let deadline = std::time::Instant::now() + HTTP_WAIT;
    while sleeping("3102") {
        assert!(
            std::time::Instant::now() < deadline,
            "the job was not cancelled"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    drop(a);
}

#[test]
fn a_job_task_created_on_one_replica_is_followed_and_cancelled_through_another() {
    let Some(url) = test_database() else { return };
    let Some(peers) = peers() else { return };
    let journal = schema_in(&url);
    let grants = "[[grants]]\nname = \"jobs\"\ntools = [\"shell\"]\nceiling = \"A2\"\n\
                  rules = [\"args.argv[0] == 'sh'\"]\nunattended = true\n\n\
                  [[grants]]\nname = \"job-tools\"\n\
                  tools = [\"job_inspect\", \"job_wait\", \"job_cancel\"]\nceiling = \"A1\"\n";
    let dir = workspace(&peers, "A2", grants);
    std::fs::write(
        dir.path().join("run.sh"),
        "echo started > \"$1.tmp\"; mv \"$1.tmp\" \"$1\"; exec sleep \"$2\"\n",
    )
    .unwrap();
    let a = replica(dir.path(), "a", &journal);
    let b = replica(dir.path(), "b", &journal);
    let (head, _) = post(
        &a.addr,
        &[],
        &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"protocolVersion": "2025-11-25",
                           "capabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}},
                           "clientInfo": {"name": "tasks", "version": "1"}}}),
    );
    let session = session_id(&head);
    let headers = [
        ("Mcp-Session-Id", session.as_str()),
        ("MCP-Protocol-Version", "2025-11-25"),
    ];
    post_raw(
        &a.addr,
        &headers,
        &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    );
    let (_, created) = post(
        &a.addr,
        &headers,
        &json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                "params": {"name": "shell", "arguments": {
                    "argv": ["sh", "run.sh", "task.pid", "3103"], "background": true}}}),
    );
    assert_eq!(created["result"]["resultType"], "task", "{created}");
    let id = created["result"]["taskId"].as_str().unwrap().to_string();
    wait_for_file_text(&dir.path().join("task.pid"), "started", "the job runs");
    // B never created it, and follows it through the job's shared record.
    let (_, working) = post(
        &b.addr,
        &headers,
        &json!({"jsonrpc": "2.0", "id": 3, "method": "tasks/get", "params": {"taskId": id}}),
    );
    assert_eq!(working["result"]["status"], "working", "{working}");
    let (_, ack) = post(
        &b.addr,
        &headers,
        &json!({"jsonrpc": "2.0", "id": 4, "method": "tasks/cancel", "params": {"taskId": id}}),
    );
    assert!(ack.get("error").is_none(), "{ack}");
    let deadline = std::time::Instant::now() + HTTP_WAIT;
    while sleeping("3103") {
        assert!(
            std::time::Instant::now() < deadline,
            "the job was not cancelled"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let (_, after) = post(
        &b.addr,
        &headers,
        &json!({"jsonrpc": "2.0", "id": 5, "method": "tasks/get", "params": {"taskId": id}}),
    );
    assert_eq!(after["result"]["status"], "cancelled", "{after}");
    // A, which created it, reports it cancelled too.
    let deadline = std::time::Instant::now() + HTTP_WAIT;
    loop {
        let (_, on_a) = post(
            &a.addr,
            &headers,
            &json!({"jsonrpc": "2.0", "id": 8, "method": "tasks/get", "params": {"taskId": id}}),
        );
        if on_a["result"]["status"] != "working" {
            assert_eq!(on_a["result"]["status"], "cancelled", "{on_a}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{on_a}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // Another session naming the task is answered as if it did not exist.
    let (head, _) = post(&b.addr, &[], &initialize_request(6, "2025-11-25"));
    let other = session_id(&head);
    let (_, foreign) = post(
        &b.addr,
        &[
            ("Mcp-Session-Id", other.as_str()),
            ("MCP-Protocol-Version", "2025-11-25"),
        ],
        &json!({"jsonrpc": "2.0", "id": 7, "method": "tasks/get", "params": {"taskId": id}}),
    );
    assert!(foreign.get("error").is_some(), "{foreign}");
}

/// The pid of the `sleep SECS` process, if one runs.
fn sleeper(secs: &str) -> Option<String> {
    let wanted = format!("sleep\0{secs}\0");
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        (cmdline == wanted.as_bytes()).then(|| e.file_name().to_string_lossy().into_owned())
    })
}

#[test]
fn a_session_deleted_through_another_replica_ends_its_jobs_there_except_detached_ones() {
    let Some(url) = test_database() else { return };
    let Some(peers) = peers() else { return };
    let journal = schema_in(&url);
    let grants = "[[grants]]\nname = \"jobs\"\ntools = [\"shell\"]\nceiling = \"A2\"\n\
                  rules = [\"args.argv[0] == 'sh'\"]\nunattended = true\n";
    let dir = workspace(&peers, "A2", grants);
    std::fs::write(
        dir.path().join("run.sh"),
        "echo started > \"$1.tmp\"; mv \"$1.tmp\" \"$1\"; exec sleep \"$2\"\n",
    )
    .unwrap();
    let a = replica(dir.path(), "a", &journal);
    let b = replica(dir.path(), "b", &journal);
    let (head, _) = post(&a.addr, &[], &initialize_request(1, "2025-06-18"));
    let session = session_id(&head);
    let headers = [
        ("Mcp-Session-Id", session.as_str()),
        ("MCP-Protocol-Version", "2025-06-18"),
    ];
    post_raw(
        &a.addr,
        &headers,
        &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    );
    for (id, file, secs, detached) in [
        (2, "bound.pid", "3105", false),
        (3, "detached.pid", "3106", true),
    ] {
        let (_, r) = post(
            &a.addr,
            &headers,
            &json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                    "params": {"name": "shell", "arguments": {
                        "argv": ["sh", "run.sh", file, secs], "background": true,
                        "detached": detached}}}),
        );
        assert!(r.to_string().contains("job_"), "a job started: {r}");
        wait_for_file_text(&dir.path().join(file), "started", "the job runs");
    }
    let deadline = std::time::Instant::now() + HTTP_WAIT;
    while sleeper("3105").is_none() || sleeper("3106").is_none() {
        assert!(std::time::Instant::now() < deadline, "both jobs sleep");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // Deleted through B, which runs neither job: A ends the bound one.
    assert!(matches!(
        delete_session(&b.addr, &session, "Bearer none"),
        200..=299
    ));
    let deadline = std::time::Instant::now() + HTTP_WAIT;
    while sleeper("3105").is_some() {
        assert!(
            std::time::Instant::now() < deadline,
            "the session's job outlived it"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let detached = sleeper("3106");
    if let Some(pid) = &detached {
        let _ = std::process::Command::new("kill")
            .args(["-9", pid])
            .status();
    }
    assert!(detached.is_some(), "a detached job outlives its session");
    drop(a);
}

/// The catalog in search mode with no pinned core: `cx__record` is listed only once loaded.
const SEARCH_MODE: &str = "[catalog]\nmode = \"search\"\npinned = []\n";

/// The names of a `tools/list` answer.
fn listed(answer: &Value) -> Vec<String> {
    answer["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("a listing: {answer}"))
        .iter()
        .filter_map(|t| t["name"].as_str().map(str::to_string))
        .collect()
}

/// The `load_tools` call of `names`.
fn load_tools(id: u64, names: &[&str], meta: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": "load_tools", "arguments": {"names": names}, "_meta": meta}})
}

#[test]
fn a_tool_loaded_through_one_replica_is_listed_and_callable_in_the_session_on_another() {
    let Some(url) = test_database() else { return };
    let Some(peers) = peers() else { return };
    let journal = schema_in(&url);
    let extra = format!("{}\n{SEARCH_MODE}", alice_and_bob_tokens());
    let dir = workspace(&peers, "A2", &extra);
    let a = replica(dir.path(), "a", &journal);
    let b = replica(dir.path(), "b", &journal);
    let (head, _) = post(
        &a.addr,
        &[("Authorization", ALICE)],
        &initialize_request(1, "2025-06-18"),
    );
    let session = session_id(&head);
    in_session(
        &a.addr,
        &session,
        ALICE,
        &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    );
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}});
    let (_, before) = in_session(&b.addr, &session, ALICE, &list);
    assert_eq!(listed(&before), ["search_tools", "load_tools"], "{before}");
    let (_, loaded) = in_session(
        &a.addr,
        &session,
        ALICE,
        &load_tools(3, &["cx__record"], json!({})),
    );
    assert_eq!(loaded["result"]["isError"], json!(false), "{loaded}");
    assert!(loaded.to_string().contains("cx__record"), "{loaded}");
    // Replica B lists what the session loaded through A, in the same place.
    let (_, after) = in_session(&b.addr, &session, ALICE, &list);
    assert_eq!(
        listed(&after),
        ["search_tools", "load_tools", "cx__record"],
        "{after}"
    );
    let call = json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call",
        "params": {"name": "cx__record", "arguments": {"text": "loaded-on-a"},
                   "_meta": {"io.ring0/idempotency-key": "k-loaded"}}});
    let (_, answer) = in_session(&b.addr, &session, ALICE, &call);
    assert_eq!(answer["result"]["isError"], json!(false), "{answer}");
    assert_eq!(effects_by_text(dir.path()).get("loaded-on-a"), Some(&1));
    // Another session of the same principal loaded nothing.
    let (head, _) = post(
        &b.addr,
        &[("Authorization", ALICE)],
        &initialize_request(5, "2025-06-18"),
    );
    let (_, other) = in_session(&b.addr, &session_id(&head), ALICE, &list);
    assert_eq!(listed(&other), ["search_tools", "load_tools"], "{other}");
}

/// A stateless 2026-07-28 request of `method` as `who`, with its `name` header when given.
fn stateless(addr: &str, who: &str, method: &str, name: Option<&str>, message: &Value) -> Value {
    let mut headers = vec![
        ("Authorization", who),
        ("MCP-Protocol-Version", "2026-07-28"),
        ("Mcp-Method", method),
    ];
    if let Some(name) = name {
        headers.push(("Mcp-Name", name));
    }
    post(addr, &headers, message).1
}

#[test]
fn a_tool_loaded_by_a_stateless_request_on_one_replica_is_listed_by_the_next_on_another() {
    let Some(url) = test_database() else { return };
    let Some(peers) = peers() else { return };
    let journal = schema_in(&url);
    let extra = format!("{}\n{SEARCH_MODE}", alice_and_bob_tokens());
    let dir = workspace(&peers, "A2", &extra);
    let a = replica(dir.path(), "a", &journal);
    let b = replica(dir.path(), "b", &journal);
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list",
                      "params": {"_meta": modern_meta(false)}});
    let load = load_tools(2, &["cx__record"], modern_meta(false));
    let loaded = stateless(&a.addr, ALICE, "tools/call", Some("load_tools"), &load);
    assert_eq!(loaded["result"]["isError"], json!(false), "{loaded}");
    let after = stateless(&b.addr, ALICE, "tools/list", None, &list);
    assert_eq!(
        listed(&after),
        ["search_tools", "load_tools", "cx__record"],
        "the next request, on another replica, lists the load: {after}"
    );
    let called = stateless_call(&b.addr, ALICE, "stateless-on-b", json!({}));
    assert_eq!(called["result"]["isError"], json!(false), "{called}");
    // Another principal's scope is its own.
    let bobs = stateless(&b.addr, BOB, "tools/list", None, &list);
    assert_eq!(listed(&bobs), ["search_tools", "load_tools"], "{bobs}");
}
