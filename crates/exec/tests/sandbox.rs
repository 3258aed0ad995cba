//! The sandbox every process runs in, by default: what a confined command can and cannot reach.

mod common;

use common::{Workspace, never};
use ring0_exec::{CommandSpec, run_command};

async fn sh(ws: &Workspace, script: &str) -> (Option<i32>, String) {
    let policy = ws.policy().allow_shell(true);
    let report = run_command(&policy, &CommandSpec::shell(script), never())
        .await
        .expect("runs");
    (
        report.summary.exit.and_then(|e| e.code),
        report.observation.text,
    )
}

#[tokio::test]
async fn smoke() {
    let ws = Workspace::new();
    let (code, text) = sh(&ws, "echo hi > a.txt; cat a.txt; id; echo $$; cat /etc/shadow; ls ~; ip addr 2>&1 | head; cat /etc/hostname; ls /root").await;
    println!("{code:?}\n{text}");
    let policy = ws.policy().allow_shell(true);
    let t = std::time::Instant::now();
    let report = run_command(&policy, &CommandSpec::shell("true"), never()).await.unwrap();
    println!("{:?} {:?}", t.elapsed(), report.summary);
}

#[test]
fn probe_time() {
    let ws = Workspace::new();
    let t = std::time::Instant::now();
    ws.policy().sandbox.check().unwrap();
    println!("check {:?}", t.elapsed());
}
