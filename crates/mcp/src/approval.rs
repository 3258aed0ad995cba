//! Approvals over MCP: how a call held for a person's decision reaches the person.
//!
//! - A client that declared the elicitation capability is asked, through `elicitation/create`
//!   during the `tools/call` it made, whether to run the call: the tool, the prepared arguments
//!   as a person must see them (escaped, whole or — when too long — cut with a pointer to
//!   ring0's log, which shows them whole), and the argument digest the approval binds to. Accept
//!   with `approve: true` approves; anything else declines. Where the grant's `approval_scope`
//!   offers it, the form has a `scope` field: `"session"` allows identical calls for the rest
//!   of the session.
//! - A client that did not declare elicitation (in either era) is never sent a question. It
//!   gets an `approval_required` refusal that tells the model to ask the user for the
//!   confirmation code; the code itself is shown to the person only — printed to ring0's log
//!   (the terminal `ring0 serve` runs in, or the client's server log) with the whole
//!   arguments — and is random, so nothing the model sees lets it derive the code. The person
//!   reads it to the model, which makes the same call again with one more ordinary argument,
//!   [`CONFIRM_ARGUMENT`]: the downstream server takes it out of the arguments before the call
//!   is prepared (never validated, hashed or forwarded) and the code approves the call. The
//!   code followed by [`SESSION_CODE_SUFFIX`] approves it for the session where that is
//!   offered. (`_meta["io.ring0/confirm"]` carries a code too, for hosts that can set it.) A
//!   code binds to the principal and session it was minted for, the tool and the prepared
//!   arguments' hash, is used once, and expires after [`CONFIRM_TOKEN_TTL`].
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
use ring0_policy::{ApprovalOutcome, ApprovalRequest, Approver, render_args, shown_args};
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The argument a model adds to a call to carry the confirmation code a person read to it.
/// Reserved: taken out of every call's arguments before the call is prepared.
pub const CONFIRM_ARGUMENT: &str = "ring0_confirmation_code";
/// `_meta` key of a tools/call carrying a confirmation code a person gave.
pub const CONFIRM_META_KEY: &str = "io.ring0/confirm";
/// Appended to a confirmation code, approves identical calls for the rest of the session (where
/// the grant offers it).
pub const SESSION_CODE_SUFFIX: &str = "+session";

/// One question to a person about one held call.
pub struct Question<'a> {
    pub call_id: &'a str,
    pub tool: &'a str,
    /// The whole prepared arguments.
    pub args: &'a Value,
    pub args_hash: &'a str,
    /// Who asks, and in which session: a confirmation code answers only there.
    pub principal: &'a str,
    pub session_id: &'a str,
    /// The approval id, named where the whole arguments are shown.
    pub approval_id: &'a str,
    /// What "allow for this session" would allow, when the grant offers it.
    pub remember: Option<&'a str>,
    pub wait: Duration,
}

