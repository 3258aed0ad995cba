//! Background jobs: per-session tables of supervised processes behind opaque handles.
//!
//! [`JobManager::start`] spawns the command and returns a [`JobReceipt`] at once; one task per job
//! runs the same supervision loop as a one-shot run, feeding the job's shaper, its in-memory tail
//! and its log file as output arrives. When the process exits (an event from tokio's reaper, no
//! polling) the job becomes terminal, its record is saved and exactly one
//! [`JobEvent::Finished`] goes to the session's event stream.
//!
//! Handles are 128 random bits. Every operation names the session; a handle that belongs to
//! another session is answered exactly like one that never existed ([`JobError::UnknownJob`],
//! same text), so handles leak nothing across sessions and a pid is never exposed.
//!
//! Interactive jobs (stdin a pipe or a terminal) are probed for a blocked read (see
//! [`crate::probe`]); a job found waiting becomes SUSPENDED and the session gets
//! [`JobEvent::InputRequested`].

mod input;
mod store;
mod types;

pub use types::{
    InputReceipt, JobEvent, JobHandle, JobReceipt, JobSnapshot, JobState, JobStatus, JobUsage,
    RunMode, SessionId,
};

use crate::capture::{Shaping, sanitize_tail};
use crate::error::{ExecError, JobError};
use crate::limits;
use crate::run::RunSummary;
use crate::spawn::{self, InputWriter};
use crate::spec::{CommandSpec, ExecPolicy, PreparedCommand};
use crate::supervise::{self, Limits, Monitor};
use ring0_shape::Stream;
use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use store::{JobRecord, Store};
use tokio::io::AsyncWriteExt;
use tokio::sync::{Notify, mpsc, watch};

/// Default wall-clock limit of a background job that names none.
pub const JOB_TIMEOUT_DEFAULT: Duration = Duration::from_secs(60 * 60);

/// Configuration of a [`JobManager`].
#[derive(Debug, Clone)]
pub struct JobsConfig {
    /// Where job records and logs live (created private if missing; locked while open).
    pub state_dir: PathBuf,
    /// The rules every job's command is checked against.
    pub policy: ExecPolicy,
    /// Most live jobs per session. Default [`limits::JOBS_PER_SESSION_DEFAULT`].
    pub jobs_per_session: usize,
    /// Most live jobs overall. Default [`limits::JOBS_TOTAL_DEFAULT`].
    pub jobs_total: usize,
    /// Finished jobs kept per session. Default [`limits::FINISHED_JOBS_RETAINED_DEFAULT`].
    pub finished_retained_per_session: usize,
    /// Most bytes of one job's log. Default [`limits::SPILL_BYTES_DEFAULT`].
    pub spill_bytes: u64,
    /// Capacity of each session's event channel. Default [`limits::SESSION_EVENTS_DEFAULT`].
    pub session_events: usize,
}

impl JobsConfig {
    pub fn new(state_dir: impl Into<PathBuf>, policy: ExecPolicy) -> Self {
        Self {
            state_dir: state_dir.into(),
            policy,
            jobs_per_session: limits::JOBS_PER_SESSION_DEFAULT,
            jobs_total: limits::JOBS_TOTAL_DEFAULT,
            finished_retained_per_session: limits::FINISHED_JOBS_RETAINED_DEFAULT,
            spill_bytes: limits::SPILL_BYTES_DEFAULT,
            session_events: limits::SESSION_EVENTS_DEFAULT,
        }
    }
}

/// What [`JobManager::open`] found from a previous run.
#[derive(Debug, Clone, Default)]
pub struct Recovery {
    /// Jobs that were running when the previous ring0 stopped, now KILLED (their sessions get a
    /// `Finished` event when they are opened).
    pub killed: Vec<JobStatus>,
    /// Record files that could not be read (left in place).
    pub unreadable: Vec<PathBuf>,
}

/// A session's stream of job events. Events queued in it are dropped with it; `Finished` events
/// of jobs that end while the session has no stream are kept for the next
/// [`JobManager::open_session`], and every job's final status stays available through
/// [`JobManager::wait`] and [`JobManager::list`].
#[derive(Debug)]
pub struct JobEvents(mpsc::Receiver<JobEvent>);

