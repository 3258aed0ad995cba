//! Limits at the door: what a client may cost ring0 before anything it sent is believed.
//!
//! Every message a downstream client sends passes [`admit`] first: one bounded line (stdio) or
//! body (HTTP), valid UTF-8, valid JSON within serde_json's nesting bound, without duplicate
//! object keys, and a JSON-RPC message rmcp's model can hold. Whatever fails is answered at once
//! — `-32700` for text that is not JSON (with the request's `id` when a scan of the text's top
//! level recovers it), `-32600` for JSON that is not a request, `-32602` for a known method
//! whose params do not fit it — so a client never waits on a message ring0 dropped. A
//! `tools/call` whose arguments repeat a key is refused as a tool error the model can correct
//! (`invalid_json`, naming the key), before the kernel: which of the two values a parser keeps
//! is a guess, and ring0 never hashes or forwards a guess.
//!
//! The HTTP side adds what a socket can cost ([`listener`]): a connection cap that sheds the
//! oldest connection still waiting for its request before refusing anyone, header-read and
//! body-read timeouts, and ([`sessions`]) a per-principal cap on sessionful sessions with idle
//! expiry, so neither half-open connections nor a flood of `initialize`s exhaust descriptors or
//! memory. The stdio transport is [`stdio`]. The bounds are [`DoorLimits`], `[http]` in the
//! configuration. [`operations`] is how liveness, readiness and metrics routes join the
//! listener, each behind the door it needs.

pub mod listener;
pub mod operations;
pub mod sessions;
pub mod shared;
pub mod stdio;

use crate::limits::{
    BODY_READ_TIMEOUT_DEFAULT, CLIENT_MESSAGE_BYTES_MAX, CONNECTIONS_MAX_DEFAULT,
    HEADER_READ_TIMEOUT_DEFAULT, SESSION_IDLE_TIMEOUT_DEFAULT, SESSIONS_PER_PRINCIPAL_MAX_DEFAULT,
};
use crate::rpc::code;
use ring0_core::{Rejection, RejectionKind};
use rmcp::model::ClientJsonRpcMessage;
use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Value, json};
use std::collections::HashSet;
use std::fmt;
use std::time::Duration;

/// `[http]`: what one HTTP client may hold of ring0's descriptors and memory. Every key is
/// optional; the defaults are the `*_DEFAULT` constants of [`crate::limits`].
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DoorConfig {
    /// How long a connection may take to send a request's headers (and how long an idle
    /// keep-alive connection is kept), in milliseconds.
    pub header_read_timeout_ms: u64,
    /// How long a request's body may take to arrive, in milliseconds.
    pub body_read_timeout_ms: u64,
    /// Connections open at once. At the cap, the oldest connection not serving a request is
    /// closed to make room; when every one is serving, the new connection is refused.
    pub connections_max: usize,
    /// Sessionful sessions one principal may hold at once; opening one more closes that
    /// principal's least recently used session.
    pub sessions_per_principal_max: usize,
    /// A sessionful session unused for this long is closed and its memory released, in seconds.
    pub session_idle_timeout_s: u64,
}

impl Default for DoorConfig {
    fn default() -> Self {
        Self {
            header_read_timeout_ms: HEADER_READ_TIMEOUT_DEFAULT.as_millis() as u64,
            body_read_timeout_ms: BODY_READ_TIMEOUT_DEFAULT.as_millis() as u64,
            connections_max: CONNECTIONS_MAX_DEFAULT,
            sessions_per_principal_max: SESSIONS_PER_PRINCIPAL_MAX_DEFAULT,
            session_idle_timeout_s: SESSION_IDLE_TIMEOUT_DEFAULT.as_secs(),
        }
    }
}

impl DoorConfig {
    /// Refuses a value that would disable a limit (zero) or make it meaningless.
    pub fn check(&self) -> Result<(), String> {
        let positive = [
            ("header_read_timeout_ms", self.header_read_timeout_ms),
            ("body_read_timeout_ms", self.body_read_timeout_ms),
            ("connections_max", self.connections_max as u64),
            (
                "sessions_per_principal_max",
                self.sessions_per_principal_max as u64,
            ),
            ("session_idle_timeout_s", self.session_idle_timeout_s),
        ];
        for (key, value) in positive {
            if value == 0 {
                return Err(format!("http.{key} must be at least 1"));
            }
        }
        Ok(())
    }

    pub fn header_read_timeout(&self) -> Duration {
        Duration::from_millis(self.header_read_timeout_ms)
    }

    pub fn body_read_timeout(&self) -> Duration {
        Duration::from_millis(self.body_read_timeout_ms)
    }

    pub fn session_idle_timeout(&self) -> Duration {
        Duration::from_secs(self.session_idle_timeout_s)
    }
}

/// What became of one message at the door.
#[derive(Debug)]
pub enum Admission {
    /// A message for the session.
    Message(Box<ClientJsonRpcMessage>),
    /// Refused: this JSON-RPC response goes back to the client instead.
    Answer(Value),
    /// Refused without an answer: a notification (JSON-RPC answers none) or an empty line.
    Dropped,
}

