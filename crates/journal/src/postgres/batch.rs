//! The set-based statements of a group commit (see the `group` module): every lookup of a batch
//! in one statement, every claim of a table in one, and the undo of a new record whose claim
//! another replica took first. Each statement carries the whole batch in array parameters
//! (`unnest`, `= ANY`), so its cost on the wire is one round trip, whatever the batch holds.
//!
//! The claims are those a proposal alone takes (see the `propose` module): an identity nobody
//! holds is claimed with `INSERT … ON CONFLICT DO NOTHING RETURNING`, one a record holds is
//! moved with `UPDATE … WHERE intent_seq = <the one read> RETURNING`; what is not returned was
//! taken by another replica first. Rows are claimed in key order, so two replicas' batches
//! claiming the same keys wait for each other instead of deadlocking.

use super::group::{Member, inserted};
use super::propose::{Seen, SeenRecords, Step};
use super::rows::{self, icols, to_i64};
use super::{Db, Shared};
use crate::JournalError;
use crate::decide;
use crate::limits::CLIENT_KEYS_PER_PRINCIPAL_MAX;
use crate::record::{IntentId, IntentRecord, Proposal};
use deadpool_postgres::Transaction;
use std::collections::{HashMap, HashSet};

/// Why a batch's transaction recorded nothing.
pub(super) enum BatchError {
    /// The server refused a statement (bad input, a conflict with another transaction), or
    /// the batch cannot be decided as one (see [`write`]): decide each proposal again alone.
    Alone,
    /// The journal failed (no connection, a broken one): every proposal is answered with it.
    Failed(JournalError),
}

impl From<JournalError> for BatchError {
    fn from(e: JournalError) -> Self {
        Self::Failed(e)
    }
}

/// Maps a database error of a batch: one the server answered with is about the statement, and
/// so perhaps about one proposal — each is decided alone; any other (the connection) is the
/// batch's.
pub(super) fn sql(db: &Db, e: tokio_postgres::Error) -> BatchError {
    if e.as_db_error().is_some() || Db::is_retryable(&e) {
        BatchError::Alone
    } else {
        BatchError::Failed(db.sql(e))
    }
}

/// An identity two proposals of one batch must not share.
#[derive(PartialEq, Eq, Hash)]
pub(super) enum Identity {
    Id(IntentId),
    Key(String),
    Content(String),
    ClientKey(String, String),
}

/// What one proposal reads: each identity it may find a record under.
pub(super) struct Lookup {
    /// The record's id: the host's, or the one drawn for a new record.
    id: IntentId,
    /// The host-supplied id, looked up.
    by_id: Option<String>,
    /// The semantic key, content digest and caller's key of a mutating proposal.
    key: Option<String>,
    content: Option<String>,
    client_key: Option<(String, String)>,
}

impl Lookup {
    pub(super) fn of(p: &Proposal, id: IntentId) -> Self {
        let by_id = p.intent_id.map(|id| id.to_string());
        if !p.mutating {
            return Self {
                id,
                by_id,
                key: None,
                content: None,
                client_key: None,
            };
        }
        Self {
            id,
            by_id,
            key: Some(p.semantic_key.encode()),
            content: Some(decide::proposal_content_digest(p)),
            client_key: p
                .client_key
                .as_ref()
                .map(|ck| (ck.principal.clone(), ck.key.clone())),
        }
    }

    pub(super) fn identities(&self) -> Vec<Identity> {
        let mut all = vec![Identity::Id(self.id)];
        all.extend(self.key.clone().map(Identity::Key));
        all.extend(self.content.clone().map(Identity::Content));
        all.extend(
            self.client_key
                .clone()
                .map(|(principal, key)| Identity::ClientKey(principal, key)),
        );
        all
    }
}

/// The records a batch found, by what found them, each with its `seq`.
#[derive(Default)]
pub(super) struct Found {
    by_id: HashMap<String, (IntentRecord, i64)>,
    by_key: HashMap<String, (IntentRecord, i64)>,
    by_content: HashMap<String, (IntentRecord, i64)>,
    /// With the claim's `bound_ms`, put back if the claim is moved and then undone.
    by_client_key: HashMap<(String, String), (IntentRecord, i64, i64)>,
}

