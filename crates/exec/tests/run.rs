//! One-shot supervised runs, as a tool call or `ring0 run` sees them.

mod common;

use common::*;
use ring0_exec::{CommandSpec, Ending, ExecError, ResourceLimits, run_command};
use std::time::Duration;

#[tokio::test]
async fn stdout_and_stderr_are_captured_apart_with_the_exit_code() {
    let ws = Workspace::new();
    let report = run_command(
        &ws.policy(),
        &CommandSpec::argv(["sh", "-c", "echo out; echo err >&2; exit 3"]),
        never(),
    )
    .await
    .unwrap();
    assert_eq!(report.summary.ending, Ending::Exited);
    assert_eq!(report.summary.exit.unwrap().code, Some(3));
    assert_eq!(report.observation.exit_code, Some(3));
    assert!(
        !report.observation.is_error,
        "a non-zero exit is reported, not judged"
    );
    let text = &report.observation.text;
    assert!(text.contains("[stdout]\nout\n"), "{text}");
    assert!(text.contains("[stderr]\nerr\n"), "{text}");
}

#[tokio::test]
async fn exit_code_zero_is_reported_as_the_number_zero() {
    let ws = Workspace::new();
    let report = run_command(&ws.policy(), &CommandSpec::argv(["true"]), never())
        .await
        .unwrap();
    assert_eq!(report.observation.exit_code, Some(0));
    assert!(report.observation.text.contains("exit code 0"));
}

#[tokio::test]
async fn arguments_reach_the_program_without_a_shell_reading_them() {
    let ws = Workspace::new();
    let report = run_command(
        &ws.policy(),
        &CommandSpec::argv(["echo", "$HOME; rm -rf x", "`id`"]),
        never(),
    )
    .await
    .unwrap();
    assert!(report.observation.text.contains("$HOME; rm -rf x `id`"));
}

#[tokio::test]
async fn a_shell_string_is_refused_unless_the_policy_allows_it() {
    let ws = Workspace::new();
    let refused = run_command(&ws.policy(), &CommandSpec::shell("echo hi"), never()).await;
    assert!(matches!(refused, Err(ExecError::ShellNotAllowed)));
    let allowed = run_command(
        &ws.policy().allow_shell(true),
        &CommandSpec::shell("echo hi | tr a-z A-Z"),
        never(),
    )
    .await
    .unwrap();
    assert!(allowed.observation.text.contains("HI"));
}

#[tokio::test]
async fn a_missing_program_is_an_error_before_anything_runs() {
    let ws = Workspace::new();
    let err = run_command(
        &ws.policy(),
        &CommandSpec::argv(["definitely-not-a-program-ring0"]),
        never(),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, ExecError::Spawn { .. }), "{err}");
    assert!(err.to_string().contains("definitely-not-a-program-ring0"));
}

#[tokio::test]
async fn the_environment_holds_only_allow_listed_and_explicit_variables() {
    let ws = Workspace::new();
    // cargo sets CARGO_MANIFEST_DIR for the test process; it must not leak through.
    assert!(std::env::var_os("CARGO_MANIFEST_DIR").is_some());
    let report = run_command(
        &ws.policy(),
        &CommandSpec::argv(["env"]).env("RING0_TEST_EXPLICIT", "yes"),
        never(),
    )
    .await
    .unwrap();
    let text = &report.observation.text;
    assert!(text.contains("PATH="), "{text}");
    assert!(text.contains("RING0_TEST_EXPLICIT=yes"), "{text}");
    assert!(!text.contains("CARGO_MANIFEST_DIR"), "{text}");
}

#[tokio::test]
async fn the_supervision_token_cannot_be_set_by_the_caller() {
    let ws = Workspace::new();
    let err = run_command(
        &ws.policy(),
        &CommandSpec::argv(["true"]).env(ring0_exec::SUPERVISION_TOKEN_ENV, "forged"),
        never(),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, ExecError::EnvNameReserved { .. }));
}

#[tokio::test]
async fn the_working_directory_must_stay_inside_the_workspace() {
    let ws = Workspace::new();
    std::fs::create_dir(ws.root().join("sub")).unwrap();
    std::os::unix::fs::symlink("/", ws.root().join("escape")).unwrap();
    let inside = run_command(
        &ws.policy(),
        &CommandSpec::argv(["pwd"]).cwd("sub"),
        never(),
    )
    .await
    .unwrap();
    assert!(inside.observation.text.contains("/sub\n"));
    for outside in ["..", "escape", "/tmp"] {
        let err = run_command(
            &ws.policy(),
            &CommandSpec::argv(["pwd"]).cwd(outside),
            never(),
        )
        .await
        .unwrap_err();
        assert!(
            matches!(err, ExecError::CwdOutsideWorkspace { .. }),
            "{outside}: {err}"
        );
    }
}

