//! A pids cgroup of its own for every run.
//!
//! Two things only the kernel's control groups give a supervisor:
//! - **a bound on a run's processes that holds for root.** `RLIMIT_NPROC` counts every process of
//!   a user and the kernel does not apply it to root at all, so a fork bomb started by a ring0
//!   running as root could take every process id of the machine until its timeout. A run's
//!   `pids.max` counts its own tasks (processes and threads), whoever runs it;
//! - **a membership nothing inside can leave.** Every descendant is in its run's cgroup whatever
//!   it did to its session, group, parent or environment (a double-forked `setsid` daemon with an
//!   empty environment included), and the cgroup outlives ring0: when ring0 is killed, the next
//!   ring0 finds the runs of dead owners and ends what is left in them
//!   ([`settle_leftover_runs`]).
//!
//! Runs live in `ring0/<owner pid>.<n>` under ring0's own cgroup, in the v1 `pids` hierarchy or
//! in the unified (v2) one where the `pids` controller can be enabled for children (ring0 in the
//! root cgroup, as in a container, or a delegated subtree). The child joins its cgroup itself,
//! before anything else ([`crate::hooks::ChildSetup`] writes `0` to the `cgroup.procs` the parent
//! opened), so it cannot fork outside it. No crate covers this: the cgroup crates manage whole
//! hierarchies for container runtimes (and bring their own process and regex stacks); a run
//! needs a directory, two writes and a read.

use std::fs;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The directory under ring0's own cgroup that holds the runs' cgroups.
const RUNS_DIR: &str = "ring0";
/// The leaf ring0 moves itself into in a cgroup v2 subtree delegated to it.
const SUPERVISOR_DIR: &str = "ring0-supervisor";
/// How long ending a cgroup's members may take before it is left for the next sweep. Members
/// are killed with SIGKILL; only a task in uninterruptible sleep outlives that for long.
const KILL_WAIT: Duration = Duration::from_secs(5);
/// Pause between looks at a cgroup that is still emptying.
const POLL: Duration = Duration::from_millis(1);
/// Most empty groups one process keeps for its next runs.
const POOL_MAX: usize = 16;
/// Most leftover cgroups one sweep ends (a machine holds at most a few thousand runs).
const LEFTOVERS_MAX: usize = 4096;
/// Most member pids read from one `cgroup.procs` (bounded by the run's `pids.max` anyway).
const MEMBERS_READ_BYTES_MAX: u64 = 1024 * 1024;

/// Where runs' cgroups are made, found once per process.
#[derive(Debug, Clone)]
struct Hierarchy {
    /// `…/ring0`, created.
    runs: PathBuf,
    /// Whether `cgroup.kill` ends a cgroup at once (v2, Linux 5.14 or later).
    kill_file: bool,
}

fn hierarchy() -> Result<&'static Hierarchy, String> {
    static HIERARCHY: OnceLock<Result<Hierarchy, String>> = OnceLock::new();
    HIERARCHY
        .get_or_init(find_hierarchy)
        .as_ref()
        .map_err(Clone::clone)
}

/// Checks that confined runs can start here: a ring0 running as root needs a pids cgroup for
/// them (see [`for_run`]).
pub(crate) fn check_confinable() -> Result<(), crate::sandbox::SandboxError> {
    match hierarchy() {
        Err(detail) if rustix::process::geteuid().is_root() => Err(unavailable(detail.clone())),
        _ => Ok(()),
    }
}

fn unavailable(detail: String) -> crate::sandbox::SandboxError {
    crate::sandbox::SandboxError::Unavailable {
        feature: "a pids cgroup (ring0 runs as root, whose processes RLIMIT_NPROC does not bound)",
        detail,
    }
}

