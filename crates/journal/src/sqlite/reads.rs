//! Reads: the record queries, the reader threads that run them for an open journal, and
//! [`JournalReader`], which runs them on a file another process may be writing.
//!
//! An open [`super::SqliteJournal`] sends each read to a small pool of reader threads, each
//! with its own `query_only` connection: WAL lets them read while the writer commits, and a
//! slow read never holds up a commit. Every record comes back through `rows::from_row`, so a
//! damaged row is reported the same way whoever reads it.

use super::files::Files;
use super::rows::{cols, from_row};
use super::schema::{APPLICATION_ID, configure_reader, open_connection};
use crate::JournalError;
use crate::hold::{HOLDS_LISTED_MAX, HeldCall};
use crate::limits::RECENT_LIMIT_MAX;
use crate::memo::MemoEntry;
use crate::record::{IntentId, IntentRecord};
use ring0_core::Observation;
use rusqlite::{Connection, OptionalExtension};
use std::path::Path;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// A read, run on a reader thread's connection.
pub(crate) type ReadJob = Box<dyn FnOnce(&Connection, &Files) + Send>;

/// States a record can leave: what `open_records` returns.
macro_rules! open_states {
    () => {
        "('PROPOSED','RECORDED','DISPATCHED','UNKNOWN','RECONCILING')"
    };
}

const SELECT_BY_ID: &str = concat!("SELECT ", cols!(), " FROM intents WHERE id = ?1");
const SELECT_BY_SEQ: &str = concat!("SELECT ", cols!(), " FROM intents WHERE seq = ?1");
const SELECT_OPEN: &str = concat!(
    "SELECT ",
    cols!(),
    " FROM intents WHERE state IN ",
    open_states!(),
    " ORDER BY seq"
);
const SELECT_RECENT: &str = concat!(
    "SELECT ",
    cols!(),
    " FROM intents ORDER BY seq DESC LIMIT ?1"
);

/// Starts `readers` reader threads (at least one), each with its own `query_only` connection,
/// sharing one queue: the returned sender. They end once it is dropped.
pub(crate) fn spawn_readers(
    files: &Files,
    readers: usize,
) -> Result<(Sender<ReadJob>, Vec<JoinHandle<()>>), JournalError> {
    let (tx, rx) = mpsc::channel::<ReadJob>();
    let rx = Arc::new(Mutex::new(rx));
    let mut threads = Vec::new();
    for n in 0..readers.max(1) {
        let conn = open_connection(files, false)?;
        configure_reader(&conn, files)?;
        let (rx, files) = (rx.clone(), files.clone());
        threads.push(
            std::thread::Builder::new()
                .name(format!("ring0-journal-reader-{n}"))
                .spawn(move || reader_loop(conn, files, rx))
                .map_err(|e| JournalError::Storage(format!("starting a reader thread: {e}")))?,
        );
    }
    Ok((tx, threads))
}

/// A reader thread: runs reads from the shared queue until it closes.
fn reader_loop(conn: Connection, files: Files, rx: Arc<Mutex<Receiver<ReadJob>>>) {
    loop {
        let job = {
            let rx = rx.lock().unwrap_or_else(|e| e.into_inner());
            rx.recv()
        };
        match job {
            Ok(job) => job(&conn, &files),
            Err(_) => return,
        }
    }
}

/// The record with this id, if any.
pub(crate) fn load_by_id(
    conn: &Connection,
    files: &Files,
    id: &IntentId,
) -> Result<Option<IntentRecord>, JournalError> {
    let mut buf = uuid::Uuid::encode_buffer();
    let text: &str = id.hyphenated().encode_lower(&mut buf);
    load_one(conn, files, SELECT_BY_ID, [text])
}

/// Records in states they can leave, oldest first: what recovery re-examines.
pub(crate) fn open_records(
    conn: &Connection,
    files: &Files,
) -> Result<Vec<IntentRecord>, JournalError> {
    load_many(conn, files, SELECT_OPEN, [])
}

