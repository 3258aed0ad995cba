//! Several `ring0 serve` processes on one PostgreSQL journal are replicas of one deployment:
//! the same keyed call sent to two of them has one effect, and a replica SIGKILLed mid-call
//! leaves its call to the other, which settles it once the dead one's lease has lapsed.
//!
//! Effects are counted in the lines of `effects.log`, which the upstream tool `fx__append`
//! (tests/fixtures/effect_upstream.py, settled by its idempotency key) appends to; both replicas
//! serve the same workspace, each with a state directory of its own. The database is the one
//! `RING0_TEST_POSTGRES_URL` names (`scripts/test.sh` starts one), each test in a schema of its
//! own; without it the test is skipped, and under CI it fails.

mod common;

use common::*;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Each replica's lease in these tests: a killed replica's call is recovered soon after.
const LEASE_MS: u64 = 1_000;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// A new schema in the test database, and a URL whose connections use it.
fn database() -> Option<String> {
    let Some(url) = std::env::var("RING0_TEST_POSTGRES_URL")
        .ok()
        .filter(|u| !u.is_empty())
    else {
        return skip_or_fail(
            "RING0_TEST_POSTGRES_URL is not set (scripts/test.sh starts a database)",
        );
    };
    let schema = format!("r_{}", std::process::id() as u64 * 1_000_000 + nanos());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .expect("the test database");
        let driver = tokio::spawn(connection);
        client
            .batch_execute(&format!("CREATE SCHEMA {schema}"))
            .await
            .unwrap();
        drop(client);
        let _ = driver.await;
    });
    let sep = if url.contains('?') { '&' } else { '?' };
    Some(format!("{url}{sep}options=-c%20search_path%3D{schema}"))
}

fn nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() as u64)
}

/// A workspace granting the effect upstream's `fx__append` (A2, settled by its idempotency key:
/// never held for a person), with the replicas' lease.
fn workspace(peers: &Path) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[[grants]]\nname = \"effects\"\ntools = [\"fx__append\"]\nceiling = \"A2\"\n\n\
         [journal]\nlease_ms = {LEASE_MS}\n\n\
         [[upstreams]]\nalias = \"fx\"\ncommand = {:?}\nargs = [{:?}, \"--dir\", {:?}]\n\n\
         [upstreams.tools.append]\neffect = \"non_idempotent\"\nauthority = \"A2\"\n\
         strategy = [\"exploitation\"]\nsettlement = \"idempotency_key\"\n",
        python(peers).display().to_string(),
        fixtures().join("effect_upstream.py").display().to_string(),
        dir.path().display().to_string(),
    );
    std::fs::write(dir.path().join("ring0.toml"), config).unwrap();
    dir
}

/// One replica: `ring0 serve --http` on the shared journal with a state directory of its own,
/// and a sessionful MCP session with it.
struct Replica {
    server: HttpServer,
    session: String,
}

impl Replica {
    fn start(dir: &Path, name: &str, journal: &str) -> Self {
        let mut cmd = Command::new(ring0());
        cmd.arg("--state-dir")
            .arg(dir.join(format!(".ring0-{name}")))
            .args(["serve", "--http", "127.0.0.1:0", "--journal", journal])
            .current_dir(dir)
            .env("HOME", test_home())
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        let server = start_http(cmd);
        let (head, init) = post(
            &server.addr,
            &[],
            &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                    "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                               "clientInfo": {"name": "replica-test", "version": "1"}}}),
        );
        assert!(init.get("result").is_some(), "{init}");
        let session = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.trim()
                    .eq_ignore_ascii_case("mcp-session-id")
                    .then(|| v.trim().to_string())
            })
            .unwrap_or_else(|| panic!("no session id in:\n{head}"));
        let replica = Self { server, session };
        replica.post(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        replica
    }

    fn post(&self, message: &Value) -> Value {
        let headers = [
            ("Mcp-Session-Id", self.session.as_str()),
            ("MCP-Protocol-Version", "2025-06-18"),
        ];
        post(&self.server.addr, &headers, message).1
    }

    /// `fx__append` with `arguments` under the caller's idempotency key `key`.
    fn append(&self, id: u64, arguments: Value, key: &str) -> Value {
        self.post(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "fx__append", "arguments": arguments, "idempotencyKey": key}}))
    }
}

/// The effect upstreams running for the workspace `dir` (one per live replica), found by their
/// command line in /proc.
fn upstreams_serving(dir: &Path) -> usize {
    let wanted = dir.display().to_string();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            std::fs::read(e.path().join("cmdline")).is_ok_and(|c| {
                let c = String::from_utf8_lossy(&c);
                c.contains("effect_upstream.py") && c.contains(&wanted)
            })
        })
        .count()
}

