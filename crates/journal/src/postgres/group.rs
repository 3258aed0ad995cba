//! Group commit: many concurrent proposals, one transaction and a few round trips per batch.
//!
//! A proposal alone pays a whole transaction: `BEGIN`, a round trip per read and per write, and
//! a `COMMIT` that waits for the server to flush its WAL. Under many proposers those waits are
//! the cost, so proposals queue here and a few workers each take what is queued — up to
//! [`POSTGRES_GROUP_COMMIT_MAX`] — and decide it in one transaction whose round trips do not
//! grow with the batch:
//!
//! 1. **admit**: proposals that share an identity (intent id, semantic key, content digest,
//!    caller's key) with an earlier one of the batch wait for after it, so those decided
//!    together cannot see each other's writes (see below);
//! 2. **read** every record bearing on any of them in one statement (`batch::find`), locked;
//! 3. **plan** each in memory with the shared `decide` rules (`propose::plan`, the function a
//!    proposal alone runs), leaving for after the batch any whose records an earlier one found;
//! 4. **write** set-based: the changed records in one compare-and-set `UPDATE`, the new ones in
//!    one `INSERT` (sent together), then their claims (`batch::claim`), the statements of a step
//!    pipelined on the connection;
//! 5. **commit**, once, and answer.
//!
//! So a batch of new intents costs five round trips — `BEGIN`, read, insert, claims, `COMMIT` —
//! whatever its size. Deciding the batch's proposals together gives each the answer it would
//! get decided alone, one after another, because no two of them share an identity or a record:
//! none of them writes anything another reads. A new record whose claim another replica took
//! first (or whose host-supplied id another replica inserted) is taken back out of the
//! transaction — its claims put back, its row deleted (`batch::undo`) — and is decided again
//! alone after the batch commits, from the other replica's result (`propose::propose`, which
//! retries), as are the proposals admit and plan set aside.
//!
//! A statement the server refuses fails the whole transaction; every proposal of the batch is
//! then decided again alone, so one proposal's bad input (or a conflict with another
//! transaction) answers that proposal with its error, not the batch. A connection that breaks
//! answers the batch with the error. If the `COMMIT` itself fails, nothing of the batch was
//! recorded: a conflict with another transaction decides each proposal again alone, any other
//! error is every proposal's. No proposal is answered before its batch's `COMMIT` returned.

use super::batch::{self, BatchError, Lookup};
use super::propose::{self, SeenRecords, Step};
use super::{Db, Shared, write_deliveries};
use crate::JournalError;
use crate::limits::{
    POSTGRES_GROUP_COMMIT_MAX, POSTGRES_GROUP_GATHER_PERCENT, POSTGRES_GROUP_GATHER_US_MAX,
    POSTGRES_GROUP_QUEUE_MAX,
};
use crate::record::{IntentId, IntentRecord, Proposal, ProposeDecision};
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::{Mutex, mpsc, oneshot};

/// What a proposer is answered with.
type Reply = oneshot::Sender<Result<ProposeDecision, JournalError>>;

/// A proposal waiting for its batch.
struct Queued {
    proposal: Proposal,
    id: IntentId,
    reply: Reply,
}

/// What a PostgreSQL journal's group commits have done since it opened: for operators (how
/// large batches are, how many proposals fell back to a transaction of their own) and for
/// `cargo bench -p ring0-journal --bench commit`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupStats {
    /// Batches of two or more proposals committed, one transaction each.
    pub batches: u64,
    /// Proposals those batches decided and answered.
    pub batched: u64,
    /// Proposals decided in a transaction of their own: one alone in the queue, one that shared
    /// an identity or a record with an earlier one of its batch, one whose claim another
    /// replica took first, every one of a batch that could not be decided as one.
    pub alone: u64,
    /// Time in the committed batches' transactions, from taking a connection to `COMMIT`.
    pub batch_time: Duration,
}

impl GroupStats {
    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &GroupStats) -> GroupStats {
        GroupStats {
            batches: self.batches.saturating_sub(earlier.batches),
            batched: self.batched.saturating_sub(earlier.batched),
            alone: self.alone.saturating_sub(earlier.alone),
            batch_time: self.batch_time.saturating_sub(earlier.batch_time),
        }
    }
}

/// The counters behind [`GroupStats`].
struct Counters {
    batches: AtomicU64,
    batched: AtomicU64,
    alone: AtomicU64,
    batch_time_us: AtomicU64,
    /// Proposals of each worker's last batch, and how long the last batch took: what
    /// [`gather`] waits for.
    last_batches: Vec<AtomicUsize>,
    last_batch_us: AtomicU64,
}

/// The queue proposals wait in for a batch.
pub(crate) struct GroupCommit {
    queue: mpsc::Sender<Queued>,
    counters: Arc<Counters>,
}

