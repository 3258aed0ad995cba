//! `read_spill`: pages of the full output a cut observation kept in the spill store.
//!
//! A truncation notice names a handle (`sha256:<hex>.<mac>`); this tool returns a page of it, by
//! byte offset and length or by line range, sanitized like any tool output. A handle is sealed
//! for the session (scope) whose call produced it, so a handle of another session, an edited one
//! or one evicted from the store is answered as unknown.

use crate::args_of;
use async_trait::async_trait;
use ring0_core::{Observation, ToolSpec};
use ring0_kernel::{CallContext, Tool, ToolError};
use ring0_shape::spill::SPILL_PAGE_BYTES_MAX;
use ring0_shape::{Cleaned, FramingDefense, SpillError, SpillStore, clean_text};
use serde::Deserialize;
use serde_json::{Value, json};
use std::sync::Arc;

/// Bytes one page returns unless the call asks for fewer or more.
pub const READ_SPILL_BYTES_DEFAULT: usize = 16 * 1024;
/// Most bytes one page returns: as much as still fits the largest observation a tool may
/// declare once JSON-escaped (which at most doubles it).
pub const READ_SPILL_BYTES_MAX: usize = 20 * 1024;
/// Model-visible budget of a page: its text JSON-escaped, with the page's position fields.
pub const READ_SPILL_OBSERVATION_BYTES: usize = READ_SPILL_BYTES_MAX * 2 + 4096;
const _: () = assert!(READ_SPILL_BYTES_MAX <= SPILL_PAGE_BYTES_MAX);
const _: () = assert!(READ_SPILL_OBSERVATION_BYTES <= ring0_core::limits::OBSERVATION_BYTES_MAX);
/// Most lines a line-range page asks for.
pub const READ_SPILL_LINES_MAX: u64 = 10_000;

pub struct ReadSpill {
    pub(crate) store: Arc<SpillStore>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadSpillArgs {
    handle: String,
    #[serde(default)]
    offset: Option<u64>,
    #[serde(default)]
    length: Option<usize>,
    #[serde(default)]
    line: Option<u64>,
    #[serde(default)]
    lines: Option<u64>,
}

impl ReadSpill {
    pub fn spec(&self) -> ToolSpec {
        ToolSpec::read(
            "read_spill",
            "Read the full output a cut tool result kept: give the `handle` its notice names \
             (sha256:…). Pages by byte `offset` and `length`, or by `line` (first line, from 1) \
             and `lines`; the answer says where the next page starts.",
            json!({
                "type": "object",
                "properties": {
                    "handle": {"type": "string", "description": "The spill handle from a truncation notice."},
                    "offset": {"type": "integer", "minimum": 0, "description": "Byte offset of the page (0 unless given)."},
                    "length": {"type": "integer", "minimum": 1, "maximum": READ_SPILL_BYTES_MAX, "default": READ_SPILL_BYTES_DEFAULT},
                    "line": {"type": "integer", "minimum": 1, "description": "First line of the page (instead of offset)."},
                    "lines": {"type": "integer", "minimum": 1, "maximum": READ_SPILL_LINES_MAX, "description": "Lines of the page (with line)."}
                },
                "required": ["handle"]
            }),
        )
        .observation_budget_bytes(READ_SPILL_OBSERVATION_BYTES)
        .deterministic(false)
    }

    /// The byte offset where 1-based `line` starts, scanning page by page.
    fn line_offset(&self, owner: &str, handle: &str, line: u64) -> Result<u64, ToolError> {
        let mut offset = 0u64;
        let mut seen = 1u64;
        while seen < line {
            let page = self
                .store
                .read_as(owner, handle, offset, SPILL_PAGE_BYTES_MAX)
                .map_err(spill_err)?;
            for (i, b) in page.bytes.iter().enumerate() {
                if *b == b'\n' {
                    seen += 1;
                    if seen == line {
                        return Ok(offset + i as u64 + 1);
                    }
                }
            }
            if page.eof {
                return Err(ToolError::not_applied(format!(
                    "the spill has {seen} lines; line {line} is past its end"
                )));
            }
            offset = page.next_offset();
        }
        Ok(0)
    }
}

fn spill_err(e: SpillError) -> ToolError {
    ToolError::not_applied(e.to_string())
}

#[async_trait]
impl Tool for ReadSpill {
    async fn call(&self, ctx: CallContext, args: Value) -> Result<Observation, ToolError> {
        let a: ReadSpillArgs = args_of(args)?;
        if a.line.is_some() && a.offset.is_some() {
            return Err(ToolError::not_applied("give `offset` or `line`, not both"));
        }
        if a.lines.is_some() && a.line.is_none() {
            return Err(ToolError::not_applied("`lines` needs `line`"));
        }
        let owner = &*ctx.scope;
        let length = a
            .length
            .unwrap_or(READ_SPILL_BYTES_DEFAULT)
            .clamp(1, READ_SPILL_BYTES_MAX);
        let offset = match a.line {
            Some(line) => self.line_offset(owner, &a.handle, line.max(1))?,
            None => a.offset.unwrap_or(0),
        };
        let page = self
            .store
            .read_as(owner, &a.handle, offset, length)
            .map_err(spill_err)?;
        let mut bytes = &page.bytes[..];
        if let Some(lines) = a.lines {
            let lines = lines.min(READ_SPILL_LINES_MAX);
            let end = bytes
                .iter()
                .enumerate()
                .filter(|(_, b)| **b == b'\n')
                .nth(lines.saturating_sub(1) as usize)
                .map_or(bytes.len(), |(i, _)| i + 1);
            bytes = &bytes[..end];
        }
        // A character the page cut at its end is left for the next page.
        let valid = match std::str::from_utf8(bytes) {
            Ok(_) => bytes.len(),
            Err(e) if e.error_len().is_none() && e.valid_up_to() > 0 => e.valid_up_to(),
            Err(_) => bytes.len(),
        };
        let bytes = &bytes[..valid];
        let mut cleaned = Cleaned::default();
        let text = clean_text(
            &String::from_utf8_lossy(bytes),
            &FramingDefense::default(),
            &mut cleaned,
        );
        let next = page.offset + bytes.len() as u64;
        let eof = next >= page.total_bytes;
        let mut value = json!({
            "handle": a.handle,
            "offset": page.offset,
            "bytes": bytes.len(),
            "total_bytes": page.total_bytes,
            "eof": eof,
            "text": text,
        });
        if !eof {
            value["next_offset"] = json!(next);
        }
        let mut obs = Observation::json(value);
        obs.invisible_removed = cleaned.invisible_removed;
        obs.framing_neutralized = cleaned.framing_neutralized;
        Ok(obs)
    }
}
