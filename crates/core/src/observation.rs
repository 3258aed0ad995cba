//! Observations: what a tool's output becomes after shaping — bounded, sanitized, typed.
//!
//! [`Observation`] is the envelope the model's view of a call is built from. The three original
//! fields (`text`, `structured`, `is_error`) are what every tool produces; the rest is filled in by
//! `ring0-shape` for tools whose output is a byte stream (processes) or an MCP content array:
//! exit status as reported by the operating system, each stream shaped on its own, what was cut and
//! why, typed diagnostics, where the full output went, who produced it and what it cost in tokens.
//! Every added field is optional and skipped when empty, so a plain `Observation::text` serializes
//! exactly as before.
//!
//! An exit code of 0 is recorded as the number 0. Nothing here turns it into "success": a process
//! that exits 0 may still have failed at its task, and the model is shown the number.

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
    /// Exit code of a process that exited normally (`WEXITSTATUS`). 0 is reported as 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Signal that terminated the process (`WTERMSIG`), if it was killed by one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// The process left a core dump (`WCOREDUMP`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub core_dumped: bool,
    /// Wall-clock time from start to exit, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// Standard output, shaped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout: Option<StreamReport>,
    /// Standard error, shaped, kept apart from standard output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr: Option<StreamReport>,
    /// Something was left out to stay within budget (see the streams' `truncation` and
    /// `truncation_notice`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub truncated: bool,
    /// A sentence the model can act on: what was cut, how much, and how to read the rest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncation_notice: Option<String>,
    /// Typed frames found in the output (tracebacks, compiler errors, panics, test summaries).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub diagnostics: Vec<Diagnostic>,
    /// Diagnostics found beyond the bounded list, counted.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub diagnostics_omitted: u64,
    /// Which tool and server produced the output, and whether that source is trusted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<Provenance>,
    /// Token counts of the raw input and of the shaped text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<TokenCounts>,
    /// Invisible and bidirectional-control characters removed (zero-width, bidi embeddings and
    /// isolates, tag characters).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub invisible_removed: u64,
    /// Text that imitated a model provider's framing and was neutralized.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub framing_neutralized: u64,
    /// Secrets (private keys, tokens, credentials, values the host marked secret) replaced by a
    /// typed marker such as `[redacted:jwt]`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub secrets_redacted: u64,
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

/// One output stream after shaping.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamReport {
    /// The shaped text: sanitized, redraws collapsed, within budget, a tombstone where cut.
    pub text: String,
    /// Bytes the stream produced before shaping.
    pub raw_bytes: u64,
    /// Bytes after sanitizing and collapsing redraws, before the budget cut.
    pub shaped_bytes: u64,
    /// Line breaks after sanitizing and collapsing redraws, before the budget cut.
    pub lines: u64,
    /// Present when the budget cut this stream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncation: Option<Truncation>,
    /// Where the full raw stream was kept, if it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spill: Option<SpillHandle>,
    /// Escape sequences (CSI, OSC, DCS, SOS/PM/APC, other ESC) removed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub escapes_removed: u64,
    /// Control characters removed (C0 other than newline and tab, DEL, C1).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub controls_removed: u64,
    /// Characters dropped because a redrawn line grew past the line limit.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub clipped_bytes: u64,
}

/// What a budget cut kept and what it dropped. `head + omitted + tail` equals the shaped stream,
/// in bytes and in line breaks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Truncation {
    /// Why the stream was cut.
    pub reason: TruncationReason,
    pub head_bytes: u64,
    pub head_lines: u64,
    pub tail_bytes: u64,
    pub tail_lines: u64,
    pub omitted_bytes: u64,
    pub omitted_lines: u64,
}

/// Why a budget cut happened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TruncationReason {
    /// The stream alone was larger than the observation budget.
    #[default]
    StreamBudget,
    /// The stream fit alone, but not together with the other stream.
    SharedBudget,
}

