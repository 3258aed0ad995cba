//! What the durable backend promises beyond the shared protocol: durability, one writer, honest
//! failure on corruption and on a full disk, spilled arguments, group commit under concurrency.

mod common;

use common::{options, proposal, refund};
use futures::executor::block_on;
use ring0_core::{Fingerprint, IntentState, Observation};
use ring0_journal::{
    Journal, JournalError, JournalReader, ManualClock, ProposeDecision, SqliteJournal,
    SqliteOptions, Transition, inspect, limits::ARGS_INLINE_BYTES_MAX,
};
use serde_json::json;
use std::sync::Arc;

fn clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::new(1_000_000))
}

fn recorded(d: ProposeDecision) -> ring0_journal::IntentRecord {
    match d {
        ProposeDecision::Recorded(r) => r,
        other => panic!("expected Recorded, got {other:?}"),
    }
}

#[test]
fn records_survive_closing_and_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("j.db");
    let c = clock();
    let id = {
        let j = SqliteJournal::open_with(&path, options(&c)).unwrap();
        let r = recorded(block_on(j.propose(refund(20, "t1"))).unwrap());
        block_on(j.transition(Transition::to(&r, IntentState::Dispatched))).unwrap();
        r.id
    };
    let j = SqliteJournal::open_with(&path, options(&c)).unwrap();
    let r = block_on(j.get(id)).unwrap().unwrap();
    assert_eq!(
        (r.state, r.fence, r.attempts),
        (IntentState::Dispatched, 2, 1)
    );
    assert_eq!(block_on(j.open_records()).unwrap().len(), 1);
}

#[test]
fn records_are_counted_by_state() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("j.db");
    let c = clock();
    let j = SqliteJournal::open_with(&path, options(&c)).unwrap();
    assert_eq!(block_on(j.count_by_state()).unwrap(), Some(vec![]));
    let a = recorded(block_on(j.propose(refund(20, "t1"))).unwrap());
    recorded(block_on(j.propose(refund(30, "t2"))).unwrap());
    block_on(j.transition(Transition::to(&a, IntentState::Dispatched))).unwrap();
    let mut counts = block_on(j.count_by_state()).unwrap().unwrap();
    counts.sort_by_key(|(s, _)| s.as_str());
    assert_eq!(
        counts,
        vec![(IntentState::Dispatched, 1), (IntentState::Recorded, 1)]
    );
}

#[test]
fn a_second_writer_gets_a_clear_lock_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("j.db");
    let _first = SqliteJournal::open(&path).unwrap();
    let Err(err) = SqliteJournal::open(&path) else {
        panic!("a second writer must be refused")
    };
    assert!(matches!(err, JournalError::Locked { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("open for writing by another process"),
        "{text}"
    );
    assert!(
        text.contains(&format!("pid {}", std::process::id())),
        "{text}"
    );
}

#[test]
fn the_lock_is_released_when_the_journal_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("j.db");
    drop(SqliteJournal::open(&path).unwrap());
    SqliteJournal::open(&path).unwrap();
}

#[test]
fn a_corrupt_file_is_reported_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("j.db");
    let garbage = b"this is not a database, but it is someone's data".repeat(100);
    std::fs::write(&path, &garbage).unwrap();
    let Err(err) = SqliteJournal::open(&path) else {
        panic!("a corrupt journal must not open")
    };
    assert!(matches!(err, JournalError::Corrupt { .. }), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), garbage);
}

#[test]
fn another_applications_database_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("j.db");
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch("CREATE TABLE customers (id INTEGER)")
        .unwrap();
    drop(conn);
    let Err(err) = SqliteJournal::open(&path) else {
        panic!("a foreign database must not open")
    };
    assert!(err.to_string().contains("not a ring0 journal"), "{err}");
}