#[tokio::test]
async fn stdin_is_empty_so_a_reader_sees_end_of_file() {
    let ws = Workspace::new();
    let report = run_command(
        &ws.policy(),
        &CommandSpec::argv(["cat"]).timeout(Duration::from_secs(30)),
        never(),
    )
    .await
    .unwrap();
    assert_eq!(report.summary.ending, Ending::Exited);
    assert_eq!(report.summary.stdout_bytes, 0);
}

#[tokio::test]
async fn the_process_leads_its_own_session_and_group() {
    let ws = Workspace::new();
    let report = run_command(
        &ws.policy(),
        &CommandSpec::argv(["cat", "/proc/self/stat"]),
        never(),
    )
    .await
    .unwrap();
    let stat = report.observation.stdout.unwrap().text;
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after.split(' ').collect();
    let pid = stat.split(' ').next().unwrap();
    assert_eq!(fields[2], pid, "process group");
    assert_eq!(fields[3], pid, "session");
}

#[tokio::test]
async fn resource_limits_apply_to_the_process() {
    let ws = Workspace::new();
    let limits = ResourceLimits {
        cpu_seconds: Some(77),
        open_files: Some(99),
        processes: Some(4000),
        address_space_bytes: Some(8 << 30),
        core_file_bytes: Some(0),
    };
    let report = run_command(
        &ws.policy().resource_limits(limits),
        &CommandSpec::argv(["cat", "/proc/self/limits"]),
        never(),
    )
    .await
    .unwrap();
    let text = &report.observation.text;
    let row = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{name} in {text}"))
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert!(row("Max cpu time").contains("77 78 seconds"));
    assert!(row("Max open files").contains("99 99 files"));
    assert!(row("Max processes").contains("4000 4000 processes"));
    assert!(row("Max address space").contains(&format!("{} {} bytes", 8u64 << 30, 8u64 << 30)));
    assert!(row("Max core file size").contains("0 0 bytes"));
}

#[tokio::test]
async fn a_timed_out_command_returns_its_partial_output() {
    let ws = Workspace::new();
    let report = run_command(
        &ws.policy().allow_shell(true),
        &CommandSpec::shell("echo before-timeout; sleep 1000").timeout(Duration::from_millis(500)),
        never(),
    )
    .await
    .unwrap();
    assert_eq!(report.summary.ending, Ending::TimedOut);
    assert!(report.observation.is_error);
    assert!(
        report.observation.text.contains("before-timeout"),
        "{}",
        report.observation.text
    );
    assert!(report.observation.text.contains("Timed out after 500 ms"));
}

#[tokio::test]
async fn a_process_that_ignores_sigterm_is_killed_after_the_grace_period() {
    let ws = Workspace::new();
    let pidfile = ws.root().join("pid");
    let script = format!(
        "trap '' TERM; echo $$ > {}; echo ready; while :; do sleep 0.1; done",
        pidfile.display()
    );
    let report = run_command(
        &ws.unconfined_policy()
            .allow_shell(true)
            .termination_grace(Duration::from_millis(300)),
        &CommandSpec::shell(script).timeout(Duration::from_millis(700)),
        never(),
    )
    .await
    .unwrap();
    assert_eq!(report.summary.ending, Ending::TimedOut);
    let teardown = report.summary.teardown.expect("teardown report");
    assert!(teardown.killed_after_grace >= 1, "{teardown:?}");
    assert_eq!(teardown.survivors, 0);
    assert_eq!(report.summary.exit.unwrap().signal, Some(9));
    assert_no_survivors(&[read_pid(&pidfile)]).await;
}

#[tokio::test]
async fn yes_hits_the_output_ceiling_with_bounded_memory() {
    let ws = Workspace::new();
    let ceiling = 4 * 1024 * 1024;
    let budget = 8 * 1024;
    let report = run_command(
        &ws.policy()
            .output_ceiling_bytes(ceiling)
            .observation_budget_bytes(budget),
        &CommandSpec::argv(["yes"]).timeout(Duration::from_secs(60)),
        never(),
    )
    .await
    .unwrap();
    assert_eq!(report.summary.ending, Ending::OutputCeiling);
    assert_eq!(
        report.summary.stdout_bytes, ceiling,
        "exactly the ceiling is kept"
    );
    assert!(report.observation.is_error);
    assert!(report.observation.truncated);
    assert!(
        report.observation.text.len() <= budget,
        "{}",
        report.observation.text.len()
    );
    assert!(
        report
            .observation
            .text
            .contains("Output ceiling of 4194304 bytes reached")
    );
}

