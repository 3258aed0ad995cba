//! The decisions every backend shares.
//!
//! A backend only stores records and finds them by id, by semantic key and by content; what a
//! proposal or a transition *means* is decided here, by pure functions over the records found.
//! That is how [`crate::MemoryJournal`] and [`crate::SqliteJournal`] give the same answers, and
//! how "delete every in-memory structure and reopen the log" gives the same decisions (P4): the
//! inputs of these functions are rows of the log, nothing else.

use crate::JournalError;
use crate::limits::{
    ARGS_BYTES_MAX, ATTEMPTS_MAX, CLIENT_KEY_BYTES_MAX, NOTE_BYTES_MAX, RECEIPT_BYTES_MAX,
    SCOPE_BYTES_MAX, SNAPSHOT_BYTES_MAX,
};
use crate::machine;
use crate::record::{
    CALL_IDS_PER_RECORD_MAX, ClientKey, IntentId, IntentRecord, Proposal, ProposeDecision,
    Transition,
};
use ring0_core::IntentState;
use ring0_core::limits::{CALL_ID_BYTES_MAX, TOOL_NAME_BYTES_MAX};
use ring0_core::receipt::TimelineEntry;
use ring0_core::text::truncate_utf8;
use sha2::{Digest, Sha256};

/// Lowercase hex of bytes (a table lookup per nibble: this runs for every proposal).
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 0xf)] as char);
    }
    out
}

/// SHA-256 of a byte string as lowercase hex.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// A version-independent digest of what an intent *is*: tool, scope, epoch and canonical
/// arguments. Two proposals with equal content digests but semantic keys of different
/// canonicalizer versions are the same intent seen through two canonicalizers: a conflict, never
/// a second record.
pub(crate) fn content_digest(tool: &str, scope: &str, epoch: u64, canonical_args: &str) -> String {
    hex(&content_digest_bytes(tool, scope, epoch, canonical_args))
}

/// [`content_digest`] as raw bytes, the form the durable backend keeps in memory.
pub(crate) fn content_digest_bytes(
    tool: &str,
    scope: &str,
    epoch: u64,
    canonical_args: &str,
) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"ring0-content\0");
    h.update(tool.as_bytes());
    h.update([0]);
    h.update(scope.as_bytes());
    h.update([0]);
    h.update(epoch.to_be_bytes());
    h.update(canonical_args.as_bytes());
    h.finalize().into()
}

pub(crate) fn record_content_digest(r: &IntentRecord) -> String {
    content_digest(&r.tool, &r.scope, r.attempt_epoch, &r.canonical_args)
}

pub(crate) fn proposal_content_digest(p: &Proposal) -> String {
    content_digest(&p.tool, &p.scope, p.attempt_epoch, &p.canonical_args)
}

/// Refuses a proposal that exceeds a limit, before anything is looked up or written.
pub(crate) fn validate_proposal(p: &Proposal) -> Result<(), JournalError> {
    let too_large = |what: &'static str, bytes: usize, max: usize| {
        if bytes > max {
            Err(JournalError::TooLarge { what, bytes, max })
        } else {
            Ok(())
        }
    };
    too_large(
        "canonical arguments",
        p.canonical_args.len(),
        ARGS_BYTES_MAX,
    )?;
    too_large("scope", p.scope.len(), SCOPE_BYTES_MAX)?;
    too_large("tool name", p.tool.len(), TOOL_NAME_BYTES_MAX)?;
    too_large("call id", p.call_id.len(), CALL_ID_BYTES_MAX)?;
    if let Some(ck) = &p.client_key {
        too_large("idempotency key", ck.key.len(), CLIENT_KEY_BYTES_MAX)?;
        too_large(
            "principal",
            ck.principal.len(),
            ring0_core::principal::PRINCIPAL_ID_BYTES_MAX,
        )?;
        if ck.key.is_empty() || !ck.key.bytes().all(|b| b.is_ascii_graphic() || b == b' ') {
            return Err(JournalError::Invalid(
                "an idempotency key is 1 or more printable ASCII characters".into(),
            ));
        }
    }
    if i64::try_from(p.attempt_epoch).is_err() {
        return Err(JournalError::Invalid(format!(
            "attempt epoch {} is above 2^63-1",
            p.attempt_epoch
        )));
    }
    Ok(())
}

/// What a backend must store after a decision.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Write {
    /// A new record: index it by id, and (when mutating) by semantic key and content digest.
    Insert(IntentRecord),
    /// An existing record, changed (state, fence, timeline or call ids).
    Update(IntentRecord),
}

