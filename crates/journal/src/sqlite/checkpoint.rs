//! The checkpointer: folds the WAL back into the database file off the commit path.
//!
//! SQLite's automatic checkpoint would run inside some commit and make it wait for the
//! database file's fsync. Instead the writer's connection has it off, and this thread, with a
//! connection of its own, runs `PASSIVE` checkpoints (which never block the writer or the
//! readers) when the writer has been idle [`CHECKPOINT_IDLE_MS`] — so its fsync of the database
//! file does not compete with commits — or once [`CHECKPOINT_WAL_FRAMES_MAX`] frames wait, which
//! bounds each checkpoint's work under constant load. The writer tells it about commits through
//! [`WalActivity`].

use super::files::Files;
use super::schema::open_connection;
use super::writer::WriterCounters;
use crate::JournalError;
use rusqlite::Connection;
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread::JoinHandle;
use std::time::Instant;

/// The checkpointer checkpoints once the writer has committed nothing for this long (50 ms).
pub const CHECKPOINT_IDLE_MS: u64 = 50;
/// ... or once this many WAL frames wait to be copied back (65,536: 64 MiB with the default
/// 1 KiB pages), which bounds each checkpoint's work under constant load — a bound in batches
/// would not, since a batch holds from one request to
/// [`crate::limits::GROUP_COMMIT_BATCH_MAX`]. (The WAL file itself starts again from its
/// beginning only after a checkpoint that catches up with the writer, so under load without a
/// pause it keeps growing; the idle checkpoint is what resets it.) Checkpointing much more often makes the checkpoint's database fsync compete with
/// commits: measured with `cargo bench -p ring0-journal --bench commit` (two runs each), 8,192
/// frames made the p99 under 64 proposers 2–3x worse; 65,536 left it within the run-to-run
/// noise.
pub const CHECKPOINT_WAL_FRAMES_MAX: i64 = 65_536;
/// How often the checkpointer looks (25 ms).
const CHECKPOINT_TICK_MS: u64 = 25;

/// What the writer tells the checkpointer, and the journal's owner through [`super::WriterStats`].
#[derive(Default)]
pub(crate) struct WalActivity {
    /// The batches' counters.
    pub(crate) stats: WriterCounters,
    /// Milliseconds since the journal opened, at the last commit.
    last_commit_ms: std::sync::atomic::AtomicU64,
    /// Batches committed since the checkpointer last checkpointed: whether there is anything to
    /// look at.
    batches_since_checkpoint: std::sync::atomic::AtomicU64,
}

/// Tells the checkpointer that a transaction committed.
pub(crate) fn note_commit(activity: &WalActivity, opened: Instant) {
    use std::sync::atomic::Ordering::Relaxed;
    let since_open = u64::try_from(opened.elapsed().as_millis()).unwrap_or(u64::MAX);
    activity.last_commit_ms.store(since_open, Relaxed);
    activity.batches_since_checkpoint.fetch_add(1, Relaxed);
}

/// Starts the checkpointer with a connection of its own; it stops once the returned sender is
/// dropped.
pub(crate) fn spawn(
    files: &Files,
    activity: Arc<WalActivity>,
    opened: Instant,
) -> Result<(Sender<()>, JoinHandle<()>), JournalError> {
    let conn = open_connection(files, false)?;
    conn.execute_batch("PRAGMA busy_timeout = 5000;")
        .map_err(|e| files.sql(e))?;
    let (stop_tx, stop_rx) = mpsc::channel::<()>();
    let handle = std::thread::Builder::new()
        .name("ring0-journal-checkpointer".into())
        .spawn(move || checkpoint_loop(conn, stop_rx, activity, opened))
        .map_err(|e| JournalError::Storage(format!("starting the checkpointer: {e}")))?;
    Ok((stop_tx, handle))
}

/// Folds the WAL back into the database file when the writer is idle or the WAL has grown,
/// until told to stop (its channel closes). A failed checkpoint is retried later: the WAL stays
/// valid, only larger.
fn checkpoint_loop(
    conn: Connection,
    stop: Receiver<()>,
    activity: Arc<WalActivity>,
    opened: Instant,
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
