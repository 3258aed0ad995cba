//! Spawning an unconfined process without copying ring0's address space.
//!
//! A `fork` copies the page tables of the whole process and write-protects every private page,
//! so ring0 (a large address space: a tokenizer, a journal, a runtime) pays for its own size on
//! every spawn and again in copy-on-write faults afterwards; std and tokio fork whenever a
//! `pre_exec` hook is registered. Here the child is created with `CLONE_VM | CLONE_VFORK`, as
//! `posix_spawn` does: it runs on a stack of its own in ring0's memory, with the spawning thread
//! suspended, until its `execve` gives it a fresh address space (or it exits). It only makes raw
//! system calls on a [`Request`] prepared here: signal dispositions reset (every signal is
//! blocked around the clone, so no handler of ring0 ever runs in it), stdio moved onto 0–2, the
//! working directory, a new session, the parent-death signal and resource limits
//! ([`ChildSetup`]), then `execve` over the candidates of a `PATH` search done in advance. The
//! error of a failing step is written into the request, which the parent reads once the clone
//! returns. The child is waited for through a pidfd.
//!
//! A confined process ([`spawn_confined`]) has a keeper and a PID namespace init that live as
//! long as it does without ever calling `execve`: they are cloned with `CLONE_VM` alone onto
//! stacks of their own in ring0's memory (no copy either), take no signal handlers (they wait
//! for signals with `sigwaitinfo` and pass them on), and the program is cloned from the init
//! with `CLONE_VM | CLONE_VFORK`, confines itself (`sandbox::Plan::confine_program`) and calls
//! `execve`. Terminals and stdio upstreams keep the fork path of std and `pty-process`.

#![allow(unsafe_code)]

use crate::hooks::ChildSetup;
use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicI32, Ordering};
use tokio::io::unix::AsyncFd;

/// Stack of the child between clone and `execve` (raw system calls only, a few frames deep).
const CHILD_STACK_BYTES: usize = 256 * 1024;
/// Highest signal number whose disposition the child resets.
const SIGNAL_NUMBER_MAX: libc::c_int = 64;
/// `PATH` when neither the child's environment nor ring0's has one (the C library's default).
const PATH_DEFAULT: &str = "/bin:/usr/bin";

/// Everything the child needs, built by the parent; the child only reads it (and `errno`).
pub(crate) struct Request {
    candidates: Vec<CString>,
    _argv: Vec<CString>,
    argv_ptrs: Vec<*const libc::c_char>,
    _envp: Vec<CString>,
    envp_ptrs: Vec<*const libc::c_char>,
    cwd: CString,
    stdio: [RawFd; 3],
    setup: ChildSetup,
    /// The error of the step that failed, written by the child before it exits.
    errno: AtomicI32,
}

fn cstring(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

impl Request {
    /// `env` is the child's complete environment; `stdio` its descriptors 0, 1 and 2 (the
    /// caller keeps them open until [`spawn`] returns).
    pub(crate) fn new(
        program: &OsStr,
        args: &[OsString],
        env: &[(OsString, OsString)],
        cwd: &Path,
        stdio: [RawFd; 3],
        setup: ChildSetup,
    ) -> io::Result<Self> {
        let argv: Vec<CString> = std::iter::once(program)
            .chain(args.iter().map(OsString::as_os_str))
            .map(|a| cstring(a.as_bytes()))
            .collect::<io::Result<_>>()?;
        let envp: Vec<CString> = env
            .iter()
            .map(|(k, v)| {
                let mut entry = k.as_bytes().to_vec();
                entry.push(b'=');
                entry.extend_from_slice(v.as_bytes());
                cstring(&entry)
            })
            .collect::<io::Result<_>>()?;
        let path = env
            .iter()
            .rev()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| v.clone())
            .or_else(|| std::env::var_os("PATH"))
            .unwrap_or_else(|| PATH_DEFAULT.into());
        let candidates = candidates(program, &path)?;
        let pointers = |list: &[CString]| -> Vec<*const libc::c_char> {
            list.iter()
                .map(|c| c.as_ptr())
                .chain(std::iter::once(std::ptr::null()))
                .collect()
        };
        Ok(Self {
            candidates,
            argv_ptrs: pointers(&argv),
            _argv: argv,
            envp_ptrs: pointers(&envp),
            _envp: envp,
            cwd: cstring(cwd.as_os_str().as_bytes())?,
            stdio,
            setup,
            errno: AtomicI32::new(0),
        })
    }
}