impl JobEvents {
    /// The next event, or `None` once the manager is gone.
    pub async fn recv(&mut self) -> Option<JobEvent> {
        self.0.recv().await
    }

    /// The next event if one is queued.
    pub fn try_recv(&mut self) -> Option<JobEvent> {
        self.0.try_recv().ok()
    }
}

/// Supervises background jobs for many sessions. Cheap to clone.
#[derive(Clone)]
pub struct JobManager {
    inner: Arc<Inner>,
}

struct Inner {
    config: JobsConfig,
    store: Store,
    table: Mutex<Table>,
    sigchld: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(task) = self.sigchld.get_mut().ok().and_then(Option::take) {
            task.abort();
        }
    }
}

#[derive(Default)]
struct Table {
    jobs: HashMap<JobHandle, Arc<Job>>,
    sessions: HashMap<SessionId, SessionEntry>,
    live_total: usize,
}

#[derive(Default)]
struct SessionEntry {
    events: Option<mpsc::Sender<JobEvent>>,
    live: usize,
    /// Finished jobs, oldest first, for retention.
    finished: VecDeque<JobHandle>,
    /// Finished events nobody was listening for; delivered on the next open.
    undelivered: Vec<JobStatus>,
}

struct Job {
    handle: JobHandle,
    session: SessionId,
    command: String,
    started: Option<Instant>,
    started_at_ms: u64,
    log: PathBuf,
    root_pid: i32,
    interactive: bool,
    live: Mutex<JobLive>,
    state_tx: watch::Sender<JobState>,
    cancel: Notify,
    input: tokio::sync::Mutex<Option<InputWriter>>,
    input_epoch: AtomicU64,
}

struct JobLive {
    state: JobState,
    tail: VecDeque<u8>,
    log_bytes: u64,
    log_dropped_bytes: u64,
    finished: Option<JobStatus>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves plain data behind; keep serving.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Job {
    fn set_state(&self, live: &mut JobLive, state: JobState) {
        if live.state != state && !live.state.is_terminal() {
            live.state = state;
            self.state_tx.send_replace(state);
        }
    }

    fn status(&self) -> JobStatus {
        let live = lock(&self.live);
        if let Some(done) = &live.finished {
            return done.clone();
        }
        JobStatus {
            job: self.handle,
            state: live.state,
            command: self.command.clone(),
            started_at_ms: self.started_at_ms,
            finished_at_ms: None,
            elapsed_ms: self
                .started
                .map(|s| u64::try_from(s.elapsed().as_millis()).unwrap_or(u64::MAX))
                .unwrap_or(0),
            log: self.log.clone(),
            log_bytes: live.log_bytes,
            log_dropped_bytes: live.log_dropped_bytes,
            summary: None,
            observation: None,
            note: None,
        }
    }

    fn tail(&self, lines: usize) -> (String, usize) {
        let bytes: Vec<u8> = lock(&self.live).tail.iter().copied().collect();
        last_lines(&sanitize_tail(&bytes), lines)
    }
}

/// The last `n` lines of `text` and how many there are.
fn last_lines(text: &str, n: usize) -> (String, usize) {
    if n == 0 {
        return (String::new(), 0);
    }
    let trimmed = text.strip_suffix('\n').unwrap_or(text);
    let mut start = trimmed.len();
    let mut count = 0;
    for (i, c) in trimmed.char_indices().rev() {
        if c == '\n' {
            count += 1;
            if count == n {
                start = i + 1;
                break;
            }
        }
        start = i;
    }
    let tail = &text[start.min(text.len())..];
    let lines = tail.lines().count();
    (tail.to_owned(), lines)
}

struct JobMonitor {
    job: Arc<Job>,
    shaper: Shaping,
    log: Option<File>,
    spill_bytes: u64,
    events: Option<mpsc::Sender<JobEvent>>,
}

impl Monitor for JobMonitor {
    fn on_output(&mut self, stream: Stream, bytes: &[u8]) {
        self.shaper.push(stream, bytes);
        let mut live = lock(&self.job.live);
        let overflow = (live.tail.len() + bytes.len()).saturating_sub(limits::TAIL_BYTES_MAX);
        let drop_front = overflow.min(live.tail.len());
        live.tail.drain(..drop_front);
        let keep_from = bytes.len().saturating_sub(limits::TAIL_BYTES_MAX);
        live.tail.extend(&bytes[keep_from..]);

        // The log gets whole chunks until the spill limit; page-cache writes of one chunk are
        // cheaper than a blocking-pool hop per chunk.
        let room = self.spill_bytes.saturating_sub(live.log_bytes);
        let write = usize::try_from(room).unwrap_or(usize::MAX).min(bytes.len());
        let mut written = 0;
        if let Some(log) = self.log.as_mut()
            && write > 0
        {
            match log.write_all(&bytes[..write]) {
                Ok(()) => written = write,
                Err(_) => self.log = None,
            }
        }
        live.log_bytes += written as u64;
        live.log_dropped_bytes += (bytes.len() - written) as u64;
        let job = Arc::clone(&self.job);
        job.set_state(&mut live, JobState::Streaming);
    }

