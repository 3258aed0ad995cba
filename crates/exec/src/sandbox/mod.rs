//! The OS sandbox every process ring0 starts runs in (Linux).
//!
//! A [`SandboxProfile`] names what a confined process may touch; a [`Sandbox`] is a profile bound
//! to a workspace and to ring0's protected paths. Before a confined program's first instruction
//! its process has:
//!
//! - **its own mount and PID namespaces** inside the user, IPC, UTS and network namespaces its
//!   sandbox keeps warm ([`warm`]: created once, joined by each process): no network but a
//!   loopback that is up (a profile that allows egress gets a network namespace of its own per
//!   process, with one TCP listener on 127.0.0.1 handed to ring0's egress proxy, and the proxy
//!   variables pointing at it); the program's PID namespace ends with it, so the kernel kills
//!   every process it left behind, daemons included ([`Sandbox::without_warm_namespaces`]
//!   creates every namespace per process instead);
//! - **masks** mounted over ring0's protected paths, `.git/hooks` (read-only) and the system
//!   secrets a profile hides (`/etc/shadow` …): empty and read-only;
//! - **Landlock** rules: the workspace and a private scratch directory (`HOME` and `TMPDIR`)
//!   read-write; system directories and the profile's toolchains read-and-execute; a few device
//!   nodes; everything else denied;
//! - **seccomp**: ptrace, mount, kexec, bpf, perf events, keyrings, userfaultfd, handles, new
//!   namespaces, module loading, raw and packet sockets, io_uring … fail with `EPERM`;
//! - no capabilities and `no_new_privs`.
//!
//! Everything is prepared in ring0 (rules opened, filter compiled, strings built) and the child
//! only makes raw system calls ([`child`]). When the kernel lacks a feature a profile needs,
//! [`Sandbox::prepare`] refuses with [`SandboxError::Unavailable`] naming it: nothing runs
//! unconfined by surprise. `Sandbox::off()` is the only way to run without, and callers print it.

mod child;
mod fs;
mod syscalls;
mod warm;

pub use child::EgressListener;
pub(crate) use child::{FORWARDED, Plan, Step, close_all_except, exit_as, step_failure};

use crate::limits;
use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

/// The name of the profile used when the configuration names none.
pub const PROFILE_DEFAULT: &str = "workspace";

/// System directories a confined process may read and execute.
pub const SYSTEM_READ_DIRS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/proc", "/sys",
];

/// Files under the readable system directories that every profile hides (mounted over with an
/// empty read-only file or directory).
pub const HIDDEN_DEFAULT: &[&str] = &[
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/ssh",
    "/etc/ssl/private",
];

/// What a profile lets a confined process reach over the network.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum NetworkPolicy {
    /// A loopback of its own and nothing else.
    #[default]
    None,
    /// Outbound connections through ring0's egress proxy, which decides per host and port. The
    /// process gets `HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY` (and lower-case) pointing at a
    /// listener on 127.0.0.1 inside its own network namespace.
    Proxy {
        /// `host:port` rules (port a number or `*`) the proxy lets through, for it to enforce.
        allow: Vec<String>,
    },
}

/// A named set of permissions for confined processes. The workspace, the scratch directory and
/// the system directories are always part of it; a profile adds to them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxProfile {
    /// Its name in configuration and messages.
    pub name: String,
    /// More directories or files to read and execute (toolchains: `~/.cargo`, a node install).
    pub read: Vec<PathBuf>,
    /// More directories to read and write.
    pub write: Vec<PathBuf>,
    /// Paths to hide besides [`HIDDEN_DEFAULT`].
    pub hide: Vec<PathBuf>,
    /// Network reach.
    pub network: NetworkPolicy,
    /// Most tasks (processes and threads) one run may have at once, enforced by its pids cgroup
    /// (see [`crate::cgroup`]); `None` keeps the run's own `processes` limit.
    pub processes_max: Option<u64>,
}

impl SandboxProfile {
    /// The default profile: the workspace read-write, the system read-only, no network.
    pub fn workspace() -> Self {
        Self {
            name: PROFILE_DEFAULT.to_owned(),
            read: Vec::new(),
            write: Vec::new(),
            hide: Vec::new(),
            network: NetworkPolicy::None,
            processes_max: None,
        }
    }
}

