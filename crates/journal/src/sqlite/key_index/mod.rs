//! The key index: how a mutating intent is found again by its semantic key and by its content
//! digest, maintained lazily (log-structured).
//!
//! Every new mutating intent must be findable by its semantic key and by its content digest.
//! Upserting both into their SQL tables inside the intent's own commit costs two random B-tree
//! positions (hash-keyed), so a group commit of n intents dirties about 2n scattered pages that
//! all go to the WAL: measured, that was most of a 64-intent batch's COMMIT. Instead the
//! `intents` table stays the only source of truth and the two index tables (`intent_keys`,
//! `intent_contents`) become a derived index persisted later:
//!
//! - the database holds a watermark, `indexed_through`: every mutating intent with `seq` at or
//!   below it has its keys in the index tables;
//! - the writer holds every entry above the watermark here, in memory ([`PendingIndex`]), and
//!   rebuilds it at open by scanning `intents` above the watermark (a crash loses nothing: the
//!   rows are durable, the map is derived from them);
//! - lookups go to the entries of the batch being decided ([`Staged`]), then to this map, then
//!   to the SQL tables, newest first, so the latest insert of a key wins, exactly as the upserts
//!   it replaces;
//! - the writer folds the oldest entries into the SQL tables and advances the watermark, in
//!   its own transactions, when it is idle, and inside a batch when the map reaches its cap
//!   (see [`crate::limits::KEY_INDEX_PENDING_MAX`]).
//!
//! Only the writer thread changes a [`PendingIndex`]; reader threads look keys up in it.
//!
//! The parts: [`pending`] holds the entries above the watermark (and a batch's staged ones);
//! [`folded_filter`] says which keys the tables may hold, so most new keys skip the probe of the
//! tables; [`KeyIndex`] here is the writer's side (rebuilt at open, looked up while deciding,
//! folded into the tables), and [`find_by_key`] the readers' look-up.

mod folded_filter;
mod pending;

pub(crate) use pending::{ContentDigest, IndexEntry, PendingIndex, Staged};

use super::files::Files;
use super::reads::{load_indexed, load_one};
use super::requests::PreparedProposal;
use super::rows::cols;
use super::writer::exec_cached;
use crate::JournalError;
use crate::decide;
use crate::limits::{
    GROUP_COMMIT_BATCH_MAX, KEY_INDEX_FOLD_CHUNK, KEY_INDEX_FOLD_IDLE_MS, KEY_INDEX_FOLD_STEP,
    KEY_INDEX_PENDING_MAX,
};
use crate::record::IntentRecord;
use folded_filter::FoldedFilter;
use ring0_core::SemanticKey;
use ring0_core::identity::Digest32;
use rusqlite::{Connection, OptionalExtension, params};
use std::cell::Cell;
use std::sync::mpsc::Receiver;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

/// The record the index tables name for a semantic key.
const SELECT_BY_KEY: &str = concat!(
    "SELECT ",
    cols!(),
    " FROM intents WHERE seq = (SELECT intent_seq FROM intent_keys WHERE semantic_key = ?1)"
);
/// The `seq` each index table names for a semantic key (?1) and a content digest (?2).
const PROBE_INDEX: &str = "SELECT
    (SELECT intent_seq FROM intent_keys WHERE semantic_key = ?1),
    (SELECT intent_seq FROM intent_contents WHERE content_digest = ?2)";
const UPSERT_KEY: &str = "INSERT INTO intent_keys (semantic_key, intent_seq) VALUES (?1, ?2)
     ON CONFLICT(semantic_key) DO UPDATE SET intent_seq = excluded.intent_seq";
const UPSERT_CONTENT: &str =
    "INSERT INTO intent_contents (content_digest, intent_seq) VALUES (?1, ?2)
     ON CONFLICT(content_digest) DO UPDATE SET intent_seq = excluded.intent_seq";
const SET_WATERMARK: &str =
    "UPDATE key_index_watermark SET indexed_through = ?1 WHERE only_row = 1";

