//! The Prometheus metrics of a running ring0, named `ring0_*`.
//!
//! Two feeds count them as things happen, and a scrape reads the rest where it lives:
//! - the kernel's events ([`ring0_kernel::EventObserver`]): every receipt (calls by
//!   disposition, refusals by kind, settlements by state, shaping, stage latencies) and the
//!   repeat guard's advisories and terminations;
//! - the policy's audit entries ([`ring0_policy::AuditSink`], as a tap behind the audit log):
//!   decisions by rule and outcome, and the approvals a person is being asked for now;
//! - at scrape time ([`Metrics::render`]): intents by state from the journal, and each
//!   upstream's connection state and restarts from the gateway.
//!
//! No label carries an argument value, a result, a principal or a tool name: label values come
//! from closed sets (states, kinds, dispositions) or from the operator's configuration (rule
//! and upstream names), and the rule label is bounded ([`DECISION_RULES_MAX`]).

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use ring0_core::receipt::{CallOutcome, Disposition, Receipt};
use ring0_core::{IntentState, Observation};
use ring0_kernel::Event;
use ring0_kernel::events::RepeatAction;
use ring0_policy::{AuditDecision, AuditEntry};
use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Distinct `rule` label values counted by name; decisions of any further rule are counted
/// under `rule="other"`, so a configuration with many rules cannot grow the exposition without
/// bound.
pub const DECISION_RULES_MAX: usize = 256;
/// Held approvals remembered at once for the `ring0_approvals_held` gauge; a hold beyond it is
/// still counted in `ring0_decisions_total`.
pub const HELD_APPROVALS_TRACKED_MAX: usize = 4096;
/// The smallest latency bucket, in seconds (1 ms); each next one doubles it.
const LATENCY_BUCKET_START_S: f64 = 0.001;
/// Latency buckets: 1 ms to about 33 s.
const LATENCY_BUCKETS: u16 = 16;

