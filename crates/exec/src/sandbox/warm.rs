//! Namespaces kept warm for one sandbox, so a confined spawn does not create them each time.
//!
//! Creating a user, network, IPC and UTS namespace costs milliseconds per process (a network
//! namespace most: its creation and its deferred teardown run through the kernel's network
//! stack), far more than the program a call runs. A [`WarmNamespaces`] is created once per
//! bound sandbox (its first confined spawn): a short-lived *holder* process enters a new user
//! namespace (ring0's ids mapped to themselves, `setgroups` denied), IPC and UTS namespaces and,
//! for a profile without egress, a network namespace whose loopback is up; ring0 opens their
//! `/proc/<holder>/ns/*` files and lets the holder exit. The open descriptors (close-on-exec,
//! never passed to a program) are what keep the namespaces alive: they last exactly as long as
//! ring0 and its confined processes, with no helper process to supervise, restart or leak.
//!
//! Each confined spawn then joins them with `setns` (its keeper has every capability in a user
//! namespace its own user created) and still creates, per process, what containment rests on:
//! a mount namespace with the masks of the moment, a PID namespace whose init ends with the
//! program (so no process outlives its call), and for a profile with egress its own network
//! namespace and listener. Landlock, seccomp and the dropped capabilities are per process as
//! before. What the processes of one bound sandbox share is what the holder made: the id
//! mapping, a hostname they cannot change (no capabilities), System V IPC, and — without
//! egress — one loopback interface and its abstract socket names, which reach no other host and
//! no process outside that sandbox (processes of one sandbox share its workspace already).

#![allow(unsafe_code)]

use super::SandboxError;
use super::child::{close_all_except, loopback_up, write_file};
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// The namespaces every warm sandbox shares; a network namespace is added when no egress.
const SHARED: libc::c_int = libc::CLONE_NEWUSER | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS;

/// What the holder reports when it is ready (anything else is the step that failed).
const READY: u8 = 0;

/// Why the holder could not set the namespaces up (its report byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum HolderStep {
    Namespaces = 1,
    IdMaps,
    Loopback,
    ParentGone,
}

impl HolderStep {
    fn from_byte(byte: u8) -> Option<Self> {
        Some(match byte {
            1 => Self::Namespaces,
            2 => Self::IdMaps,
            3 => Self::Loopback,
            4 => Self::ParentGone,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Self::Namespaces => "entering new user, IPC, UTS and network namespaces",
            Self::IdMaps => "mapping user and group ids",
            Self::Loopback => "bringing up the loopback interface",
            Self::ParentGone => "ring0 ended during setup",
        }
    }
}

/// Descriptors of the namespaces one bound sandbox's processes join.
#[derive(Debug)]
pub(crate) struct WarmNamespaces {
    user: OwnedFd,
    ipc: OwnedFd,
    uts: OwnedFd,
    /// The shared network namespace; `None` for a profile with egress (each process gets its
    /// own, with its own listener).
    net: Option<OwnedFd>,
}

/// Raw descriptors for the child between `fork` and `execve` (the [`WarmNamespaces`] they
/// come from is kept alive by the plan that holds both).
#[derive(Debug, Clone, Copy)]
pub(crate) struct JoinFds {
    pub(crate) user: RawFd,
    pub(crate) ipc: RawFd,
    pub(crate) uts: RawFd,
    pub(crate) net: Option<RawFd>,
}

impl WarmNamespaces {
    /// Creates the namespaces (through a holder process, which has exited when this returns).
    /// `share_net`: whether the processes share one network namespace (no egress).
    pub(crate) fn create(share_net: bool) -> Result<Self, SandboxError> {
        let uid = rustix::process::getuid().as_raw();
        let gid = rustix::process::getgid().as_raw();
        let map = |id: u32| CString::new(format!("{id} {id} 1\n")).expect("digits have no NUL");
        let (uid_map, gid_map) = (map(uid), map(gid));
        let flags = SHARED | if share_net { libc::CLONE_NEWNET } else { 0 };
        let setup = |what: &str, e: io::Error| SandboxError::Setup(format!("{what}: {e}"));

        let (ready_read, ready_write) = pipe().map_err(|e| setup("holder pipe", e))?;
        let (hold_read, hold_write) = pipe().map_err(|e| setup("holder pipe", e))?;
        let parent = rustix::process::getpid().as_raw_nonzero().get();
        // SAFETY: the child makes raw system calls on data prepared above and exits; the
        // parent waits for it by pid. It stays in ring0's session, so the orphan sweep (which
        // reaps only other sessions' zombies) never takes its status first.
        let pid =
            unsafe { libc::syscall(libc::SYS_clone, libc::SIGCHLD as libc::c_ulong, 0, 0, 0, 0) }
                as libc::pid_t;
        if pid < 0 {
            return Err(setup("starting the holder", io::Error::last_os_error()));
        }
        if pid == 0 {
            // SAFETY: as above; the holder ends in `hold`.
            unsafe {
                hold(
                    parent,
                    flags,
                    &uid_map,
                    &gid_map,
                    share_net,
                    ready_write.as_raw_fd(),
                    hold_read.as_raw_fd(),
                )
            }
        }
        drop(ready_write);
        drop(hold_read);
        let outcome = read_report(&ready_read).and_then(|()| Self::open(pid, share_net));
        // Closing the hold pipe lets the holder exit; the namespaces live on in our descriptors.
        drop(hold_write);
        reap(pid);
        outcome
    }

