//! Diagnostics: typed frames found in shaped output.
//!
//! A model reading a failed build or test run needs three things: what failed, where, and the
//! summary counts. Those follow fixed grammars, so they are extracted here into
//! [`Diagnostic`]s while the text streams by — before the budget cuts the middle, so an error on
//! line 40,000 of 80,000 is still found:
//!
//! - Python tracebacks: exception, message, the innermost frame inside the workspace;
//! - GCC/Clang `file:line:col: error: message` (and warnings);
//! - rustc `error[E…]: message` (and `error:`/`warning:`) with the `-->` location that follows;
//! - Rust panics in the old (`panicked at 'msg', file:l:c`) and new (`panicked at file:l:c:` then
//!   the message) formats;
//! - Go panics with the first frame of the panicking goroutine outside the runtime;
//! - `cargo test` and pytest summary lines, with the failing test names printed before them.
//!
//! A multi-pattern search (Aho-Corasick) skips lines that cannot start a frame, so the cost on
//! ordinary output is one scan. The list is bounded by [`DIAGNOSTICS_MAX`]; errors displace
//! warnings when it is full, and the rest are counted.

use std::sync::LazyLock;

use aho_corasick::{AhoCorasick, MatchKind};
use ring0_core::observation::{Diagnostic, Location, Severity, StreamName, TestRunner};

use crate::config::{DIAGNOSTIC_TEXT_BYTES_MAX, DIAGNOSTICS_MAX};

/// Failing test names kept per summary.
const FAILURE_NAMES_MAX: usize = 16;
/// Lines a rustc diagnostic may take before its `-->` location.
const RUSTC_LOCATION_LINES_MAX: u8 = 4;
/// Lines of a new-format Rust panic message kept.
const PANIC_MESSAGE_LINES_MAX: u8 = 4;
/// Lines a Go panic may take before its first frame outside the runtime.
const GO_FRAME_LINES_MAX: u8 = 48;

/// How the lines that start or summarize a frame begin, and what GCC/Clang lines contain.
const LINE_STARTS: &[&str] = &[
    "Traceback (most recent call last)",
    "error",
    "warning",
    "thread '",
    "panic: ",
    "test result: ",
    "---- ",
    "FAILED ",
    "==",
];
const LINE_CONTAINS: &[&str] = &[": error: ", ": fatal error: ", ": warning: "];

/// Finds the next line that may start or summarize a frame: a line break followed by one of
/// [`LINE_STARTS`], or one of [`LINE_CONTAINS`]. Every pattern is at least three bytes with
/// rare leading bytes, so the SIMD searcher (Teddy) skips ordinary lines without looking at them.
enum Triggers {
    Packed(aho_corasick::packed::Searcher),
    Automaton(AhoCorasick),
}

impl Triggers {
    fn find(&self, haystack: &[u8]) -> Option<usize> {
        match self {
            Triggers::Packed(s) => s.find(haystack).map(|m| m.start()),
            Triggers::Automaton(a) => a.find(haystack).map(|m| m.start()),
        }
    }
}

static TRIGGERS: LazyLock<Option<Triggers>> = LazyLock::new(|| {
    let patterns: Vec<String> = LINE_STARTS
        .iter()
        .map(|p| format!("\n{p}"))
        .chain(LINE_CONTAINS.iter().map(|p| p.to_string()))
        .collect();
    if let Some(s) = aho_corasick::packed::Searcher::new(&patterns) {
        return Some(Triggers::Packed(s));
    }
    // Without SIMD: the general automaton, slower on line-dense text but the same matches.
    AhoCorasick::builder()
        .match_kind(MatchKind::LeftmostFirst)
        .build(&patterns)
        .ok()
        .map(Triggers::Automaton)
});

/// Whether a line is one [`TRIGGERS`] would find, for the first line of a block (which has no
/// line break before it).
fn is_trigger_line(line: &[u8]) -> bool {
    LINE_STARTS.iter().any(|p| line.starts_with(p.as_bytes()))
        || LINE_CONTAINS
            .iter()
            .any(|p| memchr::memmem::find(line, p.as_bytes()).is_some())
}

