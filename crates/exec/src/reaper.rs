//! ring0 as the child subreaper of everything it starts.
//!
//! With `PR_SET_CHILD_SUBREAPER`, a descendant whose parent dies (a double fork, a daemon that
//! calls `setsid`) is re-parented to ring0 instead of to init, so it stays visible as one of ours
//! and ring0 can kill it. The price is that ring0 must reap those adopted orphans, or they linger
//! as zombies.
//!
//! Reaping must not steal the exit status of a process that tokio (or anyone in this process) is
//! waiting for. So every child this crate spawns is registered here, under the same lock the
//! sweep takes, and the sweep only reaps zombies that are (a) children of this process, (b) not
//! registered, and (c) in another session than ring0's: a child that another part of the
//! process spawned without a new session stays in ring0's session and is never touched.

use rustix::process::{self, Pid, WaitOptions};
use std::collections::HashSet;
use std::sync::{Mutex, MutexGuard, OnceLock};

static SUBREAPER: OnceLock<Result<(), String>> = OnceLock::new();
static DIRECT_CHILDREN: Mutex<Option<HashSet<i32>>> = Mutex::new(None);

/// Makes this process the child subreaper of its descendants (idempotent).
pub(crate) fn ensure_subreaper() -> Result<(), String> {
    SUBREAPER
        .get_or_init(|| {
            process::set_child_subreaper(Some(process::getpid()))
                .map_err(|e| format!("PR_SET_CHILD_SUBREAPER failed: {e}"))
        })
        .clone()
}

/// The registry lock; hold it from spawn until the child's pid is registered.
pub(crate) struct Registry<'a>(MutexGuard<'a, Option<HashSet<i32>>>);

pub(crate) fn lock() -> Registry<'static> {
    Registry(DIRECT_CHILDREN.lock().unwrap_or_else(|p| p.into_inner()))
}

impl Registry<'_> {
    pub(crate) fn register(&mut self, pid: i32) -> DirectChild {
        self.0.get_or_insert_with(HashSet::new).insert(pid);
        DirectChild(pid)
    }
}

/// A registered direct child; deregistered on drop (after tokio has reaped it, or given up).
#[derive(Debug)]
pub(crate) struct DirectChild(i32);

impl Drop for DirectChild {
    fn drop(&mut self) {
        if let Some(set) = lock().0.as_mut() {
            set.remove(&self.0);
        }
    }
}

/// Reaps adopted orphans that have died. Returns how many were reaped.
pub(crate) fn sweep_adopted_zombies() -> usize {
    let me = process::getpid().as_raw_nonzero().get();
    let my_session = crate::proc::status(me).map(|s| s.session);
    let kids = crate::proc::children(me);
    if kids.is_empty() {
        return 0;
    }
    let registry = lock();
    let mut reaped = 0;
    for kid in kids {
        if registry.0.as_ref().is_some_and(|set| set.contains(&kid)) {
            continue;
        }
        let Some(status) = crate::proc::status(kid) else {
            continue;
        };
        if !status.is_zombie() || status.ppid != me || Some(status.session) == my_session {
            continue;
        }
        let Some(pid) = Pid::from_raw(kid) else {
            continue;
        };
        if let Ok(Some(_)) = process::waitpid(Some(pid), WaitOptions::NOHANG) {
            reaped += 1;
        }
    }
    reaped
}

/// Whether this process has children that this crate did not spawn directly — orphans adopted
/// from some supervised tree (or, rarely, children of other parts of the process).
pub(crate) fn has_adopted_children() -> bool {
    let me = process::getpid().as_raw_nonzero().get();
    let kids = crate::proc::children(me);
    if kids.is_empty() {
        return false;
    }
    let my_session = crate::proc::status(me).map(|s| s.session);
    let registry = lock();
    kids.iter().any(|kid| {
        !registry.0.as_ref().is_some_and(|set| set.contains(kid))
            && crate::proc::status(*kid).is_some_and(|s| Some(s.session) != my_session)
    })
}
