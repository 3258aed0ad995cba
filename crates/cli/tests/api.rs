//! The HTTP agent API (`/v1`) of the real `ring0 serve --http`, driven by a real HTTP client
//! the way a host meets it: sessions, host tools, turns in each provider format, pending
//! actions and their outcomes, approvals, the event stream, the OpenAPI document, and every
//! refusal in the error envelope, changing nothing. The schemathesis run fuzzes every route of
//! the published document against the server.

mod common;

use common::*;
use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};

/// Grants of the tests' servers: the file tools up to A1, the host tools `lookup_*`, `sql` and
/// `send_*` up to A2, `wire_*` held for a person's approval.
const API_CONFIG: &str = r#"defaults = false

[[grants]]
name = "workspace"
tools = ["read_file", "list_dir", "write_file"]
ceiling = "A1"

[[grants]]
name = "host"
tools = ["lookup_*", "sql", "send_*"]
ceiling = "A2"

[[grants]]
name = "held"
tools = ["wire_*"]
ceiling = "A3"
approval = true
"#;

/// A host's HTTP client of one server, acting with `token` when given.
struct Host {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

impl Host {
    fn of(server: &HttpServer, token: Option<&str>) -> Self {
        // Installed once per process; a second install is refused harmlessly.
        let _ = rustls::crypto::ring::default_provider().install_default();
        Self {
            http: reqwest::Client::builder()
                .timeout(HTTP_WAIT)
                .build()
                .unwrap(),
            base: format!("http://{}", server.addr),
            token: token.map(str::to_string),
        }
    }

