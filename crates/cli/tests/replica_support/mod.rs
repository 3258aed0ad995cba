//! What the replica tests share: a schema of the test database per test (or a cluster of a
//! test's own), a workspace whose counting upstream `cx__record` (tests/fixtures/
//! counting_upstream.py) appends one line per applied idempotency key to `effects.log`, and
//! `ring0 serve --http` replicas on one journal, each with a state directory of its own.
#![allow(dead_code)]

use crate::common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Each replica's lease in these tests: a killed replica's calls are recovered soon after.
pub const LEASE_MS: u64 = 1_000;

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// The test database's URL, or `None` (the test is skipped, or fails under CI).
pub fn test_database() -> Option<String> {
    match std::env::var("RING0_TEST_POSTGRES_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => skip_or_fail("RING0_TEST_POSTGRES_URL is not set (scripts/test.sh starts a database)"),
    }
}

/// Runs `sql` against `url` (the tests' own connection).
pub fn sql_count(url: &str, sql: &str) -> i64 {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .expect("the test database");
        let driver = tokio::spawn(connection);
        let count: i64 = client.query_one(sql, &[]).await.unwrap().get(0);
        drop(client);
        let _ = driver.await;
        count
    })
}

/// A new schema in the database `url` names, and a URL whose connections use it.
pub fn schema_in(url: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() as u64);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let schema = format!("rs_{}_{nanos}_{n}", std::process::id());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
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
    format!("{url}{sep}options=-c%20search_path%3D{schema}")
}

/// A workspace granting `cx__record` (settled by its idempotency key) up to `authority`, each
/// replica running the counting upstream over stdio, with `extra` configuration.
pub fn workspace(peers: &Path, authority: &str, extra: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let transport = format!(
        "command = {:?}\nargs = [{:?}, \"--dir\", {:?}]",
        python(peers).display().to_string(),
        fixtures()
            .join("counting_upstream.py")
            .display()
            .to_string(),
        dir.path().display().to_string(),
    );
    write_config(dir.path(), &transport, authority, extra);
    dir
}

/// The command of replica `name` on `journal` in `dir`, listening on an ephemeral port.
pub fn replica_command(dir: &Path, name: &str, journal: &str) -> Command {
    let mut cmd = Command::new(ring0());
    cmd.arg("--state-dir")
        .arg(dir.join(format!(".ring0-{name}")))
        .args(["serve", "--http", "127.0.0.1:0", "--journal", journal])
        .current_dir(dir)
        .env("HOME", test_home())
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    cmd
}

/// Replica `name`, started and listening.
pub fn replica(dir: &Path, name: &str, journal: &str) -> HttpServer {
    start_http(replica_command(dir, name, journal))
}

/// The lines of `effects.log` (`KEY<TAB>TEXT`), by text: how many times each text was applied.
pub fn effects_by_text(dir: &Path) -> std::collections::BTreeMap<String, usize> {
    let mut counts = std::collections::BTreeMap::new();
    for line in std::fs::read_to_string(dir.join("effects.log"))
        .unwrap_or_default()
        .lines()
    {
        let text = line.split_once('\t').map_or(line, |(_, t)| t);
        *counts.entry(text.to_string()).or_insert(0) += 1;
    }
    counts
}

/// A PostgreSQL cluster of a test's own (`scripts/test-postgres.sh`), for a test that restarts
/// the server. Stopped on drop.
pub struct OwnCluster {
    dir: tempfile::TempDir,
    pub url: String,
}

impl OwnCluster {
    pub fn start() -> Option<Self> {
        // Only where the shared test database is available: the same script started it.
        test_database()?;
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
        let out = Command::new("bash")
            .arg(script_path())
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
    pub fn restart(&self) {
        Self::script(&self.dir, "restart");
    }
}

fn script_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/test-postgres.sh")
}

impl Drop for OwnCluster {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(script_path())
            .arg("stop")
            .arg(self.dir.path().join("cluster"))
            .stdin(Stdio::null())
            .output();
    }
}

/// `ring0.toml` in `dir` granting `cx__record` up to `authority`: the counting upstream `cx`
/// reached by `transport` (its `command` or `url` lines), with the replicas' lease and `extra`
/// configuration after it.
pub fn write_config(dir: &Path, transport: &str, authority: &str, extra: &str) {
    let config = format!(
        "[[grants]]\nname = \"effects\"\ntools = [\"cx__record\"]\nceiling = {authority:?}\n\n\
         [journal]\nlease_ms = {LEASE_MS}\n\n\
         [[upstreams]]\nalias = \"cx\"\n{transport}\n\n\
         [upstreams.tools.record]\neffect = \"non_idempotent\"\nauthority = {authority:?}\n\
         strategy = [\"exploitation\"]\nsettlement = \"idempotency_key\"\n\n{extra}"
    );
    std::fs::write(dir.join("ring0.toml"), config).unwrap();
}

/// The counting upstream over Streamable HTTP for the workspace `dir`: one process serving
/// every replica and outliving any of them, killed when dropped.
pub struct HttpUpstream {
    child: std::process::Child,
    pub url: String,
}

impl HttpUpstream {
    pub fn start(peers: &Path, dir: &Path) -> Self {
        let mut child = Command::new(python(peers))
            .arg(fixtures().join("counting_upstream.py"))
            .arg("--dir")
            .arg(dir)
            .arg("--http")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        let stdout = child.stdout.take().unwrap();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).unwrap();
        let url = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("the upstream did not start: {line:?}"))
            .to_string();
        Self { child, url }
    }
}

impl Drop for HttpUpstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
