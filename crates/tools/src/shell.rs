//! `shell` and the job tools over `ring0-exec`.
//!
//! `shell` runs a command as explicit argv (no shell parses it) unless the caller passes a
//! `command` string — which the policy allows only where a grant allows a shell. A foreground run
//! returns its shaped observation; `background: true` starts a job and returns its opaque handle
//! at once. `job_inspect`, `job_send_input`, `job_cancel` and `job_wait` act on the session's own
//! jobs (a handle of another session is answered as unknown).

use crate::{Workspace, args_of};
use async_trait::async_trait;
use ring0_core::{Authority, Effect, Observation, Settlement, Strategy, ToolSpec};
use ring0_exec::sandbox::EgressProxy;
use ring0_exec::{
    CommandSpec, ExecError, ExecPolicy, JobError, JobEvent, JobManager, JobsConfig, Sandbox,
    SandboxProfile, SessionId, StdinMode, run_command,
};
use ring0_kernel::{CallContext, EventSink, OnCancel, ProbeFinding, Tool, ToolError};
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::OnceCell;

/// Longest foreground or background run a call may ask for.
pub const SHELL_TIMEOUT_MS_MAX: u64 = 30 * 60 * 1000;
/// Default run time of a foreground command.
pub const SHELL_TIMEOUT_MS_DEFAULT: u64 = 120_000;
/// Longest `job_wait`.
pub const JOB_WAIT_MS_MAX: u64 = 10 * 60 * 1000;
/// Model-visible budget of a command's shaped output.
pub const SHELL_OBSERVATION_BYTES: usize = 16 * 1024;

/// What the shell tool needs besides the workspace.
#[derive(Debug, Clone)]
pub struct ShellConfig {
    /// The authority `shell` and `job_send_input` declare. A2 by default.
    pub authority: Authority,
    /// Whether `ring0-exec` accepts a command string at all (the policy decides per grant).
    pub allow_command_string: bool,
    /// Environment names inherited by commands.
    pub env_allow: Vec<String>,
    /// Where job records and logs live.
    pub jobs_dir: PathBuf,
    /// The OS sandbox profile commands and jobs run in; `None` runs them unconfined (then
    /// `shell` declares `authority`, otherwise it is a sandboxed A1 tool). Default: the
    /// `workspace` profile.
    pub sandbox: Option<SandboxProfile>,
    /// The egress proxy for profiles that allow network access through it, made for the call
    /// whose processes it serves (its decisions are audited under the call's principal, session
    /// and scope).
    pub egress_proxy: Option<EgressProxyFor>,
    /// Profiles a call may run in instead of `sandbox`, by name: those grants name
    /// ([`GrantProfiles`]). A name not here is never run.
    pub profiles: BTreeMap<String, SandboxProfile>,
    /// The profiles of the grant that decides a principal's `shell` calls; `None`: every call
    /// runs in `sandbox` and none may ask for another.
    pub profile_for: Option<ProfileFor>,
}

/// The call whose processes an egress proxy serves: who it acts for, in which session and
/// scope (empty for a process no call started).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressOrigin {
    pub principal: String,
    pub session: String,
    pub scope: String,
}

impl EgressOrigin {
    /// The origin of the call `ctx` describes.
    pub fn of(ctx: &CallContext) -> Self {
        Self {
            principal: ctx.session.principal.id.clone(),
            session: ctx.session.session_id.clone(),
            scope: ctx.scope.to_string(),
        }
    }
}

/// Makes the egress proxy that serves the processes of one call.
#[derive(Clone)]
pub struct EgressProxyFor(pub Arc<MakeEgressProxy>);

/// What an [`EgressProxyFor`] calls: a call's origin → the proxy of its processes.
pub type MakeEgressProxy = dyn Fn(&EgressOrigin) -> Arc<dyn EgressProxy> + Send + Sync;

impl EgressProxyFor {
    /// The proxy for the processes of the call `origin` names.
    pub fn origin(&self, origin: &EgressOrigin) -> Arc<dyn EgressProxy> {
        (self.0)(origin)
    }
}

impl std::fmt::Debug for EgressProxyFor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EgressProxyFor")
    }
}

/// The sandbox profiles of the grant that decides a principal's `shell` calls.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GrantProfiles {
    /// The profile its calls run in; `None`: [`ShellConfig::sandbox`].
    pub sandbox: Option<String>,
    /// The wider profile a call may ask for in [`SANDBOX_PROFILE_ARG`] (the policy holds such a
    /// call for a person's approval).
    pub wider: Option<String>,
}

/// Answers, for a principal, the profiles of the grant that decides its `shell` calls.
#[derive(Clone)]
pub struct ProfileFor(pub Arc<dyn Fn(&ring0_core::Principal) -> GrantProfiles + Send + Sync>);

