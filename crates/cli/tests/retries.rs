//! Retries versus repeats over MCP, through the real `ring0 serve` with the Python MCP SDK
//! client over stdio and Streamable HTTP, in both protocol eras.
//!
//! A retry (the same call again because its answer never arrived: a dropped stream, a new
//! session, a stateless re-issue, a restarted ring0) has its effect once; a repeat (the same
//! call again after its answer was delivered) runs again. Effects are counted in the lines of
//! `effects.log`, which the upstream tool `fx__append` (tests/fixtures/effect_upstream.py)
//! appends to.

mod common;

use common::*;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// A workspace whose `ring0.toml` grants the built-in file tools and the effect upstream's
/// `fx__append` (an A2 call settled by its idempotency key: never held for a person), with two
/// bearer tokens (`alice-token`, `bob-token`) for HTTP.
fn workspace(peers: &Path) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[workspace]\nstate_dir = \".ring0\"\n\n\
         [[grants]]\nname = \"files\"\ntools = [\"read_file\", \"write_file\", \"apply_patch\"]\nceiling = \"A1\"\n\n\
         [[grants]]\nname = \"effects\"\ntools = [\"fx__append\", \"fx__append_lane\"]\nceiling = \"A2\"\n\n\
         [[upstreams]]\nalias = \"fx\"\ncommand = {:?}\nargs = [{:?}, \"--dir\", {:?}]\n\n\
         [upstreams.tools.append]\neffect = \"non_idempotent\"\nauthority = \"A2\"\n\
         strategy = [\"exploitation\"]\nsettlement = \"idempotency_key\"\n\n\
         [upstreams.tools.append_lane]\neffect = \"non_idempotent\"\nauthority = \"A2\"\n\
         strategy = [\"exploitation\"]\nsettlement = \"idempotency_key\"\n\
         conflict_key = \"lane:{{lane}}\"\n",
        python(peers).display().to_string(),
        fixtures().join("effect_upstream.py").display().to_string(),
        dir.path().display().to_string(),
    );
    std::fs::write(dir.path().join("ring0.toml"), config).unwrap();
    dir
}

/// The same workspace served over HTTP, with the two tokens.
fn serve_http(dir: &Path) -> HttpServer {
    let mut config = std::fs::read_to_string(dir.join("ring0.toml")).unwrap();
    config.push('\n');
    config.push_str(&alice_and_bob_tokens());
    std::fs::write(dir.join("ring0.toml"), config).unwrap();
    let mut cmd = serve_http_command(dir);
    cmd.stdin(Stdio::null()).stdout(Stdio::null());
    start_http(cmd)
}

/// Runs one scenario of `py_client_retries.py` against `server` (a URL, or the ring0 binary for
/// stdio) in `mode`, as the principal of `token` over HTTP.
fn client(
    peers: &Path,
    scenario: &str,
    dir: &Path,
    server: &str,
    mode: &str,
    token: &str,
) -> Value {
    let out = python_report(
        Command::new(python(peers))
            .arg(fixtures().join("py_client_retries.py"))
            .args([scenario, &dir.display().to_string(), server, mode, token]),
    );
    assert!(out.get("error").is_none(), "{scenario}: {out}");
    out
}

/// How many times `text` was appended to the effects log.
fn effects(dir: &Path, text: &str) -> usize {
    std::fs::read_to_string(dir.join("effects.log"))
        .unwrap_or_default()
        .lines()
        .filter(|l| *l == text)
        .count()
}

fn appended_text(seen: &Value) -> Value {
    let text = seen["text"].as_str().unwrap_or("");
    serde_json::from_str::<Value>(text).unwrap_or(Value::Null)["text"].clone()
}

