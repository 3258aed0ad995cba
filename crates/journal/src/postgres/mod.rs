//! The shared backend: one PostgreSQL database for several ring0 replicas.
//!
//! - **The same decisions.** A proposal reads the records that bear on it and lets the private
//!   `decide` module answer, as [`crate::MemoryJournal`] and [`crate::SqliteJournal`] do; a
//!   transition is `decide::plan_transition` and a compare-and-set on the record's fence in SQL.
//!   Every decision is made on the primary the pool connects to.
//! - **Claims** (`propose`). A new record claims its semantic key, content digest and caller's
//!   key with `INSERT … ON CONFLICT DO NOTHING RETURNING` (or moves them from the record it read
//!   with a compare-and-set); two replicas proposing one intent at once get one record, and the
//!   one that lost the claim decides again and is answered by the other's record.
//! - **Leases** (`lease`). Each open is a replica with its own incarnation and a lease it renews
//!   by heartbeat; a replica that stops renewing (killed, partitioned, closed) leaves its open
//!   records to the recovery of any other, which takes them with `FOR UPDATE SKIP LOCKED` and
//!   moves their fences, so the replica that lapsed is fenced out if it wakes up.
//!   [`Journal::open_records`] is that take: the records recovery must settle now.
//! - **Group commit** (`group`, with its set-based statements in `batch`). Concurrent
//!   proposals queue and are decided a batch per transaction: one statement reads every record
//!   bearing on the batch, the shared `decide` rules decide each proposal in memory, one
//!   statement per table writes the batch's records and claims, and one `COMMIT` (one WAL
//!   flush) ends it — a handful of round trips whatever the batch holds. Proposals of a batch
//!   never share an intent id, key, content digest or record (a later one waits for after the
//!   batch), so each gets the answer it would get alone; one that loses a claim to another
//!   replica is taken back out of the transaction and decided again alone.
//!   [`PostgresOptions::group_commit`] turns it off; [`PostgresJournal::group_stats`] says
//!   how large the batches are.
//! - **Durability** is the server's: a proposal or transition returns after its transaction
//!   committed (with the server's `synchronous_commit`).
//! - **Delivery marks** are held in memory and written with the replica's next proposal (or
//!   heartbeat), never waited for, as the SQLite journal writes them with its next commit.
//! - **Held calls** (`holds`): any replica lists and decides a call held for a person's
//!   approval (a compare-and-set from PENDING), and the decision is announced with
//!   `NOTIFY ring0_holds`, which every replica's listener hands to its waiting calls
//!   ([`Journal::hold_wait`]); reading the record every second is the fallback.
//! - **Decision state** (`shared_state`): remembered approvals and GCRA rate buckets, so every
//!   replica decides a call as the others would ([`Journal::shared_state`]).
//! - **Migrations** (`schema`) are numbered, in `ring0_schema`, run once under an advisory lock.
//! - **Reading from outside** (`reader`): [`PostgresReader`] lists and shows records, and
//!   [`migrate`] runs the migrations, without registering a replica.
//! - **TLS** through rustls (ring provider, the platform's roots), as the URL's `sslmode` asks.
//!
//! The journal runs its I/O on a small runtime of its own, so it serves any executor (the
//! kernel's tokio runtime, or `block_on` in a test) and its lease is renewed whatever its callers
//! do.

mod batch;
mod deployment;
mod group;
mod holds;
mod lease;
mod propose;
mod reader;
mod rows;
mod schema;
mod shared_state;

pub use group::GroupStats;
pub use reader::{PostgresReader, migrate};
pub use schema::Migrated;

use crate::clock::{Clock, SystemClock};
use crate::decide;
use crate::hold::{HeldCall, HoldDecided, HoldState};
use crate::limits::{
    MEMO_ENTRIES_MAX, POSTGRES_CLOSE_TIMEOUT_MS, POSTGRES_CONNECT_TIMEOUT_MS,
    POSTGRES_DELIVERIES_PENDING_MAX, POSTGRES_GROUP_WORKERS_MAX, POSTGRES_HEARTBEATS_PER_LEASE,
    POSTGRES_HOLD_NOTICES_MAX, POSTGRES_HOLD_POLL_MS, POSTGRES_LEASE_MS_DEFAULT,
    POSTGRES_LEASE_MS_MIN, POSTGRES_POOL_CONNECTIONS_DEFAULT, POSTGRES_POOL_WAIT_MS,
    POSTGRES_RUNTIME_THREADS, RECENT_LIMIT_MAX,
};
use crate::memo::MemoEntry;
use crate::record::{IntentId, IntentRecord, Proposal, ProposeDecision, Transition};
use crate::{Journal, JournalError};
use async_trait::async_trait;
use deadpool_postgres::GenericClient;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use ring0_core::{Fingerprint, Observation, SemanticKey};
use rows::{cols, icols, to_i64};
use std::future::Future;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_postgres::error::SqlState;

