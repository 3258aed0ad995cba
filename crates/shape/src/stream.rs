//! The streaming shaper: process output in, one [`Observation`] out.
//!
//! ```
//! use ring0_shape::{ExitInfo, ShapeConfig, Stream, StreamShaper};
//!
//! let mut shaper = StreamShaper::new(ShapeConfig::with_budget(4096)).unwrap();
//! shaper.push(Stream::Stdout, b"\x1b[32mcompiling\x1b[0m 10%\r");
//! shaper.push(Stream::Stdout, b"compiling 100%\n");
//! shaper.push(Stream::Stderr, b"warning: unused variable\n");
//! let obs = shaper.finish(ExitInfo::exited(0));
//! assert_eq!(obs.stdout.unwrap().text, "compiling 100%\n");
//! assert_eq!(obs.exit_code, Some(0));
//! ```
//!
//! Each stream goes through its own pipeline — sanitizer, line model, framing defense,
//! diagnostics, budget — as its chunks arrive, in whatever sizes the reader produced them; the
//! output does not depend on the chunking. Memory is bounded by the configuration (about twice the
//! budget per stream plus the line model's window and the token sample), never by the input.
//!
//! `push` does blocking file I/O when a spill store is configured (buffered writes of the raw
//! bytes); call it where blocking briefly is acceptable.

use std::time::Duration;

use ring0_core::Observation;
use ring0_core::observation::{StreamName, StreamReport, TokenCounts, TruncationReason};

use crate::budget::{StreamBudget, group};
use crate::config::{
    ConfigError, DIAGNOSTIC_LINE_BYTES_MAX, DIAGNOSTICS_SECTION_BYTES_MAX, RENDER_RESERVE_BYTES,
    ShapeConfig,
};
use crate::diagnostics::Extractor;
use crate::framing::FramingDefense;
use crate::redact::Redactor;
use crate::sanitize::Sanitizer;
use crate::screen::{LineSink, Screen};
use crate::spill::SpillWriter;
use crate::tokens;

/// Longest truncation notice, in bytes.
const NOTICE_BYTES_MAX: usize = 440;
/// Longest exit status line, in bytes.
const STATUS_BYTES_MAX: usize = 64;