/// Receives the egress listener of each confined process whose profile allows egress.
///
/// ring0's egress proxy implements this: it accepts connections on the listener (which lives in
/// the child's network namespace; accepting from outside it works) and forwards the allowed ones.
pub trait EgressProxy: Send + Sync + std::fmt::Debug {
    /// Serves `listener` for the process that `profile` confines, until the returned guard is
    /// dropped (the sandbox keeps it as long as the process runs). An error refuses the process.
    fn serve(
        &self,
        listener: EgressListener,
        profile: &SandboxProfile,
    ) -> Result<EgressServing, SandboxError>;
}

/// What serves one process's egress listener: kept while the process runs, dropped after.
pub type EgressServing = Box<dyn std::any::Any + Send + Sync>;

/// Why a sandbox could not be prepared. Nothing was started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SandboxError {
    /// The kernel lacks a feature the profile needs.
    #[error(
        "the sandbox needs {feature}, which this kernel does not offer ({detail}); set sandbox = \"off\" explicitly to run unconfined"
    )]
    Unavailable {
        feature: &'static str,
        detail: String,
    },
    /// A path the profile names cannot be used.
    #[error("sandbox profile {profile:?}: path {path:?}: {reason}")]
    Path {
        profile: String,
        path: PathBuf,
        reason: String,
    },
    /// The profile allows egress but ring0 has no egress proxy to serve it.
    #[error("sandbox profile {profile:?} allows egress, but no egress proxy is configured")]
    NoEgressProxy { profile: String },
    /// Setting up the sandbox failed for another reason.
    #[error("sandbox setup: {0}")]
    Setup(String),
}

/// A profile bound to a workspace and ring0's protected paths: what [`crate::ExecPolicy`] holds.
#[derive(Clone)]
pub struct Sandbox {
    inner: Option<Arc<Bound>>,
}

struct Bound {
    profile: SandboxProfile,
    workspace: PathBuf,
    protected: Vec<PathBuf>,
    egress: Option<Arc<dyn EgressProxy>>,
    /// The namespaces this sandbox's processes join ([`warm`]); `None` until the first spawn,
    /// and for good when every process must create all of its own.
    warm: Option<Mutex<Option<Arc<warm::WarmNamespaces>>>>,
}

impl Bound {
    fn new(
        profile: SandboxProfile,
        workspace: PathBuf,
        protected: Vec<PathBuf>,
        egress: Option<Arc<dyn EgressProxy>>,
        warm: bool,
    ) -> Self {
        Self {
            profile,
            workspace,
            protected,
            egress,
            warm: warm.then(|| Mutex::new(None)),
        }
    }

    /// The warm namespaces, created on first use (an error is not kept: the next spawn tries
    /// again). `None` when this sandbox creates every namespace per process.
    fn warm(&self) -> Result<Option<Arc<warm::WarmNamespaces>>, SandboxError> {
        let Some(slot) = &self.warm else {
            return Ok(None);
        };
        let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(warm) = slot.as_ref() {
            return Ok(Some(warm.clone()));
        }
        let share_net = matches!(self.profile.network, NetworkPolicy::None);
        let warm = Arc::new(warm::WarmNamespaces::create(share_net)?);
        *slot = Some(warm.clone());
        Ok(Some(warm))
    }
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.inner {
            None => f.write_str("Sandbox(off)"),
            Some(b) => f
                .debug_struct("Sandbox")
                .field("profile", &b.profile)
                .field("workspace", &b.workspace)
                .field("protected", &b.protected)
                .field("egress_proxy", &b.egress.is_some())
                .finish(),
        }
    }
}

impl Sandbox {
    /// No sandbox: processes run as ring0's user with its full access. Only on explicit request.
    pub fn off() -> Self {
        Self { inner: None }
    }

    /// `profile` over `workspace` (read-write), with `protected` paths (ring0's configuration,
    /// lock file, state directory) masked.
    pub fn new(
        profile: SandboxProfile,
        workspace: impl Into<PathBuf>,
        protected: Vec<PathBuf>,
    ) -> Self {
        Self {
            inner: Some(Arc::new(Bound::new(
                profile,
                workspace.into(),
                protected,
                None,
                true,
            ))),
        }
    }

    /// The same sandbox, with every process creating all of its namespaces instead of joining
    /// the user, IPC, UTS and (without egress) network namespaces its sandbox keeps warm: no
    /// two processes share any namespace, at several milliseconds per spawn.
    pub fn without_warm_namespaces(&self) -> Self {
        let Some(bound) = &self.inner else {
            return self.clone();
        };
        Self {
            inner: Some(Arc::new(Bound::new(
                bound.profile.clone(),
                bound.workspace.clone(),
                bound.protected.clone(),
                bound.egress.clone(),
                false,
            ))),
        }
    }