/// The paths `execvp` would try for `program`, in order.
fn candidates(program: &OsStr, path: &OsStr) -> io::Result<Vec<CString>> {
    if program.as_bytes().contains(&b'/') {
        return Ok(vec![cstring(program.as_bytes())?]);
    }
    path.as_bytes()
        .split(|b| *b == b':')
        .map(|dir| {
            let dir: &[u8] = if dir.is_empty() { b"." } else { dir };
            let mut full = dir.to_vec();
            full.push(b'/');
            full.extend_from_slice(program.as_bytes());
            cstring(&full)
        })
        .collect()
}

/// A child spawned here, waited for through its pidfd.
pub(crate) struct Child {
    pid: libc::pid_t,
    pidfd: AsyncFd<OwnedFd>,
    status: Option<ExitStatus>,
}

impl Child {
    pub(crate) fn id(&self) -> libc::pid_t {
        self.pid
    }

    /// Sends SIGKILL, unless it was already reaped (its pid may belong to another by now).
    pub(crate) fn start_kill(&mut self) -> io::Result<()> {
        if self.status.is_some() {
            return Ok(());
        }
        // SAFETY: pidfd_send_signal on our own descriptor.
        let r = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.pidfd.get_ref().as_raw_fd(),
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// Waits for the child to exit and reaps it. Cancel-safe.
    pub(crate) async fn wait(&mut self) -> io::Result<ExitStatus> {
        use std::os::unix::process::ExitStatusExt;
        loop {
            if let Some(status) = self.status {
                return Ok(status);
            }
            let mut ready = self.pidfd.readable().await?;
            let mut raw = 0;
            // SAFETY: waitpid on our own child, not reaped yet (the orphan sweep skips
            // registered children).
            let r = unsafe { libc::waitpid(self.pid, &mut raw, libc::WNOHANG) };
            if r == self.pid {
                self.status = Some(ExitStatus::from_raw(raw));
            } else if r == 0 {
                ready.clear_ready();
            } else {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
}

/// Starts the process. When this returns `Ok`, the child has called `execve` successfully.
/// Must be called on a runtime thread (the pidfd is registered with the reactor).
pub(crate) fn spawn(request: &Request) -> io::Result<Child> {
    // SAFETY: mmap/munmap of an anonymous stack; the child runs `child_main` on it and the
    // spawning thread is suspended (CLONE_VFORK) until the child has exec'd or exited, so the
    // stack and the request outlive every use of them. All signals are blocked around the
    // clone so that no handler runs on the child's side before it resets them.
    unsafe {
        let stack = libc::mmap(
            std::ptr::null_mut(),
            CHILD_STACK_BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
            -1,
            0,
        );
        if stack == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut previous: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut previous);
        let top = stack.cast::<u8>().add(CHILD_STACK_BYTES).cast();
        let pid = libc::clone(
            child_main,
            top,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            std::ptr::from_ref(request).cast_mut().cast(),
        );
        let clone_error = io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &previous, std::ptr::null_mut());
        libc::munmap(stack, CHILD_STACK_BYTES);
        if pid < 0 {
            return Err(clone_error);
        }
        let errno = request.errno.load(Ordering::Acquire);
        if errno != 0 {
            return Err(reap_failed(pid, errno));
        }
        let pidfd = watch(pid)?;
        Ok(Child {
            pid,
            pidfd,
            status: None,
        })
    }
}

/// Reaps a child whose setup failed with `errno` (it exits, or was killed), and returns that
/// error.
///
/// # Safety
/// `pid` is this process's own unreaped child.
unsafe fn reap_failed(pid: libc::pid_t, errno: libc::c_int) -> io::Error {
    let mut raw = 0;
    // SAFETY: waitpid on our own child (the caller's contract).
    while unsafe { libc::waitpid(pid, &mut raw, 0) } < 0
        && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted
    {}
    io::Error::from_raw_os_error(errno)
}

/// A pidfd of a started child, registered for readiness (it becomes readable when the child
/// exits). The child is killed when it cannot be watched, so none runs unsupervised.
///
/// # Safety
/// `pid` is this process's own unreaped child.
unsafe fn watch(pid: libc::pid_t) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: pidfd_open and kill on our own unreaped child (the caller's contract); the
    // returned descriptor is fresh and owned here, then by the AsyncFd for its whole life.
    unsafe {
        let fd = libc::syscall(libc::SYS_pidfd_open, pid, libc::PIDFD_NONBLOCK);
        if fd < 0 {
            let e = io::Error::last_os_error();
            libc::kill(pid, libc::SIGKILL);
            return Err(e);
        }
        let pidfd = OwnedFd::from_raw_fd(fd as RawFd);
        AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE).map_err(|e| {
            libc::kill(pid, libc::SIGKILL);
            e.into()
        })
    }
}

/// The child: raw system calls on the request only; never returns to ring0's code.
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `Request` the suspended parent keeps alive; every call below is a
    // raw system call (async-signal-safe) on its prepared data or on the stack.
    unsafe {
        let request = &*(arg as *const Request);
        let fail = |errno: libc::c_int| -> ! {
            request.errno.store(errno.max(1), Ordering::Release);
            libc::_exit(127)
        };
        let errno = || *libc::__errno_location();
        // Handlers belong to ring0's memory: back to the default for every handled signal, and
        // SIGPIPE too (ring0 ignores it; a program expects the default).
        reset_signal_handlers();
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::pthread_sigmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());

