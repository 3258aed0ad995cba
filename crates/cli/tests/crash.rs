//! Real crashes of the `ring0` binary: `ring0 serve` with its SQLite journal refunds orders
//! through an MCP upstream in front of a counting HTTP service, and is SIGKILLed at random
//! points (seeded), restarted, and asked for the same refunds again under the same scope. The
//! client's request ids are fresh in every run, and ring0's own call ids restart with each
//! process, so nothing but the intent identifies a refund. Whatever the kill points:
//!
//! - no order is refunded twice at the service;
//! - after a last uninterrupted run no intent is left RECORDED, DISPATCHED, UNKNOWN or
//!   RECONCILING, and every ACKED refund happened exactly once;
//! - a refund ACKED before the last run is replayed from the journal in it, not sent again.
//!
//! Two scenarios: a service that honours `Idempotency-Key` (settlement `idempotency_key`: an
//! ambiguous refund is sent again with the same key), and one that does not (settlement
//! `probe`: the upstream's `refund_status` tool decides). The upstream is
//! `tests/fixtures/counter_upstream.py` (standard library only; `python3` must be installed).
//!
//! The service is written here with std (one thread per connection, `Connection: close`): it
//! applies a refund under a lock as soon as the request is read, answers after a random delay,
//! and sometimes drops the connection instead of answering (a lost ack). In the probe scenario
//! the upstream stamps each request with a deadline and the service refuses a request that
//! arrives later, so a refund sent by a killed process can never land after the probe looked —
//! the condition under which a probe's "unchanged" is sound.

use ring0_core::IntentState;
use ring0_core::receipt::Disposition;
use ring0_journal::{IntentRecord, JournalReader};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Kills per scenario; two scenarios make a test run's kills.
const KILLS_PER_SCENARIO: u32 = 28;
/// Orders in all: one refund intent each.
const ORDERS: u64 = 60;
/// Orders the first run is asked to refund.
const FIRST_RUN_ORDERS: u64 = 3;
/// Each run asks for the refunds of earlier runs again and this many new ones, so that kills
/// keep landing on real work rather than on replays.
const NEW_ORDERS_PER_RUN: u64 = 2;
/// One run in four is killed within this long after it started (start-up and recovery)…
const KILL_AFTER_SPAWN_MS_MAX: u64 = 600;
/// … the others within this long after ring0 answered `initialize` (among the calls).
const KILL_AFTER_READY_MS_MAX: u64 = 250;
/// Most runs per scenario (kills plus runs that finished before their kill time).
const RUNS_MAX: u32 = 120;
/// Longest a run may go without an answer before the test calls it a hang.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);
/// How far ahead of sending the upstream stamps its deadline (probe scenario); the probe waits
/// this long before it looks.
const DEADLINE_MS: u64 = 100;
/// The service answers a refund up to this long after applying it: the window in which a kill
/// leaves an intent in flight.
const ANSWER_DELAY_MS_MAX: u64 = 150;
/// The stdio session's scope: the same in every run, so a refund is the same intent.
const SCOPE: &str = "crash-test";
const TOOL: &str = "ctr__refund";

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

#[derive(Default)]
struct Ledger {
    /// Refunds applied, by order.
    applied: Vec<u32>,
    seen_keys: HashSet<String>,
    /// Refund requests received (applied or not).
    posts: u64,
}

/// How the counting service behaves.
#[derive(Clone, Copy)]
struct Behaviour {
    /// Deduplicate refunds by their `Idempotency-Key`.
    honours_keys: bool,
    /// Refunds (applied) whose answer is dropped, in percent.
    ack_loss_percent: u64,
    /// Reads (the probe's) answer HTTP 500.
    reads_fail: bool,
}

impl Default for Behaviour {
    fn default() -> Self {
        Self {
            honours_keys: false,
            ack_loss_percent: 10,
            reads_fail: false,
        }
    }
}

/// The counting service.
struct Service {
    addr: SocketAddr,
    ledger: Arc<Mutex<Ledger>>,
    stop: Arc<AtomicBool>,
}

