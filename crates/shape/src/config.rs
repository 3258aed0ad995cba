//! Shaping configuration and the named limits behind it.
//!
//! Every limit the shaper enforces is a constant here with its default; a [`ShapeConfig`] can lower
//! or raise the configurable ones within the documented bounds, and [`ShapeConfig::validate`]
//! refuses values that would make the guarantees (output within budget, memory bounded) impossible.

use std::path::PathBuf;
use std::sync::Arc;

use ring0_core::observation::Provenance;

use crate::framing::FramingDefense;
use crate::redact::Redactor;
use crate::spill::SpillStore;

/// Default model-visible budget of one observation, in bytes (both streams and the status lines).
pub const BUDGET_BYTES_DEFAULT: usize = ring0_core::spec::OBSERVATION_BUDGET_BYTES_DEFAULT;
/// Smallest accepted budget: room for the status lines, two tombstones and a little text.
pub const BUDGET_BYTES_MIN: usize = 1024;
/// Largest accepted budget. The shaper holds about twice the budget per stream in memory.
pub const BUDGET_BYTES_MAX: usize = 16 * 1024 * 1024;
/// Share of a cut stream's allowance given to its head; the rest goes to the tail, where
/// compilers and test runners put their conclusions.
pub const HEAD_PERCENT_DEFAULT: u8 = 30;
/// Longest line the line model edits in place. A longer line at the bottom of the screen is passed
/// on in pieces of this size (a carriage return then rewrites only the current piece); text that
/// would grow a redrawn line above the bottom past it is dropped and counted as clipped.
pub const LINE_BYTES_MAX: usize = 4 * 1024;
/// Lines kept editable for cursor-up redraws (multi-line progress displays). A redraw that moves
/// further up stops at the oldest kept line.
pub const SCREEN_LINES_MAX: usize = 64;
/// Most diagnostics kept per observation; more are counted in `diagnostics_omitted`.
pub const DIAGNOSTICS_MAX: usize = 32;
/// Longest message or name kept in one diagnostic, in bytes (cut on a character boundary).
pub const DIAGNOSTIC_TEXT_BYTES_MAX: usize = 512;
/// Raw bytes per observation tokenized exactly; beyond this the raw count is extrapolated and
/// flagged `raw_exact: false`.
pub const RAW_TOKEN_SAMPLE_BYTES_DEFAULT: usize = 256 * 1024;
/// Largest accepted raw token sample.
pub const RAW_TOKEN_SAMPLE_BYTES_MAX: usize = 4 * 1024 * 1024;

/// Most bytes of the rendered text given to diagnostics found in a cut output, so an error line
/// in the omitted middle is still in front of the model (taken from the streams' allowance only
/// when the output is cut and the budget is at least four times this).
pub const DIAGNOSTICS_SECTION_BYTES_MAX: usize = 2048;
/// Longest line of that section, in bytes.
pub const DIAGNOSTIC_LINE_BYTES_MAX: usize = 320;

/// How much of the budget the status lines and stream labels of the rendered text may take.
pub(crate) const RENDER_RESERVE_BYTES: usize = 512;

/// Settings of one shaping run.
#[derive(Clone, Debug)]
pub struct ShapeConfig {
    /// Model-visible budget in bytes: the rendered `text` never exceeds it.
    pub budget_bytes: usize,
    /// Percentage of a cut stream's allowance kept from its head (0–100).
    pub head_percent: u8,
    /// Where raw streams and oversized structured content go; `None` keeps nothing.
    pub spill: Option<Arc<SpillStore>>,
    /// Whose spills these are (a session's scope): handles are sealed for this owner and only
    /// it can page them with `read_spill` ([`SpillStore::read_as`]). `None` writes plain handles.
    pub spill_owner: Option<Arc<str>>,
    /// Neutralization of text imitating a provider's framing; [`FramingDefense::off`] disables it.
    pub framing: FramingDefense,
    /// Secret redaction; [`Redactor::default`] knows the common formats.
    pub redactor: Redactor,
    /// Count tokens with the o200k tokenizer.
    pub count_tokens: bool,
    /// Raw bytes tokenized exactly before extrapolating.
    pub raw_token_sample_bytes: usize,
    /// Paths under this directory count as "inside the workspace" when choosing a traceback's
    /// frame; relative paths always do.
    pub workspace_root: Option<PathBuf>,
    /// Which tool and server produced the output.
    pub provenance: Option<Provenance>,
}

impl Default for ShapeConfig {
    fn default() -> Self {
        Self {
            budget_bytes: BUDGET_BYTES_DEFAULT,
            head_percent: HEAD_PERCENT_DEFAULT,
            spill: None,
            spill_owner: None,
            framing: FramingDefense::default(),
            redactor: Redactor::default(),
            count_tokens: true,
            raw_token_sample_bytes: RAW_TOKEN_SAMPLE_BYTES_DEFAULT,
            workspace_root: None,
            provenance: None,
        }
    }
}

impl ShapeConfig {
    /// A default configuration with the given budget.
    pub fn with_budget(budget_bytes: usize) -> Self {
        Self {
            budget_bytes,
            ..Self::default()
        }
    }

    /// Checks every limit is within its documented bounds.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(BUDGET_BYTES_MIN..=BUDGET_BYTES_MAX).contains(&self.budget_bytes) {
            return Err(ConfigError::Budget {
                got: self.budget_bytes,
            });
        }
        if self.head_percent > 100 {
            return Err(ConfigError::HeadPercent {
                got: self.head_percent,
            });
        }
        if self.raw_token_sample_bytes > RAW_TOKEN_SAMPLE_BYTES_MAX {
            return Err(ConfigError::TokenSample {
                got: self.raw_token_sample_bytes,
            });
        }
        Ok(())
    }
}

/// A configuration value outside its bounds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("observation budget of {got} bytes is outside {BUDGET_BYTES_MIN}..={BUDGET_BYTES_MAX}")]
    Budget { got: usize },
    #[error("head share of {got}% is outside 0..=100")]
    HeadPercent { got: u8 },
    #[error("raw token sample of {got} bytes exceeds {RAW_TOKEN_SAMPLE_BYTES_MAX}")]
    TokenSample { got: usize },
}
