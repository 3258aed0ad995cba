//! Real crashes: a host process using the SQLite journal performs mutating calls against a
//! counting HTTP service on 127.0.0.1 and is SIGKILLed at random points, restarted, and made to
//! propose the same intents again with fresh call ids. Whatever the kill points, every intent
//! has at most one effect, and after a last uninterrupted run nothing is left unsettled.
//!
//! The service is written here with std (one thread per connection, `Connection: close`): it
//! applies a refund under a lock, answers after a random delay, and sometimes drops the
//! connection instead of answering (a lost ack). In `idempotent` mode it honours the
//! `Idempotency-Key` header; in `probe` mode it does not, and refuses requests past their
//! `X-Deadline-Ms`, which is what makes the worker's probe sound.

use ring0_core::IntentState;
use ring0_journal::{Journal, SqliteJournal};
use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Kills per scenario; two scenarios make a test run's kills.
const KILLS_PER_SCENARIO: u32 = 30;
/// Intents in all (the service's orders).
const INTENTS: u64 = 60;
/// Each worker run proposes the intents of earlier runs again and this many new ones, so kills
/// keep landing on real work rather than on replays.
const NEW_INTENTS_PER_RUN: u64 = 2;
/// Intents known to the first run.
const FIRST_RUN_INTENTS: u64 = 4;
/// Longest a worker may be left running before it is killed.
const KILL_DELAY_MS_MAX: u64 = 150;
/// Most worker runs per scenario (kills plus runs that finished before their kill time).
const RUNS_MAX: u32 = 200;
/// Longest an unkilled worker run may take.
const RUN_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Default)]
struct Ledger {
    applied: Vec<u32>,
    version: Vec<u64>,
    seen_keys: HashSet<String>,
}

struct Service {
    addr: SocketAddr,
    ledger: Arc<Mutex<Ledger>>,
    stop: Arc<AtomicBool>,
}