fn find_hierarchy() -> Result<Hierarchy, String> {
    let mounts = fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("/proc/self/mountinfo: {e}"))?;
    let own =
        fs::read_to_string("/proc/self/cgroup").map_err(|e| format!("/proc/self/cgroup: {e}"))?;
    if let Some(mount) = mount_point(&mounts, |fstype, options| {
        fstype == "cgroup" && options.split(',').any(|o| o == "pids")
    }) {
        let path = own_path(&own, |controllers| {
            controllers.split(',').any(|c| c == "pids")
        })
        .ok_or("no pids line in /proc/self/cgroup")?;
        let runs = mount.join(path.trim_start_matches('/')).join(RUNS_DIR);
        make_dir(&runs)?;
        return Ok(Hierarchy {
            runs,
            kill_file: false,
        });
    }
    let mount = mount_point(&mounts, |fstype, _| fstype == "cgroup2")
        .ok_or("neither a cgroup v1 pids hierarchy nor a cgroup2 file system is mounted")?;
    let path = own_path(&own, str::is_empty).ok_or("no cgroup2 line in /proc/self/cgroup")?;
    let own_dir = mount.join(path.trim_start_matches('/'));
    if let Err(why) = enable_pids(&own_dir) {
        // A non-root cgroup that holds processes cannot hand controllers to children (cgroup
        // v2's rule of no internal processes): ring0 moves itself into a leaf of its own
        // first, as a service with a delegated subtree (systemd's `Delegate=yes`) must.
        if path == "/" {
            return Err(why);
        }
        let leaf = own_dir.join(SUPERVISOR_DIR);
        make_dir(&leaf)?;
        fs::write(leaf.join("cgroup.procs"), "0")
            .map_err(|e| format!("moving ring0 into {}: {e} (after: {why})", leaf.display()))?;
        enable_pids(&own_dir)?;
    }
    let runs = own_dir.join(RUNS_DIR);
    make_dir(&runs)?;
    enable_pids(&runs)?;
    Ok(Hierarchy {
        kill_file: runs.join("cgroup.kill").exists(),
        runs,
    })
}

/// The mount point of the first mount whose file system type and super options `matches`.
fn mount_point(mountinfo: &str, matches: impl Fn(&str, &str) -> bool) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let point = left.split(' ').nth(4)?;
        let mut right = right.split(' ');
        let fstype = right.next()?;
        let options = right.nth(1).unwrap_or("");
        // A mount point with an escaped space or tab is not one ring0 could have made; skip it.
        (matches(fstype, options) && !point.contains('\\')).then(|| PathBuf::from(point))
    })
}

/// This process's path in the hierarchy whose controller list `matches`.
fn own_path(cgroup: &str, matches: impl Fn(&str) -> bool) -> Option<String> {
    cgroup.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let _id = parts.next()?;
        let controllers = parts.next()?;
        let path = parts.next()?;
        matches(controllers).then(|| path.to_owned())
    })
}

fn make_dir(dir: &Path) -> Result<(), String> {
    match fs::create_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(format!("creating {}: {e}", dir.display())),
    }
}

/// Makes the v2 `pids` controller available to `dir`'s children.
fn enable_pids(dir: &Path) -> Result<(), String> {
    let controllers = fs::read_to_string(dir.join("cgroup.controllers"))
        .map_err(|e| format!("{}: {e}", dir.join("cgroup.controllers").display()))?;
    if !controllers.split_whitespace().any(|c| c == "pids") {
        return Err(format!(
            "the pids controller is not available in {}",
            dir.display()
        ));
    }
    let control = dir.join("cgroup.subtree_control");
    let enabled = fs::read_to_string(&control).unwrap_or_default();
    if enabled.split_whitespace().any(|c| c == "pids") {
        return Ok(());
    }
    // Refused (EBUSY) in a non-root cgroup that holds processes: ring0's own, undelegated.
    fs::write(&control, "+pids")
        .map_err(|e| format!("enabling the pids controller in {}: {e}", control.display()))
}

/// One run's cgroup: removed (after ending whatever is left in it) when dropped.
#[derive(Debug)]
pub(crate) struct RunCgroup {
    dir: PathBuf,
    /// `cgroup.procs`, open for writing: the child writes `0` to it to join. Taken when the
    /// group goes back to the pool.
    procs: Option<OwnedFd>,
    kill_file: bool,
}

impl PartialEq for RunCgroup {
    fn eq(&self, other: &Self) -> bool {
        self.dir == other.dir
    }
}

impl Eq for RunCgroup {}

