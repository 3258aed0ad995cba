//! Background jobs, as a session of the kernel sees them.

mod common;

use common::*;
use ring0_exec::{
    CommandSpec, JobError, JobEvent, JobEvents, JobManager, JobState, JobsConfig, SessionId,
    StdinMode,
};
use std::collections::HashMap;
use std::time::Duration;

const EVENT_WAIT: Duration = Duration::from_secs(30);

struct Harness {
    ws: Workspace,
    jobs: JobManager,
}

impl Harness {
    async fn new() -> Self {
        Self::with(|_| {}).await
    }

    async fn with(configure: impl FnOnce(&mut JobsConfig)) -> Self {
        let ws = Workspace::new();
        let mut config = JobsConfig::new(
            ws.root().join(".state"),
            ws.unconfined_policy().allow_shell(true),
        );
        configure(&mut config);
        let (jobs, _) = JobManager::open(config).await.unwrap();
        Self { ws, jobs }
    }

    fn session(&self, name: &str) -> (SessionId, JobEvents) {
        let id = SessionId::new(name).unwrap();
        let events = self.jobs.open_session(&id).unwrap();
        (id, events)
    }
}

async fn next_event(events: &mut JobEvents) -> JobEvent {
    tokio::time::timeout(EVENT_WAIT, events.recv())
        .await
        .expect("an event in time")
        .expect("the stream is open")
}

#[tokio::test]
async fn start_returns_a_receipt_at_once_and_completion_arrives_as_an_event() {
    let h = Harness::new().await;
    let (s, mut events) = h.session("s");
    let receipt = h
        .jobs
        .start(&s, &CommandSpec::shell("sleep 0.2; echo finished"))
        .await
        .unwrap();
    assert_eq!(receipt.state, JobState::Spawned);
    assert!(receipt.job.to_string().starts_with("job_"));
    assert!(receipt.log.exists());
    let JobEvent::Finished { status } = next_event(&mut events).await else {
        panic!("expected a completion event");
    };
    assert_eq!(status.job, receipt.job);
    assert_eq!(status.state, JobState::Completed);
    assert_eq!(status.summary.as_ref().unwrap().exit.unwrap().code, Some(0));
    assert!(
        status
            .observation
            .as_ref()
            .unwrap()
            .text
            .contains("finished")
    );
    assert_eq!(std::fs::read_to_string(&receipt.log).unwrap(), "finished\n");
}

#[tokio::test]
async fn an_interactive_prompt_suspends_the_job_until_input_arrives() {
    let h = Harness::new().await;
    let (s, mut events) = h.session("s");
    let spec = CommandSpec::argv(["bash", "-c", "read -p 'Name? ' name; echo \"hello $name\""])
        .stdin(StdinMode::Pipe);
    let receipt = h.jobs.start(&s, &spec).await.unwrap();
    let job = receipt.job.to_string();

    let JobEvent::InputRequested { job: asked, .. } = next_event(&mut events).await else {
        panic!("expected input_requested");
    };
    assert_eq!(asked, receipt.job);
    assert_eq!(
        h.jobs.inspect(&s, &job, 10).unwrap().status.state,
        JobState::Suspended
    );

    let sent = h.jobs.send_input(&s, &job, b"world\n").await.unwrap();
    assert_eq!(sent.bytes_written, 6);
    let JobEvent::Finished { status } = next_event(&mut events).await else {
        panic!("expected completion");
    };
    assert_eq!(status.state, JobState::Completed);
    assert!(status.observation.unwrap().text.contains("hello world"));
}

#[tokio::test]
async fn an_interactive_prompt_on_a_terminal_suspends_and_completes_with_the_answer() {
    let h = Harness::new().await;
    let (s, mut events) = h.session("s");
    let spec = CommandSpec::argv([
        "bash",
        "-c",
        "read -p 'Continue? ' answer; echo \"answer=[$answer] tty=$(tty)\"",
    ])
    .stdin(StdinMode::Tty);
    let receipt = h.jobs.start(&s, &spec).await.unwrap();
    let job = receipt.job.to_string();

    let JobEvent::InputRequested { tail, .. } = next_event(&mut events).await else {
        panic!("expected input_requested");
    };
    assert!(
        tail.contains("Continue?"),
        "the prompt is shown on a terminal: {tail:?}"
    );
    h.jobs.send_input(&s, &job, b"yes\n").await.unwrap();
    let JobEvent::Finished { status } = next_event(&mut events).await else {
        panic!("expected completion");
    };
    assert_eq!(status.state, JobState::Completed);
    let text = status.observation.unwrap().text;
    assert!(text.contains("answer=[yes] tty=/dev/pts/"), "{text}");
}

