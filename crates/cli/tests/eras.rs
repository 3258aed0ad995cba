//! Both protocol eras on both sides of ring0, against real peers: the Python MCP SDK server
//! (`crates/mcp/tests/fixtures/http_server.py`, both eras on one endpoint, or the sessionful era
//! alone) and ring0's own `serve --http` as Streamable HTTP upstreams, the Python SDK client over
//! HTTP downstream.
//!
//! - an upstream that offers 2026-07-28 through `server/discover` is spoken to in it; one that
//!   does not gets the sessionful handshake;
//! - a broken upstream response stream is resumed with `Last-Event-ID`;
//! - an upstream's own request (elicitation) during a 2026-07-28 call goes back to the client as
//!   an `input_required` result, and the retry continues the same call (one intent);
//! - an upstream's `input_required` result reaches the client in either era;
//! - `list_changed` arrives in either era.
//!
//! The peers are installed by `scripts/install-mcp-peers.sh`; without them a test says why it is
//! skipped, unless `CI` is set, where that is a failure.

mod common;

use common::{Served, one_upstream_config, peers, python, python_report, ring0, rmcp_fixture};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(60);

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../mcp/tests/fixtures")
}

/// Starts a server that prints `listening on http://ADDR/mcp` to stderr.
fn serve(cmd: Command) -> Served {
    Served::start(cmd, true)
}

fn py_server(peers: &Path, legacy_only: bool) -> Served {
    py_server_on(peers, legacy_only, 0)
}

fn py_server_on(peers: &Path, legacy_only: bool, port: u16) -> Served {
    let mut cmd = Command::new(python(peers));
    cmd.arg(fixtures().join("http_server.py"))
        .args(["--port", &port.to_string()]);
    if legacy_only {
        cmd.arg("--legacy-only");
    }
    serve(cmd)
}

/// ring0 over HTTP in `dir`, with the HTTP upstream `py` at `url`.
fn ring0_over(dir: &Path, url: &str) -> Served {
    ring0_with(dir, &py_config(url, ""))
}

/// ring0 over HTTP in `dir` with `config`.
fn ring0_with(dir: &Path, config: &str) -> Served {
    std::fs::write(dir.join("ring0.toml"), config).unwrap();
    let mut cmd = Command::new(ring0());
    cmd.args(["serve", "--http", "127.0.0.1:0"])
        .current_dir(dir)
        .env("RING0_STATE_DIR", std::path::Path::new(dir).join(".ring0"));
    serve(cmd)
}

/// The upstream `py` at `url`; `extra` goes into its table.
fn py_config(url: &str, extra: &str) -> String {
    one_upstream_config(
        "upstreams",
        r#"["py__*", "up__*"]"#,
        "A3",
        "py",
        &format!("url = {url:?}\n{extra}"),
        r#"[upstreams.tools.legacy_ask]
effect = "non_idempotent"
authority = "A2"
settlement = "idempotency_key"
[upstreams.tools.ask_color]
effect = "non_idempotent"
authority = "A2"
settlement = "idempotency_key"
"#,
    )
}

/// Calls tools with the Python client in `era`; returns what it saw.
fn calls(peers: &Path, url: &str, era: &str, calls: Value) -> Value {
    python_report(
        Command::new(python(peers))
            .arg(fixtures().join("py_client_calls.py"))
            .args([url, era, &calls.to_string()]),
    )
}

fn text_of(seen: &Value, i: usize) -> &str {
    seen["calls"][i]["text"].as_str().unwrap_or("")
}

/// How many times each tool body of the Python server ran, as it reports through ring0.
fn upstream_runs(peers: &Path, url: &str) -> Value {
    let seen = calls(peers, url, "legacy", json!([["py__calls", {}]]));
    serde_json::from_str(text_of(&seen, 0)).unwrap()
}