impl GroupCommit {
    /// Starts `workers` batch workers on the current runtime; each holds one pooled connection
    /// while its batch runs.
    pub(crate) fn start(shared: Arc<Shared>, workers: usize) -> Self {
        let (queue, queued) = mpsc::channel(POSTGRES_GROUP_QUEUE_MAX);
        // The workers take turns collecting: one waits for the queue while the others run
        // their batches, so a batch is collected while the one before it commits.
        let queued = Arc::new(Mutex::new(queued));
        let workers = workers.max(1);
        let counters = Arc::new(Counters {
            batches: AtomicU64::new(0),
            batched: AtomicU64::new(0),
            alone: AtomicU64::new(0),
            batch_time_us: AtomicU64::new(0),
            last_batches: (0..workers).map(|_| AtomicUsize::new(0)).collect(),
            last_batch_us: AtomicU64::new(0),
        });
        for worker in 0..workers {
            let (shared, queued, counters) = (shared.clone(), queued.clone(), counters.clone());
            tokio::spawn(work(shared, queued, counters, worker));
        }
        Self { queue, counters }
    }

    pub(crate) fn stats(&self) -> GroupStats {
        let c = &self.counters;
        GroupStats {
            batches: c.batches.load(Ordering::Relaxed),
            batched: c.batched.load(Ordering::Relaxed),
            alone: c.alone.load(Ordering::Relaxed),
            batch_time: Duration::from_micros(c.batch_time_us.load(Ordering::Relaxed)),
        }
    }

