//! The gateway's log: one line per event, to a sink the host chooses (stderr for `ring0 serve`,
//! never stdout, which carries the MCP stdio transport).

use std::sync::Arc;

/// Where log lines go.
#[derive(Clone)]
pub struct Log(Arc<dyn Fn(&str) + Send + Sync>);

impl Log {
    /// Lines to standard error, prefixed `ring0:`.
    pub fn stderr() -> Self {
        Self(Arc::new(|line| eprintln!("ring0: {line}")))
    }

    /// Lines to a custom sink (tests, a file).
    pub fn to(sink: impl Fn(&str) + Send + Sync + 'static) -> Self {
        Self(Arc::new(sink))
    }

    /// Discards everything.
    pub fn discard() -> Self {
        Self(Arc::new(|_| {}))
    }

    pub fn line(&self, line: &str) {
        (self.0)(line)
    }
}

impl std::fmt::Debug for Log {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Log")
    }
}