fn journal_lines(dir: &Path, tool: &str) -> Vec<String> {
    let out = Command::new(ring0())
        .args(["journal", "ls"])
        .current_dir(dir)
        .env("RING0_STATE_DIR", std::path::Path::new(dir).join(".ring0"))
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.split_whitespace().any(|w| w == tool))
        .map(str::to_string)
        .collect()
}

const ERAS: [&str; 2] = ["legacy", "2026-07-28"];

#[test]
fn an_http_upstream_that_offers_2026_07_28_is_spoken_to_in_it_from_clients_of_both_eras() {
    let Some(peers) = peers() else { return };
    let upstream = py_server(&peers, false);
    let dir = tempfile::tempdir().unwrap();
    let gw = ring0_over(dir.path(), &upstream.url);
    gw.wait_for_line("[py] speaking protocol 2026-07-28 (stateless)");
    for era in ERAS {
        let seen = calls(
            &peers,
            &gw.url,
            era,
            json!([["py__echo", {"text": "through ring0"}], ["py__resumable", {"steps": 3}]]),
        );
        assert_eq!(text_of(&seen, 0), "through ring0", "{era}: {seen}");
        assert_eq!(text_of(&seen, 1), "done after 3 steps", "{era}: {seen}");
        assert_eq!(
            seen["progress"],
            json!([1.0, 2.0, 3.0]),
            "{era}: the upstream's progress reaches the client"
        );
    }
    assert!(!gw.has_line("sessionful handshake"));
}

#[test]
fn an_http_upstream_without_discovery_gets_the_sessionful_handshake() {
    let Some(peers) = peers() else { return };
    let upstream = py_server(&peers, true);
    let dir = tempfile::tempdir().unwrap();
    let gw = ring0_over(dir.path(), &upstream.url);
    let line = gw.wait_for_line("[py] no stateless protocol");
    assert!(line.contains("sessionful handshake"), "{line}");
    for era in ERAS {
        let seen = calls(&peers, &gw.url, era, json!([["py__echo", {"text": "hi"}]]));
        assert_eq!(text_of(&seen, 0), "hi", "{era}: {seen}");
    }
}

