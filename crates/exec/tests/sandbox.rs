//! The sandbox every process runs in by default, and the promise that goes with its PID
//! namespace: no process of a run outlives it, however it hides (a plain child, `setsid`, a
//! double fork with `setsid`, the same with an empty environment, a double fork with `setpgid`,
//! each ignoring SIGTERM and SIGHUP). Processes are found in /proc by a marker in their command
//! line (an emptied environment cannot hide it), polled up to a deadline.

mod common;

use common::{PROC_WAIT, Workspace, hiding_tree, hiding_tree_then, marker, never, wait_for_count};
use ring0_exec::{
    CommandSpec, ExecError, JobManager, JobState, JobsConfig, Sandbox, SandboxError,
    SandboxProfile, SessionId, run_command,
};
use std::time::{Duration, Instant};

/// Processes the hiding tree leaves, each a `sleep` carrying the marker.
const TREE_SIZE: usize = 5;

async fn assert_no_survivors(mark: &str) {
    wait_for_count(mark, |n| n == 0, "processes survive").await;
}

#[tokio::test]
async fn a_timed_out_foreground_run_leaves_no_survivors() {
    let ws = Workspace::new();
    let mark = marker(7000);
    let policy = ws.policy().allow_shell(true);
    let spec = CommandSpec::shell(hiding_tree(&mark)).timeout(Duration::from_secs(5));
    let run = run_command(&policy, &spec, never());
    let watch = wait_for_count(&mark, |n| n > TREE_SIZE, "the tree never appeared");
    let (report, ()) = tokio::join!(run, watch);
    let report = report.unwrap();
    assert_eq!(report.summary.ending, ring0_exec::Ending::TimedOut);
    assert_no_survivors(&mark).await;
}

#[tokio::test]
async fn a_cancelled_foreground_run_leaves_no_survivors() {
    let ws = Workspace::new();
    let mark = marker(7000);
    let policy = ws.policy().allow_shell(true);
    let spec = CommandSpec::shell(hiding_tree(&mark));
    let m = mark.clone();
    let cancel =
        async move { wait_for_count(&m, |n| n > TREE_SIZE, "the tree never appeared").await };
    let report = run_command(&policy, &spec, cancel).await.unwrap();
    assert_eq!(report.summary.ending, ring0_exec::Ending::Cancelled);
    assert_no_survivors(&mark).await;
}

#[tokio::test]
async fn a_finished_foreground_run_leaves_no_survivors() {
    let ws = Workspace::new();
    let mark = marker(7000);
    let policy = ws.policy().allow_shell(true);
    // The tree, and then the run's own shell exits.
    let script = hiding_tree_then(&mark, "sleep 1");
    let report = run_command(&policy, &CommandSpec::shell(script), never())
        .await
        .unwrap();
    assert_eq!(report.summary.exit.and_then(|e| e.code), Some(0));
    assert_no_survivors(&mark).await;
}

#[tokio::test]
async fn a_cancelled_job_leaves_no_survivors() {
    let ws = Workspace::new();
    let mark = marker(7000);
    let config = JobsConfig::new(ws.root().join(".state"), ws.policy().allow_shell(true));
    let (jobs, _) = JobManager::open(config).await.unwrap();
    let session = SessionId::new("s").unwrap();
    let _events = jobs.open_session(&session).unwrap();
    let job = jobs
        .start(&session, &CommandSpec::shell(hiding_tree(&mark)))
        .await
        .unwrap()
        .job
        .to_string();
    wait_for_count(&mark, |n| n > TREE_SIZE, "the tree never appeared").await;
    let status = jobs.cancel(&session, &job).await.unwrap();
    assert_eq!(status.state, JobState::Killed);
    assert_no_survivors(&mark).await;
}

#[tokio::test]
async fn a_program_sees_its_own_pid_namespace_network_and_scratch_home() {
    let ws = Workspace::new();
    let policy = ws.policy().allow_shell(true);
    let script = "echo pid=$$; tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '; \
                  test -w \"$HOME\" && test \"$HOME\" = \"$TMPDIR\" && echo home-ok";
    let report = run_command(&policy, &CommandSpec::shell(script), never())
        .await
        .unwrap();
    let text = report.observation.text;
    assert!(text.contains("pid=2"), "{text}");
    assert!(
        text.contains("pid=2\nlo\nhome-ok"),
        "only the loopback: {text}"
    );
    assert!(text.contains("home-ok"), "{text}");
}

#[tokio::test]
async fn a_signal_the_program_sends_itself_ends_it() {
    let ws = Workspace::new();
    let policy = ws.policy().allow_shell(true);
    let report = run_command(&policy, &CommandSpec::shell("kill -TERM $$"), never())
        .await
        .unwrap();
    assert_eq!(
        report.summary.exit.and_then(|e| e.signal),
        Some(libc::SIGTERM)
    );
}

