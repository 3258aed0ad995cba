//! Recovery at start: the journal's open records are settled from the log alone, with the
//! registered tools as executors.
//!
//! A record left DISPATCHED by a crash goes to UNKNOWN and is reconciled by its tool's declared
//! settlement (idempotency key, probe, or DEAD_LETTER for a person) — never dispatched again
//! blindly. A record left RECORDED was authorized and committed but never sent; by default it is
//! dispatched now. Call [`crate::Kernel::recover`] once when a process opens a durable journal,
//! before serving.

use crate::registry::Registry;
use crate::tool::{CallContext, EventSink, FailureClass, ProbeVerdict};
use async_trait::async_trait;
use ring0_core::receipt::{CallOutcome, Disposition, Timing};
use ring0_core::{Observation, Receipt, Settlement};
use ring0_journal::IntentRecord;
use ring0_journal::recovery::Executor;
use ring0_journal::settle::{DispatchOutcome, ErrorClass, ProbeVerdict as JournalVerdict};
use serde_json::Value;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

pub(crate) struct RegistryExecutor<'a> {
    pub registry: &'a Registry,
}

fn args_of(record: &IntentRecord) -> Value {
    serde_json::from_str(&record.canonical_args).unwrap_or(Value::Null)
}

fn receipt(record: &IntentRecord, outcome: CallOutcome, run_ms: u64) -> Receipt {
    Receipt {
        call_id: record.call_ids.last().cloned().unwrap_or_default(),
        index: 0,
        tool: record.tool.clone(),
        intent_id: Some(record.id.to_string()),
        semantic_key: Some(record.semantic_key),
        idempotency_key: Some(record.idempotency_key.clone()),
        state: Some(record.state),
        revision: record.fence,
        timeline: Vec::new(),
        disposition: Disposition::Recovered,
        outcome,
        timing: Timing {
            queued_ms: 0,
            run_ms,
        },
    }
}

#[async_trait]
impl Executor for RegistryExecutor<'_> {
    fn settlement(&self, record: &IntentRecord) -> Settlement {
        self.registry
            .get(&record.tool)
            .map(|t| t.spec.settlement)
            .unwrap_or(Settlement::None)
    }

    async fn snapshot(&self, record: &IntentRecord) -> Option<Value> {
        let tool = self.registry.get(&record.tool)?;
        if tool.spec.settlement != Settlement::Probe {
            return None;
        }
        tool.tool.snapshot(&args_of(record)).await
    }

    async fn dispatch(&self, record: &IntentRecord) -> DispatchOutcome {
        let Some(tool) = self.registry.get(&record.tool) else {
            let message = format!("tool {:?} is no longer registered", record.tool);
            return DispatchOutcome::Failed {
                class: ErrorClass::RejectedUpstream,
                receipt: receipt(
                    record,
                    CallOutcome::Failed {
                        message,
                        uncertain: false,
                        observation: None,
                    },
                    0,
                ),
            };
        };
        let ctx = CallContext {
            call_id: record.call_ids.last().cloned().unwrap_or_default(),
            intent_id: Some(record.id.to_string()),
            idempotency_key: Some(record.idempotency_key.clone()),
            scope: Arc::from(record.scope.as_str()),
            cancel: CancellationToken::new(),
            timeout_ms: tool.spec.timeout_ms,
            events: EventSink::detached(),
        };
        let started = Instant::now();
        let run = tool.tool.call(ctx, args_of(record));
        let result = tokio::time::timeout(Duration::from_millis(tool.spec.timeout_ms), run).await;
        let run_ms = started.elapsed().as_millis() as u64;
        match result {
            Ok(Ok(observation)) => DispatchOutcome::Applied(receipt(
                record,
                CallOutcome::Completed { observation },
                run_ms,
            )),
            Ok(Err(e)) => DispatchOutcome::Failed {
                class: match e.class {
                    FailureClass::NotApplied => ErrorClass::RejectedUpstream,
                    FailureClass::Unknown => ErrorClass::Other,
                },
                receipt: receipt(
                    record,
                    CallOutcome::Failed {
                        uncertain: e.class == FailureClass::Unknown,
                        message: e.message,
                        observation: e.observation,
                    },
                    run_ms,
                ),
            },
            Err(_) => DispatchOutcome::Failed {
                class: ErrorClass::Timeout,
                receipt: receipt(
                    record,
                    CallOutcome::Failed {
                        message: format!("timed out after {} ms", tool.spec.timeout_ms),
                        uncertain: true,
                        observation: None,
                    },
                    run_ms,
                ),
            },
        }
    }

    async fn probe(&self, record: &IntentRecord) -> JournalVerdict {
        let Some(tool) = self.registry.get(&record.tool) else {
            return JournalVerdict::Diverged {
                detail: format!("tool {:?} is no longer registered", record.tool),
            };
        };
        match tool
            .tool
            .probe(&args_of(record), record.snapshot.as_ref())
            .await
        {
            ProbeVerdict::Applied(obs) => JournalVerdict::PostconditionHolds {
                evidence: serde_json::to_value::<&Observation>(&obs).ok(),
            },
            ProbeVerdict::Unchanged => JournalVerdict::Unchanged,
            ProbeVerdict::Indeterminate(detail) => JournalVerdict::Diverged { detail },
        }
    }
}
