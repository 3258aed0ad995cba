//! Three `ring0 serve --http` replicas on one PostgreSQL journal behind a round-robin TCP
//! proxy, real Python MCP SDK clients (tests/fixtures/py_client_replicas.py) making keyed
//! mutating calls through it and re-issuing each on any error, while replicas are SIGKILLed at
//! random and restarted and PostgreSQL itself is restarted once mid-run.
//!
//! What a user would notice is checked: every logical call is answered, and each has exactly
//! one effect (the counting upstream, tests/fixtures/counting_upstream.py, appends one line per
//! applied idempotency key); once the replicas are up again, no record is left open by a dead
//! replica or UNKNOWN. The run prints the kills, the calls, their re-issues and the records
//! recovered from dead replicas.
//!
//! The number of kills is `RING0_REPLICA_KILLS` (default [`KILLS_DEFAULT`]); a longer soak is
//! `scripts/soak-replicas.sh`. The test runs on a PostgreSQL cluster of its own (it restarts
//! it), started by the script that starts the shared test database; without that database it is
//! skipped, and under CI it fails.

mod common;
mod replica_support;

use common::*;
use replica_support::*;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// SIGKILLs in one run of the test.
const KILLS_DEFAULT: usize = 200;
/// Replicas behind the proxy.
const REPLICAS: usize = 3;
/// Replicas left listening at least: the last one listening is not killed.
const UP_MIN: usize = 1;
/// Python clients making calls at once.
const WORKERS: usize = 4;
/// Longest the whole run may take before the test fails (kills, then the clients' last calls).
const RUN_WAIT: Duration = Duration::from_secs(600);
/// Longest recovery may take once every replica is up again.
const RECOVERY_WAIT: Duration = Duration::from_secs(60);

/// The states of a record not yet settled.
const OPEN_STATES: &str = "('PROPOSED', 'RECORDED', 'DISPATCHED', 'UNKNOWN', 'RECONCILING')";

fn kills() -> usize {
    std::env::var("RING0_REPLICA_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(KILLS_DEFAULT)
}

/// One replica's place: its process (starting or listening), its address once it listens
/// (where the proxy sends new connections), and which start it is.
#[derive(Default)]
struct Slot {
    child: Option<Child>,
    addr: Option<String>,
    start: u64,
    /// This start replaced one killed while starting: it is left to finish starting.
    spared: bool,
}

type Slots = Arc<Vec<Mutex<Slot>>>;

/// Kills every replica when the test ends, passed or not (the proxy's thread keeps the slots).
struct Replicas(Slots);

impl Drop for Replicas {
    fn drop(&mut self) {
        for slot in self.0.iter() {
            let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
            slot.start += 1;
            if let Some(mut child) = slot.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// A round-robin TCP proxy on an ephemeral port: each client connection goes to the next
/// replica that listens and accepts it, bytes copied both ways until either side closes.
fn proxy(slots: Slots) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let next = Arc::new(AtomicUsize::new(0));
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let slots = slots.clone();
            let next = next.clone();
            std::thread::spawn(move || relay(client, &slots, &next));
        }
    });
    addr
}

fn relay(client: TcpStream, slots: &Slots, next: &AtomicUsize) {
    let upstream = (0..slots.len()).find_map(|_| {
        let i = next.fetch_add(1, Ordering::Relaxed) % slots.len();
        let addr = slots[i].lock().unwrap().addr.clone()?;
        TcpStream::connect(addr).ok()
    });
    let Some(upstream) = upstream else {
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    let (mut c_in, mut u_out) = (client.try_clone().unwrap(), upstream.try_clone().unwrap());
    let forward = std::thread::spawn(move || {
        let _ = std::io::copy(&mut c_in, &mut u_out);
        let _ = u_out.shutdown(Shutdown::Write);
    });
    let (mut u_in, mut c_out) = (upstream, client);
    let _ = std::io::copy(&mut u_in, &mut c_out);
    let _ = c_out.shutdown(Shutdown::Both);
    let _ = u_in.shutdown(Shutdown::Both);
    let _ = forward.join();
}

/// Starts replica `i` (start number `start`) in a thread of its own: its process is in the
/// slot at once (it may be killed while starting), its address once it listens. A process
/// that exits by itself before listening (the database restarting) is started again; one the
/// test killed is left to the start that replaced it.
fn start(dir: &Path, journal: &str, i: usize, start: u64, slots: &Slots) {
    let (dir, journal, slots) = (dir.to_path_buf(), journal.to_string(), slots.clone());
    let recovered = RECOVERED.clone();
    std::thread::spawn(move || {
        let deadline = Instant::now() + RUN_WAIT;
        loop {
            let mut child = replica_command(&dir, &format!("r{i}"), &journal)
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            let stderr = child.stderr.take().unwrap();
            {
                let mut slot = slots[i].lock().unwrap();
                if slot.start != start {
                    let _ = child.kill();
                    let _ = child.wait();
                    return;
                }
                slot.child = Some(child);
            }
            let (tx, rx) = std::sync::mpsc::channel();
            let recovered = recovered.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if let Some(rest) = line.split("listening on http://").nth(1) {
                        let _ = tx.send(rest.trim_end_matches("/mcp").to_string());
                    }
                    recovered.fetch_add(recovered_in(&line), Ordering::Relaxed);
                }
            });
            let listening = rx.recv_timeout(HTTP_WAIT);
            let mut slot = slots[i].lock().unwrap();
            if slot.start != start || slot.child.is_none() {
                return; // killed while starting: another start took its place
            }
            match listening {
                Ok(addr) => {
                    slot.addr = Some(addr);
                    slot.spared = false;
                    return;
                }
                Err(_) => {
                    let mut gone = slot.child.take().unwrap();
                    let _ = gone.kill();
                    let _ = gone.wait();
                }
            }
            drop(slot);
            assert!(Instant::now() < deadline, "replica r{i} never started");
            std::thread::sleep(Duration::from_millis(100));
        }
    });
}