#[tokio::test]
async fn a_profile_path_that_does_not_exist_refuses_to_start() {
    let ws = Workspace::new();
    let mut profile = SandboxProfile::workspace();
    profile.read.push("/nonexistent/toolchain".into());
    let policy = ws
        .policy()
        .sandbox(Sandbox::new(profile, ws.root(), Vec::new()));
    let err = run_command(&policy, &CommandSpec::argv(["true"]), never())
        .await
        .unwrap_err();
    assert!(
        matches!(err, ExecError::Sandbox(SandboxError::Path { .. })),
        "{err}"
    );
}

#[tokio::test]
async fn a_profile_with_egress_and_no_proxy_refuses_to_start() {
    let ws = Workspace::new();
    let mut profile = SandboxProfile::workspace();
    profile.network = ring0_exec::sandbox::NetworkPolicy::Proxy {
        allow: vec!["example.com:443".into()],
    };
    let policy = ws
        .policy()
        .sandbox(Sandbox::new(profile, ws.root(), Vec::new()));
    let err = run_command(&policy, &CommandSpec::argv(["true"]), never())
        .await
        .unwrap_err();
    assert!(
        matches!(err, ExecError::Sandbox(SandboxError::NoEgressProxy { .. })),
        "{err}"
    );
}

/// A stand-in for ring0's egress proxy: answers the first connection on the listener.
#[derive(Debug)]
struct AnswerOnce;

impl ring0_exec::sandbox::EgressProxy for AnswerOnce {
    fn serve(
        &self,
        listener: ring0_exec::sandbox::EgressListener,
        _: &SandboxProfile,
    ) -> Result<ring0_exec::sandbox::EgressServing, SandboxError> {
        let listener = listener.into_std();
        std::thread::spawn(move || {
            use std::io::Write;
            if let Ok((mut conn, _)) = listener.accept() {
                let _ = conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 7\r\n\r\nproxied");
            }
        });
        Ok(Box::new(()))
    }
}

#[tokio::test]
async fn a_profile_with_egress_reaches_only_the_proxy_through_its_variables() {
    let ws = Workspace::new();
    let mut profile = SandboxProfile::workspace();
    profile.network = ring0_exec::sandbox::NetworkPolicy::Proxy {
        allow: vec!["example.com:80".into()],
    };
    let sandbox =
        Sandbox::new(profile, ws.root(), Vec::new()).egress_proxy(std::sync::Arc::new(AnswerOnce));
    let policy = ws.policy().allow_shell(true).sandbox(sandbox);
    let script = "echo proxy=$HTTP_PROXY; python3 -c \"import urllib.request as u; \
                  print(u.urlopen('http://example.com/', timeout=10).read().decode())\"";
    let report = run_command(&policy, &CommandSpec::shell(script), never())
        .await
        .unwrap();
    let text = report.observation.text;
    assert!(text.contains("proxy=http://127.0.0.1:3128"), "{text}");
    assert!(text.contains("proxied"), "{text}");
}

/// Listens on 127.0.0.1:PORT (argv[1]), says so in `ready`, and answers one connection.
const LISTEN_ONCE: &str = "\
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('127.0.0.1', int(sys.argv[1])))
s.listen(1)
open('ready', 'w').write('ready')
s.settimeout(60)
c, _ = s.accept()
c.sendall(b'hello from inside')
c.close()
";

/// Connects to 127.0.0.1:PORT (argv[1]) and prints what happened.
const CONNECT: &str = "\
import socket, sys
try:
    c = socket.create_connection(('127.0.0.1', int(sys.argv[1])), 5)
    print('connected', c.recv(64).decode())
except OSError as e:
    print('refused', type(e).__name__)
";

#[tokio::test]
async fn two_sandboxes_do_not_share_a_loopback() {
    let (a, b) = (Workspace::new(), Workspace::new());
    for ws in [&a, &b] {
        std::fs::write(ws.root().join("listen.py"), LISTEN_ONCE).unwrap();
        std::fs::write(ws.root().join("connect.py"), CONNECT).unwrap();
    }
    let port = (40_000 + std::process::id() % 20_000).to_string();
    // One policy, one sandbox: its processes share a loopback.
    let policy_a = a.policy();
    let policy_b = b.policy();
    let listen =
        CommandSpec::argv(["python3", "listen.py", &port]).timeout(Duration::from_secs(90));
    let connect =
        CommandSpec::argv(["python3", "connect.py", &port]).timeout(Duration::from_secs(30));
    let server = run_command(&policy_a, &listen, never());
    let clients = async {
        let ready = a.root().join("ready");
        let deadline = Instant::now() + PROC_WAIT;
        while !ready.exists() {
            assert!(Instant::now() < deadline, "the listener never started");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let from_b = run_command(&policy_b, &connect, never()).await.unwrap();
        let from_a = run_command(&policy_a, &connect, never()).await.unwrap();
        (from_b.observation.text, from_a.observation.text)
    };
    let (server, (from_b, from_a)) = tokio::join!(server, clients);
    assert!(
        from_b.contains("refused ConnectionRefusedError"),
        "{from_b}"
    );
    assert!(from_a.contains("connected hello from inside"), "{from_a}");
    assert_eq!(server.unwrap().summary.exit.and_then(|e| e.code), Some(0));
}
