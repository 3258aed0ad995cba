//! The decision state replicas share ([`crate::shared::SharedState`]) in the journal's
//! database: remembered approvals (`remembered_approvals`), GCRA rate buckets
//! (`rate_buckets`), approved pins (`pin_approvals`) and loaded tool sets
//! (`loaded_tool_sets`), timed on the database server's clock, which every replica shares (as
//! the leases are).
//!
//! A rate cell is taken by one statement, `INSERT … ON CONFLICT DO UPDATE … RETURNING`: the
//! bucket's theoretical arrival time (TAT) moves by one interval when the cell fits in the
//! burst, and is left as it was otherwise, under the row's lock, so concurrent takes on any
//! number of replicas are serialized and the limit holds across them. A bucket whose TAT passed
//! is full again, the same as no row: the heartbeat prunes those, and lapsed remembered
//! approvals.
//!
//! A loaded set is added to in one transaction whose first statement, an upsert, makes the row
//! (or empties a lapsed one) and locks it: the names it returns are decided on in Rust (the
//! caller's budget needs the tools' schemas) and written back before the lock is released, so
//! adds through any number of replicas are serialized. Sets idle for
//! [`LOADED_SET_IDLE_MS`] read as empty and are pruned by the heartbeat; a new set makes room
//! by forgetting the least recently used beyond [`LOADED_SETS_MAX`].

use super::{Db, Shared};
use crate::JournalError;
use crate::limits::POSTGRES_TAKE_BATCH_MAX;
use crate::shared::{
    LOADED_SET_IDLE_MS, LOADED_SETS_MAX, LoadedAdd, LoadedAdded, LoadedFits, PINS_LISTED_MAX,
    PinApproval, REMEMBERED_APPROVALS_MAX, RateTaken, SharedState, check_key, check_loaded,
    loaded_decide,
};
use async_trait::async_trait;
use deadpool_postgres::GenericClient;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// The database server's clock in microseconds, as SQL.
macro_rules! now_us {
    () => {
        "(extract(epoch FROM clock_timestamp()) * 1000000)::bigint"
    };
}

/// The shared decision state of one PostgreSQL journal (see the module docs).
pub(crate) struct PostgresSharedState {
    pub(crate) shared: Arc<Shared>,
    pub(crate) handle: tokio::runtime::Handle,
}

impl PostgresSharedState {
    /// Runs `f` on the journal's runtime, from any executor.
    async fn run<T, F>(&self, f: impl FnOnce(Arc<Shared>) -> F) -> Result<T, JournalError>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, JournalError>> + Send + 'static,
    {
        let name = self.shared.db.name.clone();
        self.handle
            .spawn(f(self.shared.clone()))
            .await
            .map_err(|e| JournalError::Storage(format!("{name}: journal task failed: {e}")))?
    }
}

fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// [`LOADED_SET_IDLE_MS`] in microseconds, the unit of `loaded_tool_sets.used_us`.
const LOADED_SET_IDLE_US: i64 = LOADED_SET_IDLE_MS as i64 * 1000;

#[async_trait]
impl SharedState for PostgresSharedState {
    async fn rate_take(
        &self,
        bucket: &str,
        burst: u32,
        interval: Duration,
    ) -> Result<RateTaken, JournalError> {
        check_key(bucket)?;
        let (bucket, burst, interval_us) = (
            bucket.to_string(),
            i64::from(burst.max(1)),
            micros(interval).max(1),
        );
        self.run(move |shared| async move {
            let db = &shared.db;
            let client = shared.client().await?;
            let statement = client
                .prepare_cached(concat!(
                    "WITH now AS (SELECT ",
                    now_us!(),
                    " AS us)
                     INSERT INTO rate_buckets (bucket, tat_us, allowed, seen_us)
                     SELECT $1, now.us + $2, true, now.us FROM now
                     ON CONFLICT (bucket) DO UPDATE SET
                       allowed = greatest(rate_buckets.tat_us, excluded.seen_us) + $2
                                 - excluded.seen_us <= $2 * $3,
                       tat_us = CASE
                         WHEN greatest(rate_buckets.tat_us, excluded.seen_us) + $2
                              - excluded.seen_us <= $2 * $3
                         THEN greatest(rate_buckets.tat_us, excluded.seen_us) + $2
                         ELSE rate_buckets.tat_us END,
                       seen_us = excluded.seen_us
                     RETURNING tat_us, allowed, seen_us"
                ))
                .await
                .map_err(|e| db.sql(e))?;
            let row = client
                .query_one(&statement, &[&bucket, &interval_us, &burst])
                .await
                .map_err(|e| db.sql(e))?;
            let (tat, allowed, seen): (i64, bool, i64) = (
                row.try_get(0).map_err(|e| db.sql(e))?,
                row.try_get(1).map_err(|e| db.sql(e))?,
                row.try_get(2).map_err(|e| db.sql(e))?,
            );
            if allowed {
                return Ok(RateTaken::Allowed);
            }
            // The next cell fits once the TAT is within the burst of the clock again.
            let wait_us = tat
                .saturating_sub(seen)
                .saturating_sub(interval_us * (burst - 1));
            let wait = Duration::from_micros(u64::try_from(wait_us).unwrap_or(0));
            Ok(RateTaken::Refused {
                retry_after: wait.max(Duration::from_millis(1)),
            })
        })
        .await
    }

