//! The requests the writer thread decides: what a caller sends, what it gets back, and what
//! each request does inside the writer's transaction.
//!
//! A proposal is prepared on the caller's thread ([`PreparedProposal`]): everything that does
//! not depend on what is recorded — digests, the record it would create, that record's columns
//! as stored — so the one writer thread, the journal's bottleneck under load, only looks up,
//! decides and runs SQL. [`apply`] then finds the records that bear on the request (by id, and
//! for a mutating proposal through the key index), lets the private `decide` module plan the
//! answer — the code [`crate::MemoryJournal`] runs — and writes what the plan says.

use super::files::Files;
use super::key_index::{ContentDigest, IndexEntry, KeyIndex, Staged};
use super::reads::{load_by_id, load_indexed};
use super::rows::{
    bind_client_key, by_client_key, insert_attempt, insert_fresh, json, mark_delivered, to_i64,
    update,
};
use crate::JournalError;
use crate::clock::Clock;
use crate::decide::{self, Found, Planned, Write};
use crate::hold::{self, HeldCall, HoldDecided, HoldState};
use crate::limits::MEMO_ENTRIES_MAX;
use crate::memo::MemoEntry;
use crate::record::{IntentId, IntentRecord, Proposal, ProposeDecision, Transition};
use futures::channel::oneshot;
use ring0_core::Fingerprint;
use rusqlite::{Connection, params};
use std::sync::Arc;

/// Where the writer sends a request's answer.
pub(crate) type Reply<T> = oneshot::Sender<Result<T, JournalError>>;

/// A proposal with everything the writer needs that does not depend on what is recorded,
/// computed on the caller's thread: the one writer thread is the journal's bottleneck under
/// load, so it only looks up, decides and runs SQL. That includes the record the proposal
/// creates if nothing recorded decides it (most proposals), with its columns already in their
/// stored form: for those the writer inserts a row and answers [`Proposed::Fresh`], and the
/// caller hands its own record back, so the writer neither builds nor copies one.
pub(crate) struct PreparedProposal {
    pub(crate) proposal: Proposal,
    /// `semantic_key.encode()`, the stored form.
    pub(crate) key_text: String,
    /// The content digest (see `decide::content_digest`), and its stored form.
    pub(crate) content: ContentDigest,
    pub(crate) content_hex: String,
    /// SHA-256 of the canonical arguments: the name of their spill file.
    pub(crate) args_sha256: String,
    /// The new record (`decide::new_record`), stamped with the caller's clock.
    pub(crate) fresh: IntentRecord,
    /// Its id, call ids and timeline as stored.
    pub(crate) fresh_id: String,
    pub(crate) fresh_call_ids: String,
    pub(crate) fresh_timeline: String,
    /// The time it was stamped with.
    pub(crate) fresh_ms: u64,
}

impl PreparedProposal {
    /// `incarnation` owns the new record. An id is drawn from `clock` whenever the host names
    /// none, whether or not the record is created (the memory journal draws alike).
    pub(crate) fn new(proposal: Proposal, clock: &dyn Clock, incarnation: u64) -> Self {
        let p = &proposal;
        let content =
            decide::content_digest_bytes(&p.tool, &p.scope, p.attempt_epoch, &p.canonical_args);
        let fresh_ms = clock.now_ms();
        let id = p.intent_id.unwrap_or_else(|| clock.new_id());
        let fresh = decide::new_record(p, id, fresh_ms, incarnation);
        Self {
            key_text: p.semantic_key.encode(),
            content,
            content_hex: decide::hex(&content),
            args_sha256: decide::sha256_hex(p.canonical_args.as_bytes()),
            fresh_id: id.to_string(),
            fresh_call_ids: json(&fresh.call_ids),
            fresh_timeline: json(&fresh.timeline),
            fresh,
            fresh_ms,
            proposal,
        }
    }
}

/// The writer's answer to a proposal.
// Moved once, through a channel: boxing the large variant would add an allocation, made on the
// writer's thread, to every answer that is not `Fresh`.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Proposed {
    /// The proposal's own new record ([`PreparedProposal::fresh`]) was inserted: RECORDED.
    Fresh,
    /// Records already in the journal decided it.
    Decided(ProposeDecision),
}