#[tokio::test]
async fn eighty_megabytes_of_output_drain_without_stalling() {
    let ws = Workspace::new();
    let bytes: u64 = 80 * 1000 * 1000;
    let report = run_command(
        &ws.policy(),
        &CommandSpec::argv(["head", "-c", &bytes.to_string(), "/dev/zero"])
            .timeout(Duration::from_secs(120)),
        never(),
    )
    .await
    .unwrap();
    assert_eq!(report.summary.ending, Ending::Exited);
    assert_eq!(report.summary.stdout_bytes, bytes);
    let stdout = report.observation.stdout.unwrap();
    assert_eq!(stdout.raw_bytes, bytes);
    assert!(report.observation.text.len() <= ring0_exec::ShapeConfig::default().budget_bytes);
}

#[tokio::test]
async fn cancel_leaves_no_process_of_the_tree_alive() {
    let ws = Workspace::new();
    let pids = ws.root().join("pids");
    let script = format!(
        "sleep 1000 & echo $! >> {p}; sleep 1000 & echo $! >> {p}; echo $$ >> {p}; wait",
        p = pids.display()
    );
    let (cancel_tx, cancel_rx) = tokio::sync::oneshot::channel::<()>();
    let pids_for_cancel = pids.clone();
    tokio::spawn(async move {
        wait_for_lines(&pids_for_cancel, 3).await;
        let _ = cancel_tx.send(());
    });
    let report = run_command(
        &ws.unconfined_policy().allow_shell(true),
        &CommandSpec::shell(script),
        async move {
            let _ = cancel_rx.await;
        },
    )
    .await
    .unwrap();
    assert_eq!(report.summary.ending, Ending::Cancelled);
    let all = read_pids(&pids);
    assert_eq!(all.len(), 3);
    assert_no_survivors(&all).await;
}

#[tokio::test]
async fn a_double_forked_setsid_daemon_does_not_outlive_the_run() {
    let ws = Workspace::new();
    let pidfile = ws.root().join("daemon");
    // The middle shell starts a new session, forks the daemon and exits at once, so the daemon
    // is re-parented, outside the group and the session of the run.
    let script = format!(
        "setsid sh -c 'sleep 1000 & echo $! > {}' ; echo launched",
        pidfile.display()
    );
    let report = run_command(
        &ws.unconfined_policy().allow_shell(true),
        &CommandSpec::shell(script),
        never(),
    )
    .await
    .unwrap();
    assert_eq!(report.summary.ending, Ending::Exited);
    let daemon = read_pid(&pidfile);
    let teardown = report.summary.teardown.expect("leftovers were torn down");
    assert!(teardown.processes_signalled >= 1, "{teardown:?}");
    assert_no_survivors(&[daemon]).await;
}

#[tokio::test]
async fn a_background_child_left_by_a_finished_command_is_killed() {
    let ws = Workspace::new();
    let pidfile = ws.root().join("bg");
    let script = format!("sleep 1000 & echo $! > {}; echo done", pidfile.display());
    let report = run_command(
        &ws.unconfined_policy().allow_shell(true),
        &CommandSpec::shell(script),
        never(),
    )
    .await
    .unwrap();
    assert_eq!(report.summary.ending, Ending::Exited);
    assert_eq!(report.summary.exit.unwrap().code, Some(0));
    assert!(report.observation.text.contains("done"));
    assert_no_survivors(&[read_pid(&pidfile)]).await;
}

#[tokio::test]
async fn an_empty_argv_is_refused() {
    let ws = Workspace::new();
    let err = run_command(
        &ws.policy(),
        &CommandSpec::argv(Vec::<String>::new()),
        never(),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, ExecError::EmptyArgv));
}

#[tokio::test]
async fn interactive_stdin_is_refused_for_a_one_shot_run() {
    let ws = Workspace::new();
    let err = run_command(
        &ws.policy(),
        &CommandSpec::argv(["cat"]).stdin(ring0_exec::StdinMode::Pipe),
        never(),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, ExecError::InteractiveNeedsJob));
}
