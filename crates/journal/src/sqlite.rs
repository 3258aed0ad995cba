//! The durable embedded backend: one SQLite file per journal.
//!
//! - **Durability.** WAL mode with `synchronous=FULL`: a proposal or transition returns only after
//!   its transaction is fsynced. A caller that gets an error must not dispatch (fail closed).
//! - **Group commit.** One writer thread owns the only write connection. It decides every request
//!   waiting — and every one that arrives while it is deciding — in one transaction (up to
//!   [`GROUP_COMMIT_BATCH_MAX`]), one fsync for the batch, each request atomic on its own (one
//!   statement, or a savepoint), so one refused request does not undo the others. Replies go
//!   out after the commit. The transaction stays open a moment (a bounded share of the last
//!   commit's time) for the callers the last batch answered, so callers that come back together
//!   share one fsync instead of the first starting a batch the others then wait behind (see
//!   `Gather`). [`SqliteJournal::writer_stats`] says how large batches are and where their time
//!   goes.
//! - **The writer only decides.** Whatever does not depend on what is recorded — digests, the
//!   record a new proposal creates, its columns' stored text — is computed on the caller's
//!   thread before the request is queued, and the caller keeps its request until answered, so
//!   its memory is freed on its own thread too (see `PreparedProposal`).
//! - **Checkpoints off the commit path.** SQLite's automatic checkpoint would run inside some
//!   commit and make it wait for the database file's fsync; a checkpointer thread with its own
//!   connection folds the WAL back instead (`PASSIVE`: it never blocks the writer or the
//!   readers), when the writer has been idle [`CHECKPOINT_IDLE_MS`] — so its fsync of the
//!   database file does not compete with commits — or once [`CHECKPOINT_WAL_FRAMES_MAX`] frames
//!   wait, which bounds each checkpoint's work under constant load.
//! - **Concurrent readers.** Reads run on a small pool of reader threads with their own
//!   connections; WAL lets them read while the writer commits.
//! - **One writer process.** An exclusive `flock` on `<db>.lock` is held while the journal is
//!   open; a second process (or a second open in this one) gets [`JournalError::Locked`]. The OS
//!   drops the lock when the process dies, so a crashed host never blocks its successor.
//! - **Corruption is reported, never repaired.** A file that is not a SQLite database, fails
//!   `quick_check`, belongs to another application or has a newer schema is refused with a clear
//!   error and left as it is.
//! - **Full disk fails closed.** `SQLITE_FULL` (a full disk or the configured size quota) refuses
//!   the proposal with [`JournalError::Full`]; nothing is recorded, so nothing is dispatched.
//! - **Large arguments** (over [`ARGS_INLINE_BYTES_MAX`]) are written, fsynced, to
//!   `<db>.spill/<sha256>` before the record that names them commits; reading a record checks the
//!   digest.
//! - **The key index is maintained lazily.** The semantic-key and content indexes are derived
//!   from the `intents` rows and folded into their tables off the commit path; the entries not
//!   yet folded live in memory and are rebuilt from the rows at open (see the `key_index`
//!   module). A commit writes its intents' rows only. A Bloom filter of the folded entries
//!   spares a new key the probe of the tables (see the `folded_filter` module).
//! - **Migrations** are numbered; `PRAGMA user_version` says which ran.
//!
//! Every decision is made by the private `decide` module, the code [`crate::MemoryJournal`] runs.

use crate::clock::{Clock, SystemClock};
use crate::decide::{self, Found, Write};
use crate::folded_filter::FoldedFilter;
use crate::key_index::{ContentDigest, IndexEntry, PendingIndex, Staged};
use crate::limits::{
    ARGS_INLINE_BYTES_MAX, GROUP_COMMIT_BATCH_MAX, GROUP_COMMIT_GATHER_PERCENT,
    GROUP_COMMIT_GATHER_US_MAX, KEY_INDEX_CLOSE_FOLD_CHUNK, KEY_INDEX_FOLD_CHUNK,
    KEY_INDEX_FOLD_IDLE_MS, KEY_INDEX_FOLD_STEP, KEY_INDEX_PENDING_MAX, MEMO_ENTRIES_MAX,
    READERS_DEFAULT, RECENT_LIMIT_MAX, WRITER_QUEUE_MAX,
};
use crate::memo::MemoEntry;
use crate::record::{IntentId, IntentRecord, Proposal, ProposeDecision, Transition};
use crate::{Journal, JournalError};
use async_trait::async_trait;
use futures::channel::oneshot;
use ring0_core::{Fingerprint, IntentState, Observation, SemanticKey};
use rusqlite::{Connection, ErrorCode, OpenFlags, OptionalExtension, Row, params};
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write as _};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The checkpointer checkpoints once the writer has committed nothing for this long (50 ms).
pub const CHECKPOINT_IDLE_MS: u64 = 50;
/// ... or once this many WAL frames wait to be copied back (65,536: 64 MiB with the default
/// 1 KiB pages), which bounds each checkpoint's work under constant load — a bound in batches
/// would not, since a batch holds from one request to [`GROUP_COMMIT_BATCH_MAX`]. (The WAL
/// file itself starts again from its beginning only after a checkpoint that catches up with
/// the writer, so under load without a pause it keeps growing; the idle checkpoint is what
/// resets it.) Checkpointing much more often makes the checkpoint's database fsync compete with
/// commits: measured with `cargo bench -p ring0-journal --bench commit` (two runs each), 8,192
/// frames made the p99 under 64 proposers 2–3x worse; 65,536 left it within the run-to-run
/// noise.
pub const CHECKPOINT_WAL_FRAMES_MAX: i64 = 65_536;
/// How often the checkpointer looks (25 ms).
const CHECKPOINT_TICK_MS: u64 = 25;

/// What the writer tells the checkpointer, and the journal's owner through [`WriterStats`].
#[derive(Default)]
struct WalActivity {
    /// The batches' counters.
    stats: WriterCounters,
    /// Milliseconds since the journal opened, at the last commit.
    last_commit_ms: std::sync::atomic::AtomicU64,
    /// Batches committed since the checkpointer last checkpointed: whether there is anything to
    /// look at.
    batches_since_checkpoint: std::sync::atomic::AtomicU64,
}

/// What the writer's group commits have done since the journal opened: for operators (how
/// large batches are, where a batch's time goes) and for `cargo bench -p ring0-journal --bench
/// commit`. Idle folds of the key index are not counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriterStats {
    /// Batches committed: one transaction and one fsync each.
    pub batches: u64,
    /// Requests (proposals, transitions, memo writes) those batches answered.
    pub requests: u64,
    /// Time from each batch's BEGIN to its COMMIT: deciding and writing its requests,
    /// including any wait for requests still on their way (see `Gather`).
    pub deciding: Duration,
    /// Time in the batches' COMMITs, their fsync included.
    pub committing: Duration,
    /// Proposals whose keys the writer looked up in the key-index tables: those memory did
    /// not answer and the filter of folded entries could not rule out.
    pub table_probes: u64,
}

impl WriterStats {
    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &WriterStats) -> WriterStats {
        WriterStats {
            batches: self.batches.saturating_sub(earlier.batches),
            requests: self.requests.saturating_sub(earlier.requests),
            deciding: self.deciding.saturating_sub(earlier.deciding),
            committing: self.committing.saturating_sub(earlier.committing),
            table_probes: self.table_probes.saturating_sub(earlier.table_probes),
        }
    }
}

/// The writer's counters behind [`WriterStats`].
#[derive(Default)]
struct WriterCounters {
    batches: std::sync::atomic::AtomicU64,
    requests: std::sync::atomic::AtomicU64,
    deciding_ns: std::sync::atomic::AtomicU64,
    committing_ns: std::sync::atomic::AtomicU64,
    table_probes: std::sync::atomic::AtomicU64,
}

impl WriterCounters {
    fn add(&self, requests: usize, timing: BatchTiming, table_probes: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        self.table_probes.fetch_add(table_probes, Relaxed);
        let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.batches.fetch_add(1, Relaxed);
        self.requests.fetch_add(requests as u64, Relaxed);
        self.deciding_ns.fetch_add(ns(timing.deciding), Relaxed);
        self.committing_ns.fetch_add(ns(timing.committing), Relaxed);
    }