impl std::fmt::Debug for ProfileFor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProfileFor")
    }
}

/// The `shell` argument that asks for the grant's wider sandbox profile by name.
pub const SANDBOX_PROFILE_ARG: &str = "sandbox_profile";

impl ShellConfig {
    /// The authority `shell` declares: A1 inside the sandbox, the configured one outside.
    pub fn shell_authority(&self) -> Authority {
        if self.sandbox.is_some() {
            Authority::A1
        } else {
            self.authority
        }
    }

    /// The sandbox over `workspace` with ring0's `protected` paths masked. Each call's processes
    /// get an egress proxy of their own (for the call's origin); this one serves a process no
    /// call started, under an empty origin.
    pub fn bind_sandbox(&self, workspace: &std::path::Path, protected: Vec<PathBuf>) -> Sandbox {
        let Some(profile) = &self.sandbox else {
            return Sandbox::off();
        };
        let sandbox = Sandbox::new(profile.clone(), workspace, protected);
        match &self.egress_proxy {
            Some(proxy_for) => sandbox.egress_proxy(proxy_for.origin(&EgressOrigin::default())),
            None => sandbox,
        }
    }
}

/// Most scopes whose background jobs' trees are recorded when they finish (the oldest is
/// forgotten first; as many as the kernel keeps scopes).
pub const JOB_TREE_SCOPES_MAX: usize = ring0_kernel::scope::SCOPES_MAX;

/// Most lines of a command's output quoted as evidence in a `sandbox_denied` failure.
pub const SANDBOX_DENIED_LINES_MAX: usize = 4;
/// Most bytes of each quoted line.
pub const SANDBOX_DENIED_LINE_BYTES_MAX: usize = 200;

/// What the sandbox blocks, by the error text programs print for it.
const DENIAL_MARKS: &[(&str, &str)] = &[
    (
        "Permission denied",
        "filesystem access outside what the sandbox profile allows",
    ),
    (
        "Read-only file system",
        "a write to a protected or read-only path",
    ),
    (
        "Operation not permitted",
        "a system call the sandbox forbids",
    ),
    (
        "Invalid cross-device link",
        "a link or rename across the sandbox's boundary",
    ),
    (
        "Network is unreachable",
        "network access (the sandbox has no network)",
    ),
    (
        "Temporary failure in name resolution",
        "name resolution (the sandbox has no network)",
    ),
    (
        "Could not resolve host",
        "name resolution (the sandbox has no network)",
    ),
];

/// A failed confined command whose output shows the sandbox refusing it: what was blocked,
/// with the lines that show it.
fn sandbox_denial(text: &str) -> Option<(Vec<&'static str>, Vec<String>)> {
    let mut blocked: Vec<&'static str> = Vec::new();
    let mut evidence = Vec::new();
    for line in text.lines() {
        let Some((_, what)) = DENIAL_MARKS.iter().find(|(mark, _)| line.contains(mark)) else {
            continue;
        };
        if !blocked.contains(what) {
            blocked.push(what);
        }
        if evidence.len() < SANDBOX_DENIED_LINES_MAX {
            let cut = ring0_core::text::truncate_utf8(line.trim(), SANDBOX_DENIED_LINE_BYTES_MAX);
            evidence.push(cut.to_owned());
        }
    }
    (!blocked.is_empty()).then_some((blocked, evidence))
}

/// The job table, opened on first use (opening locks its state directory).
pub(crate) struct Jobs {
    config: JobsConfig,
    manager: OnceCell<Result<JobManager, String>>,
    sessions: Mutex<HashSet<String>>,
    /// Where each background job's news goes: the event stream of the session whose call
    /// started it. News that arrives before the route is known waits here for it.
    routes: Arc<Mutex<HashMap<String, Route>>>,
    /// Jobs started with `detached: true`: they outlive the end of their session.
    detached: Mutex<HashSet<String>>,
    /// The workspace's checkpoint store: a contained job's tree is recorded before it starts
    /// and again when it finishes.
    checkpoints: Option<Arc<ring0_checkpoint::Checkpoints>>,
    /// Scopes with a job whose tree was recorded before it started, oldest first (at most
    /// [`JOB_TREE_SCOPES_MAX`]): each job of theirs that finishes records the tree it left.
    tree_scopes: Arc<Mutex<VecDeque<String>>>,
    /// The jobs of every replica of a deployment, when this one joined one.
    pub(crate) records: crate::job_records::JobRecords,
    /// Whether the task that reads other replicas' cancel requests runs.
    cancel_watch: std::sync::atomic::AtomicBool,
}

enum Route {
    Sink(EventSink),
    Early(Vec<(String, Value)>),
}

