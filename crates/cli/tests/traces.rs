//! Traces of `ring0 serve` as a collector receives them: an OTLP/HTTP receiver in the test
//! decodes what ring0 exports (`opentelemetry-proto`) and the tests read the span trees of a
//! call held for a person and approved in the client's dialog (the official Python SDK client
//! over HTTP), and of a call whose upstream crashed after its effect, settled UNKNOWN →
//! RECONCILING → ACKED by a probe (over stdio). Both continue the trace the client named in
//! `_meta.traceparent` (a stateless HTTP request's `traceparent` header too); the upstream is
//! told the span that called it; no argument value or result is in any byte exported, not
//! even what a person was shown on stderr while a span was open. `ring0 turn` is one span over
//! each of its calls' stages; without an endpoint nothing is exported or propagated. The spans
//! of a call reach the collector when `ring0 serve` stops — SIGTERM over stdio or HTTP, or the
//! stdio client closing stdin — even on an export schedule that would never have sent them.

mod common;

use common::*;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use prost::Message;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a test waits for the spans it expects.
const SPANS_WAIT: Duration = Duration::from_secs(90);
/// Export spans every 100 ms instead of the default 5 s: the tests wait for them.
const SCHEDULE_DELAY_MS: &str = "100";
/// The biggest request the receiver reads.
const BODY_BYTES_MAX: usize = 16 << 20;

/// One span as the collector received it.
#[derive(Debug, Clone)]
struct Span {
    name: String,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    kind: i32,
    start_ns: u64,
    end_ns: u64,
    /// `STATUS_CODE_ERROR` is 2.
    status: i32,
    attrs: BTreeMap<String, String>,
}

impl Span {
    fn attr(&self, key: &str) -> &str {
        self.attrs.get(key).map_or("", String::as_str)
    }
}

/// An OTLP/HTTP receiver on loopback: every `POST /v1/traces` body kept raw and decoded.
struct Collector {
    addr: String,
    bodies: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl Collector {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let kept = bodies.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().map_while(Result::ok) {
                let kept = kept.clone();
                std::thread::spawn(move || receive(stream, &kept));
            }
        });
        Self { addr, bodies }
    }

    fn traces_url(&self) -> String {
        format!("http://{}/v1/traces", self.addr)
    }

    /// Every span received so far.
    fn spans(&self) -> Vec<Span> {
        let bodies = self.bodies.lock().unwrap();
        bodies.iter().flat_map(|b| decode(b)).collect()
    }

    /// Waits until `done` holds for the spans received, and returns them.
    fn wait_for(&self, what: &str, done: impl Fn(&[Span]) -> bool) -> Vec<Span> {
        let deadline = Instant::now() + SPANS_WAIT;
        loop {
            let spans = self.spans();
            if done(&spans) {
                return spans;
            }
            assert!(Instant::now() < deadline, "{what}; received: {spans:#?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether `needle` is anywhere in the bytes received.
    fn received_bytes_contain(&self, needle: &str) -> bool {
        let bodies = self.bodies.lock().unwrap();
        bodies
            .iter()
            .any(|b| b.windows(needle.len()).any(|w| w == needle.as_bytes()))
    }
}

/// Serves one connection: HTTP/1.1 requests with a `Content-Length` body, answered 200 with
/// an empty protobuf response.
fn receive(stream: TcpStream, kept: &Mutex<Vec<Vec<u8>>>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    loop {
        let mut head = Vec::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            if line == "\r\n" {
                break;
            }
            head.push(line.trim_end().to_string());
        }
        let length = head
            .iter()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse::<usize>().ok())?
            })
            .unwrap_or(0)
            .min(BODY_BYTES_MAX);
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let status = if head
            .first()
            .is_some_and(|l| l.starts_with("POST /v1/traces "))
        {
            kept.lock().unwrap().push(body);
            "200 OK"
        } else {
            "404 Not Found"
        };
        let response = format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n"
        );
        if writer.write_all(response.as_bytes()).is_err() {
            return;
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn decode(body: &[u8]) -> Vec<Span> {
    let request = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf request");
    let mut out = Vec::new();
    for resource in request.resource_spans {
        for scope in resource.scope_spans {
            for span in scope.spans {
                let attrs = span
                    .attributes
                    .iter()
                    .map(|kv| {
                        let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                            Some(AnyValue::StringValue(s)) => s.clone(),
                            Some(AnyValue::IntValue(i)) => i.to_string(),
                            Some(AnyValue::BoolValue(b)) => b.to_string(),
                            Some(AnyValue::DoubleValue(d)) => d.to_string(),
                            other => format!("{other:?}"),
                        };
                        (kv.key.clone(), value)
                    })
                    .collect();
                out.push(Span {
                    name: span.name,
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    kind: span.kind,
                    start_ns: span.start_time_unix_nano,
                    end_ns: span.end_time_unix_nano,
                    status: span.status.map_or(0, |s| s.code),
                    attrs,
                });
            }
        }
    }
    out
}

