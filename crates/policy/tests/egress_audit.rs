//! Egress decisions in the audit trail: one hash-chained record per decision, refusals named
//! by their reason.

use ring0_egress::{EgressDecision, Reason, Verdict};
use ring0_policy::{AuditDecision, AuditSink, JsonlAudit, egress_audit, verify_chain};
use std::sync::Arc;

fn decision(verdict: Verdict, reason: Reason, rule: Option<&str>) -> EgressDecision {
    EgressDecision {
        at_ms: 1,
        verdict,
        reason,
        method: "CONNECT".into(),
        target: "crates.io:443".into(),
        rule: rule.map(str::to_string),
        address: Some("203.0.113.7:443".parse().unwrap()),
        message: "allowed".into(),
    }
}

#[test]
fn egress_decisions_are_chained_records_of_the_session() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let sink: Arc<dyn AuditSink> = Arc::new(JsonlAudit::open(&path).unwrap());
    let record = egress_audit(sink, "local".into(), "default".into(), "s-1".into());
    record(&decision(
        Verdict::Allowed,
        Reason::Allowed,
        Some("crates.io:443"),
    ))
    .unwrap();
    record(&decision(Verdict::Denied, Reason::HostNotAllowed, None)).unwrap();
    assert_eq!(verify_chain(&path).unwrap().lines, 2);
    let lines: Vec<ring0_policy::AuditEntry> = std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0].decision, AuditDecision::Allowed);
    assert_eq!(lines[0].rule, "egress:crates.io:443");
    assert_eq!(lines[0].tool, "egress");
    assert_eq!(lines[0].session_id, "s-1");
    assert_eq!(lines[1].decision, AuditDecision::Denied);
    assert_eq!(lines[1].rule, "egress:host_not_allowed");
    assert_eq!(lines[1].args.as_ref().unwrap()["target"], "crates.io:443");
}