enum State {
    Idle,
    Traceback {
        frames: u32,
        inside: Option<Location>,
        innermost: Option<Location>,
    },
    RustcLocation {
        index: usize,
        lines_left: u8,
    },
    RustPanicMessage {
        thread: String,
        location: Option<Location>,
        message: String,
        lines_left: u8,
    },
    GoPanic {
        message: String,
        stage: GoStage,
        function: Option<String>,
        lines_left: u8,
    },
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum GoStage {
    Goroutine,
    Function,
    File,
}

/// The diagnostics of a whole shaped text (a tool's output read as one stream), and how many
/// more the bounded list left out.
pub(crate) fn extract(text: &str) -> (Vec<Diagnostic>, u64) {
    let mut extractor = Extractor::new(StreamName::Stdout, None);
    extractor.feed(text.as_bytes());
    extractor.finish();
    (extractor.found, extractor.omitted)
}

/// Finds diagnostics in one stream's shaped text.
pub(crate) struct Extractor {
    stream: StreamName,
    state: State,
    workspace_root: Option<String>,
    failures: Vec<String>,
    pub found: Vec<Diagnostic>,
    pub omitted: u64,
}

impl Extractor {
    pub fn new(stream: StreamName, workspace_root: Option<String>) -> Self {
        Self {
            stream,
            state: State::Idle,
            workspace_root,
            failures: Vec::new(),
            found: Vec::new(),
            omitted: 0,
        }
    }

    /// Feeds shaped text: whole lines, except possibly a piece of an over-long line. Which lines
    /// are read does not depend on how the text was divided into blocks.
    pub fn feed(&mut self, block: &[u8]) {
        let Some(triggers) = TRIGGERS.as_ref() else {
            return;
        };
        let mut pos = 0;
        while pos < block.len() {
            if matches!(self.state, State::Idle) {
                if pos == 0 {
                    let end = memchr::memchr(b'\n', block).unwrap_or(block.len());
                    if !is_trigger_line(&block[..end]) {
                        pos = end + 1;
                        continue;
                    }
                } else {
                    let from = pos - 1;
                    let Some(start) = triggers.find(&block[from..]) else {
                        return;
                    };
                    let at = from + start;
                    pos = if block[at] == b'\n' {
                        at + 1
                    } else {
                        memchr::memrchr(b'\n', &block[pos..at]).map_or(pos, |i| pos + i + 1)
                    };
                }
            }
            let end = memchr::memchr(b'\n', &block[pos..]).map_or(block.len(), |i| pos + i);
            if let Ok(line) = std::str::from_utf8(&block[pos..end]) {
                self.line(line);
            }
            pos = end + 1;
        }
    }

    /// Ends the stream: a frame still being read is recorded with what is known.
    pub fn finish(&mut self) {
        self.settle();
    }

