//! Helpers shared by the integration tests.
#![allow(dead_code)]

mod procs;
#[allow(unused_imports)]
pub use procs::*;

use ring0_exec::ExecPolicy;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A private workspace directory, removed on drop.
pub struct Workspace {
    dir: PathBuf,
}

impl Workspace {
    pub fn new() -> Self {
        let dir =
            std::env::temp_dir().join(format!("ring0-exec-test-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        Self { dir }
    }

    pub fn root(&self) -> &Path {
        &self.dir
    }

    pub fn policy(&self) -> ExecPolicy {
        ExecPolicy::new(&self.dir)
    }

    /// A policy without the OS sandbox: for the supervision tests that follow processes by the
    /// pids they print, which inside the sandbox's PID namespace are not the host's.
    pub fn unconfined_policy(&self) -> ExecPolicy {
        ExecPolicy::new(&self.dir).sandbox(ring0_exec::Sandbox::off())
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A cancellation that never comes.
pub fn never() -> std::future::Pending<()> {
    std::future::pending()
}

pub fn read_pids(path: &Path) -> Vec<i32> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

pub fn read_pid(path: &Path) -> i32 {
    let pids = read_pids(path);
    assert_eq!(pids.len(), 1, "one pid in {}", path.display());
    pids[0]
}

/// Waits (generously) until `path` holds at least `n` lines.
pub async fn wait_for_lines(path: &Path, n: usize) {
    for _ in 0..600 {
        if read_pids(path).len() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{} never got {n} lines", path.display());
}

/// Whether `pid` is a live process (a zombie is dead).
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat[stat.rfind(')').unwrap() + 2..].chars().next().unwrap();
            state != 'Z' && state != 'X'
        }
        Err(_) => false,
    }
}

/// Asserts that none of `pids` exists any more, neither alive nor as a zombie, allowing the
/// reaper a generous moment to run.
pub async fn assert_no_survivors(pids: &[i32]) {
    for _ in 0..200 {
        if pids
            .iter()
            .all(|p| !Path::new(&format!("/proc/{p}")).exists())
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let left: Vec<_> = pids
        .iter()
        .filter(|p| Path::new(&format!("/proc/{p}")).exists())
        .map(|p| (p, alive(*p)))
        .collect();
    panic!("processes still present (pid, alive): {left:?}");
}

/// How long a test waits for marked processes to appear, or to disappear, in /proc.
pub const PROC_WAIT: Duration = Duration::from_secs(20);

/// A `sleep` duration unique to one test (`base` keeps test files apart), used as the marker
/// of the processes it starts: an emptied environment cannot hide a command line.
pub fn marker(base: u32) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{}{:09}", base + std::process::id() % 1000, nanos)
}

/// Waits, up to [`PROC_WAIT`], until the number of live processes marked by `mark` satisfies
/// `want`; fails naming `what` otherwise.
pub async fn wait_for_count(mark: &str, want: impl Fn(usize) -> bool, what: &str) {
    let deadline = std::time::Instant::now() + PROC_WAIT;
    loop {
        let n = marked_by_argument(mark);
        if want(n) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: {n} processes"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