/// Delivers a job's news to its session, or keeps it until the session is known.
fn route(routes: &Mutex<HashMap<String, Route>>, job: String, state: String, detail: Value) {
    let mut routes = routes.lock().unwrap_or_else(|p| p.into_inner());
    let finished = state != "SUSPENDED";
    match routes.get_mut(&job) {
        Some(Route::Sink(sink)) => {
            sink.job_update(&job, &state, detail);
            if finished {
                routes.remove(&job);
            }
        }
        Some(Route::Early(pending)) => pending.push((state, detail)),
        None => {
            routes.insert(job, Route::Early(vec![(state, detail)]));
        }
    }
}

impl Jobs {
    pub(crate) fn new(
        config: JobsConfig,
        checkpoints: Option<Arc<ring0_checkpoint::Checkpoints>>,
    ) -> Self {
        Self {
            config,
            manager: OnceCell::new(),
            sessions: Mutex::new(HashSet::new()),
            routes: Arc::new(Mutex::new(HashMap::new())),
            detached: Mutex::new(HashSet::new()),
            checkpoints,
            tree_scopes: Arc::new(Mutex::new(VecDeque::new())),
            records: Default::default(),
            cancel_watch: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// What records the tree the jobs of `scope` left.
    fn tree_after(&self, scope: &str) -> JobTreeAfter {
        JobTreeAfter {
            checkpoints: self.checkpoints.clone(),
            tree_scopes: self.tree_scopes.clone(),
            scope: scope.to_owned(),
        }
    }

    /// Marks `scope` as having a job whose tree was recorded before it started.
    fn tree_recorded(&self, scope: &str) {
        let mut scopes = self.tree_scopes.lock().unwrap_or_else(|p| p.into_inner());
        if scopes.iter().any(|s| s == scope) {
            return;
        }
        // A scope forgotten here only means its later jobs leave no "after" record: a restore
        // over what they changed asks for --force.
        if scopes.len() >= JOB_TREE_SCOPES_MAX {
            scopes.pop_front();
        }
        scopes.push_back(scope.to_owned());
    }

    /// The end of the client session of `scope`: its background jobs are cancelled (their whole
    /// process trees torn down), except those started detached. A scope that never started a
    /// job costs nothing.
    pub(crate) async fn end_scope(&self, scope: &str) {
        // The session's jobs other replicas run end there (their replicas cancel them).
        self.records.end_of(&scope_id(scope)).await;
        let Some(Ok(manager)) = self.manager.get() else {
            return;
        };
        let Ok(session) = SessionId::new(format!("scope_{}", scope_id(scope))) else {
            return;
        };
        let live: Vec<String> = manager
            .list(&session)
            .into_iter()
            .filter(|s| !s.state.is_terminal())
            .map(|s| s.job.to_string())
            .collect();
        for job in live {
            let detached = self
                .detached
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(&job);
            if !detached {
                let _ = manager.cancel(&session, &job).await;
            }
        }
    }

    pub(crate) async fn manager(&self) -> Result<&JobManager, ToolError> {
        let m = self
            .manager
            .get_or_init(|| async {
                JobManager::open(self.config.clone())
                    .await
                    .map(|(m, _)| m)
                    .map_err(|e| e.to_string())
            })
            .await;
        m.as_ref()
            .map_err(|e| ToolError::not_applied(format!("the job table is unavailable: {e}")))
    }

    /// Sends this job's news to `sink` from now on, delivering whatever already arrived.
    fn route_to(&self, job: String, sink: EventSink) {
        let mut routes = self.routes.lock().unwrap_or_else(|p| p.into_inner());
        let mut finished = false;
        if let Some(Route::Early(pending)) = routes.remove(&job) {
            for (state, detail) in pending {
                finished |= state != "SUSPENDED";
                sink.job_update(&job, &state, detail);
            }
        }
        if !finished {
            routes.insert(job, Route::Sink(sink));
        }
    }

    /// The job session of a scope (scopes are free text; job session ids are not).
    async fn session(&self, scope: &str) -> Result<(&JobManager, SessionId), ToolError> {
        let manager = self.manager().await?;
        let id = scope_id(scope);
        let session = SessionId::new(format!("scope_{id}"))
            .map_err(|e| ToolError::not_applied(e.to_string()))?;
        let fresh = self
            .sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id);
        if fresh {
            match manager.open_session(&session) {
                Ok(mut events) => {
                    // Drained at once so a job never waits on a full channel; each event goes
                    // to the session that started the job, the moment it happens.
                    let routes = self.routes.clone();
                    let after = self.tree_after(scope);
                    let (records, owner) = (self.records.clone(), scope_id(scope));
                    tokio::spawn(async move {
                        while let Some(event) = events.recv().await {
                            match event {
                                JobEvent::Finished { status } => {
                                    // Recorded before the news goes out, so a restore asked
                                    // for after it sees what the job left.
                                    after.record().await;
                                    let value = serde_json::to_value(&*status).unwrap_or_default();
                                    records.publish(&owner, &value, true).await;
                                    route(
                                        &routes,
                                        status.job.to_string(),
                                        status.state.to_string(),
                                        serde_json::to_value(&*status).unwrap_or(Value::Null),
                                    )
                                }
                                JobEvent::InputRequested { job, tail } => route(
                                    &routes,
                                    job.to_string(),
                                    "SUSPENDED".into(),
                                    json!({"input_requested": true, "tail": tail}),
                                ),
                            }
                        }
                    });
                }
                Err(JobError::SessionAlreadyOpen { .. }) => {}
                Err(e) => return Err(ToolError::not_applied(e.to_string())),
            }
        }
        Ok((manager, session))
    }
}

/// Records the tree a finished job left, for the scope's tree checkpoint.
struct JobTreeAfter {
    checkpoints: Option<Arc<ring0_checkpoint::Checkpoints>>,
    tree_scopes: Arc<Mutex<VecDeque<String>>>,
    scope: String,
}

impl JobTreeAfter {
    /// A failure only means a later restore sees the paths as changed outside ring0 and asks
    /// for `--force`.
    async fn record(&self) {
        let Some(store) = self.checkpoints.clone() else {
            return;
        };
        let recorded = self
            .tree_scopes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&self.scope);
        if recorded {
            let scope = self.scope.clone();
            let _ = tokio::task::spawn_blocking(move || store.after_tree(&scope)).await;
        }
    }
}