impl Found {
    /// The records one proposal found.
    pub(super) fn seen(&self, l: &Lookup) -> SeenRecords {
        fn get<K: std::hash::Hash + Eq>(map: &HashMap<K, (IntentRecord, i64)>, k: &K) -> Seen {
            map.get(k).cloned()
        }
        SeenRecords {
            by_client_key: l
                .client_key
                .as_ref()
                .and_then(|k| self.by_client_key.get(k))
                .map(|(r, seq, _)| (r.clone(), *seq)),
            by_id: l.by_id.as_ref().and_then(|k| get(&self.by_id, k)),
            by_key: l.key.as_ref().and_then(|k| get(&self.by_key, k)),
            by_content: l.content.as_ref().and_then(|k| get(&self.by_content, k)),
        }
    }

    /// Files a row of [`find`] under what found it.
    fn add(&mut self, row: &tokio_postgres::Row, db: &Db) -> Result<(), BatchError> {
        // A record that does not parse is the error of the proposals that found it, alone.
        let found = rows::from_indexed_row(row, db).map_err(|_| BatchError::Alone)?;
        let text = |i: usize| row.try_get::<_, Option<String>>(i).map_err(|e| sql(db, e));
        let (kind, v1, v2) = (text(21)?, text(22)?.unwrap_or_default(), text(23)?);
        match (kind.as_deref(), v2) {
            (Some("key"), _) => self.by_key.insert(v1, found),
            (Some("content"), _) => self.by_content.insert(v1, found),
            (Some("id"), _) => self.by_id.insert(v1, found),
            (Some("client"), Some(key)) => {
                let bound: i64 = row.try_get(24).map_err(|e| sql(db, e))?;
                let (record, seq) = found;
                self.by_client_key
                    .insert((v1, key), (record, seq, bound))
                    .map(|(r, seq, _)| (r, seq))
            }
            _ => return Err(BatchError::Alone),
        };
        Ok(())
    }

    /// When the caller's key a proposal found was bound.
    fn key_bound_ms(&self, l: &Lookup) -> Option<i64> {
        let key = l.client_key.as_ref()?;
        self.by_client_key.get(key).map(|(_, _, bound)| *bound)
    }
}

/// Every record bearing on the proposals `lookups` describe — by host-supplied id, semantic
/// key, content digest and caller's key — in one statement, locked for this transaction in
/// `seq` order (so batches of two replicas take their locks in one order).
pub(super) async fn find(
    tx: &Transaction<'_>,
    db: &Db,
    lookups: &[&Lookup],
) -> Result<Found, BatchError> {
    let statement = tx
        .prepare_cached(concat!(
            "SELECT ",
            icols!(),
            ", f.kind, f.v1, f.v2, f.bound_ms FROM (
               SELECT 'key' AS kind, k.semantic_key AS v1, NULL::text AS v2,
                      NULL::bigint AS bound_ms, k.intent_seq AS seq
                 FROM intent_keys k WHERE k.semantic_key = ANY($1::text[])
               UNION ALL
               SELECT 'content', c.content_digest, NULL, NULL, c.intent_seq
                 FROM intent_contents c WHERE c.content_digest = ANY($2::text[])
               UNION ALL
               SELECT 'client', ck.principal, ck.client_key, ck.bound_ms, ck.intent_seq
                 FROM client_keys ck
                 JOIN unnest($3::text[], $4::text[]) AS w(principal, client_key)
                   ON ck.principal = w.principal AND ck.client_key = w.client_key
               UNION ALL
               SELECT 'id', x.id, NULL, NULL, x.seq FROM intents x WHERE x.id = ANY($5::text[])
             ) f JOIN intents i ON i.seq = f.seq
             ORDER BY i.seq FOR UPDATE OF i"
        ))
        .await
        .map_err(|e| sql(db, e))?;
    let each = |f: &dyn Fn(&Lookup) -> Option<&String>| -> Vec<&str> {
        lookups
            .iter()
            .filter_map(|l| f(l))
            .map(String::as_str)
            .collect()
    };
    let client_keys: Vec<&(String, String)> = lookups
        .iter()
        .filter_map(|l| l.client_key.as_ref())
        .collect();
    let principals: Vec<&str> = client_keys.iter().map(|(p, _)| p.as_str()).collect();
    let keys: Vec<&str> = client_keys.iter().map(|(_, k)| k.as_str()).collect();
    let found = tx
        .query(
            &statement,
            &[
                &each(&|l| l.key.as_ref()),
                &each(&|l| l.content.as_ref()),
                &principals,
                &keys,
                &each(&|l| l.by_id.as_ref()),
            ],
        )
        .await
        .map_err(|e| sql(db, e))?;
    let mut all = Found::default();
    for row in &found {
        all.add(row, db)?;
    }
    Ok(all)
}

