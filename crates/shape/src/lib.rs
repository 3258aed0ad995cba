//! Observation shaping: what a tool printed, made fit for a model to read.
//!
//! This crate owns the `shape` stage of a call. It turns untrusted tool output — a process's
//! stdout and stderr as they stream, a whole text, an MCP content array — into an
//! [`Observation`]: sanitized (escape sequences parsed and removed, control and invisible
//! characters dropped, progress redraws collapsed to their final lines, secrets redacted), bounded (a byte budget
//! with head, tail and a counting tombstone; the full raw output spilled to a content-addressed
//! store), and typed (exit status as reported, diagnostics extracted, token counts, provenance).
//! It also signs the pagination cursors structured tools hand out.
//!
//! It must never run a tool, talk to a network or trust its input: every byte it reads is
//! untrusted, every buffer it holds is bounded by its configuration, and no input makes it panic.
//! It depends on `ring0-core` only among ring0 crates.
//!
//! Entry points:
//! - [`StreamShaper`]: `new(config)`, `push(Stream::Stdout | Stream::Stderr, &[u8])`,
//!   `finish(ExitInfo) -> Observation` — for process output (`ring0-exec`);
//! - [`shape_bytes`] / [`shape_reader`]: a whole text or a reader (the `ring0 shape` command),
//!   with [`render`] for its text or JSON output;
//! - [`shape_mcp_content`]: an MCP `tools/call` result's content array and structured content;
//! - [`clean_text`] / [`clean_value`]: text an MCP server gives outside a result (definitions,
//!   prompts, resources, instructions) sanitized and framing-neutralized, unbounded;
//! - [`shape_observation`]: any finished observation (the kernel's `shape` stage), idempotent;
//! - [`Redactor`]: secret redaction (private keys, tokens, credentials, host-marked values),
//!   applied by every entry point above;
//! - [`read_spill`]: pages of a spilled stream;
//! - [`CursorSigner`]: signed, expiring, session-bound pagination cursors and page ceilings.

mod budget;
pub mod config;
pub mod cursor;
mod diagnostics;
pub mod framing;
pub mod keyfile;
pub mod mcp;
pub mod observation;
pub mod redact;
mod sanitize;
mod screen;
pub mod spill;
mod stream;
pub mod tokens;

use std::io::{self, Read};

pub use config::{ConfigError, ShapeConfig};
pub use cursor::{CursorError, CursorSigner, PageSize, clamp_page_size};
pub use framing::FramingDefense;
pub use mcp::{Cleaned, clean_text, clean_value, shape_mcp_content};
pub use observation::{Shaping, SpillTarget, serialized_len, shape_observation, shape_text};
pub use redact::{RedactError, Redactor};
pub use ring0_core::Observation;
pub use spill::{SpillError, SpillPage, SpillStore, read_spill};
pub use stream::{ExitInfo, Stream, StreamShaper};

/// Size of the reads [`shape_reader`] makes.
pub const READ_CHUNK_BYTES: usize = 64 * 1024;

/// Shapes a whole text (treated as standard output, no exit status).
pub fn shape_bytes(bytes: &[u8], config: &ShapeConfig) -> Result<Observation, ConfigError> {
    let mut shaper = StreamShaper::new(config.clone())?;
    shaper.push(Stream::Stdout, bytes);
    Ok(shaper.finish(ExitInfo::none()))
}

/// What can go wrong shaping a reader.
#[derive(Debug, thiserror::Error)]
pub enum ShapeError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("reading input: {0}")]
    Read(#[from] io::Error),
}

/// Shapes everything `reader` yields, read in [`READ_CHUNK_BYTES`] chunks, as standard output —
/// what `ring0 shape` does with its standard input. Memory stays bounded whatever the input size.
pub fn shape_reader<R: Read>(
    mut reader: R,
    config: &ShapeConfig,
) -> Result<Observation, ShapeError> {
    let mut shaper = StreamShaper::new(config.clone())?;
    let mut buf = vec![0u8; READ_CHUNK_BYTES];
    loop {
        match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => shaper.push(Stream::Stdout, &buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(shaper.finish(ExitInfo::none()))
}

/// Output form of [`render`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputFormat {
    /// The model-visible text.
    Text,
    /// The whole envelope as pretty-printed JSON.
    Json,
}

/// Renders an observation for the `ring0 shape` command: its model-visible text, or the whole
/// envelope as JSON. Ends with a newline.
pub fn render(observation: &Observation, format: OutputFormat) -> String {
    match format {
        OutputFormat::Text => {
            let mut s = observation.text.clone();
            if !s.is_empty() && !s.ends_with('\n') {
                s.push('\n');
            }
            s
        }
        OutputFormat::Json => {
            let mut s = serde_json::to_string_pretty(observation)
                .unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"));
            s.push('\n');
            s
        }
    }
}
