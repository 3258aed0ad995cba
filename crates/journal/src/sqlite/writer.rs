//! The writer thread: one connection, every write, in group commits.
//!
//! One writer thread owns the only write connection. It decides every request waiting — and
//! every one that arrives while it is deciding — in one transaction (up to
//! [`GROUP_COMMIT_BATCH_MAX`]), one fsync for the batch, each request atomic on its own (one
//! statement, or a savepoint), so one refused request does not undo the others. Replies go out
//! after the commit. The transaction stays open a moment (a bounded share of the last commit's
//! time) for the callers the last batch answered, so callers that come back together share one
//! fsync instead of the first starting a batch the others then wait behind (see [`Gather`]).
//! When no request comes for a while the writer folds the key index into its tables (see the
//! `key_index` module), giving way to any caller that arrives. [`WriterStats`] says how large
//! batches are and where their time goes.

use super::checkpoint::{WalActivity, note_commit};
use super::files::Files;
use super::key_index::{KeyIndex, Staged};
use super::requests::{Done, Inserted, WriteJob, apply};
use crate::JournalError;
use crate::clock::Clock;
use crate::limits::{
    GROUP_COMMIT_BATCH_MAX, GROUP_COMMIT_GATHER_PERCENT, GROUP_COMMIT_GATHER_US_MAX,
    KEY_INDEX_CLOSE_FOLD_CHUNK, WRITER_QUEUE_MAX,
};
use rusqlite::Connection;
use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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
pub(crate) struct WriterCounters {
    batches: AtomicU64,
    requests: AtomicU64,
    deciding_ns: AtomicU64,
    committing_ns: AtomicU64,
    table_probes: AtomicU64,
}

impl WriterCounters {
    fn add(&self, requests: usize, timing: BatchTiming, table_probes: u64) {
        self.table_probes.fetch_add(table_probes, Relaxed);
        let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.batches.fetch_add(1, Relaxed);
        self.requests.fetch_add(requests as u64, Relaxed);
        self.deciding_ns.fetch_add(ns(timing.deciding), Relaxed);
        self.committing_ns.fetch_add(ns(timing.committing), Relaxed);
    }

    pub(crate) fn snapshot(&self) -> WriterStats {
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
pub(crate) struct BatchTiming {
    deciding: Duration,
    committing: Duration,
}

/// Runs a parameterless statement through the statement cache (no re-parsing per request).
pub(crate) fn exec_cached(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}

/// What the writer thread owns: the only write connection, the writer's side of the key index,
/// and what it needs to stamp records and report its batches.
pub(crate) struct WriterThread {
    pub(crate) conn: Connection,
    pub(crate) files: Files,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) incarnation: u64,
    pub(crate) index: KeyIndex,
    pub(crate) activity: Arc<WalActivity>,
    /// When the journal opened: the epoch of [`WalActivity`]'s times.
    pub(crate) opened: Instant,
}

impl WriterThread {
    /// Starts the writer thread; requests go to the returned queue (bounded by
    /// [`WRITER_QUEUE_MAX`], so callers wait instead of piling up). The thread ends, closing
    /// cleanly, once every sender is gone.
    pub(crate) fn spawn(self) -> Result<(SyncSender<WriteJob>, JoinHandle<()>), JournalError> {
        let (tx, rx) = mpsc::sync_channel::<WriteJob>(WRITER_QUEUE_MAX);
        let handle = std::thread::Builder::new()
            .name("ring0-journal-writer".into())
            .spawn(move || self.run(rx))
            .map_err(|e| JournalError::Storage(format!("starting the writer thread: {e}")))?;
        Ok((tx, handle))
    }