/// The job session id of a scope (scopes are free text; job session ids are not).
/// The job session of `scope`'s calls, as the shell tool names it.
pub(crate) fn scope_session(scope: &str) -> Option<SessionId> {
    SessionId::new(format!("scope_{}", scope_id(scope))).ok()
}

fn scope_id(scope: &str) -> String {
    let digest = Sha256::digest(scope.as_bytes());
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}

fn job_error(e: JobError) -> ToolError {
    ToolError::not_applied(e.to_string())
}

pub struct Shell {
    pub(crate) ws: Arc<Workspace>,
    pub(crate) policy: ExecPolicy,
    pub(crate) authority: Authority,
    pub(crate) jobs: Arc<Jobs>,
    /// Makes the egress proxy of each call's processes (see [`ShellConfig`]).
    pub(crate) egress: Option<EgressProxyFor>,
    /// See [`ShellConfig::profiles`].
    pub(crate) profiles: BTreeMap<String, SandboxProfile>,
    /// See [`ShellConfig::profile_for`].
    pub(crate) profile_for: Option<ProfileFor>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ShellArgs {
    #[serde(default)]
    argv: Option<Vec<String>>,
    #[serde(default)]
    command: Option<String>,
    #[serde(default)]
    cwd: Option<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    timeout_ms: Option<u64>,
    #[serde(default)]
    background: bool,
    #[serde(default)]
    detached: bool,
    #[serde(default)]
    stdin: Option<String>,
    #[serde(default)]
    sandbox_profile: Option<String>,
}

impl Shell {
    pub fn spec(&self) -> ToolSpec {
        ToolSpec::new(
            "shell",
            "Run a command in the workspace. Give `argv` (program and arguments, no shell \
             parsing); `command` (a shell script) only where a shell is granted. `background: \
             true` returns a job handle at once (see job_inspect / job_wait); the job ends with \
             the client's session unless `detached: true`. Otherwise the shaped output, exit \
             code and duration are returned.",
            json!({
                "type": "object",
                "properties": {
                    "argv": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                    "command": {"type": "string"},
                    "cwd": {"type": "string", "description": "Working directory inside the workspace."},
                    "env": {"type": "object", "additionalProperties": {"type": "string"}},
                    "timeout_ms": {"type": "integer", "minimum": 1, "maximum": SHELL_TIMEOUT_MS_MAX},
                    "background": {"type": "boolean", "default": false},
                    "detached": {"type": "boolean", "default": false, "description": "With background: the job outlives the client's session."},
                    "stdin": {"type": "string", "enum": ["null", "pipe", "tty"], "description": "For background jobs that read input."},
                    SANDBOX_PROFILE_ARG: {"type": "string", "description": "Run in this wider sandbox profile: only the one a sandbox_denied result offers, and only after a person approves."}
                }
            }),
        )
        .effect(Effect::NonIdempotent)
        .authority(self.authority)
        .settlement(Settlement::None)
        .timeout_ms(SHELL_TIMEOUT_MS_MAX + 30_000)
        .observation_budget_bytes(SHELL_OBSERVATION_BYTES * 3)
    }