/// Intents a replica's log says it recovered: "recovered N open intent(s) from the journal" at
/// start, "recovered N intent(s) another replica left open" while serving.
fn recovered_in(line: &str) -> usize {
    let Some(rest) = line.split("recovered ").nth(1) else {
        return 0;
    };
    if !line.contains("intent(s)") {
        return 0;
    }
    rest.split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Intents recovered by any replica in this run (there is one run per test process).
static RECOVERED: std::sync::LazyLock<Arc<AtomicUsize>> =
    std::sync::LazyLock::new(|| Arc::new(AtomicUsize::new(0)));

/// SIGKILLs replica `i` (listening or starting) and starts it again.
fn kill_and_restart(dir: &Path, journal: &str, i: usize, slots: &Slots) {
    let (child, next) = {
        let mut slot = slots[i].lock().unwrap();
        // A replica killed while starting comes back, and is then left to finish starting.
        slot.spared = slot.addr.is_none();
        slot.addr = None;
        slot.start += 1;
        (slot.child.take(), slot.start)
    };
    if let Some(mut child) = child {
        let _ = child.kill(); // SIGKILL
        let _ = child.wait();
    }
    start(dir, journal, i, next, slots);
}

/// Waits (bounded) until `n` replicas listen.
fn wait_listening(slots: &Slots, n: usize) {
    let deadline = Instant::now() + RUN_WAIT;
    while listening(slots).len() < n {
        assert!(Instant::now() < deadline, "replicas never came back up");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn listening(slots: &Slots) -> Vec<usize> {
    (0..slots.len())
        .filter(|i| slots[*i].lock().unwrap().addr.is_some())
        .collect()
}

/// A small deterministic generator for the kill schedule (its seed is printed).
struct Schedule(u64);

impl Schedule {
    fn next(&mut self, below: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % below
    }
}

/// The report the clients printed (to `client.out`; `client.err` holds what they logged).
fn report_of(dir: &Path) -> Value {
    let stdout = std::fs::read_to_string(dir.join("client.out")).unwrap_or_default();
    serde_json::from_str(stdout.trim()).unwrap_or_else(|_| {
        let stderr = std::fs::read(dir.join("client.err")).unwrap_or_default();
        let tail = String::from_utf8_lossy(&stderr[stderr.len().saturating_sub(8192)..]);
        panic!("the client printed no report:\n{stdout}\n… {tail}")
    })
}

#[test]
fn replicas_killed_at_random_leave_every_keyed_call_answered_with_exactly_one_effect() {
    let Some(cluster) = OwnCluster::start() else {
        return;
    };
    let Some(peers) = peers() else { return };
    let journal = schema_in(&cluster.url);
    // One upstream for every replica, over HTTP: it outlives the replicas (a call a killed
    // replica sent may still land), and a replica restarts without starting one.
    let dir = tempfile::tempdir().unwrap();
    let upstream = HttpUpstream::start(&peers, dir.path());
    write_config(dir.path(), &format!("url = {:?}", upstream.url), "A2", "");
    let slots: Slots = Arc::new((0..REPLICAS).map(|_| Mutex::default()).collect());
    let _replicas = Replicas(slots.clone());
    for i in 0..REPLICAS {
        start(dir.path(), &journal, i, 0, &slots);
    }
    wait_listening(&slots, REPLICAS);
    let front = proxy(slots.clone());
    let stop = dir.path().join("stop");
    // The clients' output goes to files, not pipes: a run of hundreds of kills logs more than a
    // pipe holds, and a client blocked writing to one would never finish.
    let output = |name: &str| Stdio::from(std::fs::File::create(dir.path().join(name)).unwrap());
    let client = Command::new(python(&peers))
        .arg(fixtures().join("py_client_replicas.py"))
        .arg(format!("http://{front}/mcp"))
        .arg(WORKERS.to_string())
        .arg(&stop)
        .stdin(Stdio::null())
        .stdout(output("client.out"))
        .stderr(output("client.err"))
        .spawn()
        .unwrap();
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    eprintln!("kill schedule seed {seed}");
    let mut schedule = Schedule(seed);
    let kills = kills();
    let started = Instant::now();
    let mut killed_listening = 0;
    for k in 0..kills {
        // A listening replica at random while more than UP_MIN listen (the clients always
        // have somewhere to go), else one still starting (once: its next start is spared).
        let deadline = Instant::now() + RUN_WAIT;
        let victim = loop {
            let up = listening(&slots);
            let candidates: Vec<usize> = if up.len() > UP_MIN {
                up
            } else {
                (0..REPLICAS)
                    .filter(|i| !up.contains(i) && !slots[*i].lock().unwrap().spared)
                    .collect()
            };
            if !candidates.is_empty() {
                break candidates[schedule.next(candidates.len() as u64) as usize];
            }
            assert!(Instant::now() < deadline, "no replica came back up");
            std::thread::sleep(Duration::from_millis(10));
        };
        if slots[victim].lock().unwrap().addr.is_some() {
            killed_listening += 1;
        }
        kill_and_restart(dir.path(), &journal, victim, &slots);
        if k == kills / 2 {
            cluster.restart();
            eprintln!("PostgreSQL restarted after {k} kills");
        }
        // The next kill comes after a pause of 50 to 250 ms (a chaos schedule, not a timing
        // assumption: nothing is asserted about when anything happens).
        std::thread::sleep(Duration::from_millis(50 + schedule.next(200)));
    }
    wait_listening(&slots, REPLICAS);
    let killing = started.elapsed();
    std::fs::write(&stop, "").unwrap();
    let deadline = Instant::now() + RUN_WAIT;
    let mut client = client;
    while client.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the clients never finished");
        std::thread::sleep(Duration::from_millis(50));
    }
    let report = report_of(dir.path());
    for error in report["errors"].as_array().into_iter().flatten() {
        eprintln!("a client re-issued after: {error}");
    }
    let answered: Vec<&str> = report["answered"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(report["unanswered"], serde_json::json!([]), "{report}");
    assert!(!answered.is_empty(), "{report}");
    // Every replica is up: what dead replicas left open is recovered by the live ones.
    let open_sql = format!("SELECT count(*) FROM intents WHERE state IN {OPEN_STATES}");
    let deadline = Instant::now() + RECOVERY_WAIT;
    while sql_count(&journal, &open_sql) > 0 {
        assert!(
            Instant::now() < deadline,
            "records left open: {}",
            sql_count(&journal, &open_sql)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let effects = effects_by_text(dir.path());
    let doubled: Vec<_> = effects.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        doubled.is_empty(),
        "calls with more than one effect: {doubled:?}"
    );
    for key in &answered {
        assert_eq!(effects.get(*key), Some(&1), "{key} has no effect");
    }
    assert_eq!(effects.len(), answered.len(), "an effect no call asked for");
    let count = |sql: &str| sql_count(&journal, sql);
    assert_eq!(
        count("SELECT count(*) FROM intents WHERE state IN ('UNKNOWN', 'DEAD_LETTER')"),
        0
    );
    assert_eq!(
        count(&format!(
            "SELECT count(*) FROM intents i LEFT JOIN replicas r ON r.incarnation = i.holder
             WHERE i.state IN {OPEN_STATES}
               AND (r.incarnation IS NULL OR r.lease_until < clock_timestamp())"
        )),
        0,
        "a record is held by a dead replica"
    );
    let recovered = RECOVERED.load(Ordering::Relaxed);
    let dispatches = std::fs::read_to_string(dir.path().join("dispatches.log"))
        .unwrap_or_default()
        .lines()
        .count();
    eprintln!(
        "{kills} SIGKILLs ({killed_listening} of a listening replica, the rest while starting) \
         over {:.1}s and one PostgreSQL restart; {} logical calls answered ({} re-issued after \
         errors), each with exactly one effect ({} dispatches reached the upstream); \
         {recovered} open records recovered from dead replicas (their leases lapsed)",
        killing.as_secs_f64(),
        answered.len(),
        report["reissued"],
        dispatches,
    );
}
