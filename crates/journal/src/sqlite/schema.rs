//! Opening a connection: the schema, its migrations and the pragmas each connection runs with.
//!
//! The writer's connection creates the file (with [`PAGE_SIZE_BYTES`] pages), switches it to
//! WAL with `synchronous=FULL` and no automatic checkpoint (the checkpointer thread does that
//! off the commit path), applies a size quota as `max_page_count`, runs `quick_check`, and
//! migrates. Readers are `query_only`. A file that is not a SQLite database, carries another
//! application's id or a newer schema than this build knows is refused and left untouched.
//!
//! Migrations are numbered; `PRAGMA user_version` says how many ran. Each runs in its own
//! transaction with the version bump, so a crash leaves the journal at one version or the next.

use super::SqliteOptions;
use super::files::Files;
use crate::JournalError;
use rusqlite::{Connection, OpenFlags};

/// Page size of a new journal (1 KiB). Each new intent goes into two indexes keyed by hashes,
/// at random places, so folding n intents dirties about 2n scattered pages; with small pages
/// that is a quarter of the WAL bytes (and fsync time) of 4 KiB pages. Chosen when those index
/// writes were part of every commit, measured with `cargo bench -p ring0-journal --bench
/// commit`: p99 under 64 proposers fell from 5.8–9.5x to 4.2–5.0x the single-commit latency.
/// Now that commits append rows only (see the `key_index` module), 4 KiB pages measured about
/// 10% less writer time per 64-intent batch (fewer WAL frames), within the run-to-run noise of
/// the bench's ratios; the folds' cost kept this size.
pub const PAGE_SIZE_BYTES: u32 = 1024;

/// Page cache of the writer connection (16 MiB; SQLite's default is 2 MiB). Deciding a new
/// intent looks its key and content digest up in two hash-keyed indexes, a leaf page at a random
/// place in each; once those indexes outgrow the cache every look-up reads its pages back from
/// the OS. Measured with `perf` on the writer thread during `cargo bench -p ring0-journal --bench
/// commit` (about 47,000 intents by its end): re-reading pages took about a tenth of its time
/// with the default cache, and almost none with this one.
pub const WRITER_CACHE_KIB: u32 = 16 * 1024;

/// `PRAGMA application_id` of a ring0 journal ("r0jl").
pub(crate) const APPLICATION_ID: i64 = 0x7230_6a6c;

/// Schema migrations; `PRAGMA user_version` is the number that ran.
pub(crate) const MIGRATIONS: &[&str] = &[
    // 1: intents with their timelines, the semantic-key and content indexes, memoized reads.
    "CREATE TABLE intents (
        seq             INTEGER PRIMARY KEY AUTOINCREMENT,
        id              TEXT    NOT NULL UNIQUE,
        semantic_key    TEXT    NOT NULL,
        scope           TEXT    NOT NULL,
        attempt_epoch   INTEGER NOT NULL,
        tool            TEXT    NOT NULL,
        args_sha256     TEXT    NOT NULL,
        args_bytes      INTEGER NOT NULL,
        args_inline     TEXT,
        call_ids        TEXT    NOT NULL,
        idempotency_key TEXT    NOT NULL,
        mutating        INTEGER NOT NULL,
        fence           INTEGER NOT NULL,
        attempts        INTEGER NOT NULL,
        state           TEXT    NOT NULL,
        timeline        TEXT    NOT NULL,
        receipt         TEXT,
        snapshot        TEXT,
        owner           INTEGER NOT NULL,
        created_ms      INTEGER NOT NULL,
        updated_ms      INTEGER NOT NULL
    );
    CREATE INDEX intents_by_state ON intents(state, seq);
    CREATE TABLE intent_keys (
        semantic_key TEXT PRIMARY KEY,
        intent_seq   INTEGER NOT NULL REFERENCES intents(seq)
    ) WITHOUT ROWID;
    CREATE TABLE intent_contents (
        content_digest TEXT PRIMARY KEY,
        intent_seq     INTEGER NOT NULL REFERENCES intents(seq)
    ) WITHOUT ROWID;
    CREATE TABLE memo (
        fingerprint TEXT PRIMARY KEY,
        observation TEXT NOT NULL,
        stored_ms   INTEGER NOT NULL
    ) WITHOUT ROWID;
    CREATE INDEX memo_by_age ON memo(stored_ms);",
    // 2: the key index is folded lazily. `content_digest` lets the in-memory part be rebuilt
    // from the rows without reading spilled arguments; `indexed_through` is the highest `seq`
    // whose keys are all in `intent_keys`/`intent_contents`. A version-1 journal indexed every
    // intent as it was inserted, so its watermark is its last `seq` (its older rows never need
    // the digest column).
    "ALTER TABLE intents ADD COLUMN content_digest TEXT;
    CREATE TABLE key_index_watermark (
        only_row        INTEGER PRIMARY KEY CHECK (only_row = 1),
        indexed_through INTEGER NOT NULL
    );
    INSERT INTO key_index_watermark (only_row, indexed_through)
        SELECT 1, coalesce(max(seq), 0) FROM intents;",
    // 3: logical calls. `attempt` numbers the attempts of one call under one semantic key;
    // `delivered_ms` says when its result reached the caller (written without waiting for the
    // disk); `client_principal`/`client_key` are the caller's explicit idempotency key, found
    // through `client_keys` (one row per principal and key, the oldest forgotten first).
    "ALTER TABLE intents ADD COLUMN attempt INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE intents ADD COLUMN delivered_ms INTEGER;
    ALTER TABLE intents ADD COLUMN client_principal TEXT;
    ALTER TABLE intents ADD COLUMN client_key TEXT;
    CREATE TABLE client_keys (
        principal  TEXT    NOT NULL,
        client_key TEXT    NOT NULL,
        intent_seq INTEGER NOT NULL REFERENCES intents(seq),
        bound_ms   INTEGER NOT NULL,
        PRIMARY KEY (principal, client_key)
    ) WITHOUT ROWID;
    CREATE INDEX client_keys_by_age ON client_keys(principal, bound_ms, client_key);",
    // 4: calls held for a person's approval (`crate::hold`), kept across restarts.
    "CREATE TABLE held_calls (
        approval_id TEXT    PRIMARY KEY,
        state       TEXT    NOT NULL,
        created_ms  INTEGER NOT NULL,
        body        TEXT    NOT NULL
    ) WITHOUT ROWID;
    CREATE INDEX held_calls_by_state ON held_calls(state, created_ms);",
];