/// How the writer maintains the key index. Always the named limits outside this module's
/// tests, which shrink them to observe folding deterministically.
#[derive(Debug, Clone, Copy)]
pub(crate) struct IndexTuning {
    /// Idle time after which the writer folds; `None`: never while open.
    pub(crate) fold_idle: Option<Duration>,
    /// Most entries folded per idle transaction.
    pub(crate) chunk: usize,
    /// Most entries held in memory.
    pub(crate) pending_max: usize,
    /// Whether a clean close folds every entry.
    pub(crate) fold_on_close: bool,
}

impl Default for IndexTuning {
    fn default() -> Self {
        Self {
            fold_idle: Some(Duration::from_millis(KEY_INDEX_FOLD_IDLE_MS)),
            chunk: KEY_INDEX_FOLD_CHUNK,
            pending_max: KEY_INDEX_PENDING_MAX,
            fold_on_close: true,
        }
    }
}

// A batch's own entries must fit under the cap, or folding older ones could not bound the map.
const _: () = assert!(GROUP_COMMIT_BATCH_MAX <= KEY_INDEX_PENDING_MAX);

/// Takes a poisoned lock anyway: the map is changed only by whole-entry operations, so a panic
/// elsewhere cannot leave it half-updated.
pub(crate) fn read_index(index: &RwLock<PendingIndex>) -> RwLockReadGuard<'_, PendingIndex> {
    index.read().unwrap_or_else(|e| e.into_inner())
}

fn write_index(index: &RwLock<PendingIndex>) -> RwLockWriteGuard<'_, PendingIndex> {
    index.write().unwrap_or_else(|e| e.into_inner())
}

/// The record holding `key`, for a reader thread: the in-memory entries first, then the
/// tables.
///
/// Race-free against a concurrent fold, which commits the entries to the tables and only then
/// removes them from the map: a lookup that still finds an entry in the map reads its row
/// (committed before the entry joined the map), and a lookup that no longer finds it runs its
/// SQL after the removal, so after the fold's COMMIT, and (each statement being its own read
/// transaction) sees the folded rows. Tables first would not be: between the SQL miss and the
/// map look-up a fold could move the entry from one to the other.
pub(crate) fn find_by_key(
    conn: &Connection,
    files: &Files,
    index: &RwLock<PendingIndex>,
    key: &SemanticKey,
) -> Result<Option<IntentRecord>, JournalError> {
    let seq = read_index(index).seq_of_key(key);
    match seq {
        Some(seq) => load_indexed(conn, files, seq).map(Some),
        None => load_one(conn, files, SELECT_BY_KEY, [key.encode()]),
    }
}

/// The writer's side of the key index: the shared map of pending entries and what the
/// database says about them.
pub(crate) struct KeyIndex {
    pub(crate) shared: Arc<RwLock<PendingIndex>>,
    pub(crate) tuning: IndexTuning,
    /// `indexed_through` as committed: every mutating intent at or below it is in the tables.
    watermark: i64,
    /// The highest `seq` committed (mutating or not).
    max_seq: i64,
    /// What the tables may hold, so most new keys skip the probe (see the `folded_filter`
    /// module). Entries join it before the fold that writes them commits.
    folded: FoldedFilter,
    /// Probes of the tables by the batch being decided, for
    /// [`super::WriterStats::table_probes`].
    table_probes: Cell<u64>,
}

/// The oldest pending entries a batch wrote to the tables because the map reached its cap,
/// to forget once the batch commits.
pub(crate) struct CapFold {
    entries: usize,
    watermark: i64,
}

