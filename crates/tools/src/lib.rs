//! ring0's built-in workspace tools.
//!
//! | tool | effect | authority | settlement |
//! | --- | --- | --- | --- |
//! | `read_file`, `list_dir`, `glob`, `search` | nullipotent | A0 | — |
//! | `write_file` | idempotent, conflict key `file:{path}` | A1 | probe (content hash) |
//! | `apply_patch` | non-idempotent | A1 | probe (every touched file's hash) |
//! | `shell` | non-idempotent, strategy unknown (runs alone) | A1 in the OS sandbox, else A2 (configurable) | none |
//! | `job_inspect`, `job_wait` | nullipotent | A0 | — |
//! | `job_send_input` | non-idempotent | as `shell` | none |
//! | `job_cancel` | idempotent | A1 | probe (job finished) |
//! | `read_spill` | nullipotent | A0 | — |
//!
//! Before `write_file` and `apply_patch` change a file, what it held is recorded in the
//! session's workspace checkpoint (`ToolsConfig::checkpoint_dir`, by default
//! `state_dir/checkpoints`; see `ring0-checkpoint`), and what they left after; a mutation whose
//! checkpoint cannot be recorded is refused. [`Workspace::checkpoints`] is the store a command
//! runner snapshots the tree with before a contained command.
//!
//! A cut `shell` or job output keeps its whole stream in the spill store (`ToolsConfig::
//! spill_dir`), its handle sealed for the calling session; `read_spill` pages it back.
//!
//! Every file access goes through the [`sandbox`]: directory handles opened once at the roots
//! the configuration grants, every path resolved beneath them by the kernel at the moment of use,
//! and ring0's own files ([`sandbox::ProtectedPaths`]: its state directory, configuration and lock
//! file) refused to every tool as `protected_path`, whatever the roots grant.
//! Listings are paginated with signed cursors, at most [`page::PAGE_ENTRIES_MAX`] entries a page.
//!
//! ```no_run
//! use ring0_core::Authority;
//! use ring0_kernel::{GrantTable, Kernel, SessionConfig};
//! use ring0_tools::{ToolsConfig, builtin_tools};
//! use std::sync::Arc;
//!
//! let config = ToolsConfig::new("/srv/project", "/var/lib/ring0/project", vec![0x5a; 32]);
//! let mut kernel = Kernel::builder();
//! for (spec, tool) in builtin_tools(&config)? {
//!     kernel = kernel.tool(spec, tool)?;
//! }
//! let kernel = kernel
//!     .authorizer(Arc::new(GrantTable::allow(&["read_file", "search"], Authority::A0)))
//!     .build();
//! let session = kernel.open_session(SessionConfig::new("user:42"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! This crate must never touch a file by a path string outside the sandbox, follow a symlink out
//! of a root, or run a command except through `ring0-exec`. Tools are reached only through the
//! kernel: [`builtin_tools`] returns specs and executors for `KernelBuilder::tool`.

// `ToolError` is the kernel's executor error, returned once per call; boxing it in every helper
// would only add an allocation to the error path and conversions at every boundary.
#![allow(clippy::result_large_err)]

pub mod files;
mod job_records;
pub mod page;
pub mod patch;
pub mod sandbox;
pub mod search;
pub mod shell;
pub mod spill;
pub mod walk;

use ring0_checkpoint::Checkpoints;
use ring0_core::{Authority, ToolSpec};
use ring0_exec::{ExecPolicy, JobsConfig};
use ring0_kernel::{Tool, ToolError};
use ring0_shape::cursor::{CURSOR_TTL_DEFAULT, CursorSigner};
use sandbox::Sandbox;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::path::PathBuf;
use std::sync::Arc;

pub use files::{Glob, ListDir, ReadFile, WriteFile};
pub use patch::ApplyPatch;
pub use search::Search;
pub use shell::{
    EgressOrigin, EgressProxyFor, GrantProfiles, JobOp, JobTool, ProfileFor, SANDBOX_PROFILE_ARG,
    Shell, ShellConfig,
};
pub use spill::ReadSpill;

/// Tools whose every effect stays inside the workspace sandbox (the policy may run these at A1).
pub const SANDBOXED_TOOLS: &[&str] = &["write_file", "apply_patch", "job_cancel"];
/// The tool and argument that carry a shell command string (refused unless a grant allows it).
pub const SHELL_STRING_ARG: (&str, &str) = ("shell", "command");
/// Default number of threads `search` uses.
pub const SEARCH_WORKERS_DEFAULT: usize = 2;

