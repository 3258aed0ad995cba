//! The steps a confined process takes between `fork` and `execve`, as raw system calls.
//!
//! This runs in a forked copy of a multi-threaded process, so it only makes system calls on data
//! prepared by the parent: no allocation, no locks. The forked process (the *keeper*) joins its
//! sandbox's warm user, IPC, UTS and network namespaces (`super::warm`) and creates new mount and
//! PID namespaces (and a network namespace when the profile has egress) — or, without warm
//! namespaces, creates all six and maps its own ids — covers the masks, brings its own loopback
//! up, opens the egress listener if asked, and forks the *init* of the new PID namespace, which
//! forks the *program* process. The keeper and the init
//! close every descriptor and wait; the program drops every capability, restricts itself with
//! Landlock and seccomp and returns to `execve`. When the program ends, the init reports its
//! status to the keeper (which exits the same way) and exits, so the kernel kills whatever is
//! left in the PID namespace; when the keeper is killed (a teardown's SIGKILL, ring0's death
//! through the parent-death signal) the init gets SIGKILL through its own parent-death signal,
//! and the namespace goes with it. SIGTERM, SIGINT, SIGHUP and SIGQUIT are passed down to the
//! program.
//!
//! A failing step reports `step << 16 | errno` as the spawn error, decoded by [`step_failure`].

#![allow(unsafe_code)]

use super::warm::{JoinFds, WarmNamespaces};
use super::{Cover, Mask, SandboxError};
use crate::limits::{SANDBOX_EGRESS_BACKLOG, SANDBOX_EGRESS_PORT, SANDBOX_TMPFS_MASK_OPTIONS};
use seccompiler::BpfProgram;
use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};

const NAMESPACES: libc::c_int = libc::CLONE_NEWUSER
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS;

/// What a process joining warm namespaces still creates for itself (see [`super::warm`]).
const NAMESPACES_PER_PROCESS: libc::c_int = libc::CLONE_NEWNS | libc::CLONE_NEWPID;

/// Highest capability number dropped from the bounding set (beyond the kernel's last, the call
/// fails harmlessly).
const CAP_NUMBER_MAX: libc::c_ulong = 63;
const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// Which step of the confinement failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub(crate) enum Step {
    Namespaces = 1,
    IdMaps,
    PrivateMounts,
    Mask,
    Loopback,
    Egress,
    Fork,
    ParentGone,
    Capabilities,
    Landlock,
    Seccomp,
    Join,
}

const STEP_SHIFT: i32 = 16;

impl Step {
    fn name(self) -> &'static str {
        match self {
            Self::Namespaces => "entering new user, mount, network and PID namespaces",
            Self::IdMaps => "mapping user and group ids",
            Self::PrivateMounts => "making mounts private",
            Self::Mask => "masking protected paths",
            Self::Loopback => "bringing up the loopback interface",
            Self::Egress => "opening the egress listener",
            Self::Fork => "starting the program in its PID namespace",
            Self::ParentGone => "the supervising process ended during setup",
            Self::Capabilities => "dropping capabilities",
            Self::Landlock => "restricting filesystem access (Landlock)",
            Self::Seccomp => "installing the system call filter (seccomp)",
            Self::Join => "joining the sandbox's warm namespaces",
        }
    }

    fn from_code(code: i32) -> Option<Self> {
        Some(match code {
            1 => Self::Namespaces,
            2 => Self::IdMaps,
            3 => Self::PrivateMounts,
            4 => Self::Mask,
            5 => Self::Loopback,
            6 => Self::Egress,
            7 => Self::Fork,
            8 => Self::ParentGone,
            9 => Self::Capabilities,
            10 => Self::Landlock,
            11 => Self::Seccomp,
            12 => Self::Join,
            _ => return None,
        })
    }

    pub(crate) fn error(self) -> io::Error {
        let errno = io::Error::last_os_error().raw_os_error().unwrap_or(0) & 0xffff;
        io::Error::from_raw_os_error(((self as i32) << STEP_SHIFT) | errno)
    }
}