    /// One request with `body` sent as it is under `content_type`; the status and the JSON
    /// body (null when there is none).
    async fn raw(
        &self,
        method: &str,
        path: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> (u16, Value) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .header("content-type", content_type)
            .body(body);
        if let Some(token) = &self.token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let response = request.send().await.expect("the server answers");
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    async fn call(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let bytes = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
        self.raw(method, path, "application/json", bytes).await
    }

    /// Creates a session with `settings`; its id.
    async fn session(&self, settings: Value) -> String {
        let (status, body) = self.call("POST", "/v1/sessions", Some(&settings)).await;
        assert_eq!(status, 201, "{body}");
        body["id"].as_str().unwrap().to_string()
    }

    async fn put_tools(&self, session: &str, tools: Value) -> (u16, Value) {
        let path = format!("/v1/sessions/{session}/tools");
        self.call("PUT", &path, Some(&json!({"tools": tools})))
            .await
    }

    async fn turn(&self, session: &str, format: &str, message: Value) -> Value {
        let path = format!("/v1/sessions/{session}/turns");
        let body = json!({"format": format, "message": message, "wait_ms": 60000});
        let (status, body) = self.call("POST", &path, Some(&body)).await;
        assert_eq!(status, 200, "{body}");
        body
    }

    /// The session's open event stream.
    async fn events(&self, session: &str) -> reqwest::Response {
        let stream = self
            .http
            .get(format!("{}/v1/sessions/{session}/events", self.base))
            .send()
            .await
            .unwrap();
        assert_eq!(stream.status(), 200);
        stream
    }

    async fn outcomes(&self, session: &str, turn: &str, outcomes: Value) -> (u16, Value) {
        let path = format!("/v1/sessions/{session}/turns/{turn}/outcomes");
        let body = json!({"outcomes": outcomes, "wait_ms": 60000});
        self.call("POST", &path, Some(&body)).await
    }
}

/// The events of `stream` up to and with the first of kind `last`, read within [`HTTP_WAIT`].
async fn read_events_until(stream: &mut reqwest::Response, last: &str) -> Vec<Value> {
    let mut events: Vec<Value> = Vec::new();
    let mut buffer = String::new();
    let deadline = Instant::now() + HTTP_WAIT;
    while !events.iter().any(|e| e["event"] == last) {
        assert!(Instant::now() < deadline, "no {last} in {events:?}");
        let chunk = tokio::time::timeout(HTTP_WAIT, stream.chunk())
            .await
            .expect("an event within the wait")
            .unwrap()
            .expect("the stream stays open");
        buffer.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buffer.find("\n\n") {
            let frame: String = buffer.drain(..end + 2).collect();
            if let Some(data) = frame.lines().find_map(|l| l.strip_prefix("data: ")) {
                events.push(serde_json::from_str(data).unwrap());
            }
        }
    }
    events
}

/// A workspace with `ring0.toml` (`config`) and `notes.txt`, served over HTTP.
fn serve(dir: &Path, config: &str) -> HttpServer {
    std::fs::write(dir.join("ring0.toml"), config).unwrap();
    std::fs::write(dir.join("notes.txt"), "the vault code is 4711\n").unwrap();
    start_http(serve_http_command(dir))
}

/// An OpenAI Chat Completions assistant message calling `tool` with `args`.
fn chat_call(id: &str, tool: &str, args: Value) -> Value {
    json!({"role": "assistant", "content": null, "tool_calls": [
        {"id": id, "type": "function", "function": {"name": tool, "arguments": args.to_string()}}
    ]})
}

/// The projection the model sees in a Chat Completions result message.
fn seen(message: &Value) -> Value {
    serde_json::from_str(message["content"].as_str().unwrap()).unwrap()
}

/// A host tool `lookup_order`: a read with a defaulted argument.
fn lookup_order() -> Value {
    json!({
        "name": "lookup_order", "description": "An order by id",
        "input_schema": {"type": "object", "properties": {
            "id": {"type": "integer"}, "fields": {"type": "string", "default": "all"}
        }, "required": ["id"]},
        "effect": "nullipotent", "authority": "A0", "strategy": ["exploration"]
    })
}

/// A host tool `send_invoice`: a write settled by idempotency key.
fn send_invoice() -> Value {
    json!({
        "name": "send_invoice", "description": "Sends an invoice",
        "input_schema": {"type": "object", "properties": {"to": {"type": "string"}}, "required": ["to"]},
        "effect": "non_idempotent", "authority": "A2", "settlement": "idempotency_key",
        "strategy": ["exploitation"]
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_runs_ring0s_tools_and_answers_in_the_turns_format() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(dir.path(), API_CONFIG);
    let host = Host::of(&server, None);
    let session = host.session(json!({})).await;
    let read = json!({"path": "notes.txt"});
    let chat = host
        .turn(
            &session,
            "openai",
            chat_call("call_1", "read_file", read.clone()),
        )
        .await;
    assert_eq!(chat["status"], "complete");
    assert_eq!(chat["pending"], json!([]));
    let message = &chat["results"][0];
    assert_eq!(message["role"], "tool");
    assert_eq!(message["tool_call_id"], "call_1");
    assert!(
        message["content"]
            .as_str()
            .unwrap()
            .contains("vault code is 4711")
    );

    let responses = host
        .turn(
            &session,
            "responses",
            json!({"output": [{"type": "function_call", "call_id": "call_2", "name": "read_file", "arguments": read.to_string()}]}),
        )
        .await;
    let item = &responses["results"][0];
    assert_eq!(item["type"], "function_call_output");
    assert_eq!(item["call_id"], "call_2");
    assert!(item["output"].as_str().unwrap().contains("4711"));

    let anthropic = host
        .turn(
            &session,
            "anthropic",
            json!({"role": "assistant", "content": [
                {"type": "text", "text": "Reading."},
                {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": read}
            ]}),
        )
        .await;
    let results = &anthropic["results"];
    assert_eq!(results["role"], "user");
    assert_eq!(results["content"][0]["tool_use_id"], "toolu_1");
    assert_eq!(results["content"][0]["is_error"], false);
    assert!(
        results["content"][0]["content"]
            .as_str()
            .unwrap()
            .contains("4711")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_tool_comes_back_pending_and_its_outcome_is_the_models_result() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(dir.path(), API_CONFIG);
    let host = Host::of(&server, None);
    let session = host.session(json!({})).await;
    let (status, listed) = host.put_tools(&session, json!([lookup_order()])).await;
    assert_eq!(status, 200, "{listed}");
    let listing = listed["tools"].as_array().unwrap();
    let mine = listing
        .iter()
        .find(|t| t["name"] == "lookup_order")
        .unwrap();
    assert_eq!(mine["host"], true);
    assert!(
        listing
            .iter()
            .any(|t| t["name"] == "read_file" && t["host"] == false)
    );

    let turn = host
        .turn(
            &session,
            "openai",
            chat_call("call_7", "lookup_order", json!({"id": 42})),
        )
        .await;
    assert_eq!(turn["status"], "pending", "{turn}");
    let action = &turn["pending"][0];
    assert_eq!(action["kind"], "run");
    assert_eq!(action["tool"], "lookup_order");
    assert_eq!(action["call_id"], "call_7");
    // The prepared arguments: the schema's default filled in.
    assert_eq!(action["arguments"], json!({"id": 42, "fields": "all"}));
    assert!(action["deadline_ms"].as_u64().unwrap() > 0);

    let (status, done) = host
        .outcomes(
            &session,
            turn["turn"].as_str().unwrap(),
            json!([{"id": action["id"], "output": {"order": 42, "status": "shipped"}}]),
        )
        .await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["status"], "complete");
    let result = seen(&done["results"][0]);
    assert_eq!(result["state"], "ACKED");
    assert_eq!(
        result["outcome"]["observation"]["structured"],
        json!({"order": 42, "status": "shipped"})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_validation_error_goes_back_to_the_model_and_the_host_runs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(dir.path(), API_CONFIG);
    let host = Host::of(&server, None);
    let session = host.session(json!({})).await;
    host.put_tools(&session, json!([lookup_order()])).await;
    let turn = host
        .turn(
            &session,
            "openai",
            chat_call(
                "call_1",
                "lookup_order",
                json!({"id": "forty-two", "colour": 1}),
            ),
        )
        .await;
    assert_eq!(turn["status"], "complete", "{turn}");
    assert_eq!(turn["pending"], json!([]));
    let refusal = seen(&turn["results"][0]);
    assert_eq!(refusal["status"], "validation_error");
    let locs: Vec<&str> = refusal["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["loc"].as_str().unwrap())
        .collect();
    assert!(
        locs.contains(&"/id") && locs.contains(&"/colour"),
        "{locs:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_call_is_pending_for_approval_and_runs_once_approved() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(dir.path(), API_CONFIG);
    let host = Host::of(&server, None);
    let session = host.session(json!({})).await;
    let wire = json!({
        "name": "wire_money", "input_schema": {"type": "object", "properties": {"cents": {"type": "integer"}}},
        "effect": "non_idempotent", "authority": "A3", "strategy": ["exploitation"]
    });
    host.put_tools(&session, json!([wire])).await;
    let turn = host
        .turn(
            &session,
            "openai",
            chat_call("call_w", "wire_money", json!({"cents": 500})),
        )
        .await;
    let turn_id = turn["turn"].as_str().unwrap().to_string();
    let held = &turn["pending"][0];
    assert_eq!(turn["status"], "pending");
    assert_eq!(held["kind"], "approval_required", "{turn}");
    assert_eq!(held["arguments"], json!({"cents": 500}));
    assert!(held["args_hash"].as_str().unwrap().starts_with("v1:"));

    // An approval that names other arguments' digest is refused, and changes nothing.
    let (status, refused) = host
        .outcomes(
            &session,
            &turn_id,
            json!([{"id": held["id"], "approve": true, "args_hash": "v1:00"}]),
        )
        .await;
    assert_eq!(status, 409, "{refused}");
    let (_, still) = host
        .call(
            "GET",
            &format!("/v1/sessions/{session}/turns/{turn_id}"),
            None,
        )
        .await;
    assert_eq!(still["pending"][0]["id"], held["id"]);

    let (status, run) = host
        .outcomes(
            &session,
            &turn_id,
            json!([{"id": held["id"], "approve": true, "args_hash": held["args_hash"]}]),
        )
        .await;
    assert_eq!(status, 200, "{run}");
    let action = &run["pending"][0];
    assert_eq!(action["kind"], "run", "{run}");
    assert!(action["intent_id"].is_string() && action["idempotency_key"].is_string());
    let (_, done) = host
        .outcomes(
            &session,
            &turn_id,
            json!([{"id": action["id"], "output": "wired"}]),
        )
        .await;
    assert_eq!(done["status"], "complete");
    assert_eq!(
        seen(&done["results"][0])["outcome"]["observation"]["text"],
        "wired"
    );

    // Denied: the model is told, and the host is never asked to run it.
    let turn = host
        .turn(
            &session,
            "openai",
            chat_call("call_x", "wire_money", json!({"cents": 9})),
        )
        .await;
    let held = &turn["pending"][0];
    let (_, done) = host
        .outcomes(
            &session,
            turn["turn"].as_str().unwrap(),
            json!([{"id": held["id"], "approve": false, "reason": "not today"}]),
        )
        .await;
    assert_eq!(done["status"], "complete", "{done}");
    let refusal = seen(&done["results"][0]);
    assert_eq!(refusal["status"], "approval_denied");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_sent_again_before_its_result_reached_the_host_is_not_run_twice() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(dir.path(), API_CONFIG);
    let host = Host::of(&server, None);
    let session = host.session(json!({})).await;
    host.put_tools(&session, json!([send_invoice(), lookup_order()]))
        .await;
    let invoice = json!({"id": "call_i", "type": "function",
        "function": {"name": "send_invoice", "arguments": "{\"to\":\"acme\"}"}});
    let lookup = json!({"id": "call_l", "type": "function",
        "function": {"name": "lookup_order", "arguments": "{\"id\":7}"}});
    // The write is a barrier: the read after it waits for its own epoch.
    let first = host
        .turn(
            &session,
            "openai",
            json!({"role": "assistant", "tool_calls": [invoice, lookup]}),
        )
        .await;
    let first_turn = first["turn"].as_str().unwrap().to_string();
    let write = first["pending"][0].clone();
    assert_eq!(write["tool"], "send_invoice", "{first}");
    let (_, next) = host
        .outcomes(
            &session,
            &first_turn,
            json!([{"id": write["id"], "output": {"invoice": "INV-1"}}]),
        )
        .await;
    assert_eq!(next["status"], "pending");
    assert_eq!(next["pending"][0]["tool"], "lookup_order", "{next}");

    // The write's result has not reached the host yet (its turn is not complete): the same
    // call sent again is answered with it, and the host is not asked to run it a second time.
    let again = host
        .turn(
            &session,
            "openai",
            json!({"role": "assistant", "tool_calls": [invoice]}),
        )
        .await;
    assert_eq!(
        again["status"], "complete",
        "the write was asked for again: {again}"
    );
    let replayed = seen(&again["results"][0]);
    assert_eq!(replayed["disposition"], "replayed", "{replayed}");
    assert_eq!(replayed["intent_id"], write["intent_id"]);
    assert_eq!(
        replayed["outcome"]["observation"]["structured"],
        json!({"invoice": "INV-1"})
    );

    let read = &next["pending"][0];
    let (_, done) = host
        .outcomes(
            &session,
            &first_turn,
            json!([{"id": read["id"], "output": {"order": 7}}]),
        )
        .await;
    assert_eq!(done["status"], "complete");
    assert_eq!(done["results"].as_array().unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_the_host_never_reports_is_asked_again_under_its_key_then_left_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(dir.path(), API_CONFIG);
    let host = Host::of(&server, None);
    let session = host.session(json!({})).await;
    let mut invoice = send_invoice();
    invoice["timeout_ms"] = json!(500);
    host.put_tools(&session, json!([invoice])).await;
    let first = host
        .turn(
            &session,
            "openai",
            chat_call("call_t", "send_invoice", json!({"to": "acme"})),
        )
        .await;
    let turn_id = first["turn"].as_str().unwrap().to_string();
    let mut runs = vec![first["pending"][0].clone()];
    // Never answered: each run times out; the settlement asks again under the same key, once.
    let done = loop {
        let path = format!("/v1/sessions/{session}/turns/{turn_id}?wait_ms=60000");
        let (status, now) = host.call("GET", &path, None).await;
        assert_eq!(status, 200, "{now}");
        if now["status"] == "complete" {
            break now;
        }
        for action in now["pending"].as_array().unwrap() {
            if !runs.iter().any(|r| r["id"] == action["id"]) {
                runs.push(action.clone());
            }
        }
        assert!(runs.len() <= 2, "asked more than once again: {runs:?}");
        // A turn with an action pending answers at once: pace the polling, decide nothing by it.
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        runs.len(),
        2,
        "the unknown outcome was not settled by asking again: {runs:?}"
    );
    assert_eq!(runs[0]["idempotency_key"], runs[1]["idempotency_key"]);
    assert_eq!(runs[0]["intent_id"], runs[1]["intent_id"]);
    let result = seen(&done["results"][0]);
    assert_eq!(result["outcome"]["kind"], "failed", "{result}");
    assert_eq!(
        result["outcome"]["uncertain"], true,
        "never reported as a success: {result}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_session_ends_its_turn_waiting_for_the_host_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(dir.path(), API_CONFIG);
    let host = Host::of(&server, None);
    let session = host.session(json!({})).await;
    host.put_tools(&session, json!([send_invoice()])).await;
    let mut stream = host.events(&session).await;
    let turn = host
        .turn(
            &session,
            "openai",
            chat_call("call_d", "send_invoice", json!({"to": "acme"})),
        )
        .await;
    assert_eq!(turn["status"], "pending");
    let (status, deleted) = host
        .call("DELETE", &format!("/v1/sessions/{session}"), None)
        .await;
    assert_eq!(status, 200, "{deleted}");
    assert_eq!(deleted["turns_cancelled"], 1, "{deleted}");
    // The host's call would wait up to its 120 s timeout; deleting the session ends it now.
    let events = read_events_until(&mut stream, "turn_finished").await;
    let finished = events
        .iter()
        .find(|e| e["event"] == "call_finished")
        .expect("the call finished");
    assert_eq!(finished["call_id"], "call_d");
    assert_eq!(
        finished["is_error"], true,
        "an unreported write is no success"
    );
    let (status, _) = host
        .call("GET", &format!("/v1/sessions/{session}/tools"), None)
        .await;
    assert_eq!(status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_tool_call_is_checked_against_its_grammar_and_answered_as_custom_output() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(dir.path(), API_CONFIG);
    let host = Host::of(&server, None);
    let session = host.session(json!({"format": "responses"})).await;
    let sql = json!({
        "name": "sql", "type": "custom", "grammar": {"syntax": "regex", "definition": "SELECT [a-z_]+ FROM [a-z_]+"},
        "effect": "nullipotent", "authority": "A0", "strategy": ["exploration"]
    });
    let (status, body) = host.put_tools(&session, json!([sql])).await;
    assert_eq!(status, 200, "{body}");
    let path = format!("/v1/sessions/{session}/turns");
    let body = json!({"message": {"output": [
        {"type": "custom_tool_call", "call_id": "call_ok", "name": "sql", "input": "SELECT name FROM users"},
        {"type": "custom_tool_call", "call_id": "call_bad", "name": "sql", "input": "DROP TABLE users"}
    ]}});
    let (_, turn) = host.call("POST", &path, Some(&body)).await;
    let action = &turn["pending"][0];
    assert_eq!(turn["pending"].as_array().unwrap().len(), 1, "{turn}");
    assert_eq!(action["input"], "SELECT name FROM users");
    let (_, done) = host
        .outcomes(
            &session,
            turn["turn"].as_str().unwrap(),
            json!([{"id": action["id"], "output": "alice"}]),
        )
        .await;
    let items = done["results"].as_array().unwrap();
    assert_eq!(items.len(), 2, "every call is answered: {done}");
    assert!(items.iter().all(|i| i["type"] == "custom_tool_call_output"));
    assert_eq!(items[0]["call_id"], "call_ok");
    let bad: Value = serde_json::from_str(items[1]["output"].as_str().unwrap()).unwrap();
    assert_eq!(bad["status"], "validation_error");
    assert_eq!(bad["errors"][0]["loc"], "/input");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_grants_narrow_its_principals_and_never_widen_them() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(dir.path(), API_CONFIG);
    let host = Host::of(&server, None);
    let session = host
        .session(json!({"grants": {"tools": ["read_file", "shell"], "ceiling": "A0"}}))
        .await;
    let (_, tools) = host
        .call("GET", &format!("/v1/sessions/{session}/tools"), None)
        .await;
    let names: Vec<&str> = tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    // shell is named by the session but not granted by the server: the session cannot add it.
    assert_eq!(names, ["read_file"]);
    let turn = host
        .turn(
            &session,
            "openai",
            json!({"role": "assistant", "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "list_dir", "arguments": "{}"}},
                {"id": "b", "type": "function", "function": {"name": "write_file", "arguments": "{\"path\":\"x.txt\",\"content\":\"x\"}"}}
            ]}),
        )
        .await;
    for message in turn["results"].as_array().unwrap() {
        // A tool the session may not call is not even known to it.
        assert_eq!(seen(message)["status"], "unknown_tool", "{message}");
    }
    assert!(!dir.path().join("x.txt").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_the_error_envelope_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(dir.path(), API_CONFIG);
    let host = Host::of(&server, None);
    let session = host.session(json!({})).await;
    let turns = format!("/v1/sessions/{session}/turns");
    let envelope = |status: u16, body: &Value, expected: u16, kind: &str| {
        assert_eq!(status, expected, "{body}");
        assert_eq!(body["status"], kind, "{body}");
        assert!(
            body["message"].is_string() && body["advice"].is_string(),
            "{body}"
        );
    };

    let (s, b) = host
        .call(
            "POST",
            "/v1/sessions/ses_nope/turns",
            Some(&json!({"message": {}})),
        )
        .await;
    envelope(s, &b, 404, "not_found");
    let (s, b) = host
        .raw(
            "POST",
            &turns,
            "application/json",
            b"{\"message\": ".to_vec(),
        )
        .await;
    envelope(s, &b, 400, "invalid_json");
    let (s, b) = host
        .raw(
            "POST",
            &turns,
            "application/json",
            br#"{"message": {}, "message": {}}"#.to_vec(),
        )
        .await;
    envelope(s, &b, 400, "invalid_json");
    let (s, b) = host.raw("POST", &turns, "text/plain", b"{}".to_vec()).await;
    envelope(s, &b, 415, "unsupported_media_type");
    let (s, b) = host
        .call(
            "POST",
            &turns,
            Some(&json!({"format": "mcp", "message": {}})),
        )
        .await;
    envelope(s, &b, 422, "validation_error");
    assert_eq!(b["errors"][0]["loc"], "/format");
    let (s, b) = host
        .call("POST", &turns, Some(&json!({"message": {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "read_file"}}]}})))
        .await;
    envelope(s, &b, 422, "invalid_turn");
    assert_eq!(b["errors"][0]["loc"], "$.tool_calls[0].id");
    let big = vec![b' '; ring0_api_body_max() + 1];
    let (s, b) = host.raw("POST", &turns, "application/json", big).await;
    envelope(s, &b, 413, "payload_too_large");

    // A tool set with one bad entry is refused whole: the good one is not registered either.
    let (s, b) = host
        .put_tools(
            &session,
            json!([lookup_order(), {"name": "read_file", "input_schema": {"type": "object"}}]),
        )
        .await;
    envelope(s, &b, 409, "conflict");
    assert_eq!(b["errors"][0]["loc"], "/tools/1/name");
    // The form of an upstream's tool names is not a host tool's to take.
    let (s, b) = host
        .put_tools(
            &session,
            json!([{"name": "github__delete_repo", "input_schema": {"type": "object"}}]),
        )
        .await;
    envelope(s, &b, 422, "validation_error");
    assert_eq!(b["errors"][0]["loc"], "/tools/0/name");
    let (s, b) = host
        .put_tools(&session, json!([{"name": "lookup_x", "input_schema": {"type": "object"}, "effect": "sometimes"}]))
        .await;
    envelope(s, &b, 422, "validation_error");
    assert_eq!(b["errors"][0]["loc"], "/tools/0/effect");
    let (_, tools) = host
        .call("GET", &format!("/v1/sessions/{session}/tools"), None)
        .await;
    assert!(
        !tools["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["host"] == true)
    );

    // Outcomes are all or nothing: one unknown action refuses the request, the known one stays
    // pending.
    host.put_tools(&session, json!([lookup_order()])).await;
    let turn = host
        .turn(
            &session,
            "openai",
            chat_call("c", "lookup_order", json!({"id": 1})),
        )
        .await;
    let turn_id = turn["turn"].as_str().unwrap();
    let action = &turn["pending"][0];
    let (s, b) = host
        .outcomes(
            &session,
            turn_id,
            json!([{"id": action["id"], "output": 1}, {"id": "act_nope", "output": 2}]),
        )
        .await;
    envelope(s, &b, 404, "not_found");
    assert_eq!(b["errors"][0]["loc"], "/outcomes/1/id");
    let (s, b) = host
        .outcomes(
            &session,
            turn_id,
            json!([{"id": action["id"], "approve": true}]),
        )
        .await;
    envelope(s, &b, 422, "validation_error");
    let (_, still) = host
        .call(
            "GET",
            &format!("/v1/sessions/{session}/turns/{turn_id}"),
            None,
        )
        .await;
    assert_eq!(still["status"], "pending");
    assert_eq!(still["pending"][0]["id"], action["id"]);

    let (s, b) = host.call("GET", "/v1/nothing/here", None).await;
    envelope(s, &b, 404, "no_route");
    let (s, b) = host.call("PATCH", &turns, None).await;
    envelope(s, &b, 405, "method_not_allowed");
}

/// The API's body bound, as documented.
fn ring0_api_body_max() -> usize {
    4 * 1024 * 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_belong_to_their_principal_and_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let config = format!("{API_CONFIG}\n{}", alice_and_bob_tokens());
    let server = serve(dir.path(), &config);
    let alice = Host::of(&server, Some("alice-token"));
    let bob = Host::of(&server, Some("bob-token"));
    let nobody = Host::of(&server, None);
    let (status, _) = nobody.call("POST", "/v1/sessions", Some(&json!({}))).await;
    assert_eq!(status, 401);
    let (status, created) = alice.call("POST", "/v1/sessions", Some(&json!({}))).await;
    assert_eq!(status, 201);
    assert_eq!(created["principal"], "alice");
    let id = created["id"].as_str().unwrap();
    for (method, path) in [
        ("GET", format!("/v1/sessions/{id}/tools")),
        ("DELETE", format!("/v1/sessions/{id}")),
    ] {
        let (status, body) = bob.call(method, &path, None).await;
        assert_eq!(status, 404, "bob reached alice's session: {body}");
    }
    let mut made = 1;
    loop {
        let (status, body) = alice.call("POST", "/v1/sessions", Some(&json!({}))).await;
        if status == 429 {
            assert_eq!(body["status"], "limit_exceeded");
            break;
        }
        assert_eq!(status, 201);
        made += 1;
        assert!(made <= 64, "more than 64 sessions for one principal");
    }
    assert_eq!(made, 64);
    // Bob's own bound is untouched by Alice's sessions.
    assert_eq!(
        bob.call("POST", "/v1/sessions", Some(&json!({}))).await.0,
        201
    );
    let (status, deleted) = alice
        .call("DELETE", &format!("/v1/sessions/{id}"), None)
        .await;
    assert_eq!(status, 200, "{deleted}");
    assert_eq!(
        alice
            .call("GET", &format!("/v1/sessions/{id}/tools"), None)
            .await
            .0,
        404
    );
    assert_eq!(
        alice.call("POST", "/v1/sessions", Some(&json!({}))).await.0,
        201
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_stream_tells_a_turns_calls_as_they_happen() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(dir.path(), API_CONFIG);
    let host = Host::of(&server, None);
    let session = host.session(json!({})).await;
    let mut stream = host.events(&session).await;
    assert!(
        stream.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    host.turn(
        &session,
        "openai",
        chat_call("call_e", "read_file", json!({"path": "notes.txt"})),
    )
    .await;
    let events = read_events_until(&mut stream, "turn_finished").await;
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    let started = kinds
        .iter()
        .position(|k| *k == "call_started")
        .expect("call_started");
    let finished = kinds
        .iter()
        .position(|k| *k == "call_finished")
        .expect("call_finished");
    assert!(started < finished, "{kinds:?}");
    assert_eq!(events[started]["call_id"], "call_e");
    assert_eq!(*kinds.last().unwrap(), "turn_finished");
}

/// A streamed turn's request, its body fed by the test event by event: the sender of the
/// body's chunks and the response to come.
struct Streaming {
    chunks: tokio::sync::mpsc::UnboundedSender<Vec<u8>>,
    response: tokio::task::JoinHandle<(u16, Value)>,
}

impl Host {
    /// Starts `POST …/turns/stream?{query}` with `content_type`; the body stays open until the
    /// returned sender is dropped.
    fn stream(&self, session: &str, query: &str, content_type: &str) -> Streaming {
        let (chunks, rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
        let body = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv()
                .await
                .map(|chunk| (Ok::<_, std::io::Error>(chunk), rx))
        });
        let mut request = self
            .http
            .post(format!(
                "{}/v1/sessions/{session}/turns/stream?{query}",
                self.base
            ))
            .header("content-type", content_type)
            .body(reqwest::Body::wrap_stream(body));
        if let Some(token) = &self.token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let response = tokio::spawn(async move {
            let response = request.send().await.expect("the server answers");
            let status = response.status().as_u16();
            let text = response.text().await.unwrap();
            (status, serde_json::from_str(&text).unwrap_or(Value::Null))
        });
        Streaming { chunks, response }
    }
}

impl Streaming {
    fn sse(&self, event: &Value) {
        self.chunks
            .send(format!("data: {event}\n\n").into_bytes())
            .unwrap();
    }

    fn line(&self, line: &str) {
        self.chunks.send(format!("{line}\n").into_bytes()).unwrap();
    }

    /// Ends the body and waits for the answer.
    async fn end(self) -> (u16, Value) {
        drop(self.chunks);
        tokio::time::timeout(HTTP_WAIT, self.response)
            .await
            .expect("the streamed turn is answered")
            .unwrap()
    }
}

/// One Chat Completions chunk carrying a tool call's delta.
fn chat_chunk(index: u64, id: Option<&str>, name: Option<&str>, args: &str) -> Value {
    let mut call = json!({"index": index, "function": {"arguments": args}});
    if let Some(id) = id {
        call["id"] = json!(id);
        call["type"] = json!("function");
    }
    if let Some(name) = name {
        call["function"]["name"] = json!(name);
    }
    json!({"object": "chat.completion.chunk", "choices": [
        {"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": null}
    ]})
}

/// A host tool `lookup_early`: a neutral read that may start while the model still streams.
fn lookup_early() -> Value {
    json!({
        "name": "lookup_early", "description": "An order by id, looked up at once",
        "input_schema": {"type": "object", "properties": {"id": {"type": "integer"}},
                         "required": ["id"]},
        "effect": "nullipotent", "authority": "A0", "strategy": ["neutral"], "early": true
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_turn_runs_an_early_call_while_the_model_still_streams() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(dir.path(), API_CONFIG);
    let host = Host::of(&server, None);
    let session = host.session(json!({})).await;
    let (status, body) = host.put_tools(&session, json!([lookup_early()])).await;
    assert_eq!(status, 200, "{body}");
    let mut events = host.events(&session).await;

    let turn = host.stream(
        &session,
        "format=openai&turn_id=resp_1",
        "text/event-stream",
    );
    turn.sse(&chat_chunk(
        0,
        Some("call_a"),
        Some("lookup_early"),
        "{\"id\"",
    ));
    turn.sse(&chat_chunk(0, None, None, ": 7}"));
    // The next call's first delta completes the first: it starts while the stream is open.
    turn.sse(&chat_chunk(
        1,
        Some("call_b"),
        Some("read_file"),
        "{\"path\": ",
    ));
    let seen_so_far = read_events_until(&mut events, "pending").await;
    let pending = seen_so_far
        .iter()
        .find(|e| e["event"] == "pending")
        .unwrap();
    assert_eq!(pending["call_id"], "call_a", "{seen_so_far:?}");
    assert!(
        seen_so_far
            .iter()
            .any(|e| e["event"] == "early_started" && e["call_id"] == "call_a"),
        "{seen_so_far:?}"
    );
    let turn_id = pending["turn"].as_str().unwrap().to_string();
    let action = pending["action"].as_str().unwrap().to_string();
    let path = format!("/v1/sessions/{session}/turns/{turn_id}/outcomes");
    let (status, body) = host
        .call(
            "POST",
            &path,
            Some(
                &json!({"outcomes": [{"id": action, "output": {"status": "shipped"}}],
                         "wait_ms": 0}),
            ),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_ne!(
        body["status"], "complete",
        "the stream is still open: {body}"
    );

    turn.sse(&chat_chunk(1, None, None, "\"notes.txt\"}"));
    turn.sse(&json!({"object": "chat.completion.chunk",
                     "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}));
    turn.chunks.send(b"data: [DONE]\n\n".to_vec()).unwrap();
    let (status, body) = turn.end().await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "complete", "{body}");
    assert!(body.get("stream_error").is_none(), "{body}");
    let results = body["results"].as_array().unwrap();
    assert_eq!(results.len(), 2, "{body}");
    assert_eq!(results[0]["tool_call_id"], "call_a");
    assert!(
        results[0]["content"].as_str().unwrap().contains("shipped"),
        "{body}"
    );
    assert_eq!(results[1]["tool_call_id"], "call_b");
    assert!(
        results[1]["content"].as_str().unwrap().contains("4711"),
        "{body}"
    );

    // The provider retries the same decision: the early call is not run a second time.
    let again = host.stream(
        &session,
        "format=openai&turn_id=resp_1",
        "application/x-ndjson",
    );
    again.line(&chat_chunk(0, Some("call_a2"), Some("lookup_early"), "{\"id\": 7}").to_string());
    again.line(
        &json!({"object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
        .to_string(),
    );
    let (status, body) = again.end().await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["status"], "complete",
        "nothing asked of the host again: {body}"
    );
    assert!(
        body["results"][0]["content"]
            .as_str()
            .unwrap()
            .contains("shipped"),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_turn_that_breaks_answers_its_complete_calls_and_runs_no_open_one() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(dir.path(), API_CONFIG);
    let host = Host::of(&server, None);
    let session = host.session(json!({"format": "anthropic"})).await;
    let turn = host.stream(&session, "", "application/x-ndjson");
    for event in [
        json!({"type": "message_start", "message": {"id": "msg_1", "role": "assistant", "content": []}}),
        json!({"type": "content_block_start", "index": 0,
               "content_block": {"type": "tool_use", "id": "toolu_r", "name": "read_file", "input": {}}}),
        json!({"type": "content_block_delta", "index": 0,
               "delta": {"type": "input_json_delta", "partial_json": "{\"path\": \"notes.txt\"}"}}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "content_block_start", "index": 1,
               "content_block": {"type": "tool_use", "id": "toolu_w", "name": "write_file", "input": {}}}),
        json!({"type": "content_block_delta", "index": 1,
               "delta": {"type": "input_json_delta", "partial_json": "{\"path\": \"made.txt\", \"content\": \"x\"}"}}),
    ] {
        turn.line(&event.to_string());
    }
    turn.line("{not json");
    let (status, body) = turn.end().await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "complete", "{body}");
    assert!(
        body["stream_error"].as_str().unwrap().contains("not JSON"),
        "{body}"
    );
    let blocks = body["results"]["content"].as_array().unwrap();
    let read = blocks
        .iter()
        .find(|b| b["tool_use_id"] == "toolu_r")
        .unwrap();
    assert!(read.to_string().contains("4711"), "{body}");
    let write = blocks
        .iter()
        .find(|b| b["tool_use_id"] == "toolu_w")
        .unwrap();
    assert_eq!(write["is_error"], true, "{body}");
    assert!(write.to_string().contains("stream_aborted"), "{body}");
    assert!(!dir.path().join("made.txt").exists(), "the open call ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_turn_refuses_what_it_cannot_read_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(dir.path(), API_CONFIG);
    let host = Host::of(&server, None);
    let session = host.session(json!({})).await;
    let path = format!("/v1/sessions/{session}/turns/stream");
    let events = chat_chunk(
        0,
        Some("call_w"),
        Some("write_file"),
        "{\"path\": \"w.txt\", \"content\": \"x\"}",
    );
    let body = format!("data: {events}\n\n").into_bytes();
    let (status, e) = host
        .raw("POST", &path, "application/json", body.clone())
        .await;
    assert_eq!(
        (status, e["status"].as_str()),
        (415, Some("unsupported_media_type")),
        "{e}"
    );
    let (status, e) = host
        .raw(
            "POST",
            &format!("{path}?speed=fast"),
            "text/event-stream",
            body.clone(),
        )
        .await;
    assert_eq!(status, 422, "{e}");
    let (status, e) = host
        .raw(
            "POST",
            &format!("{path}?format=gemini"),
            "text/event-stream",
            body.clone(),
        )
        .await;
    assert_eq!(
        (status, e["errors"][0]["loc"].as_str()),
        (422, Some("format")),
        "{e}"
    );
    let (status, _) = host
        .raw(
            "POST",
            "/v1/sessions/ses_none/turns/stream",
            "text/event-stream",
            body,
        )
        .await;
    assert_eq!(status, 404);
    let mut eager = lookup_early();
    eager["strategy"] = json!(["exploitation"]);
    let (status, e) = host.put_tools(&session, json!([eager])).await;
    assert_eq!(
        (status, e["errors"][0]["loc"].as_str()),
        (422, Some("/tools/0/early")),
        "{e}"
    );
    assert!(
        !dir.path().join("w.txt").exists(),
        "a refused stream ran a call"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_is_3_1_and_describes_every_route() {
    let dir = tempfile::tempdir().unwrap();
    let config = format!("{API_CONFIG}\n{}", alice_and_bob_tokens());
    let server = serve(dir.path(), &config);
    // Served without credentials: it describes the API, not anyone's data.
    let (status, doc) = Host::of(&server, None)
        .call("GET", "/v1/openapi.json", None)
        .await;
    assert_eq!(status, 200);
    assert!(
        doc["openapi"].as_str().unwrap().starts_with("3.1"),
        "{}",
        doc["openapi"]
    );
    let paths = doc["paths"].as_object().unwrap();
    for (path, method) in [
        ("/v1/sessions", "post"),
        ("/v1/sessions/{id}", "delete"),
        ("/v1/sessions/{id}/tools", "put"),
        ("/v1/sessions/{id}/tools", "get"),
        ("/v1/sessions/{id}/turns", "post"),
        ("/v1/sessions/{id}/turns/stream", "post"),
        ("/v1/sessions/{id}/turns/{turn}", "get"),
        ("/v1/sessions/{id}/turns/{turn}/outcomes", "post"),
        ("/v1/sessions/{id}/events", "get"),
        ("/v1/intents", "get"),
        ("/v1/intents/{id}", "get"),
        ("/v1/approvals", "get"),
        ("/v1/approvals/{id}", "post"),
        ("/v1/sessions/{id}/jobs", "get"),
    ] {
        assert!(
            paths[path][method].is_object(),
            "{method} {path} is not documented"
        );
    }
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
}

#[test]
fn schemathesis_finds_no_server_error_and_no_schema_violation() {
    let Some(peers) = peers() else { return };
    let st = peers.join("schemathesis/bin/schemathesis");
    let dir = tempfile::tempdir().unwrap();
    let server = serve(dir.path(), API_CONFIG);
    let out = std::process::Command::new(&st)
        .args([
            "run",
            &format!("http://{}/v1/openapi.json", server.addr),
            "--checks",
            "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance",
            "--max-examples",
            "40",
            "--request-timeout",
            "60",
            "--workers",
            "1",
            "--seed",
            "1",
            // An event stream never ends, so a fuzzer that reads each response whole cannot
            // check it; the_event_stream_tells_a_turns_calls_as_they_happen does.
            "--exclude-path",
            "/v1/sessions/{id}/events",
        ])
        // Its report directory goes to the test's own directory, never the source tree.
        .current_dir(dir.path())
        .env("HOME", test_home())
        .output()
        .expect("schemathesis runs");
    let report = format!("{}\n{}", text(&out.stdout), text(&out.stderr));
    assert!(
        out.status.success(),
        "schemathesis found problems:\n{report}"
    );
}

/// Alice and Bob, and Carol with the operator role (`[console] operators`).
fn alice_bob_and_operator_carol() -> String {
    format!(
        "{API_CONFIG}\n[console]\noperators = [\"carol\"]\noperator_groups = []\n\n{}\n{}",
        alice_and_bob_tokens(),
        token_table("carol", "carol-token", "")
    )
}

/// Sends an invoice through `host`'s new session, the host reporting it sent; its intent id.
async fn invoice_sent(host: &Host, to: &str) -> String {
    let session = host.session(json!({})).await;
    host.put_tools(&session, json!([send_invoice()])).await;
    let turn = host
        .turn(
            &session,
            "openai",
            chat_call("call_i", "send_invoice", json!({"to": to})),
        )
        .await;
    let action = &turn["pending"][0];
    assert_eq!(action["kind"], "run", "{turn}");
    let (_, done) = host
        .outcomes(
            &session,
            turn["turn"].as_str().unwrap(),
            json!([{"id": action["id"], "output": "sent"}]),
        )
        .await;
    assert_eq!(done["status"], "complete", "{done}");
    action["intent_id"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_principal_reads_its_own_intents_and_never_anothers() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(dir.path(), &alice_bob_and_operator_carol());
    let alice = Host::of(&server, Some("alice-token"));
    let bob = Host::of(&server, Some("bob-token"));
    let alices = invoice_sent(&alice, "acme").await;
    let bobs = invoice_sent(&bob, "globex").await;

    let (status, listed) = alice.call("GET", "/v1/intents?limit=10", None).await;
    assert_eq!(status, 200, "{listed}");
    let ids: Vec<&str> = listed["intents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [alices.as_str()], "alice sees her intent only");
    let mine = &listed["intents"][0];
    assert_eq!(mine["tool"], "send_invoice");
    assert_eq!(mine["state"], "ACKED");
    assert_eq!(mine["attempts"], 1);
    assert_eq!(mine["outcome"], "completed");
    assert!(mine["timeline"].as_array().unwrap().len() >= 2, "{mine}");

    let (status, one) = alice
        .call("GET", &format!("/v1/intents/{alices}"), None)
        .await;
    assert_eq!(status, 200, "{one}");
    assert_eq!(one["id"], alices.as_str());
    assert_eq!(one["receipt"]["outcome"]["observation"]["text"], "sent");

    // Another principal's intent is answered exactly like one that does not exist.
    let (status, theirs) = alice
        .call("GET", &format!("/v1/intents/{bobs}"), None)
        .await;
    assert_eq!(status, 404, "{theirs}");
    assert_eq!(theirs["status"], "not_found");
    let unknown = "0190a5c0-0000-7000-8000-000000000000";
    let (status, _) = alice
        .call("GET", &format!("/v1/intents/{unknown}"), None)
        .await;
    assert_eq!(status, 404);
    let (_, filtered) = bob
        .call("GET", "/v1/intents?state=ACKED&tool=send_invoice", None)
        .await;
    assert_eq!(filtered["intents"][0]["id"], bobs.as_str());
    assert_eq!(filtered["intents"].as_array().unwrap().len(), 1);
    let (_, none) = bob.call("GET", "/v1/intents?state=UNKNOWN", None).await;
    assert_eq!(none["intents"], json!([]));

    for bad in ["limit=0", "limit=201", "state=done", "principal=alice"] {
        let (status, refused) = bob.call("GET", &format!("/v1/intents?{bad}"), None).await;
        assert_eq!(status, 422, "{bad}: {refused}");
        assert_eq!(refused["status"], "validation_error");
    }
}

/// The turn as it stands once `reached` holds of it, asked again until [`HTTP_WAIT`] passes:
/// a turn that needs its host answers at once, so a decision made elsewhere shows on a later
/// read.
async fn turn_until(
    host: &Host,
    session: &str,
    turn: &str,
    reached: impl Fn(&Value) -> bool,
) -> Value {
    let path = format!("/v1/sessions/{session}/turns/{turn}?wait_ms=1000");
    let deadline = Instant::now() + HTTP_WAIT;
    loop {
        let (status, now) = host.call("GET", &path, None).await;
        assert_eq!(status, 200, "{now}");
        if reached(&now) {
            return now;
        }
        assert!(Instant::now() < deadline, "the turn never got there: {now}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Holds `wire_money` of `host`'s new session for approval; the session, turn and approval.
async fn wire_held(host: &Host) -> (String, String, Value) {
    let session = host.session(json!({})).await;
    let wire = json!({
        "name": "wire_money", "input_schema": {"type": "object", "properties": {"cents": {"type": "integer"}}},
        "effect": "non_idempotent", "authority": "A3", "strategy": ["exploitation"]
    });
    host.put_tools(&session, json!([wire])).await;
    let turn = host
        .turn(
            &session,
            "openai",
            chat_call("call_w", "wire_money", json!({"cents": 500})),
        )
        .await;
    assert_eq!(turn["pending"][0]["kind"], "approval_required", "{turn}");
    let turn_id = turn["turn"].as_str().unwrap().to_string();
    (session, turn_id, turn["pending"][0].clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_approves_a_held_call_over_the_api_and_it_runs_once() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(dir.path(), &alice_bob_and_operator_carol());
    let alice = Host::of(&server, Some("alice-token"));
    let bob = Host::of(&server, Some("bob-token"));
    let carol = Host::of(&server, Some("carol-token"));
    let (session, turn, held) = wire_held(&alice).await;

    let (status, listed) = alice.call("GET", "/v1/approvals", None).await;
    assert_eq!(status, 200, "{listed}");
    let approval = &listed["approvals"][0];
    assert_eq!(listed["approvals"].as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(approval["tool"], "wire_money");
    assert_eq!(approval["args_hash"], held["args_hash"]);
    assert!(approval["deadline_ms"].as_u64().unwrap() > 0);
    let id = approval["id"].as_str().unwrap().to_string();
    // Bob sees none of Alice's held calls.
    let (_, bobs) = bob.call("GET", "/v1/approvals", None).await;
    assert_eq!(bobs["approvals"], json!([]));

    // Neither the principal itself nor another may decide it without the operator role.
    let approve = json!({"approve": true, "args_hash": held["args_hash"]});
    for who in [&alice, &bob] {
        let (status, refused) = who
            .call("POST", &format!("/v1/approvals/{id}"), Some(&approve))
            .await;
        assert_eq!(status, 403, "{refused}");
        assert_eq!(refused["status"], "forbidden");
    }
    let (status, decided) = carol
        .call("POST", &format!("/v1/approvals/{id}"), Some(&approve))
        .await;
    assert_eq!(status, 200, "{decided}");
    assert_eq!(decided["state"], "APPROVED");
    let (status, again) = carol
        .call("POST", &format!("/v1/approvals/{id}"), Some(&approve))
        .await;
    assert_eq!(status, 409, "a second decision: {again}");

    // The waiting call is released: the host is asked to run it, once.
    let now = turn_until(&alice, &session, &turn, |t| {
        t["pending"][0]["kind"] == "run"
    })
    .await;
    let action = now["pending"][0].clone();
    let (_, done) = alice
        .outcomes(
            &session,
            &turn,
            json!([{"id": action["id"], "output": "wired"}]),
        )
        .await;
    assert_eq!(done["status"], "complete", "{done}");
    assert_eq!(
        seen(&done["results"][0])["outcome"]["observation"]["text"],
        "wired"
    );
    let (_, intents) = alice.call("GET", "/v1/intents?tool=wire_money", None).await;
    let runs = intents["intents"].as_array().unwrap();
    assert_eq!(runs.len(), 1, "{intents}");
    assert_eq!(runs[0]["state"], "ACKED");
    assert_eq!(runs[0]["attempts"], 1);
    let (_, left) = alice.call("GET", "/v1/approvals", None).await;
    assert_eq!(left["approvals"], json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_denies_a_held_call_and_a_decision_for_other_arguments_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(dir.path(), &alice_bob_and_operator_carol());
    let alice = Host::of(&server, Some("alice-token"));
    let carol = Host::of(&server, Some("carol-token"));
    let (session, turn, _) = wire_held(&alice).await;
    let (_, listed) = alice.call("GET", "/v1/approvals", None).await;
    let id = listed["approvals"][0]["id"].as_str().unwrap().to_string();
    let path = format!("/v1/approvals/{id}");

    let other = json!({"approve": true, "args_hash": "v1:00"});
    let (status, refused) = carol.call("POST", &path, Some(&other)).await;
    assert_eq!(status, 409, "{refused}");
    let (status, _) = carol
        .call(
            "POST",
            "/v1/approvals/ap_unknown",
            Some(&json!({"approve": true})),
        )
        .await;
    assert_eq!(status, 404);
    let (status, _) = carol
        .call("POST", &path, Some(&json!({"approve": true, "extra": 1})))
        .await;
    assert_eq!(status, 422);

    let deny = json!({"approve": false, "reason": "not today"});
    let (status, decided) = carol.call("POST", &path, Some(&deny)).await;
    assert_eq!(status, 200, "{decided}");
    assert_eq!(decided["state"], "DENIED");
    let done = turn_until(&alice, &session, &turn, |t| t["status"] == "complete").await;
    assert_eq!(seen(&done["results"][0])["status"], "approval_denied");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_lists_the_background_jobs_its_calls_started() {
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[workspace]\nstate_dir = \"state\"\n\n\
         [[grants]]\nname = \"contained\"\ntools = [\"shell\", \"job_*\"]\nceiling = \"A1\"\nshell = true\n\n{}",
        alice_and_bob_tokens()
    );
    let server = serve(dir.path(), &config);
    let alice = Host::of(&server, Some("alice-token"));
    let bob = Host::of(&server, Some("bob-token"));
    let session = alice.session(json!({})).await;
    let path = format!("/v1/sessions/{session}/jobs");
    let (status, none) = alice.call("GET", &path, None).await;
    assert_eq!(status, 200, "{none}");
    assert_eq!(none["jobs"], json!([]));

    let turn = alice
        .turn(
            &session,
            "openai",
            chat_call(
                "call_j",
                "shell",
                json!({"argv": ["sh", "-c", "echo from the job"], "background": true}),
            ),
        )
        .await;
    assert_eq!(turn["status"], "complete", "{turn}");
    let (status, listed) = alice.call("GET", &path, None).await;
    assert_eq!(status, 200, "{listed}");
    let jobs = listed["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 1, "{listed}");
    assert!(jobs[0]["job"].as_str().unwrap().starts_with("job_"));
    assert!(
        jobs[0]["command"]
            .as_str()
            .unwrap()
            .contains("echo from the job"),
        "{listed}"
    );

    // Another principal cannot reach the session; another session sees none of its jobs.
    let (status, _) = bob.call("GET", &path, None).await;
    assert_eq!(status, 404);
    let other = alice.session(json!({})).await;
    let (_, theirs) = alice
        .call("GET", &format!("/v1/sessions/{other}/jobs"), None)
        .await;
    assert_eq!(theirs["jobs"], json!([]));
    // A scope a session named itself may be shared: its jobs are not listed.
    let named = alice.session(json!({"scope": "build"})).await;
    let (status, refused) = alice
        .call("GET", &format!("/v1/sessions/{named}/jobs"), None)
        .await;
    assert_eq!(status, 409, "{refused}");
}
