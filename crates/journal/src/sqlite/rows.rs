//! The `intents` row and the record it stores: the column list, the row a new proposal inserts,
//! the compare-and-set update of a changed record, and the parse of a row back into an
//! [`IntentRecord`].
//!
//! A row that does not parse is corruption, reported with the record's id, never skipped or
//! guessed at. Arguments larger than [`ARGS_INLINE_BYTES_MAX`] live in the spill directory (see
//! the `files` module), written and fsynced before the row that names them commits, and checked
//! against their digest when read.

use super::files::{Files, read_spill, spill};
use super::requests::PreparedProposal;
use crate::JournalError;
use crate::limits::{ARGS_INLINE_BYTES_MAX, CLIENT_KEYS_PER_PRINCIPAL_MAX};
use crate::record::{IntentId, IntentRecord};
use ring0_core::{IntentState, SemanticKey};
use rusqlite::{Connection, Row, params};

/// The columns `from_row` reads, as a macro so statements are built with `concat!` at compile
/// time (no string formatting per request).
macro_rules! cols {
    () => {
        "id, semantic_key, scope, attempt_epoch, tool, args_sha256, args_bytes, args_inline, \
         call_ids, idempotency_key, mutating, fence, attempts, state, timeline, receipt, \
         snapshot, owner, attempt, delivered_ms, client_principal, client_key"
    };
}

pub(crate) use cols;

const INSERT_INTENT: &str = concat!(
    "INSERT INTO intents (",
    cols!(),
    ", content_digest, created_ms, updated_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, \
     ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, NULL, ?20, ?21, ?22, ?23, ?23)"
);

pub(crate) fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

pub(crate) fn json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("journal values serialize")
}

/// Inserts a proposal's new record, its columns prepared on the caller's thread, and returns
/// its `seq`. Its key-index entries are the caller's to stage: nothing here touches the index
/// tables.
pub(crate) fn insert_fresh(
    conn: &Connection,
    files: &Files,
    prepared: &PreparedProposal,
) -> Result<i64, JournalError> {
    let stored = (
        prepared.fresh_id.as_str(),
        prepared.fresh_call_ids.as_str(),
        prepared.fresh_timeline.as_str(),
    );
    insert_row(conn, files, prepared, &prepared.fresh, stored)
}

/// Inserts `r`, the next attempt of `prepared`'s logical call, and returns its `seq`.
pub(crate) fn insert_attempt(
    conn: &Connection,
    files: &Files,
    prepared: &PreparedProposal,
    r: &IntentRecord,
) -> Result<i64, JournalError> {
    let (id, call_ids, timeline) = (r.id.to_string(), json(&r.call_ids), json(&r.timeline));
    insert_row(conn, files, prepared, r, (&id, &call_ids, &timeline))
}

/// Inserts a new record of `prepared`'s proposal; `stored` is its id, call ids and timeline
/// in their stored form.
fn insert_row(
    conn: &Connection,
    files: &Files,
    prepared: &PreparedProposal,
    r: &IntentRecord,
    stored: (&str, &str, &str),
) -> Result<i64, JournalError> {
    let (id_text, call_ids_text, timeline_text) = stored;
    let sha = &prepared.args_sha256;
    let inline = if r.canonical_args.len() > ARGS_INLINE_BYTES_MAX {
        spill(files, sha, r.canonical_args.as_bytes())?;
        None
    } else {
        Some(r.canonical_args.as_str())
    };
    conn.prepare_cached(INSERT_INTENT)
        .and_then(|mut stmt| {
            stmt.execute(params![
                id_text,
                prepared.key_text,
                r.scope,
                to_i64(r.attempt_epoch),
                r.tool,
                sha,
                r.canonical_args.len() as i64,
                inline,
                call_ids_text,
                r.idempotency_key,
                r.mutating,
                to_i64(r.fence),
                r.attempts,
                r.state.as_str(),
                timeline_text,
                None::<&str>,
                None::<&str>,
                to_i64(r.owner),
                r.attempt,
                crate::record::principal_column(r),
                r.client_key.as_ref().map(|k| k.key.as_str()),
                prepared.content_hex,
                to_i64(prepared.fresh_ms),
            ])
        })
        .map_err(|e| files.sql(e))?;
    Ok(conn.last_insert_rowid())
}

/// Writes a changed record if its fence is still `expected_fence` (the compare-and-set, checked
/// again in SQL so no code path can skip it).
pub(crate) fn update(
    conn: &Connection,
    files: &Files,
    r: &IntentRecord,
    expected_fence: u64,
    now: u64,
) -> Result<(), JournalError> {
    let changed = conn
        .prepare_cached(
            "UPDATE intents SET call_ids = ?1, fence = ?2, attempts = ?3, state = ?4,
               timeline = ?5, receipt = ?6, snapshot = ?7, updated_ms = ?8, owner = ?11
             WHERE id = ?9 AND fence = ?10",
        )
        .and_then(|mut stmt| {
            stmt.execute(params![
                json(&r.call_ids),
                to_i64(r.fence),
                r.attempts,
                r.state.as_str(),
                json(&r.timeline),
                r.receipt.as_ref().map(json),
                r.snapshot.as_ref().map(json),
                to_i64(now),
                r.id.to_string(),
                to_i64(expected_fence),
                to_i64(r.owner),
            ])
        })
        .map_err(|e| files.sql(e))?;
    if changed != 1 {
        return Err(JournalError::StaleFence {
            id: r.id,
            expected: expected_fence,
            actual: r.fence,
        });
    }
    Ok(())
}

