//! The `intents` row and the record it stores: the column list, the insert of a new record,
//! the compare-and-set update of a changed one, and the parse of a row back into an
//! [`IntentRecord`]. A row that does not parse is corruption, reported with the record's id.

use super::Db;
use crate::JournalError;
use crate::record::{IntentId, IntentRecord};
use deadpool_postgres::GenericClient;
use ring0_core::{IntentState, SemanticKey};
use std::collections::{HashMap, HashSet};
use tokio_postgres::Row;

/// The columns [`from_row`] reads, as a macro so statements are built with `concat!`.
macro_rules! cols {
    () => {
        "id, semantic_key, scope, attempt_epoch, tool, canonical_args, call_ids, \
         idempotency_key, mutating, fence, attempts, state, timeline, receipt, snapshot, owner, \
         attempt, delivered_ms, client_principal, client_key"
    };
}
pub(crate) use cols;

/// The same columns qualified by the `intents` alias `i`, for joins.
macro_rules! icols {
    () => {
        "i.id, i.semantic_key, i.scope, i.attempt_epoch, i.tool, i.canonical_args, i.call_ids, \
         i.idempotency_key, i.mutating, i.fence, i.attempts, i.state, i.timeline, i.receipt, \
         i.snapshot, i.owner, i.attempt, i.delivered_ms, i.client_principal, i.client_key, i.seq"
    };
}
pub(crate) use icols;

/// The states of open records (not terminal), as stored: what recovery re-examines.
pub(crate) fn open_states() -> Vec<&'static str> {
    IntentState::ALL
        .iter()
        .filter(|s| !s.is_terminal())
        .map(|s| s.as_str())
        .collect()
}

pub(crate) fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

pub(crate) fn json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("journal values serialize")
}

/// Inserts a new record held by `holder` and returns its `seq`, or `None` when a record with its
/// id was inserted first (by another replica, for a host-supplied id).
pub(crate) async fn insert(
    client: &impl GenericClient,
    db: &Db,
    r: &IntentRecord,
    holder: u64,
    now: u64,
) -> Result<Option<i64>, JournalError> {
    let statement = client
        .prepare_cached(concat!(
            "INSERT INTO intents (",
            cols!(),
            ", holder, created_ms, updated_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, \
                 $10, $11, $12, $13, $14, $15, $16, $17, NULL, $18, $19, $20, $21, $21) \
             RETURNING seq"
        ))
        .await
        .map_err(|e| db.sql(e))?;
    let inserted = client
        .query_one(
            &statement,
            &[
                &r.id.to_string(),
                &r.semantic_key.encode(),
                &r.scope,
                &to_i64(r.attempt_epoch),
                &r.tool,
                &r.canonical_args,
                &json(&r.call_ids),
                &r.idempotency_key,
                &r.mutating,
                &to_i64(r.fence),
                &i64::from(r.attempts),
                &r.state.as_str(),
                &json(&r.timeline),
                &r.receipt.as_ref().map(json),
                &r.snapshot.as_ref().map(json),
                &to_i64(r.owner),
                &i64::from(r.attempt),
                &crate::record::principal_column(r),
                &r.client_key.as_ref().map(|k| k.key.as_str()),
                &to_i64(holder),
                &to_i64(now),
            ],
        )
        .await;
    match inserted {
        Ok(row) => row.try_get(0).map(Some).map_err(|e| db.sql(e)),
        Err(e) if Db::is_unique_violation(&e) => Ok(None),
        Err(e) => Err(db.sql(e)),
    }
}

/// Writes a changed record if its fence is still `expected_fence`: whether it was written (the
/// compare-and-set, in SQL, so no code path can skip it). A write that moves the fence makes
/// `holder` the record's lease holder; one that does not (a call id added) leaves the lease.
pub(crate) async fn update(
    client: &impl GenericClient,
    db: &Db,
    r: &IntentRecord,
    expected_fence: u64,
    holder: u64,
    now: u64,
) -> Result<bool, JournalError> {
    let statement = client
        .prepare_cached(
            "UPDATE intents SET call_ids = $1, fence = $2, attempts = $3, state = $4,
               timeline = $5, receipt = $6, snapshot = $7, updated_ms = $8, owner = $11,
               delivered_ms = CASE WHEN $12 THEN delivered_ms END,
               holder = CASE WHEN fence <> $2 THEN $13 ELSE holder END
             WHERE id = $9 AND fence = $10",
        )
        .await
        .map_err(|e| db.sql(e))?;
    let changed = client
        .execute(
            &statement,
            &[
                &json(&r.call_ids),
                &to_i64(r.fence),
                &i64::from(r.attempts),
                &r.state.as_str(),
                &json(&r.timeline),
                &r.receipt.as_ref().map(json),
                &r.snapshot.as_ref().map(json),
                &to_i64(now),
                &r.id.to_string(),
                &to_i64(expected_fence),
                &to_i64(r.owner),
                &r.delivered,
                &to_i64(holder),
            ],
        )
        .await
        .map_err(|e| db.sql(e))?;
    Ok(changed == 1)
}

