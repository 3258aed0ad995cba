//! What a failed or ambiguous dispatch says about its effect.
//!
//! Two answers decide where a mutating call settles, and both cross crate lines: a tool reports
//! them to the kernel, and the journal's settlement decides the record's next state from them.
//! They are defined once, here.
//!
//! - [`FailureClass`]: how a dispatch failed. Only the classes on the "definitely not applied"
//!   allow-list ([`FailureClass::definitely_not_applied`]) settle a record FAILED; every other
//!   failure leaves its effect UNKNOWN and is reconciled by the tool's [`Settlement`].
//! - [`ProbeFinding`]: what a tool's nullipotent reconciliation probe found about an UNKNOWN call
//!   (for tools settled by [`Settlement::Probe`]).
//!
//! [`Settlement`]: crate::Settlement
//! [`Settlement::Probe`]: crate::Settlement::Probe

use crate::Observation;
use serde::{Deserialize, Serialize};

/// How a dispatch failed, as far as its executor can tell, and so whether its effect may have
/// happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureClass {
    /// The tool vouches that nothing was applied: the request was refused before anything was
    /// sent, rejected as invalid before it was acted on (a validation error upstream), or a
    /// precondition failed before any write.
    NotApplied,
    /// The connection was refused before a byte of the request was sent.
    ConnectionRefused,
    /// No answer within the deadline: the request may or may not have been applied.
    Timeout,
    /// The connection broke after the request was sent.
    ConnectionLost,
    /// The response stream ended early.
    StreamAborted,
    /// Anything else, a crashed tool included: the effect may or may not have happened.
    Unknown,
}

impl FailureClass {
    /// The allow-list of failures after which the effect is known not to have happened.
    pub const DEFINITELY_NOT_APPLIED: [FailureClass; 2] =
        [FailureClass::NotApplied, FailureClass::ConnectionRefused];

    /// Whether this failure is on the "definitely not applied" allow-list.
    pub fn definitely_not_applied(self) -> bool {
        Self::DEFINITELY_NOT_APPLIED.contains(&self)
    }
}

/// What a reconciliation probe found about one call whose outcome was unknown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProbeFinding {
    /// The call's postcondition holds: it was applied. The observation is the evidence of the
    /// synthetic receipt the record is acknowledged with.
    Applied(Box<Observation>),
    /// The world is as the pre-dispatch snapshot recorded it: the call was not applied, and
    /// dispatching it is safe.
    Unchanged,
    /// Anything else (partly applied, changed by someone else, the probe failed): a person
    /// decides. The text says what was seen.
    Indeterminate(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_allow_listed_failures_mean_not_applied() {
        use FailureClass::*;
        for class in [NotApplied, ConnectionRefused] {
            assert!(class.definitely_not_applied());
        }
        for class in [Timeout, ConnectionLost, StreamAborted, Unknown] {
            assert!(!class.definitely_not_applied());
        }
    }

    #[test]
    fn a_finding_round_trips_through_json() {
        for finding in [
            ProbeFinding::Applied(Box::new(Observation::text("found it"))),
            ProbeFinding::Unchanged,
            ProbeFinding::Indeterminate("partly applied".into()),
        ] {
            let json = serde_json::to_value(&finding).unwrap();
            assert_eq!(
                serde_json::from_value::<ProbeFinding>(json).unwrap(),
                finding
            );
        }
    }
}