/// The children of `parent`, by name (each stage once in a one-call round, but a re-dispatch
/// adds a second `dispatch`: the first is kept).
fn children<'a>(spans: &'a [Span], parent: &Span) -> BTreeMap<&'a str, &'a Span> {
    let mut out = BTreeMap::new();
    for span in spans.iter().filter(|s| s.parent_span_id == parent.span_id) {
        out.entry(span.name.as_str()).or_insert(span);
    }
    out
}

/// The one span named `name` of `trace_id`.
fn named<'a>(spans: &'a [Span], trace_id: &str, name: &str) -> &'a Span {
    let found: Vec<&Span> = spans
        .iter()
        .filter(|s| s.trace_id == trace_id && s.name == name)
        .collect();
    assert_eq!(found.len(), 1, "one {name} span in {spans:#?}");
    found[0]
}

/// `SPAN_KIND_SERVER` in OTLP.
const KIND_SERVER: i32 = 2;
/// `STATUS_CODE_UNSET` and `STATUS_CODE_ERROR` in OTLP.
const STATUS_UNSET: i32 = 0;
const STATUS_ERROR: i32 = 2;

const STAGES: [&str; 7] = [
    "prepare", "admit", "commit", "dispatch", "shape", "settle", "project",
];

#[test]
fn a_held_then_approved_call_is_one_trace_of_its_stages_with_the_approval_between_commit_and_dispatch()
 {
    let Some(peers) = peers() else {
        return;
    };
    let collector = Collector::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ring0.toml"), HELD_SHELL_CONFIG).unwrap();
    let mut cmd = serve_http_command(dir.path());
    // The standard variable, without /v1/traces: the exporter appends it.
    cmd.env(
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        format!("http://{}", collector.addr),
    )
    .env("OTEL_BSP_SCHEDULE_DELAY", SCHEDULE_DELAY_MS);
    let server = start_http(cmd);
    let trace_id = "0af7651916cd43dd8448eb211c80319c";
    let client_span = "b7ad6b7169203331";
    let marker = "marker-4f1d9c2e-held";
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/py_client_traced.py");
    let seen = python_report(
        Command::new(python(&peers))
            .arg(&script)
            .arg(server.url())
            .arg(format!("00-{trace_id}-{client_span}-01"))
            .arg(marker),
    );
    assert_eq!(seen["is_error"], false, "{seen}");
    assert_eq!(
        seen["asked"].as_array().unwrap().len(),
        1,
        "asked once: {seen}"
    );
    assert!(dir.path().join(marker).exists(), "the approved call ran");

    let spans = collector.wait_for("the call's span and its stages", |spans| {
        spans
            .iter()
            .any(|s| s.trace_id == trace_id && s.name == "tools/call shell")
            && spans.iter().filter(|s| s.trace_id == trace_id).count() >= STAGES.len() + 2
    });
    let root = named(&spans, trace_id, "tools/call shell");
    assert_eq!(
        root.parent_span_id, client_span,
        "continues the client's trace"
    );
    assert_eq!(root.kind, KIND_SERVER);
    for (key, value) in [
        ("mcp.method.name", "tools/call"),
        ("gen_ai.operation.name", "execute_tool"),
        ("gen_ai.tool.name", "shell"),
        ("network.transport", "tcp"),
        ("ring0.principal", "local"),
        ("ring0.intent.state", "ACKED"),
        ("ring0.disposition", "dispatched"),
    ] {
        assert_eq!(root.attr(key), value, "{key} on {root:#?}");
    }
    assert!(!root.attr("mcp.session.id").is_empty(), "{root:#?}");
    assert!(!root.attr("mcp.protocol.version").is_empty(), "{root:#?}");
    assert!(
        !root.attrs.contains_key("target"),
        "no code detail: {root:#?}"
    );
    assert!(!root.attr("ring0.intent.id").is_empty(), "{root:#?}");
    let stages = children(&spans, root);
    for stage in STAGES.iter().chain(&["approve"]) {
        assert!(
            stages.contains_key(stage),
            "no {stage} under {root:#?}: {stages:#?}"
        );
    }
    assert_eq!(stages["prepare"].attr("ring0.decision"), "hold");
    assert_eq!(stages["commit"].attr("ring0.intent.state"), "RECORDED");
    let approve = stages["approve"];
    assert_eq!(approve.attr("ring0.decision"), "allow", "{approve:#?}");
    assert!(
        approve
            .attr("ring0.decision.rule")
            .starts_with("approved:ap_"),
        "the person's approval decided: {approve:#?}"
    );
    assert_eq!(stages["settle"].attr("ring0.intent.state"), "ACKED");
    assert_eq!(
        stages["settle"].attr("ring0.intent.timeline"),
        "PROPOSED,RECORDED,DISPATCHED,ACKED"
    );
    // The person is asked after the journal claimed the call and before it runs.
    assert!(stages["commit"].end_ns <= approve.start_ns, "{stages:#?}");
    assert!(approve.end_ns <= stages["dispatch"].start_ns, "{stages:#?}");
    assert!(
        !collector.received_bytes_contain(marker),
        "an argument value was exported"
    );
}

