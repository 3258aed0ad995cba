//! Projection of receipts and the turn-level contract in every provider format.

mod common;

use common::*;
use ring0_core::ProviderFormat;
use ring0_kernel::{ProjectionInput, Projector, RoundOptions, SessionConfig, Termination};
use serde_json::{Value, json};
use std::sync::Arc;

struct Label;
impl Projector for Label {
    fn project(&self, input: &ProjectionInput<'_>) -> Result<Value, String> {
        Ok(json!({"tool": input.tool, "state": input.state.map(|s| s.as_str())}))
    }
}

type ProjectFn = fn() -> Result<Value, String>;

struct Bad(ProjectFn);
impl Projector for Bad {
    fn project(&self, _input: &ProjectionInput<'_>) -> Result<Value, String> {
        (self.0)()
    }
}

#[tokio::test]
async fn a_host_projector_decides_what_the_model_sees() {
    let rec = Recorder::new();
    let session = recorder_kernel(&rec)
        .build()
        .open_session(SessionConfig::new("s").projector(Arc::new(Label)));
    let out = session
        .run_round(
            round(vec![call(0, "write", json!({"tag": "w"}))]),
            &RoundOptions::default(),
        )
        .await;
    assert_eq!(
        out.results[0].content,
        json!({"tool": "write", "state": "ACKED"})
    );
    assert!(
        out.receipts[0].intent_id.is_some(),
        "the canonical receipt keeps everything"
    );
    assert!(out.terminated.is_none());
}

#[tokio::test]
async fn by_default_the_model_sees_the_canonical_receipt() {
    let rec = Recorder::new();
    let session = recorder_kernel(&rec)
        .build()
        .open_session(SessionConfig::new("s"));
    let out = session
        .run_round(
            round(vec![call(0, "write", json!({"tag": "w"}))]),
            &RoundOptions::default(),
        )
        .await;
    assert_eq!(
        out.results[0].content,
        serde_json::to_value(&out.receipts[0]).unwrap()
    );
}

#[tokio::test]
async fn a_failing_projector_terminates_the_batch_without_fallback() {
    let cases: Vec<(&str, ProjectFn)> = vec![
        ("panics", || panic!("projector bug")),
        ("errs", || Err("no".into())),
        ("non-object", || Ok(json!([1, 2]))),
        ("oversized", || {
            Ok(json!({"x": "y".repeat(ring0_core::limits::PROJECTION_BYTES_MAX)}))
        }),
    ];
    for (name, f) in cases {
        let rec = Recorder::new();
        let session = recorder_kernel(&rec)
            .build()
            .open_session(SessionConfig::new("s").projector(Arc::new(Bad(f))));
        let out = session
            .run_round(
                round(vec![call(0, "write", json!({"tag": "w"}))]),
                &RoundOptions::default(),
            )
            .await;
        assert_eq!(
            out.results[0].content["status"], "projection_failed",
            "{name}"
        );
        assert!(out.results[0].is_error, "{name}");
        assert!(
            !out.results[0].content.to_string().contains("intent_id"),
            "{name}: never the canonical receipt"
        );
        assert_eq!(
            out.terminated,
            Some(Termination::ProjectionFailed {
                call_id: "call_0".into()
            }),
            "{name}"
        );
        // The effect happened once and is not run again.
        assert_eq!(rec.calls(), 1, "{name}");
    }
}

fn formats() -> Vec<(ProviderFormat, Value)> {
    vec![
        (
            ProviderFormat::OpenAiChat,
            json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "read", "arguments": "{\"tag\":\"one\"}"}},
                {"id": "b", "type": "function", "function": {"name": "nope", "arguments": "{}"}}
            ]}),
        ),
        (
            ProviderFormat::OpenAiResponses,
            json!({"output": [
                {"type": "function_call", "id": "fc_1", "call_id": "a", "name": "read", "arguments": "{\"tag\":\"one\"}"},
                {"type": "function_call", "id": "fc_2", "call_id": "b", "name": "nope", "arguments": "{}"}
            ]}),
        ),
        (
            ProviderFormat::Anthropic,
            json!({"role": "assistant", "content": [
                {"type": "tool_use", "id": "a", "name": "read", "input": {"tag": "one"}},
                {"type": "tool_use", "id": "b", "name": "nope", "input": {}}
            ]}),
        ),
        (
            ProviderFormat::Mcp,
            json!([
                {"jsonrpc": "2.0", "id": "a", "method": "tools/call", "params": {"name": "read", "arguments": {"tag": "one"}}},
                {"jsonrpc": "2.0", "id": "b", "method": "tools/call", "params": {"name": "nope", "arguments": {}}}
            ]),
        ),
    ]
}

