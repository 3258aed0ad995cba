//! Supervised processes and background jobs.
//!
//! This crate owns every process ring0 starts on a tool's behalf: it spawns it under rules
//! ([`ExecPolicy`]: explicit argv unless a shell is allowed, an allow-listed environment, a
//! working directory inside the workspace, stdin from `/dev/null` unless interactive, a new
//! session and process group, a parent-death signal, resource limits), drains its output into a
//! bounded shaper as it arrives, enforces a wall-clock deadline and a cumulative output ceiling,
//! and tears the whole tree down — including descendants that left the group or double-forked —
//! with SIGTERM, a grace period and SIGKILL. ring0 makes itself the child subreaper, so no
//! process a call started outlives it.
//!
//! Two entry points:
//! - [`run_command`]: one supervised run, returning the shaped [`Observation`] and a
//!   [`RunSummary`] (the path of a tool whose implementation is a command, and of `ring0 run`);
//! - [`JobManager`]: background jobs per session behind opaque handles, with `start` (a receipt
//!   at once), `inspect`, `send_input`, `cancel`, `wait`, completion and input-request events,
//!   and records that survive a restart.
//!
//! It must never expose a pid to a caller, inherit the host environment wholesale, run a shell
//! unless asked and allowed, or leave a process running after its run or job is over.
//!
//! ```no_run
//! # async fn demo() -> Result<(), ring0_exec::ExecError> {
//! use ring0_exec::{CommandSpec, ExecPolicy, run_command};
//! use std::time::Duration;
//!
//! let policy = ExecPolicy::new("/path/to/workspace");
//! let spec = CommandSpec::argv(["cargo", "check"]).timeout(Duration::from_secs(300));
//! let report = run_command(&policy, &spec, std::future::pending()).await?;
//! println!("{}", report.observation.text);
//! # Ok(()) }
//! ```
//!
//! Linux only: supervision reads `/proc` and uses `prctl`.

mod capture;
mod cgroup;
mod error;
mod hooks;
mod jobs;
pub mod limits;
mod probe;
mod proc;
mod reaper;
mod run;
pub mod sandbox;
mod spawn;
mod spec;
mod supervise;
mod teardown;
mod vfork;

pub use cgroup::{LeftoverReport, settle_leftover_runs};
pub use error::{ExecError, JobError};
pub use jobs::{
    InputReceipt, JOB_TIMEOUT_DEFAULT, JobEvent, JobEvents, JobHandle, JobManager, JobReceipt,
    JobSnapshot, JobState, JobStatus, JobUsage, JobsConfig, Recovery, RunMode, SessionId,
};
pub use ring0_core::Observation;
pub use ring0_shape::{ShapeConfig, Stream};
pub use run::{RunReport, RunSummary, run_command, run_prepared};
pub use sandbox::{Sandbox, SandboxError, SandboxProfile};
pub use spec::{
    CommandLine, CommandSpec, ENV_ALLOW_DEFAULT, ExecPolicy, PreparedCommand, ResourceLimits,
    SUPERVISION_TOKEN_ENV, StdinMode, resolve_cwd,
};
pub use supervise::{Ending, ExitReport};
pub use teardown::TeardownReport;
