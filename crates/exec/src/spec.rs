//! What to run and under which rules: [`CommandSpec`] (the request) and [`ExecPolicy`] (the
//! operator's configuration), checked together into a [`PreparedCommand`] before anything is
//! spawned.
//!
//! Preparation is where every input rule lives, so a bad request is refused with a structured
//! [`ExecError`] and nothing runs: argv is explicit unless a shell string is asked for *and*
//! allowed; the environment starts empty and only allow-listed names are inherited; the working
//! directory must resolve (symlinks included) inside the canonical workspace root.

use crate::error::ExecError;
use crate::limits;
use crate::sandbox::{Sandbox, SandboxProfile};
use ring0_shape::ShapeConfig;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Environment variable that carries a random per-run token into every process of the run, so
/// that descendants which leave the process group and the session (`setsid` plus a double fork)
/// can still be found and killed. Callers cannot set it.
pub const SUPERVISION_TOKEN_ENV: &str = "RING0_SUPERVISION_TOKEN";

/// Names inherited from ring0's own environment unless the configuration says otherwise.
pub const ENV_ALLOW_DEFAULT: &[&str] =
    &["PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR"];

/// The command line: explicit argv (the default), or a shell script.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CommandLine {
    /// Program and arguments, passed to `execve` as they are. No shell parses them, so no quoting
    /// or `--` is needed to keep an argument from being read as shell syntax.
    Argv(Vec<String>),
    /// A script for `sh -c`. Only accepted when the policy allows a shell.
    Shell(String),
}

/// Where the process reads its standard input from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StdinMode {
    /// `/dev/null`: a read returns end-of-file at once, so nothing can wait for input.
    #[default]
    Null,
    /// A pipe that `send_input` writes to.
    Pipe,
    /// A pseudo-terminal: stdin, stdout and stderr are its slave side (the two output streams
    /// arrive merged, as on a terminal).
    Tty,
}

impl StdinMode {
    pub fn is_interactive(self) -> bool {
        !matches!(self, Self::Null)
    }
}

/// One request to run a command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandSpec {
    pub command: CommandLine,
    /// Working directory: relative to the workspace root, or absolute inside it. Default: the root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<PathBuf>,
    /// Variables set explicitly (on top of the allow-listed inherited ones).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub stdin: StdinMode,
    /// Wall-clock limit in milliseconds. Default [`limits::TIMEOUT_DEFAULT`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Whose output this is (a session's scope): the spill handles of a cut output are sealed
    /// for it (`ShapeConfig::spill_owner`). Default: the policy's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spill_owner: Option<String>,
}

impl CommandSpec {
    /// A command given as explicit argv.
    pub fn argv<I, S>(argv: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            command: CommandLine::Argv(argv.into_iter().map(Into::into).collect()),
            cwd: None,
            env: BTreeMap::new(),
            stdin: StdinMode::Null,
            timeout_ms: None,
            spill_owner: None,
        }
    }

    /// A command given as a shell script (refused unless the policy allows a shell).
    pub fn shell(script: impl Into<String>) -> Self {
        Self {
            command: CommandLine::Shell(script.into()),
            ..Self::argv(Vec::<String>::new())
        }
    }

    pub fn cwd(mut self, cwd: impl Into<PathBuf>) -> Self {
        self.cwd = Some(cwd.into());
        self
    }

    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(name.into(), value.into());
        self
    }

    pub fn stdin(mut self, stdin: StdinMode) -> Self {
        self.stdin = stdin;
        self
    }

    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout_ms = Some(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX));
        self
    }

    pub fn spill_owner(mut self, owner: impl Into<String>) -> Self {
        self.spill_owner = Some(owner.into());
        self
    }
}

/// POSIX resource limits applied to the spawned process (and inherited by its descendants).
/// `None` leaves ring0's own limit in place. A value above ring0's current hard limit is lowered
/// to it, since an unprivileged process cannot raise a hard limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceLimits {
    /// RLIMIT_CPU soft limit; SIGXCPU at the soft limit, SIGKILL one second later.
    pub cpu_seconds: Option<u64>,
    /// RLIMIT_NOFILE.
    pub open_files: Option<u64>,
    /// RLIMIT_NPROC (counted per real user id by the kernel; privileged users are exempt).
    pub processes: Option<u64>,
    /// RLIMIT_AS, off by default: runtimes that reserve large virtual ranges (JVMs, Go, sanitizers)
    /// fail under a tight address-space limit.
    pub address_space_bytes: Option<u64>,
    /// RLIMIT_CORE; 0 by default so a crashing tool cannot fill the disk with core files.
    pub core_file_bytes: Option<u64>,
}

impl Default for ResourceLimits {
    fn default() -> Self {
        Self {
            cpu_seconds: Some(limits::CPU_SECONDS_DEFAULT),
            open_files: Some(limits::OPEN_FILES_DEFAULT),
            processes: Some(limits::PROCESSES_DEFAULT),
            address_space_bytes: None,
            core_file_bytes: Some(0),
        }
    }
}

