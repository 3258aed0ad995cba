//! A proposal as one PostgreSQL transaction: read the records that bear on it, let the private
//! `decide` module plan the answer (the code every backend runs), and write what the plan says.
//!
//! Several replicas propose at once, so what a proposal read may have changed before it writes.
//! Every write is therefore conditional on what was read:
//! - a new record **claims** each identity it takes — its semantic key, its content digest and
//!   the caller's key — with `INSERT … ON CONFLICT DO NOTHING RETURNING` where no record held it,
//!   or an `UPDATE … WHERE intent_seq = <the one read>` where one did (a rejected record, or the
//!   previous attempt of a delivered call);
//! - a changed record is written with a compare-and-set on its fence.
//!
//! A claim or a compare-and-set that finds the row moved rolls the transaction back and decides
//! the proposal again, from the other replica's committed result (at most
//! [`POSTGRES_PROPOSE_RETRIES_MAX`] times). The records found are read `FOR UPDATE`, so two
//! proposals of one recorded intent (a duplicate adding its call id) take turns.

use super::rows::{self, icols, to_i64};
use super::{Db, Shared};
use crate::JournalError;
use crate::decide::{self, Found, Planned, Write};
use crate::limits::{CLIENT_KEYS_PER_PRINCIPAL_MAX, POSTGRES_PROPOSE_RETRIES_MAX};
use crate::record::{ClientKey, IntentId, IntentRecord, Proposal, ProposeDecision};
use deadpool_postgres::Transaction;

/// Why a proposal's transaction was given up: another replica moved what it read (decide
/// again), or the journal failed.
pub(crate) enum Abort {
    Moved,
    Failed(JournalError),
}

impl From<JournalError> for Abort {
    fn from(e: JournalError) -> Self {
        Self::Failed(e)
    }
}

/// A database error of a proposal: one another transaction caused (a deadlock between two
/// proposals' row locks, a host-supplied id inserted by another replica first) decides again.
fn pg(db: &Db, e: tokio_postgres::Error) -> Abort {
    if Db::is_retryable(&e) || Db::is_unique_violation(&e) {
        Abort::Moved
    } else {
        Abort::Failed(db.sql(e))
    }
}

/// Decides and records a proposal; `id` is the new record's id if one is created.
pub(crate) async fn propose(
    shared: &Shared,
    p: &Proposal,
    id: IntentId,
) -> Result<ProposeDecision, JournalError> {
    let db = &shared.db;
    for _ in 0..POSTGRES_PROPOSE_RETRIES_MAX {
        let mut client = shared.client().await?;
        let deliveries = shared.pending_deliveries();
        let tx = client.transaction().await.map_err(|e| db.sql(e))?;
        let now = shared.clock.now_ms();
        super::write_deliveries(&tx, db, &deliveries, now).await?;
        match decide_in(&tx, shared, p, id, now).await {
            Ok(decision) => {
                match tx.commit().await {
                    Ok(()) => {}
                    Err(e) if Db::is_retryable(&e) => continue,
                    Err(e) => return Err(db.sql(e)),
                }
                shared.deliveries_written(&deliveries);
                return Ok(decision);
            }
            Err(Abort::Moved) => {
                let _ = tx.rollback().await;
            }
            Err(Abort::Failed(e)) => {
                let _ = tx.rollback().await;
                return Err(e);
            }
        }
    }
    Err(JournalError::Storage(format!(
        "{}: the proposal was contended by other replicas {POSTGRES_PROPOSE_RETRIES_MAX} times; \
         nothing was recorded",
        db.name
    )))
}

/// A record found for a proposal, with the `seq` its claims point at.
pub(crate) type Seen = Option<(IntentRecord, i64)>;

/// The records found for a proposal, each with the `seq` its claims point at.
#[derive(Default)]
pub(crate) struct SeenRecords {
    pub(crate) by_client_key: Seen,
    pub(crate) by_id: Seen,
    pub(crate) by_key: Seen,
    pub(crate) by_content: Seen,
}

impl SeenRecords {
    fn found(&self) -> Found<'_> {
        fn record(s: &Seen) -> Option<&IntentRecord> {
            s.as_ref().map(|(r, _)| r)
        }
        Found {
            by_client_key: record(&self.by_client_key),
            by_id: record(&self.by_id),
            by_key: record(&self.by_key),
            by_content: record(&self.by_content),
        }
    }

    /// The `seq` of every record found (a record found twice, twice).
    pub(crate) fn seqs(&self) -> impl Iterator<Item = i64> + '_ {
        [
            &self.by_client_key,
            &self.by_id,
            &self.by_key,
            &self.by_content,
        ]
        .into_iter()
        .flatten()
        .map(|(_, seq)| *seq)
    }
}

