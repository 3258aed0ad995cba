//! The log of new intents: a group commit records all its new intents in one row.
//!
//! A new intent used to be a row inserted into `intents` inside its batch: a B-tree insert and
//! two index updates, about 3.5 µs of the writer's time each — most of the time a 64-intent
//! batch spent deciding (timers around the insert in `cargo bench -p ring0-journal --bench
//! commit`: about 220 of 250 µs) — and most of its WAL frames. Now a batch writes the rows of
//! its new intents as one JSON array of row images, one row of `intent_log`, and the writer
//! copies them into `intents` later ("materializes" them):
//!
//! - when it is idle (after [`KEY_INDEX_FOLD_IDLE_MS`](crate::limits::KEY_INDEX_FOLD_IDLE_MS)
//!   without a request), [`FRESH_LOG_FOLD_CHUNK`] intents per transaction;
//! - when a request is about to change one of them (a transition, or a decision that updates
//!   the record it found): that one, in the request's transaction, before the `UPDATE`;
//! - inside a batch, the oldest rows, when the log would hold more than [`FRESH_LOG_BYTES_MAX`];
//! - before the key index folds entries of intents still in the log (its tables reference
//!   `intents`);
//! - at a clean close, and at open (whatever a crash left in the log).
//!
//! Materializing is `INSERT OR IGNORE`: an intent already copied (and perhaps changed since)
//! keeps its row, so copying twice is harmless, and a log row is deleted once every intent in it
//! is in `intents`. Readers never see an intent twice: they take an image only when `intents`
//! has no row with its `seq` (the `every_intent!` relation of the `sqlite` module).
//!
//! The writer keeps the rows it logged in memory too — the very bytes it wrote — so finding one
//! of its own intents, by `seq` or by id, decodes one image instead of parsing a log row.
//!
//! An image is a JSON array: `seq`, then the columns `cols!()` names, in its order, then the
//! content digest and the creation time; the call ids and the timeline are nested JSON, which
//! SQLite's `->>` returns as their text. The layout is the table's, so it is written here by
//! hand; SQLite's JSON functions read it back, in the readers' union and when materializing.

use crate::limits::{ARGS_INLINE_BYTES_MAX, FRESH_LOG_FOLD_CHUNK};
use crate::record::{IntentId, IntentRecord};
use ring0_core::identity::Digest32;
use rusqlite::{Connection, params};
use serde::Serialize;
use serde::ser::{SerializeTuple, Serializer};
use std::collections::{HashMap, VecDeque};
use std::fmt::Display;

/// The columns of `cols!()`, in its order, from an image `j.value`.
macro_rules! image_cols_sql {
    () => {
        "j.value->>1, j.value->>2, j.value->>3, j.value->>4, j.value->>5, j.value->>6, \
         j.value->>7, j.value->>8, j.value->>9, j.value->>10, j.value->>11, j.value->>12, \
         j.value->>13, j.value->>14, j.value->>15, j.value->>16, j.value->>17, j.value->>18"
    };
}
pub(crate) use image_cols_sql;

/// The columns of `intents` an image fills, in the image's order.
macro_rules! image_columns {
    () => {
        "seq, id, semantic_key, scope, attempt_epoch, tool, args_sha256, args_bytes, \
         args_inline, call_ids, idempotency_key, mutating, fence, attempts, state, timeline, \
         receipt, snapshot, owner, content_digest, created_ms, updated_ms"
    };
}

/// Appends one log row: the batch's images as a JSON array, and the range of `seq`s it holds.
const INSERT_LOG_ROW: &str =
    "INSERT INTO intent_log (last_seq, first_seq, records) VALUES (?1, ?2, ?3)";

/// Copies the logged intents with `seq` in (?1, ?2] into `intents`, in `seq` order, keeping any
/// row already there.
const MATERIALIZE: &str = concat!(
    "INSERT OR IGNORE INTO intents (",
    image_columns!(),
    ") SELECT j.value->>0, ",
    image_cols_sql!(),
    ", j.value->>19, j.value->>20, j.value->>20
     FROM intent_log l, json_each(l.records) j
     WHERE l.last_seq > ?1 AND l.first_seq <= ?2 AND j.value->>0 > ?1 AND j.value->>0 <= ?2
     ORDER BY j.value->>0"
);

/// Copies one image (?1) into `intents`, keeping a row already there.
const MATERIALIZE_IMAGE: &str = concat!(
    "INSERT OR IGNORE INTO intents (",
    image_columns!(),
    ") SELECT j.value->>0, ",
    image_cols_sql!(),
    ", j.value->>19, j.value->>20, j.value->>20 FROM (SELECT ?1 AS value) j"
);

/// Drops the log rows whose intents are all in `intents` (`last_seq` at most ?1).
const DELETE_LOG_ROWS: &str = "DELETE FROM intent_log WHERE last_seq <= ?1";

/// The columns of `cols!()` decoded from one image (?1).
pub(crate) const SELECT_IMAGE: &str =
    concat!("SELECT ", image_cols_sql!(), " FROM (SELECT ?1 AS value) j");

