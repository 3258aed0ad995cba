//! What the replicas of one deployment share besides the journal's records.
//!
//! Several `ring0 serve` processes on one PostgreSQL journal serve one deployment behind a load
//! balancer: any request may land on any replica. What a replica must find of another's work
//! lives in the database beside the intents, behind this narrow seam, so the MCP front end never
//! speaks SQL:
//!
//! - a **shared key** per purpose (generated once by whichever replica asks first, then read by
//!   every other), which signs handles a client carries from one replica to another (a
//!   `requestState`);
//! - each replica's **endpoint**, so a request that belongs to another live replica (the retry
//!   of a call parked there) can be handed to it;
//! - **sessions** of the sessionful MCP protocol: who opened each and what it negotiated, so
//!   another replica (or the same one restarted) serves it; bounded per principal and in all,
//!   expiring when idle, deleted with the session;
//! - **background jobs**: which replica runs each, and what it last reported, so another replica
//!   answers about it, asks its replica to cancel it, and reports the job killed once its owner
//!   is gone; and the MCP tasks that follow jobs, so any replica answers them.
//!
//! Only [`crate::PostgresJournal`] implements it ([`crate::PostgresJournal::deployment`]); a
//! single process (SQLite) has nothing to share.

use crate::JournalError;
use async_trait::async_trait;

/// Bytes of a shared key.
pub const SHARED_KEY_BYTES: usize = 32;
/// Bytes of a session's stored state (its `initialize` parameters, as JSON): a session whose
/// state is larger is served by its own replica only.
pub const SHARED_SESSION_STATE_BYTES_MAX: usize = 64 * 1024;
/// Sessions kept in all; beyond it the least recently used are forgotten (their clients get
/// 404 and initialize again, as the protocol has it).
pub const SHARED_SESSIONS_MAX: i64 = 65_536;
/// A session's last use is written at most this often, or every half of its idle expiry when
/// that is shorter (a request reads its row; it writes it only when the stamp is older).
pub const SHARED_SESSION_TOUCH_MS: u64 = 5_000;
/// Bytes of a job's stored report.
pub const SHARED_JOB_REPORT_BYTES_MAX: usize = 16 * 1024;
/// Jobs remembered in all; beyond it the oldest finished ones are forgotten.
pub const SHARED_JOBS_MAX: i64 = 65_536;
/// Job tasks remembered in all; beyond it the oldest are forgotten.
pub const SHARED_TASKS_MAX: i64 = 65_536;
/// Cancel requests a replica reads at once.
pub const SHARED_JOBS_TO_CANCEL_MAX: i64 = 256;

/// One sessionful MCP session as every replica sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedSession {
    /// The `Mcp-Session-Id`.
    pub id: String,
    /// The principal that opened it: it answers no other.
    pub principal: String,
    /// What a replica needs to serve it (the client's `initialize` parameters, as JSON).
    pub state: String,
}

/// One background job as every replica sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedJob {
    /// The job's opaque handle, as clients name it.
    pub handle: String,
    /// Who may ask about it: the owner its replica named (the scope whose call started it).
    pub owner: String,
    /// The replica whose process runs it.
    pub replica: u64,
    /// Whether that replica's lease is still running (false: it stopped or was killed).
    pub replica_live: bool,
    /// What the owner last reported of it (a JSON object; `state` among its fields).
    pub report: String,
    /// Whether the owner reported it finished.
    pub finished: bool,
}

/// An MCP task that follows a background job, as every replica sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedTask {
    /// The task id clients name.
    pub task_id: String,
    /// Who may ask about it (the session, or the stateless requests of a principal).
    pub owner: String,
    /// The job it follows.
    pub job: String,
    /// The scope the job's operations run in.
    pub scope: String,
    /// Whether its creator spoke the 2026-07-28 era (its result is rendered for it).
    pub modern: bool,
    /// Whether a client cancelled it (through any replica).
    pub cancelled: bool,
}

/// What the replicas of one deployment share (see the module documentation).
#[async_trait]
pub trait Deployment: Send + Sync + 'static {
    /// This replica (its incarnation in the shared journal).
    fn replica(&self) -> u64;

    /// The key every replica uses for `purpose` ([`SHARED_KEY_BYTES`]): made by the first
    /// replica that asks, the same for all after.
    async fn shared_key(&self, purpose: &str) -> Result<Vec<u8>, JournalError>;

    /// Records where the other replicas reach this one (`http://host:port`).
    async fn advertise(&self, endpoint: &str) -> Result<(), JournalError>;

    /// Where `replica` is reached, while its lease runs; `None` once it lapsed (or when it
    /// advertised nothing).
    async fn endpoint(&self, replica: u64) -> Result<Option<String>, JournalError>;

    /// Records a session (replacing one of the same id), forgetting the principal's least
    /// recently used ones beyond `per_principal_max`, sessions idle for `idle_ms`, and the
    /// least recently used beyond [`SHARED_SESSIONS_MAX`].
    async fn session_put(
        &self,
        session: &SharedSession,
        per_principal_max: usize,
        idle_ms: u64,
    ) -> Result<(), JournalError>;

    /// The session `id` unless it was deleted or idle for `idle_ms`; its use is recorded.
    async fn session_get(
        &self,
        id: &str,
        idle_ms: u64,
    ) -> Result<Option<SharedSession>, JournalError>;

    /// Forgets the session `id` (its client deleted it).
    async fn session_delete(&self, id: &str) -> Result<(), JournalError>;

    /// Records (or updates) a job this replica runs, with its owner and report.
    async fn job_put(
        &self,
        handle: &str,
        owner: &str,
        report: &str,
        finished: bool,
    ) -> Result<(), JournalError>;

    /// The job `handle`, with whether its replica is live.
    async fn job_get(&self, handle: &str) -> Result<Option<SharedJob>, JournalError>;

    /// Asks the replica running job `handle` of `owner` to cancel it (it reads the request with
    /// [`Deployment::jobs_to_cancel`]). Returns whether an unfinished job was asked.
    async fn job_request_cancel(&self, handle: &str, owner: &str) -> Result<bool, JournalError>;

    /// Asks the replicas running the unfinished jobs of `owner` that were not started detached
    /// (their report says `"detached": true`) to cancel them: the session that started them
    /// ended. Returns how many were asked.
    async fn jobs_end_of(&self, owner: &str) -> Result<u64, JournalError>;

    /// This replica's unfinished jobs another replica asked it to cancel (at most
    /// [`SHARED_JOBS_TO_CANCEL_MAX`] a call).
    async fn jobs_to_cancel(&self) -> Result<Vec<String>, JournalError>;

    /// Records a task that follows a job, forgetting the oldest beyond [`SHARED_TASKS_MAX`].
    async fn task_put(&self, task: &SharedTask) -> Result<(), JournalError>;

    /// The task `task_id`, if any replica recorded it.
    async fn task_get(&self, task_id: &str) -> Result<Option<SharedTask>, JournalError>;

    /// Records that a client cancelled task `task_id`, so every replica reports it cancelled.
    async fn task_cancelled(&self, task_id: &str) -> Result<(), JournalError>;
}

impl std::fmt::Debug for dyn Deployment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Deployment(replica {})", self.replica())
    }
}
