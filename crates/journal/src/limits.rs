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

/// The SQLite writer folds the key index (see the `key_index` module) into its tables once it
/// has had no request for this long (10 ms). Long enough that the gaps between the batches of a
/// busy host (well under a millisecond of waiting for the next caller) never trigger it, so a
/// fold's scattered page writes and fsync do not land between two batches of a burst; short
/// enough that a host that pauses folds within a blink and the in-memory map stays small.
/// (`cargo bench -p ring0-journal --bench commit` never pauses this long between its phases:
/// it ends with its 47,000 or so intents all pending, folded by the close.)
pub const KEY_INDEX_FOLD_IDLE_MS: u64 = 10;

/// Most key-index entries the SQLite writer folds in one idle transaction (16). A fold gives
/// way to a caller that arrives (see [`KEY_INDEX_FOLD_STEP`]) except during its COMMIT, which
/// writes the chunk's pages to the WAL and fsyncs them: about two scattered index pages per
/// entry, so 16 entries write about as many pages as a group commit of 64 new intents, and a
/// caller that arrives during that COMMIT waits about as long as behind one batch. The size
/// comes from that bound, not from a benchmark figure: folding 16 entries per fsync is slow
/// (tens of thousands of entries a second), which only an idle writer pays.
pub const KEY_INDEX_FOLD_CHUNK: usize = 16;

/// Most key-index entries folded per transaction when the SQLite journal closes (4,096): no
/// caller waits then, so the chunk is sized for throughput. Measured at the end of
/// `cargo bench -p ring0-journal --bench commit` (about 47,000 entries pending), the close with
/// its final checkpoint took 2.7 s at the idle chunk size (one fsync per 16 entries) and 0.8 s
/// with this one.
pub const KEY_INDEX_CLOSE_FOLD_CHUNK: usize = 4096;

/// The SQLite writer looks at its queue every this many entries (4) of an idle fold, and
/// abandons the fold for a waiting caller: a few upserts are all a caller waits for.
pub const KEY_INDEX_FOLD_STEP: usize = 4;

/// Most intents whose key-index entries the SQLite writer holds in memory (65,536; each is an
/// 80-byte entry and a slot in two hash maps, 200–300 bytes in all: 12–19 MiB at the cap,
/// reserved at open and touched as entries arrive).
/// Beyond it the writer folds the oldest entries inside the batch it is committing, so a host
/// under load without a pause keeps a bounded map (and a bounded scan at the next open, which
/// rebuilds the map from the rows above the watermark), at the price of that batch writing its
/// share of index pages as before.
pub const KEY_INDEX_PENDING_MAX: usize = 65_536;

/// Entries of each kind (semantic keys, content digests) the SQLite writer's filter of the
/// folded key-index entries is first sized for, at least (65,536: 128 KiB per kind, 16 bits
/// an entry); it grows by doubling as folds add entries.
pub const FOLDED_FILTER_INITIAL_ENTRIES: usize = 65_536;

/// Most memory that filter holds, both kinds together (64 MiB: several million folded
/// intents). Past it the filter is dropped and the writer probes the tables for every new key,
/// as it would without one.
pub const FOLDED_FILTER_BYTES_MAX: usize = 64 * 1024 * 1024;

/// Default time (24 hours) a caller's explicit idempotency key is kept: a retry under the key
/// within it is answered with the recorded result; after it the key names nothing.
pub const CLIENT_KEY_RETENTION_MS_DEFAULT: u64 = 24 * 60 * 60 * 1000;

/// Most explicit idempotency keys kept per principal (65,536); beyond it the oldest are
/// forgotten first.
pub const CLIENT_KEYS_PER_PRINCIPAL_MAX: usize = 65_536;

/// Longest explicit idempotency key the journal stores (256 bytes, as the kernel accepts).
pub const CLIENT_KEY_BYTES_MAX: usize = ring0_core::limits::IDEMPOTENCY_KEY_BYTES_MAX;

/// Connections the PostgreSQL journal keeps in its pool, at most (16). A proposal holds one for
/// its transaction; a caller beyond this waits for one (at most [`POSTGRES_POOL_WAIT_MS`]).
pub const POSTGRES_POOL_CONNECTIONS_DEFAULT: usize = 16;

/// Longest a PostgreSQL journal request waits for a pooled connection (10 s) before it fails
/// closed with a storage error.
pub const POSTGRES_POOL_WAIT_MS: u64 = 10_000;

/// Longest the PostgreSQL journal waits to connect to the server (10 s).
pub const POSTGRES_CONNECT_TIMEOUT_MS: u64 = 10_000;

/// Default lease of a PostgreSQL journal replica (10 s): the records it moved are its own while
/// its lease runs; once it lapses another replica's recovery takes them. Renewed by heartbeat
/// every third of it ([`POSTGRES_HEARTBEATS_PER_LEASE`]).
pub const POSTGRES_LEASE_MS_DEFAULT: u64 = 10_000;

