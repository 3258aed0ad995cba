//! Observations: what a tool's output becomes after shaping — bounded, sanitized, typed.
//!
//! This is the first version; `ring0-shape` produces the full envelope.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The shaped result of one call.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    /// Model-visible text, already within budget.
    pub text: String,
    /// Structured content (JSON), kept whole or replaced by a spill handle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structured: Option<Value>,
    /// The tool reported an error. Not the same as a non-zero exit code, which is reported as is.
    #[serde(default)]
    pub is_error: bool,
}

impl Observation {
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            ..Self::default()
        }
    }

    pub fn json(value: Value) -> Self {
        Self {
            text: String::new(),
            structured: Some(value),
            ..Self::default()
        }
    }

    pub fn error(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            is_error: true,
            ..Self::default()
        }
    }
}