/// A request to the writer. Proposals and transitions are shared with the caller, who holds
/// them until answered: the writer drops its reference before it answers, so their memory is
/// freed on the caller's thread, where it was allocated. (Freeing a batch of other threads'
/// allocations took the writer about a quarter of each 64-intent batch in `cargo bench -p
/// ring0-journal --bench commit`, contending for the callers' malloc arena while they built
/// their next requests.)
pub(crate) enum WriteJob {
    Propose(Arc<PreparedProposal>, Reply<Proposed>),
    Transition(Arc<Transition>, Reply<IntentRecord>),
    MemoPut(Fingerprint, MemoEntry, Reply<bool>),
    /// A delivery record: nobody waits for its answer.
    MarkDelivered(IntentId),
    /// A held call recorded (see [`crate::hold`]).
    HoldPut(Box<HeldCall>, Reply<bool>),
    /// A held call decided once.
    HoldDecide(String, HoldState, Reply<HoldDecided>),
}

/// What a request did, before the writer hands it to the caller as its typed answer.
pub(crate) enum Done {
    Decision(Proposed),
    Record(IntentRecord),
    Stored(bool),
    Hold(HoldDecided),
}

/// A row a job inserted: its `seq`, and its key-index entry if it is mutating.
pub(crate) struct Inserted {
    pub(crate) seq: i64,
    pub(crate) entry: Option<IndexEntry>,
}

/// Runs one request inside the writer's transaction: its answer, and the row it inserted if
/// any (for the caller to stage its key-index entry once the request's changes stand).
pub(crate) fn apply(
    conn: &Connection,
    files: &Files,
    now: u64,
    incarnation: u64,
    job: &WriteJob,
    index: &KeyIndex,
    staged: &Staged,
) -> Result<(Done, Option<Inserted>), JournalError> {
    match job {
        WriteJob::Propose(prepared, _) => {
            propose(conn, files, now, incarnation, prepared, index, staged)
        }
        WriteJob::Transition(t, _) => {
            let record = load_by_id(conn, files, &t.id)?.ok_or(JournalError::NotFound(t.id))?;
            let next = decide::plan_transition(&record, t, now, incarnation)?;
            update(conn, files, &next, record.fence, now)?;
            Ok((Done::Record(next), None))
        }
        WriteJob::MemoPut(fp, entry, _) => {
            store_memo(conn, files, fp, entry)?;
            Ok((Done::Stored(true), None))
        }
        WriteJob::MarkDelivered(id) => {
            mark_delivered(conn, files, id, now)?;
            Ok((Done::Stored(true), None))
        }
        WriteJob::HoldPut(held, _) => {
            store_hold(conn, files, held)?;
            Ok((Done::Stored(true), None))
        }
        WriteJob::HoldDecide(id, state, _) => {
            let Some(held) = crate::sqlite::reads::load_hold(conn, files, id)? else {
                return Ok((Done::Hold(HoldDecided::NotFound), None));
            };
            let outcome = hold::decide(held, state.clone(), now);
            if let Some(changed) = outcome.changed() {
                store_hold(conn, files, changed)?;
            }
            Ok((Done::Hold(outcome), None))
        }
    }
}

/// Stores a held call (one statement: the row holds the call as JSON, with its state and age
/// as columns for the pending listing).
fn store_hold(conn: &Connection, files: &Files, held: &HeldCall) -> Result<(), JournalError> {
    conn.prepare_cached(
        "INSERT INTO held_calls (approval_id, state, created_ms, body) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT(approval_id) DO UPDATE SET state = excluded.state, body = excluded.body",
    )
    .and_then(|mut stmt| {
        stmt.execute(params![
            held.approval_id,
            held.state.as_str(),
            to_i64(held.created_ms),
            crate::sqlite::rows::json(held)
        ])
    })
    .map_err(|e| files.sql(e))?;
    Ok(())
}