/// Shortest lease a PostgreSQL replica may take (200 ms): shorter, a heartbeat's round trip and
/// scheduling delays would let a live replica's lease lapse.
pub const POSTGRES_LEASE_MS_MIN: u64 = 200;

/// Heartbeats per lease (3): a replica renews its lease every third of it, so two heartbeats
/// may be lost before it lapses.
pub const POSTGRES_HEARTBEATS_PER_LEASE: u64 = 3;

/// Most expired records one recovery pass takes (256); the next pass takes the rest.
pub const POSTGRES_TAKE_BATCH_MAX: i64 = 256;

/// Most times a PostgreSQL proposal is decided again after another replica changed what it
/// read (a claim or a fence that moved between its reads and its writes) (16). Each retry reads
/// the other's committed result, so a retry decides; reaching this fails closed.
pub const POSTGRES_PROPOSE_RETRIES_MAX: u32 = 16;

/// Delivery marks the PostgreSQL journal holds until its next write (4,096); beyond it a mark
/// is dropped, which only makes the next identical call a replay (the safe side).
pub const POSTGRES_DELIVERIES_PENDING_MAX: usize = 4096;

/// Worker threads of the runtime the PostgreSQL journal runs its I/O on (2).
pub const POSTGRES_RUNTIME_THREADS: usize = 2;

/// Longest a closing PostgreSQL journal waits to give up its lease (2 s); past it the lease
/// simply lapses.
pub const POSTGRES_CLOSE_TIMEOUT_MS: u64 = 2_000;

/// Most proposals one PostgreSQL group commit decides in its transaction (256). A batch costs
/// the same few round trips whatever its size (its statements carry it in arrays), so the bound
/// is not about round trips: it caps the rows one transaction locks and the arrays one
/// statement binds (256 proposals of at most 4 KiB of inline arguments: about 1 MiB a
/// statement), and the wait of a proposer at the back of a batch. Four times the 64 proposers
/// the benchmark runs, so a burst of them fits one batch.
pub const POSTGRES_GROUP_COMMIT_MAX: usize = 256;

/// A PostgreSQL group-commit worker holding fewer proposals than the last batch had waits for
/// the rest for at most this share (25 %) of the last batch's time...
pub const POSTGRES_GROUP_GATHER_PERCENT: u32 = 25;

/// ... and never longer than this (1 ms; the runtime's timers tick by the millisecond, so a
/// shorter wait ends at the next tick). A lone proposer never waits.
pub const POSTGRES_GROUP_GATHER_US_MAX: u64 = 1_000;

/// Most proposals waiting for a PostgreSQL group commit (1,024); a proposer beyond it waits
/// for room.
pub const POSTGRES_GROUP_QUEUE_MAX: usize = 1024;

// A batch is taken from the queue: one larger than the queue could never fill.
const _: () = assert!(POSTGRES_GROUP_COMMIT_MAX <= POSTGRES_GROUP_QUEUE_MAX);

/// Group-commit workers of a PostgreSQL journal (2), each holding one pooled connection while
/// its batch runs: one collects while the other commits. Fewer when the pool is smaller, so
/// proposals never take every connection from reads and transitions. More workers split the
/// same proposers into smaller concurrent batches: with 4, 64 proposers of
/// `cargo bench -p ring0-journal --bench commit` (fsync=off, 2 cores) ran in batches of 11 to
/// 24 at 4,000 commits/s; with 2, in batches of 35 to 63 at 6,600 commits/s.
pub const POSTGRES_GROUP_WORKERS_MAX: usize = 2;

/// How long the row of a PostgreSQL replica that stopped (its lease lapsed or given up) is kept
/// for operators once it holds no open record (1 hour); then it is pruned.
pub const POSTGRES_REPLICA_RETENTION_MS: u64 = 60 * 60 * 1000;

/// How often a waiter reads a held call's record for a decision made elsewhere
/// ([`crate::Journal::hold_wait`]) on a backend that cannot tell it (100 ms): a person's
/// answer is not latency sensitive.
pub const HOLD_POLL_MS: u64 = 100;

/// How often a waiter on the PostgreSQL journal reads a held call's record although it listens
/// for decisions (1 s): the fallback for a notification lost while its listening connection
/// was down. A decision reaches a waiting call within this even without notifications.
pub const POSTGRES_HOLD_POLL_MS: u64 = 1_000;

/// Decisions of held calls the PostgreSQL journal's listener buffers for its waiters (256); a
/// waiter that falls behind reads its record again instead.
pub const POSTGRES_HOLD_NOTICES_MAX: usize = 256;

/// Longest the PostgreSQL journal's listener waits before connecting again after its
/// connection failed (5 s; it starts at 100 ms and doubles).
pub const POSTGRES_LISTEN_BACKOFF_MS_MAX: u64 = 5_000;