/// What the tools are configured with.
#[derive(Debug, Clone)]
pub struct ToolsConfig {
    /// The workspace: relative paths start here; commands run here.
    pub workspace: PathBuf,
    /// Roots that may be read (relative to the workspace or absolute).
    pub read_roots: Vec<PathBuf>,
    /// Roots that may be written (and read).
    pub write_roots: Vec<PathBuf>,
    /// Key of the pagination cursors (at least 32 random bytes; keep it across restarts so
    /// cursors stay valid).
    pub cursor_key: Vec<u8>,
    /// Bytes of file text one `read_file` result carries at most (JSON-escaped size).
    pub read_text_bytes_max: usize,
    pub search_workers: usize,
    pub shell: ShellConfig,
    /// ring0's own paths no tool may touch, whatever the roots grant (by default the state
    /// directory; a front end adds its configuration and lock files).
    pub protected: sandbox::ProtectedPaths,
    /// The spill store cut outputs are kept in (by default `state_dir/spill`); `None` keeps
    /// nothing and registers no `read_spill`.
    pub spill_dir: Option<PathBuf>,
    /// Where workspace checkpoints are kept (by default `state_dir/checkpoints`); `None`
    /// records none.
    pub checkpoint_dir: Option<PathBuf>,
}

impl ToolsConfig {
    /// The workspace readable and writable, state under `state_dir`.
    pub fn new(
        workspace: impl Into<PathBuf>,
        state_dir: impl Into<PathBuf>,
        cursor_key: Vec<u8>,
    ) -> Self {
        let state_dir = state_dir.into();
        let protected = sandbox::ProtectedPaths {
            files: Vec::new(),
            dirs: vec![state_dir.clone()],
        };
        Self {
            protected,
            spill_dir: Some(state_dir.join("spill")),
            checkpoint_dir: Some(state_dir.join(ring0_checkpoint::CHECKPOINTS_DIR)),
            workspace: workspace.into(),
            read_roots: vec![PathBuf::from(".")],
            write_roots: vec![PathBuf::from(".")],
            cursor_key,
            read_text_bytes_max: files::READ_TEXT_BYTES_DEFAULT,
            search_workers: SEARCH_WORKERS_DEFAULT,
            shell: ShellConfig {
                authority: Authority::A2,
                allow_command_string: true,
                env_allow: ring0_exec::ENV_ALLOW_DEFAULT
                    .iter()
                    .map(|s| s.to_string())
                    .collect(),
                jobs_dir: state_dir.join("jobs"),
                sandbox: Some(ring0_exec::SandboxProfile::workspace()),
                egress_proxy: None,
                profiles: std::collections::BTreeMap::new(),
                profile_for: None,
            },
        }
    }
}

