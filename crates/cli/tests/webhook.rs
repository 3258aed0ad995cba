//! Durable approvals and the webhook channel, through the real binary: a call held for a
//! person is recorded in the journal and POSTed to the configured webhook with signed approve
//! and deny links; `ring0 serve` is SIGKILLed while it waits and started again; the link then
//! releases the call, which runs once (counted in the upstream fixture's effects.log). A link
//! is one-time, and a link signed for one call cannot release another.
//!
//! The webhook's receiver is a small loopback HTTP server inside the test; the client is the
//! Python SDK's, declaring elicitation and never answering (the person is away from it).

mod common;

use common::*;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// Generous for a loaded machine: how long a webhook POST, an effect or a log line may take.
const WAIT: Duration = Duration::from_secs(60);

/// A loopback HTTP server that answers every request 200 and hands over each JSON body.
fn webhook_receiver() -> (String, Receiver<Value>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for stream in listener.incoming().map_while(Result::ok) {
            if let Some(body) = read_request(stream) {
                let _ = tx.send(body);
            }
        }
    });
    (url, rx)
}

fn read_request(mut stream: TcpStream) -> Option<Value> {
    stream.set_read_timeout(Some(WAIT)).ok()?;
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).ok()?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            length = v.trim().parse().ok()?;
        }
    }
    let mut body = vec![0; length.min(1 << 20)];
    reader.read_exact(&mut body).ok()?;
    let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    serde_json::from_slice(&body).ok()
}

