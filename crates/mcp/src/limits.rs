//! Named limits of the MCP gateway. Each has a documented default; reaching one produces a
//! structured outcome (an error result, a logged refusal, a quarantined tool), never a hang.

use std::time::Duration;

/// Longest accepted JSON-RPC message from an upstream (one stdio line, one HTTP body or one SSE
/// event). A larger message closes the connection with a clear error instead of growing memory.
pub const UPSTREAM_MESSAGE_BYTES_MAX: usize = 16 * 1024 * 1024;
/// `tools/list` pages followed per listing; a server that keeps returning cursors past this is
/// reported and its listing is refused rather than looped on.
pub const LIST_PAGES_MAX: usize = 64;
/// Tools accepted from one upstream.
pub const UPSTREAM_TOOLS_MAX: usize = 1024;
/// Requests in flight to one upstream at once; more wait for a slot.
pub const UPSTREAM_IN_FLIGHT_MAX: usize = 256;
/// How long initialize and each `tools/list` page may take.
pub const UPSTREAM_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// Default of an upstream's `start_timeout_ms`: how long `ring0 serve` waits at start for an
/// upstream to connect and list its tools before serving without it. Every upstream is waited
/// for at once, so a start waits for the longest of them, never their sum.
pub const UPSTREAM_START_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);
const _: () =
    assert!(UPSTREAM_START_TIMEOUT_DEFAULT.as_millis() < UPSTREAM_HANDSHAKE_TIMEOUT.as_millis());
/// How long a client may treat ring0's own `tools/list` and `server/discover` results as fresh
/// (`ttlMs`, 2026-07-28). ring0 knows when its catalog changes: every new catalog generation is
/// announced with `notifications/tools/list_changed`, which invalidates a cached listing at
/// once, so the hint only bounds how long a client that missed a notification keeps a stale one.
pub const CATALOG_TTL_MS: u64 = 60_000;
/// First restart delay after an upstream dies; doubled after each failed start.
pub const RESTART_BACKOFF_INITIAL: Duration = Duration::from_millis(250);
/// Largest restart delay.
pub const RESTART_BACKOFF_MAX: Duration = Duration::from_secs(30);
/// A connection that stayed up this long resets the backoff to its initial value.
pub const RESTART_BACKOFF_RESET_AFTER: Duration = Duration::from_secs(60);
/// Restarts attempted in a row before an upstream is given up (its tools stay unlisted until
/// ring0 is restarted). 0 would mean "never give up"; it is bounded like everything else.
pub const RESTARTS_MAX: u32 = 50;
/// Default idle timeout of an upstream call: reset by every progress notification.
pub const CALL_IDLE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(120);
/// Default hard limit of an upstream call, whatever progress it reports.
pub const CALL_MAX_TIMEOUT_DEFAULT: Duration = Duration::from_secs(600);
/// Longest stderr line of an upstream copied to the log; the rest of the line is counted.
pub const STDERR_LINE_BYTES_MAX: usize = 4096;
/// Tools per downstream `tools/list` page.
pub const TOOLS_PAGE_SIZE: usize = 500;
/// Base64 bytes of binary content (images, audio, blobs) forwarded whole in one result; larger
/// items are replaced by a placeholder naming their type and size.
pub const BINARY_CONTENT_BYTES_MAX: usize = 2 * 1024 * 1024;
/// Largest shaped result object of one upstream call, serialized. The result is the call's
/// observation payload, which the journal keeps with its receipt: a larger one keeps what a model
/// reads (text, structured content, `isError`) and loses its binary items and the fields ring0
/// does not model, saying so.
pub const FORWARDED_RESULT_BYTES_MAX: usize = 3 * 1024 * 1024;
const _: () = assert!(BINARY_CONTENT_BYTES_MAX < FORWARDED_RESULT_BYTES_MAX);
// Room for the observation's text beside its payload in one journaled receipt.
const _: () =
    assert!(FORWARDED_RESULT_BYTES_MAX + 512 * 1024 <= ring0_journal::limits::RECEIPT_BYTES_MAX);