impl KeyIndex {
    /// Reads the watermark and rebuilds the pending entries from the rows above it, in `seq`
    /// order, so the last insert of a key wins as it did when they were written.
    pub(crate) fn load(
        conn: &Connection,
        files: &Files,
        tuning: IndexTuning,
    ) -> Result<Self, JournalError> {
        let watermark: i64 = conn
            .query_row(
                "SELECT indexed_through FROM key_index_watermark WHERE only_row = 1",
                [],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| files.sql(e))?
            .ok_or_else(|| files.corrupt("the key index watermark is missing"))?;
        let max_seq: i64 = conn
            .query_row("SELECT coalesce(max(seq), 0) FROM intents", [], |r| {
                r.get(0)
            })
            .map_err(|e| files.sql(e))?;
        let mut pending = PendingIndex::with_capacity(tuning.pending_max);
        let mut stmt = conn
            .prepare(
                "SELECT seq, semantic_key, content_digest FROM intents
                 WHERE seq > ?1 AND mutating ORDER BY seq",
            )
            .map_err(|e| files.sql(e))?;
        let mut rows = stmt.query([watermark]).map_err(|e| files.sql(e))?;
        while let Some(row) = rows.next().map_err(|e| files.sql(e))? {
            let seq: i64 = row.get(0).map_err(|e| files.sql(e))?;
            let bad = |what: &str| files.corrupt(format!("intent seq {seq}: malformed {what}"));
            let key = row
                .get::<_, String>(1)
                .ok()
                .and_then(|t| SemanticKey::decode(&t))
                .ok_or_else(|| bad("semantic key"))?;
            let content = row
                .get::<_, String>(2)
                .ok()
                .and_then(|t| Digest32::from_hex(&t))
                .ok_or_else(|| bad("content digest"))?;
            pending.push(IndexEntry {
                seq,
                key,
                content: content.0,
            });
        }
        Ok(Self {
            shared: Arc::new(RwLock::new(pending)),
            tuning,
            watermark,
            max_seq,
            folded: load_folded(conn, files, watermark)?,
            table_probes: Cell::new(0),
        })
    }

    /// Entries held in memory.
    pub(crate) fn pending(&self) -> usize {
        read_index(&self.shared).len()
    }

    /// The highest `seq` committed.
    pub(crate) fn max_seq(&self) -> i64 {
        self.max_seq
    }

    /// The probes of the tables since the last call, for [`super::WriterStats::table_probes`].
    pub(crate) fn take_table_probes(&self) -> u64 {
        self.table_probes.take()
    }

    /// The `seq`s of the newest intents with the proposal's semantic key and with its content
    /// digest, if any. Newest first: the batch being decided (`staged`), then the pending
    /// entries, then the tables — asked only for what memory did not answer and they may hold,
    /// with one statement for both.
    pub(crate) fn lookup(
        &self,
        conn: &Connection,
        files: &Files,
        staged: &Staged,
        prepared: &PreparedProposal,
    ) -> Result<(Option<i64>, Option<i64>), JournalError> {
        let key = &prepared.proposal.semantic_key;
        let content = &prepared.content;
        let (key_seq, content_seq) = {
            let pending = read_index(&self.shared);
            (
                staged.seq_of_key(key).or_else(|| pending.seq_of_key(key)),
                staged
                    .seq_of_content(content)
                    .or_else(|| pending.seq_of_content(content)),
            )
        };
        let probe = (key_seq.is_none() && self.folded.may_contain_key(key))
            || (content_seq.is_none() && self.folded.may_contain_content(content));
        if !probe {
            return Ok((key_seq, content_seq));
        }
        self.table_probes.set(self.table_probes.get() + 1);
        // Memory wins where it has an entry.
        let (in_keys, in_contents) = conn
            .prepare_cached(PROBE_INDEX)
            .and_then(|mut stmt| {
                stmt.query_row(params![prepared.key_text, prepared.content_hex], |r| {
                    Ok((r.get::<_, Option<i64>>(0)?, r.get::<_, Option<i64>>(1)?))
                })
            })
            .map_err(|e| files.sql(e))?;
        Ok((key_seq.or(in_keys), content_seq.or(in_contents)))
    }