        for (target, fd) in request.stdio.iter().enumerate() {
            if libc::dup2(*fd, target as libc::c_int) < 0 {
                fail(errno());
            }
        }
        if libc::chdir(request.cwd.as_ptr()) != 0 {
            fail(errno());
        }
        if libc::setsid() < 0 {
            fail(errno());
        }
        if let Err(e) = request.setup.apply() {
            fail(e.raw_os_error().unwrap_or(libc::EINVAL));
        }
        // As execvp: try each candidate; a permission error is reported only if nothing ran.
        let mut reported = libc::ENOENT;
        for candidate in &request.candidates {
            libc::execve(
                candidate.as_ptr(),
                request.argv_ptrs.as_ptr(),
                request.envp_ptrs.as_ptr(),
            );
            match errno() {
                libc::ENOENT | libc::ENOTDIR => {}
                libc::EACCES => reported = libc::EACCES,
                other => fail(other),
            }
        }
        fail(reported)
    }
}

/// Stacks of the keeper, the init and the program of one confined spawn, in that order.
const CONFINED_STACKS: usize = 3;

/// The stacks of a confined spawn's keeper and init, which run in ring0's memory for as long as
/// the program does: unmapped when the [`ConfinedChild`] that owns them is dropped (after the
/// keeper was reaped; the init dies with it by its parent-death signal).
pub(crate) struct Stacks {
    base: *mut libc::c_void,
}

// SAFETY: the mapping is only unmapped on drop; the pointer is never dereferenced here.
unsafe impl Send for Stacks {}
unsafe impl Sync for Stacks {}

impl Stacks {
    fn map() -> io::Result<Self> {
        // SAFETY: an anonymous private mapping owned by the returned value.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                CHILD_STACK_BYTES * CONFINED_STACKS,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Self { base })
    }