fn reconciling_config(dir: &Path, traces_url: &str) -> String {
    common::restarting_upstream_config(
        dir,
        &format!("\n[telemetry]\nendpoint = {traces_url:?}\nservice_name = \"ring0-under-test\"\n"),
    )
}

#[test]
fn a_call_settled_by_probe_after_its_upstream_crashed_is_traced_unknown_reconciling_acked_and_the_upstream_joins_the_trace()
 {
    let collector = Collector::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("ring0.toml"),
        reconciling_config(dir.path(), &collector.traces_url()),
    )
    .unwrap();
    let mut cmd = Command::new(ring0());
    cmd.arg("serve")
        .current_dir(dir.path())
        .env("RING0_STATE_DIR", dir.path().join(".ring0"))
        .env("OTEL_BSP_SCHEDULE_DELAY", SCHEDULE_DELAY_MS);
    let mut serve = Serve::start(cmd);
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let client_span = "00f067aa0ba902b7";
    let marker = "order-9e3b7a51-secret";
    let answer = serve.request(
        "tools/call",
        json!({"name": "pay__charge", "arguments": {"id": marker},
               "_meta": {"traceparent": format!("00-{trace_id}-{client_span}-01")}}),
    );
    assert_eq!(
        answer["result"]["_meta"]["io.ring0/receipt"]["state"], "ACKED",
        "{answer}"
    );

    let spans = collector.wait_for("the call's settle span with its probe", |spans| {
        let ours = spans.iter().filter(|s| s.trace_id == trace_id);
        ours.clone().any(|s| s.name == "tools/call pay__charge")
            && ours.clone().any(|s| s.name == "settle")
            && ours.clone().any(|s| s.name == "probe")
    });
    let root = named(&spans, trace_id, "tools/call pay__charge");
    assert_eq!(root.parent_span_id, client_span);
    assert_eq!(root.attr("network.transport"), "pipe");
    // The version the client's `initialize` asked for (`Serve::start`).
    assert_eq!(root.attr("mcp.protocol.version"), "2025-06-18");
    assert_eq!(root.attr("gen_ai.tool.name"), "pay__charge");
    assert_eq!(root.attr("ring0.intent.state"), "ACKED");
    let stages = children(&spans, root);
    for stage in STAGES {
        assert!(
            stages.contains_key(stage),
            "no {stage} under {root:#?}: {stages:#?}"
        );
    }
    assert!(
        !stages.contains_key("approve"),
        "nothing was held: {stages:#?}"
    );
    let dispatch = stages["dispatch"];
    assert_eq!(dispatch.attr("ring0.dispatch.attempt"), "1");
    assert_eq!(
        dispatch.status, STATUS_ERROR,
        "the attempt failed: {dispatch:#?}"
    );
    assert!(!dispatch.attr("error.type").is_empty(), "{dispatch:#?}");
    assert_eq!(root.status, STATUS_UNSET, "the call succeeded: {root:#?}");
    let settle = stages["settle"];
    assert_eq!(settle.attr("ring0.intent.state"), "ACKED");
    let timeline = settle.attr("ring0.intent.timeline");
    assert!(
        timeline.ends_with("DISPATCHED,UNKNOWN,RECONCILING,ACKED"),
        "{settle:#?}"
    );
    let probe = named(&spans, trace_id, "probe");
    assert_eq!(
        probe.parent_span_id, settle.span_id,
        "the probe is part of settling"
    );
    assert_eq!(probe.attr("ring0.probe.finding"), "applied");
    assert!(dispatch.end_ns <= settle.start_ns, "{stages:#?}");

    // The upstream was told the dispatch span as its parent, in the same trace.
    let meta = std::fs::read_to_string(dir.path().join("meta.log")).unwrap();
    let sent: Value = serde_json::from_str(meta.lines().next().unwrap()).unwrap();
    assert_eq!(
        sent["traceparent"],
        format!("00-{trace_id}-{}-01", dispatch.span_id),
        "{sent}"
    );
    let resource_named = {
        let bodies = collector.bodies.lock().unwrap();
        bodies.iter().any(|b| {
            ExportTraceServiceRequest::decode(&b[..])
                .unwrap()
                .resource_spans
                .iter()
                .any(|r| format!("{:?}", r.resource).contains("ring0-under-test"))
        })
    };
    assert!(resource_named, "service.name from [telemetry]");
    assert!(
        !collector.received_bytes_contain(marker),
        "an argument value was exported"
    );
}

