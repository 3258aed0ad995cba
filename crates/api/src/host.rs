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
use crate::limits::{HOST_TOOL_TIMEOUT_MS_DEFAULT, HOST_TOOL_TIMEOUT_MS_MAX};
use crate::model::{
    ActionKind, ConcurrencyKind, EffectKind, GrammarSyntax, HostTool, HostToolType, PendingAction,
    SettlementKind, StrategyKind,
};
use async_trait::async_trait;
use ring0_core::call::FREE_FORM_INPUT;
use ring0_core::{
    ConcurrencyMark, ConflictKeyTemplate, Effect, ExecutionProfile, Observation, Settlement,
    Strategy, StrategySet, ToolSpec,
};
use ring0_kernel::{CallContext, CallExtensions, Tool, ToolError};
use ring0_policy::{ApprovalOutcome, ApprovalRequest, Approver};
use serde_json::{Value, json};
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
            Ok(Answer::Ran(Ok(Value::String(text)))) => Ok(Observation::text(text)),
            Ok(Answer::Ran(Ok(value))) => Ok(Observation::json(value)),
            Ok(Answer::Ran(Err(failure))) if !failure.maybe_applied => {
                Err(ToolError::not_applied(failure.message))
            }
            Ok(Answer::Ran(Err(failure))) => Err(ToolError::unknown(failure.message)),
            // Never posted as an approval; the session ended while the host held the call.
            Ok(Answer::Decided { .. }) | Err(_) => Err(ToolError::unknown(
                "the session ended before the host reported the outcome; it is unknown",
            )),
        }
    }
}

/// A host tool as the kernel registers it, or why it cannot be.
pub(crate) fn host_tool(def: &HostTool, loc: &str) -> Result<(ToolSpec, Arc<dyn Tool>), ApiError> {
    let schema = input_schema(def, loc)?;
    let mut spec = ToolSpec::new(&def.name, &def.description, schema);
    spec.effect = match def.effect.unwrap_or(EffectKind::NonIdempotent) {
        EffectKind::Nullipotent => Effect::Nullipotent,
        EffectKind::Idempotent => Effect::Idempotent,
        EffectKind::NonIdempotent => Effect::NonIdempotent,
    };
    if let Some(authority) = def.authority {
        spec.authority = authority.core();
    }
    if let Some(items) = &def.strategy {
        let items: Vec<Strategy> = items
            .iter()
            .map(|s| match s {
                StrategyKind::Exploration => Strategy::Exploration,
                StrategyKind::Exploitation => Strategy::Exploitation,
                StrategyKind::Neutral => Strategy::Neutral,
            })
            .collect();
        spec.strategy = StrategySet::of(&items);
    }
    spec.concurrency = match def.concurrency.unwrap_or(ConcurrencyKind::Default) {
        ConcurrencyKind::Default => ConcurrencyMark::Default,
        ConcurrencyKind::Parallel => ConcurrencyMark::Parallel,
        ConcurrencyKind::Sequential => ConcurrencyMark::Sequential,
    };
    if let Some(template) = &def.conflict_key {
        spec.conflict_key = Some(
            ConflictKeyTemplate::parse(template)
                .map_err(|e| ApiError::invalid(format!("{loc}/conflict_key"), e.to_string()))?,
        );
    }
    spec.settlement = match def.settlement.unwrap_or(SettlementKind::None) {
        SettlementKind::IdempotencyKey => Settlement::IdempotencyKey,
        SettlementKind::None => Settlement::None,
    };
    spec.timeout_ms = match def.timeout_ms {
        None => HOST_TOOL_TIMEOUT_MS_DEFAULT,
        Some(ms) if (1..=HOST_TOOL_TIMEOUT_MS_MAX).contains(&ms) => ms,
        Some(ms) => {
            return Err(ApiError::invalid(
                format!("{loc}/timeout_ms"),
                format!("{ms} is outside 1..={HOST_TOOL_TIMEOUT_MS_MAX}"),
            ));
        }
    };
    if let Some(bytes) = def.observation_budget_bytes {
        spec.observation_budget_bytes = bytes;
    }
    if def.early {
        if !spec.strategy.is_exactly_neutral() {
            return Err(ApiError::invalid(
                format!("{loc}/early"),
                "an early start needs strategy [\"neutral\"]: a call that explores or exploits waits for the turn it belongs to",
            ));
        }
        spec.execution = ExecutionProfile::EARLY;
    }
    let executor = Arc::new(HostExecutor {
        tool: def.name.clone(),
        custom: def.kind == HostToolType::Custom,
    });
    Ok((spec, executor))
}

/// The schema the kernel validates a host tool's arguments against.
fn input_schema(def: &HostTool, loc: &str) -> Result<Value, ApiError> {
    match def.kind {
        HostToolType::Function => {
            if def.grammar.is_some() {
                return Err(ApiError::invalid(
                    format!("{loc}/grammar"),
                    "a grammar belongs to a custom tool (type: custom)",
                ));
            }
            match &def.input_schema {
                Some(schema @ Value::Object(_)) => Ok(schema.clone()),
                Some(_) => Err(ApiError::invalid(
                    format!("{loc}/input_schema"),
                    "a JSON Schema object is expected",
                )),
                None => Err(ApiError::invalid(
                    format!("{loc}/input_schema"),
                    "a function tool needs its input_schema",
                )),
            }
        }
        HostToolType::Custom => {
            if def.input_schema.is_some() {
                return Err(ApiError::invalid(
                    format!("{loc}/input_schema"),
                    "a custom tool takes free-form text: give a grammar, not an input_schema",
                ));
            }
            let mut input = json!({"type": "string"});
            if let Some(grammar) = &def.grammar
                && grammar.syntax == GrammarSyntax::Regex
            {
                // The whole input must match, as constrained decoding produces it.
                input["pattern"] = Value::String(format!("^(?:{})$", grammar.definition));
            }
            Ok(json!({
                "type": "object",
                "properties": {FREE_FORM_INPUT: input},
                "required": [FREE_FORM_INPUT],
                "additionalProperties": false,
            }))
        }
    }
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

    fn def(value: Value) -> HostTool {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn a_custom_tools_grammar_must_match_its_whole_input() {
        let (spec, _) = host_tool(
            &def(json!({"name": "sql", "type": "custom",
                        "grammar": {"syntax": "regex", "definition": "SELECT|UPDATE"}})),
            "/tools/0",
        )
        .unwrap();
        assert_eq!(
            spec.input_schema["properties"]["input"]["pattern"],
            "^(?:SELECT|UPDATE)$"
        );
        assert_eq!(spec.input_schema["required"], json!(["input"]));
    }

    #[test]
    fn a_host_tool_is_conservative_unless_it_says_otherwise() {
        let (spec, _) = host_tool(
            &def(json!({"name": "t", "input_schema": {"type": "object"}})),
            "/tools/0",
        )
        .unwrap();
        assert_eq!(spec.effect, Effect::NonIdempotent);
        assert_eq!(spec.authority, ring0_core::Authority::A2);
        assert_eq!(spec.settlement, Settlement::None);
        assert_eq!(spec.timeout_ms, HOST_TOOL_TIMEOUT_MS_DEFAULT);
    }

    #[test]
    fn a_function_tool_needs_its_schema_and_a_timeout_within_bounds() {
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