    /// The proxy that serves egress listeners of profiles that allow egress.
    pub fn egress_proxy(self, proxy: Arc<dyn EgressProxy>) -> Self {
        let Some(bound) = self.inner else {
            return self;
        };
        Self {
            inner: Some(Arc::new(Bound::new(
                bound.profile.clone(),
                bound.workspace.clone(),
                bound.protected.clone(),
                Some(proxy),
                bound.warm.is_some(),
            ))),
        }
    }

    /// The same binding (workspace, protected paths, egress proxy) with another profile: what a
    /// call that runs in its grant's profile gets. A sandbox that is off stays off.
    pub fn with_profile(&self, profile: SandboxProfile) -> Self {
        let Some(bound) = &self.inner else {
            return self.clone();
        };
        Self {
            inner: Some(Arc::new(Bound::new(
                profile,
                bound.workspace.clone(),
                bound.protected.clone(),
                bound.egress.clone(),
                bound.warm.is_some(),
            ))),
        }
    }

    /// The same sandbox, with the *homes* of a program and of the files its arguments name added
    /// to what may be read and executed: the operator who configured a server named them. A home
    /// is the hidden directory of ring0's `HOME` the path is in (a toolchain manager's
    /// `~/.pyenv`, `~/.nvm`, `~/.cargo`), else the directory holding the topmost `node_modules`, else the
    /// parent of a `bin` directory the path is in, else the path's own directory; `/` and the system
    /// directories (readable anyway) are never added. `cwd`, when given, is added as it is.
    pub fn with_program_homes<'a>(
        &self,
        program: &Path,
        args: impl IntoIterator<Item = &'a str>,
        cwd: Option<&Path>,
    ) -> Self {
        let Some(bound) = &self.inner else {
            return self.clone();
        };
        let mut extra: Vec<PathBuf> = Vec::new();
        let resolved = if program.components().count() > 1 {
            Some(program.to_owned())
        } else {
            search_path(program)
        };
        let base = cwd.map(Path::to_owned).unwrap_or_default();
        let candidates = resolved.into_iter().chain(
            args.into_iter()
                .map(|a| base.join(a))
                .filter(|p| p.is_absolute() && p.exists()),
        );
        for path in candidates {
            let canonical = std::fs::canonicalize(&path).ok();
            for p in std::iter::once(path).chain(canonical) {
                if let Some(home) = program_home(&p)
                    && !extra.contains(&home)
                {
                    extra.push(home);
                }
            }
        }
        if let Some(cwd) = cwd.filter(|c| c.is_dir()) {
            extra.push(cwd.to_owned());
        }
        let mut profile = bound.profile.clone();
        profile.read.extend(extra);
        Self {
            inner: Some(Arc::new(Bound::new(
                profile,
                bound.workspace.clone(),
                bound.protected.clone(),
                bound.egress.clone(),
                bound.warm.is_some(),
            ))),
        }
    }

    /// Whether processes are confined.
    pub fn is_on(&self) -> bool {
        self.inner.is_some()
    }

    /// The profile's name, or `None` when off.
    pub fn profile_name(&self) -> Option<&str> {
        self.inner.as_deref().map(|b| b.profile.name.as_str())
    }

    /// Checks that this kernel can confine processes as the profile asks (Landlock ABI, user
    /// namespaces), once per process. A sandbox that is off always passes.
    pub fn check(&self) -> Result<(), SandboxError> {
        if self.inner.is_none() {
            return Ok(());
        }
        kernel_support()?;
        crate::cgroup::check_confinable()
    }

    /// Prepares the confinement of one process (everything the child needs, computed here).
    /// `None` when the sandbox is off.
    pub(crate) fn prepare(&self) -> Result<Option<Prepared>, SandboxError> {
        let Some(bound) = &self.inner else {
            return Ok(None);
        };
        kernel_support()?;
        let scratch = tempfile::Builder::new()
            .prefix(limits::SANDBOX_SCRATCH_PREFIX)
            .tempdir()
            .map_err(|e| SandboxError::Setup(format!("creating the scratch directory: {e}")))?;
        let masks = fs::masks(bound, scratch.path())?;
        let ruleset = fs::ruleset(bound, scratch.path())?;
        let egress_wanted = matches!(bound.profile.network, NetworkPolicy::Proxy { .. });
        if egress_wanted && bound.egress.is_none() {
            return Err(SandboxError::NoEgressProxy {
                profile: bound.profile.name.clone(),
            });
        }
        let warm = bound.warm()?;
        let plan = child::Plan::new(ruleset, syscalls::filter()?, masks, egress_wanted, warm)?;
        Ok(Some(Prepared {
            plan: Arc::new(plan),
            scratch,
            bound: bound.clone(),
            cgroup: None,
        }))
    }
}

