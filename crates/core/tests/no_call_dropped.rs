//! No call dropped, in any format: for any mix of output items a model may produce — function
//! calls, custom tool calls with free-form input, Anthropic calls made from code execution,
//! text, reasoning and the provider's own server-side tool items — the calls ring0 reads out of
//! the turn are exactly the calls the host has to answer, and the rendered results answer each
//! of them once, in the shape its kind needs.

use proptest::prelude::*;
use ring0_core::format::{parse_turn, render_results};
use ring0_core::{ProposedArguments, ProviderFormat, ToolResult};
use serde_json::{Value, json};
use std::collections::BTreeSet;

/// One item of a model's output, independent of the format.
#[derive(Debug, Clone)]
enum Item {
    /// A function call with JSON arguments.
    Function(String),
    /// A custom tool call with free-form input.
    Custom(String),
    /// An Anthropic call made from code execution (a `caller`); a function call elsewhere.
    FromCode(String),
    Text(String),
    /// Something the provider runs or says itself: never the host's to answer.
    ServerSide,
}

fn item() -> impl Strategy<Value = Item> {
    let text = "[ -~]{0,24}";
    prop_oneof![
        text.prop_map(Item::Function),
        text.prop_map(Item::Custom),
        text.prop_map(Item::FromCode),
        text.prop_map(Item::Text),
        Just(Item::ServerSide),
    ]
}

/// The turn in `format`, and the ids of the calls the host must answer with whether each is
/// free-form. Chat Completions has no server-side items, and Anthropic no custom tools: those
/// items become text there.
fn turn(format: ProviderFormat, items: &[Item]) -> (Value, Vec<(String, bool)>) {
    let mut calls = Vec::new();
    let mut parts = Vec::new();
    for (i, it) in items.iter().enumerate() {
        let id = format!("call_{i}");
        let part = match (format, it) {
            (ProviderFormat::OpenAiChat, Item::Function(a) | Item::FromCode(a)) => {
                calls.push((id.clone(), false));
                json!({"id": id, "type": "function", "function": {"name": "f", "arguments": json!({"a": a}).to_string()}})
            }
            (ProviderFormat::OpenAiChat, Item::Custom(input)) => {
                calls.push((id.clone(), true));
                json!({"id": id, "type": "custom", "custom": {"name": "c", "input": input}})
            }
            (ProviderFormat::OpenAiChat, _) => continue,
            (ProviderFormat::OpenAiResponses, Item::Function(a) | Item::FromCode(a)) => {
                calls.push((id.clone(), false));
                json!({"type": "function_call", "id": format!("fc_{i}"), "call_id": id, "name": "f", "arguments": json!({"a": a}).to_string()})
            }
            (ProviderFormat::OpenAiResponses, Item::Custom(input)) => {
                calls.push((id.clone(), true));
                json!({"type": "custom_tool_call", "id": format!("ctc_{i}"), "call_id": id, "name": "c", "input": input})
            }
            (ProviderFormat::OpenAiResponses, Item::Text(t)) => {
                json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": t}]})
            }
            (ProviderFormat::OpenAiResponses, Item::ServerSide) => {
                json!({"type": "web_search_call", "id": format!("ws_{i}"), "status": "completed"})
            }
            (ProviderFormat::Anthropic, Item::Function(a) | Item::Custom(a)) => {
                calls.push((id.clone(), false));
                json!({"type": "tool_use", "id": id, "name": "f", "input": {"a": a}})
            }
            (ProviderFormat::Anthropic, Item::FromCode(a)) => {
                calls.push((id.clone(), false));
                json!({"type": "tool_use", "id": id, "name": "f", "input": {"a": a},
                       "caller": {"type": "code_execution_20250825", "tool_id": format!("srvtoolu_{i}")}})
            }
            (ProviderFormat::Anthropic, Item::Text(t)) => json!({"type": "text", "text": t}),
            (ProviderFormat::Anthropic, Item::ServerSide) => {
                json!({"type": "server_tool_use", "id": format!("srvtoolu_{i}"), "name": "web_search", "input": {"query": "q"}})
            }
            (ProviderFormat::Mcp, _) => unreachable!("not generated"),
        };
        parts.push(part);
    }
    let turn = match format {
        ProviderFormat::OpenAiChat => {
            json!({"role": "assistant", "content": null, "tool_calls": parts})
        }
        ProviderFormat::OpenAiResponses => json!({"object": "response", "output": parts}),
        _ => json!({"role": "assistant", "content": parts}),
    };
    (turn, calls)
}

