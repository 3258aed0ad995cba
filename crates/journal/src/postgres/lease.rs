//! Replicas and their leases.
//!
//! Each open of a PostgreSQL journal is a replica: a row of `replicas` whose `incarnation`
//! stamps every record it moves (`IntentRecord::owner`) and whose `lease_until` it renews by
//! heartbeat. Every record also names its lease **holder**: the replica that last moved its
//! fence (it dispatched it, or is settling it). A record is in the hands of a live replica while
//! its holder's lease runs.
//!
//! Recovery ([`take_expired`]) takes the open records whose holder's lease lapsed — a replica
//! that was killed, partitioned away or closed — with `FOR UPDATE SKIP LOCKED`, so replicas
//! recovering at once split them and never wait on each other. Taking a record makes this
//! replica its holder and moves its fence, and changes nothing else (no state, no timeline): the
//! replica that lapsed, should it wake up, finds its fence moved and is refused
//! (`StaleFence`) on its next transition. The taken records are then settled by the same
//! protocol as after a crash ([`crate::recover`]), which sees them as left by another
//! incarnation.
//!
//! Replicas that are gone are pruned ([`prune`]) once they hold no open record and an hour has
//! passed, at every registration and recovery pass, so the table does not grow with restarts.
//!
//! Time here is the database server's clock (`clock_timestamp()`), the one clock every replica
//! shares; the journal's own [`crate::Clock`] stamps records as in every backend.

use super::rows::{self, cols, to_i64};
use super::{Db, Shared};
use crate::JournalError;
use crate::limits::{POSTGRES_REPLICA_RETENTION_MS, POSTGRES_TAKE_BATCH_MAX};
use crate::record::IntentRecord;
use deadpool_postgres::GenericClient;

/// Registers a new replica with a lease of `lease_ms` and returns its incarnation.
pub(crate) async fn register(
    client: &impl GenericClient,
    db: &Db,
    lease_ms: u64,
) -> Result<u64, JournalError> {
    let host = format!("pid {} on {}", std::process::id(), host_name());
    let row = client
        .query_one(
            "INSERT INTO replicas (lease_until, host)
             VALUES (clock_timestamp() + $1 * interval '1 millisecond', $2)
             RETURNING incarnation",
            &[&(to_i64(lease_ms) as f64), &host],
        )
        .await
        .map_err(|e| db.sql(e))?;
    let incarnation: i64 = row.try_get(0).map_err(|e| db.sql(e))?;
    prune(client, db).await?;
    u64::try_from(incarnation).map_err(|_| db.corrupt(format!("incarnation {incarnation}")))
}

/// Forgets replicas whose lease lapsed (or was given up) more than
/// [`POSTGRES_REPLICA_RETENTION_MS`] ago and that hold no open record, at most
/// [`POSTGRES_TAKE_BATCH_MAX`] a pass. A replica that still holds one keeps its row until
/// recovery takes its records, so an operator can see whose they were; a pruned replica's
/// records (settled) keep its incarnation as their owner.
pub(crate) async fn prune(client: &impl GenericClient, db: &Db) -> Result<u64, JournalError> {
    client
        .execute(
            "DELETE FROM replicas WHERE incarnation IN (
               SELECT r.incarnation FROM replicas r
               WHERE r.lease_until < clock_timestamp() - $1 * interval '1 millisecond'
                 AND NOT EXISTS (SELECT 1 FROM intents i
                                 WHERE i.holder = r.incarnation AND i.state = ANY($2))
               ORDER BY r.incarnation LIMIT $3
               FOR UPDATE SKIP LOCKED)",
            &[
                &(to_i64(POSTGRES_REPLICA_RETENTION_MS) as f64),
                &rows::open_states(),
                &POSTGRES_TAKE_BATCH_MAX,
            ],
        )
        .await
        .map_err(|e| db.sql(e))
}

/// Renews this replica's lease for `lease_ms` from now.
pub(crate) async fn renew(shared: &Shared) -> Result<(), JournalError> {
    let client = shared.client().await?;
    client
        .execute(
            "UPDATE replicas SET lease_until = clock_timestamp() + $2 * interval '1 millisecond'
             WHERE incarnation = $1",
            &[
                &to_i64(shared.incarnation),
                &(to_i64(shared.lease_ms) as f64),
            ],
        )
        .await
        .map_err(|e| shared.db.sql(e))?;
    Ok(())
}

/// Gives up this replica's lease: its open records are anyone's to recover from now on.
pub(crate) async fn release(shared: &Shared) -> Result<(), JournalError> {
    let client = shared.client().await?;
    client
        .execute(
            "UPDATE replicas SET lease_until = '-infinity' WHERE incarnation = $1",
            &[&to_i64(shared.incarnation)],
        )
        .await
        .map_err(|e| shared.db.sql(e))?;
    Ok(())
}

/// Takes the open records whose holder's lease lapsed (at most [`POSTGRES_TAKE_BATCH_MAX`] per
/// call, the oldest first), then returns every open record this replica took and has not moved
/// since — with its own records in flight (DISPATCHED, RECONCILING), which recovery leaves to
/// their live tasks. This replica's other open records (recorded and waiting for dispatch or a
/// person's approval, or being settled) are in its live tasks' hands and not returned.
pub(crate) async fn take_expired(shared: &Shared) -> Result<Vec<IntentRecord>, JournalError> {
    let db = &shared.db;
    let me = to_i64(shared.incarnation);
    let open = rows::open_states();
    let client = shared.client().await?;
    client
        .execute(
            "WITH lapsed AS (
               SELECT i.seq FROM intents i LEFT JOIN replicas r ON r.incarnation = i.holder
               WHERE i.state = ANY($1) AND i.holder <> $2
                 AND (r.incarnation IS NULL OR r.lease_until < clock_timestamp())
               ORDER BY i.seq LIMIT $3
               FOR UPDATE OF i SKIP LOCKED)
             UPDATE intents SET holder = $2, fence = intents.fence + 1
             FROM lapsed WHERE intents.seq = lapsed.seq",
            &[&open, &me, &POSTGRES_TAKE_BATCH_MAX],
        )
        .await
        .map_err(|e| db.sql(e))?;
    prune(&client, db).await?;
    let found = client
        .query(
            concat!(
                "SELECT ",
                cols!(),
                " FROM intents WHERE holder = $1 AND state = ANY($2)
                   AND (owner <> $1 OR state IN ('DISPATCHED', 'RECONCILING'))
                 ORDER BY seq"
            ),
            &[&me, &open],
        )
        .await
        .map_err(|e| db.sql(e))?;
    found.iter().map(|row| rows::from_row(row, db)).collect()
}

/// This machine's name, for the `replicas` row an operator reads.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "an unnamed host".into())
}
