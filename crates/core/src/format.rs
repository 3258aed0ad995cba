//! Provider formats: a model's output in, tool results out.
//!
//! Supported shapes (each provider's documented wire form):
//! - OpenAI Chat Completions: an assistant message (or a whole completion) with
//!   `tool_calls[].function.arguments` as a JSON string, or `tool_calls[].custom.input`, the
//!   free-form text of a custom tool (`type: "custom"`); results are `role: "tool"` messages
//!   with `tool_call_id`.
//! - OpenAI Responses: a response (or its `output` array) with `function_call` items and
//!   `custom_tool_call` items (free-form `input`) carrying `call_id`; results are
//!   `function_call_output` and `custom_tool_call_output` items. Items OpenAI runs itself
//!   (`web_search_call`, `mcp_call`, `reasoning`, …) are not calls for the host and are left
//!   alone.
//! - Anthropic Messages: a message with `tool_use` content blocks — with or without a `caller`
//!   (programmatic tool calling: a call made from Anthropic's code execution is still the
//!   host's to run) — results are one `user` message of `tool_result` blocks with
//!   `tool_use_id` and `is_error`. Server-side blocks (`server_tool_use`, `*_tool_result`) are
//!   Anthropic's own and are left alone.
//! - MCP: a JSON-RPC `tools/call` request (or a batch of them); results are JSON-RPC responses
//!   with `content`, `structuredContent` and `isError`.
//!
//! Results are matched by call id and rendered in source order. No call is dropped: every call
//! item the host would have to answer becomes a proposed call (and so gets exactly one result),
//! or the turn is refused whole with the item's path; a free-form input reaches the kernel as
//! [`ProposedArguments::FreeForm`].

use crate::call::{ProposedArguments, ProposedCall, Round};
use crate::limits::{CALL_ID_BYTES_MAX, CALLS_PER_ROUND_MAX};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use std::fmt;

/// The wire format of a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProviderFormat {
    OpenAiChat,
    OpenAiResponses,
    Anthropic,
    Mcp,
}

impl ProviderFormat {
    pub fn parse_name(name: &str) -> Option<Self> {
        match name {
            "openai" | "openai_chat" | "chat" => Some(Self::OpenAiChat),
            "responses" | "openai_responses" => Some(Self::OpenAiResponses),
            "anthropic" => Some(Self::Anthropic),
            "mcp" => Some(Self::Mcp),
            _ => None,
        }
    }
}

impl fmt::Display for ProviderFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::OpenAiChat => "openai",
            Self::OpenAiResponses => "responses",
            Self::Anthropic => "anthropic",
            Self::Mcp => "mcp",
        })
    }
}

/// A turn that cannot be read at all (as opposed to one bad call, which becomes a rejection).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{format} turn at {path}: {why}")]
pub struct FormatError {
    pub format: ProviderFormat,
    pub path: String,
    pub why: String,
}

/// The model-visible result of one call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolResult {
    pub call_id: String,
    pub tool: String,
    /// The projection the model sees: a JSON object.
    pub content: Value,
    pub is_error: bool,
    /// The call was a custom tool's (free-form input): rendered as that tool's output
    /// (`custom_tool_call_output` in Responses).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub free_form: bool,
}

impl ToolResult {
    fn content_text(&self) -> String {
        match &self.content {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        }
    }
}

/// Reads the tool calls (and any text) out of one model turn.
pub fn parse_turn(format: ProviderFormat, turn: &Value) -> Result<Round, FormatError> {
    let round = match format {
        ProviderFormat::OpenAiChat => parse_chat(turn),
        ProviderFormat::OpenAiResponses => parse_responses(turn),
        ProviderFormat::Anthropic => parse_anthropic(turn),
        ProviderFormat::Mcp => parse_mcp(turn),
    }?;
    if round.calls.len() > CALLS_PER_ROUND_MAX {
        return Err(err(
            format,
            "",
            format!(
                "{} tool calls in one turn; at most {CALLS_PER_ROUND_MAX} are accepted",
                round.calls.len()
            ),
        ));
    }
    Ok(round)
}

