//! The state machine of an intent.
//!
//! ```text
//! PROPOSED → RECORDED → DISPATCHED → ACKED | FAILED
//!                        DISPATCHED → UNKNOWN → RECONCILING → ACKED | COMPENSATED | DEAD_LETTER
//! PROPOSED → REJECTED_DUPLICATE | REJECTED_CONFLICT
//! ```
//! and, beyond the happy paths:
//! - `RECORDED → REJECTED_CONFLICT`: cancelled before dispatch (nothing external was touched);
//! - `RECONCILING → RECORDED`: a probe found the world unchanged since the pre-dispatch snapshot,
//!   so dispatching again is safe;
//! - `RECONCILING → DISPATCHED`: the provider honours the stored idempotency key, so re-dispatch
//!   with the same key is safe;
//! - `ACKED → COMPENSATED`: a declared compensating action undid an unwanted effect;
//! - `FAILED → RECORDED`: the failure was on the "definitely not applied" allow-list, so a new
//!   proposal of the same intent may record it again;
//! - `DEAD_LETTER → ACKED | COMPENSATED | FAILED`: a person settled it.
//!
//! Never `UNKNOWN → DISPATCHED`: an ambiguous outcome is settled, not retried from model memory.

use ring0_core::IntentState;
use ring0_core::IntentState::*;

/// Whether the state machine allows `from → to`.
pub fn is_allowed(from: IntentState, to: IntentState) -> bool {
    matches!(
        (from, to),
        (Proposed, Recorded | RejectedDuplicate | RejectedConflict)
            | (Recorded, Dispatched | RejectedConflict)
            | (Dispatched, Acked | Failed | Unknown)
            | (Unknown, Reconciling | Compensated | DeadLetter)
            | (
                Reconciling,
                Acked | Compensated | DeadLetter | Recorded | Dispatched
            )
            | (Acked, Compensated)
            | (Failed, Recorded)
            | (DeadLetter, Acked | Compensated | Failed)
    )
}

/// An illegal transition, refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("illegal transition {from} → {to}")]
pub struct TransitionError {
    pub from: IntentState,
    pub to: IntentState,
}

/// Checks a transition, returning a typed error for an illegal one.
pub fn check(from: IntentState, to: IntentState) -> Result<(), TransitionError> {
    if is_allowed(from, to) {
        Ok(())
    } else {
        Err(TransitionError { from, to })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_is_never_dispatched_again_directly() {
        assert!(!is_allowed(Unknown, Dispatched));
        assert!(!is_allowed(Unknown, Recorded));
        assert!(!is_allowed(Unknown, Acked));
        for to in [Reconciling, Compensated, DeadLetter] {
            assert!(is_allowed(Unknown, to));
        }
    }

    #[test]
    fn terminal_rejections_go_nowhere() {
        for to in IntentState::ALL {
            assert!(!is_allowed(RejectedDuplicate, to));
            assert!(!is_allowed(RejectedConflict, to));
            assert!(!is_allowed(Compensated, to));
        }
    }
}
