//! Group commit: many concurrent proposals, one transaction per batch.
//!
//! A proposal alone pays a whole transaction: `BEGIN`, its reads and writes, and a `COMMIT`
//! that waits for the server to flush its WAL. Under many proposers that flush (and the
//! round trips around it) is the cost, so proposals queue here and a few workers each take what
//! is queued — up to [`POSTGRES_GROUP_COMMIT_MAX`] — and decide it in one transaction, one
//! proposal after another (each sees the ones before it, as the SQLite writer's batch does),
//! with one `COMMIT` for all. No proposal is answered before that `COMMIT` returned.
//!
//! One proposal's trouble stays its own: each runs after a `SAVEPOINT`, and one that finds a
//! claim moved by another replica, or fails, is rolled back to it, so the batch's others still
//! commit. A proposal rolled back because another replica moved what it read is decided again
//! alone, after the batch (`propose::propose`, which retries); a failed one is answered with
//! its error. If the `COMMIT` itself fails, nothing of the batch was recorded: a conflict with
//! another transaction decides each proposal again alone, any other error is every proposal's.
//!
//! Savepoints are not released: `RELEASE` would cost a round trip per proposal and gain
//! nothing, since a rollback goes to the newest savepoint of the name. A batch is bounded below
//! the 64 subtransactions PostgreSQL caches per backend, past which every other session's
//! snapshots get slower.

use super::propose::{self, Abort};
use super::{Db, Shared, write_deliveries};
use crate::JournalError;
use crate::limits::{POSTGRES_GROUP_COMMIT_MAX, POSTGRES_GROUP_QUEUE_MAX};
use crate::record::{IntentId, Proposal, ProposeDecision};
use std::sync::Arc;
use tokio::sync::{Mutex, mpsc, oneshot};

/// What a proposer is answered with.
type Reply = oneshot::Sender<Result<ProposeDecision, JournalError>>;

/// A proposal waiting for its batch.
struct Queued {
    proposal: Proposal,
    id: IntentId,
    reply: Reply,
}

/// The queue proposals wait in for a batch.
pub(crate) struct GroupCommit {
    queue: mpsc::Sender<Queued>,
}

impl GroupCommit {
    /// Starts `workers` batch workers on the current runtime; each holds one pooled connection
    /// while its batch runs.
    pub(crate) fn start(shared: Arc<Shared>, workers: usize) -> Self {
        let (queue, queued) = mpsc::channel(POSTGRES_GROUP_QUEUE_MAX);
        // The workers take turns collecting: one waits for the queue while the others run
        // their batches, so a batch is collected while the one before it commits.
        let queued = Arc::new(Mutex::new(queued));
        for _ in 0..workers.max(1) {
            tokio::spawn(work(shared.clone(), queued.clone()));
        }
        Self { queue }
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
async fn work(shared: Arc<Shared>, queued: Arc<Mutex<mpsc::Receiver<Queued>>>) {
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
        }
        commit_batch(&shared, batch).await;
    }
}

/// A proposal's answer from its batch; `None` when it must be decided again alone (another
/// replica moved what it read).
type Answer = Option<Result<ProposeDecision, JournalError>>;

/// Decides and commits one batch and answers every proposer in it.
async fn commit_batch(shared: &Shared, mut batch: Vec<Queued>) {
    if batch.len() == 1 {
        // Alone, a proposal needs no savepoint: its own transaction is the batch.
        let q = batch.pop().expect("one proposal");
        let _ = q
            .reply
            .send(propose::propose(shared, &q.proposal, q.id).await);
        return;
    }
    let answers = match decide_batch(shared, &batch).await {
        Ok(answers) => answers,
        Err(BatchError::Conflict) => batch.iter().map(|_| None).collect(),
        Err(BatchError::Failed(e)) => batch.iter().map(|_| Some(Err(e.clone()))).collect(),
    };
    for (q, answer) in batch.into_iter().zip(answers) {
        let answer = match answer {
            Some(answer) => answer,
            // Decided again alone, from what the other replicas committed.
            None => propose::propose(shared, &q.proposal, q.id).await,
        };
        let _ = q.reply.send(answer);
    }
}

/// Why a batch's transaction recorded nothing.
enum BatchError {
    /// Its `COMMIT` conflicted with another transaction: decide each proposal again.
    Conflict,
    /// The journal failed: every proposal of the batch is answered with the error.
    Failed(JournalError),
}

impl From<JournalError> for BatchError {
    fn from(e: JournalError) -> Self {
        Self::Failed(e)
    }
}

/// Decides every proposal of `batch` in one transaction and commits it; the answers are in
/// batch order.
async fn decide_batch(shared: &Shared, batch: &[Queued]) -> Result<Vec<Answer>, BatchError> {
    let db = &shared.db;
    let mut client = shared.client().await?;
    let deliveries = shared.pending_deliveries();
    let tx = client.transaction().await.map_err(|e| db.sql(e))?;
    let now = shared.clock.now_ms();
    write_deliveries(&tx, db, &deliveries, now).await?;
    let mut answers = Vec::with_capacity(batch.len());
    for q in batch {
        tx.batch_execute("SAVEPOINT proposal")
            .await
            .map_err(|e| db.sql(e))?;
        let answer = match propose::decide_in(&tx, shared, &q.proposal, q.id, now).await {
            Ok(decision) => Some(Ok(decision)),
            Err(abort) => {
                tx.batch_execute("ROLLBACK TO SAVEPOINT proposal")
                    .await
                    .map_err(|e| db.sql(e))?;
                match abort {
                    Abort::Moved => None,
                    Abort::Failed(e) => Some(Err(e)),
                }
            }
        };
        answers.push(answer);
    }
    match tx.commit().await {
        Ok(()) => {}
        Err(e) if Db::is_retryable(&e) => return Err(BatchError::Conflict),
        Err(e) => return Err(BatchError::Failed(db.sql(e))),
    }
    shared.deliveries_written(&deliveries);
    Ok(answers)
}