    fn command_spec(&self, a: &ShellArgs) -> Result<CommandSpec, ToolError> {
        let mut spec = match (&a.argv, &a.command) {
            (Some(argv), None) => CommandSpec::argv(argv.clone()),
            (None, Some(script)) => CommandSpec::shell(script.clone()),
            _ => {
                return Err(ToolError::not_applied(
                    "give exactly one of `argv` and `command`",
                ));
            }
        };
        if let Some(cwd) = &a.cwd {
            let located = self
                .ws
                .sandbox
                .locate(cwd, crate::sandbox::Access::Write)
                .map_err(crate::files::sandbox_err)?;
            // Opened beneath the root first, so a cwd that escapes, or lies in ring0's own
            // state, is refused here.
            located.open_dir().map_err(crate::files::sandbox_err)?;
            spec = spec.cwd(located.root.path().join(&located.rel));
        }
        for (k, v) in &a.env {
            spec = spec.env(k, v);
        }
        if let Some(ms) = a.timeout_ms {
            spec = spec.timeout(Duration::from_millis(ms.min(SHELL_TIMEOUT_MS_MAX)));
        } else if !a.background {
            spec = spec.timeout(Duration::from_millis(SHELL_TIMEOUT_MS_DEFAULT));
        }
        let stdin = match a.stdin.as_deref() {
            None | Some("null") => StdinMode::Null,
            Some("pipe") => StdinMode::Pipe,
            Some("tty") => StdinMode::Tty,
            Some(other) => {
                return Err(ToolError::not_applied(format!(
                    "stdin {other:?} is not null, pipe or tty"
                )));
            }
        };
        if a.detached && !a.background {
            return Err(ToolError::not_applied(
                "`detached` needs `background: true`",
            ));
        }
        if stdin.is_interactive() && !a.background {
            return Err(ToolError::not_applied(
                "interactive stdin needs `background: true`",
            ));
        }
        Ok(spec.stdin(stdin))
    }
}

/// What a contained foreground command's tree checkpoint came to.
enum TreeCheckpoint {
    /// No checkpoint store, or the command runs unconfined (it may write anywhere: a tree
    /// checkpoint of the workspace would promise an undo it cannot keep).
    None,
    /// Recorded in this checkpoint.
    Recorded(String),
    /// Not recorded: the workspace is past the checkpoint's bound. The command runs anyway, and
    /// its result says so.
    Skipped(String),
}

impl TreeCheckpoint {
    /// Puts the checkpoint (or why there is none) in the command's result.
    fn annotate(&self, obs: &mut Observation) {
        let entry = match self {
            Self::None => return,
            Self::Recorded(id) => json!({"id": id}),
            Self::Skipped(notice) => {
                obs.text = format!("{notice}\n{}", obs.text);
                json!({"skipped": notice})
            }
        };
        if let Some(Value::Object(map)) = &mut obs.structured {
            map.insert("checkpoint".into(), entry);
        }
    }
}

/// The sandbox one call's processes run in, and the wider profile its grant offers it.
struct CallSandbox {
    sandbox: Sandbox,
    /// The grant's wider profile, when the call did not ask for it already.
    wider: Option<String>,
}

impl Shell {
    /// The sandbox of the call `ctx` describes: its grant's profile (or the one it asked for,
    /// which must be its grant's wider profile; the policy held the call for a person), with an
    /// egress proxy of its own that records the call's origin.
    fn call_sandbox(
        &self,
        ctx: &CallContext,
        asked: Option<&str>,
    ) -> Result<CallSandbox, ToolError> {
        let base = &self.policy.sandbox;
        if !base.is_on() {
            return match asked {
                Some(name) => Err(ToolError::not_applied(format!(
                    "sandbox profile {name:?} was asked for, but shell runs with its sandbox off"
                ))),
                None => Ok(CallSandbox {
                    sandbox: base.clone(),
                    wider: None,
                }),
            };
        }
        let grant = self
            .profile_for
            .as_ref()
            .map(|f| (f.0)(&ctx.session.principal))
            .unwrap_or_default();
        let chosen = match asked {
            Some(name) if grant.wider.as_deref() == Some(name) => Some(name),
            Some(name) => {
                return Err(ToolError::not_applied(format!(
                    "sandbox profile {name:?} is not offered to this call (its grant offers {})",
                    grant
                        .wider
                        .as_deref()
                        .map_or("none".to_owned(), |w| format!("{w:?}"))
                )));
            }
            None => grant.sandbox.as_deref(),
        };
        let mut sandbox = match chosen {
            Some(name) => {
                let profile = self.profiles.get(name).ok_or_else(|| {
                    ToolError::not_applied(format!(
                        "sandbox profile {name:?} is not configured, so the command did not run"
                    ))
                })?;
                base.with_profile(profile.clone())
            }
            None => base.clone(),
        };
        if let Some(proxy_for) = &self.egress {
            sandbox = sandbox.egress_proxy(proxy_for.origin(&EgressOrigin::of(ctx)));
        }
        Ok(CallSandbox {
            sandbox,
            wider: grant.wider.filter(|_| asked.is_none()),
        })
    }