    fn on_input_wait(&mut self) {
        let mut live = lock(&self.job.live);
        if live.state == JobState::Suspended || live.state.is_terminal() {
            return;
        }
        self.job.set_state(&mut live, JobState::Suspended);
        drop(live);
        let (tail, _) = self.job.tail(5);
        let event = JobEvent::InputRequested {
            job: self.job.handle,
            tail,
        };
        if let Some(events) = &self.events
            && let Err(mpsc::error::TrySendError::Full(event)) = events.try_send(event)
        {
            let events = events.clone();
            tokio::spawn(async move {
                let _ = events.send(event).await;
            });
        }
    }

    fn input_epoch(&self) -> u64 {
        self.job.input_epoch.load(Ordering::Acquire)
    }
}

impl JobManager {
    /// Opens the state directory, settles jobs a previous ring0 left running (their processes
    /// are killed, their records become KILLED) and starts reaping adopted orphans.
    ///
    /// Must be called inside a tokio runtime, which then runs every job's supervision.
    pub async fn open(config: JobsConfig) -> Result<(Self, Recovery), JobError> {
        crate::reaper::ensure_subreaper().map_err(|e| JobError::Exec(ExecError::Setup(e)))?;
        // What a killed ring0's runs left (foreground ones too) ends before anything starts.
        crate::cgroup::sweep_once();
        let store = Store::open(&config.state_dir)?;
        let (mut records, unreadable) = store.load();
        let mut recovery = Recovery {
            killed: Vec::new(),
            unreadable,
        };
        let mut interrupted = Vec::new();
        for record in &mut records {
            if !record.state.is_terminal() {
                store::settle_interrupted(
                    &store,
                    record,
                    config.policy.termination_grace,
                    now_ms(),
                )
                .await?;
                interrupted.push(record.job);
            }
        }
        records.sort_by_key(|r| (r.finished_at_ms.unwrap_or(0), r.started_at_ms));

        let mut table = Table::default();
        let mut per_session: HashMap<SessionId, Vec<JobRecord>> = HashMap::new();
        for record in records {
            per_session
                .entry(record.session.clone())
                .or_default()
                .push(record);
        }
        for (session, list) in per_session {
            let excess = list
                .len()
                .saturating_sub(config.finished_retained_per_session);
            let entry = table.sessions.entry(session).or_default();
            for (i, record) in list.into_iter().enumerate() {
                if i < excess {
                    store.remove(record.job);
                    continue;
                }
                let status = status_of_record(&record, store.log_path(record.job));
                if interrupted.contains(&record.job) {
                    recovery.killed.push(status.clone());
                    entry.undelivered.push(status.clone());
                }
                entry.finished.push_back(record.job);
                table
                    .jobs
                    .insert(record.job, Arc::new(finished_job(&record, status)));
            }
        }

        let inner = Arc::new(Inner {
            config,
            store,
            table: Mutex::new(table),
            sigchld: Mutex::new(None),
        });
        // Orphans adopted as child subreaper are reaped when they die: SIGCHLD is the event.
        let sweeper = tokio::spawn(async {
            let Ok(mut sigchld) =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())
            else {
                return;
            };
            while sigchld.recv().await.is_some() {
                crate::reaper::sweep_adopted_zombies();
            }
        });
        *lock(&inner.sigchld) = Some(sweeper);
        Ok((Self { inner }, recovery))
    }