#[test]
fn without_an_endpoint_nothing_is_exported_and_the_upstream_is_sent_no_trace_context() {
    let dir = tempfile::tempdir().unwrap();
    let config = reconciling_config(dir.path(), "http://127.0.0.1:9/v1/traces").replace(
        "[telemetry]\nendpoint = \"http://127.0.0.1:9/v1/traces\"\n",
        "[telemetry]\n",
    );
    std::fs::write(dir.path().join("ring0.toml"), config).unwrap();
    let mut cmd = Command::new(ring0());
    cmd.arg("serve")
        .current_dir(dir.path())
        .env("RING0_STATE_DIR", dir.path().join(".ring0"))
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
    let mut serve = Serve::start(cmd);
    let answer = serve.request(
        "tools/call",
        json!({"name": "pay__charge", "arguments": {"id": "order-1"},
               "_meta": {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}),
    );
    assert_eq!(
        answer["result"]["_meta"]["io.ring0/receipt"]["state"], "ACKED",
        "{answer}"
    );
    let meta = std::fs::read_to_string(dir.path().join("meta.log")).unwrap();
    let sent: Value = serde_json::from_str(meta.lines().next().unwrap()).unwrap();
    assert!(
        sent.get("traceparent").is_none(),
        "a client's trace context is not passed through untraced: {sent}"
    );
}

#[test]
fn a_turn_of_two_calls_is_one_span_with_each_calls_stages_under_it() {
    let collector = Collector::start();
    let dir = tempfile::tempdir().unwrap();
    let marker = "secret-content-5b2e8d";
    std::fs::write(dir.path().join("notes.txt"), marker).unwrap();
    let turn = json!({"role": "assistant", "tool_calls": [
        {"id": "call_a", "type": "function",
         "function": {"name": "read_file", "arguments": "{\"path\":\"notes.txt\"}"}},
        {"id": "call_b", "type": "function",
         "function": {"name": "list_dir", "arguments": format!("{{\"path\":\".\",\"x\":\"{marker}\"}}")}}
    ]});
    let mut child = ring0_command_in(dir.path())
        .args(["turn", "--format", "openai"])
        .env("RING0_STATE_DIR", dir.path().join(".ring0"))
        .env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", collector.traces_url())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(turn.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(printed.contains(marker), "the file was read: {printed}");
    // The command exports its spans before it returns; the receiver may still be storing them.
    let spans = collector.wait_for("the turn's span", |spans| {
        spans.iter().any(|s| s.name == "ring0 turn")
    });
    let roots: Vec<&Span> = spans.iter().filter(|s| s.name == "ring0 turn").collect();
    assert_eq!(roots.len(), 1, "{spans:#?}");
    let root = roots[0];
    assert_eq!(root.attr("gen_ai.provider.format"), "openai");
    let under: Vec<&Span> = spans
        .iter()
        .filter(|s| s.parent_span_id == root.span_id)
        .collect();
    for call in ["call_a", "call_b"] {
        let stages: Vec<&str> = under
            .iter()
            .filter(|s| s.attr("gen_ai.tool.call.id") == call)
            .map(|s| s.name.as_str())
            .collect();
        assert!(stages.contains(&"prepare"), "{call}: {stages:?}");
        assert!(stages.contains(&"project"), "{call}: {stages:?}");
    }
    let refused = under
        .iter()
        .find(|s| s.name == "prepare" && s.attr("gen_ai.tool.call.id") == "call_b")
        .unwrap();
    assert_eq!(
        refused.attr("error.type"),
        "validation_error",
        "{refused:#?}"
    );
    assert!(under.iter().any(|s| s.name == "admit"), "{under:#?}");
    assert!(
        !collector.received_bytes_contain(marker),
        "neither an argument nor a result was exported"
    );
}

#[test]
fn what_the_person_is_shown_of_the_arguments_on_stderr_never_reaches_a_span() {
    let collector = Collector::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ring0.toml"), HELD_SHELL_CONFIG).unwrap();
    let log = dir.path().join("stderr.log");
    let mut cmd = Command::new(ring0());
    cmd.arg("serve")
        .current_dir(dir.path())
        .env("RING0_STATE_DIR", dir.path().join(".ring0"))
        .env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", collector.traces_url())
        .env("OTEL_BSP_SCHEDULE_DELAY", SCHEDULE_DELAY_MS)
        .stderr(std::fs::File::create(&log).unwrap());
    let mut serve = Serve::start(cmd);
    let marker = "marker-a81c37e0-shown";
    // The client declared no elicitation: the person reads the arguments and a code on stderr,
    // written while the call's `approve` span is open.
    let held = serve.call("shell", json!({"argv": ["touch", marker]}));
    assert!(held.to_string().contains("approval_required"), "{held}");
    let spans = collector.wait_for("the held call's approve span", |spans| {
        spans
            .iter()
            .any(|s| s.name == "approve" && s.attr("error.type") == "approval_required")
            && spans.iter().any(|s| s.name == "tools/call shell")
    });
    let root = spans.iter().find(|s| s.name == "tools/call shell").unwrap();
    assert_eq!(root.attr("error.type"), "approval_required", "{root:#?}");
    assert_eq!(root.status, STATUS_ERROR);
    let shown = std::fs::read_to_string(&log).unwrap();
    assert!(
        shown.contains(marker),
        "the person was shown the arguments: {shown}"
    );
    assert!(
        !collector.received_bytes_contain(marker),
        "a log line became part of a span"
    );
}

#[test]
fn a_stateless_http_request_continues_the_trace_its_traceparent_header_names() {
    let collector = Collector::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), "hello").unwrap();
    let mut cmd = serve_http_command(dir.path());
    cmd.env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", collector.traces_url())
        .env("OTEL_BSP_SCHEDULE_DELAY", SCHEDULE_DELAY_MS);
    let server = start_http(cmd);
    let trace_id = "5c3e9b1d27a84f0e9d6c1b2a3f4e5d6c";
    let header_span = "1a2b3c4d5e6f7a8b";
    let meta = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                      "io.modelcontextprotocol/clientCapabilities": {},
                      "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"}});
    let call = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
        "name": "read_file", "arguments": {"path": "notes.txt"}, "_meta": meta}});
    let traceparent = format!("00-{trace_id}-{header_span}-01");
    let (head, answer) = post(
        &server.addr,
        &[
            ("MCP-Protocol-Version", "2026-07-28"),
            ("Mcp-Method", "tools/call"),
            ("Mcp-Name", "read_file"),
            ("traceparent", &traceparent),
        ],
        &call,
    );
    assert!(answer.to_string().contains("hello"), "{head}\n{answer}");
    let spans = collector.wait_for("the call's span", |spans| {
        spans
            .iter()
            .any(|s| s.trace_id == trace_id && s.name == "tools/call read_file")
    });
    let root = named(&spans, trace_id, "tools/call read_file");
    assert_eq!(root.parent_span_id, header_span, "{root:#?}");
    assert_eq!(root.attr("mcp.protocol.version"), "2026-07-28");
    assert_eq!(
        root.attr("mcp.session.id"),
        "",
        "a stateless request has no session"
    );
}