/// A keyed call whose answer was dropped, retried in the same session and then from a new
/// one: one effect, and the recorded result each time.
fn one_effect_for_a_keyed_retry(server: &str, dir: &Path, peers: &Path, mode: &str) {
    let seen = client(peers, "dropped_keyed", dir, server, mode, "alice-token");
    assert_eq!(seen["retry"]["is_error"], false, "{seen}");
    assert_eq!(appended_text(&seen["retry"]), "keyed", "{seen}");
    assert_eq!(
        effects(dir, "keyed"),
        1,
        "a keyed retry in one session: {seen}"
    );
    let again = client(peers, "keyed", dir, server, mode, "alice-token");
    assert_eq!(again["again"]["is_error"], false, "{again}");
    assert_eq!(appended_text(&again["again"]), "keyed", "{again}");
    assert_eq!(
        effects(dir, "keyed"),
        1,
        "a keyed call from a new session: {again}"
    );
}

/// An unkeyed call whose answer was dropped, made again: answered with its result, one effect.
fn one_effect_for_an_unkeyed_retry(server: &str, dir: &Path, peers: &Path, mode: &str) {
    let seen = client(peers, "dropped_unkeyed", dir, server, mode, "alice-token");
    assert_eq!(seen["retry"]["is_error"], false, "{seen}");
    assert_eq!(appended_text(&seen["retry"]), "unkeyed", "{seen}");
    assert_eq!(effects(dir, "unkeyed"), 1, "{seen}");
}

/// Three tests of `scenario`, named in order for its run over stdio, sessionful HTTP and
/// stateless (2026-07-28) HTTP.
macro_rules! over_each_transport {
    ($scenario:ident: $stdio:ident, $sessionful:ident, $stateless:ident) => {
        #[test]
        fn $stdio() {
            over(Over::Stdio, $scenario);
        }

        #[test]
        fn $sessionful() {
            over(Over::SessionfulHttp, $scenario);
        }

        #[test]
        fn $stateless() {
            over(Over::StatelessHttp, $scenario);
        }
    };
}

/// Where a scenario's client reaches ring0, and in which era.
enum Over {
    Stdio,
    SessionfulHttp,
    StatelessHttp,
}

/// Runs `scenario(server, workspace, peers, mode)` in a fresh workspace, its client reaching
/// ring0 `over` stdio (`server` is the ring0 binary) or HTTP (`server` is the URL).
fn over(over: Over, scenario: fn(&str, &Path, &Path, &str)) {
    let Some(peers) = peers() else { return };
    let dir = workspace(&peers);
    let (server, mode) = match over {
        Over::Stdio => (None, "legacy"),
        Over::SessionfulHttp => (Some(serve_http(dir.path())), "legacy"),
        Over::StatelessHttp => (Some(serve_http(dir.path())), "2026-07-28"),
    };
    let url = match &server {
        Some(s) => s.url(),
        None => ring0().display().to_string(),
    };
    scenario(&url, dir.path(), &peers, mode);
}

over_each_transport!(
    one_effect_for_a_keyed_retry:
    a_keyed_retry_has_one_effect_over_stdio,
    a_keyed_retry_has_one_effect_over_sessionful_http,
    a_keyed_retry_has_one_effect_over_stateless_http
);

over_each_transport!(
    one_effect_for_an_unkeyed_retry:
    an_unkeyed_retry_of_an_undelivered_answer_has_one_effect_over_stdio,
    an_unkeyed_retry_of_an_undelivered_answer_has_one_effect_over_sessionful_http,
    an_unkeyed_retry_of_an_undelivered_answer_has_one_effect_over_stateless_http
);

#[test]
fn a_keyed_call_re_issued_in_the_other_era_has_one_effect() {
    let Some(peers) = peers() else { return };
    let dir = workspace(&peers);
    let server = serve_http(dir.path());
    let seen = client(
        &peers,
        "dropped_keyed",
        dir.path(),
        &server.url(),
        "legacy",
        "alice-token",
    );
    assert_eq!(seen["retry"]["is_error"], false, "{seen}");
    assert_eq!(appended_text(&seen["retry"]), "keyed", "{seen}");
    // The same key as a 2026-07-28 request: the result recorded for the sessionful call.
    let again = client(
        &peers,
        "keyed",
        dir.path(),
        &server.url(),
        "2026-07-28",
        "alice-token",
    );
    assert_eq!(again["again"]["is_error"], false, "{again}");
    assert_eq!(appended_text(&again["again"]), "keyed", "{again}");
    assert_eq!(effects(dir.path(), "keyed"), 1, "{again}");
}