    fn line(&mut self, line: &str) {
        match std::mem::replace(&mut self.state, State::Idle) {
            State::Idle => self.idle_line(line),
            State::Traceback {
                mut frames,
                mut inside,
                mut innermost,
            } => {
                if let Some(rest) = line.strip_prefix("  File \"") {
                    let loc = python_frame(rest);
                    frames += 1;
                    if self.in_workspace(&loc.file) {
                        inside = Some(loc.clone());
                    }
                    innermost = Some(loc);
                    self.state = State::Traceback {
                        frames,
                        inside,
                        innermost,
                    };
                } else if line.starts_with(' ') || line.is_empty() {
                    self.state = State::Traceback {
                        frames,
                        inside,
                        innermost,
                    };
                } else {
                    let (exception, message) = match line.split_once(": ") {
                        Some((name, msg)) if !name.contains(' ') => (name, msg),
                        _ => (line.trim_end_matches(':'), ""),
                    };
                    self.push(Diagnostic::PythonException {
                        stream: self.stream,
                        exception: clip(exception),
                        message: clip(message),
                        location: inside.or(innermost),
                        frames,
                    });
                }
            }
            State::RustcLocation { index, lines_left } => {
                if let Some(loc) = line.trim_start().strip_prefix("--> ") {
                    if let Some(Diagnostic::Rustc { location, .. }) = self.found.get_mut(index) {
                        *location = parse_location(loc.trim());
                    }
                } else if lines_left > 1 && !is_rustc_start(line) {
                    self.state = State::RustcLocation {
                        index,
                        lines_left: lines_left - 1,
                    };
                } else {
                    self.idle_line(line);
                }
            }
            State::RustPanicMessage {
                thread,
                location,
                mut message,
                lines_left,
            } => {
                let ends = line.is_empty()
                    || line.starts_with("note:")
                    || line.starts_with("stack backtrace:")
                    || line.starts_with("thread '");
                if !ends {
                    if !message.is_empty() {
                        message.push('\n');
                    }
                    message.push_str(line);
                }
                if ends || lines_left <= 1 {
                    self.push(Diagnostic::RustPanic {
                        stream: self.stream,
                        thread: clip(&thread),
                        message: clip(&message),
                        location,
                    });
                    if ends {
                        self.idle_line(line);
                    }
                } else {
                    self.state = State::RustPanicMessage {
                        thread,
                        location,
                        message,
                        lines_left: lines_left - 1,
                    };
                }
            }
            State::GoPanic {
                message,
                stage,
                function,
                lines_left,
            } => self.go_line(line, message, stage, function, lines_left),
        }
    }

    fn go_line(
        &mut self,
        line: &str,
        message: String,
        stage: GoStage,
        mut function: Option<String>,
        lines_left: u8,
    ) {
        let mut next = stage;
        match stage {
            GoStage::Goroutine if line.starts_with("goroutine ") => next = GoStage::Function,
            GoStage::Function if !line.is_empty() && !line.starts_with('\t') => {
                function = Some(line.to_string());
                next = GoStage::File;
            }
            GoStage::File if line.starts_with('\t') => {
                let frame = line.trim();
                let frame = frame.rsplit_once(" +0x").map_or(frame, |(f, _)| f);
                let func = function.take().unwrap_or_default();
                let in_runtime = func.starts_with("runtime.")
                    || func.starts_with("panic(")
                    || frame.contains("/src/runtime/");
                if !in_runtime {
                    let mut location = parse_location(frame);
                    if let Some(l) = location.as_mut() {
                        l.function = Some(clip(func.trim_end_matches("(...)")));
                    }
                    self.push(Diagnostic::GoPanic {
                        stream: self.stream,
                        message: clip(&message),
                        location,
                    });
                    return;
                }
                next = GoStage::Function;
            }
            _ => {}
        }
        if lines_left <= 1 {
            self.push(Diagnostic::GoPanic {
                stream: self.stream,
                message: clip(&message),
                location: None,
            });
            return;
        }
        self.state = State::GoPanic {
            message,
            stage: next,
            function,
            lines_left: lines_left - 1,
        };
    }

    fn idle_line(&mut self, line: &str) {
        if line.starts_with("Traceback (most recent call last)") {
            self.state = State::Traceback {
                frames: 0,
                inside: None,
                innermost: None,
            };
        } else if let Some(d) = self.rust_panic(line) {
            self.push(d);
        } else if let Some(msg) = line.strip_prefix("panic: ") {
            self.state = State::GoPanic {
                message: msg.trim_end_matches(" [recovered]").to_string(),
                stage: GoStage::Goroutine,
                function: None,
                lines_left: GO_FRAME_LINES_MAX,
            };
        } else if is_rustc_start(line) {
            self.rustc(line);
        } else if let Some(rest) = line.strip_prefix("test result: ") {
            self.cargo_summary(rest);
        } else if let Some(name) = line
            .strip_prefix("---- ")
            .and_then(|r| r.strip_suffix(" stdout ----"))
        {
            self.failure(name);
        } else if let Some(rest) = line.strip_prefix("FAILED ") {
            let name = rest.split(" - ").next().unwrap_or(rest);
            self.failure(name.trim());
        } else if line.starts_with('=') {
            self.pytest_summary(line);
        } else if let Some(d) = c_compiler(line, self.stream) {
            self.push(d);
        }
    }

