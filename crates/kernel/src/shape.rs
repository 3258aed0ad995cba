//! Shape: every result of every tool bounded, sanitized and redacted before its receipt.
//!
//! Whatever a tool returns — a plain text, a JSON value, an observation it shaped itself — passes
//! through [`ring0_shape::shape_observation`] here, between settle and project: escape sequences
//! (OSC 52 included), control, invisible and bidirectional-control characters removed, framing
//! tokens neutralized, secrets redacted (the common formats and the values the host marked
//! secret), the text cut to the tool's observation budget and the whole serialized observation
//! bounded by [`OBSERVATION_BYTES_MAX`], so every receipt fits the projection bound. A tool's
//! failure message is shaped the same way, to [`FAILURE_MESSAGE_BYTES_MAX`]. The pass is
//! idempotent, so an already-shaped observation comes back unchanged, and it is never skipped.
//!
//! When the kernel has a spill store ([`crate::KernelBuilder::spill_store`]), a text this stage
//! cuts — a library tool's, an upstream's, any tool that did not cut its own — is first kept
//! whole there, sealed for the calling session, and its notice names the handle (and the
//! `read_spill` tool when one is registered); the diagnostics found in the whole text take the
//! place of part of the cut middle. A tool that cut its own output says so itself.

use ring0_core::Observation;
use ring0_core::limits::{
    FAILURE_MESSAGE_BYTES_MAX, OBSERVATION_BYTES_MAX, RECEIPT_ENVELOPE_BYTES_MAX,
};
use ring0_shape::{Redactor, Shaping, SpillStore, SpillTarget, shape_observation, shape_text};
use std::sync::Arc;

/// What the shape stage applies to the results of one session (or of recovery).
#[derive(Clone, Debug)]
pub(crate) struct ShapeStage {
    pub redactor: Redactor,
    /// Bound of a whole serialized observation: [`OBSERVATION_BYTES_MAX`], or more for a
    /// session whose host projector declares a larger projection bound (see
    /// [`ShapeStage::for_projection`]). Text stays within the tool's budget either way.
    pub observation_bytes_max: usize,
    /// Where cut text is kept whole: set for a session's stage (the owner is its scope), never
    /// for recovery's, which answers no session.
    pub spill: Option<SpillTarget>,
}

impl Default for ShapeStage {
    fn default() -> Self {
        Self {
            redactor: Redactor::default(),
            observation_bytes_max: OBSERVATION_BYTES_MAX,
            spill: None,
        }
    }
}

/// The kernel's spill store and the tool that reads it back, if registered.
#[derive(Clone, Debug)]
pub(crate) struct KernelSpill {
    pub store: Arc<SpillStore>,
    pub reader: Option<Arc<str>>,
}

impl ShapeStage {
    /// The stage for a session whose projections may take `projection_bytes_max`: an MCP host
    /// forwards an upstream's structured result (images included) whole to its client, so its
    /// observations may carry that much structured content; the text is still budgeted.
    pub fn for_projection(mut self, projection_bytes_max: usize) -> Self {
        let room = projection_bytes_max.saturating_sub(RECEIPT_ENVELOPE_BYTES_MAX);
        self.observation_bytes_max = room.max(OBSERVATION_BYTES_MAX);
        self
    }

    /// This stage for the session `owner`: text it cuts is kept in `spill`, sealed for it.
    pub fn for_owner(mut self, spill: Option<&KernelSpill>, owner: &str) -> Self {
        self.spill = spill.map(|s| SpillTarget {
            store: s.store.clone(),
            owner: Arc::from(owner),
            reader: s.reader.clone(),
        });
        self
    }

    fn shaping(&self, budget_bytes: usize) -> Shaping {
        let mut shaping = Shaping {
            redactor: self.redactor.clone(),
            spill: self.spill.clone(),
            ..Shaping::new(budget_bytes, self.observation_bytes_max)
        };
        if self.observation_bytes_max > OBSERVATION_BYTES_MAX {
            shaping.structured_bytes_max = self.observation_bytes_max;
        }
        shaping
    }

    /// One observation, within `budget_bytes` of text and [`OBSERVATION_BYTES_MAX`] serialized.
    pub fn observation(&self, obs: Observation, budget_bytes: usize) -> Observation {
        shape_observation(obs, &self.shaping(budget_bytes))
    }

    /// A tool's failure message.
    pub fn message(&self, message: &str) -> String {
        let shaping = Shaping {
            spill: None,
            ..self.shaping(FAILURE_MESSAGE_BYTES_MAX)
        };
        shape_text(message, FAILURE_MESSAGE_BYTES_MAX, &shaping).0
    }
}