/// What a proposal's transaction must write, as the records found decide it.
// Matched once per proposal, and as large as the records it carries: boxing them would add an
// allocation to every proposal for nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Step {
    /// Answered from the records found; nothing to write.
    Answer(ProposeDecision),
    /// Answered once `record`, found with `expected_fence`, is written with a compare-and-set.
    Update {
        decision: ProposeDecision,
        record: IntentRecord,
        expected_fence: u64,
    },
    /// A new record, answered once it is inserted and its claims are taken.
    Insert(IntentRecord),
}

/// Decides `p` in memory from the records found (the shared `decide` rules): what to write,
/// and the answer once it is written. `id` is the new record's id if one is created.
pub(crate) fn plan(
    p: &Proposal,
    seen: &SeenRecords,
    id: IntentId,
    now: u64,
    me: u64,
) -> Result<Step, JournalError> {
    let attempt = match decide::plan_existing(p, seen.found(), now, me)? {
        Planned::Decided(plan) => {
            return Ok(match plan.write {
                None => Step::Answer(plan.decision),
                Some(Write::Update(record)) => {
                    let expected_fence = [&seen.by_client_key, &seen.by_key, &seen.by_id]
                        .into_iter()
                        .flatten()
                        .find(|(r, _)| r.id == record.id)
                        .map(|(r, _)| r.fence)
                        .expect("an update follows a found record");
                    Step::Update {
                        decision: plan.decision,
                        record,
                        expected_fence,
                    }
                }
                Some(Write::Insert(_)) => unreachable!("a plan of the records found never inserts"),
            });
        }
        Planned::Fresh { attempt } => attempt,
    };
    let record = decide::new_record(p, id, now, me);
    Ok(Step::Insert(decide::with_attempt(record, attempt, now)))
}

/// Decides `p` inside `tx` and writes what the decision says; [`Abort::Moved`] when another
/// replica moved a claim or a fence it read (the caller rolls back and decides again).
pub(crate) async fn decide_in(
    tx: &Transaction<'_>,
    shared: &Shared,
    p: &Proposal,
    id: IntentId,
    now: u64,
) -> Result<ProposeDecision, Abort> {
    let db = &shared.db;
    let me = shared.incarnation;
    let seen = read(tx, db, p).await?;
    let record = match plan(p, &seen, id, now, me)? {
        Step::Answer(decision) => return Ok(decision),
        Step::Update {
            decision,
            record,
            expected_fence,
        } => {
            if !rows::update(tx, db, &record, expected_fence, me, now).await? {
                return Err(Abort::Moved);
            }
            return Ok(decision);
        }
        Step::Insert(record) => record,
    };
    let Some(seq) = rows::insert(tx, db, &record, me, now).await? else {
        return Err(Abort::Moved);
    };
    if p.mutating {
        let seen_seq = |s: &Seen| s.as_ref().map(|(_, seq)| *seq);
        let key = p.semantic_key.encode();
        let content = decide::proposal_content_digest(p);
        futures::try_join!(
            claim(tx, db, Claim::Key(&key), seen_seq(&seen.by_key), seq),
            claim(
                tx,
                db,
                Claim::Content(&content),
                seen_seq(&seen.by_content),
                seq
            ),
        )?;
        if let Some(ck) = &p.client_key {
            let old = seen_seq(&seen.by_client_key);
            claim(tx, db, Claim::ClientKey(ck, now), old, seq).await?;
            forget_oldest_keys(tx, db, &ck.principal).await?;
        }
    }
    Ok(ProposeDecision::Recorded(record))
}

/// The records that bear on `p`, locked for this transaction: by the host's intent id, and for
/// a write by semantic key, content digest and the caller's key.
async fn read(tx: &Transaction<'_>, db: &Db, p: &Proposal) -> Result<SeenRecords, Abort> {
    let by_id: Seen = match p.intent_id {
        Some(id) => find(tx, db, "FROM intents i WHERE i.id = $1", &id.to_string()).await?,
        None => None,
    };
    if !p.mutating {
        return Ok(SeenRecords {
            by_id,
            ..SeenRecords::default()
        });
    }
    // Independent reads: sent together, they share a round trip (the client pipelines).
    let key = p.semantic_key.encode();
    let content = decide::proposal_content_digest(p);
    let (by_key, by_content) = futures::try_join!(
        find(
            tx,
            db,
            "FROM intent_keys k JOIN intents i ON i.seq = k.intent_seq \
             WHERE k.semantic_key = $1",
            &key,
        ),
        find(
            tx,
            db,
            "FROM intent_contents c JOIN intents i ON i.seq = c.intent_seq \
             WHERE c.content_digest = $1",
            &content,
        ),
    )?;
    let by_client_key: Seen = match &p.client_key {
        Some(ck) => find_client_key(tx, db, ck).await?,
        None => None,
    };
    Ok(SeenRecords {
        by_client_key,
        by_id,
        by_key,
        by_content,
    })
}