/// Writes every member's step: the changed records and the new ones (sent together), then the
/// new ones' claims; a new record whose claim did not take is taken back out (see [`undo`]).
/// Whether each member's write took, in member order: one that did not is decided again alone
/// after the batch. Last, a principal's keys beyond [`CLIENT_KEYS_PER_PRINCIPAL_MAX`] are
/// forgotten, as after each keyed proposal alone; if that forgets a key a member looked up,
/// deciding one after another could have seen it gone, so the batch is decided alone instead.
pub(super) async fn write(
    tx: &Transaction<'_>,
    shared: &Shared,
    found: &Found,
    members: &[Member<'_>],
    now: u64,
) -> Result<Vec<bool>, BatchError> {
    let (db, me) = (&shared.db, shared.incarnation);
    let updates: Vec<(&IntentRecord, u64)> = members
        .iter()
        .filter_map(|m| match &m.step {
            Step::Update {
                record,
                expected_fence,
                ..
            } => Some((record, *expected_fence)),
            _ => None,
        })
        .collect();
    let inserts: Vec<&IntentRecord> = members.iter().filter_map(inserted).collect();
    let (updated, seqs) = futures::try_join!(
        rows::update_many(tx, &updates, me, now),
        rows::insert_many(tx, &inserts, me, now),
    )
    .map_err(|e| sql(db, e))?;
    let claims = Claims::of(members, found, &seqs);
    let taken = claims.take(tx, now).await.map_err(|e| sql(db, e))?;
    let lost: Vec<&Claim> = claims
        .0
        .iter()
        .filter(|c| !taken.contains(&c.seq))
        .collect();
    if !lost.is_empty() {
        undo(tx, &lost).await.map_err(|e| sql(db, e))?;
    }
    let written: Vec<bool> = members
        .iter()
        .map(|m| match &m.step {
            Step::Update { record, .. } => updated.contains(&record.id),
            Step::Insert(record) => seqs
                .get(&record.id)
                .is_some_and(|seq| !m.proposal.mutating || taken.contains(seq)),
            Step::Answer(_) => true,
        })
        .collect();
    forget_oldest_keys(tx, db, members, &written).await?;
    Ok(written)
}

/// One identity claimed for the new record `seq`, moved from the record `from` where one held
/// it.
#[derive(Clone, Copy)]
struct ClaimRow<V> {
    value: V,
    seq: i64,
    from: Option<i64>,
}

/// A caller's key claimed: (principal, key).
type KeyClaim<'a> = ClaimRow<(&'a str, &'a str)>;

/// The identities one new record claims.
struct Claim<'a> {
    seq: i64,
    key: ClaimRow<&'a str>,
    content: ClaimRow<&'a str>,
    client_key: Option<KeyClaim<'a>>,
    /// When the caller's key was bound to the record it is moved from: put back by an undo.
    client_key_bound_ms: Option<i64>,
}

/// The claims of every new mutating record of a batch.
struct Claims<'a>(Vec<Claim<'a>>);

