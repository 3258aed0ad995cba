//! Approvals over MCP: how a call held for a person's decision reaches the person.
//!
//! - A client that declared the elicitation capability is asked, through `elicitation/create`
//!   during the `tools/call` it made, whether to run the call (tool and prepared arguments shown,
//!   the argument hash quoted). Accept with `approve: true` approves; anything else declines.
//! - A client without elicitation gets a refusal that asks the model to obtain a confirmation
//!   code from the user; the code itself is printed to ring0's log for the person, never sent to
//!   the model. The same call made again with the code in `_meta["io.ring0/confirm"]` is
//!   approved. A code binds to the tool and the prepared arguments' hash, is used once, and
//!   expires after [`CONFIRM_TOKEN_TTL`].
//!
//! [`McpApprover`] plugs this into the policy engine's `Approver` (grants with `approval = true`,
//! anything A3); without a policy engine, the downstream session applies it to A3 calls itself.
//! Either way the question goes to the client the call came from: its [`CallRoute`], which
//! travels with the call through the kernel.
//! - A client of the 2026-07-28 era is asked the same question through an `input_required`
//!   result on its `tools/call`; the call waits, parked, for the retry that carries the answer
//!   (see [`crate::input`]), so an approved call is the same call, not a second one.

use crate::limits::{CONFIRM_TOKEN_TTL, CONFIRM_TOKENS_MAX};
use crate::log::Log;
use crate::route::CallRoute;
use async_trait::async_trait;
use ring0_kernel::CallExtensions;
use ring0_policy::{ApprovalOutcome, ApprovalRequest, Approver};
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// `_meta` key of a tools/call carrying a confirmation code a person gave.
pub const CONFIRM_META_KEY: &str = "io.ring0/confirm";

/// What asking produced.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// Approved, and how (`elicitation`, `confirmation-code`).
    Approved(&'static str),
    Declined(String),
    TimedOut,
    /// Refused for now: the model must obtain the code from the user (the reason says how).
    NeedsCode(String),
    /// The question could not be asked.
    Failed(String),
}

/// Confirmation codes, and how a person is asked.
pub struct Approvals {
    codes: Mutex<VecDeque<(String, String, String, Instant)>>,
    log: Log,
    /// Whether the downstream session gates A3 calls itself (no policy engine approves them).
    gate_a3: bool,
}

impl Approvals {
    /// `gate_a3`: true when the grants have no approval step (a plain grant table).
    pub fn new(log: Log, gate_a3: bool) -> Arc<Self> {
        Arc::new(Self {
            codes: Mutex::new(VecDeque::new()),
            log,
            gate_a3,
        })
    }

    pub fn gates_a3(&self) -> bool {
        self.gate_a3
    }

    fn mint(&self, tool: &str, args_hash: &str) -> String {
        let code = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
        let mut codes = self.codes.lock().expect("codes");
        if codes.len() >= CONFIRM_TOKENS_MAX {
            codes.pop_front();
        }
        codes.push_back((code.clone(), tool.into(), args_hash.into(), Instant::now()));
        code
    }

    fn redeem(&self, code: &str, tool: &str, args_hash: &str) -> bool {
        let mut codes = self.codes.lock().expect("codes");
        codes.retain(|(_, _, _, at)| at.elapsed() < CONFIRM_TOKEN_TTL);
        match codes
            .iter()
            .position(|(c, t, h, _)| c == code && t == tool && h == args_hash)
        {
            Some(i) => {
                codes.remove(i);
                true
            }
            None => false,
        }
    }

    /// Asks the person about one call, through the client it came from (`route`, attached to
    /// the call by the downstream server; without one, only a confirmation code can approve).
    pub async fn ask(
        &self,
        route: Option<&CallRoute>,
        tool: &str,
        args: &Value,
        args_hash: &str,
        wait: Duration,
    ) -> Answer {
        if let Some(code) = route.and_then(|r| r.confirm.clone())
            && self.redeem(&code, tool, args_hash)
        {
            return Answer::Approved("confirmation-code");
        }
        let args_text = serde_json::to_string(args).unwrap_or_default();
        let question = json!({
            "mode": "form",
            "message": format!(
                "ring0: allow {tool} with arguments {args_text}? (argument hash {args_hash})"
            ),
            "requestedSchema": {
                "type": "object",
                "properties": {"approve": {"type": "boolean", "title": "Approve", "description": "Run this call"}},
                "required": ["approve"]
            }
        });
        if let Some(route) = route.filter(|r| r.elicitation)
            && let Some(down) = route.downstream.clone()
        {
            let mut params = question;
            // The sessionful era's elicitation has no `mode`; the 2026-07-28 era's question
            // (an `input_required` result) keeps it.
            if !route.modern
                && let Some(o) = params.as_object_mut()
            {
                o.remove("mode");
            }
            return match tokio::time::timeout(
                wait,
                down.request("elicitation/create", Some(params)),
            )
            .await
            {
                Err(_) => Answer::TimedOut,
                Ok(Err(e)) => {
                    Answer::Failed(format!("the approval question could not be asked: {e}"))
                }
                Ok(Ok(answer)) if approved(&answer) => Answer::Approved("elicitation"),
                Ok(Ok(_)) => Answer::Declined("the person declined this call".into()),
            };
        }
        let code = self.mint(tool, args_hash);
        self.log.line(&format!(
            "approval needed: {tool} {args_text} (argument hash {args_hash}): confirmation code {code}"
        ));
        Answer::NeedsCode(format!(
            "{tool} needs a person's approval. ring0 showed the person a confirmation code; ask \
             the user for it, then call again with the same arguments and _meta \
             {{\"{CONFIRM_META_KEY}\": \"<code>\"}}"
        ))
    }
}

/// Whether an elicitation answer approves.
fn approved(answer: &Value) -> bool {
    answer.get("action").and_then(Value::as_str) == Some("accept")
        && answer.pointer("/content/approve").and_then(Value::as_bool) == Some(true)
}

/// The policy engine's approver for calls made over MCP.
pub struct McpApprover {
    approvals: Arc<Approvals>,
}

impl McpApprover {
    pub fn new(approvals: Arc<Approvals>) -> Self {
        Self { approvals }
    }
}

#[async_trait]
impl Approver for McpApprover {
    /// A call without a route (none of an MCP client's): only a confirmation code approves it.
    async fn decide(&self, request: &ApprovalRequest) -> ApprovalOutcome {
        self.decide_for(request, &CallExtensions::default()).await
    }

    async fn decide_for(
        &self,
        request: &ApprovalRequest,
        extensions: &CallExtensions,
    ) -> ApprovalOutcome {
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let wait = Duration::from_millis(request.deadline_ms.saturating_sub(now_ms));
        // The policy's request carries a summary, not the arguments; the summary shows them.
        let args = Value::String(request.summary.clone());
        match self
            .approvals
            .ask(
                CallRoute::of(extensions).as_deref(),
                &request.tool,
                &args,
                &request.args_hash,
                wait,
            )
            .await
        {
            Answer::Approved(_) => ApprovalOutcome::Approved {
                args_hash: request.args_hash.clone(),
            },
            Answer::Declined(reason) | Answer::NeedsCode(reason) | Answer::Failed(reason) => {
                ApprovalOutcome::Denied { reason }
            }
            Answer::TimedOut => ApprovalOutcome::TimedOut,
        }
    }
}