    /// Opens a session and returns its event stream. Events of jobs that finished while the
    /// session had no stream (including jobs killed by a restart) are delivered first. A session
    /// whose stream is still alive cannot be opened twice.
    pub fn open_session(&self, session: &SessionId) -> Result<JobEvents, JobError> {
        let (tx, rx) = mpsc::channel(self.inner.config.session_events.max(1));
        let undelivered = {
            let mut table = lock(&self.inner.table);
            let entry = table.sessions.entry(session.clone()).or_default();
            if entry.events.as_ref().is_some_and(|tx| !tx.is_closed()) {
                return Err(JobError::SessionAlreadyOpen {
                    session: session.as_str().to_owned(),
                });
            }
            entry.events = Some(tx.clone());
            std::mem::take(&mut entry.undelivered)
        };
        if !undelivered.is_empty() {
            tokio::spawn(async move {
                for status in undelivered {
                    let _ = tx
                        .send(JobEvent::Finished {
                            status: Box::new(status),
                        })
                        .await;
                }
            });
        }
        Ok(JobEvents(rx))
    }

    /// Starts `spec` as a background job of `session` and returns its receipt at once.
    pub async fn start(
        &self,
        session: &SessionId,
        spec: &CommandSpec,
    ) -> Result<JobReceipt, JobError> {
        self.start_in(session, spec, None).await
    }

    /// [`JobManager::start`], the job confined by `sandbox` instead of the policy's when given
    /// (the profile and egress of the call that starts it). A sandbox that is off is refused
    /// when the policy's is on: a job is never started less confined than the policy says.
    pub async fn start_in(
        &self,
        session: &SessionId,
        spec: &CommandSpec,
        sandbox: Option<crate::Sandbox>,
    ) -> Result<JobReceipt, JobError> {
        let inner = &self.inner;
        let mut spec = spec.clone();
        if spec.timeout_ms.is_none() {
            spec = spec.timeout(JOB_TIMEOUT_DEFAULT);
        }
        let mut prepared = PreparedCommand::prepare(&inner.config.policy, &spec)?;
        if let Some(sandbox) = sandbox {
            if inner.config.policy.sandbox.is_on() && !sandbox.is_on() {
                return Err(JobError::Exec(ExecError::Sandbox(
                    crate::SandboxError::Setup(
                        "a job may not run unconfined where the policy confines it".into(),
                    ),
                )));
            }
            prepared.sandbox = sandbox;
        }

        let events = {
            let mut table = lock(&inner.table);
            let total = table.live_total;
            let Some(entry) = table.sessions.get_mut(session) else {
                return Err(JobError::SessionNotOpen);
            };
            let Some(events) = entry.events.clone() else {
                return Err(JobError::SessionNotOpen);
            };
            if entry.live >= inner.config.jobs_per_session {
                return Err(JobError::SessionJobLimit {
                    running: entry.live,
                    limit: inner.config.jobs_per_session,
                });
            }
            if total >= inner.config.jobs_total {
                return Err(JobError::TotalJobLimit {
                    running: total,
                    limit: inner.config.jobs_total,
                });
            }
            entry.live += 1;
            table.live_total += 1;
            events
        };
        match self.spawn_job(session, prepared, events) {
            Ok(receipt) => Ok(receipt),
            Err(e) => {
                let mut table = lock(&inner.table);
                table.live_total -= 1;
                if let Some(entry) = table.sessions.get_mut(session) {
                    entry.live -= 1;
                }
                Err(e)
            }
        }
    }

