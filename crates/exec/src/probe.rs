//! Is a job waiting for input?
//!
//! The kernel sends no event when a reader starts waiting on a pipe or terminal, so interactive
//! jobs are probed every [`crate::limits::INPUT_PROBE_INTERVAL`]. A process counts as waiting for
//! input when one of its threads is blocked (per `/proc/<pid>/task/<tid>/syscall`) in:
//! - `read`, `readv`, `pread64`, `preadv`, `preadv2` on a descriptor that is the job's input;
//! - `select`/`pselect6` with the job's input in the read set, or `poll`/`ppoll` with it asking
//!   for `POLLIN` (the sets are read from `/proc/<pid>/mem`, which ring0 may read as the
//!   process's ancestor);
//! - `epoll_wait`/`epoll_pwait`/`epoll_pwait2` on an epoll instance that watches the job's input
//!   for `EPOLLIN` (per `/proc/<pid>/fdinfo/<epfd>`).
//!
//! "The job's input" is matched by identity, not by number: the pipe's inode or the terminal's
//! path, as `/proc/<pid>/fd/N` names it. `wchan` is not used: kernels often hide it, and its
//! names (`pipe_read`, `anon_pipe_read`, `n_tty_read`, `wait_woken`) change between versions.
//! Blocking in a read-family call means no input is pending; the caller still requires two
//! consecutive positive probes with no input sent in between before reporting it.

use crate::spawn::InputObject;
use procfs::process::{FDTarget, Process};
use std::os::unix::fs::FileExt;

/// Most processes of one job examined per probe.
const PROBE_PROCESSES_MAX: usize = 256;
/// Most descriptors examined in one select/poll set.
const PROBE_SET_FDS_MAX: u64 = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    Read(i32),
    Select { nfds: u64, readfds: u64 },
    Poll { fds: u64, nfds: u64 },
    Epoll(i32),
}

fn classify(number: i64, args: &[u64; 6]) -> Option<Wait> {
    let n = number as libc::c_long;
    let fd = || i32::try_from(args[0]).ok();
    if [
        libc::SYS_read,
        libc::SYS_readv,
        libc::SYS_pread64,
        libc::SYS_preadv,
        libc::SYS_preadv2,
    ]
    .contains(&n)
    {
        return fd().map(Wait::Read);
    }
    #[cfg(target_arch = "x86_64")]
    if n == libc::SYS_select {
        return Some(Wait::Select {
            nfds: args[0],
            readfds: args[1],
        });
    }
    if n == libc::SYS_pselect6 {
        return Some(Wait::Select {
            nfds: args[0],
            readfds: args[1],
        });
    }
    #[cfg(target_arch = "x86_64")]
    if n == libc::SYS_poll {
        return Some(Wait::Poll {
            fds: args[0],
            nfds: args[1],
        });
    }
    if n == libc::SYS_ppoll {
        return Some(Wait::Poll {
            fds: args[0],
            nfds: args[1],
        });
    }
    #[cfg(target_arch = "x86_64")]
    if n == libc::SYS_epoll_wait {
        return fd().map(Wait::Epoll);
    }
    if n == libc::SYS_epoll_pwait || n == libc::SYS_epoll_pwait2 {
        return fd().map(Wait::Epoll);
    }
    None
}

fn fd_is_input(process: &Process, fd: i32, input: &InputObject) -> bool {
    let Ok(info) = process.fd_from_fd(fd) else {
        return false;
    };
    match (&info.target, input) {
        (FDTarget::Pipe(inode), InputObject::Pipe(wanted)) => inode == wanted,
        (FDTarget::Path(path), InputObject::Tty(wanted)) => path == wanted,
        _ => false,
    }
}

fn read_memory(pid: i32, address: u64, len: usize) -> Option<Vec<u8>> {
    let file = std::fs::File::open(format!("/proc/{pid}/mem")).ok()?;
    let mut buf = vec![0u8; len];
    file.read_exact_at(&mut buf, address).ok()?;
    Some(buf)
}

fn waits_for(pid: i32, process: &Process, wait: Wait, input: &InputObject) -> bool {
    match wait {
        Wait::Read(fd) => fd_is_input(process, fd, input),
        Wait::Select { nfds, readfds } => {
            if readfds == 0 {
                return false;
            }
            let nfds = nfds.min(PROBE_SET_FDS_MAX);
            let Some(bits) = read_memory(pid, readfds, nfds.div_ceil(8) as usize) else {
                return false;
            };
            (0..nfds).any(|fd| {
                bits[(fd / 8) as usize] & (1 << (fd % 8)) != 0
                    && fd_is_input(process, fd as i32, input)
            })
        }
        Wait::Poll { fds, nfds } => {
            let nfds = nfds.min(PROBE_SET_FDS_MAX);
            let Some(raw) = read_memory(pid, fds, (nfds * 8) as usize) else {
                return false;
            };
            raw.chunks_exact(8).any(|entry| {
                let fd = i32::from_ne_bytes([entry[0], entry[1], entry[2], entry[3]]);
                let events = i16::from_ne_bytes([entry[4], entry[5]]);
                events & (libc::POLLIN | libc::POLLRDNORM) != 0 && fd_is_input(process, fd, input)
            })
        }
        Wait::Epoll(epfd) => {
            let Ok(info) = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{epfd}")) else {
                return false;
            };
            info.lines().any(|line| {
                let mut words = line.split_whitespace();
                if words.next() != Some("tfd:") {
                    return false;
                }
                let Some(fd) = words.next().and_then(|w| w.parse::<i32>().ok()) else {
                    return false;
                };
                let events = match (words.next(), words.next()) {
                    (Some("events:"), Some(hex)) => u32::from_str_radix(hex, 16).unwrap_or(0),
                    _ => 0,
                };
                events & (libc::EPOLLIN as u32) != 0 && fd_is_input(process, fd, input)
            })
        }
    }
}

/// Whether any process of the tree rooted at `root` is blocked waiting to read `input`.
pub(crate) fn blocked_on_input(root: i32, input: &InputObject) -> bool {
    for pid in crate::proc::tree(root, PROBE_PROCESSES_MAX) {
        let Ok(process) = Process::new(pid) else {
            continue;
        };
        let Ok(tasks) = process.tasks() else {
            continue;
        };
        for task in tasks.flatten() {
            let Ok(procfs::process::Syscall::Blocked {
                syscall_number,
                argument_registers,
                ..
            }) = task.syscall()
            else {
                continue;
            };
            if let Some(wait) = classify(syscall_number, &argument_registers)
                && waits_for(pid, &process, wait, input)
            {
                return true;
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_family_calls_name_their_descriptor() {
        let args = [7, 0, 0, 0, 0, 0];
        assert_eq!(classify(libc::SYS_read, &args), Some(Wait::Read(7)));
        assert_eq!(classify(libc::SYS_readv, &args), Some(Wait::Read(7)));
    }

    #[test]
    fn waits_that_are_not_reads_are_not_input_waits() {
        let args = [0; 6];
        assert_eq!(classify(libc::SYS_nanosleep, &args), None);
        assert_eq!(classify(libc::SYS_write, &args), None);
        assert_eq!(classify(-1, &args), None);
    }
}
