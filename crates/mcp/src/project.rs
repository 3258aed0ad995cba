//! Project, for MCP clients: a call's receipt becomes the `tools/call` result the client receives.
//!
//! The downstream server opens every kernel session with the generation's [`McpProjector`], and
//! answers a call with the round's projected result — the same for a call that ran, one replayed
//! from the journal and one memoized, since all of them are built from the receipt:
//! - an upstream tool's completed call: its observation's payload, the shaped result object the
//!   upstream sent (see [`crate::forward`]), with its `_meta`, unknown fields and content items;
//! - any other completed call (a built-in tool; a reconciled call, whose observation is the
//!   probe's evidence): the observation's text as one text item, its structured value as
//!   `structuredContent`;
//! - a failed call: the outcome the model can act on, as JSON text, with `isError: true`.
//!
//! A refused call is projected by the kernel itself (its rejection envelope); the server wraps
//! that, and the fixed `projection_failed` result, as text with `isError: true`.

use crate::limits::RESULT_BYTES_MAX;
use ring0_core::Observation;
use ring0_core::receipt::CallOutcome;
use ring0_kernel::{ProjectionInput, Projector};
use serde_json::{Value, json};
use std::collections::BTreeSet;

/// The projection of one generation's catalog.
#[derive(Debug, Default)]
pub struct McpProjector {
    /// Tools whose observations carry an upstream's result object.
    upstream_tools: BTreeSet<String>,
}

impl McpProjector {
    /// `upstream_tools`: the qualified names of the generation's upstream tools.
    pub fn new(upstream_tools: BTreeSet<String>) -> Self {
        Self { upstream_tools }
    }

    fn completed(&self, tool: &str, observation: &Observation) -> Value {
        if self.upstream_tools.contains(tool)
            && let Some(result) = observation.structured.as_ref().filter(|r| is_result(r))
        {
            return result.clone();
        }
        let text = if observation.text.is_empty() {
            observation
                .structured
                .as_ref()
                .map(Value::to_string)
                .unwrap_or_default()
        } else {
            observation.text.clone()
        };
        let mut out =
            json!({"content": [{"type": "text", "text": text}], "isError": observation.is_error});
        if let Some(s) = &observation.structured {
            out["structuredContent"] = s.clone();
        }
        out
    }
}

/// Whether a value is a `tools/call` result object (as forwarding builds it).
fn is_result(value: &Value) -> bool {
    value.get("content").is_some_and(Value::is_array)
}

impl Projector for McpProjector {
    fn project(&self, input: &ProjectionInput<'_>) -> Result<Value, String> {
        if let CallOutcome::Completed { observation } = input.outcome {
            return Ok(self.completed(input.tool, observation));
        }
        let failure = json!({
            "tool": input.tool,
            "call_id": input.call_id,
            "intent_id": input.intent_id,
            "state": input.state,
            "outcome": input.outcome,
        });
        let text = serde_json::to_string(&failure).map_err(|e| e.to_string())?;
        Ok(json!({"content": [{"type": "text", "text": text}], "isError": true}))
    }

    /// An upstream's result may carry binary content far larger than a model message.
    fn projection_bytes_max(&self) -> usize {
        RESULT_BYTES_MAX
    }

    /// A notice for the model (the repeat guard's advisory) goes where an MCP client shows the
    /// model a result: a text item after the result's content.
    fn with_notice(&self, mut projection: Value, notice: &str) -> Value {
        if let Some(items) = projection.get_mut("content").and_then(Value::as_array_mut) {
            items.push(json!({"type": "text", "text": notice}));
            return projection;
        }
        ring0_kernel::project::with_notice_field(projection, notice)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input<'a>(tool: &'a str, outcome: &'a CallOutcome) -> ProjectionInput<'a> {
        ProjectionInput {
            tool,
            call_id: "c1",
            intent_id: None,
            state: None,
            args: None,
            outcome,
        }
    }

    fn projector() -> McpProjector {
        McpProjector::new(["up__tool".to_string()].into())
    }

    #[test]
    fn an_upstream_result_is_projected_whole() {
        let result = json!({"content": [{"type": "image", "data": "aGk=", "mimeType": "image/png"}],
                            "_meta": {"k": 1}, "x-extra": true});
        let outcome = CallOutcome::Completed {
            observation: Observation {
                structured: Some(result.clone()),
                ..Observation::text("[image image/png, 4 bytes of base64]")
            },
        };
        assert_eq!(
            projector().project(&input("up__tool", &outcome)),
            Ok(result)
        );
    }

    #[test]
    fn a_built_in_observation_becomes_text_and_structured_content() {
        let outcome = CallOutcome::Completed {
            observation: Observation {
                structured: Some(json!({"content": [], "n": 1})),
                ..Observation::text("listed")
            },
        };
        // A built-in tool's structured value is never taken for an upstream result.
        let v = projector().project(&input("list_dir", &outcome)).unwrap();
        assert_eq!(v["content"][0]["text"], "listed");
        assert_eq!(v["structuredContent"]["n"], 1);
        assert_eq!(v["isError"], false);
    }

    #[test]
    fn a_failure_is_an_error_result_saying_what_is_known() {
        let outcome = CallOutcome::Failed {
            message: "upstream \"up\" is not connected".into(),
            uncertain: false,
            observation: None,
        };
        let v = projector().project(&input("up__tool", &outcome)).unwrap();
        assert_eq!(v["isError"], true);
        let text: Value = serde_json::from_str(v["content"][0]["text"].as_str().unwrap()).unwrap();
        assert_eq!(text["outcome"]["uncertain"], false);
        assert_eq!(text["tool"], "up__tool");
    }
}