/// A decision and the write that makes it durable.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ProposePlan {
    pub decision: ProposeDecision,
    pub write: Option<Write>,
}

/// The provider idempotency key of one attempt of an intent: the first attempt's is the
/// semantic key's for the epoch (as before attempts were counted); every later attempt's is
/// derived from it and the attempt number, so a provider never merges two genuine attempts.
pub fn attempt_idempotency_key(key: &ring0_core::SemanticKey, epoch: u64, attempt: u32) -> String {
    let first = key.idempotency_key(epoch);
    if attempt == 0 {
        return first;
    }
    let mut h = Sha256::new();
    h.update(b"ring0-attempt\0");
    h.update(first.as_bytes());
    h.update(attempt.to_be_bytes());
    format!("r0-{}", &hex(&h.finalize())[..40])
}

/// What the records found leave to the backend when they decide nothing themselves.
// Returned once per proposal and matched at once: boxing the plan would add an allocation to
// every decided proposal on the writer's thread.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Planned {
    /// The records decided: answer, and write what the plan says.
    Decided(ProposePlan),
    /// A new record, as [`new_record`] builds it, for this attempt of the logical call.
    Fresh { attempt: u32 },
}

/// Whether a record found under a caller's key is still within the key's retention.
pub(crate) fn key_alive(record: &IntentRecord, retention_ms: u64, now_ms: u64) -> bool {
    now_ms.saturating_sub(record.created_ms()) < retention_ms
}

/// The records a backend found for a proposal.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Found<'a> {
    /// The record the proposal's explicit idempotency key names (principal and key), if any,
    /// whatever its age: the decision applies the retention.
    pub by_client_key: Option<&'a IntentRecord>,
    /// The record with the host-supplied intent id, if the proposal carries one.
    pub by_id: Option<&'a IntentRecord>,
    /// The current mutating record holding the proposal's semantic key.
    pub by_key: Option<&'a IntentRecord>,
    /// The current mutating record with the proposal's content digest (any key version).
    pub by_content: Option<&'a IntentRecord>,
}

/// Decides a proposal against the record already holding its key (shared by every backend).
/// `None` means the existing record does not stand in the way: a failed record may be recorded
/// again, and a rejected one is replaced by a new record.
pub fn decide_existing(existing: &IntentRecord, proposal: &Proposal) -> Option<ProposeDecision> {
    use IntentState::*;
    if existing.semantic_key.version != proposal.semantic_key.version {
        return Some(ProposeDecision::Conflict {
            reason: format!(
                "canonicalizer version {} differs from recorded version {}",
                proposal.semantic_key.version, existing.semantic_key.version
            ),
            existing: Some(existing.clone()),
        });
    }
    match existing.state {
        Proposed | Recorded | Dispatched | Unknown | Reconciling => {
            Some(ProposeDecision::Duplicate(existing.clone()))
        }
        Acked => Some(ProposeDecision::Replay(existing.clone())),
        // Definitely not applied: a new proposal may record it again, within the attempt budget.
        Failed if existing.attempts >= ATTEMPTS_MAX => Some(ProposeDecision::Conflict {
            reason: format!(
                "this intent failed {} times (the most allowed); a new attempt needs a new epoch",
                existing.attempts
            ),
            existing: Some(existing.clone()),
        }),
        Failed => None,
        Compensated => Some(ProposeDecision::Conflict {
            reason: "this intent was compensated; a new attempt needs a new epoch".into(),
            existing: Some(existing.clone()),
        }),
        DeadLetter => Some(ProposeDecision::Conflict {
            reason: "this intent awaits a person's settlement (DEAD_LETTER)".into(),
            existing: Some(existing.clone()),
        }),
        RejectedDuplicate | RejectedConflict => None,
    }
}

/// Names every field in which a proposal differs from the record bound to its intent id.
fn describe_difference(existing: &IntentRecord, p: &Proposal) -> String {
    let mut parts = Vec::new();
    if existing.semantic_key.version != p.semantic_key.version {
        parts.push(format!(
            "canonicalizer version {} differs from recorded version {}",
            p.semantic_key.version, existing.semantic_key.version
        ));
    }
    if existing.tool != p.tool {
        parts.push(format!(
            "tool {:?} differs from recorded {:?}",
            p.tool, existing.tool
        ));
    }
    if existing.scope != p.scope {
        parts.push(format!(
            "scope {:?} differs from recorded {:?}",
            p.scope, existing.scope
        ));
    }
    if existing.attempt_epoch != p.attempt_epoch {
        parts.push(format!(
            "epoch {} differs from recorded {}",
            p.attempt_epoch, existing.attempt_epoch
        ));
    }
    if existing.canonical_args != p.canonical_args {
        parts.push("prepared arguments differ from the recorded ones".into());
    }
    if parts.is_empty() {
        parts.push(format!(
            "semantic key {} differs from recorded {}",
            p.semantic_key, existing.semantic_key
        ));
    }
    format!(
        "intent id {} is bound to another intent: {}",
        existing.id,
        parts.join("; ")
    )
}