/// The operator's rules for every command run through this crate.
#[derive(Debug, Clone)]
pub struct ExecPolicy {
    /// Commands run inside this directory (canonicalized when the policy is checked).
    pub workspace_root: PathBuf,
    /// Names inherited from ring0's environment. Nothing else is inherited.
    pub env_allow: Vec<String>,
    /// Whether [`CommandLine::Shell`] is accepted.
    pub shell_allowed: bool,
    /// The shell used for [`CommandLine::Shell`].
    pub shell_program: PathBuf,
    pub resource_limits: ResourceLimits,
    /// SIGTERM → SIGKILL grace period.
    pub termination_grace: Duration,
    /// Cumulative output bytes that end the run (`OutputCeiling`).
    pub output_ceiling_bytes: u64,
    /// How output is shaped: model-visible budget, spill store, token counting, provenance.
    pub shape: ShapeConfig,
    /// The OS sandbox every process runs in. Default: the `workspace` profile over
    /// `workspace_root` (see [`crate::sandbox`]); [`Sandbox::off`] only on explicit request.
    pub sandbox: Sandbox,
}

impl ExecPolicy {
    /// A policy with documented defaults for the given workspace.
    pub fn new(workspace_root: impl Into<PathBuf>) -> Self {
        let workspace_root = workspace_root.into();
        Self {
            sandbox: Sandbox::new(SandboxProfile::workspace(), &workspace_root, Vec::new()),
            workspace_root,
            env_allow: ENV_ALLOW_DEFAULT.iter().map(|s| (*s).to_owned()).collect(),
            shell_allowed: false,
            shell_program: PathBuf::from("/bin/sh"),
            resource_limits: ResourceLimits::default(),
            termination_grace: limits::TERMINATION_GRACE_DEFAULT,
            output_ceiling_bytes: limits::OUTPUT_CEILING_BYTES_DEFAULT,
            shape: ShapeConfig::default(),
        }
    }

    pub fn allow_shell(mut self, allowed: bool) -> Self {
        self.shell_allowed = allowed;
        self
    }

    pub fn termination_grace(mut self, grace: Duration) -> Self {
        self.termination_grace = grace;
        self
    }

    pub fn output_ceiling_bytes(mut self, bytes: u64) -> Self {
        self.output_ceiling_bytes = bytes;
        self
    }

    /// Sets the model-visible observation budget (the shaper's `budget_bytes`).
    pub fn observation_budget_bytes(mut self, bytes: usize) -> Self {
        self.shape.budget_bytes = bytes;
        self
    }

    pub fn shape(mut self, shape: ShapeConfig) -> Self {
        self.shape = shape;
        self
    }

    pub fn resource_limits(mut self, limits: ResourceLimits) -> Self {
        self.resource_limits = limits;
        self
    }

    /// Sets the sandbox processes run in.
    pub fn sandbox(mut self, sandbox: Sandbox) -> Self {
        self.sandbox = sandbox;
        self
    }
}

/// A request checked against a policy: everything the spawner needs, nothing left to decide.
#[derive(Debug, Clone)]
pub struct PreparedCommand {
    pub(crate) program: OsString,
    pub(crate) args: Vec<OsString>,
    pub(crate) cwd: PathBuf,
    pub(crate) env: Vec<(OsString, OsString)>,
    pub(crate) stdin: StdinMode,
    pub(crate) timeout: Duration,
    pub(crate) limits: ResourceLimits,
    pub(crate) grace: Duration,
    pub(crate) output_ceiling_bytes: u64,
    pub(crate) shape: ShapeConfig,
    pub(crate) sandbox: Sandbox,
}

impl PreparedCommand {
    /// Checks `spec` against `policy`. Every rule of this module is applied here.
    pub fn prepare(policy: &ExecPolicy, spec: &CommandSpec) -> Result<Self, ExecError> {
        let (program, args) = prepare_command_line(policy, &spec.command)?;
        policy
            .shape
            .validate()
            .map_err(|e| ExecError::ShapeConfig(e.to_string()))?;
        let cwd = resolve_cwd(&policy.workspace_root, spec.cwd.as_deref())?;
        let env = prepare_env(&policy.env_allow, &spec.env)?;
        let timeout = match spec.timeout_ms {
            None => limits::TIMEOUT_DEFAULT,
            Some(0) => return Err(ExecError::TimeoutZero),
            Some(ms) => {
                let timeout = Duration::from_millis(ms);
                if timeout > limits::TIMEOUT_MAX {
                    return Err(ExecError::TimeoutTooLong {
                        timeout_ms: ms,
                        max_ms: limits::TIMEOUT_MAX.as_millis() as u64,
                    });
                }
                timeout
            }
        };
        Ok(Self {
            program,
            args,
            cwd,
            env,
            stdin: spec.stdin,
            timeout,
            limits: policy.resource_limits,
            grace: policy.termination_grace,
            output_ceiling_bytes: policy.output_ceiling_bytes,
            shape: {
                let mut shape = policy.shape.clone();
                if let Some(owner) = &spec.spill_owner {
                    shape.spill_owner = Some(owner.as_str().into());
                }
                shape
            },
            sandbox: policy.sandbox.clone(),
        })
    }