/// Builds a record from a row; anything that does not parse is corruption, reported with the id.
pub(crate) fn from_row(row: &Row<'_>, files: &Files) -> Result<IntentRecord, JournalError> {
    let id_text: String = row.get(0).map_err(|e| files.sql(e))?;
    let bad = |what: &str| files.corrupt(format!("record {id_text}: malformed {what}"));
    let text = |i: usize, what: &str| -> Result<String, JournalError> {
        row.get::<_, String>(i).map_err(|_| bad(what))
    };
    let opt_text = |i: usize, what: &str| -> Result<Option<String>, JournalError> {
        row.get::<_, Option<String>>(i).map_err(|_| bad(what))
    };
    let int = |i: usize, what: &str| -> Result<i64, JournalError> {
        row.get::<_, i64>(i).map_err(|_| bad(what))
    };
    let id = IntentId::parse_str(&id_text).map_err(|_| bad("id"))?;
    let semantic_key =
        SemanticKey::decode(&text(1, "semantic key")?).ok_or_else(|| bad("semantic key"))?;
    let sha = text(5, "argument digest")?;
    let args_bytes = int(6, "argument length")?;
    let canonical_args = match opt_text(7, "arguments")? {
        Some(inline) => inline,
        None => read_spill(files, &id_text, &sha, args_bytes)?,
    };
    let state_text = text(13, "state")?;
    let parse_json = |i: usize, what: &str| -> Result<Option<serde_json::Value>, JournalError> {
        opt_text(i, what)?
            .map(|t| serde_json::from_str(&t).map_err(|_| bad(what)))
            .transpose()
    };
    let (principal, client_key) = crate::record::ClientKey::from_columns(
        opt_text(20, "client principal")?,
        opt_text(21, "client key")?,
    )
    .ok_or_else(|| bad("client key"))?;
    Ok(IntentRecord {
        id,
        semantic_key,
        scope: text(2, "scope")?,
        attempt_epoch: u64::try_from(int(3, "epoch")?).map_err(|_| bad("epoch"))?,
        tool: text(4, "tool")?,
        canonical_args,
        call_ids: serde_json::from_str(&text(8, "call ids")?).map_err(|_| bad("call ids"))?,
        idempotency_key: text(9, "idempotency key")?,
        mutating: int(10, "mutating flag")? != 0,
        fence: u64::try_from(int(11, "fence")?).map_err(|_| bad("fence"))?,
        attempts: u32::try_from(int(12, "attempts")?).map_err(|_| bad("attempts"))?,
        state: IntentState::parse(&state_text).ok_or_else(|| bad("state"))?,
        timeline: serde_json::from_str(&text(14, "timeline")?).map_err(|_| bad("timeline"))?,
        receipt: parse_json(15, "receipt")?
            .map(serde_json::from_value)
            .transpose()
            .map_err(|_| bad("receipt"))?,
        snapshot: parse_json(16, "snapshot")?,
        owner: u64::try_from(int(17, "owner")?).map_err(|_| bad("owner"))?,
        attempt: u32::try_from(int(18, "attempt")?).map_err(|_| bad("attempt"))?,
        delivered: row
            .get::<_, Option<i64>>(19)
            .map_err(|_| bad("delivery"))?
            .is_some(),
        principal,
        client_key,
    })
}

/// Marks a record delivered (no fence change: delivery is not a state of the record). A record
/// that is gone is no error: the delivery of nothing needs no record.
pub(crate) fn mark_delivered(
    conn: &Connection,
    files: &Files,
    id: &IntentId,
    now: u64,
) -> Result<(), JournalError> {
    conn.prepare_cached(
        "UPDATE intents SET delivered_ms = ?1 WHERE id = ?2 AND delivered_ms IS NULL",
    )
    .and_then(|mut stmt| stmt.execute(params![to_i64(now), id.to_string()]))
    .map_err(|e| files.sql(e))?;
    Ok(())
}

/// Binds a caller's key to the record at `seq`, and forgets the principal's oldest keys beyond
/// [`CLIENT_KEYS_PER_PRINCIPAL_MAX`]: two statements, run in the job's savepoint.
pub(crate) fn bind_client_key(
    conn: &Connection,
    files: &Files,
    key: &crate::record::ClientKey,
    seq: i64,
    now: u64,
) -> Result<(), JournalError> {
    conn.prepare_cached(
        "INSERT INTO client_keys (principal, client_key, intent_seq, bound_ms)
         VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT(principal, client_key) DO UPDATE SET
           intent_seq = excluded.intent_seq, bound_ms = excluded.bound_ms",
    )
    .and_then(|mut stmt| stmt.execute(params![key.principal, key.key, seq, to_i64(now)]))
    .map_err(|e| files.sql(e))?;
    conn.prepare_cached(
        "DELETE FROM client_keys WHERE principal = ?1 AND client_key IN (
           SELECT client_key FROM client_keys WHERE principal = ?1
           ORDER BY bound_ms, client_key
           LIMIT max(0, (SELECT count(*) FROM client_keys WHERE principal = ?1) - ?2))",
    )
    .and_then(|mut stmt| stmt.execute(params![key.principal, CLIENT_KEYS_PER_PRINCIPAL_MAX as i64]))
    .map_err(|e| files.sql(e))?;
    Ok(())
}

/// The record a caller's key names, if the key is bound.
pub(crate) fn by_client_key(
    conn: &Connection,
    files: &Files,
    key: &crate::record::ClientKey,
) -> Result<Option<IntentRecord>, JournalError> {
    super::reads::load_one(
        conn,
        files,
        concat!(
            "SELECT ",
            cols!(),
            " FROM intents WHERE seq = (SELECT intent_seq FROM client_keys
               WHERE principal = ?1 AND client_key = ?2)"
        ),
        params![key.principal, key.key],
    )
}
