//! A reconciliation probe due while its upstream is restarting waits for it: the call whose
//! upstream crashed right after its effect is settled by the probe once the upstream is back,
//! not dead-lettered because the probe came a moment too early.

mod common;

use common::*;
use serde_json::{Value, json};
use std::io::Write;
use std::path::Path;
use std::process::Command;

fn config(dir: &Path) -> String {
    common::restarting_upstream_config(dir, "")
}

fn response(rx: &std::sync::mpsc::Receiver<Value>, id: i64) -> Value {
    loop {
        let message = rx.recv_timeout(HTTP_WAIT).expect("ring0 answers");
        if message["id"] == id && message.get("method").is_none() {
            return message;
        }
    }
}

#[test]
fn a_probe_waits_for_its_restarting_upstream_and_settles_the_call() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ring0.toml"), config(dir.path())).unwrap();
    let mut cmd = Command::new(ring0());
    cmd.arg("serve")
        .current_dir(dir.path())
        .env("RING0_STATE_DIR", dir.path().join(".ring0"));
    let (mut child, mut stdin, rx) = spawn_stdio_json(cmd);
    let mut send = |message: Value| {
        writeln!(stdin, "{message}").unwrap();
        stdin.flush().unwrap();
    };
    send(
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "probe-test", "version": "1"}}}),
    );
    response(&rx, 1);
    send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    send(
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "pay__charge", "arguments": {"id": "order-17"}}}),
    );
    let answer = response(&rx, 2);
    let _ = child.kill();
    let _ = child.wait();

    let result = &answer["result"];
    assert_eq!(result["isError"], false, "{answer}");
    let receipt = &result["_meta"]["io.ring0/receipt"];
    assert_eq!(receipt["state"], "ACKED", "{answer}");
    assert_eq!(result["structuredContent"]["by"], "probe", "{answer}");
    let charges = std::fs::read_to_string(dir.path().join("charges.log")).unwrap();
    assert_eq!(charges, "order-17\n", "charged once, never again");
    let probes = std::fs::read_to_string(dir.path().join("probes.log")).unwrap();
    assert!(probes.lines().any(|l| l == "probe"), "{probes}");
    // The restarted upstream answered the probe: it started twice.
    let starts = std::fs::read_to_string(dir.path().join("started")).unwrap();
    assert_eq!(starts.lines().count(), 2, "{starts}");
}