/// Export only when asked to: a schedule far longer than any test, so the spans a test finds
/// were exported by the process's stop, not by the schedule.
const SCHEDULE_DELAY_NEVER_MS: &str = "3600000";
/// How long a stopped `ring0 serve` may take to exit.
const EXIT_WAIT: Duration = Duration::from_secs(30);

/// `ring0 serve` over stdio in `dir`, exporting to `collector` only when it stops; returns the
/// child, its stdin and its messages, after one `read_file` call was answered.
fn stdio_serve_after_one_call(
    dir: &Path,
    collector: &Collector,
) -> (
    std::process::Child,
    std::process::ChildStdin,
    std::sync::mpsc::Receiver<Value>,
) {
    std::fs::write(dir.join("notes.txt"), "hello").unwrap();
    let mut cmd = ring0_command_in(dir);
    cmd.arg("serve")
        .env("RING0_STATE_DIR", dir.join(".ring0"))
        .env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", collector.traces_url())
        .env("OTEL_BSP_SCHEDULE_DELAY", SCHEDULE_DELAY_NEVER_MS);
    let (child, mut stdin, rx) = spawn_stdio_json(cmd);
    for message in [
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "read_file", "arguments": {"path": "notes.txt"}}}),
    ] {
        writeln!(stdin, "{message}").unwrap();
    }
    stdin.flush().unwrap();
    let deadline = Instant::now() + SPANS_WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let m = rx.recv_timeout(left).expect("ring0 answers the call");
        if m["id"] == 2 {
            assert!(m.to_string().contains("hello"), "{m}");
            break;
        }
    }
    (child, stdin, rx)
}