impl<'a> Claims<'a> {
    fn of(members: &'a [Member<'_>], found: &Found, seqs: &HashMap<IntentId, i64>) -> Self {
        let from = |s: &Seen| s.as_ref().map(|(_, seq)| *seq);
        let claims = members
            .iter()
            .filter(|m| m.proposal.mutating)
            .filter_map(|m| {
                let seq = *seqs.get(&inserted(m)?.id)?;
                let l = m.lookup;
                let row = |value, seen: &Seen| ClaimRow {
                    value,
                    seq,
                    from: from(seen),
                };
                Some(Claim {
                    seq,
                    key: row(l.key.as_deref()?, &m.seen.by_key),
                    content: row(l.content.as_deref()?, &m.seen.by_content),
                    client_key: l.client_key.as_ref().map(|(p, k)| ClaimRow {
                        value: (p.as_str(), k.as_str()),
                        seq,
                        from: from(&m.seen.by_client_key),
                    }),
                    client_key_bound_ms: found.key_bound_ms(l),
                })
            })
            .collect();
        Self(claims)
    }

    /// Takes every claim (the statements of the three tables pipelined); the `seq` of each
    /// record all of whose claims took.
    async fn take(
        &self,
        tx: &Transaction<'_>,
        now: u64,
    ) -> Result<HashSet<i64>, tokio_postgres::Error> {
        let keys: Vec<_> = self.0.iter().map(|c| c.key).collect();
        let contents: Vec<_> = self.0.iter().map(|c| c.content).collect();
        let client_keys: Vec<_> = self.0.iter().filter_map(|c| c.client_key).collect();
        let (keys, contents, client_keys) = futures::try_join!(
            claim(tx, &INTENT_KEYS, &keys),
            claim(tx, &INTENT_CONTENTS, &contents),
            claim_client_keys(tx, &client_keys, now),
        )?;
        Ok(self
            .0
            .iter()
            .filter(|c| keys.contains(&c.seq) && contents.contains(&c.seq))
            .filter(|c| c.client_key.is_none() || client_keys.contains(&c.seq))
            .map(|c| c.seq)
            .collect())
    }
}

/// The statements of a claims table keyed by one text column.
struct ClaimTable {
    /// Claims `$1[i]` for `$2[i]` where nobody holds it.
    claim: &'static str,
    /// Moves `$1[i]` to `$2[i]` from `$3[i]`, where that record still holds it.
    moved: &'static str,
    /// Moves `$1[i]` back from `$2[i]` to `$3[i]` (the undo of `moved`).
    give_back: &'static str,
    /// Drops the claims of the records `$1`.
    drop: &'static str,
}

const INTENT_KEYS: ClaimTable = ClaimTable {
    claim: "INSERT INTO intent_keys (semantic_key, intent_seq)
            SELECT u.v, u.seq FROM unnest($1::text[], $2::bigint[]) AS u(v, seq) ORDER BY u.v
            ON CONFLICT DO NOTHING RETURNING intent_seq",
    moved: "UPDATE intent_keys t SET intent_seq = u.seq
            FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS u(v, seq, old)
            WHERE t.semantic_key = u.v AND t.intent_seq = u.old RETURNING t.intent_seq",
    give_back: "UPDATE intent_keys t SET intent_seq = u.old
                FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS u(v, seq, old)
                WHERE t.semantic_key = u.v AND t.intent_seq = u.seq",
    drop: "DELETE FROM intent_keys WHERE intent_seq = ANY($1::bigint[])",
};

const INTENT_CONTENTS: ClaimTable = ClaimTable {
    claim: "INSERT INTO intent_contents (content_digest, intent_seq)
            SELECT u.v, u.seq FROM unnest($1::text[], $2::bigint[]) AS u(v, seq) ORDER BY u.v
            ON CONFLICT DO NOTHING RETURNING intent_seq",
    moved: "UPDATE intent_contents t SET intent_seq = u.seq
            FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS u(v, seq, old)
            WHERE t.content_digest = u.v AND t.intent_seq = u.old RETURNING t.intent_seq",
    give_back: "UPDATE intent_contents t SET intent_seq = u.old
                FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS u(v, seq, old)
                WHERE t.content_digest = u.v AND t.intent_seq = u.seq",
    drop: "DELETE FROM intent_contents WHERE intent_seq = ANY($1::bigint[])",
};

/// One column of a multi-row statement, as an array parameter.
fn column<T, U>(rows: &[T], f: impl Fn(&T) -> U) -> Vec<U> {
    rows.iter().map(f).collect()
}

/// Takes `rows` in `table`, new claims and moved ones pipelined; the `seq` of each that took.
async fn claim(
    tx: &Transaction<'_>,
    table: &ClaimTable,
    rows: &[ClaimRow<&str>],
) -> Result<HashSet<i64>, tokio_postgres::Error> {
    let (new, moved): (Vec<ClaimRow<&str>>, Vec<_>) = rows.iter().partition(|r| r.from.is_none());
    let claim_new = async {
        if new.is_empty() {
            return Ok(Vec::new());
        }
        let statement = tx.prepare_cached(table.claim).await?;
        let (values, seqs) = (column(&new, |r| r.value), column(&new, |r| r.seq));
        tx.query(&statement, &[&values, &seqs]).await
    };
    let claim_moved = async {
        if moved.is_empty() {
            return Ok(Vec::new());
        }
        let statement = tx.prepare_cached(table.moved).await?;
        let (values, seqs) = (column(&moved, |r| r.value), column(&moved, |r| r.seq));
        let from = column(&moved, |r| r.from.unwrap_or_default());
        tx.query(&statement, &[&values, &seqs, &from]).await
    };
    let (new, moved) = futures::try_join!(claim_new, claim_moved)?;
    new.iter().chain(&moved).map(|row| row.try_get(0)).collect()
}

