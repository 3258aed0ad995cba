//! Finding and ending every process a supervised run started.
//!
//! A run's root is spawned as the leader of a new session and process group, with a random
//! token in its environment. A process belongs to the run when any of these holds:
//! - it is in the run's process group or session (the usual case, one signal reaches them all);
//! - its parent chain leads to a member (a child that called `setsid` or `setpgid` left the
//!   group, but not its parent's tree);
//! - it carries the run's token (a double-forked daemon: its parent died, so it was re-parented
//!   to ring0 as child subreaper and its ancestry no longer names the run).
//!
//! Only ring0's own descendants are examined for the token, so the scan never reads the
//! environment of unrelated processes. Teardown is SIGTERM (plus SIGCONT, so stopped processes
//! can act on it) to the group and to every member, a grace period during which the membership
//! is re-scanned (a member that forks gets its new child signalled too), then SIGKILL until none
//! is left. The scans read `/proc` synchronously; they take milliseconds and run only here.

use crate::proc::{self, ProcStatus};
use crate::reaper;
use crate::spec::SUPERVISION_TOKEN_ENV;
use rustix::process::{Pid, Signal};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// Who belongs to one supervised run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RunIdentity {
    /// Pid of the root; also its process group and session id.
    pub root: i32,
    /// The random token in every member's environment.
    pub token: String,
    /// The run's pids cgroup, which holds every descendant whatever it did (see
    /// [`crate::cgroup`]). Not recorded: a later ring0 finds the cgroups of dead owners itself.
    #[serde(skip)]
    pub cgroup: Option<std::sync::Arc<crate::cgroup::RunCgroup>>,
}

/// What a teardown did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TeardownReport {
    /// Distinct live processes found and signalled.
    pub processes_signalled: usize,
    /// Of those, how many were still alive when the grace period ended and got SIGKILL.
    pub killed_after_grace: usize,
    /// Processes still alive when teardown gave up (only processes stuck in uninterruptible
    /// sleep can survive SIGKILL for long).
    pub survivors: usize,
    /// From the first signal to the last check, in milliseconds.
    pub elapsed_ms: u64,
}

/// Live (not zombie) members of the run, found by the full scan described in the module docs.
pub(crate) fn live_members(identity: &RunIdentity) -> Vec<ProcStatus> {
    let me = rustix::process::getpid().as_raw_nonzero().get();
    let all = proc::all();
    let mut members = members_in(&all, me, identity, |pid| {
        proc::has_env_marker(pid, SUPERVISION_TOKEN_ENV, &identity.token)
    });
    if let Some(cgroup) = &identity.cgroup {
        for pid in cgroup.members() {
            if let Some(status) = all.get(&pid).copied().or_else(|| proc::status(pid))
                && !members.iter().any(|m| m.pid == pid)
            {
                members.push(status);
            }
        }
    }
    members.retain(|p| !p.is_zombie());
    members
}