/// Sends SIGTERM to `child`.
fn terminate(child: &std::process::Child) {
    let sent = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
}

/// Waits (bounded) for `child` to exit and returns its status.
fn exited(child: &mut std::process::Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + EXIT_WAIT;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("ring0 serve did not exit within {EXIT_WAIT:?} of being stopped");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether the spans received hold the `read_file` call with its stages (a read is not
/// journaled: no commit, no settle).
fn has_read_file_call(spans: &[Span]) -> bool {
    let root = spans.iter().find(|s| s.name == "tools/call read_file");
    root.is_some_and(|root| {
        let stages = children(spans, root);
        ["prepare", "dispatch", "shape", "project"]
            .iter()
            .all(|stage| stages.contains_key(stage))
    })
}

#[test]
fn the_spans_of_a_call_reach_the_collector_when_a_stdio_serve_is_stopped_by_sigterm() {
    let collector = Collector::start();
    let dir = tempfile::tempdir().unwrap();
    let (mut child, _stdin, _rx) = stdio_serve_after_one_call(dir.path(), &collector);
    assert!(
        collector.spans().is_empty(),
        "nothing is exported before the stop"
    );
    terminate(&child);
    let status = exited(&mut child);
    assert!(
        status.success(),
        "a stop asked for is a clean exit: {status}"
    );
    let spans = collector.spans();
    assert!(has_read_file_call(&spans), "{spans:#?}");
}

#[test]
fn the_spans_of_a_call_reach_the_collector_when_the_stdio_client_closes_stdin() {
    let collector = Collector::start();
    let dir = tempfile::tempdir().unwrap();
    let (mut child, stdin, _rx) = stdio_serve_after_one_call(dir.path(), &collector);
    drop(stdin);
    let status = exited(&mut child);
    assert!(status.success(), "{status}");
    let spans = collector.spans();
    assert!(has_read_file_call(&spans), "{spans:#?}");
}

#[test]
fn the_spans_of_a_call_reach_the_collector_when_an_http_serve_is_stopped_by_sigterm() {
    let collector = Collector::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), "hello").unwrap();
    let mut cmd = serve_http_command(dir.path());
    cmd.env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", collector.traces_url())
        .env("OTEL_BSP_SCHEDULE_DELAY", SCHEDULE_DELAY_NEVER_MS);
    let mut server = start_http(cmd);
    let meta = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                      "io.modelcontextprotocol/clientCapabilities": {},
                      "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"}});
    let call = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
        "name": "read_file", "arguments": {"path": "notes.txt"}, "_meta": meta}});
    let (head, answer) = post(
        &server.addr,
        &[
            ("MCP-Protocol-Version", "2026-07-28"),
            ("Mcp-Method", "tools/call"),
            ("Mcp-Name", "read_file"),
        ],
        &call,
    );
    assert!(answer.to_string().contains("hello"), "{head}\n{answer}");
    terminate(&server.child);
    let status = exited(&mut server.child);
    assert!(status.success(), "{status}");
    let spans = collector.spans();
    assert!(has_read_file_call(&spans), "{spans:#?}");
}

/// `header_recorder.py`: a Streamable HTTP upstream that records every request's headers in
/// `record`, killed on drop.
struct HeaderRecorder {
    child: std::process::Child,
    url: String,
}