/// How to open a PostgreSQL journal.
#[derive(Clone)]
pub struct PostgresOptions {
    /// Pooled connections, at least one. Default [`POSTGRES_POOL_CONNECTIONS_DEFAULT`].
    pub pool_connections: usize,
    /// This replica's lease: how long after its last heartbeat its records stay its own.
    /// Default [`POSTGRES_LEASE_MS_DEFAULT`], at least [`POSTGRES_LEASE_MS_MIN`].
    pub lease_ms: u64,
    /// The password, when it is not in the URL (from the environment, say).
    pub password: Option<String>,
    /// Whether concurrent proposals share a transaction (the `group` module): one `COMMIT`,
    /// one WAL flush per batch. On by default; off, each proposal is its own transaction.
    pub group_commit: bool,
    /// Timestamps and new ids.
    pub clock: Arc<dyn Clock>,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        Self {
            pool_connections: POSTGRES_POOL_CONNECTIONS_DEFAULT,
            lease_ms: POSTGRES_LEASE_MS_DEFAULT,
            password: None,
            group_commit: true,
            clock: Arc::new(SystemClock),
        }
    }
}

impl std::fmt::Debug for PostgresOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresOptions")
            .field("pool_connections", &self.pool_connections)
            .field("lease_ms", &self.lease_ms)
            .field("group_commit", &self.group_commit)
            .finish_non_exhaustive()
    }
}

/// Whether `url` names a PostgreSQL journal (`postgres://…` or `postgresql://…`).
pub fn is_postgres_url(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// The database as errors name it: `postgres://host:port/dbname`, never a password.
#[derive(Debug, Clone)]
pub(crate) struct Db {
    pub(crate) name: String,
}

impl Db {
    fn of(config: &tokio_postgres::Config) -> Self {
        use tokio_postgres::config::Host;
        let host = match config.get_hosts().first() {
            Some(Host::Tcp(h)) => h.clone(),
            #[cfg(unix)]
            Some(Host::Unix(p)) => p.display().to_string(),
            None => "localhost".into(),
        };
        let port = config.get_ports().first().copied().unwrap_or(5432);
        let db = config
            .get_dbname()
            .or(config.get_user())
            .unwrap_or("postgres");
        Self {
            name: format!("postgres://{host}:{port}/{db}"),
        }
    }

    /// Maps a database error: a full disk → [`JournalError::Full`], anything else a storage
    /// error with the server's message.
    pub(crate) fn sql(&self, e: tokio_postgres::Error) -> JournalError {
        if e.code() == Some(&SqlState::DISK_FULL) {
            return JournalError::Full(format!("{}: {e}", self.name));
        }
        match e.as_db_error() {
            Some(db) => JournalError::Storage(format!(
                "{}: {} {}: {}",
                self.name,
                db.severity(),
                db.code().code(),
                db.message()
            )),
            None => JournalError::Storage(format!("{}: {e}", self.name)),
        }
    }

    pub(crate) fn corrupt(&self, detail: impl Into<String>) -> JournalError {
        JournalError::Corrupt {
            path: self.name.clone().into(),
            detail: detail.into(),
        }
    }

    /// An error another transaction caused, after which deciding again succeeds.
    pub(crate) fn is_retryable(e: &tokio_postgres::Error) -> bool {
        matches!(
            e.code(),
            Some(c) if *c == SqlState::T_R_SERIALIZATION_FAILURE
                || *c == SqlState::T_R_DEADLOCK_DETECTED
        )
    }

    pub(crate) fn is_unique_violation(e: &tokio_postgres::Error) -> bool {
        e.code() == Some(&SqlState::UNIQUE_VIOLATION)
    }
}

/// What every request of one journal shares: the pool, the clock, this replica.
pub(crate) struct Shared {
    pub(crate) db: Db,
    pool: Pool,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) incarnation: u64,
    pub(crate) lease_ms: u64,
    /// Delivery marks not yet written (see [`Journal::mark_delivered`]).
    deliveries: Mutex<Vec<IntentId>>,
    /// Decisions of held calls as the listener hears them (see the `holds` module).
    hold_notices: tokio::sync::broadcast::Sender<holds::HoldNotice>,
    /// Whether the listener's connection listens now.
    listening: Arc<std::sync::atomic::AtomicBool>,
}

