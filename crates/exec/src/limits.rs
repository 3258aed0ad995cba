//! Named limits of supervised processes and jobs.
//!
//! Every bound this crate enforces is one of these constants (or a configuration value whose
//! default is one of them). Reaching a bound produces a structured outcome — a typed error, an
//! ending recorded in the report, a tombstone counting dropped bytes — never a hang, a panic or
//! silent loss.

use std::time::Duration;

/// Default per-command wall-clock timeout when the caller names none.
pub const TIMEOUT_DEFAULT: Duration = Duration::from_secs(120);
/// Longest accepted per-command timeout (24 hours): a longer run belongs in a background job.
pub const TIMEOUT_MAX: Duration = Duration::from_secs(24 * 60 * 60);
/// Time between SIGTERM to a process group and the SIGKILL that follows.
pub const TERMINATION_GRACE_DEFAULT: Duration = Duration::from_secs(3);
/// After SIGKILL, how long teardown keeps sweeping for survivors (processes in uninterruptible
/// sleep can take a moment to die) before reporting them by count.
pub const KILL_CONFIRM_MAX: Duration = Duration::from_secs(5);
/// After the first process exits and every descendant is gone, how long the drains wait for the
/// pipes to reach end-of-file before they are closed and the closure is reported.
pub const POST_EXIT_DRAIN_MAX: Duration = Duration::from_secs(2);

/// Cumulative stdout + stderr bytes after which the pipes are closed and the group is killed.
pub const OUTPUT_CEILING_BYTES_DEFAULT: u64 = 256 * 1024 * 1024;
/// Bytes of the observation budget set aside for the supervision note (timeout, cancel, output
/// ceiling) appended after the shaper's text, so the whole stays within the budget.
pub const SUPERVISION_NOTE_BYTES_MAX: usize = 320;
/// Size of one read from a child's pipe or pseudo-terminal.
pub const READ_CHUNK_BYTES: usize = 64 * 1024;

/// Most argv entries of one command.
pub const ARGV_ENTRIES_MAX: usize = 4096;
/// Most bytes of argv (all entries) or of a shell script.
pub const ARGV_BYTES_MAX: usize = 256 * 1024;
/// Most explicit environment variables one command may set.
pub const ENV_ENTRIES_MAX: usize = 256;
/// Most bytes of explicit environment names and values together.
pub const ENV_BYTES_MAX: usize = 64 * 1024;

/// Default soft CPU-time limit of a supervised process tree's processes, in seconds.
pub const CPU_SECONDS_DEFAULT: u64 = 3600;
/// Default limit on open file descriptors per process.
pub const OPEN_FILES_DEFAULT: u64 = 1024;
/// Default RLIMIT_NPROC. The kernel counts every process of the real user id against it, not
/// only the job's, and does not enforce it for privileged users.
pub const PROCESSES_DEFAULT: u64 = 4096;

/// Default most live jobs (not yet finished) of one session.
pub const JOBS_PER_SESSION_DEFAULT: usize = 64;
/// Default most live jobs across all sessions of one job manager.
pub const JOBS_TOTAL_DEFAULT: usize = 512;
/// Default most finished jobs one session keeps for inspection; older ones are forgotten first.
pub const FINISHED_JOBS_RETAINED_DEFAULT: usize = 256;
/// Default most bytes of a job's output written to its log file.
pub const SPILL_BYTES_DEFAULT: u64 = 64 * 1024 * 1024;
/// Bytes of recent combined output each job keeps in memory for `inspect`.
pub const TAIL_BYTES_MAX: usize = 64 * 1024;
/// Most lines `inspect` returns.
pub const TAIL_LINES_MAX: usize = 1000;
/// Largest `send_input` payload.
pub const INPUT_BYTES_MAX: usize = 4096;
/// How long `send_input` waits for a full pipe or terminal to accept the bytes.
pub const INPUT_WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Interval between checks whether an interactive job is blocked reading its input. There is
/// no kernel event for "a reader is waiting", so interactive jobs (only those) are probed.
pub const INPUT_PROBE_INTERVAL: Duration = Duration::from_millis(100);
/// Capacity of one session's event channel. A full channel delays the job that reports, never
/// drops its event.
pub const SESSION_EVENTS_DEFAULT: usize = 256;
/// Longest accepted session id.
pub const SESSION_ID_BYTES_MAX: usize = 256;
/// Longest `wait` a caller may ask for.
pub const WAIT_MAX: Duration = Duration::from_secs(24 * 60 * 60);

/// Port of the egress listener inside a confined process's own network namespace (the proxy
/// variables point at `127.0.0.1:` this).
pub const SANDBOX_EGRESS_PORT: u16 = 3128;
/// Pending connections the egress listener queues before the proxy accepts them.
pub const SANDBOX_EGRESS_BACKLOG: i32 = 128;
/// Options of the empty read-only tmpfs that masks a protected directory.
pub const SANDBOX_TMPFS_MASK_OPTIONS: &std::ffi::CStr = c"size=4k,nr_inodes=1,mode=000";
/// Name prefix of a confined process's private scratch directory (its `HOME` and `TMPDIR`),
/// created in ring0's temporary directory and removed when the process ends.
pub const SANDBOX_SCRATCH_PREFIX: &str = "ring0-sandbox-";