/// Methods rmcp's model knows: a request for one of them whose params do not decode is
/// `-32602`, not the `-32601` an unknown method gets.
const KNOWN_METHODS: &[&str] = &[
    "initialize",
    "ping",
    "tools/call",
    "tools/list",
    "prompts/get",
    "prompts/list",
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "resources/subscribe",
    "resources/unsubscribe",
    "completion/complete",
    "logging/setLevel",
    "tasks/get",
    "tasks/list",
    "tasks/cancel",
    "tasks/result",
    "server/discover",
    "subscriptions/listen",
];

/// Checks one message (a stdio line without its newline, or an HTTP body).
pub fn admit(bytes: &[u8]) -> Admission {
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Admission::Dropped;
    }
    if bytes.len() > CLIENT_MESSAGE_BYTES_MAX {
        return Admission::Answer(oversized());
    }
    let text = match std::str::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => {
            let id = recover_id(&String::from_utf8_lossy(bytes));
            return Admission::Answer(error(
                id,
                code::PARSE_ERROR,
                format!(
                    "the message is not valid UTF-8 (at byte {})",
                    e.valid_up_to()
                ),
            ));
        }
    };
    let value: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            return Admission::Answer(error(
                recover_id(text),
                code::PARSE_ERROR,
                format!("the message is not valid JSON: {e}"),
            ));
        }
    };
    let id = value
        .get("id")
        .filter(|id| id.is_string() || id.is_number())
        .cloned();
    let method = value
        .get("method")
        .and_then(Value::as_str)
        .map(str::to_string);
    let id = id.as_ref();
    let method = method.as_deref();
    if let Some(key) = duplicate_key(text) {
        return match (id, method) {
            (Some(id), Some("tools/call")) => {
                Admission::Answer(duplicate_argument(id, &value, &key))
            }
            (Some(id), _) => Admission::Answer(error(
                Some(id.clone()),
                code::INVALID_REQUEST,
                format!("the message repeats the key {key:?}: which value counts is ambiguous"),
            )),
            (None, _) => Admission::Dropped,
        };
    }
    if let (Some(id), Some(method)) = (id, method)
        && let Some(problem) = params_problem(method, &value)
    {
        return Admission::Answer(error(Some(id.clone()), code::INVALID_PARAMS, problem));
    }
    match serde_json::from_value::<ClientJsonRpcMessage>(value) {
        Ok(message) => Admission::Message(Box::new(message)),
        Err(e) => match id {
            Some(id) if method.is_some_and(|m| KNOWN_METHODS.contains(&m)) => {
                Admission::Answer(error(
                    Some(id.clone()),
                    code::INVALID_PARAMS,
                    format!("invalid params for {}: {e}", method.unwrap_or_default()),
                ))
            }
            Some(id) => Admission::Answer(error(
                Some(id.clone()),
                code::INVALID_REQUEST,
                format!("not a JSON-RPC request ring0 can read: {e}"),
            )),
            None if method.is_some() => Admission::Dropped,
            None => Admission::Answer(error(
                None,
                code::INVALID_REQUEST,
                format!("not a JSON-RPC message ring0 can read: {e}"),
            )),
        },
    }
}

/// The answer to a message longer than [`CLIENT_MESSAGE_BYTES_MAX`] (its id is not read).
pub fn oversized() -> Value {
    error(
        None,
        code::PARSE_ERROR,
        format!("the message exceeds {CLIENT_MESSAGE_BYTES_MAX} bytes and was not read"),
    )
}

/// A JSON-RPC error response.
pub fn error(id: Option<Value>, code: i64, message: impl Into<String>) -> Value {
    json!({
        "jsonrpc": "2.0",
        "id": id.unwrap_or(Value::Null),
        "error": {"code": code, "message": message.into()}
    })
}

/// What is wrong with the params of a known request that rmcp would otherwise read as an
/// unknown method (its model falls back to a custom request when typed params do not decode).
fn params_problem(method: &str, message: &Value) -> Option<String> {
    let params = message.get("params").cloned().unwrap_or(Value::Null);
    match method {
        "tools/call" => serde_json::from_value::<rmcp::model::CallToolRequestParams>(params)
            .err()
            .map(|e| format!("invalid params for tools/call: {e}")),
        _ => None,
    }
}

/// A `tools/call` whose arguments repeat a key: a tool error naming it, so that the model can
/// send the call again with each key once.
fn duplicate_argument(id: &Value, message: &Value, key: &str) -> Value {
    let tool = message
        .pointer("/params/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let rejection = Rejection::new(
        RejectionKind::InvalidJson,
        tool,
        format!("mcp-{id}"),
        format!(
            "arguments are not valid JSON: duplicate object key {key:?}: the value it names is \
             ambiguous; send each key once"
        ),
    );
    let text = serde_json::to_string(&rejection.to_json()).unwrap_or_default();
    json!({
        "jsonrpc": "2.0",
        "id": id,
        "result": {"content": [{"type": "text", "text": text}], "isError": true}
    })
}