/// Renders results in the turn's format, in the order given (the kernel passes source order).
pub fn render_results(format: ProviderFormat, results: &[ToolResult]) -> Value {
    match format {
        ProviderFormat::OpenAiChat => Value::Array(
            results
                .iter()
                .map(|r| json!({"role": "tool", "tool_call_id": r.call_id, "content": r.content_text()}))
                .collect(),
        ),
        ProviderFormat::OpenAiResponses => Value::Array(
            results
                .iter()
                .map(|r| {
                    let kind = if r.free_form {
                        "custom_tool_call_output"
                    } else {
                        "function_call_output"
                    };
                    json!({"type": kind, "call_id": r.call_id, "output": r.content_text()})
                })
                .collect(),
        ),
        ProviderFormat::Anthropic => json!({
            "role": "user",
            "content": results.iter().map(|r| json!({
                "type": "tool_result",
                "tool_use_id": r.call_id,
                "content": r.content_text(),
                "is_error": r.is_error,
            })).collect::<Vec<_>>(),
        }),
        ProviderFormat::Mcp => {
            let responses: Vec<Value> = results.iter().map(render_mcp_result).collect();
            if results.len() == 1 {
                responses.into_iter().next().expect("one")
            } else {
                Value::Array(responses)
            }
        }
    }
}

/// One MCP `tools/call` response: text content plus `structuredContent` when the projection is an
/// object, with the JSON-RPC id restored from the call id.
pub fn render_mcp_result(r: &ToolResult) -> Value {
    let id = serde_json::from_str::<Value>(&r.call_id).unwrap_or(Value::String(r.call_id.clone()));
    let mut result = Map::new();
    result.insert(
        "content".into(),
        json!([{"type": "text", "text": r.content_text()}]),
    );
    if r.content.is_object() {
        result.insert("structuredContent".into(), r.content.clone());
    }
    result.insert("isError".into(), Value::Bool(r.is_error));
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

fn err(format: ProviderFormat, path: &str, why: impl Into<String>) -> FormatError {
    FormatError {
        format,
        path: if path.is_empty() {
            "$".into()
        } else {
            path.into()
        },
        why: why.into(),
    }
}

fn call_id(format: ProviderFormat, path: &str, v: Option<&Value>) -> Result<String, FormatError> {
    let id = match v {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        Some(Value::Number(n)) if format == ProviderFormat::Mcp => n.to_string(),
        _ => return Err(err(format, path, "missing or empty call id")),
    };
    if id.len() > CALL_ID_BYTES_MAX {
        return Err(err(
            format,
            path,
            format!("call id of {} bytes exceeds {CALL_ID_BYTES_MAX}", id.len()),
        ));
    }
    Ok(id)
}

fn tool_name(v: Option<&Value>) -> String {
    v.and_then(Value::as_str).unwrap_or_default().to_string()
}

fn parse_chat(turn: &Value) -> Result<Round, FormatError> {
    let f = ProviderFormat::OpenAiChat;
    let message = match turn.get("choices") {
        Some(choices) => choices
            .get(0)
            .and_then(|c| c.get("message"))
            .ok_or_else(|| err(f, "$.choices[0].message", "missing"))?,
        None => turn,
    };
    if !message.is_object() {
        return Err(err(f, "", "expected an assistant message object"));
    }
    let mut round = Round {
        text: message
            .get("content")
            .and_then(Value::as_str)
            .map(str::to_string),
        ..Round::default()
    };
    let calls = match message.get("tool_calls") {
        None | Some(Value::Null) => return Ok(round),
        Some(Value::Array(calls)) => calls,
        Some(_) => return Err(err(f, "$.tool_calls", "expected an array")),
    };
    for (i, call) in calls.iter().enumerate() {
        let path = format!("$.tool_calls[{i}]");
        let (tool, arguments) = match call.get("type").and_then(Value::as_str) {
            Some("custom") => {
                let custom = call
                    .get("custom")
                    .ok_or_else(|| err(f, &path, "a custom tool call without `custom`"))?;
                (
                    tool_name(custom.get("name")),
                    free_form(f, &format!("{path}.custom.input"), custom.get("input"))?,
                )
            }
            Some("function") | None => {
                let function = call
                    .get("function")
                    .ok_or_else(|| err(f, &path, "missing function"))?;
                (
                    tool_name(function.get("name")),
                    json_arguments(function.get("arguments")),
                )
            }
            Some(other) => {
                return Err(err(
                    f,
                    &format!("{path}.type"),
                    format!("tool call type {other:?} is not one ring0 can answer"),
                ));
            }
        };
        round.calls.push(ProposedCall {
            index: i,
            call_id: call_id(f, &format!("{path}.id"), call.get("id"))?,
            tool,
            arguments,
            idempotency_key: None,
        });
    }
    Ok(round)
}

/// OpenAI function arguments: a JSON string (parsed in preparation), or a value.
fn json_arguments(v: Option<&Value>) -> ProposedArguments {
    match v {
        Some(Value::String(s)) => ProposedArguments::Text(s.clone()),
        Some(Value::Null) | None => ProposedArguments::Text(String::new()),
        Some(other) => ProposedArguments::Value(other.clone()),
    }
}

/// A custom tool call's input: text (absent is empty text); anything else is not a custom
/// call OpenAI sends.
fn free_form(
    format: ProviderFormat,
    path: &str,
    v: Option<&Value>,
) -> Result<ProposedArguments, FormatError> {
    match v {
        Some(Value::String(s)) => Ok(ProposedArguments::FreeForm(s.clone())),
        None | Some(Value::Null) => Ok(ProposedArguments::FreeForm(String::new())),
        Some(_) => Err(err(format, path, "a custom tool call's input must be text")),
    }
}

fn parse_responses(turn: &Value) -> Result<Round, FormatError> {
    let f = ProviderFormat::OpenAiResponses;
    let items = match turn {
        Value::Array(items) => items,
        _ => match turn.get("output") {
            Some(Value::Array(items)) => items,
            _ => return Err(err(f, "$.output", "expected an array of output items")),
        },
    };
    let mut round = Round::default();
    let mut text = String::new();
    for (i, item) in items.iter().enumerate() {
        let path = format!("$.output[{i}]");
        let arguments = match item.get("type").and_then(Value::as_str) {
            Some("function_call") => Some(json_arguments(item.get("arguments"))),
            Some("custom_tool_call") => {
                Some(free_form(f, &format!("{path}.input"), item.get("input"))?)
            }
            _ => None,
        };
        if let Some(arguments) = arguments {
            round.calls.push(ProposedCall {
                index: round.calls.len(),
                call_id: call_id(f, &format!("{path}.call_id"), item.get("call_id"))?,
                tool: tool_name(item.get("name")),
                arguments,
                idempotency_key: None,
            });
            continue;
        }
        match item.get("type").and_then(Value::as_str) {
            Some(kind) if HOST_ITEMS_NOT_MEDIATED.contains(&kind) => {
                return Err(err(
                    f,
                    &format!("{path}.type"),
                    format!(
                        "{kind} items are the host's to answer and ring0 does not mediate them; \
                         the turn is refused whole rather than leave a call unanswered"
                    ),
                ));
            }
            Some("message") => {
                for part in item
                    .get("content")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    if let Some(t) = part.get("text").and_then(Value::as_str) {
                        text.push_str(t);
                    }
                }
            }
            _ => {}
        }
    }
    if !text.is_empty() {
        round.text = Some(text);
    }
    Ok(round)
}