    fn failure(&mut self, name: &str) {
        if self.failures.len() < FAILURE_NAMES_MAX {
            self.failures.push(clip(name));
        }
    }

    fn rustc(&mut self, line: &str) {
        let (severity, rest) = match line.strip_prefix("error") {
            Some(rest) => (Severity::Error, rest),
            None => (
                Severity::Warning,
                line.strip_prefix("warning").unwrap_or(line),
            ),
        };
        let (code, message) = match rest.strip_prefix('[') {
            Some(r) => match r.split_once("]: ") {
                Some((code, msg)) => (Some(code.to_string()), msg),
                None => return,
            },
            None => match rest.strip_prefix(": ") {
                Some(msg) => (None, msg),
                None => return,
            },
        };
        // Summaries of the diagnostics already reported.
        let summary = message.starts_with("aborting due to")
            || message.starts_with("could not compile")
            || message.starts_with("build failed")
            || (message.starts_with('`') && message.contains(" generated "))
            || message.contains("warnings emitted")
            || message.contains("warning emitted");
        if summary {
            return;
        }
        if let Some(index) = self.push(Diagnostic::Rustc {
            stream: self.stream,
            severity,
            code,
            message: clip(message),
            location: None,
        }) {
            self.state = State::RustcLocation {
                index,
                lines_left: RUSTC_LOCATION_LINES_MAX,
            };
        }
    }

    fn rust_panic(&mut self, line: &str) -> Option<Diagnostic> {
        let rest = line.strip_prefix("thread '")?;
        let (thread, rest) = rest.split_once('\'')?;
        let (_, after) = rest.split_once(" panicked at ")?;
        if let Some(old) = after.strip_prefix('\'') {
            // Old format: panicked at 'message', file:line:col
            let (message, loc) = old.rsplit_once("', ")?;
            return Some(Diagnostic::RustPanic {
                stream: self.stream,
                thread: clip(thread),
                message: clip(message),
                location: parse_location(loc.trim()),
            });
        }
        // New format: panicked at file:line:col: then the message on the following lines.
        self.state = State::RustPanicMessage {
            thread: thread.to_string(),
            location: parse_location(after.trim().trim_end_matches(':')),
            message: String::new(),
            lines_left: PANIC_MESSAGE_LINES_MAX,
        };
        None
    }

    fn cargo_summary(&mut self, rest: &str) {
        let counts = rest.split_once(". ").map_or("", |(_, c)| c);
        let mut passed = 0;
        let mut failed = 0;
        let mut skipped = 0;
        for part in counts.split("; ") {
            let mut words = part.split_whitespace();
            let (Some(n), Some(what)) = (words.next(), words.next()) else {
                continue;
            };
            let Ok(n) = n.parse::<u64>() else { continue };
            match what {
                "passed" => passed = n,
                "failed" => failed = n,
                "ignored" => skipped = n,
                _ => {}
            }
        }
        let failures = std::mem::take(&mut self.failures);
        self.push(Diagnostic::TestSummary {
            stream: self.stream,
            runner: TestRunner::CargoTest,
            passed,
            failed,
            skipped,
            errors: 0,
            failures,
        });
    }

