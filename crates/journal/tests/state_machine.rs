//! Property tests of the transition rules: random sequences of proposals and transitions
//! (legal, illegal and stale) against a reference model written from the rules, not the code.

mod common;

use common::proposal;
use futures::executor::block_on;
use proptest::prelude::*;
use ring0_core::{IntentState, SemanticKey};
use ring0_journal::limits::ATTEMPTS_MAX;
use ring0_journal::{
    IntentId, IntentRecord, Journal, JournalError, ManualClock, MemoryJournal, ProposeDecision,
    Transition, is_allowed,
};
use serde_json::json;
use std::collections::HashMap;
use std::sync::Arc;

/// Cases of the main state-machine property.
const CASES: u32 = 10_000;

#[derive(Debug, Clone)]
enum Op {
    Propose {
        intent: u8,
        version: u32,
        host: Option<u8>,
        mutating: bool,
    },
    Transition {
        pick: usize,
        to: IntentState,
        stale: bool,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (
            0u8..3,
            prop_oneof![4 => Just(1u32), 1 => Just(2u32)],
            proptest::option::weighted(0.3, 0u8..3),
            prop_oneof![5 => Just(true), 1 => Just(false)]
        )
            .prop_map(|(intent, version, host, mutating)| Op::Propose {
                intent,
                version,
                host,
                mutating
            }),
        (
            any::<usize>(),
            proptest::sample::select(IntentState::ALL.to_vec()),
            proptest::bool::weighted(0.1)
        )
            .prop_map(|(pick, to, stale)| Op::Transition { pick, to, stale }),
    ]
}

fn host_id(n: u8) -> IntentId {
    uuid::Builder::from_random_bytes([n.wrapping_add(1); 16]).into_uuid()
}

fn make(intent: u8, version: u32, host: Option<u8>, mutating: bool) -> ring0_journal::Proposal {
    let mut p = proposal("refund", json!({"order": intent}), "scope", "call");
    p.semantic_key = SemanticKey {
        version,
        digest: p.semantic_key.digest,
    };
    p.intent_id = host.map(host_id);
    p.mutating = mutating;
    p
}

/// What the rules say a proposal must get, given the records so far.
fn expected(
    p: &ring0_journal::Proposal,
    records: &HashMap<IntentId, IntentRecord>,
    by_key: &HashMap<SemanticKey, IntentId>,
) -> &'static str {
    use IntentState::*;
    if let Some(id) = p.intent_id
        && let Some(bound) = records.get(&id)
        && (bound.semantic_key != p.semantic_key || !p.mutating || !bound.mutating)
    {
        return "conflict";
    }
    let live_other_version = records.values().any(|r| {
        r.mutating
            && r.semantic_key.digest == p.semantic_key.digest
            && r.semantic_key.version != p.semantic_key.version
            && by_key.get(&r.semantic_key) == Some(&r.id)
            && !matches!(r.state, RejectedConflict | RejectedDuplicate)
    });
    if p.mutating
        && let Some(r) = by_key.get(&p.semantic_key).and_then(|id| records.get(id))
    {
        match r.state {
            Recorded | Dispatched | Unknown | Reconciling | Proposed => return "duplicate",
            Acked => return "replay",
            Failed if r.attempts >= ATTEMPTS_MAX => return "conflict",
            Failed => return "recorded",
            Compensated | DeadLetter => return "conflict",
            RejectedConflict | RejectedDuplicate => {}
        }
    }
    if p.mutating && live_other_version {
        return "conflict";
    }
    if p.intent_id.is_some_and(|id| records.contains_key(&id)) {
        return "conflict";
    }
    "recorded"
}

