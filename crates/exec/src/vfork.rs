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
//! Only the pipe path with the sandbox off uses this: a confined process needs a keeper that
//! lives on after `execve` of nothing (see `sandbox::child`), which a shared address space
//! cannot host.

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
            let mut raw = 0;
            while libc::waitpid(pid, &mut raw, 0) < 0
                && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted
            {}
            return Err(io::Error::from_raw_os_error(errno));
        }
        let fd = libc::syscall(libc::SYS_pidfd_open, pid, libc::PIDFD_NONBLOCK);
        if fd < 0 {
            let e = io::Error::last_os_error();
            libc::kill(pid, libc::SIGKILL);
            return Err(e);
        }
        let pidfd = OwnedFd::from_raw_fd(fd as RawFd);
        // The descriptor is owned by the AsyncFd for its whole life.
        let pidfd = match AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE) {
            Ok(fd) => fd,
            Err(e) => {
                libc::kill(pid, libc::SIGKILL);
                return Err(e.into());
            }
        };
        Ok(Child {
            pid,
            pidfd,
            status: None,
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
