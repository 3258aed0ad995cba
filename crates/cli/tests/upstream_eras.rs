//! Upstreams that survive real servers, driven through the real `ring0` binary:
//!
//! - a Python-SDK low-level `Server` that offers 2026-07-28 in `server/discover` but fails its
//!   `tools/list` in that era is served through the sessionful fallback (`protocol = "auto"`),
//!   logged once with the reason;
//! - each `protocol` pin is the era spoken, and a pinned era that fails is reported, never
//!   switched;
//! - `initialize` answers within the start bound while upstreams hang, and a late upstream joins
//!   with `notifications/tools/list_changed`;
//! - a client that resumes streams is let go of its stream when the upstream closes its own
//!   mid-call, and gets the result on the stream it resumes (SEP-1699);
//! - ring0's own listing and `server/discover` carry a positive cache hint;
//! - upstream instructions reach the client, cleaned;
//! - the official conformance suite passes through ring0 wherever it passes directly, against
//!   that server and against a plain one.
//!
//! The peers are installed by `scripts/install-mcp-peers.sh`; without them a test says why it is
//! skipped, unless `CI` is set, where that is a failure.

mod common;

use common::{
    Served, one_upstream_config, peers, post, python, python_report, ring0, spawn_stdio_json,
};
use ring0_mcp::limits::CATALOG_TTL_MS;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(60);

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// Starts `cmd` and collects its stderr; when `listens`, waits for its address.
fn serve(cmd: Command, listens: bool) -> Served {
    Served::start(cmd, listens)
}

/// The Python-SDK low-level server (`era_upstream.py`) with `args`.
fn era_upstream(peers: &Path, args: &[&str]) -> Served {
    let mut cmd = Command::new(python(peers));
    cmd.arg(fixture("era_upstream.py")).args(args);
    serve(cmd, true)
}

/// The upstream `py` at `url` (every tool a read), `extra` in its table.
fn config(url: &str, extra: &str) -> String {
    one_upstream_config(
        "upstreams",
        r#"["py__*"]"#,
        "A3",
        "py",
        &format!("url = {url:?}\n{extra}"),
        "",
    )
}

/// `ring0 serve --http` in `dir` with `config`.
fn ring0_http(dir: &Path, config: &str) -> Served {
    std::fs::write(dir.join("ring0.toml"), config).unwrap();
    let mut cmd = Command::new(ring0());
    cmd.args(["serve", "--http", "127.0.0.1:0"])
        .current_dir(dir)
        .env("RING0_STATE_DIR", dir.join(".ring0"));
    serve(cmd, true)
}

/// Calls tools with the Python SDK client (`legacy` or `2026-07-28`); returns what it saw.
fn calls(peers: &Path, url: &str, era: &str, calls: Value) -> Value {
    let client =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../mcp/tests/fixtures/py_client_calls.py");
    python_report(
        Command::new(python(peers))
            .arg(client)
            .args([url, era, &calls.to_string()]),
    )
}

fn text_of(seen: &Value, i: usize) -> &str {
    seen["calls"][i]["text"].as_str().unwrap_or("")
}

/// The era the upstream says a call of `py__whoami` through ring0 arrived in.
fn upstream_era(peers: &Path, url: &str) -> String {
    let seen = calls(peers, url, "legacy", json!([["py__whoami", {}]]));
    assert_eq!(seen["calls"][0]["is_error"], false, "{seen}");
    text_of(&seen, 0).to_string()
}

#[test]
fn an_upstream_whose_2026_listing_fails_is_served_through_the_sessionful_handshake() {
    let Some(peers) = peers() else { return };
    let upstream = era_upstream(&peers, &["--modern-list-fails"]);
    let dir = tempfile::tempdir().unwrap();
    let gw = ring0_http(dir.path(), &config(&upstream.url, ""));
    let line = gw.wait_for_line("falling back to the sessionful handshake");
    assert!(line.contains("[py] protocol 2026-07-28 failed"), "{line}");
    assert!(
        line.contains("tools/list failed"),
        "the reason is given: {line}"
    );
    // Both eras of client reach its tools, which it serves in the era it can.
    assert_eq!(upstream_era(&peers, &gw.url), "2025-11-25");
    let modern = calls(
        &peers,
        &gw.url,
        "2026-07-28",
        json!([["py__test_simple_text", {}]]),
    );
    assert_eq!(
        text_of(&modern, 0),
        "This is a simple text response for testing.",
        "{modern}"
    );
    assert_eq!(gw.count("falling back to the sessionful handshake"), 1);
}