/// Responses output items the host must answer that ring0 cannot mediate (their outputs are not
/// text): a turn holding one is refused whole, never passed on with the call unanswered.
pub const HOST_ITEMS_NOT_MEDIATED: &[&str] = &[
    "computer_call",
    "local_shell_call",
    "shell_call",
    "apply_patch_call",
    "mcp_approval_request",
];

fn parse_anthropic(turn: &Value) -> Result<Round, FormatError> {
    let f = ProviderFormat::Anthropic;
    let blocks = match turn.get("content") {
        Some(Value::Array(blocks)) => blocks,
        Some(Value::String(s)) => {
            return Ok(Round {
                calls: Vec::new(),
                text: Some(s.clone()),
            });
        }
        _ => return Err(err(f, "$.content", "expected an array of content blocks")),
    };
    let mut round = Round::default();
    let mut text = String::new();
    for (i, block) in blocks.iter().enumerate() {
        let path = format!("$.content[{i}]");
        match block.get("type").and_then(Value::as_str) {
            Some("tool_use") => round.calls.push(ProposedCall {
                index: round.calls.len(),
                call_id: call_id(f, &format!("{path}.id"), block.get("id"))?,
                tool: tool_name(block.get("name")),
                arguments: ProposedArguments::Value(
                    block.get("input").cloned().unwrap_or(Value::Null),
                ),
                idempotency_key: None,
            }),
            Some("text") => {
                if let Some(t) = block.get("text").and_then(Value::as_str) {
                    text.push_str(t);
                }
            }
            _ => {}
        }
    }
    if !text.is_empty() {
        round.text = Some(text);
    }
    Ok(round)
}

