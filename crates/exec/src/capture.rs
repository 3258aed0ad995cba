//! Where captured bytes go: the [`OutputShaper`] seam.
//!
//! The drains push every chunk into a shaper the moment it arrives and never keep output of
//! their own, so memory stays within the shaper's budget however much a tool prints. At the end
//! the shaper turns what it kept, plus the [`RunSummary`], into the model-visible
//! [`Observation`].
//!
//! [`BoundedCapture`] is the built-in shaper: head and tail of each stream within the budget and
//! an explicit count of what was left out between them. It does no terminal-sequence parsing
//! beyond dropping control bytes; the observation-shaping crate does the full job.

use crate::run::RunSummary;
use ring0_core::Observation;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// One output stream of a process. A pseudo-terminal's merged output arrives as `Stdout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stdout => "stdout",
            Self::Stderr => "stderr",
        }
    }
}

/// Turns a stream of output chunks into an observation, in memory bounded by its budget.
pub trait OutputShaper: Send {
    /// Takes one chunk as it arrives. Must not block and must not keep more than its budget.
    fn push(&mut self, stream: Stream, bytes: &[u8]);
    /// Produces the observation once the process tree is gone and the pipes are closed.
    fn finish(self: Box<Self>, summary: &RunSummary) -> Observation;
}

/// Head and tail of one stream within a byte budget.
#[derive(Debug, Default)]
struct HeadTail {
    head: Vec<u8>,
    tail: VecDeque<u8>,
    head_max: usize,
    tail_max: usize,
    total: u64,
}

impl HeadTail {
    fn new(budget: usize) -> Self {
        Self {
            head_max: budget / 2,
            tail_max: budget - budget / 2,
            ..Self::default()
        }
    }

    fn push(&mut self, mut bytes: &[u8]) {
        self.total += bytes.len() as u64;
        let room = self.head_max - self.head.len();
        if room > 0 {
            let take = room.min(bytes.len());
            self.head.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
        }
        if bytes.len() >= self.tail_max {
            self.tail.clear();
            self.tail.extend(&bytes[bytes.len() - self.tail_max..]);
        } else {
            let overflow = (self.tail.len() + bytes.len()).saturating_sub(self.tail_max);
            self.tail.drain(..overflow);
            self.tail.extend(bytes);
        }
    }

    fn omitted(&self) -> u64 {
        self.total - (self.head.len() + self.tail.len()) as u64
    }

    fn kept(&self) -> usize {
        self.head.len() + self.tail.len()
    }

    fn render(&self, out: &mut String) {
        out.push_str(&printable(&self.head));
        let omitted = self.omitted();
        if omitted > 0 {
            out.push_str(&format!("\n[… {omitted} bytes omitted …]\n"));
        }
        let tail: Vec<u8> = self.tail.iter().copied().collect();
        out.push_str(&printable(&tail));
    }
}

/// Lossy UTF-8 with control characters other than newline and tab removed (a carriage return
/// becomes a newline, so `\r\n` line ends and progress rewrites stay readable).
pub(crate) fn printable(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut out = String::with_capacity(text.len());
    let mut previous_cr = false;
    for c in text.chars() {
        match c {
            '\r' => {
                out.push('\n');
                previous_cr = true;
                continue;
            }
            '\n' if previous_cr => {}
            '\n' | '\t' => out.push(c),
            c if c.is_control() => {}
            c => out.push(c),
        }
        previous_cr = false;
    }
    out
}

/// The built-in shaper: head and tail of stdout and of stderr, each within half the budget.
#[derive(Debug)]
pub struct BoundedCapture {
    stdout: HeadTail,
    stderr: HeadTail,
}

impl BoundedCapture {
    pub fn new(budget_bytes: usize) -> Self {
        Self {
            stdout: HeadTail::new(budget_bytes / 2),
            stderr: HeadTail::new(budget_bytes - budget_bytes / 2),
        }
    }

    /// Bytes currently held (never more than the budget).
    pub fn kept_bytes(&self) -> usize {
        self.stdout.kept() + self.stderr.kept()
    }
}

impl OutputShaper for BoundedCapture {
    fn push(&mut self, stream: Stream, bytes: &[u8]) {
        match stream {
            Stream::Stdout => self.stdout.push(bytes),
            Stream::Stderr => self.stderr.push(bytes),
        }
    }

    fn finish(self: Box<Self>, summary: &RunSummary) -> Observation {
        let mut text = String::new();
        for (name, part) in [("stdout", &self.stdout), ("stderr", &self.stderr)] {
            if part.total == 0 {
                continue;
            }
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(&format!("[{name}]\n"));
            part.render(&mut text);
        }
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&summary.status_line());
        let omitted = self.stdout.omitted() + self.stderr.omitted();
        Observation {
            text,
            structured: serde_json::to_value(summary).ok(),
            is_error: summary.is_error(),
            exit_code: summary.exit.and_then(|e| e.code),
            signal: summary.exit.and_then(|e| e.signal),
            core_dumped: summary.exit.is_some_and(|e| e.core_dumped),
            duration_ms: Some(summary.duration_ms),
            truncated: omitted > 0,
            truncation_notice: (omitted > 0).then(|| {
                format!("{omitted} bytes of output were left out between the head and tail shown")
            }),
            ..Observation::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_within_budget_is_kept_whole() {
        let mut part = HeadTail::new(16);
        part.push(b"hello ");
        part.push(b"world");
        let mut out = String::new();
        part.render(&mut out);
        assert_eq!(out, "hello world");
    }

    #[test]
    fn an_oversized_stream_keeps_head_and_tail_and_counts_the_rest() {
        let mut part = HeadTail::new(8);
        for chunk in [&b"0123"[..], b"456789", b"abcdef"] {
            part.push(chunk);
        }
        let mut out = String::new();
        part.render(&mut out);
        assert_eq!(out, "0123\n[… 8 bytes omitted …]\ncdef");
        assert_eq!(part.kept(), 8);
    }

    #[test]
    fn one_huge_chunk_never_exceeds_the_budget() {
        let mut part = HeadTail::new(10);
        part.push(&vec![b'x'; 1_000_000]);
        assert_eq!(part.kept(), 10);
        assert_eq!(part.omitted(), 999_990);
    }

    #[test]
    fn control_characters_are_removed_but_lines_survive() {
        assert_eq!(printable(b"a\x07b\r\nc\td\x1b"), "ab\nc\td");
    }
}
