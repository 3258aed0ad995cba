//! The code that runs in the child between `fork` and `execve`: parent-death signal and
//! resource limits.
//!
//! This is the only module of the crate that allows `unsafe`: registering a `pre_exec` closure is
//! an `unsafe` API in std, tokio and `pty-process` because the closure runs in a forked copy of a
//! multi-threaded process, where only async-signal-safe operations are sound. process-wrap's
//! `ProcessSession` covers `setsid`; nothing covers `PR_SET_PDEATHSIG` and `setrlimit`, which must
//! be done by the child itself (a parent can `prlimit` a child, but only after it has started
//! running the program, too late for a fork bomb).

#![allow(unsafe_code)]

use crate::sandbox::Plan;
use crate::spec::ResourceLimits;
use rustix::process::{self, Pid, Resource, Rlimit, Signal};
use std::io;
use std::os::fd::RawFd;
use std::sync::Arc;

/// Most limits one child gets (CPU, open files, processes, address space, core size).
const LIMITS_MAX: usize = 5;

/// Everything the child must do before `execve`, computed in the parent so that the child
/// neither allocates nor reads anything.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ChildSetup {
    parent: Pid,
    /// The run's `cgroup.procs`, open for writing (see [`crate::cgroup`]); -1 for none.
    cgroup_procs: RawFd,
    limits: [(Resource, Rlimit); LIMITS_MAX],
    limit_count: usize,
}

impl ChildSetup {
    /// Prepares the setup for a child of this process. Each requested limit is lowered to
    /// ring0's own hard limit, since an unprivileged child cannot raise it.
    pub(crate) fn new(limits: &ResourceLimits) -> Self {
        let mut setup = Self {
            parent: process::getpid(),
            cgroup_procs: -1,
            limits: [(
                Resource::Core,
                Rlimit {
                    current: None,
                    maximum: None,
                },
            ); LIMITS_MAX],
            limit_count: 0,
        };
        let mut add = |resource: Resource, soft: Option<u64>, extra_hard: u64| {
            let Some(soft) = soft else { return };
            let hard_now = process::getrlimit(resource).maximum;
            let clamp = |v: u64| hard_now.map_or(v, |h| v.min(h));
            setup.limits[setup.limit_count] = (
                resource,
                Rlimit {
                    current: Some(clamp(soft)),
                    maximum: Some(clamp(soft.saturating_add(extra_hard))),
                },
            );
            setup.limit_count += 1;
        };
        // One second between the soft CPU limit (SIGXCPU, catchable) and the hard one (SIGKILL).
        add(Resource::Cpu, limits.cpu_seconds, 1);
        add(Resource::Nofile, limits.open_files, 0);
        add(Resource::Nproc, limits.processes, 0);
        add(Resource::As, limits.address_space_bytes, 0);
        add(Resource::Core, limits.core_file_bytes, 0);
        setup
    }

    /// The child joins the cgroup whose `cgroup.procs` is open as `procs` first of all, so
    /// that nothing it starts is ever outside it. The caller keeps `procs` open until the
    /// spawn returns.
    pub(crate) fn join_cgroup(mut self, procs: RawFd) -> Self {
        self.cgroup_procs = procs;
        self
    }

    /// Runs in the child. Only raw system calls: no allocation, no locks.
    pub(crate) fn apply(&self) -> io::Result<()> {
        if self.cgroup_procs >= 0 {
            // SAFETY: a raw write of two static bytes to a descriptor the parent keeps open.
            // "0" names the writing process itself.
            let written = unsafe { libc::write(self.cgroup_procs, c"0".as_ptr().cast(), 1) };
            if written != 1 {
                return Err(io::Error::last_os_error());
            }
        }
        process::set_parent_process_death_signal(Some(Signal::KILL))?;
        // The parent may have died between fork and prctl; then no signal will ever come.
        if process::getppid() != Some(self.parent) {
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
        for (resource, limit) in &self.limits[..self.limit_count] {
            process::setrlimit(*resource, *limit)?;
        }
        Ok(())
    }
}

/// The sandbox a child enters after its setup, if any.
pub(crate) type Confinement = Option<Arc<Plan>>;

fn run(setup: &ChildSetup, confinement: &Confinement) -> io::Result<()> {
    setup.apply()?;
    match confinement {
        Some(plan) => {
            // The keeper leads the session and group that teardown signals; the program it
            // forks inherits them (a later setsid or setpgid hook moves only the program, and
            // the program dies with the keeper either way).
            let _ = process::setsid();
            plan.enter()
        }
        None => Ok(()),
    }
}

/// Registers a sandbox (and the parent-death signal, with no resource limits but a zero core
/// size) on a command another crate spawns: ring0's stdio upstreams.
pub(crate) fn install_confinement(
    command: &mut tokio::process::Command,
    plan: Arc<Plan>,
    cgroup_procs: Option<RawFd>,
) {
    let mut setup = ChildSetup::new(&ResourceLimits {
        cpu_seconds: None,
        open_files: None,
        processes: None,
        address_space_bytes: None,
        core_file_bytes: Some(0),
    });
    if let Some(procs) = cgroup_procs {
        setup = setup.join_cgroup(procs);
    }
    install(command, setup, Some(plan));
}

/// Registers the parent-death signal, a zero core size and the cgroup whose `cgroup.procs` is
/// open as `procs` on a command another crate spawns unconfined (a stdio upstream with the
/// sandbox off).
pub(crate) fn install_cgroup(command: &mut tokio::process::Command, procs: RawFd) {
    let setup = ChildSetup::new(&ResourceLimits {
        cpu_seconds: None,
        open_files: None,
        processes: None,
        address_space_bytes: None,
        core_file_bytes: Some(0),
    })
    .join_cgroup(procs);
    install(command, setup, None);
}

/// Registers the setup on a tokio command (the pipe path, spawned through process-wrap).
pub(crate) fn install(
    command: &mut tokio::process::Command,
    setup: ChildSetup,
    confinement: Confinement,
) {
    // SAFETY: the closure only calls `prctl`, `getppid` and `setrlimit` through rustix, which are
    // raw system calls (async-signal-safe), reads the `Copy` data captured by value, and builds
    // an `io::Error` from a raw OS error, which does not allocate. It takes no lock and touches no
    // state shared with other threads of the parent. The sandbox's `enter` keeps to the same
    // rules (see `sandbox::child`) on the plan the parent prepared and shares read-only.
    unsafe {
        command.pre_exec(move || run(&setup, &confinement));
    }
}

/// Registers the setup on a pseudo-terminal command (which makes the child a session leader
/// with the terminal as its controlling terminal before running this).
pub(crate) fn install_pty(
    command: pty_process::Command,
    setup: ChildSetup,
    confinement: Confinement,
) -> pty_process::Command {
    // SAFETY: as in `install`: raw system calls on captured data only.
    unsafe { command.pre_exec(move || run(&setup, &confinement)) }
}