    /// Inside a batch's transaction, before its COMMIT: if the batch's `staged` entries would
    /// grow the map past its cap (under load without a pause), writes the oldest pending
    /// entries to the tables — at least a chunk, so this does not recur on every batch — and
    /// advances the watermark past them. The map forgets them in [`KeyIndex::committed`]; if
    /// the batch does not commit, nothing changed but the filter, which then says "may be
    /// there" of entries that are not.
    pub(crate) fn fold_over_cap(
        &mut self,
        conn: &Connection,
        staged: &Staged,
    ) -> rusqlite::Result<Option<CapFold>> {
        let over = (self.pending() + staged.len()).saturating_sub(self.tuning.pending_max);
        if over == 0 {
            return Ok(None);
        }
        let entries = read_index(&self.shared).oldest(over.max(self.tuning.chunk));
        let Some(last) = entries.last() else {
            return Ok(None);
        };
        // Entries above the watermark are all pending, so everything up to the last one
        // folded is in the tables once this commits.
        write_index_entries(conn, &entries, &mut self.folded)?;
        conn.prepare_cached(SET_WATERMARK)?.execute([last.seq])?;
        Ok(Some(CapFold {
            entries: entries.len(),
            watermark: last.seq,
        }))
    }

    /// After a batch's COMMIT, before any caller is answered: forgets what the batch folded,
    /// moves its staged entries into the shared map and records the highest `seq` it
    /// committed.
    pub(crate) fn committed(&mut self, fold: Option<CapFold>, staged: &mut Staged, max_seq: i64) {
        let mut pending = write_index(&self.shared);
        if let Some(fold) = fold {
            pending.remove_oldest(fold.entries);
            self.watermark = fold.watermark;
        }
        staged.drain_into(&mut pending);
        self.max_seq = max_seq;
    }

    /// Whether the tables lag behind the rows: entries to fold, or a watermark to advance past
    /// intents that are not indexed (reads), so the next open scans nothing twice.
    pub(crate) fn needs_fold(&self) -> bool {
        self.watermark < self.max_seq || !read_index(&self.shared).is_empty()
    }

    /// Folds the oldest `chunk` entries in a transaction of its own, then drops
    /// them from the map. On failure nothing changed (a later idle period tries again).
    ///
    /// With `interrupt`, the fold gives way to callers: every [`KEY_INDEX_FOLD_STEP`] entries
    /// it looks at the queue, and if a request is waiting it rolls its transaction back (the
    /// entries stay in memory; nothing was lost but a little work) and returns the request, so
    /// a caller arriving during a fold waits for a few upserts, not for the chunk. What it
    /// cannot give way to is its COMMIT, which writes the chunk's pages to the WAL and fsyncs
    /// them like any other commit. (Nothing depends on a fold being durable — a lost fold takes
    /// its watermark with it and the next open rebuilds the entries — but a fold committed
    /// without its fsync would leave its pages for the next batch's fsync to write, on a
    /// caller's time: after a long idle fold, megabytes.)
    pub(crate) fn fold_chunk<J>(
        &mut self,
        conn: &Connection,
        files: &Files,
        chunk: usize,
        interrupt: Option<&Receiver<J>>,
    ) -> Result<Option<J>, JournalError> {
        let (entries, next) = {
            let pending = read_index(&self.shared);
            let n = chunk.min(pending.len());
            (pending.oldest(n), pending.seq_after(n))
        };
        // Every intent below the oldest entry left is folded or not indexed at all.
        let watermark = next.map_or(self.max_seq, |seq| seq - 1).max(self.watermark);
        let interrupted = fold_transaction(conn, &entries, watermark, interrupt, &mut self.folded)
            .map_err(|e| files.sql(e))?;
        if interrupted.is_some() {
            return Ok(interrupted);
        }
        // Committed first, removed second: see `find_by_key`.
        write_index(&self.shared).remove_oldest(entries.len());
        self.watermark = watermark;
        Ok(None)
    }
}