#[test]
fn each_protocol_pin_is_the_era_the_upstream_is_spoken_to_in() {
    let Some(peers) = peers() else { return };
    let upstream = era_upstream(&peers, &[]);
    for pin in ["2026-07-28", "2025-11-25", "2025-06-18"] {
        let dir = tempfile::tempdir().unwrap();
        let gw = ring0_http(
            dir.path(),
            &config(&upstream.url, &format!("protocol = {pin:?}")),
        );
        assert_eq!(upstream_era(&peers, &gw.url), pin, "{:?}", gw.lines());
    }
    // Unpinned, a server that serves the new era is spoken to in it.
    let dir = tempfile::tempdir().unwrap();
    let gw = ring0_http(dir.path(), &config(&upstream.url, ""));
    assert_eq!(upstream_era(&peers, &gw.url), "2026-07-28");
}

#[test]
fn a_pinned_era_that_fails_is_reported_and_never_switched() {
    let Some(peers) = peers() else { return };
    let upstream = era_upstream(&peers, &["--modern-list-fails"]);
    let dir = tempfile::tempdir().unwrap();
    let gw = ring0_http(
        dir.path(),
        &config(&upstream.url, "protocol = \"2026-07-28\""),
    );
    let line = gw.wait_for_line("[py] start failed");
    assert!(line.contains("protocol pinned to 2026-07-28"), "{line}");
    let (_, list) = post(
        &address(&gw),
        &modern_headers("tools/list"),
        &json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": modern_meta()}}),
    );
    let names = list["result"]["tools"].to_string();
    assert!(
        !names.contains("py__"),
        "no tool of the failing era is listed: {names}"
    );
    assert_eq!(gw.count("falling back"), 0, "{:?}", gw.lines());
    assert_eq!(gw.count("[py] speaking protocol 2025"), 0);
}

/// `host:port` of a served endpoint.
fn address(served: &Served) -> String {
    served
        .url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_string()
}

/// The client context of a raw 2026-07-28 request.
fn modern_meta() -> Value {
    json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
           "io.modelcontextprotocol/clientCapabilities": {},
           "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"}})
}

/// The routing headers of a raw 2026-07-28 request.
fn modern_headers(method: &'static str) -> Vec<(&'static str, &'static str)> {
    vec![
        ("MCP-Protocol-Version", "2026-07-28"),
        ("Mcp-Method", method),
    ]
}

#[test]
fn a_client_that_resumes_is_let_go_of_its_stream_when_the_upstream_closes_its_own() {
    let Some(peers) = peers() else { return };
    let upstream = era_upstream(&peers, &["--legacy-only"]);
    let dir = tempfile::tempdir().unwrap();
    let gw = ring0_http(dir.path(), &config(&upstream.url, ""));
    // The upstream closes its stream mid-call; ring0 resumes it upstream and lets its client's
    // stream close too, and the client gets the result on the stream it resumes.
    let seen = calls(
        &peers,
        &gw.url,
        "legacy",
        json!([["py__test_reconnection", {}]]),
    );
    assert_eq!(text_of(&seen, 0), "Reconnection test completed", "{seen}");
    gw.wait_for_line("[py] the response stream of request");
    gw.wait_for_line("a client resumes its response stream after event");
}

/// An upstream that accepts connections and never answers.
fn hung_upstream(peers: &Path) -> Served {
    let mut cmd = Command::new(python(peers));
    cmd.arg(fixture("hung_upstream.py"));
    serve(cmd, true)
}

