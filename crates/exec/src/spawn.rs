//! Creating the process: a new session and process group, the explicit environment, the
//! checked working directory, the stdin mode, the parent-death signal and resource limits.
//!
//! Unconfined pipes go through [`crate::vfork`] (no copy of ring0's address space); confined
//! pipes through tokio's process support wrapped by process-wrap's `ProcessSession` (the
//! `setsid` before exec); terminals through `pty-process`, which makes the child a session
//! leader with the terminal as its controlling terminal. Each applies [`crate::hooks`] for the
//! rest, and each registers the child in [`crate::reaper`] under the spawn lock.
//!
//! The parent-death signal fires when the *thread* that spawned the child exits. Spawning happens
//! on the calling task's thread: a runtime worker, which lives as long as its runtime. Do not
//! drive this crate from `spawn_blocking` threads, which the runtime retires when idle.

use crate::cgroup;
use crate::error::ExecError;
use crate::hooks::{self, ChildSetup};
use crate::reaper::{self, DirectChild};
use crate::sandbox;
use crate::spec::{PreparedCommand, SUPERVISION_TOKEN_ENV, StdinMode};
use crate::teardown::RunIdentity;
use crate::vfork;
use std::io;
use std::path::PathBuf;
use std::process::ExitStatus;
use tokio::process::{ChildStderr, ChildStdin, ChildStdout};

/// The object a job reads its input from, to recognise a process blocked reading it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum InputObject {
    /// A pipe, by inode (as `/proc/<pid>/fd/N` shows `pipe:[inode]`).
    Pipe(u64),
    /// A terminal, by the path of its slave side.
    Tty(PathBuf),
}

/// Where a process's input can be written.
pub(crate) enum InputWriter {
    Pipe(ChildStdin),
    Tty(pty_process::OwnedWritePty),
}

/// Output sources.
pub(crate) enum OutputReaders {
    Pipes {
        stdout: ChildStdout,
        stderr: ChildStderr,
    },
    Tty(pty_process::OwnedReadPty),
}

/// The root process of a run, as spawned.
pub(crate) enum Root {
    Tty(tokio::process::Child),
    /// Spawned by [`crate::vfork`]; a confined one with the stacks its keeper and init run on,
    /// released after the root (so after both) is gone.
    Lean {
        child: vfork::Child,
        _stacks: Option<vfork::Stacks>,
    },
}

impl Root {
    /// Sends SIGKILL to the root process.
    fn start_kill(&mut self) -> io::Result<()> {
        match self {
            Self::Tty(child) => child.start_kill(),
            Self::Lean { child, .. } => child.start_kill(),
        }
    }

    /// Waits for the root process alone (not its group) to exit. Cancel-safe.
    pub(crate) async fn wait(&mut self) -> io::Result<ExitStatus> {
        match self {
            Self::Tty(child) => child.wait().await,
            Self::Lean { child, .. } => child.wait().await,
        }
    }
}

/// A spawned process with everything supervision needs.
pub(crate) struct Spawned {
    pub root: Root,
    pub readers: OutputReaders,
    pub writer: Option<InputWriter>,
    pub input_object: Option<InputObject>,
    pub identity: RunIdentity,
    /// Registration in the direct-children registry; dropped after the root is reaped.
    pub registration: DirectChild,
    /// The sandbox's scratch directory, kept while the process runs (`None` when off).
    pub sandbox: Option<sandbox::Guard>,
}

fn spawn_error(command: &PreparedCommand, source: io::Error) -> ExecError {
    if let Some(failure) = sandbox::step_failure(&source) {
        return ExecError::Sandbox(failure);
    }
    ExecError::Spawn {
        program: command.program.to_string_lossy().into_owned(),
        source,
    }
}

fn base_command(
    command: &PreparedCommand,
    token: &str,
    confined: Option<&sandbox::Prepared>,
) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(&command.program);
    cmd.args(&command.args)
        .env_clear()
        .envs(command.env.iter().map(|(k, v)| (k, v)))
        .envs(confined.map(|c| c.env()).unwrap_or_default())
        .env(SUPERVISION_TOKEN_ENV, token)
        .current_dir(&command.cwd)
        // Killing on drop only reaches the root; teardown is explicit and covers the tree.
        .kill_on_drop(false);
    cmd
}