fn check_record(r: &IntentRecord) -> Result<(), TestCaseError> {
    prop_assert_eq!(r.timeline.last().map(|e| e.state), Some(r.state));
    prop_assert_eq!(&r.timeline[0].state, &IntentState::Proposed);
    for pair in r.timeline.windows(2) {
        prop_assert!(
            is_allowed(pair[0].state, pair[1].state),
            "timeline has illegal {} → {}",
            pair[0].state,
            pair[1].state
        );
    }
    let dispatches = r
        .timeline
        .iter()
        .filter(|e| e.state == IntentState::Dispatched)
        .count();
    prop_assert_eq!(dispatches, r.attempts as usize);
    prop_assert!(r.attempts <= ATTEMPTS_MAX);
    Ok(())
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let journal = MemoryJournal::with_clock(Arc::new(ManualClock::new(1)));
    let mut records: HashMap<IntentId, IntentRecord> = HashMap::new();
    let mut by_key: HashMap<SemanticKey, IntentId> = HashMap::new();
    let mut order: Vec<IntentId> = Vec::new();
    for op in ops {
        match op {
            Op::Propose {
                intent,
                version,
                host,
                mutating,
            } => {
                let p = make(intent, version, host, mutating);
                let want = expected(&p, &records, &by_key);
                let got = block_on(journal.propose(p.clone())).unwrap();
                prop_assert_eq!(got.kind(), want, "proposal {:?}", p);
                if let ProposeDecision::Recorded(r) = &got {
                    if !records.contains_key(&r.id) {
                        order.push(r.id);
                    }
                    if r.mutating {
                        by_key.insert(r.semantic_key, r.id);
                    }
                }
                if let Some(r) = got.record() {
                    records.insert(r.id, block_on(journal.get(r.id)).unwrap().unwrap());
                }
            }
            Op::Transition { pick, to, stale } => {
                if order.is_empty() {
                    continue;
                }
                let before = records[&order[pick % order.len()]].clone();
                let mut t = Transition::to(&before, to);
                if stale {
                    t.expected_fence = before.fence.saturating_sub(1);
                }
                let result = block_on(journal.transition(t));
                let legal = is_allowed(before.state, to);
                let budget = !(to == IntentState::Dispatched && before.attempts >= ATTEMPTS_MAX);
                match result {
                    Ok(after) => {
                        prop_assert!(!stale, "a stale fence was accepted");
                        prop_assert!(legal, "illegal {} → {} accepted", before.state, to);
                        prop_assert!(budget, "a dispatch beyond the attempt budget");
                        prop_assert_eq!(after.state, to);
                        prop_assert_eq!(after.fence, before.fence + 1);
                        // Never a fresh dispatch straight out of UNKNOWN (P2).
                        prop_assert!(
                            !(before.state == IntentState::Unknown
                                && to == IntentState::Dispatched)
                        );
                        records.insert(after.id, after);
                    }
                    Err(e) => {
                        match e {
                            JournalError::StaleFence { .. } => prop_assert!(stale),
                            JournalError::Transition(_) => prop_assert!(!legal && !stale),
                            JournalError::AttemptsExhausted { .. } => {
                                prop_assert!(!budget && legal && !stale)
                            }
                            other => prop_assert!(false, "unexpected error {other}"),
                        }
                        let now = block_on(journal.get(before.id)).unwrap().unwrap();
                        prop_assert_eq!(&now, &before, "a refused transition changed the record");
                    }
                }
            }
        }
        for r in records.values() {
            check_record(r)?;
        }
    }
    // At most one record per semantic key is live (not rejected) at any time.
    let mut live: HashMap<SemanticKey, usize> = HashMap::new();
    for r in records.values().filter(|r| r.mutating) {
        if !matches!(
            r.state,
            IntentState::RejectedConflict | IntentState::RejectedDuplicate
        ) {
            *live.entry(r.semantic_key).or_default() += 1;
        }
    }
    prop_assert!(
        live.values().all(|&n| n <= 1),
        "two live records for one key: {:?}",
        live
    );
    // Rebuilt from the log alone, the journal holds the same records.
    let rebuilt = MemoryJournal::from_records(journal.records(), Arc::new(ManualClock::new(1)));
    prop_assert_eq!(rebuilt.records(), journal.records());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: CASES, ..ProptestConfig::default() })]

    #[test]
    fn transitions_follow_the_rules_and_proposals_get_the_decisions_the_rules_name(
        ops in proptest::collection::vec(op(), 1..40)
    ) {
        run(ops)?;
    }
}

/// Cases replayed on SQLite as well: each case opens a real database.
const SQLITE_CASES: u32 = 128;

proptest! {
    #![proptest_config(ProptestConfig { cases: SQLITE_CASES, ..ProptestConfig::default() })]

    /// The memory backend's answers are the reference. `None` among the operations closes the
    /// SQLite journal and opens it again: a clean close folds the in-memory part of its key
    /// index into the tables, so a sequence's lookups go to entries decided in the same batch,
    /// to the in-memory index and to the tables, and every one must answer alike.
    #[test]
    fn the_sqlite_backend_answers_every_sequence_like_the_memory_backend(
        ops in proptest::collection::vec(
            prop_oneof![9 => op().prop_map(Some), 1 => Just(None)],
            1..40,
        )
    ) {
        let dir = tempfile::tempdir().unwrap();
        let clock_m = Arc::new(ManualClock::new(1));
        let clock_s = Arc::new(ManualClock::new(1));
        let memory = MemoryJournal::with_clock(clock_m);
        let open = || {
            ring0_journal::SqliteJournal::open_with(
                dir.path().join("j.db"),
                common::options(&clock_s),
            )
            .unwrap()
        };
        let mut sqlite = open();
        let mut ids: Vec<IntentId> = Vec::new();
        for op in ops {
            let Some(op) = op else {
                drop(sqlite);
                sqlite = open();
                prop_assert_eq!(sqlite.pending_index_entries(), 0, "a clean close folds everything");
                continue;
            };
            match op {
                Op::Propose { intent, version, host, mutating } => {
                    let p = make(intent, version, host, mutating);
                    let a = block_on(memory.propose(p.clone())).unwrap();
                    let b = block_on(sqlite.propose(p)).unwrap();
                    prop_assert_eq!(ownerless_decision(a.clone()), ownerless_decision(b));
                    if let ProposeDecision::Recorded(r) = &a && !ids.contains(&r.id) {
                        ids.push(r.id);
                    }
                }
                Op::Transition { pick, to, stale } => {
                    if ids.is_empty() {
                        continue;
                    }
                    let r = block_on(memory.get(ids[pick % ids.len()])).unwrap().unwrap();
                    let mut t = Transition::to(&r, to);
                    if stale {
                        t.expected_fence = r.fence.saturating_sub(1);
                    }
                    let a = block_on(memory.transition(t.clone()));
                    let b = block_on(sqlite.transition(t));
                    prop_assert_eq!(a.map(ownerless), b.map(ownerless));
                }
            }
        }
        let mut a = block_on(memory.recent(10_000)).unwrap();
        let mut b = block_on(sqlite.recent(10_000)).unwrap();
        a.sort_by_key(|r| r.id);
        b.sort_by_key(|r| r.id);
        prop_assert_eq!(
            a.into_iter().map(ownerless).collect::<Vec<_>>(),
            b.into_iter().map(ownerless).collect::<Vec<_>>()
        );
    }
}