#[test]
fn a_journal_from_a_newer_build_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("j.db");
    drop(SqliteJournal::open(&path).unwrap());
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch("PRAGMA user_version = 99").unwrap();
    drop(conn);
    let Err(err) = SqliteJournal::open(&path) else {
        panic!("a newer schema must not open")
    };
    assert!(
        matches!(err, JournalError::SchemaTooNew { found: 99, .. }),
        "{err}"
    );
}

#[test]
fn a_full_journal_fails_proposals_closed_and_keeps_what_it_has() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("j.db");
    let opts = SqliteOptions {
        max_size_bytes: Some(64 * 1024),
        ..SqliteOptions::default()
    };
    let j = SqliteJournal::open_with(&path, opts).unwrap();
    let mut kept = Vec::new();
    let err = loop {
        let p = proposal(
            "t",
            json!({"pad": "x".repeat(2000), "n": kept.len()}),
            "s",
            "c",
        );
        match block_on(j.propose(p)) {
            Ok(d) => kept.push(recorded(d).id),
            Err(e) => break e,
        }
        assert!(kept.len() < 1000, "the quota was never reached");
    };
    assert!(matches!(err, JournalError::Full(_)), "{err}");
    assert!(!kept.is_empty());
    for id in &kept {
        assert!(block_on(j.get(*id)).unwrap().is_some());
    }
    assert_eq!(block_on(j.recent(10_000)).unwrap().len(), kept.len());
}

#[test]
fn large_arguments_are_spilled_by_digest_and_read_back_whole() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("j.db");
    let j = SqliteJournal::open(&path).unwrap();
    let p = proposal(
        "t",
        json!({"blob": "y".repeat(ARGS_INLINE_BYTES_MAX * 3)}),
        "s",
        "c",
    );
    let r = recorded(block_on(j.propose(p.clone())).unwrap());
    let spilled = dir.path().join("j.db.spill").join(r.args_sha256());
    assert_eq!(std::fs::read_to_string(&spilled).unwrap(), p.canonical_args);
    let back = block_on(j.get(r.id)).unwrap().unwrap();
    assert_eq!(back.canonical_args, p.canonical_args);
}

#[test]
fn a_tampered_spill_file_is_reported_as_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("j.db");
    let j = SqliteJournal::open(&path).unwrap();
    let p = proposal(
        "t",
        json!({"blob": "y".repeat(ARGS_INLINE_BYTES_MAX * 3)}),
        "s",
        "c",
    );
    let r = recorded(block_on(j.propose(p)).unwrap());
    let spilled = dir.path().join("j.db.spill").join(r.args_sha256());
    std::fs::write(&spilled, "{}").unwrap();
    let err = block_on(j.get(r.id)).unwrap_err();
    assert!(matches!(err, JournalError::Corrupt { .. }), "{err}");
}

#[test]
fn concurrent_proposers_of_one_intent_record_it_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let j = Arc::new(SqliteJournal::open(dir.path().join("j.db")).unwrap());
    let threads: Vec<_> = (0..32)
        .map(|i| {
            let j = j.clone();
            std::thread::spawn(move || block_on(j.propose(refund(20, &format!("c{i}")))).unwrap())
        })
        .collect();
    let decisions: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let recorded = decisions.iter().filter(|d| d.kind() == "recorded").count();
    let duplicates = decisions.iter().filter(|d| d.kind() == "duplicate").count();
    assert_eq!((recorded, duplicates), (1, 31));
    let r = block_on(j.find_by_key(&refund(20, "x").semantic_key))
        .unwrap()
        .unwrap();
    assert_eq!(r.call_ids.len(), 32);
}

#[test]
fn a_reader_inspects_while_a_writer_holds_the_lock() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("j.db");
    let j = SqliteJournal::open(&path).unwrap();
    let r = recorded(block_on(j.propose(refund(20, "t1"))).unwrap());
    let reader = JournalReader::open(&path).unwrap();
    let listed = reader.recent(10).unwrap();
    assert_eq!(listed.len(), 1);
    let list = inspect::render_list(&listed);
    assert!(
        list.contains(&r.id.to_string()) && list.contains("RECORDED"),
        "{list}"
    );
    let prefix = &r.id.to_string()[..13];
    let found = reader.find(prefix).unwrap().unwrap();
    let shown = inspect::render_show(&found);
    assert!(
        shown.contains("PROPOSED") && shown.contains(&r.idempotency_key),
        "{shown}"
    );
}

