//! Errors: what a caller did wrong or what the machine refused, each with the context needed
//! to act on it.

use crate::jobs::JobState;
use std::path::PathBuf;
use thiserror::Error;

/// A command could not be prepared or started. Nothing ran (the process was never created, or
/// `execve` failed before the program's first instruction).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ExecError {
    #[error("argv is empty: name a program to run")]
    EmptyArgv,
    #[error("argv[0] is empty: name a program to run")]
    EmptyProgram,
    #[error("argv too large: {entries} entries, {bytes} bytes")]
    ArgvTooLarge { entries: usize, bytes: usize },
    #[error("argument {index} contains a NUL byte, which no program can receive")]
    NulInArgument { index: usize },
    #[error("a shell command line was requested but shell use is not allowed; pass explicit argv")]
    ShellNotAllowed,
    #[error("workspace root {root:?} is unusable: {reason}")]
    WorkspaceRootUnusable { root: PathBuf, reason: String },
    #[error("working directory {cwd:?} is unusable: {reason}")]
    CwdUnusable { cwd: PathBuf, reason: String },
    #[error(
        "working directory {cwd:?} resolves to {resolved:?}, outside the workspace root {root:?}"
    )]
    CwdOutsideWorkspace {
        cwd: PathBuf,
        resolved: PathBuf,
        root: PathBuf,
    },
    #[error("environment variable name {name:?} is invalid (empty, or contains '=' or NUL)")]
    EnvNameInvalid { name: String },
    #[error("environment variable {name:?} is reserved for supervision and cannot be set")]
    EnvNameReserved { name: String },
    #[error("environment variable {name:?} has a NUL byte in its value")]
    EnvValueInvalid { name: String },
    #[error("too much explicit environment: {entries} variables, {bytes} bytes")]
    EnvTooLarge { entries: usize, bytes: usize },
    #[error("timeout must be greater than zero")]
    TimeoutZero,
    #[error("timeout {timeout_ms} ms exceeds the maximum of {max_ms} ms; start a background job")]
    TimeoutTooLong { timeout_ms: u64, max_ms: u64 },
    #[error("interactive input needs a background job; run this command with stdin null")]
    InteractiveNeedsJob,
    #[error("could not start {program:?}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("shaping configuration: {0}")]
    ShapeConfig(String),
    #[error("could not set up supervision: {0}")]
    Setup(String),
    /// The sandbox could not confine the process, so it was not started.
    #[error("{0}")]
    Sandbox(#[from] crate::sandbox::SandboxError),
}

/// A job operation was refused.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum JobError {
    /// No job with this handle is visible to this session. A handle of another session's job
    /// gets exactly this answer, so handles reveal nothing across sessions.
    #[error("unknown job {handle:?}")]
    UnknownJob { handle: String },
    #[error("session id is invalid: {reason}")]
    SessionIdInvalid { reason: &'static str },
    #[error("session {session:?} is already open")]
    SessionAlreadyOpen { session: String },
    #[error("session is not open; open it before starting jobs")]
    SessionNotOpen,
    #[error("this session already has {running} live jobs (limit {limit})")]
    SessionJobLimit { running: usize, limit: usize },
    #[error("ring0 already supervises {running} live jobs (limit {limit})")]
    TotalJobLimit { running: usize, limit: usize },
    #[error("job is {state}; it takes no input")]
    InputNotAccepted { state: JobState },
    #[error("job was started without input (stdin is /dev/null); start it with stdin pipe or tty")]
    NotInteractive,
    #[error("input rejected: {reason}")]
    InputRejected { reason: String },
    #[error("input not accepted within {waited_ms} ms: the job is not reading")]
    InputTimedOut { waited_ms: u64 },
    #[error("input could not be written: {0}")]
    InputFailed(String),
    #[error("{0}")]
    Exec(#[from] ExecError),
    #[error("state directory {dir:?}: {reason}")]
    StateDir { dir: PathBuf, reason: String },
}
