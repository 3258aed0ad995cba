//! The durable embedded backend: one SQLite file per journal.
//!
//! - **Durability.** WAL mode with `synchronous=FULL`: a proposal or transition returns only after
//!   its transaction is fsynced. A caller that gets an error must not dispatch (fail closed).
//! - **Group commit** (`writer`). One writer thread owns the only write connection and decides
//!   every request waiting in one transaction (up to [`GROUP_COMMIT_BATCH_MAX`]), one fsync for
//!   the batch, each request atomic on its own, so one refused request does not undo the
//!   others. Replies go out after the commit. [`SqliteJournal::writer_stats`] says how large
//!   batches are and where their time goes.
//! - **The writer only decides** (`requests`). Whatever does not depend on what is recorded —
//!   digests, the record a new proposal creates, its columns' stored text — is computed on the
//!   caller's thread before the request is queued, and the caller keeps its request until
//!   answered, so its memory is freed on its own thread too.
//! - **Checkpoints off the commit path** (`checkpoint`). A checkpointer thread with its own
//!   connection folds the WAL back (`PASSIVE`: it never blocks the writer or the readers) when
//!   the writer has been idle [`CHECKPOINT_IDLE_MS`] or once [`CHECKPOINT_WAL_FRAMES_MAX`]
//!   frames wait.
//! - **Concurrent readers** (`reads`). Reads run on a small pool of reader threads with their
//!   own connections; WAL lets them read while the writer commits. [`JournalReader`] reads a
//!   file another process may be writing.
//! - **One writer process** (`files`). An exclusive `flock` on `<db>.lock` is held while the
//!   journal is open; a second process (or a second open in this one) gets
//!   [`JournalError::Locked`]. The OS drops the lock when the process dies, so a crashed host
//!   never blocks its successor.
//! - **Corruption is reported, never repaired** (`schema`, `rows`). A file that is not a SQLite
//!   database, fails `quick_check`, belongs to another application or has a newer schema is
//!   refused with a clear error and left as it is; so is a row that does not parse.
//! - **Full disk fails closed.** `SQLITE_FULL` (a full disk or the configured size quota) refuses
//!   the proposal with [`JournalError::Full`]; nothing is recorded, so nothing is dispatched.
//! - **Large arguments** (over [`ARGS_INLINE_BYTES_MAX`]) are written, fsynced, to
//!   `<db>.spill/<sha256>` before the record that names them commits; reading a record checks the
//!   digest.
//! - **The key index is maintained lazily** (`key_index`). The semantic-key and content indexes
//!   are derived from the `intents` rows and folded into their tables off the commit path; the
//!   entries not yet folded live in memory and are rebuilt from the rows at open. A commit
//!   writes its intents' rows only. A Bloom filter of the folded entries spares a new key the
//!   probe of the tables.
//! - **Migrations** (`schema`) are numbered; `PRAGMA user_version` says which ran.
//!
//! Every decision is made by the private `decide` module, the code [`crate::MemoryJournal`] runs.
//! This module holds the options and [`SqliteJournal`] itself: opening (lock, connection,
//! migrations, the key index, the threads), the [`Journal`] methods as messages to the writer
//! and the readers, and closing.

mod checkpoint;
mod files;
mod key_index;
mod reads;
mod requests;
mod rows;
mod schema;
#[cfg(test)]
mod testing;
mod writer;

pub use checkpoint::{CHECKPOINT_IDLE_MS, CHECKPOINT_WAL_FRAMES_MAX};
pub use reads::JournalReader;
pub use schema::{PAGE_SIZE_BYTES, WRITER_CACHE_KIB};
pub use writer::WriterStats;

use crate::clock::{Clock, SystemClock};
use crate::decide;
use crate::hold::{HeldCall, HoldDecided, HoldState};
#[cfg(doc)]
use crate::limits::{ARGS_INLINE_BYTES_MAX, GROUP_COMMIT_BATCH_MAX, KEY_INDEX_PENDING_MAX};
use crate::limits::{READERS_DEFAULT, RECENT_LIMIT_MAX};
use crate::memo::MemoEntry;
use crate::record::{IntentId, IntentRecord, Proposal, ProposeDecision, Transition};
use crate::{Journal, JournalError};
use async_trait::async_trait;
use checkpoint::WalActivity;
use files::{Files, acquire_lock};
use futures::channel::oneshot;
use key_index::{IndexTuning, KeyIndex, PendingIndex, read_index};
use reads::ReadJob;
use requests::{PreparedProposal, Proposed, Reply, WriteJob};
use ring0_core::{Fingerprint, Observation, SemanticKey};
use rusqlite::Connection;
use schema::{configure_writer, migrate, open_connection};
use std::fs::{self, File};
use std::path::Path;
use std::sync::mpsc::{Sender, SyncSender};
use std::sync::{Arc, RwLock};
use std::thread::JoinHandle;
use std::time::Instant;
use writer::WriterThread;

