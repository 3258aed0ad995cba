//! Helpers shared by the journal's integration tests.
#![allow(dead_code)]

use ring0_core::{SemanticKey, canonical::canonical_string};
use ring0_journal::{
    Clock, Journal, ManualClock, MemoryJournal, PostgresJournal, PostgresOptions, Proposal,
    SqliteJournal, SqliteOptions,
};
use serde_json::{Value, json};
use std::sync::Arc;

/// A proposal of `tool(args)` in `scope`, epoch 0, mutating, with a given call id.
pub fn proposal(tool: &str, args: Value, scope: &str, call_id: &str) -> Proposal {
    Proposal {
        intent_id: None,
        semantic_key: SemanticKey::compute(tool, &args, scope, 0).unwrap(),
        scope: scope.into(),
        attempt_epoch: 0,
        tool: tool.into(),
        canonical_args: canonical_string(&args).unwrap(),
        call_id: call_id.into(),
        mutating: true,
        client_key: None,
        principal: None,
    }
}

pub fn refund(amount: u64, call_id: &str) -> Proposal {
    proposal(
        "refund",
        json!({"order": "o-1", "amount": amount}),
        "user:42:checkout:7",
        call_id,
    )
}

/// A journal under test, on either backend, that can be dropped and reopened from its log.
pub struct Backend {
    pub journal: Arc<dyn Journal>,
    pub clock: Arc<ManualClock>,
    dir: Option<tempfile::TempDir>,
    kind: Kind,
}

#[derive(Clone)]
enum Kind {
    Memory,
    Sqlite,
    /// The URL of this test's own schema.
    Postgres(String),
}

impl Backend {
    pub fn memory() -> Self {
        let clock = Arc::new(ManualClock::new(1_000_000));
        Self {
            journal: Arc::new(MemoryJournal::with_clock(clock.clone())),
            clock,
            dir: None,
            kind: Kind::Memory,
        }
    }

    pub fn sqlite() -> Self {
        let clock = Arc::new(ManualClock::new(1_000_000));
        let dir = tempfile::tempdir().unwrap();
        let journal = SqliteJournal::open_with(dir.path().join("j.db"), options(&clock)).unwrap();
        Self {
            journal: Arc::new(journal),
            clock,
            dir: Some(dir),
            kind: Kind::Sqlite,
        }
    }

    /// A journal in a fresh schema of the test database, or `None` (with the reason printed)
    /// when no database is configured outside CI.
    pub fn postgres() -> Option<Self> {
        let url = fresh_postgres_schema()?;
        let clock = Arc::new(ManualClock::new(1_000_000));
        let journal = PostgresJournal::open(&url, postgres_options(&clock)).unwrap();
        Some(Self {
            journal: Arc::new(journal),
            clock,
            dir: None,
            kind: Kind::Postgres(url),
        })
    }

    /// Drops every in-memory structure and opens the journal again from its log alone.
    pub async fn reopen(&mut self) {
        match self.kind.clone() {
            Kind::Memory => {
                let records = {
                    let j = self.journal.clone();
                    let mut all = j.recent(usize::MAX).await.unwrap();
                    all.reverse();
                    all
                };
                self.journal = Arc::new(MemoryJournal::from_records(records, self.clock.clone()));
            }
            Kind::Sqlite => {
                let path = self.dir.as_ref().unwrap().path().join("j.db");
                // Drop the old handle first: it holds the write lock.
                self.journal = Arc::new(MemoryJournal::new());
                self.journal =
                    Arc::new(SqliteJournal::open_with(path, options(&self.clock)).unwrap());
            }
            Kind::Postgres(url) => {
                // Dropping the old replica gives up its lease: its open records are the new
                // one's to recover, as a restarted process's are.
                self.journal = Arc::new(MemoryJournal::new());
                self.journal =
                    Arc::new(PostgresJournal::open(&url, postgres_options(&self.clock)).unwrap());
            }
        }
    }
}

pub fn postgres_options(clock: &Arc<ManualClock>) -> PostgresOptions {
    PostgresOptions {
        clock: clock.clone() as Arc<dyn Clock>,
        pool_connections: 4,
        ..PostgresOptions::default()
    }
}

/// The environment variable naming the test database (`scripts/test.sh` starts one).
pub const POSTGRES_URL_ENV: &str = "RING0_TEST_POSTGRES_URL";

/// The test database's URL. Without one, a test on PostgreSQL is skipped with the reason
/// printed — except under CI, where it fails: the suite must not pass without having run.
pub fn postgres_url() -> Option<String> {
    match std::env::var(POSTGRES_URL_ENV) {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("{POSTGRES_URL_ENV} is not set under CI: the PostgreSQL tests cannot run")
        }
        _ => {
            eprintln!("skipped: {POSTGRES_URL_ENV} is not set (scripts/test.sh starts a database)");
            None
        }
    }
}

/// A new, empty schema in the test database, and a URL whose connections use it.
pub fn fresh_postgres_schema() -> Option<String> {
    let url = postgres_url()?;
    let schema = format!("t_{}", uuid::Uuid::new_v4().simple());
    admin(&url, &format!("CREATE SCHEMA {schema}"));
    let sep = if url.contains('?') { '&' } else { '?' };
    Some(format!("{url}{sep}options=-c%20search_path%3D{schema}"))
}

/// Empties every table of the schema `url` names but its migration record, so a journal opened
/// next starts from nothing without running the migrations again.
pub fn empty_schema(url: &str) {
    admin(
        url,
        "DO $$ BEGIN
           EXECUTE (SELECT 'TRUNCATE ' || string_agg(format('%I', tablename), ', ')
                           || ' RESTART IDENTITY CASCADE'
                    FROM pg_tables
                    WHERE schemaname = current_schema() AND tablename <> 'ring0_schema');
         END $$",
    );
}

/// Runs one statement on the database `url` names (a test's own connection, beside the
/// journal's).
pub fn admin(url: &str, sql: &str) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .unwrap();
        let driver = tokio::spawn(connection);
        client.batch_execute(sql).await.unwrap();
        drop(client);
        let _ = driver.await;
    });
}

pub fn options(clock: &Arc<ManualClock>) -> SqliteOptions {
    SqliteOptions {
        clock: clock.clone() as Arc<dyn Clock>,
        ..SqliteOptions::default()
    }
}

/// Generates one test per backend (PostgreSQL's skipped, with the reason, without a database) for each async behaviour `fn name(b: &mut Backend)`.
#[macro_export]
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(#[test]
            fn $name() {
                futures::executor::block_on(super::$name(&mut super::common::Backend::memory()))
            })*
        }
        mod sqlite {
            $(#[test]
            fn $name() {
                futures::executor::block_on(super::$name(&mut super::common::Backend::sqlite()))
            })*
        }
        mod postgres {
            $(#[test]
            fn $name() {
                if let Some(mut b) = super::common::Backend::postgres() {
                    futures::executor::block_on(super::$name(&mut b))
                }
            })*
        }
    };
}