/// Membership over a snapshot of `/proc`. `has_token` is asked only about descendants of `me`.
fn members_in(
    all: &HashMap<i32, ProcStatus>,
    me: i32,
    identity: &RunIdentity,
    has_token: impl Fn(i32) -> bool,
) -> Vec<ProcStatus> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Member,
        OursUnattributed,
        Foreign,
    }
    let mut marks: HashMap<i32, Mark> = HashMap::with_capacity(all.len());
    // Resolve each process by walking its parent chain until something already decided.
    for &start in all.keys() {
        let mut chain = Vec::new();
        let mut cursor = start;
        let verdict = loop {
            if let Some(mark) = marks.get(&cursor) {
                break *mark;
            }
            let Some(status) = all.get(&cursor) else {
                break Mark::Foreign;
            };
            if cursor == me {
                break Mark::OursUnattributed;
            }
            if status.pid == identity.root
                || status.pgrp == identity.root
                || status.session == identity.root
            {
                marks.insert(cursor, Mark::Member);
                break Mark::Member;
            }
            chain.push(cursor);
            if status.ppid <= 1 || chain.len() > all.len() {
                break Mark::Foreign;
            }
            cursor = status.ppid;
        };
        for pid in chain {
            marks.insert(pid, verdict);
        }
    }
    // Descendants of ring0 not yet attributed: the token decides, and a token holder's
    // descendants follow it.
    let tokened: HashSet<i32> = marks
        .iter()
        .filter(|(pid, mark)| **mark == Mark::OursUnattributed && **pid != me)
        .map(|(pid, _)| *pid)
        .filter(|pid| has_token(*pid))
        .collect();
    let mut members: HashSet<i32> = marks
        .iter()
        .filter(|(_, mark)| **mark == Mark::Member)
        .map(|(pid, _)| *pid)
        .chain(tokened.iter().copied())
        .collect();
    if !tokened.is_empty() {
        loop {
            let before = members.len();
            for status in all.values() {
                if marks.get(&status.pid) == Some(&Mark::OursUnattributed)
                    && members.contains(&status.ppid)
                {
                    members.insert(status.pid);
                }
            }
            if members.len() == before {
                break;
            }
        }
    }
    members.remove(&me);
    members
        .iter()
        .filter_map(|pid| all.get(pid).copied())
        .collect()
}

/// Whether the run may have left processes behind after its root was reaped: its group still
/// has members, or ring0 has adopted orphans. Cheap (no full scan), so a run that ended cleanly
/// pays almost nothing.
pub(crate) fn may_have_survivors(identity: &RunIdentity) -> bool {
    let group_alive = Pid::from_raw(identity.root)
        .is_some_and(|pid| rustix::process::test_kill_process_group(pid).is_ok());
    group_alive
        || reaper::has_adopted_children()
        || identity
            .cgroup
            .as_ref()
            .is_some_and(|c| !c.members().is_empty())
}

fn signal_all(group: Option<i32>, members: &[ProcStatus], signal: Signal) {
    if let Some(group) = group.and_then(Pid::from_raw) {
        // ESRCH (the group is empty) is the good case.
        let _ = rustix::process::kill_process_group(group, signal);
    }
    for member in members {
        if let Some(pid) = Pid::from_raw(member.pid) {
            let _ = rustix::process::kill_process(pid, signal);
        }
    }
}

/// SIGTERM, grace, SIGKILL, reap; see the module docs.
pub(crate) async fn teardown(identity: RunIdentity, grace: Duration) -> TeardownReport {
    let group = Some(identity.root);
    terminate(move || live_members(&identity), group, grace).await
}

