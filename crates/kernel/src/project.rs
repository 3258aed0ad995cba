//! Project: the canonical receipt becomes what the model sees.
//!
//! By default the model sees the canonical receipt (or, for a call refused before dispatch, the
//! rejection envelope it can correct itself from). A host may install a [`Projector`] that
//! returns a deterministic JSON object from the stable parts of the intent and receipt. A
//! projector that panics, errs, or returns invalid, non-object or oversized JSON yields the fixed
//! terminating `projection_failed` result: the batch must make no further model request, and
//! there is no fallback to the canonical receipt (which the host still has).

use ring0_core::limits::PROJECTION_BYTES_MAX;
use ring0_core::receipt::CallOutcome;
use ring0_core::{IntentState, Receipt};
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
}

/// Why a projection failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("projection failed: {0}")]
pub struct ProjectionFailure(pub String);

/// The fixed result the model sees when projection fails.
pub fn projection_failed_result() -> Value {
    json!({
        "status": "projection_failed",
        "message": "the result of this call could not be shown; the run ends here. The action may \
                    already have been applied: do not retry it.",
    })
}

fn check_shape(value: Value, bytes_max: usize) -> Result<Value, ProjectionFailure> {
    if !value.is_object() {
        return Err(ProjectionFailure(
            "the projection is not a JSON object".into(),
        ));
    }
    let size = serde_json::to_vec(&value)
        .map_err(|e| ProjectionFailure(format!("the projection does not serialize: {e}")))?
        .len();
    if size > bytes_max {
        return Err(ProjectionFailure(format!(
            "the projection is {size} bytes; at most {bytes_max} are allowed"
        )));
    }
    Ok(value)
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
        None => check_shape(
            serde_json::to_value(receipt)
                .map_err(|e| ProjectionFailure(format!("receipt does not serialize: {e}")))?,
            PROJECTION_BYTES_MAX,
        ),
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