/// A handle to content kept whole in the spill store, named by its SHA-256.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpillHandle {
    /// `sha256:` followed by 64 lowercase hex digits.
    pub id: String,
    /// Bytes stored under the handle.
    pub bytes: u64,
    /// False when the store's per-file limit stopped the copy; `bytes` says how much was kept.
    pub complete: bool,
}

/// Who produced an observation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Provenance {
    /// Tool name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// MCP server (or other upstream) the tool belongs to; absent for built-in tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    /// Whether the operator marked this source as trusted. Untrusted output is still shaped the
    /// same way; the flag is for the model and the host to weigh it.
    pub trusted: bool,
}

/// Token counts of one observation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenCounts {
    /// The tokenizer used (e.g. `o200k_base`).
    pub encoding: String,
    /// Tokens in the raw input (both streams).
    pub raw: u64,
    /// False when `raw` was extrapolated from a bounded sample instead of counted in full.
    pub raw_exact: bool,
    /// Tokens in the model-visible text.
    pub shaped: u64,
}

/// A source position.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Location {
    pub file: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub column: Option<u32>,
    /// Enclosing function, when the format names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<String>,
}

/// Which stream a diagnostic was found in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StreamName {
    Stdout,
    Stderr,
}

/// Severity of a compiler diagnostic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Error,
    Warning,
}

/// A typed frame extracted from tool output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Diagnostic {
    /// A Python traceback: the exception, its message, and the innermost frame inside the
    /// workspace (or the innermost frame when none is).
    PythonException {
        stream: StreamName,
        exception: String,
        message: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        location: Option<Location>,
        frames: u32,
    },
    /// A GCC or Clang `file:line:col: error: message` line.
    CCompiler {
        stream: StreamName,
        severity: Severity,
        message: String,
        location: Location,
    },
    /// A rustc `error[E…]: message` with its `-->` location.
    Rustc {
        stream: StreamName,
        severity: Severity,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        code: Option<String>,
        message: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        location: Option<Location>,
    },
    /// A Rust panic, in the old (`panicked at 'msg', file:l:c`) or new (`panicked at file:l:c:`
    /// then the message) format.
    RustPanic {
        stream: StreamName,
        thread: String,
        message: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        location: Option<Location>,
    },
    /// A Go panic with the first frame of the panicking goroutine.
    GoPanic {
        stream: StreamName,
        message: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        location: Option<Location>,
    },
    /// A test runner's summary line.
    TestSummary {
        stream: StreamName,
        runner: TestRunner,
        passed: u64,
        failed: u64,
        #[serde(default, skip_serializing_if = "is_zero")]
        skipped: u64,
        #[serde(default, skip_serializing_if = "is_zero")]
        errors: u64,
        /// Failing test names seen before the summary (bounded).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        failures: Vec<String>,
    },
}

/// Test runners whose summaries are recognized.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TestRunner {
    CargoTest,
    Pytest,
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_text_observation_serializes_only_the_original_fields() {
        let json = serde_json::to_value(Observation::text("hi")).unwrap();
        assert_eq!(json, serde_json::json!({"text": "hi", "is_error": false}));
    }

    #[test]
    fn exit_code_zero_is_serialized_as_zero() {
        let obs = Observation {
            exit_code: Some(0),
            ..Observation::text("")
        };
        let json = serde_json::to_value(&obs).unwrap();
        assert_eq!(json["exit_code"], 0);
    }

    #[test]
    fn envelope_round_trips_through_json() {
        let obs = Observation {
            exit_code: Some(1),
            diagnostics: vec![Diagnostic::RustPanic {
                stream: StreamName::Stderr,
                thread: "main".into(),
                message: "boom".into(),
                location: Some(Location {
                    file: "src/main.rs".into(),
                    line: Some(2),
                    column: Some(5),
                    function: None,
                }),
            }],
            ..Observation::text("x")
        };
        let back: Observation =
            serde_json::from_value(serde_json::to_value(&obs).unwrap()).unwrap();
        assert_eq!(back, obs);
    }
}