/// The escalation itself, over whatever `find` reports as the live members each time it is
/// asked (and over `group`, signalled as a whole).
pub(crate) async fn terminate(
    find: impl Fn() -> Vec<ProcStatus>,
    group: Option<i32>,
    grace: Duration,
) -> TeardownReport {
    const TICK_FIRST: Duration = Duration::from_millis(2);
    const TICK_MAX: Duration = Duration::from_millis(50);

    let started = Instant::now();
    let mut report = TeardownReport::default();
    let mut seen: HashSet<i32> = HashSet::new();

    let mut members = find();
    seen.extend(members.iter().map(|m| m.pid));
    signal_all(group, &members, Signal::TERM);
    signal_all(group, &members, Signal::CONT);

    let grace_end = started + grace;
    let mut tick = TICK_FIRST;
    loop {
        reaper::sweep_adopted_zombies();
        members = find();
        let fresh: Vec<ProcStatus> = members
            .iter()
            .filter(|m| seen.insert(m.pid))
            .copied()
            .collect();
        if !fresh.is_empty() {
            signal_all(group, &fresh, Signal::TERM);
            signal_all(group, &fresh, Signal::CONT);
        }
        if members.is_empty() || Instant::now() >= grace_end {
            break;
        }
        let left = grace_end.saturating_duration_since(Instant::now());
        tokio::time::sleep(tick.min(left)).await;
        tick = (tick * 2).min(TICK_MAX);
    }

    if !members.is_empty() {
        report.killed_after_grace = members.len();
        let kill_end = Instant::now() + crate::limits::KILL_CONFIRM_MAX;
        let mut tick = TICK_FIRST;
        loop {
            seen.extend(members.iter().map(|m| m.pid));
            signal_all(group, &members, Signal::KILL);
            tokio::time::sleep(tick).await;
            tick = (tick * 2).min(TICK_MAX);
            reaper::sweep_adopted_zombies();
            members = find();
            if members.is_empty() || Instant::now() >= kill_end {
                break;
            }
        }
        report.survivors = members.len();
    }
    reaper::sweep_adopted_zombies();
    report.processes_signalled = seen.len();
    report.elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(pid: i32, ppid: i32, pgrp: i32, session: i32) -> ProcStatus {
        ProcStatus {
            pid,
            ppid,
            pgrp,
            session,
            state: 'S',
            cpu_ticks: 0,
            children_cpu_ticks: 0,
            threads: 1,
            rss_pages: 0,
            start_ticks: 0,
        }
    }

    fn snapshot(list: &[ProcStatus]) -> HashMap<i32, ProcStatus> {
        list.iter().map(|s| (s.pid, *s)).collect()
    }

    fn pids(mut members: Vec<ProcStatus>) -> Vec<i32> {
        members.sort_by_key(|m| m.pid);
        members.into_iter().map(|m| m.pid).collect()
    }

    const ME: i32 = 100;

    fn identity() -> RunIdentity {
        RunIdentity {
            root: 200,
            token: "t".into(),
            cgroup: None,
        }
    }

    #[test]
    fn group_and_session_members_belong_to_the_run() {
        let all = snapshot(&[
            status(1, 0, 1, 1),
            status(ME, 1, ME, ME),
            status(200, ME, 200, 200),
            status(201, 200, 200, 200),
            status(202, 201, 202, 200),
        ]);
        assert_eq!(
            pids(members_in(&all, ME, &identity(), |_| false)),
            vec![200, 201, 202]
        );
    }

    #[test]
    fn a_child_that_left_the_session_is_found_through_its_parent() {
        let all = snapshot(&[
            status(1, 0, 1, 1),
            status(ME, 1, ME, ME),
            status(200, ME, 200, 200),
            status(300, 200, 300, 300),
            status(301, 300, 300, 300),
        ]);
        assert_eq!(
            pids(members_in(&all, ME, &identity(), |_| false)),
            vec![200, 300, 301]
        );
    }

    #[test]
    fn an_adopted_daemon_is_found_by_its_token_with_its_children() {
        let all = snapshot(&[
            status(1, 0, 1, 1),
            status(ME, 1, ME, ME),
            status(400, ME, 399, 399),
            status(401, 400, 399, 399),
            status(500, ME, 500, 500),
        ]);
        let members = members_in(&all, ME, &identity(), |pid| pid == 400);
        assert_eq!(pids(members), vec![400, 401]);
    }

    #[test]
    fn unrelated_processes_and_other_runs_are_left_alone() {
        let all = snapshot(&[
            status(1, 0, 1, 1),
            status(ME, 1, ME, ME),
            status(200, ME, 200, 200),
            status(600, 1, 600, 600),
            status(601, 600, 600, 600),
            status(700, ME, 700, 700),
        ]);
        assert_eq!(
            pids(members_in(&all, ME, &identity(), |_| false)),
            vec![200]
        );
    }

    #[test]
    fn the_token_is_asked_only_about_ring0_descendants() {
        let all = snapshot(&[
            status(1, 0, 1, 1),
            status(ME, 1, ME, ME),
            status(600, 1, 600, 600),
            status(700, ME, 700, 700),
        ]);
        let asked = std::sync::Mutex::new(Vec::new());
        members_in(&all, ME, &identity(), |pid| {
            asked.lock().unwrap().push(pid);
            false
        });
        assert_eq!(*asked.lock().unwrap(), vec![700]);
    }
}