fn parse_mcp(turn: &Value) -> Result<Round, FormatError> {
    let f = ProviderFormat::Mcp;
    let requests: Vec<&Value> = match turn {
        Value::Array(items) => items.iter().collect(),
        other => vec![other],
    };
    let mut round = Round::default();
    for (i, req) in requests.into_iter().enumerate() {
        let path = if turn.is_array() {
            format!("$[{i}]")
        } else {
            String::new()
        };
        if req.get("method").and_then(Value::as_str) != Some("tools/call") {
            return Err(err(f, &format!("{path}.method"), "expected \"tools/call\""));
        }
        let id = req.get("id").ok_or_else(|| err(f, &path, "missing id"))?;
        let call_id = match id {
            Value::String(_) | Value::Number(_) => {
                // Keep the JSON form so a string id "1" and a number id 1 stay distinct.
                let text = id.to_string();
                if text.len() > CALL_ID_BYTES_MAX {
                    return Err(err(f, &path, "id too long"));
                }
                text
            }
            _ => {
                return Err(err(
                    f,
                    &format!("{path}.id"),
                    "must be a string or a number",
                ));
            }
        };
        let params = req.get("params");
        let idempotency_key = match mcp_idempotency_key(params) {
            None => None,
            Some(Value::String(key)) => Some(key.clone()),
            Some(_) => {
                return Err(err(
                    f,
                    &format!("{path}.params.idempotencyKey"),
                    "must be a string",
                ));
            }
        };
        round.calls.push(ProposedCall {
            index: i,
            call_id,
            tool: tool_name(params.and_then(|p| p.get("name"))),
            arguments: ProposedArguments::Value(
                params
                    .and_then(|p| p.get("arguments"))
                    .cloned()
                    .unwrap_or_else(|| json!({})),
            ),
            idempotency_key,
        });
    }
    Ok(round)
}

/// Where an MCP `tools/call` carries its caller's idempotency key: `params.idempotencyKey`, or
/// else `params._meta["io.ring0/idempotency-key"]`.
pub const MCP_IDEMPOTENCY_KEY_META: &str = "io.ring0/idempotency-key";