/// Sends `initialize` to a stdio `ring0 serve` in `dir` and returns how long the answer took.
fn initialize_time(
    dir: &Path,
) -> (
    Duration,
    Child,
    std::process::ChildStdin,
    std::sync::mpsc::Receiver<Value>,
) {
    let mut cmd = Command::new(ring0());
    cmd.arg("serve")
        .current_dir(dir)
        .env("RING0_STATE_DIR", dir.join(".ring0"))
        .stderr(Stdio::null());
    let started = Instant::now();
    let (child, mut stdin, rx) = spawn_stdio_json(cmd);
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "t", "version": "1"}}});
    writeln!(stdin, "{init}").unwrap();
    let answer = rx.recv_timeout(WAIT).expect("initialize is answered");
    assert!(answer["result"]["serverInfo"].is_object(), "{answer}");
    (started.elapsed(), child, stdin, rx)
}

#[test]
fn initialize_answers_within_the_start_bound_while_upstreams_hang() {
    let Some(peers) = peers() else { return };
    let (a, b) = (hung_upstream(&peers), hung_upstream(&peers));
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "[[upstreams]]\nalias = \"a\"\nurl = {:?}\nstart_timeout_ms = 1000\n\n\
         [[upstreams]]\nalias = \"b\"\nurl = {:?}\nstart_timeout_ms = 1000\n",
        a.url, b.url
    );
    std::fs::write(dir.path().join("ring0.toml"), text).unwrap();
    let (took, mut child, _stdin, _rx) = initialize_time(dir.path());
    let _ = child.kill();
    let _ = child.wait();
    // Generous against a 1 s bound waited for once (not per upstream, not the old 20 s each).
    assert!(took < Duration::from_secs(12), "initialize took {took:?}");
}

