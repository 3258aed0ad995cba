//! Named limits shared by every stage. Each has a documented default; hitting one produces a
//! structured outcome, never a hang, a panic or silent loss.

/// Largest accepted argument text of one call.
pub const ARGUMENT_BYTES_MAX: usize = 256 * 1024;
/// Deepest accepted nesting of arguments.
pub const ARGUMENT_DEPTH_MAX: usize = 64;
/// Largest accepted input or output schema of one tool (canonical bytes).
pub const SCHEMA_BYTES_MAX: usize = 256 * 1024;
/// Most calls accepted in one model turn.
pub const CALLS_PER_ROUND_MAX: usize = 128;
/// Most tools one registry holds.
pub const CATALOG_TOOLS_MAX: usize = 4096;
/// Most field errors reported for one call; the rest are counted.
pub const VALIDATION_ERRORS_MAX: usize = 32;
/// Echoed input values in errors are cut to this many bytes.
pub const ECHO_BYTES_MAX: usize = 256;
/// Largest model-visible projection of one receipt.
pub const PROJECTION_BYTES_MAX: usize = 64 * 1024;
/// Longest accepted tool name.
pub const TOOL_NAME_BYTES_MAX: usize = 128;
/// Longest accepted call id.
pub const CALL_ID_BYTES_MAX: usize = 256;