impl RunCgroup {
    /// A new cgroup for one run, with at most `tasks_max` tasks. `Err` names why none can be
    /// made here.
    pub(crate) fn create(tasks_max: Option<u64>) -> Result<Self, String> {
        let hierarchy = hierarchy()?;
        sweep_once();
        let (dir, procs) = match lock_pool().pop() {
            Some(kept) => kept,
            None => make_run_dir(hierarchy)?,
        };
        // A kept group had another run's limit; "max" leaves only the ancestors' limits.
        let max = tasks_max.map_or_else(|| "max".to_owned(), |n| n.to_string());
        if let Err(e) = fs::write(dir.join("pids.max"), max) {
            let _ = fs::remove_dir(&dir);
            return Err(format!("setting up {}: {e}", dir.display()));
        }
        Ok(Self {
            dir,
            procs: Some(procs),
            kill_file: hierarchy.kill_file,
        })
    }

    /// The descriptor the child joins through (see [`crate::hooks::ChildSetup`]).
    pub(crate) fn procs_fd(&self) -> RawFd {
        self.procs.as_ref().map_or(-1, AsRawFd::as_raw_fd)
    }

    /// Pids of the tasks' processes in the cgroup now.
    pub(crate) fn members(&self) -> Vec<i32> {
        members_of(&self.dir)
    }
}

impl Drop for RunCgroup {
    fn drop(&mut self) {
        // Whatever is left has outlived its run: end it, then keep the empty group for the
        // next run or remove it.
        let emptied = end_members(&self.dir, self.kill_file).1;
        if emptied
            && uncharged(&self.dir)
            && let Some(procs) = self.procs.take()
        {
            let mut pool = lock_pool();
            if pool.len() < POOL_MAX {
                pool.push((std::mem::take(&mut self.dir), procs));
                return;
            }
        }
        remove_dir(&self.dir);
    }
}

/// Empty groups of this process kept for its next runs: making and removing a cgroup costs a
/// quarter of a millisecond, as much as a third of spawning `true`. Each is named for this
/// process, so a sweep after its death removes them with the rest.
type Pool = Vec<(PathBuf, OwnedFd)>;

fn lock_pool() -> std::sync::MutexGuard<'static, Pool> {
    static POOL: Mutex<Pool> = Mutex::new(Vec::new());
    POOL.lock().unwrap_or_else(|p| p.into_inner())
}

