//! Recovery at start: the journal's open records are settled from the log alone, with the
//! registered tools as executors.
//!
//! A record left DISPATCHED by a crash goes to UNKNOWN and is reconciled by its tool's declared
//! settlement (idempotency key, probe, or DEAD_LETTER for a person) — never dispatched again
//! blindly. A record left RECORDED was authorized and committed but never sent; by default it is
//! dispatched now. Call [`crate::Kernel::recover`] once when a process opens a durable journal,
//! before serving.

use crate::registry::Registry;
use crate::settle::{ReceiptOrigin, dispatch_outcome, ms, probe, run_tool, snapshot};
use crate::tool::{CallContext, EventSink, ToolError};
use async_trait::async_trait;
use ring0_core::Settlement;
use ring0_core::receipt::{Disposition, Timing};
use ring0_journal::IntentRecord;
use ring0_journal::recovery::Executor;
use ring0_journal::settle::{DispatchOutcome, ErrorClass, ProbeVerdict};
use serde_json::Value;
use std::sync::Arc;
use std::time::Instant;
use tokio_util::sync::CancellationToken;

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
            return dispatch_outcome(
                record,
                origin,
                Err((
                    ErrorClass::RejectedUpstream,
                    ToolError::not_applied(message),
                )),
            );
        };
        let ctx = CallContext {
            call_id: call_id.to_string(),
            intent_id: Some(record.id.to_string()),
            idempotency_key: record.mutating.then(|| record.idempotency_key.clone()),
            scope: Arc::from(record.scope.as_str()),
            cancel: CancellationToken::new(),
            timeout_ms: tool.spec.timeout_ms,
            events: EventSink::detached(),
        };
        let started = Instant::now();
        let result = run_tool(
            tool.tool.clone(),
            ctx,
            args_of(record),
            tool.spec.timeout_ms,
        )
        .await;
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

    async fn probe(&self, record: &IntentRecord) -> ProbeVerdict {
        let Some(tool) = self.registry.get(&record.tool) else {
            return ProbeVerdict::Diverged {
                detail: format!("tool {:?} is no longer registered", record.tool),
            };
        };
        probe(
            tool.tool.as_ref(),
            &args_of(record),
            record,
            tool.spec.observation_budget_bytes,
            self.shape,
        )
        .await
    }
}