/// Write A, B, A; a read after a change; two appends; an apply_patch twice: each ran.
fn repeats_run_again(target: &str, dir: &Path, peers: &Path, mode: &str) {
    let seen = client(peers, "repeats", dir, target, mode, "alice-token");
    let label = format!("{target} {mode}");
    for w in seen["writes"].as_array().unwrap() {
        assert_eq!(w["is_error"], false, "{label}: {seen}");
    }
    // Write A, B, A: A is on disk, as ring0 said.
    assert_eq!(
        std::fs::read_to_string(dir.join("aba.txt")).unwrap(),
        "A\n",
        "{label}: {seen}"
    );
    assert!(
        seen["aba_read"]["text"].as_str().unwrap().contains('A'),
        "{label}: {seen}"
    );
    // A read after a change shows the change.
    assert!(
        seen["state_1"]["text"]
            .as_str()
            .unwrap()
            .contains("version 1"),
        "{label}: {seen}"
    );
    assert!(
        seen["state_2"]["text"]
            .as_str()
            .unwrap()
            .contains("version 2"),
        "{label}: {seen}"
    );
    // Two unkeyed appends, each delivered: two effects.
    assert_eq!(effects(dir, "again"), 2, "{label}: {seen}");
    // An apply_patch applied, delivered and asked again applies again.
    assert_eq!(
        std::fs::read_to_string(dir.join("patched.txt")).unwrap(),
        "one\ntwo\ntwo\n",
        "{label}: {seen}"
    );
}

over_each_transport!(
    repeats_run_again:
    repeats_run_again_over_stdio,
    repeats_run_again_over_sessionful_http,
    repeats_run_again_over_stateless_http
);

#[test]
fn a_named_scope_keeps_a_retry_across_connections_and_is_bound_to_its_principal() {
    let Some(peers) = peers() else { return };
    let dir = workspace(&peers);
    let server = serve_http(dir.path());
    let url = server.url();
    client(&peers, "scoped", dir.path(), &url, "legacy", "alice-token");
    assert_eq!(effects(dir.path(), "scoped"), 1);
    // Alice, from a new connection in the same scope: her undelivered result, no second effect.
    let alice = client(
        &peers,
        "rescoped",
        dir.path(),
        &url,
        "legacy",
        "alice-token",
    );
    assert_eq!(alice["again"]["is_error"], false, "{alice}");
    assert_eq!(effects(dir.path(), "scoped"), 1, "{alice}");
    // Bob naming the same scope string is in a scope of his own: his call runs.
    let bob = client(
        &peers,
        "rescoped",
        dir.path(),
        &url,
        "2026-07-28",
        "bob-token",
    );
    assert_eq!(bob["again"]["is_error"], false, "{bob}");
    assert_eq!(effects(dir.path(), "scoped"), 2, "{bob}");
}

#[test]
fn a_scope_longer_than_its_bound_is_refused_with_a_structured_error() {
    let Some(peers) = peers() else { return };
    let dir = workspace(&peers);
    let (mut child, mut stdin, rx) = stdio_session(dir.path());
    let long = "s".repeat(ring0_mcp::limits::SCOPE_BYTES_MAX + 1);
    send(
        &mut stdin,
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "read_file", "arguments": {"path": "ring0.toml"},
            "_meta": {"io.ring0/scope": long}}}),
    );
    let refused = answer(&rx, 2);
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    assert_eq!(
        refused["error"]["data"]["kind"], "invalid_length",
        "{refused}"
    );
    // params.idempotencyKey and _meta's key disagreeing: refused, nothing runs.
    send(
        &mut stdin,
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
            "name": "fx__append", "arguments": {"text": "never"}, "idempotencyKey": "a",
            "_meta": {"io.ring0/idempotency-key": "b"}}}),
    );
    let mismatch = answer(&rx, 3);
    assert_eq!(
        mismatch["error"]["data"]["kind"], "idempotency_key_mismatch",
        "{mismatch}"
    );
    assert_eq!(effects(dir.path(), "never"), 0);
    drop(stdin);
    let _ = child.wait();
}