    fn snapshot(&self) -> WriterStats {
        use std::sync::atomic::Ordering::Relaxed;
        WriterStats {
            batches: self.batches.load(Relaxed),
            requests: self.requests.load(Relaxed),
            deciding: Duration::from_nanos(self.deciding_ns.load(Relaxed)),
            committing: Duration::from_nanos(self.committing_ns.load(Relaxed)),
            table_probes: self.table_probes.load(Relaxed),
        }
    }
}

/// How long a committed batch took to decide and to commit; zero for a batch that failed.
#[derive(Clone, Copy, Default)]
struct BatchTiming {
    deciding: Duration,
    committing: Duration,
}

/// Page size of a new journal (1 KiB). Each new intent goes into two indexes keyed by hashes,
/// at random places, so folding n intents dirties about 2n scattered pages; with small pages
/// that is a quarter of the WAL bytes (and fsync time) of 4 KiB pages. Chosen when those index
/// writes were part of every commit, measured with `cargo bench -p ring0-journal --bench
/// commit`: p99 under 64 proposers fell from 5.8–9.5x to 4.2–5.0x the single-commit latency.
/// Now that commits append rows only (see the `key_index` module), 4 KiB pages measured about
/// 10% less writer time per 64-intent batch (fewer WAL frames), within the run-to-run noise of
/// the bench's ratios; the folds' cost kept this size.
pub const PAGE_SIZE_BYTES: u32 = 1024;

/// Page cache of the writer connection (16 MiB; SQLite's default is 2 MiB). Deciding a new
/// intent looks its key and content digest up in two hash-keyed indexes, a leaf page at a random
/// place in each; once those indexes outgrow the cache every look-up reads its pages back from
/// the OS. Measured with `perf` on the writer thread during `cargo bench -p ring0-journal --bench
/// commit` (about 47,000 intents by its end): re-reading pages took about a tenth of its time
/// with the default cache, and almost none with this one.
pub const WRITER_CACHE_KIB: u32 = 16 * 1024;

/// `PRAGMA application_id` of a ring0 journal ("r0jl").
const APPLICATION_ID: i64 = 0x7230_6a6c;

/// Schema migrations; `PRAGMA user_version` is the number that ran.
const MIGRATIONS: &[&str] = &[
    // 1: intents with their timelines, the semantic-key and content indexes, memoized reads.
    "CREATE TABLE intents (
        seq             INTEGER PRIMARY KEY AUTOINCREMENT,
        id              TEXT    NOT NULL UNIQUE,
        semantic_key    TEXT    NOT NULL,
        scope           TEXT    NOT NULL,
        attempt_epoch   INTEGER NOT NULL,
        tool            TEXT    NOT NULL,
        args_sha256     TEXT    NOT NULL,
        args_bytes      INTEGER NOT NULL,
        args_inline     TEXT,
        call_ids        TEXT    NOT NULL,
        idempotency_key TEXT    NOT NULL,
        mutating        INTEGER NOT NULL,
        fence           INTEGER NOT NULL,
        attempts        INTEGER NOT NULL,
        state           TEXT    NOT NULL,
        timeline        TEXT    NOT NULL,
        receipt         TEXT,
        snapshot        TEXT,
        owner           INTEGER NOT NULL,
        created_ms      INTEGER NOT NULL,
        updated_ms      INTEGER NOT NULL
    );
    CREATE INDEX intents_by_state ON intents(state, seq);
    CREATE TABLE intent_keys (
        semantic_key TEXT PRIMARY KEY,
        intent_seq   INTEGER NOT NULL REFERENCES intents(seq)
    ) WITHOUT ROWID;
    CREATE TABLE intent_contents (
        content_digest TEXT PRIMARY KEY,
        intent_seq     INTEGER NOT NULL REFERENCES intents(seq)
    ) WITHOUT ROWID;
    CREATE TABLE memo (
        fingerprint TEXT PRIMARY KEY,
        observation TEXT NOT NULL,
        stored_ms   INTEGER NOT NULL
    ) WITHOUT ROWID;
    CREATE INDEX memo_by_age ON memo(stored_ms);",
    // 2: the key index is folded lazily. `content_digest` lets the in-memory part be rebuilt
    // from the rows without reading spilled arguments; `indexed_through` is the highest `seq`
    // whose keys are all in `intent_keys`/`intent_contents`. A version-1 journal indexed every
    // intent as it was inserted, so its watermark is its last `seq` (its older rows never need
    // the digest column).
    "ALTER TABLE intents ADD COLUMN content_digest TEXT;
    CREATE TABLE key_index_watermark (
        only_row        INTEGER PRIMARY KEY CHECK (only_row = 1),
        indexed_through INTEGER NOT NULL
    );
    INSERT INTO key_index_watermark (only_row, indexed_through)
        SELECT 1, coalesce(max(seq), 0) FROM intents;",
];

/// The columns `from_row` reads, as a macro so statements are built with `concat!` at compile
/// time (no string formatting per request).
macro_rules! cols {
    () => {
        "id, semantic_key, scope, attempt_epoch, tool, args_sha256, args_bytes, args_inline, \
         call_ids, idempotency_key, mutating, fence, attempts, state, timeline, receipt, \
         snapshot, owner"
    };
}

/// States a record can leave: what `open_records` returns.
macro_rules! open_states {
    () => {
        "('PROPOSED','RECORDED','DISPATCHED','UNKNOWN','RECONCILING')"
    };
}

const SELECT_BY_ID: &str = concat!("SELECT ", cols!(), " FROM intents WHERE id = ?1");
const SELECT_BY_SEQ: &str = concat!("SELECT ", cols!(), " FROM intents WHERE seq = ?1");
const SELECT_BY_KEY: &str = concat!(
    "SELECT ",
    cols!(),
    " FROM intents WHERE seq = (SELECT intent_seq FROM intent_keys WHERE semantic_key = ?1)"
);
/// The `seq` each index table names for a semantic key (?1) and a content digest (?2).
const PROBE_INDEX: &str = "SELECT
    (SELECT intent_seq FROM intent_keys WHERE semantic_key = ?1),
    (SELECT intent_seq FROM intent_contents WHERE content_digest = ?2)";
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
const INSERT_INTENT: &str = concat!(
    "INSERT INTO intents (",
    cols!(),
    ", content_digest, created_ms, updated_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, \
     ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?20)"
);
const UPSERT_KEY: &str = "INSERT INTO intent_keys (semantic_key, intent_seq) VALUES (?1, ?2)
     ON CONFLICT(semantic_key) DO UPDATE SET intent_seq = excluded.intent_seq";
const UPSERT_CONTENT: &str =
    "INSERT INTO intent_contents (content_digest, intent_seq) VALUES (?1, ?2)
     ON CONFLICT(content_digest) DO UPDATE SET intent_seq = excluded.intent_seq";
const SET_WATERMARK: &str =
    "UPDATE key_index_watermark SET indexed_through = ?1 WHERE only_row = 1";

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

/// The files of one journal.
#[derive(Debug, Clone)]
struct Files {
    db: PathBuf,
    spill: PathBuf,
}

impl Files {
    fn new(db: &Path) -> Self {
        let mut spill = db.as_os_str().to_owned();
        spill.push(".spill");
        Self {
            db: db.to_path_buf(),
            spill: PathBuf::from(spill),
        }
    }

    fn lock_path(&self) -> PathBuf {
        let mut p = self.db.as_os_str().to_owned();
        p.push(".lock");
        PathBuf::from(p)
    }

    fn corrupt(&self, detail: impl Into<String>) -> JournalError {
        JournalError::Corrupt {
            path: self.db.clone(),
            detail: detail.into(),
        }
    }

    /// Maps a SQLite error: full → [`JournalError::Full`], corrupt → [`JournalError::Corrupt`].
    fn sql(&self, e: rusqlite::Error) -> JournalError {
        match e.sqlite_error_code() {
            Some(ErrorCode::DiskFull) => JournalError::Full(e.to_string()),
            Some(ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase) => {
                self.corrupt(e.to_string())
            }
            _ => JournalError::Storage(format!("{}: {e}", self.db.display())),
        }
    }

    fn io(&self, what: &str, path: &Path, e: std::io::Error) -> JournalError {
        match e.kind() {
            std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded => {
                JournalError::Full(format!("{what} {}: {e}", path.display()))
            }
            _ => JournalError::Storage(format!("{what} {}: {e}", path.display())),
        }
    }
}