/// Spawns `command`. Errors mean nothing is running.
pub(crate) fn spawn(command: &PreparedCommand) -> Result<Spawned, ExecError> {
    reaper::ensure_subreaper().map_err(ExecError::Setup)?;
    let token = uuid::Uuid::new_v4().simple().to_string();
    let confined = command.sandbox.prepare()?;
    let tasks_max = confined
        .as_ref()
        .and_then(sandbox::Prepared::processes_max)
        .or(command.limits.processes);
    let cgroup = cgroup::for_run(tasks_max, confined.is_some())?;
    let mut setup = ChildSetup::new(&command.limits);
    if let Some(cgroup) = &cgroup {
        setup = setup.join_cgroup(cgroup.procs_fd());
    }
    let mut spawned = match command.stdin {
        StdinMode::Null | StdinMode::Pipe => spawn_lean(command, token, setup, confined.as_ref()),
        StdinMode::Tty => spawn_tty(command, token, setup, confined.as_ref()),
    }?;
    spawned.identity.cgroup = cgroup.map(std::sync::Arc::new);
    if let Some(confined) = confined {
        match confined.started() {
            Ok(guard) => spawned.sandbox = Some(guard),
            Err(e) => {
                // Its egress could not be served: it must not run on. Killing the root (the
                // init of its PID namespace) ends everything inside.
                let _ = spawned.root.start_kill();
                return Err(e.into());
            }
        }
    }
    Ok(spawned)
}

/// A pipe from `pipe2` with both ends close-on-exec: (read, write).
fn pipe() -> io::Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)> {
    let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    Ok((above_stdio(read)?, above_stdio(write)?))
}

/// `fd`, moved above 0–2 if it is one of them (ring0 started with a standard descriptor
/// closed), so that moving the child's stdio into place never overwrites another of them.
fn above_stdio(fd: std::os::fd::OwnedFd) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::AsRawFd;
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    Ok(rustix::io::fcntl_dupfd_cloexec(&fd, 3)?)
}