impl Sandbox {
    /// Confines a command spawned outside this crate (a stdio upstream server): registers the
    /// sandbox on `command` and sets its variables. Spawn it, then call
    /// [`PendingConfinement::started`] and keep the guard while it runs. A spawn error is
    /// explained by [`explain_spawn_error`]. When the sandbox is off the command still gets a
    /// pids cgroup where one can be made, so that nothing it starts outlives the guard, or a
    /// killed ring0 past the next one's start.
    pub fn confine_command(
        &self,
        command: &mut tokio::process::Command,
    ) -> Result<PendingConfinement, SandboxError> {
        let Some(mut prepared) = self.prepare()? else {
            let cgroup = crate::cgroup::for_run(None, false)?;
            if let Some(cgroup) = &cgroup {
                crate::hooks::install_cgroup(command, cgroup.procs_fd());
            }
            return Ok(PendingConfinement(Pending::Unconfined(cgroup)));
        };
        let cgroup = crate::cgroup::for_run(prepared.bound.profile.processes_max, true)?;
        command.envs(prepared.env());
        crate::hooks::install_confinement(
            command,
            prepared.plan.clone(),
            cgroup.as_ref().map(|c| c.procs_fd()),
        );
        prepared.cgroup = cgroup;
        Ok(PendingConfinement(Pending::Confined(prepared)))
    }
}

/// A confinement registered on a command that has not been spawned yet.
pub struct PendingConfinement(Pending);

enum Pending {
    Confined(Prepared),
    /// The sandbox is off: only the cgroup, if one could be made.
    Unconfined(Option<crate::cgroup::RunCgroup>),
}

impl PendingConfinement {
    /// After a successful spawn: hands over the egress listener, returns what must live as
    /// long as the process.
    pub fn started(self) -> Result<Guard, SandboxError> {
        match self.0 {
            Pending::Confined(prepared) => prepared.started(),
            Pending::Unconfined(cgroup) => Ok(Guard {
                _egress: None,
                _scratch: None,
                _cgroup: cgroup,
            }),
        }
    }
}

/// The sandbox step that made a spawn fail, if one did.
pub fn explain_spawn_error(error: &std::io::Error) -> Option<SandboxError> {
    step_failure(error)
}

/// One process's confinement, between preparation and spawn.
pub(crate) struct Prepared {
    pub(crate) plan: Arc<child::Plan>,
    scratch: tempfile::TempDir,
    bound: Arc<Bound>,
    /// The cgroup of a process spawned outside this crate (a stdio upstream), kept by its
    /// [`Guard`]; the runs of [`crate::run_command`] keep theirs in their identity.
    cgroup: Option<crate::cgroup::RunCgroup>,
}

impl Prepared {
    /// Variables the confined process gets on top of its environment.
    pub(crate) fn env(&self) -> Vec<(String, String)> {
        let scratch = self.scratch.path().to_string_lossy().into_owned();
        let mut env = vec![
            ("HOME".to_owned(), scratch.clone()),
            ("TMPDIR".to_owned(), scratch),
        ];
        if self.plan.egress_wanted() {
            let url = format!("http://127.0.0.1:{}", limits::SANDBOX_EGRESS_PORT);
            for name in [
                "HTTP_PROXY",
                "HTTPS_PROXY",
                "ALL_PROXY",
                "http_proxy",
                "https_proxy",
                "all_proxy",
            ] {
                env.push((name.to_owned(), url.clone()));
            }
            env.push(("NO_PROXY".to_owned(), String::new()));
        }
        env
    }

    /// After the spawn: hands the egress listener (if any) to the proxy, and returns what must
    /// live as long as the process (the scratch directory).
    pub(crate) fn started(self) -> Result<Guard, SandboxError> {
        let mut egress = None;
        if let Some(listener) = self.plan.take_egress()? {
            let proxy = self
                .bound
                .egress
                .as_ref()
                .ok_or_else(|| SandboxError::NoEgressProxy {
                    profile: self.bound.profile.name.clone(),
                })?;
            egress = Some(proxy.serve(listener, &self.bound.profile)?);
        }
        Ok(Guard {
            _egress: egress,
            _scratch: Some(self.scratch),
            _cgroup: self.cgroup,
        })
    }