/// The call ids the rendered results answer, with whether each answer is a custom tool's.
fn answered(format: ProviderFormat, rendered: &Value) -> Vec<(String, bool)> {
    match format {
        ProviderFormat::OpenAiChat => rendered
            .as_array()
            .unwrap()
            .iter()
            .map(|m| (m["tool_call_id"].as_str().unwrap().to_string(), false))
            .collect(),
        ProviderFormat::OpenAiResponses => rendered
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                let custom = m["type"] == "custom_tool_call_output";
                (m["call_id"].as_str().unwrap().to_string(), custom)
            })
            .collect(),
        _ => rendered["content"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| (b["tool_use_id"].as_str().unwrap().to_string(), false))
            .collect(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn the_calls_read_are_the_calls_answered(items in prop::collection::vec(item(), 0..12)) {
        for format in [
            ProviderFormat::OpenAiChat,
            ProviderFormat::OpenAiResponses,
            ProviderFormat::Anthropic,
        ] {
            let (turn, expected) = turn(format, &items);
            let round = parse_turn(format, &turn).expect("every generated turn is readable");
            let read: Vec<(String, bool)> = round
                .calls
                .iter()
                .map(|c| (c.call_id.clone(), c.arguments.is_free_form()))
                .collect();
            prop_assert_eq!(&read, &expected, "{} read other calls than it holds", format);
            let results: Vec<ToolResult> = round
                .calls
                .iter()
                .map(|c| ToolResult {
                    call_id: c.call_id.clone(),
                    tool: c.tool.clone(),
                    content: json!({"ok": true}),
                    is_error: false,
                    free_form: c.arguments.is_free_form(),
                })
                .collect();
            let rendered = render_results(format, &results);
            let answers = answered(format, &rendered);
            let ids: BTreeSet<&String> = answers.iter().map(|(id, _)| id).collect();
            prop_assert_eq!(ids.len(), answers.len(), "a call answered twice");
            if format == ProviderFormat::OpenAiResponses {
                prop_assert_eq!(&answers, &expected);
            } else {
                let expected_ids: Vec<&String> = expected.iter().map(|(id, _)| id).collect();
                prop_assert_eq!(answers.iter().map(|(id, _)| id).collect::<Vec<_>>(), expected_ids);
            }
            for call in &round.calls {
                if let ProposedArguments::FreeForm(input) = &call.arguments {
                    let Item::Custom(sent) = &items[call.call_id[5..].parse::<usize>().unwrap()]
                    else { panic!("a free-form call from a non-custom item") };
                    prop_assert_eq!(input, sent, "free-form input is passed on as sent");
                }
            }
        }
    }
}

#[test]
fn a_host_item_ring0_cannot_answer_refuses_the_turn_whole() {
    let turn = json!({"output": [
        {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
        {"type": "local_shell_call", "call_id": "call_2", "action": {"type": "exec", "command": ["ls"]}}
    ]});
    let e = parse_turn(ProviderFormat::OpenAiResponses, &turn).unwrap_err();
    assert_eq!(e.path, "$.output[1].type");
    assert!(e.why.contains("local_shell_call"), "{}", e.why);
}

#[test]
fn a_chat_tool_call_of_an_unknown_type_refuses_the_turn_whole() {
    let turn = json!({"role": "assistant", "tool_calls": [
        {"id": "call_1", "type": "hologram", "hologram": {}}
    ]});
    let e = parse_turn(ProviderFormat::OpenAiChat, &turn).unwrap_err();
    assert_eq!(e.path, "$.tool_calls[0].type");
}

#[test]
fn a_custom_tool_call_whose_input_is_not_text_refuses_the_turn() {
    let turn = json!({"output": [
        {"type": "custom_tool_call", "call_id": "call_1", "name": "c", "input": {"x": 1}}
    ]});
    let e = parse_turn(ProviderFormat::OpenAiResponses, &turn).unwrap_err();
    assert_eq!(e.path, "$.output[0].input");
}