/// One column of a multi-row statement: `f` of every row, as an array parameter.
fn column<T, U>(rows: &[T], f: impl Fn(&T) -> U) -> Vec<U> {
    rows.iter().map(f).collect()
}

/// The statement of [`insert_many`]: one row per element of its arrays.
const INSERT_MANY: &str = concat!(
    "INSERT INTO intents (",
    cols!(),
    ", holder, created_ms, updated_ms)
         SELECT u.id, u.semantic_key, u.scope, u.attempt_epoch, u.tool, u.canonical_args,
                u.call_ids, u.idempotency_key, u.mutating, u.fence, u.attempts, u.state,
                u.timeline, u.receipt, u.snapshot, u.owner, u.attempt, NULL,
                u.client_principal, u.client_key, $20, $21, $21
         FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[],
                     $6::text[], $7::text[], $8::text[], $9::bool[], $10::bigint[],
                     $11::bigint[], $12::text[], $13::text[], $14::text[], $15::text[],
                     $16::bigint[], $17::bigint[], $18::text[], $19::text[])
           AS u(id, semantic_key, scope, attempt_epoch, tool, canonical_args, call_ids,
                idempotency_key, mutating, fence, attempts, state, timeline, receipt,
                snapshot, owner, attempt, client_principal, client_key)
         ON CONFLICT (id) DO NOTHING RETURNING id, seq"
);

/// Inserts new records held by `holder`, all in one statement, and returns the `seq` of each
/// inserted, by id. A record whose id was inserted first (by another replica, for a
/// host-supplied id) is not among them. The caller maps the error (see the `group` module).
pub(crate) async fn insert_many(
    client: &impl GenericClient,
    records: &[&IntentRecord],
    holder: u64,
    now: u64,
) -> Result<HashMap<IntentId, i64>, tokio_postgres::Error> {
    if records.is_empty() {
        return Ok(HashMap::new());
    }
    let statement = client.prepare_cached(INSERT_MANY).await?;
    let inserted = client
        .query(
            &statement,
            &[
                &column(records, |r| r.id.to_string()),
                &column(records, |r| r.semantic_key.encode()),
                &column(records, |r| r.scope.clone()),
                &column(records, |r| to_i64(r.attempt_epoch)),
                &column(records, |r| r.tool.clone()),
                &column(records, |r| r.canonical_args.clone()),
                &column(records, |r| json(&r.call_ids)),
                &column(records, |r| r.idempotency_key.clone()),
                &column(records, |r| r.mutating),
                &column(records, |r| to_i64(r.fence)),
                &column(records, |r| i64::from(r.attempts)),
                &column(records, |r| r.state.as_str().to_string()),
                &column(records, |r| json(&r.timeline)),
                &column(records, |r| r.receipt.as_ref().map(json)),
                &column(records, |r| r.snapshot.as_ref().map(json)),
                &column(records, |r| to_i64(r.owner)),
                &column(records, |r| i64::from(r.attempt)),
                &column(records, |r| {
                    crate::record::principal_column(r).map(str::to_string)
                }),
                &column(records, |r| r.client_key.as_ref().map(|k| k.key.clone())),
                &to_i64(holder),
                &to_i64(now),
            ],
        )
        .await?;
    let mut seqs = HashMap::with_capacity(inserted.len());
    for row in inserted {
        let (id, seq): (String, i64) = (row.try_get(0)?, row.try_get(1)?);
        // The ids were sent from records: one that does not parse back was not among them.
        if let Ok(id) = IntentId::parse_str(&id) {
            seqs.insert(id, seq);
        }
    }
    Ok(seqs)
}

/// Writes changed records, each if its fence is still the one paired with it, all in one
/// statement (the compare-and-set of [`update`] for many): the ids of those written. The
/// caller maps the error (see the `group` module).
pub(crate) async fn update_many(
    client: &impl GenericClient,
    records: &[(&IntentRecord, u64)],
    holder: u64,
    now: u64,
) -> Result<HashSet<IntentId>, tokio_postgres::Error> {
    if records.is_empty() {
        return Ok(HashSet::new());
    }
    let statement = client
        .prepare_cached(
            "UPDATE intents i SET call_ids = u.call_ids, fence = u.fence, attempts = u.attempts,
               state = u.state, timeline = u.timeline, receipt = u.receipt,
               snapshot = u.snapshot, updated_ms = $12, owner = u.owner,
               delivered_ms = CASE WHEN u.delivered THEN i.delivered_ms END,
               holder = CASE WHEN i.fence <> u.fence THEN $13 ELSE i.holder END
             FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::text[],
                         $6::text[], $7::text[], $8::text[], $9::bigint[], $10::bool[],
                         $11::bigint[])
               AS u(id, call_ids, fence, attempts, state, timeline, receipt, snapshot, owner,
                    delivered, expected_fence)
             WHERE i.id = u.id AND i.fence = u.expected_fence
             RETURNING i.id",
        )
        .await?;
    let written = client
        .query(
            &statement,
            &[
                &column(records, |(r, _)| r.id.to_string()),
                &column(records, |(r, _)| json(&r.call_ids)),
                &column(records, |(r, _)| to_i64(r.fence)),
                &column(records, |(r, _)| i64::from(r.attempts)),
                &column(records, |(r, _)| r.state.as_str().to_string()),
                &column(records, |(r, _)| json(&r.timeline)),
                &column(records, |(r, _)| r.receipt.as_ref().map(json)),
                &column(records, |(r, _)| r.snapshot.as_ref().map(json)),
                &column(records, |(r, _)| to_i64(r.owner)),
                &column(records, |(r, _)| r.delivered),
                &column(records, |(_, fence)| to_i64(*fence)),
                &to_i64(now),
                &to_i64(holder),
            ],
        )
        .await?;
    let mut ids = HashSet::with_capacity(written.len());
    for row in written {
        let id: String = row.try_get(0)?;
        // The ids were sent from records: one that does not parse back was not among them.
        if let Ok(id) = IntentId::parse_str(&id) {
            ids.insert(id);
        }
    }
    Ok(ids)
}