impl HeaderRecorder {
    fn start(record: &Path) -> Self {
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/header_recorder.py");
        let mut child = Command::new("python3")
            .arg(&script)
            .arg(record)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line
            .trim()
            .strip_prefix("listening on ")
            .expect("the recorder's address")
            .to_string();
        Self { child, url }
    }
}

impl Drop for HeaderRecorder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn an_http_upstream_is_sent_the_traceparent_header_of_the_dispatch_that_called_it() {
    let collector = Collector::start();
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("upstream-requests.jsonl");
    let recorder = HeaderRecorder::start(&record);
    let config = one_upstream_config(
        "rec",
        "[\"rec__*\"]",
        "A0",
        "rec",
        &format!("url = {:?}", recorder.url),
        "",
    );
    std::fs::write(dir.path().join("ring0.toml"), config).unwrap();
    let mut cmd = ring0_command_in(dir.path());
    cmd.arg("serve")
        .env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", collector.traces_url())
        .env("OTEL_BSP_SCHEDULE_DELAY", SCHEDULE_DELAY_MS);
    let mut serve = Serve::start(cmd);
    serve.wait_for_tool("rec__ping");
    let trace_id = "7d3c1e0f9a2b4c5d8e6f0a1b2c3d4e5f";
    let client_span = "0123456789abcdef";
    let answer = serve.request(
        "tools/call",
        json!({"name": "rec__ping", "arguments": {},
               "_meta": {"traceparent": format!("00-{trace_id}-{client_span}-01"),
                         "tracestate": "vendor=abc"}}),
    );
    assert!(answer.to_string().contains("pong"), "{answer}");
    let spans = collector.wait_for("the call's dispatch span", |spans| {
        spans
            .iter()
            .any(|s| s.trace_id == trace_id && s.name == "dispatch")
    });
    let dispatch = named(&spans, trace_id, "dispatch");
    let calls: Vec<Value> = std::fs::read_to_string(&record)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|r: &Value| r["method"] == "tools/call")
        .collect();
    assert_eq!(calls.len(), 1, "{calls:#?}");
    let headers = &calls[0]["headers"];
    assert_eq!(
        headers["traceparent"],
        format!("00-{trace_id}-{}-01", dispatch.span_id),
        "the header names ring0's dispatch span, in the client's trace: {headers}"
    );
    // The trace's vendor state travels along the trace, as W3C asks.
    assert_eq!(headers["tracestate"], "vendor=abc", "{headers}");
    // Requests outside a traced call carry no context.
    let listed = std::fs::read_to_string(&record).unwrap();
    let list: Value = listed
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|r| r["method"] == "tools/list")
        .unwrap();
    assert!(list["headers"].get("traceparent").is_none(), "{list}");
}

/// `shell` contained (A1) without approval: a call a test can leave in flight.
const SHELL_GRANT: &str = "[workspace]\nstate_dir = \".ring0\"\n\n[[grants]]\nname = \"contained\"\ntools = [\"shell\"]\nceiling = \"A1\"\nshell = true\n";