/// The sandbox step a spawn error encodes, with the system's own error, if it encodes one.
pub(crate) fn step_failure(error: &io::Error) -> Option<SandboxError> {
    let code = error.raw_os_error()?;
    let step = Step::from_code(code >> STEP_SHIFT)?;
    let cause = io::Error::from_raw_os_error(code & 0xffff);
    Some(match step {
        Step::Namespaces => SandboxError::Unavailable {
            feature: "unprivileged user namespaces",
            detail: format!("{}: {cause}", step.name()),
        },
        Step::Landlock => SandboxError::Unavailable {
            feature: "Landlock (ABI 3 or later)",
            detail: format!("{}: {cause}", step.name()),
        },
        Step::Seccomp => SandboxError::Unavailable {
            feature: "seccomp filters",
            detail: format!("{}: {cause}", step.name()),
        },
        other => SandboxError::Setup(format!("{}: {cause}", other.name())),
    })
}

/// The listening socket a confined process's proxy variables point at. It lives in the
/// process's network namespace; accepting on it from ring0 works all the same.
#[derive(Debug)]
pub struct EgressListener {
    listener: std::net::TcpListener,
}

impl EgressListener {
    /// The port inside the child's namespace (always [`SANDBOX_EGRESS_PORT`]).
    pub fn port(&self) -> u16 {
        SANDBOX_EGRESS_PORT
    }

    /// The listener, for the proxy to accept on.
    pub fn into_std(self) -> std::net::TcpListener {
        self.listener
    }
}

/// Everything the child needs, computed by the parent.
pub(crate) struct Plan {
    ruleset: OwnedFd,
    filters: Arc<[BpfProgram; 2]>,
    masks: Vec<Mask>,
    uid_map: CString,
    gid_map: CString,
    /// The socket pair the listener travels over: (ring0's end, the child's end).
    egress: Option<(Mutex<Option<OwnedFd>>, OwnedFd)>,
    /// The namespaces to join instead of creating them, kept open while the plan lives.
    warm: Option<(Arc<WarmNamespaces>, JoinFds)>,
}

impl Plan {
    pub(super) fn new(
        ruleset: OwnedFd,
        filters: Arc<[BpfProgram; 2]>,
        masks: Vec<Mask>,
        egress: bool,
        warm: Option<Arc<WarmNamespaces>>,
    ) -> Result<Self, SandboxError> {
        // A shared network namespace has no room for one listener per process.
        debug_assert!(!(egress && warm.as_ref().is_some_and(|w| w.shares_net())));
        let uid = rustix::process::getuid().as_raw();
        let gid = rustix::process::getgid().as_raw();
        let map = |id: u32| CString::new(format!("{id} {id} 1\n")).expect("digits have no NUL");
        let egress = if egress {
            let (ours, theirs) = std::os::unix::net::UnixDatagram::pair()
                .map_err(|e| SandboxError::Setup(format!("egress socket pair: {e}")))?;
            Some((Mutex::new(Some(ours.into())), theirs.into()))
        } else {
            None
        };
        Ok(Self {
            ruleset,
            filters,
            masks,
            uid_map: map(uid),
            gid_map: map(gid),
            egress,
            warm: warm.map(|w| {
                let fds = w.join_fds();
                (w, fds)
            }),
        })
    }

    pub(super) fn egress_wanted(&self) -> bool {
        self.egress.is_some()
    }

    /// Receives the listener the child sent (it was sent before the spawn returned).
    pub(super) fn take_egress(&self) -> Result<Option<EgressListener>, SandboxError> {
        let Some((ours, _)) = &self.egress else {
            return Ok(None);
        };
        let Some(ours) = ours.lock().unwrap_or_else(|p| p.into_inner()).take() else {
            return Ok(None);
        };
        receive_fd(&ours)
            .map(|fd| {
                Some(EgressListener {
                    listener: std::net::TcpListener::from(fd),
                })
            })
            .map_err(|e| SandboxError::Setup(format!("receiving the egress listener: {e}")))
    }