    fn spawn_job(
        &self,
        session: &SessionId,
        prepared: PreparedCommand,
        events: mpsc::Sender<JobEvent>,
    ) -> Result<JobReceipt, JobError> {
        let inner = &self.inner;
        let handle = JobHandle::random();
        let log_path = inner.store.log_path(handle);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(&log_path)
            .map_err(|e| JobError::StateDir {
                dir: log_path.clone(),
                reason: format!("creating the log: {e}"),
            })?;
        let shaper = Shaping::new(&prepared.shape)?;
        let mut spawned = spawn::spawn(&prepared)?;
        let started = Instant::now();
        let started_at_ms = now_ms();
        let root_pid = spawned.identity.root;
        let (state_tx, _) = watch::channel(JobState::Spawned);
        let job = Arc::new(Job {
            handle,
            session: session.clone(),
            command: prepared.display(),
            started: Some(started),
            started_at_ms,
            log: log_path.clone(),
            root_pid,
            interactive: prepared.stdin.is_interactive(),
            live: Mutex::new(JobLive {
                state: JobState::Spawned,
                tail: VecDeque::new(),
                log_bytes: 0,
                log_dropped_bytes: 0,
                finished: None,
            }),
            state_tx,
            cancel: Notify::new(),
            input: tokio::sync::Mutex::new(spawned.writer.take()),
            input_epoch: AtomicU64::new(0),
        });
        let record = JobRecord {
            job: handle,
            session: session.clone(),
            command: job.command.clone(),
            state: JobState::Running,
            started_at_ms,
            finished_at_ms: None,
            root_pid,
            root_start_ticks: crate::proc::status(root_pid).map_or(0, |s| s.start_ticks),
            boot_id: crate::proc::boot_id(),
            token: spawned.identity.token.clone(),
            log_bytes: 0,
            log_dropped_bytes: 0,
            summary: None,
            note: None,
        };
        // Without a record a restart could forget the job: refuse rather than run unrecorded.
        if let Err(e) = inner.store.save(&record) {
            let identity = spawned.identity.clone();
            let grace = prepared.grace;
            tokio::spawn(async move {
                crate::teardown::teardown(identity, grace).await;
                drop(spawned);
            });
            return Err(e);
        }
        lock(&inner.table).jobs.insert(handle, Arc::clone(&job));

        let monitor = JobMonitor {
            job: Arc::clone(&job),
            shaper,
            log: Some(log),
            spill_bytes: inner.config.spill_bytes,
            events: Some(events),
        };
        let manager = self.clone();
        tokio::spawn(async move {
            manager
                .supervise_job(job, spawned, prepared, monitor, record)
                .await;
        });
        Ok(JobReceipt {
            job: handle,
            state: JobState::Spawned,
            log: log_path,
            started_at_ms,
            run_mode: RunMode::Background,
        })
    }

