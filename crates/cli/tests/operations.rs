//! Operating a running ring0 from the outside: `/metrics` (Prometheus text, `ring0_*`) moves
//! with the calls a real client made, `/healthz` and `/readyz` say whether ring0 lives and can
//! take calls, metrics need the listener's credentials, a stdio deployment serves them on an
//! address of its own, and `ring0 approve` in another terminal decides a call a running server
//! holds.

mod common;

use common::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};

/// Built-in reads and writes, and the Python fixture as `up`: reads, except `big`, an A3 tool
/// held for approval.
fn workspace(dir: &Path) {
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../mcp/tests/fixtures/stdio_server.py");
    let config = format!(
        r#"defaults = false
[workspace]
state_dir = ".ring0"

[[grants]]
name = "workspace"
tools = ["read_file", "write_file"]
ceiling = "A1"

[[grants]]
name = "upstream"
tools = ["up__*"]
ceiling = "A3"

[[upstreams]]
alias = "up"
command = "python3"
args = [{fixture:?}]
env = ["PATH"]
[upstreams.tools."*"]
effect = "nullipotent"
authority = "A0"
strategy = ["exploration"]
[upstreams.tools.big]
effect = "non_idempotent"
authority = "A3"
"#,
        fixture = fixture.display().to_string(),
    );
    std::fs::write(dir.join("ring0.toml"), config).unwrap();
}

/// One GET; the status code, the head and the body.
fn get(addr: &str, path: &str, headers: &[(&str, &str)]) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(HTTP_WAIT)).unwrap();
    let mut req = format!("GET {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("Host: {addr}\r\n"));
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let (head, rest) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(rest)
    } else {
        rest.to_string()
    };
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, head.to_string(), body)
}

/// The samples of a Prometheus text exposition, by series (`name{labels}` as written), with
/// every line checked against the format: a comment, or a series and a number.
fn parse_exposition(text: &str) -> BTreeMap<String, f64> {
    assert!(
        text.ends_with("# EOF\n"),
        "the exposition ends with # EOF:\n{text}"
    );
    let mut samples = BTreeMap::new();
    for line in text.lines() {
        if line.starts_with('#') {
            let kind = line.split_whitespace().nth(1).unwrap_or("");
            assert!(
                ["HELP", "TYPE", "UNIT", "EOF"].contains(&kind),
                "a comment line: {line}"
            );
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("a sample: {line}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("a number in: {line}"));
        let name = series.split('{').next().unwrap();
        assert!(
            name.starts_with("ring0_")
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "a ring0_ metric name: {line}"
        );
        samples.insert(series.to_string(), value);
    }
    samples
}

fn sample(samples: &BTreeMap<String, f64>, series: &str) -> f64 {
    samples.get(series).copied().unwrap_or(0.0)
}

fn scrape(addr: &str) -> BTreeMap<String, f64> {
    let (status, head, body) = get(addr, "/metrics", &[]);
    assert_eq!(status, 200, "{head}\n{body}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/openmetrics-text"),
        "{head}"
    );
    parse_exposition(&body)
}

fn run_client(peers: &Path, url: &str) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/py_client_ops.py");
    python_report(Command::new(python(peers)).arg(&script).arg(url))
}

