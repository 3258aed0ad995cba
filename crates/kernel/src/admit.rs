//! Admit: which prepared calls of a round may run.
//!
//! Three checks, in order:
//! - **tool choice** (`auto | required | none | named`), enforced on what the model returned,
//!   not only requested;
//! - the **round overseer**: the ordered strategy compatibility matrix over the calls accepted
//!   before each candidate (exploration → exploitation refused, unknown runs alone);
//! - the **exact-repeat guard**: consecutive identical calls (tool + canonical prepared
//!   arguments) counted across the turns of a run, per scope (every session of the scope
//!   shares one guard); advisory at 3 (a notice with that call's result), termination at 8 by
//!   default, which refuses that fingerprint (`repeat_limit`) and no other call: a different
//!   tracked call breaks the sequence.

use ring0_core::call::RejectionKind;
use ring0_core::{Fingerprint, ProposedCall, Rejection, StrategySet};
use serde::{Deserialize, Serialize};

/// Default repeat count that triggers an advisory.
pub const REPEAT_ADVISORY_DEFAULT: u32 = 3;
/// Default repeat count that terminates the loop.
pub const REPEAT_TERMINATE_DEFAULT: u32 = 8;
/// Longest policy message appended to the next model request.
pub const POLICY_MESSAGE_BYTES_MAX: usize = 512;

/// What the model was asked to do about tools in this turn.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoice {
    #[default]
    Auto,
    Required,
    None,
    Named(String),
}

/// Outcome of the tool-choice check for a whole turn.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolChoiceCheck {
    /// Per call, in source order: `Some` if the call violates the choice.
    pub rejections: Vec<Option<Rejection>>,
    /// The choice required a call and none came back.
    pub missing_call: bool,
}

pub fn check_tool_choice(choice: &ToolChoice, calls: &[ProposedCall]) -> ToolChoiceCheck {
    let reject = |c: &ProposedCall, msg: String| {
        Some(Rejection::new(
            RejectionKind::ToolChoiceViolation,
            &c.tool,
            &c.call_id,
            msg,
        ))
    };
    let rejections = calls
        .iter()
        .map(|c| match choice {
            ToolChoice::None => reject(c, "tool_choice is none: no tool may be called".into()),
            ToolChoice::Named(name) if &c.tool != name => reject(
                c,
                format!("tool_choice names {name:?}; {:?} may not be called", c.tool),
            ),
            _ => None,
        })
        .collect();
    let missing_call = match choice {
        ToolChoice::Required => calls.is_empty(),
        ToolChoice::Named(name) => !calls.iter().any(|c| &c.tool == name),
        _ => false,
    };
    ToolChoiceCheck {
        rejections,
        missing_call,
    }
}

/// The round overseer. `candidates` are `(tool, call_id, strategy)` in source order; returns,
/// per candidate, `Some(rejection)` if it may not share this round with the calls accepted
/// before it.
pub fn oversee(candidates: &[(&str, &str, StrategySet)]) -> Vec<Option<Rejection>> {
    let mut accepted: Vec<(&str, StrategySet)> = Vec::new();
    candidates
        .iter()
        .map(|&(tool, call_id, strategy)| {
            let blocker = accepted.iter().find(|(_, earlier)| !earlier.admits_after(&strategy));
            match blocker {
                None => {
                    accepted.push((tool, strategy));
                    None
                }
                Some((earlier_tool, earlier)) => {
                    let (kind, why) = if strategy.is_unknown() || earlier.is_unknown() {
                        (
                            RejectionKind::RunsAlone,
                            format!(
                                "a tool with unknown strategy runs alone in its round ({:?} was accepted first)",
                                earlier_tool
                            ),
                        )
                    } else {
                        (
                            RejectionKind::StrategyConflict,
                            format!(
                                "{tool:?} ({}) cannot use the result of {earlier_tool:?} ({}) \
                                 from the same round; call it again next round",
                                strategy.render(),
                                earlier.render()
                            ),
                        )
                    };
                    Some(Rejection::new(kind, tool, call_id, why))
                }
            }
        })
        .collect()
}

/// Thresholds of the exact-repeat guard. Zero disables the corresponding action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepeatLimits {
    pub advisory: u32,
    pub terminate: u32,
}

impl Default for RepeatLimits {
    fn default() -> Self {
        Self {
            advisory: REPEAT_ADVISORY_DEFAULT,
            terminate: REPEAT_TERMINATE_DEFAULT,
        }
    }
}