/// Opens the database file read-write (creating it only with `create`); no other thread uses
/// the connection, so SQLite's own mutex is off.
pub(crate) fn open_connection(files: &Files, create: bool) -> Result<Connection, JournalError> {
    let mut flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    if create {
        flags |= OpenFlags::SQLITE_OPEN_CREATE;
    }
    Connection::open_with_flags(&files.db, flags).map_err(|e| files.sql(e))
}

fn pragma_text(conn: &Connection, files: &Files, sql: &str) -> Result<String, JournalError> {
    conn.query_row(sql, [], |r| r.get::<_, String>(0))
        .map_err(|e| files.sql(e))
}
/// Sets up the writer's connection (see the module docs); the first statement that reads the
/// file's header is where a file that is not a database is found.
pub(crate) fn configure_writer(
    conn: &Connection,
    files: &Files,
    options: &SqliteOptions,
) -> Result<(), JournalError> {
    // Every statement the writer runs per request stays prepared.
    conn.set_prepared_statement_cache_capacity(32);
    // Takes effect only when the file is created; an existing journal keeps its page size.
    conn.execute_batch(&format!("PRAGMA page_size = {PAGE_SIZE_BYTES}"))
        .map_err(|e| files.sql(e))?;
    // The first statement that reads the header: a file that is not a database fails here.
    let mode = pragma_text(conn, files, "PRAGMA journal_mode = WAL")?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(JournalError::Storage(format!(
            "{}: could not switch to WAL (journal_mode is {mode})",
            files.db.display()
        )));
    }
    conn.execute_batch(
        "PRAGMA synchronous = FULL;
         PRAGMA foreign_keys = ON;
         PRAGMA busy_timeout = 5000;
         PRAGMA wal_autocheckpoint = 0;",
    )
    .map_err(|e| files.sql(e))?;
    conn.execute_batch(&format!("PRAGMA cache_size = -{WRITER_CACHE_KIB}"))
        .map_err(|e| files.sql(e))?;
    if let Some(max) = options.max_size_bytes {
        let page: i64 = conn
            .query_row("PRAGMA page_size", [], |r| r.get(0))
            .map_err(|e| files.sql(e))?;
        let pages = i64::try_from(max).unwrap_or(i64::MAX) / page.max(512);
        conn.query_row(
            &format!("PRAGMA max_page_count = {}", pages.max(1)),
            [],
            |_| Ok(()),
        )
        .map_err(|e| files.sql(e))?;
    }
    if options.check_integrity {
        let verdict = pragma_text(conn, files, "PRAGMA quick_check")?;
        if verdict != "ok" {
            return Err(files.corrupt(format!("quick_check: {verdict}")));
        }
    }
    Ok(())
}