/// Serializes through `Display`: digests and ids as their text, without building a `String`.
struct AsText<T>(T);

impl<T: Display> Serialize for AsText<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&self.0)
    }
}

/// What a new intent's image holds besides its record.
pub(crate) struct Fresh<'a> {
    pub record: &'a IntentRecord,
    pub args_sha256: &'a str,
    pub content: &'a [u8; 32],
    pub created_ms: u64,
}

/// A new intent's image: `seq`, the columns of `cols!()` in its order, the content digest and
/// the creation time.
struct Image<'a> {
    seq: i64,
    fresh: &'a Fresh<'a>,
}

impl Serialize for Image<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (f, r) = (self.fresh, self.fresh.record);
        let int = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let inline = (r.canonical_args.len() <= ARGS_INLINE_BYTES_MAX).then_some(&r.canonical_args);
        let mut t = s.serialize_tuple(21)?;
        t.serialize_element(&self.seq)?;
        t.serialize_element(&AsText(&r.id))?;
        t.serialize_element(&r.semantic_key)?;
        t.serialize_element(&r.scope)?;
        t.serialize_element(&int(r.attempt_epoch))?;
        t.serialize_element(&r.tool)?;
        t.serialize_element(f.args_sha256)?;
        t.serialize_element(&r.canonical_args.len())?;
        t.serialize_element(&inline)?;
        t.serialize_element(&r.call_ids)?;
        t.serialize_element(&r.idempotency_key)?;
        t.serialize_element(&r.mutating)?;
        t.serialize_element(&int(r.fence))?;
        t.serialize_element(&r.attempts)?;
        t.serialize_element(r.state.as_str())?;
        t.serialize_element(&r.timeline)?;
        t.serialize_element(&None::<()>)?;
        t.serialize_element(&None::<()>)?;
        t.serialize_element(&int(r.owner))?;
        t.serialize_element(&AsText(Digest32(*f.content)))?;
        t.serialize_element(&int(f.created_ms))?;
        t.end()
    }
}

/// One log row, as written: its images, one JSON array, and where each image ends.
struct LoggedBatch {
    first_seq: i64,
    records: Vec<u8>,
    /// End offset in `records` of each image; image `i` starts after the separator that
    /// follows image `i - 1` (or the opening `[`).
    ends: Vec<usize>,
    ids: Vec<IntentId>,
}

impl LoggedBatch {
    fn new() -> Self {
        Self {
            first_seq: 0,
            records: Vec::new(),
            ends: Vec::new(),
            ids: Vec::new(),
        }
    }

    fn last_seq(&self) -> i64 {
        self.first_seq + self.ends.len() as i64 - 1
    }

    fn image(&self, seq: i64) -> Option<&str> {
        let i = usize::try_from(seq - self.first_seq).ok()?;
        let end = *self.ends.get(i)?;
        let start = if i == 0 { 1 } else { self.ends[i - 1] + 1 };
        std::str::from_utf8(&self.records[start..end]).ok()
    }

    fn seq_of(&self, id: &IntentId) -> Option<i64> {
        self.ids
            .iter()
            .position(|x| x == id)
            .map(|i| self.first_seq + i as i64)
    }
}

/// The writer's side of the log.
pub(crate) struct FreshLog {
    /// Every intent at or below this `seq` is in `intents`.
    through: i64,
    /// The log rows committed and not yet dropped, oldest first.
    logged: VecDeque<LoggedBatch>,
    /// The `seq` of every intent in `logged`, by id.
    by_id: HashMap<IntentId, i64>,
    /// Bytes of images in `logged`.
    bytes: usize,
    /// The row of the batch being decided.
    staged: LoggedBatch,
    /// Most bytes `logged` holds before a batch materializes the oldest rows.
    bytes_max: usize,
}

impl FreshLog {
    /// Materializes whatever the log holds (a crash, or a close that could not) and starts
    /// empty. Runs at open, before anything reads `intents`.
    pub(crate) fn load(conn: &Connection, bytes_max: usize) -> rusqlite::Result<Self> {
        let last: Option<i64> =
            conn.query_row("SELECT max(last_seq) FROM intent_log", [], |r| r.get(0))?;
        if let Some(last) = last {
            conn.execute_batch("BEGIN IMMEDIATE")?;
            let done = conn
                .execute(MATERIALIZE, params![i64::MIN, last])
                .and_then(|_| conn.execute(DELETE_LOG_ROWS, [last]))
                .and_then(|_| conn.execute_batch("COMMIT"));
            if let Err(e) = done {
                let _ = conn.execute_batch("ROLLBACK");
                return Err(e);
            }
        }
        let through: i64 =
            conn.query_row("SELECT coalesce(max(seq), 0) FROM intents", [], |r| {
                r.get(0)
            })?;
        Ok(Self {
            through,
            logged: VecDeque::new(),
            by_id: HashMap::new(),
            bytes: 0,
            staged: LoggedBatch::new(),
            bytes_max,
        })
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.logged.is_empty()
    }

