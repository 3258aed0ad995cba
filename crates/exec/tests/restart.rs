//! A ring0 that dies with jobs running: the next one kills what they left and reports them.
//!
//! The dying ring0 is this test binary run again as a helper process (the ignored test below,
//! selected by name and enabled by an environment variable), killed with SIGKILL.

mod common;

use common::*;
use ring0_exec::{CommandSpec, JobEvent, JobManager, JobState, JobsConfig, SessionId};
use std::path::Path;
use std::time::Duration;

const HELPER_ENV: &str = "RING0_EXEC_RESTART_HELPER_DIR";

fn config(dir: &Path) -> JobsConfig {
    JobsConfig::new(
        dir.join("state"),
        // Pids the job prints are checked on the host: no PID namespace here.
        ring0_exec::ExecPolicy::new(dir)
            .sandbox(ring0_exec::Sandbox::off())
            .allow_shell(true)
            .termination_grace(Duration::from_millis(500)),
    )
}

#[tokio::test]
#[ignore = "helper process of a_job_running_when_ring0_dies_is_reported_killed_after_restart"]
async fn restart_helper_starts_a_job_and_waits_to_be_killed() {
    let Some(dir) = std::env::var_os(HELPER_ENV) else {
        return;
    };
    let dir = Path::new(&dir);
    let (jobs, _) = JobManager::open(config(dir)).await.unwrap();
    let session = SessionId::new("restart").unwrap();
    let _events = jobs.open_session(&session).unwrap();
    let pids = dir.join("pids");
    let script = format!(
        "echo output-before-restart; setsid sh -c 'sleep 1000 & echo $! >> {p}'; \
         echo $$ >> {p}; sleep 1000",
        p = pids.display()
    );
    let receipt = jobs
        .start(&session, &CommandSpec::shell(script))
        .await
        .unwrap();
    std::fs::write(dir.join("handle"), receipt.job.to_string()).unwrap();
    tokio::time::sleep(Duration::from_secs(600)).await;
}

#[tokio::test]
async fn a_job_running_when_ring0_dies_is_reported_killed_after_restart() {
    let ws = Workspace::new();
    let mut helper = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "restart_helper_starts_a_job_and_waits_to_be_killed",
            "--ignored",
            "--test-threads=1",
        ])
        .env(HELPER_ENV, ws.root())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pids = ws.root().join("pids");
    wait_for_lines(&pids, 2).await;
    let handle_file = ws.root().join("handle");
    for _ in 0..600 {
        if handle_file.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let handle = std::fs::read_to_string(&handle_file).unwrap();
    let daemon = read_pids(&pids)[0];

    helper.kill().unwrap();
    helper.wait().unwrap();
    // The daemon left the job's session before ring0 died. Any ring0 that starts a run now
    // ends it with the dead ring0's other leftovers; the one opened here settles the record.

    let (jobs, recovery) = JobManager::open(config(ws.root())).await.unwrap();
    assert_eq!(recovery.killed.len(), 1);
    assert_eq!(recovery.killed[0].job.to_string(), handle);
    assert_eq!(recovery.killed[0].state, JobState::Killed);
    assert_no_survivors(&[daemon]).await;

    let session = SessionId::new("restart").unwrap();
    let mut events = jobs.open_session(&session).unwrap();
    let event = tokio::time::timeout(Duration::from_secs(30), events.recv())
        .await
        .unwrap()
        .unwrap();
    let JobEvent::Finished { status } = event else {
        panic!("expected the restart's completion event");
    };
    assert_eq!(status.state, JobState::Killed);
    assert!(status.note.unwrap().contains("restarted"));

    let snapshot = jobs.inspect(&session, &handle, 10).unwrap();
    assert_eq!(snapshot.status.state, JobState::Killed);
    let log = std::fs::read_to_string(&snapshot.status.log).unwrap();
    assert!(log.starts_with("output-before-restart\n"), "{log}");
    assert!(log.contains("supervisor restarted"));
    // Another session cannot see it.
    let other = SessionId::new("other").unwrap();
    assert!(jobs.inspect(&other, &handle, 10).is_err());
}

#[tokio::test]
async fn a_state_directory_in_use_is_refused() {
    let ws = Workspace::new();
    let (_jobs, _) = JobManager::open(config(ws.root())).await.unwrap();
    let second = JobManager::open(config(ws.root())).await;
    let Err(err) = second else {
        panic!("a second manager must not share the state directory");
    };
    assert!(err.to_string().contains("another ring0 process"), "{err}");
}

#[tokio::test]
async fn finished_jobs_are_listed_again_after_a_clean_restart() {
    let ws = Workspace::new();
    let session = SessionId::new("s").unwrap();
    let handle = {
        let (jobs, _) = JobManager::open(config(ws.root())).await.unwrap();
        let _events = jobs.open_session(&session).unwrap();
        let job = jobs
            .start(&session, &CommandSpec::argv(["echo", "kept"]))
            .await
            .unwrap()
            .job
            .to_string();
        let status = jobs
            .wait(&session, &job, Duration::from_secs(30))
            .await
            .unwrap();
        assert_eq!(status.state, JobState::Completed);
        jobs.shutdown().await;
        job
    };
    // The first manager's lock goes with its last handle; its supervision tasks have ended.
    let mut reopened = None;
    for _ in 0..100 {
        if let Ok(opened) = JobManager::open(config(ws.root())).await {
            reopened = Some(opened);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (jobs, recovery) = reopened.expect("the state directory is released");
    assert!(recovery.killed.is_empty());
    let listed = jobs.list(&session);
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].job.to_string(), handle);
    assert_eq!(listed[0].state, JobState::Completed);
}

#[tokio::test]
async fn an_edited_job_record_never_makes_recovery_signal_an_unrelated_process() {
    use std::os::unix::process::CommandExt;
    let ws = Workspace::new();
    let session = SessionId::new("s").unwrap();
    let handle = {
        let (jobs, _) = JobManager::open(config(ws.root())).await.unwrap();
        let _events = jobs.open_session(&session).unwrap();
        let job = jobs
            .start(&session, &CommandSpec::argv(["true"]))
            .await
            .unwrap()
            .job
            .to_string();
        jobs.wait(&session, &job, Duration::from_secs(30))
            .await
            .unwrap();
        jobs.shutdown().await;
        job
    };
    // A process ring0 never started, leading its own process group and session.
    let mut bystander = std::process::Command::new("sleep")
        .arg("1000")
        .process_group(0)
        .spawn()
        .unwrap();
    let victim = bystander.id() as i32;
    // The record is edited to say the job is still running as that process.
    let path = ws.root().join(format!("state/jobs/{handle}.json"));
    let mut record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    record["state"] = "RUNNING".into();
    record["root_pid"] = victim.into();
    record["root_start_ticks"] = 0.into();
    std::fs::write(&path, serde_json::to_vec(&record).unwrap()).unwrap();

    let mut reopened = None;
    for _ in 0..100 {
        if let Ok(opened) = JobManager::open(config(ws.root())).await {
            reopened = Some(opened);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_jobs, recovery) = reopened.expect("the state directory is released");
    assert_eq!(recovery.killed.len(), 1, "the record is settled as killed");
    assert!(
        bystander.try_wait().unwrap().is_none(),
        "the unrelated process was signalled"
    );
    assert!(alive(victim));
    let _ = bystander.kill();
    let _ = bystander.wait();
}