#[tokio::test]
async fn two_hundred_concurrent_jobs_each_complete_with_exactly_one_event() {
    let h = Harness::with(|c| {
        c.jobs_per_session = 200;
        c.jobs_total = 200;
    })
    .await;
    let (s, mut events) = h.session("s");
    let mut started = Vec::new();
    for i in 0..200 {
        let spec = CommandSpec::argv(["sh", "-c", &format!("sleep 0.$((RANDOM % 5)); echo {i}")]);
        started.push(h.jobs.start(&s, &spec).await.unwrap().job);
    }
    let mut finished: HashMap<_, usize> = HashMap::new();
    while finished.values().sum::<usize>() < 200 {
        if let JobEvent::Finished { status } = next_event(&mut events).await {
            assert_eq!(status.state, JobState::Completed);
            *finished.entry(status.job).or_default() += 1;
        }
    }
    // Nothing more arrives: no job reported twice.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(events.try_recv().is_none());
    assert_eq!(finished.len(), 200);
    assert!(started.iter().all(|j| finished.get(j) == Some(&1)));
}

#[tokio::test]
async fn a_handle_from_another_session_is_answered_like_an_unknown_one() {
    let h = Harness::new().await;
    let (a, _events_a) = h.session("a");
    let (b, _events_b) = h.session("b");
    let job = h
        .jobs
        .start(&a, &CommandSpec::argv(["sleep", "5"]))
        .await
        .unwrap()
        .job
        .to_string();
    let unknown = "job_0123456789abcdef0123456789abcdef";

    let cross = h.jobs.inspect(&b, &job, 5).unwrap_err().to_string();
    let never_was = h.jobs.inspect(&b, unknown, 5).unwrap_err().to_string();
    assert_eq!(cross.replace(&job, "H"), never_was.replace(unknown, "H"));
    assert!(matches!(
        h.jobs.cancel(&b, &job).await,
        Err(JobError::UnknownJob { .. })
    ));
    assert!(matches!(
        h.jobs.send_input(&b, &job, b"x\n").await,
        Err(JobError::UnknownJob { .. })
    ));
    assert!(matches!(
        h.jobs.wait(&b, &job, Duration::ZERO).await,
        Err(JobError::UnknownJob { .. })
    ));
    assert!(h.jobs.list(&b).is_empty());
    // The owner still sees it running.
    assert!(
        !h.jobs
            .inspect(&a, &job, 5)
            .unwrap()
            .status
            .state
            .is_terminal()
    );
    h.jobs.cancel(&a, &job).await.unwrap();
}

#[tokio::test]
async fn cancel_kills_the_tree_and_a_setsid_daemon_with_no_survivors() {
    let h = Harness::new().await;
    let (s, mut events) = h.session("s");
    let pids = h.ws.root().join("pids");
    let script = format!(
        "sleep 1000 & echo $! >> {p}; sleep 1000 & echo $! >> {p}; \
         setsid sh -c 'sleep 1000 & echo $! >> {p}'; echo $$ >> {p}; wait",
        p = pids.display()
    );
    let job = h
        .jobs
        .start(&s, &CommandSpec::shell(script))
        .await
        .unwrap()
        .job
        .to_string();
    wait_for_lines(&pids, 4).await;
    let status = h.jobs.cancel(&s, &job).await.unwrap();
    assert_eq!(status.state, JobState::Killed);
    let all = read_pids(&pids);
    assert_eq!(all.len(), 4);
    assert_no_survivors(&all).await;
    let JobEvent::Finished { status } = next_event(&mut events).await else {
        panic!("expected completion");
    };
    assert_eq!(status.state, JobState::Killed);
}

#[tokio::test]
async fn a_job_past_its_deadline_is_timed_out_with_its_output() {
    let h = Harness::new().await;
    let (s, _events) = h.session("s");
    let job = h
        .jobs
        .start(
            &s,
            &CommandSpec::shell("echo early; sleep 1000").timeout(Duration::from_millis(300)),
        )
        .await
        .unwrap()
        .job
        .to_string();
    let status = h.jobs.wait(&s, &job, EVENT_WAIT).await.unwrap();
    assert_eq!(status.state, JobState::TimedOut);
    assert!(status.observation.unwrap().text.contains("early"));
}

#[tokio::test]
async fn wait_returns_the_current_state_when_the_timeout_passes_first() {
    let h = Harness::new().await;
    let (s, _events) = h.session("s");
    let job = h
        .jobs
        .start(&s, &CommandSpec::argv(["sleep", "30"]))
        .await
        .unwrap()
        .job
        .to_string();
    let status = h
        .jobs
        .wait(&s, &job, Duration::from_millis(50))
        .await
        .unwrap();
    assert!(!status.state.is_terminal());
    assert!(status.finished_at_ms.is_none());
    h.jobs.cancel(&s, &job).await.unwrap();
}