/// Largest `tools/call` result a client is sent: the bound of the kernel's projection for MCP
/// sessions. Forwarding never makes a result larger than the upstream message it came in
/// ([`UPSTREAM_MESSAGE_BYTES_MAX`]) by more than its notices, so any result ring0 shaped fits.
pub const RESULT_BYTES_MAX: usize = UPSTREAM_MESSAGE_BYTES_MAX + 64 * 1024;
/// Longest qualified tool name: 64 is the smallest limit among the major provider APIs.
pub const QUALIFIED_NAME_BYTES_MAX: usize = 64;
/// Longest upstream alias.
pub const ALIAS_BYTES_MAX: usize = 24;
/// How long an approval question waits for a person before the call is refused.
pub const APPROVAL_WAIT_DEFAULT: Duration = Duration::from_secs(300);
/// Pending confirm tokens kept per gateway; the oldest is dropped beyond this.
pub const CONFIRM_TOKENS_MAX: usize = 1024;
/// How long a confirm token stays valid.
pub const CONFIRM_TOKEN_TTL: Duration = Duration::from_secs(600);
/// Times in a row a broken upstream response stream is resumed with `Last-Event-ID` (sessionful
/// era, servers that number their events) before the call is reported as lost. An attempt that
/// brings new events restarts the count; the call's idle and hard timeouts bound it as well.
pub const STREAM_RESUMES_MAX: u32 = 5;
/// Longest wait before resuming a broken response stream, whatever `retry` the server asked for.
pub const STREAM_RESUME_DELAY_MAX: Duration = Duration::from_secs(5);
/// How long a question asked through an `input_required` result (2026-07-28 era) waits for the
/// client's retry. Past it the parked call is dropped and the asker (an upstream's request,
/// ring0's approval) gets an error.
pub const INPUT_WAIT: Duration = Duration::from_secs(300);
/// How long a retry handed to the replica that parked its call may take to connect there.
pub const HANDOFF_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a retry handed to another replica may take in all: its question's wait and the
/// rest of the call (a tool's own timeout is far below it).
pub const HANDOFF_WAIT: Duration = Duration::from_secs(2 * INPUT_WAIT.as_secs());
/// Calls parked at once waiting for their clients' answers; a question beyond this is answered
/// with an error at once.
pub const PARKED_CALLS_MAX: usize = 256;
/// Questions one call may have outstanding at once (one `input_required` result carries them).
pub const QUESTIONS_PER_CALL_MAX: usize = 16;
/// How long a call's first question waits for others asked at the same moment, so that they
/// travel in one `input_required` result. Not a timeout: a late question goes in the next one.
pub const INPUT_BATCH_GRACE: Duration = Duration::from_millis(20);
/// `input_required` rounds an upstream's tool call may go through before ring0 gives up on it.
pub const UPSTREAM_INPUT_ROUNDS_MAX: usize = 10;
/// Raw tool results and listings kept for the response that carries them out (see
/// [`crate::lossless`]); the oldest makes room for a new one.
pub const RAW_STASH_ENTRIES_MAX: usize = 1024;
/// Bytes of raw JSON kept at once; the oldest entries make room, and a single larger result is
/// answered with its typed rendering.
pub const RAW_STASH_BYTES_MAX: usize = 128 * 1024 * 1024;
/// How long a raw result is kept: long enough for the response to be written, and for a client
/// that resumes an SSE stream to be sent the same event again.
pub const RAW_STASH_TTL: Duration = Duration::from_secs(120);
/// Longest SSE event held while it arrives in pieces; a longer one is passed on as rmcp wrote it.
pub const SSE_EVENT_BYTES_MAX: usize = 64 * 1024 * 1024;
/// Tasks held at once across every session of one endpoint (running, or finished and kept).
pub const TASKS_MAX: usize = 256;
/// Tasks held at once for one downstream session. At either bound the oldest finished task
/// makes room; when none has finished, a call is answered the ordinary way instead of as a task.
pub const TASKS_PER_SESSION_MAX: usize = 32;
/// How long a finished task (and its result) stays available to `tasks/get`.
pub const TASK_RETAIN_AFTER_DONE: Duration = Duration::from_secs(600);
/// Poll interval suggested to clients for `tasks/get`, in milliseconds.
pub const TASK_POLL_INTERVAL_MS: u64 = 500;
/// An upstream call still running after this becomes a task (for clients that support tasks);
/// one that finishes sooner is answered directly.
pub const TASK_PROMOTE_AFTER: Duration = Duration::from_secs(1);
/// Each `job_wait` round a job task's watcher makes waits at most this long.
pub const TASK_JOB_WAIT_SLICE: Duration = Duration::from_secs(60);
/// Longest output tail (or error text) in a task status message; its start is cut, and counted.
pub const TASK_STATUS_BYTES_MAX: usize = 4096;
/// A job task's status message (its state and last lines of output) is refreshed by `tasks/get`
/// at most this often; polls in between get the last one. Each refresh is a journaled round.
pub const TASK_INSPECT_INTERVAL_MIN: Duration = Duration::from_secs(1);
/// Longest string of an upstream's tool or prompt definition, resource or prompt listing
/// forwarded (a description, a title, a schema string); the rest is cut and counted.
pub const DEFINITION_TEXT_BYTES_MAX: usize = 16 * 1024;
/// Text bytes of one `resources/read` result forwarded; a larger text is cut (the whole text
/// kept in the spill store when there is one) with a counted notice.
pub const RESOURCE_TEXT_BYTES_MAX: usize = 64 * 1024;
/// Base64 bytes of one binary resource forwarded; a larger one is replaced by a notice.
pub const RESOURCE_BLOB_BYTES_MAX: usize = 4 * 1024 * 1024;
/// Text bytes of one `prompts/get` result forwarded, over every message.
pub const PROMPT_TEXT_BYTES_MAX: usize = 64 * 1024;
/// Values of one `completion/complete` result forwarded (the protocol's own maximum).
pub const COMPLETION_VALUES_MAX: usize = 100;
/// Longest completion value forwarded.
pub const COMPLETION_VALUE_BYTES_MAX: usize = 1024;
/// Prompts listed per upstream; a longer listing is refused.
pub const UPSTREAM_PROMPTS_MAX: usize = 1024;
/// Longest `instructions` of one upstream relayed to clients (after cleaning); the rest is cut
/// and counted. The instructions are pinned with the server's identity, so a change
/// quarantines its tools and the new text is relayed only once approved.
pub const UPSTREAM_INSTRUCTIONS_BYTES_MAX: usize = 4 * 1024;
/// Longest string of a message an upstream sends a client during a call (a log message, a
/// progress message, an elicitation or sampling request) forwarded.
pub const RELAYED_TEXT_BYTES_MAX: usize = 64 * 1024;
/// Longest message a downstream client may send: one stdio line or one HTTP request body. A
/// longer one is discarded as it arrives and answered with `-32700` (HTTP: 413).
pub const CLIENT_MESSAGE_BYTES_MAX: usize = 16 * 1024 * 1024;
/// Default `[http] header_read_timeout_ms`: how long a connection may take to send a request's
/// headers (a half-open connection is closed past it), and how long an idle keep-alive
/// connection waits for its next request.
pub const HEADER_READ_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// Default `[http] body_read_timeout_ms`: how long a request's body may take to arrive.
pub const BODY_READ_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);
/// Default `[http] connections_max`: connections open at once. Below the usual descriptor limit
/// of 1024 with room for upstreams, the journal and the log.
pub const CONNECTIONS_MAX_DEFAULT: usize = 768;
/// Default `[http] sessions_per_principal_max`: sessionful sessions one principal holds at once.
pub const SESSIONS_PER_PRINCIPAL_MAX_DEFAULT: usize = 64;
/// Default `[http] session_idle_timeout_s`: a sessionful session unused this long is closed.
pub const SESSION_IDLE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30 * 60);
/// How often idle sessions are looked for. A session is closed at most this long after its
/// idle timeout.
pub const SESSION_SWEEP_INTERVAL: Duration = Duration::from_secs(5);
/// Pause after a failed `accept` (descriptors exhausted): the listener retries instead of
/// spinning on the error.
pub const ACCEPT_RETRY_DELAY: Duration = Duration::from_millis(50);
/// How long connections are given to finish at shutdown before they are dropped.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// Longest scope a client may name in `_meta["io.ring0/scope"]`; a longer one is refused.
pub const SCOPE_BYTES_MAX: usize = 256;
/// Longest idempotency key a client may send (`params.idempotencyKey` or
/// `_meta["io.ring0/idempotency-key"]`): the kernel's bound; a longer one is refused.
pub use ring0_core::limits::IDEMPOTENCY_KEY_BYTES_MAX;
/// Largest HTTP request body to `/mcp`, read by ring0 (for fields rmcp's model drops) and by
/// rmcp, which is given the same bound explicitly.
pub const REQUEST_BODY_BYTES_MAX: usize = CLIENT_MESSAGE_BYTES_MAX;
/// How long a reconciliation probe waits for its upstream to come back (a crash mid-call
/// leaves the upstream restarting just when the probe is due) before its outcome is called
/// inconclusive and the intent dead-lettered for a person.
pub const PROBE_RECONNECT_WAIT: Duration = Duration::from_secs(30);
/// The first pause before a probe is asked again after its upstream's connection failed; each
/// next pause doubles, up to [`PROBE_RETRY_BACKOFF_MAX`], all within [`PROBE_RECONNECT_WAIT`].
pub const PROBE_RETRY_BACKOFF_START: Duration = Duration::from_millis(50);
/// The longest pause between two asks of a probe whose upstream is restarting.
pub const PROBE_RETRY_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Longest a call's response waits for the progress notifications relayed before it to be sent
/// to its client (they go first; a client that stopped reading does not hold the response).
pub const RELAY_FLUSH_WAIT: Duration = Duration::from_secs(5);