/// The first object key `text` (valid JSON) repeats within one object, if any.
fn duplicate_key(text: &str) -> Option<String> {
    let mut de = serde_json::Deserializer::from_str(text);
    match KeyCheck.deserialize(&mut de) {
        Ok(()) => None,
        Err(e) => {
            let msg = e.to_string();
            let rest = msg.strip_prefix(DUPLICATE_PREFIX)?;
            Some(rest.split(" at line").next().unwrap_or(rest).to_string())
        }
    }
}

const DUPLICATE_PREFIX: &str = "duplicate key ";

/// Walks a JSON value without building it, failing on the first repeated key of an object.
#[derive(Clone, Copy)]
struct KeyCheck;

impl<'de> de::DeserializeSeed<'de> for KeyCheck {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for KeyCheck {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(self)?.is_some() {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<(), A::Error> {
        let mut seen = HashSet::new();
        while let Some(key) = access.next_key::<String>()? {
            if !seen.insert(key.clone()) {
                return Err(de::Error::custom(format_args!("{DUPLICATE_PREFIX}{key}")));
            }
            access.next_value_seed(self)?;
        }
        Ok(())
    }
}

/// The top-level `id` of a message that does not parse, when the text up to it does: a scan
/// that tracks strings and nesting and reads the value after `"id":` at depth one.
fn recover_id(text: &str) -> Option<Value> {
    let bytes = text.as_bytes();
    let mut depth = 0usize;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth = depth.checked_sub(1)?,
            b'"' => {
                let end = string_end(bytes, i)?;
                if depth == 1 && &text[i..=end] == "\"id\"" {
                    let rest = text[end + 1..].trim_start().strip_prefix(':')?.trim_start();
                    return id_literal(rest);
                }
                i = end;
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// The index of the quote closing the string that opens at `start`.
fn string_end(bytes: &[u8], start: usize) -> Option<usize> {
    let mut i = start + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'"' => return Some(i),
            _ => i += 1,
        }
    }
    None
}

/// A JSON-RPC id (a string or an integer) at the start of `rest`.
fn id_literal(rest: &str) -> Option<Value> {
    if rest.starts_with('"') {
        let end = string_end(rest.as_bytes(), 0)?;
        return serde_json::from_str::<String>(&rest[..=end])
            .ok()
            .map(Value::String);
    }
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '-'))
        .unwrap_or(rest.len());
    rest[..end].parse::<i64>().ok().map(Value::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(bytes: &[u8]) -> Value {
        match admit(bytes) {
            Admission::Answer(v) => v,
            other => panic!("expected an answer, got {other:?}"),
        }
    }

    #[test]
    fn every_unparseable_message_is_a_parse_error_with_the_id_when_it_can_be_read() {
        let deep = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":9,\"x\":{}",
            "[".repeat(100_000)
        );
        let cases: Vec<(Vec<u8>, Value)> = vec![
            (
                b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":".to_vec(),
                json!(1),
            ),
            (
                b"{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"p\xff\"}".to_vec(),
                json!(2),
            ),
            (
                br#"{"jsonrpc":"2.0","id":"s","method":"ping","params":{"x":"\ud800"}}"#.to_vec(),
                json!("s"),
            ),
            (
                br#"{"jsonrpc":"2.0","id":4,"method":"ping","params":{"x":1e400}}"#.to_vec(),
                json!(4),
            ),
            (deep.into_bytes(), json!(9)),
            (b"not json".to_vec(), Value::Null),
        ];
        for (line, id) in cases {
            let a = answer(&line);
            assert_eq!(a["error"]["code"], code::PARSE_ERROR, "{a}");
            assert_eq!(a["id"], id, "{a}");
        }
    }

    #[test]
    fn a_nested_id_is_not_taken_for_the_requests() {
        let text = r#"{"params":{"id":5},"id":7,"method":"#;
        assert_eq!(recover_id(text), Some(json!(7)));
    }

    #[test]
    fn bad_tools_call_params_are_invalid_params_not_an_unknown_method() {
        let a = answer(br#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":5}}"#);
        assert_eq!(a["error"]["code"], code::INVALID_PARAMS, "{a}");
        assert_eq!(a["id"], 3);
    }

    #[test]
    fn a_repeated_argument_is_a_tool_error_naming_the_key() {
        let a = answer(
            br#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"read_file","arguments":{"path":"a","path":"b"}}}"#,
        );
        assert_eq!(a["result"]["isError"], true, "{a}");
        let text = a["result"]["content"][0]["text"].as_str().unwrap();
        assert!(
            text.contains("invalid_json") && text.contains("\\\"path\\\""),
            "{text}"
        );
    }

    #[test]
    fn a_good_request_passes() {
        let m = admit(
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":{"a":1}}}"#,
        );
        assert!(matches!(m, Admission::Message(_)), "{m:?}");
    }

    #[test]
    fn an_oversized_message_is_refused_unread() {
        let big = vec![b' '; CLIENT_MESSAGE_BYTES_MAX + 1];
        let mut big = big;
        big[0] = b'{';
        assert_eq!(answer(&big)["error"]["code"], code::PARSE_ERROR);
    }
}
