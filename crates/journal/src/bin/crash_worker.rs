//! Test fixture for the real-crash test (`tests/crash.rs`): a host that performs mutating calls
//! against a counting HTTP service through the SQLite journal, following the kernel's protocol,
//! and that the test SIGKILLs at random points.
//!
//! Each run: open the journal (the lock of a killed predecessor is gone with it), recover what
//! the log says is open, then propose every intent again with fresh call ids (the model has
//! forgotten everything) and drive what gets recorded. Prints `done` when all intents are
//! decided.
//!
//! Usage: `ring0-journal-crash-worker <journal> <127.0.0.1:port> <idempotent|probe> <intents> <run>`
//!
//! The service speaks HTTP/1.1 with `Connection: close`; both ends belong to the test, so a few
//! lines of request writing and status parsing stand in for an HTTP client library here.

use async_trait::async_trait;
use futures::executor::block_on;
use ring0_core::receipt::{CallOutcome, Disposition};
use ring0_core::{Observation, Receipt, SemanticKey, Settlement, canonical};
use ring0_journal::{
    DispatchOutcome, Executor, FailureClass, IntentRecord, Journal, JournalError, ProbeFinding,
    Proposal, ProposeDecision, RecoveryPolicy, SqliteJournal, drive, recover,
};
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long the worker waits for the service's answer; the request's deadline is the same.
const REQUEST_TIMEOUT_MS: u64 = 60;
/// Margin added to a deadline before a probe trusts that a request can no longer land.
const DEADLINE_MARGIN_MS: u64 = 20;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

struct Http {
    addr: SocketAddr,
    settlement: Settlement,
}

enum Answer {
    Status(u16, String),
    Failed(FailureClass),
}

impl Http {
    fn request(&self, method: &str, path: &str, headers: &[(&str, String)]) -> Answer {
        let timeout = Duration::from_millis(REQUEST_TIMEOUT_MS);
        let mut stream = match TcpStream::connect_timeout(&self.addr, timeout) {
            Ok(s) => s,
            Err(_) => return Answer::Failed(FailureClass::ConnectionRefused),
        };
        let _ = stream.set_read_timeout(Some(timeout));
        let _ = stream.set_write_timeout(Some(timeout));
        let mut req =
            format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n");
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("Content-Length: 0\r\n\r\n");
        if stream.write_all(req.as_bytes()).is_err() {
            return Answer::Failed(FailureClass::ConnectionLost);
        }
        let mut buf = Vec::new();
        match stream.read_to_end(&mut buf) {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Answer::Failed(FailureClass::Timeout);
            }
            Err(_) => return Answer::Failed(FailureClass::ConnectionLost),
        }
        let text = String::from_utf8_lossy(&buf);
        let Some((head, body)) = text.split_once("\r\n\r\n") else {
            return Answer::Failed(FailureClass::ConnectionLost);
        };
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        Answer::Status(status, body.to_string())
    }

    fn order(record: &IntentRecord) -> u64 {
        let args: Value = serde_json::from_str(&record.canonical_args).unwrap_or_default();
        args["order"].as_u64().unwrap_or(u64::MAX)
    }

    fn state(&self, order: u64) -> Option<Value> {
        for _ in 0..50 {
            if let Answer::Status(200, body) = self.request("GET", &format!("/state/{order}"), &[])
            {
                return serde_json::from_str(&body).ok();
            }
        }
        None
    }
}

fn receipt(record: &IntentRecord, text: &str) -> Receipt {
    Receipt::new(
        record.last_call_id().to_string(),
        0,
        record.tool.clone(),
        Disposition::Dispatched,
        CallOutcome::Completed {
            observation: Observation::text(text),
        },
    )
}

#[async_trait]
impl Executor for Http {
    fn settlement(&self, _: &IntentRecord) -> Settlement {
        self.settlement
    }

    /// The order's version and the deadline the request will carry: a probe compares against
    /// the version only after the deadline, when the request can no longer land.
    async fn snapshot(&self, record: &IntentRecord) -> Option<Value> {
        if self.settlement != Settlement::Probe {
            return None;
        }
        let state = self.state(Self::order(record))?;
        Some(json!({
            "version": state["version"],
            "deadline_ms": now_ms() + REQUEST_TIMEOUT_MS,
        }))
    }