/// Which output stream a chunk came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    fn index(self) -> usize {
        match self {
            Stream::Stdout => 0,
            Stream::Stderr => 1,
        }
    }

    fn name(self) -> StreamName {
        match self {
            Stream::Stdout => StreamName::Stdout,
            Stream::Stderr => StreamName::Stderr,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// How a process ended, as the operating system reported it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExitInfo {
    /// `WEXITSTATUS` when the process exited normally.
    pub code: Option<i32>,
    /// `WTERMSIG` when a signal killed it.
    pub signal: Option<i32>,
    /// `WCOREDUMP`.
    pub core_dumped: bool,
    /// Time from start to exit.
    pub duration: Option<Duration>,
}

impl ExitInfo {
    /// No exit status (the output did not come from a process, or its end is unknown).
    pub fn none() -> Self {
        Self::default()
    }

    /// A normal exit with `code`.
    pub fn exited(code: i32) -> Self {
        Self {
            code: Some(code),
            ..Self::default()
        }
    }

    /// Killed by `signal`.
    pub fn signaled(signal: i32, core_dumped: bool) -> Self {
        Self {
            signal: Some(signal),
            core_dumped,
            ..Self::default()
        }
    }

    /// Sets the duration.
    pub fn with_duration(mut self, duration: Duration) -> Self {
        self.duration = Some(duration);
        self
    }

    /// From a waited-for child's status.
    #[cfg(unix)]
    pub fn from_status(status: std::process::ExitStatus) -> Self {
        use std::os::unix::process::ExitStatusExt;
        Self {
            code: status.code(),
            signal: status.signal(),
            core_dumped: status.core_dumped(),
            duration: None,
        }
    }
}

/// Shapes the output of one call as it streams in. See the module documentation.
pub struct StreamShaper {
    config: ShapeConfig,
    streams: [StreamState; 2],
    spill_errors: Vec<String>,
}

struct StreamState {
    sanitizer: Sanitizer,
    screen: Screen,
    sink: Sink,
    raw_bytes: u64,
    raw_sample: Vec<u8>,
    spill: Option<SpillWriter>,
}

/// Where finished lines go: framing defense, secret redaction, then diagnostics, then the budget.
struct Sink {
    framing: FramingDefense,
    scratch: Vec<u8>,
    framing_neutralized: u64,
    redactor: Redactor,
    /// A private-key block opened in an earlier block and not yet closed.
    in_private_key: bool,
    secrets_redacted: u64,
    extractor: Extractor,
    budget: StreamBudget,
}

impl LineSink for Sink {
    fn lines(&mut self, block: &[u8], newlines: u64) {
        let n = self.framing.neutralize(block, &mut self.scratch);
        self.framing_neutralized += n;
        let text = if n > 0 { &self.scratch[..] } else { block };
        // The sanitizer emits UTF-8 only; the lossy view is a borrow of the same bytes.
        let utf8 = String::from_utf8_lossy(text);
        let (redacted, found) = self.redactor.redact_block(&utf8, &mut self.in_private_key);
        if found == 0 && !self.in_private_key && redacted.len() == utf8.len() {
            self.extractor.feed(text);
            self.budget.push(text, newlines);
            return;
        }
        self.secrets_redacted += found;
        let bytes = redacted.as_bytes();
        let lines = memchr::memchr_iter(b'\n', bytes).count() as u64;
        self.extractor.feed(bytes);
        self.budget.push(bytes, lines);
    }
}

impl StreamShaper {
    /// A shaper for one call's output.
    pub fn new(config: ShapeConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let stream_cap = config.budget_bytes - RENDER_RESERVE_BYTES;
        let head_cap = stream_cap * usize::from(config.head_percent) / 100 + 1;
        let tail_cap = stream_cap - head_cap.min(stream_cap) + 64;
        let root = config
            .workspace_root
            .as_ref()
            .map(|p| p.to_string_lossy().into_owned());
        let mut spill_errors = Vec::new();
        let mut state = |stream: Stream| StreamState {
            sanitizer: Sanitizer::default(),
            screen: Screen::default(),
            sink: Sink {
                framing: config.framing.clone(),
                scratch: Vec::new(),
                framing_neutralized: 0,
                redactor: config.redactor.clone(),
                in_private_key: false,
                secrets_redacted: 0,
                extractor: Extractor::new(stream.name(), root.clone()),
                budget: StreamBudget::new(head_cap, tail_cap),
            },
            raw_bytes: 0,
            raw_sample: Vec::new(),
            spill: config.spill.as_ref().and_then(|s| {
                match s.writer_for(config.spill_owner.as_deref()) {
                    Ok(w) => Some(w),
                    Err(e) => {
                        spill_errors.push(format!("{}: {e}", stream.label()));
                        None
                    }
                }
            }),
        };
        let streams = [state(Stream::Stdout), state(Stream::Stderr)];
        Ok(Self {
            config,
            streams,
            spill_errors,
        })
    }

    /// Feeds a chunk of one stream, in arrival order. Chunks may split escape sequences, UTF-8
    /// characters and lines anywhere.
    pub fn push(&mut self, stream: Stream, bytes: &[u8]) {
        let sample_room = self
            .config
            .raw_token_sample_bytes
            .saturating_sub(self.streams[0].raw_sample.len() + self.streams[1].raw_sample.len());
        let s = &mut self.streams[stream.index()];
        s.raw_bytes += bytes.len() as u64;
        if self.config.count_tokens && sample_room > 0 {
            s.raw_sample
                .extend_from_slice(&bytes[..bytes.len().min(sample_room)]);
        }
        if let Some(w) = s.spill.as_mut() {
            w.write(bytes);
        }
        s.sanitizer.push(bytes, &mut s.screen, &mut s.sink);
    }

    /// Bytes of memory the shaper's buffers hold now (capacities, both streams): the figure that
    /// stays bounded by the configuration whatever the input size.
    pub fn buffered_bytes(&self) -> usize {
        self.streams
            .iter()
            .map(|s| {
                s.screen.buffered_bytes()
                    + s.sink.budget.buffered_bytes()
                    + s.sink.scratch.capacity()
                    + s.raw_sample.capacity()
                    + s.spill.as_ref().map_or(0, SpillWriter::buffered_bytes)
            })
            .sum()
    }

    /// Raw bytes received so far on `stream` (for a caller enforcing an abort ceiling).
    pub fn raw_bytes(&self, stream: Stream) -> u64 {
        self.streams[stream.index()].raw_bytes
    }

    /// Ends both streams and builds the observation. The exit status is recorded as given; an
    /// exit code of 0 is reported as 0 and does not set or clear `is_error`.
    pub fn finish(mut self, exit: ExitInfo) -> Observation {
        for s in &mut self.streams {
            s.sanitizer.finish(&mut s.screen, &mut s.sink);
            s.screen.finish(&mut s.sink);
            s.sink.extractor.finish();
        }
        let mut avail = self.config.budget_bytes - RENDER_RESERVE_BYTES;
        let whole: Option<usize> = self.streams[0]
            .sink
            .budget
            .whole_len()
            .zip(self.streams[1].sink.budget.whole_len())
            .map(|(a, b)| a + b);
        // A cut output gives up room for what the diagnostics found in the part it omits.
        let diagnostics_room = if whole.is_none_or(|w| w > avail)
            && self.config.budget_bytes >= 4 * DIAGNOSTICS_SECTION_BYTES_MAX
        {
            DIAGNOSTICS_SECTION_BYTES_MAX
        } else {
            0
        };
        avail -= diagnostics_room;
        let allowances = share(
            avail,
            self.streams[0].sink.budget.whole_len(),
            self.streams[1].sink.budget.whole_len(),
        );

        let mut reports: [Option<StreamReport>; 2] = [None, None];
        let mut notice_parts = Vec::new();
        let mut spill_parts = Vec::new();
        let mut spill_errors = std::mem::take(&mut self.spill_errors);
        let mut diagnostics = Vec::new();
        let mut diagnostics_omitted = 0;
        let mut invisible = 0;
        let mut framing = 0;
        let mut secrets = 0;
        for (i, stream) in [Stream::Stdout, Stream::Stderr].into_iter().enumerate() {
            let s = &mut self.streams[i];
            let budget = &s.sink.budget;
            let reason = match budget.whole_len() {
                Some(len) if len <= avail => TruncationReason::SharedBudget,
                _ => TruncationReason::StreamBudget,
            };
            let cut = budget.cut(allowances[i], self.config.head_percent, reason);
            let spill = match s.spill.take() {
                Some(w) if cut.truncation.is_some() => match w.finish() {
                    Ok(h) => Some(h),
                    Err(e) => {
                        spill_errors.push(format!("{}: {e}", stream.label()));
                        None
                    }
                },
                // Nothing was cut: dropping the writer removes its file.
                _ => None,
            };
            if let Some(t) = &cut.truncation {
                notice_parts.push(format!(
                    "{} kept {}+{} of {} bytes",
                    stream.label(),
                    group(t.head_bytes),
                    group(t.tail_bytes),
                    group(budget.total_bytes),
                ));
                if let Some(h) = &spill {
                    spill_parts.push(format!("{} {}", stream.label(), h.id));
                }
            }
            diagnostics.append(&mut s.sink.extractor.found);
            diagnostics_omitted += s.sink.extractor.omitted;
            invisible += s.sanitizer.stats.invisible;
            framing += s.sink.framing_neutralized;
            secrets += s.sink.secrets_redacted;
            if s.raw_bytes > 0 || stream == Stream::Stdout {
                reports[i] = Some(StreamReport {
                    text: cut.text,
                    raw_bytes: s.raw_bytes,
                    shaped_bytes: budget.total_bytes,
                    lines: budget.total_lines,
                    truncation: cut.truncation,
                    spill,
                    escapes_removed: s.sanitizer.stats.escapes,
                    controls_removed: s.sanitizer.stats.controls,
                    clipped_bytes: s.screen.clipped_bytes,
                });
            }
        }
        if diagnostics.len() > crate::config::DIAGNOSTICS_MAX {
            diagnostics_omitted += (diagnostics.len() - crate::config::DIAGNOSTICS_MAX) as u64;
            diagnostics.truncate(crate::config::DIAGNOSTICS_MAX);
        }

        let truncated = !notice_parts.is_empty();
        let mut notice = None;
        if truncated || !spill_errors.is_empty() {
            let mut n = String::new();
            if truncated {
                n.push_str(&format!(
                    "Output cut to fit {} bytes: {}.",
                    group(self.config.budget_bytes as u64),
                    notice_parts.join(", ")
                ));
                if spill_parts.is_empty() {
                    n.push_str(" The omitted text was not kept; re-run with narrower output.");
                } else {
                    n.push_str(&format!(
                        " Full raw output: {}; read it with the read_spill tool (handle, offset, length).",
                        spill_parts.join(", ")
                    ));
                }
            }
            for e in &spill_errors {
                n.push_str(" Spill failed: ");
                n.push_str(e);
                n.push('.');
            }
            notice = Some(clip(n.trim_start(), NOTICE_BYTES_MAX));
        }

        let [stdout, stderr] = reports;
        let found = (truncated && diagnostics_room > 0)
            .then(|| diagnostics_section(&diagnostics, diagnostics_omitted, diagnostics_room))
            .flatten();
        let text = render_text(
            stdout.as_ref(),
            stderr.as_ref(),
            &exit,
            found.as_deref(),
            notice.as_deref(),
            self.config.budget_bytes,
        );

        let tokens = self.config.count_tokens.then(|| {
            let mut raw = 0;
            let mut sampled = 0u64;
            let mut total = 0u64;
            for s in &self.streams {
                raw += tokens::count(&String::from_utf8_lossy(&s.raw_sample)).unwrap_or(0);
                sampled += s.raw_sample.len() as u64;
                total += s.raw_bytes;
            }
            let exact = sampled == total;
            if !exact && sampled > 0 {
                raw = ((raw as u128 * total as u128) / sampled as u128) as u64;
            }
            TokenCounts {
                encoding: tokens::ENCODING.to_string(),
                raw,
                raw_exact: exact,
                shaped: tokens::count(&text).unwrap_or(0),
            }
        });

        Observation {
            text,
            structured: None,
            is_error: false,
            exit_code: exit.code,
            signal: exit.signal,
            core_dumped: exit.core_dumped,
            duration_ms: exit.duration.map(|d| d.as_millis() as u64),
            stdout,
            stderr,
            truncated,
            truncation_notice: notice,
            diagnostics,
            diagnostics_omitted,
            provenance: self.config.provenance.clone(),
            tokens,
            invisible_removed: invisible,
            framing_neutralized: framing,
            secrets_redacted: secrets,
        }
    }
}

/// Splits `avail` bytes between two streams: a stream that fits in half gets what it needs, the
/// other gets the rest.
fn share(avail: usize, a: Option<usize>, b: Option<usize>) -> [usize; 2] {
    let half = avail / 2;
    match (a, b) {
        (Some(a), Some(b)) if a + b <= avail => [a, b],
        (Some(a), _) if a <= half => [a, avail - a],
        (_, Some(b)) if b <= half => [avail - b, b],
        _ => [half, avail - half],
    }
}

/// The model-visible text: the streams (labelled when both have text), the exit status, then
/// the notice. Within `budget` by construction; a final check cuts on a character boundary.
fn render_text(
    stdout: Option<&StreamReport>,
    stderr: Option<&StreamReport>,
    exit: &ExitInfo,
    found: Option<&str>,
    notice: Option<&str>,
    budget: usize,
) -> String {
    let out = stdout.map_or("", |r| r.text.as_str());
    let err = stderr.map_or("", |r| r.text.as_str());
    let mut text = String::with_capacity(out.len() + err.len() + 128);
    let both = !out.is_empty() && !err.is_empty();
    let section = |label: &str, body: &str, text: &mut String| {
        if body.is_empty() {
            return;
        }
        if both || label == "stderr" {
            text.push('[');
            text.push_str(label);
            text.push_str("]\n");
        }
        text.push_str(body);
        if !body.ends_with('\n') {
            text.push('\n');
        }
    };
    section("stdout", out, &mut text);
    section("stderr", err, &mut text);
    if let Some(found) = found {
        text.push_str(found);
    }
    if let Some(status) = status_line(exit) {
        text.push_str(&clip(&status, STATUS_BYTES_MAX));
        text.push('\n');
    }
    if let Some(n) = notice {
        text.push('[');
        text.push_str(n);
        text.push_str("]\n");
    }
    clip(&text, budget)
}

/// One diagnostic as the line a tool would print: `file:line:col: severity: message` (the kind
/// stands in for a missing severity; an exception name leads its message).
fn diagnostic_line(d: &ring0_core::observation::Diagnostic) -> String {
    let v = serde_json::to_value(d).unwrap_or_default();
    let field = |k: &str| v.get(k).and_then(serde_json::Value::as_str);
    let mut s = String::new();
    if let Some(loc) = v.get("location")
        && let Some(file) = loc.get("file").and_then(serde_json::Value::as_str)
    {
        s.push_str(file);
        for k in ["line", "column"] {
            if let Some(n) = loc.get(k).and_then(serde_json::Value::as_u64) {
                s.push_str(&format!(":{n}"));
            }
        }
        s.push_str(": ");
    }
    s.push_str(field("severity").or(field("kind")).unwrap_or("diagnostic"));
    s.push_str(": ");
    if let Some(name) = field("exception").or(field("name")) {
        s.push_str(name);
        s.push_str(": ");
    }
    s.push_str(field("message").unwrap_or(""));
    s
}

/// The diagnostics of a cut output, one line each, within `room` bytes: what the
/// model would otherwise miss in the omitted part. `None` when there are none.
pub(crate) fn diagnostics_section(
    diagnostics: &[ring0_core::observation::Diagnostic],
    omitted: u64,
    room: usize,
) -> Option<String> {
    if diagnostics.is_empty() {
        return None;
    }
    const HEADER: &str = "[diagnostics found in the whole output]\n";
    let mut s = String::from(HEADER);
    let mut left = (diagnostics.len() as u64) + omitted;
    let footer = |n: u64| format!("[{n} more diagnostics not shown]\n");
    for d in diagnostics {
        let mut line = clip(&diagnostic_line(d), DIAGNOSTIC_LINE_BYTES_MAX);
        line.push('\n');
        if s.len() + line.len() + footer(left).len() > room {
            break;
        }
        s.push_str(&line);
        left -= 1;
    }
    if left > 0 {
        s.push_str(&footer(left));
    }
    (s.len() > HEADER.len()).then_some(s)
}

/// `[exit code 1 · 0.84 s]`, `[killed by signal 9 (SIGKILL), core dumped]`.
fn status_line(exit: &ExitInfo) -> Option<String> {
    let mut s = match (exit.code, exit.signal) {
        (Some(code), _) => format!("[exit code {code}"),
        (None, Some(sig)) => match signal_name(sig) {
            Some(name) => format!("[killed by signal {sig} ({name})"),
            None => format!("[killed by signal {sig}"),
        },
        (None, None) => return None,
    };
    if exit.core_dumped {
        s.push_str(", core dumped");
    }
    if let Some(d) = exit.duration {
        s.push_str(&format!(" · {:.2} s", d.as_secs_f64()));
    }
    s.push(']');
    Some(s)
}

fn signal_name(sig: i32) -> Option<&'static str> {
    Some(match sig {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        13 => "SIGPIPE",
        14 => "SIGALRM",
        15 => "SIGTERM",
        24 => "SIGXCPU",
        25 => "SIGXFSZ",
        _ => return None,
    })
}