type Reply<T> = oneshot::Sender<Result<T, JournalError>>;

/// A proposal with everything the writer needs that does not depend on what is recorded,
/// computed on the caller's thread: the one writer thread is the journal's bottleneck under
/// load, so it only looks up, decides and runs SQL. That includes the record the proposal
/// creates if nothing recorded decides it (most proposals), with its columns already in their
/// stored form: for those the writer inserts a row and answers [`Proposed::Fresh`], and the
/// caller hands its own record back, so the writer neither builds nor copies one.
struct PreparedProposal {
    proposal: Proposal,
    /// `semantic_key.encode()`, the stored form.
    key_text: String,
    /// The content digest (see `decide::content_digest`), and its stored form.
    content: ContentDigest,
    content_hex: String,
    /// SHA-256 of the canonical arguments: the name of their spill file.
    args_sha256: String,
    /// The new record (`decide::new_record`), stamped with the caller's clock.
    fresh: IntentRecord,
    /// Its id, call ids and timeline as stored.
    fresh_id: String,
    fresh_call_ids: String,
    fresh_timeline: String,
    /// The time it was stamped with.
    fresh_ms: u64,
}

impl PreparedProposal {
    /// `incarnation` owns the new record. An id is drawn from `clock` whenever the host names
    /// none, whether or not the record is created (the memory journal draws alike).
    fn new(proposal: Proposal, clock: &dyn Clock, incarnation: u64) -> Self {
        let p = &proposal;
        let content =
            decide::content_digest_bytes(&p.tool, &p.scope, p.attempt_epoch, &p.canonical_args);
        let fresh_ms = clock.now_ms();
        let id = p.intent_id.unwrap_or_else(|| clock.new_id());
        let fresh = decide::new_record(p, id, fresh_ms, incarnation);
        Self {
            key_text: p.semantic_key.encode(),
            content,
            content_hex: decide::hex(&content),
            args_sha256: decide::sha256_hex(p.canonical_args.as_bytes()),
            fresh_id: id.to_string(),
            fresh_call_ids: json(&fresh.call_ids),
            fresh_timeline: json(&fresh.timeline),
            fresh,
            fresh_ms,
            proposal,
        }
    }
}

/// The writer's answer to a proposal.
// Moved once, through a channel: boxing the large variant would add an allocation, made on the
// writer's thread, to every answer that is not `Fresh`.
#[allow(clippy::large_enum_variant)]
enum Proposed {
    /// The proposal's own new record ([`PreparedProposal::fresh`]) was inserted: RECORDED.
    Fresh,
    /// Records already in the journal decided it.
    Decided(ProposeDecision),
}

/// A request to the writer. Proposals and transitions are shared with the caller, who holds
/// them until answered: the writer drops its reference before it answers, so their memory is
/// freed on the caller's thread, where it was allocated. (Freeing a batch of other threads'
/// allocations took the writer about a quarter of each 64-intent batch in `cargo bench -p
/// ring0-journal --bench commit`, contending for the callers' malloc arena while they built
/// their next requests.)
enum WriteJob {
    Propose(Arc<PreparedProposal>, Reply<Proposed>),
    Transition(Arc<Transition>, Reply<IntentRecord>),
    MemoPut(Fingerprint, MemoEntry, Reply<bool>),
}

enum Done {
    Decision(Proposed),
    Record(IntentRecord),
    Stored(bool),
}

type ReadJob = Box<dyn FnOnce(&Connection, &Files) + Send>;

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

/// How the writer maintains the key index. Always the named limits outside this module's
/// tests, which shrink them to observe folding deterministically.
#[derive(Debug, Clone, Copy)]
struct IndexTuning {
    /// Idle time after which the writer folds; `None`: never while open.
    fold_idle: Option<Duration>,
    /// Most entries folded per idle transaction.
    chunk: usize,
    /// Most entries held in memory.
    pending_max: usize,
    /// Whether a clean close folds every entry.
    fold_on_close: bool,
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

        let mut threads = Vec::new();
        let (writer_tx, writer_rx) = mpsc::sync_channel::<WriteJob>(WRITER_QUEUE_MAX);
        let (wfiles, wclock) = (files.clone(), options.clock.clone());
        let activity = Arc::new(WalActivity::default());
        let opened = std::time::Instant::now();
        let wactivity = activity.clone();
        let reported = activity.clone();
        threads.push(
            std::thread::Builder::new()
                .name("ring0-journal-writer".into())
                .spawn(move || {
                    writer_loop(
                        conn,
                        wfiles,
                        wclock,
                        incarnation,
                        writer_rx,
                        wactivity,
                        opened,
                        key_index,
                    )
                })
                .map_err(|e| JournalError::Storage(format!("starting the writer thread: {e}")))?,
        );
        let (reader_tx, reader_rx) = mpsc::channel::<ReadJob>();
        let reader_rx = Arc::new(Mutex::new(reader_rx));
        for n in 0..options.readers.max(1) {
            let conn = open_connection(&files, false)?;
            configure_reader(&conn, &files)?;
            let (rx, rfiles) = (reader_rx.clone(), files.clone());
            threads.push(
                std::thread::Builder::new()
                    .name(format!("ring0-journal-reader-{n}"))
                    .spawn(move || reader_loop(conn, rfiles, rx))
                    .map_err(|e| JournalError::Storage(format!("starting a reader thread: {e}")))?,
            );
        }
        let conn = open_connection(&files, false)?;
        conn.execute_batch("PRAGMA busy_timeout = 5000;")
            .map_err(|e| files.sql(e))?;
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        let checkpointer = std::thread::Builder::new()
            .name("ring0-journal-checkpointer".into())
            .spawn(move || checkpoint_loop(conn, stop_rx, activity, opened))
            .map_err(|e| JournalError::Storage(format!("starting the checkpointer: {e}")))?;
        Ok(Self {
            files,
            clock: options.clock,
            writer_tx: Some(writer_tx),
            reader_tx: Some(reader_tx),
            threads,
            checkpointer: Some((stop_tx, checkpointer)),
            incarnation,
            index,
            activity: reported,
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

    async fn get(&self, id: IntentId) -> Result<Option<IntentRecord>, JournalError> {
        self.read(move |conn, files| load_by_id(conn, files, &id))
            .await
    }

    async fn find_by_key(&self, key: &SemanticKey) -> Result<Option<IntentRecord>, JournalError> {
        let (key, index) = (*key, self.index.clone());
        self.read(move |conn, files| {
            // The in-memory entries first, then the tables. Race-free against a concurrent
            // fold, which commits the entries to the tables and only then removes them from the
            // map: a lookup that still finds an entry in the map reads its row (committed before
            // the entry joined the map), and a lookup that no longer finds it runs its SQL
            // after the removal, so after the fold's COMMIT, and (each statement being its own
            // read transaction) sees the folded rows. Tables first would not be: between the
            // SQL miss and the map look-up a fold could move the entry from one to the other.
            let seq = read_index(&index).seq_of_key(&key);
            match seq {
                Some(seq) => load_indexed(conn, files, seq).map(Some),
                None => load_one(conn, files, SELECT_BY_KEY, [key.encode()]),
            }
        })
        .await
    }

    async fn open_records(&self) -> Result<Vec<IntentRecord>, JournalError> {
        self.read(|conn, files| load_many(conn, files, SELECT_OPEN, []))
            .await
    }

    async fn recent(&self, limit: usize) -> Result<Vec<IntentRecord>, JournalError> {
        let limit = i64::try_from(limit.min(RECENT_LIMIT_MAX)).unwrap_or(0);
        self.read(move |conn, files| recent(conn, files, limit))
            .await
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
        self.read(move |conn, files| {
            let row = conn
                .query_row(
                    "SELECT observation, stored_ms FROM memo WHERE fingerprint = ?1",
                    [&fp],
                    |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)),
                )
                .optional()
                .map_err(|e| files.sql(e))?;
            Ok(row.and_then(|(text, at)| {
                MemoEntry {
                    text,
                    stored_ms: u64::try_from(at).unwrap_or(u64::MAX),
                }
                .serve(now, max_age_ms)
            }))
        })
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

// ---------------------------------------------------------------------------------------------
// Opening

fn acquire_lock(files: &Files) -> Result<File, JournalError> {
    let path = files.lock_path();
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| files.io("opening lock file", &path, e))?;
    match file.try_lock() {
        Ok(()) => {
            // Who holds it, for the next opener's error message; the lock itself is the flock.
            let _ = file.set_len(0);
            let _ = write!(file, "{}", std::process::id());
            Ok(file)
        }
        Err(fs::TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = holder.trim();
            Err(JournalError::Locked {
                path: files.db.clone(),
                holder: if holder.is_empty() {
                    String::new()
                } else {
                    format!(" (pid {holder})")
                },
            })
        }
        Err(fs::TryLockError::Error(e)) => Err(files.io("locking", &path, e)),
    }
}

fn open_connection(files: &Files, create: bool) -> Result<Connection, JournalError> {
    let mut flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    if create {
        flags |= OpenFlags::SQLITE_OPEN_CREATE;
    }
    Connection::open_with_flags(&files.db, flags).map_err(|e| files.sql(e))
}

fn pragma_text(conn: &Connection, files: &Files, sql: &str) -> Result<String, JournalError> {
    conn.query_row(sql, [], |r| r.get::<_, String>(0))
        .map_err(|e| files.sql(e))
}

fn configure_writer(
    conn: &Connection,
    files: &Files,
    options: &SqliteOptions,
) -> Result<(), JournalError> {
    // Every statement the writer runs per request stays prepared.
    conn.set_prepared_statement_cache_capacity(32);
    // Takes effect only when the file is created; an existing journal keeps its page size.
    conn.execute_batch(&format!("PRAGMA page_size = {PAGE_SIZE_BYTES}"))
        .map_err(|e| files.sql(e))?;
    // The first statement that reads the header: a file that is not a database fails here.
    let mode = pragma_text(conn, files, "PRAGMA journal_mode = WAL")?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(JournalError::Storage(format!(
            "{}: could not switch to WAL (journal_mode is {mode})",
            files.db.display()
        )));
    }
    conn.execute_batch(
        "PRAGMA synchronous = FULL;
         PRAGMA foreign_keys = ON;
         PRAGMA busy_timeout = 5000;
         PRAGMA wal_autocheckpoint = 0;",
    )
    .map_err(|e| files.sql(e))?;
    conn.execute_batch(&format!("PRAGMA cache_size = -{WRITER_CACHE_KIB}"))
        .map_err(|e| files.sql(e))?;
    if let Some(max) = options.max_size_bytes {
        let page: i64 = conn
            .query_row("PRAGMA page_size", [], |r| r.get(0))
            .map_err(|e| files.sql(e))?;
        let pages = i64::try_from(max).unwrap_or(i64::MAX) / page.max(512);
        conn.query_row(
            &format!("PRAGMA max_page_count = {}", pages.max(1)),
            [],
            |_| Ok(()),
        )
        .map_err(|e| files.sql(e))?;
    }
    if options.check_integrity {
        let verdict = pragma_text(conn, files, "PRAGMA quick_check")?;
        if verdict != "ok" {
            return Err(files.corrupt(format!("quick_check: {verdict}")));
        }
    }
    Ok(())
}

