//! [`Deployment`] on the shared database: keys, endpoints, sessions, jobs and job tasks in
//! tables of their own (migrations 2 to 6), next to the intents.
//!
//! Times here are the database server's clock (`clock_timestamp()` in milliseconds), the one
//! clock every replica shares, as for leases.

use super::Shared;
use super::rows::to_i64;
use crate::JournalError;
use crate::deployment::{
    Deployment, SHARED_JOB_REPORT_BYTES_MAX, SHARED_JOBS_MAX, SHARED_JOBS_TO_CANCEL_MAX,
    SHARED_KEY_BYTES, SHARED_SESSION_STATE_BYTES_MAX, SHARED_SESSION_TOUCH_MS, SHARED_SESSIONS_MAX,
    SHARED_TASKS_MAX, SharedJob, SharedSession, SharedTask,
};
use async_trait::async_trait;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

/// The database's clock, in milliseconds since the epoch.
const NOW_MS: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::BIGINT";

/// What the replicas on one PostgreSQL journal share (see [`crate::deployment`]).
pub(crate) struct PostgresDeployment {
    pub(crate) shared: Arc<Shared>,
    pub(crate) handle: tokio::runtime::Handle,
    /// Keys read once per purpose: a key never changes once made.
    keys: Mutex<HashMap<String, Vec<u8>>>,
}

impl PostgresDeployment {
    pub(crate) fn new(shared: Arc<Shared>, handle: tokio::runtime::Handle) -> Self {
        Self {
            shared,
            handle,
            keys: Mutex::new(HashMap::new()),
        }
    }

    /// Runs `f` on the journal's runtime and waits for it from any executor.
    async fn run<T, F>(&self, f: impl FnOnce(Arc<Shared>) -> F) -> Result<T, JournalError>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, JournalError>> + Send + 'static,
    {
        let task = self.handle.spawn(f(self.shared.clone()));
        task.await.map_err(|e| {
            JournalError::Storage(format!("{}: journal task failed: {e}", self.shared.db.name))
        })?
    }
}

/// A fresh random key: two version-4 UUIDs' random bits, from the operating system's generator.
fn new_key() -> Vec<u8> {
    let mut key = Vec::with_capacity(SHARED_KEY_BYTES);
    while key.len() < SHARED_KEY_BYTES {
        key.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
    }
    key.truncate(SHARED_KEY_BYTES);
    key
}

#[async_trait]
impl Deployment for PostgresDeployment {
    fn replica(&self) -> u64 {
        self.shared.incarnation
    }

    async fn shared_key(&self, purpose: &str) -> Result<Vec<u8>, JournalError> {
        if let Some(key) = self.keys.lock().expect("keys").get(purpose) {
            return Ok(key.clone());
        }
        let purpose_owned = purpose.to_string();
        let key = self
            .run(move |shared| async move {
                let client = shared.client().await?;
                // The first replica's key wins; every later one reads it.
                client
                    .execute(
                        "INSERT INTO deployment_keys (purpose, secret) VALUES ($1, $2)
                         ON CONFLICT (purpose) DO NOTHING",
                        &[&purpose_owned, &new_key()],
                    )
                    .await
                    .map_err(|e| shared.db.sql(e))?;
                let row = client
                    .query_one(
                        "SELECT secret FROM deployment_keys WHERE purpose = $1",
                        &[&purpose_owned],
                    )
                    .await
                    .map_err(|e| shared.db.sql(e))?;
                let secret: Vec<u8> = row.try_get(0).map_err(|e| shared.db.sql(e))?;
                if secret.len() != SHARED_KEY_BYTES {
                    return Err(shared.db.corrupt(format!(
                        "the shared key {purpose_owned:?} has {} bytes, not {SHARED_KEY_BYTES}",
                        secret.len()
                    )));
                }
                Ok(secret)
            })
            .await?;
        self.keys
            .lock()
            .expect("keys")
            .insert(purpose.to_string(), key.clone());
        Ok(key)
    }