#[test]
fn a_restart_that_settles_a_call_left_in_flight_is_traced_as_a_recover_span() {
    let collector = Collector::start();
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().canonicalize().unwrap();
    std::fs::write(ws.join("ring0.toml"), SHELL_GRANT).unwrap();
    // The first process is killed (SIGKILL) while its shell call runs: the intent stays
    // DISPATCHED in the journal.
    let mut first = Serve::start({
        let mut cmd = ring0_command_in(&ws);
        cmd.arg("serve").env_remove("OTEL_EXPORTER_OTLP_ENDPOINT");
        cmd
    });
    first.send(
        json!({"jsonrpc": "2.0", "id": 99, "method": "tools/call", "params": {
        "name": "shell", "arguments": {"argv": ["sh", "-c", "echo on > started; sleep 120"]}}}),
    );
    wait_for_file_text(&ws.join("started"), "on", "the shell call runs");
    drop(first);

    // The next one, tracing, settles it before it serves: shell has no probe and no key, so a
    // person decides (DEAD_LETTER), and the restart says so in a span.
    let mut cmd = ring0_command_in(&ws);
    cmd.arg("serve")
        .env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", collector.traces_url())
        .env("OTEL_BSP_SCHEDULE_DELAY", SCHEDULE_DELAY_MS);
    let mut second = Serve::start(cmd);
    second.request("tools/list", json!({}));
    let spans = collector.wait_for("the recovery's span", |spans| {
        spans.iter().any(|s| s.name == "recover")
    });
    let recovered: Vec<&Span> = spans.iter().filter(|s| s.name == "recover").collect();
    assert_eq!(recovered.len(), 1, "{spans:#?}");
    let span = recovered[0];
    assert_eq!(span.parent_span_id, "", "a root span: {span:#?}");
    assert_eq!(span.attr("gen_ai.tool.name"), "shell");
    assert!(!span.attr("ring0.intent.id").is_empty(), "{span:#?}");
    assert_eq!(span.attr("ring0.recovery.found"), "UNKNOWN", "{span:#?}");
    assert_eq!(
        span.attr("ring0.recovery.action"),
        "dead_letter",
        "{span:#?}"
    );
    assert_eq!(span.attr("ring0.intent.state"), "DEAD_LETTER", "{span:#?}");
    assert!(
        span.attr("ring0.intent.timeline")
            .ends_with("DISPATCHED,UNKNOWN,RECONCILING,DEAD_LETTER"),
        "{span:#?}"
    );
    assert_eq!(span.attr("error.type"), "DEAD_LETTER");
    assert_eq!(span.status, STATUS_ERROR);
    // The journal agrees: the intent the span names is the dead letter.
    let shown = ring0_command_in(&ws)
        .args(["journal", "show", span.attr("ring0.intent.id")])
        .output()
        .unwrap();
    assert!(
        text(&shown.stdout).contains("DEAD_LETTER"),
        "{}{}",
        text(&shown.stdout),
        text(&shown.stderr)
    );
    assert!(
        !collector.received_bytes_contain("sleep 120"),
        "an argument value was exported"
    );
}

#[test]
fn a_restart_that_re_sends_a_keyed_call_left_in_flight_traces_the_dispatch_under_its_recover_span()
{
    let collector = Collector::start();
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().canonicalize().unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/effect_upstream.py");
    let config = one_upstream_config(
        "effects",
        "[\"fx__append\"]",
        "A2",
        "fx",
        &format!(
            "command = \"python3\"\nargs = [{:?}, \"--dir\", {:?}]\nenv = [\"PATH\"]",
            fixture.display().to_string(),
            ws.display().to_string()
        ),
        "[upstreams.tools.append]\neffect = \"non_idempotent\"\nauthority = \"A2\"\n\
         strategy = [\"exploitation\"]\nsettlement = \"idempotency_key\"\n",
    );
    std::fs::write(ws.join("ring0.toml"), config).unwrap();
    let mut first = Serve::start({
        let mut cmd = ring0_command_in(&ws);
        cmd.arg("serve").env_remove("OTEL_EXPORTER_OTLP_ENDPOINT");
        cmd
    });
    first.wait_for_tool("fx__append");
    first.send(
        json!({"jsonrpc": "2.0", "id": 99, "method": "tools/call", "params": {
        "name": "fx__append", "arguments": {"text": "crash", "gate": "gate-crash"}}}),
    );
    wait_for_file_text(
        &ws.join("entered.log"),
        "crash",
        "the call reaches the upstream",
    );
    drop(first);
    std::fs::write(ws.join("gate-crash"), "").unwrap();

    let mut cmd = ring0_command_in(&ws);
    cmd.arg("serve")
        .env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", collector.traces_url())
        .env("OTEL_BSP_SCHEDULE_DELAY", SCHEDULE_DELAY_MS);
    let mut second = Serve::start(cmd);
    second.request("tools/list", json!({}));
    let spans = collector.wait_for("the recovery's span and its dispatch", |spans| {
        spans.iter().any(|s| {
            s.name == "recover"
                && spans
                    .iter()
                    .any(|c| c.parent_span_id == s.span_id && c.name == "dispatch")
        })
    });
    let span = spans.iter().find(|s| s.name == "recover").unwrap();
    assert_eq!(span.attr("gen_ai.tool.name"), "fx__append");
    assert_eq!(
        span.attr("ring0.recovery.action"),
        "redispatched",
        "{span:#?}"
    );
    assert_eq!(span.attr("ring0.intent.state"), "ACKED", "{span:#?}");
    assert_eq!(span.status, STATUS_UNSET, "{span:#?}");
    let dispatch = children(&spans, span)["dispatch"];
    assert_eq!(dispatch.trace_id, span.trace_id);
    assert_eq!(
        dispatch.attr("ring0.dispatch.attempt"),
        "2",
        "{dispatch:#?}"
    );
    assert_eq!(
        dispatch.attr("ring0.intent.id"),
        span.attr("ring0.intent.id")
    );
}