/// Builds a record from a row; anything that does not parse is corruption, reported with the id.
pub(crate) fn from_row(row: &Row, db: &Db) -> Result<IntentRecord, JournalError> {
    let id_text: String = row.try_get(0).map_err(|e| db.sql(e))?;
    let bad = |what: &str| db.corrupt(format!("record {id_text}: malformed {what}"));
    let text = |i: usize, what: &str| -> Result<String, JournalError> {
        row.try_get::<_, String>(i).map_err(|_| bad(what))
    };
    let opt_text = |i: usize, what: &str| -> Result<Option<String>, JournalError> {
        row.try_get::<_, Option<String>>(i).map_err(|_| bad(what))
    };
    let int = |i: usize, what: &str| -> Result<i64, JournalError> {
        row.try_get::<_, i64>(i).map_err(|_| bad(what))
    };
    let unsigned = |i: usize, what: &str| -> Result<u64, JournalError> {
        u64::try_from(int(i, what)?).map_err(|_| bad(what))
    };
    let small = |i: usize, what: &str| -> Result<u32, JournalError> {
        u32::try_from(int(i, what)?).map_err(|_| bad(what))
    };
    let parse_json = |i: usize, what: &str| -> Result<Option<serde_json::Value>, JournalError> {
        opt_text(i, what)?
            .map(|t| serde_json::from_str(&t).map_err(|_| bad(what)))
            .transpose()
    };
    let (principal, client_key) = crate::record::ClientKey::from_columns(
        opt_text(18, "client principal")?,
        opt_text(19, "client key")?,
    )
    .ok_or_else(|| bad("client key"))?;
    Ok(IntentRecord {
        id: IntentId::parse_str(&id_text).map_err(|_| bad("id"))?,
        semantic_key: SemanticKey::decode(&text(1, "semantic key")?)
            .ok_or_else(|| bad("semantic key"))?,
        scope: text(2, "scope")?,
        attempt_epoch: unsigned(3, "epoch")?,
        tool: text(4, "tool")?,
        canonical_args: text(5, "arguments")?,
        call_ids: serde_json::from_str(&text(6, "call ids")?).map_err(|_| bad("call ids"))?,
        idempotency_key: text(7, "idempotency key")?,
        mutating: row.try_get(8).map_err(|_| bad("mutating flag"))?,
        fence: unsigned(9, "fence")?,
        attempts: small(10, "attempts")?,
        state: IntentState::parse(&text(11, "state")?).ok_or_else(|| bad("state"))?,
        timeline: serde_json::from_str(&text(12, "timeline")?).map_err(|_| bad("timeline"))?,
        receipt: parse_json(13, "receipt")?
            .map(serde_json::from_value)
            .transpose()
            .map_err(|_| bad("receipt"))?,
        snapshot: parse_json(14, "snapshot")?,
        owner: unsigned(15, "owner")?,
        attempt: small(16, "attempt")?,
        delivered: row
            .try_get::<_, Option<i64>>(17)
            .map_err(|_| bad("delivery"))?
            .is_some(),
        principal,
        client_key,
    })
}

/// A record and its `seq` from a row read with [`icols`].
pub(crate) fn from_indexed_row(row: &Row, db: &Db) -> Result<(IntentRecord, i64), JournalError> {
    let record = from_row(row, db)?;
    let seq = row.try_get(20).map_err(|e| db.sql(e))?;
    Ok((record, seq))
}

/// The record with this id, if any.
pub(crate) async fn load_by_id(
    client: &impl GenericClient,
    db: &Db,
    id: &IntentId,
) -> Result<Option<IntentRecord>, JournalError> {
    let statement = client
        .prepare_cached(concat!("SELECT ", cols!(), " FROM intents WHERE id = $1"))
        .await
        .map_err(|e| db.sql(e))?;
    let row = client
        .query_opt(&statement, &[&id.to_string()])
        .await
        .map_err(|e| db.sql(e))?;
    row.map(|r| from_row(&r, db)).transpose()
}