impl Service {
    fn start(behaviour: Behaviour, seed: u64) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let ledger = Arc::new(Mutex::new(Ledger {
            applied: vec![0; ORDERS as usize],
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
                std::thread::spawn(move || serve(conn, &l, behaviour, mix(seed ^ n)));
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

fn serve(conn: TcpStream, ledger: &Mutex<Ledger>, behaviour: Behaviour, dice: u64) {
    let honours_keys = behaviour.honours_keys;
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
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
        if reader.read_line(&mut h).unwrap_or(0) == 0 {
            return; // the request never ended: nothing is applied
        }
        if h == "\r\n" {
            break;
        }
        if let Some((name, value)) = h.split_once(':') {
            match name.trim().to_ascii_lowercase().as_str() {
                "idempotency-key" => key = value.trim().to_string(),
                "x-deadline-ms" => deadline = value.trim().parse().unwrap_or(0),
                _ => {}
            }
        }
    }
    let order: usize = path
        .strip_prefix("/refund/")
        .and_then(|n| n.parse().ok())
        .unwrap_or(usize::MAX);
    let (status, body) = {
        let mut l = ledger.lock().unwrap();
        if method == "POST" {
            l.posts += 1;
        }
        if order >= l.applied.len() {
            (404, "{}".to_string())
        } else if method == "GET" && behaviour.reads_fail {
            (500, "{\"error\":\"reads are down\"}".to_string())
        } else if method == "GET" {
            (200, format!("{{\"applied\":{}}}", l.applied[order]))
        } else if honours_keys && !key.is_empty() && l.seen_keys.contains(&key) {
            (
                200,
                format!("{{\"applied\":{},\"replayed\":true}}", l.applied[order]),
            )
        } else if now_ms() > deadline {
            (408, "{\"error\":\"deadline passed; not applied\"}".into())
        } else {
            l.applied[order] += 1;
            if honours_keys && !key.is_empty() {
                l.seen_keys.insert(key);
            }
            (200, format!("{{\"applied\":{}}}", l.applied[order]))
        }
    };
    if method == "POST" {
        // Answer late, or not at all: the effect above is already applied.
        std::thread::sleep(Duration::from_millis(dice % ANSWER_DELAY_MS_MAX));
        if dice % 100 < behaviour.ack_loss_percent {
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

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/counter_upstream.py")
}

fn write_config(dir: &Path, service: SocketAddr, probe: bool) -> PathBuf {
    let mut args = vec![
        fixture().display().to_string(),
        "--service".into(),
        service.to_string(),
    ];
    let settlement = if probe {
        args.extend(["--deadline-ms".into(), DEADLINE_MS.to_string()]);
        "settlement = \"probe\"\nprobe = \"refund_status\""
    } else {
        "settlement = \"idempotency_key\""
    };
    let text = format!(
        r#"defaults = false
# The counter upstream posts to the test's counting service on a loopback port: a network
# a stdio upstream's default sandbox does not give (its egress goes through no proxy yet).
[sandbox]
upstreams = {{ ctr = "off" }}

[[grants]]
name = "counter"
tools = ["ctr__*"]
ceiling = "A2"

[[upstreams]]
alias = "ctr"
command = "python3"
args = {args:?}
env = ["PATH"]

[upstreams.tools.refund]
effect = "non_idempotent"
authority = "A2"
strategy = ["exploitation"]
{settlement}

[upstreams.tools.refund_status]
effect = "nullipotent"
authority = "A0"
strategy = ["exploration"]
"#
    );
    let path = dir.join("ring0.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// What one run of `ring0 serve` did.
struct Run {
    killed: bool,
    /// How long ring0 took to answer `initialize` (start, recovery, upstream connected).
    ready: Option<Duration>,
    /// Answers by order, for the refunds answered before the run ended.
    answers: BTreeMap<u64, Value>,
    stderr: String,
}

fn send(stdin: &mut impl Write, message: &Value) -> bool {
    writeln!(stdin, "{message}")
        .and_then(|_| stdin.flush())
        .is_ok()
}

/// The response to request `id`, or `None` once ring0's stdout closed (it was killed).
fn answer(messages: &Receiver<Value>, id: &str) -> Option<Value> {
    loop {
        match messages.recv_timeout(ANSWER_TIMEOUT) {
            Ok(m) if m["id"] == json!(id) && m.get("method").is_none() => return Some(m),
            Ok(_) => continue, // notifications
            Err(RecvTimeoutError::Disconnected) => return None,
            Err(RecvTimeoutError::Timeout) => panic!("no answer to {id} within {ANSWER_TIMEOUT:?}"),
        }
    }
}

/// When a run is killed.
#[derive(Clone, Copy)]
enum KillPoint {
    /// This long after the process started: lands in start-up and recovery.
    AfterSpawn(Duration),
    /// This long after ring0 answered `initialize`: lands among the calls.
    AfterReady(Duration),
}

/// Runs `ring0 serve` once, asks it for the refunds of `orders` in turn, and SIGKILLs it at
/// `kill` if it is still running then.
fn run_ring0(dir: &Path, config: &Path, run: u32, orders: &[u64], kill: Option<KillPoint>) -> Run {
    let stderr_path = dir.join(format!("run-{run}.stderr"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_ring0"))
        .args(["serve", "--scope", SCOPE, "--config"])
        .arg(config)
        .current_dir(dir)
        .env("RING0_STATE_DIR", std::path::Path::new(dir).join(".ring0"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .spawn()
        .expect("ring0 serve");
    let mut stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, messages) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                let _ = tx.send(v);
            }
        }
    });
    let child: Arc<Mutex<Child>> = Arc::new(Mutex::new(child));
    let finished = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = channel::<()>();
    let killer = kill.map(|kill| {
        let (child, finished) = (child.clone(), finished.clone());
        std::thread::spawn(move || {
            let delay = match kill {
                KillPoint::AfterSpawn(d) => d,
                KillPoint::AfterReady(d) => {
                    // Counted from the moment ring0 is serving; a run that ends first is not killed.
                    if ready_rx.recv().is_err() {
                        return false;
                    }
                    d
                }
            };
            std::thread::sleep(delay);
            let mut c = child.lock().unwrap();
            if finished.load(Ordering::SeqCst) || c.try_wait().unwrap().is_some() {
                return false;
            }
            c.kill().unwrap(); // SIGKILL
            true
        })
    });
    let mut answers = BTreeMap::new();
    let mut ready = None;
    let spawned = Instant::now();
    let init = json!({"jsonrpc": "2.0", "id": format!("r{run}-init"), "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "crash-test", "version": "1"}}});
    if send(&mut stdin, &init) && answer(&messages, &format!("r{run}-init")).is_some() {
        ready = Some(spawned.elapsed());
        let _ = ready_tx.send(());
        send(
            &mut stdin,
            &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        );
        for &order in orders {
            // A fresh request id in every run: the client's ids are not what identifies a refund.
            let id = format!("r{run}-o{order}");
            // One idempotency key per refund: a refund asked for again in a later run is the
            // same logical call (a retry), whatever became of the earlier run's answer.
            let call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": {"name": TOOL, "arguments": {"order": order},
                           "_meta": {"io.ring0/idempotency-key": format!("refund-{order}")}}});
            if !send(&mut stdin, &call) {
                break;
            }
            match answer(&messages, &id) {
                Some(a) => {
                    answers.insert(order, a);
                }
                None => break,
            }
        }
    }
    drop(stdin); // end of input: an unkilled ring0 exits
    finished.store(true, Ordering::SeqCst);
    drop(ready_tx);
    let killed = killer.is_some_and(|k| k.join().unwrap());
    let started = Instant::now();
    let status = loop {
        if let Some(s) = child.lock().unwrap().try_wait().unwrap() {
            break s;
        }
        assert!(
            started.elapsed() < ANSWER_TIMEOUT,
            "ring0 did not exit after its input ended"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
    assert!(
        killed || status.success(),
        "run {run} failed ({status}):\n{stderr}"
    );
    Run {
        killed,
        ready,
        answers,
        stderr,
    }
}

fn order_of(r: &IntentRecord) -> u64 {
    serde_json::from_str::<Value>(&r.canonical_args).unwrap()["order"]
        .as_u64()
        .unwrap()
}

fn records(journal: &Path) -> Vec<IntentRecord> {
    let reader = JournalReader::open(journal).unwrap();
    let all = reader.recent(10_000).unwrap();
    all.into_iter().filter(|r| r.tool == TOOL).collect()
}

/// The receipt summary ring0 attaches to a tools/call result.
fn disposition(answer: &Value) -> Option<Disposition> {
    serde_json::from_value(
        answer
            .pointer("/result/_meta/io.ring0~1receipt/disposition")?
            .clone(),
    )
    .ok()
}

struct Outcome {
    kills: u32,
    runs: u32,
    in_flight_at_restart: u64,
    acked: usize,
    dead_lettered: usize,
    failed: usize,
    replayed: usize,
    /// Intents settled after an ambiguous outcome (their timeline passes through RECONCILING).
    reconciled: usize,
    posts: u64,
    /// Runs killed before ring0 answered `initialize`.
    killed_starting: u32,
    ready_ms_max: u64,
}

fn in_flight(stderr: &str) -> u64 {
    // "ring0: recovered N open intent(s) from the journal: X in flight reconciled, …"
    stderr
        .lines()
        .filter_map(|l| l.split("journal: ").nth(1))
        .filter_map(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

fn scenario(name: &str, probe: bool, seed: u64) -> Outcome {
    let service = Service::start(
        Behaviour {
            honours_keys: !probe,
            ..Behaviour::default()
        },
        seed,
    );
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), service.addr, probe);
    let journal = dir.path().join(".ring0/journal.db");
    let mut out = Outcome {
        kills: 0,
        runs: 0,
        in_flight_at_restart: 0,
        acked: 0,
        dead_lettered: 0,
        failed: 0,
        replayed: 0,
        reconciled: 0,
        posts: 0,
        killed_starting: 0,
        ready_ms_max: 0,
    };
    while out.kills < KILLS_PER_SCENARIO {
        assert!(
            out.runs < RUNS_MAX,
            "{name}: {} runs without {KILLS_PER_SCENARIO} kills",
            out.runs
        );
        let known = (FIRST_RUN_ORDERS + NEW_ORDERS_PER_RUN * u64::from(out.runs)).min(ORDERS);
        // Newest first, so that a kill early in a run still lands on work not done before.
        let orders: Vec<u64> = (0..known).rev().collect();
        let dice = mix(seed ^ 0xc4a5 ^ u64::from(out.runs));
        let kill = if dice.is_multiple_of(4) {
            KillPoint::AfterSpawn(Duration::from_millis(dice % KILL_AFTER_SPAWN_MS_MAX))
        } else {
            KillPoint::AfterReady(Duration::from_millis(dice % KILL_AFTER_READY_MS_MAX))
        };
        let run = run_ring0(dir.path(), &config, out.runs, &orders, Some(kill));
        out.runs += 1;
        out.kills += u32::from(run.killed);
        out.killed_starting += u32::from(run.killed && run.ready.is_none());
        if let Some(r) = run.ready {
            out.ready_ms_max = out.ready_ms_max.max(r.as_millis() as u64);
        }
        out.in_flight_at_restart += in_flight(&run.stderr);
    }

    // The last run is not killed: it recovers what the last kill left open, then asks for
    // every refund again.
    let before: BTreeMap<u64, IntentRecord> = records(&journal)
        .into_iter()
        .filter(|r| r.state == IntentState::Acked)
        .map(|r| (order_of(&r), r))
        .collect();
    let all: Vec<u64> = (0..ORDERS).collect();
    let last = run_ring0(dir.path(), &config, out.runs, &all, None);
    out.in_flight_at_restart += in_flight(&last.stderr);
    assert_eq!(
        last.answers.len(),
        ORDERS as usize,
        "{name}: the last run answered every call:\n{}",
        last.stderr
    );

    let ledger = service.ledger.lock().unwrap();
    out.posts = ledger.posts;
    for (order, applied) in ledger.applied.iter().enumerate() {
        assert!(
            *applied <= 1,
            "{name}: order {order} was refunded {applied} times"
        );
    }
    let after = records(&journal);
    let mut keys = HashSet::new();
    for r in &after {
        let order = order_of(r);
        assert!(
            keys.insert(r.semantic_key),
            "{name}: two records for one intent"
        );
        assert!(
            !matches!(
                r.state,
                IntentState::Proposed
                    | IntentState::Recorded
                    | IntentState::Dispatched
                    | IntentState::Unknown
                    | IntentState::Reconciling
            ),
            "{name}: order {order} left {} after the last run",
            r.state
        );
        if r.timeline
            .iter()
            .any(|t| t.state == IntentState::Reconciling)
        {
            out.reconciled += 1;
        }
        match r.state {
            IntentState::Acked => {
                assert_eq!(
                    ledger.applied[order as usize], 1,
                    "{name}: order {order} ACKED without its refund"
                );
                out.acked += 1;
            }
            IntentState::DeadLetter => out.dead_lettered += 1,
            IntentState::Failed => out.failed += 1,
            _ => {}
        }
    }
    for (order, was) in &before {
        let now = after.iter().find(|r| r.id == was.id).unwrap();
        assert_eq!(
            (now.state, now.fence, now.attempts),
            (was.state, was.fence, was.attempts),
            "{name}: order {order}, ACKED before the last run, was touched again"
        );
        assert_eq!(
            disposition(&last.answers[order]),
            Some(Disposition::Replayed),
            "{name}: order {order} was not replayed: {}",
            last.answers[order]
        );
        out.replayed += 1;
    }
    assert!(out.acked > 0, "{name}: nothing was ever acknowledged");
    out
}

#[test]
fn a_sigkilled_ring0_never_refunds_an_order_twice() {
    let mut kills = 0;
    let mut in_flight = 0;
    let mut reconciled = 0;
    for (name, probe, seed) in [
        ("idempotency_key", false, 0x5eed_0001),
        ("probe", true, 0x5eed_0002),
    ] {
        let out = scenario(name, probe, seed);
        println!(
            "{name}: {} kills in {} runs ({} before ring0 was ready; ready within {} ms), {} \
             intents found in flight at restart; {} refund requests at the service; of {ORDERS} \
             intents {} ACKED ({} replayed in the last run), {} DEAD_LETTER, {} FAILED; {} settled \
             after an ambiguous outcome",
            out.kills,
            out.runs,
            out.killed_starting,
            out.ready_ms_max,
            out.in_flight_at_restart,
            out.posts,
            out.acked,
            out.replayed,
            out.dead_lettered,
            out.failed,
            out.reconciled
        );
        reconciled += out.reconciled;
        kills += out.kills;
        in_flight += out.in_flight_at_restart;
    }
    assert!(kills >= 50, "only {kills} kills");
    // Kills landed between dispatch and acknowledgement, the case that matters.
    assert!(
        in_flight > 0,
        "no kill landed while an intent was in flight"
    );
    // Lost acknowledgements and kills in flight were settled by re-dispatch or probe.
    assert!(reconciled > 0, "no intent was ever reconciled");
}

/// One `ring0 serve` run against a service that loses every acknowledgement, with the probe
/// scenario's config; returns the answer to one refund and the journal's record of it.
fn one_lost_ack(reads_fail: bool) -> (Value, IntentRecord, u32, Value) {
    let service = Service::start(
        Behaviour {
            ack_loss_percent: 100,
            reads_fail,
            ..Behaviour::default()
        },
        7,
    );
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), service.addr, true);
    let first = run_ring0(dir.path(), &config, 0, &[5], None);
    let again = run_ring0(dir.path(), &config, 1, &[5], None);
    let mut records = records(&dir.path().join(".ring0/journal.db"));
    assert_eq!(records.len(), 1, "one intent");
    let applied = service.ledger.lock().unwrap().applied[5];
    (
        first.answers[&5].clone(),
        records.remove(0),
        applied,
        again.answers[&5].clone(),
    )
}

#[test]
fn a_lost_acknowledgement_is_settled_by_the_probe_without_a_second_refund() {
    let (answer, record, applied, again) = one_lost_ack(false);
    assert_eq!(applied, 1);
    assert_eq!(record.state, IntentState::Acked, "{answer}");
    assert_eq!(record.attempts, 1, "sent once");
    assert_eq!(
        disposition(&answer),
        Some(Disposition::Recovered),
        "{answer}"
    );
    assert_eq!(disposition(&again), Some(Disposition::Replayed), "{again}");
}

#[test]
fn an_inconclusive_probe_leaves_the_refund_to_a_person() {
    let (answer, record, applied, again) = one_lost_ack(true);
    assert_eq!(applied, 1);
    assert_eq!(record.state, IntentState::DeadLetter, "{answer}");
    assert_eq!(answer["result"]["isError"], json!(true), "{answer}");
    // Asked again, it is refused rather than sent a second time.
    assert_eq!(again["result"]["isError"], json!(true), "{again}");
    assert_eq!(record.attempts, 1, "sent once");
}