    fn pytest_summary(&mut self, line: &str) {
        let inner = line.trim_matches(|c| c == '=' || c == ' ');
        let Some((counts, timing)) = inner.rsplit_once(" in ") else {
            return;
        };
        if !timing.starts_with(|c: char| c.is_ascii_digit()) {
            return;
        }
        let (mut passed, mut failed, mut skipped, mut errors) = (0, 0, 0, 0);
        let mut any = counts == "no tests ran";
        for part in counts.split(", ") {
            let Some((n, what)) = part.split_once(' ') else {
                continue;
            };
            let Ok(n) = n.parse::<u64>() else { continue };
            any = true;
            match what {
                "passed" => passed = n,
                "failed" => failed = n,
                "skipped" | "deselected" | "xfailed" | "xpassed" => skipped += n,
                "error" | "errors" => errors = n,
                _ => {}
            }
        }
        if !any {
            return;
        }
        let failures = std::mem::take(&mut self.failures);
        self.push(Diagnostic::TestSummary {
            stream: self.stream,
            runner: TestRunner::Pytest,
            passed,
            failed,
            skipped,
            errors,
            failures,
        });
    }

    /// Records a frame left open by the end of the stream.
    fn settle(&mut self) {
        match std::mem::replace(&mut self.state, State::Idle) {
            State::Traceback {
                frames,
                inside,
                innermost,
            } if frames > 0 => {
                self.push(Diagnostic::PythonException {
                    stream: self.stream,
                    exception: String::new(),
                    message: String::new(),
                    location: inside.or(innermost),
                    frames,
                });
            }
            State::RustPanicMessage {
                thread,
                location,
                message,
                ..
            } => {
                self.push(Diagnostic::RustPanic {
                    stream: self.stream,
                    thread: clip(&thread),
                    message: clip(&message),
                    location,
                });
            }
            State::GoPanic { message, .. } => {
                self.push(Diagnostic::GoPanic {
                    stream: self.stream,
                    message: clip(&message),
                    location: None,
                });
            }
            _ => {}
        }
    }

    /// Inside the workspace: under the configured root (relative paths always are); without a
    /// root, anything that is not the standard library or an installed package.
    fn in_workspace(&self, file: &str) -> bool {
        let library = file.contains("site-packages")
            || file.contains("dist-packages")
            || file.contains("/lib/python")
            || file.starts_with('<');
        if library {
            return false;
        }
        match &self.workspace_root {
            Some(root) if file.starts_with('/') => file.starts_with(root.as_str()),
            _ => true,
        }
    }

