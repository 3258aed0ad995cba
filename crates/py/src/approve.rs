//! The approval channel of the Python package: how a call the grants hold for a person is
//! decided from Python.
//!
//! - With an `approver` callable, the held call waits while it is asked (it gets the request:
//!   tool, arguments, their digest, the reason and the summary a person is shown) and answers
//!   `True` (approve this call), `"session"` (approve identical calls for the rest of the
//!   session, where the grant offers it), `False` or a reason string (deny), or a dict
//!   `{"approve": bool, "remember": bool, "reason": str}`. It may be a coroutine function.
//! - With `approvals="wait"`, the held call waits until `approve(id)` / `deny(id)` is called from
//!   another thread or task (or the approval timeout passes).
//! - Otherwise (`approvals="hold"`, the default), the call comes back to the model as
//!   `approval_required`, and the request is kept: once `approve(id)` is called, the same call
//!   (same session, tool and arguments) made again runs — a re-run of the same turn runs it.
//!
//! Every approval binds to the prepared arguments' digest, as the policy requires.

use crate::tool::{Bridge, LoopRef, call_maybe_async};
use async_trait::async_trait;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyString};
use ring0_kernel::CallExtensions;
use ring0_policy::{ApprovalOutcome, ApprovalRequest, Approver};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

/// Held calls kept for `approve` at once; the oldest goes first past it.
const PENDING_MAX: usize = 1024;

/// How held calls are decided.
pub(crate) enum Mode {
    Hold,
    Wait,
    Callback(Py<PyAny>),
}

struct Pending {
    request: ApprovalRequest,
    /// The held call waiting for the answer (`wait` mode).
    waiting: Option<oneshot::Sender<ApprovalOutcome>>,
}

/// A decision given for a held call that was answered `approval_required`: the next identical
/// call of the session takes it.
struct Given {
    session_id: String,
    tool: String,
    args_hash: String,
    outcome: ApprovalOutcome,
}

/// Held calls and decisions given ahead of their call.
pub(crate) struct Approvals {
    mode: Mode,
    bridge: Arc<Bridge>,
    pending: Mutex<BTreeMap<String, Pending>>,
    given: Mutex<Vec<Given>>,
}

impl Approvals {
    pub(crate) fn new(mode: Mode, bridge: Arc<Bridge>) -> Self {
        Self {
            mode,
            bridge,
            pending: Mutex::default(),
            given: Mutex::default(),
        }
    }

    /// The calls held now, of one session or all.
    pub(crate) fn pending(&self, session_id: Option<&str>) -> Vec<ApprovalRequest> {
        self.pending
            .lock()
            .expect("pending")
            .values()
            .filter(|p| session_id.is_none_or(|s| p.request.session_id == s))
            .map(|p| p.request.clone())
            .collect()
    }

    /// Decides held call `id`: `Some(outcome)`, or `None` when there is no such call.
    pub(crate) fn decide(&self, id: &str, approve: bool, remember: bool, reason: &str) -> bool {
        let Some(pending) = self.pending.lock().expect("pending").remove(id) else {
            return false;
        };
        let args_hash = pending.request.args_hash.clone();
        let outcome = match (approve, remember) {
            (true, true) => ApprovalOutcome::ApprovedForSession { args_hash },
            (true, false) => ApprovalOutcome::Approved { args_hash },
            (false, _) => ApprovalOutcome::Denied {
                reason: if reason.is_empty() {
                    "denied by a person".into()
                } else {
                    reason.to_string()
                },
            },
        };
        match pending.waiting {
            Some(tx) => {
                let _ = tx.send(outcome);
            }
            None => self.given.lock().expect("given").push(Given {
                session_id: pending.request.session_id,
                tool: pending.request.tool,
                args_hash: pending.request.args_hash,
                outcome,
            }),
        }
        true
    }

    fn keep(&self, request: &ApprovalRequest, waiting: Option<oneshot::Sender<ApprovalOutcome>>) {
        let mut pending = self.pending.lock().expect("pending");
        while pending.len() >= PENDING_MAX {
            let Some(oldest) = pending
                .values()
                .min_by_key(|p| p.request.created_at_ms)
                .map(|p| p.request.id.clone())
            else {
                break;
            };
            pending.remove(&oldest);
        }
        pending.insert(
            request.id.clone(),
            Pending {
                request: request.clone(),
                waiting,
            },
        );
    }

