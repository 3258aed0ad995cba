//! Held calls on the shared journal: any replica lists and decides them, and the replica whose
//! call waits for the decision is told at once.
//!
//! A held call is a row of `held_calls` (the call as JSON, its state and age as columns for the
//! pending listing), as in SQLite. A decision is a compare-and-set from `PENDING` under the
//! row's lock (`hold::decide` judges it, as on every backend), and its transaction also sends
//! `NOTIFY ring0_holds` with the approval id, which PostgreSQL delivers when it commits.
//!
//! Every journal keeps one connection of its own outside the pool that `LISTEN`s on that
//! channel ([`listen`]) and hands each approval id to the local waiters
//! ([`crate::Journal::hold_wait`]) through a bounded broadcast. Notifications are a speed-up,
//! never the source of truth: a waiter reads the record again every
//! [`POSTGRES_HOLD_POLL_MS`](crate::limits::POSTGRES_HOLD_POLL_MS) whatever it heard, and after
//! the listener reconnects every waiter reads it at once, so a notification lost while the
//! listener was down delays a decision by one poll at most.

use super::Db;
use super::rows::{json, to_i64};
use crate::JournalError;
use crate::hold::{self, HOLDS_LISTED_MAX, HeldCall, HoldDecided, HoldState};
use crate::limits::{POSTGRES_CONNECT_TIMEOUT_MS, POSTGRES_LISTEN_BACKOFF_MS_MAX};
use deadpool_postgres::GenericClient;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::broadcast;

/// The channel decisions are announced on; the payload is the approval id.
pub(crate) const CHANNEL: &str = "ring0_holds";

/// What the listener hands waiters: a decided approval id, or a prompt for every waiter to read
/// its record again (the listener (re)connected, so notifications may have been missed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HoldNotice {
    Decided(String),
    ReadAgain,
}

/// Records a held call. Returns whether it was stored: an approval id already recorded (ids are
/// random, so only a repeated record) is left as it stands.
pub(crate) async fn put(
    client: &impl GenericClient,
    db: &Db,
    held: &HeldCall,
) -> Result<bool, JournalError> {
    let inserted = client
        .execute(
            "INSERT INTO held_calls (approval_id, state, created_ms, deadline_ms, body)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (approval_id) DO NOTHING",
            &[
                &held.approval_id,
                &held.state.as_str(),
                &to_i64(held.created_ms),
                &to_i64(held.deadline_ms),
                &json(held),
            ],
        )
        .await
        .map_err(|e| db.sql(e))?;
    Ok(inserted == 1)
}

/// The held call with this approval id, in whatever state.
pub(crate) async fn get(
    client: &impl GenericClient,
    db: &Db,
    approval_id: &str,
) -> Result<Option<HeldCall>, JournalError> {
    let row = client
        .query_opt(
            "SELECT body FROM held_calls WHERE approval_id = $1",
            &[&approval_id],
        )
        .await
        .map_err(|e| db.sql(e))?;
    row.map(|r| parse(db, &r)).transpose()
}

/// Held calls still PENDING, oldest first, at most [`HOLDS_LISTED_MAX`].
pub(crate) async fn pending(
    client: &impl GenericClient,
    db: &Db,
) -> Result<Vec<HeldCall>, JournalError> {
    let rows = client
        .query(
            "SELECT body FROM held_calls WHERE state = 'PENDING'
             ORDER BY created_ms, approval_id LIMIT $1",
            &[&(HOLDS_LISTED_MAX as i64)],
        )
        .await
        .map_err(|e| db.sql(e))?;
    rows.iter().map(|r| parse(db, r)).collect()
}

/// Held calls whose intents may still wait, oldest first, at most [`HOLDS_LISTED_MAX`]: the
/// PENDING ones, and the APPROVED ones before their deadline (see
/// [`crate::Journal::holds_unreleased`]).
pub(crate) async fn unreleased(
    client: &impl GenericClient,
    db: &Db,
    now_ms: u64,
) -> Result<Vec<HeldCall>, JournalError> {
    let rows = client
        .query(
            "SELECT body FROM held_calls
             WHERE state = 'PENDING' OR (state = 'APPROVED' AND deadline_ms > $2)
             ORDER BY created_ms, approval_id LIMIT $1",
            &[&(HOLDS_LISTED_MAX as i64), &to_i64(now_ms)],
        )
        .await
        .map_err(|e| db.sql(e))?;
    rows.iter().map(|r| parse(db, r)).collect()
}

