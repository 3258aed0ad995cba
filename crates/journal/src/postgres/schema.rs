//! The PostgreSQL schema and its numbered migrations.
//!
//! `ring0_schema` holds one row per migration that ran. The migrations a database lacks run at
//! open in one transaction with their rows (PostgreSQL's DDL is transactional), under a
//! transaction-scoped advisory lock, so replicas starting together migrate once and a crash
//! leaves the schema as it was. A database whose schema is newer than this build knows is
//! refused.

use super::Db;
use crate::JournalError;
use deadpool_postgres::Client;

/// The advisory lock that serializes migrations ("r0jl").
const MIGRATION_LOCK: i64 = 0x7230_6a6c;

/// Schema migrations; `ring0_schema` has a row for each that ran.
pub(crate) const MIGRATIONS: &[&str] = &[
    // 1: replicas and their leases, intents, the identity claims (semantic key, content digest,
    // the caller's key), memoized reads.
    "CREATE TABLE replicas (
        incarnation BIGSERIAL   PRIMARY KEY,
        lease_until TIMESTAMPTZ NOT NULL,
        started_at  TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
        host        TEXT        NOT NULL
    );
    CREATE TABLE intents (
        seq              BIGSERIAL PRIMARY KEY,
        id               TEXT      NOT NULL UNIQUE,
        semantic_key     TEXT      NOT NULL,
        scope            TEXT      NOT NULL,
        attempt_epoch    BIGINT    NOT NULL,
        tool             TEXT      NOT NULL,
        canonical_args   TEXT      NOT NULL,
        call_ids         TEXT      NOT NULL,
        idempotency_key  TEXT      NOT NULL,
        mutating         BOOLEAN   NOT NULL,
        fence            BIGINT    NOT NULL,
        attempts         BIGINT    NOT NULL,
        state            TEXT      NOT NULL,
        timeline         TEXT      NOT NULL,
        receipt          TEXT,
        snapshot         TEXT,
        owner            BIGINT    NOT NULL,
        holder           BIGINT    NOT NULL,
        attempt          BIGINT    NOT NULL,
        delivered_ms     BIGINT,
        client_principal TEXT,
        client_key       TEXT,
        created_ms       BIGINT    NOT NULL,
        updated_ms       BIGINT    NOT NULL
    );
    CREATE INDEX intents_open ON intents (holder, seq)
        WHERE state IN ('PROPOSED', 'RECORDED', 'DISPATCHED', 'UNKNOWN', 'RECONCILING');
    CREATE TABLE intent_keys (
        semantic_key TEXT   PRIMARY KEY,
        intent_seq   BIGINT NOT NULL REFERENCES intents (seq)
    );
    CREATE TABLE intent_contents (
        content_digest TEXT   PRIMARY KEY,
        intent_seq     BIGINT NOT NULL REFERENCES intents (seq)
    );
    CREATE TABLE client_keys (
        principal  TEXT   NOT NULL,
        client_key TEXT   NOT NULL,
        intent_seq BIGINT NOT NULL REFERENCES intents (seq),
        bound_ms   BIGINT NOT NULL,
        PRIMARY KEY (principal, client_key)
    );
    CREATE INDEX client_keys_by_age ON client_keys (principal, bound_ms, client_key);
    CREATE TABLE memo (
        fingerprint TEXT   PRIMARY KEY,
        observation TEXT   NOT NULL,
        stored_ms   BIGINT NOT NULL
    );
    CREATE INDEX memo_by_age ON memo (stored_ms, fingerprint);",
    // 2: keys every replica shares, one per purpose (the `requestState` signing key), made by
    // the first replica that asks.
    "CREATE TABLE deployment_keys (
        purpose    TEXT        PRIMARY KEY,
        secret     BYTEA       NOT NULL,
        created_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
    );",
    // 3: where each replica's HTTP listener is reached by the others.
    "ALTER TABLE replicas ADD COLUMN endpoint TEXT;",
    // 4: sessionful MCP sessions, served by any replica.
    "CREATE TABLE mcp_sessions (
        id         TEXT   PRIMARY KEY,
        principal  TEXT   NOT NULL,
        state      TEXT   NOT NULL,
        created_ms BIGINT NOT NULL,
        used_ms    BIGINT NOT NULL
    );
    CREATE INDEX mcp_sessions_by_principal ON mcp_sessions (principal, used_ms);
    CREATE INDEX mcp_sessions_by_use ON mcp_sessions (used_ms);",
    // 5: background jobs: the replica whose process runs each, its last report, and whether
    // another replica asked it to cancel the job.
    "CREATE TABLE jobs (
        handle     TEXT    PRIMARY KEY,
        owner      TEXT    NOT NULL,
        replica    BIGINT  NOT NULL,
        report     TEXT    NOT NULL,
        finished   BOOLEAN NOT NULL,
        updated_ms BIGINT  NOT NULL,
        cancel_requested BOOLEAN NOT NULL DEFAULT false
    );
    CREATE INDEX jobs_by_age ON jobs (finished, updated_ms);
    CREATE INDEX jobs_to_cancel ON jobs (replica) WHERE cancel_requested AND NOT finished;",
    // 6: MCP tasks that follow a background job: the job and scope each task id stands for.
    "CREATE TABLE job_tasks (
        task_id    TEXT    PRIMARY KEY,
        owner      TEXT    NOT NULL,
        job        TEXT    NOT NULL,
        scope      TEXT    NOT NULL,
        modern     BOOLEAN NOT NULL,
        created_ms BIGINT  NOT NULL,
        cancelled  BOOLEAN NOT NULL DEFAULT false
    );
    CREATE INDEX job_tasks_by_age ON job_tasks (created_ms);",
    // 7: calls held for a person's approval (`crate::hold`): any replica lists and decides them,
    // and the one whose call waits is told (`NOTIFY ring0_holds`, see `postgres::holds`).
    "CREATE TABLE held_calls (
        approval_id TEXT   PRIMARY KEY,
        state       TEXT   NOT NULL,
        created_ms  BIGINT NOT NULL,
        deadline_ms BIGINT NOT NULL,
        body        TEXT   NOT NULL
    );
    CREATE INDEX held_calls_pending ON held_calls (created_ms, approval_id)
        WHERE state = 'PENDING';
    CREATE INDEX held_calls_approved ON held_calls (deadline_ms)
        WHERE state = 'APPROVED';",
    // 8: "allow for this session" approvals every replica honours (`crate::shared`), on the
    // database's clock (microseconds).
    "CREATE TABLE remembered_approvals (
        approval_key  TEXT   PRIMARY KEY,
        approval_id   TEXT   NOT NULL,
        until_us      BIGINT,
        remembered_us BIGINT NOT NULL
    );
    CREATE INDEX remembered_approvals_by_age ON remembered_approvals (remembered_us);
    CREATE INDEX remembered_approvals_by_end ON remembered_approvals (until_us);",
    // 9: GCRA rate buckets every replica takes from (`crate::shared`): each bucket's theoretical
    // arrival time on the database's clock (microseconds).
    "CREATE TABLE rate_buckets (
        bucket  TEXT    PRIMARY KEY,
        tat_us  BIGINT  NOT NULL,
        allowed BOOLEAN NOT NULL,
        seen_us BIGINT  NOT NULL
    );
    CREATE INDEX rate_buckets_by_tat ON rate_buckets (tat_us);",
    // 10: approved pins of upstream definitions (`crate::shared::PinApproval`), numbered in the
    // order they were published, so every replica's lock follows the latest approval.
    "CREATE TABLE pin_approvals (
        seq         BIGSERIAL   PRIMARY KEY,
        upstream    TEXT        NOT NULL,
        kind        TEXT        NOT NULL,
        name        TEXT        NOT NULL,
        pin         TEXT        NOT NULL,
        approved_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
        UNIQUE (upstream, kind, name, pin)
    );",
    // 11: the tools each conversation loaded in the catalog's search mode (`crate::shared`),
    // one row per (principal, scope) with the names in load order, last used on the
    // database's clock (microseconds).
    "CREATE TABLE loaded_tool_sets (
        principal TEXT   NOT NULL,
        scope     TEXT   NOT NULL,
        names     TEXT[] NOT NULL,
        used_us   BIGINT NOT NULL,
        PRIMARY KEY (principal, scope)
    );
    CREATE INDEX loaded_tool_sets_by_use ON loaded_tool_sets (used_us);",
];