#[tokio::test]
async fn every_provider_format_gets_its_results_back_in_its_own_shape() {
    for (format, turn) in formats() {
        let rec = Recorder::new();
        let session = recorder_kernel(&rec)
            .build()
            .open_session(SessionConfig::new("s"));
        let out = session
            .handle_turn(format, &turn, &RoundOptions::default())
            .await
            .unwrap();
        let m = &out.message;
        let (first_id, first_text, second_error) = match format {
            ProviderFormat::OpenAiChat => (
                m[0]["tool_call_id"].clone(),
                m[0]["content"].as_str().unwrap().to_string(),
                m[1]["content"].as_str().unwrap().contains("unknown_tool"),
            ),
            ProviderFormat::OpenAiResponses => (
                m[0]["call_id"].clone(),
                m[0]["output"].as_str().unwrap().to_string(),
                m[1]["output"].as_str().unwrap().contains("unknown_tool"),
            ),
            ProviderFormat::Anthropic => (
                m["content"][0]["tool_use_id"].clone(),
                m["content"][0]["content"].as_str().unwrap().to_string(),
                m["content"][1]["is_error"] == true,
            ),
            ProviderFormat::Mcp => (
                m[0]["id"].clone(),
                m[0]["result"]["content"][0]["text"]
                    .as_str()
                    .unwrap()
                    .to_string(),
                m[1]["result"]["isError"] == true,
            ),
        };
        assert_eq!(first_id, json!("a"), "{format}");
        assert!(first_text.contains("\"one\""), "{format}: {first_text}");
        assert!(second_error, "{format}: {m}");
        assert_eq!(rec.calls(), 1);
    }
}

/// A projector for a reader that takes more than a model message (an MCP client's images).
struct Roomy;
impl Projector for Roomy {
    fn project(&self, _input: &ProjectionInput<'_>) -> Result<Value, String> {
        Ok(json!({"x": "y".repeat(ring0_core::limits::PROJECTION_BYTES_MAX)}))
    }

    fn projection_bytes_max(&self) -> usize {
        2 * ring0_core::limits::PROJECTION_BYTES_MAX
    }
}

#[tokio::test]
async fn a_projector_that_declares_a_larger_bound_is_held_to_it() {
    let rec = Recorder::new();
    let session = recorder_kernel(&rec)
        .build()
        .open_session(SessionConfig::new("s").projector(Arc::new(Roomy)));
    let out = session
        .run_round(
            round(vec![call(0, "write", json!({"tag": "w"}))]),
            &RoundOptions::default(),
        )
        .await;
    assert!(out.terminated.is_none(), "{:?}", out.terminated);
    assert_eq!(
        out.results[0].content["x"].as_str().map(str::len),
        Some(ring0_core::limits::PROJECTION_BYTES_MAX)
    );
}

/// Projects the size of the structured payload the receipt carries.
struct PayloadSize;
impl Projector for PayloadSize {
    fn project(&self, input: &ProjectionInput<'_>) -> Result<Value, String> {
        let structured = match input.outcome {
            ring0_core::receipt::CallOutcome::Completed { observation } => {
                observation.structured.clone()
            }
            _ => None,
        };
        Ok(json!({"payload_bytes": structured.map(|v| v.to_string().len())}))
    }

    fn projection_bytes_max(&self) -> usize {
        1024 * 1024
    }
}

fn payload_kernel() -> ring0_kernel::Kernel {
    use ring0_core::{Observation, ToolSpec};
    let spec = ToolSpec::read(
        "picture",
        "Returns a large structured payload",
        json!({"type": "object", "properties": {}}),
    );
    ring0_kernel::Kernel::builder()
        .tool(
            spec,
            ring0_kernel::tool_fn(|_ctx, _args| async move {
                Ok(Observation {
                    structured: Some(json!({"data": "A".repeat(100 * 1024)})),
                    ..Observation::text("a picture")
                })
            }),
        )
        .map_err(|e| e.to_string())
        .unwrap()
        .authorizer(Arc::new(ring0_kernel::GrantTable::allow(
            &["*"],
            ring0_core::Authority::A0,
        )))
        .build()
}

#[tokio::test]
async fn a_projector_with_a_larger_bound_receives_structured_results_whole() {
    let session =
        payload_kernel().open_session(SessionConfig::new("s").projector(Arc::new(PayloadSize)));
    let out = session
        .run_round(
            round(vec![call(0, "picture", json!({}))]),
            &RoundOptions::default(),
        )
        .await;
    let bytes = out.results[0].content["payload_bytes"].as_u64().unwrap();
    assert!(bytes > 100 * 1024, "{}", out.results[0].content);
}

#[tokio::test]
async fn without_such_a_projector_a_structured_result_past_the_bound_is_withheld_and_said() {
    let session = payload_kernel().open_session(SessionConfig::new("s"));
    let out = session
        .run_round(
            round(vec![call(0, "picture", json!({}))]),
            &RoundOptions::default(),
        )
        .await;
    let text = out.results[0].content.to_string();
    assert!(text.contains("was withheld"), "{text}");
    assert!(text.len() <= ring0_core::limits::PROJECTION_BYTES_MAX);
}