impl Shared {
    pub(crate) async fn client(&self) -> Result<deadpool_postgres::Client, JournalError> {
        self.pool
            .get()
            .await
            .map_err(|e| JournalError::Storage(format!("{}: {e}", self.db.name)))
    }

    fn lock_deliveries(&self) -> std::sync::MutexGuard<'_, Vec<IntentId>> {
        // A panic while holding the lock leaves a list of ids, each whole.
        self.deliveries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The delivery marks to write with the next transaction; they stay pending until
    /// [`Shared::deliveries_written`], so every transaction until then writes them too.
    pub(crate) fn pending_deliveries(&self) -> Vec<IntentId> {
        self.lock_deliveries().clone()
    }

    pub(crate) fn deliveries_written(&self, written: &[IntentId]) {
        if !written.is_empty() {
            self.lock_deliveries().retain(|id| !written.contains(id));
        }
    }
}

/// Writes delivery marks (no fence change: delivery is not a state of the record).
pub(crate) async fn write_deliveries(
    client: &impl GenericClient,
    db: &Db,
    ids: &[IntentId],
    now: u64,
) -> Result<(), JournalError> {
    if ids.is_empty() {
        return Ok(());
    }
    let ids: Vec<String> = ids.iter().map(IntentId::to_string).collect();
    let statement = client
        .prepare_cached(
            "UPDATE intents SET delivered_ms = $1 WHERE id = ANY($2) AND delivered_ms IS NULL",
        )
        .await
        .map_err(|e| db.sql(e))?;
    client
        .execute(&statement, &[&to_i64(now), &ids])
        .await
        .map_err(|e| db.sql(e))?;
    Ok(())
}

/// The PostgreSQL journal. Cheap to share behind an `Arc`; dropping it gives up its lease (so
/// another replica may recover its open records at once) and closes its connections.
pub struct PostgresJournal {
    shared: Arc<Shared>,
    runtime: Option<tokio::runtime::Runtime>,
    handle: tokio::runtime::Handle,
    heartbeat: Option<tokio::task::JoinHandle<()>>,
    /// The connection that listens for decisions of held calls.
    listener: Option<tokio::task::JoinHandle<()>>,
    /// Where proposals wait for their batch, when group commit is on.
    group: Option<Arc<group::GroupCommit>>,
    /// Remembered approvals and rate buckets (see the `shared_state` module).
    state: Arc<shared_state::PostgresSharedState>,
}