    async fn supervise_job(
        &self,
        job: Arc<Job>,
        spawned: spawn::Spawned,
        prepared: PreparedCommand,
        mut monitor: JobMonitor,
        mut record: JobRecord,
    ) {
        {
            let mut live = lock(&job.live);
            job.set_state(&mut live, JobState::Running);
        }
        let started = job.started.unwrap_or_else(Instant::now);
        let limits = Limits {
            deadline: started + prepared.timeout,
            grace: prepared.grace,
            output_ceiling_bytes: prepared.output_ceiling_bytes,
            probe_input: job.interactive,
        };
        let done = supervise::supervise(spawned, limits, &mut monitor, job.cancel.notified()).await;
        job.input.lock().await.take();

        let summary = RunSummary {
            command: job.command.clone(),
            ending: done.ending,
            exit: done.exit,
            stdout_bytes: done.stdout_bytes,
            stderr_bytes: done.stderr_bytes,
            discarded_bytes: done.discarded_bytes,
            output_ceiling_bytes: prepared.output_ceiling_bytes,
            timeout_ms: u64::try_from(prepared.timeout.as_millis()).unwrap_or(u64::MAX),
            duration_ms: u64::try_from(done.elapsed.as_millis()).unwrap_or(u64::MAX),
            teardown: done.teardown,
            pipes_force_closed: done.pipes_force_closed,
            error: done.error.clone(),
        };
        let JobMonitor {
            shaper, mut log, ..
        } = monitor;
        let observation = shaper.finish(&summary);
        let state = JobState::from_ending(done.ending, done.exit);
        let finished_at_ms = now_ms();

        let status = {
            let mut live = lock(&job.live);
            if live.log_dropped_bytes > 0
                && let Some(log) = log.as_mut()
            {
                let _ = writeln!(
                    log,
                    "\n[ring0: log limit of {} bytes reached; {} further bytes were not written]",
                    self.inner.config.spill_bytes, live.log_dropped_bytes
                );
            }
            let status = JobStatus {
                job: job.handle,
                state,
                command: job.command.clone(),
                started_at_ms: job.started_at_ms,
                finished_at_ms: Some(finished_at_ms),
                elapsed_ms: summary.duration_ms,
                log: job.log.clone(),
                log_bytes: live.log_bytes,
                log_dropped_bytes: live.log_dropped_bytes,
                summary: Some(summary.clone()),
                observation: Some(observation),
                note: None,
            };
            live.finished = Some(status.clone());
            live.state = state;
            status
        };
        drop(log);

        record.state = state;
        record.finished_at_ms = Some(finished_at_ms);
        record.log_bytes = status.log_bytes;
        record.log_dropped_bytes = status.log_dropped_bytes;
        record.summary = Some(summary);
        let _ = self.inner.store.save(&record);

        let events = {
            let mut table = lock(&self.inner.table);
            table.live_total = table.live_total.saturating_sub(1);
            let retained = self.inner.config.finished_retained_per_session;
            let mut evicted = Vec::new();
            let events = match table.sessions.get_mut(&job.session) {
                Some(entry) => {
                    entry.live = entry.live.saturating_sub(1);
                    entry.finished.push_back(job.handle);
                    while entry.finished.len() > retained {
                        if let Some(old) = entry.finished.pop_front() {
                            evicted.push(old);
                        }
                    }
                    match &entry.events {
                        Some(tx) if !tx.is_closed() => Some(tx.clone()),
                        _ => {
                            entry.undelivered.push(status.clone());
                            None
                        }
                    }
                }
                None => None,
            };
            for old in evicted {
                table.jobs.remove(&old);
                self.inner.store.remove(old);
            }
            events
        };
        job.state_tx.send_replace(state);
        if let Some(events) = events {
            let _ = events
                .send(JobEvent::Finished {
                    status: Box::new(status),
                })
                .await;
        }
    }

    /// The job `job` of `session`, or the one answer given for anything else.
    fn find(&self, session: &SessionId, job: &str) -> Result<Arc<Job>, JobError> {
        self.find_where(job, |found| found.session == *session)
    }

    /// The job `job` if `visible` lets it be seen, or the one answer given for anything else.
    fn find_where(&self, job: &str, visible: impl Fn(&Job) -> bool) -> Result<Arc<Job>, JobError> {
        let unknown = || JobError::UnknownJob {
            handle: job.chars().take(64).collect(),
        };
        let handle = JobHandle::parse(job).ok_or_else(unknown)?;
        let table = lock(&self.inner.table);
        match table.jobs.get(&handle) {
            Some(found) if visible(found) => Ok(Arc::clone(found)),
            _ => Err(unknown()),
        }
    }

    /// Every session's jobs, newest first, at most `max`: what an operator oversees (the web
    /// console), never what a session's calls see.
    pub fn list_every_session(&self, max: usize) -> Vec<JobStatus> {
        let jobs: Vec<Arc<Job>> = lock(&self.inner.table).jobs.values().cloned().collect();
        let mut out: Vec<JobStatus> = jobs.iter().map(|j| j.status()).collect();
        out.sort_by_key(|s| std::cmp::Reverse(s.started_at_ms));
        out.truncate(max);
        out
    }

    /// [`JobManager::inspect`] of any session's job, for an operator (the web console).
    pub fn inspect_any_session(
        &self,
        job: &str,
        tail_lines: usize,
    ) -> Result<JobSnapshot, JobError> {
        let found = self.find_where(job, |_| true)?;
        let status = found.status();
        let (tail, lines) = found.tail(tail_lines.min(limits::TAIL_LINES_MAX));
        let usage = (!status.state.is_terminal()).then(|| usage_of(found.root_pid));
        Ok(JobSnapshot {
            status,
            tail,
            tail_lines: lines,
            usage,
        })
    }