    /// Records the workspace tree before a contained command runs (foreground or background).
    async fn checkpoint_before(&self, scope: &str) -> Result<TreeCheckpoint, ToolError> {
        let Some(store) = self
            .ws
            .checkpoints()
            .filter(|_| self.policy.sandbox.is_on())
        else {
            return Ok(TreeCheckpoint::None);
        };
        let (store, scope) = (store.clone(), scope.to_owned());
        let taken = tokio::task::spawn_blocking(move || store.snapshot_tree(&scope))
            .await
            .map_err(|e| ToolError::not_applied(format!("the workspace checkpoint failed: {e}")))?;
        match taken {
            Ok(id) => Ok(TreeCheckpoint::Recorded(id)),
            Err(ring0_checkpoint::CheckpointError::TooLarge(why)) => {
                Ok(TreeCheckpoint::Skipped(format!(
                    "checkpoint_skipped: no workspace checkpoint was taken before this command ({why}); \
                     `ring0 checkpoint restore` cannot undo what it changed."
                )))
            }
            Err(e) => Err(ToolError::not_applied(format!(
                "the workspace checkpoint could not be recorded, so the command did not run: {e}"
            ))),
        }
    }

    /// Records the tree as the command left it. A failure only means a later restore sees the
    /// paths as changed outside ring0 and asks for `--force`.
    async fn checkpoint_after(&self, scope: &str) {
        let Some(store) = self.ws.checkpoints() else {
            return;
        };
        let (store, scope) = (store.clone(), scope.to_owned());
        let _ = tokio::task::spawn_blocking(move || store.after_tree(&scope)).await;
    }
}

#[async_trait]
impl Tool for Shell {
    /// A command ring0 runs itself is killed when its round is cancelled (its process tree torn
    /// down), and that is its observed outcome.
    fn on_cancel(&self) -> OnCancel {
        OnCancel::Stop
    }

    async fn call(&self, ctx: CallContext, args: Value) -> Result<Observation, ToolError> {
        let a: ShellArgs = args_of(args)?;
        // Spill handles of this run are sealed for the calling session.
        let spec = self.command_spec(&a)?.spill_owner(&*ctx.scope);
        let confined = self.call_sandbox(&ctx, a.sandbox_profile.as_deref())?;
        if a.background {
            let (manager, session) = self.jobs.session(&ctx.scope).await?;
            let checkpoint = self.checkpoint_before(&ctx.scope).await?;
            if matches!(checkpoint, TreeCheckpoint::Recorded(_)) {
                self.jobs.tree_recorded(&ctx.scope);
            }
            let receipt = manager
                .start_in(&session, &spec, Some(confined.sandbox))
                .await
                .map_err(job_error)?;
            if a.detached {
                self.jobs
                    .detached
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(receipt.job.to_string());
            }
            self.jobs
                .route_to(receipt.job.to_string(), ctx.events.clone());
            let started = json!({
                "job": receipt.job,
                "state": receipt.state,
                "started_at_ms": receipt.started_at_ms,
                "detached": a.detached,
            });
            self.jobs
                .records
                .publish(&scope_id(&ctx.scope), &started, false)
                .await;
            Jobs::watch_cancel_requests(&self.jobs);
            let mut obs = Observation::json(json!({
                "job": receipt.job,
                "state": receipt.state,
                "execution_mode": receipt.run_mode,
                "started_at_ms": receipt.started_at_ms,
                "note": "running in the background: use job_wait or job_inspect with this handle",
            }));
            checkpoint.annotate(&mut obs);
            return Ok(obs);
        }
        let mut policy = self.policy.clone();
        policy.sandbox = confined.sandbox;
        let checkpoint = self.checkpoint_before(&ctx.scope).await?;
        let cancel = ctx.cancel.clone();
        let ran = run_command(&policy, &spec, async move { cancel.cancelled().await }).await;
        if matches!(checkpoint, TreeCheckpoint::Recorded(_)) {
            self.checkpoint_after(&ctx.scope).await;
        }
        let report = ran
            // `run_command` errs only when nothing ran.
            .map_err(|e| match e {
                ExecError::Sandbox(e) => {
                    ToolError::not_applied(format!("sandbox_unavailable: {e}"))
                }
                other => ToolError::not_applied(other.to_string()),
            })?;
        let failed = report
            .summary
            .exit
            .as_ref()
            .is_some_and(|x| x.code != Some(0));
        let mut obs = report.observation;
        if obs.structured.is_none() {
            obs.structured = serde_json::to_value(&report.summary).ok();
        }
        checkpoint.annotate(&mut obs);
        if let Some(profile) = policy.sandbox.profile_name().filter(|_| failed)
            && let Some((blocked, evidence)) = sandbox_denial(&obs.text)
        {
            let next = match &confined.wider {
                Some(wider) => format!(
                    "To run it in the wider profile {wider:?}, make the same call again with \
                     `\"{SANDBOX_PROFILE_ARG}\": \"{wider}\"`: a person will be asked to approve it."
                ),
                None => "A grant with a wider profile (held for approval) can run it.".to_owned(),
            };
            let message = format!(
                "sandbox_denied: the command was stopped by sandbox profile {profile:?}, which blocked {}. \
                 It may have changed files inside the workspace before that. {next}",
                blocked.join("; ")
            );
            obs.structured = Some(json!({
                "error": "sandbox_denied",
                "profile": profile,
                "blocked": blocked,
                "evidence": evidence,
                "wider_profile": confined.wider,
                "run": obs.structured.take(),
            }));
            return Err(ToolError::not_applied(message).with_observation(obs));
        }
        Ok(obs)
    }
}

// ---------------------------------------------------------------------------------------------

/// Which job operation a [`JobTool`] performs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobOp {
    Inspect,
    SendInput,
    Cancel,
    Wait,
}