    /// Decides requests until every sender is gone, folding the key index when idle, then
    /// closes cleanly (a last fold and a truncating checkpoint).
    fn run(mut self, rx: Receiver<WriteJob>) {
        // Callers answered by the last batch, and how long its COMMIT (its fsync) took: how
        // many requests the next batch waits for, and for how long at most (see `Gather`).
        let mut answered_last = 0;
        let mut commit_last = Duration::ZERO;
        let mut staged = Staged::default();
        // A request taken off the queue between two idle folds, to start the next batch with.
        let mut next: Option<WriteJob> = None;
        loop {
            let first = match next.take() {
                Some(job) => job,
                None => match self
                    .index
                    .tuning
                    .fold_idle
                    .filter(|_| self.index.needs_fold())
                {
                    None => match rx.recv() {
                        Ok(job) => job,
                        Err(_) => break,
                    },
                    Some(idle) => match rx.recv_timeout(idle) {
                        Ok(job) => job,
                        Err(mpsc::RecvTimeoutError::Disconnected) => break,
                        Err(mpsc::RecvTimeoutError::Timeout) => {
                            next = self.fold_while_idle(&rx);
                            continue;
                        }
                    },
                },
            };
            let gather = Gather::after(answered_last, commit_last);
            let mut batch = Vec::with_capacity(gather.expected.max(1));
            batch.push(first);
            let (results, timing) = commit_batch(
                &mut self.conn,
                &self.files,
                self.clock.as_ref(),
                self.incarnation,
                &mut batch,
                &rx,
                gather,
                &mut self.index,
                &mut staged,
            );
            answered_last = batch.len();
            commit_last = timing.committing;
            let probes = self.index.take_table_probes();
            if !timing.committing.is_zero() {
                self.activity.stats.add(batch.len(), timing, probes);
            }
            note_commit(&self.activity, self.opened);
            answer(batch, results);
        }
        self.close();
    }

    /// Idle: folds the key index chunk by chunk, looking at the queue between chunks, so a
    /// caller waits for one chunk at most; returns the request that interrupted it. A failed
    /// fold is retried after the next idle period; the entries stay in memory meanwhile.
    fn fold_while_idle(&mut self, rx: &Receiver<WriteJob>) -> Option<WriteJob> {
        while self.index.needs_fold() {
            let chunk = self.index.tuning.chunk;
            match self
                .index
                .fold_chunk(&self.conn, &self.files, chunk, Some(rx))
            {
                Ok(None) => note_commit(&self.activity, self.opened),
                Ok(Some(job)) => return Some(job),
                Err(_) => return None,
            }
        }
        None
    }

    /// A clean close folds every entry, so the next open has nothing to rebuild, in large
    /// chunks since no caller is left to give way to. Stopping at a failure loses nothing: the
    /// next open rebuilds what is left from the rows. Then it folds the WAL back into the
    /// database so a clean close leaves one file.
    fn close(mut self) {
        if self.index.tuning.fold_on_close {
            while self.index.needs_fold()
                && self
                    .index
                    .fold_chunk::<WriteJob>(
                        &self.conn,
                        &self.files,
                        KEY_INDEX_CLOSE_FOLD_CHUNK,
                        None,
                    )
                    .is_ok()
            {}
        }
        let _ = self.conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)");
    }
}

/// Sends each request of a committed (or failed) batch its answer. The writer lets go of its
/// share of a request first, so the caller frees it on its own thread.
fn answer(batch: Vec<WriteJob>, results: Vec<Result<Done, JournalError>>) {
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
            WriteJob::MarkDelivered(_) => {}
            WriteJob::HoldPut(_, reply) => {
                let _ = reply.send(result.map(|d| match d {
                    Done::Stored(b) => b,
                    _ => unreachable!("a held call's write returns whether it stored"),
                }));
            }
            WriteJob::HoldDecide(_, _, reply) => {
                let _ = reply.send(result.map(|d| match d {
                    Done::Hold(h) => h,
                    _ => unreachable!("a held call's decision returns what it did"),
                }));
            }
        }
    }
}

/// How the writer forms the next batch after the one that answered `answered_last` callers and
/// whose COMMIT took `commit_last`.
///
/// Callers answered together tend to come back together (the proposers of one round each
/// dispatch and settle, or propose their next intent), but not at the same instant: their
/// requests trickle in. Committing as soon as the first is decided would start a batch the rest
/// miss, and they would wait for its fsync and then for their own — two commits instead of one. So
/// the writer keeps the transaction open for them, deciding each as it arrives, until as many
/// requests as it last answered are in or it has spent [`GROUP_COMMIT_GATHER_PERCENT`] of the
/// last commit's time (never more than [`GROUP_COMMIT_GATHER_US_MAX`]) waiting for one with
/// nothing to decide. Only that idle time counts: a batch of many callers takes longer to decide
/// than the budget, and a caller that falls a little behind the others (descheduled for a few
/// microseconds) would otherwise find the batch closed and wait for two commits. A lone caller
/// never waits: the last batch answered one caller and it is here.
pub(crate) struct Gather {
    pub(crate) expected: usize,
    /// Idle time the batch may still spend waiting.
    pub(crate) budget: Cell<Duration>,
}