/// A workspace whose `fx__append` is held for approval, offered to the webhook at `hook`.
fn workspace(peers: &Path, hook: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[workspace]\nstate_dir = \".ring0\"\n\n\
         [approval]\ntimeout_secs = 600\nwebhook_url = {hook:?}\n\n\
         [[grants]]\nname = \"effects\"\ntools = [\"fx__append\"]\nceiling = \"A2\"\n\
         approval = true\n\n\
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

/// `ring0 serve --http`, its stderr copied to `serve.log` in the workspace.
fn serve(dir: &Path) -> HttpServer {
    let mut cmd = serve_http_command(dir);
    cmd.stdin(Stdio::null()).stdout(Stdio::null());
    start_http_logged(cmd, &dir.join("serve.log"))
}

/// A client whose call `fx__append {"text": text}` is held and never answered by it.
fn held_call(peers: &Path, server: &HttpServer, text: &str) -> Child {
    Command::new(python(peers))
        .arg(fixtures().join("py_client_settle.py"))
        .args([
            &server.url(),
            "fx__append",
            &json!({"text": text}).to_string(),
            &format!("key-{text}"),
            "--never-answer",
        ])
        .env("HOME", test_home())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Holds one call per text, SIGKILLs ring0 while they wait, and starts it again: the webhook's
/// offers (by text) and the new server.
fn held_then_restarted(
    peers: &Path,
    dir: &Path,
    offers: &Receiver<Value>,
    texts: &[&str],
) -> (Vec<Value>, HttpServer) {
    let mut server = serve(dir);
    let mut clients = Vec::new();
    let mut seen = Vec::new();
    for text in texts {
        clients.push(held_call(peers, &server, text));
        let offer = offers.recv_timeout(WAIT).expect("the held call is POSTed");
        assert_eq!(offer["tool"], "fx__append", "{offer}");
        assert!(
            offer["summary"].as_str().unwrap_or("").contains(text),
            "{offer}"
        );
        seen.push(offer);
    }
    // SIGKILL: nothing of ring0 runs after this, and nothing was decided.
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    for mut client in clients {
        let _ = client.kill();
        let _ = client.wait();
    }
    for text in texts {
        assert_eq!(effects(dir, text), 0, "{text} did not run while held");
    }
    let server = serve(dir);
    wait_for_file_text(
        &dir.join("serve.log"),
        "held before the restart still wait for approval",
        "the restarted server adopts the held calls",
    );
    (seen, server)
}

fn effects(dir: &Path, text: &str) -> usize {
    std::fs::read_to_string(dir.join("effects.log"))
        .unwrap_or_default()
        .lines()
        .filter(|l| *l == text)
        .count()
}

/// Waits, bounded, until `text` has `n` effects.
fn wait_for_effects(dir: &Path, text: &str, n: usize) {
    let deadline = Instant::now() + WAIT;
    while effects(dir, text) < n {
        assert!(
            Instant::now() < deadline,
            "{text}: no effect within {WAIT:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// POSTs a link to `server` (its path and query: what the signature covers), returning the
/// status and body.
fn follow(server: &HttpServer, link: &str) -> (u16, String) {
    request(server, "POST", link)
}

fn request(server: &HttpServer, method: &str, link: &str) -> (u16, String) {
    let path = &link[link.find("/approvals/").expect("a link")..];
    let mut s = TcpStream::connect(&server.addr).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        server.addr
    );
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    (status(head), body.to_string())
}

fn journal_ls(dir: &Path) -> String {
    let out = Command::new(ring0())
        .args(["journal", "ls"])
        .current_dir(dir)
        .env("RING0_STATE_DIR", dir.join(".ring0"))
        .output()
        .unwrap();
    text(&out.stdout)
}

#[test]
fn a_call_held_across_a_sigkill_is_approved_by_its_webhook_link_and_runs_once() {
    let Some(peers) = peers() else { return };
    let (hook, offers) = webhook_receiver();
    let dir = workspace(&peers, &hook);
    let (seen, server) = held_then_restarted(&peers, dir.path(), &offers, &["refund-31"]);
    let approve = seen[0]["approve_url"].as_str().unwrap().to_string();

    // Opening the link (a preview, a prefetch) shows what it decides and decides nothing.
    for _ in 0..2 {
        let (code, page) = request(&server, "GET", &approve);
        assert_eq!(code, 200, "{page}");
        assert!(page.contains("Approve this call?"), "{page}");
        assert!(page.contains("PENDING"), "a GET never decides: {page}");
    }
    assert_eq!(effects(dir.path(), "refund-31"), 0);

    let (code, body) = follow(&server, &approve);
    assert_eq!(code, 200, "{body}");
    wait_for_effects(dir.path(), "refund-31", 1);
    wait_for_file_text(
        &dir.path().join("serve.log"),
        "ran after the restart: ACKED",
        "the released call settles",
    );

    // The link replayed is refused, and nothing runs again.
    let (code, body) = follow(&server, &approve);
    assert_eq!(code, 409, "{body}");
    assert!(body.contains("already decided"), "{body}");
    // Its deny link cannot undo the decision either.
    let deny = seen[0]["deny_url"].as_str().unwrap();
    assert_eq!(follow(&server, deny).0, 409);
    assert_eq!(effects(dir.path(), "refund-31"), 1, "it ran exactly once");
    assert!(journal_ls(dir.path()).contains("ACKED"));
}

#[test]
fn a_webhook_link_releases_only_the_call_it_was_signed_for() {
    let Some(peers) = peers() else { return };
    let (hook, offers) = webhook_receiver();
    let dir = workspace(&peers, &hook);
    let (seen, server) = held_then_restarted(&peers, dir.path(), &offers, &["pay-x", "pay-y"]);
    let (x, y) = (&seen[0], &seen[1]);
    assert_ne!(x["args_hash"], y["args_hash"]);

    // X's signed approval, presented for Y: refused, and Y stays held.
    let x_link = x["approve_url"].as_str().unwrap();
    let forged = x_link.replace(
        x["approval_id"].as_str().unwrap(),
        y["approval_id"].as_str().unwrap(),
    );
    let (code, body) = follow(&server, &forged);
    assert_eq!(code, 403, "{body}");
    // A link whose signature was altered is refused too.
    let altered = format!("{}00", &x_link[..x_link.len() - 2]);
    assert_eq!(follow(&server, &altered).0, 403);

    // X's own link releases X, and only X.
    assert_eq!(follow(&server, x_link).0, 200);
    wait_for_effects(dir.path(), "pay-x", 1);
    // Y is denied by its own link: it never runs, and its intent is settled without a send.
    let (code, body) = follow(&server, y["deny_url"].as_str().unwrap());
    assert_eq!(code, 200, "{body}");
    wait_for_file_text(
        &dir.path().join("serve.log"),
        "is REJECTED_CONFLICT",
        "the denied call is settled",
    );
    assert_eq!(effects(dir.path(), "pay-y"), 0);
    assert_eq!(effects(dir.path(), "pay-x"), 1);
}

#[test]
fn a_held_call_is_released_by_its_webhook_link_while_ring0_still_waits() {
    let Some(peers) = peers() else { return };
    let (hook, offers) = webhook_receiver();
    let dir = workspace(&peers, &hook);
    let server = serve(dir.path());
    let mut client = held_call(&peers, &server, "ship-5");
    let offer = offers.recv_timeout(WAIT).expect("the held call is POSTed");
    let (code, body) = follow(&server, offer["approve_url"].as_str().unwrap());
    assert_eq!(code, 200, "{body}");
    // The round that held the call dispatches it.
    wait_for_effects(dir.path(), "ship-5", 1);
    let deadline = Instant::now() + WAIT;
    while !journal_ls(dir.path()).contains("ACKED") {
        assert!(Instant::now() < deadline, "the released call settles");
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = client.kill();
    let _ = client.wait();
    assert_eq!(effects(dir.path(), "ship-5"), 1);
    assert_eq!(
        follow(&server, offer["approve_url"].as_str().unwrap()).0,
        409
    );
}