    /// The top of stack `index` (stacks grow down).
    fn top(&self, index: usize) -> *mut libc::c_void {
        debug_assert!(index < CONFINED_STACKS);
        // SAFETY: within the mapping.
        unsafe {
            self.base
                .cast::<u8>()
                .add(CHILD_STACK_BYTES * (index + 1))
                .cast()
        }
    }
}

impl Drop for Stacks {
    fn drop(&mut self) {
        // SAFETY: our own mapping, no longer used by a live keeper or init.
        unsafe { libc::munmap(self.base, CHILD_STACK_BYTES * CONFINED_STACKS) };
    }
}

/// What the keeper, the init and the program of one confined spawn read.
struct Confined<'a> {
    request: &'a Request,
    plan: &'a crate::sandbox::Plan,
    stacks: &'a Stacks,
    /// The keeper's lifeline pipe (read, write), set by the keeper before it starts the init:
    /// the init sees a hang-up if the keeper died before the init's parent-death signal was set.
    lifeline: [AtomicI32; 2],
    /// The status pipe (read, write) the init reports the program's wait status over (an init
    /// cannot end itself by a signal, so the keeper does).
    status: [AtomicI32; 2],
}

/// A confined child: the keeper, and the stacks it and the init run on.
pub(crate) struct ConfinedChild {
    pub(crate) child: Child,
    pub(crate) stacks: Stacks,
}

/// Starts a confined process without copying ring0's address space: the keeper and the init
/// run in ring0's memory on stacks of their own (`CLONE_VM`, raw system calls only, no signal
/// handlers: they wait for signals with `sigwaitinfo`), the program is cloned from the init
/// with `CLONE_VM | CLONE_VFORK` and confines itself before its `execve`. Returns once the
/// program has called `execve` (or a step failed: then nothing runs).
pub(crate) fn spawn_confined(
    request: &Request,
    plan: &crate::sandbox::Plan,
) -> io::Result<ConfinedChild> {
    let stacks = Stacks::map()?;
    let (exec_read, exec_write) =
        rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(io::Error::from)?;
    let confined = Confined {
        request,
        plan,
        stacks: &stacks,
        lifeline: [AtomicI32::new(-1), AtomicI32::new(-1)],
        status: [AtomicI32::new(-1), AtomicI32::new(-1)],
    };
    // SAFETY: the keeper runs `keeper_main` on its own stack in our memory and reads only
    // `confined`, which lives until the exec-status pipe reports the program's `execve` (or the
    // end of every process that holds its write end), which is awaited below before returning.
    // Every signal is blocked around the clone.
    let pid = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut previous: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut previous);
        let pid = libc::clone(
            keeper_main,
            stacks.top(0),
            libc::CLONE_VM | libc::SIGCHLD,
            std::ptr::from_ref(&confined).cast_mut().cast(),
        );
        let clone_error = io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &previous, std::ptr::null_mut());
        if pid < 0 {
            return Err(clone_error);
        }
        pid
    };
    drop(exec_write);
    // End of file once the program has exec'd, or every holder of the write end is gone.
    let mut byte = [0u8; 1];
    while let Err(rustix::io::Errno::INTR) = rustix::io::read(&exec_read, &mut byte) {}
    let errno = request.errno.load(Ordering::Acquire);
    // SAFETY: pidfd_open and kill on our own unreaped child.
    unsafe {
        if errno != 0 {
            libc::kill(pid, libc::SIGKILL);
            return Err(reap_failed(pid, errno));
        }
        let pidfd = watch(pid)?;
        Ok(ConfinedChild {
            child: Child {
                pid,
                pidfd,
                status: None,
            },
            stacks,
        })
    }
}

/// Resets every handled signal (and SIGPIPE) to its default disposition. Raw system calls.
unsafe fn reset_signal_handlers() {
    // SAFETY: sigaction on this process's own table.
    unsafe {
        for signal in 1..=SIGNAL_NUMBER_MAX {
            if signal == libc::SIGKILL || signal == libc::SIGSTOP {
                continue;
            }
            let mut current: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(signal, std::ptr::null(), &mut current) != 0 {
                continue;
            }
            let handled =
                current.sa_sigaction != libc::SIG_DFL && current.sa_sigaction != libc::SIG_IGN;
            if handled || signal == libc::SIGPIPE {
                let mut default: libc::sigaction = std::mem::zeroed();
                default.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(signal, &default, std::ptr::null_mut());
            }
        }
    }
}