    async fn approval_remember(
        &self,
        key: &str,
        approval_id: &str,
        ttl: Option<Duration>,
    ) -> Result<(), JournalError> {
        check_key(key)?;
        let (key, id, ttl_us) = (key.to_string(), approval_id.to_string(), ttl.map(micros));
        self.run(move |shared| async move {
            let db = &shared.db;
            let mut client = shared.client().await?;
            let tx = client.transaction().await.map_err(|e| db.sql(e))?;
            tx.execute(
                concat!(
                    "WITH now AS (SELECT ",
                    now_us!(),
                    " AS us)
                     INSERT INTO remembered_approvals
                       (approval_key, approval_id, until_us, remembered_us)
                     SELECT $1, $2, now.us + $3::bigint, now.us FROM now
                     ON CONFLICT (approval_key) DO UPDATE SET
                       approval_id = excluded.approval_id, until_us = excluded.until_us,
                       remembered_us = excluded.remembered_us"
                ),
                &[&key, &id, &ttl_us],
            )
            .await
            .map_err(|e| db.sql(e))?;
            // Room: the oldest beyond the bound are forgotten.
            tx.execute(
                "DELETE FROM remembered_approvals WHERE approval_key IN (
                   SELECT approval_key FROM remembered_approvals
                   ORDER BY remembered_us DESC OFFSET $1)",
                &[&REMEMBERED_APPROVALS_MAX],
            )
            .await
            .map_err(|e| db.sql(e))?;
            tx.commit().await.map_err(|e| db.sql(e))
        })
        .await
    }

    async fn approval_remembered(&self, key: &str) -> Result<Option<String>, JournalError> {
        check_key(key)?;
        let key = key.to_string();
        self.run(move |shared| async move {
            let client = shared.client().await?;
            let row = client
                .query_opt(
                    concat!(
                        "SELECT approval_id FROM remembered_approvals
                         WHERE approval_key = $1 AND (until_us IS NULL OR until_us > ",
                        now_us!(),
                        ")"
                    ),
                    &[&key],
                )
                .await
                .map_err(|e| shared.db.sql(e))?;
            row.map(|r| r.try_get(0).map_err(|e| shared.db.sql(e)))
                .transpose()
        })
        .await
    }

    async fn pins_publish(&self, pins: &[PinApproval]) -> Result<(), JournalError> {
        if pins.is_empty() {
            return Ok(());
        }
        pins.iter().try_for_each(check_pin)?;
        let column = |f: fn(&PinApproval) -> &String| -> Vec<String> {
            pins.iter().map(|p| f(p).clone()).collect()
        };
        let (upstreams, kinds) = (column(|p| &p.upstream), column(|p| &p.kind));
        let (names, values) = (column(|p| &p.name), column(|p| &p.pin));
        self.run(move |shared| async move {
            let client = shared.client().await?;
            client
                .execute(
                    "INSERT INTO pin_approvals (upstream, kind, name, pin)
                     SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[])
                     ON CONFLICT (upstream, kind, name, pin) DO NOTHING",
                    &[&upstreams, &kinds, &names, &values],
                )
                .await
                .map_err(|e| shared.db.sql(e))?;
            Ok(())
        })
        .await
    }

    async fn pins_since(&self, after: i64) -> Result<Vec<(i64, PinApproval)>, JournalError> {
        self.run(move |shared| async move {
            let db = &shared.db;
            let client = shared.client().await?;
            let rows = client
                .query(
                    "SELECT seq, upstream, kind, name, pin FROM pin_approvals
                     WHERE seq > $1 ORDER BY seq LIMIT $2",
                    &[&after, &PINS_LISTED_MAX],
                )
                .await
                .map_err(|e| db.sql(e))?;
            rows.iter()
                .map(|r| {
                    Ok((
                        r.try_get(0).map_err(|e| db.sql(e))?,
                        PinApproval {
                            upstream: r.try_get(1).map_err(|e| db.sql(e))?,
                            kind: r.try_get(2).map_err(|e| db.sql(e))?,
                            name: r.try_get(3).map_err(|e| db.sql(e))?,
                            pin: r.try_get(4).map_err(|e| db.sql(e))?,
                        },
                    ))
                })
                .collect()
        })
        .await
    }

    async fn loaded_add(
        &self,
        principal: &str,
        scope: &str,
        names: &[String],
        names_max: usize,
        mut fits: LoadedFits,
    ) -> Result<LoadedAdd, JournalError> {
        check_key(principal)?;
        check_key(scope)?;
        check_loaded(names, names_max)?;
        let (principal, scope, adding) = (principal.to_string(), scope.to_string(), names.to_vec());
        self.run(move |shared| async move {
            let db = &shared.db;
            let mut client = shared.client().await?;
            let tx = client.transaction().await.map_err(|e| db.sql(e))?;
            // Makes the set, or marks it used (emptied when it lapsed), and locks its row until
            // the commit: concurrent adds to it wait here.
            let row = tx
                .query_one(
                    concat!(
                        "WITH now AS (SELECT ",
                        now_us!(),
                        " AS us)
                         INSERT INTO loaded_tool_sets AS s (principal, scope, names, used_us)
                         SELECT $1, $2, '{}', now.us FROM now
                         ON CONFLICT (principal, scope) DO UPDATE SET
                           names = CASE WHEN s.used_us < excluded.used_us - $3
                                   THEN '{}'::text[] ELSE s.names END,
                           used_us = excluded.used_us
                         RETURNING names"
                    ),
                    &[&principal, &scope, &LOADED_SET_IDLE_US],
                )
                .await
                .map_err(|e| db.sql(e))?;
            let mut set: Vec<String> = row.try_get(0).map_err(|e| db.sql(e))?;
            if set.is_empty() {
                // A new set (or one made new): room for it, the least recently used forgotten.
                tx.execute(
                    "DELETE FROM loaded_tool_sets WHERE (principal, scope) IN (
                       SELECT principal, scope FROM loaded_tool_sets
                       ORDER BY used_us DESC OFFSET $1)",
                    &[&LOADED_SETS_MAX],
                )
                .await
                .map_err(|e| db.sql(e))?;
            }
            let added = loaded_decide(&mut set, &adding, names_max, &mut *fits);
            if added.contains(&LoadedAdded::Added) {
                tx.execute(
                    "UPDATE loaded_tool_sets SET names = $3 WHERE principal = $1 AND scope = $2",
                    &[&principal, &scope, &set],
                )
                .await
                .map_err(|e| db.sql(e))?;
            }
            tx.commit().await.map_err(|e| db.sql(e))?;
            Ok(LoadedAdd { added, names: set })
        })
        .await
    }

    async fn loaded_names(
        &self,
        principal: &str,
        scope: &str,
    ) -> Result<Vec<String>, JournalError> {
        check_key(principal)?;
        check_key(scope)?;
        let (principal, scope) = (principal.to_string(), scope.to_string());
        self.run(move |shared| async move {
            let client = shared.client().await?;
            let row = client
                .query_opt(
                    concat!(
                        "WITH now AS (SELECT ",
                        now_us!(),
                        " AS us)
                         UPDATE loaded_tool_sets SET used_us = now.us FROM now
                         WHERE principal = $1 AND scope = $2 AND used_us >= now.us - $3
                         RETURNING names"
                    ),
                    &[&principal, &scope, &LOADED_SET_IDLE_US],
                )
                .await
                .map_err(|e| shared.db.sql(e))?;
            Ok(match row {
                Some(row) => row.try_get(0).map_err(|e| shared.db.sql(e))?,
                None => Vec::new(),
            })
        })
        .await
    }
}