fn effects(dir: &Path, text: &str) -> usize {
    std::fs::read_to_string(dir.join("effects.log"))
        .unwrap_or_default()
        .lines()
        .filter(|l| *l == text)
        .count()
}

/// The text the upstream answered a call with (`{"text": T, "lines": N}`), from its result.
fn appended(answer: &Value) -> String {
    assert_eq!(answer["result"]["isError"], json!(false), "{answer}");
    let content = answer["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or("");
    let inner: Value = serde_json::from_str(content).unwrap_or(Value::Null);
    inner["text"].as_str().unwrap_or_default().to_string()
}

#[test]
fn the_same_keyed_call_sent_to_two_replicas_has_one_effect() {
    let Some(journal) = database() else { return };
    let Some(peers) = peers() else { return };
    let dir = workspace(&peers);
    let a = Replica::start(dir.path(), "a", &journal);
    let b = Replica::start(dir.path(), "b", &journal);
    // One after the other: the second replica answers from the first one's record.
    let first = a.append(2, json!({"text": "once"}), "key-once");
    assert_eq!(appended(&first), "once");
    let again = b.append(2, json!({"text": "once"}), "key-once");
    assert_eq!(appended(&again), "once");
    assert_eq!(effects(dir.path(), "once"), 1, "{again}");
    // At the same moment on both: one claim wins, the other call waits for its result.
    let (a, b) = (std::sync::Arc::new(a), std::sync::Arc::new(b));
    let racers: Vec<_> = [a.clone(), b.clone()]
        .into_iter()
        .map(|r| std::thread::spawn(move || r.append(3, json!({"text": "raced"}), "key-race")))
        .collect();
    for racer in racers {
        assert_eq!(appended(&racer.join().unwrap()), "raced");
    }
    assert_eq!(effects(dir.path(), "raced"), 1);
}

#[test]
fn a_replica_killed_mid_call_leaves_its_call_to_the_other_which_settles_it_once() {
    let Some(journal) = database() else { return };
    let Some(peers) = peers() else { return };
    let dir = workspace(&peers);
    let mut a = Replica::start(dir.path(), "a", &journal);
    let b = Replica::start(dir.path(), "b", &journal);
    // The call reaches the upstream through replica A, which dies before it answers.
    let addr = a.server.addr.clone();
    let session = a.session.clone();
    let sender = std::thread::spawn(move || {
        let headers = [
            ("Mcp-Session-Id", session.as_str()),
            ("MCP-Protocol-Version", "2025-06-18"),
        ];
        let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "fx__append",
                       "arguments": {"text": "orphan", "gate": "gate-orphan"},
                       "idempotencyKey": "key-orphan"}});
        // The connection dies with the replica: no answer.
        let _ = std::panic::catch_unwind(|| post_raw(&addr, &headers, &call));
    });
    wait_for_file_text(
        &dir.path().join("entered.log"),
        "orphan",
        "the call reaches the upstream through replica A",
    );
    a.server.child.kill().unwrap(); // SIGKILL
    let _ = a.server.child.wait();
    let _ = sender.join();
    // A's upstream ran in its sandbox and dies with it (its PID namespace's init follows
    // ring0): wait until only B's is left, so the call cannot land through A's after all.
    let deadline = std::time::Instant::now() + HTTP_WAIT;
    while upstreams_serving(dir.path()) > 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "A's upstream outlived it"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // Nothing was applied. The gate opens for whoever sends the call next.
    assert_eq!(
        effects(dir.path(), "orphan"),
        0,
        "the upstream outlived its replica"
    );
    std::fs::write(dir.path().join("gate-orphan"), "").unwrap();
    // Once A's lease lapses, B's recovery takes the call and re-sends it under the same key.
    wait_for_file_text(
        &dir.path().join("effects.log"),
        "orphan",
        "replica B settles the call replica A left in flight",
    );
    // The client's re-issue to B is answered with that result, and the effect happened once.
    let again = b.append(
        3,
        json!({"text": "orphan", "gate": "gate-orphan"}),
        "key-orphan",
    );
    assert_eq!(appended(&again), "orphan");
    assert_eq!(effects(dir.path(), "orphan"), 1, "{again}");
}

fn ring0_in(dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new(ring0())
        .args(args)
        .current_dir(dir)
        .env("HOME", test_home())
        .env("RING0_STATE_DIR", dir.join(".ring0"))
        .stdin(Stdio::null())
        .output()
        .expect("ring0")
}