    async fn dispatch(&self, record: &IntentRecord) -> DispatchOutcome {
        let deadline = record
            .snapshot
            .as_ref()
            .and_then(|s| s["deadline_ms"].as_u64())
            .unwrap_or_else(|| now_ms() + REQUEST_TIMEOUT_MS);
        let headers = [
            ("Idempotency-Key", record.idempotency_key.clone()),
            ("X-Deadline-Ms", deadline.to_string()),
        ];
        let path = format!("/refund/{}", Self::order(record));
        match self.request("POST", &path, &headers) {
            Answer::Status(200, body) => DispatchOutcome::Applied(receipt(record, &body)),
            Answer::Status(status @ 400..=499, body) => DispatchOutcome::Failed {
                class: FailureClass::NotApplied,
                receipt: receipt(record, &format!("{status} {body}")),
            },
            Answer::Status(status, body) => DispatchOutcome::Failed {
                class: FailureClass::Unknown,
                receipt: receipt(record, &format!("{status} {body}")),
            },
            Answer::Failed(class) => DispatchOutcome::Failed {
                class,
                receipt: receipt(record, "no answer"),
            },
        }
    }

    async fn probe(&self, record: &IntentRecord) -> ProbeFinding {
        let Some(snapshot) = &record.snapshot else {
            return ProbeFinding::Indeterminate("no snapshot".into());
        };
        let deadline = snapshot["deadline_ms"].as_u64().unwrap_or(u64::MAX);
        let wait = (deadline + DEADLINE_MARGIN_MS).saturating_sub(now_ms());
        std::thread::sleep(Duration::from_millis(wait.min(1_000)));
        let Some(state) = self.state(Self::order(record)) else {
            return ProbeFinding::Indeterminate("the service could not be probed".into());
        };
        if state["applied"].as_u64().unwrap_or(0) > 0 {
            ProbeFinding::Applied(Box::new(Observation {
                structured: Some(state),
                ..Observation::text("the refund is there")
            }))
        } else if state["version"] == snapshot["version"] {
            ProbeFinding::Unchanged
        } else {
            ProbeFinding::Indeterminate(format!("order changed: {state}"))
        }
    }
}

fn proposal(scope: &str, order: u64) -> Proposal {
    let args = json!({"order": order, "amount": 5});
    Proposal {
        intent_id: None,
        semantic_key: SemanticKey::compute("refund", &args, scope, 0).expect("keyed"),
        scope: scope.into(),
        attempt_epoch: 0,
        tool: "refund".into(),
        canonical_args: canonical::canonical_string(&args).expect("canonical"),
        call_id: format!("call_{}", uuid::Uuid::new_v4().simple()),
        mutating: true,
        client_key: None,
        principal: None,
    }
}

fn open(path: &str) -> Result<SqliteJournal, JournalError> {
    // A killed predecessor's lock goes with its process; a short wait covers the moment the
    // test reaps it.
    let mut last = None;
    for _ in 0..100 {
        match SqliteJournal::open(path) {
            Err(e @ JournalError::Locked { .. }) => {
                last = Some(e);
                std::thread::sleep(Duration::from_millis(10));
            }
            other => return other,
        }
    }
    Err(last.expect("tried at least once"))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 6 {
        eprintln!(
            "usage: {} <journal> <addr> <idempotent|probe> <intents> <run>",
            args[0]
        );
        std::process::exit(2);
    }
    let (path, addr, mode) = (&args[1], &args[2], &args[3]);
    let intents: u64 = args[4].parse().expect("intent count");
    let run: u64 = args[5].parse().expect("run number");
    let settlement = match mode.as_str() {
        "idempotent" => Settlement::IdempotencyKey,
        _ => Settlement::Probe,
    };
    let http = Http {
        addr: addr.parse().expect("service address"),
        settlement,
    };
    let journal = match open(path) {
        Ok(j) => j,
        Err(e) => {
            eprintln!("open: {e}");
            std::process::exit(3);
        }
    };
    let report = match block_on(recover(&journal, &http, RecoveryPolicy::default())) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("recover: {e}");
            std::process::exit(4);
        }
    };
    println!(
        "recovered examined={} in_flight={} resumed={}",
        report.examined, report.in_flight, report.resumed
    );
    let scope = format!("crash-test:{mode}");
    // A different order each run, so kills land on different intents.
    let mut order: Vec<u64> = (0..intents).collect();
    order.rotate_left((run % intents.max(1)) as usize);
    for n in order {
        let decision = match block_on(journal.propose(proposal(&scope, n))) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("propose: {e}");
                std::process::exit(5);
            }
        };
        if let ProposeDecision::Recorded(r) = decision
            && let Err(e) = block_on(drive(&journal, &http, r))
        {
            eprintln!("drive: {e}");
            std::process::exit(6);
        }
    }
    println!("done");
}