    /// A decision given ahead for this call, taken.
    fn take_given(&self, request: &ApprovalRequest) -> Option<ApprovalOutcome> {
        let mut given = self.given.lock().expect("given");
        let at = given.iter().position(|g| {
            g.session_id == request.session_id
                && g.tool == request.tool
                && g.args_hash == request.args_hash
        })?;
        Some(given.remove(at).outcome)
    }

    async fn ask(
        &self,
        callback: &Py<PyAny>,
        request: &ApprovalRequest,
        event_loop: Option<&LoopRef>,
    ) -> ApprovalOutcome {
        let value = match serde_json::to_value(request) {
            Ok(v) => v,
            Err(e) => {
                return ApprovalOutcome::Denied {
                    reason: format!("the request could not be shown: {e}"),
                };
            }
        };
        let answer = call_maybe_async(&self.bridge, callback, &value, event_loop).await;
        Python::attach(|py| match answer {
            Ok(v) => read_answer(v.bind(py), &request.args_hash),
            Err(e) => ApprovalOutcome::Denied {
                reason: format!("the approver failed: {}", e.value(py)),
            },
        })
    }
}

/// An approver's answer as an outcome.
fn read_answer(v: &Bound<'_, PyAny>, args_hash: &str) -> ApprovalOutcome {
    let args_hash = args_hash.to_string();
    if let Ok(b) = v.cast::<PyBool>() {
        return if b.is_true() {
            ApprovalOutcome::Approved { args_hash }
        } else {
            ApprovalOutcome::Denied {
                reason: "denied by the approver".into(),
            }
        };
    }
    if let Ok(s) = v.cast::<PyString>() {
        let s = s.to_string();
        return match s.as_str() {
            "session" => ApprovalOutcome::ApprovedForSession { args_hash },
            "approve" | "once" => ApprovalOutcome::Approved { args_hash },
            _ => ApprovalOutcome::Denied { reason: s },
        };
    }
    if let Ok(d) = v.cast::<PyDict>() {
        let flag = |k: &str| {
            d.get_item(k)
                .ok()
                .flatten()
                .and_then(|x| x.is_truthy().ok())
                .unwrap_or(false)
        };
        if flag("approve") {
            return if flag("remember") {
                ApprovalOutcome::ApprovedForSession { args_hash }
            } else {
                ApprovalOutcome::Approved { args_hash }
            };
        }
        let reason = d
            .get_item("reason")
            .ok()
            .flatten()
            .and_then(|r| r.str().ok().map(|s| s.to_string()))
            .unwrap_or_else(|| "denied by the approver".into());
        return ApprovalOutcome::Denied { reason };
    }
    if v.is_none() {
        return ApprovalOutcome::Denied {
            reason: "the approver gave no answer".into(),
        };
    }
    match v.is_truthy() {
        Ok(true) => ApprovalOutcome::Approved { args_hash },
        _ => ApprovalOutcome::Denied {
            reason: "denied by the approver".into(),
        },
    }
}

/// Removes a waiting held call from the pending ones when its wait ends.
struct Forget<'a>(&'a Approvals, &'a str);

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.0.pending.lock().expect("pending").remove(self.1);
    }
}

/// The approver the policy asks; shares [`Approvals`] with the kernel object.
pub(crate) struct PyApprover(pub Arc<Approvals>);

#[async_trait]
impl Approver for PyApprover {
    async fn decide(&self, request: &ApprovalRequest) -> ApprovalOutcome {
        self.decide_for(request, &CallExtensions::new()).await
    }

    async fn decide_for(
        &self,
        request: &ApprovalRequest,
        extensions: &CallExtensions,
    ) -> ApprovalOutcome {
        let approvals = &self.0;
        if let Some(outcome) = approvals.take_given(request) {
            return outcome;
        }
        match &approvals.mode {
            Mode::Callback(callback) => {
                let event_loop = extensions.get::<LoopRef>();
                approvals
                    .ask(callback, request, event_loop.as_deref())
                    .await
            }
            Mode::Wait => {
                let (tx, rx) = oneshot::channel();
                approvals.keep(request, Some(tx));
                // Forgotten however the wait ends: answered, or cut at the policy's deadline.
                let _forget = Forget(approvals, &request.id);
                rx.await.unwrap_or(ApprovalOutcome::TimedOut)
            }
            Mode::Hold => {
                approvals.keep(request, None);
                ApprovalOutcome::Pending {
                    next: format!(
                        "a person approves it in the host (approval {}); the same call made again then runs",
                        request.id
                    ),
                }
            }
        }
    }
}