fn push_call_id(record: &mut IntentRecord, call_id: &str) -> bool {
    if record.call_ids.len() < CALL_IDS_PER_RECORD_MAX {
        record.call_ids.push(call_id.to_string());
        true
    } else {
        false
    }
}

/// Cuts a note to [`NOTE_BYTES_MAX`] on a character boundary, saying how much was cut.
pub(crate) fn bound_note(note: Option<String>) -> Option<String> {
    let note = note?;
    if note.len() <= NOTE_BYTES_MAX {
        return Some(note);
    }
    let kept = truncate_utf8(&note, NOTE_BYTES_MAX);
    Some(format!("{kept}… [{} bytes cut]", note.len() - kept.len()))
}

/// Decides a proposal: the records found decide it, or it creates the new record `fresh`
/// returns (see [`new_record`]).
pub(crate) fn plan_propose(
    p: &Proposal,
    found: Found<'_>,
    now_ms: u64,
    incarnation: u64,
    fresh: impl FnOnce() -> IntentRecord,
) -> Result<ProposePlan, JournalError> {
    let attempt = match plan_existing(p, found, now_ms, incarnation)? {
        Planned::Decided(plan) => return Ok(plan),
        Planned::Fresh { attempt } => attempt,
    };
    let record = with_attempt(fresh(), attempt, now_ms);
    Ok(ProposePlan {
        decision: ProposeDecision::Recorded(record.clone()),
        write: Some(Write::Insert(record)),
    })
}

/// A new record made the `attempt`-th attempt of its logical call (unchanged for the first).
pub(crate) fn with_attempt(mut record: IntentRecord, attempt: u32, now_ms: u64) -> IntentRecord {
    if attempt > 0 {
        record.attempt = attempt;
        record.idempotency_key =
            attempt_idempotency_key(&record.semantic_key, record.attempt_epoch, attempt);
        if let Some(recorded) = record.timeline.last_mut() {
            recorded.note = Some(format!(
                "attempt {attempt}: the result of the previous identical call was delivered"
            ));
            recorded.at_ms = now_ms;
        }
    }
    record
}

/// A caller's explicitly keyed proposal: the record its key names decides it, within the key's
/// retention; a key that names another call is a conflict; a forgotten key names nothing.
fn plan_keyed(
    p: &Proposal,
    found: Found<'_>,
    now_ms: u64,
    incarnation: u64,
    retention_ms: u64,
) -> Result<Planned, JournalError> {
    let Some(existing) = found
        .by_client_key
        .filter(|r| key_alive(r, retention_ms, now_ms))
    else {
        return Ok(Planned::Fresh { attempt: 0 });
    };
    if existing.tool != p.tool || existing.canonical_args != p.canonical_args {
        return Ok(Planned::Decided(ProposePlan {
            decision: ProposeDecision::KeyConflict(existing.clone()),
            write: None,
        }));
    }
    Ok(match decide_found(existing, p, now_ms, incarnation)? {
        Some(plan) => Planned::Decided(plan),
        None => Planned::Fresh { attempt: 0 },
    })
}

/// Decides a proposal against the mutating record that holds its identity (by key or by
/// semantic key): an answer, a re-recording after a definite failure, or `None` when the record
/// does not stand in the way (a rejected one).
fn decide_found(
    existing: &IntentRecord,
    p: &Proposal,
    now_ms: u64,
    incarnation: u64,
) -> Result<Option<ProposePlan>, JournalError> {
    let mut updated = existing.clone();
    let pushed = push_call_id(&mut updated, &p.call_id);
    let write = pushed.then(|| Write::Update(updated.clone()));
    if let Some(decision) = decide_existing(&updated, p) {
        return Ok(Some(ProposePlan { decision, write }));
    }
    if updated.state == IntentState::Failed {
        machine::check(IntentState::Failed, IntentState::Recorded)?;
        updated.state = IntentState::Recorded;
        updated.fence += 1;
        updated.owner = incarnation;
        updated.receipt = None;
        updated.delivered = false;
        updated.timeline.push(TimelineEntry {
            state: IntentState::Recorded,
            at_ms: now_ms,
            note: Some("re-proposed after a definite failure".into()),
        });
        return Ok(Some(ProposePlan {
            decision: ProposeDecision::Recorded(updated.clone()),
            write: Some(Write::Update(updated)),
        }));
    }
    Ok(None)
}

