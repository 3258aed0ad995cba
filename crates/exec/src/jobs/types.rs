//! The values of the job API: handles, session ids, states, receipts, snapshots, events.

use crate::error::JobError;
use crate::limits;
use crate::run::RunSummary;
use crate::supervise::{Ending, ExitReport};
use crate::teardown::TeardownReport;
use ring0_core::Observation;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::PathBuf;

/// An opaque job handle: 128 random bits, shown as `job_` and 32 hex digits. Never a pid.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct JobHandle(u128);

impl JobHandle {
    pub(crate) fn random() -> Self {
        Self(uuid::Uuid::new_v4().as_u128())
    }

    /// Parses the display form. Anything else is `None` (and is answered as an unknown job).
    pub fn parse(text: &str) -> Option<Self> {
        let hex = text.strip_prefix("job_")?;
        if hex.len() != 32
            || !hex
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        {
            return None;
        }
        u128::from_str_radix(hex, 16).ok().map(Self)
    }
}

impl fmt::Display for JobHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "job_{:032x}", self.0)
    }
}

impl fmt::Debug for JobHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl Serialize for JobHandle {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for JobHandle {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Self::parse(&text).ok_or_else(|| serde::de::Error::custom("not a job handle"))
    }
}

/// The session a job belongs to, as the host names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SessionId(String);

impl SessionId {
    /// A session id: 1 to [`limits::SESSION_ID_BYTES_MAX`] bytes of printable ASCII.
    pub fn new(id: impl Into<String>) -> Result<Self, JobError> {
        let id = id.into();
        if id.is_empty() {
            return Err(JobError::SessionIdInvalid { reason: "empty" });
        }
        if id.len() > limits::SESSION_ID_BYTES_MAX {
            return Err(JobError::SessionIdInvalid { reason: "too long" });
        }
        if !id.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(JobError::SessionIdInvalid {
                reason: "only printable ASCII without spaces is allowed",
            });
        }
        Ok(Self(id))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The life of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum JobState {
    /// The process was created; supervision has not started yet.
    Spawned,
    /// Running; no output yet (or none since input was last sent).
    Running,
    /// Running and producing output.
    Streaming,
    /// Blocked reading its input (pipe or terminal): waiting for `send_input`.
    Suspended,
    /// Exited by itself, with whatever exit code.
    Completed,
    /// Could not be supervised to the end, or died by a signal ring0 did not send.
    Failed,
    /// Torn down by `cancel`, by the output ceiling, by closing its session, or found running
    /// after a ring0 restart.
    Killed,
    /// Torn down at its deadline.
    TimedOut,
}

impl JobState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Spawned => "SPAWNED",
            Self::Running => "RUNNING",
            Self::Streaming => "STREAMING",
            Self::Suspended => "SUSPENDED",
            Self::Completed => "COMPLETED",
            Self::Failed => "FAILED",
            Self::Killed => "KILLED",
            Self::TimedOut => "TIMED_OUT",
        }
    }

    /// No further transition can leave this state.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::Completed | Self::Failed | Self::Killed | Self::TimedOut
        )
    }

    /// The terminal state a supervised run ends in.
    /// A root that exited by itself through a signal was not signalled by ring0 (teardown only
    /// follows another ending, or reaches leftovers after the root exited): it crashed.
    pub(crate) fn from_ending(ending: Ending, exit: Option<ExitReport>) -> Self {
        match ending {
            Ending::Exited => match exit {
                Some(ExitReport {
                    signal: Some(_), ..
                }) => Self::Failed,
                Some(_) => Self::Completed,
                None => Self::Failed,
            },
            Ending::TimedOut => Self::TimedOut,
            Ending::Cancelled | Ending::OutputCeiling => Self::Killed,
            Ending::SupervisionFailed => Self::Failed,
        }
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Returned by `start` at once: the job is running (or already finished) out of band.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobReceipt {
    pub job: JobHandle,
    pub state: JobState,
    /// The job's log file: its combined output as it arrives, up to the spill limit.
    pub log: PathBuf,
    pub started_at_ms: u64,
    /// How the command runs (its key on the wire is `execution_mode`, as it always was).
    #[serde(rename = "execution_mode")]
    pub run_mode: RunMode,
}

/// How a command runs: a background job returns a receipt at once and finishes as an event.
/// (Not the kernel's `SchedulingMode`, which orders the calls of a round.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunMode {
    Background,
}

/// Where a job stands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobStatus {
    pub job: JobHandle,
    pub state: JobState,
    pub command: String,
    pub started_at_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at_ms: Option<u64>,
    pub elapsed_ms: u64,
    pub log: PathBuf,
    /// Bytes written to the log.
    pub log_bytes: u64,
    /// Output bytes not written to the log because the spill limit was reached.
    #[serde(default)]
    pub log_dropped_bytes: u64,
    /// The run's envelope, once finished.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub summary: Option<RunSummary>,
    /// The shaped observation of the whole run, once finished.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observation: Option<Observation>,
    /// Why a job ended without its own exit being observed (a restart).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl JobStatus {
    pub fn teardown(&self) -> Option<TeardownReport> {
        self.summary.as_ref().and_then(|s| s.teardown)
    }
}

/// Resource use of a live job's process tree, from `/proc`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobUsage {
    /// User + system CPU of the live processes and of the children they have reaped.
    pub cpu_ms: u64,
    pub rss_bytes: u64,
    pub threads: u64,
    pub processes: u64,
}

/// What `inspect` returns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobSnapshot {
    pub status: JobStatus,
    /// The last lines of combined output, sanitized.
    pub tail: String,
    pub tail_lines: usize,
    /// Present while the job runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<JobUsage>,
}

/// Answer to `send_input`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputReceipt {
    pub bytes_written: usize,
    pub state: JobState,
}

/// Pushed on the session's event stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum JobEvent {
    /// The job is blocked reading its input.
    InputRequested { job: JobHandle, tail: String },
    /// The job reached a terminal state. Exactly one per job.
    Finished { status: Box<JobStatus> },
}