/// Takes callers' keys, bound at `now`, new claims and moved ones pipelined; the `seq` of each
/// that took.
async fn claim_client_keys(
    tx: &Transaction<'_>,
    rows: &[KeyClaim<'_>],
    now: u64,
) -> Result<HashSet<i64>, tokio_postgres::Error> {
    let (new, moved): (Vec<KeyClaim>, Vec<_>) = rows.iter().partition(|r| r.from.is_none());
    let now = to_i64(now);
    let claim_new = async {
        if new.is_empty() {
            return Ok(Vec::new());
        }
        let statement = tx
            .prepare_cached(
                "INSERT INTO client_keys (principal, client_key, intent_seq, bound_ms)
                 SELECT u.principal, u.client_key, u.seq, $4
                 FROM unnest($1::text[], $2::text[], $3::bigint[])
                   AS u(principal, client_key, seq)
                 ORDER BY u.principal, u.client_key
                 ON CONFLICT DO NOTHING RETURNING intent_seq",
            )
            .await?;
        let (principals, keys) = (column(&new, |r| r.value.0), column(&new, |r| r.value.1));
        let seqs = column(&new, |r| r.seq);
        tx.query(&statement, &[&principals, &keys, &seqs, &now])
            .await
    };
    let claim_moved = async {
        if moved.is_empty() {
            return Ok(Vec::new());
        }
        let statement = tx
            .prepare_cached(
                "UPDATE client_keys t SET intent_seq = u.seq, bound_ms = $5
                 FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[])
                   AS u(principal, client_key, seq, old)
                 WHERE t.principal = u.principal AND t.client_key = u.client_key
                   AND t.intent_seq = u.old
                 RETURNING t.intent_seq",
            )
            .await?;
        let (principals, keys) = (column(&moved, |r| r.value.0), column(&moved, |r| r.value.1));
        let seqs = column(&moved, |r| r.seq);
        let from = column(&moved, |r| r.from.unwrap_or_default());
        tx.query(&statement, &[&principals, &keys, &seqs, &from, &now])
            .await
    };
    let (new, moved) = futures::try_join!(claim_new, claim_moved)?;
    new.iter().chain(&moved).map(|row| row.try_get(0)).collect()
}

/// Takes new records whose claim another replica took first back out of the transaction: the
/// claims they moved go back to the records they were moved from (a caller's key with its
/// `bound_ms`), the claims they took anew are dropped, and so are their rows. The three steps
/// run in order (a claim given back must not be dropped; a row is deleted after its claims).
async fn undo(tx: &Transaction<'_>, lost: &[&Claim<'_>]) -> Result<(), tokio_postgres::Error> {
    let moved = |row: &ClaimRow<&str>| row.from.is_some();
    let keys: Vec<_> = lost.iter().map(|c| c.key).filter(moved).collect();
    let contents: Vec<_> = lost.iter().map(|c| c.content).filter(moved).collect();
    let client_keys: Vec<_> = lost
        .iter()
        .filter_map(|c| {
            Some((
                c.client_key.filter(|k| k.from.is_some())?,
                c.client_key_bound_ms?,
            ))
        })
        .collect();
    futures::try_join!(
        give_back(tx, INTENT_KEYS.give_back, &keys),
        give_back(tx, INTENT_CONTENTS.give_back, &contents),
        give_back_client_keys(tx, &client_keys),
    )?;
    let seqs: Vec<i64> = lost.iter().map(|c| c.seq).collect();
    futures::try_join!(
        drop_claims(tx, INTENT_KEYS.drop, &seqs),
        drop_claims(tx, INTENT_CONTENTS.drop, &seqs),
        drop_claims(
            tx,
            "DELETE FROM client_keys WHERE intent_seq = ANY($1::bigint[])",
            &seqs
        ),
    )?;
    tx.execute(
        "DELETE FROM intents WHERE seq = ANY($1::bigint[])",
        &[&seqs],
    )
    .await?;
    Ok(())
}