    /// The program as it will be passed to `execve` (for messages).
    pub fn program(&self) -> &std::ffi::OsStr {
        &self.program
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A short, printable rendering of the command line for logs and receipts.
    pub fn display(&self) -> String {
        let mut out = self.program.to_string_lossy().into_owned();
        for arg in &self.args {
            if out.len() > 200 {
                out.push_str(" …");
                break;
            }
            out.push(' ');
            out.push_str(&arg.to_string_lossy());
        }
        out
    }
}

fn prepare_command_line(
    policy: &ExecPolicy,
    line: &CommandLine,
) -> Result<(OsString, Vec<OsString>), ExecError> {
    match line {
        CommandLine::Argv(argv) => {
            let Some(first) = argv.first() else {
                return Err(ExecError::EmptyArgv);
            };
            if first.is_empty() {
                return Err(ExecError::EmptyProgram);
            }
            if argv.len() > limits::ARGV_ENTRIES_MAX {
                return Err(ExecError::ArgvTooLarge {
                    entries: argv.len(),
                    bytes: argv.iter().map(String::len).sum(),
                });
            }
            let bytes: usize = argv.iter().map(String::len).sum();
            if bytes > limits::ARGV_BYTES_MAX {
                return Err(ExecError::ArgvTooLarge {
                    entries: argv.len(),
                    bytes,
                });
            }
            if let Some(index) = argv.iter().position(|a| a.contains('\0')) {
                return Err(ExecError::NulInArgument { index });
            }
            Ok((
                OsString::from(first),
                argv[1..].iter().map(OsString::from).collect(),
            ))
        }
        CommandLine::Shell(script) => {
            if !policy.shell_allowed {
                return Err(ExecError::ShellNotAllowed);
            }
            if script.len() > limits::ARGV_BYTES_MAX {
                return Err(ExecError::ArgvTooLarge {
                    entries: 1,
                    bytes: script.len(),
                });
            }
            if script.contains('\0') {
                return Err(ExecError::NulInArgument { index: 0 });
            }
            Ok((
                policy.shell_program.clone().into_os_string(),
                vec![OsString::from("-c"), OsString::from(script)],
            ))
        }
    }
}

/// Resolves `cwd` against the workspace root and checks, after resolving symlinks, that it stays
/// inside. The resolved path is what the child gets, so a symlink swapped in later changes nothing.
pub fn resolve_cwd(workspace_root: &Path, cwd: Option<&Path>) -> Result<PathBuf, ExecError> {
    let root = std::fs::canonicalize(workspace_root).map_err(|source| {
        ExecError::WorkspaceRootUnusable {
            root: workspace_root.to_path_buf(),
            reason: source.to_string(),
        }
    })?;
    let wanted = match cwd {
        None => return Ok(root),
        Some(path) if path.is_absolute() => path.to_path_buf(),
        Some(path) => root.join(path),
    };
    let resolved = std::fs::canonicalize(&wanted).map_err(|source| ExecError::CwdUnusable {
        cwd: wanted.clone(),
        reason: source.to_string(),
    })?;
    if !resolved.starts_with(&root) {
        return Err(ExecError::CwdOutsideWorkspace {
            cwd: wanted,
            resolved,
            root,
        });
    }
    if !resolved.is_dir() {
        return Err(ExecError::CwdUnusable {
            cwd: wanted,
            reason: "not a directory".into(),
        });
    }
    Ok(resolved)
}

fn prepare_env(
    allow: &[String],
    explicit: &BTreeMap<String, String>,
) -> Result<Vec<(OsString, OsString)>, ExecError> {
    if explicit.len() > limits::ENV_ENTRIES_MAX {
        return Err(ExecError::EnvTooLarge {
            entries: explicit.len(),
            bytes: explicit.iter().map(|(k, v)| k.len() + v.len()).sum(),
        });
    }
    let bytes: usize = explicit.iter().map(|(k, v)| k.len() + v.len()).sum();
    if bytes > limits::ENV_BYTES_MAX {
        return Err(ExecError::EnvTooLarge {
            entries: explicit.len(),
            bytes,
        });
    }
    let mut env = Vec::with_capacity(allow.len() + explicit.len());
    for name in allow {
        if explicit.contains_key(name) || name == SUPERVISION_TOKEN_ENV {
            continue;
        }
        if let Some(value) = std::env::var_os(name) {
            env.push((OsString::from(name), value));
        }
    }
    for (name, value) in explicit {
        if name.is_empty() || name.contains('=') || name.contains('\0') {
            return Err(ExecError::EnvNameInvalid { name: name.clone() });
        }
        if name == SUPERVISION_TOKEN_ENV {
            return Err(ExecError::EnvNameReserved { name: name.clone() });
        }
        if value.contains('\0') {
            return Err(ExecError::EnvValueInvalid { name: name.clone() });
        }
        env.push((OsString::from(name), OsString::from(value)));
    }
    Ok(env)
}
