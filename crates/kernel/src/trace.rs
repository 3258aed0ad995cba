//! The stages as `tracing` spans: what a host's telemetry sees of a round.
//!
//! Each stage of a call opens a span named for it ([`PREPARE`], [`ADMIT`], [`COMMIT`],
//! [`APPROVE`], [`DISPATCH`], [`SHAPE`], [`SETTLE`], [`PROBE`], [`PROJECT`]) as a child of the span
//! current when the round runs — the host's span for the request or the turn. The kernel knows
//! nothing of exporters: a host that installs a `tracing` subscriber (ring0's `ring0-ops`
//! turns these spans into OpenTelemetry ones) sees them, and without one they cost a check of
//! a static interest. Recovery's settlement of each intent an earlier process left open is a
//! root [`RECOVER`] span of its own, with the attempt and the probe it made under it.
//!
//! The attributes are identities and states only — the tool's name, the provider's call id,
//! the intent's id and state, the rule that decided — **never an argument value, a result or a
//! message a tool wrote**: spans leave the machine, and arguments may hold secrets.

use ring0_core::IntentState;
use tracing::Span;

/// Validation, rewrites and the authorizer's decision for one call.
pub const PREPARE: &str = "prepare";
/// Tool choice, the round's overseer and the exact-repeat guard, for the whole round.
pub const ADMIT: &str = "admit";
/// The journal's decision on one call: a new intent, a replay, a wait, a refusal.
pub const COMMIT: &str = "commit";
/// A call held for a person, until the decision.
pub const APPROVE: &str = "approve";
/// One attempt of the tool (the first, or a same-key re-dispatch while settling).
pub const DISPATCH: &str = "dispatch";
/// The result of one attempt made into a bounded, sanitized observation.
pub const SHAPE: &str = "shape";
/// From an attempt's outcome to the intent's settled state (recorded, reconciled).
pub const SETTLE: &str = "settle";
/// The tool's probe asked whether an ambiguous effect happened (inside [`SETTLE`]).
pub const PROBE: &str = "probe";
/// A receipt made into what the model sees.
pub const PROJECT: &str = "project";

/// The settlement of one intent an earlier process left open, when a process recovers its
/// journal (at start, or a replica taking the calls of one whose lease lapsed): a root span,
/// no request being served. A re-dispatch and a probe are its `dispatch` and `probe` children.
pub const RECOVER: &str = "recover";

/// The OpenTelemetry GenAI attribute naming the tool.
pub const TOOL_NAME: &str = "gen_ai.tool.name";
/// The OpenTelemetry GenAI attribute naming the provider's call id.
pub const TOOL_CALL_ID: &str = "gen_ai.tool.call.id";
/// The journal intent answering the call.
pub const INTENT_ID: &str = "ring0.intent.id";
/// The intent's state when the span ended.
pub const INTENT_STATE: &str = "ring0.intent.state";
/// The rule of the policy that decided.
pub const DECISION_RULE: &str = "ring0.decision.rule";

/// A stage span of one call, child of the current span, with the call's tool and id and
/// empty slots for what the stage learns ([`record_intent`], [`record_outcome`]).
pub(crate) fn call_stage(name: &'static str, tool: &str, call_id: &str) -> Span {
    // One callsite per stage name: `tracing` needs a literal name, so the match spells them.
    macro_rules! stage {
        ($name:literal) => {
            tracing::info_span!(
                $name,
                gen_ai.tool.name = tool,
                gen_ai.tool.call.id = call_id,
                ring0.intent.id = tracing::field::Empty,
                ring0.intent.state = tracing::field::Empty,
                ring0.intent.timeline = tracing::field::Empty,
                ring0.decision = tracing::field::Empty,
                ring0.decision.rule = tracing::field::Empty,
                ring0.dispatch.attempt = tracing::field::Empty,
                ring0.probe.finding = tracing::field::Empty,
                "error.type" = tracing::field::Empty,
                otel.status_code = tracing::field::Empty,
            )
        };
    }
    match name {
        PREPARE => stage!("prepare"),
        COMMIT => stage!("commit"),
        APPROVE => stage!("approve"),
        DISPATCH => stage!("dispatch"),
        SHAPE => stage!("shape"),
        SETTLE => stage!("settle"),
        PROBE => stage!("probe"),
        PROJECT => stage!("project"),
        other => unreachable!("{other} is not a per-call stage"),
    }
}