    /// Queues a proposal (waiting while the queue is full) and waits for its batch's answer.
    pub(crate) async fn propose(
        &self,
        db: &Db,
        proposal: Proposal,
        id: IntentId,
    ) -> Result<ProposeDecision, JournalError> {
        let (reply, answer) = oneshot::channel();
        let gone = || JournalError::Storage(format!("{}: the journal is closing", db.name));
        self.queue
            .send(Queued {
                proposal,
                id,
                reply,
            })
            .await
            .map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}

/// One worker: collects a batch, commits it, answers its proposers; until the queue closes.
async fn work(
    shared: Arc<Shared>,
    queued: Arc<Mutex<mpsc::Receiver<Queued>>>,
    counters: Arc<Counters>,
    worker: usize,
) {
    loop {
        let mut batch = Vec::with_capacity(POSTGRES_GROUP_COMMIT_MAX);
        {
            let mut queued = queued.lock().await;
            if queued
                .recv_many(&mut batch, POSTGRES_GROUP_COMMIT_MAX)
                .await
                == 0
            {
                return;
            }
            gather(&mut queued, &mut batch, &counters).await;
        }
        commit_batch(&shared, &counters, worker, batch).await;
    }
}

/// Waits a little for the rest of a batch. Proposers answered together come back together,
/// but one at a time: a worker that took the first alone would commit it by itself and the
/// rest would wait behind that transaction. So a worker holding fewer proposals than the
/// largest of the workers' last batches waits for more, for [`POSTGRES_GROUP_GATHER_PERCENT`]
/// of the last batch's time, at most [`POSTGRES_GROUP_GATHER_US_MAX`]. A lone proposer waits
/// at most once per worker, until every worker's last batch held it alone.
async fn gather(queued: &mut mpsc::Receiver<Queued>, batch: &mut Vec<Queued>, counters: &Counters) {
    let expected = counters
        .last_batches
        .iter()
        .map(|n| n.load(Ordering::Relaxed))
        .max()
        .unwrap_or(0);
    let last_us = counters.last_batch_us.load(Ordering::Relaxed);
    let wait_us = (last_us * u64::from(POSTGRES_GROUP_GATHER_PERCENT) / 100)
        .min(POSTGRES_GROUP_GATHER_US_MAX);
    let until = tokio::time::Instant::now() + Duration::from_micros(wait_us);
    while batch.len() < expected.min(POSTGRES_GROUP_COMMIT_MAX) {
        let room = POSTGRES_GROUP_COMMIT_MAX - batch.len();
        match tokio::time::timeout_at(until, queued.recv_many(batch, room)).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

/// A proposal's answer from its batch; `None` when it is decided again alone after the batch.
type Answer = Option<Result<ProposeDecision, JournalError>>;

/// Decides and commits one batch and answers every proposer in it.
async fn commit_batch(shared: &Shared, counters: &Counters, worker: usize, batch: Vec<Queued>) {
    let started = Instant::now();
    let answers = if batch.len() == 1 {
        // Alone, a proposal is its own batch: the plain path costs no more.
        vec![None]
    } else {
        match decide_batch(shared, &batch).await {
            Ok(answers) => {
                let batched = answers.iter().filter(|a| a.is_some()).count();
                let spent = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
                counters.batches.fetch_add(1, Ordering::Relaxed);
                counters
                    .batched
                    .fetch_add(batched as u64, Ordering::Relaxed);
                counters.batch_time_us.fetch_add(spent, Ordering::Relaxed);
                answers
            }
            Err(BatchError::Alone) => batch.iter().map(|_| None).collect(),
            Err(BatchError::Failed(e)) => batch.iter().map(|_| Some(Err(e.clone()))).collect(),
        }
    };
    counters.last_batches[worker].store(batch.len(), Ordering::Relaxed);
    let spent = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
    counters.last_batch_us.store(spent, Ordering::Relaxed);
    for (q, answer) in batch.into_iter().zip(answers) {
        let answer = match answer {
            Some(answer) => answer,
            // Decided alone, from what the batch and the other replicas committed.
            None => {
                counters.alone.fetch_add(1, Ordering::Relaxed);
                propose::propose(shared, &q.proposal, q.id).await
            }
        };
        let _ = q.reply.send(answer);
    }
}

/// A proposal the batch decides: where it is in the batch, what it read, what it decided.
pub(super) struct Member<'a> {
    pub(super) at: usize,
    pub(super) proposal: &'a Proposal,
    pub(super) lookup: &'a Lookup,
    pub(super) seen: SeenRecords,
    pub(super) step: Step,
}

/// Decides every proposal of `batch` in one transaction and commits it; the answers are in
/// batch order.
async fn decide_batch(shared: &Shared, batch: &[Queued]) -> Result<Vec<Answer>, BatchError> {
    let db = &shared.db;
    let mut client = shared.client().await?;
    let deliveries = shared.pending_deliveries();
    let tx = client.transaction().await.map_err(|e| batch::sql(db, e))?;
    let now = shared.clock.now_ms();
    let lookups = admit(batch);
    let admitted: Vec<&Lookup> = lookups.iter().flatten().collect();
    let (_, found) = futures::try_join!(
        async {
            write_deliveries(&tx, db, &deliveries, now)
                .await
                .map_err(BatchError::Failed)
        },
        batch::find(&tx, db, &admitted),
    )?;
    let mut answers: Vec<Answer> = batch.iter().map(|_| None).collect();
    let members = plan(shared, batch, &lookups, &found, now, &mut answers);
    let written = batch::write(&tx, shared, &found, &members, now).await?;
    match tx.commit().await {
        Ok(()) => {}
        Err(e) if Db::is_retryable(&e) => return Err(BatchError::Alone),
        Err(e) => return Err(BatchError::Failed(db.sql(e))),
    }
    shared.deliveries_written(&deliveries);
    for (member, taken) in members.into_iter().zip(written) {
        if taken {
            answers[member.at] = Some(Ok(decision(member.step)));
        }
    }
    Ok(answers)
}

/// The answer a member's written step gives.
fn decision(step: Step) -> ProposeDecision {
    match step {
        Step::Answer(decision) | Step::Update { decision, .. } => decision,
        Step::Insert(record) => ProposeDecision::Recorded(record),
    }
}

/// Each proposal's lookups, or `None` for one that shares an identity with an earlier proposal
/// of the batch and is decided after it, alone.
fn admit(batch: &[Queued]) -> Vec<Option<Lookup>> {
    let mut taken = HashSet::new();
    batch
        .iter()
        .map(|q| {
            let lookup = Lookup::of(&q.proposal, q.id);
            let identities = lookup.identities();
            if identities.iter().any(|i| taken.contains(i)) {
                return None;
            }
            taken.extend(identities);
            Some(lookup)
        })
        .collect()
}

/// Plans every admitted proposal from the records found. One whose records an earlier member
/// found is left for after the batch (`answers` keeps `None`), so no record is written twice;
/// one the records answer without a write is answered in `answers` now.
fn plan<'a>(
    shared: &Shared,
    batch: &'a [Queued],
    lookups: &'a [Option<Lookup>],
    found: &batch::Found,
    now: u64,
    answers: &mut [Answer],
) -> Vec<Member<'a>> {
    let mut records_taken: HashSet<i64> = HashSet::new();
    let mut members = Vec::with_capacity(batch.len());
    for (at, (q, lookup)) in batch.iter().zip(lookups).enumerate() {
        let Some(lookup) = lookup else { continue };
        let seen = found.seen(lookup);
        let seqs: HashSet<i64> = seen.seqs().collect();
        if !records_taken.is_disjoint(&seqs) {
            continue;
        }
        records_taken.extend(seqs);
        match propose::plan(&q.proposal, &seen, q.id, now, shared.incarnation) {
            Ok(Step::Answer(decision)) => answers[at] = Some(Ok(decision)),
            Ok(step) => members.push(Member {
                at,
                proposal: &q.proposal,
                lookup,
                seen,
                step,
            }),
            Err(e) => answers[at] = Some(Err(e)),
        }
    }
    members
}

/// The record a member inserts, if it inserts one.
pub(super) fn inserted<'a>(member: &'a Member<'_>) -> Option<&'a IntentRecord> {
    match &member.step {
        Step::Insert(record) => Some(record),
        _ => None,
    }
}