/// Moves claims back to the records they were moved from (a [`ClaimTable::give_back`]).
async fn give_back(
    tx: &Transaction<'_>,
    statement: &str,
    rows: &[ClaimRow<&str>],
) -> Result<u64, tokio_postgres::Error> {
    if rows.is_empty() {
        return Ok(0);
    }
    let (values, seqs) = (column(rows, |r| r.value), column(rows, |r| r.seq));
    let from = column(rows, |r| r.from.unwrap_or_default());
    tx.execute(statement, &[&values, &seqs, &from]).await
}

/// Moves callers' keys back to the records they were moved from, each with the `bound_ms` it
/// had there.
async fn give_back_client_keys(
    tx: &Transaction<'_>,
    rows: &[(KeyClaim<'_>, i64)],
) -> Result<u64, tokio_postgres::Error> {
    if rows.is_empty() {
        return Ok(0);
    }
    tx.execute(
        "UPDATE client_keys t SET intent_seq = u.old, bound_ms = u.bound
         FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::bigint[])
           AS u(principal, client_key, seq, old, bound)
         WHERE t.principal = u.principal AND t.client_key = u.client_key
           AND t.intent_seq = u.seq",
        &[
            &column(rows, |(r, _)| r.value.0),
            &column(rows, |(r, _)| r.value.1),
            &column(rows, |(r, _)| r.seq),
            &column(rows, |(r, _)| r.from.unwrap_or_default()),
            &column(rows, |(_, bound_ms)| *bound_ms),
        ],
    )
    .await
}

async fn drop_claims(
    tx: &Transaction<'_>,
    statement: &str,
    seqs: &Vec<i64>,
) -> Result<u64, tokio_postgres::Error> {
    tx.execute(statement, &[seqs]).await
}

/// Forgets the keys of every principal a written member bound a new key for beyond
/// [`CLIENT_KEYS_PER_PRINCIPAL_MAX`], oldest first, as each keyed proposal alone does after
/// its claim (once for the batch leaves the same keys: the newest). [`BatchError::Alone`] if
/// it forgets a key a member looked up.
async fn forget_oldest_keys(
    tx: &Transaction<'_>,
    db: &Db,
    members: &[Member<'_>],
    written: &[bool],
) -> Result<(), BatchError> {
    let mut principals: Vec<&str> = members
        .iter()
        .zip(written)
        .filter(|(m, written)| **written && inserted(m).is_some())
        .filter_map(|(m, _)| m.lookup.client_key.as_ref().map(|(p, _)| p.as_str()))
        .collect();
    if principals.is_empty() {
        return Ok(());
    }
    principals.sort_unstable();
    principals.dedup();
    let statement = tx
        .prepare_cached(
            "DELETE FROM client_keys d USING (
               SELECT principal, client_key FROM (
                 SELECT principal, client_key, row_number() OVER (
                   PARTITION BY principal ORDER BY bound_ms DESC, client_key DESC) AS newer
                 FROM client_keys WHERE principal = ANY($1::text[])
               ) ranked WHERE newer > $2
             ) old
             WHERE d.principal = old.principal AND d.client_key = old.client_key
             RETURNING d.principal, d.client_key",
        )
        .await
        .map_err(|e| sql(db, e))?;
    let max = CLIENT_KEYS_PER_PRINCIPAL_MAX as i64;
    let forgotten = tx
        .query(&statement, &[&principals, &max])
        .await
        .map_err(|e| sql(db, e))?;
    let looked_up: HashSet<(&str, &str)> = members
        .iter()
        .filter_map(|m| m.lookup.client_key.as_ref())
        .map(|(p, k)| (p.as_str(), k.as_str()))
        .collect();
    for row in forgotten {
        let (p, k): (String, String) = (
            row.try_get(0).map_err(|e| sql(db, e))?,
            row.try_get(1).map_err(|e| sql(db, e))?,
        );
        if looked_up.contains(&(p.as_str(), k.as_str())) {
            return Err(BatchError::Alone);
        }
    }
    Ok(())
}