fn make_run_dir(hierarchy: &Hierarchy) -> Result<(PathBuf, OwnedFd), String> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = format!(
        "{}.{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let dir = hierarchy.runs.join(name);
    fs::create_dir(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let procs = fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(dir.join("cgroup.procs"));
    match procs {
        Ok(procs) => Ok((dir, procs.into())),
        Err(e) => {
            let _ = fs::remove_dir(&dir);
            Err(format!("setting up {}: {e}", dir.display()))
        }
    }
}

/// Whether no task is charged to the group any more (a dead member stays charged until it is
/// reaped): a kept group must start its next run with its whole limit.
fn uncharged(dir: &Path) -> bool {
    fs::read_to_string(dir.join("pids.current")).is_ok_and(|n| n.trim() == "0")
}

fn members_of(dir: &Path) -> Vec<i32> {
    let mut text = String::new();
    let read = fs::File::open(dir.join("cgroup.procs"))
        .and_then(|f| f.take(MEMBERS_READ_BYTES_MAX).read_to_string(&mut text));
    if read.is_err() {
        return Vec::new();
    }
    text.lines().filter_map(|l| l.trim().parse().ok()).collect()
}

/// SIGKILLs every member until the cgroup is empty (bounded by [`KILL_WAIT`]). Returns how
/// many processes were signalled and whether it emptied.
fn end_members(dir: &Path, kill_file: bool) -> (usize, bool) {
    let deadline = Instant::now() + KILL_WAIT;
    let mut signalled = 0;
    let mut members = members_of(dir);
    if kill_file && !members.is_empty() {
        let _ = fs::write(dir.join("cgroup.kill"), "1");
    }
    while !members.is_empty() {
        for &pid in &members {
            if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                signalled += 1;
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
        crate::reaper::sweep_adopted_zombies();
        if Instant::now() >= deadline {
            return (signalled, false);
        }
        std::thread::sleep(POLL);
        members = members_of(dir);
    }
    // A dead member stays charged until it is reaped; ring0 reaps its adopted orphans.
    crate::reaper::sweep_adopted_zombies();
    (signalled, true)
}

/// Removes an emptied group, waiting (bounded) for its last members to be released.
fn remove_dir(dir: &Path) -> bool {
    let deadline = Instant::now() + KILL_WAIT;
    loop {
        match fs::remove_dir(dir) {
            Ok(()) => return true,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return true,
            Err(_) if Instant::now() < deadline => {
                crate::reaper::sweep_adopted_zombies();
                std::thread::sleep(POLL);
            }
            Err(_) => return false,
        }
    }
}

/// The cgroup of a run about to start, with at most `tasks_max` tasks. A confined run of a
/// ring0 running as root is refused when it cannot have one: nothing else bounds root's
/// processes (the kernel exempts root from `RLIMIT_NPROC`). Elsewhere a run without a cgroup
/// keeps the older bounds (`RLIMIT_NPROC`, teardown by group, ancestry and token).
pub(crate) fn for_run(
    tasks_max: Option<u64>,
    confined: bool,
) -> Result<Option<RunCgroup>, crate::sandbox::SandboxError> {
    match RunCgroup::create(tasks_max) {
        Ok(cgroup) => Ok(Some(cgroup)),
        Err(detail) if confined && rustix::process::geteuid().is_root() => Err(unavailable(detail)),
        Err(_) => Ok(None),
    }
}

/// What [`settle_leftover_runs`] found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeftoverReport {
    /// Cgroups of runs whose ring0 is gone.
    pub runs: usize,
    /// Processes still in them, killed.
    pub processes_killed: usize,
}

/// Ends the runs of every ring0 that died without ending them (SIGKILLed, or the machine's
/// power cut while a job ran): whatever is left in their cgroups is killed and the cgroups are
/// removed. A run's owner is the pid its name starts with; a cgroup whose owner still lives is
/// never touched. Does nothing where runs get no cgroup.
pub fn settle_leftover_runs() -> LeftoverReport {
    let Ok(hierarchy) = hierarchy() else {
        return LeftoverReport::default();
    };
    let mut report = LeftoverReport::default();
    let Ok(entries) = fs::read_dir(&hierarchy.runs) else {
        return report;
    };
    for entry in entries.flatten().take(LEFTOVERS_MAX) {
        let name = entry.file_name();
        let Some(owner) = name
            .to_str()
            .and_then(|n| n.split_once('.'))
            .and_then(|(pid, _)| pid.parse::<i32>().ok())
        else {
            continue;
        };
        if owner_lives(owner) {
            continue;
        }
        let (killed, _) = end_members(&entry.path(), hierarchy.kill_file);
        remove_dir(&entry.path());
        report.runs += 1;
        report.processes_killed += killed;
    }
    report
}

/// Sweeps leftovers once per process, before its first run of its own.
pub(crate) fn sweep_once() {
    static SWEPT: OnceLock<LeftoverReport> = OnceLock::new();
    SWEPT.get_or_init(settle_leftover_runs);
}

fn owner_lives(pid: i32) -> bool {
    pid == std::process::id() as i32
        || rustix::process::Pid::from_raw(pid)
            .is_some_and(|p| rustix::process::test_kill_process(p).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
25 30 0:22 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
33 25 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
40 25 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
42 25 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn the_v1_pids_hierarchy_is_found_by_its_super_options() {
        let found = mount_point(MOUNTINFO, |t, o| {
            t == "cgroup" && o.split(',').any(|c| c == "pids")
        });
        assert_eq!(found, Some(PathBuf::from("/sys/fs/cgroup/pids")));
        let unified = mount_point(MOUNTINFO, |t, _| t == "cgroup2");
        assert_eq!(unified, Some(PathBuf::from("/sys/fs/cgroup/unified")));
    }

    #[test]
    fn the_own_path_is_read_per_hierarchy() {
        let cgroup = "9:name=systemd:/\n8:pids:/a/b\n4:memory:/m\n0::/svc\n";
        assert_eq!(
            own_path(cgroup, |c| c.split(',').any(|c| c == "pids")),
            Some("/a/b".to_owned())
        );
        assert_eq!(own_path(cgroup, str::is_empty), Some("/svc".to_owned()));
    }
}
