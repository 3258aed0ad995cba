//! Held calls (`ring0_journal::hold`): recorded, decided once, expired at their deadline, and
//! kept across a reopen of the durable journal — on every backend that keeps them; on
//! PostgreSQL (skipped without `RING0_TEST_POSTGRES_URL`) shared by replicas, which each learn
//! of a decision another made.

mod common;

use common::options;
use futures::executor::block_on;
use ring0_journal::{
    Clock, HeldCall, HoldDecided, HoldState, Journal, ManualClock, MemoryJournal, PostgresJournal,
    PostgresOptions, SqliteJournal, SystemClock,
};
use std::sync::Arc;
use std::time::Duration;

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

/// Two replicas of one PostgreSQL journal (system clock: held calls lapse by wall time).
fn postgres_replicas() -> Option<(String, PostgresJournal, PostgresJournal)> {
    let url = common::fresh_postgres_schema()?;
    let open = || {
        let options = PostgresOptions {
            pool_connections: 2,
            ..PostgresOptions::default()
        };
        PostgresJournal::open(&url, options).unwrap()
    };
    let (a, b) = (open(), open());
    Some((url, a, b))
}

fn wall_ms() -> u64 {
    SystemClock.now_ms()
}

#[test]
fn a_held_call_is_decided_once_in_postgresql() {
    let Some(url) = common::fresh_postgres_schema() else {
        return;
    };
    let clock = Arc::new(ManualClock::new(NOW_MS));
    let j = PostgresJournal::open(&url, common::postgres_options(&clock)).unwrap();
    decided_once(&j);
    lapsed_at_deadline(&j);
}

#[test]
fn a_call_held_on_one_replica_is_listed_and_decided_once_on_another() {
    let Some((_, a, b)) = postgres_replicas() else {
        return;
    };
    let deadline = wall_ms() + 600_000;
    assert!(block_on(b.hold_put(&held("ap_shared", deadline))).unwrap());
    // A repeated record of the same approval changes nothing.
    assert!(!block_on(b.hold_put(&held("ap_shared", deadline))).unwrap());
    let listed = block_on(a.holds_pending()).unwrap();
    assert_eq!(listed, vec![held("ap_shared", deadline)]);
    // Both replicas decide at once: one decision stands, the other finds it decided.
    let (first, second) = std::thread::scope(|s| {
        let by_a = s.spawn(|| block_on(a.hold_decide("ap_shared", approved())).unwrap());
        let by_b = s.spawn(|| block_on(b.hold_decide("ap_shared", denied())).unwrap());
        (by_a.join().unwrap(), by_b.join().unwrap())
    });
    let decided = [&first, &second]
        .iter()
        .filter(|d| matches!(d, HoldDecided::Decided(_)))
        .count();
    assert_eq!(decided, 1, "{first:?} / {second:?}");
    let stored = block_on(b.hold_get("ap_shared")).unwrap().unwrap();
    assert_ne!(stored.state, HoldState::Pending);
    assert!(block_on(a.holds_pending()).unwrap().is_empty());
}

#[test]
fn a_call_waiting_on_one_replica_learns_of_a_decision_made_on_another() {
    let Some((_, a, b)) = postgres_replicas() else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let deadline = wall_ms() + 600_000;
    block_on(b.hold_put(&held("ap_wait", deadline))).unwrap();
    let b = Arc::new(b);
    let waiter = {
        let b = b.clone();
        runtime.spawn(async move { b.hold_wait("ap_wait", Duration::from_secs(60)).await })
    };
    block_on(a.hold_decide("ap_wait", approved())).unwrap();
    let decided = runtime.block_on(waiter).unwrap().expect("decided");
    assert_eq!(decided.state, approved());
    // Undecided, the wait ends at its bound with nothing.
    block_on(b.hold_put(&held("ap_never", deadline))).unwrap();
    let undecided = runtime.block_on(b.hold_wait("ap_never", Duration::from_millis(300)));
    assert_eq!(undecided, None);
}

#[test]
fn every_replica_listens_for_decisions_on_a_connection_of_its_own() {
    let Some((_, a, b)) = postgres_replicas() else {
        return;
    };
    // The listener connects in the background: poll for both, with a deadline.
    let until = std::time::Instant::now() + Duration::from_secs(30);
    while !(a.listening() && b.listening()) {
        assert!(
            std::time::Instant::now() < until,
            "the listeners never listened"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_pending_held_call_survives_its_replica_and_is_decided_by_the_next() {
    let Some((url, a, b)) = postgres_replicas() else {
        return;
    };
    let deadline = wall_ms() + 600_000;
    block_on(a.hold_put(&held("ap_kept", deadline))).unwrap();
    drop(a);
    drop(b);
    let c = PostgresJournal::open(&url, PostgresOptions::default()).unwrap();
    assert_eq!(
        block_on(c.holds_pending()).unwrap(),
        vec![held("ap_kept", deadline)]
    );
    assert!(matches!(
        block_on(c.hold_decide("ap_kept", denied())).unwrap(),
        HoldDecided::Decided(_)
    ));
}