/// The filter of what the key-index tables hold, from a scan of their keys, sized for the
/// intents at or below the watermark (each has at most one entry of each kind). A key it cannot
/// read (the tables are derived data; the rows are checked where they are read) leaves a filter
/// that lets every lookup probe.
fn load_folded(
    conn: &Connection,
    files: &Files,
    watermark: i64,
) -> Result<FoldedFilter, JournalError> {
    let mut filter = FoldedFilter::new(u64::try_from(watermark).unwrap_or(0));
    let keys_read = each_text(
        conn,
        files,
        "SELECT semantic_key FROM intent_keys",
        |text| SemanticKey::decode(text).map(|key| filter.insert_key(&key)),
    )?;
    let contents_read = each_text(
        conn,
        files,
        "SELECT content_digest FROM intent_contents",
        |text| ring0_core::identity::Digest32::from_hex(text).map(|c| filter.insert_content(&c.0)),
    )?;
    let readable = keys_read && contents_read;
    if !readable {
        filter.give_up();
    }
    Ok(filter)
}

/// Runs `each` over the text in the first column of every row `sql` selects; false if it could
/// not read one of them (`each` returns `None`, or the value is not text).
fn each_text(
    conn: &Connection,
    files: &Files,
    sql: &str,
    mut each: impl FnMut(&str) -> Option<()>,
) -> Result<bool, JournalError> {
    let mut stmt = conn.prepare(sql).map_err(|e| files.sql(e))?;
    let mut rows = stmt.query([]).map_err(|e| files.sql(e))?;
    let mut readable = true;
    while let Some(row) = rows.next().map_err(|e| files.sql(e))? {
        let read = row
            .get_ref(0)
            .ok()
            .and_then(|v| v.as_str().ok())
            .and_then(&mut each);
        readable &= read.is_some();
    }
    Ok(readable)
}

/// The transaction of an idle fold: rolled back, returning the request, if one arrives between
/// two steps; rolled back on any error.
fn fold_transaction<J>(
    conn: &Connection,
    entries: &[IndexEntry],
    watermark: i64,
    interrupt: Option<&Receiver<J>>,
    folded: &mut FoldedFilter,
) -> rusqlite::Result<Option<J>> {
    exec_cached(conn, "BEGIN IMMEDIATE")?;
    let mut written = Ok(());
    for step in entries.chunks(KEY_INDEX_FOLD_STEP) {
        if let Some(rx) = interrupt
            && let Ok(job) = rx.try_recv()
        {
            let _ = conn.execute_batch("ROLLBACK");
            return Ok(Some(job));
        }
        written = write_index_entries(conn, step, folded);
        if written.is_err() {
            break;
        }
    }
    let written = written
        .and_then(|()| conn.prepare_cached(SET_WATERMARK)?.execute([watermark]))
        .and_then(|_| exec_cached(conn, "COMMIT"));
    if let Err(e) = written {
        let _ = conn.execute_batch("ROLLBACK");
        return Err(e);
    }
    Ok(None)
}