#[test]
fn a_late_upstream_joins_with_list_changed() {
    let Some(peers) = peers() else { return };
    // A port nobody listens on yet: the upstream starts after ring0 serves.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let dir = tempfile::tempdir().unwrap();
    let url = format!("http://127.0.0.1:{port}/mcp");
    std::fs::write(
        dir.path().join("ring0.toml"),
        config(&url, "start_timeout_ms = 500"),
    )
    .unwrap();
    let (_, mut child, mut stdin, rx) = initialize_time(dir.path());
    writeln!(
        stdin,
        "{}",
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
    )
    .unwrap();
    let list = |stdin: &mut std::process::ChildStdin, id: u64| -> Vec<String> {
        writeln!(
            stdin,
            "{}",
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/list"})
        )
        .unwrap();
        loop {
            let m = rx.recv_timeout(WAIT).expect("tools/list is answered");
            if m["id"] == id {
                return m["result"]["tools"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| t["name"].as_str().unwrap().to_string())
                    .collect();
            }
        }
    };
    assert!(!list(&mut stdin, 2).iter().any(|n| n.starts_with("py__")));
    let _upstream = era_upstream(&peers, &["--port", &port.to_string()]);
    let deadline = Instant::now() + WAIT;
    loop {
        let m = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("notifications/tools/list_changed arrives");
        if m["method"] == "notifications/tools/list_changed" {
            break;
        }
    }
    assert!(list(&mut stdin, 3).contains(&"py__whoami".to_string()));
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn ring0s_listing_and_discovery_carry_a_positive_cache_hint() {
    let Some(peers) = peers() else { return };
    let upstream = era_upstream(
        &peers,
        &["--instructions", "Call \u{1b}[31mwhoami\u{1b}[0m first."],
    );
    let dir = tempfile::tempdir().unwrap();
    let gw = ring0_http(dir.path(), &config(&upstream.url, ""));
    gw.wait_for_line("[py] speaking protocol");
    let addr = address(&gw);
    let meta = modern_meta();
    let headers = modern_headers;
    let deadline = Instant::now() + WAIT;
    let discover = loop {
        let (_, d) = post(
            &addr,
            &headers("server/discover"),
            &json!({"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {"_meta": meta}}),
        );
        // The upstream's instructions are relayed once its tools are in the catalog.
        if d["result"]["instructions"]
            .as_str()
            .is_some_and(|i| i.contains("\"py\""))
            || Instant::now() > deadline
        {
            break d;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(discover["result"]["ttlMs"], CATALOG_TTL_MS, "{discover}");
    let instructions = discover["result"]["instructions"].as_str().unwrap_or("");
    assert!(
        instructions.contains("Call whoami first."),
        "{instructions}"
    );
    assert!(!instructions.contains('\u{1b}'), "{instructions}");
    let (_, list) = post(
        &addr,
        &headers("tools/list"),
        &json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {"_meta": meta}}),
    );
    assert_eq!(list["result"]["ttlMs"], CATALOG_TTL_MS, "{list}");
    assert_eq!(list["result"]["cacheScope"], "private", "{list}");
}

/// The conformance suite's server scenarios against `url`: each scenario's passed and failed
/// check counts, and the totals line.
fn conformance(peers: &Path, url: &str, cwd: &Path) -> (BTreeMap<String, (u32, u32)>, String) {
    let node = peers.join("node/node_modules/.bin/node");
    let out = Command::new(node)
        .arg(peers.join("node/node_modules/.bin/conformance"))
        .args(["server", "--suite", "all", "--url", url])
        .current_dir(cwd)
        .output()
        .expect("conformance");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let summary = text
        .split("=== SUMMARY ===")
        .nth(1)
        .unwrap_or("")
        .to_string();
    let total = summary
        .lines()
        .find(|l| l.contains("Total:"))
        .unwrap_or_else(|| {
            panic!(
                "no summary:\n{text}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
        .trim()
        .to_string();
    let mut scenarios = BTreeMap::new();
    for line in summary.lines() {
        let Some(rest) = line
            .trim()
            .strip_prefix("✓ ")
            .or_else(|| line.trim().strip_prefix("✗ "))
        else {
            continue;
        };
        let Some((name, counts)) = rest.split_once(": ") else {
            continue;
        };
        let n = |word: &str| -> u32 {
            counts
                .split(", ")
                .find_map(|c| c.strip_suffix(word)?.trim().parse().ok())
                .unwrap_or(0)
        };
        scenarios.insert(name.to_string(), (n(" passed"), n(" failed")));
    }
    (scenarios, total)
}

/// Runs the suite directly against the upstream started with `args` and through ring0 in front
/// of it (its table given `extra`); every scenario clean directly is clean through ring0, and no
/// check passing directly is lost. Prints both totals.
fn conformance_through_ring0(args: &[&str], extra: &str) {
    let Some(peers) = peers() else { return };
    let upstream = era_upstream(&peers, args);
    let work = tempfile::tempdir().unwrap();
    let local = |url: &str| url.replace("127.0.0.1", "localhost");
    let (direct, direct_total) = conformance(&peers, &local(&upstream.url), work.path());
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "[[grants]]\nname = \"conformance\"\ntools = [\"*\"]\nceiling = \"A3\"\n\n\
         [[upstreams]]\nalias = \"conformance\"\nurl = {:?}\nnamespace = false\n{extra}\n\
         [upstreams.tools.\"*\"]\neffect = \"nullipotent\"\nauthority = \"A0\"\nstrategy = [\"exploration\"]\n",
        upstream.url
    );
    let gw = ring0_http(dir.path(), &text);
    gw.wait_for_line("tools: ");
    let (through, through_total) = conformance(&peers, &local(&gw.url), work.path());
    eprintln!(
        "conformance, upstream {args:?} {extra:?}: directly {direct_total}; through ring0 {through_total}"
    );
    let mut lost = Vec::new();
    for (name, (passed, failed)) in &direct {
        let (p, f) = through.get(name).copied().unwrap_or((0, u32::MAX));
        if (*failed == 0 && f > 0) || p < *passed {
            lost.push(format!(
                "{name}: directly {passed} passed/{failed} failed, through ring0 {p}/{f}"
            ));
        }
    }
    assert!(
        lost.is_empty(),
        "lost through ring0: {lost:#?}\nring0 log:\n{}",
        gw.lines().join("\n")
    );
}

#[test]
fn conformance_through_ring0_matches_direct_against_an_upstream_whose_2026_listing_fails() {
    conformance_through_ring0(&["--modern-list-fails"], "");
}

#[test]
fn conformance_through_ring0_matches_direct_against_a_sessionful_upstream() {
    conformance_through_ring0(&["--legacy-only"], "");
}

/// A server that offers 2026-07-28 but whose handlers need the sessionful era's back-channel
/// (standalone elicitation and sampling, log messages, subscriptions) is served whole once its
/// era is pinned.
#[test]
fn conformance_through_ring0_matches_direct_against_a_2025_era_upstream_pinned_to_its_era() {
    conformance_through_ring0(&[], "protocol = \"2025-11-25\"");
}