    /// Runs in the forked child. Returns only in the program process, ready for `execve`.
    pub(crate) fn enter(&self) -> io::Result<()> {
        // SAFETY: every call below is a raw system call on memory owned by `self` (prepared by
        // the parent and not mutated) or on the stack; nothing allocates or takes a lock.
        unsafe {
            self.enter_namespaces()?;
            let mut lifeline = [0 as RawFd; 2];
            let mut status = [0 as RawFd; 2];
            if libc::pipe2(lifeline.as_mut_ptr(), libc::O_CLOEXEC) != 0
                || libc::pipe2(status.as_mut_ptr(), libc::O_CLOEXEC) != 0
            {
                return Err(Step::Fork.error());
            }
            let ([lifeline_read, lifeline_write], [status_read, status_write]) = (lifeline, status);
            forward_signals();
            let init = raw_fork();
            if init < 0 {
                return Err(Step::Fork.error());
            }
            if init > 0 {
                keep(init, lifeline_write, status_read);
            }
            // The namespace's init: dies with the keeper, starts the program, reaps, reports.
            libc::close(lifeline_write);
            libc::close(status_read);
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(Step::ParentGone.error());
            }
            // The keeper holds the write end: a hang-up means it died before the line above.
            let mut poll = libc::pollfd {
                fd: lifeline_read,
                events: libc::POLLIN,
                revents: 0,
            };
            if libc::poll(&mut poll, 1, 0) != 0 {
                return Err(io::Error::from_raw_os_error(
                    ((Step::ParentGone as i32) << STEP_SHIFT) | libc::ESRCH,
                ));
            }
            libc::close(lifeline_read);
            let program = raw_fork();
            if program < 0 {
                return Err(Step::Fork.error());
            }
            if program > 0 {
                init_loop(program, status_write);
            }
            FORWARD_TO.store(0, Ordering::Relaxed);
            libc::close(status_write);
            self.confine_program()
        }
    }

    /// New user, mount, network, IPC, UTS and PID namespaces, with ring0's ids mapped.
    unsafe fn create_namespaces(&self) -> io::Result<()> {
        // SAFETY: raw system calls on the plan's prepared strings.
        unsafe {
            if libc::unshare(NAMESPACES) != 0 {
                return Err(Step::Namespaces.error());
            }
            write_file(c"/proc/self/setgroups", c"deny").map_err(|()| Step::IdMaps.error())?;
            write_file(c"/proc/self/uid_map", &self.uid_map).map_err(|()| Step::IdMaps.error())?;
            write_file(c"/proc/self/gid_map", &self.gid_map).map_err(|()| Step::IdMaps.error())?;
            Ok(())
        }
    }

    /// The keeper's namespaces, mounts, masks, loopback and egress listener: everything before
    /// the PID namespace's init is started. Raw system calls only.
    pub(crate) unsafe fn enter_namespaces(&self) -> io::Result<()> {
        // SAFETY: raw system calls on memory owned by `self` or on the stack.
        unsafe {
            let own_net = match &self.warm {
                Some((_, fds)) => join(fds)?,
                None => {
                    self.create_namespaces()?;
                    true
                }
            };
            let flags = libc::MS_REC | libc::MS_PRIVATE;
            if libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                flags,
                std::ptr::null(),
            ) != 0
            {
                return Err(Step::PrivateMounts.error());
            }
            for mask in &self.masks {
                cover(mask).map_err(|()| Step::Mask.error())?;
            }
            if own_net {
                loopback_up().map_err(|()| Step::Loopback.error())?;
            }
            if let Some((_, theirs)) = &self.egress {
                send_listener(theirs.as_raw_fd()).map_err(|()| Step::Egress.error())?;
            }
            Ok(())
        }
    }

    /// The program process: drops privileges and restricts itself.
    pub(crate) unsafe fn confine_program(&self) -> io::Result<()> {
        // SAFETY: raw system calls on stack data and on `self`'s prepared fields.
        unsafe {
            drop_capabilities().map_err(|()| Step::Capabilities.error())?;
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1 as libc::c_ulong, 0, 0, 0) != 0 {
                return Err(Step::Landlock.error());
            }
            let ruleset = self.ruleset.as_raw_fd();
            if libc::syscall(libc::SYS_landlock_restrict_self, ruleset, 0) != 0 {
                return Err(Step::Landlock.error());
            }
            libc::close(ruleset);
            for filter in self.filters.iter() {
                let program = libc::sock_fprog {
                    len: filter.len() as libc::c_ushort,
                    filter: filter.as_ptr() as *mut libc::sock_filter,
                };
                let mode = libc::SECCOMP_SET_MODE_FILTER as libc::c_ulong;
                if libc::syscall(libc::SYS_seccomp, mode, 0, &program) != 0 {
                    return Err(Step::Seccomp.error());
                }
            }
            Ok(())
        }
    }
}