    async fn advertise(&self, endpoint: &str) -> Result<(), JournalError> {
        let endpoint = endpoint.to_string();
        self.run(move |shared| async move {
            let client = shared.client().await?;
            client
                .execute(
                    "UPDATE replicas SET endpoint = $2 WHERE incarnation = $1",
                    &[&to_i64(shared.incarnation), &endpoint],
                )
                .await
                .map_err(|e| shared.db.sql(e))?;
            Ok(())
        })
        .await
    }

    async fn endpoint(&self, replica: u64) -> Result<Option<String>, JournalError> {
        self.run(move |shared| async move {
            let client = shared.client().await?;
            let row = client
                .query_opt(
                    "SELECT endpoint FROM replicas
                     WHERE incarnation = $1 AND lease_until > clock_timestamp()",
                    &[&to_i64(replica)],
                )
                .await
                .map_err(|e| shared.db.sql(e))?;
            match row {
                Some(row) => row.try_get(0).map_err(|e| shared.db.sql(e)),
                None => Ok(None),
            }
        })
        .await
    }

    async fn session_put(
        &self,
        session: &SharedSession,
        per_principal_max: usize,
        idle_ms: u64,
    ) -> Result<(), JournalError> {
        if session.state.len() > SHARED_SESSION_STATE_BYTES_MAX {
            return Err(JournalError::Invalid(format!(
                "a session's state is {} bytes, more than the {SHARED_SESSION_STATE_BYTES_MAX} \
                 shared",
                session.state.len()
            )));
        }
        let session = session.clone();
        let keep = to_i64(per_principal_max.saturating_sub(1) as u64);
        self.run(move |shared| async move {
            let db = &shared.db;
            let mut client = shared.client().await?;
            let tx = client.transaction().await.map_err(|e| db.sql(e))?;
            // Room first: the principal's least recently used beyond its cap, the idle, the
            // least recently used of all beyond the bound.
            tx.execute(
                "DELETE FROM mcp_sessions WHERE id IN (
                   SELECT id FROM mcp_sessions WHERE principal = $1 AND id <> $2
                   ORDER BY used_ms DESC OFFSET $3)",
                &[&session.principal, &session.id, &keep],
            )
            .await
            .map_err(|e| db.sql(e))?;
            tx.execute(
                &format!("DELETE FROM mcp_sessions WHERE used_ms < {NOW_MS} - $1"),
                &[&to_i64(idle_ms)],
            )
            .await
            .map_err(|e| db.sql(e))?;
            tx.execute(
                "DELETE FROM mcp_sessions WHERE id IN (
                   SELECT id FROM mcp_sessions ORDER BY used_ms
                   LIMIT greatest(0, (SELECT count(*) FROM mcp_sessions) - $1 + 1))",
                &[&SHARED_SESSIONS_MAX],
            )
            .await
            .map_err(|e| db.sql(e))?;
            tx.execute(
                &format!(
                    "INSERT INTO mcp_sessions (id, principal, state, created_ms, used_ms)
                     VALUES ($1, $2, $3, {NOW_MS}, {NOW_MS})
                     ON CONFLICT (id) DO UPDATE SET principal = excluded.principal,
                       state = excluded.state, used_ms = excluded.used_ms"
                ),
                &[&session.id, &session.principal, &session.state],
            )
            .await
            .map_err(|e| db.sql(e))?;
            tx.commit().await.map_err(|e| db.sql(e))
        })
        .await
    }

    async fn session_get(
        &self,
        id: &str,
        idle_ms: u64,
    ) -> Result<Option<SharedSession>, JournalError> {
        let id = id.to_string();
        self.run(move |shared| async move {
            let client = shared.client().await?;
            // One round trip: the row if it is live, and its use stamped when the stamp is
            // older than the touch interval (a fresher one is left alone: no write).
            let row = client
                .query_opt(
                    &format!(
                        "WITH live AS (
                           SELECT id, principal, state FROM mcp_sessions
                           WHERE id = $1 AND used_ms >= {NOW_MS} - $2),
                         touched AS (
                           UPDATE mcp_sessions SET used_ms = {NOW_MS}
                           WHERE id = $1 AND used_ms >= {NOW_MS} - $2
                             AND used_ms < {NOW_MS} - $3)
                         SELECT id, principal, state FROM live"
                    ),
                    // Stamped often enough that a session in use never looks idle.
                    &[
                        &id,
                        &to_i64(idle_ms),
                        &to_i64(SHARED_SESSION_TOUCH_MS.min(idle_ms / 2)),
                    ],
                )
                .await
                .map_err(|e| shared.db.sql(e))?;
            let Some(row) = row else { return Ok(None) };
            let get = |i: usize| row.try_get::<_, String>(i).map_err(|e| shared.db.sql(e));
            Ok(Some(SharedSession {
                id: get(0)?,
                principal: get(1)?,
                state: get(2)?,
            }))
        })
        .await
    }

    async fn session_delete(&self, id: &str) -> Result<(), JournalError> {
        let id = id.to_string();
        self.run(move |shared| async move {
            let client = shared.client().await?;
            client
                .execute("DELETE FROM mcp_sessions WHERE id = $1", &[&id])
                .await
                .map_err(|e| shared.db.sql(e))?;
            Ok(())
        })
        .await
    }

    async fn job_put(
        &self,
        handle: &str,
        owner: &str,
        report: &str,
        finished: bool,
    ) -> Result<(), JournalError> {
        if report.len() > SHARED_JOB_REPORT_BYTES_MAX {
            return Err(JournalError::Invalid(format!(
                "a job's report is {} bytes, more than the {SHARED_JOB_REPORT_BYTES_MAX} shared",
                report.len()
            )));
        }
        let (handle, owner, report) = (handle.to_string(), owner.to_string(), report.to_string());
        self.run(move |shared| async move {
            let db = &shared.db;
            let mut client = shared.client().await?;
            let tx = client.transaction().await.map_err(|e| db.sql(e))?;
            tx.execute(
                "DELETE FROM jobs WHERE handle IN (
                   SELECT handle FROM jobs WHERE finished ORDER BY updated_ms
                   LIMIT greatest(0, (SELECT count(*) FROM jobs) - $1 + 1))",
                &[&SHARED_JOBS_MAX],
            )
            .await
            .map_err(|e| db.sql(e))?;
            tx.execute(
                &format!(
                    "INSERT INTO jobs (handle, owner, replica, report, finished, updated_ms)
                     VALUES ($1, $2, $3, $4, $5, {NOW_MS})
                     ON CONFLICT (handle) DO UPDATE SET report = excluded.report,
                       finished = excluded.finished, updated_ms = excluded.updated_ms
                     WHERE jobs.replica = excluded.replica"
                ),
                &[
                    &handle,
                    &owner,
                    &to_i64(shared.incarnation),
                    &report,
                    &finished,
                ],
            )
            .await
            .map_err(|e| db.sql(e))?;
            tx.commit().await.map_err(|e| db.sql(e))
        })
        .await
    }

    async fn job_request_cancel(&self, handle: &str, owner: &str) -> Result<bool, JournalError> {
        let (handle, owner) = (handle.to_string(), owner.to_string());
        self.run(move |shared| async move {
            let client = shared.client().await?;
            let asked = client
                .execute(
                    "UPDATE jobs SET cancel_requested = true
                     WHERE handle = $1 AND owner = $2 AND NOT finished",
                    &[&handle, &owner],
                )
                .await
                .map_err(|e| shared.db.sql(e))?;
            Ok(asked > 0)
        })
        .await
    }

    async fn jobs_end_of(&self, owner: &str) -> Result<u64, JournalError> {
        let owner = owner.to_string();
        self.run(move |shared| async move {
            let client = shared.client().await?;
            client
                .execute(
                    "UPDATE jobs SET cancel_requested = true
                     WHERE owner = $1 AND NOT finished
                       AND (report::jsonb ->> 'detached') IS DISTINCT FROM 'true'",
                    &[&owner],
                )
                .await
                .map_err(|e| shared.db.sql(e))
        })
        .await
    }

    async fn jobs_to_cancel(&self) -> Result<Vec<String>, JournalError> {
        self.run(move |shared| async move {
            let client = shared.client().await?;
            let rows = client
                .query(
                    "SELECT handle FROM jobs
                     WHERE replica = $1 AND cancel_requested AND NOT finished
                     ORDER BY updated_ms LIMIT $2",
                    &[&to_i64(shared.incarnation), &SHARED_JOBS_TO_CANCEL_MAX],
                )
                .await
                .map_err(|e| shared.db.sql(e))?;
            rows.iter()
                .map(|r| r.try_get(0).map_err(|e| shared.db.sql(e)))
                .collect()
        })
        .await
    }

    async fn task_put(&self, task: &SharedTask) -> Result<(), JournalError> {
        let task = task.clone();
        self.run(move |shared| async move {
            let db = &shared.db;
            let mut client = shared.client().await?;
            let tx = client.transaction().await.map_err(|e| db.sql(e))?;
            tx.execute(
                "DELETE FROM job_tasks WHERE task_id IN (
                   SELECT task_id FROM job_tasks ORDER BY created_ms
                   LIMIT greatest(0, (SELECT count(*) FROM job_tasks) - $1 + 1))",
                &[&SHARED_TASKS_MAX],
            )
            .await
            .map_err(|e| db.sql(e))?;
            tx.execute(
                &format!(
                    "INSERT INTO job_tasks (task_id, owner, job, scope, modern, created_ms)
                     VALUES ($1, $2, $3, $4, $5, {NOW_MS}) ON CONFLICT (task_id) DO NOTHING"
                ),
                &[
                    &task.task_id,
                    &task.owner,
                    &task.job,
                    &task.scope,
                    &task.modern,
                ],
            )
            .await
            .map_err(|e| db.sql(e))?;
            tx.commit().await.map_err(|e| db.sql(e))
        })
        .await
    }

    async fn task_get(&self, task_id: &str) -> Result<Option<SharedTask>, JournalError> {
        let task_id = task_id.to_string();
        self.run(move |shared| async move {
            let db = &shared.db;
            let client = shared.client().await?;
            let row = client
                .query_opt(
                    "SELECT task_id, owner, job, scope, modern, cancelled FROM job_tasks
                     WHERE task_id = $1",
                    &[&task_id],
                )
                .await
                .map_err(|e| db.sql(e))?;
            let Some(row) = row else { return Ok(None) };
            let text = |i: usize| row.try_get::<_, String>(i).map_err(|e| db.sql(e));
            Ok(Some(SharedTask {
                task_id: text(0)?,
                owner: text(1)?,
                job: text(2)?,
                scope: text(3)?,
                modern: row.try_get(4).map_err(|e| db.sql(e))?,
                cancelled: row.try_get(5).map_err(|e| db.sql(e))?,
            }))
        })
        .await
    }

    async fn task_cancelled(&self, task_id: &str) -> Result<(), JournalError> {
        let task_id = task_id.to_string();
        self.run(move |shared| async move {
            let client = shared.client().await?;
            client
                .execute(
                    "UPDATE job_tasks SET cancelled = true WHERE task_id = $1",
                    &[&task_id],
                )
                .await
                .map_err(|e| shared.db.sql(e))?;
            Ok(())
        })
        .await
    }

    async fn job_get(&self, handle: &str) -> Result<Option<SharedJob>, JournalError> {
        let handle = handle.to_string();
        self.run(move |shared| async move {
            let db = &shared.db;
            let client = shared.client().await?;
            let row = client
                .query_opt(
                    "SELECT j.handle, j.owner, j.replica, j.report, j.finished,
                            coalesce(r.lease_until > clock_timestamp(), false)
                     FROM jobs j LEFT JOIN replicas r ON r.incarnation = j.replica
                     WHERE j.handle = $1",
                    &[&handle],
                )
                .await
                .map_err(|e| db.sql(e))?;
            let Some(row) = row else { return Ok(None) };
            let replica: i64 = row.try_get(2).map_err(|e| db.sql(e))?;
            Ok(Some(SharedJob {
                handle: row.try_get(0).map_err(|e| db.sql(e))?,
                owner: row.try_get(1).map_err(|e| db.sql(e))?,
                replica: u64::try_from(replica)
                    .map_err(|_| db.corrupt(format!("job replica {replica}")))?,
                report: row.try_get(3).map_err(|e| db.sql(e))?,
                finished: row.try_get(4).map_err(|e| db.sql(e))?,
                replica_live: row.try_get(5).map_err(|e| db.sql(e))?,
            }))
        })
        .await
    }
}
