//! Held calls over the API: the calling principal's calls waiting for a person's approval, and
//! an operator's decision of one.
//!
//! A decision is made on the held call's record in the journal (`Journal::hold_decide`, once,
//! a compare-and-set from PENDING), the same way the console and the webhook's links decide:
//! the call waiting for it is released by its approver, and runs once. Only a principal with
//! the operator role (the server's `[console]` operators and groups, handed in as
//! [`crate::ApiOptions::is_operator`]) may decide; anyone else is refused `403` and nothing
//! changes. A decision that names other arguments' digest than the held call's is refused too.

use crate::Api;
use crate::error::{ApiError, ErrorKind};
use crate::routes::{journal_unavailable, principal, read_json};
use axum::Extension;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use ring0_core::Principal;
use ring0_journal::{HeldCall, HoldDecided, HoldState, Journal};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Most held calls one list answers with (the oldest first).
pub const APPROVALS_LISTED_MAX: usize = 200;
/// Longest reason a denial may give, in bytes.
pub const DENIAL_REASON_BYTES_MAX: usize = 1024;
/// Longest summary of a held call shown in a list, in bytes.
pub const APPROVAL_SUMMARY_BYTES_MAX: usize = 2 * 1024;

const _: () = assert!(APPROVALS_LISTED_MAX <= ring0_journal::hold::HOLDS_LISTED_MAX);

/// One call held for a person's approval.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Approval {
    /// The approval's id (`ap_…`).
    pub id: String,
    /// The tool the call would run.
    pub tool: String,
    /// The session scope the call is in.
    pub scope: String,
    /// What a person is shown (cut to 2048 bytes).
    pub summary: String,
    /// The fingerprint of the exact prepared arguments: a decision may name it, and is refused
    /// if it names another.
    pub args_hash: String,
    /// When it was held, in Unix milliseconds.
    pub created_ms: u64,
    /// When it lapses undecided, in Unix milliseconds.
    pub deadline_ms: u64,
}

/// The calling principal's calls waiting for a person, oldest first.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ApprovalList {
    /// At most 200.
    pub approvals: Vec<Approval>,
}

/// An operator's decision of one held call.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApprovalDecision {
    /// Approve (`true`: the call runs, once) or deny it.
    pub approve: bool,
    /// Why it was denied, told to the model (at most 1024 bytes).
    #[serde(default)]
    pub reason: Option<String>,
    /// The `args_hash` the decision is for; refused when it is not the held call's.
    #[serde(default)]
    pub args_hash: Option<String>,
}

/// A held call as decided.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ApprovalDecided {
    /// The approval's id.
    pub id: String,
    /// `APPROVED` or `DENIED`.
    pub state: String,
}

fn approval(held: &HeldCall) -> Approval {
    Approval {
        id: held.approval_id.clone(),
        tool: held.tool.clone(),
        scope: held.scope.clone(),
        summary: ring0_core::limits::clip_with_length(&held.summary, APPROVAL_SUMMARY_BYTES_MAX)
            .into_owned(),
        args_hash: held.args_hash.clone(),
        created_ms: held.created_ms,
        deadline_ms: held.deadline_ms,
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The calling principal's calls held for a person's approval, oldest first.
#[utoipa::path(get, path = "/v1/approvals", tag = "approvals",
    responses(
        (status = 200, body = ApprovalList),
        (status = 422, body = ApiError), (status = 503, body = ApiError),
    ))]
pub(crate) async fn list_approvals(
    State(api): State<Api>,
    who: Option<Extension<Principal>>,
    uri: axum::http::Uri,
) -> Result<axum::Json<ApprovalList>, ApiError> {
    let principal = principal(who)?;
    if uri.query().is_some_and(|q| !q.is_empty()) {
        return Err(ApiError::invalid(
            "",
            "this route takes no query parameters",
        ));
    }
    let now = now_ms();
    let journal: &dyn Journal = api.inner.parts.gateway.journal().as_ref();
    let held = journal.holds_pending().await.map_err(journal_unavailable)?;
    let approvals = held
        .iter()
        .filter(|h| h.principal == principal.id && h.is_pending_at(now))
        .take(APPROVALS_LISTED_MAX)
        .map(approval)
        .collect();
    Ok(axum::Json(ApprovalList { approvals }))
}

/// Decides one held call, for a principal with the operator role: approved, the waiting call
/// runs once; denied, the model is told why.
#[utoipa::path(post, path = "/v1/approvals/{id}", tag = "approvals",
    params(("id" = String, Path, description = "The approval's id")),
    request_body = ApprovalDecision,
    responses(
        (status = 200, body = ApprovalDecided),
        (status = 400, body = ApiError), (status = 403, body = ApiError),
        (status = 404, body = ApiError), (status = 409, body = ApiError),
        (status = 413, body = ApiError), (status = 415, body = ApiError),
        (status = 422, body = ApiError), (status = 503, body = ApiError),
    ))]
pub(crate) async fn decide_approval(
    State(api): State<Api>,
    who: Option<Extension<Principal>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<axum::Json<ApprovalDecided>, ApiError> {
    let principal = principal(who)?;
    if !(api.inner.is_operator)(&principal) {
        return Err(ApiError::new(
            ErrorKind::Forbidden,
            "deciding a held call takes the operator role ([console] operators)",
        ));
    }
    let decision: ApprovalDecision = read_json(&headers, body, false).await?;
    let reason = decision
        .reason
        .unwrap_or_else(|| "denied through the agent API".into());
    if reason.len() > DENIAL_REASON_BYTES_MAX {
        return Err(ApiError::invalid(
            "/reason",
            format!("a reason is at most {DENIAL_REASON_BYTES_MAX} bytes"),
        ));
    }
    let journal: &dyn Journal = api.inner.parts.gateway.journal().as_ref();
    let unknown = || ApiError::not_found(format!("no held call {id:?}"));
    let held = journal
        .hold_get(&id)
        .await
        .map_err(journal_unavailable)?
        .ok_or_else(unknown)?;
    if held.state != HoldState::Pending {
        return Err(ApiError::conflict(format!(
            "the held call is {} already: a decision is made once",
            held.state.as_str()
        )));
    }
    if decision
        .args_hash
        .as_ref()
        .is_some_and(|h| *h != held.args_hash)
    {
        return Err(ApiError::conflict(
            "the decision names other arguments than the held call's args_hash",
        ));
    }
    let by = format!("agent API ({})", principal.id);
    let state = if decision.approve {
        HoldState::Approved {
            by,
            for_session: false,
        }
    } else {
        HoldState::Denied { by, reason }
    };
    match journal
        .hold_decide(&id, state)
        .await
        .map_err(journal_unavailable)?
    {
        HoldDecided::Decided(h) => Ok(axum::Json(ApprovalDecided {
            id: h.approval_id,
            state: h.state.as_str().to_string(),
        })),
        HoldDecided::AlreadyDecided(h) => Err(ApiError::conflict(format!(
            "the held call is {} already: a decision is made once",
            h.state.as_str()
        ))),
        HoldDecided::Lapsed(_) => Err(ApiError::conflict(
            "the held call's deadline passed before this decision",
        )),
        HoldDecided::NotFound => Err(unknown()),
    }
}