    /// Adds a diagnostic within [`DIAGNOSTICS_MAX`]; an error displaces the latest warning.
    /// Returns where it was stored, if it was.
    fn push(&mut self, d: Diagnostic) -> Option<usize> {
        if self.found.len() < DIAGNOSTICS_MAX {
            self.found.push(d);
            return Some(self.found.len() - 1);
        }
        self.omitted += 1;
        if is_warning(&d) {
            return None;
        }
        let i = self.found.iter().rposition(is_warning)?;
        self.found.remove(i);
        self.found.push(d);
        if let State::RustcLocation { index, .. } = &mut self.state
            && *index > i
        {
            *index -= 1;
        }
        Some(self.found.len() - 1)
    }
}

fn is_warning(d: &Diagnostic) -> bool {
    matches!(
        d,
        Diagnostic::Rustc {
            severity: Severity::Warning,
            ..
        } | Diagnostic::CCompiler {
            severity: Severity::Warning,
            ..
        }
    )
}

fn is_rustc_start(line: &str) -> bool {
    line.starts_with("error[")
        || line.starts_with("error: ")
        || line.starts_with("warning: ")
        || line.starts_with("warning[")
}

/// `path", line 12, in func` (after `  File "`).
fn python_frame(rest: &str) -> Location {
    let (file, rest) = rest.split_once('"').unwrap_or((rest, ""));
    let mut loc = Location {
        file: clip(file),
        ..Location::default()
    };
    if let Some(r) = rest.strip_prefix(", line ") {
        let (n, r) = r.split_once(',').unwrap_or((r, ""));
        loc.line = n.trim().parse().ok();
        if let Some(func) = r.trim().strip_prefix("in ") {
            loc.function = Some(clip(func));
        }
    }
    loc
}

/// A GCC/Clang `file:line[:col]: (fatal error|error|warning): message` line.
fn c_compiler(line: &str, stream: StreamName) -> Option<Diagnostic> {
    let (idx, sev_len, severity) = [
        (": fatal error: ", Severity::Error),
        (": error: ", Severity::Error),
        (": warning: ", Severity::Warning),
    ]
    .into_iter()
    .find_map(|(pat, sev)| line.find(pat).map(|i| (i, pat.len(), sev)))?;
    let location = parse_location(&line[..idx])?;
    location.line?;
    if location.file.contains(' ') || location.file.is_empty() {
        return None;
    }
    Some(Diagnostic::CCompiler {
        stream,
        severity,
        message: clip(&line[idx + sev_len..]),
        location,
    })
}

/// `file:line:col` or `file:line`.
fn parse_location(s: &str) -> Option<Location> {
    let mut parts = s.rsplitn(3, ':');
    let last = parts.next()?;
    let mid = parts.next()?;
    let (file, line, column) = match parts.next() {
        Some(file) => match (mid.parse().ok(), last.parse().ok()) {
            (Some(l), Some(c)) => (file, Some(l), Some(c)),
            _ => (s.rsplit_once(':')?.0, last.parse().ok(), None),
        },
        None => (mid, last.parse().ok(), None),
    };
    line?;
    Some(Location {
        file: clip(file),
        line,
        column,
        function: None,
    })
}

/// Cuts text to [`DIAGNOSTIC_TEXT_BYTES_MAX`] on a character boundary.
fn clip(s: &str) -> String {
    ring0_core::text::truncate_utf8(s, DIAGNOSTIC_TEXT_BYTES_MAX).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn extract(text: &str) -> Vec<Diagnostic> {
        let mut e = Extractor::new(StreamName::Stderr, None);
        e.feed(text.as_bytes());
        e.finish();
        e.found
    }

    fn loc(file: &str, line: u32, column: Option<u32>) -> Option<Location> {
        Some(Location {
            file: file.into(),
            line: Some(line),
            column,
            function: None,
        })
    }

    #[test]
    fn python_traceback_gives_exception_message_and_innermost_workspace_frame() {
        let text = "Traceback (most recent call last):\n  File \"app/main.py\", line 9, in <module>\n    run()\n  File \"app/main.py\", line 5, in run\n    json.loads(x)\n  File \"/usr/lib/python3.12/json/__init__.py\", line 346, in loads\n    return _default_decoder.decode(s)\nValueError: bad input\n";
        let d = extract(text);
        assert_eq!(
            d,
            vec![Diagnostic::PythonException {
                stream: StreamName::Stderr,
                exception: "ValueError".into(),
                message: "bad input".into(),
                location: Some(Location {
                    file: "app/main.py".into(),
                    line: Some(5),
                    column: None,
                    function: Some("run".into()),
                }),
                frames: 3,
            }]
        );
    }

    #[test]
    fn gcc_error_line_gives_file_line_column_and_message() {
        let d = extract(
            "main.c: In function 'main':\nmain.c:3:5: error: expected ';' before 'return'\n",
        );
        assert_eq!(
            d,
            vec![Diagnostic::CCompiler {
                stream: StreamName::Stderr,
                severity: Severity::Error,
                message: "expected ';' before 'return'".into(),
                location: loc("main.c", 3, Some(5)).unwrap(),
            }]
        );
    }

    #[test]
    fn rustc_error_takes_its_location_from_the_arrow_line() {
        let d = extract(
            "error[E0308]: mismatched types\n --> src/main.rs:2:18\n  |\nerror: aborting due to 1 previous error\n",
        );
        assert_eq!(
            d,
            vec![Diagnostic::Rustc {
                stream: StreamName::Stderr,
                severity: Severity::Error,
                code: Some("E0308".into()),
                message: "mismatched types".into(),
                location: loc("src/main.rs", 2, Some(18)),
            }]
        );
    }

    #[test]
    fn old_format_rust_panic_is_parsed() {
        let d = extract(
            "thread 'main' panicked at 'index out of bounds: the len is 4 but the index is 4', src/main.rs:3:5\n",
        );
        assert_eq!(
            d,
            vec![Diagnostic::RustPanic {
                stream: StreamName::Stderr,
                thread: "main".into(),
                message: "index out of bounds: the len is 4 but the index is 4".into(),
                location: loc("src/main.rs", 3, Some(5)),
            }]
        );
    }

    #[test]
    fn new_format_rust_panic_with_thread_id_takes_the_next_line_as_message() {
        let d = extract(
            "thread 'main' (4242) panicked at src/main.rs:3:5:\nboom\nnote: run with `RUST_BACKTRACE=1`\n",
        );
        assert_eq!(
            d,
            vec![Diagnostic::RustPanic {
                stream: StreamName::Stderr,
                thread: "main".into(),
                message: "boom".into(),
                location: loc("src/main.rs", 3, Some(5)),
            }]
        );
    }

    #[test]
    fn go_panic_points_at_the_first_frame_outside_the_runtime() {
        let text = "panic: runtime error: index out of range [5] with length 3\n\ngoroutine 1 [running]:\npanic({0x45e2a0?, 0xc000012018?})\n\t/usr/local/go/src/runtime/panic.go:779 +0x158\nmain.lookup(...)\n\t/home/u/app/main.go:8\nmain.main()\n\t/home/u/app/main.go:12 +0x1d\nexit status 2\n";
        let d = extract(text);
        assert_eq!(
            d,
            vec![Diagnostic::GoPanic {
                stream: StreamName::Stderr,
                message: "runtime error: index out of range [5] with length 3".into(),
                location: Some(Location {
                    file: "/home/u/app/main.go".into(),
                    line: Some(8),
                    column: None,
                    function: Some("main.lookup".into()),
                }),
            }]
        );
    }

    #[test]
    fn cargo_test_summary_carries_counts_and_failing_names() {
        let text = "---- tests::adds stdout ----\nthread 'tests::adds' (9) panicked at src/lib.rs:9:9:\nassertion failed\n\nfailures:\n    tests::adds\n\ntest result: FAILED. 3 passed; 1 failed; 2 ignored; 0 measured; 0 filtered out; finished in 0.00s\n";
        let d = extract(text);
        assert!(d.contains(&Diagnostic::TestSummary {
            stream: StreamName::Stderr,
            runner: TestRunner::CargoTest,
            passed: 3,
            failed: 1,
            skipped: 2,
            errors: 0,
            failures: vec!["tests::adds".into()],
        }));
    }

    #[test]
    fn pytest_summary_carries_counts_and_failing_names() {
        let text = "FAILED tests/test_a.py::test_x - assert 1 == 2\n==== 1 failed, 2 passed, 1 warning in 0.12s ====\n";
        let d = extract(text);
        assert_eq!(
            d,
            vec![Diagnostic::TestSummary {
                stream: StreamName::Stderr,
                runner: TestRunner::Pytest,
                passed: 2,
                failed: 1,
                skipped: 0,
                errors: 0,
                failures: vec!["tests/test_a.py::test_x".into()],
            }]
        );
    }

    #[test]
    fn the_list_is_bounded_and_errors_displace_warnings() {
        let mut text = String::new();
        for i in 0..DIAGNOSTICS_MAX {
            text.push_str(&format!("a.c:{}:1: warning: w{i}\n", i + 1));
        }
        text.push_str("a.c:99:1: error: the real problem\n");
        let mut e = Extractor::new(StreamName::Stderr, None);
        e.feed(text.as_bytes());
        assert_eq!(e.found.len(), DIAGNOSTICS_MAX);
        assert_eq!(e.omitted, 1);
        assert!(e.found.iter().any(|d| matches!(
            d,
            Diagnostic::CCompiler {
                severity: Severity::Error,
                ..
            }
        )));
    }

    #[test]
    fn ordinary_lines_mentioning_errors_are_not_diagnostics() {
        assert!(extract("0 errors found, all good\nno warnings\n").is_empty());
    }
}