/// What asking produced.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// Approved, and how (`elicitation`, `confirmation-code`); for this call only.
    Approved(&'static str),
    /// Approved for identical calls for the rest of the session.
    ApprovedForSession(&'static str),
    Declined(String),
    TimedOut,
    /// Not decided yet: the model must obtain the code from the user (the text says how).
    NeedsCode(String),
    /// The question could not be asked.
    Failed(String),
}

/// A minted confirmation code and what it answers.
struct Code {
    code: String,
    /// Principal and session the code was minted for.
    binding: String,
    tool: String,
    args_hash: String,
    /// Whether `code` + [`SESSION_CODE_SUFFIX`] may approve for the session.
    remember: bool,
    minted: Instant,
}

/// Confirmation codes and the call registry they are checked against.
pub struct Approvals {
    codes: Mutex<VecDeque<Code>>,
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

    fn mint(&self, q: &Question<'_>, binding: String) -> String {
        let code = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
        let mut codes = self.codes.lock().expect("codes");
        if codes.len() >= CONFIRM_TOKENS_MAX {
            codes.pop_front();
        }
        codes.push_back(Code {
            code: code.clone(),
            binding,
            tool: q.tool.into(),
            args_hash: q.args_hash.into(),
            remember: q.remember.is_some(),
            minted: Instant::now(),
        });
        code
    }

    /// Uses up the code `given` if it answers this question; says whether it approves for the
    /// session.
    fn redeem(&self, given: &str, q: &Question<'_>, binding: &str) -> Option<Answer> {
        let (code, for_session) = match given.strip_suffix(SESSION_CODE_SUFFIX) {
            Some(code) => (code, true),
            None => (given, false),
        };
        let mut codes = self.codes.lock().expect("codes");
        codes.retain(|c| c.minted.elapsed() < CONFIRM_TOKEN_TTL);
        let i = codes.iter().position(|c| {
            c.code == code
                && c.binding == *binding
                && c.tool == q.tool
                && c.args_hash == q.args_hash
                && (!for_session || c.remember)
        })?;
        codes.remove(i);
        Some(if for_session {
            Answer::ApprovedForSession("confirmation-code")
        } else {
            Answer::Approved("confirmation-code")
        })
    }

    /// Asks the person about one call, through the client it came from (`route`, attached to
    /// the call by the downstream server; without one, only a confirmation code can approve).
    pub async fn ask(&self, route: Option<&CallRoute>, q: &Question<'_>) -> Answer {
        // A 2026-07-28 request has a session of its own (no session spans two requests), so
        // its code binds to the principal alone; a sessionful one's to its session as well.
        let binding = match route {
            Some(r) if r.modern => binding(q.principal, ""),
            _ => binding(q.principal, q.session_id),
        };
        if let Some(code) = route.and_then(|r| r.confirm.clone())
            && let Some(answer) = self.redeem(&code, q, &binding)
        {
            return answer;
        }
        let (shown, whole) = shown_args(q.args, q.approval_id, q.args_hash);
        if !whole {
            self.log.line(&format!(
                "approval {}: the whole arguments of {} (digest {}): {}",
                q.approval_id,
                q.tool,
                q.args_hash,
                render_args(q.args)
            ));
        }
        if let Some(route) = route.filter(|r| r.elicitation)
            && let Some(down) = route.downstream.clone()
        {
            let params = question(q, &shown, whole, route.modern);
            return match tokio::time::timeout(
                q.wait,
                down.request("elicitation/create", Some(params)),
            )
            .await
            {
                Err(_) => Answer::TimedOut,
                Ok(Err(e)) => {
                    Answer::Failed(format!("the approval question could not be asked: {e}"))
                }
                Ok(Ok(answer)) => match approved(&answer) {
                    Some(true) if q.remember.is_some() => Answer::ApprovedForSession("elicitation"),
                    Some(_) => Answer::Approved("elicitation"),
                    None => Answer::Declined("the person declined this call".into()),
                },
            };
        }
        let code = self.mint(q, binding);
        let session_variant = match q.remember {
            Some(what) => {
                format!("; or {code}{SESSION_CODE_SUFFIX} to also allow identical calls for {what}")
            }
            None => String::new(),
        };
        self.log.line(&format!(
            "approval needed: {} {} (argument digest {}): confirmation code {code}{session_variant}",
            q.tool,
            if whole { shown.as_str() } else { "(arguments logged whole above)" },
            q.args_hash
        ));
        Answer::NeedsCode(format!(
            "ask the user for the confirmation code ring0 showed them for this call (never guess \
             it), then call {} again with the same arguments plus the argument \
             {CONFIRM_ARGUMENT} set to that code",
            q.tool
        ))
    }
}

/// A code answers only the principal and session it was minted for.
fn binding(principal: &str, session_id: &str) -> String {
    format!("{principal}\u{0}{session_id}")
}

/// The elicitation form for one question. The sessionful era's elicitation has no `mode`; the
/// 2026-07-28 era's question (an `input_required` result) keeps it.
fn question(q: &Question<'_>, shown: &str, whole: bool, modern: bool) -> Value {
    let where_whole = if whole {
        String::new()
    } else {
        format!(
            "\nThe arguments are too long to show here: ring0's log shows them whole under approval {}.",
            q.approval_id
        )
    };
    let mut properties = json!({
        "approve": {"type": "boolean", "title": "Approve", "description": "Run this call"}
    });
    if let Some(what) = q.remember {
        properties["scope"] = json!({
            "type": "string",
            "title": "Allow for",
            "description": format!("\"session\": also run identical calls for {what} without asking"),
            "enum": ["once", "session"],
            "default": "once"
        });
    }
    let mut params = json!({
        "mode": "form",
        "message": prompt(q, shown, &where_whole),
        "requestedSchema": {"type": "object", "properties": properties, "required": ["approve"]}
    });
    if !modern && let Some(o) = params.as_object_mut() {
        o.remove("mode");
    }
    params
}

/// The text of the question: rendered once (the arguments as [`shown_args`] escaped them,
/// never escaped again as a JSON string), one fact per line, bounded by the shown arguments'
/// own bound.
fn prompt(q: &Question<'_>, shown: &str, where_whole: &str) -> String {
    format!(
        "ring0: allow {}?\narguments: {shown}\nargument digest: {}{where_whole}",
        q.tool, q.args_hash
    )
}

/// Whether an elicitation answer approves: `None` declines, `Some(true)` approves for the
/// session, `Some(false)` approves this call.
fn approved(answer: &Value) -> Option<bool> {
    let yes = answer.get("action").and_then(Value::as_str) == Some("accept")
        && answer.pointer("/content/approve").and_then(Value::as_bool) == Some(true);
    yes.then(|| answer.pointer("/content/scope").and_then(Value::as_str) == Some("session"))
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
        let question = Question {
            call_id: &request.call_id,
            tool: &request.tool,
            args: &request.args,
            args_hash: &request.args_hash,
            principal: &request.principal,
            session_id: &request.session_id,
            approval_id: &request.id,
            remember: request.remember.as_deref(),
            wait: Duration::from_millis(request.deadline_ms.saturating_sub(now_ms)),
        };
        let args_hash = request.args_hash.clone();
        let route = CallRoute::of(extensions);
        match self.approvals.ask(route.as_deref(), &question).await {
            Answer::Approved(_) => ApprovalOutcome::Approved { args_hash },
            Answer::ApprovedForSession(_) => ApprovalOutcome::ApprovedForSession { args_hash },
            Answer::NeedsCode(next) => ApprovalOutcome::Pending { next },
            Answer::Declined(reason) | Answer::Failed(reason) => ApprovalOutcome::Denied { reason },
            Answer::TimedOut => ApprovalOutcome::TimedOut,
        }
    }
}
