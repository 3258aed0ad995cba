//! Where captured bytes go: the observation shaper.
//!
//! The drains push every chunk into a `ring0_shape::StreamShaper` the moment it arrives and keep
//! no output of their own, so memory stays within the shaper's bounds however much a tool prints.
//! At the end the shaper's observation (sanitized streams, exit status, cuts, diagnostics, spill
//! handles) is completed with what only supervision knows: the [`RunSummary`] as structured
//! content, `is_error` for runs that did not finish by themselves, and a one-line note saying
//! why (timeout, cancel, output ceiling) within the budget.

use crate::error::ExecError;
use crate::limits;
use crate::run::RunSummary;
use ring0_core::Observation;
use ring0_core::text::truncate_utf8;
use ring0_shape::{ExitInfo, ShapeConfig, Stream, StreamShaper};
use std::time::Duration;

/// Shapes one run's output.
pub(crate) struct Shaping {
    shaper: StreamShaper,
    budget_bytes: usize,
}

impl Shaping {
    pub(crate) fn new(config: &ShapeConfig) -> Result<Self, ExecError> {
        let mut config = config.clone();
        let budget_bytes = config.budget_bytes;
        // Room for the supervision note, as far as the shaper's minimum budget allows.
        config.budget_bytes = budget_bytes
            .saturating_sub(limits::SUPERVISION_NOTE_BYTES_MAX)
            .max(ring0_shape::config::BUDGET_BYTES_MIN)
            .min(budget_bytes);
        let shaper =
            StreamShaper::new(config).map_err(|e| ExecError::ShapeConfig(e.to_string()))?;
        Ok(Self {
            shaper,
            budget_bytes,
        })
    }

    pub(crate) fn push(&mut self, stream: Stream, bytes: &[u8]) {
        self.shaper.push(stream, bytes);
    }

    pub(crate) fn finish(self, summary: &RunSummary) -> Observation {
        let exit = summary.exit.unwrap_or_default();
        let info = ExitInfo {
            code: exit.code,
            signal: exit.signal,
            core_dumped: exit.core_dumped,
            duration: Some(Duration::from_millis(summary.duration_ms)),
        };
        let mut observation = self.shaper.finish(info);
        observation.structured = serde_json::to_value(summary).ok();
        observation.is_error = summary.is_error();
        if let Some(note) = summary.supervision_note() {
            let room = self.budget_bytes.saturating_sub(observation.text.len() + 1);
            let note = truncate_utf8(&note, room);
            if !note.is_empty() {
                if !observation.text.is_empty() && !observation.text.ends_with('\n') {
                    observation.text.push('\n');
                }
                observation.text.push_str(note);
            }
        }
        observation
    }
}

/// Largest tail `inspect` sanitizes at once, with room for the shaper's framing.
const TAIL_SHAPE_BUDGET_BYTES: usize = limits::TAIL_BYTES_MAX * 2;

/// Recent output made safe to show: escape sequences parsed out, controls and invisible
/// characters dropped, carriage-return redraws collapsed — the shaper's sanitizer, without a
/// budget cut or token counting.
pub(crate) fn sanitize_tail(bytes: &[u8]) -> String {
    let mut config = ShapeConfig::with_budget(TAIL_SHAPE_BUDGET_BYTES);
    config.count_tokens = false;
    match ring0_shape::shape_bytes(bytes, &config) {
        Ok(observation) => observation.stdout.map(|s| s.text).unwrap_or_default(),
        Err(_) => String::new(),
    }
}

/// A stream's name in messages.
pub(crate) fn stream_label(stream: Stream) -> &'static str {
    match stream {
        Stream::Stdout => "stdout",
        Stream::Stderr => "stderr",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sanitized_tail_has_no_escape_sequences_and_keeps_final_redraws() {
        let tail = sanitize_tail(b"\x1b[31mred\x1b[0m\nprogress 10%\rprogress 100%\n");
        assert_eq!(tail, "red\nprogress 100%\n");
    }
}
