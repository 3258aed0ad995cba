//! The journal's named limits. Each has a documented default; a proposal or transition that
//! exceeds one is refused with a structured [`crate::JournalError`] before anything is written.

/// Largest canonical argument text a proposal may carry (1 MiB). Larger is refused: the kernel
/// already bounds raw arguments (`ring0_core::limits::ARGUMENT_BYTES_MAX`), so this only catches
/// a caller that skipped preparation.
pub const ARGS_BYTES_MAX: usize = 1024 * 1024;

/// Canonical arguments up to this size (4 KiB) are stored in the record; larger ones are stored
/// by SHA-256 in the spill directory and the record keeps the digest.
pub const ARGS_INLINE_BYTES_MAX: usize = 4 * 1024;

/// Longest accepted user-intent scope (1 KiB).
pub const SCOPE_BYTES_MAX: usize = 1024;

/// Most dispatches of one intent (8). A record at this count is never dispatched again: it is
/// dead-lettered on its next ambiguous outcome and a re-proposal after a definite failure is a
/// conflict. Bounds every retry loop and every timeline.
pub const ATTEMPTS_MAX: u32 = 8;

/// Longest transition note kept (1 KiB); a longer one is cut with a marker saying how much was cut.
pub const NOTE_BYTES_MAX: usize = 1024;

/// Largest pre-dispatch snapshot (64 KiB of JSON text).
pub const SNAPSHOT_BYTES_MAX: usize = 64 * 1024;

/// Largest stored receipt (4 MiB of JSON text). Observations are bounded long before this.
pub const RECEIPT_BYTES_MAX: usize = 4 * 1024 * 1024;

/// Most requests the SQLite writer folds into one transaction (one fsync).
pub const GROUP_COMMIT_BATCH_MAX: usize = 1024;

/// The SQLite writer waits for callers its last batch answered to come back, so they share the
/// next fsync instead of missing it, for at most this share (25 %) of the last commit's time...
pub const GROUP_COMMIT_GATHER_PERCENT: u32 = 25;

/// ... and never longer than this (1 ms). A lone caller never waits.
pub const GROUP_COMMIT_GATHER_US_MAX: u64 = 1_000;

/// Most requests waiting for the SQLite writer; a proposer beyond this waits for room.
pub const WRITER_QUEUE_MAX: usize = 16 * 1024;

/// Reader connections of the SQLite backend (2 by default).
pub const READERS_DEFAULT: usize = 2;

/// Most records `recent` returns in one call.
pub const RECENT_LIMIT_MAX: usize = 10_000;

/// Default age (5 minutes) under which a memoized observation of a deterministic read is served.
pub const MEMO_TTL_MS_DEFAULT: u64 = 5 * 60 * 1000;

/// Most memoized observations kept; the oldest are evicted first.
pub const MEMO_ENTRIES_MAX: usize = 4096;

/// Largest memoized observation (256 KiB of JSON text); a larger one is simply not memoized.
pub const MEMO_OBSERVATION_BYTES_MAX: usize = 256 * 1024;