/// Why the tools could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ToolsError {
    #[error("workspace roots: {0}")]
    Roots(std::io::Error),
    #[error("cursor key: {0}")]
    Cursor(String),
    #[error("{0}")]
    Spill(#[from] ring0_shape::SpillError),
    #[error("checkpoints: {0}")]
    Checkpoint(#[from] ring0_checkpoint::CheckpointError),
}

/// What every file tool shares.
pub struct Workspace {
    pub sandbox: Sandbox,
    pub(crate) cursors: CursorSigner,
    pub(crate) read_text_bytes_max: usize,
    pub(crate) search_workers: usize,
    checkpoints: Option<Arc<Checkpoints>>,
}

impl Workspace {
    pub fn open(config: &ToolsConfig) -> Result<Self, ToolsError> {
        let sandbox = Sandbox::open(&config.workspace, &config.read_roots, &config.write_roots)
            .map_err(ToolsError::Roots)?
            .protect(config.protected.clone());
        let cursors = CursorSigner::new(&config.cursor_key, CURSOR_TTL_DEFAULT)
            .map_err(|e| ToolsError::Cursor(e.to_string()))?;
        let checkpoints = match &config.checkpoint_dir {
            Some(dir) => {
                let mut skipped = config.protected.dirs.clone();
                skipped.extend(config.protected.files.iter().cloned());
                let store = Checkpoints::open(dir, sandbox.workspace())?.skip(&skipped);
                Some(Arc::new(store))
            }
            None => None,
        };
        Ok(Self {
            sandbox,
            cursors,
            read_text_bytes_max: config.read_text_bytes_max.max(1024),
            search_workers: config.search_workers.clamp(1, 16),
            checkpoints,
        })
    }

    /// The workspace's checkpoint store, when checkpoints are kept: a command runner calls
    /// `snapshot_tree` before a contained command and `after_tree` after it.
    pub fn checkpoints(&self) -> Option<&Arc<Checkpoints>> {
        self.checkpoints.as_ref()
    }

    /// Records what the paths (as results show them) hold in the session's checkpoint, before
    /// a mutation changes them. Paths outside the workspace (absolute) are not checkpointed.
    /// Failing to record refuses the mutation: nothing was changed.
    pub(crate) fn checkpoint_before(&self, scope: &str, shown: &[String]) -> Result<(), ToolError> {
        let Some(store) = &self.checkpoints else {
            return Ok(());
        };
        let inside = workspace_paths(shown);
        if inside.is_empty() {
            return Ok(());
        }
        store.before(scope, &inside).map(drop).map_err(|e| {
            ToolError::not_applied(format!(
                "the workspace checkpoint could not be recorded, so nothing was changed: {e}"
            ))
        })
    }

    /// Records what the paths hold after a mutation, as ring0 left them. A failure here only
    /// means a later restore sees these paths as changed outside ring0 and asks for `--force`;
    /// the mutation itself has happened and is reported as such.
    pub(crate) fn checkpoint_after(&self, shown: &[String]) {
        if let Some(store) = &self.checkpoints {
            let _ = store.after(&workspace_paths(shown));
        }
    }
}

/// The paths results show relative to the workspace (the others are absolute).
fn workspace_paths(shown: &[String]) -> Vec<&str> {
    shown
        .iter()
        .map(String::as_str)
        .filter(|p| !p.starts_with('/'))
        .collect()
}

/// A tool's spec and executor, as `KernelBuilder::tool` takes them.
pub type ToolEntry = (ToolSpec, Arc<dyn Tool>);

/// The end of a client's session, for the background jobs its calls started: a front end that
/// knows when a session ends (an MCP HTTP session deleted or dropped) tells the jobs here.
#[derive(Clone)]
pub struct JobSessions {
    jobs: Arc<shell::Jobs>,
}

impl JobSessions {
    /// Cancels the live background jobs of the session of `scope` (the kernel session's
    /// scope), except those started with `detached: true`.
    pub async fn end(&self, scope: &str) {
        self.jobs.end_scope(scope).await;
    }

    /// Opens the job table now, which settles what an earlier ring0 left in it (a job recorded
    /// running is killed, by its supervision token, and recorded KILLED): a front end that
    /// serves for long calls this at start instead of leaving it to the first job call. The
    /// error says why the table could not be opened (another ring0 holds it), as the first
    /// job call would.
    pub async fn settle_leftovers(&self) -> Result<(), String> {
        self.jobs.manager().await.map(|_| ()).map_err(|e| e.message)
    }

    /// The background jobs of the session of `scope` (the kernel session's scope), newest
    /// first, at most `max`: for the front end that opened that session.
    pub async fn of_scope(
        &self,
        scope: &str,
        max: usize,
    ) -> Result<Vec<ring0_exec::JobStatus>, String> {
        let manager = self.jobs.manager().await.map_err(|e| e.message)?;
        let Some(session) = shell::scope_session(scope) else {
            return Ok(Vec::new());
        };
        let mut jobs = manager.list(&session);
        jobs.reverse();
        jobs.truncate(max);
        Ok(jobs)
    }

    /// Every session's background jobs, newest first, at most `max`: for an operator (the web
    /// console), never for a session's calls.
    pub async fn every_session(&self, max: usize) -> Result<Vec<ring0_exec::JobStatus>, String> {
        let manager = self.jobs.manager().await.map_err(|e| e.message)?;
        Ok(manager.list_every_session(max))
    }

    /// Status and output tail of any session's job, for an operator (the web console).
    pub async fn inspect_any_session(
        &self,
        job: &str,
        tail_lines: usize,
    ) -> Result<ring0_exec::JobSnapshot, String> {
        let manager = self.jobs.manager().await.map_err(|e| e.message)?;
        manager
            .inspect_any_session(job, tail_lines)
            .map_err(|e| e.to_string())
    }

    /// Records this replica's background jobs in the deployment's shared journal from now on,
    /// and answers about the jobs of other replicas from their records (see
    /// `ring0_journal::deployment`): a job whose replica stopped is reported KILLED.
    pub fn share(&self, deployment: Arc<dyn ring0_journal::Deployment>) {
        self.jobs.records.share(deployment);
    }
}

/// Every built-in tool: its spec and executor, ready for `KernelBuilder::tool`.
pub fn builtin_tools(config: &ToolsConfig) -> Result<Vec<ToolEntry>, ToolsError> {
    builtin_tools_with_jobs(config).map(|(tools, _)| tools)
}

/// [`builtin_tools`], and the handle that ends a session's background jobs.
pub fn builtin_tools_with_jobs(
    config: &ToolsConfig,
) -> Result<(Vec<ToolEntry>, JobSessions), ToolsError> {
    let ws = Arc::new(Workspace::open(config)?);
    let mut policy = ExecPolicy::new(ws.sandbox.workspace())
        .allow_shell(config.shell.allow_command_string)
        .observation_budget_bytes(shell::SHELL_OBSERVATION_BYTES);
    policy.env_allow = config.shell.env_allow.clone();
    let protected = config.protected.files.iter().chain(&config.protected.dirs);
    policy.sandbox = config
        .shell
        .bind_sandbox(ws.sandbox.workspace(), protected.cloned().collect());
    let spill = match &config.spill_dir {
        Some(dir) => Some(Arc::new(ring0_shape::SpillStore::open(dir)?)),
        None => None,
    };
    policy.shape.spill = spill.clone();
    let jobs = Arc::new(shell::Jobs::new(
        JobsConfig::new(&config.shell.jobs_dir, policy.clone()),
        ws.checkpoints().cloned(),
    ));
    let mut out: Vec<ToolEntry> = Vec::new();
    let read = ReadFile { ws: ws.clone() };
    out.push((read.spec(), Arc::new(read)));
    let list = ListDir { ws: ws.clone() };
    out.push((list.spec(), Arc::new(list)));
    let glob = Glob { ws: ws.clone() };
    out.push((glob.spec(), Arc::new(glob)));
    let search = Search { ws: ws.clone() };
    out.push((search.spec(), Arc::new(search)));
    let write = WriteFile { ws: ws.clone() };
    out.push((write.spec(), Arc::new(write)));
    let patch = ApplyPatch {
        ws: ws.clone(),
        fault: None,
    };
    out.push((patch.spec(), Arc::new(patch)));
    let shell = Shell {
        ws: ws.clone(),
        policy,
        authority: config.shell.shell_authority(),
        jobs: jobs.clone(),
        egress: config.shell.egress_proxy.clone(),
        profiles: config.shell.profiles.clone(),
        profile_for: config.shell.profile_for.clone(),
    };
    out.push((shell.spec(), Arc::new(shell)));
    for op in [JobOp::Inspect, JobOp::SendInput, JobOp::Cancel, JobOp::Wait] {
        let tool = JobTool {
            op,
            jobs: jobs.clone(),
            input_authority: config.shell.authority,
        };
        out.push((tool.spec(), Arc::new(tool)));
    }
    if let Some(store) = spill {
        let tool = ReadSpill { store };
        out.push((tool.spec(), Arc::new(tool)));
    }
    Ok((out, JobSessions { jobs }))
}

/// An `apply_patch` over `ws` (hosts that register tools one by one, and tests).
pub fn apply_patch_tool(ws: Arc<Workspace>) -> ApplyPatch {
    ApplyPatch { ws, fault: None }
}

/// A `read_file` over `ws`.
pub fn read_file_tool(ws: Arc<Workspace>) -> ReadFile {
    ReadFile { ws }
}

/// Decodes validated arguments; a mismatch here means the schema and the struct disagree.
pub(crate) fn args_of<T: DeserializeOwned>(args: Value) -> Result<T, ToolError> {
    serde_json::from_value(args).map_err(|e| ToolError::not_applied(format!("arguments: {e}")))
}

pub(crate) fn not_applied(message: String) -> ToolError {
    ToolError::not_applied(message)
}

/// A probe's "applied" verdict.
pub(crate) fn applied(observation: ring0_core::Observation) -> ring0_kernel::ProbeFinding {
    ring0_kernel::ProbeFinding::Applied(Box::new(observation))
}