/// Upserts index entries, oldest first (a later intent with the same key overwrites an
/// earlier one, as the map says). Runs inside the caller's transaction. The entries join the
/// filter first: if the transaction does not commit, the filter only says "may be there" of
/// entries that are not, which costs a probe.
fn write_index_entries(
    conn: &Connection,
    entries: &[IndexEntry],
    folded: &mut FoldedFilter,
) -> rusqlite::Result<()> {
    let mut keys = conn.prepare_cached(UPSERT_KEY)?;
    let mut contents = conn.prepare_cached(UPSERT_CONTENT)?;
    for e in entries {
        folded.insert(&e.key, &e.content);
    }
    for e in entries {
        keys.execute(params![e.key.encode(), e.seq])?;
        contents.execute(params![decide::hex(&e.content), e.seq])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Journal;
    use crate::record::{ProposeDecision, Transition};
    use crate::sqlite::SqliteJournal;
    use crate::sqlite::requests::WriteJob;
    use crate::sqlite::testing::{
        Writer, closed_with_refunds, indexed_keys, kind, no_idle_fold, open, refund, request,
        watermark,
    };
    use futures::executor::block_on;
    use ring0_core::IntentState;
    use std::sync::mpsc;
    use std::time::Instant;

    /// The refunds of `orders`, proposed again under new call ids, are duplicates, and each is
    /// found by its semantic key.
    fn assert_recognised(j: &SqliteJournal, orders: std::ops::Range<u64>) {
        for n in orders {
            let again = block_on(j.propose(refund(n, "again"))).unwrap();
            assert_eq!(kind(&again), "duplicate", "order {n}");
            assert!(
                block_on(j.find_by_key(&refund(n, "c").semantic_key))
                    .unwrap()
                    .is_some(),
                "order {n} is not found by its key"
            );
        }
    }

    /// Refund 1, proposed again under a new call id, is a duplicate, and a look-up by its key
    /// finds the record `first` created.
    fn assert_found_again(j: &SqliteJournal, first: &ProposeDecision) {
        let again = block_on(j.propose(refund(1, "c2"))).unwrap();
        assert_eq!(kind(&again), "duplicate");
        let found = block_on(j.find_by_key(&refund(1, "c").semantic_key)).unwrap();
        assert_eq!(found.map(|r| r.id), first.record().map(|r| r.id));
    }

    fn synchronous(conn: &Connection) -> i64 {
        conn.query_row("PRAGMA synchronous", [], |r| r.get(0))
            .unwrap()
    }

    #[test]
    fn an_idle_fold_gives_way_to_a_waiting_caller_and_keeps_commits_fully_synced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.db");
        let mut w = Writer::open(&path);
        w.batch(vec![refund(1, "c"), refund(2, "c"), refund(3, "c")]);
        let (tx, rx) = mpsc::sync_channel(1);
        tx.send(request()).unwrap();
        let waiting = w
            .index
            .fold_chunk(&w.conn, &w.files, KEY_INDEX_FOLD_CHUNK, Some(&rx))
            .unwrap();
        assert!(matches!(waiting, Some(WriteJob::MemoPut(..))));
        assert_eq!((w.index.pending(), indexed_keys(&path)), (3, 0));
        // 2 is FULL: what every batch commits with.
        assert_eq!(synchronous(&w.conn), 2);
        assert!(
            w.index
                .fold_chunk(&w.conn, &w.files, KEY_INDEX_FOLD_CHUNK, Some(&rx))
                .unwrap()
                .is_none()
        );
        assert_eq!((w.index.pending(), indexed_keys(&path)), (0, 3));
        assert_eq!(synchronous(&w.conn), 2);
    }

    #[test]
    fn a_duplicate_is_found_in_memory_before_any_fold() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.db");
        let j = open(&path, no_idle_fold(true));
        let first = block_on(j.propose(refund(1, "c1"))).unwrap();
        assert_eq!(kind(&first), "recorded");
        assert_eq!((j.pending_index_entries(), indexed_keys(&path)), (1, 0));
        assert_found_again(&j, &first);
    }

    #[test]
    fn only_keys_the_tables_may_hold_are_looked_up_there() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.db");
        closed_with_refunds(&path, no_idle_fold(true), 0..50);
        assert_eq!(indexed_keys(&path), 50, "a clean close folds every entry");
        let j = open(&path, no_idle_fold(true));
        for n in 100..150 {
            assert_eq!(
                kind(&block_on(j.propose(refund(n, "new"))).unwrap()),
                "recorded"
            );
        }
        assert_eq!(
            j.writer_stats().table_probes,
            0,
            "new keys are ruled out by the filter"
        );
        assert_recognised(&j, 0..50);
        assert_eq!(
            j.writer_stats().table_probes,
            50,
            "folded keys are looked up"
        );
    }

    #[test]
    fn an_index_table_it_cannot_read_leaves_every_new_key_probed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.db");
        closed_with_refunds(&path, no_idle_fold(true), 0..1);
        Connection::open(&path)
            .unwrap()
            .execute(
                "INSERT INTO intent_keys (semantic_key, intent_seq) VALUES ('not a key', 1)",
                [],
            )
            .unwrap();
        let j = open(&path, no_idle_fold(true));
        for n in 1..4 {
            assert_eq!(
                kind(&block_on(j.propose(refund(n, "c"))).unwrap()),
                "recorded"
            );
        }
        assert_eq!(j.writer_stats().table_probes, 3);
    }

    #[test]
    fn a_duplicate_is_found_in_the_tables_after_a_clean_close_folded_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.db");
        let first = {
            let j = open(&path, no_idle_fold(true));
            block_on(j.propose(refund(1, "c1"))).unwrap()
        };
        let j = open(&path, no_idle_fold(true));
        assert_eq!((j.pending_index_entries(), indexed_keys(&path)), (0, 1));
        assert_found_again(&j, &first);
    }

    #[test]
    fn an_idle_writer_folds_its_pending_entries_into_the_tables() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.db");
        let j = open(
            &path,
            IndexTuning {
                fold_idle: Some(Duration::from_millis(1)),
                chunk: 2,
                ..IndexTuning::default()
            },
        );
        for n in 0..5 {
            block_on(j.propose(refund(n, "c"))).unwrap();
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while j.pending_index_entries() > 0 {
            assert!(Instant::now() < deadline, "the idle writer never folded");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(indexed_keys(&path), 5);
        assert_eq!(watermark(&path), 5);
        assert_recognised(&j, 0..5);
    }

    #[test]
    fn reopening_a_journal_that_never_folded_rebuilds_its_pending_entries() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.db");
        closed_with_refunds(&path, no_idle_fold(false), 0..3);
        assert_eq!((indexed_keys(&path), watermark(&path)), (0, 0));
        let j = open(&path, no_idle_fold(true));
        assert_eq!(j.pending_index_entries(), 3);
        assert_recognised(&j, 0..3);
    }

    #[test]
    fn the_latest_intent_of_a_key_wins_across_memory_and_tables() {
        // A rejected record is replaced by a new record under the same key: the tables hold the
        // old one, memory the new one, and memory must win.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.db");
        let old = {
            let j = open(&path, no_idle_fold(true));
            let r = block_on(j.propose(refund(1, "c1"))).unwrap();
            let r = r.record().unwrap().clone();
            block_on(j.transition(Transition::to(&r, IntentState::RejectedConflict))).unwrap();
            r
        };
        let j = open(&path, no_idle_fold(true));
        let new = block_on(j.propose(refund(1, "c2"))).unwrap();
        assert_eq!(kind(&new), "recorded");
        assert_ne!(new.record().unwrap().id, old.id);
        assert_eq!((indexed_keys(&path), j.pending_index_entries()), (1, 1));
        let found = block_on(j.find_by_key(&old.semantic_key)).unwrap().unwrap();
        assert_eq!(found.id, new.record().unwrap().id);
        let again = block_on(j.propose(refund(1, "c3"))).unwrap();
        assert_eq!(again.record().unwrap().id, found.id);
    }

    #[test]
    fn the_pending_entries_never_exceed_their_cap_under_a_burst_without_idle_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.db");
        let cap = 32;
        let j = open(
            &path,
            IndexTuning {
                fold_idle: None,
                chunk: 8,
                pending_max: cap,
                fold_on_close: true,
            },
        );
        let mut most = 0;
        for n in 0..200 {
            block_on(j.propose(refund(n, "c"))).unwrap();
            most = most.max(j.pending_index_entries());
        }
        assert!(most <= cap, "{most} entries pending, cap {cap}");
        assert!(indexed_keys(&path) >= 200 - cap as i64);
        for n in 0..200 {
            let again = block_on(j.propose(refund(n, "again"))).unwrap();
            assert_eq!(kind(&again), "duplicate", "order {n}");
        }
    }
}