#[test]
fn the_reader_refuses_a_missing_journal_instead_of_creating_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent.db");
    assert!(JournalReader::open(&path).is_err());
    assert!(!path.exists());
}

#[test]
fn memoized_observations_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("j.db");
    let c = clock();
    let fp = Fingerprint::compute("stat", &json!({"path": "a"})).unwrap();
    let obs = Observation::text("12 bytes");
    {
        let j = SqliteJournal::open_with(&path, options(&c)).unwrap();
        assert!(block_on(j.memo_put(&fp, &obs)).unwrap());
    }
    let j = SqliteJournal::open_with(&path, options(&c)).unwrap();
    assert_eq!(block_on(j.memo_get(&fp, 60_000)).unwrap(), Some(obs));
}

/// A record driven to ACKED.
fn acked(j: &SqliteJournal, r: &ring0_journal::IntentRecord) -> ring0_journal::IntentRecord {
    let d = block_on(j.transition(Transition::to(r, IntentState::Dispatched))).unwrap();
    block_on(j.transition(Transition::to(&d, IntentState::Acked))).unwrap()
}

#[test]
fn a_delivered_intent_proposed_again_is_its_next_attempt_and_survives_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("j.db");
    let c = clock();
    let (first, second) = {
        let j = SqliteJournal::open_with(&path, options(&c)).unwrap();
        let first = recorded(block_on(j.propose(refund(20, "t1"))).unwrap());
        acked(&j, &first);
        // Not delivered: the same intent answers.
        let replay = block_on(j.propose(refund(20, "t2"))).unwrap();
        assert_eq!(replay.kind(), "replay");
        j.mark_delivered(first.id);
        let second = recorded(block_on(j.propose(refund(20, "t3"))).unwrap());
        (first, second)
    };
    assert_eq!(
        (second.attempt, second.semantic_key),
        (1, first.semantic_key)
    );
    assert_ne!(second.idempotency_key, first.idempotency_key);
    let j = SqliteJournal::open_with(&path, options(&c)).unwrap();
    assert!(block_on(j.get(first.id)).unwrap().unwrap().delivered);
    let again = block_on(j.propose(refund(20, "t4"))).unwrap();
    assert_eq!(
        (again.kind(), again.record().unwrap().id),
        ("duplicate", second.id),
        "the key now names the newest attempt"
    );
}

#[test]
fn a_client_key_names_its_call_across_scopes_and_refuses_other_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("j.db");
    let c = clock();
    let key = ring0_journal::ClientKey {
        principal: "alice".into(),
        key: "k-1".into(),
        retention_ms: 60_000,
    };
    let keyed = |amount, scope: &str| {
        let mut p = proposal("refund", json!({"amount": amount}), scope, "c");
        p.client_key = Some(key.clone());
        p
    };
    let first = {
        let j = SqliteJournal::open_with(&path, options(&c)).unwrap();
        recorded(block_on(j.propose(keyed(20, "s1"))).unwrap())
    };
    let j = SqliteJournal::open_with(&path, options(&c)).unwrap();
    let retry = block_on(j.propose(keyed(20, "s2"))).unwrap();
    assert_eq!(
        (retry.kind(), retry.record().unwrap().id),
        ("duplicate", first.id)
    );
    let other = block_on(j.propose(keyed(21, "s1"))).unwrap();
    assert_eq!(
        (other.kind(), other.record().unwrap().id),
        ("key_conflict", first.id)
    );
    c.advance_ms(60_000);
    let expired = block_on(j.propose(keyed(21, "s1"))).unwrap();
    assert_eq!(expired.kind(), "recorded", "a forgotten key names nothing");
}
