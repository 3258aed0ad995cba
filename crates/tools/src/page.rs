//! Pagination: at most [`PAGE_ENTRIES_MAX`] entries a page and a signed cursor for the rest.
//!
//! The cursor (see `ring0_shape::cursor`) carries where the listing stopped and a tag of the query
//! it belongs to; it is bound to the session's scope and expires. A cursor from another query,
//! another session, an edited one or an expired one is refused with a message telling the model
//! to start again.

use ring0_core::canonical::canonical_string;
use ring0_kernel::ToolError;
use ring0_shape::cursor::CursorSigner;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::time::SystemTime;

/// Most entries one page returns.
pub const PAGE_ENTRIES_MAX: usize = 200;
/// Bytes of JSON one page may take before it ends early with a cursor, so that a page of names
/// full of characters JSON must escape still fits what the model may be shown.
pub const PAGE_JSON_BYTES_MAX: usize = 40 * 1024;

/// Bytes `s` takes as a JSON string.
pub fn json_len(s: &str) -> usize {
    2 + s
        .bytes()
        .map(|b| match b {
            b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
            0..=0x1f => 6,
            _ => 1,
        })
        .sum::<usize>()
}

/// Payload layout: query tag (16 ASCII hex bytes) ‖ line (8 bytes, big-endian) ‖ the last path
/// returned, raw UTF-8 — raw, so names full of characters JSON would escape still fit.
const TAG_BYTES: usize = 16;
const HEADER_BYTES: usize = TAG_BYTES + 8;

/// Where a page resumes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resume {
    pub after: String,
    pub line: u64,
}

/// A tag for the query: the arguments other than `cursor` and `limit`.
pub fn query_tag(args: &Value) -> String {
    let mut query = args.clone();
    if let Some(map) = query.as_object_mut() {
        map.remove("cursor");
        map.remove("limit");
    }
    let text = canonical_string(&query).unwrap_or_else(|_| query.to_string());
    let digest = Sha256::digest(text.as_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

pub fn resume(
    signer: &CursorSigner,
    scope: &str,
    cursor: Option<&str>,
    tag: &str,
) -> Result<Option<Resume>, ToolError> {
    let Some(cursor) = cursor else {
        return Ok(None);
    };
    let payload = signer
        .verify(cursor, scope, SystemTime::now())
        .map_err(|e| ToolError::not_applied(e.to_string()))?;
    if payload.len() < HEADER_BYTES || &payload[..TAG_BYTES] != tag.as_bytes() {
        return Err(ToolError::not_applied(
            "cursor belongs to another query; repeat the same arguments with it, or start again without a cursor",
        ));
    }
    let mut line = [0u8; 8];
    line.copy_from_slice(&payload[TAG_BYTES..HEADER_BYTES]);
    let after = String::from_utf8(payload[HEADER_BYTES..].to_vec())
        .map_err(|_| ToolError::not_applied("cursor is not valid; start again without a cursor"))?;
    Ok(Some(Resume {
        after,
        line: u64::from_be_bytes(line),
    }))
}

/// Sets `next_cursor` on a page that has more, or — when the last path is too long for a
/// cursor — says so instead, so the page itself is still returned.
pub fn attach_cursor(
    out: &mut Value,
    signer: &CursorSigner,
    scope: &str,
    tag: &str,
    after: &str,
    line: u64,
) {
    let mut payload = Vec::with_capacity(HEADER_BYTES + after.len());
    payload.extend_from_slice(tag.as_bytes());
    payload.extend_from_slice(&line.to_be_bytes());
    payload.extend_from_slice(after.as_bytes());
    match signer.issue(scope, &payload, SystemTime::now()) {
        Ok(cursor) => out["next_cursor"] = Value::String(cursor),
        Err(e) => {
            out["more"] = Value::Bool(true);
            out["note"] = Value::String(format!(
                "more entries follow, but no cursor can resume after a path of {} bytes ({e}); list a narrower directory",
                after.len()
            ));
        }
    }
}