/// The decision the records found make about a proposal, or [`Planned::Fresh`] when they leave
/// it to a new record (the next attempt, when the identical call before it was delivered). A
/// plan from here never inserts: it answers, or updates the record found. In order: the record
/// the host's intent id names, the caller's explicit key, the record holding the semantic key
/// (and the same intent under another canonicalizer version), a rejected record under the id.
pub(crate) fn plan_existing(
    p: &Proposal,
    found: Found<'_>,
    now_ms: u64,
    incarnation: u64,
) -> Result<Planned, JournalError> {
    validate_proposal(p)?;
    if let Some(bound) = found.by_id
        && let Some(conflict) = conflict_with_bound_id(bound, p)
    {
        return answered(conflict);
    }
    if p.mutating
        && let Some(ck) = &p.client_key
        && found.by_id.is_none()
    {
        return plan_keyed(p, found, now_ms, incarnation, ck.retention_ms);
    }
    if p.mutating
        && let Some(planned) = plan_unkeyed_write(p, found, now_ms, incarnation)?
    {
        return Ok(planned);
    }
    if let Some(bound) = found.by_id {
        // The host's id names a record that was rejected (cancelled); ids are never reused.
        return answered(ProposeDecision::Conflict {
            reason: format!(
                "intent id {} ended {}; propose the intent again under a new id",
                bound.id, bound.state
            ),
            existing: Some(bound.clone()),
        });
    }
    Ok(Planned::Fresh { attempt: 0 })
}

/// A plan that answers the proposal and writes nothing.
fn answered(decision: ProposeDecision) -> Result<Planned, JournalError> {
    Ok(Planned::Decided(ProposePlan {
        decision,
        write: None,
    }))
}

/// The conflict a proposal makes with the record its host-supplied intent id names: another
/// intent under that id, or a read (reads are never bound to an id that is already recorded).
fn conflict_with_bound_id(bound: &IntentRecord, p: &Proposal) -> Option<ProposeDecision> {
    if bound.semantic_key != p.semantic_key {
        return Some(ProposeDecision::Conflict {
            reason: describe_difference(bound, p),
            existing: Some(bound.clone()),
        });
    }
    if !p.mutating || !bound.mutating {
        return Some(ProposeDecision::Conflict {
            reason: format!(
                "intent id {} is already recorded; a read is proposed under a new id",
                bound.id
            ),
            existing: Some(bound.clone()),
        });
    }
    None
}

/// A mutating proposal without an explicit key, against the record holding its semantic key:
/// a delivered result makes it the next attempt, anything else live decides it; the same intent
/// live under another canonicalizer version is a conflict. `None` leaves it undecided here.
fn plan_unkeyed_write(
    p: &Proposal,
    found: Found<'_>,
    now_ms: u64,
    incarnation: u64,
) -> Result<Option<Planned>, JournalError> {
    if let Some(existing) = found.by_key {
        if existing.state == IntentState::Acked
            && existing.delivered
            && existing.client_key.is_none()
            && existing.semantic_key.version == p.semantic_key.version
        {
            // The caller received the result and asks again: a genuine repeat.
            return Ok(Some(Planned::Fresh {
                attempt: existing.attempt.saturating_add(1),
            }));
        }
        if let Some(plan) = decide_found(existing, p, now_ms, incarnation)? {
            return Ok(Some(Planned::Decided(plan)));
        }
        // A rejected record does not stand in the way: a new record replaces it, unless the
        // same intent is live under another canonicalizer version.
    }
    if let Some(other) = found.by_content
        && other.semantic_key.version != p.semantic_key.version
        && !matches!(
            other.state,
            IntentState::RejectedConflict | IntentState::RejectedDuplicate
        )
    {
        return answered(ProposeDecision::Conflict {
            reason: format!(
                "the same intent is recorded under canonicalizer version {}; this proposal \
                 uses version {}, and keys of different versions are never merged",
                other.semantic_key.version, p.semantic_key.version
            ),
            existing: Some(other.clone()),
        })
        .map(Some);
    }
    Ok(None)
}