#[test]
fn metrics_move_with_the_calls_a_python_client_made_over_http() {
    let Some(peers) = peers() else { return };
    let dir = tempfile::tempdir().unwrap();
    workspace(dir.path());
    let server = start_http(serve_http_command(dir.path()));
    let before = scrape(&server.addr);
    assert_eq!(
        sample(&before, "ring0_calls_total{disposition=\"dispatched\"}"),
        0.0
    );
    assert_eq!(
        sample(&before, "ring0_upstream_up{upstream=\"up\"}"),
        1.0,
        "{before:?}"
    );

    let seen = run_client(&peers, &server.url());
    assert_eq!(seen["write_error"], false, "{seen}");
    assert_eq!(seen["read_error"], false, "{seen}");
    assert_eq!(seen["echo"], "an argument value 7f3c", "{seen}");
    assert_eq!(seen["unknown_error"], true, "{seen}");
    assert_eq!(seen["declined_error"], true, "{seen}");
    assert_eq!(seen["recovered"], true, "{seen}");
    // While the person was being asked, the call was counted as held.
    assert_eq!(seen["held_while_asked"], serde_json::json!([1.0]), "{seen}");

    let after = scrape(&server.addr);
    let (_, _, raw) = get(&server.addr, "/metrics", &[]);
    assert!(
        !raw.contains("7f3c"),
        "no argument value in the metrics:\n{raw}"
    );
    assert!(
        !raw.contains("metered"),
        "no written content in the metrics:\n{raw}"
    );
    // write_file, read_file, two echoes at least (one before, one after the crash), the crash.
    assert!(
        sample(&after, "ring0_calls_total{disposition=\"dispatched\"}") >= 5.0,
        "{after:?}"
    );
    assert_eq!(
        sample(&after, "ring0_rejections_total{kind=\"unknown_tool\"}"),
        1.0,
        "{after:?}"
    );
    assert!(
        sample(&after, "ring0_settlements_total{state=\"ACKED\"}") >= 1.0,
        "{after:?}"
    );
    assert!(
        sample(&after, "ring0_intents{state=\"ACKED\"}") >= 1.0,
        "{after:?}"
    );
    assert_eq!(
        sample(&after, "ring0_intents{state=\"DEAD_LETTER\"}"),
        0.0,
        "{after:?}"
    );
    assert!(
        sample(
            &after,
            "ring0_decisions_total{rule=\"grant:workspace\",outcome=\"allowed\"}"
        ) >= 2.0,
        "{after:?}"
    );
    assert_eq!(
        sample(
            &after,
            "ring0_decisions_total{rule=\"a3_approval\",outcome=\"held\"}"
        ),
        1.0,
        "{after:?}"
    );
    assert_eq!(
        sample(
            &after,
            "ring0_decisions_total{rule=\"a3_approval\",outcome=\"approval_denied\"}"
        ),
        1.0,
        "{after:?}"
    );
    assert_eq!(
        sample(&after, "ring0_approvals_held"),
        0.0,
        "the hold ended: {after:?}"
    );
    assert!(
        sample(&after, "ring0_call_stage_seconds_count{stage=\"run\"}") >= 5.0,
        "{after:?}"
    );
    assert!(
        sample(&after, "ring0_observation_bytes_total") > 0.0,
        "{after:?}"
    );
    // The third identical read got the repeat guard's advisory.
    assert!(
        sample(&after, "ring0_repeat_guard_total{action=\"advisory\"}") >= 1.0,
        "{after:?}"
    );
    assert_eq!(
        sample(&after, "ring0_rejections_total{kind=\"approval_denied\"}"),
        1.0,
        "{after:?}"
    );
    assert!(
        sample(&after, "ring0_upstream_restarts_total{upstream=\"up\"}") >= 1.0,
        "{after:?}"
    );
    assert_eq!(
        sample(&after, "ring0_upstream_up{upstream=\"up\"}"),
        1.0,
        "{after:?}"
    );
}

#[test]
fn healthz_answers_and_readyz_names_the_upstream_that_is_down() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("ring0.toml"),
        "[workspace]\nstate_dir = \".ring0\"\n\n[[upstreams]]\nalias = \"gone\"\n\
         command = \"false\"\nstart_timeout_ms = 200\n",
    )
    .unwrap();
    let server = start_http(serve_http_command(dir.path()));
    let (status, _, body) = get(&server.addr, "/healthz", &[]);
    assert_eq!(status, 200, "{body}");
    let (status, _, body) = get(&server.addr, "/readyz", &[]);
    assert_eq!(status, 503, "{body}");
    let report: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(report["ready"], false, "{report}");
    assert_eq!(report["journal"], "ok", "{report}");
    assert_eq!(report["upstreams"]["gone"], "down", "{report}");
    let samples = scrape(&server.addr);
    assert_eq!(
        sample(&samples, "ring0_upstream_up{upstream=\"gone\"}"),
        0.0,
        "{samples:?}"
    );
}