/// Decides a proposal from the records it names or matches, and writes the decision: the
/// proposal's own new record, an update of the record found by key, or nothing.
fn propose(
    conn: &Connection,
    files: &Files,
    now: u64,
    incarnation: u64,
    prepared: &PreparedProposal,
    index: &KeyIndex,
    staged: &Staged,
) -> Result<(Done, Option<Inserted>), JournalError> {
    let p = &prepared.proposal;
    let by_id = match p.intent_id {
        Some(id) => load_by_id(conn, files, &id)?,
        None => None,
    };
    let (by_key, by_content) = if p.mutating {
        found_by_key(conn, files, prepared, index, staged)?
    } else {
        (None, None)
    };
    let by_client_key = match (&p.client_key, p.mutating) {
        (Some(key), true) => by_client_key(conn, files, key)?,
        _ => None,
    };
    let found = Found {
        by_client_key: by_client_key.as_ref(),
        by_id: by_id.as_ref(),
        by_key: by_key.as_ref(),
        by_content: by_content.as_ref(),
    };
    let plan = match decide::plan_existing(p, found, now, incarnation)? {
        Planned::Decided(plan) => plan,
        Planned::Fresh { attempt } => {
            let (seq, proposed) = if attempt == 0 {
                (insert_fresh(conn, files, prepared)?, Proposed::Fresh)
            } else {
                let record = decide::with_attempt(prepared.fresh.clone(), attempt, now);
                let seq = insert_attempt(conn, files, prepared, &record)?;
                (seq, Proposed::Decided(ProposeDecision::Recorded(record)))
            };
            if let (Some(key), true) = (&p.client_key, p.mutating) {
                bind_client_key(conn, files, key, seq, now)?;
            }
            let entry = p.mutating.then_some(IndexEntry {
                seq,
                key: p.semantic_key,
                content: prepared.content,
            });
            return Ok((Done::Decision(proposed), Some(Inserted { seq, entry })));
        }
    };
    // A plan from the records found answers, or updates the record found.
    if let Some(Write::Update(record)) = plan.write {
        let fence = [&by_client_key, &by_key]
            .into_iter()
            .flatten()
            .find(|r| r.id == record.id)
            .map(|r| r.fence)
            .expect("an update follows a found record");
        update(conn, files, &record, fence, now)?;
    }
    Ok((Done::Decision(Proposed::Decided(plan.decision)), None))
}

/// The records holding a mutating proposal's semantic key and its content digest, found
/// through the key index.
fn found_by_key(
    conn: &Connection,
    files: &Files,
    prepared: &PreparedProposal,
    index: &KeyIndex,
    staged: &Staged,
) -> Result<(Option<IntentRecord>, Option<IntentRecord>), JournalError> {
    let (key_seq, content_seq) = index.lookup(conn, files, staged, prepared)?;
    let by_key = match key_seq {
        Some(seq) => Some(load_indexed(conn, files, seq)?),
        None => None,
    };
    let by_content = match content_seq {
        // Usually the same record: read it once.
        Some(seq) if key_seq == Some(seq) => by_key.clone(),
        Some(seq) => Some(load_indexed(conn, files, seq)?),
        None => None,
    };
    Ok((by_key, by_content))
}

/// Stores a memoized observation and evicts the oldest entries beyond [`MEMO_ENTRIES_MAX`]:
/// two statements, so the writer runs this request in a savepoint of its own.
fn store_memo(
    conn: &Connection,
    files: &Files,
    fp: &Fingerprint,
    entry: &MemoEntry,
) -> Result<(), JournalError> {
    conn.prepare_cached(
        "INSERT INTO memo (fingerprint, observation, stored_ms) VALUES (?1, ?2, ?3)
         ON CONFLICT(fingerprint) DO UPDATE SET
           observation = excluded.observation, stored_ms = excluded.stored_ms",
    )
    .and_then(|mut stmt| stmt.execute(params![fp.encode(), entry.text, to_i64(entry.stored_ms)]))
    .map_err(|e| files.sql(e))?;
    conn.prepare_cached(
        "DELETE FROM memo WHERE fingerprint IN (
           SELECT fingerprint FROM memo ORDER BY stored_ms, fingerprint
           LIMIT max(0, (SELECT count(*) FROM memo) - ?1))",
    )
    .and_then(|mut stmt| stmt.execute([MEMO_ENTRIES_MAX as i64]))
    .map_err(|e| files.sql(e))?;
    Ok(())
}