pub struct JobTool {
    pub(crate) op: JobOp,
    pub(crate) jobs: Arc<Jobs>,
    pub(crate) input_authority: Authority,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JobArgs {
    job: String,
    #[serde(default)]
    tail_lines: Option<usize>,
    #[serde(default)]
    input: Option<String>,
    #[serde(default)]
    timeout_ms: Option<u64>,
}

impl JobTool {
    pub fn spec(&self) -> ToolSpec {
        let job = json!({"type": "string", "description": "The handle shell returned (job_…)."});
        match self.op {
            JobOp::Inspect => ToolSpec::read(
                "job_inspect",
                "State, resource use and the last lines of output of a background job.",
                json!({"type": "object", "properties": {
                    "job": job,
                    "tail_lines": {"type": "integer", "minimum": 0, "maximum": 1000, "default": 50}
                }, "required": ["job"]}),
            )
            .observation_budget_bytes(SHELL_OBSERVATION_BYTES * 3),
            JobOp::Wait => ToolSpec::read(
                "job_wait",
                "Wait until a background job finishes (or timeout_ms passes) and return its status \
                 and shaped output.",
                json!({"type": "object", "properties": {
                    "job": job,
                    "timeout_ms": {"type": "integer", "minimum": 0, "maximum": JOB_WAIT_MS_MAX, "default": 30000}
                }, "required": ["job"]}),
            )
            .timeout_ms(JOB_WAIT_MS_MAX + 10_000)
            .observation_budget_bytes(SHELL_OBSERVATION_BYTES * 3)
            .track_exact_repeats(false),
            JobOp::SendInput => ToolSpec::new(
                "job_send_input",
                "Write text to the standard input of a background job started with stdin pipe or tty.",
                json!({"type": "object", "properties": {
                    "job": job,
                    "input": {"type": "string", "maxLength": 4096}
                }, "required": ["job", "input"]}),
            )
            .effect(Effect::NonIdempotent)
            .authority(self.input_authority)
            .strategy(&[Strategy::Exploitation])
            .conflict_key("job:{job}")
            .settlement(Settlement::None),
            JobOp::Cancel => ToolSpec::new(
                "job_cancel",
                "Stop a background job and its whole process tree; returns its final status.",
                json!({"type": "object", "properties": {"job": job}, "required": ["job"]}),
            )
            .effect(Effect::Idempotent)
            .authority(Authority::A1)
            .strategy(&[Strategy::Exploitation])
            .conflict_key("job:{job}")
            .settlement(Settlement::Probe),
        }
    }
}

impl JobTool {
    /// The answer about a job this replica does not run, from the deployment's record of it
    /// (see [`crate::job_records`]); `None` when no replica recorded it for this scope.
    async fn answer_from_record(
        &self,
        scope: &str,
        a: &JobArgs,
    ) -> Option<Result<Value, ToolError>> {
        use crate::job_records::Asked;
        let asked = match self.op {
            JobOp::Inspect => Asked::Inspect,
            JobOp::Wait => Asked::Wait(Duration::from_millis(
                a.timeout_ms.unwrap_or(30_000).min(JOB_WAIT_MS_MAX),
            )),
            JobOp::Cancel => Asked::Cancel,
            JobOp::SendInput => Asked::SendInput,
        };
        self.jobs
            .records
            .elsewhere(&scope_id(scope), &a.job, asked)
            .await
    }