#[test]
fn readyz_is_ready_with_the_journal_and_no_upstreams() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_http(serve_http_command(dir.path()));
    let (status, _, body) = get(&server.addr, "/readyz", &[]);
    assert_eq!(status, 200, "{body}");
    let report: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        report,
        serde_json::json!({"ready": true, "journal": "ok", "upstreams": {}})
    );
}

#[test]
fn metrics_need_the_listeners_credentials_and_probes_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = serve_http_command(dir.path());
    cmd.args(["--token-env", "OPS_TEST_TOKEN"])
        .env("OPS_TEST_TOKEN", "s3cret-ops-token-0123456789");
    let server = start_http(cmd);
    let (status, head, _) = get(&server.addr, "/metrics", &[]);
    assert_eq!(status, 401, "{head}");
    let (status, _, _) = get(
        &server.addr,
        "/metrics",
        &[("Authorization", "Bearer wrong-token-0123456789")],
    );
    assert_eq!(status, 401);
    let (status, _, body) = get(
        &server.addr,
        "/metrics",
        &[("Authorization", "Bearer s3cret-ops-token-0123456789")],
    );
    assert_eq!(status, 200, "{body}");
    parse_exposition(&body);
    assert_eq!(get(&server.addr, "/healthz", &[]).0, 200);
    assert_eq!(get(&server.addr, "/readyz", &[]).0, 200);
}

#[test]
fn operations_routes_refuse_a_host_ring0_does_not_serve() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_http(serve_http_command(dir.path()));
    for path in ["/metrics", "/healthz", "/readyz"] {
        let (status, head, _) = get(&server.addr, path, &[("Host", "rebound.example:80")]);
        assert_eq!(status, 421, "{path}: {head}");
    }
}

/// `ring0 serve --metrics-addr ADDR` over stdio; the child and the address it printed.
fn serve_stdio_with_metrics(
    dir: &Path,
    addr: &str,
) -> (std::process::Child, Result<String, String>) {
    let mut child = Command::new(ring0())
        .args(["serve", "--metrics-addr", addr])
        .current_dir(dir)
        .env("RING0_STATE_DIR", dir.join(".ring0"))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    // The log is read to its end by a thread of its own: ring0 keeps writing to it.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = Vec::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(rest) = line.split("metrics on http://").nth(1) {
                let _ = tx.send(Ok(rest.trim_end_matches("/metrics").to_string()));
            }
            lines.push(line);
        }
        let _ = tx.send(Err(lines.join("\n")));
    });
    let printed = rx.recv_timeout(HTTP_WAIT).expect("ring0 prints or ends");
    (child, printed)
}

#[test]
fn a_stdio_deployment_serves_metrics_on_an_address_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, addr) = serve_stdio_with_metrics(dir.path(), "127.0.0.1:0");
    let addr = addr.expect("the metrics address is printed");
    let samples = scrape(&addr);
    assert_eq!(sample(&samples, "ring0_approvals_held"), 0.0, "{samples:?}");
    assert!(
        samples.keys().any(|k| k.starts_with("ring0_intents{")),
        "{samples:?}"
    );
    assert_eq!(get(&addr, "/readyz", &[]).0, 200);
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn a_metrics_address_beyond_loopback_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, addr) = serve_stdio_with_metrics(dir.path(), "0.0.0.0:0");
    let printed = addr.expect_err("no metrics address is served");
    let status = child.wait().unwrap();
    assert!(!status.success());
    assert!(printed.contains("not a loopback address"), "{printed}");
}

/// The approval ids `ring0 approve` lists in `dir` now.
fn pending_approvals(dir: &Path) -> Vec<String> {
    let out = Command::new(ring0())
        .arg("approve")
        .current_dir(dir)
        .env("RING0_STATE_DIR", dir.join(".ring0"))
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter(|w| w.starts_with("ap_"))
        .map(str::to_string)
        .collect()
}