/// A process on pipes, spawned without copying ring0's address space ([`crate::vfork`]).
fn spawn_lean(
    command: &PreparedCommand,
    token: String,
    setup: ChildSetup,
    confined: Option<&sandbox::Prepared>,
) -> Result<Spawned, ExecError> {
    use std::os::fd::AsRawFd;
    let setup_error = |what: &str, e: io::Error| ExecError::Setup(format!("{what}: {e}"));
    let interactive = command.stdin == StdinMode::Pipe;
    let (stdin_read, stdin_write) = if interactive {
        let (read, write) = pipe().map_err(|e| setup_error("stdin pipe", e))?;
        (read, Some(write))
    } else {
        let null = std::fs::File::open("/dev/null")
            .and_then(|null| above_stdio(null.into()))
            .map_err(|e| setup_error("/dev/null", e))?;
        (null, None)
    };
    let (stdout_read, stdout_write) = pipe().map_err(|e| setup_error("stdout pipe", e))?;
    let (stderr_read, stderr_write) = pipe().map_err(|e| setup_error("stderr pipe", e))?;
    let mut env = command.env.clone();
    let extra = confined.map(|c| c.env()).unwrap_or_default();
    let extra = extra
        .into_iter()
        .map(|(k, v)| (k.into(), v.into()))
        .chain(std::iter::once((
            SUPERVISION_TOKEN_ENV.into(),
            token.clone().into(),
        )));
    for (name, value) in extra {
        // A later value replaces an earlier one of the same name, as `Command::env` does.
        env.retain(|(k, _)| *k != name);
        env.push((name, value));
    }
    let stdio = [
        stdin_read.as_raw_fd(),
        stdout_write.as_raw_fd(),
        stderr_write.as_raw_fd(),
    ];
    let request = vfork::Request::new(
        &command.program,
        &command.args,
        &env,
        &command.cwd,
        stdio,
        setup,
    )
    .map_err(|e| spawn_error(command, e))?;

    let mut registry = reaper::lock();
    let (child, stacks) = match confined {
        None => (vfork::spawn(&request), None),
        Some(c) => match vfork::spawn_confined(&request, &c.plan) {
            Ok(confined) => (Ok(confined.child), Some(confined.stacks)),
            Err(e) => (Err(e), None),
        },
    };
    let child = child.map_err(|e| spawn_error(command, e))?;
    let pid = child.id();
    let registration = registry.register(pid);
    drop(registry);
    drop((stdin_read, stdout_write, stderr_write));

    let reader = |fd: std::os::fd::OwnedFd, what: &str| {
        let std_fd = std::process::ChildStdout::from(fd);
        ChildStdout::from_std(std_fd).map_err(|e| setup_error(what, e))
    };
    let stdout = reader(stdout_read, "stdout pipe")?;
    let stderr = ChildStderr::from_std(std::process::ChildStderr::from(stderr_read))
        .map_err(|e| setup_error("stderr pipe", e))?;
    let (writer, input_object) = match stdin_write {
        Some(write) => {
            let stdin = ChildStdin::from_std(std::process::ChildStdin::from(write))
                .map_err(|e| setup_error("stdin pipe", e))?;
            let inode = stdin
                .as_fd_inode()
                .map_err(|e| ExecError::Setup(format!("stdin pipe: {e}")))?;
            (
                Some(InputWriter::Pipe(stdin)),
                Some(InputObject::Pipe(inode)),
            )
        }
        None => (None, None),
    };
    Ok(Spawned {
        root: Root::Lean {
            child,
            _stacks: stacks,
        },
        readers: OutputReaders::Pipes { stdout, stderr },
        writer,
        input_object,
        identity: RunIdentity {
            root: pid,
            token,
            cgroup: None,
        },
        registration,
        sandbox: None,
    })
}

fn spawn_tty(
    command: &PreparedCommand,
    token: String,
    setup: ChildSetup,
    confined: Option<&sandbox::Prepared>,
) -> Result<Spawned, ExecError> {
    let setup_error = |what: &str, e: pty_process::Error| ExecError::Setup(format!("{what}: {e}"));
    let (pty, pts) = pty_process::open().map_err(|e| setup_error("opening a terminal", e))?;
    pty.resize(pty_process::Size::new(24, 80))
        .map_err(|e| setup_error("sizing the terminal", e))?;
    let tty_path = {
        use std::os::fd::AsRawFd;
        let fd = std::os::fd::AsFd::as_fd(&pts).as_raw_fd();
        std::fs::read_link(format!("/proc/self/fd/{fd}"))
            .map_err(|e| ExecError::Setup(format!("naming the terminal: {e}")))?
    };
    let cmd = pty_process::Command::from(base_command(command, &token, confined));
    let cmd = hooks::install_pty(cmd, setup, confined.map(|c| c.plan.clone()));

    let mut registry = reaper::lock();
    let child = cmd.spawn(pts).map_err(|e| match e {
        pty_process::Error::Io(io) => spawn_error(command, io),
        other => setup_error("starting on a terminal", other),
    })?;
    let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) else {
        return Err(ExecError::Setup("spawned child has no pid".into()));
    };
    let registration = registry.register(pid);
    drop(registry);

    let (read, write) = pty.into_split();
    Ok(Spawned {
        root: Root::Tty(child),
        readers: OutputReaders::Tty(read),
        writer: Some(InputWriter::Tty(write)),
        input_object: Some(InputObject::Tty(tty_path)),
        identity: RunIdentity {
            root: pid,
            token,
            cgroup: None,
        },
        registration,
        sandbox: None,
    })
}

trait FdInode {
    fn as_fd_inode(&self) -> io::Result<u64>;
}

impl FdInode for ChildStdin {
    fn as_fd_inode(&self) -> io::Result<u64> {
        let stat = rustix::fs::fstat(self).map_err(io::Error::from)?;
        Ok(stat.st_ino)
    }
}