fn configure_reader(conn: &Connection, files: &Files) -> Result<(), JournalError> {
    conn.execute_batch("PRAGMA query_only = 1; PRAGMA busy_timeout = 5000;")
        .map_err(|e| files.sql(e))
}

fn migrate(conn: &Connection, files: &Files) -> Result<(), JournalError> {
    let app: i64 = conn
        .query_row("PRAGMA application_id", [], |r| r.get(0))
        .map_err(|e| files.sql(e))?;
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(|e| files.sql(e))?;
    let tables: i64 = conn
        .query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get(0))
        .map_err(|e| files.sql(e))?;
    let supported = MIGRATIONS.len() as i64;
    if app == 0 && version == 0 && tables == 0 {
        // A new, empty database: claim it.
        conn.execute_batch(&format!("PRAGMA application_id = {APPLICATION_ID}"))
            .map_err(|e| files.sql(e))?;
    } else if app != APPLICATION_ID {
        return Err(files.corrupt(format!(
            "not a ring0 journal (application_id {app:#x}, {tables} schema objects)"
        )));
    }
    if version > supported {
        return Err(JournalError::SchemaTooNew {
            path: files.db.clone(),
            found: version,
            supported,
        });
    }
    for (n, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        let to = n + 1;
        conn.execute_batch(&format!(
            "BEGIN IMMEDIATE; {sql}; PRAGMA user_version = {to}; COMMIT;"
        ))
        .map_err(|e| {
            let _ = conn.execute_batch("ROLLBACK");
            files.sql(e)
        })?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The writer

/// Takes a poisoned lock anyway: the map is changed only by whole-entry operations, so a panic
/// elsewhere cannot leave it half-updated.
fn read_index(index: &RwLock<PendingIndex>) -> std::sync::RwLockReadGuard<'_, PendingIndex> {
    index.read().unwrap_or_else(|e| e.into_inner())
}

fn write_index(index: &RwLock<PendingIndex>) -> std::sync::RwLockWriteGuard<'_, PendingIndex> {
    index.write().unwrap_or_else(|e| e.into_inner())
}

/// The writer's side of the key index (see the `key_index` module): the shared map of pending
/// entries and what the database says about them.
struct KeyIndex {
    shared: Arc<RwLock<PendingIndex>>,
    tuning: IndexTuning,
    /// `indexed_through` as committed: every mutating intent at or below it is in the tables.
    watermark: i64,
    /// The highest `seq` committed (mutating or not).
    max_seq: i64,
    /// What the tables may hold, so most new keys skip the probe (see the `folded_filter`
    /// module). Entries join it before the fold that writes them commits.
    folded: FoldedFilter,
    /// Probes of the tables by the batch being decided, for [`WriterStats::table_probes`].
    table_probes: std::cell::Cell<u64>,
}