#[tokio::test]
async fn inspect_shows_the_sanitized_tail_and_live_resource_use() {
    let h = Harness::new().await;
    let (s, _events) = h.session("s");
    let script = "for i in 1 2 3 4 5; do printf 'line %s \\033[31mred\\033[0m\\n' $i; done; \
                  touch ready; sleep 30";
    let job = h
        .jobs
        .start(&s, &CommandSpec::shell(script))
        .await
        .unwrap()
        .job
        .to_string();
    let ready = h.ws.root().join("ready");
    for _ in 0..600 {
        if ready.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut snapshot = h.jobs.inspect(&s, &job, 2).unwrap();
    for _ in 0..100 {
        if snapshot.tail.contains("line 5") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        snapshot = h.jobs.inspect(&s, &job, 2).unwrap();
    }
    assert_eq!(snapshot.status.state, JobState::Streaming);
    assert_eq!(snapshot.tail_lines, 2);
    assert!(snapshot.tail.starts_with("line 4"), "{:?}", snapshot.tail);
    assert!(!snapshot.tail.contains('\u{1b}'), "escape bytes are gone");
    let usage = snapshot.usage.expect("usage while running");
    assert!(usage.processes >= 1);
    assert!(usage.threads >= 1);
    assert!(usage.rss_bytes > 0);
    h.jobs.cancel(&s, &job).await.unwrap();
}

#[tokio::test]
async fn input_with_control_characters_is_refused_and_nothing_is_written() {
    let h = Harness::new().await;
    let (s, _events) = h.session("s");
    let job = h
        .jobs
        .start(&s, &CommandSpec::argv(["cat"]).stdin(StdinMode::Pipe))
        .await
        .unwrap()
        .job
        .to_string();
    let err = h.jobs.send_input(&s, &job, b"\x03").await.unwrap_err();
    assert!(matches!(err, JobError::InputRejected { .. }), "{err}");
    h.jobs.send_input(&s, &job, b"plain\n").await.unwrap();
    for _ in 0..600 {
        if h.jobs.inspect(&s, &job, 5).unwrap().tail.contains("plain") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let status = h.jobs.cancel(&s, &job).await.unwrap();
    let stdout = status.observation.unwrap().stdout.unwrap().text;
    assert_eq!(stdout, "plain\n", "only the accepted input reached the job");
}

#[tokio::test]
async fn input_to_a_non_interactive_job_is_refused() {
    let h = Harness::new().await;
    let (s, _events) = h.session("s");
    let job = h
        .jobs
        .start(&s, &CommandSpec::argv(["sleep", "30"]))
        .await
        .unwrap()
        .job
        .to_string();
    assert!(matches!(
        h.jobs.send_input(&s, &job, b"x\n").await,
        Err(JobError::NotInteractive)
    ));
    h.jobs.cancel(&s, &job).await.unwrap();
}

#[tokio::test]
async fn the_per_session_job_limit_is_enforced_and_frees_up() {
    let h = Harness::with(|c| c.jobs_per_session = 2).await;
    let (s, mut events) = h.session("s");
    let (other, _other_events) = h.session("other");
    let a = h
        .jobs
        .start(&s, &CommandSpec::argv(["sleep", "30"]))
        .await
        .unwrap();
    h.jobs
        .start(&s, &CommandSpec::argv(["sleep", "30"]))
        .await
        .unwrap();
    let refused = h
        .jobs
        .start(&s, &CommandSpec::argv(["true"]))
        .await
        .unwrap_err();
    assert!(
        matches!(
            refused,
            JobError::SessionJobLimit {
                running: 2,
                limit: 2
            }
        ),
        "{refused}"
    );
    // Another session is not affected.
    h.jobs
        .start(&other, &CommandSpec::argv(["true"]))
        .await
        .unwrap();
    h.jobs.cancel(&s, &a.job.to_string()).await.unwrap();
    next_event(&mut events).await;
    h.jobs
        .start(&s, &CommandSpec::argv(["true"]))
        .await
        .unwrap();
    h.jobs.shutdown().await;
}

#[tokio::test]
async fn a_session_cannot_be_opened_twice_while_its_stream_lives() {
    let h = Harness::new().await;
    let (s, events) = h.session("s");
    assert!(matches!(
        h.jobs.open_session(&s),
        Err(JobError::SessionAlreadyOpen { .. })
    ));
    drop(events);
    assert!(h.jobs.open_session(&s).is_ok());
}

#[tokio::test]
async fn a_job_crashing_on_a_signal_it_was_not_sent_is_failed() {
    let h = Harness::new().await;
    let (s, mut events) = h.session("s");
    h.jobs
        .start(&s, &CommandSpec::shell("kill -SEGV $$"))
        .await
        .unwrap();
    let JobEvent::Finished { status } = next_event(&mut events).await else {
        panic!("expected completion");
    };
    assert_eq!(status.state, JobState::Failed);
    assert_eq!(status.summary.unwrap().exit.unwrap().signal, Some(11));
}