    /// Adds a new intent to the batch's row, with the next `seq` (one more than the last
    /// staged, or than `committed_max`), and returns that `seq`.
    pub(crate) fn stage(&mut self, committed_max: i64, fresh: &Fresh<'_>) -> i64 {
        let b = &mut self.staged;
        let seq = if b.ends.is_empty() {
            b.first_seq = committed_max + 1;
            b.records.push(b'[');
            b.first_seq
        } else {
            b.records.push(b',');
            b.last_seq() + 1
        };
        serde_json::to_writer(&mut b.records, &Image { seq, fresh })
            .expect("an image serializes into memory");
        b.ends.push(b.records.len());
        b.ids.push(fresh.record.id);
        seq
    }

    /// The image of a logged or staged intent that may not be in `intents`.
    pub(crate) fn image(&self, seq: i64) -> Option<&str> {
        if seq <= self.through {
            return None;
        }
        if let Some(image) = self.staged.image(seq) {
            return Some(image);
        }
        let i = self.logged.partition_point(|b| b.last_seq() < seq);
        self.logged.get(i)?.image(seq)
    }

    /// The `seq` of a logged or staged intent.
    pub(crate) fn seq_of(&self, id: &IntentId) -> Option<i64> {
        self.by_id
            .get(id)
            .copied()
            .filter(|seq| *seq > self.through)
            .or_else(|| self.staged.seq_of(id))
    }

    /// Writes the batch's row, inside its transaction.
    pub(crate) fn write_staged(&mut self, conn: &Connection) -> rusqlite::Result<()> {
        if self.staged.ends.is_empty() {
            return Ok(());
        }
        self.staged.records.push(b']');
        let b = &self.staged;
        let text = std::str::from_utf8(&b.records).expect("serde_json writes UTF-8");
        conn.prepare_cached(INSERT_LOG_ROW)?
            .execute(params![b.last_seq(), b.first_seq, text])
            .map(|_| ())
    }

    /// Copies one intent into `intents` before a change to it, inside the request's transaction
    /// (`INSERT OR IGNORE`: a second copy is a no-op).
    pub(crate) fn materialize_one(&self, conn: &Connection, seq: i64) -> rusqlite::Result<()> {
        match self.image(seq) {
            Some(image) => conn
                .prepare_cached(MATERIALIZE_IMAGE)?
                .execute([image])
                .map(|_| ()),
            None => Ok(()),
        }
    }

    /// The `seq` through which to materialize so that the log, with the batch's row, stays
    /// within its bound; `None` if it does.
    pub(crate) fn over_bound(&self) -> Option<i64> {
        let mut bytes = self.bytes + self.staged.records.len();
        let mut through = None;
        for b in &self.logged {
            if bytes <= self.bytes_max {
                break;
            }
            bytes -= b.records.len();
            through = Some(b.last_seq());
        }
        through
    }

    /// The `seq` through which an idle transaction materializes: the next
    /// [`FRESH_LOG_FOLD_CHUNK`] intents.
    pub(crate) fn next_chunk(&self) -> Option<i64> {
        let last = self.logged.back()?.last_seq();
        Some(last.min(self.through.saturating_add(FRESH_LOG_FOLD_CHUNK as i64)))
    }

    /// The last intent logged: through which a close materializes.
    pub(crate) fn last_logged(&self) -> Option<i64> {
        self.logged.back().map(LoggedBatch::last_seq)
    }

    /// Copies the intents with `seq` up to `through` into `intents` and drops the log rows
    /// that leaves with nothing to copy, inside the caller's transaction; [`Self::advance`]
    /// follows once it committed.
    pub(crate) fn materialize(&self, conn: &Connection, through: i64) -> rusqlite::Result<()> {
        if through <= self.through {
            return Ok(());
        }
        conn.prepare_cached(MATERIALIZE)?
            .execute(params![self.through, through])?;
        conn.prepare_cached(DELETE_LOG_ROWS)?.execute([through])?;
        Ok(())
    }

    /// After the commit of a [`Self::materialize`] through `through`.
    pub(crate) fn advance(&mut self, through: i64) {
        if through <= self.through {
            return;
        }
        self.through = through;
        while self.logged.front().is_some_and(|b| b.last_seq() <= through) {
            let b = self.logged.pop_front().expect("checked");
            self.bytes -= b.records.len();
            for id in &b.ids {
                self.by_id.remove(id);
            }
        }
    }

    /// After the batch's commit: its row joins the log.
    pub(crate) fn commit_staged(&mut self) {
        if self.staged.ends.is_empty() {
            return;
        }
        let b = std::mem::replace(&mut self.staged, LoggedBatch::new());
        for (i, id) in b.ids.iter().enumerate() {
            self.by_id.insert(*id, b.first_seq + i as i64);
        }
        self.bytes += b.records.len();
        self.logged.push_back(b);
    }

    /// After a batch that did not commit, or before one begins: its row is forgotten.
    pub(crate) fn abort_staged(&mut self) {
        self.staged = LoggedBatch::new();
    }
}