/// How many records are in each state. One aggregate over the `state` column: cheap enough
/// for every scrape of the metrics endpoint.
pub(crate) fn count_by_state(
    conn: &Connection,
    files: &Files,
) -> Result<Vec<(ring0_core::IntentState, u64)>, JournalError> {
    let mut statement = conn
        .prepare_cached("SELECT state, COUNT(*) FROM intents GROUP BY state")
        .map_err(|e| files.sql(e))?;
    let rows = statement
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
        .map_err(|e| files.sql(e))?;
    let mut counts = Vec::new();
    for row in rows {
        let (state, count) = row.map_err(|e| files.sql(e))?;
        let state = ring0_core::IntentState::parse(&state)
            .ok_or_else(|| files.corrupt(format!("a record in the unknown state {state:?}")))?;
        counts.push((state, u64::try_from(count).unwrap_or(0)));
    }
    Ok(counts)
}

/// The record a key-index entry names. Rows are never deleted and an entry joins the index only
/// with its row, so a missing row means the file was changed behind the journal's back.
pub(crate) fn load_indexed(
    conn: &Connection,
    files: &Files,
    seq: i64,
) -> Result<IntentRecord, JournalError> {
    load_one(conn, files, SELECT_BY_SEQ, [seq])?
        .ok_or_else(|| files.corrupt(format!("the key index names intent seq {seq}, not found")))
}

/// The most recent records, newest first, at most `limit`.
pub(crate) fn recent(
    conn: &Connection,
    files: &Files,
    limit: i64,
) -> Result<Vec<IntentRecord>, JournalError> {
    load_many(conn, files, SELECT_RECENT, [limit])
}

/// The first record `sql` selects, if any.
pub(crate) fn load_one<P: rusqlite::Params>(
    conn: &Connection,
    files: &Files,
    sql: &str,
    params: P,
) -> Result<Option<IntentRecord>, JournalError> {
    let mut stmt = conn.prepare_cached(sql).map_err(|e| files.sql(e))?;
    let mut rows = stmt.query(params).map_err(|e| files.sql(e))?;
    match rows.next().map_err(|e| files.sql(e))? {
        Some(row) => Ok(Some(from_row(row, files)?)),
        None => Ok(None),
    }
}

/// Every record `sql` selects, in its order.
pub(crate) fn load_many<P: rusqlite::Params>(
    conn: &Connection,
    files: &Files,
    sql: &str,
    params: P,
) -> Result<Vec<IntentRecord>, JournalError> {
    let mut stmt = conn.prepare_cached(sql).map_err(|e| files.sql(e))?;
    let mut rows = stmt.query(params).map_err(|e| files.sql(e))?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().map_err(|e| files.sql(e))? {
        out.push(from_row(row, files)?);
    }
    Ok(out)
}

/// The held call with this approval id.
pub(crate) fn load_hold(
    conn: &Connection,
    files: &Files,
    approval_id: &str,
) -> Result<Option<HeldCall>, JournalError> {
    let mut stmt = conn
        .prepare_cached("SELECT body FROM held_calls WHERE approval_id = ?1")
        .map_err(|e| files.sql(e))?;
    let mut rows = stmt.query([approval_id]).map_err(|e| files.sql(e))?;
    match rows.next().map_err(|e| files.sql(e))? {
        Some(row) => Ok(Some(hold_from_text(
            files,
            &row.get::<_, String>(0).map_err(|e| files.sql(e))?,
        )?)),
        None => Ok(None),
    }
}

/// Pending held calls, oldest first, at most [`HOLDS_LISTED_MAX`].
pub(crate) fn load_holds_pending(
    conn: &Connection,
    files: &Files,
) -> Result<Vec<HeldCall>, JournalError> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT body FROM held_calls WHERE state = 'PENDING'
             ORDER BY created_ms, approval_id LIMIT ?1",
        )
        .map_err(|e| files.sql(e))?;
    let mut rows = stmt
        .query([HOLDS_LISTED_MAX as i64])
        .map_err(|e| files.sql(e))?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().map_err(|e| files.sql(e))? {
        out.push(hold_from_text(
            files,
            &row.get::<_, String>(0).map_err(|e| files.sql(e))?,
        )?);
    }
    Ok(out)
}