/// Joins warm namespaces (the user namespace first: it gives the capabilities the others need)
/// and creates the per-process ones. Returns whether the process has a network namespace of
/// its own (whose loopback it must bring up).
unsafe fn join(fds: &JoinFds) -> io::Result<bool> {
    // SAFETY: raw system calls on descriptors the plan keeps open.
    unsafe {
        let shared = [
            (fds.user, libc::CLONE_NEWUSER),
            (fds.ipc, libc::CLONE_NEWIPC),
            (fds.uts, libc::CLONE_NEWUTS),
        ];
        for (fd, kind) in shared
            .into_iter()
            .chain(fds.net.map(|fd| (fd, libc::CLONE_NEWNET)))
        {
            if libc::setns(fd, kind) != 0 {
                return Err(Step::Join.error());
            }
        }
        let own_net = fds.net.is_none();
        let flags = NAMESPACES_PER_PROCESS | if own_net { libc::CLONE_NEWNET } else { 0 };
        if libc::unshare(flags) != 0 {
            return Err(Step::Namespaces.error());
        }
        Ok(own_net)
    }
}

/// Signals passed on down the chain keeper → init → program, so a teardown's SIGTERM reaches
/// the program (an init ignores signals it has no handler for) and its grace period means
/// something.
pub(crate) const FORWARDED: [libc::c_int; 4] =
    [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT];

/// The process the forwarding handler signals (per process: each fork has its own copy).
static FORWARD_TO: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward(signal: libc::c_int) {
    let target = FORWARD_TO.load(Ordering::Relaxed);
    if target > 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe {
            libc::kill(target, signal);
        }
    }
}

unsafe fn forward_signals() {
    // SAFETY: sigaction with a handler that only calls kill; execve resets it in the program.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = forward as *const () as libc::sighandler_t;
        action.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        for signal in FORWARDED {
            libc::sigaction(signal, &action, std::ptr::null_mut());
        }
    }
}

/// A fork without the C library's atfork handlers, which could wait on locks that threads of
/// the parent held when it forked.
unsafe fn raw_fork() -> libc::pid_t {
    // SAFETY: clone with SIGCHLD only is fork.
    let pid = unsafe { libc::syscall(libc::SYS_clone, libc::SIGCHLD as libc::c_ulong, 0, 0, 0, 0) };
    if pid > 0 {
        FORWARD_TO.store(pid as libc::pid_t, Ordering::Relaxed);
    }
    pid as libc::pid_t
}