    /// A job this call saw finished has its tree recorded as it left it before the call
    /// answers (the session's event task records it too, but may not have yet), so a restore
    /// asked for next sees what the job did as ring0's.
    async fn after_finished(&self, scope: &str, status: &ring0_exec::JobStatus) {
        if status.state.is_terminal() {
            self.jobs.tree_after(scope).record().await;
        }
    }
}

#[async_trait]
impl Tool for JobTool {
    async fn call(&self, ctx: CallContext, args: Value) -> Result<Observation, ToolError> {
        let a: JobArgs = args_of(args)?;
        let (manager, session) = self.jobs.session(&ctx.scope).await?;
        if let Err(JobError::UnknownJob { .. }) = manager.inspect(&session, &a.job, 0)
            && let Some(answer) = self.answer_from_record(&ctx.scope, &a).await
        {
            return answer.map(Observation::json);
        }
        let value = match self.op {
            JobOp::Inspect => serde_json::to_value(
                manager
                    .inspect(&session, &a.job, a.tail_lines.unwrap_or(50))
                    .map_err(job_error)?,
            ),
            JobOp::Wait => {
                let status = manager
                    .wait(
                        &session,
                        &a.job,
                        Duration::from_millis(a.timeout_ms.unwrap_or(30_000).min(JOB_WAIT_MS_MAX)),
                    )
                    .await
                    .map_err(job_error)?;
                self.after_finished(&ctx.scope, &status).await;
                serde_json::to_value(status)
            }
            JobOp::SendInput => serde_json::to_value(
                manager
                    .send_input(&session, &a.job, a.input.unwrap_or_default().as_bytes())
                    .await
                    .map_err(job_error)?,
            ),
            JobOp::Cancel => {
                let status = manager.cancel(&session, &a.job).await.map_err(job_error)?;
                self.after_finished(&ctx.scope, &status).await;
                serde_json::to_value(status)
            }
        };
        value
            .map(Observation::json)
            .map_err(|e| ToolError::not_applied(e.to_string()))
    }

    async fn probe(&self, args: &Value, _snapshot: Option<&Value>) -> ProbeFinding {
        // Only job_cancel is settled by probe: the job is finished, or it is not.
        let Some(job) = args.get("job").and_then(Value::as_str) else {
            return ProbeFinding::Indeterminate("no job handle".into());
        };
        let Ok(manager) = self.jobs.manager().await else {
            return ProbeFinding::Indeterminate("the job table is unavailable".into());
        };
        // The probe has no scope; look the handle up in every session this tool opened.
        for status in self.jobs.all_statuses(manager) {
            if status.job.to_string() == job {
                return if status.state.is_terminal() {
                    crate::applied(Observation::json(
                        serde_json::to_value(&status).unwrap_or(Value::Null),
                    ))
                } else {
                    ProbeFinding::Unchanged
                };
            }
        }
        // A job another replica ran: finished (or ended with its replica), or not yet.
        match self.jobs.records.settled(job).await {
            Some(true) => crate::applied(Observation::json(json!({"job": job, "finished": true}))),
            Some(false) => ProbeFinding::Unchanged,
            None => ProbeFinding::Indeterminate(format!("job {job:?} is not known")),
        }
    }
}

impl Jobs {
    /// Cancels, every [`crate::job_records::CANCEL_POLL`], the jobs of this replica that
    /// another replica was asked to cancel (see [`crate::job_records`]). Started once, with the
    /// first background job of a replica that joined a deployment; it ends with the job table.
    fn watch_cancel_requests(jobs: &Arc<Jobs>) {
        use std::sync::atomic::Ordering;
        if !jobs.records.is_shared() || jobs.cancel_watch.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak = Arc::downgrade(jobs);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(crate::job_records::CANCEL_POLL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(jobs) = weak.upgrade() else {
                    return;
                };
                let asked = jobs.records.to_cancel().await;
                if asked.is_empty() {
                    continue;
                }
                let Ok(manager) = jobs.manager().await else {
                    continue;
                };
                for job in asked {
                    jobs.cancel_in_any_session(manager, &job).await;
                }
            }
        });
    }

    /// Cancels `job` in whichever of this replica's job sessions holds it.
    async fn cancel_in_any_session(&self, manager: &JobManager, job: &str) {
        let ids: Vec<String> = self
            .sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect();
        for id in ids {
            let Ok(session) = SessionId::new(format!("scope_{id}")) else {
                continue;
            };
            if manager
                .list(&session)
                .iter()
                .any(|s| s.job.to_string() == job)
            {
                let _ = manager.cancel(&session, job).await;
                return;
            }
        }
    }

    fn all_statuses(&self, manager: &JobManager) -> Vec<ring0_exec::JobStatus> {
        let ids: Vec<String> = self
            .sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect();
        ids.into_iter()
            .filter_map(|id| SessionId::new(format!("scope_{id}")).ok())
            .flat_map(|s| manager.list(&s))
            .collect()
    }
}