/// Cuts to `max` bytes on a character boundary.
pub(crate) fn clip(s: &str, max: usize) -> String {
    ring0_core::text::truncate_utf8(s, max).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shaper(budget: usize) -> StreamShaper {
        StreamShaper::new(ShapeConfig {
            count_tokens: false,
            ..ShapeConfig::with_budget(budget)
        })
        .unwrap()
    }

    #[test]
    fn an_error_line_in_the_cut_middle_is_still_in_the_text() {
        let mut s = shaper(16 * 1024);
        for i in 0..2000 {
            s.push(
                Stream::Stdout,
                format!("line {i:05} {}\n", "0".repeat(80)).as_bytes(),
            );
            if i == 999 {
                s.push(
                    Stream::Stdout,
                    b"gen.c:12:5: error: expected ';' before 'return'\n",
                );
            }
        }
        let obs = s.finish(ExitInfo::exited(1));
        assert!(obs.truncated);
        assert!(obs.text.len() <= 16 * 1024);
        assert!(
            obs.text
                .contains("gen.c:12:5: error: expected ';' before 'return'\n"),
            "{}",
            obs.text
        );
        assert!(
            obs.text.contains("[exit code 1]"),
            "the status line survives"
        );
    }

    #[test]
    fn an_output_that_fits_gets_no_diagnostics_section() {
        let mut s = shaper(16 * 1024);
        s.push(Stream::Stdout, b"gen.c:12:5: error: expected ';'\n");
        let obs = s.finish(ExitInfo::exited(1));
        assert!(!obs.text.contains("diagnostics found"), "{}", obs.text);
    }

    #[test]
    fn stdout_and_stderr_are_kept_apart() {
        let mut s = shaper(4096);
        s.push(Stream::Stdout, b"out 1\n");
        s.push(Stream::Stderr, b"err 1\n");
        s.push(Stream::Stdout, b"out 2\n");
        let obs = s.finish(ExitInfo::exited(1));
        assert_eq!(obs.stdout.unwrap().text, "out 1\nout 2\n");
        assert_eq!(obs.stderr.unwrap().text, "err 1\n");
        assert_eq!(
            obs.text,
            "[stdout]\nout 1\nout 2\n[stderr]\nerr 1\n[exit code 1]\n"
        );
    }

    #[test]
    fn exit_code_zero_is_reported_and_not_called_success() {
        let mut s = shaper(4096);
        s.push(Stream::Stdout, b"0 tests collected\n");
        let obs = s.finish(ExitInfo::exited(0));
        assert_eq!(obs.exit_code, Some(0));
        assert!(!obs.is_error);
        assert!(obs.text.contains("[exit code 0]"));
        assert!(!obs.text.to_lowercase().contains("success"));
    }

    #[test]
    fn a_signal_is_reported_by_number_and_name() {
        let s = shaper(4096);
        let obs = s.finish(ExitInfo::signaled(11, true).with_duration(Duration::from_millis(1500)));
        assert_eq!(obs.signal, Some(11));
        assert!(obs.core_dumped);
        assert_eq!(obs.duration_ms, Some(1500));
        assert!(
            obs.text
                .contains("[killed by signal 11 (SIGSEGV), core dumped · 1.50 s]")
        );
    }

    #[test]
    fn a_quiet_stream_leaves_the_budget_to_the_other() {
        let mut s = shaper(4096);
        let big: Vec<u8> = (0..500)
            .flat_map(|i| format!("line {i}\n").into_bytes())
            .collect();
        s.push(Stream::Stdout, &big);
        s.push(Stream::Stderr, b"one error\n");
        let obs = s.finish(ExitInfo::exited(1));
        let out = obs.stdout.unwrap();
        assert!(out.truncation.is_some());
        assert!(out.text.len() > 3000);
        assert_eq!(obs.stderr.unwrap().text, "one error\n");
        assert!(obs.text.len() <= 4096);
        assert!(obs.truncated);
        assert!(obs.truncation_notice.unwrap().contains("stdout kept"));
    }

    #[test]
    fn a_budget_below_the_minimum_is_a_clear_error() {
        let err = StreamShaper::new(ShapeConfig::with_budget(10))
            .err()
            .unwrap();
        assert_eq!(err, ConfigError::Budget { got: 10 });
    }
}