impl PostgresJournal {
    /// Connects to the database `url` names (`postgres://user:password@host:port/db?sslmode=…`),
    /// runs the migrations it lacks, and registers a new replica.
    pub fn open(url: &str, options: PostgresOptions) -> Result<Self, JournalError> {
        if options.lease_ms < POSTGRES_LEASE_MS_MIN {
            return Err(JournalError::Invalid(format!(
                "a replica's lease is {} ms, less than the {POSTGRES_LEASE_MS_MIN} ms allowed",
                options.lease_ms
            )));
        }
        let (config, db) = connect_config(url, options.password.as_deref())?;
        let runtime = runtime(&db)?;
        let handle = runtime.handle().clone();
        let pool_connections = options.pool_connections.max(1);
        let listen_config = config.clone();
        let pool = pool(config, &db, pool_connections, &handle)?;
        let (lease_ms, clock) = (options.lease_ms, options.clock);
        let opened = block_on(&runtime, async {
            let mut client = pool
                .get()
                .await
                .map_err(|e| JournalError::Storage(format!("{}: {e}", db.name)))?;
            schema::migrate(&mut client, &db).await?;
            lease::register(&client, &db, lease_ms).await
        });
        let incarnation = match opened {
            Ok(incarnation) => incarnation,
            Err(e) => {
                runtime.shutdown_background();
                return Err(e);
            }
        };
        let shared = Arc::new(Shared {
            db,
            pool,
            clock,
            incarnation,
            lease_ms,
            deliveries: Mutex::new(Vec::new()),
            hold_notices: tokio::sync::broadcast::channel(POSTGRES_HOLD_NOTICES_MAX).0,
            listening: Arc::default(),
        });
        let heartbeat = handle.spawn(heartbeat(shared.clone()));
        let listener = match tls(&shared.db) {
            Ok(tls) => handle.spawn(holds::listen(
                listen_config,
                tls,
                shared.hold_notices.clone(),
                shared.listening.clone(),
            )),
            Err(e) => {
                runtime.shutdown_background();
                return Err(e);
            }
        };
        let group = options.group_commit.then(|| {
            // Half the pool at most, so batches never hold every connection.
            let workers = (pool_connections / 2).clamp(1, POSTGRES_GROUP_WORKERS_MAX);
            let _entered = handle.enter();
            Arc::new(group::GroupCommit::start(shared.clone(), workers))
        });
        let state = Arc::new(shared_state::PostgresSharedState {
            shared: shared.clone(),
            handle: handle.clone(),
        });
        Ok(Self {
            shared,
            state,
            runtime: Some(runtime),
            handle,
            heartbeat: Some(heartbeat),
            listener: Some(listener),
            group,
        })
    }

    /// The database, as errors name it (`postgres://host:port/db`).
    pub fn name(&self) -> &str {
        &self.shared.db.name
    }

    /// This replica's lease.
    pub fn lease_ms(&self) -> u64 {
        self.shared.lease_ms
    }

    /// What this replica shares with the others on the database besides records (see
    /// [`crate::deployment`]). It runs on the journal's runtime: it stops working once the
    /// journal is dropped.
    pub fn deployment(&self) -> Arc<dyn crate::deployment::Deployment> {
        Arc::new(deployment::PostgresDeployment::new(
            self.shared.clone(),
            self.handle.clone(),
        ))
    }

    /// What its group commits have done since it opened; `None` with group commit off.
    pub fn group_stats(&self) -> Option<GroupStats> {
        self.group.as_ref().map(|g| g.stats())
    }

    /// Whether this replica listens for decisions of held calls now (its listening connection
    /// is up). While it does not, a waiting call learns of a decision by reading its record,
    /// within [`POSTGRES_HOLD_POLL_MS`].
    pub fn listening(&self) -> bool {
        self.shared
            .listening
            .load(std::sync::atomic::Ordering::Relaxed)
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

/// The connection settings `url` names, with ring0's own: a connect timeout unless the URL sets
/// one, the application name, the primary (decisions are made there), the password when given
/// apart from the URL.
fn connect_config(
    url: &str,
    password: Option<&str>,
) -> Result<(tokio_postgres::Config, Db), JournalError> {
    let mut config = tokio_postgres::Config::from_str(url).map_err(|e| {
        JournalError::Invalid(format!(
            "{url:?} is not a PostgreSQL URL: {e}",
            url = redact_password(url)
        ))
    })?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_millis(POSTGRES_CONNECT_TIMEOUT_MS));
    }
    config.application_name("ring0");
    // Decisions are made on the primary: of several hosts in the URL, a writable one.
    config.target_session_attrs(tokio_postgres::config::TargetSessionAttrs::ReadWrite);
    if let Some(password) = password {
        config.password(password.as_bytes());
    }
    let db = Db::of(&config);
    Ok((config, db))
}

/// The small runtime a journal (or a reader) runs its I/O on.
fn runtime(db: &Db) -> Result<tokio::runtime::Runtime, JournalError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(POSTGRES_RUNTIME_THREADS)
        .thread_name("ring0-journal-pg")
        .enable_io()
        .enable_time()
        .build()
        .map_err(|e| JournalError::Storage(format!("{}: starting its runtime: {e}", db.name)))
}

/// A URL with its password replaced, for messages.
pub fn redact_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    match rest.split_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:…@{host}"),
            None => url.to_string(),
        },
        None => url.to_string(),
    }
}