/// The signals the keeper and the init wait for: the forwarded ones and SIGCHLD.
unsafe fn waited_signals() -> libc::sigset_t {
    // SAFETY: building a set on the stack.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for signal in crate::sandbox::FORWARDED {
            libc::sigaddset(&mut set, signal);
        }
        libc::sigaddset(&mut set, libc::SIGCHLD);
        set
    }
}

/// Waits for `child` to end, passing the forwarded signals on to it; with `reap_all`, also
/// reaps every other child (the init of a PID namespace). Returns `child`'s wait status.
unsafe fn forward_until_exit(child: libc::pid_t, reap_all: bool) -> Option<libc::c_int> {
    // SAFETY: raw system calls on the stack; signals stay blocked (never delivered to a
    // handler), they are only taken with sigwaitinfo.
    unsafe {
        let set = waited_signals();
        loop {
            let mut status = 0;
            loop {
                let r = libc::waitpid(
                    if reap_all { -1 } else { child },
                    &mut status,
                    libc::WNOHANG,
                );
                if r == child {
                    return Some(status);
                }
                if r <= 0 {
                    if r < 0 && *libc::__errno_location() == libc::ECHILD {
                        return None;
                    }
                    break;
                }
            }
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let signal = libc::sigwaitinfo(&set, &mut info);
            if signal > 0 && signal != libc::SIGCHLD {
                libc::kill(child, signal);
            }
        }
    }
}

/// Records the error of a failed step for the parent and ends this process.
fn fail_confined(request: &Request, error: io::Error) -> ! {
    let code = error.raw_os_error().unwrap_or(libc::EINVAL).max(1);
    request.errno.store(code, Ordering::Release);
    // SAFETY: ends the process.
    unsafe { libc::_exit(127) }
}

/// The keeper: session leader and root of the run, in ring0's PID namespace.
extern "C" fn keeper_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `Confined` the parent keeps alive until the program's execve; only
    // raw system calls below, on it or on the stack.
    unsafe {
        let confined = &*(arg as *const Confined<'_>);
        let request = confined.request;
        reset_signal_handlers();
        let waited = waited_signals();
        libc::pthread_sigmask(libc::SIG_SETMASK, &waited, std::ptr::null_mut());
        for (target, fd) in request.stdio.iter().enumerate() {
            if libc::dup2(*fd, target as libc::c_int) < 0 {
                fail_confined(request, io::Error::last_os_error());
            }
        }
        if libc::chdir(request.cwd.as_ptr()) != 0 {
            fail_confined(request, io::Error::last_os_error());
        }
        if let Err(e) = request.setup.apply() {
            fail_confined(request, e);
        }
        // The keeper leads the session and group that teardown signals.
        libc::setsid();
        if let Err(e) = confined.plan.enter_namespaces() {
            fail_confined(request, e);
        }
        let mut lifeline = [0 as RawFd; 2];
        let mut status = [0 as RawFd; 2];
        if libc::pipe2(lifeline.as_mut_ptr(), libc::O_CLOEXEC) != 0
            || libc::pipe2(status.as_mut_ptr(), libc::O_CLOEXEC) != 0
        {
            fail_confined(request, crate::sandbox::Step::Fork.error());
        }
        for (slot, fd) in confined.lifeline.iter().zip(lifeline) {
            slot.store(fd, Ordering::Release);
        }
        for (slot, fd) in confined.status.iter().zip(status) {
            slot.store(fd, Ordering::Release);
        }
        let init = libc::clone(
            init_main,
            confined.stacks.top(1),
            libc::CLONE_VM | libc::SIGCHLD,
            arg,
        );
        if init < 0 {
            fail_confined(request, crate::sandbox::Step::Fork.error());
        }
        // Every inherited descriptor but the lifeline's write end, the exec-status pipe
        // included (the program holds it).
        crate::sandbox::close_all_except([lifeline[1], status[0]]);
        let Some(init_status) = forward_until_exit(init, false) else {
            libc::_exit(127);
        };
        let mut bytes = [0u8; 4];
        let got = libc::read(status[0], bytes.as_mut_ptr().cast(), bytes.len());
        if got == bytes.len() as isize {
            crate::sandbox::exit_as(libc::c_int::from_ne_bytes(bytes))
        }
        crate::sandbox::exit_as(init_status)
    }
}

