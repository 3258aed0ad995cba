//! Pagination: at most [`PAGE_ENTRIES_MAX`] entries a page and a signed cursor for the rest.
//!
//! The cursor (see `ring0_shape::cursor`) carries where the listing stopped and a tag of the query
//! it belongs to; it is bound to the session's scope and expires. A cursor from another query,
//! another session, an edited one or an expired one is refused with a message telling the model
//! to start again.

use ring0_core::canonical::canonical_string;
use ring0_kernel::ToolError;
use ring0_shape::cursor::CursorSigner;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::time::SystemTime;

/// Most entries one page returns.
pub const PAGE_ENTRIES_MAX: usize = 200;

#[derive(Serialize, Deserialize)]
struct Payload {
    /// Tag of the query.
    q: String,
    /// Last path returned.
    a: String,
    /// Last line number returned within that path (search only).
    #[serde(default)]
    n: u64,
}

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
    let payload: Payload = signer
        .verify_value(cursor, scope, SystemTime::now())
        .map_err(|e| ToolError::not_applied(e.to_string()))?;
    if payload.q != tag {
        return Err(ToolError::not_applied(
            "cursor belongs to another query; repeat the same arguments with it, or start again without a cursor",
        ));
    }
    Ok(Some(Resume {
        after: payload.a,
        line: payload.n,
    }))
}

pub fn issue(
    signer: &CursorSigner,
    scope: &str,
    tag: &str,
    after: &str,
    line: u64,
) -> Result<String, ToolError> {
    signer
        .issue_value(
            scope,
            &Payload {
                q: tag.to_string(),
                a: after.to_string(),
                n: line,
            },
            SystemTime::now(),
        )
        .map_err(|e| ToolError::not_applied(format!("could not issue a cursor: {e}")))
}
