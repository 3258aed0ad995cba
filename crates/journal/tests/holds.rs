//! Held calls (`ring0_journal::hold`): recorded, decided once, expired at their deadline, and
//! kept across a reopen of the durable journal — on both backends that keep them.

mod common;

use common::options;
use futures::executor::block_on;
use ring0_journal::{
    HeldCall, HoldDecided, HoldState, Journal, ManualClock, MemoryJournal, SqliteJournal,
};
use std::sync::Arc;

const NOW_MS: u64 = 1_000_000;

fn held(id: &str, deadline_ms: u64) -> HeldCall {
    HeldCall {
        approval_id: id.into(),
        tool: "pay__refund".into(),
        scope: "s".into(),
        call_id: "c1".into(),
        principal: "alice".into(),
        args_hash: "h".into(),
        summary: "refund 20".into(),
        arguments: Some(serde_json::json!({"amount": 20})),
        remember: None,
        channels: vec!["client".into(), "webhook".into()],
        created_ms: NOW_MS,
        deadline_ms,
        incarnation: 1,
        state: HoldState::Pending,
        decided_ms: None,
    }
}

fn approved() -> HoldState {
    HoldState::Approved {
        by: "webhook".into(),
        for_session: false,
    }
}

fn denied() -> HoldState {
    HoldState::Denied {
        by: "terminal".into(),
        reason: "no".into(),
    }
}

/// The first decision stands; a second one finds it decided and changes nothing.
fn decided_once(j: &dyn Journal) {
    assert!(block_on(j.hold_put(&held("ap_01", NOW_MS + 60_000))).unwrap());
    assert_eq!(block_on(j.holds_pending()).unwrap().len(), 1);
    match block_on(j.hold_decide("ap_01", approved())).unwrap() {
        HoldDecided::Decided(h) => assert_eq!(h.state, approved()),
        other => panic!("expected Decided, got {other:?}"),
    }
    match block_on(j.hold_decide("ap_01", denied())).unwrap() {
        HoldDecided::AlreadyDecided(h) => assert_eq!(h.state, approved(), "the first stands"),
        other => panic!("expected AlreadyDecided, got {other:?}"),
    }
    assert!(block_on(j.holds_pending()).unwrap().is_empty());
    assert_eq!(
        block_on(j.hold_decide("ap_nope", approved())).unwrap(),
        HoldDecided::NotFound
    );
}

/// A decision after the deadline does not decide: the held call is EXPIRED.
fn lapsed_at_deadline(j: &dyn Journal) {
    block_on(j.hold_put(&held("ap_02", NOW_MS))).unwrap();
    match block_on(j.hold_decide("ap_02", approved())).unwrap() {
        HoldDecided::Lapsed(h) => assert_eq!(h.state.as_str(), "EXPIRED"),
        other => panic!("expected Lapsed, got {other:?}"),
    }
    let stored = block_on(j.hold_get("ap_02")).unwrap().unwrap();
    assert_eq!(stored.state.as_str(), "EXPIRED");
}

#[test]
fn a_held_call_is_decided_once_in_memory() {
    let j = MemoryJournal::with_clock(Arc::new(ManualClock::new(NOW_MS)));
    decided_once(&j);
    lapsed_at_deadline(&j);
}

#[test]
fn a_held_call_is_decided_once_in_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(NOW_MS));
    let j = SqliteJournal::open_with(dir.path().join("j.db"), options(&clock)).unwrap();
    decided_once(&j);
    lapsed_at_deadline(&j);
}

#[test]
fn a_pending_held_call_survives_a_reopen_and_is_decided_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("j.db");
    let clock = Arc::new(ManualClock::new(NOW_MS));
    {
        let j = SqliteJournal::open_with(&path, options(&clock)).unwrap();
        block_on(j.hold_put(&held("ap_03", NOW_MS + 60_000))).unwrap();
    }
    let j = SqliteJournal::open_with(&path, options(&clock)).unwrap();
    let pending = block_on(j.holds_pending()).unwrap();
    assert_eq!(pending, vec![held("ap_03", NOW_MS + 60_000)]);
    assert!(matches!(
        block_on(j.hold_decide("ap_03", denied())).unwrap(),
        HoldDecided::Decided(_)
    ));
}
