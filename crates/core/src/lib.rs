//! ring0's vocabulary.
//!
//! This crate owns the types every stage of a call speaks — [`ToolSpec`] and its runtime metadata,
//! [`ProposedCall`], [`PreparedCall`], [`Round`], [`Rejection`], [`Receipt`], [`Observation`], what
//! a failed or ambiguous dispatch says about its effect ([`FailureClass`], [`ProbeFinding`]) — plus
//! RFC 8785 canonical JSON, the versioned [`SemanticKey`] and [`Fingerprint`], and the provider
//! formats (OpenAI Chat Completions, OpenAI Responses, Anthropic Messages, MCP `tools/call`).
//!
//! It must never do I/O, start an async runtime or depend on another ring0 crate: everything here
//! is a value or a pure function, so each stage of the pipeline can be tested alone.

pub mod call;
pub mod canonical;
pub mod format;
pub mod identity;
pub mod limits;
pub mod observation;
pub mod outcome;
pub mod principal;
pub mod receipt;
pub mod spec;
pub mod text;

pub use call::{
    FieldError, PreparedCall, ProposedArguments, ProposedCall, Rejection, RejectionKind, Round,
};
pub use canonical::{CanonicalError, canonicalize, parse_strict};
pub use format::{ProviderFormat, ToolResult};
pub use identity::{CANONICALIZER_VERSION, CallIdentity, Fingerprint, SemanticKey};
pub use observation::Observation;
pub use outcome::{FailureClass, ProbeFinding};
pub use principal::Principal;
pub use receipt::{IntentState, Receipt};
pub use spec::{
    Authority, ConcurrencyMark, ConflictKeyTemplate, Effect, ExecutionProfile, Settlement,
    Strategy, StrategySet, ToolSpec,
};