fn mcp_idempotency_key(params: Option<&Value>) -> Option<&Value> {
    let params = params?;
    params.get("idempotencyKey").or_else(|| {
        params
            .get("_meta")
            .and_then(|m| m.get(MCP_IDEMPOTENCY_KEY_META))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(id: &str, content: Value, is_error: bool) -> ToolResult {
        ToolResult {
            call_id: id.into(),
            tool: "get_weather".into(),
            content,
            is_error,
            free_form: false,
        }
    }

    #[test]
    fn custom_tool_calls_are_calls_in_both_openai_formats() {
        let chat = json!({"role": "assistant", "tool_calls": [
            {"id": "call_c", "type": "custom", "custom": {"name": "sql", "input": "SELECT 1"}}
        ]});
        let round = parse_turn(ProviderFormat::OpenAiChat, &chat).unwrap();
        assert_eq!(round.calls[0].tool, "sql");
        assert_eq!(
            round.calls[0].arguments,
            ProposedArguments::FreeForm("SELECT 1".into())
        );
        let responses = json!({"output": [
            {"type": "custom_tool_call", "id": "ctc_1", "call_id": "call_c", "name": "sql", "input": "SELECT 1"}
        ]});
        let round = parse_turn(ProviderFormat::OpenAiResponses, &responses).unwrap();
        assert_eq!(
            round.calls[0].arguments,
            ProposedArguments::FreeForm("SELECT 1".into())
        );
        let out = render_results(
            ProviderFormat::OpenAiResponses,
            &[ToolResult {
                free_form: true,
                ..result("call_c", json!({"rows": 1}), false)
            }],
        );
        assert_eq!(
            out,
            json!([{"type": "custom_tool_call_output", "call_id": "call_c", "output": "{\"rows\":1}"}])
        );
    }

    #[test]
    fn openai_chat_completion_round_trips() {
        let completion = json!({
            "id": "chatcmpl-abc123", "object": "chat.completion", "model": "gpt-4.1",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": null,
                "tool_calls": [
                    {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
                    {"id": "call_b", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}}
                ]}}]
        });
        let round = parse_turn(ProviderFormat::OpenAiChat, &completion).unwrap();
        assert_eq!(round.calls.len(), 2);
        assert_eq!(round.calls[1].call_id, "call_b");
        assert_eq!(
            round.calls[0].arguments,
            ProposedArguments::Text("{\"city\":\"Paris\"}".into())
        );
        let out = render_results(
            ProviderFormat::OpenAiChat,
            &[
                result("call_a", json!({"t": 21}), false),
                result("call_b", json!({"t": 3}), false),
            ],
        );
        assert_eq!(
            out,
            json!([
                {"role": "tool", "tool_call_id": "call_a", "content": "{\"t\":21}"},
                {"role": "tool", "tool_call_id": "call_b", "content": "{\"t\":3}"}
            ])
        );
    }

    #[test]
    fn openai_responses_round_trips() {
        let response = json!({
            "id": "resp_1", "object": "response", "status": "completed",
            "output": [
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {"type": "message", "id": "msg_1", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
                {"type": "function_call", "id": "fc_1", "call_id": "call_x", "name": "get_weather", "arguments": "{\"city\":\"Rome\"}", "status": "completed"}
            ]
        });
        let round = parse_turn(ProviderFormat::OpenAiResponses, &response).unwrap();
        assert_eq!(round.text.as_deref(), Some("Checking."));
        assert_eq!(round.calls[0].call_id, "call_x");
        let out = render_results(
            ProviderFormat::OpenAiResponses,
            &[result("call_x", json!({"t": 18}), false)],
        );
        assert_eq!(
            out,
            json!([{"type": "function_call_output", "call_id": "call_x", "output": "{\"t\":18}"}])
        );
    }

    #[test]
    fn anthropic_messages_round_trips() {
        let message = json!({
            "id": "msg_01", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
            "stop_reason": "tool_use",
            "content": [
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Lima"}}
            ]
        });
        let round = parse_turn(ProviderFormat::Anthropic, &message).unwrap();
        assert_eq!(round.calls[0].tool, "get_weather");
        assert_eq!(
            round.calls[0].arguments,
            ProposedArguments::Value(json!({"city": "Lima"}))
        );
        let out = render_results(
            ProviderFormat::Anthropic,
            &[result(
                "toolu_01",
                json!({"status": "validation_error"}),
                true,
            )],
        );
        assert_eq!(out["role"], "user");
        assert_eq!(out["content"][0]["tool_use_id"], "toolu_01");
        assert_eq!(out["content"][0]["is_error"], true);
    }

    #[test]
    fn mcp_ids_keep_their_json_type() {
        let batch = json!([
            {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "get_weather", "arguments": {"city": "Kyiv"}}},
            {"jsonrpc": "2.0", "id": "7", "method": "tools/call", "params": {"name": "get_weather"}}
        ]);
        let round = parse_turn(ProviderFormat::Mcp, &batch).unwrap();
        assert_eq!(round.calls[0].call_id, "7");
        assert_eq!(round.calls[1].call_id, "\"7\"");
        assert_eq!(
            round.calls[1].arguments,
            ProposedArguments::Value(json!({}))
        );
        let out = render_results(
            ProviderFormat::Mcp,
            &[
                result("7", json!({"t": 1}), false),
                result("\"7\"", json!({"t": 2}), false),
            ],
        );
        assert_eq!(out[0]["id"], json!(7));
        assert_eq!(out[1]["id"], json!("7"));
        assert_eq!(out[1]["result"]["structuredContent"], json!({"t": 2}));
        assert_eq!(out[1]["result"]["isError"], false);
    }

    #[test]
    fn a_call_without_an_id_is_a_format_error() {
        let message = json!({"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "x", "arguments": "{}"}}]});
        let e = parse_turn(ProviderFormat::OpenAiChat, &message).unwrap_err();
        assert_eq!(e.path, "$.tool_calls[0].id");
    }

    #[test]
    fn too_many_calls_in_one_turn_is_refused() {
        let calls: Vec<Value> = (0..=CALLS_PER_ROUND_MAX)
            .map(|i| json!({"type": "tool_use", "id": format!("t{i}"), "name": "x", "input": {}}))
            .collect();
        let e = parse_turn(ProviderFormat::Anthropic, &json!({"content": calls})).unwrap_err();
        assert!(e.why.contains("at most"));
    }
}
