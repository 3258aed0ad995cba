//! Recovery at start: the journal's open records are settled from the log alone, with the
//! registered tools as executors.
//!
//! A record left DISPATCHED by a crash goes to UNKNOWN and is reconciled by its tool's declared
//! settlement (idempotency key, probe, or DEAD_LETTER for a person) — never dispatched again
//! blindly. A record left RECORDED was authorized and committed but never sent: it is authorized
//! again against the current policy ([`Authorizer::recheck`], see [`recheck_recorded`]) and
//! dispatched only if that allows it; a refusal settles it REJECTED_CONFLICT (the journal's
//! terminal state for "cancelled before dispatch, nothing was sent") with the rule in its
//! timeline. Call [`crate::Kernel::recover`] once when a process opens a durable journal, before
//! serving.

use crate::policy::{AuthDecision, AuthRequest, Authorizer, SessionInfo};
use crate::registry::Registry;
use crate::settle::{ReceiptOrigin, dispatch_outcome, ms, probe, run_tool, snapshot};
use crate::tool::{CallContext, EventSink, ProbeFinding, ToolError};
use crate::trace;
use async_trait::async_trait;
use futures::future::BoxFuture;
use ring0_core::receipt::{Disposition, Timing};
use ring0_core::{Fingerprint, IntentState, Principal, Settlement};
use ring0_journal::record::Transition;
use ring0_journal::recovery::Executor;
use ring0_journal::settle::DispatchOutcome;
use ring0_journal::{IntentRecord, Journal, JournalError};
use serde_json::Value;
use std::sync::Arc;
use std::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// The registered tools as the journal's executor for records found in the log.
pub(crate) struct RegistryExecutor<'a> {
    pub registry: &'a Registry,
    pub shape: &'a crate::shape::ShapeStage,
}

fn args_of(record: &IntentRecord) -> Value {
    serde_json::from_str(&record.canonical_args).unwrap_or(Value::Null)
}

#[async_trait]
impl Executor for RegistryExecutor<'_> {
    fn knows(&self, record: &IntentRecord) -> bool {
        self.registry.get(&record.tool).is_some()
    }

    fn settlement(&self, record: &IntentRecord) -> Settlement {
        self.registry
            .get(&record.tool)
            .map(|t| t.spec.settlement)
            .unwrap_or(Settlement::None)
    }

    async fn snapshot(&self, record: &IntentRecord) -> Option<Value> {
        let tool = self.registry.get(&record.tool)?;
        snapshot(tool.tool.as_ref(), tool.spec.settlement, &args_of(record)).await
    }

    async fn dispatch(&self, record: &IntentRecord) -> DispatchOutcome {
        let call_id = record.last_call_id();
        let Some(tool) = self.registry.get(&record.tool) else {
            let origin = ReceiptOrigin {
                call_id,
                index: 0,
                tool: &record.tool,
                disposition: Disposition::Recovered,
                timing: Timing::default(),
                budget_bytes: ring0_core::limits::OBSERVATION_BYTES_MAX,
                shape: self.shape,
            };
            let message = format!("tool {:?} is no longer registered", record.tool);
            return dispatch_outcome(record, origin, Err(ToolError::not_applied(message)));
        };
        let ctx = CallContext {
            call_id: call_id.to_string(),
            intent_id: Some(record.id.to_string()),
            idempotency_key: record.mutating.then(|| record.idempotency_key.clone()),
            scope: Arc::from(record.scope.as_str()),
            session: Arc::new(recovery_session(record)),
            cancel: CancellationToken::new(),
            timeout_ms: tool.spec.timeout_ms,
            events: EventSink::detached(),
            // Recovery runs outside any request: nothing of a host's is attached.
            extensions: Default::default(),
        };
        let started = Instant::now();
        let span = trace::call_stage(trace::DISPATCH, &record.tool, call_id);
        trace::record_intent(&span, &record.id, record.state);
        let attempt = record
            .timeline
            .iter()
            .filter(|e| e.state == IntentState::Dispatched)
            .count();
        span.record("ring0.dispatch.attempt", attempt);
        let result = run_tool(
            tool.tool.clone(),
            ctx,
            args_of(record),
            tool.spec.timeout_ms,
        )
        .instrument(span.clone())
        .await;
        if let Err(e) = &result {
            trace::record_error(&span, trace::failure_kind(e.class));
        }
        let origin = ReceiptOrigin {
            call_id,
            index: 0,
            tool: &record.tool,
            disposition: Disposition::Recovered,
            timing: Timing {
                queued_ms: 0,
                run_ms: ms(started.elapsed()),
            },
            budget_bytes: tool.spec.observation_budget_bytes,
            shape: self.shape,
        };
        dispatch_outcome(record, origin, result)
    }

    async fn probe(&self, record: &IntentRecord) -> ProbeFinding {
        let Some(tool) = self.registry.get(&record.tool) else {
            return ProbeFinding::Indeterminate(format!(
                "tool {:?} is no longer registered",
                record.tool
            ));
        };
        // Under the record's `recover` span (current here): the probe is part of it.
        let recovering = tracing::Span::current();
        let span = trace::call_stage(trace::PROBE, &record.tool, record.last_call_id());
        trace::record_intent(&span, &record.id, record.state);
        let finding = probe(
            tool.tool.as_ref(),
            &args_of(record),
            record,
            tool.spec.observation_budget_bytes,
            self.shape,
        )
        .instrument(span.clone())
        .await;
        let kind = trace::finding_kind(&finding);
        span.record("ring0.probe.finding", kind);
        recovering.record("ring0.probe.finding", kind);
        finding
    }

    fn recovering<'a>(
        &'a self,
        record: &'a IntentRecord,
        settle: BoxFuture<'a, Result<IntentRecord, JournalError>>,
    ) -> BoxFuture<'a, Result<IntentRecord, JournalError>> {
        let span = trace::recover_span(record);
        Box::pin(async move {
            let settled = settle.instrument(span.clone()).await;
            trace::record_recovered(&span, record, &settled);
            settled
        })
    }
}