#[test]
fn a_journal_setting_ring0_cannot_use_is_refused_at_load_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    for (section, key) in [
        ("[journal]\nurl = \"mysql://db/ring0\"\n", "journal.url"),
        (
            "[journal]\nurl = \"postgres://db/r\"\nlease_ms = 10\n",
            "journal.lease_ms",
        ),
        (
            "[journal]\npassword_env = \"PGPASS\"\n",
            "journal.password_env",
        ),
    ] {
        std::fs::write(dir.path().join("ring0.toml"), section).unwrap();
        let out = ring0_in(dir.path(), &["config", "check"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains(key), "{key}: {stderr}");
    }
    std::fs::remove_file(dir.path().join("ring0.toml")).unwrap();
    let out = ring0_in(dir.path(), &["serve", "--journal", "sqlite:///tmp/j.db"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("--journal") && stderr.contains("PostgreSQL"),
        "{stderr}"
    );
}

#[test]
fn an_unreachable_database_refuses_the_start_naming_it_without_its_password() {
    let dir = tempfile::tempdir().unwrap();
    let url = "postgres://ring0:hunter2@127.0.0.1:1/nowhere?connect_timeout=2";
    let out = ring0_in(dir.path(), &["serve", "--journal", url]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("postgres://127.0.0.1:1/nowhere"),
        "{stderr}"
    );
    assert!(!stderr.contains("hunter2"), "{stderr}");
    assert!(
        !dir.path().join(".ring0/journal.db").exists(),
        "no SQLite journal instead"
    );
}

/// `ring0 journal …` in `dir`: its exit code and its stdout, or its stderr on failure.
fn journal_cmd(dir: &Path, args: &[&str]) -> (Option<i32>, String) {
    let mut all = vec!["journal"];
    all.extend_from_slice(args);
    let out = ring0_in(dir, &all);
    let text = if out.status.success() {
        String::from_utf8_lossy(&out.stdout).into_owned()
    } else {
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    (out.status.code(), text)
}

#[test]
fn ring0_journal_migrates_lists_and_shows_a_shared_journal_beside_its_replicas() {
    let Some(journal) = database() else { return };
    let Some(peers) = peers() else { return };
    let dir = workspace(&peers);
    let (code, text) = journal_cmd(dir.path(), &["ls", "--journal", &journal]);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("no ring0 journal here"), "{text}");
    // Migrated once, ahead of the replicas; a second run finds nothing to do.
    let (code, text) = journal_cmd(dir.path(), &["migrate", "--journal", &journal]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("migrated from version 0 to"), "{text}");
    let (code, text) = journal_cmd(dir.path(), &["migrate", "--journal", &journal]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("already at version"), "{text}");
    // A call through a running replica is listed and shown from outside it.
    let a = Replica::start(dir.path(), "a", &journal);
    assert_eq!(
        appended(&a.append(2, json!({"text": "listed"}), "key-listed")),
        "listed"
    );
    let (code, listing) = journal_cmd(dir.path(), &["ls", "--journal", &journal]);
    assert_eq!(code, Some(0), "{listing}");
    assert_eq!(
        replicas_holding_a_lease(&journal),
        1,
        "reading joined the deployment as a replica"
    );
    let line = listing
        .lines()
        .find(|l| l.contains("fx__append"))
        .unwrap_or_else(|| panic!("the call is listed:\n{listing}"));
    assert!(line.contains("ACKED"), "{line}");
    let id = line.split_whitespace().next().unwrap().to_string();
    let (code, shown) = journal_cmd(dir.path(), &["show", &id[..8], "--journal", &journal]);
    assert_eq!(code, Some(0), "{shown}");
    assert!(shown.contains(&format!("intent:          {id}")), "{shown}");
    assert!(shown.contains("state:           ACKED"), "{shown}");
    // Without a flag, `ring0 journal` reads the journal the configuration names.
    let config = std::fs::read_to_string(dir.path().join("ring0.toml")).unwrap();
    let config = config.replace("[journal]\n", &format!("[journal]\nurl = {journal:?}\n"));
    std::fs::write(dir.path().join("ring0.toml"), config).unwrap();
    let (code, text) = journal_cmd(dir.path(), &["ls"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains(&id), "{text}");
}

/// Replicas whose lease has not been given up (a killed replica's stays until it lapses and
/// long after; a drained one's is given up as it exits).
fn replicas_holding_a_lease(journal: &str) -> i64 {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (client, connection) = tokio_postgres::connect(journal, tokio_postgres::NoTls)
            .await
            .expect("the test database");
        let driver = tokio::spawn(connection);
        let count: i64 = client
            .query_one(
                "SELECT count(*) FROM replicas WHERE lease_until > '-infinity'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        drop(client);
        let _ = driver.await;
        count
    })
}

#[test]
fn a_replica_drained_with_sigterm_exits_cleanly_giving_its_lease_up() {
    let Some(journal) = database() else { return };
    let Some(peers) = peers() else { return };
    let dir = workspace(&peers);
    let mut a = Replica::start(dir.path(), "a", &journal);
    let b = Replica::start(dir.path(), "b", &journal);
    assert_eq!(
        appended(&a.append(2, json!({"text": "before"}), "key-before")),
        "before"
    );
    assert_eq!(replicas_holding_a_lease(&journal), 2);
    let status = Command::new("kill")
        .args(["-TERM", &a.server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = std::time::Instant::now() + HTTP_WAIT;
    let exit = loop {
        if let Some(exit) = a.server.child.try_wait().unwrap() {
            break exit;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the drained replica did not exit"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(exit.success(), "{exit:?}");
    assert_eq!(
        replicas_holding_a_lease(&journal),
        1,
        "the drained replica gave its lease up"
    );
    // The other replica answers the drained one's call from the shared record.
    assert_eq!(
        appended(&b.append(3, json!({"text": "before"}), "key-before")),
        "before"
    );
    assert_eq!(effects(dir.path(), "before"), 1);
}

/// A PostgreSQL cluster of a test's own (`scripts/test-postgres.sh`), for a test that restarts
/// the server (the shared test database serves other tests meanwhile). Stopped on drop.
struct OwnCluster {
    dir: tempfile::TempDir,
    url: String,
}

impl OwnCluster {
    fn start() -> Option<Self> {
        // Only where the shared test database is available: the same script started it.
        std::env::var("RING0_TEST_POSTGRES_URL")
            .ok()
            .filter(|u| !u.is_empty())?;
        let dir = tempfile::tempdir().unwrap();
        // The server runs as another user, who must reach the cluster's directory.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let out = Self::script(&dir, "start");
        let url = String::from_utf8_lossy(&out.stdout)
            .lines()
            .find_map(|l| l.strip_prefix("export RING0_TEST_POSTGRES_URL="))
            .map(str::to_string)
            .unwrap_or_else(|| panic!("no cluster: {}", String::from_utf8_lossy(&out.stderr)));
        Some(Self { dir, url })
    }

    fn script(dir: &tempfile::TempDir, command: &str) -> std::process::Output {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/test-postgres.sh");
        let out = Command::new("bash")
            .arg(script)
            .arg(command)
            .arg(dir.path().join("cluster"))
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "test-postgres.sh {command}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// A fast restart: every client connection is dropped, as in a crash of the server.
    fn restart(&self) {
        Self::script(&self.dir, "restart");
    }
}

impl Drop for OwnCluster {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/test-postgres.sh"))
            .arg("stop")
            .arg(self.dir.path().join("cluster"))
            .stdin(Stdio::null())
            .output();
    }
}

/// Sends a keyed call until it is answered with a result (a client re-issuing on error), within
/// the HTTP wait.
fn append_until_answered(replica: &Replica, arguments: Value, key: &str) -> (Value, usize) {
    let deadline = std::time::Instant::now() + HTTP_WAIT;
    let mut errors = 0;
    loop {
        let answer = replica.append(9, arguments.clone(), key);
        if answer["result"]["isError"] == json!(false) {
            return (answer, errors);
        }
        errors += 1;
        assert!(
            std::time::Instant::now() < deadline,
            "never answered: {answer}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
fn a_replica_serves_on_after_postgresql_restarts_and_each_call_has_one_effect() {
    let Some(cluster) = OwnCluster::start() else {
        skip_or_fail::<()>(
            "RING0_TEST_POSTGRES_URL is not set (scripts/test.sh starts a database)",
        );
        return;
    };
    let Some(peers) = peers() else { return };
    let dir = workspace(&peers);
    let a = Replica::start(dir.path(), "a", &cluster.url);
    assert_eq!(
        appended(&a.append(2, json!({"text": "before"}), "key-before")),
        "before"
    );
    cluster.restart();
    // The pool's connections died with the server: the replica reconnects, and a client that
    // re-issues on error is answered.
    let (answer, errors) = append_until_answered(&a, json!({"text": "after"}), "key-after");
    assert_eq!(appended(&answer), "after", "after {errors} error(s)");
    eprintln!("answered after the restart, the client having re-issued {errors} time(s)");
    let (again, _) = append_until_answered(&a, json!({"text": "before"}), "key-before");
    assert_eq!(appended(&again), "before");
    assert_eq!(effects(dir.path(), "before"), 1);
    assert_eq!(effects(dir.path(), "after"), 1);
}