    /// Status, sanitized output tail (at most [`limits::TAIL_LINES_MAX`] lines) and, while the job
    /// runs, CPU time, resident memory and thread count of its process tree.
    pub fn inspect(
        &self,
        session: &SessionId,
        job: &str,
        tail_lines: usize,
    ) -> Result<JobSnapshot, JobError> {
        let found = self.find(session, job)?;
        let status = found.status();
        let (tail, lines) = found.tail(tail_lines.min(limits::TAIL_LINES_MAX));
        let usage = (!status.state.is_terminal()).then(|| usage_of(found.root_pid));
        Ok(JobSnapshot {
            status,
            tail,
            tail_lines: lines,
            usage,
        })
    }

    /// Writes `data` to the job's stdin (pipe or terminal). Only newline and tab are accepted
    /// among control characters; at most [`limits::INPUT_BYTES_MAX`] bytes.
    pub async fn send_input(
        &self,
        session: &SessionId,
        job: &str,
        data: &[u8],
    ) -> Result<InputReceipt, JobError> {
        let found = self.find(session, job)?;
        if !found.interactive {
            return Err(JobError::NotInteractive);
        }
        let data = input::check(data)?;
        let mut writer = found.input.lock().await;
        let state = lock(&found.live).state;
        let Some(writer) = writer.as_mut().filter(|_| !state.is_terminal()) else {
            return Err(JobError::InputNotAccepted { state });
        };
        let write = async {
            match writer {
                InputWriter::Pipe(pipe) => {
                    pipe.write_all(data).await?;
                    pipe.flush().await
                }
                InputWriter::Tty(tty) => {
                    tty.write_all(data).await?;
                    tty.flush().await
                }
            }
        };
        match tokio::time::timeout(limits::INPUT_WRITE_TIMEOUT, write).await {
            Err(_) => {
                return Err(JobError::InputTimedOut {
                    waited_ms: limits::INPUT_WRITE_TIMEOUT.as_millis() as u64,
                });
            }
            Ok(Err(e)) => return Err(JobError::InputFailed(e.to_string())),
            Ok(Ok(())) => {}
        }
        found.input_epoch.fetch_add(1, Ordering::AcqRel);
        let mut live = lock(&found.live);
        if live.state == JobState::Suspended {
            found.set_state(&mut live, JobState::Running);
        }
        Ok(InputReceipt {
            bytes_written: data.len(),
            state: live.state,
        })
    }

    /// Tears the job's process tree down (SIGTERM, grace, SIGKILL) and returns its final status.
    /// A job already finished is returned as it is.
    pub async fn cancel(&self, session: &SessionId, job: &str) -> Result<JobStatus, JobError> {
        let found = self.find(session, job)?;
        found.cancel.notify_one();
        let bound = self.inner.config.policy.termination_grace
            + limits::KILL_CONFIRM_MAX
            + limits::POST_EXIT_DRAIN_MAX
            + Duration::from_secs(5);
        Ok(wait_terminal(&found, bound).await)
    }

    /// Waits until the job finishes or `timeout` passes (at most [`limits::WAIT_MAX`]) and
    /// returns its status either way.
    pub async fn wait(
        &self,
        session: &SessionId,
        job: &str,
        timeout: Duration,
    ) -> Result<JobStatus, JobError> {
        let found = self.find(session, job)?;
        Ok(wait_terminal(&found, timeout.min(limits::WAIT_MAX)).await)
    }

    /// Every job this session can see, oldest first.
    pub fn list(&self, session: &SessionId) -> Vec<JobStatus> {
        let jobs: Vec<Arc<Job>> = lock(&self.inner.table)
            .jobs
            .values()
            .filter(|j| j.session == *session)
            .cloned()
            .collect();
        let mut out: Vec<JobStatus> = jobs.iter().map(|j| j.status()).collect();
        out.sort_by_key(|s| s.started_at_ms);
        out
    }