/// A record without the incarnation that wrote it, which a reopened SQLite journal counts up
/// and the memory journal never does.
fn ownerless(mut r: IntentRecord) -> IntentRecord {
    r.owner = 0;
    r
}

fn ownerless_decision(d: ProposeDecision) -> ProposeDecision {
    match d {
        ProposeDecision::Recorded(r) => ProposeDecision::Recorded(ownerless(r)),
        ProposeDecision::Duplicate(r) => ProposeDecision::Duplicate(ownerless(r)),
        ProposeDecision::Replay(r) => ProposeDecision::Replay(ownerless(r)),
        ProposeDecision::KeyConflict(r) => ProposeDecision::KeyConflict(ownerless(r)),
        ProposeDecision::Conflict { reason, existing } => ProposeDecision::Conflict {
            reason,
            existing: existing.map(ownerless),
        },
    }
}

/// Cases replayed on PostgreSQL: each case opens a journal in a schema of its own.
const POSTGRES_CASES: u32 = 48;

proptest! {
    #![proptest_config(ProptestConfig { cases: POSTGRES_CASES, ..ProptestConfig::default() })]

    /// The memory backend's answers are the reference for PostgreSQL too. `None` among the
    /// operations closes the replica and opens another on the same database: its decisions come
    /// from the rows alone.
    #[test]
    fn the_postgres_backend_answers_every_sequence_like_the_memory_backend(
        ops in proptest::collection::vec(
            prop_oneof![9 => op().prop_map(Some), 1 => Just(None)],
            1..40,
        )
    ) {
        let Some(url) = common::fresh_postgres_schema() else {
            return Ok(());
        };
        let clock_m = Arc::new(ManualClock::new(1));
        let clock_p = Arc::new(ManualClock::new(1));
        let memory = MemoryJournal::with_clock(clock_m);
        let open = || {
            ring0_journal::PostgresJournal::open(&url, common::postgres_options(&clock_p)).unwrap()
        };
        let mut postgres = open();
        let mut ids: Vec<IntentId> = Vec::new();
        for op in ops {
            let Some(op) = op else {
                drop(postgres);
                postgres = open();
                continue;
            };
            match op {
                Op::Propose { intent, version, host, mutating } => {
                    let p = make(intent, version, host, mutating);
                    let a = block_on(memory.propose(p.clone())).unwrap();
                    let b = block_on(postgres.propose(p)).unwrap();
                    prop_assert_eq!(ownerless_decision(a.clone()), ownerless_decision(b));
                    if let ProposeDecision::Recorded(r) = &a && !ids.contains(&r.id) {
                        ids.push(r.id);
                    }
                }
                Op::Transition { pick, to, stale } => {
                    if ids.is_empty() {
                        continue;
                    }
                    let r = block_on(memory.get(ids[pick % ids.len()])).unwrap().unwrap();
                    let mut t = Transition::to(&r, to);
                    if stale {
                        t.expected_fence = r.fence.saturating_sub(1);
                    }
                    let a = block_on(memory.transition(t.clone()));
                    let b = block_on(postgres.transition(t));
                    prop_assert_eq!(a.map(ownerless), b.map(ownerless));
                }
            }
        }
        let mut a = block_on(memory.recent(10_000)).unwrap();
        let mut b = block_on(postgres.recent(10_000)).unwrap();
        a.sort_by_key(|r| r.id);
        b.sort_by_key(|r| r.id);
        prop_assert_eq!(
            a.into_iter().map(ownerless).collect::<Vec<_>>(),
            b.into_iter().map(ownerless).collect::<Vec<_>>()
        );
    }
}