/// One label.
type Label1 = [(&'static str, String); 1];
/// Two labels.
type Label2 = [(&'static str, String); 2];

/// Every metric ring0 exports, and the registry that renders them.
pub struct Metrics {
    registry: Registry,
    calls: Family<Label1, Counter>,
    rejections: Family<Label1, Counter>,
    settlements: Family<Label1, Counter>,
    decisions: Family<Label2, Counter>,
    approvals_held: Gauge,
    intents: Family<Label1, Gauge>,
    raw_tokens: Counter,
    shaped_tokens: Counter,
    stream_raw_bytes: Counter,
    stream_shown_bytes: Counter,
    observation_bytes: Counter,
    truncated: Counter,
    redactions: Family<Label1, Counter>,
    repeat_guard: Family<Label1, Counter>,
    upstream_up: Family<Label1, Gauge>,
    upstream_restarts: Family<Label1, Counter>,
    stage_seconds: Family<Label1, Histogram, fn() -> Histogram>,
    rules: Mutex<BTreeSet<String>>,
    held: Mutex<HeldApprovals>,
}

/// The approvals being waited for now, by approval id, with when each was held: a hold whose
/// end was never audited (its call cancelled mid-wait) is forgotten once the approval timeout
/// has passed, as the policy itself would have ended it by then.
struct HeldApprovals {
    since_ms: HashMap<String, u64>,
    expiry: Duration,
}

impl HeldApprovals {
    fn prune(&mut self, now_ms: u64) -> usize {
        let expiry_ms = u64::try_from(self.expiry.as_millis()).unwrap_or(u64::MAX);
        self.since_ms
            .retain(|_, at| now_ms.saturating_sub(*at) <= expiry_ms);
        self.since_ms.len()
    }
}

/// What a scrape reads where it lives.
pub struct Snapshot {
    /// Records per state, from the journal (`None` when the backend cannot count).
    pub intents: Option<Vec<(IntentState, u64)>>,
    /// Each upstream: alias, connected now, connections made so far.
    pub upstreams: Vec<UpstreamVitals>,
}

/// One upstream as a scrape sees it.
pub struct UpstreamVitals {
    pub alias: String,
    pub connected: bool,
    /// Connections made so far (the first start included).
    pub starts: u64,
}

fn label(key: &'static str, value: impl Into<String>) -> Label1 {
    [(key, value.into())]
}

impl Metrics {
    /// The metrics, empty. `approval_timeout` is the policy's (`[approval] timeout_secs`): how
    /// long a hold can last.
    pub fn new(approval_timeout: Duration) -> Self {
        let mut registry = Registry::with_prefix("ring0");
        let calls = Family::<Label1, Counter>::default();
        registry.register(
            "calls",
            "Calls answered, by disposition (dispatched, replayed, memoized, recovered, rejected)",
            calls.clone(),
        );
        let rejections = Family::<Label1, Counter>::default();
        registry.register(
            "rejections",
            "Calls refused before anything ran, by rejection kind",
            rejections.clone(),
        );
        let settlements = Family::<Label1, Counter>::default();
        registry.register(
            "settlements",
            "Journaled calls settled by this process, by the state they settled in",
            settlements.clone(),
        );
        let decisions = Family::<Label2, Counter>::default();
        registry.register(
            "decisions",
            "Policy decisions, by the rule that fired and the outcome",
            decisions.clone(),
        );
        let approvals_held = Gauge::default();
        registry.register(
            "approvals_held",
            "Calls waiting for a person's approval now",
            approvals_held.clone(),
        );
        let intents = Family::<Label1, Gauge>::default();
        registry.register(
            "intents",
            "Journal records, by state (read from the journal at scrape time)",
            intents.clone(),
        );
        let raw_tokens = Counter::default();
        registry.register(
            "shaping_raw_tokens",
            "Tokens processes produced before shaping (where the shaper counts tokens)",
            raw_tokens.clone(),
        );
        let shaped_tokens = Counter::default();
        registry.register(
            "shaping_shaped_tokens",
            "Tokens of the shaped observations the model was shown",
            shaped_tokens.clone(),
        );
        let stream_raw_bytes = Counter::default();
        registry.register(
            "shaping_stream_raw_bytes",
            "Bytes processes wrote to their output streams before shaping",
            stream_raw_bytes.clone(),
        );
        let stream_shown_bytes = Counter::default();
        registry.register(
            "shaping_stream_shown_bytes",
            "Bytes of those streams the model was shown after shaping",
            stream_shown_bytes.clone(),
        );
        let observation_bytes = Counter::default();
        registry.register(
            "observation_bytes",
            "Bytes of model-visible observation text, every tool",
            observation_bytes.clone(),
        );
        let truncated = Counter::default();
        registry.register(
            "observations_truncated",
            "Observations cut to their budget",
            truncated.clone(),
        );
        let redactions = Family::<Label1, Counter>::default();
        registry.register(
            "redactions",
            "Things taken out of tool output, by kind (secret, invisible, framing)",
            redactions.clone(),
        );
        let repeat_guard = Family::<Label1, Counter>::default();
        registry.register(
            "repeat_guard",
            "Exact-repeat guard actions (advisory, terminated)",
            repeat_guard.clone(),
        );
        let upstream_up = Family::<Label1, Gauge>::default();
        registry.register(
            "upstream_up",
            "1 when the upstream is connected, else 0",
            upstream_up.clone(),
        );
        let upstream_restarts = Family::<Label1, Counter>::default();
        registry.register(
            "upstream_restarts",
            "Reconnections of an upstream after its first start",
            upstream_restarts.clone(),
        );
        let stage_seconds = Family::<Label1, Histogram>::new_with_constructor(
            (|| {
                Histogram::new(exponential_buckets(
                    LATENCY_BUCKET_START_S,
                    2.0,
                    LATENCY_BUCKETS,
                ))
            }) as fn() -> Histogram,
        );
        registry.register(
            "call_stage_seconds",
            "Time of a dispatched call per stage: queued (round start to dispatch), run (in the tool)",
            stage_seconds.clone(),
        );
        Self {
            registry,
            calls,
            rejections,
            settlements,
            decisions,
            approvals_held,
            intents,
            raw_tokens,
            shaped_tokens,
            stream_raw_bytes,
            stream_shown_bytes,
            observation_bytes,
            truncated,
            redactions,
            repeat_guard,
            upstream_up,
            upstream_restarts,
            stage_seconds,
            rules: Mutex::new(BTreeSet::new()),
            held: Mutex::new(HeldApprovals {
                since_ms: HashMap::new(),
                expiry: approval_timeout,
            }),
        }
    }

    /// The Prometheus text exposition, with what `snapshot` read at scrape time.
    pub fn render(&self, snapshot: &Snapshot) -> String {
        if let Some(counts) = &snapshot.intents {
            for state in IntentState::ALL {
                let n = counts
                    .iter()
                    .find(|(s, _)| *s == state)
                    .map_or(0, |(_, n)| *n);
                self.intents
                    .get_or_create(&label("state", state.as_str()))
                    .set(i64::try_from(n).unwrap_or(i64::MAX));
            }
        }
        for up in &snapshot.upstreams {
            let l = label("upstream", up.alias.clone());
            self.upstream_up
                .get_or_create(&l)
                .set(i64::from(up.connected));
            let restarts = up.starts.saturating_sub(1);
            let counter = self.upstream_restarts.get_or_create(&l);
            let counted = counter.get();
            if restarts > counted {
                counter.inc_by(restarts - counted);
            }
        }
        let held = self.held.lock().expect("held approvals").prune(now_ms());
        self.approvals_held
            .set(i64::try_from(held).unwrap_or(i64::MAX));
        let mut text = String::new();
        encode(&mut text, &self.registry).expect("writing to a String does not fail");
        text
    }

    fn count_receipt(&self, receipt: &Receipt) {
        self.calls
            .get_or_create(&label("disposition", disposition(receipt.disposition)))
            .inc();
        if let CallOutcome::Rejected { rejection } = &receipt.outcome {
            self.rejections
                .get_or_create(&label("kind", rejection.status.as_str()))
                .inc();
        }
        let settled_here = matches!(
            receipt.disposition,
            Disposition::Dispatched | Disposition::Recovered
        );
        if settled_here
            && receipt.intent_id.is_some()
            && let Some(state) = receipt.state
        {
            self.settlements
                .get_or_create(&label("state", state.as_str()))
                .inc();
        }
        if receipt.disposition == Disposition::Dispatched {
            let stage = |name: &str, ms: u64| {
                self.stage_seconds
                    .get_or_create(&label("stage", name))
                    .observe(ms as f64 / 1000.0);
            };
            stage("queued", receipt.timing.queued_ms);
            stage("run", receipt.timing.run_ms);
        }
        let observation = match &receipt.outcome {
            CallOutcome::Completed { observation } => Some(observation),
            CallOutcome::Failed { observation, .. } => observation.as_ref(),
            CallOutcome::Rejected { .. } => None,
        };
        if let Some(observation) = observation {
            self.count_shaping(observation);
        }
    }

    fn count_shaping(&self, observation: &Observation) {
        if let Some(tokens) = &observation.tokens {
            self.raw_tokens.inc_by(tokens.raw);
            self.shaped_tokens.inc_by(tokens.shaped);
        }
        for stream in [&observation.stdout, &observation.stderr]
            .into_iter()
            .flatten()
        {
            self.stream_raw_bytes.inc_by(stream.raw_bytes);
            self.stream_shown_bytes.inc_by(stream.text.len() as u64);
        }
        self.observation_bytes.inc_by(observation.text.len() as u64);
        if observation.truncated {
            self.truncated.inc();
        }
        for (kind, n) in [
            ("secret", observation.secrets_redacted),
            ("invisible", observation.invisible_removed),
            ("framing", observation.framing_neutralized),
        ] {
            if n > 0 {
                self.redactions
                    .get_or_create(&label("kind", kind))
                    .inc_by(n);
            }
        }
    }

    /// The rule label of a decision: an approval's own id is not part of it, and past
    /// [`DECISION_RULES_MAX`] distinct rules the rest count as `other`.
    fn rule_label(&self, rule: &str) -> String {
        let rule = match rule.split_once(':') {
            Some(("approved", _)) => "approved",
            _ => rule,
        };
        let mut rules = self.rules.lock().expect("rule labels");
        if rules.contains(rule) {
            return rule.to_string();
        }
        if rules.len() < DECISION_RULES_MAX {
            rules.insert(rule.to_string());
            return rule.to_string();
        }
        "other".to_string()
    }

    fn count_decision(&self, entry: &AuditEntry) {
        let outcome = decision(entry.decision);
        let rule = self.rule_label(&entry.rule);
        self.decisions
            .get_or_create(&[("rule", rule), ("outcome", outcome.to_string())])
            .inc();
        let Some(id) = &entry.approval_id else {
            return;
        };
        let mut held = self.held.lock().expect("held approvals");
        match entry.decision {
            AuditDecision::Held if held.since_ms.len() < HELD_APPROVALS_TRACKED_MAX => {
                held.since_ms.insert(id.clone(), entry.at_ms);
            }
            AuditDecision::Approved
            | AuditDecision::ApprovalDenied
            | AuditDecision::ApprovalTimeout
            | AuditDecision::ApprovalRequired => {
                held.since_ms.remove(id);
            }
            _ => {}
        }
    }
}

impl ring0_kernel::EventObserver for Metrics {
    fn observe(&self, event: &Event) {
        match event {
            Event::Receipt(receipt) => self.count_receipt(receipt),
            Event::RepeatDetected { action, .. } => {
                let action = match action {
                    RepeatAction::Advisory => "advisory",
                    RepeatAction::Terminated => "terminated",
                };
                self.repeat_guard
                    .get_or_create(&label("action", action))
                    .inc();
            }
            _ => {}
        }
    }
}

/// The tap behind the audit log: it sees each decision once the log recorded it.
impl ring0_policy::AuditSink for Metrics {
    fn record(&self, entry: &AuditEntry) -> Result<(), String> {
        self.count_decision(entry);
        Ok(())
    }
}

fn disposition(d: Disposition) -> &'static str {
    match d {
        Disposition::Dispatched => "dispatched",
        Disposition::Replayed => "replayed",
        Disposition::Memoized => "memoized",
        Disposition::Recovered => "recovered",
        Disposition::Rejected => "rejected",
    }
}

fn decision(d: AuditDecision) -> &'static str {
    match d {
        AuditDecision::Allowed => "allowed",
        AuditDecision::Denied => "denied",
        AuditDecision::Held => "held",
        AuditDecision::Approved => "approved",
        AuditDecision::ApprovalDenied => "approval_denied",
        AuditDecision::ApprovalTimeout => "approval_timeout",
        AuditDecision::ApprovalRequired => "approval_required",
        AuditDecision::RateLimited => "rate_limited",
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring0_kernel::EventObserver;
    use ring0_policy::AuditSink;

    fn entry(
        decision: AuditDecision,
        rule: &str,
        approval_id: Option<&str>,
        at_ms: u64,
    ) -> AuditEntry {
        AuditEntry {
            at_ms,
            decision,
            rule: rule.into(),
            reason: String::new(),
            tool: "write_file".into(),
            call_id: "c1".into(),
            principal: "local".into(),
            scope: "s".into(),
            session_id: "s1".into(),
            args_hash: "h".into(),
            approval_id: approval_id.map(str::to_string),
            args: None,
        }
    }

    fn empty() -> Snapshot {
        Snapshot {
            intents: None,
            upstreams: Vec::new(),
        }
    }

    fn line_value(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn a_hold_is_counted_until_the_person_answers() {
        let m = Metrics::new(Duration::from_secs(300));
        let now = now_ms();
        m.record(&entry(AuditDecision::Held, "a3_approval", Some("ap1"), now))
            .unwrap();
        assert_eq!(
            line_value(&m.render(&empty()), "ring0_approvals_held"),
            Some(1.0)
        );
        m.record(&entry(
            AuditDecision::Approved,
            "approved:ap1",
            Some("ap1"),
            now,
        ))
        .unwrap();
        let text = m.render(&empty());
        assert_eq!(line_value(&text, "ring0_approvals_held"), Some(0.0));
        // The approval's id is not a label value.
        assert!(
            text.contains("ring0_decisions_total{rule=\"approved\",outcome=\"approved\"} 1"),
            "{text}"
        );
        assert!(!text.contains("ap1"), "{text}");
    }

    #[test]
    fn a_hold_never_answered_is_forgotten_after_the_approval_timeout() {
        let m = Metrics::new(Duration::from_secs(60));
        let long_ago = now_ms() - 61_000;
        m.record(&entry(
            AuditDecision::Held,
            "a3_approval",
            Some("ap1"),
            long_ago,
        ))
        .unwrap();
        assert_eq!(
            line_value(&m.render(&empty()), "ring0_approvals_held"),
            Some(0.0)
        );
    }

    #[test]
    fn rule_labels_are_bounded() {
        let m = Metrics::new(Duration::from_secs(60));
        for i in 0..DECISION_RULES_MAX + 5 {
            m.record(&entry(
                AuditDecision::Allowed,
                &format!("grant:g{i}"),
                None,
                0,
            ))
            .unwrap();
        }
        let text = m.render(&empty());
        let rules = text
            .lines()
            .filter(|l| l.starts_with("ring0_decisions_total{"))
            .count();
        assert_eq!(
            rules,
            DECISION_RULES_MAX + 1,
            "every named rule and `other`"
        );
        assert!(
            text.contains("ring0_decisions_total{rule=\"other\",outcome=\"allowed\"} 5"),
            "{text}"
        );
    }

    #[test]
    fn upstream_restarts_follow_the_gateways_count_and_intents_every_state() {
        let m = Metrics::new(Duration::from_secs(60));
        let snapshot = |starts| Snapshot {
            intents: Some(vec![(IntentState::DeadLetter, 2)]),
            upstreams: vec![UpstreamVitals {
                alias: "up".into(),
                connected: starts > 0,
                starts,
            }],
        };
        m.render(&snapshot(1));
        let text = m.render(&snapshot(3));
        assert_eq!(
            line_value(&text, "ring0_upstream_restarts_total{upstream=\"up\"}"),
            Some(2.0)
        );
        assert_eq!(
            line_value(&text, "ring0_upstream_up{upstream=\"up\"}"),
            Some(1.0)
        );
        assert_eq!(
            line_value(&text, "ring0_intents{state=\"DEAD_LETTER\"}"),
            Some(2.0)
        );
        assert_eq!(
            line_value(&text, "ring0_intents{state=\"UNKNOWN\"}"),
            Some(0.0)
        );
    }

    #[test]
    fn a_replayed_receipt_is_a_call_but_not_a_settlement() {
        let m = Metrics::new(Duration::from_secs(60));
        let receipt = Receipt {
            intent_id: Some("i1".into()),
            state: Some(IntentState::Acked),
            ..Receipt::new(
                "c1",
                0,
                "write_file",
                Disposition::Replayed,
                CallOutcome::Completed {
                    observation: Observation::text("ok"),
                },
            )
        };
        m.observe(&Event::Receipt(Box::new(receipt)));
        let text = m.render(&empty());
        assert_eq!(
            line_value(&text, "ring0_calls_total{disposition=\"replayed\"}"),
            Some(1.0)
        );
        assert!(!text.contains("ring0_settlements_total{"), "{text}");
    }
}