/// How to open a SQLite journal.
#[derive(Clone)]
pub struct SqliteOptions {
    /// Reader connections (threads); at least one. Default [`READERS_DEFAULT`].
    pub readers: usize,
    /// A size quota for the database file: past it, writes fail with [`JournalError::Full`]
    /// exactly as on a full disk. `None` (the default): the disk is the limit.
    pub max_size_bytes: Option<u64>,
    /// Run `PRAGMA quick_check` on open (default `true`): corruption is found at open, not
    /// halfway through recovery.
    pub check_integrity: bool,
    /// Timestamps and new ids.
    pub clock: Arc<dyn Clock>,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        Self {
            readers: READERS_DEFAULT,
            max_size_bytes: None,
            check_integrity: true,
            clock: Arc::new(SystemClock),
        }
    }
}

impl std::fmt::Debug for SqliteOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteOptions")
            .field("readers", &self.readers)
            .field("max_size_bytes", &self.max_size_bytes)
            .field("check_integrity", &self.check_integrity)
            .finish_non_exhaustive()
    }
}

/// The SQLite journal. Cheap to share behind an `Arc`; dropping it finishes pending writes,
/// closes the connections and releases the lock.
pub struct SqliteJournal {
    files: Files,
    clock: Arc<dyn Clock>,
    writer_tx: Option<SyncSender<WriteJob>>,
    reader_tx: Option<Sender<ReadJob>>,
    threads: Vec<JoinHandle<()>>,
    checkpointer: Option<(Sender<()>, JoinHandle<()>)>,
    incarnation: u64,
    /// Key-index entries not yet folded into their tables (shared with the writer, which alone
    /// changes them, and the readers).
    index: Arc<RwLock<PendingIndex>>,
    /// What the writer reports.
    activity: Arc<WalActivity>,
    lock: Option<File>,
}

impl SqliteJournal {
    /// Opens (creating if absent) the journal at `path` with default options.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, JournalError> {
        Self::open_with(path, SqliteOptions::default())
    }

    /// Opens (creating if absent) the journal at `path` for writing.
    pub fn open_with(path: impl AsRef<Path>, options: SqliteOptions) -> Result<Self, JournalError> {
        Self::open_tuned(path.as_ref(), options, IndexTuning::default())
    }

    fn open_tuned(
        path: &Path,
        options: SqliteOptions,
        tuning: IndexTuning,
    ) -> Result<Self, JournalError> {
        let files = Files::new(path);
        let lock = acquire_lock(&files)?;
        let conn = open_connection(&files, true)?;
        configure_writer(&conn, &files, &options)?;
        migrate(&conn, &files)?;
        let incarnation: i64 = conn
            .query_row("SELECT coalesce(max(owner), 0) + 1 FROM intents", [], |r| {
                r.get(0)
            })
            .map_err(|e| files.sql(e))?;
        let incarnation = u64::try_from(incarnation).unwrap_or(1);
        let key_index = KeyIndex::load(&conn, &files, tuning)?;
        let index = key_index.shared.clone();
        fs::create_dir_all(&files.spill)
            .map_err(|e| files.io("creating spill directory", &files.spill, e))?;

        let activity = Arc::new(WalActivity::default());
        let opened = Instant::now();
        let writer = WriterThread {
            conn,
            files: files.clone(),
            clock: options.clock.clone(),
            incarnation,
            index: key_index,
            activity: activity.clone(),
            opened,
        };
        let (writer_tx, writer_thread) = writer.spawn()?;
        let (reader_tx, mut threads) = reads::spawn_readers(&files, options.readers)?;
        threads.push(writer_thread);
        let checkpointer = checkpoint::spawn(&files, activity.clone(), opened)?;
        Ok(Self {
            files,
            clock: options.clock,
            writer_tx: Some(writer_tx),
            reader_tx: Some(reader_tx),
            threads,
            checkpointer: Some(checkpointer),
            incarnation,
            index,
            activity,
            lock: Some(lock),
        })
    }

    pub fn path(&self) -> &Path {
        &self.files.db
    }

    /// Intents whose semantic-key and content index entries are held in memory, not yet folded
    /// into the database: a diagnostic, at most [`KEY_INDEX_PENDING_MAX`].
    pub fn pending_index_entries(&self) -> usize {
        read_index(&self.index).len()
    }

    /// What the writer's group commits have done since the journal opened.
    pub fn writer_stats(&self) -> WriterStats {
        self.activity.stats.snapshot()
    }

    async fn write<T>(&self, make: impl FnOnce(Reply<T>) -> WriteJob) -> Result<T, JournalError> {
        let (tx, rx) = oneshot::channel();
        let sender = self.writer_tx.as_ref().ok_or(JournalError::Closed)?;
        sender.send(make(tx)).map_err(|_| JournalError::Closed)?;
        rx.await.map_err(|_| JournalError::Closed)?
    }

    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection, &Files) -> Result<T, JournalError> + Send + 'static,
    ) -> Result<T, JournalError> {
        let (tx, rx) = oneshot::channel();
        let job: ReadJob = Box::new(move |conn, files| {
            let _ = tx.send(f(conn, files));
        });
        let sender = self.reader_tx.as_ref().ok_or(JournalError::Closed)?;
        sender.send(job).map_err(|_| JournalError::Closed)?;
        rx.await.map_err(|_| JournalError::Closed)?
    }
}