/// The schema versions a migration went between: what the database had, and what it has now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Migrated {
    /// The version found (0: a database without a ring0 journal).
    pub from: u32,
    /// The version now, this build's.
    pub to: u32,
}

/// The version of the schema a database has (0 without a ring0 journal), without changing it.
pub(crate) async fn version(client: &Client, db: &Db) -> Result<u32, JournalError> {
    // Asked first and apart: a statement naming a table that does not exist fails to parse.
    let exists: bool = client
        .query_one("SELECT to_regclass('ring0_schema') IS NOT NULL", &[])
        .await
        .and_then(|row| row.try_get(0))
        .map_err(|e| db.sql(e))?;
    if !exists {
        return Ok(0);
    }
    let found: i32 = client
        .query_one("SELECT coalesce(max(version), 0) FROM ring0_schema", &[])
        .await
        .and_then(|row| row.try_get(0))
        .map_err(|e| db.sql(e))?;
    u32::try_from(found).map_err(|_| db.corrupt(format!("schema version {found}")))
}

/// Runs the migrations the database has not run yet, or refuses a schema newer than this build.
pub(crate) async fn migrate(client: &mut Client, db: &Db) -> Result<Migrated, JournalError> {
    let tx = client.transaction().await.map_err(|e| db.sql(e))?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(|e| db.sql(e))?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS ring0_schema (
            version    INT         PRIMARY KEY,
            applied_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
        )",
    )
    .await
    .map_err(|e| db.sql(e))?;
    let found: i32 = tx
        .query_one("SELECT coalesce(max(version), 0) FROM ring0_schema", &[])
        .await
        .and_then(|row| row.try_get(0))
        .map_err(|e| db.sql(e))?;
    let supported = MIGRATIONS.len() as i64;
    if i64::from(found) > supported {
        return Err(JournalError::SchemaTooNew {
            path: db.name.clone().into(),
            found: i64::from(found),
            supported,
        });
    }
    for (n, sql) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        let version = i32::try_from(n + 1).expect("fewer than 2^31 migrations");
        tx.batch_execute(sql).await.map_err(|e| db.sql(e))?;
        tx.execute(
            "INSERT INTO ring0_schema (version) VALUES ($1)",
            &[&version],
        )
        .await
        .map_err(|e| db.sql(e))?;
    }
    tx.commit().await.map_err(|e| db.sql(e))?;
    Ok(Migrated {
        from: u32::try_from(found).unwrap_or(0),
        to: MIGRATIONS.len() as u32,
    })
}