/// Decides a held call once, at `now_ms`: the row is locked, judged by `hold::decide`, updated
/// only while still PENDING, and the decision announced on [`CHANNEL`] with the commit.
pub(crate) async fn decide(
    client: &mut deadpool_postgres::Client,
    db: &Db,
    approval_id: &str,
    state: HoldState,
    now_ms: u64,
) -> Result<HoldDecided, JournalError> {
    let tx = client.transaction().await.map_err(|e| db.sql(e))?;
    let row = tx
        .query_opt(
            "SELECT body FROM held_calls WHERE approval_id = $1 FOR UPDATE",
            &[&approval_id],
        )
        .await
        .map_err(|e| db.sql(e))?;
    let Some(row) = row else {
        return Ok(HoldDecided::NotFound);
    };
    let outcome = hold::decide(parse(db, &row)?, state, now_ms);
    let Some(changed) = outcome.changed() else {
        return Ok(outcome);
    };
    let updated = tx
        .execute(
            "UPDATE held_calls SET state = $2, body = $3
             WHERE approval_id = $1 AND state = 'PENDING'",
            &[&approval_id, &changed.state.as_str(), &json(changed)],
        )
        .await
        .map_err(|e| db.sql(e))?;
    // The row is locked and was PENDING when read: nothing else can have decided it.
    assert_eq!(updated, 1, "a locked pending held call is updated once");
    tx.execute("SELECT pg_notify($1, $2)", &[&CHANNEL, &approval_id])
        .await
        .map_err(|e| db.sql(e))?;
    tx.commit().await.map_err(|e| db.sql(e))?;
    Ok(outcome)
}

fn parse(db: &Db, row: &tokio_postgres::Row) -> Result<HeldCall, JournalError> {
    let text: String = row.try_get(0).map_err(|e| db.sql(e))?;
    serde_json::from_str(&text).map_err(|e| db.corrupt(format!("a held call does not parse: {e}")))
}

/// Listens on [`CHANNEL`] on a connection of its own and hands every decision to `notices`,
/// for as long as it runs (the journal aborts it when closed). A lost connection is made
/// again, waiting 100 ms at first and doubling up to [`POSTGRES_LISTEN_BACKOFF_MS_MAX`]; each
/// new connection tells every waiter to read its record again.
pub(crate) async fn listen(
    config: tokio_postgres::Config,
    tls: tokio_postgres_rustls::MakeRustlsConnect,
    notices: broadcast::Sender<HoldNotice>,
    listening: Arc<AtomicBool>,
) {
    let first_backoff = Duration::from_millis(100);
    let mut backoff = first_backoff;
    loop {
        if listen_once(&config, tls.clone(), &notices, &listening).await {
            backoff = first_backoff;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_millis(POSTGRES_LISTEN_BACKOFF_MS_MAX));
    }
}

/// One listening connection, until it fails. Returns whether it listened at all.
async fn listen_once(
    config: &tokio_postgres::Config,
    tls: tokio_postgres_rustls::MakeRustlsConnect,
    notices: &broadcast::Sender<HoldNotice>,
    listening: &AtomicBool,
) -> bool {
    let connect = tokio::time::timeout(
        Duration::from_millis(POSTGRES_CONNECT_TIMEOUT_MS),
        config.connect(tls),
    );
    let Ok(Ok((client, mut connection))) = connect.await else {
        return false;
    };
    // The connection delivers notifications only while it is polled, which the `LISTEN` below
    // needs too: a task of its own polls it until it closes.
    let forward = notices.clone();
    let driver = tokio::spawn(async move {
        while let Some(Ok(message)) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            if let tokio_postgres::AsyncMessage::Notification(n) = message
                && n.channel() == CHANNEL
            {
                // No waiter is no error: nobody in this process waits for that call.
                let _ = forward.send(HoldNotice::Decided(n.payload().to_string()));
            }
        }
    });
    if client
        .batch_execute(&format!("LISTEN {CHANNEL}"))
        .await
        .is_err()
    {
        driver.abort();
        return false;
    }
    listening.store(true, Ordering::Relaxed);
    let _ = notices.send(HoldNotice::ReadAgain);
    // The client must live while the connection runs: dropping it closes the connection.
    let _ = driver.await;
    listening.store(false, Ordering::Relaxed);
    drop(client);
    true
}
