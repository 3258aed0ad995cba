//! Reading `/proc`: process status, ancestry, environment markers and children.
//!
//! Parsing is the `procfs` crate's; this module narrows it to what supervision needs and turns
//! every race (a process exiting between listing and reading) into "not there", never an error.

use procfs::process::{Process, Stat};
use std::collections::HashMap;

/// What supervision needs from `/proc/<pid>/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProcStatus {
    pub pid: i32,
    pub ppid: i32,
    pub pgrp: i32,
    pub session: i32,
    pub state: char,
    /// utime + stime of this process, in clock ticks.
    pub cpu_ticks: u64,
    /// cutime + cstime: CPU of its reaped children, in clock ticks.
    pub children_cpu_ticks: u64,
    pub threads: i64,
    pub rss_pages: u64,
    /// Start time in clock ticks since boot; with the pid, identifies one process for good.
    pub start_ticks: u64,
}

impl ProcStatus {
    pub fn is_zombie(&self) -> bool {
        matches!(self.state, 'Z' | 'X')
    }

    fn from_stat(stat: &Stat) -> Self {
        Self {
            pid: stat.pid,
            ppid: stat.ppid,
            pgrp: stat.pgrp,
            session: stat.session,
            state: stat.state,
            cpu_ticks: stat.utime.saturating_add(stat.stime),
            children_cpu_ticks: (stat.cutime.max(0) as u64)
                .saturating_add(stat.cstime.max(0) as u64),
            threads: stat.num_threads,
            rss_pages: stat.rss,
            start_ticks: stat.starttime,
        }
    }
}

/// Status of one process, or `None` if it is gone (or unreadable).
pub(crate) fn status(pid: i32) -> Option<ProcStatus> {
    let stat = Process::new(pid).ok()?.stat().ok()?;
    Some(ProcStatus::from_stat(&stat))
}

/// Status of every process visible in `/proc`.
pub(crate) fn all() -> HashMap<i32, ProcStatus> {
    let mut out = HashMap::new();
    let Ok(iter) = procfs::process::all_processes() else {
        return out;
    };
    for process in iter.flatten() {
        if let Ok(stat) = process.stat() {
            out.insert(stat.pid, ProcStatus::from_stat(&stat));
        }
    }
    out
}

/// Whether `pid`'s environment holds `name=value`. Unreadable (gone, a zombie, another user's)
/// counts as no.
pub(crate) fn has_env_marker(pid: i32, name: &str, value: &str) -> bool {
    let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
        return false;
    };
    let mut wanted = Vec::with_capacity(name.len() + value.len() + 1);
    wanted.extend_from_slice(name.as_bytes());
    wanted.push(b'=');
    wanted.extend_from_slice(value.as_bytes());
    environ
        .split(|b| *b == 0)
        .any(|entry| entry == wanted.as_slice())
}

/// Direct children of `pid` (of every thread of it), from `/proc/<pid>/task/*/children`.
pub(crate) fn children(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let Ok(process) = Process::new(pid) else {
        return out;
    };
    let Ok(tasks) = process.tasks() else {
        return out;
    };
    for task in tasks.flatten() {
        if let Ok(kids) = task.children() {
            out.extend(kids.into_iter().filter_map(|k| i32::try_from(k).ok()));
        }
    }
    out
}

/// `pid` and every live descendant reachable through the children lists (the cheap walk used
/// while a job runs; teardown uses the full scan in `teardown`, which also finds escapees).
pub(crate) fn tree(root: i32, max: usize) -> Vec<i32> {
    let mut out = vec![root];
    let mut next = 0;
    while next < out.len() && out.len() < max {
        let kids = children(out[next]);
        for kid in kids {
            if out.len() >= max {
                break;
            }
            if !out.contains(&kid) {
                out.push(kid);
            }
        }
        next += 1;
    }
    out
}

/// Clock ticks per second, for turning `ProcStatus` CPU figures into time.
pub(crate) fn ticks_per_second() -> u64 {
    procfs::ticks_per_second().max(1)
}

/// Bytes per page, for turning `rss_pages` into bytes.
pub(crate) fn page_size() -> u64 {
    procfs::page_size()
}

/// This boot's random id: a pid and start time recorded under another boot mean nothing.
pub(crate) fn boot_id() -> Option<String> {
    procfs::sys::kernel::random::boot_id().ok()
}