/// Closes every descriptor but `keep` (sorted, at most two).
pub(crate) unsafe fn close_all_except(keep: [RawFd; 2]) {
    let (a, b) = if keep[0] <= keep[1] {
        (keep[0], keep[1])
    } else {
        (keep[1], keep[0])
    };
    let close = |from: RawFd, to: libc::c_uint| {
        if from >= 0 && (from as libc::c_uint) <= to {
            // SAFETY: close_range on this process's own table.
            unsafe { libc::syscall(libc::SYS_close_range, from as libc::c_uint, to, 0) };
        }
    };
    if a > 0 {
        close(0, a as libc::c_uint - 1);
    }
    if b > a + 1 {
        close(a + 1, b as libc::c_uint - 1);
    }
    close(b + 1, libc::c_uint::MAX);
}

unsafe fn wait_for(pid: libc::pid_t, any: bool) -> Option<libc::c_int> {
    let mut status = 0;
    loop {
        // SAFETY: waitpid on a child of this process.
        let r = unsafe { libc::waitpid(if any { -1 } else { pid }, &mut status, 0) };
        if r == pid {
            return Some(status);
        }
        // SAFETY: reading errno.
        if r < 0 && unsafe { *libc::__errno_location() } != libc::EINTR {
            return None;
        }
    }
}

/// The namespace's init: reaps everything, and when the program ends reports its status to the
/// keeper and exits, which makes the kernel kill whatever the program left behind.
unsafe fn init_loop(program: libc::pid_t, status_write: RawFd) -> ! {
    // SAFETY: raw system calls only; the process ends here.
    unsafe {
        close_all_except([status_write, status_write]);
        let Some(status) = wait_for(program, true) else {
            libc::_exit(127);
        };
        let bytes = status.to_ne_bytes();
        libc::write(status_write, bytes.as_ptr().cast(), bytes.len());
        libc::_exit(0);
    }
}

/// The keeper: closes everything but its two pipes, waits for the init and exits as the program
/// did (by the same signal, if a signal ended it).
unsafe fn keep(init: libc::pid_t, lifeline: RawFd, status_read: RawFd) -> ! {
    // SAFETY: raw system calls only; the process ends here.
    unsafe {
        // Every inherited descriptor, the exec-status pipe of the spawner included (so the
        // spawn returns as soon as the program has called execve).
        close_all_except([lifeline, status_read]);
        let Some(init_status) = wait_for(init, false) else {
            libc::_exit(127);
        };
        let mut bytes = [0u8; 4];
        let got = libc::read(status_read, bytes.as_mut_ptr().cast(), bytes.len());
        let status = if got == bytes.len() as isize {
            libc::c_int::from_ne_bytes(bytes)
        } else {
            init_status
        };
        exit_as(status)
    }
}

/// Ends this process the way `status` (a wait status) says: by the same signal, or with the same
/// exit code.
pub(crate) unsafe fn exit_as(status: libc::c_int) -> ! {
    // SAFETY: raw system calls only; the process ends here.
    unsafe {
        if libc::WIFSIGNALED(status) {
            let signal = libc::WTERMSIG(status);
            libc::signal(signal, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, signal);
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::kill(libc::getpid(), signal);
            libc::_exit(128 + signal);
        }
        libc::_exit(libc::WEXITSTATUS(status));
    }
}

/// Writes `text` to `path` in one call.
pub(super) unsafe fn write_file(path: &CStr, text: &CStr) -> Result<(), ()> {
    // SAFETY: raw system calls on the given strings.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(());
        }
        let bytes = text.to_bytes();
        let written = libc::write(fd, bytes.as_ptr().cast(), bytes.len());
        libc::close(fd);
        if written == bytes.len() as isize {
            Ok(())
        } else {
            Err(())
        }
    }
}