impl KeyIndex {
    /// Reads the watermark and rebuilds the pending entries from the rows above it, in `seq`
    /// order, so the last insert of a key wins as it did when they were written.
    fn load(conn: &Connection, files: &Files, tuning: IndexTuning) -> Result<Self, JournalError> {
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
                .and_then(|t| ring0_core::identity::Digest32::from_hex(&t))
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
            table_probes: std::cell::Cell::new(0),
        })
    }

    fn pending(&self) -> usize {
        read_index(&self.shared).len()
    }

    /// Whether the tables lag behind the rows: entries to fold, or a watermark to advance past
    /// intents that are not indexed (reads), so the next open scans nothing twice.
    fn needs_fold(&self) -> bool {
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
    fn fold_chunk(
        &mut self,
        conn: &Connection,
        files: &Files,
        chunk: usize,
        interrupt: Option<&Receiver<WriteJob>>,
    ) -> Result<Option<WriteJob>, JournalError> {
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
fn fold_transaction(
    conn: &Connection,
    entries: &[IndexEntry],
    watermark: i64,
    interrupt: Option<&Receiver<WriteJob>>,
    folded: &mut FoldedFilter,
) -> rusqlite::Result<Option<WriteJob>> {
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

/// Tells the checkpointer that a transaction committed.
fn note_commit(activity: &WalActivity, opened: Instant) {
    use std::sync::atomic::Ordering::Relaxed;
    let since_open = u64::try_from(opened.elapsed().as_millis()).unwrap_or(u64::MAX);
    activity.last_commit_ms.store(since_open, Relaxed);
    activity.batches_since_checkpoint.fetch_add(1, Relaxed);
}

#[allow(clippy::too_many_arguments)]
fn writer_loop(
    mut conn: Connection,
    files: Files,
    clock: Arc<dyn Clock>,
    incarnation: u64,
    rx: Receiver<WriteJob>,
    activity: Arc<WalActivity>,
    opened: Instant,
    mut index: KeyIndex,
) {
    // Callers answered by the last batch, and how long its COMMIT (its fsync) took: how many
    // requests the next batch waits for, and for how long at most (see `Gather`).
    let mut answered_last = 0;
    let mut commit_last = Duration::ZERO;
    let mut staged = Staged::default();
    // A request taken off the queue between two idle folds, to start the next batch with.
    let mut next: Option<WriteJob> = None;
    loop {
        let first = match next.take() {
            Some(job) => job,
            None => match index.tuning.fold_idle.filter(|_| index.needs_fold()) {
                None => match rx.recv() {
                    Ok(job) => job,
                    Err(_) => break,
                },
                Some(idle) => match rx.recv_timeout(idle) {
                    Ok(job) => job,
                    Err(mpsc::RecvTimeoutError::Disconnected) => break,
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        // Idle: fold chunk by chunk, looking at the queue between chunks, so a
                        // caller waits for one chunk at most. A failed fold is retried after
                        // the next idle period; the entries stay in memory meanwhile.
                        while index.needs_fold() {
                            match index.fold_chunk(&conn, &files, index.tuning.chunk, Some(&rx)) {
                                Ok(None) => note_commit(&activity, opened),
                                Ok(Some(job)) => {
                                    next = Some(job);
                                    break;
                                }
                                Err(_) => break,
                            }
                        }
                        continue;
                    }
                },
            },
        };
        let gather = Gather::after(answered_last, commit_last);
        let mut batch = Vec::with_capacity(gather.expected.max(1));
        batch.push(first);
        let (results, timing) = commit_batch(
            &mut conn,
            &files,
            clock.as_ref(),
            incarnation,
            &mut batch,
            &rx,
            gather,
            &mut index,
            &mut staged,
        );
        answered_last = batch.len();
        commit_last = timing.committing;
        let probes = index.table_probes.take();
        if !timing.committing.is_zero() {
            activity.stats.add(batch.len(), timing, probes);
        }
        note_commit(&activity, opened);
        for (job, result) in batch.into_iter().zip(results) {
            match job {
                WriteJob::Propose(prepared, reply) => {
                    drop(prepared);
                    let _ = reply.send(result.map(|d| match d {
                        Done::Decision(d) => d,
                        _ => unreachable!("a proposal decides"),
                    }));
                }
                WriteJob::Transition(transition, reply) => {
                    drop(transition);
                    let _ = reply.send(result.map(|d| match d {
                        Done::Record(r) => r,
                        _ => unreachable!("a transition returns a record"),
                    }));
                }
                WriteJob::MemoPut(_, _, reply) => {
                    let _ = reply.send(result.map(|d| match d {
                        Done::Stored(b) => b,
                        _ => unreachable!("a memo write returns whether it stored"),
                    }));
                }
            }
        }
    }
    // A clean close folds every entry, so the next open has nothing to rebuild, in large chunks
    // since no caller is left to give way to. Stopping at a failure loses nothing: the next open
    // rebuilds what is left from the rows.
    if index.tuning.fold_on_close {
        while index.needs_fold()
            && index
                .fold_chunk(&conn, &files, KEY_INDEX_CLOSE_FOLD_CHUNK, None)
                .is_ok()
        {}
    }
    // Fold the WAL back into the database so a clean close leaves one file.
    let _ = conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)");
}

/// How the writer forms the next batch after the one that answered `answered_last` callers and
/// whose COMMIT took `commit_last`.
///
/// Callers answered together tend to come back together (the proposers of one round each
/// dispatch and settle, or propose their next intent), but not at the same instant: their
/// requests trickle in. Committing as soon as the first is decided would start a batch the rest miss,
/// and they would wait for its fsync and then for their own — two commits instead of one. So
/// the writer keeps the transaction open for them, deciding each as it arrives, until as many
/// requests as it last answered are in or it has spent [`GROUP_COMMIT_GATHER_PERCENT`] of the
/// last commit's time (never more than [`GROUP_COMMIT_GATHER_US_MAX`]) waiting for one with
/// nothing to decide. Only that idle time counts: a batch of many callers takes longer to decide
/// than the budget, and a caller that falls a little behind the others (descheduled for a few
/// microseconds) would otherwise find the batch closed and wait for two commits. A lone caller
/// never waits: the last batch answered one caller and it is here.
struct Gather {
    expected: usize,
    /// Idle time the batch may still spend waiting.
    budget: std::cell::Cell<Duration>,
}

impl Gather {
    fn after(answered_last: usize, commit_last: Duration) -> Self {
        let wait = (commit_last * GROUP_COMMIT_GATHER_PERCENT / 100)
            .min(Duration::from_micros(GROUP_COMMIT_GATHER_US_MAX));
        Self {
            expected: answered_last.min(GROUP_COMMIT_BATCH_MAX),
            budget: std::cell::Cell::new(wait),
        }
    }

    /// The next request to add to `batch`, if one is waiting or is worth waiting for.
    fn next(&self, rx: &Receiver<WriteJob>, batch_len: usize) -> Option<WriteJob> {
        if batch_len >= GROUP_COMMIT_BATCH_MAX {
            return None;
        }
        if let Ok(job) = rx.try_recv() {
            return Some(job);
        }
        if batch_len >= self.expected {
            return None;
        }
        let left = self.budget.get();
        if left.is_zero() {
            return None;
        }
        let started = Instant::now();
        let job = rx.recv_timeout(left).ok();
        self.budget.set(left.saturating_sub(started.elapsed()));
        job
    }
}

/// Decides `batch` and every request [`Gather`] adds to it in one transaction, each job atomic
/// on its own, and commits: one fsync for all. Returns the results, in `batch` order, and
/// how long the COMMIT took.
///
/// The key-index entries of the batch's new intents are staged as each job's savepoint is
/// released and join the shared map once the COMMIT succeeded, before any caller is answered;
/// a batch that fails leaves the map as it was. If the map would grow past its cap, the oldest
/// entries are folded inside this transaction.
#[allow(clippy::too_many_arguments)]
fn commit_batch(
    conn: &mut Connection,
    files: &Files,
    clock: &dyn Clock,
    incarnation: u64,
    batch: &mut Vec<WriteJob>,
    rx: &Receiver<WriteJob>,
    gather: Gather,
    index: &mut KeyIndex,
    staged: &mut Staged,
) -> (Vec<Result<Done, JournalError>>, BatchTiming) {
    staged.clear();
    let fail_all = |n: usize, e: JournalError, staged: &mut Staged| {
        staged.clear();
        let results = (0..n).map(|_| Err(e.clone())).collect::<Vec<_>>();
        (results, BatchTiming::default())
    };
    let begun = Instant::now();
    if let Err(e) = exec_cached(conn, "BEGIN IMMEDIATE") {
        return fail_all(batch.len(), files.sql(e), staged);
    }
    let now = clock.now_ms();
    // Sized for the requests the batch expects, so gathering them never moves the results.
    let mut results = Vec::with_capacity(batch.len().max(gather.expected));
    let mut max_seq = index.max_seq;
    loop {
        while let Some(job) = batch.get(results.len()) {
            // A proposal or a transition writes with one statement at most, which SQLite makes
            // atomic by itself: a statement that fails undoes its own changes and leaves the
            // transaction open (and one that takes the transaction down is caught below). Only
            // a memo write, two statements, needs a savepoint of its own.
            let savepoint = matches!(job, WriteJob::MemoPut(..));
            if savepoint && let Err(e) = exec_cached(conn, "SAVEPOINT job") {
                results.push(Err(files.sql(e)));
                continue;
            }
            let result = apply(conn, files, now, incarnation, job, index, staged);
            if let Err(e) = &result
                && conn.is_autocommit()
            {
                // SQLite rolled the whole transaction back itself (SQLITE_FULL, an I/O error):
                // every decision of this batch is gone, so every request fails closed.
                return fail_all(batch.len(), e.clone(), staged);
            }
            let end = if !savepoint {
                Ok(())
            } else if result.is_ok() {
                exec_cached(conn, "RELEASE job")
            } else {
                exec_cached(conn, "ROLLBACK TO job").and_then(|()| exec_cached(conn, "RELEASE job"))
            };
            match end {
                Ok(()) => results.push(result.map(|(done, inserted)| {
                    if let Some(inserted) = inserted {
                        max_seq = max_seq.max(inserted.seq);
                        if let Some(entry) = inserted.entry {
                            staged.push(entry);
                        }
                    }
                    done
                })),
                Err(e) => {
                    let _ = conn.execute_batch("ROLLBACK");
                    return fail_all(batch.len(), files.sql(e), staged);
                }
            }
        }
        match gather.next(rx, batch.len()) {
            Some(job) => batch.push(job),
            None => break,
        }
    }
    // Under load without a pause the map reaches its cap: fold the oldest entries here, at
    // least a chunk so this does not recur on every batch.
    let pending = index.pending();
    let over = (pending + staged.len()).saturating_sub(index.tuning.pending_max);
    let mut folded = None;
    if over > 0 {
        let entries = read_index(&index.shared).oldest(over.max(index.tuning.chunk));
        if let Some(last) = entries.last() {
            // Entries above the watermark are all pending, so everything up to the last one
            // folded is in the tables once this commits.
            let written = write_index_entries(conn, &entries, &mut index.folded)
                .and_then(|()| conn.prepare_cached(SET_WATERMARK)?.execute([last.seq]));
            if let Err(e) = written {
                let _ = conn.execute_batch("ROLLBACK");
                return fail_all(batch.len(), files.sql(e), staged);
            }
            folded = Some((entries.len(), last.seq));
        }
    }
    let started = Instant::now();
    match exec_cached(conn, "COMMIT") {
        Ok(()) => {
            let timing = BatchTiming {
                deciding: started - begun,
                committing: started.elapsed(),
            };
            let mut pending = write_index(&index.shared);
            if let Some((n, watermark)) = folded {
                pending.remove_oldest(n);
                index.watermark = watermark;
            }
            staged.drain_into(&mut pending);
            index.max_seq = max_seq;
            (results, timing)
        }
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            fail_all(batch.len(), files.sql(e), staged)
        }
    }
}