fn hold_from_text(files: &Files, text: &str) -> Result<HeldCall, JournalError> {
    serde_json::from_str(text).map_err(|e| JournalError::Corrupt {
        path: files.db.clone(),
        detail: format!("a held call does not parse: {e}"),
    })
}

/// The memoized observation stored under `fingerprint`, if it is at most `max_age_ms` old at
/// `now_ms` (see [`crate::memo`]).
pub(crate) fn load_memo(
    conn: &Connection,
    files: &Files,
    fingerprint: &str,
    now_ms: u64,
    max_age_ms: u64,
) -> Result<Option<Observation>, JournalError> {
    let row = conn
        .query_row(
            "SELECT observation, stored_ms FROM memo WHERE fingerprint = ?1",
            [fingerprint],
            |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)),
        )
        .optional()
        .map_err(|e| files.sql(e))?;
    Ok(row.and_then(|(text, at)| {
        MemoEntry {
            text,
            stored_ms: u64::try_from(at).unwrap_or(u64::MAX),
        }
        .serve(now_ms, max_age_ms)
    }))
}

/// A read-only view of a journal file, for inspection (`ring0 journal ls|show`) while a host may
/// hold the write lock. It takes no lock, runs no migration and never writes.
pub struct JournalReader {
    conn: Connection,
    files: Files,
}

impl JournalReader {
    /// Opens the journal at `path` for reading. A missing file, or one that is not a ring0
    /// journal, is an error; nothing is created.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, JournalError> {
        let files = Files::new(path.as_ref());
        if !files.db.exists() {
            return Err(JournalError::Storage(format!(
                "no journal at {}",
                files.db.display()
            )));
        }
        let conn = open_connection(&files, false)?;
        configure_reader(&conn, &files)?;
        let app: i64 = conn
            .query_row("PRAGMA application_id", [], |r| r.get(0))
            .map_err(|e| files.sql(e))?;
        if app != APPLICATION_ID {
            return Err(files.corrupt(format!("not a ring0 journal (application_id {app:#x})")));
        }
        Ok(Self { conn, files })
    }

    /// The most recent records, newest first.
    pub fn recent(&self, limit: usize) -> Result<Vec<IntentRecord>, JournalError> {
        let limit = i64::try_from(limit.min(RECENT_LIMIT_MAX)).unwrap_or(0);
        recent(&self.conn, &self.files, limit)
    }

    /// How many records are in each state (states without records left out).
    pub fn count_by_state(&self) -> Result<Vec<(ring0_core::IntentState, u64)>, JournalError> {
        count_by_state(&self.conn, &self.files)
    }

    /// The record whose id is `id`, or the only one whose id starts with `id` (at least 4
    /// characters). An ambiguous prefix is an error naming how many matched.
    pub fn find(&self, id: &str) -> Result<Option<IntentRecord>, JournalError> {
        if let Ok(full) = IntentId::parse_str(id) {
            return load_by_id(&self.conn, &self.files, &full);
        }
        if id.len() < 4 || !id.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            return Err(JournalError::Storage(format!(
                "{id:?} is not an intent id or an id prefix of at least 4 hex digits"
            )));
        }
        let pattern = format!("{}%", id.to_ascii_lowercase());
        let mut found = load_many(
            &self.conn,
            &self.files,
            concat!(
                "SELECT ",
                cols!(),
                " FROM intents WHERE id LIKE ?1 ORDER BY seq LIMIT 2"
            ),
            [pattern],
        )?;
        match found.len() {
            0 => Ok(None),
            1 => Ok(found.pop()),
            _ => Err(JournalError::Storage(format!(
                "id prefix {id:?} matches more than one intent"
            ))),
        }
    }
}