/// Mounts a mask's cover over its target.
unsafe fn cover(mask: &Mask) -> Result<(), ()> {
    let null = std::ptr::null();
    let target = mask.target.as_ptr();
    // SAFETY: raw mount calls on prepared strings.
    unsafe {
        let ok = match &mask.cover {
            Cover::EmptyDir => {
                let flags = libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
                libc::mount(
                    c"tmpfs".as_ptr(),
                    target,
                    c"tmpfs".as_ptr(),
                    flags,
                    SANDBOX_TMPFS_MASK_OPTIONS.as_ptr().cast(),
                ) == 0
            }
            Cover::EmptyFile(source) => {
                libc::mount(source.as_ptr(), target, null, libc::MS_BIND, null.cast()) == 0
                    && read_only(target, mask.locked_flags)
            }
            Cover::ReadOnly => {
                libc::mount(
                    target,
                    target,
                    null,
                    libc::MS_BIND | libc::MS_REC,
                    null.cast(),
                ) == 0
                    && read_only(target, mask.locked_flags)
            }
        };
        if ok { Ok(()) } else { Err(()) }
    }
}

unsafe fn read_only(target: *const libc::c_char, locked: libc::c_ulong) -> bool {
    let flags = libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | locked;
    // SAFETY: a raw mount call on a prepared string.
    unsafe {
        libc::mount(
            std::ptr::null(),
            target,
            std::ptr::null(),
            flags,
            std::ptr::null(),
        ) == 0
    }
}

/// Sets `lo` up in the new network namespace.
pub(super) unsafe fn loopback_up() -> Result<(), ()> {
    // SAFETY: raw socket and ioctl calls on a stack `ifreq`.
    unsafe {
        let socket = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if socket < 0 {
            return Err(());
        }
        let mut request: libc::ifreq = std::mem::zeroed();
        request.ifr_name[0] = b'l' as libc::c_char;
        request.ifr_name[1] = b'o' as libc::c_char;
        let mut ok = libc::ioctl(socket, libc::SIOCGIFFLAGS, &mut request) == 0;
        if ok {
            request.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
            ok = libc::ioctl(socket, libc::SIOCSIFFLAGS, &request) == 0;
        }
        libc::close(socket);
        if ok { Ok(()) } else { Err(()) }
    }
}

/// Space for one control message carrying one descriptor (`CMSG_SPACE(sizeof(int))` is 24 on
/// 64-bit Linux), as u64s for alignment.
const CMSG_WORDS: usize = 4;

/// Opens the egress listener on 127.0.0.1 in this namespace and sends it over `channel`.
unsafe fn send_listener(channel: RawFd) -> Result<(), ()> {
    // SAFETY: raw socket calls on stack structures sized for one descriptor.
    unsafe {
        let listener = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if listener < 0 {
            return Err(());
        }
        let address = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: SANDBOX_EGRESS_PORT.to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(std::net::Ipv4Addr::LOCALHOST).to_be(),
            },
            sin_zero: [0; 8],
        };
        let bound = libc::bind(
            listener,
            (&address as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        ) == 0
            && libc::listen(listener, SANDBOX_EGRESS_BACKLOG) == 0;
        let sent = bound && send_fd(channel, listener);
        libc::close(listener);
        if sent { Ok(()) } else { Err(()) }
    }
}

unsafe fn send_fd(channel: RawFd, fd: RawFd) -> bool {
    // SAFETY: the control buffer is large enough for one descriptor (asserted by CMSG_SPACE).
    unsafe {
        let mut control = [0u64; CMSG_WORDS];
        let space = libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) as usize;
        if space > std::mem::size_of_val(&control) {
            return false;
        }
        let mut byte = [0u8; 1];
        let mut iov = libc::iovec {
            iov_base: byte.as_mut_ptr().cast(),
            iov_len: 1,
        };
        let mut message: libc::msghdr = std::mem::zeroed();
        message.msg_iov = &mut iov;
        message.msg_iovlen = 1;
        message.msg_control = control.as_mut_ptr().cast();
        message.msg_controllen = space;
        let header = libc::CMSG_FIRSTHDR(&message);
        (*header).cmsg_level = libc::SOL_SOCKET;
        (*header).cmsg_type = libc::SCM_RIGHTS;
        (*header).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(header).cast::<RawFd>(), fd);
        libc::sendmsg(channel, &message, 0) == 1
    }
}