/// The record a proposal creates when nothing recorded decides it: RECORDED under `id` (the
/// host's intent id, or a new one), stamped `now_ms` and owned by `incarnation`.
pub(crate) fn new_record(
    p: &Proposal,
    id: IntentId,
    now_ms: u64,
    incarnation: u64,
) -> IntentRecord {
    IntentRecord {
        id,
        idempotency_key: p.semantic_key.idempotency_key(p.attempt_epoch),
        semantic_key: p.semantic_key,
        scope: p.scope.clone(),
        attempt_epoch: p.attempt_epoch,
        tool: p.tool.clone(),
        canonical_args: p.canonical_args.clone(),
        call_ids: vec![p.call_id.clone()],
        mutating: p.mutating,
        fence: 1,
        attempts: 0,
        state: IntentState::Recorded,
        timeline: vec![
            TimelineEntry {
                state: IntentState::Proposed,
                at_ms: now_ms,
                note: None,
            },
            TimelineEntry {
                state: IntentState::Recorded,
                at_ms: now_ms,
                note: None,
            },
        ],
        receipt: None,
        snapshot: None,
        owner: incarnation,
        attempt: 0,
        delivered: false,
        client_key: p.client_key.as_ref().map(|ck| ClientKey {
            principal: ck.principal.clone(),
            key: ck.key.clone(),
            retention_ms: 0,
        }),
        principal: p.principal.clone(),
    }
}

/// The incarnation a journal opened over these records takes: one past every owner in the log.
/// A record stamped with it can only have been moved by this incarnation.
pub(crate) fn next_incarnation<'a>(records: impl Iterator<Item = &'a IntentRecord>) -> u64 {
    records.map(|r| r.owner).max().unwrap_or(0) + 1
}

/// Applies a compare-and-set transition to a record, returning the changed record.
pub(crate) fn plan_transition(
    record: &IntentRecord,
    t: &Transition,
    now_ms: u64,
    incarnation: u64,
) -> Result<IntentRecord, JournalError> {
    if record.fence != t.expected_fence {
        return Err(JournalError::StaleFence {
            id: t.id,
            expected: t.expected_fence,
            actual: record.fence,
        });
    }
    machine::check(record.state, t.to)?;
    if t.to == IntentState::Dispatched && record.attempts >= ATTEMPTS_MAX {
        return Err(JournalError::AttemptsExhausted {
            id: record.id,
            attempts: record.attempts,
        });
    }
    if let Some(snapshot) = &t.snapshot {
        let bytes = serde_json::to_string(snapshot).map_or(usize::MAX, |s| s.len());
        if bytes > SNAPSHOT_BYTES_MAX {
            return Err(JournalError::TooLarge {
                what: "pre-dispatch snapshot",
                bytes,
                max: SNAPSHOT_BYTES_MAX,
            });
        }
    }
    if let Some(receipt) = &t.receipt {
        let bytes = serde_json::to_string(receipt).map_or(usize::MAX, |s| s.len());
        if bytes > RECEIPT_BYTES_MAX {
            return Err(JournalError::TooLarge {
                what: "receipt",
                bytes,
                max: RECEIPT_BYTES_MAX,
            });
        }
    }
    let mut next = record.clone();
    next.state = t.to;
    next.fence += 1;
    next.owner = incarnation;
    if t.to == IntentState::Dispatched {
        next.attempts += 1;
    }
    if t.to == IntentState::Recorded {
        // Open again: whatever receipt an earlier attempt left no longer describes the record.
        next.receipt = None;
    }
    if t.receipt.is_some() {
        next.receipt = t.receipt.clone();
    }
    if t.snapshot.is_some() {
        next.snapshot = t.snapshot.clone();
    }
    next.timeline.push(TimelineEntry {
        state: t.to,
        at_ms: now_ms,
        note: bound_note(t.note.clone()),
    });
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_notes_are_cut_with_a_marker_on_a_char_boundary() {
        let note = "é".repeat(NOTE_BYTES_MAX);
        let cut = bound_note(Some(note.clone())).unwrap();
        assert!(cut.len() < note.len());
        assert!(cut.ends_with(&format!("[{} bytes cut]", note.len() - NOTE_BYTES_MAX)));
    }

    #[test]
    fn content_digest_separates_every_field() {
        let base = content_digest("t", "s", 0, "{}");
        assert_ne!(base, content_digest("u", "s", 0, "{}"));
        assert_ne!(base, content_digest("t", "r", 0, "{}"));
        assert_ne!(base, content_digest("t", "s", 1, "{}"));
        assert_ne!(base, content_digest("t", "s", 0, "[]"));
        // The separator keeps "ab"+"c" apart from "a"+"bc".
        assert_ne!(
            content_digest("ab", "c", 0, ""),
            content_digest("a", "bc", 0, "")
        );
    }
}