/// Whether ring0 learns of the lost session from a 404 or from the broken listen stream first,
/// the next calls are served by a new session.
#[test]
fn a_sessionful_upstream_that_forgets_its_session_is_initialized_again() {
    let Some(peers) = peers() else { return };
    let first = py_server(&peers, true);
    let port: u16 = first
        .url
        .rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches("/mcp")
        .parse()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let gw = ring0_over(dir.path(), &first.url);
    gw.wait_for_line("[py] no stateless protocol");
    let seen = calls(
        &peers,
        &gw.url,
        "legacy",
        json!([["py__echo", {"text": "first"}]]),
    );
    assert_eq!(text_of(&seen, 0), "first", "{seen}");
    // A new process on the same port knows none of the old sessions: HTTP 404.
    drop(first);
    let _second = py_server_on(&peers, true, port);
    let deadline = Instant::now() + WAIT;
    let mut last = Value::Null;
    while Instant::now() < deadline {
        last = calls(
            &peers,
            &gw.url,
            "legacy",
            json!([["py__echo", {"text": "second"}]]),
        );
        if text_of(&last, 0) == "second" {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(text_of(&last, 0), "second", "{last}");
    let handshakes = gw.count("using the sessionful handshake");
    assert!(handshakes >= 2, "a new session was initialized");
}

#[test]
fn an_abandoned_call_is_cancelled_upstream_in_both_eras() {
    let Some(peers) = peers() else { return };
    for legacy_only in [false, true] {
        let upstream = py_server(&peers, legacy_only);
        let dir = tempfile::tempdir().unwrap();
        let gw = ring0_with(
            dir.path(),
            &py_config(&upstream.url, "call_idle_timeout_ms = 1000"),
        );
        gw.wait_for_line("tool py__calls trusted on first use");
        let seen = calls(
            &peers,
            &gw.url,
            "legacy",
            json!([["py__sleepy", {"seconds": 30}]]),
        );
        assert_eq!(seen["calls"][0]["is_error"], true, "{seen}");
        assert!(text_of(&seen, 0).contains("idle timeout"), "{seen}");
        // Cancelled upstream: a notification in the sessionful era, a closed stream in 2026-07-28.
        let deadline = Instant::now() + WAIT;
        loop {
            let runs = upstream_runs(&peers, &gw.url);
            if runs["sleepy_cancelled"] == 1 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "legacy_only={legacy_only}: the upstream never saw the cancellation: {runs}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

#[test]
fn a_broken_upstream_response_stream_is_resumed_with_last_event_id() {
    let Some(peers) = peers() else { return };
    let upstream = py_server(&peers, true);
    let dir = tempfile::tempdir().unwrap();
    let gw = ring0_over(dir.path(), &upstream.url);
    gw.wait_for_line("[py] no stateless protocol");
    let seen = calls(
        &peers,
        &gw.url,
        "legacy",
        json!([["py__resumable", {"steps": 4}]]),
    );
    assert_eq!(seen["calls"][0]["is_error"], false, "{seen}");
    assert_eq!(text_of(&seen, 0), "done after 4 steps", "{seen}");
    assert_eq!(
        seen["progress"],
        json!([1.0, 2.0, 3.0, 4.0]),
        "progress before and after the break"
    );
    gw.wait_for_line("resuming after event");
    assert_eq!(upstream_runs(&peers, &gw.url)["resumable"], 1, "ran once");
}

#[test]
fn an_upstream_elicitation_during_a_2026_07_28_call_is_answered_through_input_required() {
    let Some(peers) = peers() else { return };
    // The sessionful upstream asks with a request of its own, mid-call.
    let upstream = py_server(&peers, true);
    let dir = tempfile::tempdir().unwrap();
    let gw = ring0_over(dir.path(), &upstream.url);
    gw.wait_for_line("[py] no stateless protocol");
    let seen = calls(
        &peers,
        &gw.url,
        "2026-07-28",
        json!([["py__legacy_ask", {}]]),
    );
    assert_eq!(seen["asked"], json!(["Which color?"]), "{seen}");
    assert_eq!(text_of(&seen, 0), "color: teal", "{seen}");
    assert_eq!(seen["calls"][0]["is_error"], false, "{seen}");
    assert_eq!(
        seen["progress"],
        json!([1.0]),
        "progress after the answer reaches the retry's stream"
    );
    assert!(
        seen["calls"][0]["receipt"]["intent_id"].is_string(),
        "the result of the retry is the call's: {seen}"
    );
    assert_eq!(
        journal_lines(dir.path(), "py__legacy_ask").len(),
        1,
        "one intent"
    );
    assert_eq!(
        upstream_runs(&peers, &gw.url)["legacy_ask"],
        1,
        "one upstream call"
    );
}

#[test]
fn a_stdio_upstreams_sampling_and_elicitation_reach_clients_of_both_eras() {
    let (Some(peers), Some(fixture)) = (peers(), rmcp_fixture()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = one_upstream_config(
        "upstreams",
        r#"["up__*"]"#,
        "A3",
        "up",
        &format!("command = {:?}", fixture.display().to_string()),
        "",
    );
    let gw = ring0_with(dir.path(), &config);
    for era in ERAS {
        let seen = calls(
            &peers,
            &gw.url,
            era,
            json!([
                ["up__test_sampling", {"prompt": "hi"}],
                ["up__test_elicitation", {"message": "who are you?"}]
            ]),
        );
        assert_eq!(
            seen["asked"],
            json!(["sampling", "who are you?"]),
            "{era}: {seen}"
        );
        assert_eq!(
            text_of(&seen, 0),
            "LLM response: sampled through ring0",
            "{era}: {seen}"
        );
        assert!(
            text_of(&seen, 1).contains("ada@example.org"),
            "{era}: {seen}"
        );
    }
}

#[test]
fn an_approved_2026_07_28_call_is_one_intent_and_one_upstream_call() {
    let Some(peers) = peers() else { return };
    let upstream = py_server(&peers, false);
    let dir = tempfile::tempdir().unwrap();
    let gw = ring0_with(
        dir.path(),
        &py_config(
            &upstream.url,
            "[upstreams.tools.echo]\neffect = \"non_idempotent\"\nauthority = \"A3\"",
        ),
    );
    gw.wait_for_line("tool py__calls trusted on first use");
    let seen = calls(
        &peers,
        &gw.url,
        "2026-07-28",
        json!([["py__echo", {"text": "approved"}]]),
    );
    let asked = seen["asked"].as_array().unwrap();
    assert_eq!(asked.len(), 1, "{seen}");
    assert!(
        asked[0].as_str().unwrap().contains("allow py__echo"),
        "{seen}"
    );
    assert_eq!(text_of(&seen, 0), "approved", "{seen}");
    assert_eq!(journal_lines(dir.path(), "py__echo").len(), 1, "one intent");
    assert_eq!(
        upstream_runs(&peers, &gw.url)["echo"],
        1,
        "one upstream call"
    );
}

#[test]
fn an_upstream_input_required_result_reaches_clients_of_both_eras() {
    let Some(peers) = peers() else { return };
    let upstream = py_server(&peers, false);
    let dir = tempfile::tempdir().unwrap();
    let gw = ring0_over(dir.path(), &upstream.url);
    gw.wait_for_line("[py] speaking protocol 2026-07-28");
    for era in ERAS {
        let seen = calls(&peers, &gw.url, era, json!([["py__ask_color", {}]]));
        assert_eq!(seen["asked"], json!(["Which color?"]), "{era}: {seen}");
        assert_eq!(text_of(&seen, 0), "color: teal", "{era}: {seen}");
        assert_eq!(seen["progress"], json!([1.0]), "{era}: {seen}");
    }
    assert_eq!(
        journal_lines(dir.path(), "py__ask_color").len(),
        2,
        "one intent per call"
    );
}

#[test]
fn an_upstream_list_change_reaches_ring0_in_both_eras() {
    let Some(peers) = peers() else { return };
    for legacy_only in [false, true] {
        let upstream = py_server(&peers, legacy_only);
        let dir = tempfile::tempdir().unwrap();
        let gw = ring0_over(dir.path(), &upstream.url);
        gw.wait_for_line("tool py__calls trusted on first use");
        let seen = calls(&peers, &gw.url, "legacy", json!([["py__grow", {}]]));
        assert_eq!(text_of(&seen, 0), "grown", "{seen}");
        // A tool added after approval starts quarantined: seeing it proves the new listing arrived.
        gw.wait_for_line("tool py__extra is quarantined");
    }
}

#[test]
fn ring0_serves_another_ring0_as_a_2026_07_28_upstream() {
    let Some(peers) = peers() else { return };
    let inner_dir = tempfile::tempdir().unwrap();
    std::fs::write(inner_dir.path().join("a.txt"), "inner workspace\n").unwrap();
    let mut cmd = Command::new(ring0());
    cmd.args(["serve", "--http", "127.0.0.1:0"])
        .current_dir(inner_dir.path())
        .env(
            "RING0_STATE_DIR",
            std::path::Path::new(inner_dir.path()).join(".ring0"),
        );
    let inner = serve(cmd);
    let dir = tempfile::tempdir().unwrap();
    let config = one_upstream_config(
        "inner",
        r#"["in__*"]"#,
        "A0",
        "in",
        &format!("url = {:?}", inner.url),
        "",
    );
    let gw = ring0_with(dir.path(), &config);
    gw.wait_for_line("[in] speaking protocol 2026-07-28 (stateless)");
    gw.wait_for_line("tool in__read_file trusted on first use");
    for era in ERAS {
        let seen = calls(
            &peers,
            &gw.url,
            era,
            json!([["in__read_file", {"path": "a.txt"}]]),
        );
        assert_eq!(text_of(&seen, 0), "inner workspace\n", "{era}: {seen}");
    }
}