/// The guard's verdict on one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RepeatVerdict {
    Proceed,
    Advisory { count: u32 },
    Terminate { count: u32 },
}

/// Consecutive identical calls across the turns of one run.
#[derive(Debug, Default)]
pub struct RepeatGuard {
    limits: RepeatLimits,
    last: Option<Fingerprint>,
    /// The explicit idempotency key of the last tracked call, if it had one.
    last_key: Option<String>,
    count: u32,
    pub advisories: u64,
    pub terminations: u64,
}

impl RepeatGuard {
    pub fn new(limits: RepeatLimits) -> Self {
        Self {
            limits,
            ..Self::default()
        }
    }

    /// Counts one call. An exempt (`tracked = false`) call neither advances nor resets the
    /// sequence. `key` is the call's explicit idempotency key: the same call under the same key
    /// as the last one is that call sent again (a client's retry of an answer it did not get),
    /// not a repeat, and is not counted again.
    pub fn observe(
        &mut self,
        fingerprint: Fingerprint,
        key: Option<&str>,
        tracked: bool,
    ) -> RepeatVerdict {
        if !tracked {
            return RepeatVerdict::Proceed;
        }
        if self.last == Some(fingerprint) {
            if key.is_some() && key == self.last_key.as_deref() {
                return RepeatVerdict::Proceed;
            }
            self.count = self.count.saturating_add(1);
        } else {
            self.last = Some(fingerprint);
            self.count = 1;
        }
        self.last_key = key.map(str::to_string);
        let c = self.count;
        if self.limits.terminate > 0 && c >= self.limits.terminate {
            self.terminations += 1;
            RepeatVerdict::Terminate { count: c }
        } else if self.limits.advisory > 0 && c == self.limits.advisory {
            self.advisories += 1;
            RepeatVerdict::Advisory { count: c }
        } else {
            RepeatVerdict::Proceed
        }
    }

    /// A genuine new user or steering message: the model has new evidence.
    pub fn reset(&mut self) {
        self.last = None;
        self.last_key = None;
        self.count = 0;
    }
}

/// The bounded policy message for the next model request after an advisory. It names the tool,
/// never the arguments.
pub fn advisory_message(tool: &str, count: u32) -> String {
    let mut msg = format!(
        "ring0 policy: {tool:?} was called {count} times in a row with identical arguments and \
         its result will not change. Use the result you have or try a different approach; \
         further identical calls will end the run."
    );
    msg.truncate(msg.floor_char_boundary(POLICY_MESSAGE_BYTES_MAX));
    msg
}

/// What the exact-repeat guard decided about one prepared call, with its events sent.
// Made once per call and matched at once: boxing the refusal would not pay for itself.
#[allow(clippy::large_enum_variant)]
pub(crate) enum RepeatDecision {
    /// The call may run; `advisory` is the policy message for the next model request, if the
    /// call reached the advisory count.
    Run { advisory: Option<String> },
    /// The call is refused and the run ends.
    Refuse {
        rejection: Rejection,
        termination: crate::session::Termination,
    },
}

/// Counts one prepared call with the session's guard: the one repeat-guard decision for block
/// and streaming rounds alike.
pub(crate) fn guard_repeat(
    guard: &mut RepeatGuard,
    call: &ring0_core::PreparedCall,
    key: Option<&str>,
    tracked: bool,
    events: &crate::events::EventHub,
) -> RepeatDecision {
    use crate::events::{Event, RepeatAction};
    let (count, action) = match guard.observe(call.fingerprint, key, tracked) {
        RepeatVerdict::Proceed => return RepeatDecision::Run { advisory: None },
        RepeatVerdict::Advisory { count } => (count, RepeatAction::Advisory),
        RepeatVerdict::Terminate { count } => (count, RepeatAction::Terminated),
    };
    events.send(Event::RepeatDetected {
        tool: call.tool.clone(),
        fingerprint: call.fingerprint,
        count,
        action,
    });
    if action == RepeatAction::Advisory {
        return RepeatDecision::Run {
            advisory: Some(advisory_message(&call.tool, count)),
        };
    }
    RepeatDecision::Refuse {
        rejection: Rejection::new(
            RejectionKind::RepeatLimit,
            &call.tool,
            &call.call_id,
            format!(
                "{:?} was called {count} times in a row with identical arguments; this call was \
                 not run, and is not run again until a different call or a new user message",
                call.tool
            ),
        ),
        termination: crate::session::Termination::RepeatLimit {
            tool: call.tool.clone(),
            count,
        },
    }
}