    /// Cancels the session's live jobs, waits for them, and forgets the session: its jobs'
    /// records and logs are removed.
    pub async fn close_session(&self, session: &SessionId) {
        let jobs: Vec<Arc<Job>> = lock(&self.inner.table)
            .jobs
            .values()
            .filter(|j| j.session == *session)
            .cloned()
            .collect();
        self.cancel_all(&jobs).await;
        let mut table = lock(&self.inner.table);
        table.sessions.remove(session);
        for job in jobs {
            table.jobs.remove(&job.handle);
            self.inner.store.remove(job.handle);
        }
    }

    /// Cancels every live job and waits for each to finish.
    pub async fn shutdown(&self) {
        let jobs: Vec<Arc<Job>> = lock(&self.inner.table).jobs.values().cloned().collect();
        self.cancel_all(&jobs).await;
    }

    async fn cancel_all(&self, jobs: &[Arc<Job>]) {
        let bound = self.inner.config.policy.termination_grace
            + limits::KILL_CONFIRM_MAX
            + limits::POST_EXIT_DRAIN_MAX
            + Duration::from_secs(5);
        let waits = jobs
            .iter()
            .filter(|j| !j.state_tx.borrow().is_terminal())
            .map(|j| {
                j.cancel.notify_one();
                wait_terminal(j, bound)
            });
        futures::future::join_all(waits).await;
    }
}

async fn wait_terminal(job: &Job, bound: Duration) -> JobStatus {
    let mut rx = job.state_tx.subscribe();
    let _ = tokio::time::timeout(bound, rx.wait_for(|s| s.is_terminal())).await;
    job.status()
}

fn usage_of(root: i32) -> JobUsage {
    let ticks = crate::proc::ticks_per_second();
    let page = crate::proc::page_size();
    let mut usage = JobUsage::default();
    for pid in crate::proc::tree(root, 4096) {
        if let Some(s) = crate::proc::status(pid) {
            usage.cpu_ms += (s.cpu_ticks + s.children_cpu_ticks) * 1000 / ticks;
            usage.rss_bytes += s.rss_pages * page;
            usage.threads += u64::try_from(s.threads).unwrap_or(0);
            usage.processes += 1;
        }
    }
    usage
}

fn status_of_record(record: &JobRecord, log: PathBuf) -> JobStatus {
    JobStatus {
        job: record.job,
        state: record.state,
        command: record.command.clone(),
        started_at_ms: record.started_at_ms,
        finished_at_ms: record.finished_at_ms,
        elapsed_ms: record
            .finished_at_ms
            .map_or(0, |f| f.saturating_sub(record.started_at_ms)),
        log,
        log_bytes: record.log_bytes,
        log_dropped_bytes: record.log_dropped_bytes,
        summary: record.summary.clone(),
        observation: None,
        note: record.note.clone(),
    }
}

fn finished_job(record: &JobRecord, status: JobStatus) -> Job {
    let (state_tx, _) = watch::channel(record.state);
    Job {
        handle: record.job,
        session: record.session.clone(),
        command: record.command.clone(),
        started: None,
        started_at_ms: record.started_at_ms,
        log: status.log.clone(),
        root_pid: record.root_pid,
        interactive: false,
        live: Mutex::new(JobLive {
            state: record.state,
            tail: VecDeque::new(),
            log_bytes: record.log_bytes,
            log_dropped_bytes: record.log_dropped_bytes,
            finished: Some(status),
        }),
        state_tx,
        cancel: Notify::new(),
        input: tokio::sync::Mutex::new(None),
        input_epoch: AtomicU64::new(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_lines_returns_the_requested_count() {
        assert_eq!(last_lines("a\nb\nc\n", 2), ("b\nc\n".to_owned(), 2));
        assert_eq!(last_lines("a\nb\nc", 5), ("a\nb\nc".to_owned(), 3));
        assert_eq!(last_lines("a\nb\n", 0), (String::new(), 0));
    }

    #[test]
    fn handles_round_trip_and_reject_lookalikes() {
        let handle = JobHandle::random();
        assert_eq!(JobHandle::parse(&handle.to_string()), Some(handle));
        assert_eq!(JobHandle::parse("job_123"), None);
        assert_eq!(JobHandle::parse(&handle.to_string().to_uppercase()), None);
        assert_eq!(JobHandle::parse("12345"), None);
    }
}
