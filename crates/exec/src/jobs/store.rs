//! Job records on disk, so that a restart forgets nothing.
//!
//! The state directory holds `lock` (an exclusive `flock`, so two ring0 instances never share
//! and kill each other's jobs), and under `jobs/` one `<handle>.json` record and one
//! `<handle>.log` per job. A record is written when the job starts and again when it ends, each
//! time to a temporary file renamed over the old one, so a crash leaves the old record or the new
//! one, never half of either. The directory is created private (mode 0700): records hold handles.
//!
//! At startup every record still marked live belongs to a ring0 that died without finishing it:
//! the processes it left are killed (those carrying the job's environment token, and those
//! sharing its process group or session with one that does; only if they started after the job
//! under the same boot) and the record becomes KILLED, with a note and its log intact. An edited
//! record cannot point the kill at an unrelated process: none carries the token.

use crate::error::JobError;
use crate::jobs::types::{JobHandle, JobState, SessionId};
use crate::proc::{self, ProcStatus};
use crate::run::RunSummary;
use crate::spec::SUPERVISION_TOKEN_ENV;
use serde::{Deserialize, Serialize};
use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// One job as recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct JobRecord {
    pub job: JobHandle,
    pub session: SessionId,
    pub command: String,
    pub state: JobState,
    pub started_at_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at_ms: Option<u64>,
    pub root_pid: i32,
    pub root_start_ticks: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    pub token: String,
    #[serde(default)]
    pub log_bytes: u64,
    #[serde(default)]
    pub log_dropped_bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<RunSummary>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The state directory, locked for this process.
#[derive(Debug)]
pub(crate) struct Store {
    jobs_dir: PathBuf,
    /// Held open for the lock's lifetime.
    _lock: File,
}

fn io_error(dir: &Path, what: &str, e: impl std::fmt::Display) -> JobError {
    JobError::StateDir {
        dir: dir.to_path_buf(),
        reason: format!("{what}: {e}"),
    }
}

impl Store {
    pub(crate) fn open(state_dir: &Path) -> Result<Self, JobError> {
        let jobs_dir = state_dir.join("jobs");
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&jobs_dir)
            .map_err(|e| io_error(state_dir, "creating", e))?;
        let lock = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(state_dir.join("lock"))
            .map_err(|e| io_error(state_dir, "opening the lock file", e))?;
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive).map_err(
            |_| {
                io_error(
                    state_dir,
                    "locking",
                    "another ring0 process uses this state directory",
                )
            },
        )?;
        Ok(Self {
            jobs_dir,
            _lock: lock,
        })
    }

    pub(crate) fn log_path(&self, job: JobHandle) -> PathBuf {
        self.jobs_dir.join(format!("{job}.log"))
    }

    fn record_path(&self, job: JobHandle) -> PathBuf {
        self.jobs_dir.join(format!("{job}.json"))
    }

    /// Writes `record` atomically (temporary file, then rename).
    pub(crate) fn save(&self, record: &JobRecord) -> Result<(), JobError> {
        let path = self.record_path(record.job);
        let tmp = path.with_extension("json.tmp");
        let bytes = serde_json::to_vec_pretty(record)
            .map_err(|e| io_error(&self.jobs_dir, "encoding a record", e))?;
        let mut file = fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| io_error(&self.jobs_dir, "writing a record", e))?;
        // No fsync: a record must survive ring0 dying, which the page cache covers; a machine
        // crash also ends every job (and changes the boot id the record is checked against).
        file.write_all(&bytes)
            .map_err(|e| io_error(&self.jobs_dir, "writing a record", e))?;
        fs::rename(&tmp, &path).map_err(|e| io_error(&self.jobs_dir, "renaming a record", e))
    }

    /// Removes a job's record and log.
    pub(crate) fn remove(&self, job: JobHandle) {
        let _ = fs::remove_file(self.record_path(job));
        let _ = fs::remove_file(self.log_path(job));
    }

    /// Every readable record. Unreadable files are skipped and named in the second list.
    pub(crate) fn load(&self) -> (Vec<JobRecord>, Vec<PathBuf>) {
        let mut records = Vec::new();
        let mut unreadable = Vec::new();
        let Ok(entries) = fs::read_dir(&self.jobs_dir) else {
            return (records, unreadable);
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            match fs::read(&path)
                .ok()
                .and_then(|b| serde_json::from_slice::<JobRecord>(&b).ok())
            {
                Some(record) => records.push(record),
                None => unreadable.push(path),
            }
        }
        (records, unreadable)
    }
}

/// Shortest supervision token a record may name; a shorter one (an edited record) identifies
/// no process.
const TOKEN_CHARS_MIN: usize = 16;

/// Live processes a job of a previous run left behind. A record on disk is not trusted to name
/// them: a process is the job's only if it carries the job's supervision token in its
/// environment (set by ring0 when it started the job), or if it shares the job's process group
/// or session with one that does — a pid, group or start time in the record alone never makes an
/// unrelated process a target.
fn leftovers(record: &JobRecord, boot_id: Option<&str>) -> Vec<ProcStatus> {
    if record.boot_id.as_deref() != boot_id || boot_id.is_none() {
        return Vec::new();
    }
    if record.token.len() < TOKEN_CHARS_MIN {
        return Vec::new();
    }
    let me = rustix::process::getpid().as_raw_nonzero().get();
    let candidates: Vec<ProcStatus> = proc::all()
        .into_values()
        .filter(|p| p.pid != me && !p.is_zombie() && p.start_ticks >= record.root_start_ticks)
        .collect();
    let marked: Vec<&ProcStatus> = candidates
        .iter()
        .filter(|p| proc::has_env_marker(p.pid, SUPERVISION_TOKEN_ENV, &record.token))
        .collect();
    let group_verified = marked
        .iter()
        .any(|p| p.pgrp == record.root_pid || p.session == record.root_pid);
    let marked_pids: Vec<i32> = marked.iter().map(|p| p.pid).collect();
    candidates
        .iter()
        .filter(|p| {
            marked_pids.contains(&p.pid)
                || (group_verified && (p.pgrp == record.root_pid || p.session == record.root_pid))
        })
        .copied()
        .collect()
}

/// Kills what a live record's job left running and marks it KILLED.
pub(crate) async fn settle_interrupted(
    store: &Store,
    record: &mut JobRecord,
    grace: Duration,
    now_ms: u64,
) -> Result<(), JobError> {
    let boot = proc::boot_id();
    let snapshot = record.clone();
    let boot_for_find = boot.clone();
    let report = crate::teardown::terminate(
        move || leftovers(&snapshot, boot_for_find.as_deref()),
        None,
        grace,
    )
    .await;
    record.state = JobState::Killed;
    record.finished_at_ms = Some(now_ms);
    record.note = Some(format!(
        "ring0 restarted while this job was running; {} leftover processes were killed",
        report.processes_signalled
    ));
    if let Ok(mut log) = fs::OpenOptions::new()
        .append(true)
        .open(store.log_path(record.job))
    {
        let _ = writeln!(log, "\n[ring0: supervisor restarted; job killed]");
    }
    store.save(record)
}