/// Session id recovery's re-check presents to policy.
pub const RECOVERY_SESSION_ID: &str = "recovery";

/// Authorizes every RECORDED record an earlier process left behind against the current policy,
/// and settles each one it refuses (RECORDED → REJECTED_CONFLICT, the rule and reason noted),
/// so that recovery never dispatches a call today's grants would not allow. Returns the settled
/// records. The re-check asks as the principal the record names (without its groups, which
/// the journal does not keep: a grant that names only a group refuses), or as
/// [`Principal::local`] for a record that names none, in the record's scope.
pub(crate) async fn recheck_recorded(
    journal: &dyn Journal,
    registry: &Registry,
    authorizer: &dyn Authorizer,
) -> Result<Vec<IntentRecord>, JournalError> {
    let me = journal.incarnation();
    let mut refused = Vec::new();
    // A call held for a person's approval waits for that decision, not for today's policy;
    // one approved is released by whoever watches its held call.
    let holds = journal.holds_unreleased().await?;
    for record in journal.open_records().await? {
        // A record of this very incarnation belongs to a live round of this process.
        if record.state != IntentState::Recorded || Some(record.owner) == me {
            continue;
        }
        if holds.iter().any(|h| h.holds(&record)) {
            continue;
        }
        let Some(tool) = registry.get(&record.tool) else {
            continue;
        };
        let Some((rule, reason)) = refusal(authorizer, &tool.spec, &record).await else {
            continue;
        };
        let t = Transition::to(&record, IntentState::RejectedConflict).note(format!(
            "refused at recovery by the current policy ({rule}): {reason}; nothing was sent"
        ));
        match journal.transition(t).await {
            Ok(settled) => {
                let span = trace::recover_span(&record);
                span.record(trace::DECISION_RULE, rule.as_str());
                trace::record_recovered(&span, &record, &Ok(settled.clone()));
                refused.push(settled);
            }
            // Another writer moved it first: it is no longer this recovery's to settle.
            Err(JournalError::StaleFence { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(refused)
}

/// The rule and reason the current policy refuses `record` with, or `None` when it allows it.
/// Who a recovered call acts for: nobody's session is open, so the recovery session's.
fn recovery_session(record: &IntentRecord) -> SessionInfo {
    SessionInfo {
        scope: record.scope.clone(),
        session_id: RECOVERY_SESSION_ID.into(),
        principal: record
            .principal
            .as_deref()
            .map_or_else(Principal::local, Principal::new),
    }
}

async fn refusal(
    authorizer: &dyn Authorizer,
    spec: &ring0_core::ToolSpec,
    record: &IntentRecord,
) -> Option<(String, String)> {
    let args = args_of(record);
    let args_hash = match Fingerprint::from_canonical_args(&spec.name, &record.canonical_args) {
        Ok(f) => f.encode(),
        Err(e) => {
            return Some((
                "recovery:invalid_arguments".into(),
                format!("the recorded arguments cannot be fingerprinted: {e}"),
            ));
        }
    };
    let session = recovery_session(record);
    let call_id = record.last_call_id();
    // No host is attached to a recovered call: nobody can be asked, so only a decision that
    // needs no person can let it through.
    let extensions = crate::tool::CallExtensions::default();
    let request = AuthRequest {
        session: &session,
        spec,
        call_id,
        args: &args,
        args_hash: &args_hash,
        events: None,
        extensions: &extensions,
    };
    match authorizer.recheck(&request).await {
        AuthDecision::Allow { .. } => None,
        AuthDecision::Deny { rule, reason }
        | AuthDecision::ApprovalDenied { rule, reason }
        | AuthDecision::ApprovalRequired { rule, reason, .. }
        | AuthDecision::RateLimited { rule, reason, .. } => Some((rule, reason)),
        AuthDecision::ApprovalTimeout { rule } => {
            Some((rule, "no approval arrived in time".into()))
        }
    }
}
