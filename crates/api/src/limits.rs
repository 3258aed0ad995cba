//! The API's bounds. Each is a named constant; reaching one is a structured refusal (`429
//! limit_exceeded`, `413 payload_too_large`), never a hang or unbounded growth.

use std::time::Duration;

/// Largest request body accepted, in bytes: a turn of [`ring0_core::limits::CALLS_PER_ROUND_MAX`]
/// calls of the largest accepted arguments does not fit, but a real model turn does many times.
pub const BODY_BYTES_MAX: usize = 4 * 1024 * 1024;
/// API sessions one principal may hold at once; one more is refused until one is deleted or
/// expires.
pub const SESSIONS_PER_PRINCIPAL_MAX: usize = 64;
/// API sessions held at once, every principal together.
pub const SESSIONS_MAX: usize = 4096;
/// An API session unused this long (and with no turn open) is deleted.
pub const SESSION_IDLE_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// Host tools one session may register.
pub const HOST_TOOLS_PER_SESSION_MAX: usize = 128;
/// Turns of one session still running (waiting for the host or for their calls) at once.
pub const TURNS_OPEN_PER_SESSION_MAX: usize = 8;
/// Finished turns whose results a session keeps for a host that lost a response.
pub const TURNS_KEPT_PER_SESSION_MAX: usize = 32;
/// How long a turn or outcomes request waits for the turn to finish or to need the host, by
/// default; past it the answer is `running` and the host asks again (`GET …/turns/{turn}`).
pub const TURN_WAIT_MS_DEFAULT: u64 = 60_000;
/// The longest wait a request may ask for (`wait_ms`).
pub const TURN_WAIT_MS_MAX: u64 = 300_000;
/// How long a host tool's call waits for the host's outcome when it declares no `timeout_ms`,
/// and the longest it may declare (defined with the host-tool vocabulary in `ring0-host`).
pub use ring0_host::{HOST_TOOL_TIMEOUT_MS_DEFAULT, HOST_TOOL_TIMEOUT_MS_MAX};
/// Event streams (`GET …/events`) open at once on one session.
pub const EVENT_STREAMS_PER_SESSION_MAX: usize = 4;
/// Events buffered for one session's streams; a stream that falls further behind is told how
/// many it missed.
pub const EVENTS_BUFFER_MAX: usize = 1024;
/// How often an idle event stream sends a comment, so proxies keep it open.
pub const EVENT_KEEPALIVE: Duration = Duration::from_secs(15);
/// Longest scope name a session may ask for, in bytes.
pub const SCOPE_BYTES_MAX: usize = 256;
/// Tool patterns a session's grants may list.
pub const GRANT_PATTERNS_MAX: usize = 64;
/// Longest text a host sends with an outcome (an error message, a denial's reason), in bytes;
/// longer text is cut.
pub const OUTCOME_TEXT_BYTES_MAX: usize = 2 * 1024;
/// Scheduler turns a response waits after the first pending action, so that actions the same
/// epoch raises at once are answered together. Not a timer: a bound on yields.
pub const PENDING_COALESCE_YIELDS: usize = 16;
/// Largest body of a streamed turn (all its events), in bytes.
pub const STREAM_BYTES_MAX: usize = 16 * 1024 * 1024;
/// Longest silence between two events of a streamed turn; past it the stream is aborted.
pub const STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest a streamed turn's stream may last in all.
pub const STREAM_DURATION_MAX: Duration = Duration::from_secs(10 * 60);
/// Events read ahead of the round a streamed turn feeds (the body is read no faster).
pub const STREAM_FEED_BUFFER: usize = 64;
/// Longest provider turn id a streamed turn may name, in bytes.
pub const STREAM_TURN_ID_BYTES_MAX: usize = 256;

const _: () = assert!(TURN_WAIT_MS_DEFAULT <= TURN_WAIT_MS_MAX);
const _: () = assert!(BODY_BYTES_MAX <= STREAM_BYTES_MAX);
const _: () = assert!(SESSIONS_PER_PRINCIPAL_MAX <= SESSIONS_MAX);
const _: () = assert!(HOST_TOOLS_PER_SESSION_MAX <= ring0_core::limits::CATALOG_TOOLS_MAX);