pub(crate) fn configure_reader(conn: &Connection, files: &Files) -> Result<(), JournalError> {
    conn.execute_batch("PRAGMA query_only = 1; PRAGMA busy_timeout = 5000;")
        .map_err(|e| files.sql(e))
}

/// Claims a new, empty database for ring0 or checks that an existing one is a ring0 journal
/// this build can read, then runs the migrations it has not run yet.
pub(crate) fn migrate(conn: &Connection, files: &Files) -> Result<(), JournalError> {
    let app: i64 = conn
        .query_row("PRAGMA application_id", [], |r| r.get(0))
        .map_err(|e| files.sql(e))?;
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(|e| files.sql(e))?;
    let tables: i64 = conn
        .query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get(0))
        .map_err(|e| files.sql(e))?;
    let supported = MIGRATIONS.len() as i64;
    if app == 0 && version == 0 && tables == 0 {
        // A new, empty database: claim it.
        conn.execute_batch(&format!("PRAGMA application_id = {APPLICATION_ID}"))
            .map_err(|e| files.sql(e))?;
    } else if app != APPLICATION_ID {
        return Err(files.corrupt(format!(
            "not a ring0 journal (application_id {app:#x}, {tables} schema objects)"
        )));
    }
    if version > supported {
        return Err(JournalError::SchemaTooNew {
            path: files.db.clone(),
            found: version,
            supported,
        });
    }
    for (n, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        let to = n + 1;
        conn.execute_batch(&format!(
            "BEGIN IMMEDIATE; {sql}; PRAGMA user_version = {to}; COMMIT;"
        ))
        .map_err(|e| {
            let _ = conn.execute_batch("ROLLBACK");
            files.sql(e)
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Journal;
    use crate::decide;
    use crate::sqlite::testing::{kind, no_idle_fold, open, refund, watermark};
    use futures::executor::block_on;
    use rusqlite::params;

    #[test]
    fn a_version_1_journal_migrates_and_still_deduplicates_its_intents() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.db");
        let p = refund(1, "c1");
        let id = uuid::Uuid::now_v7();
        {
            // A journal as the version-1 schema wrote it: every intent indexed at insertion.
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(&format!(
                "PRAGMA application_id = {APPLICATION_ID}; BEGIN; {}; PRAGMA user_version = 1; \
                 COMMIT;",
                MIGRATIONS[0]
            ))
            .unwrap();
            let timeline = serde_json::json!([{"state": "PROPOSED", "at_ms": 1},
                                              {"state": "RECORDED", "at_ms": 1}]);
            conn.execute(
                "INSERT INTO intents (id, semantic_key, scope, attempt_epoch, tool, args_sha256,
                   args_bytes, args_inline, call_ids, idempotency_key, mutating, fence, attempts,
                   state, timeline, owner, created_ms, updated_ms)
                 VALUES (?1, ?2, ?3, 0, ?4, ?5, ?6, ?7, '[\"c1\"]', ?8, 1, 1, 0, 'RECORDED', ?9,
                   1, 1, 1)",
                params![
                    id.to_string(),
                    p.semantic_key.encode(),
                    p.scope,
                    p.tool,
                    decide::sha256_hex(p.canonical_args.as_bytes()),
                    p.canonical_args.len() as i64,
                    p.canonical_args,
                    p.semantic_key.idempotency_key(0),
                    timeline.to_string(),
                ],
            )
            .unwrap();
            conn.execute(
                "INSERT INTO intent_keys VALUES (?1, 1)",
                [p.semantic_key.encode()],
            )
            .unwrap();
            conn.execute(
                "INSERT INTO intent_contents VALUES (?1, 1)",
                [decide::content_digest(
                    &p.tool,
                    &p.scope,
                    0,
                    &p.canonical_args,
                )],
            )
            .unwrap();
        }
        let j = open(&path, no_idle_fold(true));
        assert_eq!((j.pending_index_entries(), watermark(&path)), (0, 1));
        let again = block_on(j.propose(refund(1, "c2"))).unwrap();
        assert_eq!(
            (kind(&again), again.record().unwrap().id),
            ("duplicate", id)
        );
        // Found by content too: the same intent under another canonicalizer version.
        let mut other_version = refund(1, "c3");
        other_version.semantic_key.version += 1;
        let conflict = block_on(j.propose(other_version)).unwrap();
        assert_eq!(
            (kind(&conflict), conflict.record().unwrap().id),
            ("conflict", id)
        );
    }
}