impl Gather {
    pub(crate) fn after(answered_last: usize, commit_last: Duration) -> Self {
        let wait = (commit_last * GROUP_COMMIT_GATHER_PERCENT / 100)
            .min(Duration::from_micros(GROUP_COMMIT_GATHER_US_MAX));
        Self {
            expected: answered_last.min(GROUP_COMMIT_BATCH_MAX),
            budget: Cell::new(wait),
        }
    }

    /// The next request to add to `batch`, if one is waiting or is worth waiting for.
    pub(crate) fn next(&self, rx: &Receiver<WriteJob>, batch_len: usize) -> Option<WriteJob> {
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
pub(crate) fn commit_batch(
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
    let mut max_seq = index.max_seq();
    loop {
        while let Some(job) = batch.get(results.len()) {
            match decide_job(conn, files, now, incarnation, job, index, staged) {
                Ok(result) => results.push(result.map(|(done, inserted)| {
                    if let Some(inserted) = inserted {
                        max_seq = max_seq.max(inserted.seq);
                        if let Some(entry) = inserted.entry {
                            staged.push(entry);
                        }
                    }
                    done
                })),
                Err(e) => return fail_all(batch.len(), e, staged),
            }
        }
        match gather.next(rx, batch.len()) {
            Some(job) => batch.push(job),
            None => break,
        }
    }
    // Under load without a pause the map reaches its cap: fold its oldest entries here.
    let folded = match index.fold_over_cap(conn, staged) {
        Ok(folded) => folded,
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            return fail_all(batch.len(), files.sql(e), staged);
        }
    };
    let started = Instant::now();
    match exec_cached(conn, "COMMIT") {
        Ok(()) => {
            let timing = BatchTiming {
                deciding: started - begun,
                committing: started.elapsed(),
            };
            index.committed(folded, staged, max_seq);
            (results, timing)
        }
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            fail_all(batch.len(), files.sql(e), staged)
        }
    }
}

/// Decides one request of a batch inside the batch's transaction: its own result (a refused
/// request undoes only its own changes), or `Err` when the transaction is gone — rolled back by
/// SQLite itself or by this function — and the whole batch must fail closed.
fn decide_job(
    conn: &Connection,
    files: &Files,
    now: u64,
    incarnation: u64,
    job: &WriteJob,
    index: &KeyIndex,
    staged: &Staged,
) -> Result<Result<(Done, Option<Inserted>), JournalError>, JournalError> {
    // A proposal or a transition writes with one statement at most, which SQLite makes atomic
    // by itself: a statement that fails undoes its own changes and leaves the transaction open
    // (and one that takes the transaction down is caught below). Only a memo write and a keyed
    // proposal (its record, then its key's binding and the bound's eviction), several
    // statements, need a savepoint of their own.
    let savepoint = match job {
        WriteJob::MemoPut(..) => true,
        WriteJob::Propose(p, _) => p.proposal.client_key.is_some(),
        _ => false,
    };
    if savepoint && let Err(e) = exec_cached(conn, "SAVEPOINT job") {
        return Ok(Err(files.sql(e)));
    }
    let result = apply(conn, files, now, incarnation, job, index, staged);
    if let Err(e) = &result
        && conn.is_autocommit()
    {
        // SQLite rolled the whole transaction back itself (SQLITE_FULL, an I/O error): every
        // decision of this batch is gone, so every request fails closed.
        return Err(e.clone());
    }
    let end = if !savepoint {
        Ok(())
    } else if result.is_ok() {
        exec_cached(conn, "RELEASE job")
    } else {
        exec_cached(conn, "ROLLBACK TO job").and_then(|()| exec_cached(conn, "RELEASE job"))
    };
    match end {
        Ok(()) => Ok(result),
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(files.sql(e))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Journal;
    use crate::sqlite::testing::{Writer, kind, no_idle_fold, open, refund, request};
    use futures::executor::block_on;

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
    fn a_batch_never_grows_past_its_maximum() {
        let (tx, rx) = mpsc::sync_channel(8);
        tx.send(request()).unwrap();
        let gather = Gather::after(2 * GROUP_COMMIT_BATCH_MAX, Duration::from_millis(2));
        assert!(gather.next(&rx, GROUP_COMMIT_BATCH_MAX).is_none());
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
}