    fn open(pid: libc::pid_t, share_net: bool) -> Result<Self, SandboxError> {
        let open = |name: &str| -> Result<OwnedFd, SandboxError> {
            let path = format!("/proc/{pid}/ns/{name}");
            std::fs::File::open(&path)
                .map(OwnedFd::from)
                .map_err(|e| SandboxError::Setup(format!("opening {path}: {e}")))
        };
        Ok(Self {
            user: open("user")?,
            ipc: open("ipc")?,
            uts: open("uts")?,
            net: if share_net { Some(open("net")?) } else { None },
        })
    }

    /// Whether the processes share one network namespace.
    pub(crate) fn shares_net(&self) -> bool {
        self.net.is_some()
    }

    pub(crate) fn join_fds(&self) -> JoinFds {
        JoinFds {
            user: self.user.as_raw_fd(),
            ipc: self.ipc.as_raw_fd(),
            uts: self.uts.as_raw_fd(),
            net: self.net.as_ref().map(AsRawFd::as_raw_fd),
        }
    }
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 fills the array; the descriptors are owned at once.
    unsafe {
        if libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok((OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])))
    }
}

/// Reads the holder's report: ready, or the step that failed with its errno.
fn read_report(ready: &OwnedFd) -> Result<(), SandboxError> {
    let mut report = [0u8; 1 + std::mem::size_of::<i32>()];
    let got = loop {
        // SAFETY: reading into a stack buffer of the given length.
        let n = unsafe { libc::read(ready.as_raw_fd(), report.as_mut_ptr().cast(), report.len()) };
        if n >= 0 || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            break n;
        }
    };
    if got == 1 && report[0] == READY {
        return Ok(());
    }
    let step = (got == report.len() as isize)
        .then(|| HolderStep::from_byte(report[0]))
        .flatten();
    let Some(step) = step else {
        return Err(SandboxError::Setup(
            "the namespace holder ended before it was ready".into(),
        ));
    };
    let errno = i32::from_ne_bytes(report[1..].try_into().expect("four bytes"));
    let cause = io::Error::from_raw_os_error(errno);
    Err(match step {
        HolderStep::Namespaces => SandboxError::Unavailable {
            feature: "unprivileged user namespaces",
            detail: format!("{}: {cause}", step.name()),
        },
        other => SandboxError::Setup(format!("{}: {cause}", other.name())),
    })
}

fn reap(pid: libc::pid_t) {
    let mut status = 0;
    loop {
        // SAFETY: waitpid on our own child.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return;
        }
    }
}

/// The holder: enters the namespaces, reports, and waits until ring0 has opened them.
#[allow(clippy::too_many_arguments)]
unsafe fn hold(
    parent: libc::pid_t,
    flags: libc::c_int,
    uid_map: &CString,
    gid_map: &CString,
    loopback: bool,
    ready: RawFd,
    hold: RawFd,
) -> ! {
    let fail = |step: HolderStep| -> ! {
        // SAFETY: raw system calls on stack data; the process ends here.
        unsafe {
            let errno = *libc::__errno_location();
            let mut report = [0u8; 5];
            report[0] = step as u8;
            report[1..].copy_from_slice(&errno.to_ne_bytes());
            libc::write(ready, report.as_ptr().cast(), report.len());
            libc::_exit(1)
        }
    };
    // SAFETY: raw system calls on prepared data only; the process ends here.
    unsafe {
        if libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        ) != 0
            || libc::getppid() != parent
        {
            fail(HolderStep::ParentGone);
        }
        // ring0's end of the hold pipe among them: the holder must see it close.
        close_all_except([ready, hold]);
        if libc::unshare(flags) != 0 {
            fail(HolderStep::Namespaces);
        }
        if write_file(c"/proc/self/setgroups", c"deny").is_err()
            || write_file(c"/proc/self/uid_map", uid_map).is_err()
            || write_file(c"/proc/self/gid_map", gid_map).is_err()
        {
            fail(HolderStep::IdMaps);
        }
        if loopback && loopback_up().is_err() {
            fail(HolderStep::Loopback);
        }
        let byte = [READY];
        libc::write(ready, byte.as_ptr().cast(), 1);
        let mut sink = [0u8; 1];
        // Returns (0) when ring0 closes the other end, or fails when ring0 is gone.
        while libc::read(hold, sink.as_mut_ptr().cast(), 1) > 0 {}
        libc::_exit(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warm_namespaces_outlive_their_holder_and_differ_from_ring0s() {
        if super::super::kernel_support().is_err() {
            return;
        }
        let warm = WarmNamespaces::create(true).expect("warm namespaces");
        let ours = std::fs::metadata("/proc/self/ns/user").unwrap();
        let theirs = rustix::fs::fstat(&warm.user).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_ne!(ours.ino(), theirs.st_ino, "a user namespace of its own");
        assert!(warm.shares_net());
        assert!(!WarmNamespaces::create(false).unwrap().shares_net());
    }
}