/// A row a job inserted: its `seq`, and its key-index entry if it is mutating.
struct Inserted {
    seq: i64,
    entry: Option<IndexEntry>,
}

/// The record a key-index entry names. Rows are never deleted and an entry joins the index only
/// with its row, so a missing row means the file was changed behind the journal's back.
fn load_indexed(conn: &Connection, files: &Files, seq: i64) -> Result<IntentRecord, JournalError> {
    load_one(conn, files, SELECT_BY_SEQ, [seq])?
        .ok_or_else(|| files.corrupt(format!("the key index names intent seq {seq}, not found")))
}

#[allow(clippy::too_many_arguments)]
fn apply(
    conn: &Connection,
    files: &Files,
    now: u64,
    incarnation: u64,
    job: &WriteJob,
    index: &KeyIndex,
    staged: &Staged,
) -> Result<(Done, Option<Inserted>), JournalError> {
    match job {
        WriteJob::Propose(prepared, _) => {
            let p = &prepared.proposal;
            let by_id = match p.intent_id {
                Some(id) => load_by_id(conn, files, &id)?,
                None => None,
            };
            let (by_key, by_content) = if p.mutating {
                // Newest first: this batch, then the pending entries, then the tables.
                let (key_seq, content_seq) = {
                    let pending = read_index(&index.shared);
                    let key = &p.semantic_key;
                    let content = &prepared.content;
                    (
                        staged.seq_of_key(key).or_else(|| pending.seq_of_key(key)),
                        staged
                            .seq_of_content(content)
                            .or_else(|| pending.seq_of_content(content)),
                    )
                };
                // The tables are asked only for what memory did not answer and they may hold.
                let probe = (key_seq.is_none() && index.folded.may_contain_key(&p.semantic_key))
                    || (content_seq.is_none()
                        && index.folded.may_contain_content(&prepared.content));
                let (key_seq, content_seq) = if probe {
                    index.table_probes.set(index.table_probes.get() + 1);
                    // One statement probes both tables; memory wins where it has an entry.
                    let (in_keys, in_contents) = conn
                        .prepare_cached(PROBE_INDEX)
                        .and_then(|mut stmt| {
                            stmt.query_row(params![prepared.key_text, prepared.content_hex], |r| {
                                Ok((r.get::<_, Option<i64>>(0)?, r.get::<_, Option<i64>>(1)?))
                            })
                        })
                        .map_err(|e| files.sql(e))?;
                    (key_seq.or(in_keys), content_seq.or(in_contents))
                } else {
                    (key_seq, content_seq)
                };
                let by_key = match key_seq {
                    Some(seq) => Some(load_indexed(conn, files, seq)?),
                    None => None,
                };
                let by_content = match content_seq {
                    // Usually the same record: read it once.
                    Some(seq) if key_seq == Some(seq) => by_key.clone(),
                    Some(seq) => Some(load_indexed(conn, files, seq)?),
                    None => None,
                };
                (by_key, by_content)
            } else {
                (None, None)
            };
            let expected_fence = by_key.as_ref().map(|r| r.fence);
            let found = Found {
                by_id: by_id.as_ref(),
                by_key: by_key.as_ref(),
                by_content: by_content.as_ref(),
            };
            let Some(plan) = decide::plan_existing(p, found, now, incarnation)? else {
                let seq = insert_fresh(conn, files, prepared)?;
                let entry = p.mutating.then_some(IndexEntry {
                    seq,
                    key: p.semantic_key,
                    content: prepared.content,
                });
                return Ok((
                    Done::Decision(Proposed::Fresh),
                    Some(Inserted { seq, entry }),
                ));
            };
            // A plan from the records found answers, or updates the record found by key.
            if let Some(Write::Update(record)) = plan.write {
                let fence = expected_fence.expect("an update follows a found record");
                update(conn, files, &record, fence, now)?;
            }
            Ok((Done::Decision(Proposed::Decided(plan.decision)), None))
        }
        WriteJob::Transition(t, _) => {
            let record = load_by_id(conn, files, &t.id)?.ok_or(JournalError::NotFound(t.id))?;
            let next = decide::plan_transition(&record, t, now, incarnation)?;
            update(conn, files, &next, record.fence, now)?;
            Ok((Done::Record(next), None))
        }
        WriteJob::MemoPut(fp, entry, _) => {
            conn.prepare_cached(
                "INSERT INTO memo (fingerprint, observation, stored_ms) VALUES (?1, ?2, ?3)
                 ON CONFLICT(fingerprint) DO UPDATE SET
                   observation = excluded.observation, stored_ms = excluded.stored_ms",
            )
            .and_then(|mut stmt| {
                stmt.execute(params![fp.encode(), entry.text, to_i64(entry.stored_ms)])
            })
            .map_err(|e| files.sql(e))?;
            conn.prepare_cached(
                "DELETE FROM memo WHERE fingerprint IN (
                   SELECT fingerprint FROM memo ORDER BY stored_ms, fingerprint
                   LIMIT max(0, (SELECT count(*) FROM memo) - ?1))",
            )
            .and_then(|mut stmt| stmt.execute([MEMO_ENTRIES_MAX as i64]))
            .map_err(|e| files.sql(e))?;
            Ok((Done::Stored(true), None))
        }
    }
}

/// Runs a parameterless statement through the statement cache (no re-parsing per request).
fn exec_cached(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("journal values serialize")
}

/// Inserts a proposal's new record, its columns prepared on the caller's thread, and returns
/// its `seq`. Its key-index entries are the caller's to stage: nothing here touches the index
/// tables.
fn insert_fresh(
    conn: &Connection,
    files: &Files,
    prepared: &PreparedProposal,
) -> Result<i64, JournalError> {
    let r = &prepared.fresh;
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
                prepared.fresh_id,
                prepared.key_text,
                r.scope,
                to_i64(r.attempt_epoch),
                r.tool,
                sha,
                r.canonical_args.len() as i64,
                inline,
                prepared.fresh_call_ids,
                r.idempotency_key,
                r.mutating,
                to_i64(r.fence),
                r.attempts,
                r.state.as_str(),
                prepared.fresh_timeline,
                None::<&str>,
                None::<&str>,
                to_i64(r.owner),
                prepared.content_hex,
                to_i64(prepared.fresh_ms),
            ])
        })
        .map_err(|e| files.sql(e))?;
    Ok(conn.last_insert_rowid())
}

