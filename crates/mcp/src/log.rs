//! The gateway's log: one line per event, to a sink the host chooses (stderr for `ring0 serve`,
//! never stdout, which carries the MCP stdio transport).
//!
//! Every line is cleaned of escape sequences and control and invisible characters first: an
//! upstream's stderr is copied here, and must not drive the operator's terminal (colors, OSC 52
//! clipboard writes, hidden text).
//!
//! Secret values ring0 hands an upstream (tokens, headers and variables from the environment or
//! files) are registered with [`Log::redact`]: every line, whoever wrote it (ring0 or an
//! upstream's own stderr), has them replaced by [`REDACTED`] before it reaches the sink.

use std::sync::{Arc, RwLock};

/// What a registered secret value is replaced with in a log line.
pub const REDACTED: &str = "[redacted]";
/// Values shorter than this are not registered: masking every occurrence of two or three common
/// bytes would garble the log without hiding anything worth the name.
pub const REDACT_BYTES_MIN: usize = 4;
/// Most secret values registered; more are refused (the caller reports it).
pub const REDACTIONS_MAX: usize = 1024;

type Sink = Arc<dyn Fn(Severity, &str) + Send + Sync>;

/// How much a line matters to the person running ring0; a host's sink may filter on it (a
/// level flag) or write it as the line's level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// Detail: every tool of the catalog and the grant that decides it.
    Debug,
    /// What ring0 is doing: where it serves, its configuration, counts.
    Info,
    /// What a person acts on or should see whatever the level: approval codes, upstream
    /// failures and their own stderr, recoveries, refusals at start.
    Attention,
}

/// Where log lines go (cheap to clone; clones share the sink and the redactions).
#[derive(Clone)]
pub struct Log {
    sink: Sink,
    redactions: Arc<RwLock<Vec<String>>>,
}

impl Log {
    fn with_sink(sink: Sink) -> Self {
        Self {
            sink,
            redactions: Arc::new(RwLock::new(Vec::new())),
        }
    }

    /// Lines to standard error, prefixed `ring0:`, whatever their severity.
    pub fn stderr() -> Self {
        Self::with_sink(Arc::new(|_, line| eprintln!("ring0: {line}")))
    }

    /// Lines to a custom sink (tests, a file), whatever their severity.
    pub fn to(sink: impl Fn(&str) + Send + Sync + 'static) -> Self {
        Self::with_sink(Arc::new(move |_, line| sink(line)))
    }

    /// Lines to a sink that is told each line's [`Severity`] (a host's logger).
    pub fn leveled(sink: impl Fn(Severity, &str) + Send + Sync + 'static) -> Self {
        Self::with_sink(Arc::new(sink))
    }

    /// Discards everything.
    pub fn discard() -> Self {
        Self::with_sink(Arc::new(|_, _| {}))
    }

    /// Registers a secret value: no later line shows it. Returns `false` when it could not be
    /// registered (the table is full); a value shorter than [`REDACT_BYTES_MIN`] is ignored.
    pub fn redact(&self, value: &str) -> bool {
        if value.len() < REDACT_BYTES_MIN {
            return true;
        }
        let mut list = self.redactions.write().expect("redactions");
        if list.iter().any(|v| v == value) {
            return true;
        }
        if list.len() >= REDACTIONS_MAX {
            return false;
        }
        list.push(value.to_string());
        // Longest first, so a secret containing another is replaced whole.
        list.sort_by_key(|v| std::cmp::Reverse(v.len()));
        true
    }

    /// A line a person should see whatever the level ([`Severity::Attention`]).
    pub fn line(&self, line: &str) {
        self.write(Severity::Attention, line)
    }

    /// A line about what ring0 is doing ([`Severity::Info`]).
    pub fn info(&self, line: &str) {
        self.write(Severity::Info, line)
    }

    /// A line of detail ([`Severity::Debug`]).
    pub fn debug(&self, line: &str) {
        self.write(Severity::Debug, line)
    }

    /// Cleans and redacts `line`, then hands it to the sink.
    fn write(&self, severity: Severity, line: &str) {
        let cleaned;
        let line = if line.bytes().all(|b| (0x20..0x7f).contains(&b)) {
            line
        } else {
            let mut counts = ring0_shape::Cleaned::default();
            cleaned =
                ring0_shape::clean_text(line, &ring0_shape::FramingDefense::off(), &mut counts);
            cleaned.as_str()
        };
        let list = self.redactions.read().expect("redactions");
        if list.iter().any(|v| line.contains(v.as_str())) {
            let mut clean = line.to_string();
            for v in list.iter() {
                clean = clean.replace(v.as_str(), REDACTED);
            }
            drop(list);
            (self.sink)(severity, &clean)
        } else {
            drop(list);
            (self.sink)(severity, line)
        }
    }
}

impl std::fmt::Debug for Log {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Log")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn a_registered_secret_never_reaches_the_sink() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        let log = Log::to(move |l| sink.lock().unwrap().push(l.to_string()));
        assert!(log.redact("tok-123456"));
        log.clone()
            .line("[up] env: API_KEY=tok-123456 and again tok-123456");
        log.line("nothing here");
        log.line("\u{1b}]52;c;ZXZpbA==\u{7}copied\u{202E}");
        assert_eq!(
            *seen.lock().unwrap(),
            vec![
                "[up] env: API_KEY=[redacted] and again [redacted]".to_string(),
                "nothing here".to_string(),
                "copied".to_string()
            ]
        );
    }
}
