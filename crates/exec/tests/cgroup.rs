//! Every run in a pids cgroup of its own: a bound on its processes that holds when ring0 runs
//! as root (where `RLIMIT_NPROC` does not apply), and a membership no process can leave, kept by
//! the kernel after ring0 dies, so the next ring0 ends what a killed one left.
//!
//! The dying ring0 is this test binary run again as a helper process (the ignored test below,
//! selected by name and enabled by an environment variable), killed with SIGKILL.

mod common;

use common::{Workspace, hiding_tree, hiding_tree_then, marker, never, wait_for_count};
use ring0_exec::{
    CommandSpec, ResourceLimits, Sandbox, SandboxProfile, run_command, settle_leftover_runs,
};
use std::time::Duration;

/// Processes the hiding tree leaves, each a `sleep` carrying the marker.
const TREE_SIZE: usize = 5;
/// The process limit the bounded runs get.
const TASKS_MAX: u64 = 32;
const HELPER_ENV: &str = "RING0_EXEC_CGROUP_HELPER_MARK";
/// The errno of a refused fork (EAGAIN on Linux), as the fork script prints it.
const EAGAIN: &str = "11";

/// Forks sleeping children until the kernel refuses, then prints how many it made and why.
const FORK_UNTIL_REFUSED: &str = "\
import os, sys, time
made = 0
while made < 1000:
    try:
        pid = os.fork()
    except OSError as e:
        print(f'forked {made} then errno {e.errno}')
        sys.exit(0)
    if pid == 0:
        time.sleep(120)
        os._exit(0)
    made += 1
print(f'forked {made} then errno none')
";

/// (children made, errno of the refusal) from the fork script's line.
fn forks(text: &str) -> (u64, String) {
    let line = text
        .lines()
        .find(|l| l.starts_with("forked "))
        .unwrap_or_else(|| panic!("no report in {text:?}"));
    let words: Vec<&str> = line.split(' ').collect();
    (words[1].parse().unwrap(), words[4].to_owned())
}

fn bounded() -> ResourceLimits {
    ResourceLimits {
        processes: Some(TASKS_MAX),
        ..ResourceLimits::default()
    }
}

/// Runs the fork script under `policy`: (children made, errno of the refusal).
async fn fork_until_refused(ws: &Workspace, policy: &ring0_exec::ExecPolicy) -> (u64, String) {
    std::fs::write(ws.root().join("fork.py"), FORK_UNTIL_REFUSED).unwrap();
    let spec = CommandSpec::argv(["python3", "fork.py"]).timeout(Duration::from_secs(60));
    let report = run_command(policy, &spec, never()).await.unwrap();
    forks(&report.observation.text)
}

#[tokio::test]
async fn a_fork_bomb_in_the_sandbox_stops_at_the_profiles_process_limit() {
    let ws = Workspace::new();
    let profile = SandboxProfile {
        processes_max: Some(TASKS_MAX),
        ..SandboxProfile::workspace()
    };
    let policy = ws
        .policy()
        .sandbox(Sandbox::new(profile, ws.root(), Vec::new()));
    let (made, errno) = fork_until_refused(&ws, &policy).await;
    assert_eq!(errno, EAGAIN);
    assert!(
        made < TASKS_MAX,
        "{made} children under a limit of {TASKS_MAX}"
    );
}

#[tokio::test]
async fn an_unconfined_fork_bomb_stops_at_the_run_limit_whoever_runs_ring0() {
    let ws = Workspace::new();
    let policy = ws.unconfined_policy().resource_limits(bounded());
    let (made, errno) = fork_until_refused(&ws, &policy).await;
    assert_eq!(errno, EAGAIN);
    assert!(
        made < TASKS_MAX,
        "{made} children under a limit of {TASKS_MAX}"
    );
}

#[tokio::test]
async fn an_unconfined_runs_hidden_processes_end_with_it_even_with_an_empty_environment() {
    let ws = Workspace::new();
    let mark = marker(6000);
    let policy = ws.unconfined_policy().allow_shell(true);
    let script = hiding_tree_then(&mark, "sleep 1");
    let report = run_command(&policy, &CommandSpec::shell(script), never())
        .await
        .unwrap();
    assert_eq!(report.summary.exit.and_then(|e| e.code), Some(0));
    wait_for_count(&mark, |n| n == 0, "processes survive their run").await;
}

#[tokio::test]
#[ignore = "helper process of the_runs_a_killed_ring0_left_are_ended_by_the_next_one"]
async fn cgroup_helper_runs_a_hiding_tree_and_waits_to_be_killed() {
    let Some(mark) = std::env::var_os(HELPER_ENV) else {
        return;
    };
    let ws = Workspace::new();
    let policy = ws.unconfined_policy().allow_shell(true);
    let spec =
        CommandSpec::shell(hiding_tree(&mark.to_string_lossy())).timeout(Duration::from_secs(600));
    let _ = run_command(&policy, &spec, never()).await;
}

#[tokio::test]
async fn the_runs_a_killed_ring0_left_are_ended_by_the_next_one() {
    let mark = marker(6000);
    let mut helper = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "cgroup_helper_runs_a_hiding_tree_and_waits_to_be_killed",
            "--ignored",
            "--test-threads=1",
        ])
        .env(HELPER_ENV, &mark)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_for_count(&mark, |n| n > TREE_SIZE, "the tree never appeared").await;
    helper.kill().unwrap();
    helper.wait().unwrap();
    // The unconfined tree had no PID namespace to die with: what hid from the dead ring0's
    // session and group lives on until a ring0 ends it (any ring0 starting now may).
    settle_leftover_runs();
    wait_for_count(&mark, |n| n == 0, "processes of the killed ring0 survive").await;
}