/// Writes a changed record if its fence is still `expected_fence` (the compare-and-set, checked
/// again in SQL so no code path can skip it).
fn update(
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

/// Stores large arguments as `<spill>/<sha256>`: written to a temporary name, fsynced, renamed,
/// and the directory fsynced, so a committed record never names a missing or partial file.
fn spill(files: &Files, sha: &str, bytes: &[u8]) -> Result<(), JournalError> {
    let target = files.spill.join(sha);
    if target.exists() {
        return Ok(());
    }
    let tmp = files.spill.join(format!("{sha}.tmp"));
    let mut f = File::create(&tmp).map_err(|e| files.io("creating spill file", &tmp, e))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(|e| files.io("writing spill file", &tmp, e))?;
    fs::rename(&tmp, &target).map_err(|e| files.io("renaming spill file", &target, e))?;
    File::open(&files.spill)
        .and_then(|d| d.sync_all())
        .map_err(|e| files.io("syncing spill directory", &files.spill, e))?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Reading

/// Folds the WAL back into the database file when the writer is idle or the WAL has grown,
/// until told to stop (its channel closes). A failed checkpoint is retried later: the WAL stays
/// valid, only larger.
fn checkpoint_loop(
    conn: Connection,
    stop: Receiver<()>,
    activity: Arc<WalActivity>,
    opened: std::time::Instant,
) {
    use std::sync::atomic::Ordering::Relaxed;
    let tick = std::time::Duration::from_millis(CHECKPOINT_TICK_MS);
    while let Err(mpsc::RecvTimeoutError::Timeout) = stop.recv_timeout(tick) {
        let batches = activity.batches_since_checkpoint.load(Relaxed);
        if batches == 0 {
            continue;
        }
        let now = u64::try_from(opened.elapsed().as_millis()).unwrap_or(u64::MAX);
        let idle = now.saturating_sub(activity.last_commit_ms.load(Relaxed));
        if idle >= CHECKPOINT_IDLE_MS || wal_backlog_frames(&conn) >= CHECKPOINT_WAL_FRAMES_MAX {
            activity
                .batches_since_checkpoint
                .fetch_sub(batches, Relaxed);
            let _ = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()));
        }
    }
}

/// WAL frames not yet copied back into the database file. A `NOOP` checkpoint only reads the
/// WAL index header: no lock the writer or the readers wait for, no I/O. An error reads as 0
/// (nothing to do now; the idle checkpoint still comes).
fn wal_backlog_frames(conn: &Connection) -> i64 {
    conn.query_row("PRAGMA wal_checkpoint(NOOP)", [], |row| {
        Ok(row.get::<_, i64>(1)? - row.get::<_, i64>(2)?)
    })
    .unwrap_or(0)
}

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

fn load_by_id(
    conn: &Connection,
    files: &Files,
    id: &IntentId,
) -> Result<Option<IntentRecord>, JournalError> {
    let mut buf = uuid::Uuid::encode_buffer();
    let text: &str = id.hyphenated().encode_lower(&mut buf);
    load_one(conn, files, SELECT_BY_ID, [text])
}

fn recent(conn: &Connection, files: &Files, limit: i64) -> Result<Vec<IntentRecord>, JournalError> {
    load_many(conn, files, SELECT_RECENT, [limit])
}

fn load_one<P: rusqlite::Params>(
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

fn load_many<P: rusqlite::Params>(
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

/// Builds a record from a row; anything that does not parse is corruption, reported with the id.
fn from_row(row: &Row<'_>, files: &Files) -> Result<IntentRecord, JournalError> {
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
    })
}

fn read_spill(files: &Files, id: &str, sha: &str, len: i64) -> Result<String, JournalError> {
    let path = files.spill.join(sha);
    let bytes = fs::read(&path).map_err(|e| {
        files.corrupt(format!(
            "record {id}: spilled arguments {} unreadable: {e}",
            path.display()
        ))
    })?;
    if bytes.len() as i64 != len || decide::sha256_hex(&bytes) != sha {
        return Err(files.corrupt(format!(
            "record {id}: spilled arguments {} do not match their digest",
            path.display()
        )));
    }
    String::from_utf8(bytes)
        .map_err(|_| files.corrupt(format!("record {id}: spilled arguments are not UTF-8")))
}

// ---------------------------------------------------------------------------------------------
// Read-only inspection

/// A read-only view of a journal file, for inspection (`ring0 journal ls|show`) while a host may
/// hold the write lock. It takes no lock, runs no migration and never writes.
pub struct JournalReader {
    conn: Connection,
    files: Files,
}

impl JournalReader {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> WriteJob {
        let fingerprint = Fingerprint::compute("read", &serde_json::json!({})).unwrap();
        let entry = MemoEntry {
            text: "{}".into(),
            stored_ms: 0,
        };
        WriteJob::MemoPut(fingerprint, entry, oneshot::channel().0)
    }

    #[test]
    fn a_batch_takes_every_request_already_waiting_beyond_the_count_it_expects() {
        let (tx, rx) = mpsc::sync_channel(8);
        for _ in 0..3 {
            tx.send(request()).unwrap();
        }
        let gather = Gather::after(1, Duration::ZERO);
        let mut batch_len = 1;
        while gather.next(&rx, batch_len).is_some() {
            batch_len += 1;
        }
        assert_eq!(batch_len, 4);
    }

    #[test]
    fn only_time_spent_waiting_uses_up_a_batch_budget() {
        // Deciding the requests already in takes longer than the budget; a caller still on
        // its way is waited for all the same, and the wait for one that never comes ends.
        let (_tx, rx) = mpsc::sync_channel::<WriteJob>(8);
        let gather = Gather::after(64, Duration::from_millis(2));
        let budget = gather.budget.get();
        std::thread::sleep(budget * 2);
        assert_eq!(gather.budget.get(), budget, "deciding is not waiting");
        assert!(gather.next(&rx, 1).is_none());
        assert!(gather.budget.get().is_zero(), "the wait used it up");
    }

    #[test]
    fn a_batch_stops_waiting_for_callers_that_do_not_come_back() {
        // The last batch answered 64 callers and none is back: the batch closes instead of
        // holding its transaction open for them.
        let (_tx, rx) = mpsc::sync_channel::<WriteJob>(8);
        let gather = Gather::after(64, Duration::from_millis(2));
        assert!(gather.next(&rx, 1).is_none());
    }

    #[test]
    fn the_wal_backlog_counts_frames_until_a_checkpoint_copies_them_back() {
        let dir = tempfile::tempdir().unwrap();
        let conn = Connection::open(dir.path().join("backlog.db")).unwrap();
        conn.query_row("PRAGMA journal_mode = WAL", [], |_| Ok(()))
            .unwrap();
        conn.execute_batch(
            "PRAGMA wal_autocheckpoint = 0; CREATE TABLE t (x); INSERT INTO t VALUES (1);",
        )
        .unwrap();
        assert!(wal_backlog_frames(&conn) > 0);
        conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
            .unwrap();
        assert_eq!(wal_backlog_frames(&conn), 0);
    }

    #[test]
    fn a_batch_never_grows_past_its_maximum() {
        let (tx, rx) = mpsc::sync_channel(8);
        tx.send(request()).unwrap();
        let gather = Gather::after(2 * GROUP_COMMIT_BATCH_MAX, Duration::from_millis(2));
        assert!(gather.next(&rx, GROUP_COMMIT_BATCH_MAX).is_none());
    }

    // -----------------------------------------------------------------------------------------
    // The lazily folded key index

    use futures::executor::block_on;
    use ring0_core::canonical::canonical_string;

    /// A mutating proposal of `refund(order n)`, under the current canonicalizer.
    fn refund(n: u64, call_id: &str) -> Proposal {
        let args = serde_json::json!({"order": n, "amount": 5});
        Proposal {
            intent_id: None,
            semantic_key: SemanticKey::compute("refund", &args, "user:1", 0).unwrap(),
            scope: "user:1".into(),
            attempt_epoch: 0,
            tool: "refund".into(),
            canonical_args: canonical_string(&args).unwrap(),
            call_id: call_id.into(),
            mutating: true,
        }
    }