/// The root span of one record's settlement at recovery, with the state it was found in.
pub(crate) fn recover_span(record: &ring0_journal::IntentRecord) -> Span {
    tracing::info_span!(
        parent: None,
        "recover",
        gen_ai.tool.name = record.tool.as_str(),
        ring0.intent.id = %record.id,
        ring0.recovery.found = record.state.as_str(),
        ring0.recovery.action = tracing::field::Empty,
        ring0.intent.state = tracing::field::Empty,
        ring0.intent.timeline = tracing::field::Empty,
        ring0.probe.finding = tracing::field::Empty,
        ring0.decision.rule = tracing::field::Empty,
        "error.type" = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    )
}

/// What recovery did with a record, from how it was `found` and how it was left: `reconciled`
/// (settled without sending it again: its probe decided), `redispatched` (sent again under the
/// same key), `resumed` (a
/// committed call never sent, sent now), `dead_letter` (left for a person), `cancelled`
/// (refused before it was sent), or `settled` (anything else: its settlement needed no call).
pub(crate) fn recovery_action(
    found: &ring0_journal::IntentRecord,
    settled: &ring0_journal::IntentRecord,
) -> &'static str {
    let since = settled.timeline.get(found.timeline.len()..).unwrap_or(&[]);
    let reached = |state: IntentState| since.iter().any(|e| e.state == state);
    match settled.state {
        IntentState::DeadLetter => "dead_letter",
        IntentState::RejectedConflict => "cancelled",
        _ if reached(IntentState::Dispatched) && found.state == IntentState::Recorded => "resumed",
        _ if reached(IntentState::Dispatched) => "redispatched",
        _ if reached(IntentState::Reconciling) => "reconciled",
        _ => "settled",
    }
}

/// How a record's settlement at recovery ended, on its span: the state, the timeline, the
/// action, and a state other than ACKED as its error.
pub(crate) fn record_recovered(
    span: &Span,
    found: &ring0_journal::IntentRecord,
    settled: &Result<ring0_journal::IntentRecord, ring0_journal::JournalError>,
) {
    match settled {
        Ok(done) => {
            record_intent(span, &done.id, done.state);
            record_timeline(span, done);
            span.record("ring0.recovery.action", recovery_action(found, done));
            if done.state != IntentState::Acked {
                record_error(span, done.state.as_str());
            }
        }
        Err(_) => record_error(span, "journal_unavailable"),
    }
}

/// The round-wide admit span.
pub(crate) fn admit_stage(calls: usize) -> Span {
    tracing::info_span!(
        "admit",
        ring0.round.calls = calls,
        ring0.round.accepted = tracing::field::Empty,
        ring0.repeat_guard = tracing::field::Empty,
    )
}

/// The intent a stage ended with.
pub(crate) fn record_intent(span: &Span, id: &impl std::fmt::Display, state: IntentState) {
    span.record(INTENT_ID, tracing::field::display(id));
    span.record(INTENT_STATE, state.as_str());
}

/// A stage that ended in an error: its closed-set kind (a rejection kind, a failure class),
/// never its message.
pub(crate) fn record_error(span: &Span, kind: &str) {
    span.record("error.type", kind);
    span.record("otel.status_code", "ERROR");
}

/// What the policy decided (`allow`, `hold`, `deny`, …) and by which rule, when it names one.
pub(crate) fn record_decision(span: &Span, decision: &str, rule: Option<&str>) {
    span.record("ring0.decision", decision);
    if let Some(rule) = rule {
        span.record(DECISION_RULE, rule);
    }
}

/// A failed attempt's class as `error.type` says it.
pub(crate) fn failure_kind(class: ring0_core::FailureClass) -> &'static str {
    use ring0_core::FailureClass as C;
    match class {
        C::NotApplied => "not_applied",
        C::ConnectionRefused => "connection_refused",
        C::Timeout => "timeout",
        C::ConnectionLost => "connection_lost",
        C::StreamAborted => "stream_aborted",
        C::Unknown => "unknown",
    }
}

/// The states an intent went through, in order (`PROPOSED,RECORDED,DISPATCHED,ACKED`): how it settled,
/// in one attribute.
pub(crate) fn record_timeline(span: &Span, record: &ring0_journal::IntentRecord) {
    if span.is_disabled() {
        // Nobody traces: the joined text is not built.
        return;
    }
    let states: Vec<&str> = record.timeline.iter().map(|e| e.state.as_str()).collect();
    span.record("ring0.intent.timeline", states.join(","));
}

/// A probe's finding as `ring0.probe.finding` says it (the evidence itself stays out).
pub(crate) fn finding_kind(finding: &ring0_core::ProbeFinding) -> &'static str {
    match finding {
        ring0_core::ProbeFinding::Applied(_) => "applied",
        ring0_core::ProbeFinding::Unchanged => "unchanged",
        ring0_core::ProbeFinding::Indeterminate(_) => "indeterminate",
    }
}