/// Starts `ring0 serve` over stdio in `dir` and initializes it; returns the child, its stdin and
/// its messages.
fn stdio_session(
    dir: &Path,
) -> (
    std::process::Child,
    std::process::ChildStdin,
    std::sync::mpsc::Receiver<Value>,
) {
    let mut cmd = Command::new(ring0());
    cmd.arg("serve").current_dir(dir).env("HOME", test_home());
    let (child, mut stdin, rx) = spawn_stdio_json(cmd);
    send(
        &mut stdin,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}}),
    );
    answer(&rx, 1);
    send(
        &mut stdin,
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    );
    (child, stdin, rx)
}

fn send(stdin: &mut std::process::ChildStdin, message: Value) {
    use std::io::Write;
    writeln!(stdin, "{message}").unwrap();
}

/// The answer to request `id`.
fn answer(rx: &std::sync::mpsc::Receiver<Value>, id: i64) -> Value {
    loop {
        let m = rx.recv_timeout(HTTP_WAIT).expect("an answer");
        if m["id"] == id && m.get("method").is_none() {
            return m;
        }
    }
}

#[test]
fn a_keyed_call_re_issued_after_ring0_was_killed_mid_call_has_one_effect() {
    let Some(peers) = peers() else { return };
    let dir = workspace(&peers);
    let (mut child, mut stdin, _rx) = stdio_session(dir.path());
    // The key as the MCP idempotency proposal sends it: params.idempotencyKey.
    send(
        &mut stdin,
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "fx__append", "arguments": {"text": "crash", "gate": "gate-crash"},
            "idempotencyKey": "key-crash"}}),
    );
    // Dispatched: the upstream has the call. ring0 dies before it answers.
    wait_for_file_text(
        &dir.path().join("entered.log"),
        "crash",
        "the call reaches the upstream",
    );
    child.kill().unwrap(); // SIGKILL
    let _ = child.wait();
    // The upstream ran in ring0's sandbox and died with it, its effect never applied; the
    // gate is opened for the next run.
    std::fs::write(dir.path().join("gate-crash"), "").unwrap();
    assert_eq!(
        effects(dir.path(), "crash"),
        0,
        "the sandboxed upstream outlived ring0"
    );
    // A new ring0 (started by the client) settles what the killed one left open (re-sent under
    // the same idempotency key); the client's re-issue with that key is answered with the
    // result, and the effect happened once.
    let ring0 = ring0().display().to_string();
    let seen = client(&peers, "crashed", dir.path(), &ring0, "legacy", "");
    assert_eq!(seen["again"]["is_error"], false, "{seen}");
    assert_eq!(appended_text(&seen["again"]), "crash", "{seen}");
    assert_eq!(effects(dir.path(), "crash"), 1, "{seen}");
}

#[test]
fn a_held_call_that_will_be_replayed_is_never_shown_to_the_approver() {
    let Some(peers) = peers() else { return };
    let dir = workspace(&peers);
    let mut config = std::fs::read_to_string(dir.path().join("ring0.toml")).unwrap();
    config.push_str(
        "\n[[grants]]\nname = \"shell\"\ntools = [\"shell\"]\nceiling = \"A2\"\napproval = true\n",
    );
    std::fs::write(dir.path().join("ring0.toml"), config).unwrap();
    let ring0 = ring0().display().to_string();
    let seen = client(&peers, "held", dir.path(), &ring0, "legacy", "");
    assert_eq!(seen["first"]["is_error"], false, "{seen}");
    assert_eq!(seen["ran"], true, "{seen}");
    assert_eq!(seen["again"]["is_error"], false, "{seen}");
    assert_eq!(
        seen["again"]["receipt"]["disposition"], "replayed",
        "{seen}"
    );
    assert_eq!(
        seen["asked"].as_array().unwrap().len(),
        1,
        "the retry is answered without asking: {seen}"
    );
}