/// Longest field of a published pin (the upstream's alias, a definition's name, the pin).
const PIN_FIELD_BYTES_MAX: usize = 1024;

fn check_pin(p: &PinApproval) -> Result<(), JournalError> {
    for field in [&p.upstream, &p.kind, &p.name, &p.pin] {
        if field.len() > PIN_FIELD_BYTES_MAX {
            return Err(JournalError::Invalid(format!(
                "a pin field of {} bytes; at most {PIN_FIELD_BYTES_MAX}",
                field.len()
            )));
        }
    }
    Ok(())
}

/// Forgets full rate buckets, lapsed remembered approvals and idle loaded sets, at most
/// [`POSTGRES_TAKE_BATCH_MAX`] of each a call (the heartbeat's).
pub(crate) async fn prune(client: &impl GenericClient, db: &Db) -> Result<(), JournalError> {
    client
        .execute(
            concat!(
                "DELETE FROM rate_buckets WHERE bucket IN (
                   SELECT bucket FROM rate_buckets WHERE tat_us < ",
                now_us!(),
                " ORDER BY tat_us LIMIT $1)"
            ),
            &[&POSTGRES_TAKE_BATCH_MAX],
        )
        .await
        .map_err(|e| db.sql(e))?;
    client
        .execute(
            concat!(
                "DELETE FROM remembered_approvals WHERE approval_key IN (
                   SELECT approval_key FROM remembered_approvals WHERE until_us < ",
                now_us!(),
                " ORDER BY until_us LIMIT $1)"
            ),
            &[&POSTGRES_TAKE_BATCH_MAX],
        )
        .await
        .map_err(|e| db.sql(e))?;
    client
        .execute(
            concat!(
                "DELETE FROM loaded_tool_sets WHERE (principal, scope) IN (
                   SELECT principal, scope FROM loaded_tool_sets WHERE used_us < ",
                now_us!(),
                " - $2 ORDER BY used_us LIMIT $1)"
            ),
            &[&POSTGRES_TAKE_BATCH_MAX, &LOADED_SET_IDLE_US],
        )
        .await
        .map_err(|e| db.sql(e))?;
    Ok(())
}
