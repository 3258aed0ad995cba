//! Processes of a test run found in /proc, and the tree of hidden processes the no-survivor
//! tests start. Shared by `ring0-exec`'s sandbox tests and the `ring0` CLI's (which include
//! this file by path), so both crates test the same escapes.

use std::path::Path;

/// Pids of live processes (a zombie is not live) for whose `/proc/PID` directory `matches`
/// holds.
pub fn live_processes(matches: impl Fn(&Path) -> bool) -> Vec<i32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let live = std::fs::read_to_string(entry.path().join("stat")).is_ok_and(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        });
        if live && matches(&entry.path()) {
            pids.push(pid);
        }
    }
    pids
}

/// Live processes whose command line has `mark` as an argument.
pub fn marked_by_argument(mark: &str) -> usize {
    live_processes(|proc| {
        let cmdline = std::fs::read(proc.join("cmdline")).unwrap_or_default();
        cmdline.split(|b| *b == 0).any(|arg| arg == mark.as_bytes())
    })
    .len()
}

/// A script that leaves the five kinds of hidden process behind (plain child, setsid, double
/// fork + setsid, the same with an empty environment, double fork + setpgid), each ignoring
/// SIGTERM and SIGHUP and marked by the `sleep` duration `mark`, and then waits.
pub fn hiding_tree(mark: &str) -> String {
    hiding_tree_then(mark, &format!("trap '' TERM HUP; sleep {mark}"))
}

/// The five hidden processes, then `tail`.
pub fn hiding_tree_then(mark: &str, tail: &str) -> String {
    let ignore = "trap '' TERM HUP";
    format!(
        "sh -c \"{ignore}; sleep {mark}\" & \
         setsid sh -c \"{ignore}; sleep {mark}\" & \
         sh -c \"(setsid sh -c \\\"{ignore}; sleep {mark}\\\" &)\" & \
         sh -c \"(setsid env -i /bin/sh -c \\\"{ignore}; sleep {mark}\\\" &)\" & \
         sh -c \"(python3 -c 'import os,signal; os.setpgid(0,0); signal.signal(signal.SIGTERM, signal.SIG_IGN); signal.signal(signal.SIGHUP, signal.SIG_IGN); os.execvp(\\\"sleep\\\", [\\\"sleep\\\", \\\"{mark}\\\"])' &)\" & \
         {tail}"
    )
}
