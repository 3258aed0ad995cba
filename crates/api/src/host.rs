//! Host tools: tools the host defines (`PUT /v1/sessions/{id}/tools`) and runs itself.
//!
//! A host tool is registered in the session's kernel like any other, with the runtime metadata
//! the host declares, so its calls are validated, authorized by the principal's grants,
//! committed, ordered and settled by the kernel; only the run is the host's. Its executor
//! ([`HostExecutor`]) posts the call to the turn's [`Board`] as a `run` action with the prepared
//! arguments, the intent and its idempotency key, and waits for the host's outcome within the
//! tool's timeout. A custom tool (free-form input) is a tool whose one argument is the string
//! `input`, with its regular-expression grammar as that string's `pattern`.
//!
//! [`HostApprovals`] is the approval channel of API calls: a call the grants hold for a person
//! is posted as an `approval_required` action, and the host's answer decides it.

use crate::board::{Answer, Board, TurnLink};
use crate::error::ApiError;
use crate::model::{ActionKind, HostTool, HostToolType, PendingAction};
use async_trait::async_trait;
use ring0_core::call::FREE_FORM_INPUT;
use ring0_core::{Observation, ToolSpec};
use ring0_kernel::{CallContext, CallExtensions, Tool, ToolError};
use ring0_policy::{ApprovalOutcome, ApprovalRequest, Approver};
use serde_json::Value;
use std::sync::Arc;

/// A fresh action id.
pub(crate) fn action_id() -> String {
    format!("act_{}", &uuid::Uuid::new_v4().simple().to_string()[..20])
}

pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Runs a host tool's call by asking the host.
pub(crate) struct HostExecutor {
    tool: String,
    custom: bool,
}

#[async_trait]
impl Tool for HostExecutor {
    async fn call(&self, ctx: CallContext, args: Value) -> Result<Observation, ToolError> {
        let Some(link) = ctx.extensions.get::<TurnLink>() else {
            return Err(ToolError::not_applied(
                "a host tool runs only in a turn of the HTTP agent API; nothing was run",
            ));
        };
        let input = self
            .custom
            .then(|| args.get(FREE_FORM_INPUT).and_then(Value::as_str))
            .flatten()
            .map(str::to_string);
        let action = PendingAction {
            id: action_id(),
            kind: ActionKind::Run,
            call_id: ctx.call_id.clone(),
            tool: self.tool.clone(),
            arguments: args,
            input,
            intent_id: ctx.intent_id.clone(),
            idempotency_key: ctx.idempotency_key.clone(),
            args_hash: None,
            reason: None,
            summary: None,
            deadline_ms: now_ms().saturating_add(ctx.timeout_ms),
        };
        let Some((posted, answer)) = link.0.post(action) else {
            return Err(ToolError::not_applied(
                "the session ended before the host could run the call; nothing was run",
            ));
        };
        let answer = tokio::select! {
            answer = answer => answer,
            _ = ctx.cancel.cancelled() => {
                return Err(ToolError::unknown(
                    "the call was stopped while the host ran it; its outcome is unknown",
                ));
            }
        };
        drop(posted);
        match answer {
            Ok(Answer::Ran(reported)) => ring0_host::host_outcome(reported),
            // Never posted as an approval; the session ended while the host held the call.
            Ok(Answer::Decided { .. }) | Err(_) => Err(ToolError::unknown(
                "the session ended before the host reported the outcome; it is unknown",
            )),
        }
    }
}

/// A host tool as the kernel registers it (the spec `ring0-host` makes of its declaration, run
/// by asking the host), or why it cannot be.
pub(crate) fn host_tool(def: &HostTool, loc: &str) -> Result<(ToolSpec, Arc<dyn Tool>), ApiError> {
    let spec = ring0_host::tool_spec(def)
        .map_err(|p| ApiError::invalid(format!("{loc}{}", p.loc), p.message))?;
    let executor = Arc::new(HostExecutor {
        tool: def.name.clone(),
        custom: def.kind == HostToolType::Custom,
    });
    Ok((spec, executor))
}

/// Asks the host about a held API call; any other call goes to `inner`, the server's channel.
pub struct HostApprovals {
    inner: Arc<dyn Approver>,
}

impl HostApprovals {
    /// Held calls of API turns are asked of their host; others go to `inner`.
    pub fn new(inner: Arc<dyn Approver>) -> Self {
        Self { inner }
    }
}

#[async_trait]
impl Approver for HostApprovals {
    async fn decide(&self, request: &ApprovalRequest) -> ApprovalOutcome {
        self.inner.decide(request).await
    }

    async fn decide_for(
        &self,
        request: &ApprovalRequest,
        extensions: &CallExtensions,
    ) -> ApprovalOutcome {
        match extensions.get::<TurnLink>() {
            Some(link) => ask_host(&link.0, request).await,
            None => self.inner.decide_for(request, extensions).await,
        }
    }
}

async fn ask_host(board: &Arc<Board>, request: &ApprovalRequest) -> ApprovalOutcome {
    let action = PendingAction {
        id: action_id(),
        kind: ActionKind::ApprovalRequired,
        call_id: request.call_id.clone(),
        tool: request.tool.clone(),
        arguments: request.args.clone(),
        input: None,
        intent_id: None,
        idempotency_key: None,
        args_hash: Some(request.args_hash.clone()),
        reason: Some(request.reason.clone()),
        summary: Some(request.summary.clone()),
        deadline_ms: request.deadline_ms,
    };
    let Some((posted, answer)) = board.post(action) else {
        return ApprovalOutcome::Denied {
            reason: "the session ended before anyone decided".into(),
        };
    };
    let wait = std::time::Duration::from_millis(request.deadline_ms.saturating_sub(now_ms()));
    let answer = tokio::time::timeout(wait, answer).await;
    drop(posted);
    match answer {
        Err(_) => ApprovalOutcome::TimedOut,
        Ok(Ok(Answer::Decided {
            approve: true,
            remember,
            ..
        })) => {
            let args_hash = request.args_hash.clone();
            if remember && request.remember.is_some() {
                ApprovalOutcome::ApprovedForSession { args_hash }
            } else {
                ApprovalOutcome::Approved { args_hash }
            }
        }
        Ok(Ok(Answer::Decided { reason, .. })) => ApprovalOutcome::Denied { reason },
        Ok(Ok(Answer::Ran(_)) | Err(_)) => ApprovalOutcome::Denied {
            reason: "the session ended before anyone decided".into(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::HOST_TOOL_TIMEOUT_MS_MAX;
    use serde_json::json;

    fn def(value: Value) -> HostTool {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn a_refused_declaration_is_located_in_the_request() {
        let Err(e) = host_tool(&def(json!({"name": "t"})), "/tools/3") else {
            panic!("a function tool without a schema was accepted")
        };
        assert_eq!(e.errors[0].loc, "/tools/3/input_schema");
        let Err(e) = host_tool(
            &def(json!({"name": "t", "input_schema": {"type": "object"},
                        "timeout_ms": HOST_TOOL_TIMEOUT_MS_MAX + 1})),
            "/tools/0",
        ) else {
            panic!("a timeout beyond the bound was accepted")
        };
        assert_eq!(e.errors[0].loc, "/tools/0/timeout_ms");
    }
}