impl Drop for SqliteJournal {
    fn drop(&mut self) {
        // Closing the channels ends the threads after the work already queued; the lock is
        // released only once no connection is left. The checkpointer stops first so the
        // writer's closing checkpoint has the WAL to itself.
        if let Some((stop, handle)) = self.checkpointer.take() {
            drop(stop);
            let _ = handle.join();
        }
        self.writer_tx.take();
        self.reader_tx.take();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        self.lock.take();
    }
}

#[async_trait]
impl Journal for SqliteJournal {
    async fn propose(&self, proposal: Proposal) -> Result<ProposeDecision, JournalError> {
        // Limits are checked before queueing so an oversized proposal never reaches the writer.
        decide::validate_proposal(&proposal)?;
        let prepared = Arc::new(PreparedProposal::new(
            proposal,
            self.clock.as_ref(),
            self.incarnation,
        ));
        let held = prepared.clone();
        match self
            .write(|reply| WriteJob::Propose(prepared, reply))
            .await?
        {
            Proposed::Decided(decision) => Ok(decision),
            // The writer let go of its reference before answering.
            Proposed::Fresh => Ok(ProposeDecision::Recorded(match Arc::try_unwrap(held) {
                Ok(prepared) => prepared.fresh,
                Err(shared) => shared.fresh.clone(),
            })),
        }
    }

    async fn transition(&self, transition: Transition) -> Result<IntentRecord, JournalError> {
        let transition = Arc::new(transition);
        let held = transition.clone();
        let record = self
            .write(|reply| WriteJob::Transition(transition, reply))
            .await;
        drop(held);
        record
    }

    fn mark_delivered(&self, id: IntentId) {
        // Never waits: not for the writer's answer, and not for room in its queue (a delivery
        // dropped there only makes the next identical call a replay).
        if let Some(sender) = &self.writer_tx {
            let _ = sender.try_send(WriteJob::MarkDelivered(id));
        }
    }

    async fn get(&self, id: IntentId) -> Result<Option<IntentRecord>, JournalError> {
        self.read(move |conn, files| reads::load_by_id(conn, files, &id))
            .await
    }

    async fn find_by_key(&self, key: &SemanticKey) -> Result<Option<IntentRecord>, JournalError> {
        let (key, index) = (*key, self.index.clone());
        self.read(move |conn, files| key_index::find_by_key(conn, files, &index, &key))
            .await
    }

    async fn open_records(&self) -> Result<Vec<IntentRecord>, JournalError> {
        self.read(reads::open_records).await
    }

    async fn recent(&self, limit: usize) -> Result<Vec<IntentRecord>, JournalError> {
        let limit = i64::try_from(limit.min(RECENT_LIMIT_MAX)).unwrap_or(0);
        self.read(move |conn, files| reads::recent(conn, files, limit))
            .await
    }

    async fn count_by_state(
        &self,
    ) -> Result<Option<Vec<(ring0_core::IntentState, u64)>>, JournalError> {
        self.read(reads::count_by_state).await.map(Some)
    }

    fn incarnation(&self) -> Option<u64> {
        Some(self.incarnation)
    }

    async fn memo_get(
        &self,
        fingerprint: &Fingerprint,
        max_age_ms: u64,
    ) -> Result<Option<Observation>, JournalError> {
        let fp = fingerprint.encode();
        let now = self.clock.now_ms();
        self.read(move |conn, files| reads::load_memo(conn, files, &fp, now, max_age_ms))
            .await
    }

    async fn hold_put(&self, held: &HeldCall) -> Result<bool, JournalError> {
        let held = Box::new(held.clone());
        self.write(|reply| WriteJob::HoldPut(held, reply)).await
    }

    async fn hold_get(&self, approval_id: &str) -> Result<Option<HeldCall>, JournalError> {
        let id = approval_id.to_string();
        self.read(move |conn, files| reads::load_hold(conn, files, &id))
            .await
    }

    async fn holds_pending(&self) -> Result<Vec<HeldCall>, JournalError> {
        self.read(reads::load_holds_pending).await
    }

    async fn hold_decide(
        &self,
        approval_id: &str,
        state: HoldState,
    ) -> Result<HoldDecided, JournalError> {
        let id = approval_id.to_string();
        self.write(|reply| WriteJob::HoldDecide(id, state, reply))
            .await
    }

    async fn memo_put(
        &self,
        fingerprint: &Fingerprint,
        observation: &Observation,
    ) -> Result<bool, JournalError> {
        let Some(entry) = MemoEntry::new(observation, self.clock.now_ms()) else {
            return Ok(false);
        };
        let fp = *fingerprint;
        self.write(|reply| WriteJob::MemoPut(fp, entry, reply))
            .await
    }
}