fn pool(
    config: tokio_postgres::Config,
    db: &Db,
    size: usize,
    handle: &tokio::runtime::Handle,
) -> Result<Pool, JournalError> {
    let tls = tls(db)?;
    let manager = Manager::from_config(
        config,
        tls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let wait = Some(Duration::from_millis(POSTGRES_POOL_WAIT_MS));
    let _entered = handle.enter();
    Pool::builder(manager)
        .max_size(size)
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .wait_timeout(wait)
        .create_timeout(Some(Duration::from_millis(POSTGRES_CONNECT_TIMEOUT_MS)))
        .recycle_timeout(wait)
        .build()
        .map_err(|e| JournalError::Storage(format!("{}: {e}", db.name)))
}

/// rustls with the ring provider and the platform's verifier, used when the URL's `sslmode`
/// asks for TLS (`prefer`, the default, uses it when the server offers it; `require` insists).
///
/// The configuration is built once per process and shared by every journal opened in it:
/// loading the platform's roots costs tens of milliseconds, which a replica's pool and
/// listener (and every reopen) would otherwise pay again for the same result.
fn tls(db: &Db) -> Result<tokio_postgres_rustls::MakeRustlsConnect, JournalError> {
    static CONFIG: std::sync::OnceLock<Result<rustls::ClientConfig, String>> =
        std::sync::OnceLock::new();
    let config = CONFIG.get_or_init(|| {
        use rustls_platform_verifier::BuilderVerifierExt;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .and_then(|b| b.with_platform_verifier())
            .map(|b| b.with_no_client_auth())
            .map_err(|e| e.to_string())
    });
    match config {
        Ok(config) => Ok(tokio_postgres_rustls::MakeRustlsConnect::new(
            config.clone(),
        )),
        Err(e) => Err(JournalError::Storage(format!("{}: TLS: {e}", db.name))),
    }
}

/// Runs `f` to completion on `runtime` from any thread, inside an async context or not.
fn block_on<F>(runtime: &tokio::runtime::Runtime, f: F) -> F::Output
where
    F: Future + Send,
    F::Output: Send,
{
    std::thread::scope(|s| {
        s.spawn(|| runtime.block_on(f))
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// Renews the lease every [`POSTGRES_HEARTBEATS_PER_LEASE`]th of it, and writes the delivery
/// marks no proposal has written since. A failed renewal is tried again at the next beat; a
/// lease that lapses meanwhile only lets another replica take (and fence) its records.
async fn heartbeat(shared: Arc<Shared>) {
    let every = Duration::from_millis(shared.lease_ms / POSTGRES_HEARTBEATS_PER_LEASE);
    // Registering took the first lease: the first renewal is one beat later.
    let mut beat = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        beat.tick().await;
        let _ = lease::renew(&shared).await;
        if let Ok(client) = shared.client().await {
            let _ = shared_state::prune(&client, &shared.db).await;
        }
        let deliveries = shared.pending_deliveries();
        if !deliveries.is_empty()
            && let Ok(client) = shared.client().await
            && write_deliveries(&client, &shared.db, &deliveries, shared.clock.now_ms())
                .await
                .is_ok()
        {
            shared.deliveries_written(&deliveries);
        }
    }
}

impl Drop for PostgresJournal {
    fn drop(&mut self) {
        // Closing the queue lets the group workers finish what is queued and stop.
        self.group = None;
        for task in [self.heartbeat.take(), self.listener.take()]
            .into_iter()
            .flatten()
        {
            task.abort();
        }
        let Some(runtime) = self.runtime.take() else {
            return;
        };
        let shared = self.shared.clone();
        block_on(&runtime, async move {
            let limit = Duration::from_millis(POSTGRES_CLOSE_TIMEOUT_MS);
            let deliveries = shared.pending_deliveries();
            let _ = tokio::time::timeout(limit, async {
                if let Ok(client) = shared.client().await {
                    let now = shared.clock.now_ms();
                    let _ = write_deliveries(&client, &shared.db, &deliveries, now).await;
                }
                lease::release(&shared).await
            })
            .await;
        });
        runtime.shutdown_background();
    }
}

#[async_trait]
impl Journal for PostgresJournal {
    async fn propose(&self, proposal: Proposal) -> Result<ProposeDecision, JournalError> {
        decide::validate_proposal(&proposal)?;
        // An id is drawn for every proposal the host names none for, as the other backends do.
        let id = proposal
            .intent_id
            .unwrap_or_else(|| self.shared.clock.new_id());
        match self.group.clone() {
            Some(group) => {
                self.run(move |shared| async move { group.propose(&shared.db, proposal, id).await })
                    .await
            }
            None => {
                self.run(
                    move |shared| async move { propose::propose(&shared, &proposal, id).await },
                )
                .await
            }
        }
    }

    async fn transition(&self, t: Transition) -> Result<IntentRecord, JournalError> {
        self.run(move |shared| async move {
            let db = &shared.db;
            let client = shared.client().await?;
            let record = rows::load_by_id(&client, db, &t.id)
                .await?
                .ok_or(JournalError::NotFound(t.id))?;
            let now = shared.clock.now_ms();
            let next = decide::plan_transition(&record, &t, now, shared.incarnation)?;
            if rows::update(&client, db, &next, record.fence, shared.incarnation, now).await? {
                return Ok(next);
            }
            // Another replica moved it between the read and the write.
            let actual = rows::load_by_id(&client, db, &t.id)
                .await?
                .map_or(record.fence, |r| r.fence);
            Err(JournalError::StaleFence {
                id: t.id,
                expected: t.expected_fence,
                actual,
            })
        })
        .await
    }

    fn mark_delivered(&self, id: IntentId) {
        // Never waits: written with the next proposal or heartbeat. A mark dropped beyond the
        // bound only makes the next identical call a replay.
        let mut pending = self.shared.lock_deliveries();
        if pending.len() < POSTGRES_DELIVERIES_PENDING_MAX && !pending.contains(&id) {
            pending.push(id);
        }
    }

    async fn get(&self, id: IntentId) -> Result<Option<IntentRecord>, JournalError> {
        self.run(move |shared| async move {
            let client = shared.client().await?;
            rows::load_by_id(&client, &shared.db, &id).await
        })
        .await
    }

    async fn find_by_key(&self, key: &SemanticKey) -> Result<Option<IntentRecord>, JournalError> {
        let key = key.encode();
        self.run(move |shared| async move {
            let client = shared.client().await?;
            let row = client
                .query_opt(
                    concat!(
                        "SELECT ",
                        icols!(),
                        " FROM intent_keys k JOIN intents i ON i.seq = k.intent_seq
                         WHERE k.semantic_key = $1 AND i.mutating"
                    ),
                    &[&key],
                )
                .await
                .map_err(|e| shared.db.sql(e))?;
            row.map(|r| rows::from_row(&r, &shared.db)).transpose()
        })
        .await
    }

    /// The records recovery must settle now: those whose holder's lease lapsed, taken by this
    /// replica (see the `lease` module), with this replica's own records in flight.
    async fn open_records(&self) -> Result<Vec<IntentRecord>, JournalError> {
        self.run(|shared| async move { lease::take_expired(&shared).await })
            .await
    }

    async fn recent(&self, limit: usize) -> Result<Vec<IntentRecord>, JournalError> {
        let limit = i64::try_from(limit.min(RECENT_LIMIT_MAX)).unwrap_or(0);
        self.run(move |shared| async move {
            let client = shared.client().await?;
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
                .map_err(|e| shared.db.sql(e))?;
            found
                .iter()
                .map(|r| rows::from_row(r, &shared.db))
                .collect()
        })
        .await
    }

    fn incarnation(&self) -> Option<u64> {
        Some(self.shared.incarnation)
    }

    fn shared_state(&self) -> Option<Arc<dyn crate::shared::SharedState>> {
        Some(self.state.clone())
    }

    async fn hold_put(&self, held: &HeldCall) -> Result<bool, JournalError> {
        let held = held.clone();
        self.run(move |shared| async move {
            let client = shared.client().await?;
            holds::put(&client, &shared.db, &held).await
        })
        .await
    }

    async fn hold_get(&self, approval_id: &str) -> Result<Option<HeldCall>, JournalError> {
        let id = approval_id.to_string();
        self.run(move |shared| async move {
            let client = shared.client().await?;
            holds::get(&client, &shared.db, &id).await
        })
        .await
    }

    async fn holds_pending(&self) -> Result<Vec<HeldCall>, JournalError> {
        self.run(|shared| async move {
            let client = shared.client().await?;
            holds::pending(&client, &shared.db).await
        })
        .await
    }

    async fn holds_unreleased(&self) -> Result<Vec<HeldCall>, JournalError> {
        self.run(|shared| async move {
            let client = shared.client().await?;
            holds::unreleased(&client, &shared.db, shared.clock.now_ms()).await
        })
        .await
    }

    async fn hold_decide(
        &self,
        approval_id: &str,
        state: HoldState,
    ) -> Result<HoldDecided, JournalError> {
        let id = approval_id.to_string();
        self.run(move |shared| async move {
            let mut client = shared.client().await?;
            let now = shared.clock.now_ms();
            holds::decide(&mut client, &shared.db, &id, state, now).await
        })
        .await
    }

    /// Waits for the listener's word that the call was decided (by any replica), reading the
    /// record at the start, on every word about it, and every [`POSTGRES_HOLD_POLL_MS`] in case
    /// a notification was lost.
    async fn hold_wait(&self, approval_id: &str, wait: Duration) -> Option<HeldCall> {
        use tokio::sync::broadcast::error::RecvError;
        // Subscribed before the first read, so a decision between the two is heard.
        let mut notices = self.shared.hold_notices.subscribe();
        let until = tokio::time::Instant::now() + wait;
        let poll = Duration::from_millis(POSTGRES_HOLD_POLL_MS);
        loop {
            if let Ok(Some(held)) = self.hold_get(approval_id).await
                && held.state != HoldState::Pending
            {
                return Some(held);
            }
            // Until a word about this call (or a prompt to read again), the poll, or the end.
            let heard = async {
                loop {
                    match notices.recv().await {
                        Ok(holds::HoldNotice::Decided(id)) if id != approval_id => continue,
                        Ok(_) | Err(RecvError::Lagged(_)) => return,
                        // The journal is closing: the poll reads on until the end.
                        Err(RecvError::Closed) => std::future::pending::<()>().await,
                    }
                }
            };
            let now = tokio::time::Instant::now();
            if now >= until {
                return None;
            }
            let _ = tokio::time::timeout(poll.min(until - now), heard).await;
        }
    }

    async fn memo_get(
        &self,
        fingerprint: &Fingerprint,
        max_age_ms: u64,
    ) -> Result<Option<Observation>, JournalError> {
        let fp = fingerprint.encode();
        self.run(move |shared| async move {
            let client = shared.client().await?;
            let row = client
                .query_opt(
                    "SELECT observation, stored_ms FROM memo WHERE fingerprint = $1",
                    &[&fp],
                )
                .await
                .map_err(|e| shared.db.sql(e))?;
            let Some(row) = row else {
                return Ok(None);
            };
            let entry = MemoEntry {
                text: row.try_get(0).map_err(|e| shared.db.sql(e))?,
                stored_ms: u64::try_from(row.try_get::<_, i64>(1).map_err(|e| shared.db.sql(e))?)
                    .unwrap_or(u64::MAX),
            };
            Ok(entry.serve(shared.clock.now_ms(), max_age_ms))
        })
        .await
    }

    async fn memo_put(
        &self,
        fingerprint: &Fingerprint,
        observation: &Observation,
    ) -> Result<bool, JournalError> {
        let Some(entry) = MemoEntry::new(observation, self.shared.clock.now_ms()) else {
            return Ok(false);
        };
        let fp = fingerprint.encode();
        self.run(move |shared| async move {
            let db = &shared.db;
            let mut client = shared.client().await?;
            let tx = client.transaction().await.map_err(|e| db.sql(e))?;
            tx.execute(
                "INSERT INTO memo (fingerprint, observation, stored_ms) VALUES ($1, $2, $3)
                 ON CONFLICT (fingerprint) DO UPDATE SET
                   observation = excluded.observation, stored_ms = excluded.stored_ms",
                &[&fp, &entry.text, &to_i64(entry.stored_ms)],
            )
            .await
            .map_err(|e| db.sql(e))?;
            tx.execute(
                "DELETE FROM memo WHERE fingerprint IN (
                   SELECT fingerprint FROM memo ORDER BY stored_ms, fingerprint
                   LIMIT greatest(0, (SELECT count(*) FROM memo) - $1))",
                &[&(MEMO_ENTRIES_MAX as i64)],
            )
            .await
            .map_err(|e| db.sql(e))?;
            tx.commit().await.map_err(|e| db.sql(e))?;
            Ok(true)
        })
        .await
    }
}