#[test]
fn the_repeat_guard_advises_at_the_third_call_and_stops_only_that_call() {
    let Some(peers) = peers() else { return };
    let dir = workspace(&peers);
    std::fs::write(dir.path().join("effects.log"), "").unwrap();
    std::fs::write(dir.path().join("guard.txt"), "the same every time\n").unwrap();
    let ring0 = ring0().display().to_string();
    let seen = client(&peers, "guard", dir.path(), &ring0, "legacy", "");
    let same = seen["same"].as_array().unwrap();
    let text = |i: usize| same[i]["text"].as_str().unwrap_or("").to_string();
    assert_eq!(same[0]["is_error"], false, "{seen}");
    assert!(!text(1).contains("times in a row"), "{seen}");
    assert!(
        text(2).contains("times in a row"),
        "the advisory reaches the model with the 3rd result: {seen}"
    );
    let stopped = same
        .iter()
        .position(|r| r["text"].as_str().unwrap_or("").contains("repeat_limit"))
        .unwrap_or_else(|| panic!("the exact repeat is stopped: {seen}"));
    assert!(stopped < same.len(), "{seen}");
    assert!(
        same[stopped..].iter().all(|r| r["is_error"] == true),
        "{seen}"
    );
    // Another call still runs.
    assert_eq!(seen["other"]["is_error"], false, "{seen}");
}

#[test]
fn calls_with_equal_conflict_keys_serialize_across_concurrent_tools_calls() {
    let Some(peers) = peers() else { return };
    let dir = workspace(&peers);
    let ring0 = ring0().display().to_string();
    let seen = client(&peers, "lanes", dir.path(), &ring0, "legacy", "");
    for call in ["a", "b", "c"] {
        assert_eq!(seen[call]["is_error"], false, "{call}: {seen}");
    }
    let before: Vec<&str> = seen["while_a_waits"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    // C, in another lane, ran while A waited; B, in A's lane, did not start.
    assert!(before.contains(&"done C"), "{seen}");
    assert!(!before.contains(&"enter B"), "{seen}");
    let events: Vec<&str> = seen["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let at = |e: &str| {
        events
            .iter()
            .position(|x| *x == e)
            .unwrap_or_else(|| panic!("{e}: {seen}"))
    };
    assert!(at("done A") < at("enter B"), "{seen}");
}

#[test]
fn an_unsettled_write_blocks_the_next_write_of_its_key_and_no_other() {
    let Some(peers) = peers() else { return };
    let dir = workspace(&peers);
    let ring0 = ring0().display().to_string();
    let seen = client(&peers, "unsettled", dir.path(), &ring0, "legacy", "");
    assert_eq!(seen["a"]["is_error"], true, "{seen}");
    let unknown = seen["a"]["receipt"]["intent_id"].as_str().unwrap_or("");
    assert!(!unknown.is_empty(), "{seen}");
    // B shares A's conflict key: refused, naming A's intent, and nothing ran.
    let b = seen["b"]["text"].as_str().unwrap();
    assert!(b.contains("blocked_by_unsettled"), "{seen}");
    assert!(b.contains(unknown), "{seen}");
    // C's key is another: it runs.
    assert_eq!(seen["c"]["is_error"], false, "{seen}");
    assert_eq!(effects(dir.path(), "B"), 0, "{seen}");
    assert_eq!(effects(dir.path(), "C"), 1, "{seen}");
}