/// A small deterministic generator for the service's delays and drops.
fn mix(n: u64) -> u64 {
    let mut z = n.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Service {
    fn start(honours_keys: bool) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let ledger = Arc::new(Mutex::new(Ledger {
            applied: vec![0; INTENTS as usize],
            version: vec![0; INTENTS as usize],
            ..Ledger::default()
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let (l, s) = (ledger.clone(), stop.clone());
        let counter = Arc::new(AtomicU64::new(0));
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let (l, n) = (l.clone(), counter.fetch_add(1, Ordering::SeqCst));
                std::thread::spawn(move || serve(conn, &l, honours_keys, mix(n)));
            }
        });
        Self { addr, ledger, stop }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

fn serve(conn: TcpStream, ledger: &Mutex<Ledger>, honours_keys: bool, dice: u64) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
    let mut reader = BufReader::new(&conn);
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (mut key, mut deadline) = (String::new(), u64::MAX);
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
            break;
        }
        if let Some((name, value)) = h.split_once(':') {
            match name.trim().to_ascii_lowercase().as_str() {
                "idempotency-key" => key = value.trim().to_string(),
                "x-deadline-ms" => deadline = value.trim().parse().unwrap_or(u64::MAX),
                _ => {}
            }
        }
    }
    let order: usize = path
        .rsplit('/')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(usize::MAX);
    let (status, body) = {
        let mut l = ledger.lock().unwrap();
        if order >= l.applied.len() {
            (404, "{}".to_string())
        } else if method == "GET" {
            (
                200,
                format!(
                    "{{\"applied\":{},\"version\":{}}}",
                    l.applied[order], l.version[order]
                ),
            )
        } else if honours_keys && l.seen_keys.contains(&key) {
            (
                200,
                format!("{{\"applied\":{},\"replayed\":true}}", l.applied[order]),
            )
        } else if now_ms() > deadline {
            (
                408,
                "{\"error\":\"deadline passed; not applied\"}".to_string(),
            )
        } else {
            l.applied[order] += 1;
            l.version[order] += 1;
            if honours_keys {
                l.seen_keys.insert(key);
            }
            (200, format!("{{\"applied\":{}}}", l.applied[order]))
        }
    };
    if method == "POST" {
        // Answer late, or not at all: the effect above is already applied.
        std::thread::sleep(Duration::from_millis(dice % 25));
        if dice % 100 < 8 {
            return;
        }
    }
    let mut conn = conn;
    let _ = write!(
        conn,
        "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

struct Outcome {
    acked: usize,
    dead_lettered: usize,
    kills: u32,
    runs: u32,
    in_flight_at_restart: u64,
}

fn scenario(mode: &str, honours_keys: bool) -> Outcome {
    let service = Service::start(honours_keys);
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal.db");
    let worker = env!("CARGO_BIN_EXE_ring0-journal-crash-worker");
    let spawn = |run: u32, intents: u64| {
        Command::new(worker)
            .args([
                journal.to_str().unwrap(),
                &service.addr.to_string(),
                mode,
                &intents.to_string(),
                &run.to_string(),
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let in_flight = |stdout: &str| -> u64 {
        stdout
            .split_whitespace()
            .find_map(|w| w.strip_prefix("in_flight="))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    let mut out = Outcome {
        acked: 0,
        dead_lettered: 0,
        kills: 0,
        runs: 0,
        in_flight_at_restart: 0,
    };
    while out.kills < KILLS_PER_SCENARIO {
        assert!(
            out.runs < RUNS_MAX,
            "{} runs without {KILLS_PER_SCENARIO} kills",
            out.runs
        );
        let known = (FIRST_RUN_INTENTS + NEW_INTENTS_PER_RUN * u64::from(out.runs)).min(INTENTS);
        let mut child = spawn(out.runs, known);
        out.runs += 1;
        let delay = Duration::from_millis(mix(u64::from(out.runs) ^ 0xc4a5) % KILL_DELAY_MS_MAX);
        let started = Instant::now();
        while started.elapsed() < delay && child.try_wait().unwrap().is_none() {
            std::thread::sleep(Duration::from_millis(1));
        }
        if child.try_wait().unwrap().is_none() {
            child.kill().unwrap(); // SIGKILL
            out.kills += 1;
        }
        let result = child.wait_with_output().unwrap();
        out.in_flight_at_restart += in_flight(&String::from_utf8_lossy(&result.stdout));
        if result.status.code().is_some_and(|c| c != 0) {
            panic!(
                "worker run {} failed: {}",
                out.runs,
                String::from_utf8_lossy(&result.stderr)
            );
        }
    }
    // A last run that is not killed settles everything.
    let mut child = spawn(out.runs, INTENTS);
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        assert!(
            started.elapsed() < RUN_TIMEOUT,
            "the final run did not finish"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let result = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&result.stdout);
    assert!(
        result.status.success(),
        "{}",
        String::from_utf8_lossy(&result.stderr)
    );
    assert!(stdout.contains("done"), "{stdout}");
    out.in_flight_at_restart += in_flight(&stdout);

    let ledger = service.ledger.lock().unwrap();
    for (order, applied) in ledger.applied.iter().enumerate() {
        assert!(
            *applied <= 1,
            "{mode}: order {order} was refunded {applied} times"
        );
    }
    let j = SqliteJournal::open(&journal).unwrap();
    let records = futures::executor::block_on(j.recent(10_000)).unwrap();
    assert!(records.len() >= INTENTS as usize);
    for r in &records {
        assert!(
            r.state.is_terminal(),
            "{mode}: intent {} left {} after the final run",
            r.id,
            r.state
        );
        let order: usize =
            serde_json::from_str::<serde_json::Value>(&r.canonical_args).unwrap()["order"]
                .as_u64()
                .unwrap() as usize;
        if r.state == IntentState::Acked {
            assert_eq!(
                ledger.applied[order], 1,
                "{mode}: order {order} ACKED without its effect"
            );
            out.acked += 1;
        }
        if r.state == IntentState::DeadLetter {
            out.dead_lettered += 1;
        }
    }
    assert!(out.acked > 0, "{mode}: nothing was ever acknowledged");
    out
}

#[test]
fn sigkilled_hosts_never_apply_an_intent_twice() {
    let mut kills = 0;
    let mut in_flight = 0;
    for (mode, honours_keys) in [("idempotent", true), ("probe", false)] {
        let out = scenario(mode, honours_keys);
        println!(
            "{mode}: {} kills in {} runs, {} intents found in flight at restart; \
             {} of {INTENTS} intents ACKED, {} DEAD_LETTER",
            out.kills, out.runs, out.in_flight_at_restart, out.acked, out.dead_lettered
        );
        kills += out.kills;
        in_flight += out.in_flight_at_restart;
    }
    assert!(kills >= 50, "only {kills} kills");
    // Kills landed between dispatch and acknowledgement, the case that matters.
    assert!(
        in_flight > 0,
        "no kill landed while an intent was in flight"
    );
}

#[test]
fn a_second_process_cannot_open_a_journal_held_for_writing() {
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal.db");
    let _held = SqliteJournal::open(&journal).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_ring0-journal-crash-worker"))
        .args([
            journal.to_str().unwrap(),
            "127.0.0.1:9",
            "idempotent",
            "1",
            "0",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("is open for writing by another process"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("pid {}", std::process::id())),
        "{stderr}"
    );
}