    /// The most tasks the profile lets one process tree have, if it says.
    pub(crate) fn processes_max(&self) -> Option<u64> {
        self.bound.profile.processes_max
    }
}

/// Kept while a confined process runs; stops serving its egress listener and removes its
/// scratch directory when dropped.
pub struct Guard {
    _egress: Option<EgressServing>,
    _scratch: Option<tempfile::TempDir>,
    /// Dropped last: whatever is left in the process's cgroup is ended with it.
    _cgroup: Option<crate::cgroup::RunCgroup>,
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("sandbox::Guard")
    }
}

/// The kernel's Landlock ABI and user namespaces, probed once.
fn kernel_support() -> Result<(), SandboxError> {
    static SUPPORT: OnceLock<Result<(), (&'static str, String)>> = OnceLock::new();
    SUPPORT
        .get_or_init(|| {
            fs::probe().map_err(|d| ("Landlock (ABI 3 or later)", d))?;
            child::probe_namespaces().map_err(|d| ("unprivileged user namespaces", d))
        })
        .clone()
        .map_err(|(feature, detail)| SandboxError::Unavailable { feature, detail })
}

/// Hidden directories of a home that hold secrets, never a program's home.
const SECRET_HOME_DIRS: &[&str] = &[
    ".ssh", ".gnupg", ".aws", ".config", ".local", ".kube", ".docker",
];

/// The directory a program or script is installed in (see [`Sandbox::with_program_homes`]).
fn program_home(path: &Path) -> Option<PathBuf> {
    use std::ffi::OsStr;
    let ancestors: Vec<&Path> = path.ancestors().skip(1).collect();
    // A toolchain manager's directory in the user's home (`~/.pyenv`, `~/.nvm`, `~/.cargo`):
    // `HOME`, or the account's home when `HOME` points elsewhere (a test harness, a service).
    let user_homes = [std::env::var_os("HOME").map(PathBuf::from), account_home()];
    let in_home = |a: &&&Path| {
        a.parent()
            .is_some_and(|p| user_homes.iter().flatten().any(|h| h == p))
            && a.file_name()
                .and_then(OsStr::to_str)
                .is_some_and(|n| n.starts_with('.') && !SECRET_HOME_DIRS.contains(&n))
    };
    let home = ancestors
        .iter()
        .find(in_home)
        .copied()
        .or_else(|| {
            ancestors
                .iter()
                .rev()
                .find(|a| a.file_name() == Some(OsStr::new("node_modules")))
                .and_then(|m| m.parent())
        })
        .or_else(|| {
            ancestors
                .iter()
                .find(|a| a.file_name() == Some(OsStr::new("bin")))
                .and_then(|b| b.parent())
        })
        .or_else(|| path.parent())?;
    let system = SYSTEM_READ_DIRS
        .iter()
        .any(|d| home == Path::new(d) || home.starts_with(d));
    (home != Path::new("/") && !system && home.is_dir()).then(|| home.to_owned())
}

/// The home directory of ring0's account in `/etc/passwd`, if it has one there. (Only the file:
/// an account known through another name service falls back to `HOME` alone.)
fn account_home() -> Option<PathBuf> {
    let uid = rustix::process::getuid().as_raw().to_string();
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    let dir = passwd.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        (fields.len() >= 7 && fields[2] == uid).then(|| PathBuf::from(fields[5]))
    })?;
    (dir.is_absolute() && dir != Path::new("/")).then_some(dir)
}

/// `program` looked up in ring0's `PATH`, as `execvp` would.
fn search_path(program: &Path) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

fn cstring(path: &Path) -> Result<CString, SandboxError> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| SandboxError::Setup(format!("path {path:?} contains a NUL byte")))
}

/// A mount the child makes over a path before it is confined.
#[derive(Debug)]
pub(crate) struct Mask {
    /// The path masked.
    pub(crate) target: CString,
    /// What goes over it.
    pub(crate) cover: Cover,
    /// Flags the existing mount is locked with (kept on a read-only remount).
    pub(crate) locked_flags: libc::c_ulong,
}

#[derive(Debug)]
pub(crate) enum Cover {
    /// An empty read-only file (bind-mounted from the scratch directory).
    EmptyFile(CString),
    /// An empty read-only directory (a tmpfs).
    EmptyDir,
    /// The path itself, read-only (a bind mount onto itself).
    ReadOnly,
}

#[allow(dead_code)]
fn _assert_send_sync() {
    fn is<T: Send + Sync>() {}
    is::<child::Plan>();
    is::<OwnedFd>();
}