/// The init of the program's PID namespace: dies with the keeper, starts the program, reaps
/// everything, and ends as the program did, so the kernel kills whatever it left behind.
extern "C" fn init_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: as in `keeper_main`.
    unsafe {
        let confined = &*(arg as *const Confined<'_>);
        let request = confined.request;
        if libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        ) != 0
        {
            fail_confined(request, crate::sandbox::Step::ParentGone.error());
        }
        // The keeper holds the lifeline's write end: a hang-up means it died before the line
        // above, and no signal will come.
        let lifeline_read = confined.lifeline[0].load(Ordering::Acquire);
        libc::close(confined.lifeline[1].load(Ordering::Acquire));
        let mut poll = libc::pollfd {
            fd: lifeline_read,
            events: libc::POLLIN,
            revents: 0,
        };
        if libc::poll(&mut poll, 1, 0) != 0 {
            fail_confined(request, crate::sandbox::Step::ParentGone.error());
        }
        libc::close(lifeline_read);
        // Read before the program's execve, after which ring0 may free `confined`.
        let status_write = confined.status[1].load(Ordering::Acquire);
        let program = libc::clone(
            program_main,
            confined.stacks.top(2),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            arg,
        );
        if program < 0 {
            fail_confined(request, crate::sandbox::Step::Fork.error());
        }
        crate::sandbox::close_all_except([status_write, status_write]);
        let Some(status) = forward_until_exit(program, true) else {
            libc::_exit(127);
        };
        let bytes = status.to_ne_bytes();
        libc::write(status_write, bytes.as_ptr().cast(), bytes.len());
        libc::_exit(0)
    }
}

/// The program: confines itself and calls `execve` (the init is suspended until then).
extern "C" fn program_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: as in `keeper_main`.
    unsafe {
        let confined = &*(arg as *const Confined<'_>);
        let request = confined.request;
        // The program leads a session and group of its own, as an unconfined one does (it
        // stays the keeper's descendant, which is how teardown finds it).
        if libc::setsid() < 0 {
            fail_confined(request, io::Error::last_os_error());
        }
        if let Err(e) = confined.plan.confine_program() {
            fail_confined(request, e);
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::pthread_sigmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        let mut reported = libc::ENOENT;
        for candidate in &request.candidates {
            libc::execve(
                candidate.as_ptr(),
                request.argv_ptrs.as_ptr(),
                request.envp_ptrs.as_ptr(),
            );
            match *libc::__errno_location() {
                libc::ENOENT | libc::ENOTDIR => {}
                libc::EACCES => reported = libc::EACCES,
                other => fail_confined(request, io::Error::from_raw_os_error(other)),
            }
        }
        fail_confined(request, io::Error::from_raw_os_error(reported))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_name_is_searched_in_path_order_and_a_path_is_taken_as_is() {
        let found = candidates(OsStr::new("ls"), OsStr::new("/a::/b")).unwrap();
        let found: Vec<&[u8]> = found.iter().map(|c| c.to_bytes()).collect();
        assert_eq!(found, vec![&b"/a/ls"[..], b"./ls", b"/b/ls"]);
        let direct = candidates(OsStr::new("./run.sh"), OsStr::new("/a")).unwrap();
        assert_eq!(direct[0].to_bytes(), b"./run.sh");
    }
}