/// Receives one descriptor sent by [`send_fd`].
fn receive_fd(channel: &OwnedFd) -> io::Result<OwnedFd> {
    // SAFETY: the buffers outlive the call; a received descriptor is owned by us at once.
    unsafe {
        let mut control = [0u64; CMSG_WORDS];
        let mut byte = [0u8; 1];
        let mut iov = libc::iovec {
            iov_base: byte.as_mut_ptr().cast(),
            iov_len: 1,
        };
        let mut message: libc::msghdr = std::mem::zeroed();
        message.msg_iov = &mut iov;
        message.msg_iovlen = 1;
        message.msg_control = control.as_mut_ptr().cast();
        message.msg_controllen = std::mem::size_of_val(&control);
        let flags = libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC;
        if libc::recvmsg(channel.as_raw_fd(), &mut message, flags) != 1 {
            return Err(io::Error::last_os_error());
        }
        let header = libc::CMSG_FIRSTHDR(&message);
        if header.is_null()
            || (*header).cmsg_level != libc::SOL_SOCKET
            || (*header).cmsg_type != libc::SCM_RIGHTS
        {
            return Err(io::Error::other("no descriptor in the message"));
        }
        let fd = std::ptr::read_unaligned(libc::CMSG_DATA(header).cast::<RawFd>());
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Empties the bounding, ambient, effective, permitted and inheritable sets, so not even a
/// uid-0 `execve` inside the namespace regains a capability.
unsafe fn drop_capabilities() -> Result<(), ()> {
    // SAFETY: raw prctl and capset calls on stack structures.
    unsafe {
        for cap in 0..=CAP_NUMBER_MAX {
            // Fails with EINVAL past the kernel's last capability; nothing to drop there.
            libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0);
        }
        let clear = libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong;
        libc::prctl(libc::PR_CAP_AMBIENT, clear, 0, 0, 0);
        let header = CapHeader {
            version: LINUX_CAPABILITY_VERSION_3,
            pid: 0,
        };
        let data = [CapData {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        }; 2];
        if libc::syscall(libc::SYS_capset, &header, data.as_ptr()) != 0 {
            return Err(());
        }
        Ok(())
    }
}

/// Checks once that this process may create the namespaces a sandbox enters, in a throwaway
/// child (namespaces cannot be entered by a multi-threaded process itself).
pub(super) fn probe_namespaces() -> Result<(), String> {
    // SAFETY: the child makes two raw system calls and exits; the parent waits for it by pid.
    // It stays in ring0's session, so the orphan sweep never reaps it first.
    unsafe {
        let pid = libc::syscall(libc::SYS_clone, libc::SIGCHLD as libc::c_ulong, 0, 0, 0, 0);
        if pid < 0 {
            return Err(format!("fork: {}", io::Error::last_os_error()));
        }
        if pid == 0 {
            let code = if libc::unshare(NAMESPACES) == 0 {
                0
            } else {
                *libc::__errno_location() & 0x7f
            };
            libc::_exit(code);
        }
        let mut status = 0;
        loop {
            let r = libc::waitpid(pid as libc::pid_t, &mut status, 0);
            if r == pid as libc::pid_t {
                break;
            }
            if r < 0 && *libc::__errno_location() != libc::EINTR {
                return Err(format!(
                    "waiting for the probe: {}",
                    io::Error::last_os_error()
                ));
            }
        }
        match (libc::WIFEXITED(status), libc::WEXITSTATUS(status)) {
            (true, 0) => Ok(()),
            (true, errno) => Err(format!("unshare: {}", io::Error::from_raw_os_error(errno))),
            _ => Err("the probe process was killed".into()),
        }
    }
}
