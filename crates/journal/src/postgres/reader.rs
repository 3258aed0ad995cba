//! Reading a PostgreSQL journal without joining it, for `ring0 journal ls | show`, and running
//! its migrations ahead of a deployment, for `ring0 journal migrate`.
//!
//! A [`PostgresReader`] registers no replica, takes no lease and changes nothing: an operator
//! may point it at the database of a running deployment. It reads a schema of this build's
//! version only, and says what to do about any other.

use super::rows::{self, cols};
use super::schema::{self, MIGRATIONS, Migrated};
use super::{Db, block_on, connect_config, pool, runtime};
use crate::JournalError;
use crate::limits::RECENT_LIMIT_MAX;
use crate::record::{IntentId, IntentRecord};
use deadpool_postgres::Pool;

/// Connections a reader keeps: its requests are one at a time.
const READER_CONNECTIONS: usize = 1;

/// Shortest id prefix [`PostgresReader::find`] looks up (4 hex digits), as the SQLite reader.
const ID_PREFIX_CHARS_MIN: usize = 4;

/// A read-only view of a PostgreSQL journal.
pub struct PostgresReader {
    /// Taken at drop, to shut down without blocking (a reader may be dropped inside another
    /// runtime).
    runtime: Option<tokio::runtime::Runtime>,
    pool: Pool,
    db: Db,
}

impl std::fmt::Debug for PostgresReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresReader")
            .field("db", &self.db.name)
            .finish_non_exhaustive()
    }
}

impl PostgresReader {
    /// Connects to the journal `url` names (`password` when it is not in the URL). A database
    /// without a ring0 journal, or with a schema of another version, is an error saying so.
    pub fn open(url: &str, password: Option<&str>) -> Result<Self, JournalError> {
        let (config, db) = connect_config(url, password)?;
        let runtime = runtime(&db)?;
        let pool = pool(config, &db, READER_CONNECTIONS, runtime.handle())?;
        let reader = Self {
            runtime: Some(runtime),
            pool,
            db,
        };
        let found = reader.on_runtime(|pool, db| async move {
            let client = client(&pool, &db).await?;
            schema::version(&client, &db).await
        })?;
        let supported = MIGRATIONS.len() as u32;
        if found == 0 {
            return Err(JournalError::Storage(format!(
                "{}: no ring0 journal here (`ring0 journal migrate` or `ring0 serve` creates one)",
                reader.db.name
            )));
        }
        if found > supported {
            return Err(JournalError::SchemaTooNew {
                path: reader.db.name.clone().into(),
                found: i64::from(found),
                supported: i64::from(supported),
            });
        }
        if found < supported {
            return Err(JournalError::Storage(format!(
                "{}: the journal's schema is version {found}, this build reads {supported}: run \
                 `ring0 journal migrate`",
                reader.db.name
            )));
        }
        Ok(reader)
    }

    /// The database, as errors name it (`postgres://host:port/db`).
    pub fn name(&self) -> &str {
        &self.db.name
    }

    /// The most recent records, newest first (at most [`RECENT_LIMIT_MAX`]).
    pub fn recent(&self, limit: usize) -> Result<Vec<IntentRecord>, JournalError> {
        let limit = i64::try_from(limit.min(RECENT_LIMIT_MAX)).unwrap_or(0);
        self.on_runtime(move |pool, db| async move {
            let client = client(&pool, &db).await?;
            let found = client
                .query(
                    concat!(
                        "SELECT ",
                        cols!(),
                        " FROM intents ORDER BY seq DESC LIMIT $1"
                    ),
                    &[&limit],
                )
                .await
                .map_err(|e| db.sql(e))?;
            found.iter().map(|r| rows::from_row(r, &db)).collect()
        })
    }

    /// The record whose id is `id`, or the only one whose id starts with `id` (at least
    /// [`ID_PREFIX_CHARS_MIN`] hex digits). An ambiguous prefix is an error.
    pub fn find(&self, id: &str) -> Result<Option<IntentRecord>, JournalError> {
        let full = IntentId::parse_str(id).ok();
        if full.is_none()
            && (id.len() < ID_PREFIX_CHARS_MIN
                || !id.chars().all(|c| c.is_ascii_hexdigit() || c == '-'))
        {
            return Err(JournalError::Invalid(format!(
                "{id:?} is not an intent id or an id prefix of at least {ID_PREFIX_CHARS_MIN} \
                 hex digits"
            )));
        }
        let pattern = match full {
            Some(full) => full.to_string(),
            None => format!("{}%", id.to_ascii_lowercase()),
        };
        let id = id.to_string();
        self.on_runtime(move |pool, db| async move {
            let client = client(&pool, &db).await?;
            let found = client
                .query(
                    concat!(
                        "SELECT ",
                        cols!(),
                        " FROM intents WHERE id LIKE $1 ORDER BY seq LIMIT 2"
                    ),
                    &[&pattern],
                )
                .await
                .map_err(|e| db.sql(e))?;
            match found.as_slice() {
                [] => Ok(None),
                [row] => rows::from_row(row, &db).map(Some),
                _ => Err(JournalError::Invalid(format!(
                    "id prefix {id:?} matches more than one intent"
                ))),
            }
        })
    }

    fn on_runtime<T, F>(&self, f: impl FnOnce(Pool, Db) -> F) -> Result<T, JournalError>
    where
        T: Send,
        F: Future<Output = Result<T, JournalError>> + Send,
    {
        let runtime = self.runtime.as_ref().expect("the runtime lives until drop");
        block_on(runtime, f(self.pool.clone(), self.db.clone()))
    }
}

impl Drop for PostgresReader {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

async fn client(pool: &Pool, db: &Db) -> Result<deadpool_postgres::Client, JournalError> {
    pool.get()
        .await
        .map_err(|e| JournalError::Storage(format!("{}: {e}", db.name)))
}

/// Runs the migrations the journal at `url` lacks (creating it in an empty database), under
/// the advisory lock replicas take, without registering a replica. A schema newer than this
/// build is refused and left alone.
pub fn migrate(url: &str, password: Option<&str>) -> Result<Migrated, JournalError> {
    let (config, db) = connect_config(url, password)?;
    let runtime = runtime(&db)?;
    let pool = pool(config, &db, READER_CONNECTIONS, runtime.handle())?;
    let migrated = block_on(&runtime, async {
        let mut client = client(&pool, &db).await?;
        schema::migrate(&mut client, &db).await
    });
    runtime.shutdown_background();
    migrated
}