    fn kind(d: &ProposeDecision) -> &'static str {
        d.kind()
    }

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

    /// Never folds while open; folds on a clean close unless `fold_on_close` is false.
    fn no_idle_fold(fold_on_close: bool) -> IndexTuning {
        IndexTuning {
            fold_idle: None,
            fold_on_close,
            ..IndexTuning::default()
        }
    }

    fn open(path: &Path, tuning: IndexTuning) -> SqliteJournal {
        SqliteJournal::open_tuned(path, SqliteOptions::default(), tuning).unwrap()
    }

    /// Rows of the key-index table, read through a connection of its own.
    /// Refund 1, proposed again under a new call id, is a duplicate, and a look-up by its key
    /// finds the record `first` created.
    fn assert_found_again(j: &SqliteJournal, first: &ProposeDecision) {
        let again = block_on(j.propose(refund(1, "c2"))).unwrap();
        assert_eq!(kind(&again), "duplicate");
        let found = block_on(j.find_by_key(&refund(1, "c").semantic_key)).unwrap();
        assert_eq!(found.map(|r| r.id), first.record().map(|r| r.id));
    }

    /// Opens the journal at `path`, records the refunds of `orders` and closes it.
    fn closed_with_refunds(path: &Path, tuning: IndexTuning, orders: std::ops::Range<u64>) {
        let j = open(path, tuning);
        for n in orders {
            block_on(j.propose(refund(n, "first"))).unwrap();
        }
    }

    fn indexed_keys(path: &Path) -> i64 {
        let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
        conn.query_row("SELECT count(*) FROM intent_keys", [], |r| r.get(0))
            .unwrap()
    }

    fn watermark(path: &Path) -> i64 {
        let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
        conn.query_row("SELECT indexed_through FROM key_index_watermark", [], |r| {
            r.get(0)
        })
        .unwrap()
    }

    /// The writer's connection and key index, to run batches directly.
    struct Writer {
        conn: Connection,
        files: Files,
        index: KeyIndex,
        staged: Staged,
    }

    impl Writer {
        fn open(path: &Path) -> Self {
            let files = Files::new(path);
            let conn = open_connection(&files, true).unwrap();
            configure_writer(&conn, &files, &SqliteOptions::default()).unwrap();
            migrate(&conn, &files).unwrap();
            let index = KeyIndex::load(&conn, &files, no_idle_fold(true)).unwrap();
            Self {
                conn,
                files,
                index,
                staged: Staged::default(),
            }
        }

        /// Decides the proposals as one batch and commits it.
        fn batch(&mut self, proposals: Vec<Proposal>) -> Vec<Result<&'static str, JournalError>> {
            let (_tx, rx) = mpsc::sync_channel(1);
            let mut batch: Vec<WriteJob> = proposals
                .into_iter()
                .map(|p| {
                    WriteJob::Propose(
                        Arc::new(PreparedProposal::new(p, &SystemClock, 1)),
                        oneshot::channel().0,
                    )
                })
                .collect();
            let (results, _) = commit_batch(
                &mut self.conn,
                &self.files,
                &SystemClock,
                1,
                &mut batch,
                &rx,
                Gather::after(0, Duration::ZERO),
                &mut self.index,
                &mut self.staged,
            );
            results
                .into_iter()
                .map(|r| {
                    r.map(|done| match done {
                        Done::Decision(Proposed::Fresh) => "recorded",
                        Done::Decision(Proposed::Decided(d)) => kind(&d),
                        _ => unreachable!("a proposal decides"),
                    })
                })
                .collect()
        }

        /// Makes the insert of any intent proposed with this call id fail: a job whose
        /// savepoint is rolled back (`ABORT`), or a whole batch that is (`ROLLBACK`).
        fn fail_inserts(&self, call_id: &str, how: &str) {
            self.conn
                .execute_batch(&format!(
                    "CREATE TEMP TRIGGER fail_{call_id} BEFORE INSERT ON intents
                     WHEN NEW.call_ids LIKE '%\"{call_id}\"%'
                     BEGIN SELECT RAISE({how}, 'injected failure'); END;"
                ))
                .unwrap();
        }
    }

    #[test]
    fn a_duplicate_in_the_same_batch_is_found_among_the_staged_entries() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Writer::open(&dir.path().join("j.db"));
        let decided = w.batch(vec![refund(1, "c1"), refund(1, "c2")]);
        assert_eq!(decided, vec![Ok("recorded"), Ok("duplicate")]);
        assert_eq!(w.index.pending(), 1);
    }

    #[test]
    fn a_rolled_back_job_leaves_no_staged_entry_behind() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Writer::open(&dir.path().join("j.db"));
        w.fail_inserts("boom", "ABORT");
        // The second job takes the `seq` the first one rolled back: a stale staged entry for
        // order 1 would name order 2's record and make the third proposal a duplicate of it.
        let decided = w.batch(vec![refund(1, "boom"), refund(2, "c2"), refund(1, "c3")]);
        assert!(decided[0].is_err(), "{:?}", decided[0]);
        assert_eq!(decided[1..], [Ok("recorded"), Ok("recorded")]);
        assert_eq!(w.index.pending(), 2);
    }

    #[test]
    fn a_failed_batch_leaves_the_pending_entries_as_they_were() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Writer::open(&dir.path().join("j.db"));
        w.fail_inserts("doom", "ROLLBACK");
        let decided = w.batch(vec![refund(1, "c1"), refund(2, "doom")]);
        assert!(decided.iter().all(Result::is_err), "{decided:?}");
        assert_eq!(w.index.pending(), 0);
        assert_eq!(w.batch(vec![refund(1, "c1")]), vec![Ok("recorded")]);
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
    fn the_writer_counts_its_batches_and_the_requests_they_answered() {
        let dir = tempfile::tempdir().unwrap();
        let j = open(&dir.path().join("j.db"), no_idle_fold(true));
        for n in 0..3 {
            block_on(j.propose(refund(n, "alone"))).unwrap();
        }
        let alone = j.writer_stats();
        assert_eq!(
            (alone.batches, alone.requests),
            (3, 3),
            "one batch per lone caller"
        );
        assert!(!alone.deciding.is_zero() && !alone.committing.is_zero());
        let together = (10..18).map(|n| j.propose(refund(n, "together")));
        for d in block_on(futures::future::join_all(together)) {
            assert_eq!(kind(&d.unwrap()), "recorded");
        }
        let grouped = j.writer_stats().since(&alone);
        assert_eq!(grouped.requests, 8);
        assert!((1..=8).contains(&grouped.batches), "{grouped:?}");
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

    #[test]
    fn a_version_1_journal_migrates_and_still_deduplicates_its_intents() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.db");
        let p = refund(1, "c1");
        let id = uuid::Uuid::now_v7();
        {
            // A journal as the version-1 schema wrote it: every intent indexed at insertion.
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(&format!(
                "PRAGMA application_id = {APPLICATION_ID}; BEGIN; {}; PRAGMA user_version = 1; \
                 COMMIT;",
                MIGRATIONS[0]
            ))
            .unwrap();
            let timeline = serde_json::json!([{"state": "PROPOSED", "at_ms": 1},
                                              {"state": "RECORDED", "at_ms": 1}]);
            conn.execute(
                "INSERT INTO intents (id, semantic_key, scope, attempt_epoch, tool, args_sha256,
                   args_bytes, args_inline, call_ids, idempotency_key, mutating, fence, attempts,
                   state, timeline, owner, created_ms, updated_ms)
                 VALUES (?1, ?2, ?3, 0, ?4, ?5, ?6, ?7, '[\"c1\"]', ?8, 1, 1, 0, 'RECORDED', ?9,
                   1, 1, 1)",
                params![
                    id.to_string(),
                    p.semantic_key.encode(),
                    p.scope,
                    p.tool,
                    decide::sha256_hex(p.canonical_args.as_bytes()),
                    p.canonical_args.len() as i64,
                    p.canonical_args,
                    p.semantic_key.idempotency_key(0),
                    timeline.to_string(),
                ],
            )
            .unwrap();
            conn.execute(
                "INSERT INTO intent_keys VALUES (?1, 1)",
                [p.semantic_key.encode()],
            )
            .unwrap();
            conn.execute(
                "INSERT INTO intent_contents VALUES (?1, 1)",
                [decide::content_digest(
                    &p.tool,
                    &p.scope,
                    0,
                    &p.canonical_args,
                )],
            )
            .unwrap();
        }
        let j = open(&path, no_idle_fold(true));
        assert_eq!((j.pending_index_entries(), watermark(&path)), (0, 1));
        let again = block_on(j.propose(refund(1, "c2"))).unwrap();
        assert_eq!(
            (kind(&again), again.record().unwrap().id),
            ("duplicate", id)
        );
        // Found by content too: the same intent under another canonicalizer version.
        let mut other_version = refund(1, "c3");
        other_version.semantic_key.version += 1;
        let conflict = block_on(j.propose(other_version)).unwrap();
        assert_eq!(
            (kind(&conflict), conflict.record().unwrap().id),
            ("conflict", id)
        );
    }
}