/// One record found through `from_where` (a `FROM … WHERE … = $1` clause over `intents i`),
/// locked for this transaction.
async fn find(tx: &Transaction<'_>, db: &Db, from_where: &str, value: &str) -> Result<Seen, Abort> {
    let sql = format!("SELECT {} {from_where} FOR UPDATE OF i", icols!());
    let statement = tx.prepare_cached(&sql).await.map_err(|e| pg(db, e))?;
    let row = tx
        .query_opt(&statement, &[&value])
        .await
        .map_err(|e| pg(db, e))?;
    Ok(row.map(|r| rows::from_indexed_row(&r, db)).transpose()?)
}

async fn find_client_key(tx: &Transaction<'_>, db: &Db, ck: &ClientKey) -> Result<Seen, Abort> {
    let sql = concat!(
        "SELECT ",
        icols!(),
        " FROM client_keys k JOIN intents i ON i.seq = k.intent_seq
         WHERE k.principal = $1 AND k.client_key = $2 FOR UPDATE OF i"
    );
    let statement = tx.prepare_cached(sql).await.map_err(|e| pg(db, e))?;
    let row = tx
        .query_opt(&statement, &[&ck.principal, &ck.key])
        .await
        .map_err(|e| pg(db, e))?;
    Ok(row.map(|r| rows::from_indexed_row(&r, db)).transpose()?)
}

/// An identity a new record takes.
enum Claim<'a> {
    Key(&'a str),
    Content(&'a str),
    ClientKey(&'a ClientKey, u64),
}

/// Points an identity at the new record `seq`: claimed where nobody held it (`seen` is `None`),
/// moved from `seen` where a record did. Another replica that claimed or moved it first makes
/// this proposal decide again.
async fn claim(
    tx: &Transaction<'_>,
    db: &Db,
    what: Claim<'_>,
    seen: Option<i64>,
    seq: i64,
) -> Result<(), Abort> {
    let (value, new, moved) = match &what {
        Claim::Key(key) => (
            *key,
            "INSERT INTO intent_keys (semantic_key, intent_seq) VALUES ($1, $2)
             ON CONFLICT DO NOTHING RETURNING intent_seq",
            "UPDATE intent_keys SET intent_seq = $2 WHERE semantic_key = $1 AND intent_seq = $3
             RETURNING intent_seq",
        ),
        Claim::Content(digest) => (
            *digest,
            "INSERT INTO intent_contents (content_digest, intent_seq) VALUES ($1, $2)
             ON CONFLICT DO NOTHING RETURNING intent_seq",
            "UPDATE intent_contents SET intent_seq = $2
             WHERE content_digest = $1 AND intent_seq = $3 RETURNING intent_seq",
        ),
        Claim::ClientKey(ck, now) => {
            return claim_client_key(tx, db, ck, *now, seq, seen).await;
        }
    };
    let row = match seen {
        None => {
            let statement = tx.prepare_cached(new).await.map_err(|e| pg(db, e))?;
            tx.query_opt(&statement, &[&value, &seq]).await
        }
        Some(old) => {
            let statement = tx.prepare_cached(moved).await.map_err(|e| pg(db, e))?;
            tx.query_opt(&statement, &[&value, &seq, &old]).await
        }
    }
    .map_err(|e| pg(db, e))?;
    if row.is_none() {
        return Err(Abort::Moved);
    }
    Ok(())
}

async fn claim_client_key(
    tx: &Transaction<'_>,
    db: &Db,
    ck: &ClientKey,
    now: u64,
    seq: i64,
    seen: Option<i64>,
) -> Result<(), Abort> {
    let now = to_i64(now);
    let row = match seen {
        None => {
            tx.query_opt(
                "INSERT INTO client_keys (principal, client_key, intent_seq, bound_ms)
                 VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING RETURNING intent_seq",
                &[&ck.principal, &ck.key, &seq, &now],
            )
            .await
        }
        Some(old) => {
            tx.query_opt(
                "UPDATE client_keys SET intent_seq = $3, bound_ms = $4
                 WHERE principal = $1 AND client_key = $2 AND intent_seq = $5
                 RETURNING intent_seq",
                &[&ck.principal, &ck.key, &seq, &now, &old],
            )
            .await
        }
    }
    .map_err(|e| pg(db, e))?;
    if row.is_none() {
        return Err(Abort::Moved);
    }
    Ok(())
}

/// Forgets a principal's oldest keys beyond [`CLIENT_KEYS_PER_PRINCIPAL_MAX`].
async fn forget_oldest_keys(
    tx: &Transaction<'_>,
    db: &Db,
    principal: &str,
) -> Result<(), JournalError> {
    tx.execute(
        "DELETE FROM client_keys WHERE principal = $1 AND client_key IN (
           SELECT client_key FROM client_keys WHERE principal = $1
           ORDER BY bound_ms, client_key
           LIMIT greatest(0, (SELECT count(*) FROM client_keys WHERE principal = $1) - $2))",
        &[&principal, &(CLIENT_KEYS_PER_PRINCIPAL_MAX as i64)],
    )
    .await
    .map_err(|e| db.sql(e))?;
    Ok(())
}