#[test]
fn ring0_approve_in_another_terminal_releases_a_call_held_by_a_running_server() {
    let Some(peers) = peers() else { return };
    let dir = tempfile::tempdir().unwrap();
    workspace(dir.path());
    let server = start_http(serve_http_command(dir.path()));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/py_client_held.py");
    let client = Command::new(python(&peers))
        .arg(&script)
        .arg(server.url())
        .env("HOME", test_home())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The held call appears in the terminal's list while its client is being asked.
    let deadline = std::time::Instant::now() + HTTP_WAIT;
    let id = loop {
        if let Some(id) = pending_approvals(dir.path()).into_iter().next() {
            break id;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no pending approval listed"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let approved = Command::new(ring0())
        .args(["approve", &id])
        .current_dir(dir.path())
        .env("RING0_STATE_DIR", dir.path().join(".ring0"))
        .output()
        .unwrap();
    assert!(
        approved.status.success(),
        "{}",
        String::from_utf8_lossy(&approved.stderr)
    );
    let out = client.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let seen: Value = serde_json::from_str(stdout.lines().last().unwrap_or("")).unwrap();
    assert_eq!(seen["asked"], 1, "the client was asked too: {seen}");
    assert_eq!(seen["is_error"], false, "the call ran: {seen}");
    assert!(
        pending_approvals(dir.path()).is_empty(),
        "the request is withdrawn"
    );
    let samples = scrape(&server.addr);
    assert_eq!(
        sample(
            &samples,
            "ring0_decisions_total{rule=\"approved\",outcome=\"approved\"}"
        ),
        1.0,
        "{samples:?}"
    );
}

#[test]
fn ring0_status_reports_the_journal_approvals_and_what_a_running_server_says() {
    let dir = tempfile::tempdir().unwrap();
    workspace(dir.path());
    let server = start_http(serve_http_command(dir.path()));
    let out = Command::new(ring0())
        .args(["status", "--server", &server.addr])
        .current_dir(dir.path())
        .env("RING0_STATE_DIR", dir.path().join(".ring0"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    for line in [
        "intents: none",
        "approvals pending: 0",
        "upstreams configured: up",
        &format!("server {}: ready", server.addr),
        "  journal: ok",
        "  upstream up: up",
    ] {
        assert!(text.lines().any(|l| l == line), "{line:?} in:\n{text}");
    }
    drop(server);
    // Without a server to ask, what the state directory holds; a server that is gone is named.
    let out = Command::new(ring0())
        .args(["status", "--server", "127.0.0.1:9"])
        .current_dir(dir.path())
        .env("RING0_STATE_DIR", dir.path().join(".ring0"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--server 127.0.0.1:9"), "{stderr}");
}

#[test]
fn readyz_is_ready_while_an_optional_upstream_is_down_and_names_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("ring0.toml"),
        "[workspace]\nstate_dir = \".ring0\"\n\n[[upstreams]]\nalias = \"extra\"\n\
         command = \"false\"\nstart_timeout_ms = 200\noptional = true\n",
    )
    .unwrap();
    let server = start_http(serve_http_command(dir.path()));
    let (status, _, body) = get(&server.addr, "/readyz", &[]);
    assert_eq!(status, 200, "{body}");
    let report: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(report["ready"], true, "{report}");
    assert_eq!(report["upstreams"]["extra"], "down (optional)", "{report}");
    let samples = scrape(&server.addr);
    assert_eq!(
        sample(&samples, "ring0_upstream_up{upstream=\"extra\"}"),
        0.0,
        "still reported down in the metrics: {samples:?}"
    );
}

/// Waits (bounded) for a process whose stdin was closed to end.
fn wait_for_exit(child: &mut std::process::Child) {
    let deadline = std::time::Instant::now() + HTTP_WAIT;
    while child.try_wait().unwrap().is_none() {
        assert!(std::time::Instant::now() < deadline, "ring0 did not end");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Every line of `text` as a JSON object with a string `level`, `target` and `message`.
fn json_lines(text: &str) -> Vec<Value> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let v: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line:?}\n{text}"));
            for key in ["level", "target", "message"] {
                assert!(v[key].is_string(), "no {key} in {line}");
            }
            v
        })
        .collect()
}

#[test]
fn with_log_format_json_every_stderr_line_is_a_json_object_with_level_target_and_message() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ring0.toml"), HELD_SHELL_CONFIG).unwrap();
    let log = dir.path().join("stderr.log");
    let mut cmd = Command::new(ring0());
    cmd.args(["serve", "--log-format", "json"])
        .current_dir(dir.path())
        .env("RING0_STATE_DIR", dir.path().join(".ring0"))
        .stderr(std::fs::File::create(&log).unwrap());
    let (mut child, mut stdin, rx) = spawn_stdio_json(cmd);
    let mut ask = |id: i64, method: &str, params: Value| {
        let request =
            serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        writeln!(stdin, "{request}").unwrap();
        loop {
            let m = rx.recv_timeout(HTTP_WAIT).expect("ring0 answers");
            if m["id"] == id {
                return m;
            }
        }
    };
    ask(
        1,
        "initialize",
        serde_json::json!({"protocolVersion": "2025-06-18",
        "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}),
    );
    // A client that cannot be asked: the person is shown a confirmation code on stderr.
    let held = ask(
        2,
        "tools/call",
        serde_json::json!({"name": "shell",
        "arguments": {"argv": ["touch", "x"]}}),
    );
    assert!(held.to_string().contains("approval_required"), "{held}");
    drop(stdin);
    wait_for_exit(&mut child);
    let text = std::fs::read_to_string(&log).unwrap();
    let lines = json_lines(&text);
    let says = |needle: &str| {
        lines
            .iter()
            .find(|l| l["message"].as_str().unwrap().contains(needle))
            .unwrap_or_else(|| panic!("no line with {needle:?} in:\n{text}"))
    };
    assert_eq!(says("serving MCP on stdio")["level"], "INFO", "{text}");
    let code = says("confirmation code");
    assert_eq!(code["level"], "WARN", "a person acts on it: {text}");
    assert_eq!(code["target"], "ring0", "{text}");
    assert!(lines.iter().all(|l| l["timestamp"].is_string()), "{text}");
}

#[test]
fn with_log_format_json_a_failure_at_start_is_a_json_error_line() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("ring0.toml"),
        "[telemetry]\nendpoint = \"ftp://collector\"\n",
    )
    .unwrap();
    let out = Command::new(ring0())
        .args(["serve", "--log-format", "json"])
        .current_dir(dir.path())
        .env("RING0_STATE_DIR", dir.path().join(".ring0"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stderr);
    let lines = json_lines(&text);
    assert_eq!(lines.len(), 1, "{text}");
    assert_eq!(lines[0]["level"], "ERROR", "{text}");
    let message = lines[0]["message"].as_str().unwrap();
    assert!(
        message.contains("telemetry.endpoint"),
        "names the key: {message}"
    );
}

#[test]
fn a_collector_that_cannot_be_reached_is_said_on_stderr_and_calls_go_on() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), "hello").unwrap();
    // A loopback port nothing listens on any more.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let log = dir.path().join("stderr.log");
    let mut cmd = Command::new(ring0());
    cmd.args(["serve", "--log-format", "json"])
        .current_dir(dir.path())
        .env("RING0_STATE_DIR", dir.path().join(".ring0"))
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{closed}"))
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .stderr(std::fs::File::create(&log).unwrap());
    let (mut child, mut stdin, rx) = spawn_stdio_json(cmd);
    for (id, method, params) in [
        (
            1,
            "initialize",
            serde_json::json!({"protocolVersion": "2025-06-18",
            "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}),
        ),
        (
            2,
            "tools/call",
            serde_json::json!({"name": "read_file",
            "arguments": {"path": "notes.txt"}}),
        ),
    ] {
        let request =
            serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        writeln!(stdin, "{request}").unwrap();
        let answer = loop {
            let m = rx.recv_timeout(HTTP_WAIT).expect("ring0 answers");
            if m["id"] == id {
                break m;
            }
        };
        assert!(answer.get("error").is_none(), "{answer}");
    }
    drop(stdin);
    wait_for_exit(&mut child);
    let text = std::fs::read_to_string(&log).unwrap();
    let lines = json_lines(&text);
    assert!(
        lines
            .iter()
            .any(|l| l["message"] == "traces: exported over OTLP/HTTP"),
        "ring0 says traces are on: {text}"
    );
    assert!(
        lines.iter().any(|l| l["target"] == "opentelemetry_sdk"
            && l["message"].as_str().unwrap().contains("Export")),
        "the failed export is said: {text}"
    );
}
