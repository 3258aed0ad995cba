//! Project: the canonical receipt becomes what the model sees.
//!
//! By default the model sees the canonical receipt (or, for a call refused before dispatch, the
//! rejection envelope it can correct itself from). Both fit [`PROJECTION_BYTES_MAX`] by
//! construction: a rejection is bounded field by field, an observation by the shape stage to
//! [`ring0_core::limits::OBSERVATION_BYTES_MAX`], and the rest of a receipt by
//! [`ring0_core::limits::RECEIPT_ENVELOPE_BYTES_MAX`]; so the default projection never fails.
//!
//! A host may install a [`Projector`] that returns a deterministic JSON object from the stable
//! parts of the intent and receipt. A projector that panics, errs, or returns invalid, non-object
//! or oversized JSON yields the terminating `projection_failed` result — only a host projector can
//! cause it. The batch must make no further model request, and there is no fallback to the
//! canonical receipt (which the host still has). Its message says what is known about the call:
//! whether it ran, and whether its effect may have been applied.

use ring0_core::limits::PROJECTION_BYTES_MAX;
use ring0_core::receipt::CallOutcome;
use ring0_core::{IntentState, Receipt};
use ring0_shape::serialized_len;
use serde_json::{Value, json};
use std::panic::{AssertUnwindSafe, catch_unwind};

/// What a projector may look at: the stable intent and receipt. Replay disposition and timing
/// are deliberately absent so the projection is the same whether a call ran or was replayed.
#[derive(Debug, Clone)]
pub struct ProjectionInput<'a> {
    pub tool: &'a str,
    pub call_id: &'a str,
    pub intent_id: Option<&'a str>,
    pub state: Option<IntentState>,
    pub args: Option<&'a Value>,
    pub outcome: &'a CallOutcome,
}

/// A host's model-visible projection. Must be deterministic for the same input.
pub trait Projector: Send + Sync {
    fn project(&self, input: &ProjectionInput<'_>) -> Result<Value, String>;

    /// The largest projection this host's reader accepts, in serialized bytes: a projection
    /// above it fails. [`PROJECTION_BYTES_MAX`] unless the host's results carry more than a
    /// model message does (an MCP client is sent an upstream's images whole).
    fn projection_bytes_max(&self) -> usize {
        PROJECTION_BYTES_MAX
    }

    /// Adds a notice for the model to a projection (the repeat guard's advisory, shown with
    /// the result of the call that reached it). The default adds it as the object's `notice`
    /// field; a host whose reader shows only part of the object (an MCP client shows its
    /// `content`) puts it where the model reads it. A projection the notice would push past
    /// the bound is returned unchanged.
    fn with_notice(&self, projection: Value, notice: &str) -> Value {
        with_notice_field(projection, notice)
    }
}

/// A projection with `notice` as its `notice` field, unless that field is taken.
pub fn with_notice_field(mut projection: Value, notice: &str) -> Value {
    if let Some(obj) = projection.as_object_mut()
        && !obj.contains_key(NOTICE_FIELD)
    {
        obj.insert(NOTICE_FIELD.into(), Value::String(notice.into()));
    }
    projection
}

/// The field of a projection that carries a notice for the model.
pub const NOTICE_FIELD: &str = "notice";

/// Why a projection failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("projection failed: {0}")]
pub struct ProjectionFailure(pub String);

/// The result the model sees when the host's projector fails: what is known about the call, from
/// its receipt.
pub fn projection_failed_result(receipt: &Receipt) -> Value {
    let known = match (&receipt.outcome, receipt.state) {
        (CallOutcome::Rejected { .. }, _) => {
            "The call was refused before it ran: nothing was applied."
        }
        (_, Some(IntentState::Acked)) => {
            "The call ran and completed: do not run it again for the same purpose."
        }
        (_, Some(IntentState::Failed)) => "The call failed without an effect.",
        (
            CallOutcome::Failed {
                uncertain: false, ..
            },
            _,
        ) => "The call failed without an effect.",
        _ => "The action may already have been applied: do not retry it.",
    };
    json!({
        "status": "projection_failed",
        "message": format!(
            "the host could not show the result of this call; the run ends here. {known}"
        ),
    })
}

fn check_shape(value: Value, bytes_max: usize) -> Result<Value, ProjectionFailure> {
    if !value.is_object() {
        return Err(ProjectionFailure(
            "the projection is not a JSON object".into(),
        ));
    }
    // Counted, not written out: a projection is measured on every call.
    let size = serialized_len(&value);
    if size == usize::MAX {
        return Err(ProjectionFailure(
            "the projection does not serialize".into(),
        ));
    }
    if size > bytes_max {
        return Err(ProjectionFailure(format!(
            "the projection is {size} bytes; at most {bytes_max} are allowed"
        )));
    }
    Ok(value)
}

/// [`project`], and `notice` shown to the model with the result when it fits.
pub fn project_with_notice(
    receipt: &Receipt,
    args: Option<&Value>,
    projector: Option<&dyn Projector>,
    notice: Option<&str>,
) -> Result<Value, ProjectionFailure> {
    let projected = project(receipt, args, projector)?;
    let Some(notice) = notice else {
        return Ok(projected);
    };
    let bytes_max = projector.map_or(PROJECTION_BYTES_MAX, |p| p.projection_bytes_max());
    let noticed = catch_unwind(AssertUnwindSafe(|| match projector {
        Some(p) => p.with_notice(projected.clone(), notice),
        None => with_notice_field(projected.clone(), notice),
    }));
    // The notice is also the round's policy message: a projection it does not fit goes without.
    Ok(match noticed.map(|v| check_shape(v, bytes_max)) {
        Ok(Ok(v)) => v,
        _ => projected,
    })
}

/// Projects one receipt. `args` are the prepared arguments when the call was prepared.
pub fn project(
    receipt: &Receipt,
    args: Option<&Value>,
    projector: Option<&dyn Projector>,
) -> Result<Value, ProjectionFailure> {
    if let CallOutcome::Rejected { rejection } = &receipt.outcome {
        return check_shape(rejection.to_json(), PROJECTION_BYTES_MAX);
    }
    match projector {
        None => Ok(canonical(receipt)),
        Some(projector) => {
            let input = ProjectionInput {
                tool: &receipt.tool,
                call_id: &receipt.call_id,
                intent_id: receipt.intent_id.as_deref(),
                state: receipt.state,
                args,
                outcome: &receipt.outcome,
            };
            let produced = catch_unwind(AssertUnwindSafe(|| projector.project(&input)))
                .map_err(|_| ProjectionFailure("the projector panicked".into()))?
                .map_err(ProjectionFailure)?;
            check_shape(produced, projector.projection_bytes_max())
        }
    }
}

/// The canonical receipt as the model sees it without a host projector. It fits the projection
/// bound by construction; should an envelope ever outgrow it, the observation is withheld and
/// the receipt says so, rather than ending the run.
fn canonical(receipt: &Receipt) -> Value {
    let value = serde_json::to_value(receipt).unwrap_or(Value::Null);
    let size = serialized_len(&value);
    debug_assert!(size <= PROJECTION_BYTES_MAX, "receipt of {size} bytes");
    if size <= PROJECTION_BYTES_MAX && value.is_object() {
        return value;
    }
    json!({
        "call_id": receipt.call_id,
        "tool": receipt.tool,
        "state": receipt.state,
        "is_error": receipt.is_error(),
        "message": format!(
            "the receipt of {size} bytes exceeded the projection bound of {PROJECTION_BYTES_MAX} bytes; its observation was withheld"
        ),
    })
}
