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
/// Longest accepted idempotency key a caller sends with a call (256 bytes of printable ASCII).
pub const IDEMPOTENCY_KEY_BYTES_MAX: usize = 256;
/// Room in a projected receipt for everything but its observation: identity, keys, state,
/// timeline, a failure message. Together with [`OBSERVATION_BYTES_MAX`] it makes up
/// [`PROJECTION_BYTES_MAX`].
pub const RECEIPT_ENVELOPE_BYTES_MAX: usize = 16 * 1024;
/// Largest serialized observation of one call, and so the largest observation budget a tool may
/// declare: whatever fits the budget fits the projection with its envelope.
pub const OBSERVATION_BYTES_MAX: usize = PROJECTION_BYTES_MAX - RECEIPT_ENVELOPE_BYTES_MAX;
/// Longest failure message a tool's error keeps in its receipt.
pub const FAILURE_MESSAGE_BYTES_MAX: usize = 2 * 1024;
/// Largest serialized rejection: a rejection always fits the projection bound.
pub const REJECTION_BYTES_MAX: usize = PROJECTION_BYTES_MAX;
/// Most items of a list inside a rejection (allowed keys, enum values); the rest are counted.
pub const REJECTION_LIST_ITEMS_MAX: usize = 16;
/// Longest text inside a rejection (a message, a location, a listed name), in bytes.
pub const REJECTION_TEXT_BYTES_MAX: usize = 512;

const _: () = assert!(RECEIPT_ENVELOPE_BYTES_MAX < PROJECTION_BYTES_MAX);
const _: () = assert!(
    VALIDATION_ERRORS_MAX * (3 * REJECTION_TEXT_BYTES_MAX + ECHO_BYTES_MAX) < REJECTION_BYTES_MAX
);

/// `s` cut to at most `max` bytes on a character boundary, saying how long it was when cut.
pub fn clip_with_length(s: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if s.len() <= max {
        return std::borrow::Cow::Borrowed(s);
    }
    std::borrow::Cow::Owned(format!(
        "{}… ({} bytes in all)",
        crate::text::truncate_utf8(s, max),
        s.len()
    ))
}
